//! Simulated agents over WebSocket: the agent's side of docs/protocol.md with
//! the protocol's own message types, one connection per device, plain `ws://`
//! (the simulator runs on loopback). Connections come from many loopback
//! source addresses, so tens of thousands of them do not exhaust one
//! address's ephemeral ports.

use crate::SimAgent;
use drover_model::wire::parse_intent_value;
use futures_util::{SinkExt, StreamExt};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{HeaderValue, header};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_util::sync::CancellationToken;
use transport_websocket::AGENT_PATH_PREFIX;
use transport_websocket::protocol::{AgentMessage, ServerMessage};

/// Where the simulated agents connect, and from how many loopback source
/// addresses (200 spread a fleet as many sites would; 1 puts every device
/// behind one address, as a site's NAT does).
#[derive(Debug, Clone, Copy)]
pub struct Target {
    pub addr: SocketAddr,
    pub sources: u8,
}

impl Target {
    /// `addr`, from 200 source addresses.
    pub fn spread(addr: SocketAddr) -> Self {
        Self { addr, sources: 200 }
    }
}

fn config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(0)
        .max_message_size(Some(transport_websocket::MAX_FRAME_BYTES))
}

/// A loopback source address for connection `index` (127.0.0.2 and up).
fn source(index: usize, sources: u8) -> SocketAddr {
    let host = 2 + (index % usize::from(sources.clamp(1, 200))) as u8;
    SocketAddr::from((Ipv4Addr::new(127, 0, 0, host), 0))
}

/// A device's WebSocket connection to the agents' port, from a loopback
/// source address picked by `index`, authenticated by its token.
pub(crate) async fn open(
    target: Target,
    index: usize,
    device: &drover_model::DeviceId,
    token: &str,
) -> anyhow::Result<WebSocketStream<TcpStream>> {
    let path = format!("{AGENT_PATH_PREFIX}{device}");
    open_at(target, index, &path, Some(&format!("Bearer {token}"))).await
}

/// A WebSocket connection to `path` on the agents' port from a loopback
/// source address picked by `index`, with `authorization` if any.
pub(crate) async fn open_at(
    target: Target,
    index: usize,
    path: &str,
    authorization: Option<&str>,
) -> anyhow::Result<WebSocketStream<TcpStream>> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(source(index, target.sources))?;
    let tcp = socket.connect(target.addr).await?;
    let _ = tcp.set_nodelay(true);
    let url = format!("ws://{}{path}", target.addr);
    let mut request = url.into_client_request()?;
    if let Some(authorization) = authorization {
        request
            .headers_mut()
            .insert(header::AUTHORIZATION, HeaderValue::from_str(authorization)?);
    }
    let (ws, _) = tokio_tungstenite::client_async_with_config(request, tcp, Some(config())).await?;
    Ok(ws)
}

/// Plays one agent until `shutdown`, reconnecting after a lost connection.
pub async fn play(
    target: Target,
    index: usize,
    token: String,
    mut agent: SimAgent,
    shutdown: CancellationToken,
) {
    let mut first = true;
    while !shutdown.is_cancelled() {
        if !first {
            agent.stats.reconnects.fetch_add(1, Ordering::Relaxed);
            let pause = Duration::from_millis(500 + fastrand::u64(0..1500));
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = shutdown.cancelled() => return,
            }
        }
        first = false;
        if let Err(e) = session(target, index, &token, &mut agent, &shutdown).await {
            agent.stats.errors.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(device = %agent.device, error = %e, "simulated connection ended");
        }
    }
}

async fn session(
    target: Target,
    index: usize,
    token: &str,
    agent: &mut SimAgent,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let (mut sink, mut stream) = open(target, index, &agent.device, token).await?.split();
    let hello = AgentMessage::Hello(drover_model::model::Hello {
        device_id: agent.device.clone(),
        agent_version: "sim".into(),
        boot_id: agent.boot_id.clone(),
        capabilities: SimAgent::capabilities(),
        jobs: agent.held(),
    });
    sink.send(Message::text(hello.encode())).await?;
    agent.stats.connected.fetch_add(1, Ordering::Relaxed);
    let result = async {
        let mut sent_up_to = 0u64;
        let mut heartbeat = tokio::time::interval_at(
            tokio::time::Instant::now() + agent.behaviour.heartbeat,
            agent.behaviour.heartbeat,
        );
        loop {
            // Statuses not yet sent on this connection go out in order.
            let fresh: Vec<AgentMessage> = agent
                .pending()
                .iter()
                .filter(|(id, _)| *id > sent_up_to)
                .map(|(id, status)| {
                    if status.state.is_terminal() {
                        AgentMessage::Result {
                            outbox_id: *id,
                            status: status.clone(),
                        }
                    } else {
                        AgentMessage::Progress {
                            outbox_id: *id,
                            status: status.clone(),
                        }
                    }
                })
                .collect();
            for message in fresh {
                if let AgentMessage::Result { outbox_id, .. } | AgentMessage::Progress { outbox_id, .. } =
                    &message
                {
                    sent_up_to = sent_up_to.max(*outbox_id);
                }
                sink.feed(Message::text(message.encode())).await?;
            }
            sink.flush().await?;
            tokio::select! {
                _ = shutdown.cancelled() => {
                    let _ = sink.send(Message::Close(None)).await;
                    return Ok(());
                }
                _ = heartbeat.tick() => {
                    let beat = AgentMessage::Heartbeat { heartbeat: agent.heartbeat() };
                    sink.send(Message::text(beat.encode())).await?;
                }
                frame = stream.next() => {
                    let frame = match frame {
                        None => anyhow::bail!("the server closed the connection"),
                        Some(frame) => frame?,
                    };
                    let Message::Text(text) = frame else { continue };
                    match ServerMessage::decode(text.as_str()) {
                        Ok(ServerMessage::Job { intent, .. }) => {
                            let Ok(intent) = parse_intent_value(intent) else { continue };
                            if let Some(job_id) = agent.take(&intent) {
                                sink.feed(Message::text(AgentMessage::Ack { job_id }.encode())).await?;
                                if agent.pending().last().is_some_and(|(_, s)| s.state.is_terminal()) {
                                    // The completion heartbeat (A6).
                                    let beat = AgentMessage::Heartbeat { heartbeat: agent.heartbeat() };
                                    sink.feed(Message::text(beat.encode())).await?;
                                }
                            }
                        }
                        Ok(ServerMessage::Received { outbox_id }) => agent.confirm(outbox_id),
                        // Simulated devices keep no output and are asked for none.
                        Ok(ServerMessage::Cancel { .. } | ServerMessage::Logs(_)) => {}
                        Ok(ServerMessage::Error { message }) => {
                            tracing::debug!(device = %agent.device, %message, "the server could not use a message");
                        }
                        Err(e) => tracing::debug!(error = %e, "unusable server message"),
                    }
                }
            }
        }
    }
    .await;
    agent.stats.connected.fetch_sub(1, Ordering::Relaxed);
    result
}
