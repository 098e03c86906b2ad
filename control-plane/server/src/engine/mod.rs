//! The run engine: plans TaskRuns, releases intents as the pure
//! [`rollout::decide`] says, and keeps each run's aggregate status. It
//! learns what changed from the store's change feed (a status stored, a run
//! applied, a device regrouped), whichever replica wrote it, and keeps a view
//! of each unfinished run in memory, so a pass costs what changed, not the
//! fleet. It emits what it released to the delivery core and never sees a
//! connection. Every write is a compare-and-set, so a pass that loses a race
//! simply leaves the work to the next pass.

use crate::dispatch::{Presence, Released};
use drover_model::{DeviceId, JobId};
use drover_rules::records::{JobDelivery, Phase, PlanTarget, TaskRunRecord, run_key};
use drover_rules::rollout;
use drover_store::db::{Db, DbError};
use jiff::Timestamp;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, Notify, broadcast};
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// The updater's package job budget, copied into each intent.
const JOB_TIMEOUT_SECONDS: u32 = 1500;

/// How long the engine gathers changes before a pass.
const GATHER: Duration = Duration::from_millis(50);

/// How long the engine's first pass waits for the status backlog.
const INTAKE_WAIT: Duration = Duration::from_secs(60);

/// A plan claim older than this is taken over by another planner.
const PLAN_CLAIM_TTL: jiff::SignedDuration = jiff::SignedDuration::from_secs(60);

mod deployments;
mod runs;
mod schedules;

use runs::{Seen, seen_of};

/// Ticks between two passes over every deployment in view (30 s at the
/// default pass interval of 1 s); results, arrivals and due retries pass
/// sooner.
const DEPLOYMENT_TICKS: u64 = 30;

/// An unfinished run as the engine keeps it between passes.
struct RunView {
    uid: JobId,
    /// The run's phase at the last pass: a change of the run's record in
    /// the same phase is a pass's own counts (this replica's or another's),
    /// which needs no pass of its own.
    phase: Phase,
    /// The deadline its outcomes are judged by (the run's, once Running).
    deadline: Timestamp,
    plan: Vec<PlanTarget>,
    index: HashMap<DeviceId, usize>,
    outcomes: Vec<Seen>,
    /// The judged outcomes counted, kept as they change: a pass in which
    /// nothing can be released or end reads this, not every target.
    tally: rollout::Tally,
    /// A target failed since the last pass that looked at every target,
    /// which names the latest failure in the run's status.
    failure_unnamed: bool,
}

impl RunView {
    fn new(
        uid: JobId,
        phase: Phase,
        deadline: Timestamp,
        plan: Vec<PlanTarget>,
        outcomes: Vec<Seen>,
    ) -> Self {
        let index = plan
            .iter()
            .enumerate()
            .map(|(position, target)| (target.device.clone(), position))
            .collect();
        let mut view = Self {
            uid,
            phase,
            deadline,
            plan,
            index,
            outcomes,
            tally: rollout::Tally::default(),
            failure_unnamed: true,
        };
        view.rejudge(deadline);
        view
    }

    /// Counts every outcome afresh, judged by `deadline`.
    fn rejudge(&mut self, deadline: Timestamp) {
        self.deadline = deadline;
        self.tally = rollout::Tally::default();
        for (target, seen) in self.plan.iter().zip(&self.outcomes) {
            self.tally
                .add_target(target.canary, &runs::judged(seen, deadline));
        }
        self.failure_unnamed = true;
    }

    /// Records what target `index`'s job is doing now.
    fn set(&mut self, index: usize, seen: Seen) {
        let canary = self.plan[index].canary;
        let before = runs::judged(&self.outcomes[index], self.deadline);
        let after = runs::judged(&seen, self.deadline);
        if before != after {
            self.tally.count(canary, &before, false);
            self.tally.count(canary, &after, true);
            if matches!(
                after,
                rollout::Outcome::Failed(_) | rollout::Outcome::Late(_)
            ) {
                self.failure_unnamed = true;
            }
        }
        self.outcomes[index] = seen;
    }

