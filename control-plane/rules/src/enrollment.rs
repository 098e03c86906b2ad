//! Enrollment (issue 55): a device that made its own key asks to join with
//! an enrollment token; the control plane records its key as pending, or
//! accepts it at once when the token says so. What is stored (the token's
//! digest, never the token; each device's public key, never a secret) opens
//! no device's session: a copy of the store makes no credential.
//!
//! [`decide`] is the whole decision, a pure function of the request, the
//! stored records and the time; the server reads and writes around it.

use drover_model::DeviceId;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// How an enrollment token starts: `drover-enroll.NAME.SECRET`.
pub const TOKEN_PREFIX: &str = "drover-enroll.";

/// Pending devices kept at most: a flood of requests with a valid token
/// fills this and no more (the operator sees it; accepted devices and
/// auto-accepted ones are not counted).
pub const PENDING_CAP: usize = 10_000;

pub fn token_key(name: &str) -> String {
    format!("enrollment-tokens/{name}")
}

pub fn key_key(device: &DeviceId) -> String {
    format!("device-keys/{device}")
}

pub const TOKEN_PREFIX_KEY: &str = "enrollment-tokens/";
pub const KEY_PREFIX_KEY: &str = "device-keys/";
pub const REVOKED_PREFIX_KEY: &str = "revoked-keys/";

/// Where a key that lost its acceptance is remembered (by the key).
pub fn revoked_key(public_key: &str) -> String {
    format!("{REVOKED_PREFIX_KEY}{public_key}")
}

/// The name an enrollment token claims, if it has the token's shape.
pub fn token_name(token: &str) -> Option<&str> {
    let (name, secret) = token.strip_prefix(TOKEN_PREFIX)?.rsplit_once('.')?;
    (!name.is_empty() && !secret.is_empty()).then_some(name)
}

/// An enrollment token as stored: its SHA-256 digest, never the token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnrollmentTokenRecord {
    pub name: String,
    /// SHA-256 of the whole token, hex.
    pub digest: String,
    /// What a device accepted through this token joins with.
    pub groups: BTreeSet<String>,
    pub labels: BTreeMap<String, String>,
    /// Devices it may enroll; None: any number.
    pub max_uses: Option<u64>,
    /// Uses claimed, counted for a limited token only (an unlimited one's
    /// uses are the keys that name it).
    pub uses: u64,
    pub expires_at: Option<Timestamp>,
    /// Devices enrolled with it are accepted at once; otherwise each waits
    /// for an operator.
    pub auto_accept: bool,
    pub created_at: Timestamp,
    pub created_by: String,
    pub revoked_at: Option<Timestamp>,
    pub revoked_by: Option<String>,
}

/// Where a device's key stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyState {
    /// Asked to join; waits for an operator.
    Pending,
    /// Its key opens the device's sessions.
    Accepted,
    /// Refused by an operator: asking again is refused too.
    Rejected,
}

impl KeyState {
    pub fn name(self) -> &'static str {
        match self {
            KeyState::Pending => "pending",
            KeyState::Accepted => "accepted",
            KeyState::Rejected => "rejected",
        }
    }
}

/// What the device said of itself when it asked (shown to the operator
/// who decides; cut to [`INVENTORY_FIELD_MAX`] each).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnrollInventory {
    pub hostname: Option<String>,
    pub os_release: Option<String>,
    pub architecture: Option<String>,
    pub agent_version: Option<String>,
}

/// The longest an inventory field may be.
pub const INVENTORY_FIELD_MAX: usize = 256;

/// Another key that asked for an id already enrolled: shown to the
/// operator, never taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyConflict {
    pub public_key: String,
    pub at: Timestamp,
    pub peer: Option<String>,
}

/// A device's key: pending, accepted or rejected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceKeyRecord {
    pub device: DeviceId,
    /// The Ed25519 public key, hex (32 bytes).
    pub public_key: String,
    pub state: KeyState,
    /// The enrollment token it came with; None when an operator entered it.
    pub token: Option<String>,
    pub inventory: EnrollInventory,
    pub requested_at: Timestamp,
    pub peer: Option<String>,
    pub decided_at: Option<Timestamp>,
    /// `operator/NAME`, or `token/NAME` for an auto-accept token.
    pub decided_by: Option<String>,
    /// A device record existed before the key (made by a manifest, let in
    /// by its token until now): never accepted without an operator.
    pub existing_device: bool,
    /// The last other key that asked for this id.
    pub conflict: Option<KeyConflict>,
}

/// A key that was accepted and no longer is (rejected, or its device
/// deleted), written before the change that ends it: what a broker must
/// refuse even when it missed the removal (a NATS server takes it into
/// the account's revocations when the control plane next checks).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RevokedKeyRecord {
    pub device: DeviceId,
    /// The Ed25519 public key, hex (32 bytes).
    pub public_key: String,
    pub revoked_at: Timestamp,
}

