//! The scheduler's fleet simulation (the jobs seed's integration test): two
//! engines (replicas) over one real embedded store, each with the devices
//! connected to it and a change feed that sometimes lags, pass over two
//! deployments while a simulated fleet of 250 devices in five time zones
//! takes their jobs, works for a while, fails some attempts, and drops
//! offline for hours. The clock is injected: three days go by in
//! two-minute turns, through a window across midnight and the night Sofia
//! moves its clocks forward.
//!
//! Asserted on every turn: no deployment has more than `maxConcurrency`
//! targets out; a job starts only inside its device's window; a waiting
//! retry's time is exactly the failure's receive time plus the backoff; a
//! retry is not released before it. At the end: every target has ended,
//! the cached counts equal a recount, and each device took each job once,
//! attempts 1, 2, 3... in order, with the ids the deployment derives.
//!
//! Rollout safety (issue 33), on two more groups of the same fleet: a
//! deployment with a failure threshold stops exactly when the targets that
//! ended failed reach it (the stored counts never reach it while it runs,
//! and it never stops before that many used up their attempts), releases
//! nothing after, and its queued jobs are canceled on the devices; a
//! deployment with a release rate never releases more than its limit in
//! any 60 seconds, on either replica, and reaches the limit.

use super::*;
use crate::dispatch::Presence;
use drover_model::JobId;
use drover_model::model::{JobState, JobStatus, StepRecord};
use drover_rules::deployment::{
    Counts, DeploymentJob, DeploymentSpec, DeploymentStatus, DeviceFilter, FailureLimit,
    FailureThreshold, RATE_WINDOW, TargetEnd, Targeting, Window, attempt_job_id, time_zone,
};
use drover_rules::records::{DeviceRecord, device_key, targets_prefix};
use drover_store::store::RedbKv;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use tokio::sync::{Notify, mpsc};

const TURN: SignedDuration = SignedDuration::from_mins(2);
const ZONES_A: [Option<&str>; 6] = [
    Some("UTC"),
    Some("Europe/Sofia"),
    Some("America/New_York"),
    Some("Asia/Tokyo"),
    Some("Australia/Sydney"),
    None,
];
const ZONES_B: [Option<&str>; 3] = [Some("Europe/Sofia"), None, Some("America/New_York")];

/// The seed's rule, written out: `retry_backoff × 2^(attempt-1)`.
fn backoff(spec: &DeploymentSpec, attempt: u32) -> SignedDuration {
    SignedDuration::from_secs(spec.retry_backoff_seconds as i64 * (1i64 << (attempt - 1)))
}

fn t(text: &str) -> Timestamp {
    text.parse().expect("timestamp")
}

struct SimDevice {
    id: DeviceId,
    index: usize,
    deployment: Option<&'static str>,
}

/// Whether the device is offline at `now`: every ninth device drops off for
/// two to four hours, at a different hour each.
fn offline(index: usize, start: Timestamp, now: Timestamp) -> bool {
    if !index.is_multiple_of(9) {
        return false;
    }
    let from = start + SignedDuration::from_hours(3 + (index % 20) as i64);
    let until = from + SignedDuration::from_hours(2 + (index % 3) as i64);
    from <= now && now < until
}

/// Whether attempt `attempt` fails on device `index`.
fn fails(index: usize, attempt: u32) -> bool {
    (index.is_multiple_of(7) && attempt == 1)
        || (index.is_multiple_of(11) && attempt <= 2)
        || index.is_multiple_of(13)
}

/// How long attempt `attempt` works on device `index`.
fn work(index: usize, attempt: u32) -> SignedDuration {
    SignedDuration::from_mins(5 + ((index * 7 + attempt as usize * 3) % 20) as i64)
}

struct Working {
    key: String,
    finish_at: Timestamp,
    fail: bool,
}

