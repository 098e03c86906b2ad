//! The agent's end over MQTT: one clean session (client id = device id)
//! subscribed at every connect to its intents and control topics, whose
//! retained messages give the latest intent or cancel order of each job; a
//! hello after every connect; statuses published QoS 1 from the durable
//! outbox and dropped only on the broker's PUBACK (A4); heartbeats; a last
//! will that says it went away. Each connection starts from fresh client
//! state: everything unconfirmed is published again (the control plane
//! treats duplicates as no-ops), and the broker's retained messages keep
//! the intents.

use crate::{Control, MqttSettings, Offline, TRANSPORT, Topic, Topics, options};
use agent_core::backoff::{Backoff, SessionEnd, Supervisor};
use agent_core::clock;
use agent_core::executor::{AdmitError, Agent};
use drover_model::credentials::BrokerPasswords;
use drover_model::logs::{LogChunk, LogRequest};
use drover_model::model::Hello;
use drover_model::wire::intent_json;
use rumqttc::{AsyncClient, Event, Incoming, LastWill, Outgoing, QoS, SubscribeFilter};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

#[derive(Debug, Clone)]
pub struct AgentSettings {
    /// The user is the device id; the password comes from `passwords`.
    pub mqtt: MqttSettings,
    pub passwords: BrokerPasswords,
    /// A device with its own key: how it asks to join while the broker
    /// does not let it in (its password is then the key's).
    pub joining: Option<crate::enrolling::Joining>,
    pub heartbeat_interval: Duration,
    pub backoff_max: Duration,
}

/// What the agent logs, and `check --connect` prints, when a broker took
/// the token instead of the derived password.
pub const USING_TOKEN: &str = "the MQTT broker knows this device by its token, not by the \
    password derived from it: write its files again with this version's `drover mqtt-config`, \
    so that they hold no token";

/// Why a session ended.
#[derive(Debug)]
enum Failure {
    /// The broker refused the credentials.
    Refused(String),
    Other(String),
}

impl From<String> for Failure {
    fn from(reason: String) -> Self {
        Self::Other(reason)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Refused(reason) | Self::Other(reason) => f.write_str(reason),
        }
    }
}

/// Why the link failed, in the operator's terms.
fn explain(e: &rumqttc::ConnectionError) -> Failure {
    use rumqttc::{ConnectReturnCode, ConnectionError};
    match e {
        ConnectionError::ConnectionRefused(
            ConnectReturnCode::BadUserNamePassword | ConnectReturnCode::NotAuthorized,
        ) => Failure::Refused(
            "the MQTT broker refused this device's password and its token: put what \
             `drover token DEVICE` prints on the control plane's host in the agent's \
             token_file, and authorize the device in mosquitto (`drover mqtt-config`)"
                .to_owned(),
        ),
        other => Failure::Other(other.to_string()),
    }
}

/// `settings.mqtt` with the password to try now.
fn with_password(settings: &AgentSettings, passwords: &BrokerPasswords) -> MqttSettings {
    MqttSettings {
        password: passwords.current().to_owned(),
        ..settings.mqtt.clone()
    }
}

