//! The control plane's records and their keys. How each is laid out on disk
//! is the store's business (`drover::stored`); every update goes through a
//! compare-and-set retry loop (`drover::db::Db::update`).

use drover_model::model::{Intent, JobStatus, PackageInstall};
use drover_model::{DeviceId, JobId};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

pub const API_VERSION: &str = "fleet.nationtech.io/v1alpha1";
/// Targets per plan chunk: the plan of a 20,000-device run is 40 small values.
pub const PLAN_CHUNK: usize = 500;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRecord {
    pub id: DeviceId,
    pub groups: BTreeSet<String>,
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
    pub last_heartbeat: Option<Timestamp>,
    pub last_seen: Option<Timestamp>,
    /// The transport the agent last spoke over (`websocket`, `nats`).
    pub transport: Option<String>,
    /// When an agent first connected with this device's credentials (the
    /// control plane's clock), as far as this control plane has kept it:
    /// a device that never reported an assessment is judged from here.
    pub first_connected: Option<Timestamp>,
}

impl DeviceRecord {
    pub fn new(id: DeviceId) -> Self {
        Self {
            id,
            groups: BTreeSet::new(),
            labels: BTreeMap::new(),
            time_zone: None,
            decommissioned: false,
            agent_present: false,
            capabilities: Vec::new(),
            agent_version: None,
            boot_id: None,
            os_release: None,
            architecture: None,
            last_heartbeat: None,
            last_seen: None,
            transport: None,
            first_connected: None,
        }
    }

    /// The device's state as operators read it (`get devices`, /metrics):
    /// `online` is whether its agent is connected and heard from lately.
    pub fn state(&self, online: bool) -> &'static str {
        match (self.decommissioned, self.agent_present, online) {
            (true, _, _) => "decommissioned",
            (false, false, _) => "never connected",
            (false, true, true) => "online",
            (false, true, false) => "offline",
        }
    }

    /// The device's labels including the implicit `device-id` label, so a
    /// selector can pick one device by name as the fleet-tasks seed does.
    pub fn effective_labels(&self) -> BTreeMap<String, String> {
        let mut labels = self.labels.clone();
        labels.insert("device-id".into(), self.id.to_string());
        labels
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskRunSpec {
    pub allowed_groups: Vec<String>,
    pub target_selector: TargetSelector,
    pub deadline_seconds: u64,
    /// The only workload so far; always present in a valid spec.
    pub system_upgrade_v1: drover_model::model::Empty,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetSelector {
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    Planning,
    Running,
    Complete,
    Failed,
    /// An operator canceled it: nothing more is released, undecided jobs
    /// get a cancel order, and it ends Failed with reason `Canceled` once
    /// they are decided. (Appended: stored records decode unchanged.)
    Canceling,
}

impl Phase {
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Complete | Phase::Failed)
    }
}

/// Aggregate status only: no per-device map grows with the fleet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunStatus {
    pub phase: Phase,
    pub reason: Option<String>,
    pub targets: u32,
    pub canaries: u32,
    pub released: u32,
    pub succeeded: u32,
    pub failed: u32,
    pub start_time: Option<Timestamp>,
    pub completion_time: Option<Timestamp>,
    /// `<device>: <error>`, bounded to 1 KiB.
    pub latest_error: Option<String>,
    pub plan_chunks: u32,
}

