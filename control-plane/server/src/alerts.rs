//! What needs an operator's eye, as the dashboard's alerts page and
//! `GET /api/v1/alerts` list it: a failed canary, a run past its deadline,
//! a deployment that failed or stopped at its failure threshold, devices offline longer than the configured
//! time, devices stuck in a resume loop (a job failed because the agent
//! kept stopping while it ran, A10), and devices whose patch status needs
//! attention (a security update waiting, a reboot pending, no recent
//! assessment: `drover_rules::patch::alerts`). Any alert can be
//! acknowledged: it is listed as such while its condition lasts. Most are read off the runs,
//! deployments and devices as stored; the resume loop is recorded by the
//! delivery core when that status arrives (`alerts/<device>/<job>`, created
//! once), since finding it later would mean reading every job.

use drover_model::DeviceId;
use drover_rules::deployment::DeploymentRecord;
use drover_rules::records::AlertRecord;
use drover_rules::records::{Phase, TaskRunRecord};
use drover_store::db::{Db, DbError};
use jiff::{SignedDuration, Timestamp};

use drover_api::fleet::{Acknowledged, Alert, Severity};

/// Devices listed one by one among the offline ones; the rest are counted.
pub const OFFLINE_LISTED: usize = 100;
/// How long a resume-loop or a finished run's alert stays listed.
pub const KEPT: SignedDuration = SignedDuration::from_hours(7 * 24);

/// Every alert now, newest first. `online` says whether a device is online
/// (this replica's presence, else its stored last-seen time).
pub async fn list(
    db: &Db,
    fleet: &crate::patch_index::Snapshot,
    now: Timestamp,
    offline_after: SignedDuration,
    patch_limits: &drover_rules::patch::AlertLimits,
    online: &(dyn Fn(&DeviceId, Option<Timestamp>) -> bool + Sync),
) -> Result<(Vec<Alert>, usize), DbError> {
    let recent = |at: Option<Timestamp>| at.is_none_or(|at| now.duration_since(at) < KEPT);
    let mut alerts = ended_alerts(db, &recent).await?;
    let mut offline = Vec::new();
    for (id, device) in &fleet.devices {
        if device.decommissioned || !device.agent_present {
            continue;
        }
        for patch in drover_rules::patch::alerts(
            fleet.assessments.get(id).map(|a| a.as_ref()),
            device.first_connected,
            now,
            patch_limits,
        ) {
            alerts.push(Alert {
                severity: if patch.kind == "SecurityUpdatesWaiting" {
                    Severity::Critical
                } else {
                    Severity::Warning
                },
                kind: patch.kind.into(),
                resource: format!("device/{id}"),
                message: patch.message,
                at: Some(patch.since),
                acknowledged: None,
            });
        }
        if online(id, device.last_seen) {
            continue;
        }
        let seen = device.last_seen.max(device.last_heartbeat);
        if seen.is_none_or(|seen| now.duration_since(seen) >= offline_after) {
            offline.push((seen, id.clone()));
        }
    }
    // The longest offline first.
    offline.sort();
    let offline_count = offline.len();
    for (seen, device) in offline.into_iter().take(OFFLINE_LISTED) {
        alerts.push(Alert {
            severity: Severity::Warning,
            kind: "DeviceOffline".into(),
            resource: format!("device/{device}"),
            message: match seen {
                Some(seen) => format!("offline since {seen}"),
                None => "never heard from".into(),
            },
            at: seen,
            acknowledged: None,
        });
    }
    for (_, _, alert) in db.list::<AlertRecord>("alerts/").await? {
        if !recent(Some(alert.at)) {
            continue;
        }
        alerts.push(Alert {
            severity: Severity::Critical,
            kind: "ResumeLoop".into(),
            resource: format!("device/{}", alert.device),
            message: format!(
                "{}: {}",
                alert.run.as_deref().unwrap_or("a job"),
                alert.message
            ),
            at: Some(alert.at),
            acknowledged: None,
        });
    }
    // An acknowledgement holds for the alert whose condition began when it
    // was given; a condition that cleared and returned is an alert again.
    let acks: std::collections::HashMap<(String, String), drover_rules::records::AlertAck> = db
        .list::<drover_rules::records::AlertAck>("acks/")
        .await?
        .into_iter()
        .map(|(_, _, ack)| ((ack.kind.clone(), ack.resource.clone()), ack))
        .collect();
    for alert in &mut alerts {
        if let Some(ack) = acks.get(&(alert.kind.clone(), alert.resource.clone()))
            && ack.instance == alert.at
        {
            alert.acknowledged = Some(Acknowledged {
                by: ack.by.clone(),
                at: ack.at,
            });
        }
    }
    // Newest first; alerts of one moment in the order of what they are about.
    alerts.sort_by(|a, b| {
        b.at.cmp(&a.at)
            .then_with(|| a.resource.cmp(&b.resource))
            .then_with(|| a.kind.cmp(&b.kind))
    });
    Ok((alerts, offline_count))
}

/// The alerts of runs and deployments: a failed canary or a run past its
/// deadline, a deployment that failed or stopped at its failure threshold
/// (`recent` says whether an end is recent enough to show).
async fn ended_alerts(
    db: &Db,
    recent: &impl Fn(Option<Timestamp>) -> bool,
) -> Result<Vec<Alert>, DbError> {
    let mut alerts = Vec::new();
    for (_, _, run) in db.list::<TaskRunRecord>("runs/").await? {
        let (severity, kind) = match run.status.reason.as_deref() {
            Some("CanaryFailed") => (Severity::Critical, "CanaryFailed"),
            Some("DeadlineExceeded") => (Severity::Warning, "DeadlineExceeded"),
            _ => continue,
        };
        if run.status.phase != Phase::Failed || !recent(run.status.completion_time) {
            continue;
        }
        alerts.push(Alert {
            severity,
            kind: kind.into(),
            resource: format!("taskrun/{}", run.name),
            message: run.status.latest_error.clone().unwrap_or_default(),
            at: run.status.completion_time,
            acknowledged: None,
        });
    }
    for (_, _, deployment) in db.list::<DeploymentRecord>("deployments/").await? {
        let status = &deployment.status;
        // Raised the moment the rollout stops, while its last jobs finish.
        if status.threshold_reached_at.is_some()
            && (!status.phase.is_terminal() || recent(status.completion_time))
        {
            alerts.push(Alert {
                severity: Severity::Critical,
                kind: "FailureThresholdReached".into(),
                resource: format!("deployment/{}", deployment.name),
                message: status.latest_error.clone().unwrap_or_default(),
                at: status.threshold_reached_at,
                acknowledged: None,
            });
            continue;
        }
        let failed = status.phase == Phase::Failed
            && matches!(status.reason.as_deref(), Some("TargetsFailed" | "Expired"));
        if failed && recent(status.completion_time) {
            alerts.push(Alert {
                severity: Severity::Warning,
                kind: "DeploymentFailed".into(),
                resource: format!("deployment/{}", deployment.name),
                message: format!(
                    "{}: {}",
                    status.reason.as_deref().unwrap_or(""),
                    status.latest_error.as_deref().unwrap_or("")
                ),
                at: status.completion_time,
                acknowledged: None,
            });
        }
    }
    Ok(alerts)
}
