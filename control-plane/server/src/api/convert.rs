//! The records and wire types as the API shows them (`drover-api`): one
//! function per type, field by field, so a field renamed on either side
//! fails to compile here instead of changing an answer unnoticed.

use drover_api::{deployments, devices, jobs, runs};
use drover_model::model;
use drover_rules::patch::{DeviceAssessment, FleetPatchStatus};
use drover_rules::records::DeviceRecord;

pub(super) fn job_state(state: model::JobState) -> jobs::JobState {
    use model::JobState as S;
    match state {
        S::Accepted => jobs::JobState::Accepted,
        S::Waiting => jobs::JobState::Waiting,
        S::Running => jobs::JobState::Running,
        S::AwaitingReboot => jobs::JobState::AwaitingReboot,
        S::Succeeded => jobs::JobState::Succeeded,
        S::Failed => jobs::JobState::Failed,
        S::Expired => jobs::JobState::Expired,
        S::Rejected => jobs::JobState::Rejected,
        S::Canceled => jobs::JobState::Canceled,
    }
}

fn step_state(state: model::StepState) -> jobs::StepState {
    use model::StepState as S;
    match state {
        S::Pending => jobs::StepState::Pending,
        S::Running => jobs::StepState::Running,
        S::Done => jobs::StepState::Done,
        S::Failed => jobs::StepState::Failed,
    }
}

fn failure(failure: drover_model::failure::Failure) -> jobs::Failure {
    use drover_model::failure::Failure as F;
    match failure {
        F::StepFailed => jobs::Failure::StepFailed,
        F::ResumeLoop => jobs::Failure::ResumeLoop,
        F::SignatureRefused => jobs::Failure::SignatureRefused,
        F::Malformed => jobs::Failure::Malformed,
        F::UnknownKind => jobs::Failure::UnknownKind,
        F::QueueFull => jobs::Failure::QueueFull,
        F::OtherDevice => jobs::Failure::OtherDevice,
        F::Other => jobs::Failure::Other,
    }
}

/// Why a target waits, as the API serves it: the rules' code, sentence
/// and end.
pub(super) fn wait(wait: &drover_rules::deployment::Wait) -> drover_api::jobs::TargetWait {
    drover_api::jobs::TargetWait {
        code: wait.code().to_owned(),
        text: wait.text(),
        until: wait.until(),
    }
}

pub(super) fn job_status(status: &model::JobStatus) -> jobs::JobStatus {
    jobs::JobStatus {
        job_id: status.job_id.to_string(),
        device_id: status.device_id.to_string(),
        attempt: status.attempt,
        kind: status.kind.clone(),
        state: job_state(status.state),
        steps: status
            .steps
            .iter()
            .map(|step| jobs::Step {
                name: step.name.clone(),
                state: step_state(step.state),
                started_at: step.started_at,
                seconds: step.seconds,
                tries: step.tries,
                error: step.error.clone(),
            })
            .collect(),
        error: status.error.clone(),
        output: status.output.as_ref().map(job_output),
        accepted_at: status.accepted_at,
        started_at: status.started_at,
        finished_at: status.finished_at,
        boot_id: status.boot_id.clone(),
        completion_heartbeat_at: status.completion_heartbeat_at,
        seq: status.seq,
        failure: status.failure().map(failure),
        reason: status.reason.clone(),
    }
}

fn inventory(inventory: &model::Inventory) -> jobs::Inventory {
    jobs::Inventory {
        os_release: inventory.os_release.clone(),
        architecture: inventory.architecture.clone(),
        kernel: inventory.kernel.clone(),
        uptime_seconds: inventory.uptime_seconds,
        memory_total_bytes: inventory.memory_total_bytes,
        memory_available_bytes: inventory.memory_available_bytes,
        disks: inventory
            .disks
            .iter()
            .map(|d| jobs::DiskUsage {
                mount_point: d.mount_point.clone(),
                total_bytes: d.total_bytes,
                available_bytes: d.available_bytes,
            })
            .collect(),
        installed_packages: inventory.installed_packages,
    }
}

fn changes(changes: &[model::PackageChange]) -> Vec<jobs::PackageChange> {
    changes
        .iter()
        .map(|c| jobs::PackageChange {
            name: c.name.clone(),
            from: c.from.clone(),
            to: c.to.clone(),
        })
        .collect()
}

