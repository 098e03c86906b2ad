//! Manifests as operators write them (`drover apply -f`): a TaskRun exactly as
//! the fleet-tasks seed shows it, and a Device carrying groups and labels.
//! Unknown fields are refused, so a typo never widens a rollout.

use drover_model::DeviceId;
use drover_model::model::Empty;
use drover_rules::records::{API_VERSION, TargetSelector, TaskRunSpec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

mod deploy_spec;

pub use deploy_spec::MAX_RETRY_BACKOFF_SECONDS;
pub(crate) use deploy_spec::render_software;
use deploy_spec::*;

/// Longest deadline a run may ask for: 30 days.
pub const MAX_DEADLINE_SECONDS: u64 = 30 * 24 * 3600;

#[derive(Debug, Clone, PartialEq)]
pub enum Manifest {
    TaskRun {
        name: String,
        spec: TaskRunSpec,
    },
    Device {
        id: DeviceId,
        labels: BTreeMap<String, String>,
        spec: DeviceSpec,
    },
    TaskSchedule {
        name: String,
        spec: drover_rules::schedule::ScheduleSpec,
    },
    Deployment {
        name: String,
        spec: drover_rules::deployment::DeploymentSpec,
    },
    /// Files a job may carry to a device (by reference; sealed at rest).
    Secret {
        name: String,
        data: BTreeMap<String, String>,
    },
}

/// Most keys one Secret holds.
pub const MAX_SECRET_KEYS: usize = 16;
/// Largest value of one key, in bytes.
pub const MAX_SECRET_VALUE: usize = 4096;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WireSecret {
    data: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceSpec {
    #[serde(default)]
    pub groups: Vec<String>,
    #[serde(default)]
    pub time_zone: Option<String>,
    #[serde(default)]
    pub decommissioned: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Raw {
    api_version: String,
    kind: String,
    metadata: Metadata,
    spec: serde_json::Value,
    /// Ignored: status is the control plane's to write.
    #[serde(default)]
    #[allow(dead_code)]
    status: serde_json::Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Metadata {
    name: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    #[allow(dead_code)]
    namespace: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WireTaskRunSpec {
    #[serde(default)]
    allowed_groups: Vec<String>,
    #[serde(default)]
    target_selector: WireSelector,
    deadline_seconds: u64,
    system_upgrade_v1: Option<Empty>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WireSelector {
    #[serde(default)]
    match_labels: BTreeMap<String, String>,
    #[serde(default)]
    match_expressions: Option<serde_json::Value>,
}

/// A resource name: 1 to 63 of `[a-z0-9-]`, starting and ending alphanumeric.
pub fn valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
}

/// Upper bound of the labels or groups one resource carries.
pub const MAX_LABELS: usize = 64;

/// A label value or group name: 1 to 63 of `[A-Za-z0-9._-]`, starting and
/// ending alphanumeric (Kubernetes' rule); a label key may add a
/// `prefix/` of the same characters. No control, space or bidirectional
/// characters can reach a terminal through them.
fn valid_token(text: &str, allow_slash: bool) -> bool {
    let ok = |part: &str| {
        let bytes = part.as_bytes();
        !bytes.is_empty()
            && bytes.len() <= 63
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
            && bytes[0].is_ascii_alphanumeric()
            && bytes[bytes.len() - 1].is_ascii_alphanumeric()
    };
    match text.split_once('/') {
        Some((prefix, name)) if allow_slash => prefix.len() <= 253 && ok(prefix) && ok(name),
        Some(_) => false,
        None => ok(text),
    }
}

/// The problems of groups and labels given outside a manifest (an
/// enrollment token's), in the words a manifest's would get.
pub fn group_and_label_problems(
    what: &str,
    groups: &[String],
    labels: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut problems = Vec::new();
    check_groups(what, groups, &mut problems);
    check_labels(what, labels, &mut problems);
    problems
}

fn check_labels(what: &str, labels: &BTreeMap<String, String>, problems: &mut Vec<String>) {
    if labels.len() > MAX_LABELS {
        problems.push(format!("{what}: at most {MAX_LABELS} labels"));
    }
    for (key, value) in labels {
        if !valid_token(key, true) {
            problems.push(format!(
                "{what}: label key {:?} must be 1 to 63 of [A-Za-z0-9._-], starting and ending alphanumeric (with an optional prefix/)",
                shorten(key)
            ));
        }
        if !value.is_empty() && !valid_token(value, false) {
            problems.push(format!(
                "{what}: label value {:?} must be empty or 1 to 63 of [A-Za-z0-9._-], starting and ending alphanumeric",
                shorten(value)
            ));
        }
    }
}

fn check_groups(what: &str, groups: &[String], problems: &mut Vec<String>) {
    if groups.len() > MAX_LABELS {
        problems.push(format!("{what}: at most {MAX_LABELS} groups"));
    }
    for group in groups {
        if !valid_token(group, false) {
            problems.push(format!(
                "{what}: group {:?} must be 1 to 63 of [A-Za-z0-9._-], starting and ending alphanumeric",
                shorten(group)
            ));
        }
    }
}

/// The start of a long text, for an error message.
fn shorten(text: &str) -> String {
    let mut short: String = text.chars().take(40).collect();
    if short.len() < text.len() {
        short.push('…');
    }
    short
}

/// Longest schedule name: its runs add `-YYYYMMDDHHMM` and stay within 63.
pub const MAX_SCHEDULE_NAME: usize = 50;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WireSchedule {
    schedule: drover_rules::schedule::Cadence,
    #[serde(default)]
    suspend: bool,
    template: WireTemplate,
    successful_runs_history_limit: Option<u32>,
    failed_runs_history_limit: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireTemplate {
    spec: serde_json::Value,
}

/// Whether a JSON value holds `key` anywhere.
fn contains_key(value: &serde_json::Value, key: &str) -> bool {
    match value {
        serde_json::Value::Object(map) => {
            map.contains_key(key) || map.values().any(|v| contains_key(v, key))
        }
        serde_json::Value::Array(items) => items.iter().any(|v| contains_key(v, key)),
        _ => false,
    }
}

/// A TaskRun spec (of a run, or of a schedule's template) at `path`.
fn parse_run_spec(value: serde_json::Value, path: &str) -> Result<TaskRunSpec, String> {
    let wire: WireTaskRunSpec = serde_json::from_value(value)
        .map_err(|e| format!("invalid TaskRun spec at {path}: {e}"))?;
    let mut problems = Vec::new();
    check_groups(
        &format!("{path}.allowedGroups"),
        &wire.allowed_groups,
        &mut problems,
    );
    check_labels(
        &format!("{path}.targetSelector.matchLabels"),
        &wire.target_selector.match_labels,
        &mut problems,
    );
    if wire.allowed_groups.is_empty() {
        problems.push(format!("{path}.allowedGroups needs at least one group"));
    }
    if wire.target_selector.match_expressions.is_some() {
        problems.push(format!(
            "{path}.targetSelector.matchExpressions is not implemented yet and fails closed; use matchLabels"
        ));
    }
    if wire.deadline_seconds == 0 || wire.deadline_seconds > MAX_DEADLINE_SECONDS {
        problems.push(format!(
            "{path}.deadlineSeconds must be between 1 and {MAX_DEADLINE_SECONDS}"
        ));
    }
    let Some(system_upgrade_v1) = wire.system_upgrade_v1 else {
        problems.push(format!("{path} needs a workload: systemUpgradeV1: {{}}"));
        return Err(problems.join("; "));
    };
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    Ok(TaskRunSpec {
        allowed_groups: wire.allowed_groups,
        target_selector: TargetSelector {
            match_labels: wire.target_selector.match_labels,
        },
        deadline_seconds: wire.deadline_seconds,
        system_upgrade_v1,
    })
}

/// Parses and validates one manifest; the error lists what is wrong.
pub fn parse(value: serde_json::Value) -> Result<Manifest, String> {
    let raw: Raw = serde_json::from_value(value).map_err(|e| format!("not a manifest: {e}"))?;
    if raw.api_version != API_VERSION {
        return Err(format!(
            "apiVersion must be {API_VERSION}, got {}",
            raw.api_version
        ));
    }
    match raw.kind.as_str() {
        "TaskRun" => {
            if !valid_name(&raw.metadata.name) {
                return Err(format!(
                    "metadata.name {:?} must be 1 to 63 of [a-z0-9-], starting and ending alphanumeric",
                    raw.metadata.name
                ));
            }
            let spec = parse_run_spec(raw.spec, "spec")?;
            Ok(Manifest::TaskRun {
                name: raw.metadata.name,
                spec,
            })
        }
        "TaskSchedule" => parse_schedule(raw),
        "Deployment" => {
            if !valid_name(&raw.metadata.name) {
                return Err(format!(
                    "metadata.name {:?} must be 1 to 63 of [a-z0-9-], starting and ending alphanumeric",
                    raw.metadata.name
                ));
            }
            let spec = parse_deployment_spec(raw.spec)?;
            Ok(Manifest::Deployment {
                name: raw.metadata.name,
                spec,
            })
        }
        "Device" => parse_device(raw),
        "Secret" => parse_secret(raw),
        other => Err(format!(
            "unknown kind {other:?}; this control plane serves TaskRun, TaskSchedule, Deployment, Device and Secret"
        )),
    }
}

/// A TaskSchedule: its name short enough for its runs' names, UTC only, its
/// template a run's spec and its history limits bounded.
fn parse_schedule(raw: Raw) -> Result<Manifest, String> {
    if !valid_name(&raw.metadata.name) || raw.metadata.name.len() > MAX_SCHEDULE_NAME {
        return Err(format!(
            "metadata.name {:?} must be 1 to {MAX_SCHEDULE_NAME} of [a-z0-9-], starting and ending alphanumeric \
             (its runs are named <schedule>-<YYYYMMDDHHMM>)",
            raw.metadata.name
        ));
    }
    if contains_key(&raw.spec, "timeZone") {
        return Err(
            "schedules are always UTC: a time zone cannot be set (remove timeZone and give the times in UTC)"
                .into(),
        );
    }
    let wire: WireSchedule =
        serde_json::from_value(raw.spec).map_err(|e| format!("invalid TaskSchedule spec: {e}"))?;
    wire.schedule
        .compile()
        .map_err(|e| format!("spec.schedule: {e}"))?;
    let template = parse_run_spec(wire.template.spec, "spec.template.spec")?;
    let limit = |field: &str, value: Option<u32>, default: u32| {
        let value = value.unwrap_or(default);
        if value > drover_rules::schedule::MAX_HISTORY {
            return Err(format!(
                "spec.{field} {value} is more than {} (older runs are deleted as newer ones finish; \
                 keep their results elsewhere if you need more)",
                drover_rules::schedule::MAX_HISTORY
            ));
        }
        Ok(value)
    };
    Ok(Manifest::TaskSchedule {
        name: raw.metadata.name,
        spec: drover_rules::schedule::ScheduleSpec {
            schedule: wire.schedule,
            suspend: wire.suspend,
            template,
            successful_runs_history_limit: limit(
                "successfulRunsHistoryLimit",
                wire.successful_runs_history_limit,
                drover_rules::schedule::DEFAULT_SUCCESSFUL_HISTORY,
            )?,
            failed_runs_history_limit: limit(
                "failedRunsHistoryLimit",
                wire.failed_runs_history_limit,
                drover_rules::schedule::DEFAULT_FAILED_HISTORY,
            )?,
        },
    })
}

/// A Device: its labels and groups, none of the control plane's labels, and
/// a time zone this machine knows.
fn parse_device(raw: Raw) -> Result<Manifest, String> {
    let id = DeviceId::new(raw.metadata.name).map_err(|e| e.to_string())?;
    let spec: DeviceSpec =
        serde_json::from_value(raw.spec).map_err(|e| format!("invalid Device spec: {e}"))?;
    if raw.metadata.labels.contains_key("device-id") {
        return Err("label device-id is implicit and cannot be set".into());
    }
    let mut problems = Vec::new();
    check_labels("metadata.labels", &raw.metadata.labels, &mut problems);
    if let Some(key) = raw
        .metadata
        .labels
        .keys()
        .find(|k| k.starts_with(drover_rules::patch::MAINTAINED_PREFIX))
    {
        problems.push(format!(
            "metadata.labels: {:?} is the control plane's: labels under {} are maintained \
             from each device's patch assessments and cannot be set",
            shorten(key),
            drover_rules::patch::MAINTAINED_PREFIX
        ));
    }
    check_groups("spec.groups", &spec.groups, &mut problems);
    if let Some(zone) = &spec.time_zone
        && (zone.is_empty()
            || zone.len() > 64
            || !zone
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'_' | b'-' | b'+')))
    {
        problems.push(format!(
            "spec.timeZone {:?} is not an IANA time zone name (such as Europe/Sofia)",
            shorten(zone)
        ));
    } else if let Some(zone) = &spec.time_zone
        && drover_rules::deployment::time_zone(zone).is_none()
    {
        problems.push(format!(
            "spec.timeZone {zone:?} is not in this machine's time zone database (tzdata)"
        ));
    }
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    Ok(Manifest::Device {
        id,
        labels: raw.metadata.labels,
        spec,
    })
}

/// A Secret: names that are file names on the device, and bounded values.
fn parse_secret(raw: Raw) -> Result<Manifest, String> {
    if !drover_model::sealed::is_secret_name(&raw.metadata.name) {
        return Err(format!(
            "metadata.name {:?} must be 1 to 64 of [A-Za-z0-9._-], not starting with a dot",
            shorten(&raw.metadata.name)
        ));
    }
    let wire: WireSecret = serde_json::from_value(raw.spec)
        .map_err(|e| format!("invalid Secret spec (spec.data: {{key: value}}): {e}"))?;
    let mut problems = Vec::new();
    if wire.data.is_empty() || wire.data.len() > MAX_SECRET_KEYS {
        problems.push(format!("spec.data must hold 1 to {MAX_SECRET_KEYS} keys"));
    }
    for (key, value) in &wire.data {
        if !drover_model::sealed::is_secret_name(key) {
            problems.push(format!(
                "spec.data key {:?} must be 1 to 64 of [A-Za-z0-9._-], not starting with a dot (it is a file name on the device)",
                shorten(key)
            ));
        }
        if value.len() > MAX_SECRET_VALUE {
            problems.push(format!(
                "spec.data.{key} is {} bytes, over the limit of {MAX_SECRET_VALUE}",
                value.len()
            ));
        }
    }
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    Ok(Manifest::Secret {
        name: raw.metadata.name,
        data: wire.data,
    })
}

#[cfg(test)]
mod tests;
