//! Enrollment requests as the transports hand them over (issue 55): the
//! device's signature is checked here, the records read, the rules'
//! `enrollment::decide` asked, and what it decided written: the token's
//! use, the device's key (pending or accepted) and, when accepted, the
//! device with the token's groups and labels. Operators' actions (accept,
//! reject, tokens) are in `api::enrollment`.

use crate::enroll_limits::EnrollLimits;
use drover_contract::gate::{EnrollAnswer as Answer, EnrollRequest as Enrollment, Proof};
use drover_model::DeviceId;
use drover_model::enroll::{Inventory, broker_password_message, enroll_message, verify};
use drover_rules::enrollment::{
    Decision, DeviceKeyRecord, EnrollInventory, EnrollmentTokenRecord, INVENTORY_FIELD_MAX,
    KEY_PREFIX_KEY, KeyConflict, KeyState, REVOKED_PREFIX_KEY, Refusal, Request, RevokedKeyRecord,
    decide, key_key, revoked_key, token_key, token_name, valid_public_key,
};
use drover_rules::records::{DeviceRecord, device_key};
use drover_store::db::{Db, DbError};
use jiff::Timestamp;
use ring::digest::{SHA256, digest};
use tracing::info;

/// How often the same conflicting key is noted again on a device's key
/// record: a device asking again and again (or a flood) writes once a
/// minute, not once a request.
pub const CONFLICT_NOTED_EVERY: jiff::SignedDuration = jiff::SignedDuration::from_secs(60);

/// Whether a conflict by `public_key` at `now` is news beside the last one
/// noted: another key, or the same one after [`CONFLICT_NOTED_EVERY`].
fn worth_noting(last: Option<&KeyConflict>, public_key: &str, now: Timestamp) -> bool {
    match last {
        None => true,
        Some(last) => {
            last.public_key != public_key || now.duration_since(last.at) >= CONFLICT_NOTED_EVERY
        }
    }
}

/// Who accepted a key that came with the device's own bearer token.
pub const DEVICE_TOKEN: &str = "device-token";

/// SHA-256 of an enrollment token, hex: what the store keeps.
pub fn token_digest(token: &str) -> String {
    drover_model::signing::hex(digest(&SHA256, token.as_bytes()).as_ref())
}

fn cut(field: Option<String>) -> Option<String> {
    field.map(|f| {
        drover_model::bounded(
            f.replace(|c: char| c.is_control(), " "),
            INVENTORY_FIELD_MAX,
        )
    })
}

fn stored_inventory(inventory: Inventory) -> EnrollInventory {
    EnrollInventory {
        hostname: cut(inventory.hostname),
        os_release: cut(inventory.os_release),
        architecture: cut(inventory.architecture),
        agent_version: cut(inventory.agent_version),
    }
}

/// The token's record, if `token` is one this control plane issued.
async fn token_of(db: &Db, token: &str) -> Result<Option<(u64, EnrollmentTokenRecord)>, DbError> {
    let Some(name) = token_name(token) else {
        return Ok(None);
    };
    let digest = token_digest(token);
    Ok(db
        .get::<EnrollmentTokenRecord>(&token_key(name))
        .await?
        .filter(|(_, record)| record.digest == digest))
}

/// Devices waiting for an operator.
pub async fn pending_count(db: &Db) -> Result<usize, DbError> {
    Ok(db
        .list::<DeviceKeyRecord>(KEY_PREFIX_KEY)
        .await?
        .iter()
        .filter(|(_, _, key)| key.state == KeyState::Pending)
        .count())
}

