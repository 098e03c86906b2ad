//! The fleet at a glance: counts cheap enough to poll, and the alerts.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// `GET /summary`: fleet counts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Devices registered.
    pub devices: u64,
    /// Devices whose agent has ever said hello.
    pub agents_present: u64,
    /// Agents connected to this replica, by transport.
    pub connected_here: BTreeMap<String, u64>,
    pub engine: EngineStats,
}

/// The engine's passes since this replica started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EngineStats {
    pub deployment_passes: u64,
    pub deployment_pass_seconds: f64,
    pub deployment_store_seconds: f64,
    pub run_passes: u64,
    pub run_pass_seconds: f64,
    pub run_full_passes: u64,
}

/// How much an alert asks of an operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Critical,
    Warning,
}

impl Severity {
    pub fn name(self) -> &'static str {
        match self {
            Severity::Critical => "critical",
            Severity::Warning => "warning",
        }
    }
}

/// Something that needs an operator's eye now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Alert {
    pub severity: Severity,
    /// CanaryFailed, DeadlineExceeded, DeploymentFailed,
    /// FailureThresholdReached, DeviceOffline, ResumeLoop, and the patch
    /// alerts (SecurityUpdatesWaiting, …).
    pub kind: String,
    /// What it is about: `taskrun/NAME`, `deployment/NAME`, `device/ID`.
    pub resource: String,
    pub message: String,
    /// When its condition began: an acknowledgement holds for this start.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub at: Option<Timestamp>,
    /// Who acknowledged it and when, while its condition lasts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acknowledged: Option<Acknowledged>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Acknowledged {
    /// `operator/NAME (cli|dashboard)`.
    pub by: String,
    #[schema(value_type = String, format = DateTime)]
    pub at: Timestamp,
}

/// `GET /alerts`: every alert now, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Alerts {
    pub items: Vec<Alert>,
    /// Devices offline longer than `offlineAfterMinutes` (the first 100
    /// are among the items, the longest offline first).
    pub offline_devices: u64,
    pub offline_after_minutes: u64,
}

/// `POST /alerts/ack`: acknowledge the alert `kind` about `resource` as it
/// stands now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AckRequest {
    pub kind: String,
    pub resource: String,
}

/// The acknowledgement given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AckAnswer {
    pub kind: String,
    pub resource: String,
    pub acknowledged: Acknowledged,
}

/// A Secret as listed: its name and keys, never their values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretSummary {
    pub name: String,
    pub keys: Vec<String>,
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: Timestamp,
}
