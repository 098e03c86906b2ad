//! `drover-sim reconnect` (issue 55): N devices behind one address (every
//! simulated device connects from 127.0.0.2, as a site's NAT shows them)
//! are in over WebSocket; the control plane is killed and started again on
//! the same ports, and every device reconnects at once after its backoff.
//! Prints the time from the kill until every device is in again, how many
//! connection attempts were made again, and the new control plane's CPU per
//! device. The agents' port admits 64 handshakes per address at a time.
//!
//! Over NATS and MQTT a control plane's restart does not touch the devices'
//! connections (they hold the broker's); what meets them at once is the
//! broker's restart, which `nats-connect` measures (all of its devices come
//! from one address too).

use crate::harness::{Api, Process, Serve, Transport, free_port, http_builder, start_drover_on};
use crate::procstat;
use crate::ws::Target;
use crate::{Behaviour, SimAgent, Stats, device_ids};
use anyhow::{Context, Result, bail};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// One run's figures.
#[derive(Debug, Clone)]
pub struct ReconnectFigures {
    pub devices: usize,
    /// From the kill until every device was in again.
    pub back: Duration,
    /// Connection attempts made again, the fleet's, after the kill.
    pub retries: usize,
    /// The new control plane's CPU until then (its start included), per
    /// device.
    pub cpu_per_device: Duration,
    pub load: (f64, f64),
}

async fn connected_here(api: &Api) -> Result<u64> {
    Ok(api.get("/summary").await?["connectedHere"]["websocket"]
        .as_u64()
        .unwrap_or(0))
}

/// Waits until the control plane at `api` has `devices` connected.
async fn until_in(api: &Api, devices: usize, limit: Duration) -> Result<()> {
    let started = Instant::now();
    loop {
        match connected_here(api).await {
            Ok(n) if n >= devices as u64 => return Ok(()),
            _ if started.elapsed() > limit => {
                bail!(
                    "only {} of {devices} in",
                    connected_here(api).await.unwrap_or(0)
                )
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// One run: a fresh control plane, N devices from one address, a restart.
pub async fn measure(drover: &Path, devices: usize) -> Result<ReconnectFigures> {
    let dir = tempfile::Builder::new()
        .prefix("drover-reconnect-")
        .tempdir()?;
    let secrets = drover_server::auth::Secrets::load_or_create(&dir.path().join("data"), None)?;
    let ids = device_ids("nat-", devices);
    let agents = format!("127.0.0.1:{}", free_port()?);
    let serve = Serve {
        transport: Transport::Websocket,
        broker_url: None,
        nats_replicas: 1,
        store_on_nats: false,
        nats_authority: None,
    };
    let (process, api_base, _) = start_drover_on(drover, dir.path(), serve, &agents)?;
    let mut process: Option<Process> = Some(process);
    let api = |base: &str| -> Result<Api> {
        Ok(Api {
            base: format!("http://{base}"),
            token: secrets.operator_token().to_owned(),
            http: http_builder().build()?,
        })
    };
    let first = api(&api_base)?;
    crate::harness::register(&first.base, &first.token, &ids).await?;
    let stats = Arc::new(Stats::default());
    let behaviour = Arc::new(Behaviour::default());
    let shutdown = CancellationToken::new();
    let target = Target {
        addr: agents.parse()?,
        sources: 1,
    };
    for (index, device) in ids.iter().enumerate() {
        let agent = SimAgent::new(device.clone(), behaviour.clone(), stats.clone());
        tokio::spawn(crate::ws::play(
            target,
            index,
            secrets.device_token(device),
            agent,
            shutdown.clone(),
        ));
    }
    until_in(&first, devices, Duration::from_secs(600))
        .await
        .context("the first connections")?;

    let load_before = procstat::load_average().unwrap_or(f64::NAN);
    let retries_before = stats.reconnects.load(Ordering::Relaxed);
    let killed = Instant::now();
    if let Some(mut old) = process.take() {
        // SIGKILL, as a crash: no shutdown path runs. Its handle's own
        // drop would signal a process already gone.
        let _ = old.0.kill();
        let _ = old.0.wait();
        std::mem::forget(old);
    }
    let (again, api_base, _) = start_drover_on(drover, dir.path(), serve, &agents)?;
    let second = api(&api_base)?;
    until_in(&second, devices, Duration::from_secs(600)).await?;
    let back = killed.elapsed();
    let cpu_after = procstat::usage(again.0.id()).context("the control plane's usage")?;
    let load_after = procstat::load_average().unwrap_or(f64::NAN);
    shutdown.cancel();
    Ok(ReconnectFigures {
        devices,
        back,
        retries: stats.reconnects.load(Ordering::Relaxed) - retries_before,
        cpu_per_device: cpu_after.cpu / devices.max(1) as u32,
        load: (load_before, load_after),
    })
}
