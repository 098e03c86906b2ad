//! `apply --dry-run=server`: every manifest checked as apply checks it,
//! nothing stored, and for each what would happen: created, configured,
//! unchanged or refused; for a TaskRun and a Deployment the frozen target
//! list it would get now (how many, canaries, the first names) and the
//! devices left out with why, so a selector typo is seen before an
//! immutable run fails at once with NoTargets.

use super::*;
use drover_api::changes::{Kind, Preview, PreviewItem, PreviewResult};
use drover_rules::deployment::{Selection, Targeting};
use drover_rules::placement;
use std::collections::{BTreeMap, HashMap};

/// Names listed in a preview before "and N more".
const FIRST: usize = 10;

/// The targets a preview shows: how many, the first names, and who is left
/// out and why.
fn with_targets(
    item: PreviewItem,
    targets: &[(DeviceId, bool)],
    excluded: BTreeMap<&'static str, u32>,
) -> PreviewItem {
    PreviewItem {
        targets: Some(targets.len() as u64),
        canaries: Some(targets.iter().filter(|(_, canary)| *canary).count() as u64),
        first: Some(
            targets
                .iter()
                .take(FIRST)
                .map(|(d, _)| d.to_string())
                .collect(),
        ),
        excluded: Some(
            excluded
                .into_iter()
                .map(|(why, n)| (why.to_owned(), n))
                .collect(),
        ),
        ..item
    }
}

/// Every manifest of a List parsed, or the first one's problem by its index.
pub(super) fn parse_all(items: &[Value]) -> Result<Vec<Manifest>, ApiError> {
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            manifest::parse(item.clone()).map_err(|e| {
                ApiError(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!("item {index}: {e}"),
                )
            })
        })
        .collect()
}

/// The devices a Deployment names that are not registered (a typo such as
/// `devices: [pi-kichen]`), at most ten of them, or None.
pub(super) async fn unknown_devices(
    db: &drover_store::db::Db,
    targets: &Targeting,
) -> Result<Option<String>, ApiError> {
    let Targeting::Devices(named) = targets else {
        return Ok(None);
    };
    let registered: std::collections::HashSet<DeviceId> = db
        .list::<DeviceRecord>("devices/")
        .await?
        .into_iter()
        .map(|(_, _, d)| d.id)
        .collect();
    let unknown: Vec<String> = named
        .iter()
        .filter(|d| !registered.contains(*d))
        .map(|d| d.to_string())
        .collect();
    Ok((!unknown.is_empty()).then(|| {
        let shown: Vec<&str> = unknown.iter().take(10).map(String::as_str).collect();
        let more = unknown.len().saturating_sub(10);
        format!(
            "spec.targets.devices names {} device{} that {} not registered: {}{}",
            unknown.len(),
            if unknown.len() == 1 { "" } else { "s" },
            if unknown.len() == 1 { "is" } else { "are" },
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        )
    }))
}
/// A TaskRun's preview: unchanged, created or refused (a run's spec never
/// changes), with the targets its plan would freeze now.
async fn preview_run(
    state: &ApiState,
    name: String,
    spec: drover_rules::records::TaskRunSpec,
    devices: &[DeviceRecord],
) -> Result<PreviewItem, ApiError> {
    let (result, reason) = match state.db.get::<TaskRunRecord>(&run_key(&name)).await? {
        Some((_, run)) if run.spec == spec => (PreviewResult::Unchanged, None),
        Some(_) => (
            PreviewResult::Refused,
            Some("a TaskRun's spec never changes (delete it first)".to_owned()),
        ),
        None => (PreviewResult::Created, None),
    };
    let plan: Vec<(DeviceId, bool)> = placement::plan(&spec, devices)
        .into_iter()
        .map(|t| (t.device, t.canary))
        .collect();
    let mut excluded = BTreeMap::new();
    for device in devices {
        match placement::placed(&spec, device) {
            Ok(()) | Err(placement::Left::NotSelected) => {}
            Err(left) => *excluded.entry(left.name()).or_insert(0) += 1,
        }
    }
    let mut item = with_targets(
        PreviewItem {
            reason,
            ..PreviewItem::new(Kind::TaskRun, name, result)
        },
        &plan,
        excluded,
    );
    if plan.is_empty() {
        item.warning = Some(
            "no authorized device with an agent matches: the run would fail at once (NoTargets)"
                .into(),
        );
    }
    item.unmatched = drover_rules::unmatched::of_run(&spec, devices);
    if item.unmatched.is_empty() {
        item.unmatched = drover_rules::unmatched::empty_groups(&spec.allowed_groups, devices);
    }
    Ok(item)
}

/// Why a device a Deployment's targeting matched is left out (its
/// `Selection::Excluded`), by the dry run's name for it.
fn excluded_why(
    device: &DeviceRecord,
    job: &drover_rules::deployment::DeploymentJob,
) -> &'static str {
    if device.decommissioned {
        "decommissioned"
    } else if !device.agent_present {
        "noAgentYet"
    } else if !drover_rules::deployment::runs_kind(job, device) {
        "agentLacksTheKind"
    } else {
        "noInventoryYet"
    }
}

