//! Deployments (the jobs seed): one kind of job fanned out over a set of
//! targets materialised once at start, released within a concurrency limit,
//! inside each device's maintenance window in its site's time zone, with
//! retries after an exponential backoff. Every attempt is a new job.
//!
//! This module is the pure part: the spec, the stored target, the window,
//! and [`decide`], one pass over (targets, now) with the clock injected. The
//! engine (`engine/deployments/`) reads and writes; the delivery core carries
//! the jobs it creates, as it does a task run's.

use drover_model::model::JobKind;
use drover_model::model::PackageInstall;
use drover_model::{DeviceId, JobId, MAX_ERROR_BYTES, bounded};
use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

mod decide;
mod status;
mod target;
mod targeting;
mod waiting;
mod window;

pub use decide::decide;
pub use status::{Adds, THRESHOLD_REACHED, next_status};
pub use target::{TargetState, observe};
pub use targeting::{
    DeviceFilter, DeviceInventory, Selection, SoftwareCondition, VersionCmp, VersionOp,
    inventory_key, runs_kind, select,
};
pub use waiting::{DeviceNow, Wait, rate_wait, wait_of, zone_of};
pub use window::{Window, format_minute, parse_minute, time_zone};

/// Upper bound of one deployment's targets (`too_many_targets` beyond).
pub const MAX_TARGETS: usize = 20_000;
/// Upper bound of retries after the first attempt.
pub const MAX_RETRIES: u32 = 20;
/// Longest backoff one retry waits, however many attempts came before.
pub const MAX_BACKOFF: SignedDuration = SignedDuration::from_hours(7 * 24);
/// A started job times out this long after its own timeout (the jobs seed:
/// `timeout_seconds + 5 minutes` after its start).
pub const RUNNING_GRACE: SignedDuration = SignedDuration::from_mins(5);
/// The job budget copied into each intent (the updater's package job).
pub const JOB_TIMEOUT_SECONDS: u32 = 1500;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentSpec {
    pub targets: Targeting,
    pub job: DeploymentJob,
    /// Targets queued or running at once.
    pub max_concurrency: u32,
    pub maintenance_window: Option<Window>,
    /// Attempts after the first one fails or times out.
    pub retries: u32,
    /// The wait before retry n is `retry_backoff_seconds × 2^(n-1)`.
    pub retry_backoff_seconds: u64,
    /// The deployment expires this long after it started: pending and queued
    /// targets expire then, and no attempt starts after it.
    pub deadline_seconds: u64,
    /// Stop the rollout once this many targets ended failed (layout V4).
    pub failure_threshold: Option<FailureThreshold>,
    /// At most this many releases in any 60 seconds (layout V4).
    pub max_releases_per_minute: Option<u32>,
}

/// When a deployment stops releasing: a count of targets that ended failed,
/// or a percentage of the targets that ended (succeeded or failed), judged
/// once at least `min_ended` have ended. Reaching it stops the rollout: no
/// more releases, queued jobs canceled on their agents, running ones
/// finish, and the deployment ends Failed with `FailureThresholdReached`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FailureThreshold {
    pub limit: FailureLimit,
    /// Targets that must have ended, succeeded or failed, before the
    /// threshold is judged (0: from the first).
    pub min_ended: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FailureLimit {
    /// This many targets ended failed.
    Failed(u32),
    /// This percentage (1-100) of the targets that ended, ended failed.
    Percent(u8),
}

impl FailureThreshold {
    /// Whether `counts` reach the threshold. Expired and canceled targets
    /// count neither way: they say nothing about the job.
    pub fn reached(&self, counts: &Counts) -> bool {
        let failed = u64::from(counts.failed);
        let ended = failed + u64::from(counts.succeeded);
        if ended < u64::from(self.min_ended) || failed == 0 {
            return false;
        }
        match self.limit {
            FailureLimit::Failed(limit) => failed >= u64::from(limit),
            FailureLimit::Percent(percent) => failed * 100 >= u64::from(percent) * ended,
        }
    }

