//! A device's history: each decided job kept after the run, deployment or
//! schedule that made it is deleted, with a retention of its own (a count
//! per device and an age), so a device upgraded last week never reads as
//! never upgraded because its run was cleaned away.
//!
//! A history record is a summary in plain fields (names, times, lines),
//! not the job record: its layout stays frozen while the wire's types
//! change. Only a device's newest succeeded upgrade keeps its report (the
//! packages it changed), so a device's history stays small.

use crate::records::JobDelivery;
use crate::state::JobPhase;
use drover_model::model::{JobKind, JobOutput, PackageChange, UpgradeOutput};
use drover_model::{DeviceId, JobId};
use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

pub const HISTORY_PREFIX: &str = "history/";

pub fn history_key(device: &DeviceId, job: JobId) -> String {
    format!("{HISTORY_PREFIX}{device}/{job}")
}

pub fn device_history_prefix(device: &DeviceId) -> String {
    format!("{HISTORY_PREFIX}{device}/")
}

/// The device a history key names (`history/DEVICE/JOB`).
pub fn device_of_key(key: &str) -> Option<&str> {
    key.strip_prefix(HISTORY_PREFIX)?.split('/').next()
}

/// One decided job of a device, as its history keeps it. Created when
/// the job's record is deleted; changed only to drop its report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryRecord {
    pub job: JobId,
    /// The job kind's name (`systemUpgradeV1`, …).
    pub kind: String,
    /// The run that made it: a task run's name or `deployment/NAME`.
    pub run: Option<String>,
    /// Its decided state, as [`JobPhase::name`] says it.
    pub state: String,
    pub created_at: Timestamp,
    pub finished_at: Option<Timestamp>,
    pub error: Option<String>,
    /// A failed job's reason lines, as its status carried them.
    pub reason: Vec<String>,
    /// What it did, in one line (`outcome::result_line`).
    pub result_text: Option<String>,
    /// An upgrade's report; kept only on the device's newest succeeded
    /// upgrade.
    pub upgrade: Option<HistoryUpgrade>,
    /// When the job's record was deleted and this was kept.
    pub archived_at: Timestamp,
}

/// What an upgrade changed, as [`UpgradeOutput`] says it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryUpgrade {
    pub simulated: bool,
    pub upgraded: Vec<HistoryChange>,
    pub installed: Vec<HistoryChange>,
    pub removed: Vec<String>,
    pub kept_back: Vec<String>,
    pub omitted: u32,
    pub reboot_required: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryChange {
    pub name: String,
    pub from: Option<String>,
    pub to: String,
}

impl HistoryRecord {
    /// When it ended (when it was made, for one whose end is unknown): the
    /// order a history is read in.
    pub fn ended_at(&self) -> Timestamp {
        self.finished_at.unwrap_or(self.created_at)
    }

    pub fn phase(&self) -> Option<JobPhase> {
        JobPhase::from_name(&self.state)
    }

    /// A system upgrade that succeeded.
    pub fn is_succeeded_upgrade(&self) -> bool {
        self.kind == UPGRADE_KIND && self.phase() == Some(JobPhase::Succeeded)
    }

    /// The report as the wire's type.
    pub fn upgrade_output(&self) -> Option<UpgradeOutput> {
        let u = self.upgrade.as_ref()?;
        let changes = |c: &[HistoryChange]| {
            c.iter()
                .map(|c| PackageChange {
                    name: c.name.clone(),
                    from: c.from.clone(),
                    to: c.to.clone(),
                })
                .collect()
        };
        Some(UpgradeOutput {
            simulated: u.simulated,
            upgraded: changes(&u.upgraded),
            installed: changes(&u.installed),
            removed: u.removed.clone(),
            kept_back: u.kept_back.clone(),
            omitted: u.omitted,
            reboot_required: u.reboot_required,
        })
    }
}

const UPGRADE_KIND: &str = "systemUpgradeV1";

/// What a device's history keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// The newest this many records per device.
    pub per_device: usize,
    /// None older than this (by when the job ended).
    pub max_age: SignedDuration,
}

