//! Enrollment (issue 55): enrollment tokens (`/enrollment-tokens`) and the
//! keys devices enrolled (`/device-keys`), pending until an operator
//! accepts or rejects them (`/devices/{id}/accept`, `/devices/{id}/reject`).

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// An enrollment token as listed; `token` only in the answer that made it
/// (only its digest is kept).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnrollmentToken {
    pub name: String,
    /// What a device accepted through it joins with.
    pub groups: Vec<String>,
    pub labels: BTreeMap<String, String>,
    /// Devices it may enroll; none: any number.
    pub max_uses: Option<u64>,
    pub uses: u64,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub expires_at: Option<Timestamp>,
    /// Devices enrolled with it are accepted at once.
    pub auto_accept: bool,
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    pub created_by: String,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub revoked_at: Option<Timestamp>,
    pub revoked_by: Option<String>,
    /// The token, given once: put it in the devices' enrollment file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// `GET /agent-trust`: what every device's agent config pins, none of it
/// secret (`drover enrollment-tokens create --agent-config` writes it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentTrust {
    /// The keys fleet intents are signed with (hex Ed25519): the agent's
    /// `intent_public_keys`.
    pub intent_public_keys: Vec<String>,
    /// With NATS decentralized authentication (`serve --nats-authority`):
    /// the enrollment user's JWT, the same for every device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats_enrollment_jwt: Option<String>,
}

/// `POST /enrollment-tokens`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewEnrollmentToken {
    pub name: String,
    #[serde(default)]
    pub groups: Vec<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub max_uses: Option<u64>,
    #[serde(default)]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub expires_at: Option<Timestamp>,
    #[serde(default)]
    pub auto_accept: bool,
}

/// Where an enrolled key stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum KeyState {
    Pending,
    Accepted,
    Rejected,
}

/// Another key that asked for an id already enrolled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyConflict {
    pub public_key: String,
    #[schema(value_type = String, format = DateTime)]
    pub at: Timestamp,
    pub peer: Option<String>,
}

/// A device's enrolled key (`GET /device-keys`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceKey {
    pub device: String,
    /// Ed25519, hex.
    pub public_key: String,
    pub state: KeyState,
    /// The enrollment token it came with.
    pub token: Option<String>,
    pub hostname: Option<String>,
    pub os_release: Option<String>,
    pub architecture: Option<String>,
    pub agent_version: Option<String>,
    #[schema(value_type = String, format = DateTime)]
    pub requested_at: Timestamp,
    /// The address it asked from.
    pub peer: Option<String>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub decided_at: Option<Timestamp>,
    /// `operator/NAME`, or `token/NAME` for an auto-accept token.
    pub decided_by: Option<String>,
    /// A device of this id existed before (made by a manifest): never
    /// accepted without an operator.
    pub existing_device: bool,
    pub conflict: Option<KeyConflict>,
}

/// `POST /device-keys`: a device's key accepted before the device asks
/// (pre-authorization: the key read from the device, `drover-agent status`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PreauthorizedKey {
    pub device: String,
    /// Ed25519, 64 lowercase hex digits.
    pub public_key: String,
    #[serde(default)]
    pub groups: Vec<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}
