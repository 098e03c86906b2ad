//! The operators' HTTP/JSON API under `/api/v1`, behind a bearer token.

use crate::auth::Secrets;
use crate::dispatch::Presence;
use crate::engine::Engine;
use crate::manifest::{self, Manifest};
use axum::extract::{Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use drover_api::changes::{Changed, Kind, Outcome};
use drover_api::fleet;
use drover_contract::link::LinkState;
use drover_model::{DeviceId, JobId};
use drover_rules::deployment::{DeploymentRecord, TargetRecord};
use drover_rules::records::PackageRecord;
use drover_rules::records::{
    DeviceRecord, JobDelivery, Phase, RunStatus, TaskRunRecord, device_key, job_key, run_key,
};
use drover_store::db::{Db, DbError};
use jiff::Timestamp;
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use tokio::sync::Notify;

pub mod access;
mod apply;
pub(crate) mod convert;
mod deletes;
mod deployments;
mod devices;
pub(crate) mod enrollment;
mod logs;
pub mod openapi;
mod operators;
mod preview;
mod runs;
mod schedules;
pub mod tokens;
pub mod ui;

use crate::http::ApiError;

use access::require_operator;
use apply::*;
use deletes::*;
use deployments::*;
use devices::*;
use enrollment::*;
use logs::*;
use operators::*;
use runs::*;
use schedules::*;

/// Upper bound of targets one page lists.
pub const MAX_PAGE: usize = 500;
/// Upper bound of a request body: a List of 20,000 devices fits.
const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;
/// Upper bound of manifests in one List.
const MAX_LIST_ITEMS: usize = 20_000;

/// `?limit=N&continue=NAME` on a listing, in Kubernetes' words. Without
/// `limit`, every object; with it, at most that many (and at most
/// [`MAX_PAGE`]) in name order, and when more follow a `Link: <…>;
/// rel="next"` header (as GitHub's API pages) giving the next page's
/// address. The body stays a JSON array either way.
#[derive(Deserialize, Default)]
pub(super) struct ListQuery {
    limit: Option<usize>,
    #[serde(rename = "continue")]
    after: Option<String>,
}

/// One page of records under `prefix`, and the name the next page
/// continues after when more follow.
async fn list_page<T: drover_store::stored::Record>(
    db: &Db,
    prefix: &str,
    query: &ListQuery,
) -> Result<(Vec<T>, Option<String>), ApiError> {
    let limit = match query.limit {
        Some(0) => {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                format!("limit must be 1 to {MAX_PAGE} (leave it out for every object)"),
            ));
        }
        Some(limit) => limit.min(MAX_PAGE),
        None => usize::MAX,
    };
    let (page, more) = db.page::<T>(prefix, query.after.as_deref(), limit).await?;
    let next = more
        .then(|| {
            page.last()
                .map(|(key, _, _)| key[prefix.len()..].to_owned())
        })
        .flatten();
    let records = page.into_iter().map(|(_, _, record)| record).collect();
    Ok((records, next))
}

/// A listing's answer: the objects, and the next page's link when there is one.
fn listed<T: serde::Serialize>(
    path: &str,
    query: &ListQuery,
    items: Vec<T>,
    next: Option<String>,
) -> Response {
    let mut response = Json(items).into_response();
    if let (Some(next), Some(limit)) = (next, query.limit) {
        let page = form_urlencoded::Serializer::new(String::new())
            .append_pair("limit", &limit.min(MAX_PAGE).to_string())
            .append_pair("continue", &next)
            .finish();
        if let Ok(value) =
            axum::http::HeaderValue::from_str(&format!("</api/v1{path}?{page}>; rel=\"next\""))
        {
            response.headers_mut().insert(header::LINK, value);
        }
    }
    response
}

