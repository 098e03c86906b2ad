//! The engine's run side: freezes a TaskRun's target plan, releases its
//! intents as the pure [`rollout::decide`] says, judges each target by the
//! deadline on the control plane's clock, and keeps the run's status.

use super::{Engine, JOB_TIMEOUT_SECONDS, PLAN_CLAIM_TTL, RunView};
use drover_contract::kv::Op;
use drover_model::model::{Intent, JobKind, JobState};
use drover_model::{JobId, MAX_ERROR_BYTES, bounded};
use drover_rules::deployment::Lease;
use drover_rules::placement;
use drover_rules::records::{
    Delivery, DeviceRecord, JobDelivery, PLAN_CHUNK, Phase, PlanHeader, PlanTarget, TaskRunRecord,
    device_key, job_key, plan_header_key, plan_key, run_key, run_lease_key,
};
use drover_rules::rollout::{self, Finish, Outcome, TargetView};
use drover_store::db::{Db, DbError};
use jiff::{SignedDuration, Timestamp};
use std::collections::HashSet;
use tracing::{debug, info};

/// How long a replica passes over a run alone before another takes over
/// (a killed replica's runs wait at most this long).
pub(super) const RUN_LEASE: SignedDuration = SignedDuration::from_secs(10);
/// The holder renews its lease (one small write) once less than this is left.
const RUN_LEASE_RENEW_BEFORE: SignedDuration = SignedDuration::from_secs(5);

