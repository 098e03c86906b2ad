//! The operators' HTTP/JSON API under `/api/v1`, behind a bearer token.

use crate::auth::Secrets;
use crate::db::{Db, DbError};
use crate::deployment::{DeploymentRecord, TargetEnd, TargetRecord};
use crate::dispatch::Presence;
use crate::engine::Engine;
use crate::manifest::{self, Manifest};
use crate::packages::PackageRecord;
use crate::records::{
    DeviceRecord, JobDelivery, Phase, RunStatus, TaskRunRecord, device_key, job_key, run_key,
};
use agent_core::{DeviceId, JobId};
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use drover_contract::link::LinkState;
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
    /// The agent links, for `/healthz` and the metrics.
    pub links: Vec<Arc<dyn drover_contract::link::AgentLinks>>,
    pub db: Db,
    pub secrets: Arc<Secrets>,
    pub engine: Arc<Engine>,
    pub engine_wake: Arc<Notify>,
    /// Live presence on this replica: fresher than the stored times.
    pub presence: Arc<Presence>,
    /// The data directory (package files live there).
    pub data: std::path::PathBuf,
    /// Whether this control plane serves package downloads.
    pub downloads: bool,
    /// Seals Secrets at rest.
    pub vault: Arc<crate::secrets::Vault>,
    /// A device not heard from for this long is an alert.
    pub offline_alert: jiff::SignedDuration,
    /// The dashboard's cookie is `Secure` (the API speaks https).
    pub secure_cookies: bool,
    /// Failed dashboard logins per client address.
    pub logins: Arc<crate::ui::LoginLimiter>,
    /// The package store's quota and the uploads' stall timeout.
    pub uploads: crate::packages::UploadLimits,
}

pub struct ApiError(pub StatusCode, pub String);

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
        .route("/devices/page", get(device_page))
        .route("/alerts", get(list_alerts))
        .route("/devices/{id}", get(get_device).delete(delete_device))
        .route("/devices/{id}/inventory", get(get_inventory))
        .route("/apply", post(apply))
        .route("/taskschedules", get(list_schedules))
        .route("/taskschedules/{name}", get(get_schedule))
        .route("/taskschedules/{name}/suspend", post(suspend_schedule))
        .route("/taskruns", get(list_runs))
        .route("/taskruns/{name}", get(get_run).delete(delete_run))
        .route("/taskruns/{name}/targets", get(run_targets))
        .route("/taskruns/{name}/cancel", post(cancel_run))
        .route("/deployments", get(list_deployments))
        .route("/deployments/{name}", get(get_deployment))
        .route("/deployments/{name}/targets", get(deployment_targets))
        .route("/deployments/{name}/describe", get(describe_deployment))
        .route("/deployments/{name}/add-new-devices", post(add_new_devices))
        .route("/deployments/{name}/cancel", post(cancel_deployment))
        // The body is streamed to disk and bounded there, not by the limit below.
        .route("/packages", get(list_packages).post(upload_package))
        .route("/secrets", get(list_secrets))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_operator,
        ))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES));
    // Prometheus scrapes with the operator token too
    // (`authorization: {credentials_file: …}` in its scrape config).
    let metrics =
        Router::new()
            .route("/metrics", get(metrics))
            .layer(axum::middleware::from_fn_with_state(
                state.clone(),
                require_operator,
            ));
    let secure = state.secure_cookies;
    Router::new()
        .route("/healthz", get(healthz))
        .nest("/api/v1", api)
        .merge(metrics)
        .merge(crate::ui::router(state.clone()))
        .layer(axum::middleware::map_response(
            move |response: Response| async move { security_headers(response, secure) },
        ))
        .with_state(state)
}

/// On every response: no content-type sniffing, no referrer sent to other
/// sites, and over TLS, HSTS (a browser that reached the API over https
/// never falls back to http, where the cookie or token would be seen).
fn security_headers(mut response: Response, tls: bool) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        axum::http::HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        axum::http::HeaderValue::from_static("no-referrer"),
    );
    if tls {
        headers.insert(
            header::STRICT_TRANSPORT_SECURITY,
            axum::http::HeaderValue::from_static("max-age=31536000"),
        );
    }
    response
}

