//! Table tests of the job lifecycle: each row is (state before, event,
//! expected state, persist, next).

use super::*;
use drover_model::JobId;
use drover_model::model::JobKind;

const STEPS: &[&str] = &["preflight", "work", "reboot", "confirm"];
const LIMITS: Limits = Limits { max_resumes: 3 };

fn t(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).expect("valid time")
}

fn device() -> DeviceId {
    DeviceId::new("device-1").expect("valid")
}

fn intent(expires_in: i64) -> Intent {
    Intent {
        job_id: JobId::random(),
        device_id: device(),
        kind: JobKind::system_upgrade(),
        attempt: 1,
        created_at: t(0),
        expires_at: t(expires_in),
        timeout_seconds: 1500,
    }
}

fn ctx<'a>(
    device: &'a DeviceId,
    busy: bool,
    steps: Option<&'static [&'static str]>,
) -> AdmitContext<'a> {
    let unfinished = usize::from(busy);
    AdmitContext {
        device_id: device,
        boot_id: "boot-a",
        now: t(10),
        control_plane_now: t(10),
        arrival: 1,
        unfinished,
        steps,
    }
}

fn admitted(expires_in: i64) -> JobRecord {
    let device = device();
    match admit(
        None,
        Ok(intent(expires_in)),
        &ctx(&device, false, Some(STEPS)),
    ) {
        Ok(Admission::New(record)) => record,
        other => panic!("expected a new job, got {other:?}"),
    }
}

fn pick(now: i64, boot: &str) -> Event {
    Event::Pick {
        now: t(now),
        control_plane_now: t(now),
        boot_id: boot.into(),
    }
}

fn finished(now: i64, outcome: StepOutcome) -> Event {
    Event::StepFinished {
        now: t(now),
        boot_id: "boot-a".into(),
        outcome,
    }
}

/// Drives a record through events and checks the last transition.
fn check(events: Vec<Event>, expected: (JobState, Persist, Next)) -> JobRecord {
    let mut record = admitted(3600);
    let mut last = (Persist::Nothing, Next::Stop);
    for event in events {
        let (next_record, persist, next) = transition(record, event, LIMITS);
        record = next_record;
        last = (persist, next);
    }
    assert_eq!((record.status.state, last.0, last.1), expected);
    record
}

/// (name, parsed intent, busy, steps of the kind, error fragment, expected
/// state, expected failure)
type AdmissionCase = (
    &'static str,
    Result<Intent, IntentError>,
    bool,
    Option<&'static [&'static str]>,
    &'static str,
    JobState,
    Option<Failure>,
);

#[test]
fn admission_table() {
    let me = device();
    let fresh = intent(3600);
    let cases: Vec<AdmissionCase> = vec![
        (
            "idle agent accepts",
            Ok(fresh.clone()),
            false,
            Some(STEPS),
            "",
            JobState::Accepted,
            None,
        ),
        (
            "busy agent queues",
            Ok(fresh.clone()),
            true,
            Some(STEPS),
            "",
            JobState::Waiting,
            None,
        ),
        (
            "expired on arrival",
            Ok(intent(5)),
            false,
            Some(STEPS),
            "expired",
            JobState::Expired,
            None,
        ),
        (
            "kind without a chain",
            Ok(fresh.clone()),
            false,
            None,
            "does not support",
            JobState::Rejected,
            Some(Failure::UnknownKind),
        ),
        (
            "unknown kind with a job id",
            Err(IntentError {
                job_id: Some(JobId::random()),
                device_id: None,
                kind: Some("containerV1".into()),
                attempt: 1,
                reason: "unknown job kind \"containerV1\"".into(),
                failure: Failure::UnknownKind,
            }),
            false,
            Some(STEPS),
            "unknown job kind",
            JobState::Rejected,
            Some(Failure::UnknownKind),
        ),
    ];
    for (name, parsed, busy, steps, error, state, failure) in cases {
        let got = admit(None, parsed, &ctx(&me, busy, steps)).expect(name);
        let record = match got {
            Admission::New(r) | Admission::Refused(r) => r,
            Admission::Duplicate(_) => panic!("{name}: unexpected duplicate"),
        };
        assert_eq!(record.status.state, state, "{name}");
        assert_eq!(record.status.failure, failure, "{name}");
        let got_error = record.status.error.unwrap_or_default();
        assert!(got_error.contains(error), "{name}: {got_error}");
    }
}