/// Decides one request and writes what was decided. A request that races
/// another for the same token or id is decided again on what won.
/// `own_token`: the request's token is the device's own bearer token (the
/// caller checked it), so the device moves from its token to its key.
/// `limits`: how fast requests are taken per address and new devices per
/// token ([`EnrollLimits`]).
pub async fn enroll(
    db: &Db,
    request: Enrollment,
    own_token: bool,
    limits: &EnrollLimits,
) -> Result<Answer, DbError> {
    if let Some(peer) = request.peer
        && let Err(refused) = limits.address(peer)
    {
        return Ok(Answer::Refused(refused));
    }
    if !valid_public_key(&request.public_key) {
        return Ok(Answer::Refused(
            "the public key is not 64 lowercase hex digits (an Ed25519 key)".into(),
        ));
    }
    let proven = match &request.proof {
        Proof::Challenge {
            challenge,
            signature,
        } => verify(
            &request.public_key,
            &enroll_message(&request.device, &request.public_key, challenge),
            signature,
        ),
        Proof::BrokerPassword(password) => verify(
            &request.public_key,
            &broker_password_message(&request.device, &request.public_key),
            password,
        ),
    };
    if !proven {
        let what = match request.proof {
            Proof::Challenge { .. } => "the signature is not the key's over this challenge",
            Proof::BrokerPassword(_) => "the broker password is not the key's signature",
        };
        return Ok(Answer::Refused(what.into()));
    }
    for _ in 0..20 {
        if let Some(answer) = try_enroll(db, &request, own_token, limits).await? {
            return Ok(answer);
        }
    }
    Err(DbError::Contention {
        key: key_key(&request.device),
        tries: 20,
    })
}

/// One attempt; None when a write lost a race.
async fn try_enroll(
    db: &Db,
    request: &Enrollment,
    own_token: bool,
    limits: &EnrollLimits,
) -> Result<Option<Answer>, DbError> {
    let now = Timestamp::now();
    let existing = db.get::<DeviceKeyRecord>(&key_key(&request.device)).await?;
    let token = if own_token {
        None
    } else {
        token_of(db, &request.token).await?
    };
    let device_exists = db
        .get::<DeviceRecord>(&device_key(&request.device))
        .await?
        .is_some();
    let mut facts = Request {
        device: &request.device,
        public_key: &request.public_key,
        token: token.as_ref().map(|(_, t)| t),
        own_token,
        existing_key: existing.as_ref().map(|(_, k)| k),
        device_exists,
        pending: 0,
        now,
    };
    let mut decision = decide(&facts);
    if decision == Decision::Pend {
        facts.pending = pending_count(db).await?;
        decision = decide(&facts);
    }
    match decision {
        Decision::Unchanged(KeyState::Accepted) => Ok(Some(Answer::Accepted)),
        Decision::Unchanged(_) => Ok(Some(Answer::Pending)),
        Decision::Refuse(Refusal::Conflict) => {
            if let Some((revision, mut key)) = existing
                && worth_noting(key.conflict.as_ref(), &request.public_key, now)
            {
                key.conflict = Some(KeyConflict {
                    public_key: request.public_key.clone(),
                    at: now,
                    peer: request.peer.map(|p| p.to_string()),
                });
                // Noting the conflict is best effort: the refusal stands.
                let _ = db.put(&key_key(&request.device), &key, revision).await;
                tracing::warn!(device = %request.device, "enrollment refused: the id is enrolled with another key");
            }
            Ok(Some(Answer::Refused(Refusal::Conflict.message().into())))
        }
        Decision::Refuse(refusal) => {
            info!(device = %request.device, reason = refusal.message(), "enrollment refused");
            Ok(Some(Answer::Refused(refusal.message().into())))
        }
        Decision::Accept { .. } | Decision::Pend => {
            // A new device (or a new key) is what a token's limit counts.
            if let Some((_, token)) = &token
                && let Err(refused) = limits.token(&token.name)
            {
                return Ok(Some(Answer::Refused(refused)));
            }
            write(db, request, token, decision, device_exists, now).await
        }
    }
}

