//! The dashboard: static pages embedded in the binary (`ui/`; plain
//! JavaScript, no build step), a login with an operator's token that sets
//! an HttpOnly, SameSite=Strict session cookie bound to that operator, and one server-sent event
//! stream that tells open pages what changed, so they fetch again only
//! then. The pages read and act through the same `/api/v1` as the CLI: the
//! API accepts the session cookie in place of the bearer token, and a
//! request that changes something must carry the session's CSRF token
//! (`api::access`).

use super::{ApiState, require_operator};
use crate::http::ApiError;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use jiff::Timestamp;
use serde::Deserialize;
use serde_json::json;
use std::collections::BTreeSet;
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;

/// The session cookie's name.
pub const COOKIE: &str = "drover_session";
/// The header that carries the session's CSRF token.
pub const CSRF_HEADER: &str = "x-drover-csrf";
/// How long a dashboard session lasts.
const SESSION: i64 = 12 * 3600;
/// Changes that arrive within this share one event.
const GATHER: Duration = Duration::from_millis(300);

const INDEX: &str = include_str!("ui/index.html");
const LOGIN: &str = include_str!("ui/login.html");
const APP_JS: &str = include_str!("ui/app.js");
const APP_CSS: &str = include_str!("ui/app.css");

pub fn router(state: ApiState) -> Router<ApiState> {
    let private = Router::new()
        .route("/ui/session", get(session))
        .route("/ui/events", get(events))
        .layer(axum::middleware::from_fn_with_state(
            state,
            require_operator,
        ));
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui/") }))
        .route("/ui", get(|| async { Redirect::to("/ui/") }))
        .route("/ui/", get(index))
        .route("/ui/login", get(login_page).post(login))
        .route("/ui/logout", post(logout))
        .route(
            "/ui/app.js",
            get(|| async { asset("text/javascript", APP_JS) }),
        )
        .route("/ui/app.css", get(|| async { asset("text/css", APP_CSS) }))
        .merge(private)
}

fn asset(kind: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// A page: no framing by other sites, scripts only from here.
fn page(body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; frame-ancestors 'none'; form-action 'self'",
            ),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

/// The value of the session cookie, if the request has one.
pub fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
}

/// Where a session's logout is kept until the session would have expired.
pub(super) fn logout_key(session_id: &str) -> String {
    format!("ui-logouts/{session_id}")
}

async fn logged_in(state: &ApiState, headers: &HeaderMap) -> bool {
    match session_cookie(headers) {
        Some(session) => matches!(
            super::tokens::operator_of_session(state, session).await,
            Ok(Some(_))
        ),
        None => false,
    }
}

async fn index(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    if logged_in(&state, &headers).await {
        page(INDEX)
    } else {
        Redirect::to("/ui/login").into_response()
    }
}

async fn login_page() -> Response {
    page(LOGIN)
}

#[derive(Deserialize)]
struct Login {
    token: String,
}

/// Failed logins an address may make before it must wait.
const LOGIN_ATTEMPTS: u32 = 5;
/// One failed login is forgiven per this long.
const LOGIN_REFILL: Duration = Duration::from_secs(60);
/// Addresses remembered at most (the oldest are forgotten first).
const LOGIN_ADDRESSES: usize = 10_000;

/// Failed dashboard logins per client address: a token bucket of
/// [`LOGIN_ATTEMPTS`], one back per [`LOGIN_REFILL`]. It slows wrong
/// tokens only: a right token logs in whatever the address's count (behind
/// a TLS proxy every operator shares one address, and a stranger's wrong
/// guesses must not lock them out), and a login that succeeds does not
/// forgive the address's failures. Guessing a 256-bit token is hopeless
/// anyway; this keeps the log and the CPU quiet and says who tried.
#[derive(Default)]
pub struct LoginLimiter {
    /// A std Mutex: held only to count, never across an await.
    failures:
        std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, (f64, std::time::Instant)>>,
}

impl LoginLimiter {
    /// The wait before `peer` may try a wrong token again, if it has used
    /// its attempts.
    fn wait(&self, peer: std::net::IpAddr, now: std::time::Instant) -> Option<Duration> {
        let failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let (used, at) = *failures.get(&peer)?;
        // Another attempt needs one whole attempt left.
        let over = Self::refilled(used, at, now) - f64::from(LOGIN_ATTEMPTS - 1);
        (over > 0.0).then(|| LOGIN_REFILL.mul_f64(over))
    }