impl RunStatus {
    /// A new run's status: Planning, nothing counted yet.
    pub fn planning() -> Self {
        Self {
            phase: Phase::Planning,
            reason: None,
            targets: 0,
            canaries: 0,
            released: 0,
            succeeded: 0,
            failed: 0,
            start_time: None,
            completion_time: None,
            latest_error: None,
            plan_chunks: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskRunRecord {
    pub name: String,
    /// The run UID, which is also every target's job id and attempt id.
    pub uid: JobId,
    pub created_at: Timestamp,
    pub spec: TaskRunSpec,
    pub status: RunStatus,
    /// The TaskSchedule that created the run, whose history limits delete
    /// it once newer runs have finished; `None` for a run applied by hand
    /// (and for every run stored before owners were kept).
    pub owner: Option<String>,
}

impl TaskRunRecord {
    pub fn deadline(&self) -> Timestamp {
        let start = self.status.start_time.unwrap_or(self.created_at);
        let seconds = i64::try_from(self.spec.deadline_seconds).unwrap_or(i64::MAX / 2);
        start
            .checked_add(jiff::SignedDuration::from_secs(seconds))
            .unwrap_or(Timestamp::MAX)
    }
}

/// The frozen plan's header, outside the run record. A planner claims it
/// (create-only, or taking over a claim older than a minute), writes the
/// chunks, then marks it complete; only then does the run enter Running. So
/// concurrent replicas load one plan, and a planner that died mid-way is
/// replaced instead of leaving half a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanHeader {
    pub planner: String,
    pub claimed_at: Timestamp,
    pub targets: u32,
    pub canaries: u32,
    pub chunks: u32,
    pub complete: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanTarget {
    pub device: DeviceId,
    pub canary: bool,
}

/// Where a job is on its way to the device (the jobs seed's delivery states).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Delivery {
    Created,
    /// Kept in memory only (see `delivery.rs`); a record read back from
    /// layout V1 may still say so.
    Sent {
        at: Timestamp,
    },
    Acked {
        at: Timestamp,
    },
    /// The intent expired before the device took it; it never starts (A3).
    Expired {
        at: Timestamp,
    },
}

/// One job for one device: its intent, delivery state and latest status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobDelivery {
    pub intent: Intent,
    pub run: Option<String>,
    pub delivery: Delivery,
    pub status: Option<JobStatus>,
    pub created_at: Timestamp,
    /// The control plane's time when the terminal status arrived: success
    /// before the deadline is judged by it, never by the device's clock (A12).
    pub terminal_received_at: Option<Timestamp>,
    /// When the control plane decided to cancel the job (its run or
    /// deployment was canceled). From then on the delivery core sends the
    /// signed cancel order in place of the intent; the job is decided by the
    /// status the agent reports (Canceled, or the end of a job that had
    /// started: a started job is never interrupted).
    pub cancel_requested_at: Option<Timestamp>,
}

/// The `run` a deployment's jobs carry: `deployment/NAME`.
pub fn deployment_run(name: &str) -> String {
    format!("deployment/{name}")
}

/// Whether a job's `run` names a deployment rather than a task run.
pub fn is_deployment_run(run: &str) -> bool {
    run.starts_with("deployment/")
}

pub fn device_key(id: &DeviceId) -> String {
    format!("devices/{id}")
}
pub fn run_key(name: &str) -> String {
    format!("runs/{name}")
}
pub fn schedule_key(name: &str) -> String {
    format!("schedules/{name}")
}
pub fn deployment_key(name: &str) -> String {
    format!("deployments/{name}")
}
pub fn target_key(deployment: JobId, device: &DeviceId) -> String {
    format!("targets/{deployment}/{device}")
}
pub fn targets_prefix(deployment: JobId) -> String {
    format!("targets/{deployment}/")
}
pub fn plan_key(uid: JobId, index: u32) -> String {
    format!("plans/{uid}/{index:06}")
}
pub fn plan_header_key(uid: JobId) -> String {
    format!("plans/{uid}/header")
}
/// Which replica passes over a running run (a `Lease`, as deployments hold).
pub fn run_lease_key(uid: JobId) -> String {
    format!("run-leases/{uid}")
}
pub fn job_key(device: &DeviceId, job: JobId) -> String {
    format!("jobs/{device}/{job}")
}
pub fn device_jobs_prefix(device: &DeviceId) -> String {
    format!("jobs/{device}/")
}

// The records of packages, secrets and alerts: their logic stays with
// the server (packages.rs, secrets.rs, alerts.rs).

/// A package in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackageRecord {
    pub id: String,
    pub name: String,
    pub version: String,
    pub architecture: String,
    pub sha256: String,
    pub size: u64,
    pub uploaded_at: Timestamp,
}

impl PackageRecord {
    /// The job's parameters, without a link (the enricher adds one).
    pub fn job(&self) -> PackageInstall {
        PackageInstall {
            package: self.id.clone(),
            name: self.name.clone(),
            version: self.version.clone(),
            architecture: self.architecture.clone(),
            sha256: self.sha256.clone(),
            size: self.size,
            download: None,
            secrets: Vec::new(),
            sealed: None,
        }
    }
}

pub fn package_key(id: &str) -> String {
    format!("packages/{id}")
}

/// A secret as stored: its keys in clear (to list them), the values sealed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretRecord {
    pub name: String,
    pub keys: Vec<String>,
    pub nonce: String,
    pub ciphertext: String,
    pub updated_at: Timestamp,
}

