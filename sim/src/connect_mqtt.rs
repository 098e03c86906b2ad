//! `drover-sim mqtt-connect` (issue 55): N devices connecting to one
//! mosquitto at once, all from one address, as a site's fleet does after
//! the broker restarts: by the password file of the static set-up
//! (`drover mqtt-config --device`) or by the logins the control plane
//! handed the dynamic security plugin when it accepted them (`drover
//! mqtt-config --dynamic-security`). Both hash with PBKDF2-SHA512. No
//! control plane: the figure is the broker's cost of letting devices in.
//! Each device that fails tries again after the agent's own backoff (its
//! MQTT link starts at one second), as the agent does.

use crate::harness::{Process, broker_passwords, start_mosquitto, start_mosquitto_dynsec};
use crate::logins::{control_client, hand_over};
use crate::procstat;
use agent_core::backoff::{Backoff, DEFAULT_BACKOFF_MAX};
use anyhow::{Context, Result, bail};
use drover_model::DeviceId;
use rumqttc::{Event, Incoming};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Where the broker keeps the devices' logins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Logins {
    /// mosquitto's password file, written before it starts.
    File,
    /// The dynamic security plugin, given each login over
    /// `$CONTROL/dynamic-security/v1` as the control plane does.
    Dynsec,
}

/// One run's figures.
#[derive(Debug, Clone)]
pub struct MqttConnectFigures {
    pub devices: usize,
    /// From the first attempt until every device was connected.
    pub connected: Duration,
    /// The broker's CPU over that time, per device.
    pub broker_cpu_per_device: Duration,
    /// Attempts that failed and were made again.
    pub retries: usize,
    pub load: (f64, f64),
}

/// The agent's first delay after its MQTT link fails.
const MQTT_BACKOFF_INITIAL: Duration = Duration::from_secs(1);

/// One device: connects, tries again after its backoff until the broker
/// lets it in, then holds its connection until `done`.
async fn device(
    url: String,
    device: DeviceId,
    password: String,
    connected: Arc<AtomicUsize>,
    retries: Arc<AtomicUsize>,
    done: CancellationToken,
) -> Result<()> {
    let settings = transport_mqtt::MqttSettings {
        url,
        user: device.to_string(),
        password,
        ca_file: None,
        prefix: transport_mqtt::DEFAULT_PREFIX.to_owned(),
        keep_alive: Duration::from_secs(60),
    };
    let mut options = transport_mqtt::options(&settings, device.as_str())?;
    options.set_clean_session(true);
    let (client, mut events) = transport_mqtt::client(options, 8);
    let mut backoff = Backoff::new(MQTT_BACKOFF_INITIAL, DEFAULT_BACKOFF_MAX);
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut attempt = Instant::now();
    let mut counted = false;
    loop {
        tokio::select! {
            _ = done.cancelled() => {
                let _ = client.try_disconnect();
                return Ok(());
            }
            event = events.poll() => match event {
                Ok(Event::Incoming(Incoming::ConnAck(_))) if !counted => {
                    counted = true;
                    connected.fetch_add(1, Ordering::Relaxed);
                }
                Ok(_) => {}
                Err(e) if Instant::now() < deadline => {
                    if retries.fetch_add(1, Ordering::Relaxed) < 3 {
                        eprintln!("a connection failed: {e}; trying again");
                    }
                    tokio::time::sleep(backoff.failed(attempt.elapsed())).await;
                    attempt = Instant::now();
                }
                Err(e) => bail!("{device}: {e}"),
            }
        }
    }
}

/// One run: a fresh broker with N logins, N devices connecting at once.
pub async fn measure(devices: usize, logins: Logins) -> Result<MqttConnectFigures> {
    let dir = tempfile::Builder::new()
        .prefix("drover-mqtt-connect-")
        .tempdir()?;
    let passwords: Vec<(DeviceId, String)> = (0..devices)
        .map(|i| {
            let id = DeviceId::new(format!("mc-{i:05}"))?;
            Ok((id, format!("{:064x}", fastrand::u128(..))))
        })
        .collect::<Result<_>>()?;
    match logins {
        Logins::File => {
            // Each device's password derived from its token, as `drover
            // mqtt-config --device` and its agent both derive it.
            let tokens = passwords;
            let (broker, url) = start_mosquitto(dir.path(), &tokens, "")?;
            run(broker, url, broker_passwords(&tokens), devices).await
        }
        Logins::Dynsec => {
            let (broker, url, _) = start_mosquitto_dynsec(dir.path())?;
            let (client, mut events) = control_client(url.clone(), devices).await?;
            hand_over(&client, &mut events, &passwords).await?;
            let _ = client.disconnect().await;
            run(broker, url, passwords, devices).await
        }
    }
}

/// Every device connects at once; the clock runs until all are in.
async fn run(
    broker: Process,
    url: String,
    passwords: Vec<(DeviceId, String)>,
    devices: usize,
) -> Result<MqttConnectFigures> {
    let connected = Arc::new(AtomicUsize::new(0));
    let retries = Arc::new(AtomicUsize::new(0));
    let done = CancellationToken::new();
    let before = procstat::usage(broker.0.id()).context("the broker's usage")?;
    let load_before = procstat::load_average().unwrap_or(f64::NAN);
    let started = Instant::now();
    let tasks: Vec<_> = passwords
        .into_iter()
        .map(|(id, password)| {
            tokio::spawn(device(
                url.clone(),
                id,
                password,
                connected.clone(),
                retries.clone(),
                done.clone(),
            ))
        })
        .collect();
    while connected.load(Ordering::Relaxed) < devices {
        if started.elapsed() > Duration::from_secs(600) {
            done.cancel();
            bail!(
                "only {} of {devices} connected in ten minutes",
                connected.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let in_after = started.elapsed();
    let after = procstat::usage(broker.0.id()).context("the broker's usage")?;
    let load_after = procstat::load_average().unwrap_or(f64::NAN);
    done.cancel();
    for task in tasks {
        let _ = task.await;
    }
    drop(broker);
    Ok(MqttConnectFigures {
        devices,
        connected: in_after,
        broker_cpu_per_device: after.cpu.saturating_sub(before.cpu) / devices.max(1) as u32,
        retries: retries.load(Ordering::Relaxed),
        load: (load_before, load_after),
    })
}
