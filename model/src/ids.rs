//! Validated identifiers. A `DeviceId` is a valid NATS token, MQTT topic level
//! and KV key by construction, so no boundary needs to re-check it.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdError {
    #[error("device id must be 1 to 64 characters of [a-z0-9_-], got {0:?}")]
    BadDeviceId(String),
    #[error("job id must be a UUID, got {0:?}")]
    BadJobId(String),
}

/// A device's identity: 1 to 64 of `[a-z0-9_-]`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct DeviceId(String);

impl DeviceId {
    pub fn new(id: impl Into<String>) -> Result<Self, IdError> {
        let id = id.into();
        let valid = !id.is_empty()
            && id.len() <= 64
            && id
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if valid {
            Ok(Self(id))
        } else {
            Err(IdError::BadDeviceId(id))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for DeviceId {
    type Error = IdError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<DeviceId> for String {
    fn from(value: DeviceId) -> Self {
        value.0
    }
}

impl FromStr for DeviceId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A job's identity. For a TaskRun it is the run UID, which is also the attempt id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct JobId(uuid::Uuid);

impl JobId {
    pub fn random() -> Self {
        Self(uuid::Uuid::new_v4())
    }

    pub fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }

    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(uuid::Uuid::from_bytes(bytes))
    }
}

impl TryFrom<String> for JobId {
    type Error = IdError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        value.parse()
    }
}

impl From<JobId> for String {
    fn from(value: JobId) -> Self {
        value.0.to_string()
    }
}

impl FromStr for JobId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        uuid::Uuid::parse_str(s)
            .map(Self)
            .map_err(|_| IdError::BadJobId(s.to_owned()))
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_ids_follow_the_token_rule() {
        let cases: &[(&str, bool)] = &[
            ("device-1", true),
            ("a", true),
            ("pi_4-kitchen", true),
            (&"a".repeat(64), true),
            (&"a".repeat(65), false),
            ("", false),
            ("Device", false),
            ("dev.1", false),
            ("dev/1", false),
            ("dev 1", false),
            ("dev*", false),
            ("dev>", false),
        ];
        for (input, ok) in cases {
            assert_eq!(DeviceId::new(*input).is_ok(), *ok, "{input:?}");
        }
    }

    #[test]
    fn job_ids_round_trip_through_json() {
        let id = JobId::random();
        let json = serde_json::to_string(&id).expect("serialize");
        let back: JobId = serde_json::from_str(&json).expect("parse");
        assert_eq!(id, back);
        assert!(serde_json::from_str::<JobId>("\"not-a-uuid\"").is_err());
    }
}
