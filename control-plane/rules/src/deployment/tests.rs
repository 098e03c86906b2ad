use super::*;
use jiff::tz::TimeZone;

fn t(text: &str) -> Timestamp {
    text.parse().expect("timestamp")
}

fn dev(name: &str) -> DeviceId {
    DeviceId::new(name).expect("device id")
}

pub(super) fn spec(
    max_concurrency: u32,
    window: Option<(&str, &str, &str)>,
    retries: u32,
) -> DeploymentSpec {
    DeploymentSpec {
        targets: Targeting::All,
        job: DeploymentJob::SystemUpgradeV1,
        max_concurrency,
        maintenance_window: window.map(|(start, end, zone)| Window {
            start_minute: parse_minute(start).expect("start"),
            end_minute: parse_minute(end).expect("end"),
            time_zone: zone.into(),
        }),
        retries,
        retry_backoff_seconds: 60,
        deadline_seconds: 7 * 24 * 3600,
        failure_threshold: None,
        max_releases_per_minute: None,
    }
}

const UID: &str = "0b7e6f3c-8d0a-4c1e-9b2f-3a4d5e6f7a8b";
const START: &str = "2026-03-01T00:00:00Z";

fn facts(spec: &DeploymentSpec) -> Facts<'_> {
    Facts {
        spec,
        uid: UID.parse().expect("uid"),
        started: t(START),
        canceling: false,
        recent_releases: &[],
    }
}

fn pending(name: &str, zone: Option<&str>) -> TargetRecord {
    TargetRecord::new(dev(name), zone.map(str::to_owned))
}

fn released(name: &str, attempt: u32, at: &str) -> TargetRecord {
    let mut record = pending(name, None);
    record.attempt = attempt;
    record.job = Some(attempt_job_id(
        UID.parse().expect("uid"),
        &dev(name),
        attempt,
    ));
    record.released_at = Some(t(at));
    record
}

fn input(record: &TargetRecord, job: Option<Observed>) -> TargetInput<'_> {
    TargetInput {
        record,
        job,
        online: true,
        time_zone: record.time_zone.as_deref(),
        waiting_since: None,
    }
}

/// How target `i` ends in what this pass decided, if it ends.
fn end_of(decision: &Decision, i: usize) -> Option<TargetEnd> {
    decision
        .changes
        .iter()
        .find(|(j, _)| *j == i)
        .and_then(|(_, r)| r.end)
}

fn names(records: &[TargetRecord], decision: &Decision) -> Vec<String> {
    decision
        .released
        .iter()
        .map(|&i| records[i].device.to_string())
        .collect()
}

#[test]
fn concurrency_online_and_order() {
    // (what, max_concurrency, already queued, offline indices, released now)
    type Case<'a> = (&'a str, u32, usize, Vec<usize>, Vec<&'a str>);
    let cases: Vec<Case> = vec![
        ("room for two", 2, 0, vec![], vec!["d0", "d1"]),
        (
            "one slot taken by a queued target",
            2,
            1,
            vec![],
            vec!["d1"],
        ),
        ("full", 1, 1, vec![], vec![]),
        ("offline devices wait", 2, 0, vec![0, 1], vec!["d2", "d3"]),
        (
            "more room than targets",
            100,
            0,
            vec![],
            vec!["d0", "d1", "d2", "d3", "d4"],
        ),
    ];
    let now = t("2026-03-01T10:00:00Z");
    for (what, max, queued, offline, expected) in cases {
        let spec = spec(max, None, 0);
        let mut records: Vec<TargetRecord> =
            (0..5).map(|i| pending(&format!("d{i}"), None)).collect();
        for record in records.iter_mut().take(queued) {
            *record = released(record.device.as_str(), 1, "2026-03-01T09:00:00Z");
        }
        let inputs: Vec<TargetInput> = records
            .iter()
            .enumerate()
            .map(|(i, r)| TargetInput {
                record: r,
                job: r.job.map(|_| Observed::Queued { acked: None }),
                online: !offline.contains(&i),
                time_zone: r.time_zone.as_deref(),
                waiting_since: None,
            })
            .collect();
        let decision = decide(&facts(&spec), &inputs, now);
        let expected: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
        let expected: Vec<String> = expected
            .into_iter()
            .filter(|d| !records[..queued].iter().any(|r| r.device.as_str() == d))
            .collect();
        assert_eq!(names(&records, &decision), expected, "{what}");
        let active = decision.counts.queued + decision.counts.running;
        assert!(active <= max, "{what}: {active} active > {max}");
        assert_eq!(decision.counts.total(), 5, "{what}");
        for &i in &decision.released {
            let (_, next) = decision
                .changes
                .iter()
                .find(|(j, _)| *j == i)
                .expect("a change");
            assert_eq!(next.attempt, 1, "{what}");
            assert_eq!(next.released_at, Some(now), "{what}");
            assert_eq!(
                next.job,
                Some(attempt_job_id(UID.parse().expect("uid"), &next.device, 1))
            );
        }
    }
}

