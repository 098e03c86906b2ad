//! The control plane's end over MQTT as an agent link (mosquitto's files,
//! which confine each device to its own topics, are `crate::mosquitto`).
//!
//! The control plane keeps one persistent session (clean session off) and
//! acknowledges what it receives to the broker only once the delivery core
//! committed it (manual acks): a control plane that dies before its commit
//! gets the message again from its session. Intents go out retained; a
//! decided one is withdrawn with an empty retained payload. When the broker
//! comes back without the session (mosquitto loses what it had not saved),
//! every undecided intent is sent again: the store is the truth.

use crate::inbound::{heartbeat_event, status_event};
use crate::{Control, MqttSettings, TRANSPORT, Topic, Topics, options};
use drover_contract::BoxFuture;
use drover_contract::gate::DeviceGate;
use drover_contract::link::{
    AgentHello, AgentLinks, Answer, Delivered, Event as LinkEvent, HealthCell, Inbound, LinkError,
    LinkHealth, Reply,
};
use drover_model::model::{Hello, Intent};
use drover_model::{DeviceId, JobId};
use jiff::Timestamp;
use rumqttc::{AsyncClient, Event, EventLoop, Incoming, Publish, QoS, SubscribeFilter};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// How long a quiet spell after connecting means the session's backlog of
/// statuses is handed over (MQTT says no more than that).
const BACKLOG_QUIET: Duration = Duration::from_millis(500);
const BACKLOG_MAX: Duration = Duration::from_secs(15);
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// Requests waiting for the event loop to send them (rumqttc's queue).
pub const REQUEST_QUEUE: usize = 10_000;

pub struct MqttLinks {
    pub(crate) client: AsyncClient,
    topics: Topics,
    /// Judges devices that ask to join (`crate::joining`), once the control
    /// plane has handed it over ([`MqttLinks::judge_with`]).
    pub(crate) gate: tokio::sync::watch::Sender<Option<Arc<dyn DeviceGate>>>,
    events: mpsc::Sender<LinkEvent>,
    health: HealthCell,
    /// What the loop waits on now ([`Waiting`]), for the stall warning.
    waiting: AtomicU8,
    /// The loop not moving for this long is a stall: the broker's own rule
    /// for a client that stopped talking (1.5 keep-alives).
    stall_after: Duration,
    /// What is asked of the broker about devices' logins (`crate::joining`).
    pub(crate) logins: crate::admissions::Logins,
    /// Log requests this replica sent and waits on.
    logs: Arc<drover_contract::logs::Waiters>,
}

/// What the link's loop waits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Waiting {
    /// The next packet, or room to write one.
    Broker = 0,
    /// Room in the delivery core's queue of events.
    Core = 1,
}

impl Waiting {
    fn describe(value: u8) -> &'static str {
        if value == Self::Core as u8 {
            "waiting for the delivery core to take an event"
        } else {
            "waiting for the broker"
        }
    }
}

/// What one turn of the loop did.
enum Step {
    /// An event from the broker's connection, handled.
    Moved,
    /// Nothing came within the quiet tick.
    Quiet,
    /// The connection failed; the next turn connects again.
    Failed,
    /// The delivery core stopped: the link stops too.
    CoreGone,
}

/// What the loop remembers between turns.
struct Session {
    first: bool,
    backlog_since: Option<tokio::time::Instant>,
    last_message: tokio::time::Instant,
}

fn link_error(e: impl std::fmt::Display) -> LinkError {
    LinkError {
        transport: TRANSPORT,
        reason: e.to_string(),
    }
}

impl MqttLinks {
    /// Connects (the event loop runs in [`MqttLinks::run`]).
    /// `request_queue` bounds what waits for the event loop to send it.
    pub fn new(
        settings: &MqttSettings,
        client_id: &str,
        request_queue: usize,
        events: mpsc::Sender<LinkEvent>,
    ) -> Result<(Arc<Self>, EventLoop), crate::MqttError> {
        let mut options = options(settings, client_id)?;
        options
            .set_manual_acks(true)
            .set_inflight(1000)
            .set_max_packet_size(
                crate::SERVER_READ_LIMIT,
                crate::MAX_MESSAGE_BYTES + 64 * 1024,
            );
        let (client, event_loop) = crate::client(options, request_queue.max(1));
        Ok((
            Arc::new(Self {
                client,
                topics: Topics::new(&settings.prefix),
                gate: tokio::sync::watch::Sender::new(None),
                events,
                health: HealthCell::default(),
                waiting: AtomicU8::new(Waiting::Broker as u8),
                stall_after: (settings.keep_alive * 3 / 2).max(Duration::from_secs(1)),
                logins: Default::default(),
                logs: Arc::default(),
            }),
            event_loop,
        ))
    }

