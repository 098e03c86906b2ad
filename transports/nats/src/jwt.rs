//! NATS decentralized authentication (issue 55): the JWTs nats-server
//! trusts, as the `nats-io/jwt` v2 library writes them (read there:
//! `v2/claims.go`, `user_claims.go`, `account_claims.go`). A JWT is
//! `base64url(header).base64url(claims).base64url(signature)`, the header
//! `{"typ":"JWT","alg":"ed25519-nkey"}`, the signature the issuer's nkey's
//! over the first two parts. nats-server checks the signature, the issuer
//! and the expiry; `jti` is only an id (here the claims' SHA-256 in base32).

use base64::Engine;
use nkeys::KeyPair;
use serde_json::{Value, json};
use std::collections::BTreeMap;

#[derive(Debug, thiserror::Error)]
pub enum JwtError {
    #[error("cannot sign with the nkey: {0}")]
    Sign(String),
    #[error("cannot encode the claims: {0}")]
    Encode(#[from] serde_json::Error),
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// A JWT with `nats` as its NATS-specific claims, about `subject`, issued by
/// `issuer` at `issued_at` (Unix seconds).
pub fn encode(
    issuer: &KeyPair,
    subject: &str,
    name: &str,
    nats: Value,
    issued_at: i64,
) -> Result<String, JwtError> {
    let header = b64(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let mut claims = json!({
        "iat": issued_at,
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let digest = ring::digest::digest(&ring::digest::SHA256, &serde_json::to_vec(&claims)?);
    claims["jti"] = Value::String(drover_model::nkey::base32(digest.as_ref()));
    let signed = format!("{header}.{}", b64(&serde_json::to_vec(&claims)?));
    let signature = issuer
        .sign(signed.as_bytes())
        .map_err(|e| JwtError::Sign(e.to_string()))?;
    Ok(format!("{signed}.{}", b64(&signature)))
}

/// The claims part of a JWT, decoded (for tests and for reading back).
pub fn claims(jwt: &str) -> Option<Value> {
    let part = jwt.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// An operator's claims: which account is the system account.
pub fn operator_claims(system_account: &str) -> Value {
    json!({ "system_account": system_account, "type": "operator", "version": 2 })
}

/// An account's claims: no limit but what the server has, JetStream on
/// when asked, the keys that sign its users, and its users revoked (user
/// public key → the time before which its JWTs no longer hold).
pub fn account_claims(
    signing_keys: &[String],
    revocations: &BTreeMap<String, i64>,
    jetstream: bool,
) -> Value {
    let store = if jetstream { -1 } else { 0 };
    json!({
        "limits": {
            "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
            "wildcards": true, "conn": -1, "leaf": -1,
            "mem_storage": store, "disk_storage": store, "streams": store, "consumer": store,
        },
        "signing_keys": signing_keys,
        "revocations": revocations,
        "default_permissions": { "pub": {}, "sub": {} },
        "type": "account",
        "version": 2,
    })
}

/// What a user may publish and subscribe to; None: everything.
pub struct Permissions {
    pub publish: Vec<String>,
    pub subscribe: Vec<String>,
}

/// A user's claims, signed by a signing key of `issuer_account`. A bearer
/// JWT lets in whoever shows it, with no nonce to sign: only for a user
/// whose JWT is no secret and whose rights are few (the enrollment user).
pub fn user_claims(issuer_account: &str, permissions: Option<&Permissions>, bearer: bool) -> Value {
    let mut nats = json!({
        "subs": -1, "data": -1, "payload": -1,
        "issuer_account": issuer_account,
        "type": "user",
        "version": 2,
    });
    if let Some(permissions) = permissions {
        nats["pub"] = json!({ "allow": permissions.publish });
        nats["sub"] = json!({ "allow": permissions.subscribe });
    }
    if bearer {
        nats["bearer_token"] = Value::Bool(true);
    }
    nats
}

/// A credentials file as `nats` tools and async-nats read it.
pub fn creds(jwt: &str, seed: &str) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device's key as the control plane names it is the key nkeys makes
    /// from the same seed.
    #[test]
    fn a_devices_user_nkey_is_the_one_nkeys_makes() {
        let seed = [7u8; 32];
        let pair = KeyPair::new_from_raw(nkeys::KeyPairType::User, seed).expect("key");
        let ring = ring::signature::Ed25519KeyPair::from_seed_unchecked(&seed).expect("ring");
        use ring::signature::KeyPair as _;
        let hex = drover_model::signing::hex(ring.public_key().as_ref());
        assert_eq!(
            drover_model::nkey::user_nkey(&hex).as_deref(),
            Some(pair.public_key().as_str())
        );
    }

    #[test]
    fn a_jwt_is_signed_by_its_issuer_over_its_first_two_parts() {
        let account = KeyPair::new_account();
        let user = KeyPair::new_user();
        let permissions = Permissions {
            publish: vec!["a.b".into()],
            subscribe: vec!["c.>".into()],
        };
        let jwt = encode(
            &account,
            &user.public_key(),
            "pi-1",
            user_claims(&account.public_key(), Some(&permissions), false),
            1_700_000_000,
        )
        .expect("jwt");
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let signature = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(parts[2])
            .expect("b64");
        let signed = format!("{}.{}", parts[0], parts[1]);
        account
            .verify(signed.as_bytes(), &signature)
            .expect("the issuer's signature");
        assert!(user.verify(signed.as_bytes(), &signature).is_err());
        let claims = claims(&jwt).expect("claims");
        assert_eq!(claims["sub"], user.public_key());
        assert_eq!(claims["iss"], account.public_key());
        assert_eq!(claims["nats"]["pub"]["allow"][0], "a.b");
        assert_eq!(claims["nats"]["type"], "user");
        assert!(claims["jti"].as_str().is_some_and(|j| j.len() == 52));
    }
}