#[test]
fn windows_in_each_sites_time_zone() {
    // (what, window, device zone, now, in window)
    let night = ("22:00", "05:00", "Europe/Sofia");
    type Case<'a> = (
        &'a str,
        (&'a str, &'a str, &'a str),
        Option<&'a str>,
        &'a str,
        bool,
    );
    let cases: Vec<Case> = vec![
        // Sofia is UTC+2 in winter.
        (
            "before a window across midnight",
            night,
            None,
            "2026-02-10T19:59:00Z",
            false,
        ),
        (
            "its first minute",
            night,
            None,
            "2026-02-10T20:00:00Z",
            true,
        ),
        ("after midnight", night, None, "2026-02-10T23:30:00Z", true),
        ("its last minute", night, None, "2026-02-11T02:59:00Z", true),
        (
            "its end is outside",
            night,
            None,
            "2026-02-11T03:00:00Z",
            false,
        ),
        ("midday", night, None, "2026-02-11T10:00:00Z", false),
        // The device's own zone wins over the window's.
        (
            "Tokyo at 22:00 local",
            night,
            Some("Asia/Tokyo"),
            "2026-02-10T13:00:00Z",
            true,
        ),
        (
            "Tokyo at 05:00 local",
            night,
            Some("Asia/Tokyo"),
            "2026-02-10T20:00:00Z",
            false,
        ),
        (
            "New York at 23:00 local",
            night,
            Some("America/New_York"),
            "2026-02-11T04:00:00Z",
            true,
        ),
        (
            "New York at 18:00 local",
            night,
            Some("America/New_York"),
            "2026-02-10T23:00:00Z",
            false,
        ),
        // A window within one day, in UTC.
        (
            "daytime UTC inside",
            ("09:00", "17:00", "UTC"),
            None,
            "2026-02-10T16:59:00Z",
            true,
        ),
        (
            "daytime UTC after",
            ("09:00", "17:00", "UTC"),
            None,
            "2026-02-10T17:00:00Z",
            false,
        ),
        // Spring forward in Sofia, 2026-03-29: 03:00 EET becomes 04:00 EEST
        // (01:00 UTC). A 03:00-05:00 window opens at 04:00 local that day.
        (
            "DST spring: 02:59 EET",
            ("03:00", "05:00", "Europe/Sofia"),
            None,
            "2026-03-29T00:59:00Z",
            false,
        ),
        (
            "DST spring: 04:00 EEST",
            ("03:00", "05:00", "Europe/Sofia"),
            None,
            "2026-03-29T01:00:00Z",
            true,
        ),
        (
            "DST spring: 04:59 EEST",
            ("03:00", "05:00", "Europe/Sofia"),
            None,
            "2026-03-29T01:59:00Z",
            true,
        ),
        (
            "DST spring: 05:00 EEST",
            ("03:00", "05:00", "Europe/Sofia"),
            None,
            "2026-03-29T02:00:00Z",
            false,
        ),
        // Fall back, 2026-10-25: 04:00 EEST becomes 03:00 EET (01:00 UTC); a
        // 03:00-04:00 window is open for both of that day's 03:00 hours.
        (
            "DST fall: 02:59 EEST",
            ("03:00", "04:00", "Europe/Sofia"),
            None,
            "2026-10-24T23:59:00Z",
            false,
        ),
        (
            "DST fall: first 03:00",
            ("03:00", "04:00", "Europe/Sofia"),
            None,
            "2026-10-25T00:00:00Z",
            true,
        ),
        (
            "DST fall: first 03:59",
            ("03:00", "04:00", "Europe/Sofia"),
            None,
            "2026-10-25T00:59:00Z",
            true,
        ),
        (
            "DST fall: second 03:00",
            ("03:00", "04:00", "Europe/Sofia"),
            None,
            "2026-10-25T01:00:00Z",
            true,
        ),
        (
            "DST fall: second 03:59",
            ("03:00", "04:00", "Europe/Sofia"),
            None,
            "2026-10-25T01:59:00Z",
            true,
        ),
        (
            "DST fall: 04:00 EET",
            ("03:00", "04:00", "Europe/Sofia"),
            None,
            "2026-10-25T02:00:00Z",
            false,
        ),
        // New York's spring forward, 2026-03-08 02:00 EST -> 03:00 EDT.
        (
            "NY spring: 01:59 EST",
            ("02:00", "03:30", "America/New_York"),
            None,
            "2026-03-08T06:59:00Z",
            false,
        ),
        (
            "NY spring: 03:00 EDT",
            ("02:00", "03:30", "America/New_York"),
            None,
            "2026-03-08T07:00:00Z",
            true,
        ),
        (
            "NY spring: 03:30 EDT",
            ("02:00", "03:30", "America/New_York"),
            None,
            "2026-03-08T07:30:00Z",
            false,
        ),
    ];
    for (what, window, zone, now, expected) in cases {
        let spec = spec(10, Some(window), 0);
        let records = [pending("d0", zone)];
        let inputs = [input(&records[0], None)];
        let mut facts = facts(&spec);
        facts.started = t(now) - SignedDuration::from_hours(1);
        let decision = decide(&facts, &inputs, t(now));
        assert_eq!(decision.released == vec![0], expected, "{what} at {now}");
    }
}

/// Issue 33 item 3: the window is judged in the device's zone at each pass,
/// not the one it had when it became a target. A device planned in Honolulu
/// (outside a 09:00-11:00 UTC window at 10:00 UTC) that moved to a UTC
/// site is released at the next pass; the other way round, it waits.
#[test]
fn each_pass_judges_the_window_in_the_devices_zone_now() {
    let spec = spec(10, Some(("09:00", "11:00", "UTC")), 0);
    let now = t("2026-03-10T10:00:00Z");
    let mut facts = facts(&spec);
    facts.started = now - SignedDuration::from_hours(1);
    let planned_far = [pending("mover", Some("Pacific/Honolulu"))];
    let moved_here = TargetInput {
        time_zone: Some("Etc/UTC"),
        ..input(&planned_far[0], None)
    };
    assert_eq!(decide(&facts, &[moved_here], now).released, [0]);
    let stayed = input(&planned_far[0], None);
    assert!(decide(&facts, &[stayed], now).released.is_empty());
    let planned_here = [pending("leaver", Some("Etc/UTC"))];
    let moved_away = TargetInput {
        time_zone: Some("Pacific/Honolulu"),
        ..input(&planned_here[0], None)
    };
    assert!(decide(&facts, &[moved_away], now).released.is_empty());
    // A site whose zone was removed: the window's own zone.
    let unzoned = TargetInput {
        time_zone: None,
        ..input(&planned_far[0], None)
    };
    assert_eq!(decide(&facts, &[unzoned], now).released, [0]);
}

