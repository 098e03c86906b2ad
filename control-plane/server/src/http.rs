//! What every HTTP surface of the server shares (the API, the dashboard,
//! package uploads and downloads): the error answer and the bearer token.
//! It knows nothing of them.

use axum::Json;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use drover_store::db::DbError;

pub struct ApiError(pub StatusCode, pub String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(drover_api::ErrorBody { error: self.1 })).into_response()
    }
}

impl From<DbError> for ApiError {
    fn from(e: DbError) -> Self {
        ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
    }
}

/// The bearer token of a request, or "" (which no check accepts).
pub fn bearer(request: &Request) -> &str {
    bearer_of(request.headers())
}

/// The bearer token in `headers`, or "".
pub fn bearer_of(headers: &HeaderMap) -> &str {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("")
}