/// The fleet: what each device holds, and what it has taken.
#[derive(Default)]
struct Fleet {
    /// Delivered, not yet taken (the device was offline).
    inbox: BTreeMap<usize, VecDeque<String>>,
    /// Taken, waiting behind the job that runs (one at a time, A2).
    queue: BTreeMap<usize, VecDeque<String>>,
    working: BTreeMap<usize, Working>,
    /// Every job each device took: (job id, deployment, attempt).
    taken: BTreeMap<usize, Vec<(JobId, String, u32)>>,
    /// Deliveries of a job the device had already taken (the agent answers
    /// them from its store, A1; the engine should not cause any).
    duplicates: Vec<String>,
    /// When the control plane received each failed attempt:
    /// (deployment, device, attempt) -> time.
    failed_at: BTreeMap<(String, DeviceId, u32), Timestamp>,
}

fn status(intent: &Intent, state: JobState, now: Timestamp, seq: u64) -> JobStatus {
    JobStatus {
        job_id: intent.job_id,
        device_id: intent.device_id.clone(),
        attempt: intent.attempt,
        kind: intent.kind.name().into(),
        state,
        steps: vec![StepRecord::pending("work")],
        error: (state == JobState::Failed).then(|| format!("attempt {} failed", intent.attempt)),
        output: None,
        accepted_at: now,
        started_at: (state != JobState::Accepted).then_some(now),
        finished_at: state.is_terminal().then_some(now),
        boot_id: "sim".into(),
        completion_heartbeat_at: (state == JobState::Succeeded).then_some(now),
        seq,
        failure: None,
        reason: Vec::new(),
    }
}

/// Stores a status as the delivery core would (acked with the first one,
/// the receive time with a terminal one).
async fn report(db: &Db, key: &str, state: JobState, now: Timestamp) {
    db.update::<JobDelivery, _>(key, |job| {
        let mut job = job?;
        let seq = job.status.as_ref().map_or(1, |s| s.seq + 1);
        job.status = Some(status(&job.intent, state, now, seq));
        if matches!(job.delivery, Delivery::Created | Delivery::Sent { .. }) {
            job.delivery = Delivery::Acked { at: now };
        }
        if state.is_terminal() {
            job.terminal_received_at = Some(now);
        }
        Some(job)
    })
    .await
    .expect("report a status");
}

/// A job's record as stored, with the name of the deployment it is of.
async fn job_of(db: &Db, key: &str) -> (String, JobDelivery) {
    let (_, job) = db.get::<JobDelivery>(key).await.expect("get").expect("job");
    let name = job
        .run
        .clone()
        .expect("a deployment's job")
        .trim_start_matches("deployment/")
        .to_owned();
    (name, job)
}

/// A deployment's record and targets as stored.
async fn stored(db: &Db, name: &str) -> (DeploymentRecord, Vec<(String, u64, TargetRecord)>) {
    let (_, record) = db
        .get::<DeploymentRecord>(&deployment_key(name))
        .await
        .expect("get")
        .expect("deployment");
    let targets = db
        .list::<TargetRecord>(&targets_prefix(record.uid))
        .await
        .expect("targets");
    (record, targets)
}

/// A deployment over one group of the fleet.
fn spec(
    group: &str,
    job: DeploymentJob,
    max_concurrency: u32,
    (start_hour, end_hour, time_zone): (u16, u16, &str),
    (retries, retry_backoff_seconds): (u32, u64),
    deadline_days: u64,
) -> DeploymentSpec {
    DeploymentSpec {
        targets: Targeting::Filter(DeviceFilter {
            match_labels: BTreeMap::new(),
            groups: vec![group.into()],
            ..DeviceFilter::default()
        }),
        job,
        max_concurrency,
        maintenance_window: Some(Window {
            start_minute: start_hour * 60,
            end_minute: end_hour * 60,
            time_zone: time_zone.into(),
        }),
        retries,
        retry_backoff_seconds,
        deadline_seconds: deadline_days * 24 * 3600,
        failure_threshold: None,
        max_releases_per_minute: None,
    }
}

/// Across midnight, in each device's zone.
fn spec_a() -> DeploymentSpec {
    let job = DeploymentJob::SystemUpgradeV1;
    spec("fleet-a", job, 12, (22, 5, "UTC"), (2, 600), 3)
}

/// 02:00-04:00: on 2027-03-28 Sofia skips 03:00-04:00, so its window that
/// night is one hour long.
fn spec_b() -> DeploymentSpec {
    let job = DeploymentJob::InventoryRefreshV1;
    spec("fleet-b", job, 8, (2, 4, "Europe/Sofia"), (1, 300), 2)
}