/// One enrollment request, its signature already checked.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub device: &'a DeviceId,
    pub public_key: &'a str,
    /// The token's record when the token named one and its digest matched.
    pub token: Option<&'a EnrollmentTokenRecord>,
    /// The credential is the device's own bearer token (a device moving
    /// from its token to its key): it proves the id, so the key is
    /// accepted at once and the device keeps its groups and labels.
    pub own_token: bool,
    pub existing_key: Option<&'a DeviceKeyRecord>,
    /// A device record exists for this id.
    pub device_exists: bool,
    pub pending: usize,
    pub now: Timestamp,
}

/// Why an enrollment is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No token, a token of no stored name, or the wrong secret.
    UnknownToken,
    Revoked,
    Expired,
    UsedUp,
    /// The id is enrolled (or asked for) with another key.
    Conflict,
    /// An operator rejected this key.
    Rejected,
    /// Too many devices wait for an operator.
    PendingFull,
}

impl Refusal {
    /// What the device is told (and logs).
    pub fn message(self) -> &'static str {
        match self {
            Refusal::UnknownToken => "the enrollment token is not one this control plane issued",
            Refusal::Revoked => "the enrollment token was revoked",
            Refusal::Expired => "the enrollment token has expired",
            Refusal::UsedUp => "the enrollment token has enrolled as many devices as it may",
            Refusal::Conflict => {
                "this device id is enrolled with another key; an operator must delete the \
                 device before another key can take the id"
            }
            Refusal::Rejected => "an operator rejected this device's key",
            Refusal::PendingFull => "too many devices wait for an operator; try again later",
        }
    }
}

/// What becomes of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Recorded as accepted now, by an auto-accept token: the device joins
    /// with the token's groups and labels. Counts one use.
    Accept {
        groups: BTreeSet<String>,
        labels: BTreeMap<String, String>,
    },
    /// Recorded as pending. Counts one use.
    Pend,
    /// The same key asked again: it stands as it is (nothing written,
    /// nothing counted).
    Unchanged(KeyState),
    /// Refused; a conflict is also noted on the device's key record.
    Refuse(Refusal),
}

/// The decision on one request. The key the request names proves itself
/// (its signature) before this is asked; an accepted or pending key asking
/// again needs no token.
pub fn decide(request: &Request) -> Decision {
    if let Some(existing) = request.existing_key {
        if existing.public_key != request.public_key {
            return Decision::Refuse(Refusal::Conflict);
        }
        return match existing.state {
            KeyState::Rejected => Decision::Refuse(Refusal::Rejected),
            state => Decision::Unchanged(state),
        };
    }
    if request.own_token {
        return Decision::Accept {
            groups: BTreeSet::new(),
            labels: BTreeMap::new(),
        };
    }
    let Some(token) = request.token else {
        return Decision::Refuse(Refusal::UnknownToken);
    };
    if token.revoked_at.is_some() {
        return Decision::Refuse(Refusal::Revoked);
    }
    if token.expires_at.is_some_and(|at| at <= request.now) {
        return Decision::Refuse(Refusal::Expired);
    }
    if token.max_uses.is_some_and(|max| token.uses >= max) {
        return Decision::Refuse(Refusal::UsedUp);
    }
    if token.auto_accept && !request.device_exists {
        return Decision::Accept {
            groups: token.groups.clone(),
            labels: token.labels.clone(),
        };
    }
    if request.pending >= PENDING_CAP {
        return Decision::Refuse(Refusal::PendingFull);
    }
    Decision::Pend
}

