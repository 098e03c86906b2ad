//! Job kinds on the control plane's side, in one place (issue 29): each
//! kind is a module here and one line in [`KINDS`]. A kind says how a
//! Deployment's manifest writes it (its `spec.<name>` section, parsed
//! strictly and rendered back), what `apply` checks and fills in before
//! the deployment is stored (a package's checksum from the store), what
//! the delivery core attaches as a job goes out (a fresh download link,
//! sealed secrets), and what its stored reports write beside the job (an
//! inventory's package list goes to the device's inventory record). What
//! every kind's report does (the resume-loop alert, A10) is here too. The
//! manifest parser, `apply` and the delivery core ask this module; none
//! of them knows a kind by name.
//!
//! The agent's side has its own registry: the chains `drover-agent` is
//! built with (agent/src/main.rs), each advertising its kind as its
//! capability.

mod assessment;
mod inventory;
mod package;
mod upgrade;

use crate::http::ApiError;
use crate::secrets::Enricher;
use drover_model::{DeviceId, Intent, JobStatus};
use drover_rules::deployment::{DeploymentJob, DeviceInventory};
use drover_rules::records::{AlertRecord, JobDelivery};
use drover_store::db::Db;
use jiff::Timestamp;
use std::future::Future;
use std::pin::Pin;

/// A kind's asynchronous step (apply's checks, the enricher).
pub type Step<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What `apply` gives a kind to check a deployment's job against.
pub struct Apply<'a> {
    pub db: &'a Db,
    /// Whether this control plane serves package downloads.
    pub downloads: bool,
    /// Secrets an earlier manifest of the same dry run would create: they
    /// count as there, as they would be when the List is applied in order.
    /// Empty when applying (each is stored before the next manifest).
    pub secrets_before: &'a [String],
}

/// A stored report of a job, as its kind's handler sees it.
pub struct Report<'a> {
    pub device: &'a DeviceId,
    pub job: &'a JobDelivery,
    /// The status about to be stored: a handler may take parts of its
    /// output to keep elsewhere.
    pub status: &'a mut JobStatus,
    /// The control plane's time the report counts from.
    pub at: Timestamp,
}

/// A record a report writes beside the job, in the same commit.
#[derive(Debug, Clone, PartialEq)]
pub enum ReportWrite {
    /// The device's installed packages (`inventory/<device>`).
    Inventory(DeviceInventory),
    /// An alert, created once (`alerts/<device>/<job>`).
    Alert(String, AlertRecord),
    /// The report's patch assessment becomes the device's latest
    /// (`assessments/<device>`), unless a newer one is kept.
    Assessment,
}

/// One job kind's handling on the control plane.
pub trait Kind: Sync {
    /// The wire name, which is also the capability agents advertise.
    fn name(&self) -> &'static str;

    /// How a manifest writes this kind's section, for error messages.
    fn example(&self) -> &'static str {
        "{}"
    }

    /// A Deployment's `spec.<name>` section, parsed strictly; what is
    /// wrong goes to `problems` (each naming its field).
    fn deployment_job(
        &self,
        section: serde_json::Value,
        problems: &mut Vec<String>,
    ) -> DeploymentJob;

    /// The section as `drover get deployment -o yaml` shows it.
    fn render_deployment_job(&self, _job: &DeploymentJob) -> serde_json::Value {
        serde_json::json!({})
    }

    /// Checks a deployment's job at `apply` and fills in what the
    /// manifest leaves to the store, before the deployment is stored.
    fn resolve<'a>(
        &'a self,
        _apply: Apply<'a>,
        _job: &'a mut DeploymentJob,
    ) -> Step<'a, Result<(), ApiError>> {
        Box::pin(async { Ok(()) })
    }

    /// Whether the agent may run this kind on its own (a local job the
    /// control plane never sent) and its finished report is still kept:
    /// the delivery core confirms such a job's statuses instead of
    /// refusing them, and keeps the finished one as the device's latest
    /// assessment (`patchAssessmentV1`, the only such kind so far).
    fn keeps_local_reports(&self) -> bool {
        false
    }

    /// Attaches what the job needs as it goes out (never stored). An error
    /// says what could not be attached; the job goes out without it, and
    /// the device fails it saying so.
    fn enrich<'a>(
        &'a self,
        _enricher: &'a Enricher,
        _intent: &'a mut Intent,
        _now: Timestamp,
    ) -> Step<'a, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }

    /// What a stored report of this kind writes beside the job.
    fn on_report(&self, _report: &mut Report<'_>) -> Vec<ReportWrite> {
        Vec::new()
    }
}