    /// Counts a failed login; returns how many `peer` has used.
    fn failed(&self, peer: std::net::IpAddr, now: std::time::Instant) -> f64 {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if failures.len() >= LOGIN_ADDRESSES && !failures.contains_key(&peer) {
            failures.retain(|_, (used, at)| Self::refilled(*used, *at, now) > 0.0);
            if failures.len() >= LOGIN_ADDRESSES
                && let Some(oldest) = failures
                    .iter()
                    .min_by_key(|(_, (_, at))| *at)
                    .map(|(p, _)| *p)
            {
                failures.remove(&oldest);
            }
        }
        let entry = failures.entry(peer).or_insert((0.0, now));
        let used = Self::refilled(entry.0, entry.1, now) + 1.0;
        *entry = (used, now);
        used
    }

    fn refilled(used: f64, at: std::time::Instant, now: std::time::Instant) -> f64 {
        let back = now.saturating_duration_since(at).as_secs_f64() / LOGIN_REFILL.as_secs_f64();
        (used - back).max(0.0)
    }
}

/// Checks the operator token and sets the session cookie. Failed logins
/// are logged with the client's address and limited per address.
async fn login(
    State(state): State<ApiState>,
    // The listener (`drover::listen::serve`) puts the client's address on every request.
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    Json(body): Json<Login>,
) -> Response {
    let peer = peer.ip();
    let now = std::time::Instant::now();
    let token = body.token.trim();
    // The token is checked first: a right one logs in whatever wrong ones
    // were sent from the same address.
    let operator = match super::tokens::operator_of_token(&state, token).await {
        Ok(Some(operator)) => operator,
        Ok(None) => {
            if let Some(wait) = state.logins.wait(peer, now) {
                let seconds = wait.as_secs().max(1);
                return (
                    StatusCode::TOO_MANY_REQUESTS,
                    [(header::RETRY_AFTER, seconds.to_string())],
                    Json(json!({"error": format!(
                        "too many failed logins from {peer}; try again in {seconds} s \
                         (a right token is let in at once)"
                    )})),
                )
                    .into_response();
            }
            // A revoked operator's own token is recorded against that
            // operator's budget, a stranger's against strangers'.
            let former = match super::tokens::former_operator_of_token(&state, token).await {
                Ok(former) => former,
                Err(e) => return e.into_response(),
            };
            if let Ok(skipped) =
                state
                    .budgets
                    .take(crate::audit::Sort::Refusal, former.as_deref(), now)
            {
                let mut entry = super::access::login_entry(&state, None, peer, "refused", 401);
                if let Some(name) = &former {
                    entry.who = format!("operator/{name}");
                    entry.reason = Some(format!(
                        "operator {name}'s token, which no longer opens the API (revoked or rotated)"
                    ));
                }
                if skipped > 0
                    && let Some(reason) = &mut entry.reason
                {
                    reason.push_str(&format!(
                        " ({skipped} refusals before this one not recorded)"
                    ));
                }
                crate::audit::write(&state.db, entry).await;
            }
            let used = state.logins.failed(peer, now);
            tracing::warn!(%peer, failures = used.ceil() as u64, "dashboard login with a wrong or revoked operator token");
            return ApiError(
                StatusCode::UNAUTHORIZED,
                "that is not a valid operator token of this control plane (an operator's own, \
                 or DATA/operator.token)"
                    .into(),
            )
            .into_response();
        }
        Err(e) => return e.into_response(),
    };
    if let Err(wait) = state
        .budgets
        .take(crate::audit::Sort::Login, Some(&operator.name), now)
    {
        let seconds = wait.as_secs().max(1);
        let logins = crate::audit::LOGINS;
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, seconds.to_string())],
            Json(json!({"error": format!(
                "operator {} logged in {} times within the hour through this replica (at most \
                 {} at once, then {} an hour); try again in {seconds} s",
                operator.name, logins.burst, logins.burst, logins.per_hour
            )})),
        )
            .into_response();
    }
    let credential = super::tokens::credential(&state, &operator);
    let session = match state.secrets.ui_session(
        Timestamp::now().as_second() + SESSION,
        &operator.name,
        operator.generation,
        &credential,
    ) {
        Ok(session) => session,
        Err(e) => {
            return ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")).into_response();
        }
    };
    let secure = if state.secure_cookies { "; Secure" } else { "" };
    let cookie =
        format!("{COOKIE}={session}; HttpOnly; SameSite=Strict; Path=/; Max-Age={SESSION}{secure}");
    crate::audit::write(
        &state.db,
        super::access::login_entry(&state, Some(&operator), peer, "applied", 200),
    )
    .await;
    tracing::info!(%peer, operator = %operator.name, "dashboard login");
    (
        [(header::SET_COOKIE, cookie)],
        Json(json!({"result": "logged in"})),
    )
        .into_response()
}