/// Issue 33 item 1 (the jobs seed): a job the device acknowledged but did
/// not start times out like a running one, counted from when it could have
/// started: never while an earlier job on the device is unfinished
/// (`waiting_since` None), else from the later of its acknowledgement and
/// the end of the last earlier job.
#[test]
fn an_acknowledged_job_not_started_times_out_from_when_it_could_have_started() {
    let spec = spec(10, None, 1);
    let acked = t("2026-03-01T10:00:00Z");
    let record = released("d0", 1, "2026-03-01T10:00:00Z");
    let timeout = SignedDuration::from_secs(i64::from(JOB_TIMEOUT_SECONDS)) + RUNNING_GRACE;
    let waiting = |since: Option<Timestamp>| TargetInput {
        waiting_since: since,
        ..input(&record, Some(Observed::Queued { acked: Some(acked) }))
    };
    let mut facts = facts(&spec);
    facts.started = acked - SignedDuration::from_mins(1);
    // Behind an unfinished job: hours later, still queued.
    let behind = decide(
        &facts,
        &[waiting(None)],
        acked + SignedDuration::from_hours(3),
    );
    assert!(behind.changes.is_empty(), "{:?}", behind.changes);
    assert_eq!(behind.counts.queued, 1);
    // Nothing before it: out at the ack plus the timeout, not a second sooner.
    let early = decide(
        &facts,
        &[waiting(Some(acked))],
        acked + timeout - SignedDuration::from_secs(1),
    );
    assert!(early.changes.is_empty());
    let due = decide(&facts, &[waiting(Some(acked))], acked + timeout);
    let (_, retried) = &due.changes[0];
    assert_eq!(retried.job, None, "the attempt ends");
    assert!(
        retried.last_error.as_deref().is_some_and(
            |e| e.starts_with("timed out: acknowledged by the device and not started 1800s")
        ),
        "{retried:?}"
    );
    assert_eq!(
        retried.next_attempt_at,
        Some(acked + timeout + backoff(&spec, 1))
    );
    // The job before it ended an hour after the ack: counted from then.
    let freed = acked + SignedDuration::from_hours(1);
    let later = decide(
        &facts,
        &[waiting(Some(freed))],
        acked + timeout + SignedDuration::from_mins(10),
    );
    assert!(later.changes.is_empty());
    assert_eq!(
        decide(&facts, &[waiting(Some(freed))], freed + timeout)
            .changes
            .len(),
        1
    );
}

#[test]
fn failures_retry_after_an_exact_exponential_backoff() {
    let spec = spec(10, None, 3);
    let uid: JobId = UID.parse().expect("uid");
    let mut record = released("d0", 1, "2026-03-01T10:00:00Z");
    let mut expected_waits = vec![60, 120, 240].into_iter();
    let mut failed_at = t("2026-03-01T10:05:00Z");
    for attempt in 1..=4u32 {
        assert_eq!(record.attempt, attempt);
        let job = record.job.expect("out");
        assert_eq!(job, attempt_job_id(uid, &record.device, attempt));
        // The attempt fails, as the control plane received it at `failed_at`.
        let inputs = [input(
            &record,
            Some(Observed::Failed {
                at: failed_at,
                error: format!("attempt {attempt} failed"),
            }),
        )];
        let decision = decide(&facts(&spec), &inputs, failed_at);
        let (_, next) = decision.changes[0].clone();
        assert_eq!(
            next.last_error.as_deref(),
            Some(format!("attempt {attempt} failed").as_str())
        );
        assert_eq!(
            decision.latest_error.as_deref(),
            Some(format!("d0: attempt {attempt} failed").as_str())
        );
        let Some(wait) = expected_waits.next() else {
            // No retries left: the target has failed.
            assert_eq!(next.end, Some(TargetEnd::Failed { at: failed_at }));
            assert_eq!(decision.counts.failed, 1);
            assert!(decision.finished);
            return;
        };
        let due = failed_at + SignedDuration::from_secs(wait);
        assert_eq!(next.next_attempt_at, Some(due), "attempt {attempt}");
        assert_eq!(next.job, None);
        assert!(
            decision.released.is_empty(),
            "not released before the backoff"
        );
        assert_eq!(decision.counts.waiting_retry, 1);
        assert_eq!(decision.next_retry_at, Some(due));
        // One second early: still waiting.
        let early = [input(&next, None)];
        let decision = decide(&facts(&spec), &early, due - SignedDuration::from_secs(1));
        assert!(
            decision.released.is_empty(),
            "attempt {attempt}: released early"
        );
        // Exactly due: the next attempt, a new job.
        let decision = decide(&facts(&spec), &early, due);
        assert_eq!(decision.released, vec![0], "attempt {attempt}");
        let (_, again) = decision.changes[0].clone();
        assert_ne!(again.job, Some(job), "every attempt is a new job");
        assert_eq!(again.next_attempt_at, None);
        record = again;
        failed_at = due + SignedDuration::from_secs(30);
    }
    panic!("the retries never ran out");
}

