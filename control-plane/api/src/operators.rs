//! Operators (`/operators`), who the caller is (`/whoami`) and the audit
//! log's query.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What an operator may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads everything (secrets' names, never their values).
    Viewer,
    /// Also applies, cancels, suspends, acknowledges and uploads.
    Operator,
    /// Also deletes, and manages operators and devices' tokens.
    Admin,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

/// How the caller reached the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Via {
    /// A bearer token (the CLI, a script, Prometheus).
    Cli,
    /// A dashboard session.
    Dashboard,
}

/// `GET /whoami`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Whoami {
    pub name: String,
    pub role: Role,
    pub via: Via,
}

/// An operator as listed; `token` only in the answer that made it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Operator {
    pub name: String,
    pub role: Role,
    /// The bootstrap operator (its token is `DATA/operator.token`).
    pub bootstrap: bool,
    /// Raised by every new token and by the revocation.
    pub generation: u64,
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    pub created_by: String,
    #[schema(value_type = String, format = DateTime)]
    pub changed_at: Timestamp,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub revoked_at: Option<Timestamp>,
    pub revoked_by: Option<String>,
    /// The new token, given once: only its digest is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// `POST /operators`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NewOperator {
    pub name: String,
    /// viewer, operator or admin.
    pub role: String,
}

/// One entry of the audit log (`GET /audit`): a change, or a refused
/// request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    /// The control plane's clock when the request was answered.
    #[schema(value_type = String, format = DateTime)]
    pub at: Timestamp,
    /// `operator/NAME`, `schedule/NAME`, or `unknown` (no valid credential).
    pub who: String,
    pub role: Option<Role>,
    /// `cli` (a bearer token), `dashboard` (a session) or `control-plane`.
    pub via: String,
    /// The client's address, when there was a client.
    pub peer: Option<String>,
    /// apply, cancel, delete, suspend, upload, login, …
    pub verb: String,
    pub kind: Option<String>,
    pub name: Option<String>,
    /// The request: method and path (never a query's or body's secrets).
    pub request: Option<String>,
    /// SHA-256 of the request's body, in hex, when it had one.
    pub body_digest: Option<String>,
    /// The objects it touched (at most 100 listed).
    pub objects: Vec<AuditObject>,
    pub objects_total: u64,
    /// `applied`, `refused` (no credential or role) or `failed`.
    pub outcome: String,
    pub status: u16,
    pub reason: Option<String>,
    /// The replica that answered.
    pub replica: String,
}

/// An object an audit entry touched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditObject {
    pub kind: String,
    pub name: String,
    /// What became of it: created, configured, unchanged, deleted, …
    pub result: Option<String>,
    /// SHA-256 of the manifest as sent (its JSON), in hex.
    pub digest: Option<String>,
}