/// Writes an accepted or pending key; `token` is None for a device that
/// came with its own bearer token.
async fn write(
    db: &Db,
    request: &Enrollment,
    token: Option<(u64, EnrollmentTokenRecord)>,
    decision: Decision,
    device_exists: bool,
    now: Timestamp,
) -> Result<Option<Answer>, DbError> {
    let accepted = matches!(decision, Decision::Accept { .. });
    let by = match &token {
        Some((_, token)) => format!("token/{}", token.name),
        None => DEVICE_TOKEN.to_owned(),
    };
    // A limited token's use first: a token used up meanwhile refuses this
    // one. An unlimited token is not written at all, so a thousand devices
    // of one image enrolling at once do not all compete for one record;
    // its uses are counted from the keys that name it.
    if let Some((revision, mut token)) = token.clone()
        && token.max_uses.is_some()
    {
        token.uses += 1;
        if let Err(e) = db.put(&token_key(&token.name), &token, revision).await {
            return lost(e);
        }
    }
    let key = DeviceKeyRecord {
        device: request.device.clone(),
        public_key: request.public_key.clone(),
        state: if accepted {
            KeyState::Accepted
        } else {
            KeyState::Pending
        },
        token: token.as_ref().map(|(_, t)| t.name.clone()),
        inventory: stored_inventory(request.inventory.clone()),
        requested_at: now,
        peer: request.peer.map(|p| p.to_string()),
        decided_at: accepted.then_some(now),
        decided_by: accepted.then(|| by.clone()),
        existing_device: device_exists,
        conflict: None,
    };
    // Another request for the same id got there first: decided again (a
    // use of the token is spent, as for any refused request that got this far).
    if let Err(e) = db.put(&key_key(&request.device), &key, 0).await {
        return lost(e);
    }
    if let Decision::Accept { groups, labels } = decision {
        join(db, &request.device, &groups, &labels).await?;
        info!(device = %request.device, by = %by, "device enrolled and accepted");
        Ok(Some(Answer::Accepted))
    } else {
        info!(device = %request.device, by = %by, "device enrolled; waits for an operator");
        Ok(Some(Answer::Pending))
    }
}

fn lost(e: DbError) -> Result<Option<Answer>, DbError> {
    match e {
        DbError::Kv(e) if e.is_conflict() => Ok(None),
        e => Err(e),
    }
}

/// Makes (or adds to) the device's record with `groups` and `labels`: an
/// accepted device is in the fleet, where runs can reach it.
pub async fn join(
    db: &Db,
    device: &DeviceId,
    groups: &std::collections::BTreeSet<String>,
    labels: &std::collections::BTreeMap<String, String>,
) -> Result<(), DbError> {
    db.update::<DeviceRecord, _>(&device_key(device), |current| {
        let created = current.is_none();
        let mut record = current.unwrap_or_else(|| DeviceRecord::new(device.clone()));
        let before = record.clone();
        record.groups.extend(groups.iter().cloned());
        for (k, v) in labels {
            record.labels.entry(k.clone()).or_insert_with(|| v.clone());
        }
        (created || record != before).then_some(record)
    })
    .await?;
    Ok(())
}

/// Remembers that `key` (an accepted one) is losing its acceptance,
/// before the change that ends it: the brokers' revocations are checked
/// against these ([`Gate::revoked_keys`]).
pub async fn remember_revoked(db: &Db, key: &DeviceKeyRecord) -> Result<(), DbError> {
    let record = RevokedKeyRecord {
        device: key.device.clone(),
        public_key: key.public_key.clone(),
        revoked_at: Timestamp::now(),
    };
    // The latest revocation counts: a key accepted again since (a device
    // deleted and enrolled anew with it) must be refused from now.
    db.update(
        &revoked_key(&key.public_key),
        |_: Option<RevokedKeyRecord>| Some(record.clone()),
    )
    .await
    .map(|_| ())
}

/// The control plane's judgement at every transport's door: tokens at
/// their generation (until a key is accepted), accepted keys, enrollment.
#[derive(Clone)]
pub struct Gate {
    pub secrets: std::sync::Arc<crate::auth::Secrets>,
    pub credentials: std::sync::Arc<crate::device_tokens::Generations>,
    pub db: Db,
    pub limits: std::sync::Arc<EnrollLimits>,
}

impl drover_contract::gate::DeviceGate for Gate {
    fn token_opens(&self, device: &DeviceId, token: &str) -> bool {
        self.credentials.token_opens(&self.secrets, device, token)
    }

