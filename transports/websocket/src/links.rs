//! The control plane's side of the WebSocket protocol as an agent link: the
//! listener, TLS, the handshake with the device token, and one session per
//! connected agent that turns frames into inbound events and delivers jobs.
//! A status is confirmed with `received` only once the delivery core has
//! committed it; bad input gets an `error` frame and the session goes on.
//!
//! Per connection the session keeps little: small WebSocket buffers, an
//! outgoing queue, and the statuses awaiting their commit. Jobs, states and
//! decisions are the delivery core's.

use crate::protocol::{AgentMessage, DecodeError, ServerMessage};
use crate::server::{Door, Io, accept};
use crate::{MAX_FRAME_BYTES, MAX_MESSAGE_BYTES};
use drover_contract::BoxFuture;
use drover_contract::link::{
    AgentHello, AgentLinks, Answer, Delivered, Event, Inbound, LinkError, Reply,
};
use drover_contract::logs::{AskError, LogStream, Waiters};
use drover_model::model::Intent;
use drover_model::{DeviceId, JobId};
use futures_util::stream::FuturesUnordered;
use futures_util::{SinkExt, StreamExt};
use jiff::Timestamp;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

pub const TRANSPORT: drover_model::transport::Transport =
    drover_model::transport::Transport::WebSocket;
/// How long a new connection may take for its TLS and WebSocket handshakes.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a new connection may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a hello may wait for the delivery core.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// The control plane's judgement of who comes in.
pub type Gate = Arc<dyn drover_contract::gate::DeviceGate>;

/// Small buffers for an idle device: a message larger than the read buffer
/// is still read, in pieces.
fn server_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(0)
        .max_message_size(Some(MAX_FRAME_BYTES))
        .max_frame_size(Some(MAX_FRAME_BYTES))
}

struct Session {
    id: u64,
    outgoing: mpsc::UnboundedSender<Message>,
}

/// WebSocket agents connected to this replica.
pub struct WsLinks {
    /// A std Mutex: nothing awaits while it is held.
    sessions: Mutex<HashMap<DeviceId, Session>>,
    next_id: AtomicU64,
    events: mpsc::Sender<Event>,
    /// Log requests sent to agents connected here.
    logs: Arc<Waiters>,
}

impl WsLinks {
    pub fn new(events: mpsc::Sender<Event>) -> Arc<Self> {
        Arc::new(Self {
            sessions: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            events,
            logs: Arc::default(),
        })
    }