#[test]
fn a_running_attempt_times_out_on_the_control_planes_clock() {
    let spec = spec(10, None, 1);
    let record = released("d0", 1, "2026-03-01T10:00:00Z");
    // First seen running: the clock starts now.
    let seen = t("2026-03-01T10:10:00Z");
    let decision = decide(
        &facts(&spec),
        &[input(&record, Some(Observed::Running))],
        seen,
    );
    let (_, running) = decision.changes[0].clone();
    assert_eq!(running.running_since, Some(seen));
    assert_eq!(decision.counts.running, 1);
    let limit = seen + SignedDuration::from_secs(1500 + 300);
    let decision = decide(
        &facts(&spec),
        &[input(&running, Some(Observed::Running))],
        limit - SignedDuration::from_secs(1),
    );
    assert!(decision.changes.is_empty(), "not yet: {decision:?}");
    let decision = decide(
        &facts(&spec),
        &[input(&running, Some(Observed::Running))],
        limit,
    );
    let (_, timed_out) = decision.changes[0].clone();
    assert!(
        timed_out
            .last_error
            .as_deref()
            .unwrap_or("")
            .starts_with("timed out"),
        "{timed_out:?}"
    );
    assert_eq!(timed_out.job, None);
    assert_eq!(
        timed_out.next_attempt_at,
        Some(limit + SignedDuration::from_secs(60))
    );
    assert_eq!(decision.counts.waiting_retry, 1, "the slot is free again");
}

#[test]
fn expiry_ends_pending_and_queued_targets_but_not_running_ones() {
    let spec = spec(10, None, 5);
    let deadline = facts(&spec).deadline();
    let records = [
        pending("pending", None),
        released("queued", 1, "2026-03-07T23:00:00Z"),
        {
            let mut r = released("running", 1, "2026-03-07T22:00:00Z");
            r.running_since = Some(t("2026-03-07T23:50:00Z"));
            r
        },
        released("failing", 1, "2026-03-07T22:00:00Z"),
    ];
    let inputs = [
        input(&records[0], None),
        input(&records[1], Some(Observed::Queued { acked: None })),
        input(&records[2], Some(Observed::Running)),
        input(
            &records[3],
            Some(Observed::Failed {
                at: deadline,
                error: "dpkg failed".into(),
            }),
        ),
    ];
    let decision = decide(&facts(&spec), &inputs, deadline);
    assert!(decision.released.is_empty());
    let end = |i: usize| end_of(&decision, i);
    assert_eq!(end(0), Some(TargetEnd::Expired { at: deadline }));
    assert_eq!(end(1), Some(TargetEnd::Expired { at: deadline }));
    assert_eq!(end(2), None, "a started job is never interrupted (A3)");
    assert_eq!(
        end(3),
        Some(TargetEnd::Failed { at: deadline }),
        "no retry after the deadline"
    );
    // The queued job is canceled on its agent, as an operator's cancel
    // would (issue 33 item 2); the running one is left to finish.
    assert_eq!(decision.cancel, [1]);
    assert_eq!(
        decision.counts,
        Counts {
            pending: 0,
            waiting_retry: 0,
            queued: 0,
            running: 1,
            succeeded: 0,
            failed: 1,
            expired: 2,
            canceled: 0,
        }
    );
    assert!(!decision.finished);
}

#[test]
fn success_ends_a_target_and_the_deployment_finishes_when_all_have_ended() {
    let spec = spec(10, None, 0);
    let records = [
        released("a", 1, "2026-03-01T10:00:00Z"),
        released("b", 1, "2026-03-01T10:00:00Z"),
    ];
    let at = t("2026-03-01T10:20:00Z");
    let inputs = [
        input(&records[0], Some(Observed::Succeeded { at })),
        input(
            &records[1],
            Some(Observed::Failed {
                at,
                error: "no".into(),
            }),
        ),
    ];
    let decision = decide(&facts(&spec), &inputs, at);
    assert!(decision.finished);
    assert_eq!(decision.counts.succeeded, 1);
    assert_eq!(decision.counts.failed, 1);
    // A pass over ended targets changes nothing.
    let ended: Vec<TargetRecord> = decision.changes.iter().map(|(_, r)| r.clone()).collect();
    let inputs: Vec<TargetInput> = ended.iter().map(|r| input(r, None)).collect();
    let again = decide(&facts(&spec), &inputs, at + SignedDuration::from_hours(1));
    assert!(again.changes.is_empty() && again.finished);
}

#[test]
fn attempt_job_ids_are_stable_and_distinct() {
    let uid: JobId = UID.parse().expect("uid");
    let a1 = attempt_job_id(uid, &dev("a"), 1);
    assert_eq!(a1, attempt_job_id(uid, &dev("a"), 1));
    assert_ne!(a1, attempt_job_id(uid, &dev("a"), 2));
    assert_ne!(a1, attempt_job_id(uid, &dev("b"), 1));
    assert_ne!(a1, attempt_job_id(JobId::random(), &dev("a"), 1));
    // A UUIDv8: version nibble 8, RFC variant.
    let text = a1.to_string();
    assert_eq!(&text[14..15], "8", "{text}");
    assert!(matches!(&text[19..20], "8" | "9" | "a" | "b"), "{text}");
}

#[test]
fn backoff_doubles_and_is_bounded() {
    let spec = spec(1, None, MAX_RETRIES);
    assert_eq!(backoff(&spec, 1), SignedDuration::from_secs(60));
    assert_eq!(backoff(&spec, 2), SignedDuration::from_secs(120));
    assert_eq!(backoff(&spec, 5), SignedDuration::from_secs(960));
    assert_eq!(backoff(&spec, 40), MAX_BACKOFF);
}

#[test]
fn minutes_parse_and_format() {
    assert_eq!(parse_minute("00:00"), Some(0));
    assert_eq!(parse_minute("23:59"), Some(1439));
    for bad in ["24:00", "7:00", "07:60", "0700", "", "ab:cd", "07:00:00"] {
        assert_eq!(parse_minute(bad), None, "{bad}");
    }
    assert_eq!(format_minute(22 * 60 + 5), "22:05");
}

/// The windows need the system's tz database (Debian's tzdata).
#[test]
fn the_tz_database_is_there() {
    let zone = TimeZone::get("Europe/Sofia");
    assert!(zone.is_ok(), "install tzdata: {zone:?}");
    assert!(time_zone("Mars/Olympus").is_none());
    assert_eq!(time_zone("UTC"), Some(TimeZone::UTC));
}

