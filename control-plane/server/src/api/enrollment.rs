//! Enrollment (issue 55) as operators see it: enrollment tokens (list,
//! create, revoke) and the keys devices enrolled (list; accept or reject a
//! pending one). Every change needs an admin and is in the audit log.

use super::access::{Caller, noted};
use super::tokens::valid_name;
use super::*;
use axum::Extension;
use drover_api::enrollment as api;
use drover_rules::enrollment::{
    DeviceKeyRecord, EnrollmentTokenRecord, KEY_PREFIX_KEY, KeyState, TOKEN_PREFIX,
    TOKEN_PREFIX_KEY, key_key, token_key,
};
use std::collections::BTreeMap;

fn token_answer(record: &EnrollmentTokenRecord) -> api::EnrollmentToken {
    api::EnrollmentToken {
        name: record.name.clone(),
        groups: record.groups.iter().cloned().collect(),
        labels: record.labels.clone(),
        max_uses: record.max_uses,
        uses: record.uses,
        expires_at: record.expires_at,
        auto_accept: record.auto_accept,
        created_at: record.created_at,
        created_by: record.created_by.clone(),
        revoked_at: record.revoked_at,
        revoked_by: record.revoked_by.clone(),
        token: None,
    }
}

fn api_state(state: KeyState) -> api::KeyState {
    match state {
        KeyState::Pending => api::KeyState::Pending,
        KeyState::Accepted => api::KeyState::Accepted,
        KeyState::Rejected => api::KeyState::Rejected,
    }
}

fn key_answer(record: &DeviceKeyRecord) -> api::DeviceKey {
    api::DeviceKey {
        device: record.device.to_string(),
        public_key: record.public_key.clone(),
        state: api_state(record.state),
        token: record.token.clone(),
        hostname: record.inventory.hostname.clone(),
        os_release: record.inventory.os_release.clone(),
        architecture: record.inventory.architecture.clone(),
        agent_version: record.inventory.agent_version.clone(),
        requested_at: record.requested_at,
        peer: record.peer.clone(),
        decided_at: record.decided_at,
        decided_by: record.decided_by.clone(),
        existing_device: record.existing_device,
        conflict: record.conflict.as_ref().map(|c| api::KeyConflict {
            public_key: c.public_key.clone(),
            at: c.at,
            peer: c.peer.clone(),
        }),
    }
}

/// What every device's agent config pins: the intent keys (and over NATS
/// the enrollment user's JWT). Public keys only; a viewer may read them.
pub(super) async fn agent_trust(State(state): State<ApiState>) -> Json<api::AgentTrust> {
    Json(api::AgentTrust::clone(&state.agent_trust))
}

pub(super) async fn list_enrollment_tokens(
    State(state): State<ApiState>,
) -> Result<Json<Vec<api::EnrollmentToken>>, ApiError> {
    let tokens = state
        .db
        .list::<EnrollmentTokenRecord>(TOKEN_PREFIX_KEY)
        .await?;
    // An unlimited token's uses are its keys (it is not written per use).
    let keys = state.db.list::<DeviceKeyRecord>(KEY_PREFIX_KEY).await?;
    let mut enrolled: BTreeMap<&str, u64> = BTreeMap::new();
    for (_, _, key) in &keys {
        if let Some(name) = key.token.as_deref() {
            *enrolled.entry(name).or_default() += 1;
        }
    }
    Ok(Json(
        tokens
            .iter()
            .map(|(_, _, t)| api::EnrollmentToken {
                uses: t
                    .uses
                    .max(enrolled.get(t.name.as_str()).copied().unwrap_or(0)),
                ..token_answer(t)
            })
            .collect(),
    ))
}

fn unprocessable(message: String) -> ApiError {
    ApiError(StatusCode::UNPROCESSABLE_ENTITY, message)
}

