//! The operators' HTTP/JSON API under `/api/v1`, behind a bearer token.

use crate::auth::Secrets;
use crate::dispatch::Presence;
use crate::engine::Engine;
use crate::manifest::{self, Manifest};
use crate::records::{
    Db, DbError, DeviceRecord, JobDelivery, RunStatus, TaskRunRecord, device_key, job_key, run_key,
};
use agent_core::{DeviceId, JobId};
use axum::extract::{Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use jiff::Timestamp;
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use tokio::sync::Notify;

/// Upper bound of targets one page lists.
pub const MAX_PAGE: usize = 500;
/// Upper bound of a request body: a List of 20,000 devices fits.
const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;
/// Upper bound of manifests in one List.
const MAX_LIST_ITEMS: usize = 20_000;

#[derive(Clone)]
pub struct ApiState {
    pub db: Db,
    pub secrets: Arc<Secrets>,
    pub engine: Arc<Engine>,
    pub engine_wake: Arc<Notify>,
    /// Live presence on this replica: fresher than the stored times.
    pub presence: Arc<Presence>,
}

pub struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

impl From<DbError> for ApiError {
    fn from(e: DbError) -> Self {
        ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
    }
}

fn not_found(what: String) -> ApiError {
    ApiError(StatusCode::NOT_FOUND, format!("{what} not found"))
}

pub fn router(state: ApiState) -> Router {
    let api = Router::new()
        .route("/summary", get(summary))
        .route("/devices", get(list_devices))
        .route("/devices/{id}", get(get_device))
        .route("/apply", post(apply))
        .route("/taskschedules", get(list_schedules))
        .route("/taskschedules/{name}", get(get_schedule))
        .route("/taskruns", get(list_runs))
        .route("/taskruns/{name}", get(get_run))
        .route("/taskruns/{name}/targets", get(run_targets))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_operator,
        ))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .nest("/api/v1", api)
        .with_state(state)
}

async fn require_operator(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if !state.secrets.verify_operator(token) {
        return ApiError(
            StatusCode::UNAUTHORIZED,
            "missing or bad operator token (Authorization: Bearer <token>)".into(),
        )
        .into_response();
    }
    next.run(request).await
}

/// Fleet counts, cheap enough to poll.
async fn summary(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    let devices = state.db.list::<DeviceRecord>("devices/").await?;
    let present = devices.iter().filter(|(_, _, d)| d.agent_present).count();
    Ok(Json(json!({
        "devices": devices.len(),
        "agentsPresent": present,
        "connectedHere": state.presence.connected(),
    })))
}

/// A device as stored, with the fresher times this replica has seen.
fn with_presence(state: &ApiState, mut device: DeviceRecord) -> DeviceRecord {
    if let Some(live) = state.presence.get(&device.id) {
        device.last_seen = device.last_seen.max(Some(live.last_seen));
        device.last_heartbeat = device.last_heartbeat.max(live.last_heartbeat);
    }
    device
}

async fn list_devices(State(state): State<ApiState>) -> Result<Json<Vec<DeviceRecord>>, ApiError> {
    let devices = state.db.list::<DeviceRecord>("devices/").await?;
    Ok(Json(
        devices
            .into_iter()
            .map(|(_, _, d)| with_presence(&state, d))
            .collect(),
    ))
}

async fn get_device(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<DeviceRecord>, ApiError> {
    let id = DeviceId::new(id).map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
    match state.db.get::<DeviceRecord>(&device_key(&id)).await? {
        Some((_, device)) => Ok(Json(with_presence(&state, device))),
        None => Err(not_found(format!("device {id}"))),
    }
}

/// Applies one manifest, a JSON array of them, or a `kind: List` with
/// `items` (what `drover apply -f` sends for a file of several documents):
/// many devices register in one request.
async fn apply(
    State(state): State<ApiState>,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let body = crate::strict_json::parse(&body).map_err(|e| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("the request body is not acceptable JSON: {e}"),
        )
    })?;
    let items = match body {
        Value::Array(items) => items,
        Value::Object(ref map) if map.get("kind").and_then(Value::as_str) == Some("List") => {
            match map.get("items") {
                Some(Value::Array(items)) => items.clone(),
                _ => {
                    return Err(ApiError(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "a List needs an array `items`".into(),
                    ));
                }
            }
        }
        single => return apply_one(&state, single).await,
    };
    if items.len() > MAX_LIST_ITEMS {
        return Err(ApiError(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("at most {MAX_LIST_ITEMS} manifests per request"),
        ));
    }
    // Every manifest is checked before any is applied.
    let mut manifests = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        manifests.push(manifest::parse(item.clone()).map_err(|e| {
            ApiError(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("item {index}: {e}"),
            )
        })?);
    }
    // Devices go in together: one commit for the lot.
    let devices: Vec<&Manifest> = manifests
        .iter()
        .filter(|m| matches!(m, Manifest::Device { .. }))
        .collect();
    let mut device_results = apply_devices(&state, &devices).await?.into_iter();
    let mut results = Vec::with_capacity(items.len());
    for (item, manifest) in items.into_iter().zip(&manifests) {
        if matches!(manifest, Manifest::Device { .. }) {
            results.push(device_results.next().unwrap_or(Value::Null));
        } else {
            let (_, Json(result)) = apply_one(&state, item).await?;
            results.push(result);
        }
    }
    Ok((
        StatusCode::OK,
        Json(json!({"kind": "List", "items": results})),
    ))
}

