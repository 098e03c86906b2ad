//! The agent's end over NATS: subscribe to its republished intent subject,
//! say hello (with the jobs it holds) after every (re)connect until a control
//! plane answers, send its statuses as requests that a control plane answers
//! once each is in the status bucket (the answer confirms it, A4) or, when
//! none answers, have the broker hold them (JetStream's acknowledgement
//! confirms it), and publish heartbeats. Reconnects are async-nats's own,
//! timed by the agent's one reconnect rule ([`reconnect_delay`]); the first
//! connection is retried by the link's supervisor with the same rule.

use crate::spread::Reconnects;
use crate::{
    HEARTBEAT_PREFIX, HelloReply, INTENT_REPUBLISH_PREFIX, MAX_VALUE_BYTES, NatsError,
    NatsSettings, STATUS_BUCKET, StatusReply, connect_options, heartbeat_subject, held_subject,
    hello_subject, inbox_prefix, key, key_subject, status_subject,
};
use agent_core::backoff::{Backoff, SessionEnd, Supervisor};
use agent_core::clock;
use agent_core::executor::{AdmitError, Agent};
use async_nats::jetstream;
use drover_model::credentials::BrokerPasswords;
use drover_model::model::{Hello, JobStatus};
use drover_model::wire::intent_json;
use futures_util::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// How long a hello waits for its answer, and how often an unanswered hello
/// is sent again (no control plane runs, or none answered in time).
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
const HELLO_RETRY: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct AgentSettings {
    /// The user is the device id; the password comes from `passwords`.
    pub nats: NatsSettings,
    pub passwords: BrokerPasswords,
    /// A device with its own key: how it asks to join, and where its user
    /// JWT is kept (then `passwords` is not used).
    pub joining: Option<crate::enrolling::Joining>,
    pub heartbeat_interval: Duration,
    pub backoff_max: Duration,
}

/// How long async-nats waits before its attempt number `attempts` (from 1
/// after each loss; it counts again from 0 once connected) to reconnect a
/// lost connection: the agent's one reconnect rule (agent_core::backoff,
/// from 1 s doubling to `backoff_max`, jittered in the upper half). Its own
/// default tries at once, then after 2, 4, 8 ms … up to 4 s, in step across
/// the fleet: a broker restarted under 50,000 agents is met by all of them
/// within milliseconds, again and again, each abandoned attempt costing the
/// server a TLS handshake and a password check, and a busy server never
/// catches up (a three-node cluster on two cores did not, issue 34).
pub fn reconnect_delay(attempts: usize, backoff_max: Duration) -> Duration {
    let failures = u32::try_from(attempts).unwrap_or(u32::MAX).max(1);
    agent_core::backoff::delay(
        failures,
        RECONNECT_INITIAL,
        backoff_max.max(RECONNECT_INITIAL),
    )
}

/// async-nats's delay callback for one session: no delay before the
/// session's first connection (the link's supervisor already waited its
/// backoff), then [`reconnect_delay`] once it has connected; the first
/// attempt after each loss waits, besides, a random part of the window the
/// control plane named (decision 0020), so that a fleet whose server
/// restarted comes back spread over it instead of all at once.
pub fn reconnect_delays(
    backoff_max: Duration,
    state: Arc<Reconnects>,
) -> impl Fn(usize) -> Duration + Send + Sync + 'static {
    move |attempts| {
        if !state.connected() {
            Duration::ZERO
        } else if attempts <= 1 {
            reconnect_delay(attempts, backoff_max) + agent_core::backoff::within(state.window())
        } else {
            reconnect_delay(attempts, backoff_max)
        }
    }
}

/// How long the agent gives one connection attempt.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The first delay of [`reconnect_delay`] and of the first connection's retries.
pub const RECONNECT_INITIAL: Duration = Duration::from_secs(1);

/// What the agent logs, and `check --connect` prints, when a broker took
/// the token instead of the derived password.
pub const USING_TOKEN: &str = "the NATS server knows this device by its token, not by the \
    password derived from it: print its authorization again with this version's `drover \
    nats-config`, so that the server's files hold no token";

