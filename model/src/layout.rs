//! Frozen layouts of the wire types as the stores wrote them. Both stores
//! (the agent's and the control plane's) keep their records as postcard,
//! which writes fields in order with no names: a field added to a wire type
//! would change the bytes of every stored record that holds it. A record
//! whose layout holds a wire type that changed therefore keeps the old
//! shape here, frozen, and migrates it on read; each store's fixture tests
//! decode bytes written by the old code and fail when a change forgets to.
//! Never change a struct in this module: add the next one.

use crate::ids::{DeviceId, JobId};
use crate::model::{JobOutput, JobState, JobStatus, StepRecord};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// Frozen: a job's status as stored before it carried its
/// [`JobStatus::failure`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobStatusV1 {
    pub job_id: JobId,
    pub device_id: DeviceId,
    pub attempt: u32,
    pub kind: String,
    pub state: JobState,
    pub steps: Vec<StepRecord>,
    pub error: Option<String>,
    pub output: Option<JobOutput>,
    pub accepted_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub boot_id: String,
    pub completion_heartbeat_at: Option<Timestamp>,
    pub seq: u64,
}

impl From<JobStatusV1> for JobStatus {
    /// A status kept before the field gets its failure from the signals
    /// the agent then sent (its error's text, the kind it named).
    fn from(v1: JobStatusV1) -> Self {
        let mut status = JobStatus {
            job_id: v1.job_id,
            device_id: v1.device_id,
            attempt: v1.attempt,
            kind: v1.kind,
            state: v1.state,
            steps: v1.steps,
            error: v1.error,
            output: v1.output,
            accepted_at: v1.accepted_at,
            started_at: v1.started_at,
            finished_at: v1.finished_at,
            boot_id: v1.boot_id,
            completion_heartbeat_at: v1.completion_heartbeat_at,
            seq: v1.seq,
            failure: None,
            reason: Vec::new(),
        };
        status.failure = status.failure();
        status
    }
}

/// Frozen: a job's status as stored before it carried its
/// [`JobStatus::reason`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobStatusV2 {
    pub job_id: JobId,
    pub device_id: DeviceId,
    pub attempt: u32,
    pub kind: String,
    pub state: JobState,
    pub steps: Vec<StepRecord>,
    pub error: Option<String>,
    pub output: Option<JobOutput>,
    pub accepted_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub boot_id: String,
    pub completion_heartbeat_at: Option<Timestamp>,
    pub seq: u64,
    pub failure: Option<crate::failure::Failure>,
}

impl From<JobStatusV2> for JobStatus {
    /// A status kept before the field has no reason lines.
    fn from(v2: JobStatusV2) -> Self {
        JobStatus {
            job_id: v2.job_id,
            device_id: v2.device_id,
            attempt: v2.attempt,
            kind: v2.kind,
            state: v2.state,
            steps: v2.steps,
            error: v2.error,
            output: v2.output,
            accepted_at: v2.accepted_at,
            started_at: v2.started_at,
            finished_at: v2.finished_at,
            boot_id: v2.boot_id,
            completion_heartbeat_at: v2.completion_heartbeat_at,
            seq: v2.seq,
            failure: v2.failure,
            reason: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::{Failure, RESUME_LOOP_TEXT, UNVERIFIED_KIND};

    fn v1(kind: &str, state: JobState, error: Option<&str>) -> JobStatusV1 {
        JobStatusV1 {
            job_id: "6f1c3b1e-3f7e-4a55-9a3c-2f1f0e9f8a01".parse().expect("id"),
            device_id: DeviceId::new("pi-1").expect("id"),
            attempt: 1,
            kind: kind.into(),
            state,
            steps: Vec::new(),
            error: error.map(str::to_owned),
            output: None,
            accepted_at: Timestamp::UNIX_EPOCH,
            started_at: None,
            finished_at: None,
            boot_id: "b".into(),
            completion_heartbeat_at: None,
            seq: 3,
        }
    }

    /// A status kept, or sent, before the field says its failure by the
    /// signals of its time; a plain failure or success says none (the
    /// negative controls).
    #[test]
    fn an_older_status_gets_its_failure_from_the_signals_it_carried() {
        let looping = format!("picked up again 4 times ({RESUME_LOOP_TEXT}); giving up");
        for (status, failure) in [
            (
                v1("systemUpgradeV1", JobState::Failed, Some(&looping)),
                Some(Failure::ResumeLoop),
            ),
            (
                v1(UNVERIFIED_KIND, JobState::Rejected, Some("bad signature")),
                Some(Failure::SignatureRefused),
            ),
            (
                v1("systemUpgradeV1", JobState::Failed, Some("step x failed")),
                None,
            ),
            (v1("systemUpgradeV1", JobState::Succeeded, None), None),
            (
                v1("systemUpgradeV1", JobState::Rejected, Some(&looping)),
                None,
            ),
        ] {
            let seen = format!("{status:?}");
            let status = JobStatus::from(status);
            assert_eq!(status.failure, failure, "{seen}");
            // The field wins over the signals once it is there.
            let mut typed = status.clone();
            typed.failure = Some(Failure::QueueFull);
            assert_eq!(typed.failure(), Some(Failure::QueueFull));
        }
    }

    /// The wire's JSON: an older agent's status (no field) reads as none,
    /// a newer agent's failure this build does not know reads as Other.
    #[test]
    fn the_failure_on_the_wire_is_optional_and_open_to_newer_agents() {
        let mut value = serde_json::to_value(JobStatus::from(v1(
            "systemUpgradeV1",
            JobState::Failed,
            Some("x"),
        )))
        .expect("json");
        value.as_object_mut().expect("object").remove("failure");
        let older: JobStatus = serde_json::from_value(value.clone()).expect("older agent");
        assert_eq!(older.failure, None);
        value["failure"] = "diskOnFire".into();
        let newer: JobStatus = serde_json::from_value(value.clone()).expect("newer agent");
        assert_eq!(newer.failure, Some(Failure::Other));
        value["failure"] = "resumeLoop".into();
        let known: JobStatus = serde_json::from_value(value).expect("this agent");
        assert_eq!(known.failure, Some(Failure::ResumeLoop));
    }
}