/// Stops once five targets ended failed (nine of its sixty would).
const THRESHOLD: u32 = 5;
fn spec_c() -> DeploymentSpec {
    let job = DeploymentJob::SystemUpgradeV1;
    let mut spec = spec("fleet-c", job, 10, (20, 8, "UTC"), (1, 300), 3);
    spec.failure_threshold = Some(FailureThreshold {
        limit: FailureLimit::Failed(THRESHOLD),
        min_ended: 0,
    });
    spec
}

/// Room for thirty at once, but four releases a minute.
const RATE: u32 = 4;
fn spec_d() -> DeploymentSpec {
    let job = DeploymentJob::SystemUpgradeV1;
    let mut spec = spec("fleet-d", job, 30, (18, 10, "UTC"), (2, 300), 3);
    spec.max_releases_per_minute = Some(RATE);
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_fleet_keeps_every_deployment_rule() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Db::new(Arc::new(
        RedbKv::open(&dir.path().join("drover.redb")).expect("store"),
    ));
    let start = t("2027-03-27T12:00:00Z");
    let specs = [
        ("midnight", spec_a()),
        ("dst-night", spec_b()),
        ("threshold", spec_c()),
        ("paced", spec_d()),
    ];

    // The fleet: 160 devices in fleet-a, 80 in fleet-b, 10 in neither, 60
    // in fleet-c and 60 in fleet-d; every seventeenth of fleet-a never had
    // an agent (excluded).
    let mut devices = Vec::new();
    for index in 0..370usize {
        let id = DeviceId::new(format!("sim-{index:03}")).expect("id");
        let mut record = DeviceRecord::new(id.clone());
        let (group, zone, deployment) = match index {
            0..160 => ("fleet-a", ZONES_A[index % 6], Some("midnight")),
            160..240 => ("fleet-b", ZONES_B[index % 3], Some("dst-night")),
            250..310 => ("fleet-c", None, Some("threshold")),
            310..370 => ("fleet-d", ZONES_B[index % 3], Some("paced")),
            _ => ("elsewhere", None, None),
        };
        record.groups.insert(group.into());
        record.time_zone = zone.map(str::to_owned);
        record.agent_present = !(index < 160 && index.is_multiple_of(17));
        record.capabilities = vec!["systemUpgradeV1".into(), "inventoryRefreshV1".into()];
        record.last_seen = Some(start);
        db.put(&device_key(&id), &record, 0).await.expect("device");
        let deployment = deployment.filter(|_| record.agent_present);
        devices.push(SimDevice {
            id,
            index,
            deployment,
        });
    }
    let excluded_a = (0..160).filter(|i| i % 17 == 0).count() as u32;

    // Two replicas over the one store.
    // Each replica knows the devices connected to it: a third of the fleet
    // is seen by both (as over NATS), the rest by one replica each (as
    // WebSocket sessions behind a load balancer).
    let presences: Vec<Arc<Presence>> = (0..2).map(|_| Arc::new(Presence::default())).collect();
    let seen_by = |index: usize| -> Vec<&Arc<Presence>> {
        match index % 3 {
            0 => presences.iter().collect(),
            replica => vec![&presences[replica - 1]],
        }
    };
    let (released_tx, mut released) = mpsc::unbounded_channel();
    let replicas: Vec<Engine> = (0..2)
        .map(|replica| {
            Engine::new(
                db.clone(),
                Arc::new(Notify::new()),
                Some(released_tx.clone()),
            )
            .with_presence(presences[replica].clone())
        })
        .collect();
    let mut feeds: Vec<_> = replicas.iter().map(|_| db.changes()).collect();
    let mut uids = BTreeMap::new();
    for (name, spec) in &specs {
        let record = DeploymentRecord {
            name: (*name).into(),
            uid: JobId::random(),
            created_at: start,
            spec: spec.clone(),
            add_requests: 0,
            status: DeploymentStatus::planning(),
        };
        uids.insert(name.to_string(), record.uid);
        db.put(&deployment_key(name), &record, 0)
            .await
            .expect("deployment");
    }

    let by_id: HashMap<DeviceId, usize> = devices.iter().map(|d| (d.id.clone(), d.index)).collect();
    let mut fleet = Fleet::default();
    let mut online = vec![true; devices.len()];
    let mut now = start;
    let mut peak: BTreeMap<String, u32> = BTreeMap::new();
    let mut retries_checked = 0usize;
    // When each deployment's jobs were released, on the control plane's clock.
    let mut releases: BTreeMap<String, Vec<Timestamp>> = BTreeMap::new();
    let mut canceled_on_devices = 0usize;
    let mut turn = 0u64;
    let end = start + SignedDuration::from_hours(3 * 24 + 1);
    let finished = loop {
        turn += 1;
        now += TURN;
        assert!(now < end, "the deployments did not finish in three days");

        // Presence: heartbeats, drops and returns.
        for device in &devices {
            let off = offline(device.index, start, now);
            for presence in seen_by(device.index) {
                if off && online[device.index] {
                    presence.simulate_gone(&device.id);
                } else if !off {
                    presence.simulate_seen(&device.id, now, !online[device.index]);
                }
            }
            online[device.index] = !off;
        }

        // The delivery core hands released jobs to their devices.
        while let Ok(keys) = released.try_recv() {
            for key in keys {
                let device = key.split('/').nth(1).expect("device");
                let index = by_id[&DeviceId::new(device).expect("id")];
                let (name, job) = job_of(&db, &key).await;
                releases
                    .entry(name)
                    .or_default()
                    .push(job.intent.created_at);
                fleet.inbox.entry(index).or_default().push_back(key);
            }
        }

        // Each device takes what it was sent (if online; an intent past its
        // expiry is expired by the sweeper instead), runs one job at a time.
        for device in &devices {
            let index = device.index;
            let inbox = fleet.inbox.entry(index).or_default();
            let mut still = VecDeque::new();
            while let Some(key) = inbox.pop_front() {
                let (name, job) = job_of(&db, &key).await;
                if now >= job.intent.expires_at {
                    db.update::<JobDelivery, _>(&key, |j| {
                        let mut j = j?;
                        j.delivery = Delivery::Expired { at: now };
                        Some(j)
                    })
                    .await
                    .expect("expire");
                    continue;
                }
                if !online[index] {
                    still.push_back(key);
                    continue;
                }
                if job.cancel_requested_at.is_some() {
                    // The agent cancels a job it holds and has not started.
                    report(&db, &key, JobState::Canceled, now).await;
                    canceled_on_devices += 1;
                    continue;
                }
                if fleet
                    .taken
                    .get(&index)
                    .is_some_and(|taken| taken.iter().any(|(id, _, _)| *id == job.intent.job_id))
                {
                    fleet.duplicates.push(key);
                    continue;
                }
                let spec = &specs.iter().find(|(n, _)| *n == name).expect("spec").1;
                let attempt = job.intent.attempt;
                // Released inside the device's window, on the control plane's clock.
                let (_, target) = db
                    .get::<TargetRecord>(&target_key(uids[&name], &device.id))
                    .await
                    .expect("get")
                    .expect("target");
                let window = spec.maintenance_window.as_ref().expect("window");
                let zone = target
                    .time_zone
                    .as_deref()
                    .or(Some(window.time_zone.as_str()))
                    .and_then(time_zone)
                    .expect("zone");
                assert!(
                    window.contains(&zone, job.intent.created_at),
                    "{key} released at {} outside {}'s window ({:?})",
                    job.intent.created_at,
                    device.id,
                    zone.iana_name()
                );
                // A retry never before its backoff.
                if attempt > 1 {
                    let failed =
                        fleet
                            .failed_at
                            .get(&(name.clone(), device.id.clone(), attempt - 1));
                    if let Some(failed) = failed {
                        let due = *failed + backoff(spec, attempt - 1);
                        assert!(
                            job.intent.created_at >= due,
                            "{key}: attempt {attempt} released at {}, before {due}",
                            job.intent.created_at
                        );
                    }
                }
                fleet
                    .taken
                    .entry(index)
                    .or_default()
                    .push((job.intent.job_id, name, attempt));
                report(&db, &key, JobState::Accepted, now).await;
                fleet.queue.entry(index).or_default().push_back(key);
            }
            *inbox = still;
            if !online[index] {
                continue;
            }
            if let Some(working) = fleet.working.get(&index)
                && now >= working.finish_at
            {
                let working = fleet.working.remove(&index).expect("working");
                let state = if working.fail {
                    JobState::Failed
                } else {
                    JobState::Succeeded
                };
                report(&db, &working.key, state, now).await;
                if working.fail {
                    let (name, job) = job_of(&db, &working.key).await;
                    fleet
                        .failed_at
                        .insert((name, device.id.clone(), job.intent.attempt), now);
                }
            }
            if !fleet.working.contains_key(&index)
                && let Some(key) = fleet.queue.entry(index).or_default().pop_front()
            {
                let (_, job) = db
                    .get::<JobDelivery>(&key)
                    .await
                    .expect("get")
                    .expect("job");
                let attempt = job.intent.attempt;
                report(&db, &key, JobState::Running, now).await;
                fleet.working.insert(
                    index,
                    Working {
                        key,
                        finish_at: now + work(index, attempt),
                        fail: fails(index, attempt),
                    },
                );
            }
        }

        // Both replicas pass, at the same time, the first to ask for the
        // lease taking turns; in stretches of four turns one replica's change
        // feed lags, so its view is behind the store.
        let [feed_a, feed_b] = &mut feeds[..] else {
            unreachable!("two replicas")
        };
        let reads = |replica: u64| !(turn / 4 + replica).is_multiple_of(3);
        let (a, b) = if turn.is_multiple_of(2) {
            tokio::join!(
                replicas[0].turn(feed_a, turn, reads(0), now),
                replicas[1].turn(feed_b, turn, reads(1), now)
            )
        } else {
            let (b, a) = tokio::join!(
                replicas[1].turn(feed_b, turn, reads(1), now),
                replicas[0].turn(feed_a, turn, reads(0), now)
            );
            (a, b)
        };
        a.expect("a turn");
        b.expect("a turn");

        // The rules, on the store's truth.
        let mut all_ended = true;
        for (name, spec) in &specs {
            let (record, targets) = stored(&db, name).await;
            let out = targets
                .iter()
                .filter(|(_, _, t)| t.job.is_some() && t.end.is_none())
                .count() as u32;
            assert!(
                out <= spec.max_concurrency,
                "{name}: {out} targets out at {now}, over {}",
                spec.max_concurrency
            );
            let peak = peak.entry(name.to_string()).or_default();
            *peak = (*peak).max(out);
            for (_, _, target) in &targets {
                if let (None, None, Some(next)) = (&target.end, &target.job, target.next_attempt_at)
                    && let Some(failed) = fleet.failed_at.get(&(
                        name.to_string(),
                        target.device.clone(),
                        target.attempt,
                    ))
                {
                    assert_eq!(
                        next,
                        *failed + backoff(spec, target.attempt),
                        "{name}/{}: the retry of attempt {}: {target:?}",
                        target.device,
                        target.attempt
                    );
                    retries_checked += 1;
                }
            }
            if let Some(threshold) = spec.failure_threshold {
                // Not late: counts that reach it are a stopped deployment's.
                assert!(
                    record.status.threshold_reached_at.is_some()
                        || !threshold.reached(&record.status.counts),
                    "{name}: the threshold was reached at {now} and the rollout goes on: {:?}",
                    record.status
                );
                if let Some(stop) = record.status.threshold_reached_at {
                    // Never early: that many had used up their attempts.
                    let used_up = targets
                        .iter()
                        .filter(|(_, _, t)| {
                            matches!(t.end, Some(TargetEnd::Failed { at }) if at <= stop)
                                && t.attempt == spec.retries + 1
                        })
                        .count() as u32;
                    assert!(
                        used_up >= THRESHOLD,
                        "{name}: stopped at {stop} with {used_up} failed"
                    );
                    let late: Vec<_> = releases
                        .get(*name)
                        .into_iter()
                        .flatten()
                        .filter(|at| **at > stop)
                        .collect();
                    assert!(
                        late.is_empty(),
                        "{name}: released after its stop at {stop}: {late:?}"
                    );
                }
            }
            all_ended &= record.status.phase.is_terminal();
        }
        if all_ended {
            break turn;
        }
    };

    // Every target ended, and the cached counts are a recount.
    for (name, spec) in &specs {
        let (record, targets) = stored(&db, name).await;
        let mut recount = Counts::default();
        for (_, _, target) in &targets {
            match target.end {
                Some(TargetEnd::Succeeded { .. }) => recount.succeeded += 1,
                Some(TargetEnd::Failed { .. }) => recount.failed += 1,
                Some(TargetEnd::Expired { .. }) => recount.expired += 1,
                Some(TargetEnd::Canceled { .. }) => recount.canceled += 1,
                None => panic!("{name}/{} never ended", target.device),
            }
        }
        assert_eq!(record.status.counts, recount, "{name}");
        assert_eq!(record.status.targets as usize, targets.len(), "{name}");
        let expected_targets = devices
            .iter()
            .filter(|d| d.deployment == Some(*name))
            .count();
        assert_eq!(targets.len(), expected_targets, "{name}");
        if *name == "midnight" {
            assert_eq!(record.status.excluded, excluded_a);
        }
        if spec.failure_threshold.is_some() {
            assert_eq!(
                record.status.reason.as_deref(),
                Some(deployment::THRESHOLD_REACHED)
            );
            assert_eq!(record.status.phase, Phase::Failed);
            assert!(recount.canceled > 0, "{name}: the stop canceled targets");
            assert!(recount.succeeded > 0, "{name}: some succeeded first");
            eprintln!("{name}: {:?} {recount:?}", record.status.latest_error);
            continue;
        }
        // Devices that fail every attempt used up their retries and failed.
        for (_, _, target) in &targets {
            let index = by_id[&target.device];
            let always = (1..=spec.retries + 1).all(|a| fails(index, a));
            if always {
                assert!(
                    matches!(target.end, Some(TargetEnd::Failed { .. })),
                    "{name}/{}: {target:?}",
                    target.device
                );
                assert_eq!(target.attempt, spec.retries + 1);
            }
        }
        eprintln!(
            "{name}: {:?} {:?}, peak {} of {} out at once",
            record.status.phase, recount, peak[*name], spec.max_concurrency
        );
        if let Some(rate) = spec.max_releases_per_minute {
            // At most `rate` in any 60 seconds, and that many at times.
            let mut times = releases[*name].clone();
            times.sort();
            let busiest = (0..times.len())
                .map(|i| {
                    times[i..]
                        .iter()
                        .take_while(|t| **t < times[i] + RATE_WINDOW)
                        .count()
                })
                .max()
                .unwrap_or(0);
            eprintln!(
                "{name}: {} releases, at most {busiest} in a minute",
                times.len()
            );
            assert_eq!(
                busiest as u32, rate,
                "{name}: the rate held and was reached"
            );
            continue;
        }
        assert_eq!(
            peak[*name], spec.max_concurrency,
            "{name}: the limit was reached, so it was tested"
        );
    }
    assert!(retries_checked > 0, "some retries were waited for");

    // Each device took each job once; attempts 1, 2, 3... with derived ids.
    let mut attempts_total = 0;
    for (index, taken) in &fleet.taken {
        let device = &devices[*index];
        let mut seen = HashSet::new();
        let mut last_attempt: BTreeMap<&str, u32> = BTreeMap::new();
        for (job, name, attempt) in taken {
            assert!(seen.insert(*job), "{}: job {job} taken twice", device.id);
            let last = last_attempt.entry(name.as_str()).or_default();
            assert_eq!(*attempt, *last + 1, "{}: attempts in order", device.id);
            *last = *attempt;
            assert_eq!(*job, attempt_job_id(uids[name], &device.id, *attempt));
            attempts_total += 1;
        }
    }
    assert!(
        fleet.duplicates.is_empty(),
        "jobs delivered again: {:?}",
        fleet.duplicates
    );
    let failed_attempts = fleet.failed_at.len();
    eprintln!(
        "{finished} turns ({} virtual hours), {attempts_total} attempts taken, \
         {failed_attempts} failed and retried or ended, {retries_checked} retry checks",
        finished as i64 * TURN.as_mins() / 60
    );
    assert!(failed_attempts > 20, "failures were exercised");
    eprintln!("{canceled_on_devices} jobs canceled on their devices");
}

