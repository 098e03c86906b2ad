//! Simulated agents over NATS JetStream: one client per device, logged in
//! as a hand-registered device (its id and the broker password its token
//! derives) or as an accepted one (its user JWT, signing the server's nonce
//! with its key), on the subjects its login permits: the republished intent subject, a hello after every connect,
//! status requests (a control plane's answer confirms each) and heartbeats.

use crate::SimAgent;
use agent_core::backoff::{Backoff, DEFAULT_BACKOFF_MAX as BACKOFF_MAX};
use drover_model::model::Hello;
use drover_model::wire::parse_intent_bytes;
use futures_util::StreamExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use transport_nats::agent::{
    CONNECT_TIMEOUT, RECONNECT_INITIAL, Sent, reconnect_delays, send_status,
};
use transport_nats::spread::Reconnects;
use transport_nats::{
    HelloReply, INTENT_REPUBLISH_PREFIX, heartbeat_subject, hello_subject, inbox_prefix,
};

/// How a simulated device logs in to NATS.
#[derive(Clone)]
pub enum NatsLogin {
    /// A hand-registered device: its id, and the password its token derives.
    Token(String),
    /// An accepted device: its user JWT and its key.
    Key(transport_nats::KeyLogin),
}

impl NatsLogin {
    fn options(&self, device: &drover_model::DeviceId) -> async_nats::ConnectOptions {
        match self {
            Self::Token(token) => async_nats::ConnectOptions::with_user_and_password(
                device.to_string(),
                drover_model::credentials::broker_password(token, device),
            ),
            Self::Key(login) => crate::keys::jwt_options(&login.jwt, login.signer.clone()),
        }
    }
}

/// Plays one agent until `shutdown`; async-nats reconnects by itself, and
/// a session that failed is started again, both after the real agent's
/// backoff (a fleet connecting at once is met as the real one would be).
pub async fn play(url: String, login: NatsLogin, mut agent: SimAgent, shutdown: CancellationToken) {
    let mut backoff = Backoff::new(RECONNECT_INITIAL, BACKOFF_MAX);
    let spread = agent.behaviour.first_attempt_spread.as_millis() as u64;
    if spread > 0 {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(fastrand::u64(0..spread))) => {}
            _ = shutdown.cancelled() => return,
        }
    }
    loop {
        let started = tokio::time::Instant::now();
        match session(&url, &login, &mut agent, &shutdown).await {
            Ok(()) => return,
            Err(e) => {
                agent.stats.errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(device = %agent.device, error = %e, "simulated NATS agent failed");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff.failed(started.elapsed())) => {}
            _ = shutdown.cancelled() => return,
        }
        agent.stats.reconnects.fetch_add(1, Ordering::Relaxed);
    }
}

async fn session(
    url: &str,
    login: &NatsLogin,
    agent: &mut SimAgent,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let reconnects = Arc::new(Reconnects::default());
    let client = login
        .options(&agent.device)
        .custom_inbox_prefix(inbox_prefix(&agent.device))
        .connection_timeout(CONNECT_TIMEOUT)
        .reconnect_delay_callback(reconnect_delays(BACKOFF_MAX, reconnects.clone()))
        .connect(url)
        .await?;
    reconnects.set_connected();
    let js = async_nats::jetstream::new(client.clone());
    let mut intents = client
        .subscribe(format!("{INTENT_REPUBLISH_PREFIX}.{}.>", agent.device))
        .await?;
    agent.stats.connected.fetch_add(1, Ordering::Relaxed);
    let result = async {
        let mut greeted = hello(&client, agent, &reconnects).await;
        let mut heartbeat = tokio::time::interval_at(
            tokio::time::Instant::now() + agent.behaviour.heartbeat,
            agent.behaviour.heartbeat,
        );
        let mut retry = tokio::time::interval(Duration::from_secs(5));
        loop {
            flush(&client, &js, agent).await;
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = retry.tick() => {
                    if !greeted {
                        greeted = hello(&client, agent, &reconnects).await;
                    }
                }
                _ = heartbeat.tick() => publish_heartbeat(&client, agent).await,
                message = intents.next() => {
                    let Some(message) = message else { anyhow::bail!("subscription closed") };
                    let deleted = message
                        .headers
                        .as_ref()
                        .and_then(|h| h.get("KV-Operation"))
                        .is_some();
                    if deleted {
                        continue;
                    }
                    if let Ok(intent) = parse_intent_bytes(&message.payload)
                        && agent.take(&intent).is_some()
                    {
                        flush(&client, &js, agent).await;
                        publish_heartbeat(&client, agent).await;
                    }
                }
            }
        }
    }
    .await;
    agent.stats.connected.fetch_sub(1, Ordering::Relaxed);
    result
}

async fn hello(client: &async_nats::Client, agent: &SimAgent, reconnects: &Reconnects) -> bool {
    let hello = Hello {
        device_id: agent.device.clone(),
        agent_version: "sim".into(),
        boot_id: agent.boot_id.clone(),
        capabilities: SimAgent::capabilities(),
        jobs: agent.held(),
    };
    let Ok(payload) = serde_json::to_vec(&hello) else {
        return false;
    };
    let request = client.request(hello_subject(&agent.device), payload.into());
    match tokio::time::timeout(Duration::from_secs(10), request).await {
        Ok(Ok(reply)) => serde_json::from_slice::<HelloReply>(&reply.payload).is_ok_and(|reply| {
            reconnects.set_window(reply.reconnect_spread_ms);
            reply.error.is_none()
        }),
        _ => false,
    }
}

/// Sends every unconfirmed status, as the agent does.
async fn flush(
    client: &async_nats::Client,
    js: &async_nats::jetstream::Context,
    agent: &mut SimAgent,
) {
    let pending: Vec<_> = agent.pending().to_vec();
    for (id, status) in pending {
        match send_status(client, js, &status).await {
            Sent::Stored | Sent::Refused(_) => agent.confirm(id),
            Sent::Later(_) => return,
        }
    }
}

async fn publish_heartbeat(client: &async_nats::Client, agent: &mut SimAgent) {
    let subject = heartbeat_subject(&agent.device);
    if let Ok(payload) = serde_json::to_vec(&agent.heartbeat()) {
        let _ = client.publish(subject, payload.into()).await;
    }
}