    /// Devices that ask to join are judged by `gate` from now on (those
    /// that asked before wait for it), and the broker's logins are checked
    /// against the keys it accepted.
    pub fn judge_with(self: &Arc<Self>, gate: Arc<dyn DeviceGate>) {
        self.gate.send_replace(Some(gate));
        // Logins that outlived their keys are found and removed.
        self.list_logins_periodically();
        self.send_logins();
    }

    pub(crate) async fn send(&self, inbound: Inbound) -> bool {
        self.waiting.store(Waiting::Core as u8, Ordering::Relaxed);
        let sent = self
            .events
            .send(LinkEvent {
                transport: TRANSPORT,
                inbound,
            })
            .await
            .is_ok();
        self.waiting.store(Waiting::Broker as u8, Ordering::Relaxed);
        sent
    }

    /// Runs the event loop until `shutdown`.
    ///
    /// The loop is the only thing that drains rumqttc's request queue, so it
    /// never waits for room there: what it sends itself (subscriptions,
    /// acknowledgements) is tried at once and, when the queue is full, handed
    /// to a task that waits. And it watches itself: when a turn does not move
    /// for [`MqttLinks::stall_after`], it says so, drops the connection and
    /// connects again; the broker then hands over again what was not
    /// acknowledged.
    pub async fn run(self: Arc<Self>, mut event_loop: EventLoop, shutdown: CancellationToken) {
        let mut session = Session {
            first: true,
            backlog_since: None,
            last_message: tokio::time::Instant::now(),
        };
        let mut moved = tokio::time::Instant::now();
        loop {
            let deadline = moved + self.stall_after;
            let step = tokio::select! {
                _ = shutdown.cancelled() => {
                    let _ = self.client.try_disconnect();
                    return;
                }
                step = self.step(&mut event_loop, &mut session, &shutdown) => Some(step),
                _ = tokio::time::sleep_until(deadline) => None,
            };
            match step {
                Some(Step::Moved | Step::Failed) => {
                    moved = tokio::time::Instant::now();
                    self.health.progress();
                }
                Some(Step::Quiet) => {}
                Some(Step::CoreGone) => return,
                None => {
                    let waiting = Waiting::describe(self.waiting.load(Ordering::Relaxed));
                    let seconds = self.stall_after.as_secs_f64();
                    warn!(
                        seconds,
                        waiting,
                        "the MQTT link has not moved for {seconds:.0} s ({waiting}); \
                         dropping the connection and connecting again"
                    );
                    self.health.stalled(format!(
                        "did not move for {seconds:.0} s ({waiting}); reconnecting"
                    ));
                    self.waiting.store(Waiting::Broker as u8, Ordering::Relaxed);
                    // Drops the connection; the next poll connects again and
                    // the broker resends what this replica did not
                    // acknowledge (the message in hand, if any).
                    event_loop.clean();
                    moved = tokio::time::Instant::now();
                }
            }
        }
    }