#[derive(Clone)]
pub struct ApiState {
    /// The agent links, for `/healthz` and the metrics.
    pub links: Vec<Arc<dyn drover_contract::link::AgentLinks>>,
    pub db: Db,
    /// The fleet's patch facts in memory, for the fleet views.
    pub patch_index: Arc<crate::patch_index::PatchIndex>,
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
    pub patch_alerts: drover_rules::patch::AlertLimits,
    /// The dashboard's cookie is `Secure` (the API speaks https).
    pub secure_cookies: bool,
    /// Failed dashboard logins per client address.
    pub logins: Arc<ui::LoginLimiter>,
    /// The package store's quota and the uploads' stall timeout.
    pub uploads: crate::packages::UploadLimits,
    /// This replica's id, in the audit log's entries.
    pub replica: String,
    /// What each caller may still add to the audit log.
    pub budgets: Arc<crate::audit::AuditBudgets>,
    /// The package store's quota, shared by the uploads under way.
    pub package_quota: Arc<crate::packages::PackageQuota>,
    /// What every device's agent config pins (`GET /agent-trust`).
    pub agent_trust: Arc<drover_api::enrollment::AgentTrust>,
}

/// The API's OpenAPI document (`openapi.rs`).
async fn openapi_json() -> Response {
    static DOCUMENT: std::sync::LazyLock<String> = std::sync::LazyLock::new(openapi::document);
    (
        [(header::CONTENT_TYPE, "application/json")],
        DOCUMENT.as_str(),
    )
        .into_response()
}

/// An agent pointed at the operators' API instead of the agents' port: a
/// wrong port, told apart from a wrong token (421 Misdirected Request,
/// which the agent turns into that sentence).
async fn agents_port_elsewhere() -> ApiError {
    ApiError(
        StatusCode::MISDIRECTED_REQUEST,
        "this is the control plane's operators' API, not its agents' port: agents connect to \
         the address of `drover serve --agent-listen` (port 7181 by default)"
            .into(),
    )
}

/// What a job did, in the one line every view shows (the rules' words).
fn result_text(job: Option<&JobDelivery>) -> Option<String> {
    drover_rules::outcome::result_line(job?.status.as_ref()?.output.as_ref())
}

fn not_found(what: String) -> ApiError {
    ApiError(StatusCode::NOT_FOUND, format!("{what} not found"))
}

