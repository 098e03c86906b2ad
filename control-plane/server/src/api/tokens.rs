//! Which operator a credential names: operators' tokens (`drover-op.NAME.
//! SECRET`, checked against the digest in the operator's record), the
//! bootstrap token (`DATA/operator.token`, admin's until admin is rotated
//! or revoked) and dashboard sessions. The API's gate (`access`) and the
//! dashboard's login and event stream (`ui`) ask here.

use super::ApiState;
use crate::http::ApiError;
use drover_rules::records::{BOOTSTRAP_OPERATOR, OperatorRecord, Role, operator_key};
use drover_store::db::DbError;
use jiff::Timestamp;

/// How a named operator's token starts: `drover-op.NAME.SECRET`.
pub const TOKEN_PREFIX: &str = "drover-op.";

/// The bootstrap operator's record as it is before anyone changed it: an
/// admin whose token is `DATA/operator.token`.
fn bootstrap_record(now: Timestamp) -> OperatorRecord {
    OperatorRecord {
        name: BOOTSTRAP_OPERATOR.to_owned(),
        role: Role::Admin,
        token_digest: None,
        generation: 0,
        created_at: now,
        created_by: "init".to_owned(),
        changed_at: now,
        revoked_at: None,
        revoked_by: None,
    }
}

/// Stores the bootstrap operator once (every replica may try; the first
/// one's record stays), so the operators list shows it from the start.
pub async fn ensure_bootstrap(db: &drover_store::db::Db) -> Result<(), DbError> {
    let record = bootstrap_record(Timestamp::now());
    match db.put(&operator_key(BOOTSTRAP_OPERATOR), &record, 0).await {
        Ok(_) => Ok(()),
        Err(DbError::Kv(e)) if e.is_conflict() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whether `name` may name an operator: 1 to 63 of a-z, 0-9 and `-`, not
/// starting or ending with `-` (it appears in tokens, keys and cookies).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// The operator a named token claims to be.
pub(super) fn token_name(token: &str) -> Option<&str> {
    let (name, secret) = token.strip_prefix(TOKEN_PREFIX)?.rsplit_once('.')?;
    (valid_name(name) && !secret.is_empty()).then_some(name)
}

/// A fresh token for `name`.
pub fn new_token(name: &str) -> anyhow::Result<String> {
    Ok(format!(
        "{TOKEN_PREFIX}{name}.{}",
        crate::auth::random_hex(32)?
    ))
}

/// The credential an operator's sessions are bound to.
pub fn credential(state: &ApiState, operator: &OperatorRecord) -> String {
    operator
        .token_digest
        .clone()
        .unwrap_or_else(|| state.secrets.bootstrap_credential())
}

/// The record of operator `name`, if `token` is the token it was last
/// issued (revoked or not).
async fn issued_to(
    state: &ApiState,
    name: &str,
    token: &str,
) -> Result<Option<OperatorRecord>, ApiError> {
    let Some((_, record)) = state.db.get::<OperatorRecord>(&operator_key(name)).await? else {
        return Ok(None);
    };
    let issued = record
        .token_digest
        .as_deref()
        .is_some_and(|digest| state.secrets.verify_operator_digest(token, digest));
    Ok(issued.then_some(record))
}

/// The operator whose token this is, if it is one and not revoked. A
/// store that cannot answer is an error (fail closed).
pub async fn operator_of_token(
    state: &ApiState,
    token: &str,
) -> Result<Option<OperatorRecord>, ApiError> {
    if token.is_empty() {
        return Ok(None);
    }
    if let Some(name) = token_name(token) {
        return Ok(issued_to(state, name, token)
            .await?
            .filter(|record| record.revoked_at.is_none()));
    }
    if !state.secrets.verify_operator(token) {
        return Ok(None);
    }
    // The bootstrap token: admin's, until admin is rotated or revoked.
    Ok(
        match state
            .db
            .get::<OperatorRecord>(&operator_key(BOOTSTRAP_OPERATOR))
            .await?
        {
            None => Some(bootstrap_record(Timestamp::now())),
            Some((_, record)) => {
                (record.token_digest.is_none() && record.revoked_at.is_none()).then_some(record)
            }
        },
    )
}

/// The operator whose dashboard session this is, if it is valid: ours, not
/// expired, not logged out, and made with the operator's current token and
/// generation.
pub async fn operator_of_session(
    state: &ApiState,
    session: &str,
) -> Result<Option<OperatorRecord>, ApiError> {
    let Some(parsed) = crate::auth::Secrets::parse_ui_session(session) else {
        return Ok(None);
    };
    if !valid_name(parsed.name) {
        return Ok(None);
    }
    let record = match state
        .db
        .get::<OperatorRecord>(&operator_key(parsed.name))
        .await?
    {
        Some((_, record)) => record,
        None if parsed.name == BOOTSTRAP_OPERATOR => bootstrap_record(Timestamp::now()),
        None => return Ok(None),
    };
    if record.revoked_at.is_some() {
        return Ok(None);
    }
    let now = Timestamp::now().as_second();
    let credential = credential(state, &record);
    if !state
        .secrets
        .verify_ui_session(&parsed, record.generation, &credential, now)
    {
        return Ok(None);
    }
    let logout = super::ui::logout_key(&crate::auth::Secrets::ui_session_id(&parsed));
    Ok(state
        .db
        .get::<u64>(&logout)
        .await?
        .is_none()
        .then_some(record))
}

/// The operator a token that no longer opens the API was really issued to:
/// a revoked operator's own token (its digest is kept), or the bootstrap
/// token after admin was rotated or revoked. A made-up token naming an
/// operator is not one: only the holder of a real token can spend that
/// operator's refusal budget.
pub async fn former_operator_of_token(
    state: &ApiState,
    token: &str,
) -> Result<Option<String>, ApiError> {
    if token.is_empty() {
        return Ok(None);
    }
    if let Some(name) = token_name(token) {
        return Ok(issued_to(state, name, token)
            .await?
            .map(|record| record.name));
    }
    Ok(state
        .secrets
        .verify_operator(token)
        .then(|| BOOTSTRAP_OPERATOR.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_tokens_say_whose_they_are() {
        let token = new_token("alice").expect("token");
        assert_eq!(token_name(&token), Some("alice"));
        assert_eq!(token_name("drover-op.Alice.x"), None, "not a valid name");
        assert_eq!(token_name("drover-op.alice."), None, "no secret");
        assert_eq!(token_name("0123abcd"), None, "the bootstrap token");
        assert!(valid_name("ops-team-2"));
        assert!(!valid_name("-x") && !valid_name("a.b") && !valid_name(""));
    }
}
