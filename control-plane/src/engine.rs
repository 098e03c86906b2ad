//! The run engine: plans TaskRuns, releases intents as the pure
//! [`rollout::decide`] says, and keeps each run's aggregate status. It
//! learns what changed from the store's change feed (a status stored, a run
//! applied, a device regrouped), whichever replica wrote it, and keeps a view
//! of each unfinished run in memory, so a pass costs what changed, not the
//! fleet. It emits what it released to the delivery core and never sees a
//! connection. Every write is a compare-and-set, so a pass that loses a race
//! simply leaves the work to the next pass.

use crate::db::{Db, DbError};
use crate::dispatch::{Presence, Released};
use crate::placement;
use crate::records::{
    Delivery, DeviceRecord, JobDelivery, PLAN_CHUNK, Phase, PlanHeader, PlanTarget, TaskRunRecord,
    device_key, job_key, plan_header_key, plan_key, run_key,
};
use crate::rollout::{self, Finish, Outcome, TargetView};
use crate::schedule::TaskScheduleRecord;
use crate::store::Op;
use agent_core::model::{Intent, JobKind, JobState};
use agent_core::{DeviceId, JobId, MAX_ERROR_BYTES, bounded};
use jiff::Timestamp;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, Notify, broadcast};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The updater's package job budget, copied into each intent.
const JOB_TIMEOUT_SECONDS: u32 = 1500;

/// How long the engine gathers changes before a pass.
const GATHER: Duration = Duration::from_millis(50);

/// How long the engine's first pass waits for the status backlog.
const INTAKE_WAIT: Duration = Duration::from_secs(60);

/// A plan claim older than this is taken over by another planner.
const PLAN_CLAIM_TTL: jiff::SignedDuration = jiff::SignedDuration::from_secs(60);

#[path = "deploy_engine.rs"]
mod deployments;
pub use deployments::observe;

/// Ticks between two passes over every deployment in view (30 s at the
/// default pass interval of 1 s); results, arrivals and due retries pass
/// sooner.
const DEPLOYMENT_TICKS: u64 = 30;

/// An unfinished run as the engine keeps it between passes.
struct RunView {
    uid: JobId,
    plan: Vec<PlanTarget>,
    index: HashMap<DeviceId, usize>,
    outcomes: Vec<Seen>,
}

#[derive(Default)]
struct Views {
    runs: HashMap<String, RunView>,
    by_uid: HashMap<JobId, String>,
}

pub struct Engine {
    /// This process's planner id, for plan claims.
    id: String,
    db: Db,
    wake: Arc<Notify>,
    released: Option<Released>,
    /// An async Mutex: passes await the store while they hold it.
    views: Mutex<Views>,
    deployments: Mutex<deployments::DeploymentViews>,
    /// Who is online, and who just arrived (None in tests without links).
    presence: Option<Arc<Presence>>,
    /// What passes cost, for the benchmark and operators.
    pub stats: PassStats,
}

/// Time spent in passes since start (a pass over a deployment, one over a
/// run), so the scheduler's own share of a rollout's wall time is known.
#[derive(Debug, Default)]
pub struct PassStats {
    pub deployment_passes: std::sync::atomic::AtomicU64,
    pub deployment_pass_micros: std::sync::atomic::AtomicU64,
    /// Of that, waiting for the store's commits (shared with the intake).
    pub deployment_store_micros: std::sync::atomic::AtomicU64,
    pub run_passes: std::sync::atomic::AtomicU64,
    pub run_pass_micros: std::sync::atomic::AtomicU64,
}

impl PassStats {
    fn add(
        count: &std::sync::atomic::AtomicU64,
        micros: &std::sync::atomic::AtomicU64,
        since: std::time::Instant,
    ) {
        use std::sync::atomic::Ordering::Relaxed;
        count.fetch_add(1, Relaxed);
        micros.fetch_add(since.elapsed().as_micros() as u64, Relaxed);
    }