/// Makes an enrollment token and answers it, once.
pub(super) async fn create_enrollment_token(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let body: api::NewEnrollmentToken = serde_json::from_slice(&body).map_err(|e| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("the request body is not a new enrollment token: {e}"),
        )
    })?;
    if !valid_name(&body.name) {
        return Err(unprocessable(format!(
            "{:?} is not a token name: 1 to 63 of a-z, 0-9 and -, not starting or ending with -",
            body.name
        )));
    }
    let problems = manifest::group_and_label_problems(
        &format!("enrollment token {}", body.name),
        &body.groups,
        &body.labels,
    );
    if !problems.is_empty() {
        return Err(unprocessable(problems.join("; ")));
    }
    let now = Timestamp::now();
    if body.expires_at.is_some_and(|at| at <= now) {
        return Err(unprocessable("expiresAt is in the past".into()));
    }
    if body.max_uses == Some(0) {
        return Err(unprocessable("maxUses 0 would enroll no device".into()));
    }
    let secret = crate::auth::random_hex(32)
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")))?;
    let token = format!("{TOKEN_PREFIX}{}.{secret}", body.name);
    let record = EnrollmentTokenRecord {
        name: body.name.clone(),
        digest: crate::enrollment::token_digest(&token),
        groups: body.groups.iter().cloned().collect(),
        labels: body.labels.clone(),
        max_uses: body.max_uses,
        uses: 0,
        expires_at: body.expires_at,
        auto_accept: body.auto_accept,
        created_at: now,
        created_by: caller.who(),
        revoked_at: None,
        revoked_by: None,
    };
    match state.db.put(&token_key(&body.name), &record, 0).await {
        Ok(_) => {}
        Err(DbError::Kv(e)) if e.is_conflict() => {
            return Err(ApiError(
                StatusCode::CONFLICT,
                format!("enrollment token {} exists; pick another name", body.name),
            ));
        }
        Err(e) => return Err(e.into()),
    }
    tracing::info!(token = %body.name, auto_accept = body.auto_accept, by = %caller.name, "enrollment token created");
    let answer = api::EnrollmentToken {
        token: Some(token),
        ..token_answer(&record)
    };
    Ok(noted(
        (StatusCode::CREATED, Json(answer)).into_response(),
        "EnrollmentToken",
        &body.name,
        "created",
    ))
}

/// Revokes a token: devices that enrolled with it stay; no new one can.
pub(super) async fn revoke_enrollment_token(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let now = Timestamp::now();
    let updated = state
        .db
        .update::<EnrollmentTokenRecord, _>(&token_key(&name), |current| {
            let mut record = current?;
            if record.revoked_at.is_some() {
                return None;
            }
            record.revoked_at = Some(now);
            record.revoked_by = Some(caller.who());
            Some(record)
        })
        .await?
        .ok_or_else(|| not_found(format!("enrollment token {name}")))?;
    Ok(noted(
        Json(token_answer(&updated)).into_response(),
        "EnrollmentToken",
        &name,
        "revoked",
    ))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct KeyFilter {
    /// pending, accepted or rejected; without it, every key.
    state: Option<String>,
}

pub(super) async fn list_device_keys(
    State(state): State<ApiState>,
    Query(filter): Query<KeyFilter>,
) -> Result<Json<Vec<api::DeviceKey>>, ApiError> {
    let wanted = match filter.state.as_deref() {
        None => None,
        Some("pending") => Some(KeyState::Pending),
        Some("accepted") => Some(KeyState::Accepted),
        Some("rejected") => Some(KeyState::Rejected),
        Some(other) => {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                format!("state {other:?} is not pending, accepted or rejected"),
            ));
        }
    };
    let keys = state.db.list::<DeviceKeyRecord>(KEY_PREFIX_KEY).await?;
    Ok(Json(
        keys.iter()
            .filter(|(_, _, k)| wanted.is_none_or(|w| k.state == w))
            .map(|(_, _, k)| key_answer(k))
            .collect(),
    ))
}