/// Issue 33 item 1 (the jobs seed): a job the device acknowledged but did
/// not start waits, without a clock, while an earlier job on the device is
/// unfinished, and then times out a job timeout (plus grace) after that job
/// ended, not after its own acknowledgement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_job_behind_an_earlier_one_times_out_from_its_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Db::new(Arc::new(
        RedbKv::open(&dir.path().join("drover.redb")).expect("store"),
    ));
    let t0 = t("2027-04-01T10:00:00Z");
    let device = DeviceId::new("q1").expect("id");
    let mut record = DeviceRecord::new(device.clone());
    record.agent_present = true;
    record.capabilities = vec!["systemUpgradeV1".into(), "inventoryRefreshV1".into()];
    record.last_seen = Some(t0);
    db.put(&device_key(&device), &record, 0)
        .await
        .expect("device");
    let presence = Arc::new(Presence::default());
    presence.simulate_seen(&device, t0, true);
    let engine =
        Engine::new(db.clone(), Arc::new(Notify::new()), None).with_presence(presence.clone());
    let mut feed = db.changes();
    let spec = DeploymentSpec {
        targets: Targeting::Devices(vec![device.clone()]),
        job: DeploymentJob::SystemUpgradeV1,
        max_concurrency: 1,
        maintenance_window: None,
        retries: 0,
        retry_backoff_seconds: 60,
        deadline_seconds: 2 * 24 * 3600,
        failure_threshold: None,
        max_releases_per_minute: None,
    };
    let mut turn = 0;
    let mut now = t0;
    let mut job_of = BTreeMap::new();
    // "first" is released at t0, "second" a minute later: behind it.
    for name in ["first", "second"] {
        let record = DeploymentRecord {
            name: name.into(),
            uid: JobId::random(),
            created_at: now,
            spec: spec.clone(),
            add_requests: 0,
            status: DeploymentStatus::planning(),
        };
        db.put(&deployment_key(name), &record, 0)
            .await
            .expect("deployment");
        for _ in 0..3 {
            turn += 1;
            presence.simulate_seen(&device, now, false);
            engine.turn(&mut feed, turn, true, now).await.expect("turn");
        }
        let (_, targets) = stored(&db, name).await;
        let job = targets[0].2.job.expect("released");
        job_of.insert(name, job_key(&device, job));
        now += SignedDuration::from_mins(1);
    }
    // The device runs the first and acknowledges the second.
    report(&db, &job_of["first"], JobState::Running, t0).await;
    report(
        &db,
        &job_of["second"],
        JobState::Accepted,
        t0 + SignedDuration::from_mins(1),
    )
    .await;
    let state_at = async |engine: &Engine, feed: &mut _, turn: u64, at: Timestamp| {
        presence.simulate_seen(&device, at, false);
        engine.turn(feed, turn, true, at).await.expect("turn");
        let (record, targets) = stored(&db, "second").await;
        (record.status.counts, targets[0].2.last_error.clone())
    };
    // The first ends 20 minutes in; the second's clock starts then.
    let ended = t0 + SignedDuration::from_mins(20);
    report(&db, &job_of["first"], JobState::Succeeded, ended).await;
    // 35 minutes after its ack: past a timeout counted from the ack (30
    // minutes), not past one counted from the first job's end.
    turn += 1;
    let (counts, error) =
        state_at(&engine, &mut feed, turn, t0 + SignedDuration::from_mins(36)).await;
    assert_eq!((counts.queued, counts.failed), (1, 0), "{error:?}");
    // A timeout after the first job ended: it times out.
    let timeout = SignedDuration::from_secs(i64::from(deployment::JOB_TIMEOUT_SECONDS))
        + deployment::RUNNING_GRACE;
    turn += 1;
    let (counts, error) = state_at(
        &engine,
        &mut feed,
        turn,
        ended + timeout + SignedDuration::from_secs(1),
    )
    .await;
    assert_eq!((counts.queued, counts.failed), (0, 1), "{error:?}");
    assert!(
        error
            .as_deref()
            .is_some_and(|e| e.contains("acknowledged by the device and not started")),
        "{error:?}"
    );
}