    fn key_of(&self, device: &DeviceId) -> Option<String> {
        self.credentials.key_of(device)
    }

    fn revoked_keys(&self) -> drover_contract::BoxFuture<'static, Vec<(DeviceId, String, i64)>> {
        let (db, credentials) = (self.db.clone(), self.credentials.clone());
        Box::pin(async move {
            match db.list::<RevokedKeyRecord>(REVOKED_PREFIX_KEY).await {
                // A key accepted again since (preauthorized anew) is left out.
                Ok(records) => records
                    .into_iter()
                    .filter(|(_, _, r)| {
                        credentials.key_of(&r.device).as_deref() != Some(r.public_key.as_str())
                    })
                    .map(|(_, _, r)| (r.device, r.public_key, r.revoked_at.as_second()))
                    .collect(),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the revoked keys");
                    Vec::new()
                }
            }
        })
    }

    fn enroll(&self, request: Enrollment) -> drover_contract::BoxFuture<'static, Answer> {
        let (db, limits) = (self.db.clone(), self.limits.clone());
        // A device's own token moves it to its key (the token is refused
        // from then on).
        let own_token = self.token_opens(&request.device, &request.token);
        Box::pin(async move {
            enroll(&db, request, own_token, &limits)
                .await
                .unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "cannot record an enrollment request");
                    Answer::Refused(format!(
                        "the control plane cannot record the request now ({e}); try again later"
                    ))
                })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_model::signing::hex;
    use drover_store::store::mem::MemKv;
    use ring::signature::{Ed25519KeyPair, KeyPair};
    use std::sync::Arc;

    struct Device {
        id: DeviceId,
        pair: Ed25519KeyPair,
    }

    impl Device {
        fn new(id: &str, seed: u8) -> Self {
            Self {
                id: DeviceId::new(id).expect("id"),
                pair: Ed25519KeyPair::from_seed_unchecked(&[seed; 32]).expect("key"),
            }
        }

        fn public(&self) -> String {
            hex(self.pair.public_key().as_ref())
        }

        /// This key's signature as a broker password for `device`.
        fn broker_password(&self, device: &DeviceId) -> String {
            hex(self
                .pair
                .sign(&broker_password_message(device, &self.public()))
                .as_ref())
        }

        fn request(&self, token: &str) -> Enrollment {
            let challenge = "0a".repeat(32);
            let signature = hex(self
                .pair
                .sign(&enroll_message(&self.id, &self.public(), &challenge))
                .as_ref());
            Enrollment {
                device: self.id.clone(),
                public_key: self.public(),
                token: token.into(),
                inventory: Inventory {
                    hostname: Some("pi\u{1b}[31m".into()),
                    ..Inventory::default()
                },
                proof: Proof::Challenge {
                    challenge,
                    signature,
                },
                peer: None,
            }
        }
    }

    /// The device's key record as stored, with its revision.
    async fn stored_key(db: &Db, device: &DeviceId) -> (u64, DeviceKeyRecord) {
        db.get::<DeviceKeyRecord>(&key_key(device))
            .await
            .expect("get")
            .expect("key")
    }

    async fn with_token(db: &Db, name: &str, auto_accept: bool, max_uses: Option<u64>) -> String {
        let token = format!("drover-enroll.{name}.s3cret");
        let record = EnrollmentTokenRecord {
            name: name.into(),
            digest: token_digest(&token),
            groups: ["kiosk".to_owned()].into(),
            labels: [("site".to_owned(), "ghent".to_owned())].into(),
            max_uses,
            uses: 0,
            expires_at: None,
            auto_accept,
            created_at: Timestamp::now(),
            created_by: "operator/admin".into(),
            revoked_at: None,
            revoked_by: None,
        };
        db.put(&token_key(name), &record, 0).await.expect("put");
        token
    }

    #[tokio::test]
    async fn an_auto_accept_token_joins_the_device_with_its_groups_once_per_use() {
        let db = Db::new(Arc::new(MemKv::default()));
        let token = with_token(&db, "line-3", true, Some(1)).await;
        let pi = Device::new("pi-1", 1);
        assert_eq!(
            enroll(&db, pi.request(&token), false, &EnrollLimits::none())
                .await
                .expect("enroll"),
            Answer::Accepted
        );
        let (_, device) = db
            .get::<DeviceRecord>(&device_key(&pi.id))
            .await
            .expect("get")
            .expect("the device joined");
        assert!(device.groups.contains("kiosk"));
        assert_eq!(device.labels["site"], "ghent");
        let (_, key) = stored_key(&db, &pi.id).await;
        assert_eq!(key.state, KeyState::Accepted);
        assert_eq!(key.decided_by.as_deref(), Some("token/line-3"));
        assert_eq!(
            key.inventory.hostname.as_deref(),
            Some("pi [31m"),
            "control characters cleaned"
        );
        // Asking again with the same key spends no use; a second device
        // finds the token used up.
        assert_eq!(
            enroll(&db, pi.request(&token), false, &EnrollLimits::none())
                .await
                .expect("again"),
            Answer::Accepted
        );
        let other = Device::new("pi-2", 2);
        assert_eq!(
            enroll(&db, other.request(&token), false, &EnrollLimits::none())
                .await
                .expect("enroll"),
            Answer::Refused(Refusal::UsedUp.message().into())
        );
    }

    /// A token's limit counts new devices: a pending one asking again is
    /// not refused for the others, and the next new one is, with nothing
    /// recorded for it; another token has its own share.
    #[tokio::test]
    async fn a_tokens_limit_counts_new_devices_not_devices_asking_again() {
        let db = Db::new(Arc::new(MemKv::default()));
        let (image, other) = (
            with_token(&db, "image", false, None).await,
            with_token(&db, "other", false, None).await,
        );
        let limits = EnrollLimits::new(0, 2);
        let (a, b, c) = (
            Device::new("pi-a", 1),
            Device::new("pi-b", 2),
            Device::new("pi-c", 3),
        );
        for pi in [&a, &b, &a, &b, &a] {
            let answer = enroll(&db, pi.request(&image), false, &limits).await;
            assert_eq!(answer.expect("enroll"), Answer::Pending, "{}", pi.id);
        }
        let refused = enroll(&db, c.request(&image), false, &limits).await;
        assert!(
            matches!(refused.expect("enroll"), Answer::Refused(m) if m.contains("too many new devices")),
        );
        assert!(
            db.get::<DeviceKeyRecord>(&key_key(&c.id))
                .await
                .expect("get")
                .is_none()
        );
        let answer = enroll(&db, c.request(&other), false, &limits).await;
        assert_eq!(answer.expect("enroll"), Answer::Pending);
    }

    /// A thousand devices of one image enrolling at once with an unlimited
    /// token do not compete for its record: it is not written per use.
    #[tokio::test]
    async fn an_unlimited_token_is_not_written_per_use() {
        let db = Db::new(Arc::new(MemKv::default()));
        let token = with_token(&db, "fleet", true, None).await;
        let (before, _) = db
            .get::<EnrollmentTokenRecord>(&token_key("fleet"))
            .await
            .expect("get")
            .expect("token");
        let enrollments = (0..50u8).map(|i| {
            let db = db.clone();
            let token = token.clone();
            tokio::spawn(async move {
                let pi = Device::new(&format!("pi-{i}"), i + 1);
                enroll(&db, pi.request(&token), false, &EnrollLimits::none())
                    .await
                    .expect("enroll")
            })
        });
        for answer in futures_util::future::join_all(enrollments).await {
            assert_eq!(answer.expect("task"), Answer::Accepted);
        }
        let (after, record) = db
            .get::<EnrollmentTokenRecord>(&token_key("fleet"))
            .await
            .expect("get")
            .expect("token");
        assert_eq!((after, record.uses), (before, 0));
        let limited = with_token(&db, "limited", true, Some(60)).await;
        let pi = Device::new("pi-limited", 200);
        assert_eq!(
            enroll(&db, pi.request(&limited), false, &EnrollLimits::none())
                .await
                .expect("enroll"),
            Answer::Accepted
        );
        let (_, record) = db
            .get::<EnrollmentTokenRecord>(&token_key("limited"))
            .await
            .expect("get")
            .expect("token");
        assert_eq!(record.uses, 1, "a limited token counts its uses");
    }

    #[tokio::test]
    async fn a_bad_signature_a_wrong_secret_and_another_key_are_refused() {
        let db = Db::new(Arc::new(MemKv::default()));
        let token = with_token(&db, "line-3", false, None).await;
        let pi = Device::new("pi-1", 1);
        let mut forged = pi.request(&token);
        if let Proof::Challenge { challenge, .. } = &mut forged.proof {
            *challenge = "0b".repeat(32);
        }
        assert!(
            matches!(enroll(&db, forged, false, &EnrollLimits::none()).await.expect("enroll"), Answer::Refused(m) if m.contains("signature"))
        );
        // A broker password proves the key only when it is this key's
        // signature for this device.
        let other = Device::new("pi-2", 2);
        let mut borrowed = pi.request(&token);
        borrowed.proof = Proof::BrokerPassword(other.broker_password(&pi.id));
        assert!(
            matches!(enroll(&db, borrowed, false, &EnrollLimits::none()).await.expect("enroll"), Answer::Refused(m) if m.contains("broker password"))
        );
        let mut elsewhere = pi.request(&token);
        elsewhere.proof = Proof::BrokerPassword(pi.broker_password(&other.id));
        assert!(matches!(
            enroll(&db, elsewhere, false, &EnrollLimits::none())
                .await
                .expect("enroll"),
            Answer::Refused(_)
        ));
        let wrong = pi.request("drover-enroll.line-3.guess");
        assert_eq!(
            enroll(&db, wrong, false, &EnrollLimits::none())
                .await
                .expect("enroll"),
            Answer::Refused(Refusal::UnknownToken.message().into())
        );
        // The positive controls: the right request waits for an operator,
        // and so does the same one proven by the device's broker password.
        assert_eq!(
            enroll(&db, pi.request(&token), false, &EnrollLimits::none())
                .await
                .expect("enroll"),
            Answer::Pending
        );
        let mut by_password = pi.request(&token);
        by_password.proof = Proof::BrokerPassword(pi.broker_password(&pi.id));
        assert_eq!(
            enroll(&db, by_password, false, &EnrollLimits::none())
                .await
                .expect("enroll"),
            Answer::Pending
        );
        assert!(
            db.get::<DeviceRecord>(&device_key(&pi.id))
                .await
                .expect("get")
                .is_none()
        );
        assert_eq!(pending_count(&db).await.expect("count"), 1);
        // Another key for the same id: refused, noted, the first key kept.
        let thief = Device::new("pi-1", 9);
        assert_eq!(
            enroll(&db, thief.request(&token), false, &EnrollLimits::none())
                .await
                .expect("enroll"),
            Answer::Refused(Refusal::Conflict.message().into())
        );
        let (revision, key) = stored_key(&db, &pi.id).await;
        assert_eq!(key.public_key, pi.public());
        assert_eq!(key.conflict.map(|c| c.public_key), Some(thief.public()));
        // Asking again and again writes nothing more within the minute; a
        // third key is news.
        for _ in 0..5 {
            assert_eq!(
                enroll(&db, thief.request(&token), false, &EnrollLimits::none())
                    .await
                    .expect("enroll"),
                Answer::Refused(Refusal::Conflict.message().into())
            );
        }
        let (again, _) = stored_key(&db, &pi.id).await;
        assert_eq!(again, revision, "a repeated conflict is not written again");
        let third = Device::new("pi-1", 10);
        enroll(&db, third.request(&token), false, &EnrollLimits::none())
            .await
            .expect("enroll");
        let (_, key) = stored_key(&db, &pi.id).await;
        assert_eq!(key.conflict.map(|c| c.public_key), Some(third.public()));
    }
}