#[test]
fn a_known_job_id_is_a_duplicate_and_an_unreadable_one_is_an_error() {
    let me = device();
    let record = admitted(3600);
    let again = admit(
        Some(record.clone()),
        Ok(intent(3600)),
        &ctx(&me, false, Some(STEPS)),
    );
    assert_eq!(again, Ok(Admission::Duplicate(record)));
    let unreadable = IntentError {
        job_id: None,
        device_id: None,
        kind: None,
        attempt: 0,
        reason: "not json".into(),
        failure: Failure::Malformed,
    };
    assert!(admit(None, Err(unreadable), &ctx(&me, false, Some(STEPS))).is_err());
}

#[test]
fn a_full_queue_refuses_with_a_reason() {
    let me = device();
    let full = AdmitContext {
        unfinished: MAX_UNFINISHED,
        ..ctx(&me, true, Some(STEPS))
    };
    match admit(None, Ok(intent(3600)), &full) {
        Ok(Admission::Refused(record)) => {
            assert!(
                record
                    .status
                    .error
                    .unwrap_or_default()
                    .contains("queue is full")
            )
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn an_intent_for_another_device_is_dropped_and_never_recorded() {
    let me = device();
    let other = DeviceId::new("device-2").expect("valid");
    let foreign = Intent {
        device_id: other.clone(),
        ..intent(3600)
    };
    let own_job = admitted(3600);
    // Even when this device holds a job of that id, the foreign copy is
    // dropped rather than answered as a duplicate.
    for existing in [None, Some(own_job)] {
        let err = admit(existing, Ok(foreign.clone()), &ctx(&me, false, Some(STEPS)))
            .expect_err("dropped");
        assert_eq!(err.job_id, Some(foreign.job_id));
        assert!(
            err.reason.contains("is for device device-2"),
            "{}",
            err.reason
        );
    }
    let malformed_foreign = IntentError {
        job_id: Some(JobId::random()),
        device_id: Some(other),
        kind: Some("containerV1".into()),
        attempt: 1,
        reason: "unknown job kind".into(),
        failure: Failure::UnknownKind,
    };
    assert!(admit(None, Err(malformed_foreign), &ctx(&me, false, Some(STEPS))).is_err());
}

#[test]
fn a_recorded_refusal_never_shadows_a_valid_intent_of_the_same_id() {
    let me = device();
    let valid = intent(3600);
    let refused = match admit(
        None,
        Err(IntentError {
            job_id: Some(valid.job_id),
            device_id: Some(me.clone()),
            kind: Some("containerV1".into()),
            attempt: 1,
            reason: "unknown job kind \"containerV1\"".into(),
            failure: Failure::UnknownKind,
        }),
        &ctx(&me, false, Some(STEPS)),
    ) {
        Ok(Admission::Refused(record)) => record,
        other => panic!("expected a refusal, got {other:?}"),
    };
    // The same refusal again is a duplicate; a valid intent takes its place.
    let bad_again = IntentError {
        job_id: Some(valid.job_id),
        device_id: Some(me.clone()),
        kind: None,
        attempt: 1,
        reason: "malformed".into(),
        failure: Failure::Malformed,
    };
    assert!(matches!(
        admit(
            Some(refused.clone()),
            Err(bad_again),
            &ctx(&me, false, Some(STEPS))
        ),
        Ok(Admission::Duplicate(_))
    ));
    match admit(
        Some(refused.clone()),
        Ok(valid.clone()),
        &ctx(&me, false, Some(STEPS)),
    ) {
        Ok(Admission::New(record)) => {
            assert_eq!(record.status.state, JobState::Accepted);
            assert_eq!(record.status.job_id, valid.job_id);
            assert!(
                record.status.seq > refused.status.seq,
                "ordered after the refusal"
            );
        }
        other => panic!("expected the valid intent admitted, got {other:?}"),
    }
    // An accepted job is never replaced.
    let accepted = admitted(3600);
    assert!(matches!(
        admit(Some(accepted), Ok(valid), &ctx(&me, false, Some(STEPS))),
        Ok(Admission::Duplicate(_))
    ));
}

#[test]
fn expiry_is_judged_on_the_control_planes_clock_not_the_devices() {
    let me = device();
    // The device's clock is two hours fast; the control plane says t(10).
    let fast = AdmitContext {
        now: t(10 + 7200),
        ..ctx(&me, false, Some(STEPS))
    };
    match admit(None, Ok(intent(600)), &fast) {
        Ok(Admission::New(record)) => assert_eq!(record.status.state, JobState::Accepted),
        other => panic!("a fast device clock must not expire the intent: {other:?}"),
    }
    // The device's clock is two hours slow, but the control plane is past expiry.
    let slow = AdmitContext {
        now: t(10 - 7200),
        control_plane_now: t(700),
        ..ctx(&me, false, Some(STEPS))
    };
    match admit(None, Ok(intent(600)), &slow) {
        Ok(Admission::New(record)) => assert_eq!(record.status.state, JobState::Expired),
        other => panic!("expected expired, got {other:?}"),
    }
    // At pick-up too.
    let (record, _, _) = transition(
        admitted(600),
        Event::Pick {
            now: t(20),
            control_plane_now: t(601),
            boot_id: "boot-a".into(),
        },
        LIMITS,
    );
    assert_eq!(record.status.state, JobState::Expired);
    let (record, _, _) = transition(
        admitted(600),
        Event::Pick {
            now: t(9000),
            control_plane_now: t(20),
            boot_id: "boot-a".into(),
        },
        LIMITS,
    );
    assert_eq!(record.status.state, JobState::Running);
}

#[test]
fn transition_table() {
    use JobState::*;
    check(
        vec![pick(20, "boot-a")],
        (Running, Persist::Report, Next::RunStep(0)),
    );
    check(
        vec![pick(4000, "boot-a")],
        (Expired, Persist::Report, Next::Stop),
    );
    check(
        vec![pick(20, "boot-a"), finished(21, StepOutcome::Done)],
        (Running, Persist::Report, Next::RunStep(1)),
    );
    check(
        vec![
            pick(20, "boot-a"),
            finished(
                21,
                StepOutcome::RetryAfter {
                    after: Duration::from_secs(5),
                    reason: "lock".into(),
                },
            ),
        ],
        (
            Running,
            Persist::Save,
            Next::RetryStep {
                index: 0,
                after: Duration::from_secs(5),
            },
        ),
    );
    let failed = check(
        vec![
            pick(20, "boot-a"),
            finished(21, StepOutcome::Fail("disk full".into())),
        ],
        (Failed, Persist::Report, Next::Stop),
    );
    assert_eq!(failed.status.failure, Some(Failure::StepFailed));
    // A crash while a step ran: the same step runs again, earlier ones do not.
    check(
        vec![
            pick(20, "boot-a"),
            finished(21, StepOutcome::Done),
            pick(30, "boot-a"),
        ],
        (Running, Persist::Save, Next::RunStep(1)),
    );
    // Reboot: awaiting until a new boot id is seen.
    let to_reboot = vec![
        pick(20, "boot-a"),
        finished(21, StepOutcome::Done),
        finished(22, StepOutcome::Done),
        finished(23, StepOutcome::Reboot),
    ];
    check(
        to_reboot.clone(),
        (AwaitingReboot, Persist::Report, Next::Reboot),
    );
    let mut same_boot = to_reboot.clone();
    same_boot.push(pick(40, "boot-a"));
    check(same_boot, (AwaitingReboot, Persist::Save, Next::Reboot));
    let mut new_boot = to_reboot.clone();
    new_boot.push(pick(90, "boot-b"));
    let record = check(
        new_boot.clone(),
        (Running, Persist::Report, Next::RunStep(3)),
    );
    assert_eq!(record.status.steps[2].state, StepState::Done);
    assert_eq!(record.status.boot_id, "boot-b");
    new_boot.push(finished(91, StepOutcome::Done));
    let record = check(new_boot, (Succeeded, Persist::Report, Next::Stop));
    assert_eq!(record.status.completion_heartbeat_at, Some(t(91)));
    // Cancel: only before start.
    check(
        vec![Event::Cancel { now: t(15) }],
        (Canceled, Persist::Report, Next::Stop),
    );
    check(
        vec![pick(20, "boot-a"), Event::Cancel { now: t(21) }],
        (Running, Persist::Nothing, Next::Stop),
    );
    // A terminal job never advances.
    check(
        vec![
            pick(20, "boot-a"),
            finished(21, StepOutcome::Fail("x".into())),
            pick(30, "boot-a"),
        ],
        (Failed, Persist::Nothing, Next::Stop),
    );
}

#[test]
fn the_loop_breaker_fails_a_job_resumed_too_often() {
    let mut events = vec![pick(20, "boot-a")];
    for n in 0..LIMITS.max_resumes {
        events.push(pick(30 + i64::from(n), "boot-a"));
    }
    check(
        events.clone(),
        (JobState::Running, Persist::Save, Next::RunStep(0)),
    );
    events.push(pick(100, "boot-a"));
    let record = check(events, (JobState::Failed, Persist::Report, Next::Stop));
    assert_eq!(record.status.failure, Some(Failure::ResumeLoop));
    // The text older control planes recognise the loop by.
    assert!(
        record
            .status
            .error
            .unwrap_or_default()
            .contains(drover_model::failure::RESUME_LOOP_TEXT)
    );
}

#[test]
fn every_change_bumps_the_sequence_and_steps_record_their_time() {
    let record = check(
        vec![pick(20, "boot-a"), finished(25, StepOutcome::Done)],
        (JobState::Running, Persist::Report, Next::RunStep(1)),
    );
    assert_eq!(record.status.seq, 3);
    let first = &record.status.steps[0];
    assert_eq!(
        (first.state, first.tries, first.seconds),
        (StepState::Done, 1, Some(5.0))
    );
    assert_eq!(record.status.steps[1].started_at, Some(t(25)));
}

#[test]
fn only_a_failed_local_job_resumes_from_its_failed_step() {
    let failing = vec![
        pick(20, "boot-a"),
        finished(21, StepOutcome::Done),
        finished(22, StepOutcome::Fail("lock".into())),
    ];
    // A fleet job never resumes.
    let mut fleet = failing.clone();
    fleet.push(Event::Resume { now: t(30) });
    check(fleet, (JobState::Failed, Persist::Nothing, Next::Stop));
    // A local one continues at the failed step, with a new start.
    let mut record = admitted(3600);
    record.origin = Origin::Local;
    for event in failing {
        record = transition(record, event, LIMITS).0;
    }
    let (record, persist, next) = transition(record, Event::Resume { now: t(30) }, LIMITS);
    assert_eq!(
        (record.status.state, persist, next),
        (JobState::Running, Persist::Report, Next::RunStep(1))
    );
    let step = &record.status.steps[1];
    assert_eq!(
        (step.state, step.started_at, step.tries),
        (StepState::Running, Some(t(30)), 1)
    );
    assert_eq!(
        record.status.steps[0].tries, 1,
        "the done step is untouched"
    );
    assert_eq!(record.status.error, None);
    // A running job cannot be resumed.
    let (_, persist, _) = transition(record, Event::Resume { now: t(31) }, LIMITS);
    assert_eq!(persist, Persist::Nothing);
}
