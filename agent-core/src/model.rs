//! The job model of DESIGN.md, shared by the agent and the control plane.
//! These types are also the JSON payloads on every transport (camelCase), so a
//! field added here must be optional for older peers.

use crate::ids::{DeviceId, JobId};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// What a job asks the device to do. `SystemUpgradeV1` has no parameters, ever
/// (invariant A8): apt, dpkg, repository and reboot policy are compiled in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum JobKind {
    SystemUpgradeV1(Empty),
    InventoryRefreshV1(Empty),
}

/// The parameters of a kind that takes none. Unknown fields are refused, so a
/// peer cannot smuggle options into a parameterless kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

impl JobKind {
    /// The kind's wire name, which is also the capability an agent advertises.
    pub fn name(&self) -> &'static str {
        match self {
            JobKind::SystemUpgradeV1(_) => "systemUpgradeV1",
            JobKind::InventoryRefreshV1(_) => "inventoryRefreshV1",
        }
    }

    pub fn system_upgrade() -> Self {
        JobKind::SystemUpgradeV1(Empty {})
    }

    pub fn inventory_refresh() -> Self {
        JobKind::InventoryRefreshV1(Empty {})
    }
}

/// One job for one device, as the control plane sends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Intent {
    pub job_id: JobId,
    pub device_id: DeviceId,
    pub kind: JobKind,
    pub attempt: u32,
    pub created_at: Timestamp,
    /// An intent past this instant never starts (A3).
    pub expires_at: Timestamp,
    /// The job's budget once started, in seconds. Informational for the
    /// updater, which bounds each child call itself; expiry never interrupts apt.
    pub timeout_seconds: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum JobState {
    Accepted,
    Waiting,
    Running,
    AwaitingReboot,
    Succeeded,
    Failed,
    Expired,
    Rejected,
    Canceled,
}

impl JobState {
    pub fn is_terminal(self) -> bool {
        match self {
            JobState::Succeeded
            | JobState::Failed
            | JobState::Expired
            | JobState::Rejected
            | JobState::Canceled => true,
            JobState::Accepted
            | JobState::Waiting
            | JobState::Running
            | JobState::AwaitingReboot => false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepState {
    Pending,
    Running,
    Done,
    Failed,
}

/// Where a job is in its chain: one record per step, durable, so the record,
/// not a log search, says where a job stopped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepRecord {
    pub name: String,
    pub state: StepState,
    pub started_at: Option<Timestamp>,
    /// Seconds from the step's durable start to its end.
    pub seconds: Option<f64>,
    pub tries: u32,
    /// Bounded to [`crate::MAX_ERROR_BYTES`].
    pub error: Option<String>,
}

impl StepRecord {
    pub fn pending(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            state: StepState::Pending,
            started_at: None,
            seconds: None,
            tries: 0,
            error: None,
        }
    }
}

/// A job's reported status. `seq` grows with every change so a receiver can
/// drop stale or duplicate copies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobStatus {
    pub job_id: JobId,
    pub device_id: DeviceId,
    pub attempt: u32,
    /// The kind's wire name, or the unknown name of a rejected kind.
    pub kind: String,
    pub state: JobState,
    pub steps: Vec<StepRecord>,
    /// The latest error, bounded to [`crate::MAX_ERROR_BYTES`].
    pub error: Option<String>,
    pub output: Option<JobOutput>,
    pub accepted_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub boot_id: String,
    /// The first heartbeat after the updater completed (A6).
    pub completion_heartbeat_at: Option<Timestamp>,
    pub seq: u64,
}

/// What a finished job found or did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum JobOutput {
    Upgrade(UpgradeOutput),
    Inventory(Inventory),
}

/// Upper bound of package names an upgrade output lists.
pub const MAX_LISTED_PACKAGES: usize = 300;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeOutput {
    /// True when apt only simulated the upgrade (`apt-get -s`).
    pub simulated: bool,
    pub upgraded: Vec<PackageChange>,
    pub installed: Vec<PackageChange>,
    pub removed: Vec<String>,
    pub kept_back: Vec<String>,
    /// Package entries left out to keep the output bounded.
    pub omitted: u32,
    pub reboot_required: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackageChange {
    pub name: String,
    pub from: Option<String>,
    pub to: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    pub os_release: String,
    pub architecture: String,
    pub kernel: String,
    pub uptime_seconds: u64,
    pub memory_total_bytes: u64,
    pub memory_available_bytes: u64,
    pub disks: Vec<DiskUsage>,
    pub installed_packages: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskUsage {
    pub mount_point: String,
    pub total_bytes: u64,
    pub available_bytes: u64,
}

/// The agent's periodic sign of life. A heartbeat under a new boot id is what
/// confirms a job that rebooted the device (A6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Heartbeat {
    pub device_id: DeviceId,
    pub boot_id: String,
    pub seq: u64,
    pub agent_version: String,
    pub capabilities: Vec<String>,
    pub uptime_seconds: u64,
    pub os_release: String,
    pub architecture: String,
    /// Changes whenever the installed package set changes.
    pub inventory_digest: String,
    pub sent_at: Timestamp,
}

/// A job the agent still holds, as listed in its `hello`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldJob {
    pub job_id: JobId,
    pub state: JobState,
}