/// Connects with this device's credentials, waits for the broker's
/// CONNACK, and disconnects: `drover-agent check --connect`. Returns
/// whether the broker took the token rather than the derived password.
pub async fn probe(settings: &AgentSettings, client_id: &str) -> Result<bool, String> {
    let mut passwords = settings.passwords.clone();
    loop {
        match probe_with(&with_password(settings, &passwords), client_id).await {
            Ok(()) => return Ok(passwords.using_token()),
            Err(Failure::Refused(_)) if !passwords.using_token() => {
                passwords.refused();
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

async fn probe_with(settings: &MqttSettings, client_id: &str) -> Result<(), Failure> {
    // The device's own id (a broker set up as `drover mqtt-config` prints
    // makes a client's id its user name anyway) and a clean session. It is
    // only used while the agent is not running: `check --connect` asks a
    // running agent over its status socket instead of pushing it off.
    let mut options = options(settings, client_id).map_err(|e| e.to_string())?;
    options.set_clean_session(true);
    let (client, mut events) = crate::client(options, 8);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout_at(deadline, events.poll()).await {
            Ok(Ok(Event::Incoming(Incoming::ConnAck(_)))) => {
                let _ = client.disconnect().await;
                return Ok(());
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(explain(&e)),
            Err(_) => {
                return Err(Failure::Other(format!(
                    "no answer from {} within 10 s",
                    settings.url
                )));
            }
        }
    }
}

/// Runs the agent's MQTT link until `shutdown`.
pub async fn run(settings: AgentSettings, agent: Arc<Agent>, shutdown: CancellationToken) {
    let backoff = Backoff::new(Duration::from_secs(1), settings.backoff_max);
    let mut passwords = settings.passwords.clone();
    let mut supervisor = Supervisor::new(&agent, TRANSPORT, backoff);
    loop {
        supervisor.start();
        let end = {
            let mqtt = with_password(&settings, &passwords);
            match session(&settings, &mqtt, passwords.using_token(), &agent, &shutdown).await {
                Ok(()) => SessionEnd::Shutdown,
                Err(e @ Failure::Refused(_)) if passwords.refused() => {
                    debug!(error = %e, "the MQTT broker refused the derived password; trying the token");
                    SessionEnd::RetryNow
                }
                Err(Failure::Refused(_)) if settings.joining.is_some() => {
                    ask_to_join(&settings, &agent).await
                }
                Err(e) => {
                    warn!(error = %e, "MQTT link failed");
                    SessionEnd::Failed(e.to_string())
                }
            }
        };
        if !supervisor.ended(&agent, end, &shutdown).await {
            return;
        }
    }
}

/// Not let in with the device's own password: it asks to join (again),
/// and tries its login after the usual wait.
async fn ask_to_join(settings: &AgentSettings, agent: &Agent) -> SessionEnd {
    let Some(joining) = &settings.joining else {
        return SessionEnd::Failed("no enrollment token to ask to join with".into());
    };
    let inventory = agent_core::inventory::inventory(agent);
    match crate::enrolling::ask(&settings.mqtt, joining, agent.device_id(), inventory).await {
        Ok(()) => {
            info!("asked to join over MQTT; waiting to be accepted");
            SessionEnd::Failed(
                "not let in yet: this device asked to join with its enrollment token and \
                 waits to be accepted (`drover devices pending` on the control plane)"
                    .into(),
            )
        }
        Err(e) => {
            warn!(error = %e, "cannot ask to join over MQTT");
            SessionEnd::Failed(e)
        }
    }
}

/// What the event loop's outgoing publishes are, in the order they were
/// asked for: an outbox entry, or something nobody waits on.
struct Pending {
    asked: VecDeque<Option<u64>>,
    /// Packet id → outbox id, until the broker's PUBACK.
    in_flight: HashMap<u16, u64>,
    /// Outbox ids published on this connection.
    sent: HashSet<u64>,
    /// What this connection still has to ask for once the request queue has
    /// room: the session's loop is the only thing that drains that queue, so
    /// it never waits for room there; it tries, and tries again after the
    /// next event.
    subscribe_due: bool,
    hello_due: bool,
    /// The outbox had more than the queue took.
    outbox_due: bool,
    /// A log answer's chunk the queue did not take yet.
    chunk: Option<Vec<u8>>,
}

impl Pending {
    fn any_due(&self) -> bool {
        self.subscribe_due || self.hello_due || self.outbox_due || self.chunk.is_some()
    }
}

/// The request queue of one connection: room for a full outbox page, the
/// subscriptions, a hello and a heartbeat.
const REQUEST_QUEUE: usize = 64 + 8;

async fn session(
    settings: &AgentSettings,
    mqtt: &MqttSettings,
    using_token: bool,
    agent: &Arc<Agent>,
    shutdown: &CancellationToken,
) -> Result<(), Failure> {
    let device = agent.device_id().clone();
    let topics = Topics::new(&mqtt.prefix);
    let mut options = options(mqtt, device.as_str()).map_err(|e| e.to_string())?;
    // A clean session: everything the control plane sends a device is
    // retained, one message per job topic, so a subscription at connect gets
    // the latest of each and nothing is lost. A persistent session would also
    // replay what the broker queued while the device was away, oldest first:
    // an intent whose topic now holds its cancel order came first, and the
    // job could start before the order arrived.
    options.set_clean_session(true);
    let will = serde_json::to_vec(&Offline {
        device_id: device.clone(),
        offline: true,
    })
    .map_err(|e| e.to_string())?;
    options.set_last_will(LastWill::new(
        topics.heartbeat(&device),
        will,
        QoS::AtLeastOnce,
        false,
    ));
    let (client, mut events) = crate::client(options, REQUEST_QUEUE);
    let mut pending = Pending {
        asked: VecDeque::new(),
        in_flight: HashMap::new(),
        sent: HashSet::new(),
        subscribe_due: false,
        hello_due: false,
        outbox_due: false,
        chunk: None,
    };
    // Log answers' chunks, published from this loop: every publish must
    // pass through it, in order, for `pending.asked` to stay true.
    let (chunks_tx, mut chunks) = mpsc::channel::<LogChunk>(4);
    let mut connected = false;
    let mut heartbeat = tokio::time::interval(settings.heartbeat_interval);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => {
                let _ = client.try_disconnect();
                return Ok(());
            }
            event = events.poll() => {
                let event = event.map_err(|e| explain(&e))?;
                match event {
                    Event::Incoming(Incoming::ConnAck(ack)) => {
                        info!(session_present = ack.session_present, "connected to MQTT");
                        if using_token {
                            warn!("{USING_TOKEN}");
                        }
                        connected = true;
                        agent.update_link(|l| {
                            l.connected = true;
                            l.last_contact = Some(clock::now());
                            l.last_error = None;
                        });
                        // Subscribing again is harmless, and needed when the
                        // broker lost the session (a crash between autosaves).
                        pending.subscribe_due = true;
                        pending.hello_due = true;
                        pending.outbox_due = true;
                    }
                    Event::Incoming(Incoming::Publish(publish)) => {
                        agent.update_link(|l| l.last_contact = Some(clock::now()));
                        match topics.parse(&publish.topic) {
                            Some(Topic::Intent(..)) if publish.payload.is_empty() => {
                                debug!(topic = %publish.topic, "intent withdrawn");
                            }
                            Some(Topic::Intent(..)) => {
                                admit(agent, &publish.payload);
                                pending.outbox_due = true;
                            }
                            Some(Topic::Control(_)) => match serde_json::from_slice::<Control>(&publish.payload) {
                                Ok(control) => {
                                    agent.observe_control_plane_time(control.server_time);
                                    if let Some(error) = control.error {
                                        warn!(%error, "the control plane refused this agent's hello");
                                    }
                                }
                                Err(e) => warn!(error = %e, "unreadable control message ignored"),
                            },
                            Some(Topic::LogsAsk(_)) => answer_logs(agent, &chunks_tx, &publish.payload),
                            _ => debug!(topic = %publish.topic, "message on an unexpected topic ignored"),
                        }
                    }
                    Event::Outgoing(Outgoing::Publish(pkid)) => {
                        if let Some(Some(outbox_id)) = pending.asked.pop_front()
                            && pkid != 0
                        {
                            pending.in_flight.insert(pkid, outbox_id);
                        }
                    }
                    Event::Incoming(Incoming::PubAck(ack)) => {
                        if let Some(outbox_id) = pending.in_flight.remove(&ack.pkid) {
                            if let Err(e) = agent.outbox_ack(outbox_id) {
                                warn!(error = %e, "cannot drop a confirmed status");
                            }
                            // A long outbox goes out as room frees up.
                            pending.outbox_due = true;
                        }
                    }
                    _ => {}
                }
                if connected && pending.any_due() {
                    catch_up(&client, &topics, agent, &mut pending)?;
                }
            }
            _ = heartbeat.tick(), if connected => publish_heartbeat(&client, &topics, agent, &mut pending)?,
            _ = agent.heartbeat_wanted().notified(), if connected => {
                pending.outbox_due = true;
                catch_up(&client, &topics, agent, &mut pending)?;
                publish_heartbeat(&client, &topics, agent, &mut pending)?;
            }
            _ = agent.outbox_changed().notified(), if connected => {
                pending.outbox_due = true;
                catch_up(&client, &topics, agent, &mut pending)?;
            }
            Some(chunk) = chunks.recv(), if connected && pending.chunk.is_none() => {
                pending.chunk = serde_json::to_vec(&chunk).ok();
                catch_up(&client, &topics, agent, &mut pending)?;
            }
        }
    }
}

fn admit(agent: &Agent, payload: &[u8]) {
    match agent.admit_signed(intent_json(payload)) {
        Ok(reply) => {
            debug!(job_id = %reply.status.job_id, duplicate = reply.duplicate, "intent recorded")
        }
        // Nothing to answer without a job id: log and drop (A7, A11).
        Err(AdmitError::Unreadable(e)) => warn!(error = %e, "unusable intent dropped"),
        Err(AdmitError::Store(e)) => {
            warn!(error = %e, "cannot record an intent; it is read again on reconnect")
        }
    }
}

/// Asks for what this connection still owes, in order (subscriptions, the
/// hello, then the outbox), as far as the request queue takes it now; what
/// it does not take stays due for the next turn.
fn catch_up(
    client: &AsyncClient,
    topics: &Topics,
    agent: &Agent,
    pending: &mut Pending,
) -> Result<(), String> {
    let device = agent.device_id();
    if pending.subscribe_due {
        let filters = [
            topics.intents_of(device),
            topics.control(device),
            topics.logs_ask(device),
        ]
        .map(|filter| SubscribeFilter::new(filter, QoS::AtLeastOnce));
        if client.try_subscribe_many(filters).is_err() {
            return Ok(());
        }
        pending.subscribe_due = false;
    }
    if pending.hello_due {
        let hello = Hello {
            device_id: device.clone(),
            agent_version: agent.agent_version().to_owned(),
            boot_id: agent.boot_id().to_owned(),
            capabilities: agent.capabilities(),
            jobs: agent.held_jobs().map_err(|e| e.to_string())?,
        };
        let payload = serde_json::to_vec(&hello).map_err(|e| e.to_string())?;
        if client
            .try_publish(topics.hello(device), QoS::AtLeastOnce, false, payload)
            .is_err()
        {
            return Ok(());
        }
        pending.asked.push_back(None);
        pending.hello_due = false;
    }
    if pending.outbox_due {
        pending.outbox_due = !flush(client, topics, agent, pending)?;
    }
    if let Some(chunk) = pending.chunk.take() {
        let topic = topics.logs_answer(device);
        if client
            .try_publish(topic, QoS::AtLeastOnce, false, chunk.clone())
            .is_ok()
        {
            pending.asked.push_back(None);
        } else {
            pending.chunk = Some(chunk);
        }
    }
    Ok(())
}

/// Answers the log request in `payload` in the background, its chunks
/// handed to the session's loop; one that does not parse is dropped (it
/// has no request id to answer).
fn answer_logs(agent: &Arc<Agent>, chunks: &mpsc::Sender<LogChunk>, payload: &[u8]) {
    let request: LogRequest = match serde_json::from_slice(payload) {
        Ok(request) => request,
        Err(e) => {
            warn!(error = %e, "an unreadable log request dropped");
            return;
        }
    };
    let (agent, chunks) = (agent.clone(), chunks.clone());
    tokio::spawn(agent_core::job_logs::relay(
        move |send| agent.logs().answer(&request, send),
        move |chunk| {
            let chunks = chunks.clone();
            async move { chunks.send(chunk).await.is_ok() }
        },
    ));
}

/// Publishes unconfirmed statuses not yet sent on this connection; true when
/// the queue took every one of them.
fn flush(
    client: &AsyncClient,
    topics: &Topics,
    agent: &Agent,
    pending: &mut Pending,
) -> Result<bool, String> {
    let entries = agent.outbox(64).map_err(|e| e.to_string())?;
    for entry in entries {
        if pending.sent.contains(&entry.id) {
            continue;
        }
        let payload = serde_json::to_vec(&entry.status).map_err(|e| e.to_string())?;
        if client
            .try_publish(
                topics.status(&entry.status.device_id, entry.status.job_id),
                QoS::AtLeastOnce,
                // Retained: a control plane that (re)subscribes gets each
                // job's latest status, whatever its session lost.
                true,
                payload,
            )
            .is_err()
        {
            return Ok(false);
        }
        pending.sent.insert(entry.id);
        pending.asked.push_back(Some(entry.id));
    }
    Ok(true)
}

/// A heartbeat, QoS 0: skipped when the queue is full (the next one follows).
fn publish_heartbeat(
    client: &AsyncClient,
    topics: &Topics,
    agent: &Agent,
    pending: &mut Pending,
) -> Result<(), String> {
    let heartbeat = agent.heartbeat().map_err(|e| e.to_string())?;
    let payload = serde_json::to_vec(&heartbeat).map_err(|e| e.to_string())?;
    if client
        .try_publish(
            topics.heartbeat(agent.device_id()),
            QoS::AtMostOnce,
            false,
            payload,
        )
        .is_ok()
    {
        pending.asked.push_back(None);
    } else {
        debug!("heartbeat skipped: the request queue is full");
    }
    Ok(())
}
