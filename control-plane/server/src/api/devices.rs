//! The devices: listing (whole and paged), one device, its inventory, and
//! deleting one.

use super::convert;
use super::*;
use drover_api::devices as api;
use drover_model::model::{JobKind, JobState};
use drover_rules::patch::DeviceAssessment;
use std::collections::BTreeMap;

#[derive(Deserialize)]
pub(super) struct DevicePage {
    #[serde(default)]
    offset: usize,
    limit: Option<usize>,
    /// Matches the id, a group, a label (`key=value`), the OS or the
    /// agent's version, ignoring case.
    #[serde(default)]
    q: String,
    /// online, offline, never_connected, decommissioned.
    state: Option<String>,
    /// A patch state (`drover_rules::patch::PATCH_FILTERS`).
    patch: Option<String>,
}

/// One page of the fleet for the dashboard, filtered on the server: the
/// fleet may be 20,000 devices. Each device comes with its state and its
/// current (undecided) job, if any.
pub(super) async fn device_page(
    State(state): State<ApiState>,
    Query(page): Query<DevicePage>,
) -> Result<Json<api::DevicePage>, ApiError> {
    let now = Timestamp::now();
    let q = page.q.trim().to_lowercase();
    let wanted = page.state.as_deref().map(|s| s.replace('_', " "));
    let patch_filter = page.patch.as_deref().filter(|p| !p.is_empty());
    if let Some(filter) = patch_filter
        && drover_rules::patch::in_patch_state(filter, None, now).is_none()
    {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!(
                "unknown patch state {filter:?}; one of {}",
                drover_rules::patch::PATCH_FILTERS.join(", ")
            ),
        ));
    }
    // The fleet from the patch index: no device record decoded but the
    // page's own.
    let index = state.patch_index.current().await?;
    let mut matching = Vec::new();
    for (id, stored) in &index.devices {
        if let Some(filter) = patch_filter
            && drover_rules::patch::in_patch_state(
                filter,
                index.assessments.get(id).map(|a| a.as_ref()),
                now,
            ) != Some(true)
        {
            continue;
        }
        let online = state.presence.online(id, stored.last_seen, now);
        let device_state = stored.state(online);
        if wanted.as_deref().is_some_and(|w| w != device_state) {
            continue;
        }
        if !q.is_empty() && !device_matches(stored, &q) {
            continue;
        }
        matching.push((stored, device_state));
    }
    let limit = page.limit.unwrap_or(100).min(MAX_PAGE);
    let mut items = Vec::new();
    for (stored, device_state) in matching.iter().skip(page.offset).take(limit) {
        let device = with_presence(&state, stored.as_ref().clone());
        let jobs = state
            .db
            .list::<JobDelivery>(&drover_rules::records::device_jobs_prefix(&device.id))
            .await?;
        let current = jobs.iter().find_map(|(_, _, job)| {
            let decided = job.status.as_ref().is_some_and(|s| s.state.is_terminal())
                || matches!(
                    job.delivery,
                    drover_rules::records::Delivery::Expired { .. }
                );
            (!decided).then(|| {
                let step = job.status.as_ref().and_then(|s| {
                    s.steps
                        .iter()
                        .rfind(|step| step.state != drover_model::StepState::Pending)
                        .map(|step| step.name.clone())
                });
                let phase = drover_rules::state::JobPhase::of_job(job);
                api::CurrentJob {
                    run: job.run.clone(),
                    kind: job.intent.kind.name().to_owned(),
                    state: phase.name().to_owned(),
                    state_label: phase.label().to_owned(),
                    step,
                }
            })
        });
        let assessment = assessment_of(&state.db, &device.id).await?;
        items.push(api::Device {
            current_job: current,
            patch: assessment.as_ref().map(convert::patch_summary),
            ..convert::device(&device, *device_state == "online")
        });
    }
    Ok(Json(api::DevicePage {
        total: matching.len() as u64,
        offset: page.offset as u64,
        items,
    }))
}

