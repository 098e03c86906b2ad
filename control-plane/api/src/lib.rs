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
pub mod enrollment;
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

/// An age as the API and the CLI write it: a whole number of seconds,
/// minutes, hours or days (`30s`, `30m`, `24h`, `7d`); None for anything
/// else. The audit log's `since` and `--expires` take it.
pub fn parse_age(text: &str) -> Option<jiff::SignedDuration> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let number: i64 = number.parse().ok()?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return None,
    };
    Some(jiff::SignedDuration::from_secs(
        number.checked_mul(seconds)?,
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_age_is_a_number_and_a_unit() {
        assert_eq!(super::parse_age("90s").map(|d| d.as_secs()), Some(90));
        assert_eq!(super::parse_age("7d").map(|d| d.as_secs()), Some(604_800));
        for bad in ["", "7", "d", "7w", "-1d", "1.5h", "99999999999999999d"] {
            assert_eq!(super::parse_age(bad), None, "{bad}");
        }
    }
}
