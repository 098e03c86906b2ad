//! The run engine: passes over every unfinished TaskRun that plan it, release
//! intents as the pure [`rollout::decide`] says, and keep the run's aggregate
//! status. Every write is a compare-and-set, so a pass that loses a race
//! simply leaves the work to the next pass.

use crate::hub::Hub;
use crate::placement;
use crate::records::{
    Db, DbError, Delivery, DeviceRecord, JobDelivery, PLAN_CHUNK, Phase, PlanHeader, PlanTarget,
    TaskRunRecord, device_key, job_key, plan_header_key, plan_key, run_key,
};
use crate::rollout::{self, Finish, Outcome, TargetView};
use agent_core::model::{Intent, JobKind, JobState};
use agent_core::{MAX_ERROR_BYTES, bounded};
use jiff::Timestamp;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The updater's package job budget, copied into each intent.
const JOB_TIMEOUT_SECONDS: u32 = 1500;

/// How long the engine's first pass waits for the status backlog.
const INTAKE_WAIT: Duration = Duration::from_secs(60);

/// A plan claim older than this is taken over by another planner.
const PLAN_CLAIM_TTL: jiff::SignedDuration = jiff::SignedDuration::from_secs(60);

pub struct Engine {
    /// This process's planner id, for plan claims.
    id: String,
    db: Db,
    hub: Arc<Hub>,
    wake: Arc<Notify>,
}

impl Engine {
    pub fn new(db: Db, hub: Arc<Hub>, wake: Arc<Notify>) -> Self {
        Self {
            id: agent_core::JobId::random().to_string(),
            db,
            hub,
            wake,
        }
    }