    /// Whether some target is still to be released: only then can a
    /// device's record (its groups, a new agent) change what a pass does.
    fn releasing(&self) -> bool {
        self.tally.unreleased_canaries + self.tally.unreleased_rest > 0
    }
}

#[derive(Default)]
struct Views {
    runs: HashMap<String, RunView>,
    by_uid: HashMap<JobId, String>,
}

/// Work an engine pass owes, gathered between passes from the change
/// feed, the ticks and arriving devices.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Todo {
    /// A run, by name.
    Run(String),
    /// The runs still planning (they have no view yet) and the schedules.
    PlanningRuns,
    /// A deployment, by name.
    Deployment(String),
    /// The deployments still materialising their targets.
    PlanningDeployments,
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
    /// The only replica on its store (the embedded store admits one
    /// process): runs' passes need no lease.
    alone: bool,
    /// What devices' histories keep of the jobs deleted with their run,
    /// deployment or schedule.
    history: drover_rules::history::Retention,
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
    /// Of the run passes, those that judged every target (the others read
    /// the run's tally, or left the run to the replica holding its lease).
    pub run_full_passes: std::sync::atomic::AtomicU64,
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

    pub fn api(&self) -> drover_api::fleet::EngineStats {
        use std::sync::atomic::Ordering::Relaxed;
        drover_api::fleet::EngineStats {
            deployment_passes: self.deployment_passes.load(Relaxed),
            deployment_pass_seconds: self.deployment_pass_micros.load(Relaxed) as f64 / 1e6,
            deployment_store_seconds: self.deployment_store_micros.load(Relaxed) as f64 / 1e6,
            run_passes: self.run_passes.load(Relaxed),
            run_pass_seconds: self.run_pass_micros.load(Relaxed) as f64 / 1e6,
            run_full_passes: self.run_full_passes.load(Relaxed),
        }
    }
}

impl Engine {
    pub fn new(db: Db, wake: Arc<Notify>, released: Option<Released>) -> Self {
        Self {
            id: drover_model::JobId::random().to_string(),
            db,
            wake,
            released,
            views: Mutex::new(Views::default()),
            deployments: Mutex::new(Default::default()),
            presence: None,
            alone: false,
            history: Default::default(),
            stats: PassStats::default(),
        }
    }

    /// Judges who is online by `presence`, and passes over a deployment as
    /// soon as a device with a pending target arrives.
    pub fn with_presence(mut self, presence: Arc<Presence>) -> Self {
        self.presence = Some(presence);
        self
    }

    /// The only replica on its store: no other process can pass over a run,
    /// so runs' passes take no lease (and a lease left by this replica's
    /// previous life does not hold its runs up).
    pub fn alone(mut self) -> Self {
        self.alone = true;
        self
    }

    /// Devices' histories keep what `retention` says.
    pub fn with_history(mut self, retention: drover_rules::history::Retention) -> Self {
        self.history = retention;
        self
    }