    /// The threshold in words, as the status and the alert say it.
    pub fn describe(&self) -> String {
        let limit = match self.limit {
            FailureLimit::Failed(n) => format!("{n} failed targets"),
            FailureLimit::Percent(p) => format!("{p}% of ended targets failed"),
        };
        match self.min_ended {
            0 | 1 => limit,
            n => format!("{limit}, once {n} ended"),
        }
    }
}

/// Releases made at one moment: a deployment keeps the last minute's, so
/// `max_releases_per_minute` holds over any 60 seconds, on any replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Releases {
    pub at: Timestamp,
    pub count: u32,
}

/// The window `max_releases_per_minute` counts over.
pub const RATE_WINDOW: SignedDuration = SignedDuration::from_secs(60);
/// Release batches a deployment keeps; older ones merge into the next
/// (counted later than they were, so the limit is never exceeded).
pub const MAX_RELEASE_BATCHES: usize = 64;

/// Which devices a deployment targets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Targeting {
    All,
    Devices(Vec<DeviceId>),
    Filter(DeviceFilter),
}

/// The job every target runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeploymentJob {
    SystemUpgradeV1,
    InventoryRefreshV1,
    /// One package from the store. A manifest names only its id; `apply`
    /// fills in the rest from the package store before the deployment is
    /// stored, so the spec (and every job) fixes the file's checksum.
    PackageInstallV1(Box<PackageInstall>),
    /// A patch assessment now, on every target (read only). (Appended:
    /// stored deployments decode unchanged.)
    PatchAssessmentV1,
}

impl DeploymentJob {
    pub fn kind(&self) -> JobKind {
        match self {
            DeploymentJob::SystemUpgradeV1 => JobKind::system_upgrade(),
            DeploymentJob::InventoryRefreshV1 => JobKind::inventory_refresh(),
            DeploymentJob::PackageInstallV1(package) => JobKind::PackageInstallV1(package.clone()),
            DeploymentJob::PatchAssessmentV1 => JobKind::patch_assessment(),
        }
    }

    /// The kind's wire name.
    pub fn name(&self) -> &'static str {
        match self {
            DeploymentJob::SystemUpgradeV1 => "systemUpgradeV1",
            DeploymentJob::InventoryRefreshV1 => "inventoryRefreshV1",
            DeploymentJob::PackageInstallV1(_) => "packageInstallV1",
            DeploymentJob::PatchAssessmentV1 => "patchAssessmentV1",
        }
    }
}

/// A deployment as stored (`deployments/<name>`): the immutable spec, the
/// operator's requests, and the status the engine recomputes from the
/// targets at every pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentRecord {
    pub name: String,
    /// Names the deployment's targets and derives its jobs' ids.
    pub uid: JobId,
    pub created_at: Timestamp,
    pub spec: DeploymentSpec,
    /// "Add new devices" requests so far (the API counts them up).
    pub add_requests: u32,
    pub status: DeploymentStatus,
}