    /// Agents connected here now.
    pub fn connected(&self) -> usize {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Ends `device`'s session here, if it has one, telling the agent why
    /// (its token was revoked): an error frame, then a close. The agent
    /// connects again with whatever token it has, and the handshake decides.
    pub fn disconnect(&self, device: &DeviceId, why: &str) {
        let sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(session) = sessions.get(device) {
            let _ = session.outgoing.send(error_frame(why));
            let _ = session.outgoing.send(Message::Close(None));
        }
    }

    /// Accepts agents until `shutdown`. A connection holds one of
    /// `admission`'s pending slots (a few per address) through its TLS and
    /// WebSocket handshakes, each given [`HANDSHAKE_TIMEOUT`], and one of its
    /// established slots once its token is accepted: idle sockets from one
    /// address keep out neither devices that finished their handshakes nor
    /// those connecting from elsewhere. More are closed at once.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        tls: Option<tokio_rustls::TlsAcceptor>,
        gate: Gate,
        admission: Arc<drover_net::admission::Admission>,
        shutdown: CancellationToken,
    ) {
        while let Some((tcp, peer, pending)) =
            admission.accept("agents", &listener, &shutdown).await
        {
            let links = self.clone();
            let (tls, gate, shutdown) = (tls.clone(), gate.clone(), shutdown.clone());
            let admission = admission.clone();
            tokio::spawn(async move {
                let _ = tcp.set_nodelay(true);
                let handshake = async {
                    let stream: Box<dyn Io> = match &tls {
                        Some(acceptor) => match acceptor.accept(tcp).await {
                            Ok(tls) => Box::new(tls),
                            Err(e) => return Err(format!("TLS handshake failed: {e}")),
                        },
                        None => Box::new(tcp),
                    };
                    let mut agent = accept(stream, gate.as_ref(), Some(server_config()))
                        .await
                        .map_err(|e| e.to_string())?;
                    if let Door::Key(key) = &agent.door {
                        crate::door::prove(&mut agent.ws, &agent.device_id, key).await?;
                    }
                    Ok(agent)
                };
                let accepted = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                    Ok(accepted) => accepted,
                    Err(_) => Err(format!("no handshake within {HANDSHAKE_TIMEOUT:?}")),
                };
                match accepted {
                    Ok(agent) if agent.door == Door::Enroll => {
                        let answer = tokio::time::timeout(
                            HANDSHAKE_TIMEOUT,
                            crate::door::enroll(
                                agent.ws,
                                &agent.device_id,
                                peer.ip(),
                                gate.as_ref(),
                            ),
                        )
                        .await;
                        drop(pending);
                        match answer {
                            Ok(answer) => {
                                info!(%peer, device = %agent.device_id, ?answer, "enrollment answered")
                            }
                            Err(_) => {
                                info!(%peer, device = %agent.device_id, "enrollment timed out")
                            }
                        }
                    }
                    Ok(mut agent) if agent.probe => {
                        drop(pending);
                        info!(device = %agent.device_id, "connection check: the device's token is good");
                        let _ = agent.ws.close(None).await;
                    }
                    Ok(mut agent) => {
                        let _slot = match pending.establish() {
                            Ok(slot) => slot,
                            Err(why) => {
                                let refused = admission.refused();
                                if refused.is_power_of_two() {
                                    warn!(%peer, device = %agent.device_id, refused, reason = %why, "agent connection closed");
                                }
                                let _ = agent.ws.close(None).await;
                                return;
                            }
                        };
                        let span = info_span!("agent", device = %agent.device_id);
                        links
                            .session(agent.device_id, agent.ws, shutdown)
                            .instrument(span)
                            .await;
                    }
                    Err(e) => info!(%peer, error = %e, "agent connection refused"),
                }
            });
        }
    }

    async fn session(
        self: Arc<Self>,
        device: DeviceId,
        ws: WebSocketStream<Box<dyn Io>>,
        shutdown: CancellationToken,
    ) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (outgoing, queue) = mpsc::unbounded_channel();
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(device.clone(), Session { id, outgoing });
        let result = self.converse(&device, ws, queue, &shutdown).await;
        let current = {
            let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
            let current = sessions.get(&device).is_some_and(|s| s.id == id);
            if current {
                sessions.remove(&device);
            }
            current
        };
        if current {
            let _ = self
                .events
                .send(Event {
                    transport: TRANSPORT,
                    inbound: Inbound::Gone {
                        device: device.clone(),
                    },
                })
                .await;
        }
        match result {
            Ok(()) => info!("agent disconnected"),
            Err(e) => info!(error = %e, "agent session ended"),
        }
    }

    async fn send_event(&self, inbound: Inbound) -> Result<(), SessionError> {
        self.events
            .send(Event {
                transport: TRANSPORT,
                inbound,
            })
            .await
            .map_err(|_| SessionError::Protocol("the control plane is stopping".into()))
    }

    async fn converse(
        &self,
        device: &DeviceId,
        ws: WebSocketStream<Box<dyn Io>>,
        mut queue: mpsc::UnboundedReceiver<Message>,
        shutdown: &CancellationToken,
    ) -> Result<(), SessionError> {
        let (mut sink, mut stream) = ws.split();
        let hello = tokio::time::timeout(HELLO_TIMEOUT, stream.next())
            .await
            .map_err(|_| SessionError::Protocol("no hello within 10 s".into()))?;
        let hello = match hello {
            Some(Ok(Message::Text(text))) => match AgentMessage::decode(text.as_str()) {
                Ok(AgentMessage::Hello(hello)) => {
                    let device_id = &hello.device_id;
                    if device_id != device {
                        let message = format!(
                            "hello names device {device_id}, but the token is for {device}"
                        );
                        let _ = sink.send(error_frame(&message)).await;
                        return Err(SessionError::Protocol(message));
                    }
                    AgentHello::from(hello)
                }
                Ok(_) => {
                    let _ = sink
                        .send(error_frame("the first message must be hello"))
                        .await;
                    return Err(SessionError::Protocol("first message was not hello".into()));
                }
                Err(e) => {
                    let _ = sink.send(error_frame(&e.to_string())).await;
                    return Err(SessionError::Protocol(e.to_string()));
                }
            },
            Some(Ok(_)) => return Err(SessionError::Protocol("first frame was not text".into())),
            Some(Err(e)) => return Err(SessionError::Ws(e)),
            None => return Ok(()),
        };
        let held = hello.held.len();
        let (reply, answer) = Reply::channel();
        self.send_event(Inbound::Hello {
            device: device.clone(),
            hello: Box::new(hello),
            reply,
        })
        .await?;
        match tokio::time::timeout(ANSWER_TIMEOUT, answer).await {
            Ok(Ok(Answer::Stored)) => {}
            Ok(Ok(Answer::Refused(reason) | Answer::Failed(reason))) => {
                let _ = sink.send(error_frame(&reason)).await;
                return Err(SessionError::Protocol(reason));
            }
            Ok(Err(_)) | Err(_) => {
                return Err(SessionError::Protocol(
                    "the control plane did not take the hello".into(),
                ));
            }
        }
        info!(held, "agent connected");
        // Statuses awaiting their commit, answered in whatever order.
        let mut commits = FuturesUnordered::new();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    let _ = sink.send(Message::Close(None)).await;
                    return Ok(());
                }
                message = queue.recv() => {
                    let Some(message) = message else { return Ok(()) };
                    let closing = matches!(message, Message::Close(_));
                    sink.send(message).await?;
                    if closing {
                        // Closed by the control plane (`disconnect`): nothing
                        // more is read from this connection.
                        return Err(SessionError::Protocol("closed by the control plane".into()));
                    }
                }
                Some((outbox_id, answer)) = commits.next(), if !commits.is_empty() => {
                    let answer: Result<Answer, _> = answer;
                    match (answer, outbox_id) {
                        (Ok(Answer::Stored), Some(outbox_id)) => {
                            sink.send(Message::text(ServerMessage::Received { outbox_id }.encode())).await?;
                        }
                        (Ok(Answer::Stored), None) => {}
                        // Decided: confirmed even when refused, so the agent
                        // may drop it from its outbox; and told why.
                        (Ok(Answer::Refused(problem)), outbox_id) => {
                            sink.send(error_frame(&problem)).await?;
                            if let Some(outbox_id) = outbox_id {
                                sink.send(Message::text(ServerMessage::Received { outbox_id }.encode())).await?;
                            }
                        }
                        // Not committed: no confirmation; the agent sends it again.
                        (Ok(Answer::Failed(problem)), outbox_id) => warn!(?outbox_id, %problem, "not stored"),
                        (Err(_), outbox_id) => warn!(?outbox_id, "not answered"),
                    }
                }
                frame = stream.next() => {
                    let frame = match frame {
                        None => return Ok(()),
                        Some(frame) => frame?,
                    };
                    let text = match frame {
                        Message::Text(text) => text,
                        Message::Binary(_) => {
                            sink.send(error_frame(&DecodeError::Binary.to_string())).await?;
                            continue;
                        }
                        Message::Close(_) => return Ok(()),
                        Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => continue,
                    };
                    match self.on_message(device, text.as_str()).await? {
                        Incoming::Nothing => {}
                        Incoming::Reply(message) => sink.send(Message::text(message.encode())).await?,
                        Incoming::AwaitCommit(outbox_id, answer) => {
                            commits.push(async move { (outbox_id, answer.await) });
                        }
                    }
                }
            }
        }
    }

    /// Handles one text message. Bad input gets an `error` reply and the
    /// session goes on.
    async fn on_message(&self, device: &DeviceId, text: &str) -> Result<Incoming, SessionError> {
        let message = match AgentMessage::decode(text) {
            Ok(message) => message,
            Err(e) => {
                warn!(error = %e, "unusable message from an agent");
                return Ok(Incoming::Reply(ServerMessage::Error {
                    message: e.to_string(),
                }));
            }
        };
        match message {
            AgentMessage::Hello(_) => Ok(Incoming::Reply(ServerMessage::Error {
                message: "hello is only valid as the first message".into(),
            })),
            AgentMessage::Ack { job_id } => {
                self.send_event(Inbound::Ack {
                    device: device.clone(),
                    job_id,
                })
                .await?;
                Ok(Incoming::Nothing)
            }
            AgentMessage::Progress { outbox_id, status }
            | AgentMessage::Result { outbox_id, status } => {
                let (reply, answer) = Reply::channel();
                self.send_event(Inbound::Status {
                    device: device.clone(),
                    status: Box::new(status),
                    received_at: Timestamp::now(),
                    position: None,
                    reply,
                })
                .await?;
                Ok(Incoming::AwaitCommit(Some(outbox_id), answer))
            }
            AgentMessage::Heartbeat { heartbeat } => {
                if &heartbeat.device_id != device {
                    return Ok(Incoming::Reply(ServerMessage::Error {
                        message: format!(
                            "heartbeat for device {} refused on the connection of {device}",
                            heartbeat.device_id
                        ),
                    }));
                }
                let (reply, answer) = Reply::channel();
                self.send_event(Inbound::Heartbeat {
                    device: device.clone(),
                    heartbeat: Box::new(heartbeat),
                    reply,
                })
                .await?;
                Ok(Incoming::AwaitCommit(None, answer))
            }
            AgentMessage::Error { message } => {
                warn!(%message, "the agent could not use a message");
                Ok(Incoming::Nothing)
            }
            AgentMessage::LogChunk(chunk) => {
                self.logs.deliver(device, chunk);
                Ok(Incoming::Nothing)
            }
        }
    }
}

