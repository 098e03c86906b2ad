//! The delivery core in milliseconds (issue 29 item 4): the memory store,
//! a fake agent link that records what went out, and a clock the test
//! moves. Each test drives the core's own steps (release, intake, sweep,
//! the end of a delivery) the way its run loop would, without a network,
//! a broker or a wall-clock wait.

use super::*;
use drover_contract::link::{AgentHello, Delivered, LinkError, Reply};
use drover_model::JobId;
use drover_model::model::JobKind;
use drover_store::store::mem::MemKv;
use std::sync::Mutex;

const TRANSPORT: drover_model::transport::Transport = drover_model::transport::Transport::WebSocket;
const ACK_TIMEOUT: Duration = Duration::from_secs(30);

/// A clock the test moves.
struct TestClock(Mutex<Timestamp>);

impl TestClock {
    fn advance(&self, by: SignedDuration) {
        let mut now = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *now += by;
    }
}

impl Clock for TestClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What went out over the fake link, in order.
#[derive(Debug, Clone, PartialEq)]
enum Out {
    Intent(JobId, Timestamp),
    Cancel(JobId),
    Withdraw(JobId),
}

/// An agent link that takes everything and remembers it; or, while `down`,
/// reaches nobody.
#[derive(Default)]
struct FakeLinks {
    out: Mutex<Vec<Out>>,
    down: std::sync::atomic::AtomicBool,
}

impl FakeLinks {
    fn taken(&self) -> Vec<Out> {
        std::mem::take(&mut *self.out.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn record(&self, out: Out) -> Result<Delivered, LinkError> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(Delivered::NotConnected);
        }
        self.out.lock().unwrap_or_else(|p| p.into_inner()).push(out);
        Ok(Delivered::Sent)
    }
}

impl AgentLinks for FakeLinks {
    fn transport(&self) -> drover_model::transport::Transport {
        TRANSPORT
    }

    fn brokered(&self) -> bool {
        false
    }

    fn deliver<'a>(
        &'a self,
        intent: &'a Intent,
        _signed: &'a serde_json::Value,
        server_time: Timestamp,
    ) -> drover_contract::BoxFuture<'a, Result<Delivered, LinkError>> {
        Box::pin(async move { self.record(Out::Intent(intent.job_id, server_time)) })
    }

    fn cancel<'a>(
        &'a self,
        _device: &'a DeviceId,
        job_id: JobId,
        _signed: &'a serde_json::Value,
    ) -> drover_contract::BoxFuture<'a, Result<Delivered, LinkError>> {
        Box::pin(async move { self.record(Out::Cancel(job_id)) })
    }

    fn withdraw<'a>(
        &'a self,
        _device: &'a DeviceId,
        job_id: JobId,
    ) -> drover_contract::BoxFuture<'a, Result<(), LinkError>> {
        Box::pin(async move {
            self.record(Out::Withdraw(job_id))?;
            Ok(())
        })
    }
}

struct Core {
    dispatcher: Dispatcher,
    db: Db,
    link: Arc<FakeLinks>,
    clock: Arc<TestClock>,
    presence: Arc<Presence>,
    _keys: tempfile::TempDir,
}

fn start() -> Timestamp {
    "2027-01-04T10:00:00Z".parse().expect("time")
}

fn device() -> DeviceId {
    DeviceId::new("unit-1").expect("id")
}

impl Core {
    async fn new() -> Self {
        let db = Db::new(Arc::new(MemKv::default()));
        let link = Arc::new(FakeLinks::default());
        let clock = Arc::new(TestClock(Mutex::new(start())));
        let presence = Arc::new(Presence::default());
        let keys = tempfile::tempdir().expect("tempdir");
        let signer = Arc::new(IntentSigner::load_or_create(keys.path()).expect("intent key"));
        let mut record = DeviceRecord::new(device());
        record.transport = Some(TRANSPORT.as_str().into());
        record.agent_present = true;
        db.put(&device_key(&device()), &record, 0)
            .await
            .expect("device");
        let dispatcher = Dispatcher::new(
            db.clone(),
            vec![link.clone() as Arc<dyn AgentLinks>],
            DispatchSettings {
                ack_timeout: ACK_TIMEOUT,
            },
            presence.clone(),
            watch::channel(false).0,
            signer,
        )
        .with_clock(clock.clone());
        Self {
            dispatcher,
            db,
            link,
            clock,
            presence,
            _keys: keys,
        }
    }

    /// Stores a job for the device, as the engine does, and returns its key.
    async fn job(&self, expires_in: SignedDuration, cancel: bool) -> (String, JobId) {
        let now = self.clock.now();
        let job_id = JobId::random();
        let job = JobDelivery {
            intent: Intent {
                job_id,
                device_id: device(),
                kind: JobKind::system_upgrade(),
                attempt: 1,
                created_at: now,
                expires_at: now + expires_in,
                timeout_seconds: 1500,
            },
            run: Some("unit-run".into()),
            delivery: Delivery::Created,
            status: None,
            created_at: now,
            terminal_received_at: None,
            cancel_requested_at: cancel.then_some(now),
        };
        let key = job_key(&device(), job_id);
        self.db.put(&key, &job, 0).await.expect("job");
        (key, job_id)
    }