impl DeploymentRecord {
    pub fn facts(&self) -> Facts<'_> {
        Facts {
            spec: &self.spec,
            uid: self.uid,
            started: self.status.start_time.unwrap_or(self.created_at),
            canceling: self.status.phase == crate::records::Phase::Canceling,
            recent_releases: &self.status.recent_releases,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentStatus {
    pub phase: crate::records::Phase,
    pub reason: Option<String>,
    pub targets: u32,
    /// Matching devices left out: no agent yet, or decommissioned.
    pub excluded: u32,
    pub counts: Counts,
    pub start_time: Option<Timestamp>,
    pub completion_time: Option<Timestamp>,
    /// `<device>: <error>`, bounded to 1 KiB.
    pub latest_error: Option<String>,
    pub next_retry_at: Option<Timestamp>,
    /// The replica passing over this deployment now; others wait for it
    /// (or for `until`), so one pass at a time releases.
    pub lease: Option<Lease>,
    /// "Add new devices" requests handled.
    pub add_requests_handled: u32,
    /// When a pass found the failure threshold reached (layout V4).
    pub threshold_reached_at: Option<Timestamp>,
    /// The releases of the last minute, oldest first, while the spec has
    /// `max_releases_per_minute` (layout V4).
    pub recent_releases: Vec<Releases>,
}

impl DeploymentStatus {
    pub fn planning() -> Self {
        Self {
            phase: crate::records::Phase::Planning,
            reason: None,
            targets: 0,
            excluded: 0,
            counts: Counts::default(),
            start_time: None,
            completion_time: None,
            latest_error: None,
            next_retry_at: None,
            lease: None,
            add_requests_handled: 0,
            threshold_reached_at: None,
            recent_releases: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    pub holder: String,
    pub until: Timestamp,
}

/// One target as stored (`targets/<deployment uid>/<device>`). Written when
/// the target is materialised and at every change of its attempt; what its
/// current job is doing is read from the job's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetRecord {
    pub device: DeviceId,
    /// The device's site time zone when it became a target (shown; each
    /// pass judges the window in the device's zone as stored then, see
    /// [`TargetInput::time_zone`]); None: the window's own.
    pub time_zone: Option<String>,
    /// Attempts released so far.
    pub attempt: u32,
    /// The current attempt's job, while it is undecided.
    pub job: Option<JobId>,
    pub released_at: Option<Timestamp>,
    /// When the control plane first saw the current attempt running (its
    /// clock, A12): the running timeout counts from here.
    pub running_since: Option<Timestamp>,
    /// A failed attempt waits for this before the next one.
    pub next_attempt_at: Option<Timestamp>,
    pub end: Option<TargetEnd>,
    /// The latest attempt's error, bounded.
    pub last_error: Option<String>,
}

impl TargetRecord {
    pub fn new(device: DeviceId, time_zone: Option<String>) -> Self {
        Self {
            device,
            time_zone,
            attempt: 0,
            job: None,
            released_at: None,
            running_since: None,
            next_attempt_at: None,
            end: None,
            last_error: None,
        }
    }
}

/// How a target ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TargetEnd {
    Succeeded {
        at: Timestamp,
    },
    Failed {
        at: Timestamp,
    },
    Expired {
        at: Timestamp,
    },
    /// An operator canceled the deployment before this target's job started.
    /// (Appended: stored targets decode unchanged.)
    Canceled {
        at: Timestamp,
    },
}

/// What the current attempt's job is doing, as its record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// Released, not started: on its way, or waiting on the device. `acked`
    /// is when the device acknowledged it (the control plane's clock), if
    /// it has.
    Queued {
        acked: Option<Timestamp>,
    },
    Running,
    /// Received by the control plane at `at` (with its completion heartbeat).
    Succeeded {
        at: Timestamp,
    },
    Failed {
        at: Timestamp,
        error: String,
    },
    /// The device canceled it on the control plane's order, before it
    /// started.
    Canceled {
        at: Timestamp,
    },
}

/// A target as one pass sees it.
#[derive(Debug, Clone)]
pub struct TargetInput<'a> {
    pub record: &'a TargetRecord,
    /// The current attempt's job; None when no attempt is out.
    pub job: Option<Observed>,
    pub online: bool,
    /// The device's site time zone now (read at every pass, the seed's
    /// coalesce(site tz, default)); None or unknown: the window's own.
    pub time_zone: Option<&'a str>,
    /// For a job the device acknowledged but has not started: when its
    /// timeout's clock started, the later of its acknowledgement and the
    /// end of the last earlier job on the device (the agent runs one job
    /// at a time). None while an earlier job there is unfinished, or when
    /// it could not be due yet (the engine only looks once the
    /// acknowledgement is a timeout old).
    pub waiting_since: Option<Timestamp>,
}

