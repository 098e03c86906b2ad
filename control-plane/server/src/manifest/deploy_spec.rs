//! A Deployment's spec as operators write it: targets (all, devices, a
//! filter of labels and software), the job, concurrency, the maintenance
//! window, retries; parsed strictly and rendered back.

use super::*;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct WireDeploymentSpec {
    targets: WireTargets,
    // The job's section (`systemUpgradeV1: {}` …) is taken out first and
    // parsed by its kind (crate::kinds).
    max_concurrency: u32,
    #[serde(default)]
    maintenance_window: Option<WireWindow>,
    #[serde(default)]
    retries: u32,
    #[serde(default = "default_backoff")]
    retry_backoff_seconds: u64,
    deadline_seconds: u64,
    #[serde(default)]
    failure_threshold: Option<WireFailureThreshold>,
    #[serde(default)]
    max_releases_per_minute: Option<u32>,
}

/// `failureThreshold: {failed: 5}` or `{percent: 10, minEnded: 40}`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct WireFailureThreshold {
    #[serde(default)]
    failed: Option<u32>,
    #[serde(default)]
    percent: Option<u32>,
    #[serde(default)]
    min_ended: Option<u32>,
}

/// A failure threshold as written, checked: exactly one of a count and a
/// percentage; a percentage needs `minEnded`, or its first failure would
/// be 100 % of one.
fn failure_threshold(
    wire: WireFailureThreshold,
    problems: &mut Vec<String>,
) -> Option<drover_rules::deployment::FailureThreshold> {
    use drover_rules::deployment::{FailureLimit, FailureThreshold, MAX_TARGETS};
    let max = MAX_TARGETS as u32;
    let limit = match (wire.failed, wire.percent) {
        (Some(n), None) if (1..=max).contains(&n) => FailureLimit::Failed(n),
        (None, Some(p)) if (1..=100).contains(&p) && wire.min_ended.is_some() => {
            FailureLimit::Percent(p as u8)
        }
        (None, Some(p)) if (1..=100).contains(&p) => {
            problems.push(
                "spec.failureThreshold.percent needs minEnded: how many targets must end before a percentage is judged"
                    .into(),
            );
            return None;
        }
        (Some(_), None) => {
            problems.push(format!(
                "spec.failureThreshold.failed must be between 1 and {max}"
            ));
            return None;
        }
        (None, Some(_)) => {
            problems.push("spec.failureThreshold.percent must be between 1 and 100".into());
            return None;
        }
        _ => {
            problems.push(
                "spec.failureThreshold needs exactly one of `failed: N` (targets) or `percent: P` (of the targets that ended)"
                    .into(),
            );
            return None;
        }
    };
    let min_ended = wire.min_ended.unwrap_or(0);
    if min_ended > max {
        problems.push(format!(
            "spec.failureThreshold.minEnded must be at most {max}"
        ));
    }
    Some(FailureThreshold { limit, min_ended })
}

/// Most releases an operator may allow per minute: as many as targets.
const MAX_RELEASES_PER_MINUTE: u32 = drover_rules::deployment::MAX_TARGETS as u32;

