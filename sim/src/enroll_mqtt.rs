//! `drover-sim enroll --transport mqtt` (issue 55): N devices of one image
//! joining at once over MQTT, as a fleet's first boot would, each as the
//! agent does it: log in with its own password (its key's signature);
//! refused, ask to join on `enroll/<id>` as the enrollment user (one short
//! connection: connect, publish, the broker's PUBACK) with one auto-accept
//! token, and log in again after the agent's own backoff. mosquitto runs the dynamic
//! security plugin as `drover mqtt-config --dynamic-security` sets it up,
//! and the control plane adds each accepted device's login to it. A
//! device learns it was accepted only by logging in, so "all accepted" is
//! when the control plane had accepted them all (its API), and "all in" is
//! when the last device's own login was let in.

use crate::enroll::{EnrollFigures, image_token};
use crate::harness::{Serve, Transport, start_drover, start_mosquitto_dynsec};
use crate::keys::key;
use crate::procstat;
use anyhow::{Context, Result, bail};
use drover_model::DeviceId;
use drover_model::enroll::{Signer, key_broker_password};
use rumqttc::{ConnectReturnCode, Event, Incoming};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use transport_mqtt::MqttSettings;
use transport_mqtt::enrolling::{Joining, ask};

/// What every simulated device shares.
struct Fleet {
    url: String,
    token: String,
    in_by_key: AtomicUsize,
    retries: AtomicUsize,
}

impl Fleet {
    fn settings(&self, user: &str, password: String) -> MqttSettings {
        MqttSettings {
            url: self.url.clone(),
            user: user.to_owned(),
            password,
            ca_file: None,
            prefix: transport_mqtt::DEFAULT_PREFIX.to_owned(),
            keep_alive: Duration::from_secs(60),
        }
    }

    /// After the device's `failures`th failure: the agent's own backoff
    /// (1 s doubled per failure to 60 s, jittered in its upper half). Over
    /// MQTT a device not let in yet asks again and again until its login
    /// is made, so a flat short jitter (the other transports' tools) would
    /// ask far more often than a fleet of agents does.
    async fn again(&self, device: &DeviceId, what: &str, failures: u32) {
        if self.retries.fetch_add(1, Ordering::Relaxed) < 3 {
            eprintln!("{device}: {what}; trying again");
        }
        backoff(failures).await;
    }
}

/// The agent's wait after its `failures`th failed session.
async fn backoff(failures: u32) {
    let delay = agent_core::backoff::delay(
        failures,
        Duration::from_secs(1),
        agent_core::backoff::DEFAULT_BACKOFF_MAX,
    );
    tokio::time::sleep(delay).await;
}

/// How a device's own login went.
enum Login {
    In(tokio::task::JoinHandle<()>),
    Refused,
    Failed(String),
}

/// Logs in as `device` with its key's password; in, its connection is kept
/// by a task polling it.
async fn login(fleet: &Fleet, device: &DeviceId, signer: &dyn Signer) -> Login {
    let settings = fleet.settings(device.as_str(), key_broker_password(signer, device));
    let mut options = match transport_mqtt::options(&settings, device.as_str()) {
        Ok(options) => options,
        Err(e) => return Login::Failed(e.to_string()),
    };
    options.set_clean_session(true);
    let (client, mut events) = transport_mqtt::client(options, 4);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match tokio::time::timeout_at(deadline, events.poll()).await {
            Ok(Ok(Event::Incoming(Incoming::ConnAck(ack)))) => {
                if ack.code != ConnectReturnCode::Success {
                    return Login::Refused;
                }
                return Login::In(tokio::spawn(async move {
                    let _client = client;
                    while events.poll().await.is_ok() {}
                }));
            }
            Ok(Ok(_)) => {}
            Ok(Err(rumqttc::ConnectionError::ConnectionRefused(_))) => return Login::Refused,
            Ok(Err(e)) => return Login::Failed(e.to_string()),
            Err(_) => return Login::Failed("no CONNACK within 20 s".into()),
        }
    }
}