/// Ends the session server-side (a logout record every replica reads,
/// kept until the session would have expired) and clears the cookie. With
/// a live session, the request must carry its CSRF token: another site
/// cannot log an operator out.
async fn logout(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    let clear = [(
        header::SET_COOKIE,
        format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
    )];
    let now = Timestamp::now().as_second();
    // Only a valid session needs its logout kept: a revoked operator's or
    // an expired one opens nothing anyway.
    let Some(session) = session_cookie(&headers) else {
        return (clear, Json(json!({"result": "logged out"}))).into_response();
    };
    match super::tokens::operator_of_session(&state, session).await {
        Ok(Some(_)) => {}
        Ok(None) => return (clear, Json(json!({"result": "logged out"}))).into_response(),
        Err(e) => return e.into_response(),
    }
    let Some(parsed) = crate::auth::Secrets::parse_ui_session(session) else {
        return (clear, Json(json!({"result": "logged out"}))).into_response();
    };
    let expires = parsed.expires;
    let csrf = headers
        .get(CSRF_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !state.secrets.verify_ui_csrf(session, csrf) {
        return ApiError(
            StatusCode::FORBIDDEN,
            format!("a logout needs the session's {CSRF_HEADER} header"),
        )
        .into_response();
    }
    let id = crate::auth::Secrets::ui_session_id(&parsed);
    let expires = u64::try_from(expires).unwrap_or(0);
    match state.db.put(&logout_key(&id), &expires, 0).await {
        Ok(_) => {}
        // Logged out already (another tab, another replica).
        Err(drover_store::db::DbError::Kv(e)) if e.is_conflict() => {}
        Err(e) => {
            return ApiError(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("cannot record the logout: {e}"),
            )
            .into_response();
        }
    }
    forget_old_logouts(&state, now).await;
    tracing::info!("dashboard logout");
    (clear, Json(json!({"result": "logged out"}))).into_response()
}

/// Deletes the logouts of sessions that have expired anyway.
async fn forget_old_logouts(state: &ApiState, now: i64) {
    let Ok(logouts) = state.db.list::<u64>("ui-logouts/").await else {
        return;
    };
    let old: Vec<String> = logouts
        .into_iter()
        .filter(|(_, _, expires)| i64::try_from(*expires).unwrap_or(i64::MAX) <= now)
        .map(|(key, _, _)| key)
        .collect();
    if !old.is_empty() {
        let _ = state.db.delete_all(&old).await;
    }
}

/// The session's CSRF token, for the page's requests that change something.
/// And who is signed in, with which role: the pages hide what it cannot do.
async fn session(
    State(state): State<ApiState>,
    axum::Extension(caller): axum::Extension<super::access::Caller>,
    headers: HeaderMap,
) -> Response {
    // Signed in with the bearer token: no cookie, no CSRF token needed.
    let csrf = session_cookie(&headers).map(|session| state.secrets.ui_csrf(session));
    Json(json!({
        "csrf": csrf,
        "operator": caller.name,
        "role": caller.role,
    }))
    .into_response()
}

/// What a stored change concerns, as the pages name it.
fn topic(key: &str) -> Option<&'static str> {
    let prefix = key.split('/').next()?;
    Some(match prefix {
        "runs" | "plans" => "runs",
        "deployments" | "targets" => "deployments",
        "schedules" => "schedules",
        "devices" | "inventory" | "assessments" => "devices",
        "jobs" => "jobs",
        "alerts" | "acks" => "alerts",
        "operators" => "operators",
        "audit" => "audit",
        _ => return None,
    })
}

/// How often an open event stream checks, with nothing else to do, that
/// the credential it was opened with still opens the API (a session that
/// expired).
const RECHECK: Duration = Duration::from_secs(30);

