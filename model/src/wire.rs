//! Turning a peer's JSON into an [`Intent`], with a reason a person can read
//! when it cannot be done. Every transport uses this, so an unknown kind or a
//! malformed field is answered the same way whichever wire carried it (A7).

use crate::failure::Failure;
use crate::ids::{DeviceId, JobId};
use crate::model::{Intent, JobKind};
use jiff::Timestamp;
use serde::Deserialize;

/// Upper bound of one intent's JSON, in bytes.
pub const MAX_INTENT_BYTES: usize = 16 * 1024;

/// Why an intent was refused. `job_id` is set when the peer's message named a
/// readable job id, so the refusal can be reported as a `Rejected` status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct IntentError {
    pub job_id: Option<JobId>,
    pub device_id: Option<DeviceId>,
    pub kind: Option<String>,
    pub attempt: u32,
    pub reason: String,
    /// The reason as a fact, for the Rejected status that records it.
    pub failure: Failure,
}

/// The wire shape before validation: the kind stays raw JSON so an unknown
/// kind can be named in the rejection instead of failing the whole parse.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WireIntent {
    job_id: JobId,
    device_id: String,
    kind: serde_json::Value,
    attempt: u32,
    created_at: Timestamp,
    expires_at: Timestamp,
    timeout_seconds: u32,
    /// Checked before parsing (`signing`); carried, not used, here.
    #[serde(default, rename = "signature")]
    _signature: Option<String>,
}

/// An intent's JSON from raw bytes, bounding its size first.
pub fn intent_json(bytes: &[u8]) -> Result<serde_json::Value, IntentError> {
    if bytes.len() > MAX_INTENT_BYTES {
        return Err(refusal(
            None,
            format!(
                "intent is {} bytes, over the limit of {MAX_INTENT_BYTES}",
                bytes.len()
            ),
        ));
    }
    serde_json::from_slice(bytes)
        .map_err(|e| refusal(None, format!("intent is not valid JSON: {e}")))
}

/// Parses an intent from raw bytes, bounding its size first.
pub fn parse_intent_bytes(bytes: &[u8]) -> Result<Intent, IntentError> {
    parse_intent_value(intent_json(bytes)?)
}

/// Parses an intent from a JSON value that a transport already decoded.
pub fn parse_intent_value(value: serde_json::Value) -> Result<Intent, IntentError> {
    // Read the job id on its own first, so that even a malformed intent can be
    // answered with a Rejected status for the right job.
    let job_id = value
        .get("jobId")
        .and_then(|v| v.as_str())
        .and_then(|s| s.parse::<JobId>().ok());
    let attempt = value
        .get("attempt")
        .and_then(|v| v.as_u64())
        .and_then(|a| u32::try_from(a).ok())
        .unwrap_or(0);
    let wire: WireIntent = serde_json::from_value(value).map_err(|e| IntentError {
        attempt,
        ..refusal(job_id, format!("malformed intent: {e}"))
    })?;
    let fail = |kind: Option<String>, device_id: Option<DeviceId>, reason: String| IntentError {
        job_id: Some(wire.job_id),
        device_id,
        kind,
        attempt: wire.attempt,
        reason,
        failure: Failure::Malformed,
    };
    let device_id = DeviceId::new(wire.device_id.clone())
        .map_err(|e| fail(None, None, format!("malformed intent: {e}")))?;
    let kind_name = match &wire.kind {
        serde_json::Value::Object(map) if map.len() == 1 => map.keys().next().cloned(),
        _ => None,
    };
    let Some(kind_name) = kind_name else {
        return Err(fail(
            None,
            Some(device_id),
            "malformed intent: kind must be an object with exactly one key, such as {\"systemUpgradeV1\":{}}".into(),
        ));
    };
    let kind: JobKind = match serde_json::from_value(wire.kind.clone()) {
        Ok(kind) => kind,
        Err(e) => {
            let known = JobKind::NAMES;
            if known.contains(&kind_name.as_str()) {
                let reason = format!("invalid parameters for job kind {kind_name}: {e}");
                return Err(fail(Some(kind_name), Some(device_id), reason));
            }
            let reason = format!(
                "unknown job kind {kind_name:?}; this agent knows {}",
                known.join(", ")
            );
            return Err(IntentError {
                failure: Failure::UnknownKind,
                ..fail(Some(kind_name), Some(device_id), reason)
            });
        }
    };
    if let JobKind::PackageInstallV1(package) = &kind
        && let Err(e) = package.check()
    {
        let reason = format!("invalid parameters for job kind {kind_name}: {e}");
        return Err(fail(Some(kind_name), Some(device_id), reason));
    }
    Ok(Intent {
        job_id: wire.job_id,
        device_id,
        kind,
        attempt: wire.attempt,
        created_at: wire.created_at,
        expires_at: wire.expires_at,
        timeout_seconds: wire.timeout_seconds,
    })
}

