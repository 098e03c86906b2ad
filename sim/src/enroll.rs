//! `drover-sim enroll` (issue 55): N devices of one image enrolling at once
//! with one auto-accept token over WebSocket (over NATS: `enroll_nats`), as a fleet's first boot would,
//! then each connecting by its key (challenge, proof, hello). Prints the
//! time until every device is accepted, until every one is connected by
//! its key, and the control plane's CPU per device.

use crate::harness::{Api, Process, Serve, Transport, http_builder, start_drover};
use crate::keys::{SimKey, key};
use crate::procstat;
use crate::ws::{Target, open_at};
use anyhow::{Context, Result, bail};
use drover_model::DeviceId;
use drover_model::enroll::Signer;
use futures_util::SinkExt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use transport_websocket::enrolling::{self, Enrolled};
use transport_websocket::protocol::AgentMessage;

/// One run's figures.
#[derive(Debug, Clone)]
pub struct EnrollFigures {
    pub devices: usize,
    /// From the first request until every device was told accepted.
    pub accepted: Duration,
    /// From the first request until every device was in by its key.
    pub connected: Duration,
    /// The control plane's CPU over both, per device.
    pub cpu_per_device: Duration,
    /// The broker's CPU over both, per device (none over WebSocket).
    pub broker_cpu_per_device: Option<Duration>,
    /// Requests that were refused or failed and were asked again.
    pub retries: usize,
    pub load: (f64, f64),
}

/// One enrollment request, by the agent's own side of the conversation.
async fn enroll_once(
    target: Target,
    index: usize,
    device: &DeviceId,
    key: &SimKey,
    token: &str,
) -> Result<()> {
    let path = format!("{}{device}", transport_websocket::ENROLL_PATH_PREFIX);
    let ws = open_at(target, index, &path, None).await?;
    match enrolling::enroll(ws, device, key, token, Default::default()).await? {
        Enrolled::Accepted => Ok(()),
        Enrolled::Pending(message) => bail!("not accepted: {message}"),
    }
}

/// Connects by the key, proves it, says hello; keeps the connection.
async fn connect_by_key(
    target: Target,
    index: usize,
    device: &DeviceId,
    key: &SimKey,
) -> Result<WebSocketStream<TcpStream>> {
    let path = format!("{}{device}", transport_websocket::AGENT_PATH_PREFIX);
    let authorization = format!(
        "{} {}",
        transport_websocket::KEY_AUTHORIZATION,
        key.public_key()
    );
    let mut ws = open_at(target, index, &path, Some(&authorization)).await?;
    enrolling::prove(&mut ws, device, key).await?;
    let hello = AgentMessage::Hello(drover_model::model::Hello {
        device_id: device.clone(),
        agent_version: "sim".into(),
        boot_id: "sim-boot".into(),
        capabilities: vec!["systemUpgradeV1".into()],
        jobs: Vec::new(),
    });
    ws.send(Message::text(hello.encode())).await?;
    Ok(ws)
}

/// One device: enroll (asked again after a refusal or a failure, with
/// jitter, as an agent does), then connect by its key.
async fn device(
    target: Target,
    index: usize,
    token: Arc<String>,
    accepted: Arc<AtomicUsize>,
    retries: Arc<AtomicUsize>,
) -> Result<WebSocketStream<TcpStream>> {
    let device = DeviceId::new(format!("enr-{index:05}"))?;
    let key = key(index)?;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        match enroll_once(target, index, &device, &key, &token).await {
            Ok(()) => break,
            Err(e) if Instant::now() < deadline => {
                if retries.fetch_add(1, Ordering::Relaxed) < 3 {
                    eprintln!("{device}: {e:#}; asking again");
                }
                tokio::time::sleep(Duration::from_millis(200 + fastrand::u64(0..800))).await;
            }
            Err(e) => return Err(e),
        }
    }
    accepted.fetch_add(1, Ordering::Relaxed);
    loop {
        match connect_by_key(target, index, &device, &key).await {
            Ok(ws) => return Ok(ws),
            Err(e) if Instant::now() < deadline => {
                retries.fetch_add(1, Ordering::Relaxed);
                if retries.load(Ordering::Relaxed) < 4 {
                    eprintln!("{device}: {e:#}; connecting again");
                }
                tokio::time::sleep(Duration::from_millis(200 + fastrand::u64(0..800))).await;
            }
            Err(e) => return Err(e),
        }
    }
}

async fn online(api: &Api) -> Result<u64> {
    let summary = api.get("/summary").await?;
    Ok(summary["connectedHere"]["websocket"].as_u64().unwrap_or(0))
}

/// The API of the control plane whose data is in DIR/data, and the
/// auto-accept enrollment token of the devices' image, made there.
pub(crate) async fn image_token(dir: &Path, api_base: &str) -> Result<(Api, String)> {
    let api = Api {
        base: format!("http://{api_base}"),
        token: std::fs::read_to_string(dir.join("data/operator.token"))?
            .trim()
            .to_owned(),
        http: http_builder().build()?,
    };
    let made = api
        .post(
            "/enrollment-tokens",
            &serde_json::json!({"name": "image", "groups": ["sim"], "autoAccept": true}),
        )
        .await?;
    let token = made["token"].as_str().context("no token")?.to_owned();
    Ok((api, token))
}

/// One run: a fresh control plane, N devices enrolling at once.
pub async fn measure(drover: &Path, devices: usize) -> Result<EnrollFigures> {
    let dir = tempfile::Builder::new()
        .prefix("drover-enroll-")
        .tempdir()?;
    let (process, api_base, agents) = start_drover(
        drover,
        dir.path(),
        Serve {
            transport: Transport::Websocket,
            broker_url: None,
            nats_replicas: 1,
            store_on_nats: false,
            nats_authority: None,
        },
    )?;
    let process: Process = process;
    let (api, token) = image_token(dir.path(), &api_base).await?;
    let token = Arc::new(token);
    let addr: SocketAddr = agents.trim_start_matches("ws://").parse()?;
    let target = Target::spread(addr);
    let (accepted, retries) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let before = procstat::usage(process.0.id()).context("the control plane's usage")?;
    let load_before = procstat::load_average().unwrap_or(f64::NAN);
    let started = Instant::now();
    let tasks: Vec<_> = (0..devices)
        .map(|i| {
            tokio::spawn(device(
                target,
                i,
                token.clone(),
                accepted.clone(),
                retries.clone(),
            ))
        })
        .collect();
    let mut accepted_at = None;
    while accepted.load(Ordering::Relaxed) < devices {
        if tasks.iter().all(|t| t.is_finished()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if accepted.load(Ordering::Relaxed) >= devices {
        accepted_at = Some(started.elapsed());
    }
    let mut connections = Vec::new();
    for task in tasks {
        connections.push(task.await??);
    }
    // In by key means the control plane took the hello.
    while online(&api).await? < devices as u64 {
        if started.elapsed() > Duration::from_secs(900) {
            bail!("only {} of {devices} online", online(&api).await?);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let connected = started.elapsed();
    let after = procstat::usage(process.0.id()).context("the control plane's usage")?;
    let load_after = procstat::load_average().unwrap_or(f64::NAN);
    drop(connections);
    Ok(EnrollFigures {
        devices,
        accepted: accepted_at.context("not every device was accepted")?,
        connected,
        cpu_per_device: after.cpu.saturating_sub(before.cpu) / devices.max(1) as u32,
        broker_cpu_per_device: None,
        retries: retries.load(Ordering::Relaxed),
        load: (load_before, load_after),
    })
}
