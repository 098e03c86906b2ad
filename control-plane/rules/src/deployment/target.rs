//! What a target's current job is doing, as the deployment's rules read it.

use super::Observed;
use crate::records::{Delivery, JobDelivery};
use drover_model::JobState;
use jiff::Timestamp;

/// What a job's record says its attempt is doing.
pub fn observe(job: &JobDelivery, now: Timestamp) -> Observed {
    // The control plane's receive time decides (A12); `now` stands in for a
    // record from before it was kept.
    let received = job.terminal_received_at.unwrap_or(now);
    let Some(status) = &job.status else {
        return match job.delivery {
            Delivery::Expired { at } => Observed::Failed {
                at,
                error: "the intent expired before the device took it".into(),
            },
            _ => Observed::Queued,
        };
    };
    match status.state {
        JobState::Succeeded if status.completion_heartbeat_at.is_some() => {
            Observed::Succeeded { at: received }
        }
        JobState::Succeeded | JobState::Running | JobState::AwaitingReboot => Observed::Running,
        JobState::Accepted | JobState::Waiting => Observed::Queued,
        JobState::Canceled => Observed::Canceled { at: received },
        JobState::Failed | JobState::Expired | JobState::Rejected => Observed::Failed {
            at: received,
            error: status
                .error
                .clone()
                .unwrap_or_else(|| format!("{:?}", status.state)),
        },
    }
}