/// The bearer token of a request, or "" (which no check accepts).
pub fn bearer(request: &Request) -> &str {
    bearer_of(request.headers())
}

/// The bearer token in `headers`, or "".
fn bearer_of(headers: &HeaderMap) -> &str {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("")
}

pub async fn require_operator(
    State(state): State<ApiState>,
    request: Request,
    next: Next,
) -> Response {
    let (headers, method) = (request.headers().clone(), request.method().clone());
    match authorize(&state, &headers, &method).await {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

/// The operator's bearer token, or the dashboard's session cookie; with the
/// cookie, a request that changes something must carry the session's CSRF
/// token too (a page on another site can send the cookie, SameSite aside,
/// but cannot read the token or set the header).
async fn authorize(
    state: &ApiState,
    headers: &HeaderMap,
    method: &axum::http::Method,
) -> Result<(), ApiError> {
    if state.secrets.verify_operator(bearer_of(headers)) {
        return Ok(());
    }
    if let Some(session) = crate::ui::session_cookie(headers)
        && crate::ui::session_valid(state, session).await
    {
        let reads = matches!(*method, axum::http::Method::GET | axum::http::Method::HEAD);
        let csrf = headers
            .get(crate::ui::CSRF_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if reads || state.secrets.verify_ui_csrf(session, csrf) {
            return Ok(());
        }
        return Err(ApiError(
            StatusCode::FORBIDDEN,
            format!(
                "a dashboard request that changes something needs the session's {} header",
                crate::ui::CSRF_HEADER
            ),
        ));
    }
    Err(ApiError(
        StatusCode::UNAUTHORIZED,
        "missing or bad operator token (Authorization: Bearer <token>)".into(),
    ))
}

/// Fleet counts, cheap enough to poll.
async fn summary(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    let devices = state.db.list::<DeviceRecord>("devices/").await?;
    let present = devices.iter().filter(|(_, _, d)| d.agent_present).count();
    Ok(Json(json!({
        "devices": devices.len(),
        "agentsPresent": present,
        "connectedHere": state.presence.connected(),
        "engine": state.engine.stats.json(),
    })))
}

/// The process's metrics, with the gauges a scrape computes: devices by
/// state (as `get devices` shows them) and agents connected here.
/// `ok` while every agent link is up; else 503 and a line per link that is
/// not, with why (a broker down, a stalled link reconnecting).
async fn healthz(State(state): State<ApiState>) -> Response {
    let trouble: Vec<String> = state
        .links
        .iter()
        .filter_map(|link| {
            let health = link.health();
            (health.state != LinkState::Up).then(|| {
                format!(
                    "{}: {}{}",
                    link.transport(),
                    health.state.name(),
                    health.reason.map(|r| format!(": {r}")).unwrap_or_default()
                )
            })
        })
        .collect();
    if trouble.is_empty() {
        "ok\n".into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{}\n", trouble.join("\n")),
        )
            .into_response()
    }
}

async fn metrics(State(state): State<ApiState>) -> Result<Response, ApiError> {
    let metrics = crate::metrics::metrics();
    for link in &state.links {
        let health = link.health();
        let labels = vec![("transport", link.transport().to_owned())];
        metrics
            .link_up
            .get_or_create(&labels)
            .set(i64::from(health.state == LinkState::Up));
        metrics
            .link_stalls
            .get_or_create(&labels)
            .set(i64::try_from(health.stalls).unwrap_or(i64::MAX));
        if let Some(at) = health.last_progress {
            metrics
                .link_last_progress
                .get_or_create(&labels)
                .set(at.as_second());
        }
    }
    let now = Timestamp::now();
    let mut states: std::collections::BTreeMap<&'static str, i64> = [
        ("online", 0),
        ("offline", 0),
        ("never connected", 0),
        ("decommissioned", 0),
    ]
    .into_iter()
    .collect();
    for (_, _, device) in state.db.list::<DeviceRecord>("devices/").await? {
        let online = state.presence.online(&device.id, device.last_seen, now);
        *states.entry(device.state(online)).or_default() += 1;
    }
    for (name, count) in states {
        metrics
            .devices
            .get_or_create(&vec![("state", name.replace(' ', "_"))])
            .set(count);
    }
    metrics.agents.clear();
    for (transport, count) in state.presence.connected() {
        metrics
            .agents
            .get_or_create(&vec![("transport", transport.into())])
            .set(count as i64);
    }
    Ok((
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        metrics.encode(),
    )
        .into_response())
}

#[derive(Deserialize)]
struct DevicePage {
    #[serde(default)]
    offset: usize,
    limit: Option<usize>,
    /// Matches the id, a group, a label (`key=value`), the OS or the
    /// agent's version, ignoring case.
    #[serde(default)]
    q: String,
    /// online, offline, never_connected, decommissioned.
    state: Option<String>,
}

/// One page of the fleet for the dashboard, filtered on the server: the
/// fleet may be 20,000 devices. Each device comes with its state and its
/// current (undecided) job, if any.
async fn device_page(
    State(state): State<ApiState>,
    Query(page): Query<DevicePage>,
) -> Result<Json<Value>, ApiError> {
    let now = Timestamp::now();
    let q = page.q.trim().to_lowercase();
    let wanted = page.state.as_deref().map(|s| s.replace('_', " "));
    let mut matching = Vec::new();
    for (_, _, stored) in state.db.list::<DeviceRecord>("devices/").await? {
        let online = state.presence.online(&stored.id, stored.last_seen, now);
        let device = with_presence(&state, stored);
        let device_state = device.state(online);
        if wanted.as_deref().is_some_and(|w| w != device_state) {
            continue;
        }
        if !q.is_empty() && !device_matches(&device, &q) {
            continue;
        }
        matching.push((device, device_state));
    }
    let limit = page.limit.unwrap_or(100).min(MAX_PAGE);
    let mut items = Vec::new();
    for (device, device_state) in matching.iter().skip(page.offset).take(limit) {
        let jobs = state
            .db
            .list::<JobDelivery>(&crate::records::device_jobs_prefix(&device.id))
            .await?;
        let current = jobs.iter().find_map(|(_, _, job)| {
            let decided = job.status.as_ref().is_some_and(|s| s.state.is_terminal())
                || matches!(job.delivery, crate::records::Delivery::Expired { .. });
            (!decided).then(|| {
                let step = job.status.as_ref().and_then(|s| {
                    s.steps
                        .iter()
                        .rfind(|step| step.state != agent_core::StepState::Pending)
                        .map(|step| step.name.clone())
                });
                json!({
                    "run": job.run,
                    "kind": job.intent.kind.name(),
                    "state": job.status.as_ref().map_or("Queued".to_owned(), |s| format!("{:?}", s.state)),
                    "step": step,
                })
            })
        });
        let mut item = serde_json::to_value(device)
            .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        item["state"] = json!(device_state);
        item["currentJob"] = current.unwrap_or(Value::Null);
        items.push(item);
    }
    Ok(Json(json!({
        "total": matching.len(),
        "offset": page.offset,
        "items": items,
    })))
}

fn device_matches(device: &DeviceRecord, q: &str) -> bool {
    let has = |text: &str| text.to_lowercase().contains(q);
    has(device.id.as_str())
        || device.groups.iter().any(|g| has(g))
        || device.labels.iter().any(|(k, v)| has(&format!("{k}={v}")))
        || device.os_release.as_deref().is_some_and(has)
        || device.agent_version.as_deref().is_some_and(has)
}

/// What needs an operator's eye now (see `alerts.rs`).
async fn list_alerts(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    let now = Timestamp::now();
    let online = |device: &DeviceRecord| state.presence.online(&device.id, device.last_seen, now);
    let (alerts, offline) =
        crate::alerts::list(&state.db, now, state.offline_alert, &online).await?;
    Ok(Json(json!({
        "items": alerts,
        "offlineDevices": offline,
        "offlineAfterMinutes": state.offline_alert.as_secs() / 60,
    })))
}

#[derive(Deserialize)]
struct Suspension {
    suspend: bool,
}

/// Suspends a schedule (no new runs; ticks meanwhile are not owed) or
/// resumes it. Its runs are left as they are.
async fn suspend_schedule(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    Json(body): Json<Suspension>,
) -> Result<Json<Value>, ApiError> {
    let key = crate::records::schedule_key(&name);
    let updated = state
        .db
        .update::<crate::schedule::TaskScheduleRecord, _>(&key, |current| {
            let mut schedule = current?;
            if schedule.spec.suspend == body.suspend {
                return None;
            }
            schedule.spec.suspend = body.suspend;
            Some(schedule)
        })
        .await?;
    let Some(schedule) = updated else {
        return Err(not_found(format!("TaskSchedule {name}")));
    };
    Ok(Json(manifest::render_schedule(&schedule, Timestamp::now())))
}

/// A device as stored, with the fresher times this replica has seen.
fn with_presence(state: &ApiState, mut device: DeviceRecord) -> DeviceRecord {
    if let Some(live) = state.presence.get(&device.id) {
        device.last_seen = device.last_seen.max(Some(live.last_seen));
        device.last_heartbeat = device.last_heartbeat.max(live.last_heartbeat);
    }
    device
}

/// Every device as stored, with the fresher times this replica has seen
/// and `online`: its agent is connected here and heard from lately, or
/// (held by another replica) was seen lately.
async fn list_devices(State(state): State<ApiState>) -> Result<Json<Vec<Value>>, ApiError> {
    let devices = state.db.list::<DeviceRecord>("devices/").await?;
    let now = Timestamp::now();
    let mut listed = Vec::with_capacity(devices.len());
    for (_, _, stored) in devices {
        let online = state.presence.online(&stored.id, stored.last_seen, now);
        let mut device = serde_json::to_value(with_presence(&state, stored))
            .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        device["online"] = Value::Bool(online);
        listed.push(device);
    }
    Ok(Json(listed))
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

/// Removes a device from the registry with its inventory and its finished
/// jobs. Refused while one of its jobs is undecided (cancel its run or
/// deployment, or wait). Its token is derived, not stored: an agent that
/// still runs with it registers the device again when it connects, as a
/// kubelet does; decommission the device to refuse it instead.
async fn delete_device(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id = DeviceId::new(id).map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
    let Some((_, device)) = state.db.get::<DeviceRecord>(&device_key(&id)).await? else {
        return Err(not_found(format!("device {id}")));
    };
    let jobs = state
        .db
        .list::<JobDelivery>(&crate::records::device_jobs_prefix(&id))
        .await?;
    let undecided: Vec<String> = jobs
        .iter()
        .filter(|(_, _, job)| {
            !job.status.as_ref().is_some_and(|s| s.state.is_terminal())
                && !matches!(job.delivery, crate::records::Delivery::Expired { .. })
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
    let mut keys: Vec<String> = jobs.into_iter().map(|(key, _, _)| key).collect();
    let job_count = keys.len();
    keys.push(crate::deployment::inventory_key(&id));
    keys.push(device_key(&id));
    state.db.delete_all(&keys).await?;
    tracing::info!(device = %id, jobs = job_count, "device deleted");
    Ok(Json(json!({
        "kind": "Device",
        "name": id,
        "result": "deleted",
        "jobs": job_count,
        "online": online,
    })))
}

/// Deletes a finished task run: its record, its frozen plan and its jobs'
/// records. A run still going is refused: cancel it first.
async fn delete_run(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let Some((_, run)) = state.db.get::<TaskRunRecord>(&run_key(&name)).await? else {
        return Err(not_found(format!("TaskRun {name}")));
    };
    if run.status.phase == Phase::Canceling {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!(
                "TaskRun {name} is still canceling (jobs that had started run to their end); delete it once it has ended"
            ),
        ));
    }
    if !run.status.phase.is_terminal() {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!(
                "TaskRun {name} is {:?}; cancel it first (drover cancel taskrun {name}) and delete it once it has ended",
                run.status.phase
            ),
        ));
    }
    let plan = state.engine.load_plan(&run).await?;
    let job_keys: Vec<String> = plan
        .iter()
        .map(|target| job_key(&target.device, run.uid))
        .collect();
    // Jobs first, the run last: a delete cut short is finished by running
    // it again.
    let jobs = state.db.delete_all(&job_keys).await?;
    let mut plan_keys: Vec<String> = (0..run.status.plan_chunks)
        .map(|index| crate::records::plan_key(run.uid, index))
        .collect();
    plan_keys.push(crate::records::plan_header_key(run.uid));
    state.db.delete_all(&plan_keys).await?;
    state.db.delete_all(&[run_key(&name)]).await?;
    tracing::info!(run = %name, jobs, "run deleted");
    Ok(Json(json!({
        "kind": "TaskRun",
        "name": name,
        "result": "deleted",
        "jobs": jobs,
    })))
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
    for (index, (item, manifest)) in items.into_iter().zip(&manifests).enumerate() {
        if matches!(manifest, Manifest::Device { .. }) {
            results.push(device_results.next().unwrap_or(Value::Null));
            continue;
        }
        let name = item["metadata"]["name"].as_str().unwrap_or("?").to_owned();
        let kind = item["kind"].as_str().unwrap_or("?").to_owned();
        match apply_one(&state, item).await {
            Ok((_, Json(result))) => results.push(result),
            // Stop at the first failure and say what is applied: the items
            // before it, and every device (they went in first, together).
            Err(ApiError(code, error)) => {
                results.extend(device_results);
                let applied: Vec<String> = results
                    .iter()
                    .map(|r| {
                        format!(
                            "{}/{} {}",
                            r["kind"].as_str().unwrap_or("?"),
                            r["name"].as_str().unwrap_or("?"),
                            r["result"].as_str().unwrap_or("?")
                        )
                    })
                    .collect();
                let applied = if applied.is_empty() {
                    "nothing was applied".to_owned()
                } else {
                    format!("applied: {}", applied.join(", "))
                };
                return Err(ApiError(
                    code,
                    format!(
                        "item {index} ({kind}/{name}): {error}; it and the items after it were not applied; {applied}"
                    ),
                ));
            }
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
            let run = TaskRunRecord {
                name: name.clone(),
                uid: JobId::random(),
                created_at: Timestamp::now(),
                spec,
                status: RunStatus::planning(),
            };
            let created =
                create_immutable(state, "TaskRun", &run_key(&name), run, |r| (r.uid, &r.spec))
                    .await?;
            state.engine_wake.notify_one();
            Ok(created)
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
        Manifest::Deployment { name, mut spec } => {
            if let crate::deployment::DeploymentJob::PackageInstallV1(wanted) = &mut spec.job {
                **wanted = resolve_package(state, wanted).await?;
            }
            let deployment = DeploymentRecord {
                name: name.clone(),
                uid: JobId::random(),
                created_at: Timestamp::now(),
                spec,
                add_requests: 0,
                status: crate::deployment::DeploymentStatus::planning(),
            };
            // The store's change feed brings it to the engine.
            let key = crate::records::deployment_key(&name);
            create_immutable(state, "Deployment", &key, deployment, |d| (d.uid, &d.spec)).await
        }
        Manifest::Secret { name, data } => {
            let record = state
                .vault
                .seal(&name, &data)
                .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e))?;
            let key = crate::secrets::secret_key(&name);
            let mut created = false;
            state
                .db
                .update::<crate::secrets::SecretRecord, _>(&key, |current| {
                    created = current.is_none();
                    Some(record.clone())
                })
                .await?;
            let result = if created { "created" } else { "configured" };
            Ok((
                StatusCode::OK,
                Json(
                    json!({"kind": "Secret", "name": name, "result": result, "keys": record.keys}),
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

/// The packages a device's latest inventory refresh reported.
async fn get_inventory(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<crate::deployment::DeviceInventory>, ApiError> {
    let id = DeviceId::new(id).map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
    match state
        .db
        .get::<crate::deployment::DeviceInventory>(&crate::deployment::inventory_key(&id))
        .await?
    {
        Some((_, inventory)) => Ok(Json(inventory)),
        None => Err(not_found(format!(
            "an inventory of device {id} (run an inventoryRefreshV1 job on it)"
        ))),
    }
}

/// A package deployment's job from the store: the manifest names the
/// package (and may pin its version and checksum).
async fn resolve_package(
    state: &ApiState,
    wanted: &agent_core::model::PackageInstall,
) -> Result<agent_core::model::PackageInstall, ApiError> {
    if !state.downloads {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "packageInstallV1: this control plane serves no package downloads; start `drover serve` with --download-listen".into(),
        ));
    }
    let key = crate::packages::package_key(&wanted.package);
    let Some((_, stored)) = state.db.get::<PackageRecord>(&key).await? else {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!(
                "package {} is not in the package store; upload it with `drover packages upload FILE.deb`",
                wanted.package
            ),
        ));
    };
    for (field, pinned, held) in [
        ("version", &wanted.version, &stored.version),
        ("sha256", &wanted.sha256, &stored.sha256),
    ] {
        if !pinned.is_empty() && pinned != held {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                format!(
                    "packageInstallV1.{field} is {pinned}, but the store holds {} with {held}",
                    stored.id
                ),
            ));
        }
    }
    for name in &wanted.secrets {
        if state
            .db
            .get::<crate::secrets::SecretRecord>(&crate::secrets::secret_key(name))
            .await?
            .is_none()
        {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                format!("packageInstallV1.secrets: there is no Secret {name}; apply it first"),
            ));
        }
    }
    Ok(agent_core::model::PackageInstall {
        secrets: wanted.secrets.clone(),
        ..stored.job()
    })
}