    /// One turn: the next event from the broker's connection, handled.
    async fn step(
        self: &Arc<Self>,
        event_loop: &mut EventLoop,
        session: &mut Session,
        shutdown: &CancellationToken,
    ) -> Step {
        let event = tokio::select! {
            event = event_loop.poll() => event,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {
                if let Some(since) = session.backlog_since
                    && (session.last_message.elapsed() >= BACKLOG_QUIET
                        || since.elapsed() >= BACKLOG_MAX)
                {
                    session.backlog_since = None;
                    if !self.send(Inbound::CaughtUp).await {
                        return Step::CoreGone;
                    }
                }
                return Step::Quiet;
            }
        };
        match event {
            Ok(Event::Incoming(Incoming::ConnAck(ack))) => {
                info!(
                    session_present = ack.session_present,
                    "connected to the MQTT broker"
                );
                self.health.connected();
                self.subscribe();
                self.logins.reconnected();
                if session.first {
                    session.backlog_since = Some(tokio::time::Instant::now());
                    session.last_message = tokio::time::Instant::now();
                }
                // The broker came back without our session: it lost what
                // it kept, retained intents too. Send them again.
                if !ack.session_present && !session.first && !self.send(Inbound::Resend).await {
                    return Step::CoreGone;
                }
                session.first = false;
            }
            Ok(Event::Incoming(Incoming::Publish(publish))) => {
                session.last_message = tokio::time::Instant::now();
                if !self.on_publish(publish).await {
                    return Step::CoreGone;
                }
            }
            Ok(_) => {}
            Err(e) => {
                warn!(error = %e, "MQTT connection failed; reconnecting");
                self.health.connecting(format!("connection failed: {e}"));
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = shutdown.cancelled() => {}
                }
                return Step::Failed;
            }
        }
        Step::Moved
    }

    /// Subscribes to what the control plane reads, without waiting in the loop.
    fn subscribe(self: &Arc<Self>) {
        let filters = || {
            self.topics
                .server_filters()
                .into_iter()
                .chain([crate::dynsec::response_topic()])
                .map(|filter| SubscribeFilter::new(filter, QoS::AtLeastOnce))
                .collect::<Vec<_>>()
        };
        if self.client.try_subscribe_many(filters()).is_err() {
            let (links, filters) = (self.clone(), filters());
            tokio::spawn(async move {
                if let Err(e) = links.client.subscribe_many(filters).await {
                    warn!(error = %e, "cannot subscribe");
                }
            });
        }
    }

    /// Hands one message to the delivery core; it is acknowledged to the
    /// broker once answered. Returns false when the core has stopped.
    async fn on_publish(self: &Arc<Self>, publish: Publish) -> bool {
        if publish.topic == crate::dynsec::response_topic() {
            self.on_dynsec_response(publish);
            return true;
        }
        let topic = self.topics.parse(&publish.topic);
        // Bigger than any message Drover sends: dropped here, so that one
        // device cannot make the link fail on it (the broker would hand it
        // over again at every connection). A status topic's retained copy
        // goes too, so the device keeps nothing there.
        if publish.payload.len() > crate::MAX_MESSAGE_BYTES {
            warn!(
                topic = %publish.topic,
                bytes = publish.payload.len(),
                limit = crate::MAX_MESSAGE_BYTES,
                "message over the size limit dropped (set mosquitto's max_packet_size, \
                 as `drover mqtt-config` prints, so the broker refuses it first)"
            );
            if matches!(topic, Some(Topic::Status(..))) {
                self.clear_soon(publish.topic.clone());
            }
            self.ack_soon(publish);
            return true;
        }
        let (inbound, answer) = match topic {
            // The control plane's own clearing of a retained status.
            Some(Topic::Status(..)) if publish.payload.is_empty() => {
                self.ack_soon(publish);
                return true;
            }
            Some(Topic::Status(device, job)) => match status_event(device, job, &publish) {
                Some((event, answer)) => (event, Some(answer)),
                None => {
                    self.clear_soon(publish.topic.clone());
                    self.ack_soon(publish);
                    return true;
                }
            },
            Some(Topic::Hello(device)) => return self.on_hello(device, publish).await,
            Some(Topic::Enroll(device)) => {
                self.on_enroll(device, publish);
                return true;
            }
            Some(Topic::LogsAnswer(device)) => {
                crate::inbound::log_chunk(&self.logs, &device, &publish.payload);
                self.ack_soon(publish);
                return true;
            }
            Some(Topic::Heartbeat(device)) => match heartbeat_event(device, &publish.payload) {
                Some(event) => (event, None),
                None => {
                    debug!(topic = %publish.topic, "unusable heartbeat ignored");
                    self.ack_soon(publish);
                    return true;
                }
            },
            _ => {
                debug!(topic = %publish.topic, "message on an unexpected topic ignored");
                self.ack_soon(publish);
                return true;
            }
        };
        if !self.send(inbound).await {
            return false;
        }
        match answer {
            // Acknowledged to the broker only once committed (or decided); a
            // decided job's retained status is cleared once stored.
            Some((answer, terminal)) => {
                let links = self.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(ANSWER_TIMEOUT, answer).await {
                        // A decided job's retained status is cleared once
                        // stored, and a refused one at once: a device keeps
                        // retained only the statuses of its open jobs.
                        Ok(Ok(answer @ (Answer::Stored | Answer::Refused(_)))) => {
                            links.ack(&publish).await;
                            if terminal || matches!(answer, Answer::Refused(_)) {
                                let topic = publish.topic.clone();
                                let _ = links
                                    .client
                                    .publish(topic, QoS::AtLeastOnce, true, Vec::new())
                                    .await;
                            }
                        }
                        _ => {
                            debug!(topic = %publish.topic, "not committed; the broker keeps it for the next session")
                        }
                    }
                });
            }
            None => self.ack_soon(publish),
        }
        true
    }

    /// A hello: handed to the delivery core, then answered on the device's
    /// control topic and acknowledged to the broker once decided (false:
    /// the delivery core has stopped).
    async fn on_hello(self: &Arc<Self>, device: DeviceId, publish: Publish) -> bool {
        match serde_json::from_slice::<Hello>(&publish.payload) {
            Ok(hello) if hello.device_id == device => {
                let (reply, answer) = Reply::channel();
                let links = self.clone();
                let control = self.topics.control(&device);
                let event = Inbound::Hello {
                    device,
                    hello: Box::new(AgentHello::from(hello)),
                    reply,
                };
                if !self.send(event).await {
                    return false;
                }
                tokio::spawn(async move {
                    let error = match tokio::time::timeout(ANSWER_TIMEOUT, answer).await {
                        Ok(Ok(Answer::Stored)) => None,
                        Ok(Ok(Answer::Refused(e) | Answer::Failed(e))) => Some(e),
                        Ok(Err(_)) | Err(_) => Some("the control plane did not answer".into()),
                    };
                    links.control(&control, error).await;
                    links.ack(&publish).await;
                });
                true
            }
            _ => {
                warn!(topic = %publish.topic, "unusable hello ignored");
                self.ack_soon(publish);
                true
            }
        }
    }

    /// Clears a retained status topic from the loop, without waiting there.
    fn clear_soon(self: &Arc<Self>, topic: String) {
        if self
            .client
            .try_publish(topic.clone(), QoS::AtLeastOnce, true, Vec::new())
            .is_err()
        {
            let links = self.clone();
            tokio::spawn(async move {
                let _ = links
                    .client
                    .publish(topic, QoS::AtLeastOnce, true, Vec::new())
                    .await;
            });
        }
    }

    /// Acknowledges a message to the broker from the loop: at once when the
    /// request queue has room, else from a task that waits for it (the loop
    /// must not: only it makes room).
    pub(crate) fn ack_soon(self: &Arc<Self>, publish: Publish) {
        if self.client.try_ack(&publish).is_err() {
            let links = self.clone();
            tokio::spawn(async move { links.ack(&publish).await });
        }
    }

    pub(crate) async fn ack(&self, publish: &Publish) {
        if let Err(e) = self.client.ack(publish).await {
            debug!(error = %e, "cannot acknowledge a message");
        }
    }

    async fn control(&self, topic: &str, error: Option<String>) {
        let control = Control {
            server_time: Timestamp::now(),
            error,
        };
        if let Ok(payload) = serde_json::to_vec(&control)
            && let Err(e) = self
                .client
                .publish(topic, QoS::AtLeastOnce, false, payload)
                .await
        {
            debug!(error = %e, "cannot answer a hello");
        }
    }
}

