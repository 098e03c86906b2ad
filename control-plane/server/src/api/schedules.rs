//! TaskSchedules: listing, one schedule, suspending and resuming.

use super::*;

/// Suspends a schedule (no new runs; ticks meanwhile are not owed) or
/// resumes it. Its runs are left as they are.
pub(super) async fn suspend_schedule(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    Json(body): Json<drover_api::schedules::Suspension>,
) -> Result<Response, ApiError> {
    let key = drover_rules::records::schedule_key(&name);
    let updated = state
        .db
        .update::<drover_rules::schedule::TaskScheduleRecord, _>(&key, |current| {
            let mut schedule = current?;
            if schedule.spec.suspend == body.suspend {
                return None;
            }
            schedule.spec.suspend = body.suspend;
            Some(schedule)
        })
        .await?;
    let Some(schedule) = updated else {
        return Err(not_found(format!("TaskSchedule {name}")));
    };
    // The audit log says which way (the route says "suspend" either way).
    Ok(access::noted(
        Json(convert::task_schedule(&schedule, Timestamp::now())).into_response(),
        "TaskSchedule",
        &name,
        if body.suspend { "suspended" } else { "resumed" },
    ))
}

pub(super) async fn list_schedules(
    State(state): State<ApiState>,
    Query(query): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let now = Timestamp::now();
    let (schedules, next) =
        list_page::<drover_rules::schedule::TaskScheduleRecord>(&state.db, "schedules/", &query)
            .await?;
    let items: Vec<_> = schedules
        .iter()
        .map(|s| convert::task_schedule(s, now))
        .collect();
    Ok(listed("/taskschedules", &query, items, next))
}

pub(super) async fn get_schedule(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<drover_api::schedules::TaskSchedule>, ApiError> {
    match state
        .db
        .get::<drover_rules::schedule::TaskScheduleRecord>(&drover_rules::records::schedule_key(
            &name,
        ))
        .await?
    {
        Some((_, schedule)) => Ok(Json(convert::task_schedule(&schedule, Timestamp::now()))),
        None => Err(not_found(format!("TaskSchedule {name}"))),
    }
}