    pub fn json(&self) -> serde_json::Value {
        use std::sync::atomic::Ordering::Relaxed;
        serde_json::json!({
            "deploymentPasses": self.deployment_passes.load(Relaxed),
            "deploymentPassSeconds": self.deployment_pass_micros.load(Relaxed) as f64 / 1e6,
            "deploymentStoreSeconds": self.deployment_store_micros.load(Relaxed) as f64 / 1e6,
            "runPasses": self.run_passes.load(Relaxed),
            "runPassSeconds": self.run_pass_micros.load(Relaxed) as f64 / 1e6,
        })
    }
}

impl Engine {
    pub fn new(db: Db, wake: Arc<Notify>, released: Option<Released>) -> Self {
        Self {
            id: agent_core::JobId::random().to_string(),
            db,
            wake,
            released,
            views: Mutex::new(Views::default()),
            deployments: Mutex::new(Default::default()),
            presence: None,
            stats: PassStats::default(),
        }
    }

    /// Judges who is online by `presence`, and passes over a deployment as
    /// soon as a device with a pending target arrives.
    pub fn with_presence(mut self, presence: Arc<Presence>) -> Self {
        self.presence = Some(presence);
        self
    }

    /// Passes whenever the store says something changed, every `interval`
    /// (deadlines), and when woken. The first pass waits (at most
    /// [`INTAKE_WAIT`]) until `intake_ready` says the statuses reported
    /// while the control plane was down are read, so no run fails its
    /// deadline for a result that is already in.
    pub async fn run(
        self: Arc<Self>,
        interval: Duration,
        mut intake_ready: tokio::sync::watch::Receiver<bool>,
        shutdown: CancellationToken,
    ) {
        let mut feed = self.db.changes();
        tokio::select! {
            ready = tokio::time::timeout(INTAKE_WAIT, intake_ready.wait_for(|ready| *ready)) => {
                if ready.is_err() {
                    warn!("the statuses reported while the control plane was down are not all read yet; passing anyway");
                }
            }
            _ = shutdown.cancelled() => return,
        }
        let mut tick = tokio::time::interval(interval);
        let mut ticks = 0u64;
        let mut full = true;
        let mut dirty: HashSet<String> = HashSet::new();
        let presence = self.presence.clone();
        let arrived = async || match &presence {
            Some(presence) => presence.arrived().await,
            None => std::future::pending().await,
        };
        loop {
            let now = Timestamp::now();
            let result = if full {
                self.pass_all(now).await
            } else {
                self.pass(std::mem::take(&mut dirty), now).await
            };
            full = false;
            if let Err(e) = result {
                warn!(error = %e, "run pass failed; retrying on the next pass");
                full = true;
            }
            tokio::select! {
                _ = tick.tick() => {
                    // Deadlines: every unfinished run is looked at.
                    dirty.extend(self.views.lock().await.runs.keys().cloned());
                    dirty.insert(String::new());
                    ticks += 1;
                    if ticks.is_multiple_of(DEPLOYMENT_TICKS) {
                        dirty.extend(self.viewed_deployments().await);
                        dirty.insert(deployments::DIRTY_PLANNING.to_owned());
                    } else {
                        dirty.extend(self.due_deployments(now).await);
                    }
                }
                _ = arrived() => {
                    if let Some(presence) = &presence {
                        let (devices, overflow) = presence.take_arrivals();
                        if overflow {
                            dirty.extend(self.viewed_deployments().await);
                        } else {
                            dirty.extend(self.deployments_of(&devices).await);
                        }
                    }
                }
                _ = self.wake.notified() => full = true,
                change = feed.recv() => match change {
                    Ok(change) => {
                        // Statuses come in waves: gather a moment's worth, so a
                        // pass over a large run is not repeated per status.
                        tokio::time::sleep(GATHER).await;
                        let mut changes = vec![change];
                        while let Ok(more) = feed.try_recv() {
                            changes.push(more);
                        }
                        if let Err(e) = self.route(changes, &mut dirty).await {
                            warn!(error = %e, "cannot follow the store's changes; passing over everything");
                            full = true;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => full = true,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = shutdown.cancelled() => return,
            }
        }
    }

    /// Updates the views from changed keys; collects the runs to pass over.
    async fn route(
        &self,
        changes: Vec<crate::store::Change>,
        dirty: &mut HashSet<String>,
    ) -> Result<(), DbError> {
        for change in &changes {
            if ["deployments/", "targets/", "jobs/", "devices/"]
                .iter()
                .any(|prefix| change.key.starts_with(prefix))
            {
                self.route_deployment(change, dirty).await?;
            }
        }
        let mut views = self.views.lock().await;
        let mut devices_changed = false;
        for change in changes {
            if let Some(name) = change.key.strip_prefix("runs/") {
                dirty.insert(name.to_owned());
            } else if change.key.starts_with("schedules/") {
                dirty.insert(String::new());
            } else if change.key.starts_with("devices/") {
                devices_changed = true;
            } else if let Some(rest) = change.key.strip_prefix("jobs/") {
                let Some((device, uid)) = rest.split_once('/') else {
                    continue;
                };
                let Ok(uid) = uid.parse::<JobId>() else {
                    continue;
                };
                let Some(name) = views.by_uid.get(&uid).cloned() else {
                    continue;
                };
                let Ok(device) = DeviceId::new(device) else {
                    continue;
                };
                let job = self.db.get::<JobDelivery>(&change.key).await?;
                let Some(view) = views.runs.get_mut(&name) else {
                    continue;
                };
                if let Some(&index) = view.index.get(&device) {
                    view.outcomes[index] = seen_of(job.map(|(_, j)| j));
                    dirty.insert(name);
                }
            }
        }
        if devices_changed {
            // Regrouped devices matter to runs that still release (revocation),
            // and new agents to runs still planning.
            dirty.extend(views.runs.keys().cloned());
            dirty.insert(String::new());
        }
        Ok(())
    }

    /// Forgets every view and passes over every unfinished run (and the
    /// schedules).
    pub async fn pass_all(&self, now: Timestamp) -> Result<(), DbError> {
        if let Err(e) = self.schedules(now).await {
            warn!(error = %e, "cannot look at the schedules; trying again on the next pass");
        }
        let mut names: HashSet<String> = {
            let mut views = self.views.lock().await;
            *views = Views::default();
            self.db
                .list::<TaskRunRecord>("runs/")
                .await?
                .into_iter()
                .filter(|(_, _, run)| !run.status.phase.is_terminal())
                .map(|(_, _, run)| run.name)
                .collect()
        };
        names.extend(self.all_deployments().await?);
        self.pass(names, now).await
    }

    /// Passes over the named runs; the empty name stands for runs still
    /// planning, whose views do not exist yet.
    async fn pass(&self, mut names: HashSet<String>, now: Timestamp) -> Result<(), DbError> {
        if names.remove(deployments::DIRTY_PLANNING) {
            names.extend(self.planning_deployments().await?);
        }
        let deployment_names: Vec<String> = names
            .iter()
            .filter_map(|n| n.strip_prefix(deployments::DIRTY).map(str::to_owned))
            .filter(|n| !n.is_empty())
            .collect();
        names.retain(|n| !n.starts_with(deployments::DIRTY));
        for name in deployment_names {
            let since = std::time::Instant::now();
            if let Err(e) = self.pass_deployment(&name, now).await {
                warn!(deployment = %name, error = %e, "cannot advance deployment");
            }
            crate::metrics::metrics()
                .engine_pass_seconds
                .get_or_create(&vec![("kind", "deployment".into())])
                .observe(crate::metrics::seconds(since));
            PassStats::add(
                &self.stats.deployment_passes,
                &self.stats.deployment_pass_micros,
                since,
            );
        }
        if names.remove("") {
            if let Err(e) = self.schedules(now).await {
                warn!(error = %e, "cannot look at the schedules; trying again on the next pass");
            }
            for (_, _, run) in self.db.list::<TaskRunRecord>("runs/").await? {
                if run.status.phase == Phase::Planning {
                    names.insert(run.name);
                }
            }
        }
        for name in names {
            let since = std::time::Instant::now();
            if let Err(e) = self.reconcile(&name, now).await {
                warn!(run = %name, error = %e, "cannot advance run");
            }
            crate::metrics::metrics()
                .engine_pass_seconds
                .get_or_create(&vec![("kind", "run".into())])
                .observe(crate::metrics::seconds(since));
            PassStats::add(&self.stats.run_passes, &self.stats.run_pass_micros, since);
        }
        Ok(())
    }

    /// Looks at every TaskSchedule: creates the run a tick asks for
    /// (create-only, so replicas and restarts create it once) and records
    /// what was decided under the schedule's revision.
    pub async fn schedules(&self, now: Timestamp) -> Result<Vec<String>, DbError> {
        let mut created = Vec::new();
        for (key, revision, schedule) in self.db.list::<TaskScheduleRecord>("schedules/").await? {
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
            let decision = crate::schedule::decide(&schedule, &ticks, active, now);
            if let Some((name, tick)) = &decision.create {
                let run = TaskRunRecord {
                    name: name.clone(),
                    uid: JobId::random(),
                    created_at: now,
                    spec: schedule.spec.template.clone(),
                    status: crate::records::RunStatus::planning(),
                };
                match self.db.put(&run_key(name), &run, 0).await {
                    Ok(_) => {
                        info!(schedule = %schedule.name, run = %name, %tick, "scheduled run created");
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

    pub async fn reconcile(&self, name: &str, now: Timestamp) -> Result<(), DbError> {
        let Some((revision, run)) = self.db.get::<TaskRunRecord>(&run_key(name)).await? else {
            self.forget(name).await;
            return Ok(());
        };
        match run.status.phase {
            // A terminal run never advances.
            Phase::Complete | Phase::Failed => {
                self.forget(name).await;
                Ok(())
            }
            Phase::Planning => self.plan(revision, run, now).await,
            Phase::Running | Phase::Canceling => self.advance(revision, run, now).await,
        }
    }

    async fn forget(&self, name: &str) {
        let mut views = self.views.lock().await;
        if let Some(view) = views.runs.remove(name) {
            views.by_uid.remove(&view.uid);
        }
    }

    /// Freezes the target plan in bounded chunks outside the run, then moves
    /// the run to Running. A store error leaves it in Planning for the next
    /// pass instead of becoming NoTargets. See [`PlanHeader`] for how
    /// concurrent planners agree on one plan.
    async fn plan(
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
        let devices: Vec<DeviceRecord> = self
            .db
            .list::<DeviceRecord>("devices/")
            .await?
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

    async fn start_running(
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

    async fn put_run(&self, revision: u64, run: &TaskRunRecord) -> Result<(), DbError> {
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

    /// Builds the view of a running run: its plan and every target's job.
    async fn load_view(&self, run: &TaskRunRecord) -> Result<RunView, DbError> {
        let plan = self.load_plan(run).await?;
        let mut outcomes = Vec::with_capacity(plan.len());
        let mut index = HashMap::with_capacity(plan.len());
        for (position, target) in plan.iter().enumerate() {
            let job = self
                .db
                .get::<JobDelivery>(&job_key(&target.device, run.uid))
                .await?;
            outcomes.push(seen_of(job.map(|(_, j)| j)));
            index.insert(target.device.clone(), position);
        }
        Ok(RunView {
            uid: run.uid,
            plan,
            index,
            outcomes,
        })
    }

    async fn advance(
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
            let Some(view) = views.runs.get(&run.name) else {
                return Ok(());
            };
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
                        view.outcomes[i] = Seen::Pending { cancel: false };
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

    /// Asks every released, undecided job of a canceled run to cancel (the
    /// delivery core sends the order when it sees the request). A pass that
    /// released a job after the cancel was stored sees it here on the next
    /// pass, so none is missed.
    async fn request_cancels(&self, view: &mut RunView, now: Timestamp) -> Result<(), DbError> {
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
                view.outcomes[position] = Seen::Pending { cancel: true };
            }
        }
        info!(
            asked = settled.len(),
            "cancel requested for the run's undecided jobs"
        );
        Ok(())
    }

    /// Stores what a pass decided: the counts, and the end if it came.
    async fn finish_pass(
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
                }
                Ok(())
            }
            Err(DbError::Kv(e)) if e.is_conflict() => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
impl Engine {
    /// One turn of [`Engine::run`]'s loop at `now`, for tests that drive the
    /// clock: the changes the store announced, the arrivals, the due
    /// deployments, every deployment on each [`DEPLOYMENT_TICKS`]th turn.
    /// Without `read_feed` the feed lags: the changes stay unread this turn.
    pub(crate) async fn turn(
        &self,
        feed: &mut broadcast::Receiver<crate::store::Change>,
        turn: u64,
        read_feed: bool,
        now: Timestamp,
    ) -> Result<(), DbError> {
        let mut changes = Vec::new();
        if read_feed {
            loop {
                match feed.try_recv() {
                    Ok(change) => changes.push(change),
                    Err(broadcast::error::TryRecvError::Lagged(_)) => {
                        return self.pass_all(now).await;
                    }
                    Err(_) => break,
                }
            }
        }
        let mut dirty = HashSet::new();
        self.route(changes, &mut dirty).await?;
        if let Some(presence) = &self.presence {
            let (devices, _) = presence.take_arrivals();
            dirty.extend(self.deployments_of(&devices).await);
        }
        dirty.extend(self.due_deployments(now).await);
        if turn.is_multiple_of(DEPLOYMENT_TICKS) {
            dirty.extend(self.viewed_deployments().await);
            dirty.insert(deployments::DIRTY_PLANNING.to_owned());
        }
        self.pass(dirty, now).await
    }
}

/// A target's job as the view keeps it, before the deadline is applied.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
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
}

fn seen_of(job: Option<JobDelivery>) -> Seen {
    let Some(job) = job else {
        return Seen::Unreleased;
    };
    if matches!(job.delivery, Delivery::Expired { .. }) && job.status.is_none() {
        return Seen::Failed("the intent expired before the device took it".into());
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
        JobState::Failed | JobState::Expired | JobState::Rejected | JobState::Canceled => {
            Seen::Failed(
                status
                    .error
                    .unwrap_or_else(|| format!("{:?}", status.state)),
            )
        }
        JobState::Accepted | JobState::Waiting | JobState::Running | JobState::AwaitingReboot => {
            pending
        }
    }
}

fn judged(seen: &Seen, deadline: Timestamp) -> Outcome {
    match seen {
        Seen::Unreleased => Outcome::Unreleased,
        Seen::Pending { .. } => Outcome::Pending,
        Seen::Succeeded { at } if *at <= deadline => Outcome::Succeeded,
        Seen::Succeeded { at } => Outcome::Failed(format!(
            "the result reached the control plane at {at}, after the deadline {deadline}"
        )),
        Seen::Failed(error) => Outcome::Failed(error.clone()),
    }
}

/// The targets as the rollout rules see them, with the deadline applied to
/// successes (one the control plane received late is a failure), and the
/// latest error.
fn judge(view: &RunView, deadline: Timestamp) -> (Vec<TargetView>, Option<String>) {
    let mut targets = Vec::with_capacity(view.plan.len());
    let mut latest_error = None;
    for (target, seen) in view.plan.iter().zip(&view.outcomes) {
        let outcome = judged(seen, deadline);
        if let Outcome::Failed(error) = &outcome {
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
/// clock never decides. A late success is a failure.
pub fn outcome_of(job: Option<JobDelivery>, deadline: Timestamp) -> Outcome {
    judged(&seen_of(job), deadline)
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