    /// Lets every delivery in flight end, as the run loop does.
    async fn settle(&mut self) {
        while let Some(done) = self.dispatcher.in_flight.join_next().await {
            if let Ok((flight, transport, result)) = done {
                self.dispatcher.delivered(flight, transport, result);
            }
            self.dispatcher.start_queued();
        }
    }

    async fn release(&mut self, key: &str) {
        self.dispatcher.released(vec![key.to_owned()]).await;
        self.settle().await;
    }

    async fn sweep_after(&mut self, wait: SignedDuration) {
        self.clock.advance(wait);
        self.dispatcher.sweep().await;
        self.settle().await;
    }

    async fn event(&mut self, inbound: Inbound) {
        self.dispatcher
            .handle(vec![Event {
                transport: TRANSPORT,
                inbound,
            }])
            .await;
        self.settle().await;
    }

    /// The delivery state the core holds in memory for an open job.
    fn delivery(&self, key: &str) -> Option<Delivery> {
        self.dispatcher.open.get(key).map(|o| o.delivery.clone())
    }

    /// A status of `job` in `state`, as an agent sends it.
    fn status(&self, job: JobId, state: drover_model::JobState) -> Inbound {
        let now = self.clock.now();
        Inbound::Status {
            device: device(),
            status: Box::new(drover_model::JobStatus {
                job_id: job,
                device_id: device(),
                attempt: 1,
                kind: "systemUpgradeV1".into(),
                state,
                steps: Vec::new(),
                error: None,
                output: None,
                accepted_at: now,
                started_at: Some(now),
                finished_at: state.is_terminal().then_some(now),
                boot_id: "boot-1".into(),
                completion_heartbeat_at: None,
                seq: 1,
                failure: None,
                reason: Vec::new(),
            }),
            received_at: now,
            position: None,
            reply: Reply::none(),
        }
    }

    async fn stored(&self, key: &str) -> JobDelivery {
        self.db
            .get::<JobDelivery>(key)
            .await
            .expect("read")
            .expect("the job is stored")
            .1
    }
}

fn secs(s: i64) -> SignedDuration {
    SignedDuration::from_secs(s)
}

#[tokio::test]
async fn a_released_job_goes_out_once_and_again_only_when_its_ack_is_late() {
    let mut core = Core::new().await;
    let (key, job) = core.job(secs(3600), false).await;
    core.release(&key).await;
    assert_eq!(core.link.taken(), vec![Out::Intent(job, start())]);

    // Inside the ack timeout nothing goes out again.
    core.sweep_after(secs(29)).await;
    assert_eq!(core.link.taken(), vec![]);

    // Past it, the intent goes out again, stamped with the clock's time.
    core.sweep_after(secs(1)).await;
    assert_eq!(
        core.link.taken(),
        vec![Out::Intent(job, start() + secs(30))]
    );

    // Acknowledged: never sent again, and stored so (the API shows it
    // acked before the agent's first status arrives, issue 33 item 7).
    assert_eq!(core.stored(&key).await.delivery, Delivery::Created);
    core.event(Inbound::Ack {
        device: device(),
        job_id: job,
    })
    .await;
    assert!(matches!(core.delivery(&key), Some(Delivery::Acked { .. })));
    assert!(matches!(
        core.stored(&key).await.delivery,
        Delivery::Acked { .. }
    ));
    core.sweep_after(secs(120)).await;
    assert_eq!(core.link.taken(), vec![]);
}

#[tokio::test]
async fn a_job_whose_link_reaches_nobody_is_tried_again_at_the_next_sweep_due() {
    let mut core = Core::new().await;
    core.link
        .down
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let (key, job) = core.job(secs(3600), false).await;
    core.release(&key).await;
    assert_eq!(core.link.taken(), vec![]);
    assert_eq!(
        core.delivery(&key),
        Some(Delivery::Created),
        "a delivery that reached nobody returns the job to created"
    );
    core.link
        .down
        .store(false, std::sync::atomic::Ordering::SeqCst);
    core.sweep_after(secs(30)).await;
    assert_eq!(
        core.link.taken(),
        vec![Out::Intent(job, start() + secs(30))]
    );
}

