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
    let acked = match job.delivery {
        Delivery::Acked { at } => Some(at),
        _ => None,
    };
    let Some(status) = &job.status else {
        return match job.delivery {
            Delivery::Expired { at } => Observed::Failed {
                at,
                error: "the intent expired before the device took it".into(),
            },
            _ => Observed::Queued { acked },
        };
    };
    match status.state {
        JobState::Succeeded if status.completion_heartbeat_at.is_some() => {
            Observed::Succeeded { at: received }
        }
        JobState::Succeeded | JobState::Running | JobState::AwaitingReboot => Observed::Running,
        // A status acknowledges the job (its record says when, or it is
        // from before acknowledgements were kept: now).
        JobState::Accepted | JobState::Waiting => Observed::Queued {
            acked: Some(acked.unwrap_or(now)),
        },
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

/// A deployment target's state, defined once: the API's `state` (and its
/// `?state=` filter), the CLI's and the dashboard's rows, and the decide
/// step's counts all read it from here. A target waiting for a retry's
/// backoff is also counted among the pending (the `waitingRetry` count is
/// a part of `pending`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetState {
    /// Not released yet: waiting for a slot, the window, or its device.
    Pending,
    /// A failed attempt waits for its backoff before the next.
    WaitingRetry,
    /// Released, not started.
    Queued,
    Running,
    Succeeded,
    Failed,
    Expired,
    Canceled,
}

impl TargetState {
    pub const ALL: [TargetState; 8] = [
        TargetState::Pending,
        TargetState::WaitingRetry,
        TargetState::Queued,
        TargetState::Running,
        TargetState::Succeeded,
        TargetState::Failed,
        TargetState::Expired,
        TargetState::Canceled,
    ];

    /// The state of `record`, whose current job (if one is out) is doing
    /// `job`.
    pub fn of(record: &super::TargetRecord, job: Option<&Observed>, now: Timestamp) -> Self {
        use super::TargetEnd;
        match (&record.end, record.job) {
            (Some(TargetEnd::Succeeded { .. }), _) => TargetState::Succeeded,
            (Some(TargetEnd::Failed { .. }), _) => TargetState::Failed,
            (Some(TargetEnd::Expired { .. }), _) => TargetState::Expired,
            (Some(TargetEnd::Canceled { .. }), _) => TargetState::Canceled,
            (None, None) if record.next_attempt_at.is_some_and(|at| at > now) => {
                TargetState::WaitingRetry
            }
            (None, None) => TargetState::Pending,
            (None, Some(_)) => match job {
                Some(Observed::Running) => TargetState::Running,
                _ => TargetState::Queued,
            },
        }
    }

    /// The machine name, as the API serves it.
    pub fn name(self) -> &'static str {
        match self {
            TargetState::Pending => "pending",
            TargetState::WaitingRetry => "waitingRetry",
            TargetState::Queued => "queued",
            TargetState::Running => "running",
            TargetState::Succeeded => "succeeded",
            TargetState::Failed => "failed",
            TargetState::Expired => "expired",
            TargetState::Canceled => "canceled",
        }
    }

    /// The same state in words.
    pub fn label(self) -> &'static str {
        match self {
            TargetState::Pending => "Not released yet",
            TargetState::WaitingRetry => "Waiting to retry after a failed attempt",
            TargetState::Queued => "Released, not started",
            TargetState::Running => "Running",
            TargetState::Succeeded => "Succeeded",
            TargetState::Failed => "Failed",
            TargetState::Expired => "Expired",
            TargetState::Canceled => "Canceled",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deployment::{TargetEnd, TargetRecord};
    use drover_model::{DeviceId, JobId};

    #[test]
    fn a_target_has_one_state_with_one_name_and_label() {
        let now: Timestamp = "2027-01-04T10:00:00Z".parse().expect("time");
        let later = now + jiff::SignedDuration::from_mins(5);
        let fresh = TargetRecord::new(DeviceId::new("t-1").expect("id"), None);
        let state = |record: &TargetRecord, job: Option<Observed>| {
            TargetState::of(record, job.as_ref(), now)
        };
        assert_eq!(state(&fresh, None), TargetState::Pending);
        let waiting = TargetRecord {
            next_attempt_at: Some(later),
            ..fresh.clone()
        };
        assert_eq!(state(&waiting, None), TargetState::WaitingRetry);
        let due = TargetRecord {
            next_attempt_at: Some(now),
            ..fresh.clone()
        };
        assert_eq!(
            state(&due, None),
            TargetState::Pending,
            "its backoff is over"
        );
        let out = TargetRecord {
            job: Some(JobId::random()),
            ..fresh.clone()
        };
        assert_eq!(state(&out, None), TargetState::Queued);
        assert_eq!(
            state(&out, Some(Observed::Queued { acked: None })),
            TargetState::Queued
        );
        assert_eq!(state(&out, Some(Observed::Running)), TargetState::Running);
        let ended = |end| TargetRecord {
            end: Some(end),
            ..out.clone()
        };
        assert_eq!(
            state(
                &ended(TargetEnd::Failed { at: now }),
                Some(Observed::Running)
            ),
            TargetState::Failed,
            "the record's end decides"
        );
        assert_eq!(
            state(&ended(TargetEnd::Canceled { at: now }), None),
            TargetState::Canceled
        );
        let mut names = std::collections::HashSet::new();
        for s in TargetState::ALL {
            assert!(names.insert(s.name()), "{} twice", s.name());
            assert_eq!(TargetState::from_name(s.name()), Some(s));
            assert!(!s.label().is_empty());
        }
        assert_eq!(TargetState::from_name("Pending"), None);
    }
}
