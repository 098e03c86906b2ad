//! TaskSchedules' passes: the runs their ticks ask for, and the finished
//! runs past their history limits.

use super::Engine;
use drover_model::JobId;
use drover_rules::records::{Phase, TaskRunRecord, run_key};
use drover_rules::schedule::TaskScheduleRecord;
use drover_store::db::DbError;
use jiff::Timestamp;
use std::collections::HashMap;
use tracing::{info, warn};

impl Engine {
    /// Looks at every TaskSchedule: creates the run a tick asks for
    /// (create-only, so replicas and restarts create it once) and records
    /// what was decided under the schedule's revision.
    pub async fn schedules(&self, now: Timestamp) -> Result<Vec<String>, DbError> {
        let mut created = Vec::new();
        let schedules = self.db.list::<TaskScheduleRecord>("schedules/").await?;
        if schedules.is_empty() {
            return Ok(created);
        }
        // Each schedule's finished runs, for its history limits.
        let mut finished: HashMap<String, Vec<TaskRunRecord>> = HashMap::new();
        for (_, _, run) in self.db.list::<TaskRunRecord>("runs/").await? {
            if let Some(owner) = &run.owner
                && run.status.phase.is_terminal()
            {
                finished.entry(owner.clone()).or_default().push(run);
            }
        }
        for (key, revision, schedule) in schedules {
            self.keep_history(
                &schedule,
                finished.remove(&schedule.name).unwrap_or_default(),
            )
            .await?;
            let ticks = match schedule.spec.schedule.compile() {
                Ok(ticks) => ticks,
                Err(e) => {
                    warn!(schedule = %schedule.name, error = %e, "schedule cannot tick");
                    continue;
                }
            };
            let active = match &schedule.status.active_run {
                Some(name) => self
                    .db
                    .get::<TaskRunRecord>(&run_key(name))
                    .await?
                    .is_some_and(|(_, run)| !run.status.phase.is_terminal()),
                None => false,
            };
            let decision = drover_rules::schedule::decide(&schedule, &ticks, active, now);
            if let Some((name, tick)) = &decision.create {
                let run = TaskRunRecord {
                    name: name.clone(),
                    uid: JobId::random(),
                    created_at: now,
                    spec: schedule.spec.template.clone(),
                    status: drover_rules::records::RunStatus::planning(),
                    owner: Some(schedule.name.clone()),
                };
                match self.db.put(&run_key(name), &run, 0).await {
                    Ok(_) => {
                        info!(schedule = %schedule.name, run = %name, %tick, "scheduled run created");
                        crate::audit::scheduled_run(&self.db, &self.id, &schedule.name, name, now)
                            .await;
                        created.push(name.clone());
                    }
                    // Created already, by another replica or before a restart.
                    Err(DbError::Kv(e)) if e.is_conflict() => {}
                    Err(e) => return Err(e),
                }
            }
            if decision.status != schedule.status {
                let mut updated = schedule.clone();
                updated.status = decision.status;
                match self.db.put(&key, &updated, revision).await {
                    Ok(_) => {}
                    // Another pass or replica recorded it first.
                    Err(DbError::Kv(e)) if e.is_conflict() => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(created)
    }

    /// Deletes a schedule's finished runs past its history limits, as
    /// `drover delete taskrun` would (every replica may do it; a delete is
    /// idempotent).
    async fn keep_history(
        &self,
        schedule: &TaskScheduleRecord,
        finished: Vec<TaskRunRecord>,
    ) -> Result<(), DbError> {
        let seen = finished
            .iter()
            .map(|run| drover_rules::schedule::Finished {
                name: run.name.clone(),
                created_at: run.created_at,
                succeeded: run.status.phase == Phase::Complete,
            })
            .collect();
        let past = drover_rules::schedule::past_history(&schedule.spec, seen);
        for run in finished.iter().filter(|run| past.contains(&run.name)) {
            let jobs = self.delete_finished_run(run).await?;
            info!(schedule = %schedule.name, run = %run.name, jobs, "run past the schedule's history limit deleted");
        }
        Ok(())
    }
}
