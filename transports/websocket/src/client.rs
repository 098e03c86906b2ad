//! The agent's end: connect (TLS unless loopback), say `hello`, then move
//! messages between the socket and [`agent_core::executor::Agent`] until the
//! connection drops, and reconnect with capped, jittered backoff.

pub use crate::enrolling::Credential;
use crate::enrolling::Enrolled;
use crate::protocol::{AgentMessage, ServerMessage};
use crate::{AGENT_PATH_PREFIX, ENROLL_PATH_PREFIX, KEY_AUTHORIZATION, PROBE_HEADER, ws_config};
use agent_core::backoff::{Backoff, SessionEnd, Supervisor};
use agent_core::executor::{AdmitError, AdmitReply, Agent};
use drover_model::model::Hello;
use drover_net::certificate::{CertificateProblem, certificate_problem};
use drover_net::tls::{client_config, is_loopback};
use futures_util::{SinkExt, StreamExt};
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{HeaderValue, Uri, header};
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Any byte stream a WebSocket can run over (plain TCP or TLS).
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

#[derive(Debug, Clone)]
pub struct ClientSettings {
    /// `wss://host:port` (or `ws://` to a loopback host).
    pub server_url: String,
    /// This device's bearer token, or its own key.
    pub credential: Credential,
    /// CAs to trust for `wss://`.
    pub ca_file: PathBuf,
    pub heartbeat_interval: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    pub connect_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("bad server_url {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("refusing plain ws:// to {0}, which is not a loopback address; use wss://")]
    PlainToRemote(String),
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("connecting to {0} timed out")]
    ConnectTimeout(String),
    #[error(transparent)]
    Tls(#[from] drover_net::tls::TlsError),
    #[error("TLS handshake failed: {0}{hint}", hint = tls_hint(.0))]
    TlsHandshake(std::io::Error),
    #[error(
        "the control plane refused this device's token (HTTP {0}): put what `drover token \
         DEVICE` prints on the control plane's host in the agent's token_file"
    )]
    Refused(u16),
    #[error(
        "{0} is the control plane's operators' API, not its agents' port: point server_url at \
         the address of `drover serve --agent-listen` (port 7181 by default)"
    )]
    WrongPort(String),
    #[error(
        "the control plane has not accepted this device's key, and the agent has no \
         enrollment token to ask with: set enrollment_token_file in the agent's config"
    )]
    NotEnrolled,
    #[error("enrolled; waiting for an operator to accept this device: {0}")]
    Pending(String),
    #[error("enrollment: {0}")]
    Enrollment(String),
    #[error("WebSocket error: {0}")]
    Ws(#[from] tungstenite::Error),
    #[error("the key's conversation with the control plane: {0}")]
    Key(#[from] crate::enrolling::EnrollError),
    #[error("the server said nothing for {0:?}; reconnecting")]
    Silent(Duration),
    #[error("the server closed the connection")]
    Closed,
    #[error("agent store error: {0}")]
    Store(#[from] agent_core::store::StoreError),
}

impl ClientError {
    /// Configuration errors do not heal by retrying; they are still retried
    /// (the file may be fixed), but logged as errors.
    fn is_config(&self) -> bool {
        matches!(
            self,
            ClientError::Url { .. }
                | ClientError::PlainToRemote(_)
                | ClientError::Tls(_)
                | ClientError::TlsHandshake(_)
                | ClientError::Refused(_)
                | ClientError::WrongPort(_)
                | ClientError::NotEnrolled
                | ClientError::Enrollment(_)
                | ClientError::Key(crate::enrolling::EnrollError::Refused(_))
        )
    }
}

/// What to do about the TLS errors an agent meets first.
pub fn tls_hint(e: &std::io::Error) -> String {
    tls_advice(
        certificate_problem(e),
        "the agent's ca_file",
        "the agent's URL",
    )
}

/// What to do about a server certificate this end would not trust,
/// whoever met it: the agent (its ca_file) or the CLI (--ca-file). `ca`
/// names the setting that holds the CA, `url` where the host name came
/// from. Empty when there is nothing to add.
pub fn tls_advice(problem: Option<CertificateProblem>, ca: &str, url: &str) -> String {
    match problem {
        Some(CertificateProblem::CaAsServer) => {
            "; the server presents a CA certificate as its own: make a CA and a server \
             certificate signed by it with `drover init --tls-name HOST`, serve that, and trust \
             the CA (tls/ca.pem)"
                .into()
        }
        Some(CertificateProblem::UnknownIssuer) => {
            format!("; {ca} does not hold the CA that signed the server's certificate (tls/ca.pem)")
        }
        Some(CertificateProblem::WrongName) => format!(
            "; the server's certificate does not name the host in {url} (see --tls-name of \
             `drover init`)"
        ),
        Some(CertificateProblem::OutsideValidity) => {
            "; the server's certificate has expired or is not valid yet, or this machine's \
             clock is wrong"
                .into()
        }
        None => String::new(),
    }
}

/// Runs the agent's connection until `shutdown`.
pub async fn run(settings: ClientSettings, agent: Arc<Agent>, shutdown: CancellationToken) {
    let backoff = Backoff::new(settings.backoff_initial, settings.backoff_max);
    let mut supervisor = Supervisor::new(
        &agent,
        drover_model::transport::Transport::WebSocket,
        backoff,
    );
    loop {
        supervisor.start();
        let end = match connect_and_serve(&settings, &agent, &shutdown).await {
            // The control plane closed it (a restart): soon again.
            Ok(()) => SessionEnd::Closed,
            Err(ClientError::Pending(message)) => {
                info!(%message, "waiting for an operator to accept this device");
                SessionEnd::Failed(ClientError::Pending(message).to_string())
            }
            Err(e) => {
                if e.is_config() {
                    tracing::error!(error = %e, "cannot connect to the control plane");
                } else {
                    warn!(error = %e, "connection to the control plane lost");
                }
                SessionEnd::Failed(e.to_string())
            }
        };
        if !supervisor.ended(&agent, end, &shutdown).await {
            return;
        }
    }
}

/// Checks a server URL and CA file as [`run`] would use them, without
/// connecting: `agent check` catches here what `run` would retry forever.
pub fn check_settings(server_url: &str, ca_file: &std::path::Path) -> Result<(), ClientError> {
    let url_error = |reason: &str| ClientError::Url {
        url: server_url.to_owned(),
        reason: reason.into(),
    };
    let uri: Uri = server_url
        .trim_end_matches('/')
        .parse()
        .map_err(|_| url_error("not a URL"))?;
    let host = uri.host().ok_or_else(|| url_error("no host"))?.to_owned();
    match uri.scheme_str() {
        Some("wss") => {
            client_config(ca_file)?;
            Ok(())
        }
        Some("ws") if is_loopback(&host) => Ok(()),
        Some("ws") => Err(ClientError::PlainToRemote(host)),
        _ => Err(url_error("scheme must be ws:// or wss://")),
    }
}

/// Connects to the agents' port and is let in: by the bearer token, or by
/// the device's key (signing the challenge). A key the control plane has
/// not accepted asks to join first, with the enrollment token.
async fn connect(
    settings: &ClientSettings,
    agent: Option<&Agent>,
    device: &drover_model::DeviceId,
    probe: bool,
) -> Result<WebSocketStream<Box<dyn Io>>, ClientError> {
    let Credential::Key {
        signer,
        enrollment_token,
    } = &settings.credential
    else {
        return open(settings, AGENT_PATH_PREFIX, device.as_str(), probe).await;
    };
    let mut ws = match open(settings, AGENT_PATH_PREFIX, device.as_str(), probe).await {
        Err(ClientError::Refused(401)) if probe => {
            return Err(ClientError::Enrollment(
                "this device's key is not accepted (yet): the running agent asks to join with \
                 its enrollment token; `drover devices pending` shows it on the control plane"
                    .into(),
            ));
        }
        Err(ClientError::Refused(401)) => {
            let Some(token) = enrollment_token else {
                return Err(ClientError::NotEnrolled);
            };
            let inventory = agent
                .map(agent_core::inventory::inventory)
                .unwrap_or_default();
            let door = open(settings, ENROLL_PATH_PREFIX, device.as_str(), false).await?;
            match crate::enrolling::enroll(door, device, signer.as_ref(), token, inventory).await? {
                Enrolled::Accepted => {
                    info!("this device's key is accepted");
                    open(settings, AGENT_PATH_PREFIX, device.as_str(), probe).await?
                }
                Enrolled::Pending(message) => return Err(ClientError::Pending(message)),
            }
        }
        other => other?,
    };
    crate::enrolling::prove(&mut ws, device, signer.as_ref()).await?;
    Ok(ws)
}

/// Opens `prefix`/`device` on the agents' port with this device's
/// credential's header (none at the enrollment door).
async fn open(
    settings: &ClientSettings,
    prefix: &str,
    device: &str,
    probe: bool,
) -> Result<WebSocketStream<Box<dyn Io>>, ClientError> {
    let url_error = |reason: &str| ClientError::Url {
        url: settings.server_url.clone(),
        reason: reason.into(),
    };
    let base = settings.server_url.trim_end_matches('/');
    let full = format!("{base}{prefix}{device}");
    let uri: Uri = full.parse().map_err(|_| url_error("not a URL"))?;
    let host = uri.host().ok_or_else(|| url_error("no host"))?.to_owned();
    let secure = match uri.scheme_str() {
        Some("wss") => true,
        Some("ws") => false,
        _ => return Err(url_error("scheme must be ws:// or wss://")),
    };
    if !secure && !is_loopback(&host) {
        return Err(ClientError::PlainToRemote(host));
    }
    let port = uri.port_u16().unwrap_or(if secure { 443 } else { 80 });
    let addr = format!(
        "{}:{port}",
        host.trim_start_matches('[').trim_end_matches(']')
    );
    let tcp = tokio::time::timeout(settings.connect_timeout, TcpStream::connect(&addr))
        .await
        .map_err(|_| ClientError::ConnectTimeout(addr.clone()))?
        .map_err(|source| ClientError::Connect {
            addr: addr.clone(),
            source,
        })?;
    let _ = tcp.set_nodelay(true);
    let stream: Box<dyn Io> = if secure {
        let config = client_config(&settings.ca_file)?;
        let name = rustls::pki_types::ServerName::try_from(host.clone())
            .map_err(|_| url_error("host is not a valid TLS server name"))?;
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(ClientError::TlsHandshake)?;
        Box::new(tls)
    } else {
        Box::new(tcp)
    };
    let mut request = uri.into_client_request()?;
    let authorization = match &settings.credential {
        _ if prefix == ENROLL_PATH_PREFIX => None,
        Credential::Token(token) => Some(
            HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| url_error("token is not a valid header value"))?,
        ),
        Credential::Key { signer, .. } => Some(
            HeaderValue::from_str(&format!("{KEY_AUTHORIZATION} {}", signer.public_key()))
                .map_err(|_| url_error("the public key is not a valid header value"))?,
        ),
    };
    if let Some(authorization) = authorization {
        request
            .headers_mut()
            .insert(header::AUTHORIZATION, authorization);
    }
    if probe {
        request
            .headers_mut()
            .insert(PROBE_HEADER, HeaderValue::from_static("1"));
    }
    let (ws, _) = tokio::time::timeout(
        settings.connect_timeout,
        tokio_tungstenite::client_async_with_config(request, stream, Some(ws_config())),
    )
    .await
    .map_err(|_| ClientError::ConnectTimeout(addr.clone()))?
    .map_err(|e| match e {
        // The operators' API answers an agent's path so (421 Misdirected
        // Request): a wrong port, not a wrong token.
        tungstenite::Error::Http(response) if response.status().as_u16() == 421 => {
            ClientError::WrongPort(addr.clone())
        }
        tungstenite::Error::Http(response) if matches!(response.status().as_u16(), 401 | 403) => {
            ClientError::Refused(response.status().as_u16())
        }
        other => other.into(),
    })?;
    Ok(ws)
}

/// Connects, is let in with this device's token, and closes: `drover-agent
/// check --connect`.
pub async fn probe(
    settings: &ClientSettings,
    device: &drover_model::DeviceId,
) -> Result<(), ClientError> {
    let mut ws = connect(settings, None, device, true).await?;
    let _ = ws.close(None).await;
    Ok(())
}

async fn connect_and_serve(
    settings: &ClientSettings,
    agent: &Arc<Agent>,
    shutdown: &CancellationToken,
) -> Result<(), ClientError> {
    let ws = tokio::select! {
        ws = connect(settings, Some(agent), agent.device_id(), false) => ws?,
        _ = shutdown.cancelled() => return Ok(()),
    };
    info!(url = %settings.server_url, "connected to the control plane");
    agent.update_link(|l| {
        l.connected = true;
        l.last_contact = Some(agent_core::clock::now());
        l.last_error = None;
    });
    let (mut sink, mut stream) = ws.split();
    let hello = AgentMessage::Hello(Hello {
        device_id: agent.device_id().clone(),
        agent_version: agent.agent_version().to_owned(),
        boot_id: agent.boot_id().to_owned(),
        capabilities: agent.capabilities(),
        jobs: agent.held_jobs()?,
    });
    sink.send(Message::text(hello.encode())).await?;
    let mut sent_this_connection: HashSet<u64> = HashSet::new();
    let mut heartbeat = tokio::time::interval(settings.heartbeat_interval);
    let silence_limit = settings.heartbeat_interval * 3;
    let mut last_heard = Instant::now();
    // Log answers, read off the async threads: bounded, so a slow link
    // holds back the reading rather than filling memory.
    let (chunks_tx, mut chunks) = tokio::sync::mpsc::channel::<AgentMessage>(4);
    loop {
        for entry in agent.outbox(64)? {
            if sent_this_connection.insert(entry.id) {
                let message = if entry.status.state.is_terminal() {
                    AgentMessage::Result {
                        outbox_id: entry.id,
                        status: entry.status,
                    }
                } else {
                    AgentMessage::Progress {
                        outbox_id: entry.id,
                        status: entry.status,
                    }
                };
                sink.send(Message::text(message.encode())).await?;
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => {
                let _ = sink.send(Message::Close(None)).await;
                return Ok(());
            }
            _ = heartbeat.tick() => {
                if last_heard.elapsed() > silence_limit {
                    return Err(ClientError::Silent(silence_limit));
                }
                let beat = AgentMessage::Heartbeat { heartbeat: agent.heartbeat()? };
                sink.send(Message::text(beat.encode())).await?;
                sink.send(Message::Ping(Vec::new().into())).await?;
            }
            _ = agent.heartbeat_wanted().notified() => {
                let beat = AgentMessage::Heartbeat { heartbeat: agent.heartbeat()? };
                sink.send(Message::text(beat.encode())).await?;
            }
            _ = agent.outbox_changed().notified() => {}
            Some(chunk) = chunks.recv() => {
                sink.send(Message::text(chunk.encode())).await?;
            }
            frame = stream.next() => {
                let frame = match frame {
                    None => return Err(ClientError::Closed),
                    Some(frame) => frame?,
                };
                last_heard = Instant::now();
                agent.update_link(|l| l.last_contact = Some(agent_core::clock::now()));
                if let Some(reply) = handle_frame(frame, agent, &chunks_tx) {
                    sink.send(Message::text(reply.encode())).await?;
                }
            }
        }
    }
}

/// Handles one frame from the server; returns the reply to send, if any.
/// Nothing here may panic or stall: bad input gets an `error` reply (A7).
fn handle_frame(
    frame: Message,
    agent: &Arc<Agent>,
    chunks: &tokio::sync::mpsc::Sender<AgentMessage>,
) -> Option<AgentMessage> {
    let text = match frame {
        Message::Text(text) => text,
        Message::Binary(_) => {
            warn!("server sent a binary frame; ignoring it");
            return Some(error_reply(
                crate::protocol::DecodeError::Binary.to_string(),
            ));
        }
        Message::Ping(_) | Message::Pong(_) | Message::Frame(_) | Message::Close(_) => return None,
    };
    let message = match ServerMessage::decode(text.as_str()) {
        Ok(message) => message,
        Err(e) => {
            warn!(error = %e, "unusable message from the server");
            return Some(error_reply(e.to_string()));
        }
    };
    match message {
        ServerMessage::Job {
            intent,
            server_time,
        } => {
            if let Some(time) = server_time {
                agent.observe_control_plane_time(time);
            }
            Some(acknowledged(agent.admit_signed(Ok(intent)), "job"))
        }
        // The agent's answer to the order is the job's status, from its outbox.
        ServerMessage::Cancel { order } => {
            Some(acknowledged(agent.admit_signed(Ok(order)), "cancel order"))
        }
        ServerMessage::Received { outbox_id } => {
            if let Err(e) = agent.outbox_ack(outbox_id) {
                warn!(outbox_id, error = %e, "cannot drop a confirmed status from the outbox");
            }
            None
        }
        ServerMessage::Error { message } => {
            warn!(%message, "the server could not use a message");
            None
        }
        ServerMessage::Logs(request) => {
            let (agent, chunks) = (agent.clone(), chunks.clone());
            tokio::task::spawn_blocking(move || {
                agent.logs().answer(&request, |chunk| {
                    chunks.blocking_send(AgentMessage::LogChunk(chunk)).is_ok()
                });
            });
            None
        }
    }
}

/// The answer to a job or a cancel order (`what`) the agent was handed: an
/// ack once recorded, else the reason. Without an ack the server sends it
/// again once the ack times out.
fn acknowledged(result: Result<AdmitReply, AdmitError>, what: &str) -> AgentMessage {
    match result {
        Ok(reply) => AgentMessage::Ack {
            job_id: reply.status.job_id,
        },
        Err(AdmitError::Unreadable(e)) => {
            warn!(error = %e, "{what} refused before it could be recorded");
            error_reply(format!("{what} refused: {e}"))
        }
        Err(AdmitError::Store(e)) => {
            tracing::error!(error = %e, "cannot record a {what}");
            error_reply(format!("cannot record the {what}: {e}"))
        }
    }
}

fn error_reply(message: String) -> AgentMessage {
    AgentMessage::Error {
        message: drover_model::bounded(message, drover_model::MAX_ERROR_BYTES),
    }
}
