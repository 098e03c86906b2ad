//! Deleting what `apply` and `packages upload` make, with the rules runs
//! have: what is still going is refused with the command to run first
//! (cancel a deployment; finish what needs a Secret or a package), and a
//! delete cut short is finished by running it again (dependents first,
//! the record last).

use super::*;
use drover_rules::deployment::DeploymentJob;

fn conflict(message: String) -> ApiError {
    ApiError(StatusCode::CONFLICT, message)
}

/// The unfinished deployments whose job uses `uses`.
async fn unfinished_deployments_using(
    state: &ApiState,
    uses: impl Fn(&DeploymentJob) -> bool,
) -> Result<Vec<String>, ApiError> {
    Ok(state
        .db
        .list::<DeploymentRecord>("deployments/")
        .await?
        .into_iter()
        .filter(|(_, _, d)| !d.status.phase.is_terminal() && uses(&d.spec.job))
        .map(|(_, _, d)| d.name)
        .collect())
}

/// A finished deployment: its jobs (every attempt of every target; each
/// decided one kept in its device's history), its targets, then its
/// record.
pub(super) async fn delete_deployment(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<Changed>, ApiError> {
    let key = drover_rules::records::deployment_key(&name);
    let Some((_, deployment)) = state.db.get::<DeploymentRecord>(&key).await? else {
        return Err(not_found(format!("Deployment {name}")));
    };
    if !deployment.status.phase.is_terminal() {
        return Err(conflict(format!(
            "Deployment {name} is {:?}; cancel it first (drover cancel deployment {name}) and \
             delete it once it has ended",
            deployment.status.phase
        )));
    }
    let targets = state
        .db
        .list::<TargetRecord>(&drover_rules::records::targets_prefix(deployment.uid))
        .await?;
    let job_keys: Vec<String> = targets
        .iter()
        .flat_map(|(_, _, target)| {
            (1..=target.attempt).map(|attempt| {
                let job = drover_rules::deployment::attempt_job_id(
                    deployment.uid,
                    &target.device,
                    attempt,
                );
                job_key(&target.device, job)
            })
        })
        .collect();
    let jobs = state.engine.retire_jobs(&job_keys).await?;
    let target_keys: Vec<String> = targets.iter().map(|(key, _, _)| key.clone()).collect();
    state.db.delete_all(&target_keys).await?;
    state.db.delete_all(&[key]).await?;
    tracing::info!(deployment = %name, jobs, targets = target_keys.len(), "deployment deleted");
    let mut answer = Changed::new(Kind::Deployment, name, Outcome::Deleted);
    answer.jobs = Some(jobs as u64);
    Ok(Json(answer))
}

/// A schedule: it makes no more runs; the runs it made stay (each is
/// deleted on its own, as any run).
pub(super) async fn delete_schedule(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<Changed>, ApiError> {
    let key = drover_rules::records::schedule_key(&name);
    if state
        .db
        .get::<drover_rules::schedule::TaskScheduleRecord>(&key)
        .await?
        .is_none()
    {
        return Err(not_found(format!("TaskSchedule {name}")));
    }
    state.db.delete_all(&[key]).await?;
    tracing::info!(schedule = %name, "schedule deleted");
    Ok(Json(Changed::new(
        Kind::TaskSchedule,
        name,
        Outcome::Deleted,
    )))
}

/// A Secret no unfinished deployment still needs (its jobs get the
/// Secret's files at every delivery).
pub(super) async fn delete_secret(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<Changed>, ApiError> {
    let key = drover_rules::records::secret_key(&name);
    if state
        .db
        .get::<drover_rules::records::SecretRecord>(&key)
        .await?
        .is_none()
    {
        return Err(not_found(format!("Secret {name}")));
    }
    let users = unfinished_deployments_using(
        &state,
        |job| matches!(job, DeploymentJob::PackageInstallV1(p) if p.secrets.contains(&name)),
    )
    .await?;
    if let Some(first) = users.first() {
        return Err(conflict(format!(
            "Secret {name} is needed by Deployment {first}, which has not ended; cancel it \
             (drover cancel deployment {first}) or wait for it, then delete the Secret"
        )));
    }
    state.db.delete_all(&[key]).await?;
    tracing::info!(secret = %name, "secret deleted");
    Ok(Json(Changed::new(Kind::Secret, name, Outcome::Deleted)))
}

/// A package no unfinished deployment installs: its record, then its file
/// (unless another record holds the same file).
pub(super) async fn delete_package(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<Changed>, ApiError> {
    let key = drover_rules::records::package_key(&id);
    let Some((_, package)) = state.db.get::<PackageRecord>(&key).await? else {
        return Err(not_found(format!("package {id}")));
    };
    let users = unfinished_deployments_using(
        &state,
        |job| matches!(job, DeploymentJob::PackageInstallV1(p) if p.package == id),
    )
    .await?;
    if let Some(first) = users.first() {
        return Err(conflict(format!(
            "package {id} is installed by Deployment {first}, which has not ended; cancel it \
             (drover cancel deployment {first}) or wait for it, then delete the package"
        )));
    }
    state.db.delete_all(&[key]).await?;
    let shared = state
        .db
        .list::<PackageRecord>("packages/")
        .await?
        .iter()
        .any(|(_, _, other)| other.sha256 == package.sha256);
    let mut freed = 0;
    if !shared {
        let file = crate::packages::blob_dir(&state.data).join(format!("{}.deb", package.sha256));
        if tokio::fs::remove_file(&file).await.is_ok() {
            freed = package.size;
        }
    }
    tracing::info!(package = %id, freed, "package deleted");
    let mut answer = Changed::new(Kind::Package, id, Outcome::Deleted);
    answer.freed_bytes = Some(freed);
    Ok(Json(answer))
}
