//! Devices: one device with its state and patch summary, a page of the
//! fleet, a device's jobs, its assessment and inventory, the fleet's patch
//! status, and its token's generation.

use crate::jobs::JobOutput;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// A device as the API shows it: what the registry keeps, with what the
/// answer adds (whether it is online, its state, its patch summary).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub id: String,
    pub groups: Vec<String>,
    pub labels: BTreeMap<String, String>,
    /// IANA time zone of the device's site, for maintenance windows.
    pub time_zone: Option<String>,
    pub decommissioned: bool,
    /// An agent has connected with this device's credentials at least once.
    pub agent_present: bool,
    pub capabilities: Vec<String>,
    pub agent_version: Option<String>,
    pub boot_id: Option<String>,
    pub os_release: Option<String>,
    pub architecture: Option<String>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub last_heartbeat: Option<Timestamp>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub last_seen: Option<Timestamp>,
    /// The transport the agent last spoke over.
    pub transport: Option<String>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub first_connected: Option<Timestamp>,
    /// Its agent is connected and heard from lately.
    pub online: bool,
    /// online, offline, never connected or decommissioned.
    pub state: String,
    /// Its latest assessment's summary; null before the first.
    pub patch: Option<PatchSummary>,
    /// The labels the control plane maintains from its assessments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintained_labels: Option<BTreeMap<String, String>>,
    /// Its token's generation (one device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_generation: Option<u64>,
    /// Its undecided job, if any (the fleet page).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_job: Option<CurrentJob>,
}

/// A device's undecided job, as the fleet page shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CurrentJob {
    pub run: Option<String>,
    pub kind: String,
    /// The job's phase name (notReleased, undelivered, accepted, …).
    pub state: String,
    pub state_label: String,
    /// The latest step that is not pending.
    pub step: Option<String>,
}

/// `GET /devices/page`: one filtered page of the fleet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DevicePage {
    pub total: u64,
    pub offset: u64,
    pub items: Vec<Device>,
}

/// A device's latest assessment in brief.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PatchSummary {
    /// When the control plane received it.
    #[schema(value_type = String, format = DateTime)]
    pub assessed_at: Timestamp,
    pub upgradable: u32,
    pub security: u32,
    pub kept_back: u32,
    pub security_archive: bool,
    /// Why a reboot is pending, if one is.
    pub reboot_pending: Option<String>,
    pub running_kernel: String,
    pub newest_kernel: Option<String>,
    /// Since when the oldest pending security update has waited.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub oldest_security_since: Option<Timestamp>,
    /// The assessment in one line.
    pub summary: String,
}

/// `GET /devices/{id}/assessment`: the summary with the pending packages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Assessment {
    #[serde(flatten)]
    pub summary: PatchSummary,
    pub pending: Vec<Pending>,
    /// Pending packages not listed.
    pub omitted: u32,
}

/// A pending package, and since when a security update has waited.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Pending {
    pub name: String,
    pub from: Option<String>,
    pub to: String,
    pub security: bool,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub since: Option<Timestamp>,
}

/// `GET /devices/{id}/jobs`: a device's latest jobs, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceJobs {
    pub device: String,
    /// All its jobs (at most 50 are listed).
    pub total: u64,
    pub items: Vec<DeviceJob>,
    /// The last upgrade that succeeded, however many jobs came after it.
    pub last_upgrade: Option<DeviceJob>,
}

/// One of a device's jobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceJob {
    pub job: String,
    pub kind: String,
    pub run: Option<String>,
    pub state: String,
    pub state_label: String,
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub finished_at: Option<Timestamp>,
    pub error: Option<String>,
    /// A failed job's reason in the failing program's own words (see
    /// [`crate::jobs::JobStatus::reason`]); absent when there is none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reason: Vec<String>,
    /// What it did, in one line.
    pub result_text: Option<String>,
    /// An upgrade's report: on the device's latest succeeded upgrade
    /// always; on a job its history kept, only on the newest such upgrade.
    pub output: Option<JobOutput>,
    /// Its run, deployment or schedule was deleted and the device's
    /// history kept it (see `drover serve --history-jobs-per-device`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub run_deleted: bool,
}

/// `GET /devices/{id}/inventory`: the packages its latest inventory found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceInventory {
    pub device: String,
    #[schema(value_type = String, format = DateTime)]
    pub collected_at: Timestamp,
    /// Name to version.
    pub packages: BTreeMap<String, String>,
    /// The device left packages out.
    pub truncated: bool,
}

/// `GET /patch-status`: the fleet's devices (not decommissioned) by their
/// latest assessment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PatchStatus {
    pub devices: u32,
    pub up_to_date: u32,
    pub with_updates: u32,
    pub with_security_updates: u32,
    #[serde(rename = "securityUnder1Day")]
    pub security_under_1_day: u32,
    #[serde(rename = "security1To7Days")]
    pub security_1_to_7_days: u32,
    #[serde(rename = "securityOver7Days")]
    pub security_over_7_days: u32,
    pub no_security_archive: u32,
    pub reboot_pending: u32,
    /// Assessed, but not for over `staleAfterHours`.
    pub stale: u32,
    pub never_assessed: u32,
    pub stale_after_hours: u64,
}

/// `GET /devices/token-generations`: every device whose token was rotated,
/// with its generation (the others are at 0). No token crosses here.
pub type TokenGenerations = BTreeMap<String, u64>;

/// `POST /devices/{id}/rotate-token`: the token before this generation is
/// refused from now on; the new one is made on the control plane's host
/// (`drover token ID`), never sent here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenRotated {
    pub device: String,
    pub token_generation: u64,
}
