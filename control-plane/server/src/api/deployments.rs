//! Deployments: listing, one deployment, its targets page and description,
//! canceling, adding newly matching devices.

use super::convert;
use super::*;
use drover_api::deployments as api;
use drover_rules::deployment::TargetState;

pub(super) async fn deployment(state: &ApiState, name: &str) -> Result<DeploymentRecord, ApiError> {
    match state
        .db
        .get::<DeploymentRecord>(&drover_rules::records::deployment_key(name))
        .await?
    {
        Some((_, deployment)) => Ok(deployment),
        None => Err(not_found(format!("Deployment {name}"))),
    }
}

/// Every target of the deployment `uid` (key, revision, record).
async fn targets(
    state: &ApiState,
    uid: JobId,
) -> Result<Vec<(String, u64, TargetRecord)>, ApiError> {
    Ok(state
        .db
        .list::<TargetRecord>(&drover_rules::records::targets_prefix(uid))
        .await?)
}

/// What judging why a deployment's targets wait needs, read once per
/// request: the fleet index (each device's last-seen time), how many
/// targets are out, and the release rate's hold. A target's wait is the
/// engine's own judgement (`wait_of`, then the release rate), with each
/// device's presence as this replica knows it; only the targets an answer
/// shows are judged.
struct Waits<'a> {
    state: &'a ApiState,
    deployment: &'a DeploymentRecord,
    fleet: std::sync::Arc<crate::patch_index::Snapshot>,
    active: u32,
    rate: Option<drover_rules::deployment::Wait>,
    now: Timestamp,
}

impl<'a> Waits<'a> {
    async fn new(
        state: &'a ApiState,
        deployment: &'a DeploymentRecord,
        targets: &[(String, u64, TargetRecord)],
        now: Timestamp,
    ) -> Result<Self, ApiError> {
        let active = targets
            .iter()
            .filter(|(_, _, t)| t.end.is_none() && t.job.is_some())
            .count() as u32;
        Ok(Self {
            state,
            deployment,
            fleet: state.patch_index.current().await?,
            active,
            rate: drover_rules::deployment::rate_wait(
                &deployment.spec,
                &deployment.status.recent_releases,
                0,
                now,
            ),
            now,
        })
    }

    /// Why `target` waits, if it is not released yet.
    fn of(&self, target: &TargetRecord) -> Option<drover_rules::deployment::Wait> {
        if target.end.is_some()
            || target.job.is_some()
            || self.deployment.status.phase.is_terminal()
        {
            return None;
        }
        let last_seen = self
            .fleet
            .devices
            .get(&target.device)
            .and_then(|d| d.last_seen);
        let device = drover_rules::deployment::DeviceNow {
            online: self
                .state
                .presence
                .online(&target.device, last_seen, self.now),
            last_seen,
            time_zone: target.time_zone.as_deref(),
        };
        drover_rules::deployment::wait_of(
            &self.deployment.spec,
            target,
            device,
            self.active,
            self.now,
        )
        .or_else(|| self.rate.clone())
    }
}

/// The window in each zone (the first 100; a device with no zone of its
/// own is in the window's): open now or when it opens, with the targets
/// in that zone.
pub(super) fn windows_now(
    window: &drover_rules::deployment::Window,
    zones: &std::collections::BTreeMap<Option<String>, u64>,
    now: Timestamp,
) -> Vec<api::WindowNow> {
    let mut counts: std::collections::BTreeMap<&str, u64> = Default::default();
    for (zone, count) in zones {
        *counts
            .entry(zone.as_deref().unwrap_or(&window.time_zone))
            .or_default() += count;
    }
    counts
        .into_iter()
        .take(100)
        .map(|(zone, count)| {
            let tz = drover_rules::deployment::time_zone(zone).unwrap_or(jiff::tz::TimeZone::UTC);
            let local = |at| tz.to_datetime(at).strftime("%Y-%m-%d %H:%M").to_string();
            let opens_at = window.next_open(&tz, now);
            api::WindowNow {
                time_zone: zone.to_owned(),
                targets: count,
                local_time: local(now),
                open: window.contains(&tz, now),
                opens_at,
                opens_local: opens_at.map(local),
            }
        })
        .collect()
}

pub(super) async fn list_deployments(
    State(state): State<ApiState>,
    Query(query): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let (deployments, next) =
        list_page::<DeploymentRecord>(&state.db, "deployments/", &query).await?;
    let items: Vec<api::Deployment> = deployments.iter().map(convert::deployment).collect();
    Ok(listed("/deployments", &query, items, next))
}