pub(super) fn job_output(output: &model::JobOutput) -> jobs::JobOutput {
    match output {
        model::JobOutput::Upgrade(u) => jobs::JobOutput::Upgrade(jobs::UpgradeOutput {
            simulated: u.simulated,
            upgraded: changes(&u.upgraded),
            installed: changes(&u.installed),
            removed: u.removed.clone(),
            kept_back: u.kept_back.clone(),
            omitted: u.omitted,
            reboot_required: u.reboot_required,
        }),
        model::JobOutput::Inventory(i) => jobs::JobOutput::Inventory(inventory(i)),
        model::JobOutput::Software(s) => jobs::JobOutput::Software(jobs::SoftwareInventory {
            inventory: inventory(&s.inventory),
            packages: s
                .packages
                .iter()
                .map(|p| jobs::InstalledPackage {
                    name: p.name.clone(),
                    version: p.version.clone(),
                })
                .collect(),
            omitted: s.omitted,
        }),
        model::JobOutput::Assessment(a) => jobs::JobOutput::Assessment(jobs::PatchAssessment {
            upgradable: a.upgradable,
            security: a.security,
            kept_back: a.kept_back,
            security_archive: a.security_archive,
            reboot_pending: a.reboot_pending.clone(),
            running_kernel: a.running_kernel.clone(),
            newest_kernel: a.newest_kernel.clone(),
            pending: a
                .pending
                .iter()
                .map(|p| jobs::PendingPackage {
                    name: p.name.clone(),
                    from: p.from.clone(),
                    to: p.to.clone(),
                    security: p.security,
                })
                .collect(),
            omitted: a.omitted,
        }),
    }
}

/// A device as the registry keeps it, with whether it is `online` and its
/// state; the caller adds what its answer says beside (patch summary, …).
pub(super) fn device(device: &DeviceRecord, online: bool) -> devices::Device {
    devices::Device {
        id: device.id.to_string(),
        groups: device.groups.iter().cloned().collect(),
        labels: device.labels.clone(),
        time_zone: device.time_zone.clone(),
        decommissioned: device.decommissioned,
        agent_present: device.agent_present,
        capabilities: device.capabilities.clone(),
        agent_version: device.agent_version.clone(),
        boot_id: device.boot_id.clone(),
        os_release: device.os_release.clone(),
        architecture: device.architecture.clone(),
        last_heartbeat: device.last_heartbeat,
        last_seen: device.last_seen,
        transport: device.transport.clone(),
        first_connected: device.first_connected,
        online,
        state: device.state(online).to_owned(),
        patch: None,
        maintained_labels: None,
        token_generation: None,
        current_job: None,
    }
}

/// A device's latest assessment in brief.
pub(super) fn patch_summary(a: &DeviceAssessment) -> devices::PatchSummary {
    devices::PatchSummary {
        assessed_at: a.received_at,
        upgradable: a.assessment.upgradable,
        security: a.assessment.security,
        kept_back: a.assessment.kept_back,
        security_archive: a.assessment.security_archive,
        reboot_pending: a.assessment.reboot_pending.clone(),
        running_kernel: a.assessment.running_kernel.clone(),
        newest_kernel: a.assessment.newest_kernel.clone(),
        oldest_security_since: a.oldest_security(),
        summary: drover_rules::outcome::assessment_line(&a.assessment),
    }
}

pub(super) fn patch_status(
    fleet: &FleetPatchStatus,
    stale_after_hours: u64,
) -> devices::PatchStatus {
    devices::PatchStatus {
        devices: fleet.devices,
        up_to_date: fleet.up_to_date,
        with_updates: fleet.with_updates,
        with_security_updates: fleet.with_security_updates,
        security_under_1_day: fleet.security_under_1_day,
        security_1_to_7_days: fleet.security_1_to_7_days,
        security_over_7_days: fleet.security_over_7_days,
        no_security_archive: fleet.no_security_archive,
        reboot_pending: fleet.reboot_pending,
        stale: fleet.stale,
        never_assessed: fleet.never_assessed,
        stale_after_hours,
    }
}

pub(crate) fn phase(phase: drover_rules::records::Phase) -> runs::Phase {
    use drover_rules::records::Phase as P;
    match phase {
        P::Planning => runs::Phase::Planning,
        P::Running => runs::Phase::Running,
        P::Complete => runs::Phase::Complete,
        P::Failed => runs::Phase::Failed,
        P::Canceling => runs::Phase::Canceling,
    }
}

