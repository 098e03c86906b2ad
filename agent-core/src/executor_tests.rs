//! The executor against a real redb store and a counting chain.

use super::*;
use crate::chain::BoxFuture;
use crate::store::RedbStore;
use drover_model::model::JobKind;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};

/// A chain whose steps count how often they ran.
#[derive(Default)]
struct Counting {
    runs: Mutex<HashMap<String, u32>>,
    total: AtomicU32,
}

impl Chain for Counting {
    fn kind(&self) -> &'static str {
        "systemUpgradeV1"
    }
    fn steps(&self) -> &'static [&'static str] {
        &["first", "second"]
    }
    fn run_step<'a>(&'a self, ctx: StepContext<'a>) -> BoxFuture<'a, StepOutcome> {
        Box::pin(async move {
            *self
                .runs
                .lock()
                .expect("lock")
                .entry(ctx.step.to_owned())
                .or_default() += 1;
            self.total.fetch_add(1, Ordering::SeqCst);
            StepOutcome::Done
        })
    }
}

fn settings(dir: &std::path::Path, hold: Option<TestHold>) -> Settings {
    Settings {
        device_id: DeviceId::new("device-1").expect("valid"),
        boot_id: "boot-a".into(),
        agent_version: "test".into(),
        limits: Limits { max_resumes: 5 },
        keep_jobs: 100,
        facts: FactSources {
            root: dir.to_owned(),
        },
        test_hold: hold,
        test_job_budget: None,
        logs: Default::default(),
        trusted_keys: Default::default(),
        device_key: None,
    }
}

fn intent(expires_in: i64) -> Intent {
    let now = Timestamp::now();
    Intent {
        job_id: JobId::random(),
        device_id: DeviceId::new("device-1").expect("valid"),
        kind: JobKind::system_upgrade(),
        attempt: 1,
        created_at: now,
        expires_at: now + jiff::SignedDuration::from_secs(expires_in),
        timeout_seconds: 60,
    }
}

async fn wait_for_state(agent: &Agent, job: JobId, state: JobState) -> JobStatus {
    for _ in 0..200 {
        let found = agent
            .recent_jobs(100)
            .expect("jobs")
            .into_iter()
            .find(|s| s.job_id == job);
        if let Some(status) = found.filter(|s| s.state == state) {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("job {job} never reached {state:?}");
}

#[tokio::test]
async fn a_job_runs_once_and_a_duplicate_is_answered_from_the_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(RedbStore::open(&dir.path().join("a.redb")).expect("open"));
    let chain = Arc::new(Counting::default());
    let agent = Agent::new(settings(dir.path(), None), store, vec![chain.clone()]);
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(agent.clone().run(shutdown.clone()));

    let job = intent(3600);
    let first = agent.admit(Ok(job.clone())).expect("admit");
    assert!(!first.duplicate);
    let done = wait_for_state(&agent, job.job_id, JobState::Succeeded).await;
    assert!(done.completion_heartbeat_at.is_some());
    let again = agent.admit(Ok(job.clone())).expect("admit again");
    assert!(again.duplicate);
    assert_eq!(again.status.state, JobState::Succeeded);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        chain.total.load(Ordering::SeqCst),
        2,
        "two steps, each once"
    );

    let expired = intent(-5);
    let reply = agent.admit(Ok(expired)).expect("admit expired");
    assert_eq!(reply.status.state, JobState::Expired);
    assert_eq!(
        chain.total.load(Ordering::SeqCst),
        2,
        "an expired intent never starts"
    );
    shutdown.cancel();
    worker.await.expect("worker");
}