pub fn secret_key(name: &str) -> String {
    format!("secrets/{name}")
}

/// A device's resume loop as the delivery core recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AlertRecord {
    pub device: DeviceId,
    pub job_id: JobId,
    /// The run or deployment the job belonged to.
    pub run: Option<String>,
    pub at: Timestamp,
    pub message: String,
}

/// An operator's acknowledgement of one alert (`acks/<kind>/<resource>`):
/// it holds for the alert whose condition began at `instance`; once the
/// condition clears and returns (a new start), the alert is raised again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AlertAck {
    pub kind: String,
    pub resource: String,
    /// When the acknowledged alert's condition began (its `at`).
    pub instance: Option<Timestamp>,
    /// Who acknowledged it: the operator token, or a dashboard session.
    pub by: String,
    pub at: Timestamp,
}

pub fn ack_key(kind: &str, resource: &str) -> String {
    format!("acks/{kind}/{resource}")
}

/// The key and record of a resume-loop alert for `job` on `device`.
pub fn resume_loop(
    device: &DeviceId,
    job: &JobDelivery,
    error: &str,
    at: Timestamp,
) -> (String, AlertRecord) {
    (
        format!("alerts/{device}/{}", job.intent.job_id),
        AlertRecord {
            device: device.clone(),
            job_id: job.intent.job_id,
            run: job.run.clone(),
            at,
            message: drover_model::bounded(error, drover_model::MAX_ERROR_BYTES),
        },
    )
}

/// What an operator may do. Each role may do what the one before it may.
/// Stored by variant index: never reorder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads everything (secrets' names, never their values).
    Viewer,
    /// Also applies, cancels, suspends, acknowledges and uploads.
    Operator,
    /// Also deletes, and manages operators and devices' tokens.
    Admin,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "viewer" => Some(Role::Viewer),
            "operator" => Some(Role::Operator),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The name of the operator the bootstrap token (`DATA/operator.token`) is.
pub const BOOTSTRAP_OPERATOR: &str = "admin";

/// A named operator: a role and the digest of its token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperatorRecord {
    pub name: String,
    pub role: Role,
    /// The token's HMAC under the control plane's key, in hex; None for
    /// the bootstrap operator while its token is `DATA/operator.token`.
    pub token_digest: Option<String>,
    /// Counts the operator's tokens: rotate and revoke raise it, which ends
    /// the dashboard sessions made with the token before.
    pub generation: u64,
    pub created_at: Timestamp,
    pub created_by: String,
    pub changed_at: Timestamp,
    pub revoked_at: Option<Timestamp>,
    pub revoked_by: Option<String>,
}

pub fn operator_key(name: &str) -> String {
    format!("operators/{name}")
}

/// One object a change touched, as the audit log names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditObject {
    pub kind: String,
    pub name: String,
    /// What became of it: created, configured, unchanged, deleted, …
    pub result: Option<String>,
    /// SHA-256 of the manifest as sent (its JSON), in hex.
    pub digest: Option<String>,
}

/// One entry of the audit log: a change, or a refused request. Created
/// once, never changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    /// The control plane's clock when the request was answered.
    pub at: Timestamp,
    /// `operator/NAME`, `schedule/NAME`, or `unknown` (no valid credential).
    pub who: String,
    pub role: Option<Role>,
    /// `cli` (a bearer token), `dashboard` (a session) or `control-plane`.
    pub via: String,
    /// The client's address, when there was a client.
    pub peer: Option<String>,
    /// apply, cancel, delete, suspend, upload, login, …
    pub verb: String,
    pub kind: Option<String>,
    pub name: Option<String>,
    /// The request: method and path (never a query's or body's secrets).
    pub request: Option<String>,
    /// SHA-256 of the request's body, in hex, when it had one.
    pub body_digest: Option<String>,
    /// The objects it touched (at most [`AUDIT_OBJECTS`] listed).
    pub objects: Vec<AuditObject>,
    pub objects_total: u64,
    /// `applied`, `refused` (no credential or role) or `failed`.
    pub outcome: String,
    pub status: u16,
    pub reason: Option<String>,
    /// The replica that answered.
    pub replica: String,
}

/// Objects one audit entry lists; a List of thousands keeps its count and
/// its body's digest.
pub const AUDIT_OBJECTS: usize = 100;
