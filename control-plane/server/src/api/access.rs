//! Who may do what, and the record of what was done. Every request to the
//! API names an operator: a bearer token (the CLI, scripts) or a dashboard
//! session, both checked against the operator's record in the store, so a
//! revoke or rotate on one replica is refused on every replica as soon as
//! the store's change feed brings the record (a mirror read per request on
//! NATS). Each route needs a role ([`role_needed`]); a request without it
//! is answered 403 naming the role needed. Every request that changes
//! something, and every refused one, is written to the audit log
//! (`audit/…`, create-only) before it is answered.

use super::ApiState;
use crate::http::{ApiError, bearer_of};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use drover_rules::records::{
    AUDIT_OBJECTS, AuditObject, AuditRecord, BOOTSTRAP_OPERATOR, OperatorRecord, Role,
};
use jiff::Timestamp;
use std::net::SocketAddr;
use std::time::Instant;

use super::tokens::{former_operator_of_token, operator_of_session, operator_of_token, token_name};
pub use crate::audit::AUDIT_PREFIX;
use crate::audit::Sort;
/// How the caller reached the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// A bearer token: the CLI, a script, Prometheus.
    Token,
    /// A dashboard session cookie.
    Dashboard,
}

impl Via {
    pub fn name(self) -> &'static str {
        match self {
            Via::Token => "cli",
            Via::Dashboard => "dashboard",
        }
    }
}

/// The operator a request was made by; handlers find it among the
/// request's extensions.
#[derive(Debug, Clone)]
pub struct Caller {
    pub name: String,
    pub role: Role,
    pub via: Via,
}

impl Caller {
    /// How the audit log and acknowledgements name the caller.
    pub fn who(&self) -> String {
        format!("operator/{}", self.name)
    }
}

/// What a handler tells the audit log about the objects a change touched
/// (a response extension): the route names one object, `apply` many.
#[derive(Debug, Clone, Default)]
pub struct AuditNote {
    pub objects: Vec<AuditObject>,
    pub objects_total: u64,
    pub body_digest: Option<String>,
    /// Nothing changed (a dry run): no entry.
    pub skip: bool,
}

/// `response` with a note for the audit log: the one object it changed.
pub fn noted(response: Response, kind: &str, name: &str, result: &str) -> Response {
    let mut response = response;
    response.extensions_mut().insert(AuditNote {
        objects: vec![AuditObject {
            kind: kind.to_owned(),
            name: name.to_owned(),
            result: Some(result.to_owned()),
            digest: None,
        }],
        objects_total: 1,
        body_digest: None,
        skip: false,
    });
    response
}

/// The role a request needs: reading needs a viewer, deleting and managing
/// operators, devices' tokens, enrollment tokens or devices' keys an
/// admin, any other change an operator.
pub fn role_needed(method: &Method, path: &str) -> Role {
    let path = path.strip_prefix("/api/v1").unwrap_or(path);
    if matches!(*method, Method::GET | Method::HEAD) {
        Role::Viewer
    } else if *method == Method::DELETE
        || path == "/operators"
        || path.starts_with("/operators/")
        || path.ends_with("/rotate-token")
        || path.starts_with("/enrollment-tokens")
        || path == "/device-keys"
        || (path.starts_with("/devices/")
            && (path.ends_with("/accept") || path.ends_with("/reject")))
    {
        Role::Admin
    } else {
        Role::Operator
    }
}

/// The verb, kind and name a request's route says it changes.
pub fn describe(method: &Method, path: &str) -> (String, Option<String>, Option<String>) {
    let path = path.strip_prefix("/api/v1").unwrap_or(path);
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let kind = |plural: &str| -> Option<String> {
        Some(
            match plural {
                "taskruns" => "TaskRun",
                "taskschedules" => "TaskSchedule",
                "deployments" => "Deployment",
                "devices" => "Device",
                "packages" => "Package",
                "secrets" => "Secret",
                "operators" => "Operator",
                "enrollment-tokens" => "EnrollmentToken",
                "alerts" => "Alert",
                _ => return None,
            }
            .to_owned(),
        )
    };
    let verb = match (method, parts.as_slice()) {
        (&Method::DELETE, _) => "delete".to_owned(),
        (_, ["apply"]) => "apply".to_owned(),
        (_, ["packages"]) => "upload".to_owned(),
        (_, ["operators"]) => "add".to_owned(),
        (_, ["enrollment-tokens"]) => "create".to_owned(),
        (_, ["device-keys"]) => "preauthorize".to_owned(),
        (_, ["alerts", "ack"]) => "acknowledge".to_owned(),
        (_, [_, _, action]) => action.to_string(),
        (method, _) if matches!(*method, Method::GET | Method::HEAD) => "read".to_owned(),
        (method, _) => method.as_str().to_lowercase(),
    };
    let (kind, name) = match parts.as_slice() {
        [plural, name, ..] if kind(plural).is_some() && *plural != "alerts" => {
            (kind(plural), Some((*name).to_owned()))
        }
        [plural, ..] => (kind(plural), None),
        [] => (None, None),
    };
    (verb, kind, name)
}