async fn decide_key(
    state: &ApiState,
    caller: &Caller,
    id: &str,
    to: KeyState,
) -> Result<DeviceKeyRecord, ApiError> {
    let device = DeviceId::new(id.to_owned())
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
    let now = Timestamp::now();
    let key = key_key(&device);
    let Some((revision, mut record)) = state.db.get::<DeviceKeyRecord>(&key).await? else {
        return Err(not_found(format!("an enrolled key of device {device}")));
    };
    if record.state == to {
        return Ok(record);
    }
    if to == KeyState::Accepted && record.state == KeyState::Rejected {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!(
                "device {device}'s key was rejected; delete the device (`drover delete device \
                 {device}`) and let it enroll again"
            ),
        ));
    }
    if record.state == KeyState::Accepted {
        // Remembered first: a broker that misses the removal is told again.
        crate::enrollment::remember_revoked(&state.db, &record).await?;
    }
    record.state = to;
    record.decided_at = Some(now);
    record.decided_by = Some(caller.who());
    match state.db.put(&key, &record, revision).await {
        Ok(_) => {}
        Err(DbError::Kv(e)) if e.is_conflict() => {
            return Err(ApiError(
                StatusCode::CONFLICT,
                format!("device {device}'s key changed meanwhile; try again"),
            ));
        }
        Err(e) => return Err(e.into()),
    }
    if to == KeyState::Accepted {
        // The device joins with its token's groups and labels.
        let token = match &record.token {
            Some(name) => state
                .db
                .get::<EnrollmentTokenRecord>(&token_key(name))
                .await?
                .map(|(_, t)| t),
            None => None,
        };
        let (groups, labels) = token.map(|t| (t.groups, t.labels)).unwrap_or_default();
        crate::enrollment::join(&state.db, &device, &groups, &labels).await?;
    }
    tracing::info!(%device, state = to.name(), by = %caller.name, "device key decided");
    Ok(record)
}

/// Accepts a pending key: the device joins the fleet.
pub(super) async fn accept_device(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    decided(&state, &caller, &id, KeyState::Accepted).await
}

/// Rejects a key (pending or accepted): it opens nothing, and asking again
/// is refused; an open session ends.
pub(super) async fn reject_device(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    decided(&state, &caller, &id, KeyState::Rejected).await
}

/// The answer to an operator's decision on a key, noted in the audit log
/// as the key's new state.
async fn decided(
    state: &ApiState,
    caller: &Caller,
    id: &str,
    to: KeyState,
) -> Result<Response, ApiError> {
    let record = decide_key(state, caller, id, to).await?;
    Ok(noted(
        Json(key_answer(&record)).into_response(),
        "Device",
        id,
        to.name(),
    ))
}

/// Accepts a device's key before the device asks (pre-authorization): the
/// device joins with the groups and labels given, and its agent is let in
/// by the key at once, without enrolling. Another key already recorded for
/// the id is a conflict (delete the device first).
pub(super) async fn preauthorize_key(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let body: api::PreauthorizedKey = serde_json::from_slice(&body).map_err(|e| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("the request body is not a device key: {e}"),
        )
    })?;
    let device = DeviceId::new(body.device.clone())
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
    if !drover_rules::enrollment::valid_public_key(&body.public_key) {
        return Err(unprocessable(
            "publicKey is not 64 lowercase hex digits (an Ed25519 key; `drover-agent status` \
             prints the device's)"
                .into(),
        ));
    }
    let problems =
        manifest::group_and_label_problems(&format!("device {device}"), &body.groups, &body.labels);
    if !problems.is_empty() {
        return Err(unprocessable(problems.join("; ")));
    }
    let key = key_key(&device);
    let existing = state.db.get::<DeviceKeyRecord>(&key).await?;
    if let Some((_, record)) = &existing
        && record.public_key != body.public_key
    {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!(
                "device {device} has another key ({}); delete the device first to give it \
                 another",
                record.state.name()
            ),
        ));
    }
    let now = Timestamp::now();
    let device_exists = state
        .db
        .get::<DeviceRecord>(&device_key(&device))
        .await?
        .is_some();
    let record = DeviceKeyRecord {
        device: device.clone(),
        public_key: body.public_key.clone(),
        state: KeyState::Accepted,
        token: None,
        inventory: Default::default(),
        requested_at: now,
        peer: None,
        decided_at: Some(now),
        decided_by: Some(caller.who()),
        existing_device: device_exists,
        conflict: None,
    };
    let expected = existing.as_ref().map_or(0, |(revision, _)| *revision);
    match state.db.put(&key, &record, expected).await {
        Ok(_) => {}
        Err(DbError::Kv(e)) if e.is_conflict() => {
            return Err(ApiError(
                StatusCode::CONFLICT,
                format!("device {device}'s key changed meanwhile; try again"),
            ));
        }
        Err(e) => return Err(e.into()),
    }
    let groups = body.groups.iter().cloned().collect();
    crate::enrollment::join(&state.db, &device, &groups, &body.labels).await?;
    tracing::info!(%device, by = %caller.name, "device key pre-authorized");
    Ok(noted(
        (StatusCode::CREATED, Json(key_answer(&record))).into_response(),
        "Device",
        device.as_str(),
        "preauthorized",
    ))
}