pub(super) fn delivery(delivery: &drover_rules::records::Delivery) -> runs::Delivery {
    use drover_rules::records::Delivery as D;
    match *delivery {
        D::Created => runs::Delivery::Created,
        D::Sent { at } => runs::Delivery::Sent { at },
        D::Acked { at } => runs::Delivery::Acked { at },
        D::Expired { at } => runs::Delivery::Expired { at },
    }
}

/// A reason's code in words (`drover_rules::reasons`), when there are some.
fn reason_text(reason: Option<&str>) -> Option<String> {
    reason
        .and_then(drover_rules::reasons::sentence)
        .map(str::to_owned)
}

/// A run's spec as an operator wrote it.
pub(crate) fn task_run_spec(spec: &drover_rules::records::TaskRunSpec) -> runs::TaskRunSpec {
    runs::TaskRunSpec {
        allowed_groups: spec.allowed_groups.clone(),
        target_selector: runs::TargetSelector {
            match_labels: spec.target_selector.match_labels.clone(),
        },
        deadline_seconds: spec.deadline_seconds,
        system_upgrade_v1: Default::default(),
    }
}

/// A package in the store.
pub(super) fn package(p: &drover_rules::records::PackageRecord) -> drover_api::schedules::Package {
    drover_api::schedules::Package {
        id: p.id.clone(),
        name: p.name.clone(),
        version: p.version.clone(),
        architecture: p.architecture.clone(),
        sha256: p.sha256.clone(),
        size: p.size,
        uploaded_at: p.uploaded_at,
    }
}

/// A run as the API shows it: its manifest, with its status and the
/// reason in words beside its code.
pub(crate) fn task_run(run: &drover_rules::records::TaskRunRecord) -> runs::TaskRun {
    let status = &run.status;
    runs::TaskRun {
        api_version: drover_rules::records::API_VERSION.to_owned(),
        kind: "TaskRun".to_owned(),
        metadata: runs::ObjectMeta {
            name: run.name.clone(),
            uid: Some(run.uid.to_string()),
            creation_timestamp: run.created_at,
            // Kubernetes' word for who made an object: here, the schedule
            // whose history limits will delete the run.
            owner_references: run.owner.as_ref().map(|owner| {
                vec![runs::OwnerReference {
                    kind: "TaskSchedule".to_owned(),
                    name: owner.clone(),
                }]
            }),
        },
        spec: task_run_spec(&run.spec),
        status: runs::TaskRunStatus {
            phase: phase(status.phase),
            reason: status.reason.clone(),
            reason_text: reason_text(status.reason.as_deref()),
            targets: status.targets,
            canaries: status.canaries,
            released: status.released,
            succeeded: status.succeeded,
            failed: status.failed,
            start_time: status.start_time,
            completion_time: status.completion_time,
            latest_error: status.latest_error.clone(),
            plan_chunks: status.plan_chunks,
        },
    }
}

/// A deployment's spec as an operator wrote it (what `apply` takes back).
fn deployment_spec(spec: &drover_rules::deployment::DeploymentSpec) -> deployments::DeploymentSpec {
    use drover_rules::deployment::{FailureLimit, Targeting};
    let targets = match &spec.targets {
        Targeting::All => deployments::Targets {
            all: Some(true),
            devices: None,
            filter: None,
        },
        Targeting::Devices(devices) => deployments::Targets {
            all: None,
            devices: Some(devices.iter().map(ToString::to_string).collect()),
            filter: None,
        },
        Targeting::Filter(filter) => deployments::Targets {
            all: None,
            devices: None,
            filter: Some(deployments::TargetFilter {
                match_labels: filter.match_labels.clone(),
                groups: filter.groups.to_vec(),
                software_present: (!filter.software_present.is_empty())
                    .then(|| crate::manifest::render_software(&filter.software_present)),
                software_absent: (!filter.software_absent.is_empty())
                    .then(|| crate::manifest::render_software(&filter.software_absent)),
            }),
        },
    };
    let job = match crate::kinds::kind(spec.job.name()) {
        Some(kind) => kind.render_deployment_job(&spec.job),
        None => serde_json::json!({}),
    };
    deployments::DeploymentSpec {
        targets,
        max_concurrency: spec.max_concurrency,
        retries: spec.retries,
        retry_backoff_seconds: spec.retry_backoff_seconds,
        deadline_seconds: spec.deadline_seconds,
        failure_threshold: spec.failure_threshold.as_ref().map(|threshold| {
            let (failed, percent) = match threshold.limit {
                FailureLimit::Failed(n) => (Some(n), None),
                FailureLimit::Percent(p) => (None, Some(p)),
            };
            let min_ended = (threshold.min_ended > 0
                || matches!(threshold.limit, FailureLimit::Percent(_)))
            .then_some(threshold.min_ended);
            deployments::FailureThreshold {
                failed,
                percent,
                min_ended,
            }
        }),
        max_releases_per_minute: spec.max_releases_per_minute,
        maintenance_window: spec.maintenance_window.as_ref().map(|window| {
            deployments::MaintenanceWindow {
                start: drover_rules::deployment::format_minute(window.start_minute),
                end: drover_rules::deployment::format_minute(window.end_minute),
                time_zone: window.time_zone.clone(),
            }
        }),
        job: [(spec.job.name().to_owned(), job)].into_iter().collect(),
    }
}

