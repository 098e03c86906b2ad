//! Devices: what the device routes answer that is the API's own.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// `GET /devices/token-generations`: every device whose token was rotated,
/// with its generation (the others are at 0). No token crosses here.
pub type TokenGenerations = BTreeMap<String, u64>;

/// `POST /devices/{id}/rotate-token`: the token before this generation is
/// refused from now on; the new one is made on the control plane's host
/// (`drover token ID`), never sent here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenRotated {
    pub device: String,
    pub token_generation: u64,
}