/// Debian's version ordering (dpkg's own test vectors, lib/dpkg/t/t-version.c
/// and deb-version(7)): epochs first, `~` sorts before anything, even the
/// end; letters before non-letters; numbers compared as numbers.
#[test]
fn version_relations_follow_debians_ordering() {
    use VersionOp::*;
    let table: &[(&str, VersionOp, &str, bool)] = &[
        ("1.0", Eq, "1.0", true),
        // No revision is the same as revision 0.
        ("1.0", Eq, "1.0-0", true),
        ("1.0", Lt, "1.0-1", true),
        ("1.0-1", Lt, "1.0-2", true),
        ("1.0~rc1", Lt, "1.0", true),
        ("1.0~rc1", Gt, "1.0~beta", true),
        ("1.0~", Lt, "1.0", true),
        ("1.0+deb12u1", Gt, "1.0", true),
        ("1:0.9", Gt, "2.0", true),
        ("0:1.0", Eq, "1.0", true),
        ("1.10", Gt, "1.9", true),
        ("1.0a", Gt, "1.0", true),
        ("1.0a", Lt, "1.0+", true),
        ("3.0.11-1~deb12u2", Lt, "3.0.11-1", true),
        ("3.0.11-1~deb12u2", Ge, "3.0.11-1~deb12u1", true),
        ("2.36-9+deb12u4", Le, "2.36-9+deb12u4", true),
        ("2.36-9+deb12u4", Le, "2.36-9+deb12u3", false),
    ];
    for (installed, op, wanted, expected) in table {
        assert_eq!(
            op.holds(installed, wanted),
            *expected,
            "{installed} {} {wanted}",
            op.as_str()
        );
    }
    for (text, op) in [
        ("<", Lt),
        ("<<", Lt),
        ("<=", Le),
        ("=", Eq),
        (">=", Ge),
        (">", Gt),
        (">>", Gt),
    ] {
        assert_eq!(VersionOp::parse(text), Some(op), "{text}");
    }
    assert_eq!(VersionOp::parse("=>"), None);
}

#[test]
fn software_conditions_need_an_inventory_that_can_decide_them() {
    let inventory = |packages: &[(&str, &str)], truncated: bool| DeviceInventory {
        device: dev("d1"),
        collected_at: t(START),
        packages: packages
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect(),
        truncated,
    };
    let condition = |name: &str, cmp: Option<(VersionOp, &str)>| SoftwareCondition {
        name: name.into(),
        version_cmp: cmp.map(|(op, version)| VersionCmp {
            op,
            version: version.into(),
        }),
    };
    let old_openssl = DeviceFilter {
        software_present: vec![condition(
            "openssl",
            Some((VersionOp::Lt, "3.0.11-1~deb12u2")),
        )],
        ..DeviceFilter::default()
    };
    let no_telnet = DeviceFilter {
        software_absent: vec![condition("telnetd", None)],
        ..DeviceFilter::default()
    };
    let vulnerable = inventory(&[("openssl", "3.0.9-1")], false);
    let patched = inventory(&[("openssl", "3.0.11-1~deb12u2")], false);
    let telnet = inventory(&[("telnetd", "0.17-44")], false);
    let partial = inventory(&[("openssl", "3.0.9-1")], true);
    let table: &[(&str, &DeviceFilter, Option<&DeviceInventory>, Option<bool>)] = &[
        (
            "no software conditions",
            &DeviceFilter::default(),
            None,
            Some(true),
        ),
        ("old openssl", &old_openssl, Some(&vulnerable), Some(true)),
        ("patched openssl", &old_openssl, Some(&patched), Some(false)),
        ("no inventory yet", &old_openssl, None, None),
        (
            "present in a truncated list",
            &old_openssl,
            Some(&partial),
            Some(true),
        ),
        (
            "not listed in a truncated list",
            &old_openssl,
            Some(&telnet_truncated()),
            None,
        ),
        ("absent", &no_telnet, Some(&vulnerable), Some(true)),
        (
            "present, so not absent",
            &no_telnet,
            Some(&telnet),
            Some(false),
        ),
        (
            "absence unprovable in a truncated list",
            &no_telnet,
            Some(&partial),
            None,
        ),
    ];
    fn telnet_truncated() -> DeviceInventory {
        DeviceInventory {
            device: DeviceId::new("d1").expect("id"),
            collected_at: Timestamp::UNIX_EPOCH,
            packages: [("telnetd".to_owned(), "0.17".to_owned())].into(),
            truncated: true,
        }
    }
    for (what, filter, inventory, expected) in table {
        assert_eq!(filter.software_matches(*inventory), *expected, "{what}");
    }
    // A device whose software cannot be judged is excluded, not skipped.
    let mut device = crate::records::DeviceRecord::new(dev("d1"));
    device.agent_present = true;
    device.capabilities = vec!["systemUpgradeV1".into()];
    let targeting = Targeting::Filter(old_openssl.clone());
    let job = DeploymentJob::SystemUpgradeV1;
    assert_eq!(select(&targeting, &job, &device, None), Selection::Excluded);
    assert_eq!(
        select(&targeting, &job, &device, Some(&vulnerable)),
        Selection::Target
    );
    assert_eq!(
        select(&targeting, &job, &device, Some(&patched)),
        Selection::NotSelected
    );
    // An agent that does not run the job's kind is left out, as a task
    // run leaves it out, not sent a job it would refuse.
    let assess = DeploymentJob::PatchAssessmentV1;
    assert_eq!(
        select(&targeting, &assess, &device, Some(&vulnerable)),
        Selection::Excluded
    );
    assert!(!runs_kind(&assess, &device));
    assert!(runs_kind(&job, &device));
}