/// Targets by state, recomputed from the targets at every pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    pub pending: u32,
    /// Of the pending: waiting for a retry's backoff.
    pub waiting_retry: u32,
    pub queued: u32,
    pub running: u32,
    pub succeeded: u32,
    pub failed: u32,
    pub expired: u32,
    /// Ended by an operator's cancel: never released, or canceled on the
    /// device before it started.
    pub canceled: u32,
}

impl Counts {
    pub fn total(&self) -> u32 {
        self.pending
            + self.queued
            + self.running
            + self.succeeded
            + self.failed
            + self.expired
            + self.canceled
    }
}

/// What one pass decided.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    /// Targets whose record changes, by index, with the new record.
    pub changes: Vec<(usize, TargetRecord)>,
    /// Of the changes: the targets released now (a new attempt).
    pub released: Vec<usize>,
    pub counts: Counts,
    /// Every target has ended.
    pub finished: bool,
    /// The earliest moment a waiting retry becomes due.
    pub next_retry_at: Option<Timestamp>,
    /// `<device>: <error>` of a target that failed an attempt in this pass.
    pub latest_error: Option<String>,
    /// The targets whose job is out and must be asked to cancel: of a
    /// canceled deployment, and the queued ones of an expired deployment.
    pub cancel: Vec<usize>,
    /// This pass found the failure threshold reached: it released nothing
    /// and stopped the rollout as a cancel does.
    pub threshold_reached: bool,
    /// The release batches to keep (the last minute's and this pass's),
    /// when this pass released under `max_releases_per_minute`.
    pub recent_releases: Option<Vec<Releases>>,
    /// Pending targets wait for the release rate until then.
    pub next_release_at: Option<Timestamp>,
}

/// The deployment's own facts a pass needs.
#[derive(Debug, Clone)]
pub struct Facts<'a> {
    pub spec: &'a DeploymentSpec,
    pub uid: JobId,
    pub started: Timestamp,
    /// An operator canceled it, or its failure threshold was reached:
    /// nothing more is released or retried.
    pub canceling: bool,
    /// The releases of the last minute (see [`Releases`]).
    pub recent_releases: &'a [Releases],
}

impl Facts<'_> {
    pub fn deadline(&self) -> Timestamp {
        let seconds = i64::try_from(self.spec.deadline_seconds).unwrap_or(i64::MAX / 2);
        self.started
            .checked_add(SignedDuration::from_secs(seconds))
            .unwrap_or(Timestamp::MAX)
    }
}

/// The wait before the attempt after `attempt` (1-based) failed.
pub fn backoff(spec: &DeploymentSpec, attempt: u32) -> SignedDuration {
    let base = i64::try_from(spec.retry_backoff_seconds).unwrap_or(i64::MAX);
    let factor = 1i64 << attempt.saturating_sub(1).min(40);
    base.checked_mul(factor)
        .map(SignedDuration::from_secs)
        .unwrap_or(MAX_BACKOFF)
        .min(MAX_BACKOFF)
}

/// The job id of `device`'s attempt `attempt` in deployment `uid`: derived,
/// so two replicas that release the same attempt create the same job (the
/// store's create-only write keeps one).
pub fn attempt_job_id(uid: JobId, device: &DeviceId, attempt: u32) -> JobId {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    context.update(b"drover deployment attempt\0");
    context.update(uid.as_bytes());
    context.update(device.as_str().as_bytes());
    context.update(b"\0");
    context.update(&attempt.to_be_bytes());
    let digest = context.finish();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest.as_ref()[..16]);
    // RFC 9562 UUIDv8 (custom): version and variant bits.
    bytes[6] = (bytes[6] & 0x0f) | 0x80;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    JobId::from_bytes(bytes)
}

#[cfg(test)]
mod tests;
