//! A job's state as an operator reads it, defined once: the CLI, the
//! dashboard and the metrics all show [`JobPhase::name`] for the same job,
//! and [`JobPhase::label`] where a sentence fits. The API computes it
//! ([`JobView`]) and serves it; nothing downstream derives it again.
//!
//! It is read from the stored job (its delivery, its latest status, whether
//! a cancel was asked) and, for a run's target, from whether the target was
//! released and when the run ended.

use crate::records::{Delivery, JobDelivery};
use drover_model::JobState;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// Where a job is, from the operator's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum JobPhase {
    /// A run's target held back until its canaries succeed: no job yet.
    NotReleased,
    /// Created, and not yet acknowledged by the device (it may be offline,
    /// or the intent is on its way).
    Undelivered,
    /// The device acknowledged it and has not started it.
    Accepted,
    /// The device holds it behind an earlier job.
    Waiting,
    Running,
    AwaitingReboot,
    /// A cancel was asked before the job started; the device has not
    /// confirmed it yet.
    Canceling,
    Succeeded,
    Failed,
    /// It expired before it started (A3), on the device or at the control
    /// plane.
    Expired,
    /// The device refused it (an unknown kind, another device's id, a bad
    /// signature).
    Rejected,
    Canceled,
}

impl JobPhase {
    pub const ALL: [JobPhase; 12] = [
        JobPhase::NotReleased,
        JobPhase::Undelivered,
        JobPhase::Accepted,
        JobPhase::Waiting,
        JobPhase::Running,
        JobPhase::AwaitingReboot,
        JobPhase::Canceling,
        JobPhase::Succeeded,
        JobPhase::Failed,
        JobPhase::Expired,
        JobPhase::Rejected,
        JobPhase::Canceled,
    ];

    /// The machine name: the API's `state`, the CLI's STATE column, the
    /// dashboard's badge and the metrics' `state` label.
    pub fn name(self) -> &'static str {
        match self {
            JobPhase::NotReleased => "notReleased",
            JobPhase::Undelivered => "undelivered",
            JobPhase::Accepted => "accepted",
            JobPhase::Waiting => "waiting",
            JobPhase::Running => "running",
            JobPhase::AwaitingReboot => "awaitingReboot",
            JobPhase::Canceling => "canceling",
            JobPhase::Succeeded => "succeeded",
            JobPhase::Failed => "failed",
            JobPhase::Expired => "expired",
            JobPhase::Rejected => "rejected",
            JobPhase::Canceled => "canceled",
        }
    }

    /// The same state in words, for a sentence or a tooltip.
    pub fn label(self) -> &'static str {
        match self {
            JobPhase::NotReleased => "Not released: waiting for the canaries",
            JobPhase::Undelivered => "Not yet acknowledged by the device",
            JobPhase::Accepted => "Accepted by the device, not started",
            JobPhase::Waiting => "Waiting for an earlier job on the device",
            JobPhase::Running => "Running",
            JobPhase::AwaitingReboot => "Waiting for the device to reboot",
            JobPhase::Canceling => "Cancel sent, not yet confirmed by the device",
            JobPhase::Succeeded => "Succeeded",
            JobPhase::Failed => "Failed",
            JobPhase::Expired => "Expired before it started",
            JobPhase::Rejected => "Refused by the device",
            JobPhase::Canceled => "Canceled",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Decided: nothing more will happen to the job.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobPhase::Succeeded
                | JobPhase::Failed
                | JobPhase::Expired
                | JobPhase::Rejected
                | JobPhase::Canceled
        )
    }

    /// The state of a job from its delivery, its latest status and whether
    /// a cancel was asked. A cancel shows only until the job starts: a
    /// started job is never interrupted, so it shows what it is doing.
    pub fn of(delivery: &Delivery, status: Option<JobState>, cancel_requested: bool) -> Self {
        let reported = match status {
            Some(JobState::Succeeded) => return JobPhase::Succeeded,
            Some(JobState::Failed) => return JobPhase::Failed,
            Some(JobState::Expired) => return JobPhase::Expired,
            Some(JobState::Rejected) => return JobPhase::Rejected,
            Some(JobState::Canceled) => return JobPhase::Canceled,
            Some(JobState::Running) => return JobPhase::Running,
            Some(JobState::AwaitingReboot) => return JobPhase::AwaitingReboot,
            Some(JobState::Accepted) => Some(JobPhase::Accepted),
            Some(JobState::Waiting) => Some(JobPhase::Waiting),
            None => None,
        };
        if matches!(delivery, Delivery::Expired { .. }) {
            return JobPhase::Expired;
        }
        if cancel_requested {
            return JobPhase::Canceling;
        }
        reported.unwrap_or(match delivery {
            Delivery::Acked { .. } => JobPhase::Accepted,
            Delivery::Created | Delivery::Sent { .. } | Delivery::Expired { .. } => {
                JobPhase::Undelivered
            }
        })
    }

    /// Why a task run's target in this state waits, given its device's
    /// presence: the canaries; the device offline while its job is not
    /// acknowledged (one online has it on its way); an earlier job there.
    pub fn wait(
        self,
        online: bool,
        last_seen: Option<jiff::Timestamp>,
    ) -> Option<crate::deployment::Wait> {
        use crate::deployment::Wait;
        match self {
            JobPhase::NotReleased => Some(Wait::Canaries),
            JobPhase::Undelivered | JobPhase::Accepted if !online => {
                Some(Wait::Offline { last_seen })
            }
            JobPhase::Waiting => Some(Wait::EarlierJob),
            _ => None,
        }
    }

    pub fn of_job(job: &JobDelivery) -> Self {
        Self::of(
            &job.delivery,
            job.status.as_ref().map(|s| s.state),
            job.cancel_requested_at.is_some(),
        )
    }
}