    /// Passes every `interval`, and whenever something is applied or reported.
    /// The first pass waits (at most [`INTAKE_WAIT`]) until `intake_ready`
    /// says the statuses reported while the control plane was down are read,
    /// so no run fails its deadline for a result that is already in.
    pub async fn run(
        self: Arc<Self>,
        interval: Duration,
        mut intake_ready: tokio::sync::watch::Receiver<bool>,
        shutdown: CancellationToken,
    ) {
        tokio::select! {
            ready = tokio::time::timeout(INTAKE_WAIT, intake_ready.wait_for(|ready| *ready)) => {
                if ready.is_err() {
                    warn!("the statuses reported while the control plane was down are not all read yet; passing anyway");
                }
            }
            _ = shutdown.cancelled() => return,
        }
        loop {
            if let Err(e) = self.pass_all(Timestamp::now()) {
                warn!(error = %e, "run pass failed; retrying on the next pass");
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = self.wake.notified() => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }

    pub fn pass_all(&self, now: Timestamp) -> Result<(), DbError> {
        for (_, _, run) in self.db.list::<TaskRunRecord>("runs/")? {
            if run.status.phase.is_terminal() {
                continue;
            }
            if let Err(e) = self.reconcile(&run.name, now) {
                warn!(run = %run.name, error = %e, "cannot advance run");
            }
        }
        Ok(())
    }

    pub fn reconcile(&self, name: &str, now: Timestamp) -> Result<(), DbError> {
        let Some((revision, run)) = self.db.get::<TaskRunRecord>(&run_key(name))? else {
            return Ok(());
        };
        match run.status.phase {
            // A terminal run never advances.
            Phase::Complete | Phase::Failed => Ok(()),
            Phase::Planning => self.plan(revision, run, now),
            Phase::Running => self.advance(revision, run, now),
        }
    }

    /// Freezes the target plan in bounded chunks outside the run, then moves
    /// the run to Running. A store error leaves it in Planning for the next
    /// pass instead of becoming NoTargets. See [`PlanHeader`] for how
    /// concurrent planners agree on one plan.
    fn plan(&self, revision: u64, mut run: TaskRunRecord, now: Timestamp) -> Result<(), DbError> {
        let header_key = plan_header_key(run.uid);
        let existing = self.db.get::<PlanHeader>(&header_key)?;
        let (header_revision, header) = match existing {
            Some((_, header)) if header.complete => {
                return self.start_running(revision, run, &header, now);
            }
            Some((_, header))
                if header.planner != self.id
                    && now.duration_since(header.claimed_at) < PLAN_CLAIM_TTL =>
            {
                // Another replica is writing this plan; its result is used on a later pass.
                return Ok(());
            }
            Some((header_revision, header)) => (header_revision, Some(header)),
            None => (0, None),
        };
        let devices: Vec<DeviceRecord> = self
            .db
            .list::<DeviceRecord>("devices/")?
            .into_iter()
            .map(|(_, _, d)| d)
            .collect();
        let targets = placement::plan(&run.spec, &devices);
        if targets.is_empty() && header.is_none() {
            run.status.start_time = Some(now);
            run.status.phase = Phase::Failed;
            run.status.reason = Some("NoTargets".into());
            run.status.completion_time = Some(now);
            run.status.latest_error =
                Some("no authorized device with an agent matches the selector".into());
            return self.put_run(revision, &run);
        }
        let chunks: Vec<&[PlanTarget]> = targets.chunks(PLAN_CHUNK).collect();
        let mut claim = PlanHeader {
            planner: self.id.clone(),
            claimed_at: now,
            targets: targets.len() as u32,
            canaries: targets.iter().filter(|t| t.canary).count() as u32,
            chunks: chunks.len() as u32,
            complete: false,
        };
        let claim_revision = match self.db.put(&header_key, &claim, header_revision) {
            Ok(revision) => revision,
            Err(DbError::Kv(e)) if e.is_conflict() => return Ok(()),
            Err(e) => return Err(e),
        };
        for (index, chunk) in chunks.iter().enumerate() {
            let key = plan_key(run.uid, index as u32);
            let existing = self
                .db
                .get::<Vec<PlanTarget>>(&key)?
                .map(|(r, _)| r)
                .unwrap_or(0);
            self.db.put(&key, &chunk.to_vec(), existing)?;
        }
        claim.complete = true;
        match self.db.put(&header_key, &claim, claim_revision) {
            Ok(_) => self.start_running(revision, run, &claim, now),
            // Our claim was taken over while we wrote; the new claimant's plan wins.
            Err(DbError::Kv(e)) if e.is_conflict() => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn start_running(
        &self,
        revision: u64,
        mut run: TaskRunRecord,
        plan: &PlanHeader,
        now: Timestamp,
    ) -> Result<(), DbError> {
        run.status.start_time = Some(now);
        run.status.phase = Phase::Running;
        run.status.targets = plan.targets;
        run.status.canaries = plan.canaries;
        run.status.plan_chunks = plan.chunks;
        self.put_run(revision, &run)
    }

    fn put_run(&self, revision: u64, run: &TaskRunRecord) -> Result<(), DbError> {
        match self.db.put(&run_key(&run.name), run, revision) {
            Ok(_) => {
                info!(run = %run.name, phase = ?run.status.phase, targets = run.status.targets, "run planned");
                self.wake.notify_one();
                Ok(())
            }
            // Another pass or replica moved the run first.
            Err(DbError::Kv(e)) if e.is_conflict() => Ok(()),
            Err(e) => Err(e),
        }
    }

    pub fn load_plan(&self, run: &TaskRunRecord) -> Result<Vec<PlanTarget>, DbError> {
        let mut plan = Vec::with_capacity(run.status.targets as usize);
        for index in 0..run.status.plan_chunks {
            if let Some((_, chunk)) = self.db.get::<Vec<PlanTarget>>(&plan_key(run.uid, index))? {
                plan.extend(chunk);
            }
        }
        Ok(plan)
    }

    fn advance(
        &self,
        revision: u64,
        mut run: TaskRunRecord,
        now: Timestamp,
    ) -> Result<(), DbError> {
        let plan = self.load_plan(&run)?;
        let deadline = run.deadline();
        let mut views = Vec::with_capacity(plan.len());
        let mut latest_error = run.status.latest_error.clone();
        for target in &plan {
            let job = self
                .db
                .get::<JobDelivery>(&job_key(&target.device, run.uid))?;
            let outcome = outcome_of(job.map(|(_, j)| j), deadline);
            if let Outcome::Failed(error) = &outcome {
                latest_error = Some(bounded(
                    format!("{}: {error}", target.device),
                    MAX_ERROR_BYTES,
                ));
            }
            views.push(TargetView {
                device: target.device.clone(),
                canary: target.canary,
                outcome,
            });
        }
        // Group authorization is read now, just before release.
        let revoked = |device: &agent_core::DeviceId| match self
            .db
            .get::<DeviceRecord>(&device_key(device))
        {
            Ok(Some((_, record))) => !placement::authorized(&run.spec, &record),
            Ok(None) => true,
            // An unreadable registry is not a revocation; the caller retries the pass.
            Err(_) => false,
        };
        let decision = rollout::decide(&views, now, deadline, &revoked);
        for device in &decision.release {
            let intent = Intent {
                job_id: run.uid,
                device_id: device.clone(),
                kind: JobKind::system_upgrade(),
                attempt: 1,
                created_at: now,
                expires_at: deadline,
                timeout_seconds: JOB_TIMEOUT_SECONDS,
            };
            let job = JobDelivery {
                intent,
                run: Some(run.name.clone()),
                delivery: Delivery::Created,
                status: None,
                created_at: now,
                terminal_received_at: None,
            };
            match self.db.put(&job_key(device, run.uid), &job, 0) {
                Ok(_) => info!(run = %run.name, device = %device, "intent released"),
                // Already released by an earlier pass: creation is idempotent.
                Err(DbError::Kv(e)) if e.is_conflict() => {}
                Err(e) => return Err(e),
            }
            self.hub.notify(device);
        }
        let mut status = run.status.clone();
        status.released = decision.counts.released + decision.release.len() as u32;
        status.succeeded = decision.counts.succeeded;
        status.failed = decision.counts.failed;
        status.latest_error = latest_error;
        match decision.finish {
            None => {}
            Some(Finish::Complete) => {
                status.phase = Phase::Complete;
                status.reason = Some("AllTargetsSucceeded".into());
                status.completion_time = Some(now);
            }
            Some(Finish::Failed { reason, message }) => {
                status.phase = Phase::Failed;
                status.reason = Some(reason.into());
                status.completion_time = Some(now);
                status.latest_error = Some(bounded(message, MAX_ERROR_BYTES));
            }
        }
        if status == run.status {
            return Ok(());
        }
        let finished = status.phase.is_terminal();
        run.status = status;
        match self.db.put(&run_key(&run.name), &run, revision) {
            Ok(_) => {
                if finished {
                    info!(run = %run.name, phase = ?run.status.phase, reason = ?run.status.reason, "run finished");
                }
                Ok(())
            }
            Err(DbError::Kv(e)) if e.is_conflict() => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// What a target's job means for the run. Success counts only when the
/// control plane received it (the result with its completion heartbeat, A6)
/// by the deadline, on the control plane's own clock (A12); the device's
/// clock never decides. A late success is a failure.
pub fn outcome_of(job: Option<JobDelivery>, deadline: Timestamp) -> Outcome {
    let Some(job) = job else {
        return Outcome::Unreleased;
    };
    let Some(status) = job.status else {
        return Outcome::Pending;
    };
    match status.state {
        JobState::Succeeded if status.completion_heartbeat_at.is_none() => Outcome::Pending,
        // Records stored before the control plane kept its receive time
        // (layout V1) are judged by the device's completion time, as then.
        JobState::Succeeded => match job.terminal_received_at.or(status.completion_heartbeat_at) {
            Some(at) if at <= deadline => Outcome::Succeeded,
            Some(at) => Outcome::Failed(format!(
                "the result reached the control plane at {at}, after the deadline {deadline}"
            )),
            None => Outcome::Pending,
        },
        JobState::Failed | JobState::Expired | JobState::Rejected | JobState::Canceled => {
            Outcome::Failed(
                status
                    .error
                    .unwrap_or_else(|| format!("{:?}", status.state)),
            )
        }
        JobState::Accepted | JobState::Waiting | JobState::Running | JobState::AwaitingReboot => {
            Outcome::Pending
        }
    }
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