/// Secrets by name and keys; values never leave the control plane here.
async fn list_secrets(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    let secrets = state
        .db
        .list::<crate::secrets::SecretRecord>("secrets/")
        .await?;
    Ok(Json(Value::Array(
        secrets
            .into_iter()
            .map(|(_, _, s)| json!({"name": s.name, "keys": s.keys, "updatedAt": s.updated_at}))
            .collect(),
    )))
}

/// Stores an uploaded .deb (the request body).
async fn upload_package(
    State(state): State<ApiState>,
    request: Request,
) -> Result<(StatusCode, Json<PackageRecord>), ApiError> {
    let (record, created) =
        crate::packages::upload(&state.db, &state.data, state.uploads, request.into_body()).await?;
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((code, Json(record)))
}

async fn list_packages(
    State(state): State<ApiState>,
) -> Result<Json<Vec<PackageRecord>>, ApiError> {
    let packages = state.db.list::<PackageRecord>("packages/").await?;
    Ok(Json(packages.into_iter().map(|(_, _, p)| p).collect()))
}

/// Creates a resource whose spec never changes (a TaskRun, a Deployment):
/// the same spec again is `unchanged`, another spec under the name is a 409.
/// `identity` gives a record's uid and spec.
async fn create_immutable<T, S>(
    state: &ApiState,
    kind: &str,
    key: &str,
    new: T,
    identity: impl Fn(&T) -> (JobId, &S),
) -> Result<(StatusCode, Json<Value>), ApiError>
where
    T: crate::stored::Record,
    S: PartialEq,
{
    let name = key.split_once('/').map_or(key, |(_, n)| n);
    if let Some((_, existing)) = state.db.get::<T>(key).await? {
        let (uid, spec) = identity(&existing);
        if spec == identity(&new).1 {
            return Ok((
                StatusCode::OK,
                Json(
                    json!({"kind": kind, "name": name, "result": "unchanged", "uid": uid.to_string()}),
                ),
            ));
        }
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("the spec of {kind} {name} is immutable; apply one with a new name instead"),
        ));
    }
    match state.db.put(key, &new, 0).await {
        Ok(_) => {}
        Err(DbError::Kv(e)) if e.is_conflict() => {
            return Err(ApiError(
                StatusCode::CONFLICT,
                format!("{kind} {name} was created concurrently"),
            ));
        }
        Err(e) => return Err(e.into()),
    }
    Ok((
        StatusCode::CREATED,
        Json(
            json!({"kind": kind, "name": name, "result": "created", "uid": identity(&new).0.to_string()}),
        ),
    ))
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
            "createdAt": job.as_ref().map(|j| j.created_at.to_string()),
            "cancelRequestedAt": job.as_ref().and_then(|j| j.cancel_requested_at.map(|t| t.to_string())),
            "status": job.as_ref().and_then(|j| j.status.as_ref()),
        }));
    }
    Ok(Json(
        json!({"total": plan.len(), "offset": page.offset, "items": items}),
    ))
}