/// A job's state as the API serves it: the state, and whether it was
/// decided after the run it belongs to had ended (so a run's header,
/// counted when it ended, and its rows never contradict each other).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobView {
    pub phase: JobPhase,
    pub after_run_ended: bool,
}

impl JobView {
    /// A run's target: `job` is None while it is not released. `run_ended`
    /// is when the run ended, if it has.
    pub fn of_target(job: Option<&JobDelivery>, run_ended: Option<Timestamp>) -> Self {
        let Some(job) = job else {
            return JobView {
                phase: JobPhase::NotReleased,
                after_run_ended: false,
            };
        };
        let phase = JobPhase::of_job(job);
        let decided_at = job.terminal_received_at;
        JobView {
            phase,
            after_run_ended: phase.is_final()
                && matches!((decided_at, run_ended), (Some(at), Some(end)) if at > end),
        }
    }

    /// The label, with "after the run ended" where that is so.
    pub fn label(self) -> String {
        if self.after_run_ended {
            format!("{} after the run ended", self.phase.label())
        } else {
            self.phase.label().to_owned()
        }
    }

    /// The fields the API adds to an object that shows a job: `state`
    /// (the machine name), `stateLabel` and `afterRunEnded`.
    pub fn fields(self) -> serde_json::Value {
        serde_json::json!({
            "state": self.phase.name(),
            "stateLabel": self.label(),
            "afterRunEnded": self.after_run_ended,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_model::model::{Intent, JobStatus};

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    #[test]
    fn every_state_has_one_name_and_the_name_reads_back() {
        let mut names: Vec<&str> = JobPhase::ALL.iter().map(|p| p.name()).collect();
        for phase in JobPhase::ALL {
            assert_eq!(JobPhase::from_name(phase.name()), Some(phase));
            assert_eq!(
                serde_json::to_value(phase).unwrap(),
                serde_json::json!(phase.name()),
                "the serialized form is the name"
            );
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), JobPhase::ALL.len());
    }

    #[test]
    fn a_job_reads_as_its_status_then_its_cancel_then_its_delivery() {
        use JobPhase as P;
        let created = Delivery::Created;
        let sent = Delivery::Sent { at: t(1) };
        let acked = Delivery::Acked { at: t(2) };
        let expired = Delivery::Expired { at: t(3) };
        let cases = [
            (&created, None, false, P::Undelivered),
            (&sent, None, false, P::Undelivered),
            (&acked, None, false, P::Accepted),
            (&acked, Some(JobState::Accepted), false, P::Accepted),
            (&acked, Some(JobState::Waiting), false, P::Waiting),
            (&acked, Some(JobState::Running), false, P::Running),
            (
                &acked,
                Some(JobState::AwaitingReboot),
                false,
                P::AwaitingReboot,
            ),
            (&acked, Some(JobState::Succeeded), false, P::Succeeded),
            (&created, Some(JobState::Failed), false, P::Failed),
            (&expired, None, false, P::Expired),
            (&expired, None, true, P::Expired),
            (&acked, Some(JobState::Rejected), false, P::Rejected),
            // A cancel shows until the job starts, never over what it does.
            (&created, None, true, P::Canceling),
            (&acked, Some(JobState::Waiting), true, P::Canceling),
            (&acked, Some(JobState::Running), true, P::Running),
            (&acked, Some(JobState::Canceled), true, P::Canceled),
            (&acked, Some(JobState::Succeeded), true, P::Succeeded),
        ];
        for (delivery, status, cancel, want) in cases {
            assert_eq!(
                JobPhase::of(delivery, status, cancel),
                want,
                "{delivery:?} {status:?} cancel={cancel}"
            );
        }
    }

    fn job(state: Option<JobState>, decided_at: Option<Timestamp>) -> JobDelivery {
        let device = drover_model::DeviceId::new("d1").unwrap();
        let job_id = drover_model::JobId::random();
        let intent = Intent {
            job_id,
            device_id: device.clone(),
            kind: drover_model::JobKind::SystemUpgradeV1(Default::default()),
            attempt: 1,
            created_at: t(0),
            expires_at: t(3600),
            timeout_seconds: 60,
        };
        let status = state.map(|state| JobStatus {
            job_id,
            device_id: device,
            attempt: 1,
            kind: "systemUpgradeV1".into(),
            state,
            steps: Vec::new(),
            error: None,
            output: None,
            accepted_at: t(1),
            started_at: None,
            finished_at: None,
            boot_id: "b".into(),
            completion_heartbeat_at: None,
            seq: 1,
            failure: None,
            reason: Vec::new(),
        });
        JobDelivery {
            intent,
            run: Some("r".into()),
            delivery: Delivery::Acked { at: t(1) },
            status,
            created_at: t(0),
            terminal_received_at: decided_at,
            cancel_requested_at: None,
        }
    }

    #[test]
    fn a_run_target_says_why_it_waits_while_it_does() {
        use crate::deployment::Wait;
        let seen = Some(t(100));
        assert_eq!(JobPhase::NotReleased.wait(true, seen), Some(Wait::Canaries));
        assert_eq!(
            JobPhase::Undelivered.wait(false, seen),
            Some(Wait::Offline { last_seen: seen })
        );
        assert_eq!(JobPhase::Undelivered.wait(true, seen), None, "on its way");
        assert_eq!(JobPhase::Waiting.wait(true, seen), Some(Wait::EarlierJob));
        for phase in [JobPhase::Running, JobPhase::Succeeded, JobPhase::Failed] {
            assert_eq!(phase.wait(false, seen), None, "{phase:?}");
        }
        assert_eq!(
            JobPhase::Undelivered.wait(false, None).map(|w| w.text()),
            Some("device offline, never heard from".to_owned())
        );
    }

    #[test]
    fn a_target_decided_after_its_run_ended_says_so() {
        let not_released = JobView::of_target(None, Some(t(10)));
        assert_eq!(not_released.phase, JobPhase::NotReleased);
        assert!(!not_released.after_run_ended);

        let in_time = job(Some(JobState::Succeeded), Some(t(5)));
        let view = JobView::of_target(Some(&in_time), Some(t(10)));
        assert_eq!(view.phase, JobPhase::Succeeded);
        assert!(!view.after_run_ended);
        assert_eq!(view.label(), "Succeeded");

        let late = job(Some(JobState::Succeeded), Some(t(20)));
        let view = JobView::of_target(Some(&late), Some(t(10)));
        assert!(view.after_run_ended);
        assert_eq!(view.label(), "Succeeded after the run ended");
        assert_eq!(view.fields()["state"], "succeeded");

        let running = job(Some(JobState::Running), None);
        let view = JobView::of_target(Some(&running), Some(t(10)));
        assert_eq!(view.phase, JobPhase::Running);
        assert!(!view.after_run_ended, "only a decided job is late");
        let still_going = JobView::of_target(Some(&late), None);
        assert!(!still_going.after_run_ended);
    }
}