pub(super) async fn preview(state: &ApiState, items: Vec<Value>) -> Result<Preview, ApiError> {
    let manifests = parse_all(&items)?;
    // As placement sees them: with the labels the control plane maintains.
    let devices = crate::patch_labels::placed_devices(&state.db).await?;
    // As stored: what a Device manifest is compared with.
    let stored: HashMap<DeviceId, DeviceRecord> = state
        .db
        .list::<DeviceRecord>("devices/")
        .await?
        .into_iter()
        .map(|(_, _, d)| (d.id.clone(), d))
        .collect();
    let mut results = Vec::with_capacity(manifests.len());
    // The Secrets the List would have created by each manifest.
    let mut secrets_before: Vec<String> = Vec::new();
    for manifest in manifests {
        results.push(match manifest {
            Manifest::TaskRun { name, spec } => preview_run(state, name, spec, &devices).await?,
            Manifest::Deployment { name, mut spec } => {
                if let Some(kind) = crate::kinds::kind(spec.job.name()) {
                    let apply = crate::kinds::Apply {
                        db: &state.db,
                        downloads: state.downloads,
                        secrets_before: &secrets_before,
                    };
                    kind.resolve(apply, &mut spec.job).await?;
                }
                let unknown = unknown_devices(&state.db, &spec.targets).await?;
                let (result, reason) = match state
                    .db
                    .get::<DeploymentRecord>(&drover_rules::records::deployment_key(&name))
                    .await?
                {
                    _ if unknown.is_some() => (PreviewResult::Refused, unknown),
                    Some((_, existing)) if existing.spec == spec => {
                        (PreviewResult::Unchanged, None)
                    }
                    Some(_) => (
                        PreviewResult::Refused,
                        Some("a Deployment's spec never changes (delete it first)".to_owned()),
                    ),
                    None => (PreviewResult::Created, None),
                };
                let inventories: HashMap<DeviceId, drover_rules::deployment::DeviceInventory> =
                    match &spec.targets {
                        Targeting::Filter(filter) if filter.needs_inventory() => state
                            .db
                            .list::<drover_rules::deployment::DeviceInventory>("inventory/")
                            .await?
                            .into_iter()
                            .map(|(_, _, i)| (i.device.clone(), i))
                            .collect(),
                        _ => HashMap::new(),
                    };
                let mut chosen = Vec::new();
                let mut zones: BTreeMap<Option<String>, u64> = BTreeMap::new();
                let mut excluded = BTreeMap::new();
                for device in &devices {
                    let inventory = inventories.get(&device.id);
                    match drover_rules::deployment::select(
                        &spec.targets,
                        &spec.job,
                        device,
                        inventory,
                    ) {
                        Selection::Target => {
                            chosen.push((device.id.clone(), false));
                            *zones.entry(device.time_zone.clone()).or_default() += 1;
                        }
                        Selection::Excluded => {
                            *excluded.entry(excluded_why(device, &spec.job)).or_insert(0) += 1;
                        }
                        Selection::NotSelected => {}
                    }
                }
                let nothing_selected = chosen.is_empty() && excluded.is_empty();
                let mut item = with_targets(
                    PreviewItem {
                        reason,
                        ..PreviewItem::new(Kind::Deployment, name, result)
                    },
                    &chosen,
                    excluded,
                );
                if let Targeting::Filter(filter) = &spec.targets {
                    item.unmatched = if nothing_selected {
                        drover_rules::unmatched::of_filter(filter, &devices, |d| {
                            inventories.get(&d.id)
                        })
                    } else {
                        drover_rules::unmatched::empty_groups(&filter.groups, &devices)
                    };
                }
                if let Some(window) = &spec.maintenance_window {
                    item.windows =
                        super::deployments::windows_now(window, &zones, Timestamp::now());
                }
                item
            }
            Manifest::Device { id, labels, spec } => {
                let result = match stored.get(&id) {
                    Some(d) if super::apply::device_unchanged(d, &labels, &spec) => {
                        PreviewResult::Unchanged
                    }
                    Some(_) => PreviewResult::Configured,
                    None => PreviewResult::Created,
                };
                PreviewItem::new(Kind::Device, id.as_str(), result)
            }
            Manifest::TaskSchedule { name, spec } => {
                let result = match state
                    .db
                    .get::<drover_rules::schedule::TaskScheduleRecord>(
                        &drover_rules::records::schedule_key(&name),
                    )
                    .await?
                {
                    Some((_, existing)) if existing.spec == spec => PreviewResult::Unchanged,
                    Some(_) => PreviewResult::Configured,
                    None => PreviewResult::Created,
                };
                PreviewItem::new(Kind::TaskSchedule, name, result)
            }
            Manifest::Secret { name, .. } => {
                secrets_before.push(name.clone());
                let exists = state
                    .db
                    .get::<drover_rules::records::SecretRecord>(&drover_rules::records::secret_key(
                        &name,
                    ))
                    .await?
                    .is_some();
                PreviewItem::new(
                    Kind::Secret,
                    name,
                    if exists {
                        PreviewResult::Configured
                    } else {
                        PreviewResult::Created
                    },
                )
            }
        });
    }
    Ok(Preview {
        dry_run: "server".into(),
        items: results,
    })
}