async fn deployment(state: &ApiState, name: &str) -> Result<DeploymentRecord, ApiError> {
    match state
        .db
        .get::<DeploymentRecord>(&crate::records::deployment_key(name))
        .await?
    {
        Some((_, deployment)) => Ok(deployment),
        None => Err(not_found(format!("Deployment {name}"))),
    }
}

async fn list_deployments(State(state): State<ApiState>) -> Result<Json<Vec<Value>>, ApiError> {
    let deployments = state.db.list::<DeploymentRecord>("deployments/").await?;
    Ok(Json(
        deployments
            .iter()
            .map(|(_, _, d)| manifest::render_deployment(d))
            .collect(),
    ))
}

async fn get_deployment(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(manifest::render_deployment(
        &deployment(&state, &name).await?,
    )))
}

/// A target's state as an operator reads it.
fn target_state(target: &TargetRecord, job: Option<&JobDelivery>, now: Timestamp) -> &'static str {
    match (target.end, target.job) {
        (Some(TargetEnd::Succeeded { .. }), _) => "succeeded",
        (Some(TargetEnd::Failed { .. }), _) => "failed",
        (Some(TargetEnd::Expired { .. }), _) => "expired",
        (Some(TargetEnd::Canceled { .. }), _) => "canceled",
        (None, None) if target.next_attempt_at.is_some_and(|at| at > now) => "waitingRetry",
        (None, None) => "pending",
        (None, Some(_)) => match job.map(|j| crate::engine::observe(j, now)) {
            Some(crate::deployment::Observed::Running) => "running",
            _ => "queued",
        },
    }
}

