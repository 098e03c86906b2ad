//! The status a deployment's pass writes: the decision's counts and the
//! new targets, the latest error, and the phase it ends in.

use super::{Decision, DeploymentRecord, DeploymentStatus};
use crate::records::Phase;
use drover_model::{MAX_ERROR_BYTES, bounded};
use jiff::Timestamp;

/// The reason of a deployment stopped by its failure threshold.
pub const THRESHOLD_REACHED: &str = "FailureThresholdReached";

/// What this pass does with an "add new devices" request.
pub struct Adds {
    /// New targets it adds.
    pub count: usize,
    /// Why it adds none although some match.
    pub error: Option<String>,
    /// A request was pending, and is handled now.
    pub handled: bool,
    /// With a request handled: the devices that match the targeting now
    /// but have no agent, so cannot be targets (the seed's excluded_count,
    /// counted again at each "add new devices").
    pub excluded: Option<u32>,
}

/// The deployment's status after this pass (without its lease): the counts
/// of the decision and the new targets, the latest error, and the phase it
/// ends in once every target has ended.
pub fn next_status(
    record: &DeploymentRecord,
    decision: &Decision,
    adds: Adds,
    now: Timestamp,
) -> DeploymentStatus {
    let mut status = record.status.clone();
    status.lease = None;
    status.counts = decision.counts;
    status.counts.pending += adds.count as u32;
    status.targets = status.counts.total();
    status.next_retry_at = decision.next_retry_at;
    if let Some(error) = decision.latest_error.clone().or(adds.error) {
        status.latest_error = Some(bounded(error, MAX_ERROR_BYTES));
    }
    if adds.handled {
        status.add_requests_handled = record.add_requests;
        if let Some(excluded) = adds.excluded {
            status.excluded = excluded;
        }
    }
    if let Some(releases) = &decision.recent_releases {
        status.recent_releases = releases.clone();
    }
    if decision.threshold_reached {
        let c = &status.counts;
        let threshold = record
            .spec
            .failure_threshold
            .map(|t| t.describe())
            .unwrap_or_default();
        status.phase = Phase::Canceling;
        status.reason = Some(THRESHOLD_REACHED.into());
        status.threshold_reached_at = Some(now);
        status.latest_error = Some(bounded(
            format!(
                "stopped: {} of {} ended targets failed, reaching the failure threshold ({threshold}); last: {}",
                c.failed,
                c.failed + c.succeeded,
                status.latest_error.as_deref().unwrap_or("-")
            ),
            MAX_ERROR_BYTES,
        ));
    }
    let stopped = status.threshold_reached_at.is_some();
    if decision.finished && (record.status.phase == Phase::Canceling || stopped) {
        let c = &status.counts;
        let why = match stopped {
            true => "stopped at its failure threshold",
            false => "canceled by an operator",
        };
        status.phase = Phase::Failed;
        status.reason = Some(
            if stopped {
                THRESHOLD_REACHED
            } else {
                "Canceled"
            }
            .into(),
        );
        status.completion_time = Some(now);
        status.latest_error = Some(format!(
            "{why}: {} of {} targets succeeded, {} failed, {} expired, {} canceled",
            c.succeeded,
            c.total(),
            c.failed,
            c.expired,
            c.canceled
        ));
    } else if decision.finished && adds.count == 0 {
        let c = &status.counts;
        status.phase = if c.failed == 0 && c.expired == 0 {
            Phase::Complete
        } else {
            Phase::Failed
        };
        status.reason = Some(
            if c.failed == 0 && c.expired == 0 {
                "AllTargetsSucceeded"
            } else if c.failed == 0 {
                "Expired"
            } else {
                "TargetsFailed"
            }
            .into(),
        );
        status.completion_time = Some(now);
    }
    status
}
