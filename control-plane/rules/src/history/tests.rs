use super::*;
use crate::records::Delivery;
use drover_model::JobState;
use drover_model::model::{Intent, JobStatus};

fn t(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).expect("time")
}

fn job(kind: JobKind, state: Option<JobState>, finished: i64) -> JobDelivery {
    let device = DeviceId::new("d1").expect("id");
    let job_id = JobId::random();
    let name = kind.name().to_owned();
    let upgrade = matches!(kind, JobKind::SystemUpgradeV1(_));
    let intent = Intent {
        job_id,
        device_id: device.clone(),
        kind,
        attempt: 1,
        created_at: t(finished - 10),
        expires_at: t(finished + 3600),
        timeout_seconds: 60,
    };
    let status = state.map(|state| JobStatus {
        job_id,
        device_id: device,
        attempt: 1,
        kind: name,
        state,
        steps: Vec::new(),
        error: (state == JobState::Failed).then(|| "apt-get failed".to_owned()),
        output: (upgrade && state == JobState::Succeeded).then(|| {
            JobOutput::Upgrade(UpgradeOutput {
                simulated: false,
                upgraded: vec![PackageChange {
                    name: "bash".into(),
                    from: Some("5.1".into()),
                    to: "5.2".into(),
                }],
                installed: Vec::new(),
                removed: Vec::new(),
                kept_back: Vec::new(),
                omitted: 0,
                reboot_required: false,
            })
        }),
        accepted_at: t(finished - 9),
        started_at: Some(t(finished - 8)),
        finished_at: Some(t(finished)),
        boot_id: "b".into(),
        completion_heartbeat_at: None,
        seq: 3,
        failure: None,
        reason: if state == JobState::Failed {
            vec!["E: Unable to correct problems, you have held broken packages.".into()]
        } else {
            Vec::new()
        },
    });
    JobDelivery {
        intent,
        run: Some("weekly-1".into()),
        delivery: Delivery::Acked {
            at: t(finished - 9),
        },
        status,
        created_at: t(finished - 10),
        terminal_received_at: Some(t(finished)),
        cancel_requested_at: None,
    }
}

fn upgrade() -> JobKind {
    JobKind::SystemUpgradeV1(Default::default())
}

#[test]
fn a_decided_job_is_kept_with_its_result_and_reason_and_an_undecided_one_is_not() {
    let ok = record_of(&job(upgrade(), Some(JobState::Succeeded), 100), t(200)).expect("kept");
    assert_eq!(ok.kind, "systemUpgradeV1");
    assert_eq!(ok.run.as_deref(), Some("weekly-1"));
    assert_eq!(ok.state, "succeeded");
    assert_eq!(ok.finished_at, Some(t(100)));
    assert_eq!(ok.archived_at, t(200));
    assert!(ok.is_succeeded_upgrade());
    let said = ok.result_text.clone().unwrap_or_default();
    assert!(said.contains("bash 5.1 → 5.2"), "{said}");
    let report = ok.upgrade_output().expect("the report");
    assert_eq!(report.upgraded[0].to, "5.2");

    let failed = record_of(&job(upgrade(), Some(JobState::Failed), 100), t(200)).expect("kept");
    assert_eq!(failed.state, "failed");
    assert_eq!(failed.error.as_deref(), Some("apt-get failed"));
    assert_eq!(failed.reason.len(), 1);
    assert!(!failed.is_succeeded_upgrade());
    assert!(failed.upgrade.is_none());

    for undecided in [None, Some(JobState::Accepted), Some(JobState::Running)] {
        assert_eq!(
            record_of(&job(upgrade(), undecided, 100), t(200)),
            None,
            "{undecided:?}"
        );
    }
    // Expired before the device took it: kept, ended when it expired.
    let mut expired = job(upgrade(), None, 100);
    expired.delivery = Delivery::Expired { at: t(150) };
    expired.terminal_received_at = None;
    let expired = record_of(&expired, t(200)).expect("kept");
    assert_eq!(expired.state, "expired");
    assert_eq!(expired.finished_at, Some(t(150)));
}

#[test]
fn retention_keeps_the_newest_within_the_age_and_one_upgrade_report() {
    let retention = Retention {
        per_device: 3,
        max_age: SignedDuration::from_hours(24),
    };
    let now = t(100_000);
    let record = |kind: JobKind, state, finished| {
        record_of(&job(kind, Some(state), finished), now).expect("decided")
    };
    let assess = || JobKind::PatchAssessmentV1(Default::default());
    let history = vec![
        record(upgrade(), JobState::Succeeded, 99_000), // newest upgrade: keeps its report
        record(assess(), JobState::Succeeded, 98_000),
        record(upgrade(), JobState::Succeeded, 97_000), // kept, report dropped
        record(upgrade(), JobState::Failed, 96_000),    // past the count
        record(upgrade(), JobState::Succeeded, 1_000),  // past the count and the age
    ];
    let trimmed = trim(&history, retention, now);
    assert_eq!(trimmed.delete, vec![history[3].job, history[4].job]);
    assert_eq!(trimmed.drop_report, vec![history[2].job]);

    // Within the count, only the age deletes.
    let roomy = Retention {
        per_device: 10,
        ..retention
    };
    let trimmed = trim(&history, roomy, now);
    assert_eq!(trimmed.delete, vec![history[4].job]);
    // The positive control: a history within both keeps everything.
    let young = &history[..2];
    assert!(trim(young, roomy, now).is_empty());
}

#[test]
fn a_key_names_its_device() {
    let device = DeviceId::new("pi-kitchen").expect("id");
    let job = JobId::random();
    let key = history_key(&device, job);
    assert!(key.starts_with(&device_history_prefix(&device)));
    assert_eq!(device_of_key(&key), Some("pi-kitchen"));
    assert_eq!(device_of_key("jobs/pi-kitchen/x"), None);
}