#[derive(Deserialize)]
struct TargetPage {
    #[serde(default)]
    offset: usize,
    limit: Option<usize>,
    /// Only targets in this state (pending, waitingRetry, queued, running,
    /// succeeded, failed, expired).
    state: Option<String>,
}

/// One page of a deployment's targets with each one's attempt and state.
async fn deployment_targets(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    Query(page): Query<TargetPage>,
) -> Result<Json<Value>, ApiError> {
    let deployment = deployment(&state, &name).await?;
    let targets = state
        .db
        .list::<TargetRecord>(&crate::records::targets_prefix(deployment.uid))
        .await?;
    let now = Timestamp::now();
    let limit = page.limit.unwrap_or(100).min(MAX_PAGE);
    let mut items = Vec::new();
    let mut total = 0usize;
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
        if page.state.as_deref().is_some_and(|s| s != target_state) {
            continue;
        }
        total += 1;
        if total <= page.offset || items.len() >= limit {
            continue;
        }
        items.push(json!({
            "device": target.device,
            "state": target_state,
            "attempt": target.attempt,
            "job": target.job.map(|j| j.to_string()),
            "timeZone": target.time_zone,
            "releasedAt": target.released_at.map(|t| t.to_string()),
            "nextAttemptAt": target.next_attempt_at.map(|t| t.to_string()),
            "lastError": target.last_error,
            "delivery": job.as_ref().map(|j| &j.delivery),
            "createdAt": job.as_ref().map(|j| j.created_at.to_string()),
            "status": job.as_ref().and_then(|j| j.status.as_ref()),
        }));
    }
    Ok(Json(
        json!({"total": total, "offset": page.offset, "items": items}),
    ))
}

