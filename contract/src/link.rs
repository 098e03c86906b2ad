//! What a transport's server side offers the control plane. Inbound, one
//! closed enum for every transport; outbound, deliver or withdraw an intent.
//! The control plane's delivery core answers every event that needs an
//! answer through its [`Reply`] only after the event's effects are committed
//! to the store: a transport confirms a status to the agent no sooner (A4).

use crate::BoxFuture;
use drover_model::model::{Heartbeat, HeldJob, Intent, JobStatus};
use drover_model::transport::Transport;
use drover_model::{DeviceId, JobId};
use jiff::Timestamp;
use tokio::sync::oneshot;

/// Who an agent says it is when it (re)connects.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentHello {
    pub agent_version: String,
    pub boot_id: String,
    pub capabilities: Vec<String>,
    /// Jobs the agent still holds: unfinished, or finished but unconfirmed.
    pub held: Vec<HeldJob>,
}

impl From<drover_model::model::Hello> for AgentHello {
    /// The hello an agent sent, less the device it names (the transport
    /// checked that against the device it authenticated).
    fn from(hello: drover_model::model::Hello) -> Self {
        Self {
            agent_version: hello.agent_version,
            boot_id: hello.boot_id,
            capabilities: hello.capabilities,
            held: hello.jobs,
        }
    }
}

/// Something that came in over a transport. The device is the one the
/// transport authenticated, never one a message names.
#[derive(Debug)]
pub enum Inbound {
    Hello {
        device: DeviceId,
        hello: Box<AgentHello>,
        reply: Reply,
    },
    /// The agent recorded the job durably.
    Ack { device: DeviceId, job_id: JobId },
    Status {
        device: DeviceId,
        /// Boxed: events wait in a queue, and most are small.
        status: Box<JobStatus>,
        /// When it reached the control plane's side, on a clock no device
        /// sets: the control plane's, or the broker's for a status the
        /// broker kept while no control plane ran (A12).
        received_at: Timestamp,
        /// The broker's position of this status, for transports that replay
        /// from a position after a restart; committed with the status.
        position: Option<u64>,
        reply: Reply,
    },
    Heartbeat {
        device: DeviceId,
        heartbeat: Box<Heartbeat>,
        /// Refused when what the device reports cannot be kept.
        reply: Reply,
    },
    /// The device's connection to this replica ended.
    Gone { device: DeviceId },
    /// Every status the broker kept while no control plane ran has been
    /// handed over; deadlines may be judged now.
    CaughtUp,
    /// The broker lost what it kept (a restart between its saves): every
    /// undecided intent of a device on this transport goes out again. The
    /// control plane's store is the truth, never the broker.
    Resend,
}

/// One inbound event and the transport it came over.
#[derive(Debug)]
pub struct Event {
    pub transport: Transport,
    pub inbound: Inbound,
}

/// The delivery core's answer to an event, sent after its commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Committed (or a duplicate of what is committed): confirm it.
    Stored,
    /// Decided and refused with a reason; confirm it, and say why.
    Refused(String),
    /// Not committed (a store error): do not confirm; the agent sends it again.
    Failed(String),
}

/// Where an event's answer goes; dropping it unanswered means `Failed`.
#[derive(Debug)]
pub struct Reply(Option<oneshot::Sender<Answer>>);

impl Reply {
    /// An event nobody waits on.
    pub fn none() -> Self {
        Self(None)
    }

    /// A reply and the receiver its answer arrives on.
    pub fn channel() -> (Self, oneshot::Receiver<Answer>) {
        let (tx, rx) = oneshot::channel();
        (Self(Some(tx)), rx)
    }

    /// Whether someone waits on the answer (an agent that resends what is
    /// not confirmed); a broker's backlog handed over waits on nobody.
    pub fn is_awaited(&self) -> bool {
        self.0.is_some()
    }

    pub fn send(mut self, answer: Answer) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(answer);
        }
    }
}

/// What became of a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivered {
    /// Written to the device's connection, or stored for it by a broker.
    Sent,
    /// This replica cannot reach the device now (no connection here).
    NotConnected,
}

/// Where a link's connection to its broker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    /// Connected, and its loop moves.
    Up,
    /// Not connected now; it is trying again.
    Connecting,
    /// Its loop stopped moving while connected; it drops the connection and
    /// connects again.
    Stalled,
}

impl LinkState {
    /// The name the metrics and `/healthz` use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Up => "up",
            Self::Connecting => "connecting",
            Self::Stalled => "stalled",
        }
    }
}