#[tokio::test]
async fn a_job_interrupted_mid_step_resumes_at_that_step() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("a.redb");
    let hold = TestHold {
        step: "second".into(),
        hold: dir.path().join("hold"),
        reached: dir.path().join("reached"),
    };
    std::fs::write(&hold.hold, "").expect("hold");
    let job = intent(3600);
    let first_chain = Arc::new(Counting::default());
    {
        let store = Arc::new(RedbStore::open(&db).expect("open"));
        let agent = Agent::new(
            settings(dir.path(), Some(hold.clone())),
            store,
            vec![first_chain.clone()],
        );
        let shutdown = CancellationToken::new();
        let worker = tokio::spawn(agent.clone().run(shutdown.clone()));
        agent.admit(Ok(job.clone())).expect("admit");
        for _ in 0..200 {
            if hold.reached.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(hold.reached.exists(), "the job reached the held step");
        shutdown.cancel();
        worker.await.expect("worker");
    }
    std::fs::remove_file(&hold.hold).expect("release");
    let second_chain = Arc::new(Counting::default());
    let store = Arc::new(RedbStore::open(&db).expect("reopen"));
    let agent = Agent::new(
        settings(dir.path(), Some(hold)),
        store,
        vec![second_chain.clone()],
    );
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(agent.clone().run(shutdown.clone()));
    let status = wait_for_state(&agent, job.job_id, JobState::Succeeded).await;
    assert_eq!(
        first_chain.runs.lock().expect("lock").get("first"),
        Some(&1)
    );
    assert_eq!(
        second_chain.runs.lock().expect("lock").get("first"),
        None,
        "a done step never runs again"
    );
    assert_eq!(
        second_chain.runs.lock().expect("lock").get("second"),
        Some(&1)
    );
    assert_eq!(status.steps[1].tries, 1);
    shutdown.cancel();
    worker.await.expect("worker");
}

#[test]
fn heartbeats_increase_across_restarts_with_one_durable_write_per_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Arc<RedbStore> =
        Arc::new(RedbStore::open(&dir.path().join("a.redb")).expect("open"));
    let seqs = |agent: &Agent| -> Vec<u64> {
        (0..5)
            .map(|_| agent.heartbeat().expect("heartbeat").seq)
            .collect()
    };
    let first = seqs(&Agent::new(
        settings(dir.path(), None),
        store.clone(),
        vec![],
    ));
    let second = seqs(&Agent::new(
        settings(dir.path(), None),
        store.clone(),
        vec![],
    ));
    let all: Vec<u64> = first.iter().chain(&second).copied().collect();
    assert!(
        all.windows(2).all(|w| w[0] < w[1]),
        "heartbeats must increase across a restart: {all:?}"
    );
    // Ten heartbeats, two starts: two writes, not ten.
    assert_eq!(store.next("agent-start").expect("counter"), 3);
    assert_eq!(store.next("heartbeat").expect("counter"), 1);
}

/// A control plane's key, and the agent's settings that trust it.
fn signing_key() -> (ring::signature::Ed25519KeyPair, TrustedKeys) {
    use ring::signature::KeyPair;
    let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new())
        .expect("generate");
    let key = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("parse");
    let trusted = TrustedKeys::from_hex(&[drover_model::signing::hex(key.public_key().as_ref())])
        .expect("trusted");
    (key, trusted)
}

fn signed(
    key: &ring::signature::Ed25519KeyPair,
    mut value: serde_json::Value,
) -> serde_json::Value {
    let message = drover_model::signing::canonical(&value).expect("object");
    value[drover_model::signing::SIGNATURE_FIELD] =
        serde_json::Value::String(drover_model::signing::hex(key.sign(&message).as_ref()));
    value
}

fn cancel_order(job: JobId, device: &str) -> serde_json::Value {
    serde_json::json!({"cancelJob": job, "deviceId": device, "attempt": 1})
}