/// What an operator needs to judge a deployment: its counts, whether each
/// site's window is open now, the latest errors, and the retries waiting.
async fn describe_deployment(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let deployment = deployment(&state, &name).await?;
    let targets = state
        .db
        .list::<TargetRecord>(&crate::records::targets_prefix(deployment.uid))
        .await?;
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
        if let Some(error) = &target.last_error {
            errors
                .push(json!({"device": target.device, "attempt": target.attempt, "error": error}));
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
    let windows: Vec<Value> = match &deployment.spec.maintenance_window {
        None => Vec::new(),
        Some(window) => zones
            .iter()
            .take(100)
            .map(|(zone, count)| {
                let tz = crate::deployment::time_zone(zone).unwrap_or(jiff::tz::TimeZone::UTC);
                json!({
                    "timeZone": zone,
                    "targets": count,
                    "localTime": tz.to_datetime(now).strftime("%Y-%m-%d %H:%M").to_string(),
                    "open": window.contains(&tz, now),
                })
            })
            .collect(),
    };
    Ok(Json(json!({
        "deployment": manifest::render_deployment(&deployment),
        "windows": windows,
        "latestErrors": errors.into_iter().take(10).collect::<Vec<_>>(),
        "waitingRetry": waiting.iter().take(20).map(|(at, t)| json!({
            "device": t.device,
            "attempt": t.attempt,
            "nextAttemptAt": at.to_string(),
            "lastError": t.last_error,
        })).collect::<Vec<_>>(),
        "waitingRetryTotal": waiting.len(),
    })))
}

async fn cancel_run(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let (answer, run) = cancel::<TaskRunRecord>(&state, "TaskRun", &run_key(&name), &name, |r| {
        &mut r.status.phase
    })
    .await?;
    // Every job out is asked before the answer, so a device that comes back
    // right after it gets the order, not the intent; the engine's passes ask
    // any job a pass released meanwhile.
    let keys: Vec<String> = state
        .engine
        .load_plan(&run)
        .await?
        .iter()
        .map(|target| job_key(&target.device, run.uid))
        .collect();
    state.db.request_cancels(&keys, Timestamp::now()).await?;
    Ok(answer)
}

async fn cancel_deployment(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let key = crate::records::deployment_key(&name);
    let (answer, deployment) =
        cancel::<DeploymentRecord>(&state, "Deployment", &key, &name, |d| &mut d.status.phase)
            .await?;
    let keys: Vec<String> = state
        .db
        .list::<TargetRecord>(&crate::records::targets_prefix(deployment.uid))
        .await?
        .into_iter()
        .filter_map(|(_, _, target)| target.job.map(|job| job_key(&target.device, job)))
        .collect();
    state.db.request_cancels(&keys, Timestamp::now()).await?;
    Ok(answer)
}

/// Cancels a run or deployment: it enters `Canceling` and the engine does
/// the rest (releases nothing more, asks every job that is out to cancel,
/// ends it Failed with reason `Canceled` once they are decided). Asking
/// again is harmless; a finished one is refused.
async fn cancel<T: crate::stored::Record + Clone + Send + Sync + 'static>(
    state: &ApiState,
    kind: &str,
    key: &str,
    name: &str,
    phase: fn(&mut T) -> &mut Phase,
) -> Result<((StatusCode, Json<Value>), T), ApiError> {
    let mut refused = None;
    let mut already = false;
    let updated = state
        .db
        .update::<T, _>(key, |current| {
            let mut record = current?;
            let now = *phase(&mut record);
            if now.is_terminal() {
                refused = Some(format!(
                    "{kind} {name} has finished ({now:?}); there is nothing to cancel"
                ));
                return None;
            }
            already = now == Phase::Canceling;
            if already {
                return None;
            }
            *phase(&mut record) = Phase::Canceling;
            Some(record)
        })
        .await?;
    if let Some(refused) = refused {
        return Err(ApiError(StatusCode::CONFLICT, refused));
    }
    let Some(record) = updated else {
        return Err(not_found(format!("{kind} {name}")));
    };
    let result = if already {
        "already canceling"
    } else {
        "cancel requested"
    };
    tracing::info!(kind, name, result, "cancel");
    Ok((
        (
            StatusCode::ACCEPTED,
            Json(json!({"kind": kind, "name": name, "result": result, "phase": "Canceling"})),
        ),
        record,
    ))
}

/// "Add new devices": the engine runs the deployment's targeting again and
/// adds the devices that match now and are not targets yet.
async fn add_new_devices(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let key = crate::records::deployment_key(&name);
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
        Json(
            json!({"kind": "Deployment", "name": name, "result": "add-new-devices requested", "request": deployment.add_requests}),
        ),
    ))
}
