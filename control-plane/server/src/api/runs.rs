//! TaskRuns: listing, one run, its targets page, canceling and deleting.

use super::convert;
use super::*;
use drover_api::runs as api;
use drover_rules::state::JobView;

/// Deletes a finished task run: its record, its frozen plan and its jobs'
/// records. A run still going is refused: cancel it first.
pub(super) async fn delete_run(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<Changed>, ApiError> {
    let Some((_, run)) = state.db.get::<TaskRunRecord>(&run_key(&name)).await? else {
        return Err(not_found(format!("TaskRun {name}")));
    };
    if run.status.phase == Phase::Canceling {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!(
                "TaskRun {name} is still canceling (jobs that had started run to their end); delete it once it has ended"
            ),
        ));
    }
    if !run.status.phase.is_terminal() {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!(
                "TaskRun {name} is {:?}; cancel it first (drover cancel taskrun {name}) and delete it once it has ended",
                run.status.phase
            ),
        ));
    }
    let jobs = state.engine.delete_finished_run(&run).await?;
    tracing::info!(run = %name, jobs, "run deleted");
    let mut answer = Changed::new(Kind::TaskRun, name, Outcome::Deleted);
    answer.jobs = Some(jobs as u64);
    Ok(Json(answer))
}

pub(super) async fn list_runs(
    State(state): State<ApiState>,
    Query(query): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let (runs, next) = list_page::<TaskRunRecord>(&state.db, "runs/", &query).await?;
    let items: Vec<api::TaskRun> = runs.iter().map(convert::task_run).collect();
    Ok(listed("/taskruns", &query, items, next))
}

pub(super) async fn get_run(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<api::TaskRun>, ApiError> {
    match state.db.get::<TaskRunRecord>(&run_key(&name)).await? {
        Some((_, run)) => Ok(Json(convert::task_run(&run))),
        None => Err(not_found(format!("TaskRun {name}"))),
    }
}

#[derive(Deserialize)]
pub(super) struct Page {
    #[serde(default)]
    offset: usize,
    limit: Option<usize>,
}

/// One page of a run's frozen plan with each target's delivery and status.
pub(super) async fn run_targets(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    Query(page): Query<Page>,
) -> Result<Json<api::RunTargets>, ApiError> {
    let Some((_, run)) = state.db.get::<TaskRunRecord>(&run_key(&name)).await? else {
        return Err(not_found(format!("TaskRun {name}")));
    };
    let plan = state.engine.load_plan(&run).await?;
    let limit = page.limit.unwrap_or(100).min(MAX_PAGE);
    let fleet = state.patch_index.current().await?;
    let now = Timestamp::now();
    let ended = run.status.phase.is_terminal();
    let mut items = Vec::new();
    for target in plan.iter().skip(page.offset).take(limit) {
        let job = state
            .db
            .get::<JobDelivery>(&job_key(&target.device, run.uid))
            .await?
            .map(|(_, j)| j);
        let view = JobView::of_target(job.as_ref(), run.status.completion_time);
        let last_seen = fleet.devices.get(&target.device).and_then(|d| d.last_seen);
        let online = state.presence.online(&target.device, last_seen, now);
        let waiting = match ended {
            true => None,
            false => view.phase.wait(online, last_seen),
        };
        items.push(api::RunTarget {
            device: target.device.to_string(),
            canary: target.canary,
            released: job.is_some(),
            delivery: job.as_ref().map(|j| convert::delivery(&j.delivery)),
            created_at: job.as_ref().map(|j| j.created_at),
            cancel_requested_at: job.as_ref().and_then(|j| j.cancel_requested_at),
            status: job
                .as_ref()
                .and_then(|j| j.status.as_ref())
                .map(convert::job_status),
            result_text: result_text(job.as_ref()),
            state: view.phase.name().to_owned(),
            state_label: view.label(),
            after_run_ended: view.after_run_ended,
            waiting: waiting.as_ref().map(convert::wait),
        });
    }
    Ok(Json(api::RunTargets {
        total: plan.len() as u64,
        offset: page.offset as u64,
        items,
    }))
}

pub(super) async fn cancel_run(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<Changed>), ApiError> {
    let (answer, run) =
        cancel::<TaskRunRecord>(&state, Kind::TaskRun, &run_key(&name), &name, |r| {
            &mut r.status.phase
        })
        .await?;
    // Every job out is asked before the answer, so a device that comes back
    // right after it gets the order, not the intent; the engine's passes ask
    // any job a pass released meanwhile.
    let keys: Vec<String> = state
        .engine
        .load_plan(&run)
        .await?
        .iter()
        .map(|target| job_key(&target.device, run.uid))
        .collect();
    state.db.request_cancels(&keys, Timestamp::now()).await?;
    Ok(answer)
}