/// A failed connection, in the operator's terms.
fn connect_error(url: &str, e: &async_nats::ConnectError) -> NatsError {
    use async_nats::ConnectErrorKind;
    match e.kind() {
        ConnectErrorKind::AuthorizationViolation => NatsError::Refused {
            url: url.to_owned(),
            reason: "the NATS server refused this device's password and its token \
                (authorization violation): put what `drover token DEVICE` prints on the \
                control plane's host in the agent's token_file, and authorize the device in \
                nats-server (`drover nats-config`)"
                .to_owned(),
        },
        _ => NatsError::Connect {
            url: url.to_owned(),
            reason: e.to_string(),
        },
    }
}

/// `settings.nats` with the password to try now.
fn with_password(settings: &AgentSettings, passwords: &BrokerPasswords) -> NatsSettings {
    NatsSettings {
        password: Some(passwords.current().to_owned()),
        ..settings.nats.clone()
    }
}

/// Connects with this device's credentials and closes: `drover-agent check
/// --connect`. Returns whether the server took the token rather than the
/// derived password.
pub async fn probe(settings: &AgentSettings) -> Result<bool, NatsError> {
    let mut passwords = settings.passwords.clone();
    loop {
        let nats = with_password(settings, &passwords);
        let client = match connect_options(&nats).connect(nats.addresses()?).await {
            Ok(client) => client,
            Err(e) => match connect_error(&nats.url, &e) {
                NatsError::Refused { .. } if !passwords.using_token() => {
                    passwords.refused();
                    continue;
                }
                other => return Err(other),
            },
        };
        client.flush().await.map_err(|e| NatsError::Connect {
            url: nats.url.clone(),
            reason: e.to_string(),
        })?;
        return Ok(passwords.using_token());
    }
}

/// Runs the agent's NATS link until `shutdown`.
pub async fn run(settings: AgentSettings, agent: Arc<Agent>, shutdown: CancellationToken) {
    let backoff = Backoff::new(RECONNECT_INITIAL, settings.backoff_max);
    let mut passwords = settings.passwords.clone();
    let mut supervisor = Supervisor::new(&agent, drover_model::transport::Transport::Nats, backoff);
    loop {
        supervisor.start();
        let end = if let Some(joining) = &settings.joining {
            joined_session(&settings, joining, &agent, &shutdown).await
        } else {
            let nats = with_password(&settings, &passwords);
            match serve(&settings, &nats, passwords.using_token(), &agent, &shutdown).await {
                Ok(()) => SessionEnd::Shutdown,
                Err(e @ NatsError::Refused { .. }) if passwords.refused() => {
                    debug!(error = %e, "the NATS server refused the derived password; trying the token");
                    SessionEnd::RetryNow
                }
                Err(e) => {
                    warn!(error = %e, "NATS link failed");
                    SessionEnd::Failed(e.to_string())
                }
            }
        };
        if !supervisor.ended(&agent, end, &shutdown).await {
            return;
        }
    }
}