/// One device: log in, and while refused ask to join and wait; returns
/// the task holding its connection.
async fn device(fleet: Arc<Fleet>, index: usize) -> Result<tokio::task::JoinHandle<()>> {
    let device = DeviceId::new(format!("enm-{index:05}"))?;
    let signer: Arc<dyn Signer> = Arc::new(key(index)?);
    let joining = Joining {
        signer: signer.clone(),
        token: fleet.token.clone(),
    };
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut failures = 0;
    loop {
        match login(&fleet, &device, signer.as_ref()).await {
            Login::In(held) => {
                fleet.in_by_key.fetch_add(1, Ordering::Relaxed);
                return Ok(held);
            }
            _ if Instant::now() >= deadline => bail!("{device}: not let in within 900 s"),
            Login::Failed(e) => {
                failures += 1;
                fleet.again(&device, &e, failures).await;
                continue;
            }
            Login::Refused => {}
        }
        let settings = fleet.settings("", String::new());
        // The agent's session ends either way (asked, or failed to ask),
        // and it waits its backoff before logging in again.
        failures += 1;
        match ask(&settings, &joining, &device, Default::default()).await {
            // Its first request is no retry.
            Ok(()) if failures == 1 => backoff(failures).await,
            Ok(()) => {
                fleet
                    .again(&device, "not let in after asking", failures)
                    .await
            }
            Err(e) => fleet.again(&device, &e, failures).await,
        }
    }
}

/// One run: a fresh broker and control plane, N devices joining at once.
pub async fn measure(drover: &Path, devices: usize) -> Result<EnrollFigures> {
    let dir = tempfile::Builder::new()
        .prefix("drover-enroll-mqtt-")
        .tempdir()?;
    let (broker, url, _) = start_mosquitto_dynsec(dir.path())?;
    let (process, api_base, _) = start_drover(
        drover,
        dir.path(),
        Serve {
            transport: Transport::Mqtt,
            broker_url: Some(&url),
            nats_replicas: 1,
            store_on_nats: false,
            nats_authority: None,
        },
    )?;
    let (api, token) = image_token(dir.path(), &api_base).await?;
    let fleet = Arc::new(Fleet {
        url,
        token,
        in_by_key: AtomicUsize::new(0),
        retries: AtomicUsize::new(0),
    });
    let cp_before = procstat::usage(process.0.id()).context("the control plane's usage")?;
    let broker_before = procstat::usage(broker.0.id()).context("the broker's usage")?;
    let load_before = procstat::load_average().unwrap_or(f64::NAN);
    let started = Instant::now();
    let tasks: Vec<_> = (0..devices)
        .map(|i| tokio::spawn(device(fleet.clone(), i)))
        .collect();
    let mut accepted_at = None;
    let mut next_count = Instant::now();
    let (mut accepted, mut next_word) = (0, Instant::now() + Duration::from_secs(60));
    while !tasks.iter().all(|t| t.is_finished()) {
        if accepted_at.is_none() && Instant::now() >= next_count {
            // Counting the accepted keys costs the control plane a listing:
            // twice a second, not at every turn.
            next_count = Instant::now() + Duration::from_millis(500);
            let keys = api.get("/device-keys?state=accepted").await?;
            accepted = keys.as_array().map_or(0, Vec::len);
            if accepted >= devices {
                accepted_at = Some(started.elapsed());
            }
        }
        if Instant::now() >= next_word {
            // A long run says how far it is, once a minute.
            next_word += Duration::from_secs(60);
            eprintln!(
                "after {} s: {accepted} accepted, {} in by key",
                started.elapsed().as_secs(),
                fleet.in_by_key.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let connected = started.elapsed();
    let mut held = Vec::new();
    for task in tasks {
        held.push(task.await?.with_context(|| {
            format!(
                "{} of {devices} in by key and {accepted} accepted after {} s",
                fleet.in_by_key.load(Ordering::Relaxed),
                connected.as_secs()
            )
        })?);
    }
    let cp_after = procstat::usage(process.0.id()).context("the control plane's usage")?;
    let broker_after = procstat::usage(broker.0.id()).context("the broker's usage")?;
    let load_after = procstat::load_average().unwrap_or(f64::NAN);
    for task in held {
        task.abort();
    }
    let per_device =
        |before: Duration, after: Duration| after.saturating_sub(before) / devices.max(1) as u32;
    Ok(EnrollFigures {
        devices,
        accepted: accepted_at.unwrap_or(connected),
        connected,
        cpu_per_device: per_device(cp_before.cpu, cp_after.cpu),
        broker_cpu_per_device: Some(per_device(broker_before.cpu, broker_after.cpu)),
        retries: fleet.retries.load(Ordering::Relaxed),
        load: (load_before, load_after),
    })
}
