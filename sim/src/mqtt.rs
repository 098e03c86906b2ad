//! Simulated agents over MQTT: one persistent session per device, logged in
//! with its device id and broker password, on the topics `drover mqtt-config` permits:
//! its intents (retained), a hello after every connect, statuses QoS 1
//! (the broker's PUBACK confirms them) and heartbeats.

use crate::SimAgent;
use drover_model::model::Hello;
use drover_model::wire::parse_intent_bytes;
use rumqttc::{Event, Incoming, Outgoing, QoS};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use transport_mqtt::{MqttSettings, Topic, Topics};

/// Plays one agent until `shutdown`.
pub async fn play(url: String, token: String, mut agent: SimAgent, shutdown: CancellationToken) {
    loop {
        if let Err(e) = session(&url, &token, &mut agent, &shutdown).await {
            agent.stats.errors.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(device = %agent.device, error = %e, "simulated MQTT agent failed");
        } else {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500 + fastrand::u64(0..1500))) => {}
            _ = shutdown.cancelled() => return,
        }
        agent.stats.reconnects.fetch_add(1, Ordering::Relaxed);
    }
}

async fn session(
    url: &str,
    token: &str,
    agent: &mut SimAgent,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let topics = Topics::new(transport_mqtt::DEFAULT_PREFIX);
    let settings = MqttSettings {
        url: url.to_owned(),
        user: agent.device.to_string(),
        password: drover_model::credentials::broker_password(token, &agent.device),
        ca_file: None,
        prefix: transport_mqtt::DEFAULT_PREFIX.to_owned(),
        keep_alive: Duration::from_secs(60),
    };
    let mut options = transport_mqtt::options(&settings, agent.device.as_str())?;
    // As the real agent connects: a clean session, its intents retained.
    options.set_clean_session(true);
    let (client, mut events) = transport_mqtt::client(options, 64);
    let mut asked: VecDeque<Option<u64>> = VecDeque::new();
    let mut in_flight: HashMap<u16, u64> = HashMap::new();
    let mut sent: HashSet<u64> = HashSet::new();
    let mut connected = false;
    let (mut subscribe_due, mut hello_due) = (false, false);
    let mut heartbeat = tokio::time::interval_at(
        tokio::time::Instant::now() + agent.behaviour.heartbeat,
        agent.behaviour.heartbeat,
    );
    let result = async {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    let _ = client.try_disconnect();
                    return Ok(());
                }
                _ = heartbeat.tick(), if connected => {
                    let payload = serde_json::to_vec(&agent.heartbeat())?;
                    if client.try_publish(topics.heartbeat(&agent.device), QoS::AtMostOnce, false, payload).is_ok() {
                        asked.push_back(None);
                    }
                }
                event = events.poll() => match event? {
                    Event::Incoming(Incoming::ConnAck(_)) => {
                        if !connected {
                            agent.stats.connected.fetch_add(1, Ordering::Relaxed);
                        }
                        connected = true;
                        subscribe_due = true;
                        hello_due = true;
                    }
                    Event::Incoming(Incoming::Publish(publish)) => {
                        if let Some(Topic::Intent(..)) = topics.parse(&publish.topic)
                            && !publish.payload.is_empty()
                            && let Ok(intent) = parse_intent_bytes(&publish.payload)
                            && agent.take(&intent).is_some()
                        {
                            let payload = serde_json::to_vec(&agent.heartbeat())?;
                            if client.try_publish(topics.heartbeat(&agent.device), QoS::AtMostOnce, false, payload).is_ok() {
                                asked.push_back(None);
                            }
                        }
                    }
                    Event::Outgoing(Outgoing::Publish(pkid)) => {
                        if let Some(Some(id)) = asked.pop_front() && pkid != 0 {
                            in_flight.insert(pkid, id);
                        }
                    }
                    Event::Incoming(Incoming::PubAck(ack)) => {
                        if let Some(id) = in_flight.remove(&ack.pkid) {
                            agent.confirm(id);
                        }
                    }
                    _ => {}
                },
            }
            // Like the agent, this loop alone drains its request queue, so it
            // never waits for room there: what the queue does not take now
            // is tried again after the next event.
            if subscribe_due {
                subscribe_due = client
                    .try_subscribe(topics.intents_of(&agent.device), QoS::AtLeastOnce)
                    .is_err();
            }
            if hello_due && !subscribe_due {
                let hello = Hello {
                    device_id: agent.device.clone(),
                    agent_version: "sim".into(),
                    boot_id: agent.boot_id.clone(),
                    capabilities: SimAgent::capabilities(),
                    jobs: agent.held(),
                };
                hello_due = client
                    .try_publish(topics.hello(&agent.device), QoS::AtLeastOnce, false, serde_json::to_vec(&hello)?)
                    .is_err();
                if !hello_due {
                    asked.push_back(None);
                }
            }
            if hello_due || !connected {
                continue;
            }
            // Statuses not yet sent on this connection go out.
            let fresh: Vec<(u64, String, Vec<u8>)> = agent
                .pending()
                .iter()
                .filter(|(id, _)| !sent.contains(id))
                .filter_map(|(id, status)| {
                    Some((*id, topics.status(&status.device_id, status.job_id), serde_json::to_vec(status).ok()?))
                })
                .collect();
            for (id, topic, payload) in fresh {
                if client.try_publish(topic, QoS::AtLeastOnce, true, payload).is_err() {
                    break;
                }
                sent.insert(id);
                asked.push_back(Some(id));
            }
        }
    }
    .await;
    if connected {
        agent.stats.connected.fetch_sub(1, Ordering::Relaxed);
    }
    result
}