/// One session of a device with its own key: by its kept JWT, or after
/// asking to join; a JWT the servers refuse is forgotten, and the device
/// asks again after its backoff.
async fn joined_session(
    settings: &AgentSettings,
    joining: &crate::enrolling::Joining,
    agent: &Arc<Agent>,
    shutdown: &CancellationToken,
) -> SessionEnd {
    use crate::enrolling::Asked;
    let jwt = match joining.kept() {
        Some(jwt) => jwt,
        None => {
            let inventory = agent_core::inventory::inventory(agent);
            let asked = tokio::select! {
                asked = joining.ask(&settings.nats, agent.device_id(), inventory) => asked,
                _ = shutdown.cancelled() => return SessionEnd::Shutdown,
            };
            match asked {
                Ok(Asked::Accepted(jwt)) => {
                    info!("accepted over NATS: this device's JWT is kept");
                    jwt
                }
                Ok(Asked::NotYet(message)) => {
                    info!(%message, "asked to join over NATS; not let in yet");
                    return SessionEnd::Failed(format!("not let in yet: {message}"));
                }
                Err(e) => {
                    warn!(error = %e, "cannot ask to join over NATS");
                    return SessionEnd::Failed(e.to_string());
                }
            }
        }
    };
    let nats = NatsSettings {
        user: None,
        password: None,
        key_login: Some(joining.login(jwt)),
        ..settings.nats.clone()
    };
    match serve(settings, &nats, false, agent, shutdown).await {
        Ok(()) => SessionEnd::Shutdown,
        Err(NatsError::Refused { url, .. }) => {
            warn!(%url, "the NATS servers refused this device's JWT; it asks to join again");
            joining.forget();
            SessionEnd::Failed(format!(
                "the NATS servers at {url} refused this device's JWT (revoked, or another \
                 account): asking to join again"
            ))
        }
        Err(e) => {
            warn!(error = %e, "NATS link failed");
            SessionEnd::Failed(e.to_string())
        }
    }
}

async fn serve(
    settings: &AgentSettings,
    nats: &NatsSettings,
    using_token: bool,
    agent: &Arc<Agent>,
    shutdown: &CancellationToken,
) -> Result<(), NatsError> {
    let device = agent.device_id().clone();
    let (events_tx, mut events) = mpsc::channel::<async_nats::Event>(16);
    let reconnects = Arc::new(Reconnects::default());
    let options = connect_options(nats)
        .custom_inbox_prefix(inbox_prefix(&device))
        .name(format!("drover-agent {device}"))
        .reconnect_delay_callback(reconnect_delays(settings.backoff_max, reconnects.clone()))
        .event_callback(move |event| {
            let tx = events_tx.clone();
            async move {
                let _ = tx.try_send(event);
            }
        });
    let client = tokio::select! {
        client = options.connect(nats.addresses()?) => client.map_err(|e| connect_error(&nats.url, &e))?,
        _ = shutdown.cancelled() => return Ok(()),
    };
    reconnects.set_connected();
    let js = jetstream::new(client.clone());
    // Subscribe before reading current values, so nothing falls in between.
    let mut intents = client
        .subscribe(format!("{INTENT_REPUBLISH_PREFIX}.{device}.>"))
        .await
        .map_err(|e| NatsError::JetStream(e.to_string()))?;
    let mut log_requests = client
        .subscribe(crate::logs::request_subject(&device))
        .await
        .map_err(|e| NatsError::JetStream(e.to_string()))?;
    info!(url = %nats.url, "connected to NATS");
    if using_token {
        warn!("{USING_TOKEN}");
    }
    mark_connected(agent);
    let mut greeted = hello(&client, agent, &reconnects).await;
    send_heartbeat(&client, agent).await;
    flush_outbox(&client, &js, agent).await;
    let mut heartbeat = tokio::time::interval(settings.heartbeat_interval);
    let mut outbox_retry = tokio::time::interval(Duration::from_secs(5));
    let mut hello_retry = tokio::time::interval(HELLO_RETRY);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => {
                let _ = client.flush().await;
                return Ok(());
            }
            event = events.recv() => match event {
                Some(async_nats::Event::Connected) => {
                    info!("reconnected to NATS; saying hello again");
                    mark_connected(agent);
                    greeted = hello(&client, agent, &reconnects).await;
                    flush_outbox(&client, &js, agent).await;
                }
                Some(async_nats::Event::Disconnected) => agent.update_link(|l| l.connected = false),
                // The server's authorization changed under a reconnecting
                // client, which would try the same password for ever: start
                // again, with the other one.
                Some(event) if refused_on_reconnect(&event) => {
                    return Err(NatsError::Refused {
                        url: nats.url.clone(),
                        reason: "the NATS server refused this device's password on reconnect".into(),
                    });
                }
                Some(other) => debug!(event = %other, "NATS event"),
                None => {}
            },
            message = intents.next() => {
                let Some(message) = message else {
                    return Err(NatsError::JetStream("intent subscription closed".into()));
                };
                agent.update_link(|l| l.last_contact = Some(clock::now()));
                let deleted = message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("KV-Operation"))
                    .is_some_and(|op| op.as_str() == "DEL" || op.as_str() == "PURGE");
                if !deleted {
                    admit(agent, &message.payload);
                    flush_outbox(&client, &js, agent).await;
                }
            }
            Some(request) = log_requests.next() => {
                crate::logs::answer(&client, agent, &request.payload);
            }
            _ = heartbeat.tick() => send_heartbeat(&client, agent).await,
            _ = hello_retry.tick(), if !greeted => greeted = hello(&client, agent, &reconnects).await,
            _ = agent.heartbeat_wanted().notified() => {
                flush_outbox(&client, &js, agent).await;
                send_heartbeat(&client, agent).await;
            }
            _ = agent.outbox_changed().notified() => flush_outbox(&client, &js, agent).await,
            _ = outbox_retry.tick() => flush_outbox(&client, &js, agent).await,
        }
    }
}