/// A canceled deployment releases nothing and retries nothing; targets not
/// released end Canceled; jobs that are out (queued or running) are listed
/// for a cancel order and decide their targets by how they end; it is
/// finished once every target has ended.
#[test]
fn a_canceled_deployment_releases_nothing_and_asks_its_jobs_out_to_cancel() {
    let spec = spec(10, None, 3);
    let now = t("2026-03-01T10:00:00Z");
    let mut waiting = released("retrying", 1, "2026-03-01T09:00:00Z");
    waiting.job = None;
    waiting.released_at = None;
    waiting.next_attempt_at = Some(t("2026-03-01T10:05:00Z"));
    waiting.last_error = Some("apt failed".into());
    let records = [
        pending("never", None),
        waiting,
        released("queued", 1, "2026-03-01T09:00:00Z"),
        released("running", 1, "2026-03-01T09:00:00Z"),
        released("failing", 1, "2026-03-01T09:00:00Z"),
        released("canceled", 1, "2026-03-01T09:00:00Z"),
    ];
    let jobs = [
        None,
        None,
        Some(Observed::Queued { acked: None }),
        Some(Observed::Running),
        Some(Observed::Failed {
            at: now,
            error: "dpkg failed".into(),
        }),
        Some(Observed::Canceled { at: now }),
    ];
    let inputs: Vec<TargetInput> = records
        .iter()
        .zip(jobs)
        .map(|(r, job)| input(r, job))
        .collect();
    let mut facts = facts(&spec);
    facts.canceling = true;
    let decision = decide(&facts, &inputs, now);
    assert!(decision.released.is_empty(), "nothing is released");
    assert_eq!(
        decision.cancel,
        vec![2, 3],
        "the queued and the running job"
    );
    let end = |i: usize| end_of(&decision, i);
    assert_eq!(end(0), Some(TargetEnd::Canceled { at: now }));
    assert_eq!(end(1), Some(TargetEnd::Canceled { at: now }), "no retry");
    assert_eq!(end(4), Some(TargetEnd::Failed { at: now }), "no retry");
    assert_eq!(end(5), Some(TargetEnd::Canceled { at: now }));
    assert_eq!(
        (
            decision.counts.canceled,
            decision.counts.failed,
            decision.counts.queued,
            decision.counts.running
        ),
        (3, 1, 1, 1)
    );
    assert!(!decision.finished, "two jobs are still out");

    // Without the cancel, the same targets release and retry.
    facts.canceling = false;
    let running = decide(&facts, &inputs, now);
    assert_eq!(names(&records, &running), ["never"]);
    assert!(running.cancel.is_empty());
    assert_eq!(
        running.counts.canceled, 1,
        "the device's own Canceled status"
    );
}

/// The status a pass writes, apart from the store: a deployment whose
/// targets all ended is Complete or Failed with its reason, unless an "add
/// new devices" request brought new targets in this pass; a canceled one
/// ends Canceled with its counts in a sentence; a request is marked handled.
#[test]
fn the_status_a_pass_writes_follows_the_decision_and_the_add_request() {
    let spec = spec(10, None, 0);
    let at = t("2026-03-01T10:20:00Z");
    let records = [released("a", 1, "2026-03-01T10:00:00Z")];
    let succeeded = [input(&records[0], Some(Observed::Succeeded { at }))];
    let decision = decide(&facts(&spec), &succeeded, at);
    let mut record = DeploymentRecord {
        name: "d".into(),
        uid: JobId::random(),
        created_at: t("2026-03-01T09:00:00Z"),
        spec: spec.clone(),
        add_requests: 1,
        status: DeploymentStatus::planning(),
    };
    record.status.phase = crate::records::Phase::Running;
    let none = || Adds {
        count: 0,
        error: None,
        handled: false,
        excluded: None,
    };

    let done = next_status(&record, &decision, none(), at);
    assert_eq!(done.phase, crate::records::Phase::Complete);
    assert_eq!(done.reason.as_deref(), Some("AllTargetsSucceeded"));
    assert_eq!(done.completion_time, Some(at));
    assert_eq!((done.targets, done.counts.succeeded), (1, 1));
    assert_eq!(done.add_requests_handled, 0);

    // New targets in the same pass: not finished, counted as pending.
    let adds = Adds {
        count: 2,
        error: None,
        handled: true,
        excluded: Some(4),
    };
    let more = next_status(&record, &decision, adds, at);
    assert_eq!(more.phase, crate::records::Phase::Running);
    assert_eq!((more.targets, more.counts.pending), (3, 2));
    assert_eq!(more.add_requests_handled, 1);
    assert_eq!(
        more.excluded, 4,
        "matching devices without an agent, counted again"
    );

    // Too many to add: the error is the latest, nothing pending.
    let refused = Adds {
        count: 0,
        error: Some("too_many_targets: …".into()),
        handled: true,
        excluded: None,
    };
    let refused = next_status(&record, &decision, refused, at);
    assert_eq!(refused.latest_error.as_deref(), Some("too_many_targets: …"));
    assert_eq!(refused.phase, crate::records::Phase::Complete);

    record.status.phase = crate::records::Phase::Canceling;
    let canceled = next_status(&record, &decision, none(), at);
    assert_eq!(canceled.phase, crate::records::Phase::Failed);
    assert_eq!(canceled.reason.as_deref(), Some("Canceled"));
    assert_eq!(
        canceled.latest_error.as_deref(),
        Some("canceled by an operator: 1 of 1 targets succeeded, 0 failed, 0 expired, 0 canceled")
    );
}

/// A failed target (its only attempt failed at `at`).
fn ended_failed(name: &str, at: &str) -> TargetRecord {
    let mut record = released(name, 1, at);
    record.job = None;
    record.end = Some(TargetEnd::Failed { at: t(at) });
    record
}

