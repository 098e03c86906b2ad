//! Operators (`/operators`: list, add, rotate, revoke) and the audit log
//! (`/audit`: read, filtered, as JSON or JSON lines for a SIEM).

use super::access::{AUDIT_PREFIX, Caller, noted};
use super::tokens::{new_token, valid_name};
use super::*;
use axum::Extension;
use drover_api::operators as ops;
use drover_rules::records::{AuditRecord, BOOTSTRAP_OPERATOR, OperatorRecord, Role};

/// A stored role as the API names it.
pub(super) fn api_role(role: Role) -> ops::Role {
    match role {
        Role::Viewer => ops::Role::Viewer,
        Role::Operator => ops::Role::Operator,
        Role::Admin => ops::Role::Admin,
    }
}

fn operator_answer(operator: &OperatorRecord) -> ops::Operator {
    ops::Operator {
        name: operator.name.clone(),
        role: api_role(operator.role),
        bootstrap: operator.token_digest.is_none(),
        generation: operator.generation,
        created_at: operator.created_at,
        created_by: operator.created_by.clone(),
        changed_at: operator.changed_at,
        revoked_at: operator.revoked_at,
        revoked_by: operator.revoked_by.clone(),
        token: None,
    }
}

pub(super) async fn list_operators(
    State(state): State<ApiState>,
) -> Result<Json<Vec<ops::Operator>>, ApiError> {
    let operators = state.db.list::<OperatorRecord>("operators/").await?;
    Ok(Json(
        operators
            .iter()
            .map(|(_, _, operator)| operator_answer(operator))
            .collect(),
    ))
}

/// Who the caller is: the dashboard shows it and hides what the role
/// cannot do.
pub(super) async fn whoami(Extension(caller): Extension<Caller>) -> Json<ops::Whoami> {
    Json(ops::Whoami {
        name: caller.name,
        role: api_role(caller.role),
        via: match caller.via {
            access::Via::Token => ops::Via::Cli,
            access::Via::Dashboard => ops::Via::Dashboard,
        },
    })
}

/// Adds an operator and answers its token, once (only its digest is
/// kept). A revoked name may be added again: a new token, a new generation.
pub(super) async fn add_operator(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let body: ops::NewOperator = serde_json::from_slice(&body).map_err(|e| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("the request body is not {{\"name\": NAME, \"role\": ROLE}}: {e}"),
        )
    })?;
    if !valid_name(&body.name) {
        return Err(ApiError(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "{:?} is not an operator name: 1 to 63 of a-z, 0-9 and -, not starting or \
                 ending with -",
                body.name
            ),
        ));
    }
    let Some(role) = Role::parse(&body.role) else {
        return Err(ApiError(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("{:?} is not a role: viewer, operator or admin", body.role),
        ));
    };
    let token = new_token(&body.name)
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")))?;
    let digest = state.secrets.operator_digest(&token);
    let now = Timestamp::now();
    let key = drover_rules::records::operator_key(&body.name);
    let (expected, generation) = match state.db.get::<OperatorRecord>(&key).await? {
        None => (0, 0),
        Some((revision, old)) if old.revoked_at.is_some() => (revision, old.generation + 1),
        Some(_) => {
            return Err(ApiError(
                StatusCode::CONFLICT,
                format!(
                    "operator {} exists; `drover operators rotate {}` gives it a new token",
                    body.name, body.name
                ),
            ));
        }
    };
    let record = OperatorRecord {
        name: body.name.clone(),
        role,
        token_digest: Some(digest),
        generation,
        created_at: now,
        created_by: caller.who(),
        changed_at: now,
        revoked_at: None,
        revoked_by: None,
    };
    match state.db.put(&key, &record, expected).await {
        Ok(_) => {}
        Err(drover_store::db::DbError::Kv(e)) if e.is_conflict() => {
            return Err(ApiError(
                StatusCode::CONFLICT,
                format!("operator {} changed meanwhile; try again", body.name),
            ));
        }
        Err(e) => return Err(e.into()),
    }
    tracing::info!(operator = %body.name, %role, by = %caller.name, "operator added");
    let answer = ops::Operator {
        token: Some(token),
        ..operator_answer(&record)
    };
    Ok(noted(
        (StatusCode::CREATED, Json(answer)).into_response(),
        "Operator",
        &body.name,
        "created",
    ))
}

/// Changes operator `name` under a compare-and-set: `change` edits it
/// (true), leaves it as it is (false), or says why it may not (409). 404
/// when there is no such operator.
async fn change_operator(
    state: &ApiState,
    name: &str,
    mut change: impl FnMut(&mut OperatorRecord) -> Result<bool, String>,
) -> Result<OperatorRecord, ApiError> {
    let mut refusal = None;
    let updated = state
        .db
        .update::<OperatorRecord, _>(&drover_rules::records::operator_key(name), |current| {
            let mut operator = current?;
            refusal = None;
            match change(&mut operator) {
                Ok(true) => Some(operator),
                Ok(false) => None,
                Err(reason) => {
                    refusal = Some(reason);
                    None
                }
            }
        })
        .await?;
    if let Some(reason) = refusal {
        return Err(ApiError(StatusCode::CONFLICT, reason));
    }
    updated.ok_or_else(|| not_found(format!("operator {name}")))
}