/// Whether the server refused the client's credentials: as a server error,
/// or as the client error async-nats reports a refused reconnect with.
fn refused_on_reconnect(event: &async_nats::Event) -> bool {
    match event {
        async_nats::Event::ServerError(async_nats::ServerError::AuthorizationViolation) => true,
        async_nats::Event::ClientError(async_nats::ClientError::Other(error)) => {
            error.contains("authorization violation")
        }
        _ => false,
    }
}

fn mark_connected(agent: &Agent) {
    agent.update_link(|l| {
        l.connected = true;
        l.last_contact = Some(clock::now());
        l.last_error = None;
    });
}

fn admit(agent: &Agent, payload: &[u8]) {
    match agent.admit_signed(intent_json(payload)) {
        Ok(reply) => {
            debug!(job_id = %reply.status.job_id, duplicate = reply.duplicate, "intent recorded")
        }
        // Nothing to answer on NATS: log and drop (A7, A11).
        Err(AdmitError::Unreadable(e)) => warn!(error = %e, "unusable intent dropped"),
        Err(AdmitError::Store(e)) => {
            warn!(error = %e, "cannot record an intent; it is read again on reconnect")
        }
    }
}

/// Says hello: the control plane records the agent, puts again every intent
/// the agent does not hold, and answers with its clock. Returns whether a
/// control plane answered; an unanswered hello is sent again later.
async fn hello(client: &async_nats::Client, agent: &Agent, reconnects: &Reconnects) -> bool {
    let jobs = match agent.held_jobs() {
        Ok(jobs) => jobs,
        Err(e) => {
            warn!(error = %e, "cannot list the jobs this agent holds");
            return false;
        }
    };
    let hello = Hello {
        device_id: agent.device_id().clone(),
        agent_version: agent.agent_version().to_owned(),
        boot_id: agent.boot_id().to_owned(),
        capabilities: agent.capabilities(),
        jobs,
    };
    let Ok(payload) = serde_json::to_vec(&hello) else {
        return false;
    };
    let request = client.request(hello_subject(agent.device_id()), payload.into());
    let reply = match tokio::time::timeout(HELLO_TIMEOUT, request).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(e)) => {
            debug!(error = %e, "no control plane answered the hello; trying again later");
            return false;
        }
        Err(_) => {
            debug!("the hello timed out; trying again later");
            return false;
        }
    };
    match serde_json::from_slice::<HelloReply>(&reply.payload) {
        Ok(HelloReply {
            server_time,
            error: None,
            reconnect_spread_ms,
        }) => {
            agent.observe_control_plane_time(server_time);
            let window = reconnects.set_window(reconnect_spread_ms);
            agent.update_link(|l| {
                l.reconnect_spread_ms = reconnect_spread_ms.map(|_| window.as_millis() as u64)
            });
            info!(
                held = hello.jobs.len(),
                reconnect_spread_ms = window.as_millis() as u64,
                "the control plane answered the hello"
            );
            true
        }
        Ok(HelloReply {
            error: Some(error), ..
        }) => {
            warn!(%error, "the control plane refused the hello; trying again later");
            false
        }
        Err(e) => {
            warn!(error = %e, "unreadable answer to the hello; trying again later");
            false
        }
    }
}