/// A public key as the wire carries it: 64 hex digits (32 bytes).
pub fn valid_public_key(key: &str) -> bool {
    key.len() == 64
        && key
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        "2026-12-06T12:00:00Z".parse().expect("time")
    }

    fn token(auto_accept: bool) -> EnrollmentTokenRecord {
        EnrollmentTokenRecord {
            name: "line-3".into(),
            digest: "d".into(),
            groups: ["kiosk".to_owned()].into(),
            labels: [("site".to_owned(), "ghent".to_owned())].into(),
            max_uses: Some(2),
            uses: 0,
            expires_at: Some("2026-12-07T00:00:00Z".parse().expect("time")),
            auto_accept,
            created_at: now(),
            created_by: "operator/admin".into(),
            revoked_at: None,
            revoked_by: None,
        }
    }

    fn key(public_key: &str, state: KeyState) -> DeviceKeyRecord {
        DeviceKeyRecord {
            device: DeviceId::new("pi-1").expect("id"),
            public_key: public_key.into(),
            state,
            token: Some("line-3".into()),
            inventory: EnrollInventory::default(),
            requested_at: now(),
            peer: None,
            decided_at: None,
            decided_by: None,
            existing_device: false,
            conflict: None,
        }
    }

    /// Every row of the decision, each with what changes it.
    #[test]
    fn the_enrollment_table() {
        let device = DeviceId::new("pi-1").expect("id");
        let a = "a".repeat(64);
        let b = "b".repeat(64);
        let auto = token(true);
        let manual = token(false);
        let revoked = EnrollmentTokenRecord {
            revoked_at: Some(now()),
            ..token(true)
        };
        let expired = EnrollmentTokenRecord {
            expires_at: Some(now()),
            ..token(true)
        };
        let used_up = EnrollmentTokenRecord {
            uses: 2,
            ..token(true)
        };
        let one_left = EnrollmentTokenRecord {
            uses: 1,
            ..token(true)
        };
        let unlimited = EnrollmentTokenRecord {
            max_uses: None,
            expires_at: None,
            uses: 1_000_000,
            ..token(true)
        };
        let accepted = key(&a, KeyState::Accepted);
        let pending = key(&a, KeyState::Pending);
        let rejected = key(&a, KeyState::Rejected);
        let joined = Decision::Accept {
            groups: auto.groups.clone(),
            labels: auto.labels.clone(),
        };
        type Row<'a> = (
            &'a str,
            Option<&'a EnrollmentTokenRecord>,
            Option<&'a DeviceKeyRecord>,
            bool,
            usize,
            Decision,
        );
        let rows: Vec<Row> = vec![
            (
                "auto-accept token",
                Some(&auto),
                None,
                false,
                0,
                joined.clone(),
            ),
            (
                "its last use",
                Some(&one_left),
                None,
                false,
                0,
                joined.clone(),
            ),
            (
                "no limits",
                Some(&unlimited),
                None,
                false,
                0,
                joined.clone(),
            ),
            (
                "token without auto-accept",
                Some(&manual),
                None,
                false,
                0,
                Decision::Pend,
            ),
            (
                "auto-accept for an existing device",
                Some(&auto),
                None,
                true,
                0,
                Decision::Pend,
            ),
            (
                "no token",
                None,
                None,
                false,
                0,
                Decision::Refuse(Refusal::UnknownToken),
            ),
            (
                "revoked",
                Some(&revoked),
                None,
                false,
                0,
                Decision::Refuse(Refusal::Revoked),
            ),
            (
                "expired",
                Some(&expired),
                None,
                false,
                0,
                Decision::Refuse(Refusal::Expired),
            ),
            (
                "used up",
                Some(&used_up),
                None,
                false,
                0,
                Decision::Refuse(Refusal::UsedUp),
            ),
            (
                "pending full",
                Some(&manual),
                None,
                false,
                PENDING_CAP,
                Decision::Refuse(Refusal::PendingFull),
            ),
            (
                "auto-accept past the pending cap",
                Some(&auto),
                None,
                false,
                PENDING_CAP,
                joined.clone(),
            ),
            (
                "the accepted key again, no token",
                None,
                Some(&accepted),
                false,
                0,
                Decision::Unchanged(KeyState::Accepted),
            ),
            (
                "the pending key again",
                Some(&revoked),
                Some(&pending),
                false,
                0,
                Decision::Unchanged(KeyState::Pending),
            ),
            (
                "a rejected key",
                Some(&auto),
                Some(&rejected),
                false,
                0,
                Decision::Refuse(Refusal::Rejected),
            ),
        ];
        for (what, token, existing, exists, pending_count, expected) in rows {
            let request = Request {
                device: &device,
                public_key: &a,
                token,
                own_token: false,
                existing_key: existing,
                device_exists: exists,
                pending: pending_count,
                now: now(),
            };
            assert_eq!(decide(&request), expected, "{what}");
        }
        // The device's own token: its key is accepted at once, for a
        // device a manifest made too; it keeps what it has. Not over a key
        // already there (the token proves the id, not the key).
        let own = |existing: Option<&DeviceKeyRecord>, public_key: &str| {
            decide(&Request {
                device: &device,
                public_key,
                token: None,
                own_token: true,
                existing_key: existing,
                device_exists: true,
                pending: PENDING_CAP,
                now: now(),
            })
        };
        assert_eq!(
            own(None, &a),
            Decision::Accept {
                groups: BTreeSet::new(),
                labels: BTreeMap::new()
            }
        );
        assert_eq!(
            own(Some(&accepted), &b),
            Decision::Refuse(Refusal::Conflict)
        );
        assert_eq!(
            own(Some(&rejected), &a),
            Decision::Refuse(Refusal::Rejected)
        );
        // Another key for an enrolled, pending or rejected id: a conflict,
        // whatever the token.
        for existing in [&accepted, &pending, &rejected] {
            let request = Request {
                device: &device,
                public_key: &b,
                token: Some(&auto),
                own_token: false,
                existing_key: Some(existing),
                device_exists: true,
                pending: 0,
                now: now(),
            };
            assert_eq!(
                decide(&request),
                Decision::Refuse(Refusal::Conflict),
                "{:?}",
                existing.state
            );
        }
    }

    #[test]
    fn tokens_and_keys_have_their_shapes() {
        assert_eq!(token_name("drover-enroll.line-3.abc"), Some("line-3"));
        assert_eq!(token_name("drover-enroll.line-3."), None);
        assert_eq!(token_name("drover-op.line-3.abc"), None);
        assert_eq!(token_name("drover-enroll..abc"), None);
        assert!(valid_public_key(&"0f".repeat(32)));
        assert!(!valid_public_key(&"0F".repeat(32)));
        assert!(!valid_public_key(&"0f".repeat(31)));
        assert!(!valid_public_key(&"zz".repeat(32)));
    }
}