impl MqttLinks {
    /// Publishes what the broker keeps for a device's job, retained QoS 1 on
    /// its intent topic: the signed intent, the signed cancel order in its
    /// place, or nothing (withdrawn).
    async fn retain(
        &self,
        device: &DeviceId,
        job_id: JobId,
        payload: Vec<u8>,
    ) -> Result<(), LinkError> {
        self.client
            .publish(
                self.topics.intent(device, job_id),
                QoS::AtLeastOnce,
                true,
                payload,
            )
            .await
            .map_err(link_error)
    }
}

impl AgentLinks for MqttLinks {
    fn transport(&self) -> drover_model::transport::Transport {
        TRANSPORT
    }

    fn brokered(&self) -> bool {
        true
    }

    fn health(&self) -> LinkHealth {
        self.health.get()
    }

    fn deliver<'a>(
        &'a self,
        intent: &'a Intent,
        signed: &'a serde_json::Value,
        _server_time: Timestamp,
    ) -> BoxFuture<'a, Result<Delivered, LinkError>> {
        Box::pin(async move {
            let payload = serde_json::to_vec(signed).map_err(link_error)?;
            self.retain(&intent.device_id, intent.job_id, payload)
                .await?;
            Ok(Delivered::Sent)
        })
    }

    fn cancel<'a>(
        &'a self,
        device: &'a DeviceId,
        job_id: JobId,
        signed: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<Delivered, LinkError>> {
        Box::pin(async move {
            let payload = serde_json::to_vec(signed).map_err(link_error)?;
            // In the intent's place: the broker keeps the order, not the
            // intent, for an agent that is away.
            self.retain(device, job_id, payload).await?;
            Ok(Delivered::Sent)
        })
    }

    fn logs<'a>(
        &'a self,
        device: &'a DeviceId,
        job: Option<String>,
        tail: Option<u32>,
    ) -> BoxFuture<'a, Result<drover_contract::logs::LogStream, drover_contract::logs::AskError>>
    {
        Box::pin(async move {
            let stream = self.logs.open(device, job, tail)?;
            let payload = serde_json::to_vec(&stream.request).map_err(link_error)?;
            let topic = self.topics.logs_ask(device);
            let publish = self.client.publish(topic, QoS::AtLeastOnce, false, payload);
            publish.await.map_err(link_error)?;
            Ok(stream)
        })
    }

    fn withdraw<'a>(
        &'a self,
        device: &'a DeviceId,
        job_id: JobId,
    ) -> BoxFuture<'a, Result<(), LinkError>> {
        Box::pin(self.retain(device, job_id, Vec::new()))
    }
}
