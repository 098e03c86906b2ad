//! A job as the API shows it: its state, its steps, what it did. The API's
//! own copy, apart from the agents' wire status and the stored record.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A job's state as its device reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
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

/// A step's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum StepState {
    Pending,
    Running,
    Done,
    Failed,
}

impl StepState {
    pub fn name(self) -> &'static str {
        match self {
            StepState::Pending => "Pending",
            StepState::Running => "Running",
            StepState::Done => "Done",
            StepState::Failed => "Failed",
        }
    }
}

/// One step of a job's chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    pub name: String,
    pub state: StepState,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub started_at: Option<Timestamp>,
    /// Seconds from the step's durable start to its end.
    pub seconds: Option<f64>,
    pub tries: u32,
    pub error: Option<String>,
}

/// A job's status as its device last reported it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobStatus {
    pub job_id: String,
    pub device_id: String,
    pub attempt: u32,
    /// The kind's wire name, or the unknown name of a rejected kind.
    pub kind: String,
    pub state: JobState,
    pub steps: Vec<Step>,
    /// The latest error.
    pub error: Option<String>,
    pub output: Option<JobOutput>,
    #[schema(value_type = String, format = DateTime)]
    pub accepted_at: Timestamp,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub started_at: Option<Timestamp>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub finished_at: Option<Timestamp>,
    pub boot_id: String,
    /// The first heartbeat after the updater completed.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub completion_heartbeat_at: Option<Timestamp>,
    /// Grows with every change.
    pub seq: u64,
    /// Why a Failed or Rejected job ended so; absent when it did not, or
    /// when its agent is older than the field and said nothing the control
    /// plane could read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// A Failed job's reason in the failing program's own words (apt's
    /// `E:` lines and the unmet dependencies it names, dpkg's error for a
    /// package, else the failing step's last lines): at most 40 lines of
    /// plain text. Absent when there is none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reason: Vec<String>,
}

/// Why a job failed or was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum Failure {
    /// One of the job's steps failed; its error says why.
    StepFailed,
    /// The agent stopped while the job ran more often than its limit.
    ResumeLoop,
    /// The intent's signature did not hold on the device.
    SignatureRefused,
    /// The intent could not be read, or its parameters were invalid.
    Malformed,
    /// The agent does not know, or does not run, the job's kind.
    UnknownKind,
    /// The agent's queue of unfinished jobs was full.
    QueueFull,
    /// The intent named another device.
    OtherDevice,
    /// A reason this control plane does not know, from a newer agent.
    #[serde(other)]
    Other,
}

/// What a finished job found or did: one of these, by its name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum JobOutput {
    Upgrade(UpgradeOutput),
    Inventory(Inventory),
    Software(SoftwareInventory),
    Assessment(PatchAssessment),
}

/// What an upgrade changed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeOutput {
    /// apt only simulated the upgrade.
    pub simulated: bool,
    pub upgraded: Vec<PackageChange>,
    pub installed: Vec<PackageChange>,
    pub removed: Vec<String>,
    pub kept_back: Vec<String>,
    /// Package entries left out to keep the output bounded.
    pub omitted: u32,
    pub reboot_required: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PackageChange {
    pub name: String,
    pub from: Option<String>,
    pub to: String,
}

/// A device's facts as an inventory found them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
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

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskUsage {
    pub mount_point: String,
    pub total_bytes: u64,
    pub available_bytes: u64,
}

/// An inventory with the installed packages.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SoftwareInventory {
    pub inventory: Inventory,
    pub packages: Vec<InstalledPackage>,
    pub omitted: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct InstalledPackage {
    pub name: String,
    pub version: String,
}

/// What a full upgrade would change on the device now.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PatchAssessment {
    pub upgradable: u32,
    pub security: u32,
    pub kept_back: u32,
    pub security_archive: bool,
    pub reboot_pending: Option<String>,
    pub running_kernel: String,
    pub newest_kernel: Option<String>,
    pub pending: Vec<PendingPackage>,
    pub omitted: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PendingPackage {
    pub name: String,
    pub from: Option<String>,
    pub to: String,
    pub security: bool,
}

/// Why a target not released yet waits: what the engine's pass acts on
/// (`drover_rules::deployment::wait_of`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TargetWait {
    /// RetryBackoff, Offline, WindowClosed, ConcurrencyLimit, ReleaseRate.
    pub code: String,
    /// The sentence to show.
    pub text: String,
    /// When it ends by itself, if known (a window's opening, a backoff's
    /// end, room in the release rate).
    #[schema(value_type = Option<String>, format = DateTime)]
    pub until: Option<Timestamp>,
}