/// A dashboard login's entry: the operator's, or a refused one's.
pub fn login_entry(
    state: &ApiState,
    operator: Option<&OperatorRecord>,
    peer: std::net::IpAddr,
    outcome: &str,
    status: u16,
) -> AuditRecord {
    AuditRecord {
        at: Timestamp::now(),
        who: operator.map_or_else(|| "unknown".to_owned(), |o| format!("operator/{}", o.name)),
        role: operator.map(|o| o.role),
        via: Via::Dashboard.name().to_owned(),
        peer: Some(peer.to_string()),
        verb: "login".to_owned(),
        kind: None,
        name: None,
        request: Some("POST /ui/login".to_owned()),
        body_digest: None,
        objects: Vec::new(),
        objects_total: 0,
        outcome: outcome.to_owned(),
        status,
        reason: (operator.is_none()).then(|| "a wrong or revoked operator token".to_owned()),
        replica: state.replica.clone(),
    }
}

/// A request refused before it reached its handler: its answer, and the
/// verified operator it came from, when one is known (a dashboard session
/// without its CSRF token; a revoked operator's own token), so the audit log
/// names them and counts it against their budget, not strangers'.
pub struct Refused {
    pub status: StatusCode,
    pub reason: String,
    pub operator: Option<String>,
}

impl Refused {
    fn new(status: StatusCode, reason: String, operator: Option<String>) -> Self {
        Self {
            status,
            reason,
            operator,
        }
    }
}

impl From<ApiError> for Refused {
    fn from(ApiError(status, reason): ApiError) -> Self {
        Self::new(status, reason, None)
    }
}