/// How long a status waits for its answer, or for JetStream's ack when it
/// is put directly.
const STATUS_TIMEOUT: Duration = Duration::from_secs(10);

/// What became of one status sent to the control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// Stored: drop it from the outbox.
    Stored,
    /// Never to be stored: drop it, and say why.
    Refused(String),
    /// Not stored now: send it again later.
    Later(String),
}

/// Sends one status as a request on the device's status subject, which a
/// control plane answers once the status is in the status bucket. When no
/// control plane takes the request (none runs, or none answers in time),
/// the status is published to the device's subject of the held-status
/// stream: JetStream's acknowledgement means the broker keeps it, stamped
/// with its own time, until a control plane takes it. Failing that (a
/// control plane or an authorization older than the held stream), it is
/// put into the status bucket directly, as agents did before, which
/// nats-server refuses unless its authorization still allows it (`drover
/// nats-config --allow-direct-status-puts`); then the status waits in the
/// outbox for the next try.
pub async fn send_status(
    client: &async_nats::Client,
    js: &jetstream::Context,
    status: &JobStatus,
) -> Sent {
    let payload = match serde_json::to_vec(status) {
        Ok(payload) => payload,
        Err(e) => return Sent::Refused(format!("cannot encode the status: {e}")),
    };
    if payload.len() > MAX_VALUE_BYTES as usize {
        return Sent::Refused(format!(
            "a status of {} bytes is larger than the {MAX_VALUE_BYTES} bytes allowed",
            payload.len()
        ));
    }
    let request = client.request(status_subject(&status.device_id), payload.clone().into());
    let unanswered = match tokio::time::timeout(STATUS_TIMEOUT, request).await {
        Ok(Ok(reply)) => {
            return match serde_json::from_slice::<StatusReply>(&reply.payload) {
                Ok(StatusReply::Stored) => Sent::Stored,
                Ok(StatusReply::Refused(reason)) => Sent::Refused(reason),
                Ok(StatusReply::Failed(reason)) => Sent::Later(reason),
                Err(e) => Sent::Later(format!("unreadable answer to a status: {e}")),
            };
        }
        Ok(Err(e))
            if matches!(
                e.kind(),
                async_nats::RequestErrorKind::TimedOut | async_nats::RequestErrorKind::NoResponders
            ) =>
        {
            e.to_string()
        }
        Ok(Err(e)) => return Sent::Later(format!("status not sent: {e}")),
        Err(_) => "no answer".to_owned(),
    };
    let held = match js
        .publish(held_subject(&status.device_id), payload.clone().into())
        .await
    {
        Ok(ack) => match tokio::time::timeout(STATUS_TIMEOUT, ack).await {
            Ok(Ok(_)) => {
                debug!(job_id = %status.job_id, "no control plane answered; the broker holds the status");
                return Sent::Stored;
            }
            Ok(Err(e)) => format!("the broker did not hold it: {e}"),
            Err(_) => "the broker did not acknowledge holding it".to_owned(),
        },
        Err(e) => format!("the broker did not hold it: {e}"),
    };
    let unanswered = format!("{unanswered}; {held}");
    let subject = key_subject(STATUS_BUCKET, &key(&status.device_id, status.job_id));
    let acked = match js.publish(subject, payload.into()).await {
        Ok(ack) => tokio::time::timeout(STATUS_TIMEOUT, ack).await,
        Err(e) => return Sent::Later(format!("{unanswered}; a direct put failed: {e}")),
    };
    match acked {
        Ok(Ok(_)) => Sent::Stored,
        Ok(Err(e)) => Sent::Later(format!("{unanswered}; a direct put failed: {e}")),
        Err(_) => Sent::Later(format!("{unanswered}; a direct put was not acknowledged")),
    }
}

