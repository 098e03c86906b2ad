//! What the control plane reads off the broker, as the delivery core
//! takes it: a status with the receiver of its answer, a heartbeat, or an
//! agent's last will; a chunk of a device's log answer, to the request it
//! answers.

use crate::Offline;
use drover_contract::link::{Answer, Inbound, Reply};
use drover_model::model::{Heartbeat, JobStatus};
use drover_model::{DeviceId, JobId};
use jiff::Timestamp;
use rumqttc::Publish;
use tracing::warn;

/// A status as the delivery core takes it, with the receiver of its answer
/// and whether it is terminal; None (logged) when it is unreadable or
/// names another job than its topic.
pub(crate) fn status_event(
    device: DeviceId,
    job: JobId,
    publish: &Publish,
) -> Option<(Inbound, (tokio::sync::oneshot::Receiver<Answer>, bool))> {
    match serde_json::from_slice::<JobStatus>(&publish.payload) {
        Ok(status) if status.job_id == job => {
            let terminal = status.state.is_terminal();
            let (reply, answer) = Reply::channel();
            Some((
                Inbound::Status {
                    device,
                    status: Box::new(status),
                    received_at: Timestamp::now(),
                    position: None,
                    reply,
                },
                (answer, terminal),
            ))
        }
        Ok(_) => {
            warn!(topic = %publish.topic, "status names another job than its topic; dropped");
            None
        }
        Err(e) => {
            warn!(topic = %publish.topic, error = %e, "unreadable status dropped");
            None
        }
    }
}

/// A heartbeat, or an agent's last will saying it went offline, as the
/// delivery core takes it; None when it is neither or names another device.
pub(crate) fn heartbeat_event(device: DeviceId, payload: &[u8]) -> Option<Inbound> {
    if let Ok(offline) = serde_json::from_slice::<Offline>(payload)
        && offline.offline
        && offline.device_id == device
    {
        return Some(Inbound::Gone { device });
    }
    match serde_json::from_slice::<Heartbeat>(payload) {
        Ok(heartbeat) if heartbeat.device_id == device => Some(Inbound::Heartbeat {
            device,
            heartbeat: Box::new(heartbeat),
            reply: Reply::none(),
        }),
        _ => None,
    }
}

/// A chunk of `device`'s answer to a log request, to the request it
/// answers (if this replica sent it); one that does not parse is dropped.
pub(crate) fn log_chunk(
    waiters: &drover_contract::logs::Waiters,
    device: &DeviceId,
    payload: &[u8],
) {
    match serde_json::from_slice::<drover_model::logs::LogChunk>(payload) {
        Ok(chunk) => {
            waiters.deliver(device, chunk);
        }
        Err(e) => tracing::debug!(%device, error = %e, "an unreadable log chunk dropped"),
    }
}