/// Who made a request, from its bearer token or its dashboard session.
/// With the cookie, a request that changes something must carry the
/// session's CSRF token too (a page on another site can send the cookie,
/// SameSite aside, but cannot read the token or set the header).
async fn identify(
    state: &ApiState,
    headers: &HeaderMap,
    method: &Method,
) -> Result<Caller, Refused> {
    if let Some(operator) = operator_of_token(state, bearer_of(headers)).await? {
        return Ok(Caller {
            name: operator.name,
            role: operator.role,
            via: Via::Token,
        });
    }
    if let Some(session) = super::ui::session_cookie(headers)
        && let Some(operator) = operator_of_session(state, session).await?
    {
        let reads = matches!(*method, Method::GET | Method::HEAD);
        let csrf = headers
            .get(super::ui::CSRF_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if reads || state.secrets.verify_ui_csrf(session, csrf) {
            return Ok(Caller {
                name: operator.name,
                role: operator.role,
                via: Via::Dashboard,
            });
        }
        return Err(Refused::new(
            StatusCode::FORBIDDEN,
            format!(
                "a dashboard request that changes something needs the session's {} header",
                super::ui::CSRF_HEADER
            ),
            Some(operator.name),
        ));
    }
    // A named token says whose it claims to be (a valid name, so safe to
    // log); the log says so without the token.
    let token = bearer_of(headers);
    let former = former_operator_of_token(state, token).await?;
    let reason = match token_name(token) {
        None if state.secrets.verify_operator(token) => format!(
            "DATA/operator.token (the bootstrap admin's) no longer opens the API: operator \
             {BOOTSTRAP_OPERATOR} was rotated or revoked; use an admin's own token"
        ),
        Some(name) => format!(
            "a token naming operator {name} that is not its current one (revoked, rotated or \
             made up)"
        ),
        None => "missing or bad operator token (Authorization: Bearer <token>), or no valid \
                 dashboard session"
            .to_owned(),
    };
    Err(Refused::new(StatusCode::UNAUTHORIZED, reason, former))
}

/// A refusal's reason, saying how many of the same caller's refusals
/// before it were over its budget and not recorded.
fn not_recorded(reason: &str, skipped: u64) -> String {
    if skipped > 0 {
        format!("{reason} ({skipped} refusals before this one not recorded)")
    } else {
        reason.to_owned()
    }
}

/// The API's gate: names the caller, checks its role, runs the request,
/// and writes the audit entry of every change and every refusal.
pub async fn require_operator(
    State(state): State<ApiState>,
    mut request: Request,
    next: Next,
) -> Response {
    let method = request.method().clone();
    // The path as the client sent it (nesting strips `/api/v1`).
    let path = request
        .extensions()
        .get::<axum::extract::OriginalUri>()
        .map(|uri| uri.path().to_owned())
        .unwrap_or_else(|| request.uri().path().to_owned());
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(peer)| peer.ip().to_string());
    let reads = matches!(method, Method::GET | Method::HEAD);
    let (verb, kind, name) = describe(&method, &path);
    let entry = |who: String, role: Option<Role>, via: &str| AuditRecord {
        at: Timestamp::now(),
        who,
        role,
        via: via.to_owned(),
        peer: peer.clone(),
        verb: verb.clone(),
        kind: kind.clone(),
        name: name.clone(),
        request: Some(format!("{method} {path}")),
        body_digest: None,
        objects: Vec::new(),
        objects_total: 0,
        outcome: "refused".to_owned(),
        status: 0,
        reason: None,
        replica: state.replica.clone(),
    };
    let caller = match identify(&state, request.headers(), &method).await {
        Ok(caller) => caller,
        Err(Refused {
            status,
            reason,
            operator,
        }) => {
            // A wrong token or session is recorded; no credential at all
            // (a page loaded after its session ended) is not.
            let via = if !bearer_of(request.headers()).is_empty() {
                Some(Via::Token)
            } else if super::ui::session_cookie(request.headers()).is_some() {
                Some(Via::Dashboard)
            } else {
                None
            };
            if let Some(via) = via
                && (status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN)
            {
                if let Ok(skipped) =
                    state
                        .budgets
                        .take(Sort::Refusal, operator.as_deref(), Instant::now())
                {
                    let who = operator
                        .as_deref()
                        .map_or_else(|| "unknown".to_owned(), |name| format!("operator/{name}"));
                    let mut refused = entry(who, None, via.name());
                    refused.status = status.as_u16();
                    refused.reason = Some(not_recorded(&reason, skipped));
                    crate::audit::write(&state.db, refused).await;
                }
                tracing::warn!(peer = peer.as_deref().unwrap_or("?"), %method, %path, "refused: {reason}");
            }
            return ApiError(status, reason).into_response();
        }
    };
    let needed = role_needed(&method, &path);
    if caller.role < needed {
        let reason = format!(
            "{verb} needs the {needed} role; operator {} has the {} role",
            caller.name, caller.role
        );
        if let Ok(skipped) = state
            .budgets
            .take(Sort::Refusal, Some(&caller.name), Instant::now())
        {
            let mut refused = entry(caller.who(), Some(caller.role), caller.via.name());
            refused.status = StatusCode::FORBIDDEN.as_u16();
            refused.reason = Some(not_recorded(&reason, skipped));
            crate::audit::write(&state.db, refused).await;
        }
        tracing::warn!(operator = %caller.name, %method, %path, "refused: {reason}");
        return ApiError(StatusCode::FORBIDDEN, reason).into_response();
    }
    // A change is made only when its entry can be written.
    if !reads
        && let Err(wait) = state
            .budgets
            .take(Sort::Change, Some(&caller.name), Instant::now())
    {
        let seconds = wait.as_secs().max(1);
        let allowance = crate::audit::CHANGES;
        let reason = format!(
            "operator {} has made {} changes through this replica within the hour (at most {} \
             at once, then {} an hour); try again in {seconds} s",
            caller.name, allowance.burst, allowance.burst, allowance.per_hour
        );
        if let Ok(skipped) = state
            .budgets
            .take(Sort::Refusal, Some(&caller.name), Instant::now())
        {
            let mut refused = entry(caller.who(), Some(caller.role), caller.via.name());
            refused.status = StatusCode::TOO_MANY_REQUESTS.as_u16();
            refused.reason = Some(not_recorded(&reason, skipped));
            crate::audit::write(&state.db, refused).await;
        }
        tracing::warn!(operator = %caller.name, %method, %path, "refused: {reason}");
        let mut response = ApiError(StatusCode::TOO_MANY_REQUESTS, reason).into_response();
        response.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from(seconds),
        );
        return response;
    }
    request.extensions_mut().insert(caller.clone());
    let response = next.run(request).await;
    if reads {
        return response;
    }
    let done = entry(caller.who(), Some(caller.role), caller.via.name());
    audited(&state, &caller.name, done, response).await
}