/// The jobs a device's history keeps by default: a year of weekly
/// upgrades, with room for the installs and assessments between them.
pub const JOBS_PER_DEVICE: u32 = 100;
/// The days a device's history keeps a job by default: as long as the
/// audit log keeps its entries.
pub const DAYS: u32 = 400;

impl Default for Retention {
    fn default() -> Self {
        Self {
            per_device: JOBS_PER_DEVICE as usize,
            max_age: SignedDuration::from_hours(i64::from(DAYS) * 24),
        }
    }
}

/// The history record of `job`, archived at `now`; None for a job not
/// decided (nothing happened on the device that a history should keep).
pub fn record_of(job: &JobDelivery, now: Timestamp) -> Option<HistoryRecord> {
    let phase = JobPhase::of_job(job);
    if !phase.is_final() {
        return None;
    }
    let status = job.status.as_ref();
    let expired_at = match job.delivery {
        crate::records::Delivery::Expired { at } => Some(at),
        _ => None,
    };
    let output = status.and_then(|s| s.output.as_ref());
    let upgrade = match output {
        Some(JobOutput::Upgrade(u)) if phase == JobPhase::Succeeded => Some(upgrade_of(u)),
        _ => None,
    };
    Some(HistoryRecord {
        job: job.intent.job_id,
        kind: job.intent.kind.name().to_owned(),
        run: job.run.clone(),
        state: phase.name().to_owned(),
        created_at: job.created_at,
        finished_at: status
            .and_then(|s| s.finished_at)
            .or(job.terminal_received_at)
            .or(expired_at),
        error: status.and_then(|s| s.error.clone()),
        reason: status.map(|s| s.reason.clone()).unwrap_or_default(),
        result_text: crate::outcome::result_line(output),
        upgrade: matches!(job.intent.kind, JobKind::SystemUpgradeV1(_))
            .then_some(upgrade)
            .flatten(),
        archived_at: now,
    })
}

fn upgrade_of(u: &UpgradeOutput) -> HistoryUpgrade {
    let changes = |c: &[PackageChange]| {
        c.iter()
            .map(|c| HistoryChange {
                name: c.name.clone(),
                from: c.from.clone(),
                to: c.to.clone(),
            })
            .collect()
    };
    HistoryUpgrade {
        simulated: u.simulated,
        upgraded: changes(&u.upgraded),
        installed: changes(&u.installed),
        removed: u.removed.clone(),
        kept_back: u.kept_back.clone(),
        omitted: u.omitted,
        reboot_required: u.reboot_required,
    }
}

/// What retention does to one device's history.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Trim {
    /// Past the count or the age.
    pub delete: Vec<JobId>,
    /// Kept, but their upgrade report goes: every report but the one of
    /// the newest succeeded upgrade.
    pub drop_report: Vec<JobId>,
}

impl Trim {
    pub fn is_empty(&self) -> bool {
        self.delete.is_empty() && self.drop_report.is_empty()
    }
}

/// What `retention` deletes from one device's `history` at `now`, and
/// which reports go.
pub fn trim(history: &[HistoryRecord], retention: Retention, now: Timestamp) -> Trim {
    let oldest = now.checked_sub(retention.max_age).unwrap_or(Timestamp::MIN);
    let mut newest_first: Vec<&HistoryRecord> = history.iter().collect();
    newest_first.sort_by(|a, b| b.ended_at().cmp(&a.ended_at()).then(b.job.cmp(&a.job)));
    let mut out = Trim::default();
    let mut report_kept = false;
    for (i, record) in newest_first.into_iter().enumerate() {
        if i >= retention.per_device || record.ended_at() < oldest {
            out.delete.push(record.job);
            continue;
        }
        if record.is_succeeded_upgrade() && !report_kept {
            report_kept = true;
        } else if record.upgrade.is_some() {
            out.drop_report.push(record.job);
        }
    }
    out
}

#[cfg(test)]
mod tests;