/// Whether the credential a request came with (its bearer token or its
/// dashboard session) still names an operator: not revoked, rotated or
/// logged out. A store that cannot answer says no (fail closed).
async fn still_allowed(state: &ApiState, headers: &HeaderMap) -> bool {
    if let Ok(Some(_)) =
        super::tokens::operator_of_token(state, crate::http::bearer_of(headers)).await
    {
        return true;
    }
    match session_cookie(headers) {
        Some(session) => matches!(
            super::tokens::operator_of_session(state, session).await,
            Ok(Some(_))
        ),
        None => false,
    }
}

/// Whether a change can end what a credential opens: an operator's record
/// (revoked, rotated) or a session's logout.
fn ends_credentials(key: &str) -> bool {
    key.starts_with("operators/") || key.starts_with("ui-logouts/")
}

/// Server-sent events: `changed` with the topics (runs, deployments,
/// schedules, devices, jobs, alerts) that changed, at most one event per
/// 300 ms, from the store's change feed (which on NATS carries every
/// replica's writes). A page fetches again only what it shows. The stream
/// ends as soon as the credential it was opened with no longer opens the
/// API: checked at every change of an operator or a logout, and every
/// [`RECHECK`].
async fn events(State(state): State<ApiState>, headers: HeaderMap) -> impl IntoResponse {
    let feed = state.db.changes();
    let stream = futures_util::stream::unfold(
        (feed, state, headers),
        |(mut feed, state, headers)| async move {
            let mut topics = BTreeSet::new();
            while topics.is_empty() {
                let recheck = match tokio::time::timeout(RECHECK, feed.recv()).await {
                    Ok(Ok(change)) => {
                        topics.extend(topic(&change.key));
                        ends_credentials(&change.key)
                    }
                    Ok(Err(RecvError::Lagged(_))) => {
                        topics.insert("all");
                        true
                    }
                    Ok(Err(RecvError::Closed)) => return None,
                    Err(_) => true,
                };
                if recheck && !still_allowed(&state, &headers).await {
                    return None;
                }
            }
            let deadline = tokio::time::Instant::now() + GATHER;
            let mut recheck = false;
            loop {
                match tokio::time::timeout_at(deadline, feed.recv()).await {
                    Ok(Ok(change)) => {
                        topics.extend(topic(&change.key));
                        recheck |= ends_credentials(&change.key);
                    }
                    Ok(Err(RecvError::Lagged(_))) => {
                        topics.insert("all");
                        recheck = true;
                    }
                    Ok(Err(RecvError::Closed)) | Err(_) => break,
                }
            }
            if recheck && !still_allowed(&state, &headers).await {
                return None;
            }
            let data = topics.into_iter().collect::<Vec<_>>().join(",");
            let event = Event::default().event("changed").data(data);
            Some((Ok::<_, Infallible>(event), (feed, state, headers)))
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_gets_five_failed_logins_then_one_a_minute() {
        let limiter = LoginLimiter::default();
        let (a, b) = (
            "192.0.2.1".parse().expect("ip"),
            "192.0.2.2".parse().expect("ip"),
        );
        let start = std::time::Instant::now();
        for tried in 1..=5 {
            assert_eq!(limiter.wait(a, start), None, "attempt {tried} is allowed");
            limiter.failed(a, start);
        }
        let wait = limiter.wait(a, start).expect("the sixth waits");
        assert_eq!(wait, LOGIN_REFILL);
        assert_eq!(
            limiter.wait(b, start),
            None,
            "another address is not limited"
        );
        let later = start + LOGIN_REFILL;
        assert_eq!(
            limiter.wait(a, later),
            None,
            "one attempt back after a minute"
        );
        limiter.failed(a, later);
        assert!(limiter.wait(a, later).is_some());
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            "theme=dark; drover_session=123.abc; other=1"
                .parse()
                .expect("header"),
        );
        assert_eq!(session_cookie(&headers), Some("123.abc"));
        let mut none = HeaderMap::new();
        none.insert(header::COOKIE, "drover_sessionx=1".parse().expect("header"));
        assert_eq!(session_cookie(&none), None);
    }

    #[test]
    fn changes_are_named_by_what_the_pages_show() {
        assert_eq!(topic("runs/upgrade"), Some("runs"));
        assert_eq!(topic("targets/abc/dev"), Some("deployments"));
        assert_eq!(topic("assessments/pi-1"), Some("devices"));
        // An acknowledgement changes the alerts page of every session.
        assert_eq!(topic("acks/RebootPending/device/pi-1"), Some("alerts"));
        assert_eq!(topic("cursors/nats"), None);
    }
}