/// Gives an operator a new token: the old one, and every dashboard session
/// made with it, stop working on every replica.
pub(super) async fn rotate_operator(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let token = new_token(&name)
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")))?;
    let digest = state.secrets.operator_digest(&token);
    let now = Timestamp::now();
    let operator = change_operator(&state, &name, |operator| {
        if operator.revoked_at.is_some() {
            return Err(format!(
                "operator {name} is revoked; `drover operators add {name} --role ROLE` makes it again"
            ));
        }
        operator.token_digest = Some(digest.clone());
        operator.generation += 1;
        operator.changed_at = now;
        Ok(true)
    })
    .await?;
    tracing::info!(operator = %name, by = %caller.name, "operator token rotated");
    let answer = ops::Operator {
        token: Some(token),
        ..operator_answer(&operator)
    };
    Ok(noted(
        Json(answer).into_response(),
        "Operator",
        &name,
        "rotated",
    ))
}

/// Revokes an operator: its token and sessions are refused on every
/// replica from the moment the record reaches it. The last admin cannot be
/// revoked (nobody could manage operators after).
pub(super) async fn revoke_operator(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let operators = state.db.list::<OperatorRecord>("operators/").await?;
    let admins_left = operators
        .iter()
        .filter(|(_, _, o)| o.role == Role::Admin && o.revoked_at.is_none() && o.name != name)
        .count();
    let now = Timestamp::now();
    let operator = change_operator(&state, &name, |operator| {
        if operator.revoked_at.is_some() {
            return Ok(false);
        }
        if operator.role == Role::Admin && admins_left == 0 {
            return Err(format!(
                "operator {name} is the last admin; add another admin first"
            ));
        }
        operator.revoked_at = Some(now);
        operator.revoked_by = Some(caller.who());
        operator.generation += 1;
        operator.changed_at = now;
        Ok(true)
    })
    .await?;
    if name == BOOTSTRAP_OPERATOR {
        tracing::warn!(
            "the bootstrap operator is revoked: DATA/operator.token no longer opens the API"
        );
    }
    tracing::info!(operator = %name, by = %caller.name, "operator revoked");
    Ok(noted(
        Json(operator_answer(&operator)).into_response(),
        "Operator",
        &name,
        "revoked",
    ))
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct AuditQuery {
    /// RFC 3339 time, or an age such as `24h` or `7d`.
    since: Option<String>,
    operator: Option<String>,
    kind: Option<String>,
    /// `jsonl`: one entry per line (a SIEM's input); else a JSON array.
    format: Option<String>,
}

/// The entry as the API shows it.
pub(super) fn audit_entry(entry: &AuditRecord) -> ops::AuditEntry {
    ops::AuditEntry {
        at: entry.at,
        who: entry.who.clone(),
        role: entry.role.map(api_role),
        via: entry.via.clone(),
        peer: entry.peer.clone(),
        verb: entry.verb.clone(),
        kind: entry.kind.clone(),
        name: entry.name.clone(),
        request: entry.request.clone(),
        body_digest: entry.body_digest.clone(),
        objects: entry
            .objects
            .iter()
            .map(|o| ops::AuditObject {
                kind: o.kind.clone(),
                name: o.name.clone(),
                result: o.result.clone(),
                digest: o.digest.clone(),
            })
            .collect(),
        objects_total: entry.objects_total,
        outcome: entry.outcome.clone(),
        status: entry.status,
        reason: entry.reason.clone(),
        replica: entry.replica.clone(),
    }
}

/// When `since` begins: a time, or an age before now.
fn since(text: &str, now: Timestamp) -> Result<Timestamp, ApiError> {
    if let Ok(at) = text.parse::<Timestamp>() {
        return Ok(at);
    }
    let bad = || {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("since={text}: give a time (2026-12-01T00:00:00Z) or an age (30m, 24h, 7d)"),
        )
    };
    let age = drover_api::parse_age(text).ok_or_else(bad)?;
    now.checked_sub(age).map_err(|_| bad())
}

/// The audit log in time order, filtered by time, operator and kind.
pub(super) async fn read_audit(
    State(state): State<ApiState>,
    Query(query): Query<AuditQuery>,
) -> Result<Response, ApiError> {
    let from = match query.since.as_deref() {
        Some(text) => Some(since(text, Timestamp::now())?),
        None => None,
    };
    let who = query
        .operator
        .as_deref()
        .map(|name| format!("operator/{name}"));
    let entries = state.db.list::<AuditRecord>(AUDIT_PREFIX).await?;
    let shown = entries.iter().map(|(_, _, e)| e).filter(|e| {
        from.is_none_or(|from| e.at >= from)
            && who.as_deref().is_none_or(|who| e.who == who)
            && query.kind.as_deref().is_none_or(|kind| {
                e.kind
                    .as_deref()
                    .is_some_and(|k| k.eq_ignore_ascii_case(kind))
                    || e.objects.iter().any(|o| o.kind.eq_ignore_ascii_case(kind))
            })
    });
    match query.format.as_deref() {
        None | Some("json") => Ok(Json(shown.map(audit_entry).collect::<Vec<_>>()).into_response()),
        Some("jsonl") => {
            let mut lines = String::new();
            for entry in shown {
                let line = serde_json::to_string(&audit_entry(entry))
                    .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
                lines.push_str(&line);
                lines.push('\n');
            }
            Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], lines).into_response())
        }
        Some(other) => Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!("format={other}: json or jsonl"),
        )),
    }
}