/// The control plane's order to cancel one job on one device, signed like
/// an intent (A11). It travels where the intent travels: in its place in a
/// broker (the NATS bucket key, the MQTT retained topic), so an agent that
/// was away finds the order instead of the intent; over WebSocket in a
/// `cancel` message. `cancelJob` tells it from an intent.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CancelOrder {
    pub cancel_job: JobId,
    pub device_id: DeviceId,
    pub attempt: u32,
}

/// The field that marks a cancel order.
pub const CANCEL_FIELD: &str = "cancelJob";

/// Whether a value in an intent's place is a cancel order.
pub fn is_cancel_order(value: &serde_json::Value) -> bool {
    value.get(CANCEL_FIELD).is_some()
}

/// Parses a cancel order; the error says what is wrong with it.
pub fn parse_cancel_order(value: serde_json::Value) -> Result<CancelOrder, IntentError> {
    let job_id = value
        .get(CANCEL_FIELD)
        .and_then(|v| v.as_str())
        .and_then(|s| s.parse::<JobId>().ok());
    serde_json::from_value(value)
        .map_err(|e| refusal(job_id, format!("malformed cancel order: {e}")))
}

fn refusal(job_id: Option<JobId>, reason: String) -> IntentError {
    IntentError {
        job_id,
        device_id: None,
        kind: None,
        attempt: 0,
        reason,
        failure: Failure::Malformed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOB: &str = "6f1c3b1e-3f7e-4a55-9a3c-2f1f0e9f8a01";

    fn intent_json(kind: &str) -> String {
        format!(
            r#"{{"jobId":"{JOB}","deviceId":"device-1","kind":{kind},"attempt":1,
            "createdAt":"2026-11-30T10:00:00Z","expiresAt":"2026-11-30T16:00:00Z","timeoutSeconds":1500}}"#
        )
    }

    fn check(input: &str, expected: Result<&str, &str>) {
        let got = parse_intent_bytes(input.as_bytes());
        match (got, expected) {
            (Ok(intent), Ok(kind)) => assert_eq!(intent.kind.name(), kind, "{input}"),
            (Err(e), Err(fragment)) => {
                assert!(e.reason.contains(fragment), "{input}: {}", e.reason)
            }
            (got, expected) => panic!("{input}: got {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn intents_parse_or_are_refused_with_a_reason() {
        check(
            &intent_json(r#"{"systemUpgradeV1":{}}"#),
            Ok("systemUpgradeV1"),
        );
        check(
            &intent_json(r#"{"inventoryRefreshV1":{}}"#),
            Ok("inventoryRefreshV1"),
        );
        check(
            &intent_json(r#"{"containerV1":{}}"#),
            Err("unknown job kind \"containerV1\""),
        );
        check(
            &intent_json(r#"{"systemUpgradeV1":{"packages":["evil"]}}"#),
            Err("invalid parameters for job kind systemUpgradeV1"),
        );
        check(&intent_json(r#""systemUpgradeV1""#), Err("exactly one key"));
        check("not json", Err("not valid JSON"));
        check(&"x".repeat(MAX_INTENT_BYTES + 1), Err("over the limit"));
        check(
            &intent_json(r#"{"systemUpgradeV1":{}}"#).replace("device-1", "Device.1"),
            Err("device id must be"),
        );
    }

    #[test]
    fn a_refusal_names_the_job_when_it_can() {
        let err = parse_intent_bytes(intent_json(r#"{"nope":{}}"#).as_bytes()).unwrap_err();
        assert_eq!(err.job_id.map(|j| j.to_string()), Some(JOB.to_string()));
        assert_eq!(err.kind.as_deref(), Some("nope"));
        assert_eq!(err.failure, Failure::UnknownKind);
        let err = parse_intent_bytes(
            intent_json(r#"{"systemUpgradeV1":{"packages":["evil"]}}"#).as_bytes(),
        )
        .unwrap_err();
        assert_eq!(err.failure, Failure::Malformed, "a known kind, bad fields");
        let err = parse_intent_bytes(br#"{"jobId":"x"}"#).unwrap_err();
        assert_eq!(err.job_id, None);
        assert_eq!(err.failure, Failure::Malformed);
    }
}
