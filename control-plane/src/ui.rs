//! The dashboard: static pages embedded in the binary (`ui/`; plain
//! JavaScript, no build step), a login with the operator token that sets an
//! HttpOnly, SameSite=Strict session cookie, and one server-sent event
//! stream that tells open pages what changed, so they fetch again only
//! then. The pages read and act through the same `/api/v1` as the CLI: the
//! API accepts the session cookie in place of the bearer token, and a
//! request that changes something must carry the session's CSRF token
//! (`api::authorize`).

use crate::api::{ApiError, ApiState, require_operator};
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

fn logged_in(state: &ApiState, headers: &HeaderMap) -> bool {
    session_cookie(headers).is_some_and(|s| {
        state
            .secrets
            .verify_ui_session(s, Timestamp::now().as_second())
    })
}

async fn index(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    if logged_in(&state, &headers) {
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

/// Checks the operator token and sets the session cookie.
async fn login(State(state): State<ApiState>, Json(body): Json<Login>) -> Response {
    if !state.secrets.verify_operator(body.token.trim()) {
        return ApiError(
            StatusCode::UNAUTHORIZED,
            "that is not this control plane's operator token (DATA/operator.token)".into(),
        )
        .into_response();
    }
    let session = state
        .secrets
        .ui_session(Timestamp::now().as_second() + SESSION);
    let secure = if state.secure_cookies { "; Secure" } else { "" };
    let cookie =
        format!("{COOKIE}={session}; HttpOnly; SameSite=Strict; Path=/; Max-Age={SESSION}{secure}");
    tracing::info!("dashboard login");
    (
        [(header::SET_COOKIE, cookie)],
        Json(json!({"result": "logged in"})),
    )
        .into_response()
}

async fn logout() -> Response {
    (
        [(
            header::SET_COOKIE,
            format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
        )],
        Json(json!({"result": "logged out"})),
    )
        .into_response()
}

/// The session's CSRF token, for the page's requests that change something.
async fn session(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    match session_cookie(&headers) {
        Some(session) => Json(json!({"csrf": state.secrets.ui_csrf(session)})).into_response(),
        // Signed in with the bearer token: no cookie, no CSRF token needed.
        None => Json(json!({"csrf": null})).into_response(),
    }
}

/// What a stored change concerns, as the pages name it.
fn topic(key: &str) -> Option<&'static str> {
    let prefix = key.split('/').next()?;
    Some(match prefix {
        "runs" | "plans" => "runs",
        "deployments" | "targets" => "deployments",
        "schedules" => "schedules",
        "devices" | "inventory" => "devices",
        "jobs" => "jobs",
        "alerts" => "alerts",
        _ => return None,
    })
}

/// Server-sent events: `changed` with the topics (runs, deployments,
/// schedules, devices, jobs, alerts) that changed, at most one event per
/// 300 ms, from the store's change feed (which on NATS carries every
/// replica's writes). A page fetches again only what it shows.
async fn events(State(state): State<ApiState>) -> impl IntoResponse {
    let feed = state.db.changes();
    let stream = futures_util::stream::unfold(feed, |mut feed| async move {
        let mut topics = BTreeSet::new();
        while topics.is_empty() {
            match feed.recv().await {
                Ok(change) => topics.extend(topic(&change.key)),
                Err(RecvError::Lagged(_)) => {
                    topics.insert("all");
                }
                Err(RecvError::Closed) => return None,
            }
        }
        let deadline = tokio::time::Instant::now() + GATHER;
        loop {
            match tokio::time::timeout_at(deadline, feed.recv()).await {
                Ok(Ok(change)) => topics.extend(topic(&change.key)),
                Ok(Err(RecvError::Lagged(_))) => {
                    topics.insert("all");
                }
                Ok(Err(RecvError::Closed)) | Err(_) => break,
            }
        }
        let data = topics.into_iter().collect::<Vec<_>>().join(",");
        let event = Event::default().event("changed").data(data);
        Some((Ok::<_, Infallible>(event), feed))
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(topic("cursors/nats"), None);
    }
}