enum Incoming {
    Nothing,
    Reply(ServerMessage),
    /// An answer to wait for; with the outbox id of a status to confirm.
    AwaitCommit(Option<u64>, tokio::sync::oneshot::Receiver<Answer>),
}

impl WsLinks {
    /// Writes a message to the device's session, if this replica holds one.
    fn send(&self, device: &DeviceId, message: ServerMessage) -> Delivered {
        let sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let Some(session) = sessions.get(device) else {
            return Delivered::NotConnected;
        };
        match session.outgoing.send(Message::text(message.encode())) {
            Ok(()) => Delivered::Sent,
            Err(_) => Delivered::NotConnected,
        }
    }
}

impl AgentLinks for WsLinks {
    fn transport(&self) -> drover_model::transport::Transport {
        TRANSPORT
    }

    fn brokered(&self) -> bool {
        false
    }

    fn deliver<'a>(
        &'a self,
        intent: &'a Intent,
        signed: &'a serde_json::Value,
        server_time: Timestamp,
    ) -> BoxFuture<'a, Result<Delivered, LinkError>> {
        let message = ServerMessage::Job {
            intent: signed.clone(),
            server_time: Some(server_time),
        };
        Box::pin(async move { Ok(self.send(&intent.device_id, message)) })
    }

    fn cancel<'a>(
        &'a self,
        device: &'a DeviceId,
        _job_id: JobId,
        signed: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<Delivered, LinkError>> {
        let message = ServerMessage::Cancel {
            order: signed.clone(),
        };
        Box::pin(async move { Ok(self.send(device, message)) })
    }

    fn logs<'a>(
        &'a self,
        device: &'a DeviceId,
        job: Option<String>,
        tail: Option<u32>,
    ) -> BoxFuture<'a, Result<LogStream, AskError>> {
        Box::pin(async move {
            let stream = self.logs.open(device, job, tail)?;
            match self.send(device, ServerMessage::Logs(stream.request.clone())) {
                Delivered::Sent => Ok(stream),
                Delivered::NotConnected => Err(AskError::NotConnected),
            }
        })
    }

    fn withdraw<'a>(
        &'a self,
        _device: &'a DeviceId,
        _job_id: JobId,
    ) -> BoxFuture<'a, Result<(), LinkError>> {
        // Nothing is kept for a WebSocket agent between connections.
        Box::pin(async { Ok(()) })
    }
}

fn error_frame(message: &str) -> Message {
    Message::text(
        ServerMessage::Error {
            message: drover_model::bounded(message, MAX_MESSAGE_BYTES / 2),
        }
        .encode(),
    )
}

#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("WebSocket error: {0}")]
    Ws(#[from] tokio_tungstenite::tungstenite::Error),
}
