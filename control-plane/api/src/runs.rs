//! TaskRuns as the API shows them (Kubernetes' shape: metadata, spec,
//! status), and one page of a run's frozen plan.

use crate::jobs::JobStatus;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// The API version every manifest carries.
pub const API_VERSION: &str = "fleet.nationtech.io/v1alpha1";

/// An object's name and what the control plane set on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    pub name: String,
    /// Runs and deployments have one; it is also their jobs' id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[schema(value_type = String, format = DateTime)]
    pub creation_timestamp: Timestamp,
    /// Who made the object: a run's schedule, whose history limits will
    /// delete it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_references: Option<Vec<OwnerReference>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct OwnerReference {
    pub kind: String,
    pub name: String,
}

/// Where a run or deployment is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum Phase {
    Planning,
    Running,
    Complete,
    Failed,
    Canceling,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Planning => "Planning",
            Phase::Running => "Running",
            Phase::Complete => "Complete",
            Phase::Failed => "Failed",
            Phase::Canceling => "Canceling",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Complete | Phase::Failed)
    }
}

/// A TaskRun: the seed's resource.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskRun {
    pub api_version: String,
    /// `TaskRun`.
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: TaskRunSpec,
    pub status: TaskRunStatus,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskRunSpec {
    pub allowed_groups: Vec<String>,
    pub target_selector: TargetSelector,
    pub deadline_seconds: u64,
    /// The workload: a full system upgrade (no fields).
    #[schema(value_type = Object)]
    pub system_upgrade_v1: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetSelector {
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

/// A run's counts: nothing in it grows with the fleet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskRunStatus {
    pub phase: Phase,
    /// Why it ended, as a code (CanaryFailed, DeadlineExceeded, …).
    pub reason: Option<String>,
    /// The reason in words.
    pub reason_text: Option<String>,
    pub targets: u32,
    pub canaries: u32,
    pub released: u32,
    pub succeeded: u32,
    pub failed: u32,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub start_time: Option<Timestamp>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub completion_time: Option<Timestamp>,
    /// `<device>: <error>`.
    pub latest_error: Option<String>,
    pub plan_chunks: u32,
}

/// Where a job is on its way to its device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum Delivery {
    Created,
    Sent {
        #[schema(value_type = String, format = DateTime)]
        at: Timestamp,
    },
    Acked {
        #[schema(value_type = String, format = DateTime)]
        at: Timestamp,
    },
    /// The intent expired before the device took it.
    Expired {
        #[schema(value_type = String, format = DateTime)]
        at: Timestamp,
    },
}

/// `GET /taskruns/{name}/targets`: one page of a run's frozen plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunTargets {
    pub total: u64,
    pub offset: u64,
    pub items: Vec<RunTarget>,
}

/// One target of a run with its job's delivery and status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunTarget {
    pub device: String,
    pub canary: bool,
    /// Its job was released.
    pub released: bool,
    pub delivery: Option<Delivery>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub created_at: Option<Timestamp>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub cancel_requested_at: Option<Timestamp>,
    pub status: Option<JobStatus>,
    /// What the job did, in one line.
    pub result_text: Option<String>,
    /// The job's phase name (notReleased, undelivered, accepted, …).
    pub state: String,
    pub state_label: String,
    /// It was decided after the run ended.
    pub after_run_ended: bool,
    /// Why it waits (the canaries, its device offline, an earlier job on
    /// the device), while it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<crate::jobs::TargetWait>,
}
