//! The operators' HTTP/JSON API under `/api/v1`, behind a bearer token.

use crate::auth::Secrets;
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
/// Upper bound of a request body.
const MAX_BODY_BYTES: usize = 256 * 1024;

#[derive(Clone)]
pub struct ApiState {
    pub db: Db,
    pub secrets: Arc<Secrets>,
    pub engine: Arc<Engine>,
    pub engine_wake: Arc<Notify>,
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
        .route("/devices", get(list_devices))
        .route("/devices/{id}", get(get_device))
        .route("/apply", post(apply))
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

async fn list_devices(State(state): State<ApiState>) -> Result<Json<Vec<DeviceRecord>>, ApiError> {
    let devices = state.db.list::<DeviceRecord>("devices/")?;
    Ok(Json(devices.into_iter().map(|(_, _, d)| d).collect()))
}

async fn get_device(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<DeviceRecord>, ApiError> {
    let id = DeviceId::new(id).map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
    match state.db.get::<DeviceRecord>(&device_key(&id))? {
        Some((_, device)) => Ok(Json(device)),
        None => Err(not_found(format!("device {id}"))),
    }
}

async fn apply(
    State(state): State<ApiState>,
    Json(body): Json<Value>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let manifest =
        manifest::parse(body).map_err(|e| ApiError(StatusCode::UNPROCESSABLE_ENTITY, e))?;
    match manifest {
        Manifest::TaskRun { name, spec } => {
            let key = run_key(&name);
            if let Some((_, existing)) = state.db.get::<TaskRunRecord>(&key)? {
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
            match state.db.put(&key, &run, 0) {
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
                })?;
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

async fn list_runs(State(state): State<ApiState>) -> Result<Json<Vec<Value>>, ApiError> {
    let runs = state.db.list::<TaskRunRecord>("runs/")?;
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
    match state.db.get::<TaskRunRecord>(&run_key(&name))? {
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
    let Some((_, run)) = state.db.get::<TaskRunRecord>(&run_key(&name))? else {
        return Err(not_found(format!("TaskRun {name}")));
    };
    let plan = state.engine.load_plan(&run)?;
    let limit = page.limit.unwrap_or(100).min(MAX_PAGE);
    let mut items = Vec::new();
    for target in plan.iter().skip(page.offset).take(limit) {
        let job = state
            .db
            .get::<JobDelivery>(&job_key(&target.device, run.uid))?
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