impl Engine {
    /// Freezes the target plan in bounded chunks outside the run, then moves
    /// the run to Running. A store error leaves it in Planning for the next
    /// pass instead of becoming NoTargets. See [`PlanHeader`] for how
    /// concurrent planners agree on one plan.
    pub(super) async fn plan(
        &self,
        revision: u64,
        mut run: TaskRunRecord,
        now: Timestamp,
    ) -> Result<(), DbError> {
        let header_key = plan_header_key(run.uid);
        let existing = self.db.get::<PlanHeader>(&header_key).await?;
        let (header_revision, header) = match existing {
            Some((_, header)) if header.complete => {
                return self.start_running(revision, run, &header, now).await;
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
        let devices = crate::patch_labels::placed_devices(&self.db).await?;
        let targets = placement::plan(&run.spec, &devices);
        if targets.is_empty() && header.is_none() {
            run.status.start_time = Some(now);
            run.status.phase = Phase::Failed;
            run.status.reason = Some("NoTargets".into());
            run.status.completion_time = Some(now);
            run.status.latest_error = Some(drover_rules::unmatched::with_unmatched(
                "no authorized device with an agent matches the selector",
                &drover_rules::unmatched::of_run(&run.spec, &devices),
            ));
            return self.put_run(revision, &run).await;
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
        let claim_revision = match self.db.put(&header_key, &claim, header_revision).await {
            Ok(revision) => revision,
            Err(DbError::Kv(e)) if e.is_conflict() => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut ops = Vec::with_capacity(chunks.len());
        for (index, chunk) in chunks.iter().enumerate() {
            let key = plan_key(run.uid, index as u32);
            let existing = self
                .db
                .get::<Vec<PlanTarget>>(&key)
                .await?
                .map(|(r, _)| r)
                .unwrap_or(0);
            ops.push(Op::Put {
                key,
                value: Db::encode(&chunk.to_vec())?,
                expected: existing,
            });
        }
        for result in self.db.commit(ops).await? {
            result?;
        }
        claim.complete = true;
        match self.db.put(&header_key, &claim, claim_revision).await {
            Ok(_) => self.start_running(revision, run, &claim, now).await,
            // Our claim was taken over while we wrote; the new claimant's plan wins.
            Err(DbError::Kv(e)) if e.is_conflict() => Ok(()),
            Err(e) => Err(e),
        }
    }

    pub(super) async fn start_running(
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
        self.put_run(revision, &run).await
    }

    pub(super) async fn put_run(&self, revision: u64, run: &TaskRunRecord) -> Result<(), DbError> {
        match self.db.put(&run_key(&run.name), run, revision).await {
            Ok(_) => {
                info!(run = %run.name, phase = ?run.status.phase, targets = run.status.targets, "run planned");
                Ok(())
            }
            // Another pass or replica moved the run first.
            Err(DbError::Kv(e)) if e.is_conflict() => Ok(()),
            Err(e) => Err(e),
        }
    }

    pub async fn load_plan(&self, run: &TaskRunRecord) -> Result<Vec<PlanTarget>, DbError> {
        let mut plan = Vec::with_capacity(run.status.targets as usize);
        for index in 0..run.status.plan_chunks {
            if let Some((_, chunk)) = self
                .db
                .get::<Vec<PlanTarget>>(&plan_key(run.uid, index))
                .await?
            {
                plan.extend(chunk);
            }
        }
        Ok(plan)
    }

    /// Deletes a finished run's records: its jobs first (each decided one
    /// kept in its device's history), then its frozen plan, the run last,
    /// so a delete cut short is finished by running it again. The caller
    /// has checked the run is terminal. Returns how many job records went.
    pub async fn delete_finished_run(&self, run: &TaskRunRecord) -> Result<usize, DbError> {
        let plan = self.load_plan(run).await?;
        let job_keys: Vec<String> = plan
            .iter()
            .map(|target| job_key(&target.device, run.uid))
            .collect();
        let jobs = self.retire_jobs(&job_keys).await?;
        let mut plan_keys: Vec<String> = (0..run.status.plan_chunks)
            .map(|index| plan_key(run.uid, index))
            .collect();
        plan_keys.push(drover_rules::records::plan_header_key(run.uid));
        plan_keys.push(run_lease_key(run.uid));
        self.db.delete_all(&plan_keys).await?;
        self.db.delete_all(&[run_key(&run.name)]).await?;
        Ok(jobs)
    }

    /// Builds the view of a running run: its plan and every target's job.
    pub(super) async fn load_view(&self, run: &TaskRunRecord) -> Result<RunView, DbError> {
        let plan = self.load_plan(run).await?;
        let mut outcomes = Vec::with_capacity(plan.len());
        for target in &plan {
            let job = self
                .db
                .get::<JobDelivery>(&job_key(&target.device, run.uid))
                .await?;
            outcomes.push(seen_of(job.map(|(_, j)| j)));
        }
        Ok(RunView::new(
            run.uid,
            run.status.phase,
            run.deadline(),
            plan,
            outcomes,
        ))
    }

    pub(super) async fn advance(
        &self,
        revision: u64,
        run: TaskRunRecord,
        now: Timestamp,
    ) -> Result<(), DbError> {
        let mut views = self.views.lock().await;
        if !views.runs.contains_key(&run.name) {
            let view = self.load_view(&run).await?;
            views.by_uid.insert(run.uid, run.name.clone());
            views.runs.insert(run.name.clone(), view);
        }
        let deadline = run.deadline();
        // The views hold outcomes without the deadline; judge it now.
        let (targets, latest_error) = {
            let Some(view) = views.runs.get_mut(&run.name) else {
                return Ok(());
            };
            view.phase = run.status.phase;
            // Another replica's lease: it passes; this view stays current
            // from the change feed, ready to take over when the lease ends.
            if !self.run_lease(&run, now).await? {
                return Ok(());
            }
            if view.deadline != deadline {
                view.rejudge(deadline);
            }
            // Most passes of a large run only count results: then the
            // tally says what looking at every target would.
            if run.status.phase != Phase::Canceling
                && !view.failure_unnamed
                && let Some(decision) = rollout::decide_quiet(&view.tally, now, deadline)
            {
                drop(views);
                return self.finish_pass(revision, run, decision, None, now).await;
            }
            view.failure_unnamed = false;
            self.stats
                .run_full_passes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            judge(view, deadline)
        };
        if run.status.phase == Phase::Canceling {
            let Some(view) = views.runs.get_mut(&run.name) else {
                return Ok(());
            };
            self.request_cancels(view, now).await?;
            drop(views);
            let decision = rollout::decide_canceling(&targets, now, deadline);
            return self
                .finish_pass(revision, run, decision, latest_error, now)
                .await;
        }
        let candidates = rollout::decide(&targets, now, deadline, &|_| false).release;
        // Group authorization is read now, just before release.
        let mut revoked_devices = HashSet::new();
        for device in &candidates {
            match self.db.get::<DeviceRecord>(&device_key(device)).await {
                Ok(Some((_, record))) if placement::authorized(&run.spec, &record) => {}
                Ok(_) => {
                    revoked_devices.insert(device.clone());
                }
                // An unreadable registry is not a revocation; the next pass retries.
                Err(e) => return Err(e),
            }
        }
        let decision = rollout::decide(&targets, now, deadline, &|d| revoked_devices.contains(d));
        let mut released_keys = Vec::new();
        if !decision.release.is_empty() {
            let mut ops = Vec::with_capacity(decision.release.len());
            let mut keys = Vec::with_capacity(decision.release.len());
            for device in &decision.release {
                let job = JobDelivery {
                    intent: Intent {
                        job_id: run.uid,
                        device_id: device.clone(),
                        kind: JobKind::system_upgrade(),
                        attempt: 1,
                        created_at: now,
                        expires_at: deadline,
                        timeout_seconds: JOB_TIMEOUT_SECONDS,
                    },
                    run: Some(run.name.clone()),
                    delivery: Delivery::Created,
                    status: None,
                    created_at: now,
                    terminal_received_at: None,
                    cancel_requested_at: None,
                };
                let key = job_key(device, run.uid);
                ops.push(Op::Put {
                    key: key.clone(),
                    value: Db::encode(&job)?,
                    // Create-only: a repeated pass never releases twice.
                    expected: 0,
                });
                keys.push(key);
            }
            let results = self.db.commit(ops).await?;
            for (key, result) in keys.into_iter().zip(results) {
                match result {
                    Ok(_) => released_keys.push(key),
                    // Already released by an earlier pass or another replica.
                    Err(e) if e.is_conflict() => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if let Some(view) = views.runs.get_mut(&run.name) {
                for device in &decision.release {
                    if let Some(&i) = view.index.get(device)
                        && view.outcomes[i] == Seen::Unreleased
                    {
                        view.set(i, Seen::Pending { cancel: false });
                    }
                }
            }
            info!(run = %run.name, released = released_keys.len(), "intents released");
            crate::metrics::metrics()
                .jobs_released
                .get_or_create(&vec![("kind", JobKind::system_upgrade().name().into())])
                .inc_by(released_keys.len() as u64);
        }
        drop(views);
        if !released_keys.is_empty()
            && let Some(released) = &self.released
        {
            let _ = released.send(released_keys);
        }
        self.finish_pass(revision, run, decision, latest_error, now)
            .await
    }

    /// Whether this replica passes over the running `run` now: it holds the
    /// run's lease (`run-leases/<uid>`), taking it when free or run out and
    /// renewing it when little is left, each a compare-and-set. One replica
    /// passes, so each result is judged and each release attempted once
    /// across replicas, not once per replica. The lease saves work only:
    /// releases stay create-only and the status a compare-and-set, so two
    /// replicas that both believe they hold it still release each job once.
    async fn run_lease(&self, run: &TaskRunRecord, now: Timestamp) -> Result<bool, DbError> {
        if self.alone {
            return Ok(true);
        }
        let key = run_lease_key(run.uid);
        let (revision, held) = match self.db.get::<Lease>(&key).await? {
            Some((revision, lease)) => (revision, Some(lease)),
            None => (0, None),
        };
        if let Some(lease) = &held {
            let left = lease.until.duration_since(now);
            if lease.holder != self.id && left > SignedDuration::ZERO {
                return Ok(false);
            }
            if lease.holder == self.id && left > RUN_LEASE_RENEW_BEFORE {
                return Ok(true);
            }
        }
        let lease = Lease {
            holder: self.id.clone(),
            until: now + RUN_LEASE,
        };
        match self.db.put(&key, &lease, revision).await {
            Ok(_) => {
                if held.map(|h| h.holder) != Some(self.id.clone()) {
                    debug!(run = %run.name, "this replica passes over the run");
                }
                Ok(true)
            }
            // Another replica took it first; it passes.
            Err(DbError::Kv(e)) if e.is_conflict() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives back the leases of the runs this replica passes over, as it
    /// stops (each a compare-and-set to a lease that has run out): another
    /// replica takes each run on its next pass, where a rolling restart
    /// would otherwise hold every run the stopped replica had for up to
    /// [`RUN_LEASE`]. Best effort: a lease not given back runs out.
    pub(super) async fn give_back_run_leases(&self) {
        if self.alone {
            return;
        }
        let uids: Vec<JobId> = self.views.lock().await.by_uid.keys().copied().collect();
        let now = Timestamp::now();
        for uid in uids {
            let key = run_lease_key(uid);
            let given = match self.db.get::<Lease>(&key).await {
                Ok(Some((revision, lease))) if lease.holder == self.id && lease.until > now => {
                    let ended = Lease {
                        holder: self.id.clone(),
                        until: now,
                    };
                    self.db.put(&key, &ended, revision).await.map(|_| true)
                }
                Ok(_) => Ok(false),
                Err(e) => Err(e),
            };
            match given {
                Ok(true) => debug!(run = %uid, "gave the run's lease back"),
                Ok(false) => {}
                Err(e) => {
                    debug!(run = %uid, error = %e, "cannot give the run's lease back; it runs out")
                }
            }
        }
    }

    /// Asks every released, undecided job of a canceled run to cancel (the
    /// delivery core sends the order when it sees the request). A pass that
    /// released a job after the cancel was stored sees it here on the next
    /// pass, so none is missed.
    pub(super) async fn request_cancels(
        &self,
        view: &mut RunView,
        now: Timestamp,
    ) -> Result<(), DbError> {
        let asking: Vec<usize> = (0..view.plan.len())
            .filter(|&i| view.outcomes[i] == (Seen::Pending { cancel: false }))
            .collect();
        if asking.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = asking
            .iter()
            .map(|&i| job_key(&view.plan[i].device, view.uid))
            .collect();
        let settled = self.db.request_cancels(&keys, now).await?;
        for (&position, key) in asking.iter().zip(&keys) {
            if settled.contains(key) {
                view.set(position, Seen::Pending { cancel: true });
            }
        }
        info!(
            asked = settled.len(),
            "cancel requested for the run's undecided jobs"
        );
        Ok(())
    }

    /// Stores what a pass decided: the counts, and the end if it came.
    pub(super) async fn finish_pass(
        &self,
        revision: u64,
        mut run: TaskRunRecord,
        decision: rollout::Decision,
        latest_error: Option<String>,
        now: Timestamp,
    ) -> Result<(), DbError> {
        let mut status = run.status.clone();
        status.released = decision.counts.released + decision.release.len() as u32;
        status.succeeded = decision.counts.succeeded;
        status.failed = decision.counts.failed;
        status.latest_error = latest_error.or(status.latest_error);
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
        match self.db.put(&run_key(&run.name), &run, revision).await {
            Ok(_) => {
                if finished {
                    info!(run = %run.name, phase = ?run.status.phase, reason = ?run.status.reason, "run finished");
                    self.forget(&run.name).await;
                    // Nothing passes over a finished run. A lease taken
                    // again by a replica that had not yet seen the end goes
                    // when the run is deleted, with its plan.
                    let _ = self.db.delete_all(&[run_lease_key(run.uid)]).await;
                }
                Ok(())
            }
            Err(DbError::Kv(e)) if e.is_conflict() => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// A target's job as the view keeps it, before the deadline is applied.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Seen {
    Unreleased,
    /// Released, undecided; `cancel` once its cancel was requested.
    Pending {
        cancel: bool,
    },
    /// Succeeded; when the control plane received it (or, for a record from
    /// before that was kept, the device's completion time).
    Succeeded {
        at: Timestamp,
    },
    Failed(String),
    /// Never taken in time: the intent expired before the device took it,
    /// or the device reported it expired.
    Expired(String),
}

pub(super) fn seen_of(job: Option<JobDelivery>) -> Seen {
    let Some(job) = job else {
        return Seen::Unreleased;
    };
    if matches!(job.delivery, Delivery::Expired { .. }) && job.status.is_none() {
        return Seen::Expired("the intent expired before the device took it".into());
    }
    let pending = Seen::Pending {
        cancel: job.cancel_requested_at.is_some(),
    };
    let Some(status) = job.status else {
        return pending;
    };
    match status.state {
        JobState::Succeeded => match status.completion_heartbeat_at {
            None => pending,
            // Records stored before the control plane kept its receive time
            // (layout V1) are judged by the device's completion time, as then.
            Some(device_time) => Seen::Succeeded {
                at: job.terminal_received_at.unwrap_or(device_time),
            },
        },
        JobState::Expired => Seen::Expired(
            status
                .error
                .unwrap_or_else(|| "the intent expired before the device started it".into()),
        ),
        JobState::Failed | JobState::Rejected | JobState::Canceled => Seen::Failed(
            status
                .error
                .unwrap_or_else(|| format!("{:?}", status.state)),
        ),
        JobState::Accepted | JobState::Waiting | JobState::Running | JobState::AwaitingReboot => {
            pending
        }
    }
}

pub(super) fn judged(seen: &Seen, deadline: Timestamp) -> Outcome {
    match seen {
        Seen::Unreleased => Outcome::Unreleased,
        Seen::Pending { .. } => Outcome::Pending,
        Seen::Succeeded { at } if *at <= deadline => Outcome::Succeeded,
        Seen::Succeeded { at } => Outcome::Late(format!(
            "the result reached the control plane at {at}, after the deadline {deadline}"
        )),
        Seen::Failed(error) => Outcome::Failed(error.clone()),
        Seen::Expired(error) => Outcome::Late(error.clone()),
    }
}

/// The targets as the rollout rules see them, with the deadline applied to
/// successes (one the control plane received late is a failure), and the
/// latest error.
pub(super) fn judge(view: &RunView, deadline: Timestamp) -> (Vec<TargetView>, Option<String>) {
    let mut targets = Vec::with_capacity(view.plan.len());
    let mut latest_error = None;
    for (target, seen) in view.plan.iter().zip(&view.outcomes) {
        let outcome = judged(seen, deadline);
        if let Outcome::Failed(error) | Outcome::Late(error) = &outcome {
            latest_error = Some(bounded(
                format!("{}: {error}", target.device),
                MAX_ERROR_BYTES,
            ));
        }
        targets.push(TargetView {
            device: target.device.clone(),
            canary: target.canary,
            outcome,
        });
    }
    (targets, latest_error)
}

/// What a target's job means for the run. Success counts only when the
/// control plane received it (the result with its completion heartbeat, A6)
/// by the deadline, on the control plane's own clock (A12); the device's
/// clock never decides. A late success is a failure. (The run pass
/// judges its views the same way, through `judged`.)
#[cfg(test)]
pub(super) fn outcome_of(job: Option<JobDelivery>, deadline: Timestamp) -> Outcome {
    judged(&seen_of(job), deadline)
}