/// How a link is doing, for `/healthz` and the metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkHealth {
    pub state: LinkState,
    /// When the link last moved: a packet in or out, a connection attempt.
    /// None where nothing is measured (a listener waits for its agents).
    pub last_progress: Option<Timestamp>,
    /// Why it is not up, in words.
    pub reason: Option<String>,
    /// How many times it was found stalled since the process started.
    pub stalls: u64,
    /// When the last stall was found, and what the loop waited on.
    pub last_stall: Option<(Timestamp, String)>,
}

impl LinkHealth {
    /// A link with nothing that can stall (WebSocket: agents connect to it).
    pub fn always_up() -> Self {
        Self {
            state: LinkState::Up,
            last_progress: None,
            reason: None,
            stalls: 0,
            last_stall: None,
        }
    }
}

/// A link's health as its loop updates it and the API reads it.
#[derive(Debug)]
pub struct HealthCell(std::sync::Mutex<LinkHealth>);

impl Default for HealthCell {
    fn default() -> Self {
        Self(std::sync::Mutex::new(LinkHealth {
            state: LinkState::Connecting,
            last_progress: None,
            reason: Some("not connected yet".into()),
            stalls: 0,
            last_stall: None,
        }))
    }
}

impl HealthCell {
    /// A std Mutex: held only to copy or change a few fields, never across
    /// an await.
    fn change(&self, change: impl FnOnce(&mut LinkHealth)) {
        let mut health = self.0.lock().unwrap_or_else(|p| p.into_inner());
        change(&mut health);
    }

    /// The loop moved.
    pub fn progress(&self) {
        self.change(|h| h.last_progress = Some(Timestamp::now()));
    }

    pub fn connected(&self) {
        self.change(|h| {
            h.state = LinkState::Up;
            h.reason = None;
            h.last_progress = Some(Timestamp::now());
        });
    }

    pub fn connecting(&self, reason: String) {
        self.change(|h| {
            // A stall stays the reason until the link is up again.
            if h.state != LinkState::Stalled {
                h.state = LinkState::Connecting;
                h.reason = Some(reason);
            }
            h.last_progress = Some(Timestamp::now());
        });
    }

    pub fn stalled(&self, reason: String) {
        self.change(|h| {
            h.state = LinkState::Stalled;
            h.last_stall = Some((Timestamp::now(), reason.clone()));
            h.reason = Some(reason);
            h.stalls += 1;
        });
    }

    pub fn get(&self) -> LinkHealth {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{transport}: {reason}")]
pub struct LinkError {
    pub transport: Transport,
    pub reason: String,
}

impl From<LinkError> for crate::logs::AskError {
    fn from(e: LinkError) -> Self {
        Self::Link(e.to_string())
    }
}

/// One transport's server side.
pub trait AgentLinks: Send + Sync + 'static {
    /// The transport, whose name devices record.
    fn transport(&self) -> Transport;

    /// True when a broker holds intents for devices (NATS, MQTT): any
    /// replica reaches any device, so only one should deliver. False when
    /// only the replica holding the device's connection can (WebSocket).
    fn brokered(&self) -> bool;

    /// Delivers an intent: `signed` is what goes on the wire (the intent's
    /// JSON with the control plane's signature, A11); `server_time` goes with
    /// it where the wire carries the control plane's clock (A12).
    fn deliver<'a>(
        &'a self,
        intent: &'a Intent,
        signed: &'a serde_json::Value,
        server_time: Timestamp,
    ) -> BoxFuture<'a, Result<Delivered, LinkError>>;

    /// Delivers the control plane's signed order to cancel a job
    /// (`drover_model::wire::CancelOrder`). A broker keeps it in the intent's
    /// place, so an agent that was away reads the order, never the intent.
    fn cancel<'a>(
        &'a self,
        device: &'a DeviceId,
        job_id: JobId,
        signed: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<Delivered, LinkError>>;

    /// How the link's connection is doing (`/healthz`, the metrics).
    fn health(&self) -> LinkHealth {
        LinkHealth::always_up()
    }

    /// Asks `device` for a job's output (`drover logs`): the answer comes
    /// on the stream as the device sends it. Not every link carries it.
    fn logs<'a>(
        &'a self,
        device: &'a DeviceId,
        job: Option<String>,
        tail: Option<u32>,
    ) -> BoxFuture<'a, Result<crate::logs::LogStream, crate::logs::AskError>> {
        let _ = (device, job, tail);
        Box::pin(async move { Err(crate::logs::AskError::Unsupported(self.transport())) })
    }

    /// Withdraws an intent that is decided (finished or expired): a broker
    /// forgets it. A no-op where nothing is kept.
    fn withdraw<'a>(
        &'a self,
        device: &'a DeviceId,
        job_id: JobId,
    ) -> BoxFuture<'a, Result<(), LinkError>>;
}
