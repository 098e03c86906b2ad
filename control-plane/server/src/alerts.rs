//! What needs an operator's eye, as the dashboard's alerts page and
//! `GET /api/v1/alerts` list it: a failed canary, a run past its deadline,
//! a deployment that failed, devices offline longer than the configured
//! time, and devices stuck in a resume loop (a job failed because the agent
//! kept stopping while it ran, A10). Most are read off the runs,
//! deployments and devices as stored; the resume loop is recorded by the
//! delivery core when that status arrives (`alerts/<device>/<job>`, created
//! once), since finding it later would mean reading every job.

use crate::db::{Db, DbError};
use crate::deployment::DeploymentRecord;
pub use crate::records::{AlertRecord, resume_loop};
use crate::records::{DeviceRecord, Phase, TaskRunRecord};
use jiff::{SignedDuration, Timestamp};
use serde::Serialize;

/// One alert as the API lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Alert {
    /// `critical` or `warning`.
    pub severity: &'static str,
    /// CanaryFailed, DeadlineExceeded, DeploymentFailed, DeviceOffline,
    /// ResumeLoop.
    pub kind: &'static str,
    /// What it is about: `taskrun/NAME`, `deployment/NAME`, `device/ID`.
    pub resource: String,
    pub message: String,
    pub at: Option<Timestamp>,
}

/// Devices listed one by one among the offline ones; the rest are counted.
pub const OFFLINE_LISTED: usize = 100;
/// How long a resume-loop or a finished run's alert stays listed.
pub const KEPT: SignedDuration = SignedDuration::from_hours(7 * 24);

/// Every alert now, newest first. `online` says whether a device is online
/// (this replica's presence, else its stored last-seen time).
pub async fn list(
    db: &Db,
    now: Timestamp,
    offline_after: SignedDuration,
    online: &(dyn Fn(&DeviceRecord) -> bool + Sync),
) -> Result<(Vec<Alert>, usize), DbError> {
    let recent = |at: Option<Timestamp>| at.is_none_or(|at| now.duration_since(at) < KEPT);
    let mut alerts = Vec::new();
    for (_, _, run) in db.list::<TaskRunRecord>("runs/").await? {
        let (severity, kind) = match run.status.reason.as_deref() {
            Some("CanaryFailed") => ("critical", "CanaryFailed"),
            Some("DeadlineExceeded") => ("warning", "DeadlineExceeded"),
            _ => continue,
        };
        if run.status.phase != Phase::Failed || !recent(run.status.completion_time) {
            continue;
        }
        alerts.push(Alert {
            severity,
            kind,
            resource: format!("taskrun/{}", run.name),
            message: run.status.latest_error.clone().unwrap_or_default(),
            at: run.status.completion_time,
        });
    }
    for (_, _, deployment) in db.list::<DeploymentRecord>("deployments/").await? {
        let status = &deployment.status;
        let failed = status.phase == Phase::Failed
            && matches!(status.reason.as_deref(), Some("TargetsFailed" | "Expired"));
        if failed && recent(status.completion_time) {
            alerts.push(Alert {
                severity: "warning",
                kind: "DeploymentFailed",
                resource: format!("deployment/{}", deployment.name),
                message: format!(
                    "{}: {}",
                    status.reason.as_deref().unwrap_or(""),
                    status.latest_error.as_deref().unwrap_or("")
                ),
                at: status.completion_time,
            });
        }
    }
    let mut offline = Vec::new();
    for (_, _, device) in db.list::<DeviceRecord>("devices/").await? {
        if device.decommissioned || !device.agent_present || online(&device) {
            continue;
        }
        let seen = device.last_seen.max(device.last_heartbeat);
        if seen.is_none_or(|seen| now.duration_since(seen) >= offline_after) {
            offline.push((seen, device.id));
        }
    }
    // The longest offline first.
    offline.sort();
    let offline_count = offline.len();
    for (seen, device) in offline.into_iter().take(OFFLINE_LISTED) {
        alerts.push(Alert {
            severity: "warning",
            kind: "DeviceOffline",
            resource: format!("device/{device}"),
            message: match seen {
                Some(seen) => format!("offline since {seen}"),
                None => "never heard from".into(),
            },
            at: seen,
        });
    }
    for (_, _, alert) in db.list::<AlertRecord>("alerts/").await? {
        if !recent(Some(alert.at)) {
            continue;
        }
        alerts.push(Alert {
            severity: "critical",
            kind: "ResumeLoop",
            resource: format!("device/{}", alert.device),
            message: format!(
                "{}: {}",
                alert.run.as_deref().unwrap_or("a job"),
                alert.message
            ),
            at: Some(alert.at),
        });
    }
    alerts.sort_by_key(|a| std::cmp::Reverse(a.at));
    Ok((alerts, offline_count))
}
