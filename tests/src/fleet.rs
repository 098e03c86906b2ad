//! One fleet per transport for scenarios written once (issue 29): a
//! control plane, the broker the transport needs (none for WebSocket), and
//! agents started over it.

use crate::{AgentProcess, CP_BROKER_USER, ControlPlane, Mosquitto, NatsServer};
use serde_json::Value;
use std::path::PathBuf;

/// The control plane's broker password in these fleets.
pub const FLEET_PASSWORD: &str = "fleet-secret";

/// The broker between the control plane and the agents, if any.
pub enum Broker {
    None,
    Nats(NatsServer),
    Mqtt(Mosquitto),
}

/// A control plane with the broker of one transport (or none: WebSocket),
/// and agents over that transport: the same scenario runs on each.
pub struct Fleet {
    pub cp: ControlPlane,
    pub broker: Broker,
}

impl Fleet {
    pub fn websocket() -> Self {
        Self {
            cp: ControlPlane::start(&[]),
            broker: Broker::None,
        }
    }

    pub fn nats(devices: &[&str]) -> Self {
        let (nats, cp) = crate::nats_fleet(devices, FLEET_PASSWORD);
        Self {
            cp,
            broker: Broker::Nats(nats),
        }
    }

    pub fn mqtt(devices: &[&str]) -> Self {
        let (broker, cp) = crate::mqtt_fleet(devices, FLEET_PASSWORD);
        Self {
            cp,
            broker: Broker::Mqtt(broker),
        }
    }

    pub fn agent(&self, device: &str, extra: &str) -> AgentProcess {
        let dir = self.cp.dir.path().join(device);
        let token = self.cp.device_token(device);
        match &self.broker {
            Broker::None => AgentProcess::start(&dir, device, &self.cp.agent_url, &token, extra),
            Broker::Nats(nats) => {
                AgentProcess::start_nats(&dir, device, &nats.url(), &token, None, extra)
            }
            Broker::Mqtt(broker) => {
                AgentProcess::start_mqtt(&dir, device, &broker.url(), &token, extra)
            }
        }
    }

    /// An agent whose `[updater]` table is `updater` (upgrade mode in a
    /// disposable root, say).
    pub fn agent_updating(&self, device: &str, updater: &str) -> AgentProcess {
        let dir = self.cp.dir.path().join(device);
        let token = self.cp.device_token(device);
        let transport = match &self.broker {
            Broker::None => format!(
                "kind = \"websocket\"\nserver_url = {}\ntoken = {}\nheartbeat_seconds = 1\nbackoff_max_seconds = 2\n",
                crate::toml_string(&self.cp.agent_url),
                crate::toml_string(&token)
            ),
            Broker::Nats(nats) => crate::agent::nats_transport(&nats.url(), &token, None),
            Broker::Mqtt(broker) => crate::agent::mqtt_transport(&broker.url(), &token, None),
        };
        AgentProcess::start_full(&dir, device, &transport, "", updater, "")
    }

    /// An agent held before its upgrade's full-upgrade step.
    pub fn held_agent(&self, device: &str) -> (AgentProcess, PathBuf, PathBuf) {
        let dir = self.cp.dir.path().join(device);
        std::fs::create_dir_all(&dir).expect("dir");
        let hold = dir.join("hold");
        let reached = dir.join("reached");
        std::fs::write(&hold, "").expect("hold");
        let agent = self.agent(device, &crate::hold_config(&hold, &reached));
        (agent, hold, reached)
    }

    /// What the broker keeps in the intent's place for `device`'s job.
    pub async fn kept(&self, device: &str, job: &str) -> Option<Value> {
        match &self.broker {
            Broker::None => None,
            Broker::Nats(nats) => bucket_value(nats, "system-upgrade-intent", device, job).await,
            Broker::Mqtt(broker) => retained(broker, device, job).await,
        }
    }
}

/// The value under `<device>.<job>` in a NATS KV bucket, read as the
/// control plane.
async fn bucket_value(nats: &NatsServer, bucket: &str, device: &str, job: &str) -> Option<Value> {
    let client = async_nats::ConnectOptions::with_user_and_password(
        CP_BROKER_USER.into(),
        FLEET_PASSWORD.into(),
    )
    .connect(nats.url())
    .await
    .expect("connect");
    let bucket = async_nats::jetstream::new(client)
        .get_key_value(bucket)
        .await
        .expect("bucket");
    let value = bucket.get(format!("{device}.{job}")).await.expect("get")?;
    serde_json::from_slice(&value).ok()
}

/// The retained message on the device's intent topic for `job`, read as the
/// control plane (which may read every topic under the prefix). A message
/// of our own on a second topic, published after the subscription, marks
/// the end: mosquitto hands a subscriber the retained messages first.
pub async fn retained(broker: &Mosquitto, device: &str, job: &str) -> Option<Value> {
    use rumqttc::{Event, Packet, QoS};
    let mut options = rumqttc::MqttOptions::new("cancel-test-reader", "127.0.0.1", broker.port);
    // A second control-plane user: under the control plane's own, the
    // broker would give this reader its client id and push it off.
    options.set_credentials(crate::WATCH_BROKER_USER, FLEET_PASSWORD);
    let (client, mut events) = rumqttc::AsyncClient::new(options, 16);
    let topic = format!("drover/v1/devices/{device}/intents/{job}");
    let marker = format!("drover/v1/devices/{device}/test-marker");
    for t in [&topic, &marker] {
        client
            .subscribe(t.clone(), QoS::AtLeastOnce)
            .await
            .expect("subscribe");
    }
    let mut subscribed = 0;
    let mut found = None;
    loop {
        match events.poll().await.expect("mqtt") {
            Event::Incoming(Packet::SubAck(_)) => {
                subscribed += 1;
                if subscribed == 2 {
                    client
                        .publish(marker.clone(), QoS::AtLeastOnce, false, "end")
                        .await
                        .expect("publish");
                }
            }
            Event::Incoming(Packet::Publish(p)) if p.topic == topic => {
                found = serde_json::from_slice::<Value>(&p.payload).ok();
            }
            Event::Incoming(Packet::Publish(p)) if p.topic == marker => return found,
            _ => {}
        }
    }
}