pub(super) fn device_matches(device: &DeviceRecord, q: &str) -> bool {
    let has = |text: &str| text.to_lowercase().contains(q);
    has(device.id.as_str())
        || device.groups.iter().any(|g| has(g))
        || device.labels.iter().any(|(k, v)| has(&format!("{k}={v}")))
        || device.os_release.as_deref().is_some_and(has)
        || device.agent_version.as_deref().is_some_and(has)
}

/// A device as stored, with the fresher times this replica has seen.
pub(super) fn with_presence(state: &ApiState, mut device: DeviceRecord) -> DeviceRecord {
    if let Some(live) = state.presence.get(&device.id) {
        device.last_seen = device.last_seen.max(Some(live.last_seen));
        device.last_heartbeat = device.last_heartbeat.max(live.last_heartbeat);
    }
    device
}

/// Every device as stored, with the fresher times this replica has seen
/// and `online`: its agent is connected here and heard from lately, or
/// (held by another replica) was seen lately.
pub(super) async fn list_devices(
    State(state): State<ApiState>,
    Query(query): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let (devices, next) = list_page::<DeviceRecord>(&state.db, "devices/", &query).await?;
    let now = Timestamp::now();
    // A page's own assessments, read one by one: a page of 500 costs the
    // same in a fleet of any size. Without a page, every one at once.
    let mut assessments = match query.limit {
        Some(_) => std::collections::HashMap::new(),
        None => assessments_by_device(&state.db).await?,
    };
    let mut listed = Vec::with_capacity(devices.len());
    for stored in devices {
        let online = state.presence.online(&stored.id, stored.last_seen, now);
        let assessment = match query.limit {
            Some(_) => assessment_of(&state.db, &stored.id).await?,
            None => assessments.remove(&stored.id),
        };
        listed.push(api::Device {
            patch: assessment.as_ref().map(convert::patch_summary),
            maintained_labels: Some(maintained_labels(assessment.as_ref())),
            ..convert::device(&with_presence(&state, stored), online)
        });
    }
    Ok(super::listed("/devices", &query, listed, next))
}

/// The id named in a path, of a device that is registered (else 400 or 404).
async fn registered(state: &ApiState, id: String) -> Result<DeviceId, ApiError> {
    let id = DeviceId::new(id).map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
    if state
        .db
        .get::<DeviceRecord>(&device_key(&id))
        .await?
        .is_none()
    {
        return Err(not_found(format!("device {id}")));
    }
    Ok(id)
}

