//! `apply`: manifests (one, or a List) validated whole, then created or
//! updated; package references resolved.

use super::*;
use drover_api::changes::{
    Applied, AppliedList, ApplyAnswer as Answer, Changed, Kind, ListKind, Outcome,
};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ApplyQuery {
    /// `server`: check and preview only; nothing is stored.
    dry_run: Option<String>,
}

fn sha256_hex(bytes: &[u8]) -> String {
    drover_model::signing::hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

/// Applies one manifest, a JSON array of them, or a `kind: List` with
/// `items` (what `drover apply -f` sends for a file of several documents):
/// many devices register in one request. The answer carries the audit
/// log's note: each object, what became of it, and its manifest's digest.
pub(super) async fn apply(
    State(state): State<ApiState>,
    axum::Extension(caller): axum::Extension<super::access::Caller>,
    Query(query): Query<ApplyQuery>,
    body: axum::body::Bytes,
) -> Response {
    let dry_run = query.dry_run.is_some();
    let answer = if dry_run {
        apply_body(&state, query, &body).await
    } else {
        match check_field_roles(&state, &caller, &body).await {
            Ok(()) => apply_body(&state, query, &body).await,
            Err(e) => Err(e),
        }
    };
    if dry_run {
        let mut response = answer.into_response();
        response.extensions_mut().insert(super::access::AuditNote {
            skip: true,
            ..Default::default()
        });
        return response;
    }
    let note = apply_note(&body, &answer);
    let mut response = answer.into_response();
    response.extensions_mut().insert(note);
    response
}

/// The fields of a manifest whose change needs more than the operator role
/// that `apply` needs: (kind, field, role). Decommissioning a device, or
/// bringing one back, is an admin's (the threat model's table), through
/// `apply` as through any other route.
pub const FIELD_ROLES: &[(&str, &str, drover_rules::records::Role)] = &[(
    "Device",
    "spec.decommissioned",
    drover_rules::records::Role::Admin,
)];

/// The value a manifest asks for in `field` (`spec.decommissioned`), and
/// the one stored now; an object not stored yet has the field's default.
async fn asked_and_stored(
    state: &ApiState,
    kind: &str,
    field: &str,
    item: &Value,
) -> Result<Option<(Value, Value)>, ApiError> {
    match (kind, field) {
        ("Device", "spec.decommissioned") => {
            let asked = item["spec"]["decommissioned"].as_bool().unwrap_or(false);
            let Some(id) = item["metadata"]["name"]
                .as_str()
                .and_then(|name| DeviceId::new(name.to_owned()).ok())
            else {
                // Not a device id: the manifest is refused as it is parsed.
                return Ok(None);
            };
            let stored = state
                .db
                .get::<DeviceRecord>(&device_key(&id))
                .await?
                .is_some_and(|(_, device)| device.decommissioned);
            Ok(Some((json!(asked), json!(stored))))
        }
        _ => Ok(None),
    }
}

/// The manifests a body sends, as the audit note and the role check read
/// them: a JSON array, a List's `items`, or one manifest; `None` when the
/// body is not JSON.
fn sent_items(body: &[u8]) -> Option<Vec<Value>> {
    Some(match serde_json::from_slice::<Value>(body).ok()? {
        Value::Array(items) => items,
        Value::Object(map) if map.get("kind").and_then(Value::as_str) == Some("List") => map
            .get("items")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
        single => vec![single],
    })
}

/// Refuses (403, before anything is applied) a body whose manifests change
/// a field [`FIELD_ROLES`] gives to a role the caller does not have.
async fn check_field_roles(
    state: &ApiState,
    caller: &super::access::Caller,
    body: &[u8],
) -> Result<(), ApiError> {
    // Unreadable: refused as it is parsed.
    let Some(items) = sent_items(body) else {
        return Ok(());
    };
    for item in items.iter().take(MAX_LIST_ITEMS) {
        let kind = item["kind"].as_str().unwrap_or_default();
        for (field_kind, field, role) in FIELD_ROLES {
            if caller.role >= *role || !kind.eq_ignore_ascii_case(field_kind) {
                continue;
            }
            if let Some((asked, stored)) = asked_and_stored(state, field_kind, field, item).await?
                && asked != stored
            {
                return Err(ApiError(
                    StatusCode::FORBIDDEN,
                    format!(
                        "changing {field} of {field_kind} {} (from {stored} to {asked}) needs the \
                         {role} role; operator {} has the {} role",
                        item["metadata"]["name"].as_str().unwrap_or("?"),
                        caller.name,
                        caller.role
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// What the audit log keeps of an apply: each object, what became of it,
/// and its manifest's digest (the SHA-256 of its JSON as sent), but for
/// Secrets.
fn apply_note(
    body: &[u8],
    answer: &Result<(StatusCode, Json<Answer>), ApiError>,
) -> super::access::AuditNote {
    let sent = sent_items(body);
    // A Secret's manifest holds its values: a plain digest of it is
    // readable by every viewer and a short value is found from it by
    // trying them all, so neither a Secret nor a body that holds one (or
    // that could not be read as manifests) gets a digest.
    let is_secret = |item: &Value| {
        item.get("kind")
            .and_then(Value::as_str)
            .is_some_and(|kind| kind.eq_ignore_ascii_case("Secret"))
    };
    let holds_secret = sent.as_ref().is_none_or(|sent| sent.iter().any(is_secret));
    let sent = sent.unwrap_or_default();
    let digest = |index: usize| {
        sent.get(index)
            .filter(|item| !is_secret(item))
            .and_then(|item| serde_json::to_vec(item).ok())
            .map(|bytes| sha256_hex(&bytes))
    };
    let objects = match answer {
        Ok((_, Json(Answer::Applied(applied)))) => applied.items(),
        Ok((_, Json(Answer::Preview(_)))) | Err(_) => Vec::new(),
    };
    super::access::AuditNote {
        objects: objects
            .iter()
            .take(drover_rules::records::AUDIT_OBJECTS)
            .enumerate()
            .map(|(index, result)| drover_rules::records::AuditObject {
                kind: result.kind.name().to_owned(),
                name: result.name.clone(),
                result: Some(result.result.name().to_owned()),
                digest: (result.kind != Kind::Secret)
                    .then(|| digest(index))
                    .flatten(),
            })
            .collect(),
        objects_total: objects.len() as u64,
        body_digest: (!holds_secret).then(|| sha256_hex(body)),
        skip: false,
    }
}

async fn apply_body(
    state: &ApiState,
    query: ApplyQuery,
    body: &[u8],
) -> Result<(StatusCode, Json<Answer>), ApiError> {
    let body = drover_rules::strict_json::parse(body).map_err(|e| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("the request body is not acceptable JSON: {e}"),
        )
    })?;
    match query.dry_run.as_deref() {
        None => {}
        Some("server") => {
            let items = match body {
                Value::Array(items) => items,
                Value::Object(ref map)
                    if map.get("kind").and_then(Value::as_str) == Some("List") =>
                {
                    map.get("items")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default()
                }
                single => vec![single],
            };
            if items.len() > MAX_LIST_ITEMS {
                return Err(ApiError(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("at most {MAX_LIST_ITEMS} manifests per request"),
                ));
            }
            let preview = super::preview::preview(state, items).await?;
            return Ok((StatusCode::OK, Json(Answer::Preview(preview))));
        }
        Some(other) => {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                format!("dryRun={other}: the only dry run is dryRun=server"),
            ));
        }
    }
    let items = match body {
        Value::Array(items) => items,
        Value::Object(ref map) if map.get("kind").and_then(Value::as_str) == Some("List") => {
            match map.get("items") {
                Some(Value::Array(items)) => items.clone(),
                _ => {
                    return Err(ApiError(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "a List needs an array `items`".into(),
                    ));
                }
            }
        }
        single => {
            let (code, one) = apply_one(state, single).await?;
            return Ok((code, Json(Answer::Applied(Applied::One(one)))));
        }
    };
    if items.len() > MAX_LIST_ITEMS {
        return Err(ApiError(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("at most {MAX_LIST_ITEMS} manifests per request"),
        ));
    }
    // Every manifest is checked before any is applied.
    let manifests = super::preview::parse_all(&items)?;
    // Devices go in together: one commit for the lot.
    let devices: Vec<&Manifest> = manifests
        .iter()
        .filter(|m| matches!(m, Manifest::Device { .. }))
        .collect();
    let mut device_results = apply_devices(state, &devices).await?.into_iter();
    let mut results = Vec::with_capacity(items.len());
    for (index, (item, manifest)) in items.into_iter().zip(&manifests).enumerate() {
        if matches!(manifest, Manifest::Device { .. }) {
            if let Some(result) = device_results.next() {
                results.push(result);
            }
            continue;
        }
        let name = item["metadata"]["name"].as_str().unwrap_or("?").to_owned();
        let kind = item["kind"].as_str().unwrap_or("?").to_owned();
        match apply_one(state, item).await {
            Ok((_, result)) => results.push(result),
            // Stop at the first failure and say what is applied: the items
            // before it, and every device (they went in first, together).
            Err(ApiError(code, error)) => {
                results.extend(device_results);
                let applied: Vec<String> = results
                    .iter()
                    .map(|r| format!("{}/{} {}", r.kind, r.name, r.result))
                    .collect();
                let applied = if applied.is_empty() {
                    "nothing was applied".to_owned()
                } else {
                    format!("applied: {}", applied.join(", "))
                };
                return Err(ApiError(
                    code,
                    format!(
                        "item {index} ({kind}/{name}): {error}; it and the items after it were not applied; {applied}"
                    ),
                ));
            }
        }
    }
    Ok((
        StatusCode::OK,
        Json(Answer::Applied(Applied::List(AppliedList {
            kind: ListKind::List,
            items: results,
        }))),
    ))
}

/// Creates or configures many devices in one commit (retried for those whose
/// record changed meanwhile, as an agent's hello may do).
/// Whether a Device manifest asks for what the device already has.
pub(super) fn device_unchanged(
    device: &DeviceRecord,
    labels: &std::collections::BTreeMap<String, String>,
    spec: &crate::manifest::DeviceSpec,
) -> bool {
    device.groups.iter().eq(spec
        .groups
        .iter()
        .collect::<std::collections::BTreeSet<_>>())
        && device.labels == *labels
        && device.time_zone == spec.time_zone
        && device.decommissioned == spec.decommissioned
}

pub(super) async fn apply_devices(
    state: &ApiState,
    manifests: &[&Manifest],
) -> Result<Vec<Changed>, ApiError> {
    let mut results: Vec<Option<Changed>> = vec![None; manifests.len()];
    let mut todo: Vec<usize> = (0..manifests.len()).collect();
    for _ in 0..10 {
        if todo.is_empty() {
            break;
        }
        let mut ops = Vec::with_capacity(todo.len());
        let mut created = Vec::with_capacity(todo.len());
        // The manifests whose write is in this commit, in order.
        let mut sent = Vec::with_capacity(todo.len());
        for &index in &todo {
            let Manifest::Device { id, labels, spec } = manifests[index] else {
                continue;
            };
            let current = state.db.get::<DeviceRecord>(&device_key(id)).await?;
            let (expected, mut device) =
                current.unwrap_or_else(|| (0, DeviceRecord::new(id.clone())));
            if expected != 0 && device_unchanged(&device, labels, spec) {
                // Nothing to write: said so, as for every other kind.
                results[index] = Some(Changed::new(Kind::Device, id.as_str(), Outcome::Unchanged));
                continue;
            }
            created.push(expected == 0);
            sent.push(index);
            device.groups = spec.groups.iter().cloned().collect();
            device.labels = labels.clone();
            device.time_zone = spec.time_zone.clone();
            device.decommissioned = spec.decommissioned;
            ops.push(drover_contract::kv::Op::Put {
                key: device_key(id),
                value: Db::encode(&device)?,
                expected,
            });
        }
        if ops.is_empty() {
            // Every one left was unchanged.
            todo.clear();
            break;
        }
        let outcomes = state.db.commit(ops).await?;
        let mut again = Vec::new();
        for ((index, created), outcome) in sent.iter().zip(created).zip(outcomes) {
            let Manifest::Device { id, .. } = manifests[*index] else {
                continue;
            };
            match outcome {
                Ok(_) => {
                    let result = if created {
                        Outcome::Created
                    } else {
                        Outcome::Configured
                    };
                    results[*index] = Some(Changed::new(Kind::Device, id.as_str(), result));
                }
                Err(e) if e.is_conflict() => again.push(*index),
                Err(e) => return Err(DbError::from(e).into()),
            }
        }
        todo = again;
    }
    if !todo.is_empty() {
        return Err(ApiError(
            StatusCode::CONFLICT,
            "some devices kept changing; apply again".into(),
        ));
    }
    state.engine_wake.notify_one();
    Ok(results.into_iter().flatten().collect())
}

pub(super) async fn apply_one(
    state: &ApiState,
    body: Value,
) -> Result<(StatusCode, Changed), ApiError> {
    let manifest =
        manifest::parse(body).map_err(|e| ApiError(StatusCode::UNPROCESSABLE_ENTITY, e))?;
    match manifest {
        Manifest::TaskRun { name, spec } => {
            let run = TaskRunRecord {
                name: name.clone(),
                uid: JobId::random(),
                created_at: Timestamp::now(),
                spec,
                status: RunStatus::planning(),
                owner: None,
            };
            let created = create_immutable(state, Kind::TaskRun, &run_key(&name), run, |r| {
                (r.uid, &r.spec)
            })
            .await?;
            state.engine_wake.notify_one();
            Ok(created)
        }
        Manifest::TaskSchedule { name, spec } => {
            let key = drover_rules::records::schedule_key(&name);
            let mut result = Outcome::Configured;
            state
                .db
                .update::<drover_rules::schedule::TaskScheduleRecord, _>(&key, |current| {
                    Some(match current {
                        // The schedule may change (suspend, cadence, template);
                        // the runs it made never do.
                        Some(mut existing) => {
                            if existing.spec == spec {
                                result = Outcome::Unchanged;
                                return None;
                            }
                            existing.spec = spec.clone();
                            existing
                        }
                        None => {
                            result = Outcome::Created;
                            drover_rules::schedule::TaskScheduleRecord {
                                name: name.clone(),
                                created_at: Timestamp::now(),
                                spec: spec.clone(),
                                status: Default::default(),
                            }
                        }
                    })
                })
                .await?;
            state.engine_wake.notify_one();
            let code = if result == Outcome::Created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok((code, Changed::new(Kind::TaskSchedule, name, result)))
        }
        Manifest::Deployment { name, mut spec } => {
            if let Some(kind) = crate::kinds::kind(spec.job.name()) {
                let apply = crate::kinds::Apply {
                    db: &state.db,
                    downloads: state.downloads,
                    secrets_before: &[],
                };
                kind.resolve(apply, &mut spec.job).await?;
            }
            // A typo in a device list is refused, not left out unseen.
            if let Some(unknown) = super::preview::unknown_devices(&state.db, &spec.targets).await?
            {
                return Err(ApiError(StatusCode::BAD_REQUEST, unknown));
            }
            let deployment = DeploymentRecord {
                name: name.clone(),
                uid: JobId::random(),
                created_at: Timestamp::now(),
                spec,
                add_requests: 0,
                status: drover_rules::deployment::DeploymentStatus::planning(),
            };
            // The store's change feed brings it to the engine.
            let key = drover_rules::records::deployment_key(&name);
            create_immutable(state, Kind::Deployment, &key, deployment, |d| {
                (d.uid, &d.spec)
            })
            .await
        }
        Manifest::Secret { name, data } => {
            let record = state
                .vault
                .seal(&name, &data)
                .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e))?;
            let key = drover_rules::records::secret_key(&name);
            let mut created = false;
            state
                .db
                .update::<drover_rules::records::SecretRecord, _>(&key, |current| {
                    created = current.is_none();
                    Some(record.clone())
                })
                .await?;
            let result = if created {
                Outcome::Created
            } else {
                Outcome::Configured
            };
            Ok((
                StatusCode::OK,
                Changed {
                    keys: Some(record.keys.clone()),
                    ..Changed::new(Kind::Secret, name, result)
                },
            ))
        }
        Manifest::Device { id, labels, spec } => {
            let mut created = false;
            state
                .db
                .update::<DeviceRecord, _>(&device_key(&id), |current| {
                    created = current.is_none();
                    let mut device = current.unwrap_or_else(|| DeviceRecord::new(id.clone()));
                    device.groups = spec.groups.iter().cloned().collect();
                    device.labels = labels.clone();
                    device.time_zone = spec.time_zone.clone();
                    device.decommissioned = spec.decommissioned;
                    Some(device)
                })
                .await?;
            // Group changes matter to runs waiting to release (revocation).
            state.engine_wake.notify_one();
            let result = if created {
                Outcome::Created
            } else {
                Outcome::Configured
            };
            Ok((
                StatusCode::OK,
                Changed::new(Kind::Device, id.as_str(), result),
            ))
        }
    }
}

/// Creates a resource whose spec never changes (a TaskRun, a Deployment):
/// the same spec again is `unchanged`, another spec under the name is a 409.
/// `identity` gives a record's uid and spec.
pub(super) async fn create_immutable<T, S>(
    state: &ApiState,
    kind: Kind,
    key: &str,
    new: T,
    identity: impl Fn(&T) -> (JobId, &S),
) -> Result<(StatusCode, Changed), ApiError>
where
    T: drover_store::stored::Record,
    S: PartialEq,
{
    let name = key.split_once('/').map_or(key, |(_, n)| n);
    if let Some((_, existing)) = state.db.get::<T>(key).await? {
        let (uid, spec) = identity(&existing);
        if spec == identity(&new).1 {
            return Ok((
                StatusCode::OK,
                Changed {
                    uid: Some(uid.to_string()),
                    ..Changed::new(kind, name, Outcome::Unchanged)
                },
            ));
        }
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("the spec of {kind} {name} is immutable; apply one with a new name instead"),
        ));
    }
    match state.db.put(key, &new, 0).await {
        Ok(_) => {}
        Err(DbError::Kv(e)) if e.is_conflict() => {
            return Err(ApiError(
                StatusCode::CONFLICT,
                format!("{kind} {name} was created concurrently"),
            ));
        }
        Err(e) => return Err(e.into()),
    }
    Ok((
        StatusCode::CREATED,
        Changed {
            uid: Some(identity(&new).0.to_string()),
            ..Changed::new(kind, name, Outcome::Created)
        },
    ))
}