    /// Deletes these job records, each decided one kept in its device's
    /// history first ([`crate::history::archive`]); how many records went.
    pub async fn retire_jobs(&self, keys: &[String]) -> Result<usize, DbError> {
        let mut jobs = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some((_, job)) = self.db.get::<JobDelivery>(key).await? {
                jobs.push(job);
            }
        }
        let kept = crate::history::archive(&self.db, &jobs, self.history, Timestamp::now()).await?;
        let deleted = self.db.delete_all(keys).await?;
        tracing::info!(
            deleted,
            kept,
            "job records deleted, decided ones kept in their devices' history"
        );
        Ok(deleted)
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
        let mut dirty: HashSet<Todo> = HashSet::new();
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
                    dirty.extend(self.views.lock().await.runs.keys().cloned().map(Todo::Run));
                    dirty.insert(Todo::PlanningRuns);
                    ticks += 1;
                    if ticks.is_multiple_of(DEPLOYMENT_TICKS) {
                        dirty.extend(self.viewed_deployments().await);
                        dirty.insert(Todo::PlanningDeployments);
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
                _ = shutdown.cancelled() => {
                    self.give_back_run_leases().await;
                    return;
                }
            }
        }
    }

    /// Updates the views from changed keys; collects the runs to pass over.
    async fn route(
        &self,
        changes: Vec<drover_contract::kv::Change>,
        dirty: &mut HashSet<Todo>,
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
                // A pass stores the run's counts after each wave of results;
                // every replica sees that write. Passing again for it would
                // make each pass cause the next one on every replica. Jobs'
                // changes and the deadline tick bring the passes a run needs;
                // a new phase (planned, canceled, finished) or a deleted
                // run is passed over at once.
                if let Some(view) = views.runs.get(name)
                    && let Some((_, run)) = self.db.get::<TaskRunRecord>(&change.key).await?
                    && run.status.phase == view.phase
                {
                    continue;
                }
                dirty.insert(Todo::Run(name.to_owned()));
            } else if change.key.starts_with("schedules/") {
                dirty.insert(Todo::PlanningRuns);
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
                    view.set(index, seen_of(job.map(|(_, j)| j)));
                    dirty.insert(Todo::Run(name));
                }
            }
        }
        if devices_changed {
            // Regrouped devices matter to runs that still release (revocation),
            // and new agents to runs still planning; a run whose every target
            // is out has nothing a device's record could change.
            dirty.extend(
                views
                    .runs
                    .iter()
                    .filter(|(_, view)| view.releasing())
                    .map(|(name, _)| Todo::Run(name.clone())),
            );
            dirty.insert(Todo::PlanningRuns);
        }
        Ok(())
    }

    /// Forgets every view and passes over every unfinished run (and the
    /// schedules).
    pub async fn pass_all(&self, now: Timestamp) -> Result<(), DbError> {
        if let Err(e) = self.schedules(now).await {
            warn!(error = %e, "cannot look at the schedules; trying again on the next pass");
        }
        let mut names: HashSet<Todo> = {
            let mut views = self.views.lock().await;
            *views = Views::default();
            self.db
                .list::<TaskRunRecord>("runs/")
                .await?
                .into_iter()
                .filter(|(_, _, run)| !run.status.phase.is_terminal())
                .map(|(_, _, run)| Todo::Run(run.name))
                .collect()
        };
        names.extend(self.all_deployments().await?);
        self.pass(names, now).await
    }

    /// Does the work owed: the deployments first, then the runs.
    async fn pass(&self, mut todo: HashSet<Todo>, now: Timestamp) -> Result<(), DbError> {
        if todo.remove(&Todo::PlanningDeployments) {
            todo.extend(self.planning_deployments().await?);
        }
        let mut deployment_names = Vec::new();
        let mut names = HashSet::new();
        let mut planning_runs = false;
        for item in todo {
            match item {
                Todo::Deployment(name) => deployment_names.push(name),
                Todo::Run(name) => {
                    names.insert(name);
                }
                Todo::PlanningRuns => planning_runs = true,
                Todo::PlanningDeployments => {}
            }
        }
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
        if planning_runs {
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
}

#[cfg(test)]
impl Engine {
    /// One turn of [`Engine::run`]'s loop at `now`, for tests that drive the
    /// clock: the changes the store announced, the arrivals, the due
    /// deployments, every deployment on each [`DEPLOYMENT_TICKS`]th turn.
    /// Without `read_feed` the feed lags: the changes stay unread this turn.
    pub(crate) async fn turn(
        &self,
        feed: &mut broadcast::Receiver<drover_contract::kv::Change>,
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
            dirty.insert(Todo::PlanningDeployments);
        }
        self.pass(dirty, now).await
    }
}

#[cfg(test)]
mod tests;