impl Fleet {
    /// The status the broker keeps for `device`'s job (NATS's status
    /// bucket, under the seed's key); None where the transport keeps none.
    pub async fn kept_status(&self, device: &str, job: &str) -> Option<Value> {
        let Broker::Nats(nats) = &self.broker else {
            return None;
        };
        bucket_value(nats, "system-upgrade-status", device, job).await
    }

    /// Publishes `payload` where `device`'s intent for `job` arrives, as a
    /// control-plane user of the broker would (a peer the agent must not
    /// trust blindly); returns once the broker has it.
    pub async fn publish_intent(&self, device: &str, job: &str, payload: String) {
        match &self.broker {
            Broker::None => panic!("over WebSocket only the control plane sends intents"),
            Broker::Nats(nats) => {
                let client = async_nats::ConnectOptions::with_user_and_password(
                    CP_BROKER_USER.into(),
                    FLEET_PASSWORD.into(),
                )
                .connect(nats.url())
                .await
                .expect("connect");
                client
                    .publish(format!("drover.rp.intent.{device}.{job}"), payload.into())
                    .await
                    .expect("publish");
                client.flush().await.expect("flush");
            }
            Broker::Mqtt(broker) => {
                use rumqttc::{Event, Incoming, QoS};
                let mut options =
                    rumqttc::MqttOptions::new(format!("publisher-{job}"), "127.0.0.1", broker.port);
                options.set_credentials(crate::WATCH_BROKER_USER, FLEET_PASSWORD);
                let (client, mut events) = rumqttc::AsyncClient::new(options, 16);
                client
                    .publish(
                        format!("drover/v1/devices/{device}/intents/{job}"),
                        QoS::AtLeastOnce,
                        false,
                        payload,
                    )
                    .await
                    .expect("publish");
                while !matches!(
                    events.poll().await.expect("mqtt"),
                    Event::Incoming(Incoming::PubAck(_))
                ) {}
            }
        }
    }

    /// Makes the broker know `device` by its device token, as brokers set
    /// up before per-device broker passwords did, and restarts it.
    pub fn know_by_token(&mut self, device: &str) {
        let token = self.cp.device_token(device);
        match &mut self.broker {
            Broker::None => panic!("a WebSocket fleet has no broker"),
            Broker::Nats(nats) => {
                let id = drover_model::DeviceId::new(device).expect("id");
                let old = transport_nats::server::authorization_config(
                    (CP_BROKER_USER, FLEET_PASSWORD),
                    &[(id, token)],
                    transport_nats::server::DirectStatusPuts::Denied,
                )
                .expect("config");
                nats.reconfigure(&old);
            }
            Broker::Mqtt(broker) => {
                let passwd = broker.dir.path().join("auth/drover.passwd");
                let current = std::fs::read_to_string(&passwd).expect("password file");
                let prefix = format!("{device}:");
                let old: String = current
                    .lines()
                    .map(|line| match line.starts_with(&prefix) {
                        true => transport_mqtt::mosquitto::password_line(device, &token),
                        false => line.to_owned(),
                    })
                    .map(|line| format!("{line}\n"))
                    .collect();
                std::fs::write(&passwd, old).expect("write the old file");
                broker.restart();
            }
        }
    }

    /// Makes the broker know `devices` by their broker passwords again, as
    /// `drover nats-config` / `mqtt-config` write them, and restarts it.
    pub fn know_by_password(&mut self, devices: &[&str]) {
        match &mut self.broker {
            Broker::None => panic!("a WebSocket fleet has no broker"),
            Broker::Nats(nats) => nats.reconfigure(&crate::nats_auth(
                self.cp.dir.path(),
                devices,
                FLEET_PASSWORD,
            )),
            Broker::Mqtt(broker) => {
                let out = broker.dir.path().join("auth").display().to_string();
                let mut args = vec![
                    "mqtt-config",
                    "--control-plane-password",
                    FLEET_PASSWORD,
                    "--control-plane-user",
                    CP_BROKER_USER,
                    "--control-plane-user",
                    crate::WATCH_BROKER_USER,
                    "--out",
                    &out,
                ];
                for device in devices {
                    args.extend(["--device", device]);
                }
                ControlPlane::drover_in(self.cp.dir.path(), &args);
                broker.restart();
            }
        }
    }

    /// Kills the broker without letting it save anything (none for
    /// WebSocket: the caller's scenario is for brokers).
    pub fn kill_broker(&mut self) {
        match &mut self.broker {
            Broker::None => panic!("a WebSocket fleet has no broker"),
            Broker::Nats(nats) => nats.kill9(),
            Broker::Mqtt(broker) => broker.kill9(),
        }
    }

    /// Starts the killed broker again on its port and data.
    pub fn restart_broker(&mut self) {
        match &mut self.broker {
            Broker::None => panic!("a WebSocket fleet has no broker"),
            Broker::Nats(nats) => nats.restart(),
            Broker::Mqtt(broker) => broker.restart(),
        }
    }

    /// The transport's name, as an agent's status reports its link.
    pub fn transport(&self) -> &'static str {
        match self.broker {
            Broker::None => "websocket",
            Broker::Nats(_) => "nats",
            Broker::Mqtt(_) => "mqtt",
        }
    }
}