/// Creates or configures many devices in one commit (retried for those whose
/// record changed meanwhile, as an agent's hello may do).
async fn apply_devices(state: &ApiState, manifests: &[&Manifest]) -> Result<Vec<Value>, ApiError> {
    let mut results: Vec<Value> = vec![Value::Null; manifests.len()];
    let mut todo: Vec<usize> = (0..manifests.len()).collect();
    for _ in 0..10 {
        if todo.is_empty() {
            break;
        }
        let mut ops = Vec::with_capacity(todo.len());
        let mut created = Vec::with_capacity(todo.len());
        for &index in &todo {
            let Manifest::Device { id, labels, spec } = manifests[index] else {
                continue;
            };
            let current = state.db.get::<DeviceRecord>(&device_key(id)).await?;
            let (expected, mut device) =
                current.unwrap_or_else(|| (0, DeviceRecord::new(id.clone())));
            created.push(expected == 0);
            device.groups = spec.groups.iter().cloned().collect();
            device.labels = labels.clone();
            device.time_zone = spec.time_zone.clone();
            device.decommissioned = spec.decommissioned;
            ops.push(crate::store::Op::Put {
                key: device_key(id),
                value: Db::encode(&device)?,
                expected,
            });
        }
        let outcomes = state.db.commit(ops).await?;
        let mut again = Vec::new();
        for ((index, created), outcome) in todo.iter().zip(created).zip(outcomes) {
            let Manifest::Device { id, .. } = manifests[*index] else {
                continue;
            };
            match outcome {
                Ok(_) => {
                    let result = if created { "created" } else { "configured" };
                    results[*index] =
                        json!({"kind": "Device", "name": id.to_string(), "result": result});
                }
                Err(e) if e.is_conflict() => again.push(*index),
                Err(e) => return Err(DbError::from(e).into()),
            }
        }
        todo = again;
    }
    if !todo.is_empty() {
        return Err(ApiError(
            StatusCode::CONFLICT,
            "some devices kept changing; apply again".into(),
        ));
    }
    state.engine_wake.notify_one();
    Ok(results)
}