/// The control plane's signed cancel order: a queued job is Canceled and
/// reported, never runs; a job the agent never received is recorded as
/// Canceled so its intent, should it still arrive, never runs (A1); an
/// unsigned order, or one for another device, changes nothing (A11).
#[tokio::test]
async fn a_signed_cancel_order_cancels_queued_and_unreceived_jobs_and_nothing_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(RedbStore::open(&dir.path().join("a.redb")).expect("open"));
    let chain = Arc::new(Counting::default());
    let (key, trusted) = signing_key();
    let mut settings = settings(dir.path(), None);
    settings.trusted_keys = trusted;
    let agent = Agent::new(settings, store, vec![chain.clone()]);
    let intent_value = |intent: &Intent| signed(&key, serde_json::to_value(intent).expect("json"));

    // Queued (the worker is not running yet): canceled, reported.
    let queued = intent(3600);
    agent
        .admit_signed(Ok(intent_value(&queued)))
        .expect("admit");
    let reply = agent
        .admit_signed(Ok(signed(&key, cancel_order(queued.job_id, "device-1"))))
        .expect("cancel");
    assert_eq!(reply.status.state, JobState::Canceled);
    assert!(
        agent
            .outbox(100)
            .expect("outbox")
            .iter()
            .any(|e| e.status.job_id == queued.job_id && e.status.state == JobState::Canceled),
        "the Canceled status is reported"
    );

    // Never received: recorded as Canceled; the intent arriving later is a
    // duplicate and never runs.
    let late = intent(3600);
    let reply = agent
        .admit_signed(Ok(signed(&key, cancel_order(late.job_id, "device-1"))))
        .expect("cancel an unknown job");
    assert_eq!(reply.status.state, JobState::Canceled);
    let again = agent
        .admit_signed(Ok(intent_value(&late)))
        .expect("the intent after its cancel");
    assert!(again.duplicate, "the canceled job's intent is a duplicate");
    assert_eq!(again.status.state, JobState::Canceled);

    // Unsigned, or signed for another device: refused, nothing recorded.
    let kept = intent(3600);
    agent.admit_signed(Ok(intent_value(&kept))).expect("admit");
    let unsigned = agent.admit_signed(Ok(cancel_order(kept.job_id, "device-1")));
    assert!(
        matches!(&unsigned, Err(AdmitError::Unreadable(e)) if e.reason.contains("not signed")),
        "{unsigned:?}"
    );
    let elsewhere = agent.admit_signed(Ok(signed(&key, cancel_order(kept.job_id, "device-2"))));
    assert!(
        matches!(&elsewhere, Err(AdmitError::Unreadable(e)) if e.reason.contains("for device device-2")),
        "{elsewhere:?}"
    );
    let stranger = JobId::random();
    let _ = agent.admit_signed(Ok(cancel_order(stranger, "device-1")));
    assert!(
        agent.job(stranger).expect("job").is_none(),
        "nothing recorded"
    );

    // The worker runs only the job nobody canceled: it picks in arrival
    // order and never a decided job, so once the last one has succeeded
    // nothing else can run.
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(agent.clone().run(shutdown.clone()));
    wait_for_state(&agent, kept.job_id, JobState::Succeeded).await;
    assert_eq!(chain.total.load(Ordering::SeqCst), 2, "one job, two steps");
    assert_eq!(
        agent.job(queued.job_id).expect("job").map(|s| s.state),
        Some(JobState::Canceled)
    );
    shutdown.cancel();
    worker.await.expect("worker");
}

#[tokio::test]
async fn the_supervisor_keeps_the_link_state_and_one_reset_rule_for_every_transport() {
    use crate::backoff::{Backoff, SessionEnd, Supervisor};
    use drover_model::transport::Transport;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(RedbStore::open(&dir.path().join("a.redb")).expect("open"));
    let agent = Agent::new(settings(dir.path(), None), store, Vec::new());
    let shutdown = tokio_util::sync::CancellationToken::new();
    let ms = Duration::from_millis;
    let link = || agent.info().expect("info").link;
    assert_eq!(link().transport, None, "no link started yet");
    let mut supervisor = Supervisor::new(&agent, Transport::Mqtt, Backoff::new(ms(1), ms(4)));
    assert_eq!(link().transport, Some(Transport::Mqtt));
    agent.update_link(|l| l.connected = true);

    // Another credential to try: at once, the link untouched.
    supervisor.start();
    assert!(
        supervisor
            .ended(&agent, SessionEnd::RetryNow, &shutdown)
            .await
    );
    assert!(link().connected);
    // A failure: not connected, its reason kept, counted.
    for n in 1..=3 {
        supervisor.start();
        let end = SessionEnd::Failed(format!("refused {n}"));
        assert!(supervisor.ended(&agent, end, &shutdown).await);
        assert_eq!(supervisor.failures(), n);
    }
    assert!(!link().connected);
    assert_eq!(link().last_error.as_deref(), Some("refused 3"));
    // Closed by the peer: the count starts again.
    supervisor.start();
    assert!(
        supervisor
            .ended(&agent, SessionEnd::Closed, &shutdown)
            .await
    );
    assert_eq!(supervisor.failures(), 0);
    // The link asked to stop, or the agent is stopping: no next session.
    assert!(
        !supervisor
            .ended(&agent, SessionEnd::Shutdown, &shutdown)
            .await
    );
    shutdown.cancel();
    let end = SessionEnd::Failed("late".into());
    assert!(!supervisor.ended(&agent, end, &shutdown).await);
}
