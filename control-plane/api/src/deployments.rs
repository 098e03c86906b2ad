//! Deployments as the API shows them: the manifest with its status, one
//! page of its targets, and what `describe` needs to judge one.

use crate::jobs::JobStatus;
pub use crate::jobs::TargetWait;
use crate::runs::{Delivery, ObjectMeta, Phase};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// A Deployment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Deployment {
    pub api_version: String,
    /// `Deployment`.
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: DeploymentSpec,
    pub status: DeploymentStatus,
}

/// A deployment's spec as an operator wrote it (what `apply` takes back).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentSpec {
    pub targets: Targets,
    pub max_concurrency: u32,
    pub retries: u32,
    /// The wait before retry n is this × 2^(n-1).
    pub retry_backoff_seconds: u64,
    pub deadline_seconds: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<FailureThreshold>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_releases_per_minute: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_window: Option<MaintenanceWindow>,
    /// The job, under its kind's name (`systemUpgradeV1`,
    /// `packageInstallV1`, …), in the form that kind's section takes.
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub job: BTreeMap<String, serde_json::Value>,
}

/// Who a deployment targets: every device, named devices, or a filter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Targets {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<TargetFilter>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetFilter {
    pub match_labels: BTreeMap<String, String>,
    pub groups: Vec<String>,
    /// Packages that must be installed (name, and a version rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub software_present: Option<serde_json::Value>,
    /// Packages that must not be installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub software_absent: Option<serde_json::Value>,
}

/// When a deployment stops releasing: `failed` targets, or `percent` of
/// the ended ones, once `minEnded` have ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureThreshold {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ended: Option<u32>,
}

/// Daily hours (`HH:MM`) in each site's time zone, `timeZone` for sites
/// without one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceWindow {
    pub start: String,
    pub end: String,
    pub time_zone: String,
}

/// A deployment's counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentStatus {
    pub phase: Phase,
    pub reason: Option<String>,
    pub reason_text: Option<String>,
    pub targets: u32,
    /// Devices the targeting found but left out.
    pub excluded_count: u32,
    pub pending: u32,
    pub waiting_retry: u32,
    pub queued: u32,
    pub running: u32,
    pub succeeded: u32,
    pub failed: u32,
    pub expired: u32,
    pub canceled: u32,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub start_time: Option<Timestamp>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub completion_time: Option<Timestamp>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub next_retry_at: Option<Timestamp>,
    pub latest_error: Option<String>,
    pub add_new_devices_requests: u32,
    pub add_new_devices_handled: u32,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub failure_threshold_reached_at: Option<Timestamp>,
}

/// `GET /deployments/{name}/targets`: one page of its targets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DeploymentTargets {
    /// The targets in the state asked for (all without one).
    pub total: u64,
    pub offset: u64,
    pub items: Vec<DeploymentTarget>,
}

/// One target with its attempt, state and current job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentTarget {
    pub device: String,
    /// pending, waitingRetry, queued, running, succeeded, failed, expired,
    /// canceled.
    pub state: String,
    pub state_label: String,
    pub attempt: u32,
    pub job: Option<String>,
    pub time_zone: Option<String>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub released_at: Option<Timestamp>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub next_attempt_at: Option<Timestamp>,
    pub last_error: Option<String>,
    pub delivery: Option<Delivery>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub created_at: Option<Timestamp>,
    pub status: Option<JobStatus>,
    pub result_text: Option<String>,
    /// Why it waits, for a target not released yet (none when the next
    /// pass releases it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<TargetWait>,
}

/// A device and why its target waits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeviceWait {
    pub device: String,
    pub wait: TargetWait,
}

/// `GET /deployments/{name}/describe`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentDescription {
    pub deployment: Deployment,
    /// Each site's window now (the first 100 time zones).
    pub windows: Vec<WindowNow>,
    /// The latest errors (10).
    pub latest_errors: Vec<TargetError>,
    /// The next retries (20).
    pub waiting_retry: Vec<WaitingRetry>,
    pub waiting_retry_total: u64,
    /// Targets not released yet and why each waits (the first 20, those
    /// whose wait ends soonest first).
    #[serde(default)]
    pub waiting: Vec<DeviceWait>,
    /// Targets not released yet that wait, by the wait's code.
    #[serde(default)]
    pub waiting_by_code: std::collections::BTreeMap<String, u64>,
    /// Groups of its filter no device is in now, beside groups that
    /// select devices (a misspelt one selects nothing and says nothing),
    /// with the nearest existing name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unmatched: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WindowNow {
    pub time_zone: String,
    /// Targets not ended in this zone.
    pub targets: u64,
    /// `YYYY-MM-DD HH:MM` there now.
    pub local_time: String,
    pub open: bool,
    /// When it opens next there, while closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub opens_at: Option<Timestamp>,
    /// That moment there, `YYYY-MM-DD HH:MM`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opens_local: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TargetError {
    pub device: String,
    pub attempt: u32,
    pub error: String,
    /// That attempt's job's reason in the failing program's own words.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reason: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaitingRetry {
    pub device: String,
    pub attempt: u32,
    #[schema(value_type = String, format = DateTime)]
    pub next_attempt_at: Timestamp,
    pub last_error: Option<String>,
}