/// Every kind this control plane knows. A new kind: its module, and a
/// line here.
pub static KINDS: &[&dyn Kind] = &[
    &upgrade::SystemUpgrade,
    &inventory::InventoryRefresh,
    &package::PackageInstall,
    &assessment::PatchAssessment,
];

/// The kind called `name`, if this control plane knows it.
pub fn kind(name: &str) -> Option<&'static dyn Kind> {
    KINDS.iter().copied().find(|k| k.name() == name)
}

/// A kind whose section is `{}`: parsed as [`drover_model::model::Empty`], so
/// a peer cannot smuggle options into it.
pub(crate) fn empty_section(name: &str, section: serde_json::Value, problems: &mut Vec<String>) {
    if let Err(e) = serde_json::from_value::<drover_model::model::Empty>(section) {
        problems.push(format!("spec.{name}: {e}"));
    }
}

/// The job sections a manifest may name, for "exactly one job" errors.
pub fn examples() -> String {
    let named: Vec<String> = KINDS
        .iter()
        .map(|k| format!("{}: {}", k.name(), k.example()))
        .collect();
    match named.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// The job's kind's attachments as it goes out.
pub async fn enrich(
    enricher: &Enricher,
    intent: &mut Intent,
    now: Timestamp,
) -> Result<(), String> {
    match kind(intent.kind.name()) {
        Some(kind) => kind.enrich(enricher, intent, now).await,
        None => Ok(()),
    }
}

/// What a stored report writes beside its job: its kind's writes, then
/// what every kind's report does.
pub fn on_report(report: &mut Report<'_>) -> Vec<ReportWrite> {
    let mut writes = match kind(report.job.intent.kind.name()) {
        Some(kind) => kind.on_report(report),
        None => Vec::new(),
    };
    // A job failed because the agent kept stopping while it ran (A10).
    if report.status.state == drover_model::JobState::Failed
        && report.status.failure() == Some(drover_model::failure::Failure::ResumeLoop)
    {
        let error = report.status.error.as_deref().unwrap_or_default();
        let (key, alert) =
            drover_rules::records::resume_loop(report.device, report.job, error, report.at);
        writes.push(ReportWrite::Alert(key, alert));
    }
    writes
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_model::model::JobKind;

    #[test]
    fn every_kind_of_the_job_model_is_registered_once_under_its_wire_name() {
        for name in JobKind::NAMES {
            let registered = KINDS.iter().filter(|k| k.name() == name).count();
            assert_eq!(registered, 1, "{name}");
        }
        assert_eq!(
            KINDS.len(),
            JobKind::NAMES.len(),
            "a registered kind the model lacks"
        );
        assert!(kind("unknownV1").is_none());
    }

    #[test]
    fn each_kinds_deployment_section_parses_to_its_own_job_and_renders_back() {
        for kind in KINDS {
            let section = match kind.name() {
                "packageInstallV1" => serde_json::json!({"package": "hello_1.0_all"}),
                _ => serde_json::json!({}),
            };
            let mut problems = Vec::new();
            let job = kind.deployment_job(section.clone(), &mut problems);
            assert!(problems.is_empty(), "{}: {problems:?}", kind.name());
            assert_eq!(job.name(), kind.name());
            assert_eq!(job.kind().name(), kind.name());
            let rendered = kind.render_deployment_job(&job);
            if kind.name() == "packageInstallV1" {
                assert_eq!(rendered["package"], "hello_1.0_all");
            } else {
                assert_eq!(rendered, section);
            }
            let mut problems = Vec::new();
            kind.deployment_job(serde_json::json!({"smuggled": true}), &mut problems);
            assert!(
                problems.iter().any(|p| p.contains("unknown field")),
                "{}: {problems:?}",
                kind.name()
            );
        }
        assert_eq!(
            examples(),
            "systemUpgradeV1: {}, inventoryRefreshV1: {}, packageInstallV1: {package: ID} or patchAssessmentV1: {}"
        );
    }

    fn job(kind: JobKind) -> JobDelivery {
        let at: Timestamp = "2027-01-04T10:00:00Z".parse().expect("time");
        JobDelivery {
            intent: drover_model::Intent {
                job_id: drover_model::JobId::random(),
                device_id: DeviceId::new("k-1").expect("id"),
                kind,
                attempt: 1,
                created_at: at,
                expires_at: at,
                timeout_seconds: 60,
            },
            run: Some("r".into()),
            delivery: drover_rules::records::Delivery::Created,
            status: None,
            created_at: at,
            terminal_received_at: None,
            cancel_requested_at: None,
        }
    }

    fn status(job: &JobDelivery, state: drover_model::JobState) -> JobStatus {
        JobStatus {
            job_id: job.intent.job_id,
            device_id: job.intent.device_id.clone(),
            attempt: 1,
            kind: job.intent.kind.name().into(),
            state,
            steps: Vec::new(),
            error: None,
            output: None,
            accepted_at: job.created_at,
            started_at: None,
            finished_at: None,
            boot_id: "b".into(),
            completion_heartbeat_at: None,
            seq: 1,
            failure: None,
            reason: Vec::new(),
        }
    }

    #[test]
    fn an_inventorys_packages_go_to_the_device_record_and_a_resume_loop_raises_an_alert() {
        use drover_model::JobState;
        use drover_model::model::{InstalledPackage, JobOutput, SoftwareInventory};
        let device = DeviceId::new("k-1").expect("id");
        let at: Timestamp = "2027-01-04T10:05:00Z".parse().expect("time");

        let refresh = job(JobKind::inventory_refresh());
        let mut done = status(&refresh, JobState::Succeeded);
        done.output = Some(JobOutput::Software(SoftwareInventory {
            inventory: Default::default(),
            packages: vec![InstalledPackage {
                name: "openssl".into(),
                version: "3.0.17".into(),
            }],
            omitted: 0,
        }));
        let writes = on_report(&mut Report {
            device: &device,
            job: &refresh,
            status: &mut done,
            at,
        });
        let [ReportWrite::Inventory(inventory)] = writes.as_slice() else {
            panic!("{writes:?}");
        };
        assert_eq!(
            inventory.packages.get("openssl").map(String::as_str),
            Some("3.0.17")
        );
        assert_eq!(inventory.collected_at, at);
        let Some(JobOutput::Software(kept)) = &done.output else {
            panic!("the output stays");
        };
        assert!(
            kept.packages.is_empty(),
            "the list moved to the inventory record"
        );

        let upgrade = job(JobKind::system_upgrade());
        let mut failed = status(&upgrade, JobState::Failed);
        failed.failure = Some(drover_model::failure::Failure::StepFailed);
        assert!(
            on_report(&mut Report {
                device: &device,
                job: &upgrade,
                status: &mut failed,
                at
            })
            .is_empty(),
            "a failed step raises no alert"
        );
        // The loop as this agent says it (the fact), and as an agent older
        // than the fact said it (the text of its error).
        let mut typed = status(&upgrade, JobState::Failed);
        typed.failure = Some(drover_model::failure::Failure::ResumeLoop);
        typed.error = Some("picked up again 4 times; giving up".into());
        let mut older = status(&upgrade, JobState::Failed);
        older.error = Some(format!(
            "the agent stopped: {}",
            drover_model::failure::RESUME_LOOP_TEXT
        ));
        for mut looping in [typed, older] {
            let writes = on_report(&mut Report {
                device: &device,
                job: &upgrade,
                status: &mut looping,
                at,
            });
            assert!(
                matches!(writes.as_slice(), [ReportWrite::Alert(key, _)] if key.starts_with("alerts/k-1/")),
                "{looping:?}: {writes:?}"
            );
        }
    }
}