#[tokio::test]
async fn an_intent_past_its_expiry_never_goes_out_and_is_stored_expired() {
    let mut core = Core::new().await;
    let (key, job) = core.job(secs(60), false).await;
    core.link
        .down
        .store(true, std::sync::atomic::Ordering::SeqCst);
    core.release(&key).await;
    core.link
        .down
        .store(false, std::sync::atomic::Ordering::SeqCst);
    core.sweep_after(secs(61)).await;
    let out = core.link.taken();
    assert!(
        !out.iter().any(|o| matches!(o, Out::Intent(..))),
        "an expired intent went out: {out:?}"
    );
    assert_eq!(out, vec![Out::Withdraw(job)], "and is withdrawn");
    assert_eq!(
        core.stored(&key).await.delivery,
        Delivery::Expired {
            at: start() + secs(61)
        }
    );
    assert!(!core.dispatcher.open.contains_key(&key), "it is decided");
}

#[tokio::test]
async fn a_job_canceled_before_it_went_out_sends_the_order_never_the_intent() {
    let mut core = Core::new().await;
    let (key, job) = core.job(secs(3600), true).await;
    core.release(&key).await;
    assert_eq!(core.link.taken(), vec![Out::Cancel(job)]);
    // The order got out: it is not repeated on every sweep.
    core.sweep_after(secs(60)).await;
    let out = core.link.taken();
    assert!(
        !out.iter().any(|o| matches!(o, Out::Intent(..))),
        "the intent went out after the cancel: {out:?}"
    );
}

#[tokio::test]
async fn a_hello_without_the_job_gets_it_again_and_a_hello_holding_it_acknowledges_it() {
    let mut core = Core::new().await;
    let (key, job) = core.job(secs(3600), false).await;
    core.release(&key).await;
    assert_eq!(core.link.taken().len(), 1);
    core.presence
        .simulate_seen(&device(), core.clock.now(), true);
    let hello = |held: Vec<drover_model::model::HeldJob>| Inbound::Hello {
        device: device(),
        hello: Box::new(AgentHello {
            agent_version: "test".into(),
            boot_id: "boot-1".into(),
            capabilities: vec!["systemUpgradeV1".into()],
            held,
        }),
        reply: Reply::none(),
    };
    // The agent came back without it: it was lost on the way.
    core.clock.advance(secs(1));
    core.event(hello(Vec::new())).await;
    assert_eq!(core.link.taken(), vec![Out::Intent(job, start() + secs(1))]);
    // Back again, holding it: acknowledged, nothing sent.
    core.event(hello(vec![drover_model::model::HeldJob {
        job_id: job,
        state: drover_model::JobState::Accepted,
    }]))
    .await;
    assert_eq!(core.link.taken(), vec![]);
    assert!(matches!(core.delivery(&key), Some(Delivery::Acked { .. })));
    assert!(
        matches!(core.stored(&key).await.delivery, Delivery::Acked { .. }),
        "a hello's acknowledgement is stored, as an ack's is"
    );
    core.sweep_after(secs(120)).await;
    assert_eq!(core.link.taken(), vec![]);
}

#[tokio::test]
async fn a_broker_that_lost_its_state_gets_every_undecided_intent_again_but_no_decided_one() {
    let mut core = Core::new().await;
    let (first, one) = core.job(secs(3600), false).await;
    let (second, two) = core.job(secs(3600), false).await;
    let (third, three) = core.job(secs(3600), false).await;
    for key in [&first, &second, &third] {
        core.release(key).await;
    }
    assert_eq!(core.link.taken().len(), 3);
    core.event(Inbound::Ack {
        device: device(),
        job_id: one,
    })
    .await;
    // The third ends: its status is stored and its intent withdrawn.
    core.event(core.status(three, drover_model::JobState::Succeeded))
        .await;
    assert_eq!(core.link.taken(), vec![Out::Withdraw(three)]);
    assert!(!core.dispatcher.open.contains_key(&third), "decided");
    assert!(core.stored(&third).await.terminal_received_at.is_some());

    core.clock.advance(secs(5));
    core.event(Inbound::Resend).await;
    let mut out = core.link.taken();
    out.sort_by_key(|o| format!("{o:?}"));
    let mut want = vec![
        Out::Intent(one, start() + secs(5)),
        Out::Intent(two, start() + secs(5)),
    ];
    want.sort_by_key(|o| format!("{o:?}"));
    assert_eq!(out, want, "every undecided intent, and not the decided one");
    assert!(core.dispatcher.open.contains_key(&second));
}

#[test]
fn the_sweeper_notices_a_missing_ack_within_a_second_of_the_timeout() {
    use std::time::Duration;
    assert_eq!(
        super::sweep_period(Duration::from_secs(60)),
        Duration::from_secs(1)
    );
    assert_eq!(
        super::sweep_period(Duration::from_secs(600)),
        Duration::from_secs(1)
    );
    assert_eq!(
        super::sweep_period(Duration::from_secs(30)),
        Duration::from_millis(500)
    );
    assert_eq!(
        super::sweep_period(Duration::from_secs(2)),
        Duration::from_millis(200)
    );
}