async fn apply_one(state: &ApiState, body: Value) -> Result<(StatusCode, Json<Value>), ApiError> {
    let manifest =
        manifest::parse(body).map_err(|e| ApiError(StatusCode::UNPROCESSABLE_ENTITY, e))?;
    match manifest {
        Manifest::TaskRun { name, spec } => {
            let key = run_key(&name);
            if let Some((_, existing)) = state.db.get::<TaskRunRecord>(&key).await? {
                if existing.spec == spec {
                    return Ok((
                        StatusCode::OK,
                        Json(
                            json!({"kind": "TaskRun", "name": name, "result": "unchanged", "uid": existing.uid.to_string()}),
                        ),
                    ));
                }
                return Err(ApiError(
                    StatusCode::CONFLICT,
                    format!(
                        "the spec of TaskRun {name} is immutable; apply a run with a new name instead"
                    ),
                ));
            }
            let run = TaskRunRecord {
                name: name.clone(),
                uid: JobId::random(),
                created_at: Timestamp::now(),
                spec,
                status: RunStatus::planning(),
            };
            match state.db.put(&key, &run, 0).await {
                Ok(_) => {}
                Err(DbError::Kv(e)) if e.is_conflict() => {
                    return Err(ApiError(
                        StatusCode::CONFLICT,
                        format!("TaskRun {name} was created concurrently"),
                    ));
                }
                Err(e) => return Err(e.into()),
            }
            state.engine_wake.notify_one();
            Ok((
                StatusCode::CREATED,
                Json(
                    json!({"kind": "TaskRun", "name": name, "result": "created", "uid": run.uid.to_string()}),
                ),
            ))
        }
        Manifest::TaskSchedule { name, spec } => {
            let key = crate::records::schedule_key(&name);
            let mut result = "configured";
            state
                .db
                .update::<crate::schedule::TaskScheduleRecord, _>(&key, |current| {
                    Some(match current {
                        // The schedule may change (suspend, cadence, template);
                        // the runs it made never do.
                        Some(mut existing) => {
                            if existing.spec == spec {
                                result = "unchanged";
                                return None;
                            }
                            existing.spec = spec.clone();
                            existing
                        }
                        None => {
                            result = "created";
                            crate::schedule::TaskScheduleRecord {
                                name: name.clone(),
                                created_at: Timestamp::now(),
                                spec: spec.clone(),
                                status: Default::default(),
                            }
                        }
                    })
                })
                .await?;
            state.engine_wake.notify_one();
            let code = if result == "created" {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok((
                code,
                Json(json!({"kind": "TaskSchedule", "name": name, "result": result})),
            ))
        }
        Manifest::Device { id, labels, spec } => {
            let mut created = false;
            state
                .db
                .update::<DeviceRecord, _>(&device_key(&id), |current| {
                    created = current.is_none();
                    let mut device = current.unwrap_or_else(|| DeviceRecord::new(id.clone()));
                    device.groups = spec.groups.iter().cloned().collect();
                    device.labels = labels.clone();
                    device.time_zone = spec.time_zone.clone();
                    device.decommissioned = spec.decommissioned;
                    Some(device)
                })
                .await?;
            // Group changes matter to runs waiting to release (revocation).
            state.engine_wake.notify_one();
            let result = if created { "created" } else { "configured" };
            Ok((
                StatusCode::OK,
                Json(json!({"kind": "Device", "name": id.to_string(), "result": result})),
            ))
        }
    }
}

async fn list_schedules(State(state): State<ApiState>) -> Result<Json<Vec<Value>>, ApiError> {
    let now = Timestamp::now();
    let schedules = state
        .db
        .list::<crate::schedule::TaskScheduleRecord>("schedules/")
        .await?;
    Ok(Json(
        schedules
            .iter()
            .map(|(_, _, s)| manifest::render_schedule(s, now))
            .collect(),
    ))
}

async fn get_schedule(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    match state
        .db
        .get::<crate::schedule::TaskScheduleRecord>(&crate::records::schedule_key(&name))
        .await?
    {
        Some((_, schedule)) => Ok(Json(manifest::render_schedule(&schedule, Timestamp::now()))),
        None => Err(not_found(format!("TaskSchedule {name}"))),
    }
}

async fn list_runs(State(state): State<ApiState>) -> Result<Json<Vec<Value>>, ApiError> {
    let runs = state.db.list::<TaskRunRecord>("runs/").await?;
    Ok(Json(
        runs.iter()
            .map(|(_, _, r)| manifest::render_run(r))
            .collect(),
    ))
}

async fn get_run(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    match state.db.get::<TaskRunRecord>(&run_key(&name)).await? {
        Some((_, run)) => Ok(Json(manifest::render_run(&run))),
        None => Err(not_found(format!("TaskRun {name}"))),
    }
}

#[derive(Deserialize)]
struct Page {
    #[serde(default)]
    offset: usize,
    limit: Option<usize>,
}

/// One page of a run's frozen plan with each target's delivery and status.
async fn run_targets(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    Query(page): Query<Page>,
) -> Result<Json<Value>, ApiError> {
    let Some((_, run)) = state.db.get::<TaskRunRecord>(&run_key(&name)).await? else {
        return Err(not_found(format!("TaskRun {name}")));
    };
    let plan = state.engine.load_plan(&run).await?;
    let limit = page.limit.unwrap_or(100).min(MAX_PAGE);
    let mut items = Vec::new();
    for target in plan.iter().skip(page.offset).take(limit) {
        let job = state
            .db
            .get::<JobDelivery>(&job_key(&target.device, run.uid))
            .await?
            .map(|(_, j)| j);
        items.push(json!({
            "device": target.device,
            "canary": target.canary,
            "released": job.is_some(),
            "delivery": job.as_ref().map(|j| &j.delivery),
            "status": job.as_ref().and_then(|j| j.status.as_ref()),
        }));
    }
    Ok(Json(
        json!({"total": plan.len(), "offset": page.offset, "items": items}),
    ))
}
