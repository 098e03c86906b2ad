//! The operators' API as types (`/api/v1`): what each request sends and
//! each answer holds. The server's handlers answer with these types and
//! the CLI reads them back through the same types, so a field renamed on
//! one side fails to compile on the other, not at run time on a fleet.
//! The OpenAPI document (`GET /api/v1/openapi.json`, kept in
//! `docs/openapi.json`) is generated from their schemas.
//!
//! These are the API's own shapes: apart from the records the store keeps
//! (`drover-rules`' records, frozen by their fixtures) and from the agents'
//! wire messages (`drover-model`), so each can change on its own schedule.
//! Data only: no runtime, no store, no HTTP.

pub mod changes;
pub mod deployments;
pub mod devices;
pub mod fleet;
pub mod jobs;
pub mod operators;
pub mod runs;
pub mod schedules;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Every refusal and failure: the status code says which, `error` says why
/// in a sentence an operator can act on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: String,
}