/// Sends every unconfirmed status; a control plane's answer (or JetStream's
/// ack of a direct put) is the confirmation that drops it from the outbox.
async fn flush_outbox(client: &async_nats::Client, js: &jetstream::Context, agent: &Agent) {
    let entries = match agent.outbox(64) {
        Ok(entries) => entries,
        Err(e) => {
            warn!(error = %e, "cannot read the outbox");
            return;
        }
    };
    for entry in entries {
        match send_status(client, js, &entry.status).await {
            Sent::Stored => {}
            Sent::Refused(reason) => warn!(
                job_id = %entry.status.job_id,
                %reason,
                "the control plane refused a status; dropped"
            ),
            Sent::Later(reason) => {
                debug!(job_id = %entry.status.job_id, %reason, "status not stored; retrying later");
                return;
            }
        }
        if let Err(e) = agent.outbox_ack(entry.id) {
            warn!(error = %e, "cannot drop a sent status");
        }
    }
}

async fn send_heartbeat(client: &async_nats::Client, agent: &Agent) {
    let heartbeat = match agent.heartbeat() {
        Ok(heartbeat) => heartbeat,
        Err(e) => {
            warn!(error = %e, "cannot build a heartbeat");
            return;
        }
    };
    let subject = heartbeat_subject(agent.device_id());
    debug_assert!(subject.starts_with(HEARTBEAT_PREFIX));
    match serde_json::to_vec(&heartbeat) {
        Ok(payload) => {
            if let Err(e) = client.publish(subject, payload.into()).await {
                debug!(error = %e, "heartbeat not sent");
            }
        }
        Err(e) => warn!(error = %e, "cannot encode a heartbeat"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_connection_is_tried_again_after_the_agents_backoff_not_at_once() {
        let max = Duration::from_secs(60);
        // async-nats's default would be 0 ms, then 2, 4, 8 … and at most 4 s.
        let first = reconnect_delay(1, max);
        assert!(
            first >= RECONNECT_INITIAL / 2 && first <= RECONNECT_INITIAL,
            "{first:?}"
        );
        let late = reconnect_delay(12, max);
        assert!(late >= max / 2 && late <= max, "{late:?}");
        assert!(reconnect_delay(usize::MAX, max) <= max);
        // A cap under the first delay is the first delay.
        assert!(reconnect_delay(5, Duration::ZERO) <= RECONNECT_INITIAL);

        let state = Arc::new(Reconnects::default());
        let delays = reconnect_delays(max, state.clone());
        assert_eq!(
            delays(1),
            Duration::ZERO,
            "a session's first connection waits not"
        );
        state.set_connected();
        assert!(delays(1) >= RECONNECT_INITIAL / 2);
    }

    #[test]
    fn the_first_reconnect_after_a_loss_is_spread_over_the_named_window() {
        let max = Duration::from_secs(60);
        let state = Arc::new(Reconnects::default());
        state.set_connected();
        let delays = reconnect_delays(max, state.clone());
        // No window named (a small fleet, an older control plane): as before.
        assert!((0..200).all(|_| delays(1) <= RECONNECT_INITIAL));
        let window = Duration::from_secs(10);
        assert_eq!(state.set_window(Some(10_000)), window);
        let firsts: Vec<Duration> = (0..200).map(|_| delays(1)).collect();
        assert!(
            firsts
                .iter()
                .all(|d| *d >= RECONNECT_INITIAL / 2 && *d <= RECONNECT_INITIAL + window)
        );
        // Spread, not shifted: some early in the window, some late.
        assert!(
            firsts.iter().any(|d| *d < Duration::from_secs(4)),
            "{firsts:?}"
        );
        assert!(
            firsts.iter().any(|d| *d > Duration::from_secs(7)),
            "{firsts:?}"
        );
        // Later attempts follow the backoff alone.
        assert!((0..200).all(|_| delays(2) <= 2 * RECONNECT_INITIAL));
    }
}