pub(super) async fn get_deployment(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<api::Deployment>, ApiError> {
    Ok(Json(convert::deployment(&deployment(&state, &name).await?)))
}

/// A target's state as an operator reads it (the rules' [`TargetState`]).
pub(super) fn target_state(
    target: &TargetRecord,
    job: Option<&JobDelivery>,
    now: Timestamp,
) -> TargetState {
    let observed = job.map(|j| drover_rules::deployment::observe(j, now));
    TargetState::of(target, observed.as_ref(), now)
}

#[derive(Deserialize)]
pub(super) struct TargetPage {
    #[serde(default)]
    offset: usize,
    limit: Option<usize>,
    /// Only targets in this state (a [`TargetState`] name: pending,
    /// waitingRetry, queued, running, succeeded, failed, expired, canceled).
    state: Option<String>,
}

/// One page of a deployment's targets with each one's attempt and state.
pub(super) async fn deployment_targets(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    Query(page): Query<TargetPage>,
) -> Result<Json<api::DeploymentTargets>, ApiError> {
    let wanted = match page.state.as_deref() {
        None => None,
        Some(name) => Some(TargetState::from_name(name).ok_or_else(|| {
            let names: Vec<&str> = TargetState::ALL.iter().map(|s| s.name()).collect();
            ApiError(
                StatusCode::BAD_REQUEST,
                format!("unknown target state {name:?}; one of {}", names.join(", ")),
            )
        })?),
    };
    let deployment = deployment(&state, &name).await?;
    let targets = targets(&state, deployment.uid).await?;
    let now = Timestamp::now();
    let limit = page.limit.unwrap_or(100).min(MAX_PAGE);
    let mut items = Vec::new();
    let mut total = 0usize;
    let waits = Waits::new(&state, &deployment, &targets, now).await?;
    for (_, _, target) in &targets {
        let job = match target.job {
            Some(id) => state
                .db
                .get::<JobDelivery>(&job_key(&target.device, id))
                .await?
                .map(|(_, j)| j),
            None => None,
        };
        let target_state = target_state(target, job.as_ref(), now);
        if wanted.is_some_and(|s| s != target_state) {
            continue;
        }
        total += 1;
        if total <= page.offset || items.len() >= limit {
            continue;
        }
        items.push(api::DeploymentTarget {
            device: target.device.to_string(),
            state: target_state.name().to_owned(),
            state_label: target_state.label().to_owned(),
            attempt: target.attempt,
            job: target.job.map(|j| j.to_string()),
            time_zone: target.time_zone.clone(),
            released_at: target.released_at,
            next_attempt_at: target.next_attempt_at,
            last_error: target.last_error.clone(),
            delivery: job.as_ref().map(|j| convert::delivery(&j.delivery)),
            created_at: job.as_ref().map(|j| j.created_at),
            status: job
                .as_ref()
                .and_then(|j| j.status.as_ref())
                .map(convert::job_status),
            result_text: result_text(job.as_ref()),
            waiting: waits.of(target).as_ref().map(convert::wait),
        });
    }
    Ok(Json(api::DeploymentTargets {
        total: total as u64,
        offset: page.offset as u64,
        items,
    }))
}

/// What an operator needs to judge a deployment: its counts, whether each
/// site's window is open now, the latest errors, and the retries waiting.
pub(super) async fn describe_deployment(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<api::DeploymentDescription>, ApiError> {
    let deployment = deployment(&state, &name).await?;
    let targets = targets(&state, deployment.uid).await?;
    let now = Timestamp::now();
    let mut zones: std::collections::BTreeMap<String, usize> = Default::default();
    let mut errors = Vec::new();
    let mut waiting = Vec::new();
    for (_, _, target) in &targets {
        if target.end.is_none()
            && let Some(window) = &deployment.spec.maintenance_window
        {
            let zone = target
                .time_zone
                .clone()
                .unwrap_or_else(|| window.time_zone.clone());
            *zones.entry(zone).or_default() += 1;
        }
        if target.last_error.is_some() {
            errors.push(target);
        }
        if target.end.is_none()
            && target.job.is_none()
            && let Some(at) = target.next_attempt_at
            && at > now
        {
            waiting.push((at, target));
        }
    }
    waiting.sort_by_key(|(at, _)| *at);
    // The shown errors with their reasons, from their attempts' jobs.
    errors.truncate(10);
    let mut latest_errors = Vec::with_capacity(errors.len());
    for target in errors {
        let job = drover_rules::deployment::attempt_job_id(
            deployment.uid,
            &target.device,
            target.attempt,
        );
        let reason = match state
            .db
            .get::<JobDelivery>(&job_key(&target.device, job))
            .await?
        {
            Some((_, job)) => job.status.map(|s| s.reason).unwrap_or_default(),
            None => Vec::new(),
        };
        latest_errors.push(api::TargetError {
            device: target.device.to_string(),
            attempt: target.attempt,
            error: target.last_error.clone().unwrap_or_default(),
            reason,
        });
    }
    // Every waiting target is counted by its reason; only the 20 shown
    // are put in words.
    let waits = Waits::new(&state, &deployment, &targets, now).await?;
    let mut holds: Vec<(usize, drover_rules::deployment::Wait)> = targets
        .iter()
        .enumerate()
        .filter_map(|(index, (_, _, target))| Some((index, waits.of(target)?)))
        .collect();
    let mut waiting_by_code: std::collections::BTreeMap<String, u64> = Default::default();
    for (_, wait) in &holds {
        *waiting_by_code.entry(wait.code().to_owned()).or_default() += 1;
    }
    holds.sort_by_key(|(index, wait)| (wait.until().is_none(), wait.until(), *index));
    let windows: Vec<api::WindowNow> = match &deployment.spec.maintenance_window {
        None => Vec::new(),
        Some(window) => {
            let zones = zones
                .into_iter()
                .map(|(z, n)| (Some(z), n as u64))
                .collect();
            windows_now(window, &zones, now)
        }
    };
    let unmatched = match &deployment.spec.targets {
        drover_rules::deployment::Targeting::Filter(filter) if filter.groups.len() > 1 => {
            let devices = crate::patch_labels::placed_devices(&state.db).await?;
            drover_rules::unmatched::empty_groups(&filter.groups, &devices)
        }
        _ => Vec::new(),
    };
    Ok(Json(api::DeploymentDescription {
        unmatched,
        deployment: convert::deployment(&deployment),
        windows,
        latest_errors,
        waiting_retry: waiting
            .iter()
            .take(20)
            .map(|(at, t)| api::WaitingRetry {
                device: t.device.to_string(),
                attempt: t.attempt,
                next_attempt_at: *at,
                last_error: t.last_error.clone(),
            })
            .collect(),
        waiting_retry_total: waiting.len() as u64,
        waiting: holds
            .into_iter()
            .take(20)
            .map(|(index, wait)| api::DeviceWait {
                device: targets[index].2.device.to_string(),
                wait: convert::wait(&wait),
            })
            .collect(),
        waiting_by_code,
    }))
}

pub(super) async fn cancel_deployment(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<Changed>), ApiError> {
    let key = drover_rules::records::deployment_key(&name);
    let (answer, deployment) =
        cancel::<DeploymentRecord>(&state, Kind::Deployment, &key, &name, |d| {
            &mut d.status.phase
        })
        .await?;
    let keys: Vec<String> = targets(&state, deployment.uid)
        .await?
        .into_iter()
        .filter_map(|(_, _, target)| target.job.map(|job| job_key(&target.device, job)))
        .collect();
    state.db.request_cancels(&keys, Timestamp::now()).await?;
    Ok(answer)
}

/// "Add new devices": the engine runs the deployment's targeting again and
/// adds the devices that match now and are not targets yet.
pub(super) async fn add_new_devices(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<Changed>), ApiError> {
    let key = drover_rules::records::deployment_key(&name);
    let mut refused = None;
    let updated = state
        .db
        .update::<DeploymentRecord, _>(&key, |current| {
            let mut deployment = current?;
            if deployment.status.phase.is_terminal() {
                refused = Some(format!(
                    "Deployment {name} has finished ({:?}); new devices cannot join it",
                    deployment.status.phase
                ));
                return None;
            }
            deployment.add_requests += 1;
            Some(deployment)
        })
        .await?;
    if let Some(refused) = refused {
        return Err(ApiError(StatusCode::CONFLICT, refused));
    }
    let Some(deployment) = updated else {
        return Err(not_found(format!("Deployment {name}")));
    };
    // The store's change feed brings the request to the engine.
    Ok((
        StatusCode::ACCEPTED,
        Json(Changed {
            request: Some(u64::from(deployment.add_requests)),
            ..Changed::new(Kind::Deployment, name, Outcome::AddNewDevicesRequested)
        }),
    ))
}