/// A change's response, once its audit entry is written: its outcome, its
/// objects, and a failure's reason within the operator's refusal budget.
async fn audited(
    state: &ApiState,
    operator: &str,
    mut done: AuditRecord,
    response: Response,
) -> Response {
    let (mut parts, body) = response.into_parts();
    let status = parts.status;
    done.status = status.as_u16();
    done.outcome = if status.is_success() {
        "applied"
    } else if status == StatusCode::FORBIDDEN || status == StatusCode::UNAUTHORIZED {
        "refused"
    } else {
        "failed"
    }
    .to_owned();
    let note = parts.extensions.remove::<AuditNote>();
    if note.as_ref().is_some_and(|note| note.skip) && status.is_success() {
        return Response::from_parts(parts, body);
    }
    if let Some(note) = note {
        done.objects = note.objects;
        done.objects.truncate(AUDIT_OBJECTS);
        done.objects_total = note.objects_total;
        done.body_digest = note.body_digest;
    }
    // A failure changed nothing: it is recorded within the operator's
    // refusal budget, like a refusal.
    let skipped = if status.is_success() {
        0
    } else {
        match state
            .budgets
            .take(Sort::Refusal, Some(operator), Instant::now())
        {
            Ok(skipped) => skipped,
            Err(_) => return Response::from_parts(parts, body),
        }
    };
    // An error's reason is the body's `error` (a small JSON object).
    let body = if status.is_success() {
        body
    } else {
        let bytes = axum::body::to_bytes(body, 64 * 1024)
            .await
            .unwrap_or_default();
        done.reason = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| {
                v["error"]
                    .as_str()
                    .map(|reason| not_recorded(reason, skipped))
            });
        axum::body::Body::from(bytes)
    };
    crate::audit::write(&state.db, done).await;
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(parts, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_route_needs_the_role_its_change_asks_for() {
        let cases = [
            (Method::GET, "/api/v1/devices", Role::Viewer),
            (Method::GET, "/api/v1/operators", Role::Viewer),
            (Method::GET, "/metrics", Role::Viewer),
            (Method::POST, "/api/v1/apply", Role::Operator),
            (Method::POST, "/api/v1/taskruns/up/cancel", Role::Operator),
            (Method::POST, "/api/v1/packages", Role::Operator),
            (Method::DELETE, "/api/v1/taskruns/up", Role::Admin),
            (Method::POST, "/api/v1/operators", Role::Admin),
            (Method::POST, "/api/v1/operators/bob/revoke", Role::Admin),
            (
                Method::POST,
                "/api/v1/devices/pi-1/rotate-token",
                Role::Admin,
            ),
        ];
        for (method, path, role) in cases {
            assert_eq!(role_needed(&method, path), role, "{method} {path}");
        }
    }

    #[test]
    fn a_request_is_described_by_its_route() {
        let d = |m: Method, p: &str| describe(&m, p);
        assert_eq!(
            d(Method::POST, "/api/v1/taskruns/up/cancel"),
            ("cancel".into(), Some("TaskRun".into()), Some("up".into()))
        );
        assert_eq!(
            d(Method::DELETE, "/api/v1/devices/pi-1"),
            ("delete".into(), Some("Device".into()), Some("pi-1".into()))
        );
        assert_eq!(
            d(Method::POST, "/api/v1/apply"),
            ("apply".into(), None, None)
        );
        assert_eq!(
            d(Method::POST, "/api/v1/operators"),
            ("add".into(), Some("Operator".into()), None)
        );
        assert_eq!(
            d(Method::POST, "/api/v1/alerts/ack"),
            ("acknowledge".into(), Some("Alert".into()), None)
        );
    }
}
