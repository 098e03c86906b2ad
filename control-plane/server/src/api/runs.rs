//! TaskRuns: listing, one run, its targets page, canceling and deleting.

use super::*;
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
    let items = runs.iter().map(manifest::render_run).collect();
    Ok(listed("/taskruns", &query, items, next))
}

pub(super) async fn get_run(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    match state.db.get::<TaskRunRecord>(&run_key(&name)).await? {
        Some((_, run)) => Ok(Json(manifest::render_run(&run))),
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
) -> Result<Json<Value>, ApiError> {
    let Some((_, run)) = state.db.get::<TaskRunRecord>(&run_key(&name)).await? else {
        return Err(not_found(format!("TaskRun {name}")));
    };
    let plan = state.engine.load_plan(&run).await?;
    let limit = page.limit.unwrap_or(100).min(MAX_PAGE);
    let mut items = Vec::new();
    for target in plan.iter().skip(page.offset).take(limit) {
        let job = state
            .db
            .get::<JobDelivery>(&job_key(&target.device, run.uid))
            .await?
            .map(|(_, j)| j);
        let view = JobView::of_target(job.as_ref(), run.status.completion_time);
        let mut item = json!({
            "device": target.device,
            "canary": target.canary,
            "released": job.is_some(),
            "delivery": job.as_ref().map(|j| &j.delivery),
            "createdAt": job.as_ref().map(|j| j.created_at.to_string()),
            "cancelRequestedAt": job.as_ref().and_then(|j| j.cancel_requested_at.map(|t| t.to_string())),
            "status": job.as_ref().and_then(|j| j.status.as_ref()),
            "resultText": result_text(job.as_ref()),
        });
        if let (Some(item), Value::Object(fields)) = (item.as_object_mut(), view.fields()) {
            item.extend(fields);
        }
        items.push(item);
    }
    Ok(Json(
        json!({"total": plan.len(), "offset": page.offset, "items": items}),
    ))
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
