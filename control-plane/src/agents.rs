//! The agent side of the control plane over WebSocket: the listener, one
//! session per connected agent, delivery with acks (a job is `sent` when
//! written; unacked for the ack timeout it returns to `created` and goes out
//! again on the next connection), status intake with duplicate suppression,
//! and heartbeats into the device registry.

use crate::auth::Secrets;
use crate::hub::Hub;
use crate::intake::{Intake, StatusOutcome};
use crate::records::{Db, DbError, Delivery, JobDelivery, device_jobs_prefix, job_key};
use agent_core::DeviceId;
use futures_util::{SinkExt, StreamExt};
use jiff::Timestamp;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};
use transport_websocket::protocol::{AgentMessage, DecodeError, ServerMessage};
use transport_websocket::server::{Io, accept};

/// How long a new connection may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

pub struct AgentService {
    pub db: Db,
    pub hub: Arc<Hub>,
    pub secrets: Arc<Secrets>,
    pub intake: Intake,
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    pub ack_timeout: Duration,
}

type Ws = WebSocketStream<Box<dyn Io>>;

impl AgentService {
    pub async fn serve(self: Arc<Self>, listener: TcpListener, shutdown: CancellationToken) {
        let sweeper = tokio::spawn(self.clone().sweep_acks(shutdown.clone()));
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = shutdown.cancelled() => break,
            };
            let (tcp, peer) = match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    warn!(error = %e, "agent accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let service = self.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                let _ = tcp.set_nodelay(true);
                let stream: Box<dyn Io> = match &service.tls {
                    Some(acceptor) => match acceptor.accept(tcp).await {
                        Ok(tls) => Box::new(tls),
                        Err(e) => {
                            debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                    },
                    None => Box::new(tcp),
                };
                let secrets = service.secrets.clone();
                let accepted = accept(stream, move |device: &DeviceId, token: &str| {
                    secrets.verify_device(device, token)
                })
                .await;
                match accepted {
                    Ok(agent) => {
                        let span = info_span!("agent", device = %agent.device_id);
                        service
                            .session(agent.device_id, agent.ws, shutdown)
                            .instrument(span)
                            .await;
                    }
                    Err(e) => info!(%peer, error = %e, "agent connection refused"),
                }
            });
        }
        sweeper.abort();
    }

    /// Returns jobs sent but not acked within the timeout to `created`.
    async fn sweep_acks(self: Arc<Self>, shutdown: CancellationToken) {
        let period = (self.ack_timeout / 4).max(Duration::from_millis(200));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = shutdown.cancelled() => return,
            }
            let now = Timestamp::now();
            let timeout = jiff::SignedDuration::try_from(self.ack_timeout)
                .unwrap_or(jiff::SignedDuration::MAX);
            let jobs = match self.db.list::<JobDelivery>("jobs/") {
                Ok(jobs) => jobs,
                Err(e) => {
                    warn!(error = %e, "ack sweep cannot list jobs");
                    continue;
                }
            };
            for (key, _, job) in jobs {
                let Delivery::Sent { at } = job.delivery else {
                    continue;
                };
                if now.duration_since(at) < timeout {
                    continue;
                }
                let result = self.db.update::<JobDelivery, _>(&key, |current| {
                    let mut job = current?;
                    match job.delivery {
                        Delivery::Sent { at: sent } if sent == at => {
                            job.delivery = Delivery::Created;
                            Some(job)
                        }
                        _ => None,
                    }
                });
                match result {
                    Ok(_) => {
                        info!(job_id = %job.intent.job_id, device = %job.intent.device_id, "no ack in time; the job goes out again on the next connection")
                    }
                    Err(e) => warn!(key, error = %e, "cannot reset an unacked job"),
                }
            }
        }
    }

    async fn session(&self, device: DeviceId, ws: Ws, shutdown: CancellationToken) {
        let (id, mut wake) = self.hub.register(&device);
        let result = self.converse(&device, ws, &mut wake, &shutdown).await;
        self.hub.unregister(&device, id);
        match result {
            Ok(()) => info!("agent disconnected"),
            Err(e) => info!(error = %e, "agent session ended"),
        }
    }

    async fn converse(
        &self,
        device: &DeviceId,
        ws: Ws,
        wake: &mut tokio::sync::mpsc::Receiver<()>,
        shutdown: &CancellationToken,
    ) -> Result<(), SessionError> {
        let (mut sink, mut stream) = ws.split();
        // The first message must be a hello from this device.
        let hello = tokio::time::timeout(HELLO_TIMEOUT, stream.next())
            .await
            .map_err(|_| SessionError::Protocol("no hello within 10 s".into()))?;
        let held = match hello {
            Some(Ok(Message::Text(text))) => match AgentMessage::decode(text.as_str()) {
                Ok(AgentMessage::Hello {
                    device_id,
                    agent_version,
                    boot_id,
                    capabilities,
                    jobs,
                }) => {
                    if &device_id != device {
                        let message = format!(
                            "hello names device {device_id}, but the token is for {device}"
                        );
                        let _ = sink.send(error_frame(&message)).await;
                        return Err(SessionError::Protocol(message));
                    }
                    self.intake.on_hello(
                        device,
                        &agent_version,
                        &boot_id,
                        &capabilities,
                        "websocket",
                    )?;
                    jobs
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
        info!(held = held.len(), "agent connected");
        self.intake.resync(device, &held)?;
        self.deliver(device, &mut sink).await?;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    let _ = sink.send(Message::Close(None)).await;
                    return Ok(());
                }
                _ = wake.recv() => self.deliver(device, &mut sink).await?,
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
                    for reply in self.on_message(device, text.as_str())? {
                        sink.send(Message::text(reply.encode())).await?;
                    }
                }
            }
        }
    }

    /// Sends every job in `created` and marks it `sent`.
    async fn deliver<S>(&self, device: &DeviceId, sink: &mut S) -> Result<(), SessionError>
    where
        S: SinkExt<Message, Error = tokio_tungstenite::tungstenite::Error> + Unpin,
    {
        for (key, _, job) in self.db.list::<JobDelivery>(&device_jobs_prefix(device))? {
            let finished = job.status.as_ref().is_some_and(|s| s.state.is_terminal());
            if job.delivery != Delivery::Created || finished {
                continue;
            }
            let intent = serde_json::to_value(&job.intent)
                .map_err(|e| SessionError::Protocol(e.to_string()))?;
            let job_message = ServerMessage::Job {
                intent,
                server_time: Some(Timestamp::now()),
            };
            sink.send(Message::text(job_message.encode())).await?;
            let now = Timestamp::now();
            self.db.update::<JobDelivery, _>(&key, |current| {
                let mut job = current?;
                if job.delivery != Delivery::Created {
                    return None;
                }
                job.delivery = Delivery::Sent { at: now };
                Some(job)
            })?;
            info!(job_id = %job.intent.job_id, "job sent");
        }
        Ok(())
    }

    /// Handles one text message; returns the replies. Bad input gets an
    /// `error` reply and the session goes on.
    fn on_message(
        &self,
        device: &DeviceId,
        text: &str,
    ) -> Result<Vec<ServerMessage>, SessionError> {
        let message = match AgentMessage::decode(text) {
            Ok(message) => message,
            Err(e) => {
                warn!(error = %e, "unusable message from an agent");
                return Ok(vec![ServerMessage::Error {
                    message: e.to_string(),
                }]);
            }
        };
        match message {
            AgentMessage::Hello { .. } => Ok(vec![ServerMessage::Error {
                message: "hello is only valid as the first message".into(),
            }]),
            AgentMessage::Ack { job_id } => {
                let now = Timestamp::now();
                self.db
                    .update::<JobDelivery, _>(&job_key(device, job_id), |current| {
                        let mut job = current?;
                        if matches!(job.delivery, Delivery::Acked { .. }) {
                            return None;
                        }
                        job.delivery = Delivery::Acked { at: now };
                        Some(job)
                    })?;
                Ok(vec![])
            }
            AgentMessage::Progress { outbox_id, status }
            | AgentMessage::Result { outbox_id, status } => {
                let mut replies = Vec::new();
                let received_at = Timestamp::now();
                if let StatusOutcome::Refused(problem) =
                    self.intake.on_status(device, status, received_at)?
                {
                    replies.push(ServerMessage::Error { message: problem });
                }
                // Confirmed even when refused: the decision is made and stored,
                // so the agent may drop it from its outbox.
                replies.push(ServerMessage::Received { outbox_id });
                Ok(replies)
            }
            AgentMessage::Heartbeat { heartbeat } => Ok(self
                .intake
                .on_heartbeat(device, &heartbeat, "websocket")?
                .map(|message| vec![ServerMessage::Error { message }])
                .unwrap_or_default()),
            AgentMessage::Error { message } => {
                warn!(%message, "the agent could not use a message");
                Ok(vec![])
            }
        }
    }
}

fn error_frame(message: &str) -> Message {
    Message::text(
        ServerMessage::Error {
            message: message.to_owned(),
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
    #[error("store error: {0}")]
    Db(#[from] DbError),
}
