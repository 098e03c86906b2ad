//! A job's output over NATS (`drover logs`, `drover_model::logs`): the
//! control plane publishes a request on the device's own inbox subject
//! (`_INBOX_<device>.logs`, which only the device may read), and the
//! device publishes its answer's chunks on `drover.logs.<device>`, the one
//! subject it may publish them on. It never answers to a reply subject a
//! request names: only the control plane reads its answers. Core NATS, at
//! most once: a lost chunk shows as a gap, and the answer breaks off saying
//! so.

use crate::inbox_prefix;
use agent_core::executor::Agent;
use drover_model::DeviceId;
use drover_model::logs::LogRequest;
use std::sync::Arc;
use tracing::{debug, warn};

/// Answers: `<prefix>.<device>`.
pub const LOGS_PREFIX: &str = "drover.logs";

/// Where `device` publishes its answers.
pub fn answer_subject(device: &DeviceId) -> String {
    format!("{LOGS_PREFIX}.{device}")
}

/// Where `device` reads log requests: under its own inbox.
pub fn request_subject(device: &DeviceId) -> String {
    format!("{}.logs", inbox_prefix(device))
}

/// The agent's side: answers the request in `payload` in the background.
/// A request that does not parse is dropped (there is no request id to
/// answer); bounds are [`agent_core::job_logs`]'s.
pub(crate) fn answer(client: &async_nats::Client, agent: &Arc<Agent>, payload: &[u8]) {
    let request: LogRequest = match serde_json::from_slice(payload) {
        Ok(request) => request,
        Err(e) => {
            warn!(error = %e, "an unreadable log request dropped");
            return;
        }
    };
    let (client, agent) = (client.clone(), agent.clone());
    let subject = answer_subject(agent.device_id());
    tokio::spawn(async move {
        agent_core::job_logs::relay(
            move |send| agent.logs().answer(&request, send),
            |chunk| {
                let (client, subject) = (client.clone(), subject.clone());
                async move {
                    let Ok(payload) = serde_json::to_vec(&chunk) else {
                        return false;
                    };
                    match client.publish(subject, payload.into()).await {
                        Ok(()) => true,
                        Err(e) => {
                            debug!(error = %e, "cannot publish a log chunk");
                            false
                        }
                    }
                }
            },
        )
        .await;
    });
}

#[cfg(feature = "server")]
pub(crate) mod server {
    use super::*;
    use crate::subjects::Messages;
    use drover_contract::logs::Waiters;
    use drover_model::logs::LogChunk;
    use tokio_util::sync::CancellationToken;

    /// Hands every answer chunk to the request it answers, until shutdown.
    /// Every replica reads them all (no queue group): a chunk goes to the
    /// replica whose request it names, and the others drop it.
    pub(crate) async fn answers(
        client: async_nats::Client,
        waiters: Arc<Waiters>,
        shutdown: CancellationToken,
    ) {
        let subscription = client.subscribe(format!("{LOGS_PREFIX}.*")).await;
        let Some(mut messages) = Messages::new(subscription, "log answers", &shutdown) else {
            return;
        };
        while let Some((device, message)) = messages.next().await {
            match serde_json::from_slice::<LogChunk>(&message.payload) {
                Ok(chunk) => {
                    waiters.deliver(&device, chunk);
                }
                Err(e) => debug!(device = %device, error = %e, "an unreadable log chunk dropped"),
            }
        }
    }
}