/// A device's latest jobs (newest first, at most 50): each one's state,
/// what it did in one line, and its whole output (an upgrade's packages
/// from → to, whether it rebooted).
pub(super) async fn device_jobs(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<api::DeviceJobs>, ApiError> {
    let id = registered(&state, id).await?;
    let live = state
        .db
        .list::<JobDelivery>(&drover_rules::records::device_jobs_prefix(&id))
        .await?;
    // What its history kept of jobs whose run, deployment or schedule is
    // gone (a job both kept and still recorded, by a delete cut short,
    // shows once, as recorded).
    let mut history = crate::history::of_device(&state.db, &id).await?;
    history.retain(|kept| !live.iter().any(|(_, _, j)| j.intent.job_id == kept.job));
    let mut rows: Vec<api::DeviceJob> = live
        .iter()
        .map(|(_, _, job)| job_row(job))
        .chain(history.iter().map(history_row))
        .collect();
    rows.sort_by_key(|row| std::cmp::Reverse(row.created_at));
    // The last upgrade that succeeded, however many jobs came after it:
    // what the device's packages last changed by (the report an operator
    // reads beside the pending list), from its jobs or its history.
    let last_live = live
        .iter()
        .map(|(_, _, job)| job)
        .filter(|job| matches!(job.intent.kind, JobKind::SystemUpgradeV1(_)))
        .filter_map(|job| {
            let status = job.status.as_ref()?;
            (status.state == JobState::Succeeded).then_some((status.finished_at?, job))
        })
        .max_by_key(|(finished, _)| *finished);
    let last_kept = history
        .iter()
        .filter(|kept| kept.is_succeeded_upgrade())
        .max_by_key(|kept| kept.ended_at());
    let last_upgrade = match (last_live, last_kept) {
        (Some((finished, _)), Some(kept)) if kept.ended_at() > finished => Some(history_row(kept)),
        (Some((_, job)), _) => Some(job_row(job)),
        (None, Some(kept)) => Some(history_row(kept)),
        (None, None) => None,
    };
    Ok(Json(api::DeviceJobs {
        device: id.to_string(),
        total: rows.len() as u64,
        items: rows.into_iter().take(50).collect(),
        last_upgrade,
    }))
}

/// One of a device's jobs as its history lists it.
fn job_row(job: &JobDelivery) -> api::DeviceJob {
    let phase = drover_rules::state::JobPhase::of_job(job);
    let status = job.status.as_ref();
    api::DeviceJob {
        job: job.intent.job_id.to_string(),
        kind: job.intent.kind.name().to_owned(),
        run: job.run.clone(),
        state: phase.name().to_owned(),
        state_label: phase.label().to_owned(),
        created_at: job.created_at,
        finished_at: status.and_then(|s| s.finished_at),
        error: status.and_then(|s| s.error.clone()),
        reason: status.map(|s| s.reason.clone()).unwrap_or_default(),
        result_text: super::result_text(Some(job)),
        output: status
            .and_then(|s| s.output.as_ref())
            .map(convert::job_output),
        run_deleted: false,
    }
}

/// A job its device's history kept after its run was deleted.
fn history_row(kept: &drover_rules::history::HistoryRecord) -> api::DeviceJob {
    api::DeviceJob {
        job: kept.job.to_string(),
        kind: kept.kind.clone(),
        run: kept.run.clone(),
        state: kept.state.clone(),
        state_label: kept
            .phase()
            .map_or_else(|| kept.state.clone(), |p| p.label().to_owned()),
        created_at: kept.created_at,
        finished_at: kept.finished_at,
        error: kept.error.clone(),
        reason: kept.reason.clone(),
        result_text: kept.result_text.clone(),
        output: kept
            .upgrade_output()
            .map(|u| convert::job_output(&drover_model::model::JobOutput::Upgrade(u))),
        run_deleted: true,
    }
}

/// One device as the list shows it (with `online`).
pub(super) async fn get_device(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<api::Device>, ApiError> {
    let id = DeviceId::new(id).map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
    let Some((_, stored)) = state.db.get::<DeviceRecord>(&device_key(&id)).await? else {
        return Err(not_found(format!("device {id}")));
    };
    let online = state
        .presence
        .online(&stored.id, stored.last_seen, Timestamp::now());
    let assessment = state
        .db
        .get::<DeviceAssessment>(&drover_rules::patch::assessment_key(&id))
        .await?
        .map(|(_, a)| a);
    Ok(Json(api::Device {
        patch: assessment.as_ref().map(convert::patch_summary),
        maintained_labels: Some(maintained_labels(assessment.as_ref())),
        token_generation: Some(crate::device_tokens::generation(&state.db, &id).await?),
        ..convert::device(&with_presence(&state, stored), online)
    }))
}

/// Every device whose token was rotated, with its generation (the others
/// are at 0): what `nats-config` and `mqtt-config` derive brokers'
/// passwords from. No token crosses here.
pub(super) async fn token_generations(
    State(state): State<ApiState>,
) -> Result<Json<drover_api::devices::TokenGenerations>, ApiError> {
    let prefix = crate::device_tokens::PREFIX;
    let stored = state.db.list::<u64>(prefix).await?;
    Ok(Json(
        stored
            .into_iter()
            .map(|(key, _, generation)| (key[prefix.len()..].to_owned(), generation))
            .collect(),
    ))
}

/// Revokes a device's token and issues the next one (an admin's): its
/// generation is raised, the token before it is refused from now on on every
/// replica and its open WebSocket session ends. The new token never crosses
/// the API: `drover token ID` makes it on the control plane's host.
pub(super) async fn rotate_device_token(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = registered(&state, id).await?;
    let generation = state
        .db
        .update::<u64, _>(&crate::device_tokens::key(&id), |g| {
            Some(g.unwrap_or(0) + 1)
        })
        .await?
        .unwrap_or(1);
    tracing::info!(device = %id, generation, "device token rotated");
    Ok(super::access::noted(
        Json(drover_api::devices::TokenRotated {
            device: id.to_string(),
            token_generation: generation,
        })
        .into_response(),
        "Device",
        id.as_str(),
        "token rotated",
    ))
}

/// The labels the control plane maintains for a device (a selector matches
/// them; a manifest cannot set them), from its latest assessment.
fn maintained_labels(assessment: Option<&DeviceAssessment>) -> BTreeMap<String, String> {
    assessment
        .map(|a| {
            a.maintained_labels()
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// Every device's latest assessment, by device.
/// A device's latest assessment, if one came.
async fn assessment_of(
    db: &drover_store::db::Db,
    id: &DeviceId,
) -> Result<Option<DeviceAssessment>, ApiError> {
    Ok(db
        .get::<DeviceAssessment>(&drover_rules::patch::assessment_key(id))
        .await?
        .map(|(_, a)| a))
}

async fn assessments_by_device(
    db: &drover_store::db::Db,
) -> Result<std::collections::HashMap<DeviceId, DeviceAssessment>, ApiError> {
    Ok(db
        .list::<DeviceAssessment>("assessments/")
        .await?
        .into_iter()
        .map(|(_, _, a)| (a.device.clone(), a))
        .collect())
}

/// The fleet's patch status (`drover_rules::patch::FleetPatchStatus`):
/// every registered device that is not decommissioned, by its latest
/// assessment.
pub(super) async fn fleet_patch_status(
    state: &ApiState,
    now: Timestamp,
) -> Result<drover_rules::patch::FleetPatchStatus, ApiError> {
    let index = state.patch_index.current().await?;
    let mut fleet = drover_rules::patch::FleetPatchStatus::default();
    for (id, device) in &index.devices {
        if !device.decommissioned {
            fleet.add(index.assessments.get(id).map(|a| a.as_ref()), now);
        }
    }
    Ok(fleet)
}

pub(super) async fn patch_status(
    State(state): State<ApiState>,
) -> Result<Json<api::PatchStatus>, ApiError> {
    let fleet = fleet_patch_status(&state, Timestamp::now()).await?;
    let stale_after_hours =
        u64::try_from(drover_rules::patch::STALE_AFTER.as_secs() / 3600).unwrap_or(0);
    Ok(Json(convert::patch_status(&fleet, stale_after_hours)))
}

/// A device's latest patch assessment whole: the summary's fields and the
/// pending packages, each security update with since when it has waited.
pub(super) async fn get_assessment(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<api::Assessment>, ApiError> {
    let id = registered(&state, id).await?;
    let Some((_, a)) = state
        .db
        .get::<DeviceAssessment>(&drover_rules::patch::assessment_key(&id))
        .await?
    else {
        return Err(not_found(format!(
            "an assessment of device {id} (none has reached the control plane yet)"
        )));
    };
    Ok(Json(api::Assessment {
        summary: convert::patch_summary(&a),
        pending: a
            .assessment
            .pending
            .iter()
            .map(|p| api::Pending {
                name: p.name.clone(),
                from: p.from.clone(),
                to: p.to.clone(),
                security: p.security,
                since: a.security_since.get(&p.name).copied(),
            })
            .collect(),
        omitted: a.assessment.omitted,
    }))
}

/// Removes a device from the registry with its inventory and its finished
/// jobs. Refused while one of its jobs is undecided (cancel its run or
/// deployment, or wait). Its token is derived, not stored: an agent that
/// still runs with it registers the device again when it connects, as a
/// kubelet does; decommission the device to refuse it instead. Its
/// enrolled key goes with it (the session ends; an agent with a valid
/// enrollment token enrolls again); reject the key to keep it out.
pub(super) async fn delete_device(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<Changed>, ApiError> {
    let id = DeviceId::new(id).map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
    let enrolled_key = drover_rules::enrollment::key_key(&id);
    let Some((_, device)) = state.db.get::<DeviceRecord>(&device_key(&id)).await? else {
        // A device that enrolled and was never accepted (or was rejected)
        // has its key only: deleting it lets the id enroll anew.
        if state
            .db
            .get::<drover_rules::enrollment::DeviceKeyRecord>(&enrolled_key)
            .await?
            .is_some()
        {
            state.db.delete_all(&[enrolled_key]).await?;
            tracing::info!(device = %id, "enrolled key deleted");
            return Ok(Json(Changed::new(
                Kind::Device,
                id.as_str(),
                Outcome::Deleted,
            )));
        }
        return Err(not_found(format!("device {id}")));
    };
    let jobs = state
        .db
        .list::<JobDelivery>(&drover_rules::records::device_jobs_prefix(&id))
        .await?;
    let undecided: Vec<String> = jobs
        .iter()
        .filter(|(_, _, job)| {
            !job.status.as_ref().is_some_and(|s| s.state.is_terminal())
                && !matches!(
                    job.delivery,
                    drover_rules::records::Delivery::Expired { .. }
                )
        })
        .map(|(_, _, job)| {
            job.run
                .clone()
                .unwrap_or_else(|| job.intent.job_id.to_string())
        })
        .collect();
    if !undecided.is_empty() {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!(
                "device {id} has {} undecided job(s) ({}); cancel the run or deployment, or wait for it, then delete the device",
                undecided.len(),
                undecided.join(", ")
            ),
        ));
    }
    let online = state
        .presence
        .online(&id, device.last_seen, Timestamp::now());
    // History is immutable: a job that belongs to a task run stays as the
    // run ended (its targets page keeps showing it), and goes with the run
    // when the run is deleted. The rest go with the device: a deployment's
    // job (`deployment/NAME`) too, as its target keeps its own end.
    let (kept, deleted): (Vec<_>, Vec<_>) = jobs.into_iter().partition(|(_, _, job)| {
        job.run
            .as_deref()
            .is_some_and(|run| !drover_rules::records::is_deployment_run(run))
    });
    let mut keys: Vec<String> = deleted.into_iter().map(|(key, _, _)| key).collect();
    let job_count = keys.len();
    keys.push(drover_rules::deployment::inventory_key(&id));
    keys.push(drover_rules::patch::assessment_key(&id));
    // Its history goes with it: the device is gone from the fleet.
    keys.extend(
        crate::history::of_device(&state.db, &id)
            .await?
            .iter()
            .map(|record| drover_rules::history::history_key(&id, record.job)),
    );
    keys.push(device_key(&id));
    // Its enrolled key too: its session ends, and it is let in again only
    // by enrolling anew (reject a key to keep a device out). An accepted
    // one is remembered first, for a broker that misses the removal.
    if let Some((_, key)) = state
        .db
        .get::<drover_rules::enrollment::DeviceKeyRecord>(&enrolled_key)
        .await?
        && key.state == drover_rules::enrollment::KeyState::Accepted
    {
        crate::enrollment::remember_revoked(&state.db, &key).await?;
    }
    keys.push(enrolled_key);
    state.db.delete_all(&keys).await?;
    tracing::info!(device = %id, jobs = job_count, kept = kept.len(), "device deleted");
    let mut answer = Changed::new(Kind::Device, id.as_str(), Outcome::Deleted);
    answer.jobs = Some(job_count as u64);
    answer.kept_for_runs = Some(kept.len() as u64);
    answer.online = Some(online);
    Ok(Json(answer))
}

/// The packages a device's latest inventory refresh reported.
pub(super) async fn get_inventory(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<api::DeviceInventory>, ApiError> {
    let id = DeviceId::new(id).map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
    match state
        .db
        .get::<drover_rules::deployment::DeviceInventory>(&drover_rules::deployment::inventory_key(
            &id,
        ))
        .await?
    {
        Some((_, inventory)) => Ok(Json(api::DeviceInventory {
            device: inventory.device.to_string(),
            collected_at: inventory.collected_at,
            packages: inventory.packages,
            truncated: inventory.truncated,
        })),
        None => Err(not_found(format!(
            "an inventory of device {id} (run an inventoryRefreshV1 job on it)"
        ))),
    }
}