pub fn router(state: ApiState) -> Router {
    let api = Router::new()
        .route("/summary", get(summary))
        .route("/devices", get(list_devices))
        .route("/devices/page", get(device_page))
        .route("/devices/token-generations", get(token_generations))
        .route("/alerts", get(list_alerts))
        .route("/alerts/ack", post(ack_alert))
        .route("/devices/{id}", get(get_device).delete(delete_device))
        .route("/devices/{id}/inventory", get(get_inventory))
        .route("/devices/{id}/jobs", get(device_jobs))
        .route("/devices/{id}/logs", get(device_logs))
        .route("/devices/{id}/assessment", get(get_assessment))
        .route("/devices/{id}/rotate-token", post(rotate_device_token))
        .route("/devices/{id}/accept", post(accept_device))
        .route("/devices/{id}/reject", post(reject_device))
        .route("/device-keys", get(list_device_keys).post(preauthorize_key))
        .route("/agent-trust", get(agent_trust))
        .route(
            "/enrollment-tokens",
            get(list_enrollment_tokens).post(create_enrollment_token),
        )
        .route(
            "/enrollment-tokens/{name}/revoke",
            post(revoke_enrollment_token),
        )
        .route("/patch-status", get(patch_status))
        .route("/apply", post(apply))
        .route("/taskschedules", get(list_schedules))
        .route(
            "/taskschedules/{name}",
            get(get_schedule).delete(delete_schedule),
        )
        .route("/taskschedules/{name}/suspend", post(suspend_schedule))
        .route("/taskruns", get(list_runs))
        .route("/taskruns/{name}", get(get_run).delete(delete_run))
        .route("/taskruns/{name}/targets", get(run_targets))
        .route("/taskruns/{name}/cancel", post(cancel_run))
        .route("/deployments", get(list_deployments))
        .route(
            "/deployments/{name}",
            get(get_deployment).delete(delete_deployment),
        )
        .route("/deployments/{name}/targets", get(deployment_targets))
        .route("/deployments/{name}/describe", get(describe_deployment))
        .route("/deployments/{name}/add-new-devices", post(add_new_devices))
        .route("/deployments/{name}/cancel", post(cancel_deployment))
        // The body is streamed to disk and bounded there, not by the limit below.
        .route("/packages", get(list_packages).post(upload_package))
        .route("/secrets", get(list_secrets))
        .route("/secrets/{name}", axum::routing::delete(delete_secret))
        .route("/packages/{id}", axum::routing::delete(delete_package))
        .route("/operators", get(list_operators).post(add_operator))
        .route("/operators/{name}/rotate", post(rotate_operator))
        .route("/operators/{name}/revoke", post(revoke_operator))
        .route("/whoami", get(whoami))
        .route("/audit", get(read_audit))
        .route("/openapi.json", get(openapi_json))
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
        .route("/agent/v1/ws/{device}", get(agents_port_elsewhere))
        .route("/agent/v1/enroll/{device}", get(agents_port_elsewhere))
        .nest("/api/v1", api)
        .merge(metrics)
        .merge(ui::router(state.clone()))
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

/// Fleet counts, cheap enough to poll.
async fn summary(State(state): State<ApiState>) -> Result<Json<fleet::Summary>, ApiError> {
    let devices = state.db.list::<DeviceRecord>("devices/").await?;
    let present = devices.iter().filter(|(_, _, d)| d.agent_present).count();
    Ok(Json(fleet::Summary {
        devices: devices.len() as u64,
        agents_present: present as u64,
        connected_here: state
            .presence
            .connected()
            .into_iter()
            .map(|(transport, count)| (transport.as_str().to_owned(), count as u64))
            .collect(),
        engine: state.engine.stats.api(),
    }))
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
        let labels = vec![("transport", link.transport().as_str().to_owned())];
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
    for (name, count) in fleet_patch_status(&state, now).await?.by_state() {
        metrics
            .patch
            .get_or_create(&vec![("state", name.into())])
            .set(i64::from(count));
    }
    metrics.agents.clear();
    for (transport, count) in state.presence.connected() {
        metrics
            .agents
            .get_or_create(&vec![("transport", transport.as_str().into())])
            .set(count as i64);
    }
    Ok((
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        metrics.encode(),
    )
        .into_response())
}

/// What needs an operator's eye now (see `alerts.rs`).
async fn list_alerts(State(state): State<ApiState>) -> Result<Json<fleet::Alerts>, ApiError> {
    let now = Timestamp::now();
    let online = |id: &DeviceId, seen: Option<Timestamp>| state.presence.online(id, seen, now);
    let fleet = state.patch_index.current().await?;
    let (alerts, offline) = crate::alerts::list(
        &state.db,
        &fleet,
        now,
        state.offline_alert,
        &state.patch_alerts,
        &online,
    )
    .await?;
    Ok(Json(fleet::Alerts {
        items: alerts,
        offline_devices: offline as u64,
        offline_after_minutes: u64::try_from(state.offline_alert.as_secs() / 60).unwrap_or(0),
    }))
}

/// Acknowledges the alert `kind` about `resource` as it stands now: it is
/// listed as acknowledged (by whom, when) while its condition lasts, and
/// raised again once the condition clears and returns.
async fn ack_alert(
    State(state): State<ApiState>,
    axum::Extension(caller): axum::Extension<access::Caller>,
    Json(request): Json<fleet::AckRequest>,
) -> Result<Json<fleet::AckAnswer>, ApiError> {
    let now = Timestamp::now();
    let online = |id: &DeviceId, seen: Option<Timestamp>| state.presence.online(id, seen, now);
    let fleet = state.patch_index.current().await?;
    let (alerts, _) = crate::alerts::list(
        &state.db,
        &fleet,
        now,
        state.offline_alert,
        &state.patch_alerts,
        &online,
    )
    .await?;
    let Some(alert) = alerts
        .iter()
        .find(|a| a.kind == request.kind && a.resource == request.resource)
    else {
        return Err(not_found(format!(
            "a {} alert about {} (none is raised now)",
            request.kind, request.resource
        )));
    };
    let by = format!("{} ({})", caller.who(), caller.via.name());
    let ack = drover_rules::records::AlertAck {
        kind: request.kind.clone(),
        resource: request.resource.clone(),
        instance: alert.at,
        by: by.clone(),
        at: now,
    };
    let key = drover_rules::records::ack_key(&request.kind, &request.resource);
    state
        .db
        .update::<drover_rules::records::AlertAck, _>(&key, |_| Some(ack.clone()))
        .await?;
    tracing::info!(kind = %request.kind, resource = %request.resource, %by, "alert acknowledged");
    Ok(Json(fleet::AckAnswer {
        kind: request.kind,
        resource: request.resource,
        acknowledged: fleet::Acknowledged { by, at: now },
    }))
}

/// Secrets by name and keys; values never leave the control plane here.
async fn list_secrets(
    State(state): State<ApiState>,
    Query(query): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let (secrets, next) =
        list_page::<drover_rules::records::SecretRecord>(&state.db, "secrets/", &query).await?;
    let items = secrets
        .into_iter()
        .map(|s| fleet::SecretSummary {
            name: s.name,
            keys: s.keys,
            updated_at: s.updated_at,
        })
        .collect::<Vec<_>>();
    Ok(listed("/secrets", &query, items, next))
}

/// Stores an uploaded .deb (the request body); the audit log keeps its id
/// and SHA-256.
async fn upload_package(
    State(state): State<ApiState>,
    request: Request,
) -> Result<Response, ApiError> {
    let (record, created) = crate::packages::upload(
        &state.db,
        &state.data,
        state.uploads,
        &state.package_quota,
        request.into_body(),
    )
    .await?;
    let (code, result) = if created {
        (StatusCode::CREATED, "created")
    } else {
        (StatusCode::OK, "unchanged")
    };
    let mut response = access::noted(
        (code, Json(convert::package(&record))).into_response(),
        "Package",
        &record.id,
        result,
    );
    if let Some(note) = response.extensions_mut().get_mut::<access::AuditNote>() {
        note.body_digest = Some(record.sha256.clone());
    }
    Ok(response)
}

async fn list_packages(
    State(state): State<ApiState>,
    Query(query): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let (packages, next) = list_page::<PackageRecord>(&state.db, "packages/", &query).await?;
    let items: Vec<_> = packages.iter().map(convert::package).collect();
    Ok(listed("/packages", &query, items, next))
}

/// Cancels a run or deployment: it enters `Canceling` and the engine does
/// the rest (releases nothing more, asks every job that is out to cancel,
/// ends it Failed with reason `Canceled` once they are decided). Asking
/// again is harmless; a finished one is refused.
async fn cancel<T: drover_store::stored::Record + Clone + Send + Sync + 'static>(
    state: &ApiState,
    kind: Kind,
    key: &str,
    name: &str,
    phase: fn(&mut T) -> &mut Phase,
) -> Result<((StatusCode, Json<Changed>), T), ApiError> {
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
        Outcome::AlreadyCanceling
    } else {
        Outcome::CancelRequested
    };
    tracing::info!(%kind, name, %result, "cancel");
    let mut answer = Changed::new(kind, name, result);
    answer.phase = Some("Canceling".into());
    Ok(((StatusCode::ACCEPTED, Json(answer)), record))
}