pub(super) fn default_backoff() -> u64 {
    300
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct WireTargets {
    #[serde(default)]
    all: bool,
    devices: Option<Vec<String>>,
    filter: Option<WireFilter>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct WireFilter {
    #[serde(default)]
    match_labels: BTreeMap<String, String>,
    #[serde(default)]
    groups: Vec<String>,
    #[serde(default)]
    software_present: Vec<WireSoftware>,
    #[serde(default)]
    software_absent: Vec<WireSoftware>,
}

/// `{name: openssl, versionCmp: {op: "<<", version: "3.0.11-1~deb12u2"}}`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct WireSoftware {
    name: String,
    #[serde(default)]
    version_cmp: Option<WireVersionCmp>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct WireVersionCmp {
    op: String,
    version: String,
}

pub(crate) fn render_software(
    conditions: &[drover_rules::deployment::SoftwareCondition],
) -> serde_json::Value {
    conditions
        .iter()
        .map(|c| match &c.version_cmp {
            Some(cmp) => serde_json::json!({
                "name": c.name, "versionCmp": {"op": cmp.op.as_str(), "version": cmp.version}
            }),
            None => serde_json::json!({"name": c.name}),
        })
        .collect()
}

/// At most this many software conditions in one filter.
pub(super) const MAX_SOFTWARE_CONDITIONS: usize = 32;

pub(super) fn software_conditions(
    field: &str,
    wire: Vec<WireSoftware>,
    problems: &mut Vec<String>,
) -> Vec<drover_rules::deployment::SoftwareCondition> {
    use drover_rules::deployment::{SoftwareCondition, VersionCmp, VersionOp};
    if wire.len() > MAX_SOFTWARE_CONDITIONS {
        problems.push(format!(
            "{field}: at most {MAX_SOFTWARE_CONDITIONS} conditions"
        ));
    }
    let mut conditions = Vec::new();
    for condition in wire.into_iter().take(MAX_SOFTWARE_CONDITIONS) {
        if !drover_model::model::is_package_name(&condition.name) {
            problems.push(format!(
                "{field}: {:?} is not a Debian package name",
                condition.name
            ));
        }
        let version_cmp = match condition.version_cmp {
            None => None,
            Some(cmp) => {
                let op = VersionOp::parse(&cmp.op);
                if op.is_none() {
                    problems.push(format!(
                        "{field}: versionCmp.op {:?} is not one of <<, <=, =, >=, >> (or <, >)",
                        cmp.op
                    ));
                }
                if !drover_model::model::is_version(&cmp.version) {
                    problems.push(format!(
                        "{field}: versionCmp.version {:?} is not a Debian version",
                        cmp.version
                    ));
                }
                op.map(|op| VersionCmp {
                    op,
                    version: cmp.version,
                })
            }
        };
        conditions.push(SoftwareCondition {
            name: condition.name,
            version_cmp,
        });
    }
    conditions
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct WireWindow {
    start: String,
    end: String,
    #[serde(default)]
    time_zone: Option<String>,
}

/// Longest backoff an operator may give a first retry: one day.
pub const MAX_RETRY_BACKOFF_SECONDS: u64 = 24 * 3600;

pub(super) fn parse_deployment_spec(
    mut value: serde_json::Value,
) -> Result<drover_rules::deployment::DeploymentSpec, String> {
    use drover_rules::deployment::{DeploymentJob, DeploymentSpec, MAX_RETRIES, MAX_TARGETS};
    // Every registered kind's section (a `null` one is absent).
    let mut jobs = Vec::new();
    if let Some(spec) = value.as_object_mut() {
        for kind in crate::kinds::KINDS {
            if let Some(section) = spec.remove(kind.name())
                && !section.is_null()
            {
                jobs.push((*kind, section));
            }
        }
    }
    let wire: WireDeploymentSpec =
        serde_json::from_value(value).map_err(|e| format!("invalid Deployment spec: {e}"))?;
    let mut problems = Vec::new();
    let targets = targeting(wire.targets, &mut problems);
    let job = match <[_; 1]>::try_from(jobs) {
        Ok([(kind, section)]) => kind.deployment_job(section, &mut problems),
        Err(_) => {
            problems.push(format!(
                "spec needs exactly one job: {}",
                crate::kinds::examples()
            ));
            DeploymentJob::SystemUpgradeV1
        }
    };
    if wire.max_concurrency == 0 || wire.max_concurrency as usize > MAX_TARGETS {
        problems.push(format!(
            "spec.maxConcurrency must be between 1 and {MAX_TARGETS}"
        ));
    }
    if wire.retries > MAX_RETRIES {
        problems.push(format!("spec.retries must be at most {MAX_RETRIES}"));
    }
    if wire.retry_backoff_seconds == 0 || wire.retry_backoff_seconds > MAX_RETRY_BACKOFF_SECONDS {
        problems.push(format!(
            "spec.retryBackoffSeconds must be between 1 and {MAX_RETRY_BACKOFF_SECONDS}"
        ));
    }
    if wire.deadline_seconds == 0 || wire.deadline_seconds > MAX_DEADLINE_SECONDS {
        problems.push(format!(
            "spec.deadlineSeconds must be between 1 and {MAX_DEADLINE_SECONDS}"
        ));
    }
    let failure_threshold = wire
        .failure_threshold
        .and_then(|threshold| failure_threshold(threshold, &mut problems));
    if let Some(rate) = wire.max_releases_per_minute
        && !(1..=MAX_RELEASES_PER_MINUTE).contains(&rate)
    {
        problems.push(format!(
            "spec.maxReleasesPerMinute must be between 1 and {MAX_RELEASES_PER_MINUTE}"
        ));
    }
    let maintenance_window = maintenance_window(wire.maintenance_window, &mut problems);
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    Ok(DeploymentSpec {
        targets,
        job,
        max_concurrency: wire.max_concurrency,
        maintenance_window,
        retries: wire.retries,
        retry_backoff_seconds: wire.retry_backoff_seconds,
        deadline_seconds: wire.deadline_seconds,
        failure_threshold,
        max_releases_per_minute: wire.max_releases_per_minute,
    })
}

/// Which devices a Deployment targets: exactly one of all, a list of
/// devices (each once) or a filter that says something.
fn targeting(
    targets: WireTargets,
    problems: &mut Vec<String>,
) -> drover_rules::deployment::Targeting {
    use drover_rules::deployment::{DeviceFilter, MAX_TARGETS, Targeting};
    let chosen = [
        targets.all,
        targets.devices.is_some(),
        targets.filter.is_some(),
    ]
    .iter()
    .filter(|c| **c)
    .count();
    if chosen != 1 {
        problems.push(
            "spec.targets needs exactly one of `all: true`, `devices: [...]` or `filter: {...}`"
                .into(),
        );
        Targeting::All
    } else if let Some(devices) = targets.devices {
        if devices.is_empty() || devices.len() > MAX_TARGETS {
            problems.push(format!(
                "spec.targets.devices lists 1 to {MAX_TARGETS} devices"
            ));
        }
        let mut ids = Vec::with_capacity(devices.len());
        let mut seen = std::collections::HashSet::new();
        for device in devices {
            match DeviceId::new(device.clone()) {
                Ok(id) if seen.insert(id.clone()) => ids.push(id),
                Ok(_) => problems.push(format!(
                    "spec.targets.devices lists {} twice",
                    shorten(&device)
                )),
                Err(e) => problems.push(format!("spec.targets.devices: {e}")),
            }
            if problems.len() > 10 {
                break;
            }
        }
        Targeting::Devices(ids)
    } else if let Some(filter) = targets.filter {
        check_labels(
            "spec.targets.filter.matchLabels",
            &filter.match_labels,
            problems,
        );
        check_groups("spec.targets.filter.groups", &filter.groups, problems);
        if filter.match_labels.is_empty()
            && filter.groups.is_empty()
            && filter.software_present.is_empty()
            && filter.software_absent.is_empty()
        {
            problems.push(
                "spec.targets.filter is empty; give matchLabels, groups or software conditions, or say `all: true`"
                    .into(),
            );
        }
        let software_present = software_conditions(
            "spec.targets.filter.softwarePresent",
            filter.software_present,
            problems,
        );
        let software_absent = software_conditions(
            "spec.targets.filter.softwareAbsent",
            filter.software_absent,
            problems,
        );
        Targeting::Filter(DeviceFilter {
            match_labels: filter.match_labels,
            groups: filter.groups,
            software_present,
            software_absent,
        })
    } else {
        Targeting::All
    }
}

/// A Deployment's maintenance window: HH:MM to HH:MM, not empty, in a time
/// zone this machine knows (UTC unless given).
fn maintenance_window(
    window: Option<WireWindow>,
    problems: &mut Vec<String>,
) -> Option<drover_rules::deployment::Window> {
    use drover_rules::deployment::Window;
    match window {
        None => None,
        Some(window) => {
            let start = drover_rules::deployment::parse_minute(&window.start);
            let end = drover_rules::deployment::parse_minute(&window.end);
            let zone = window.time_zone.unwrap_or_else(|| "UTC".into());
            if start.is_none() || end.is_none() {
                problems.push(format!(
                    "spec.maintenanceWindow start and end are HH:MM (24-hour), got {:?} and {:?}",
                    shorten(&window.start),
                    shorten(&window.end)
                ));
            } else if start == end {
                problems.push(
                    "spec.maintenanceWindow is empty (start equals end); leave it out to allow any time"
                        .into(),
                );
            }
            if drover_rules::deployment::time_zone(&zone).is_none() {
                problems.push(format!(
                    "spec.maintenanceWindow.timeZone {:?} is not in this machine's time zone database",
                    shorten(&zone)
                ));
            }
            Some(Window {
                start_minute: start.unwrap_or(0),
                end_minute: end.unwrap_or(0),
                time_zone: zone,
            })
        }
    }
}
