//! `drover-sim mqtt-logins` (issue 55): what mosquitto's dynamic security
//! plugin costs when devices join over MQTT. The control plane hands the
//! broker one login per accepted device (`transport_mqtt::dynsec::admit`),
//! and the plugin of mosquitto 2.0 writes its whole file again after each
//! command, so each login costs more than the last. This sends N logins
//! as the control plane does, all at once, and prints the time until the
//! broker answered them all, the broker's CPU per login, and its file.

use crate::harness::{CP_PASSWORD, CP_USER, Process, start_mosquitto_dynsec};
use crate::procstat;
use anyhow::{Context, Result, bail};
use drover_model::DeviceId;
use rumqttc::{Event, Incoming, QoS};
use std::time::{Duration, Instant};

/// One run's figures.
#[derive(Debug, Clone)]
pub struct LoginFigures {
    pub logins: usize,
    /// From the first command until the broker answered the last.
    pub answered: Duration,
    /// The broker's CPU over that time, per login.
    pub broker_cpu_per_login: Duration,
    /// The plugin's file at the end.
    pub file_bytes: u64,
    pub load: (f64, f64),
}

/// One run: a fresh broker, N logins sent at once.
pub async fn measure(logins: usize) -> Result<LoginFigures> {
    let dir = tempfile::Builder::new()
        .prefix("drover-mqtt-logins-")
        .tempdir()?;
    let (broker, url, file): (Process, String, _) = start_mosquitto_dynsec(dir.path())?;
    let (client, mut events) = control_client(url, logins).await?;
    let before = procstat::usage(broker.0.id()).context("the broker's usage")?;
    let load_before = procstat::load_average().unwrap_or(f64::NAN);
    let logins: Vec<(DeviceId, String)> = (0..logins)
        .map(|index| {
            let device = DeviceId::new(format!("ml-{index:05}"))?;
            Ok((device, format!("{:0128x}", index)))
        })
        .collect::<Result<_>>()?;
    let started = Instant::now();
    hand_over(&client, &mut events, &logins).await?;
    let logins = logins.len();
    let answered_in = started.elapsed();
    let after = procstat::usage(broker.0.id()).context("the broker's usage")?;
    let load_after = procstat::load_average().unwrap_or(f64::NAN);
    Ok(LoginFigures {
        logins,
        answered: answered_in,
        broker_cpu_per_login: after.cpu.saturating_sub(before.cpu) / logins.max(1) as u32,
        file_bytes: std::fs::metadata(&file)?.len(),
        load: (load_before, load_after),
    })
}

/// The control plane's client at the broker at `url`, subscribed to the
/// plugin's answers, room for `logins` of them.
pub(crate) async fn control_client(
    url: String,
    logins: usize,
) -> Result<(rumqttc::AsyncClient, rumqttc::EventLoop)> {
    let settings = transport_mqtt::MqttSettings {
        url,
        user: CP_USER.to_owned(),
        password: CP_PASSWORD.to_owned(),
        ca_file: None,
        prefix: transport_mqtt::DEFAULT_PREFIX.to_owned(),
        keep_alive: Duration::from_secs(60),
    };
    let mut options = transport_mqtt::options(&settings, "drover-sim-logins")?;
    options.set_clean_session(true).set_inflight(1000);
    let (client, mut events) = transport_mqtt::client(options, logins + 16);
    client
        .subscribe(transport_mqtt::dynsec::response_topic(), QoS::AtLeastOnce)
        .await?;
    // Wait for the subscription before the clock starts.
    loop {
        match tokio::time::timeout(Duration::from_secs(10), events.poll()).await {
            Ok(Ok(Event::Incoming(Incoming::SubAck(_)))) => break,
            Ok(Ok(_)) => {}
            Ok(Err(e)) => bail!("the broker: {e}"),
            Err(_) => bail!("no subscription within 10 s"),
        }
    }
    Ok((client, events))
}

/// Hands the broker each device's login at once (the logins the control
/// plane makes when devices are accepted, all sent together), and waits
/// until it answered them all.
pub(crate) async fn hand_over(
    client: &rumqttc::AsyncClient,
    events: &mut rumqttc::EventLoop,
    logins: &[(DeviceId, String)],
) -> Result<()> {
    for (device, password) in logins {
        client
            .publish(
                transport_mqtt::dynsec::CONTROL_TOPIC,
                QoS::AtLeastOnce,
                false,
                transport_mqtt::dynsec::command(
                    device,
                    &transport_mqtt::admissions::Command::Create(password.clone()),
                ),
            )
            .await?;
    }
    let mut answered = 0;
    while answered < logins.len() {
        match tokio::time::timeout(Duration::from_secs(600), events.poll()).await {
            Ok(Ok(Event::Incoming(Incoming::Publish(p))))
                if p.topic == transport_mqtt::dynsec::response_topic() =>
            {
                let failures = transport_mqtt::dynsec::failures(&p.payload);
                if !failures.is_empty() {
                    bail!("the plugin refused: {failures:?}");
                }
                answered += 1;
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => bail!("the broker: {e}"),
            Err(_) => bail!("only {answered} of {} answered", logins.len()),
        }
    }
    Ok(())
}