fn ended_succeeded(name: &str, at: &str) -> TargetRecord {
    let mut record = released(name, 1, at);
    record.end = Some(TargetEnd::Succeeded { at: t(at) });
    record
}

#[test]
fn a_failure_threshold_is_reached_by_count_or_percentage_after_enough_ended() {
    let counts = |succeeded, failed| Counts {
        succeeded,
        failed,
        ..Counts::default()
    };
    let count = |n, min_ended| FailureThreshold {
        limit: FailureLimit::Failed(n),
        min_ended,
    };
    let percent = |p, min_ended| FailureThreshold {
        limit: FailureLimit::Percent(p),
        min_ended,
    };
    // (what, threshold, succeeded, failed, reached)
    let cases = [
        ("one short of the count", count(3, 0), 10, 2, false),
        ("the count", count(3, 0), 0, 3, true),
        ("over the count", count(3, 0), 50, 4, true),
        ("count before enough ended", count(1, 10), 5, 4, false),
        ("count once enough ended", count(1, 10), 6, 4, true),
        ("percent below", percent(10, 20), 91, 9, false),
        ("percent exactly", percent(10, 20), 90, 10, true),
        ("percent before enough ended", percent(10, 20), 0, 19, false),
        ("percent once enough ended", percent(10, 20), 1, 19, true),
        (
            "no failure never reaches 0%-like limits",
            percent(1, 0),
            100,
            0,
            false,
        ),
        (
            "100% needs every ended target failed",
            percent(100, 2),
            1,
            5,
            false,
        ),
        ("100% with every one failed", percent(100, 2), 0, 2, true),
    ];
    for (what, threshold, succeeded, failed, reached) in cases {
        assert_eq!(
            threshold.reached(&counts(succeeded, failed)),
            reached,
            "{what}"
        );
    }
    // Expired and canceled targets count neither way.
    let mut c = counts(9, 1);
    c.expired = 50;
    c.canceled = 50;
    assert!(!percent(20, 10).reached(&c));
}

#[test]
fn the_pass_that_counts_the_threshold_releases_nothing_and_stops_the_rollout() {
    let mut spec = spec(10, None, 1);
    spec.failure_threshold = Some(FailureThreshold {
        limit: FailureLimit::Failed(2),
        min_ended: 0,
    });
    let now = t("2026-03-01T10:00:00Z");
    let error = || Observed::Failed {
        at: now,
        error: "dpkg said no".into(),
    };
    // d0 failed before; d1's last attempt fails now (the second failed
    // target); d2 is queued, d3 runs, d4 waits for a retry after its first
    // attempt failed now, d5..d7 are pending.
    let mut records = vec![
        ended_failed("d0", "2026-03-01T09:00:00Z"),
        released("d1", 2, "2026-03-01T09:30:00Z"),
        released("d2", 1, "2026-03-01T09:50:00Z"),
        released("d3", 1, "2026-03-01T09:40:00Z"),
        released("d4", 1, "2026-03-01T09:45:00Z"),
    ];
    records.extend((5..8).map(|i| pending(&format!("d{i}"), None)));
    let jobs = [
        None,
        Some(error()),
        Some(Observed::Queued { acked: None }),
        Some(Observed::Running),
        Some(error()),
        None,
        None,
        None,
    ];
    let inputs: Vec<TargetInput> = records
        .iter()
        .zip(jobs)
        .map(|(r, job)| input(r, job))
        .collect();
    let decision = decide(&facts(&spec), &inputs, now);
    assert!(decision.threshold_reached);
    assert!(decision.released.is_empty(), "{decision:?}");
    assert!(matches!(
        end_of(&decision, 1),
        Some(TargetEnd::Failed { .. })
    ));
    // Its retry is not released: the target ends failed.
    assert!(matches!(
        end_of(&decision, 4),
        Some(TargetEnd::Failed { .. })
    ));
    for i in 5..8 {
        assert!(
            matches!(end_of(&decision, i), Some(TargetEnd::Canceled { .. })),
            "d{i}"
        );
    }
    assert_eq!(
        decision.cancel,
        [2, 3],
        "the queued and running jobs are asked out"
    );
    assert!(
        !decision.finished,
        "the running and queued ones still decide"
    );

    let record = DeploymentRecord {
        name: "stop".into(),
        uid: UID.parse().expect("uid"),
        created_at: t(START),
        spec: spec.clone(),
        add_requests: 0,
        status: DeploymentStatus {
            phase: crate::records::Phase::Running,
            ..DeploymentStatus::planning()
        },
    };
    let adds = || Adds {
        count: 0,
        error: None,
        handled: false,
        excluded: None,
    };
    let status = next_status(&record, &decision, adds(), now);
    assert_eq!(status.phase, crate::records::Phase::Canceling);
    assert_eq!(status.reason.as_deref(), Some(THRESHOLD_REACHED));
    assert_eq!(status.threshold_reached_at, Some(now));
    let said = status.latest_error.clone().unwrap_or_default();
    assert!(
        said.contains("3 of 3 ended targets failed") && said.contains("2 failed targets"),
        "{said}"
    );

    // One short of it, the same pass releases as usual.
    let mut short = spec.clone();
    short.failure_threshold = Some(FailureThreshold {
        limit: FailureLimit::Failed(4),
        min_ended: 0,
    });
    let decision_short = decide(&facts(&short), &inputs, now);
    assert!(!decision_short.threshold_reached);
    assert_eq!(decision_short.released.len(), 3, "d5, d6, d7 released");

    // The stopped deployment's last running target ends: Failed, with the
    // threshold as its reason.
    let mut stopped = record.clone();
    stopped.status = status;
    let mut after = records.clone();
    for (i, next) in &decision.changes {
        after[*i] = next.clone();
    }
    let finish = now + SignedDuration::from_mins(5);
    let jobs = (0..8).map(|i| match i {
        2 => Some(Observed::Canceled { at: finish }),
        3 => Some(Observed::Succeeded { at: finish }),
        _ => None,
    });
    let inputs: Vec<TargetInput> = after.iter().zip(jobs).map(|(r, j)| input(r, j)).collect();
    let last = decide(&stopped.facts(), &inputs, finish);
    assert!(last.finished && !last.threshold_reached && last.released.is_empty());
    let ended = next_status(&stopped, &last, adds(), finish);
    assert_eq!(ended.phase, crate::records::Phase::Failed);
    assert_eq!(ended.reason.as_deref(), Some(THRESHOLD_REACHED));
    assert_eq!(ended.threshold_reached_at, Some(now), "kept");
}