/// A deployment as the API shows it: the manifest with its status.
pub(crate) fn deployment(
    deployment: &drover_rules::deployment::DeploymentRecord,
) -> deployments::Deployment {
    let status = &deployment.status;
    let counts = &status.counts;
    deployments::Deployment {
        api_version: drover_rules::records::API_VERSION.to_owned(),
        kind: "Deployment".to_owned(),
        metadata: runs::ObjectMeta {
            name: deployment.name.clone(),
            uid: Some(deployment.uid.to_string()),
            creation_timestamp: deployment.created_at,
            owner_references: None,
        },
        spec: deployment_spec(&deployment.spec),
        status: deployments::DeploymentStatus {
            phase: phase(status.phase),
            reason: status.reason.clone(),
            reason_text: reason_text(status.reason.as_deref()),
            targets: status.targets,
            excluded_count: status.excluded,
            pending: counts.pending,
            waiting_retry: counts.waiting_retry,
            queued: counts.queued,
            running: counts.running,
            succeeded: counts.succeeded,
            failed: counts.failed,
            expired: counts.expired,
            canceled: counts.canceled,
            start_time: status.start_time,
            completion_time: status.completion_time,
            next_retry_at: status.next_retry_at,
            latest_error: status.latest_error.clone(),
            add_new_devices_requests: deployment.add_requests,
            add_new_devices_handled: status.add_requests_handled,
            failure_threshold_reached_at: status.threshold_reached_at,
        },
    }
}

/// A schedule as the API shows it, with its next tick.
pub(crate) fn task_schedule(
    schedule: &drover_rules::schedule::TaskScheduleRecord,
    now: jiff::Timestamp,
) -> drover_api::schedules::TaskSchedule {
    use drover_api::schedules as api;
    use drover_rules::schedule::Cadence;
    let next = schedule
        .spec
        .schedule
        .compile()
        .ok()
        .filter(|_| !schedule.spec.suspend)
        .and_then(|ticks| ticks.next_after(now.max(schedule.status.last_tick.unwrap_or(now))));
    let cadence = match &schedule.spec.schedule {
        Cadence::Daily(at) => api::Cadence::Daily(at.clone()),
        Cadence::Weekly { day, at } => api::Cadence::Weekly {
            day: day.clone(),
            at: at.clone(),
        },
        Cadence::Yearly { date, at } => api::Cadence::Yearly {
            date: date.clone(),
            at: at.clone(),
        },
        Cadence::Cron(expression) => api::Cadence::Cron(expression.clone()),
    };
    api::TaskSchedule {
        api_version: drover_rules::records::API_VERSION.to_owned(),
        kind: "TaskSchedule".to_owned(),
        metadata: drover_api::runs::ObjectMeta {
            name: schedule.name.clone(),
            uid: None,
            creation_timestamp: schedule.created_at,
            owner_references: None,
        },
        spec: api::TaskScheduleSpec {
            schedule: cadence,
            suspend: schedule.spec.suspend,
            template: api::RunTemplate {
                spec: task_run_spec(&schedule.spec.template),
            },
            successful_runs_history_limit: schedule.spec.successful_runs_history_limit,
            failed_runs_history_limit: schedule.spec.failed_runs_history_limit,
        },
        status: api::TaskScheduleStatus {
            last_tick: schedule.status.last_tick,
            next_tick: next,
            last_run: schedule.status.last_run.clone(),
            active_run: schedule.status.active_run.clone(),
            skipped_ticks: schedule.status.skipped,
        },
    }
}