#[test]
fn a_percentage_threshold_waits_for_enough_ended_targets() {
    let mut spec = spec(5, None, 0);
    spec.failure_threshold = Some(FailureThreshold {
        limit: FailureLimit::Percent(50),
        min_ended: 4,
    });
    let now = t("2026-03-01T10:00:00Z");
    // Two failed of three ended: 67%, but only three ended.
    let mut records = vec![
        ended_failed("d0", "2026-03-01T09:00:00Z"),
        ended_failed("d1", "2026-03-01T09:00:00Z"),
        ended_succeeded("d2", "2026-03-01T09:00:00Z"),
    ];
    records.extend((3..6).map(|i| pending(&format!("d{i}"), None)));
    let inputs: Vec<TargetInput> = records.iter().map(|r| input(r, None)).collect();
    let decision = decide(&facts(&spec), &inputs, now);
    assert!(!decision.threshold_reached);
    assert_eq!(decision.released.len(), 3);
    // A fourth ends succeeded: 2 of 4 is 50%, reached.
    records[3] = ended_succeeded("d3", "2026-03-01T09:30:00Z");
    let inputs: Vec<TargetInput> = records.iter().map(|r| input(r, None)).collect();
    let decision = decide(&facts(&spec), &inputs, now);
    assert!(decision.threshold_reached);
    assert!(decision.released.is_empty());
}

#[test]
fn releases_keep_to_the_rate_over_any_minute() {
    let mut spec = spec(100, None, 0);
    spec.max_releases_per_minute = Some(5);
    let start = t("2026-03-01T10:00:00Z");
    let records: Vec<TargetRecord> = (0..20)
        .map(|i| pending(&format!("d{i:02}"), None))
        .collect();
    let uid: JobId = UID.parse().expect("uid");
    let mut kept: Vec<Releases> = Vec::new();
    let mut current = records.clone();
    let mut released_at: Vec<Timestamp> = Vec::new();
    // Passes every 7 seconds for three minutes.
    for step in 0..26 {
        let now = start + SignedDuration::from_secs(7 * step);
        let facts = Facts {
            spec: &spec,
            uid,
            started: start,
            canceling: false,
            recent_releases: &kept,
        };
        let inputs: Vec<TargetInput> = current
            .iter()
            .map(|r| input(r, r.job.map(|_| Observed::Running)))
            .collect();
        let decision = decide(&facts, &inputs, now);
        if decision.released.is_empty() {
            assert_eq!(decision.recent_releases, None, "nothing to keep");
        } else {
            kept = decision.recent_releases.clone().expect("kept");
            assert!(kept.iter().all(|r| r.at > now - RATE_WINDOW));
        }
        if decision.released.is_empty() && current.iter().any(|r| r.job.is_none()) {
            let next = decision.next_release_at.expect("told when");
            assert!(next > now && next <= now + RATE_WINDOW, "{next}");
        }
        released_at.extend(decision.released.iter().map(|_| now));
        for (i, next) in decision.changes {
            current[i] = next;
        }
    }
    // 5 at 0 s, then 5 more at 63 s (the first pass past 60 s) and 126 s.
    assert_eq!(released_at.len(), 15, "{released_at:?}");
    for (i, at) in released_at.iter().enumerate() {
        let window = released_at[i..]
            .iter()
            .filter(|later| **later < *at + RATE_WINDOW)
            .count();
        assert!(window <= 5, "{window} released in the minute from {at}");
    }
    // Without the rate all twenty go at once.
    spec.max_releases_per_minute = None;
    let inputs: Vec<TargetInput> = records.iter().map(|r| input(r, None)).collect();
    assert_eq!(decide(&facts(&spec), &inputs, start).released.len(), 20);
}

#[test]
fn the_release_batches_kept_stay_bounded_and_never_undercount() {
    let mut spec = spec(1000, None, 0);
    spec.max_releases_per_minute = Some(1000);
    let start = t("2026-03-01T10:00:00Z");
    let records: Vec<TargetRecord> = (0..200)
        .map(|i| pending(&format!("d{i:03}"), None))
        .collect();
    // 100 earlier batches of one each within the last minute.
    let kept: Vec<Releases> = (0..100)
        .map(|i| Releases {
            at: start - SignedDuration::from_millis(59_000 - i * 500),
            count: 1,
        })
        .collect();
    let facts = Facts {
        spec: &spec,
        uid: UID.parse().expect("uid"),
        started: start,
        canceling: false,
        recent_releases: &kept,
    };
    let inputs: Vec<TargetInput> = records.iter().map(|r| input(r, None)).collect();
    let decision = decide(&facts, &inputs, start);
    assert_eq!(decision.released.len(), 200);
    let next = decision.recent_releases.expect("kept");
    assert_eq!(next.len(), MAX_RELEASE_BATCHES);
    assert_eq!(next.iter().map(|r| r.count).sum::<u32>(), 300);
    assert!(next.windows(2).all(|w| w[0].at <= w[1].at));
}
