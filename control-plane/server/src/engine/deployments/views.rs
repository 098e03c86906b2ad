//! The engine's view of each unfinished deployment, kept in memory between
//! passes and updated from the store's change feed: its targets, what
//! their current jobs are doing, and when a pass is next due.

use crate::engine::Engine;
use crate::engine::Todo;
use drover_contract::kv::Change;
use drover_model::{DeviceId, JobId};
use drover_rules::deployment::{self, DeploymentRecord, Observed, TargetRecord, observe};
use drover_rules::records::{
    Delivery, DeviceRecord, JobDelivery, Phase, device_key, job_key, targets_prefix,
};
use drover_store::db::DbError;
use jiff::{SignedDuration, Timestamp};
use std::collections::{HashMap, HashSet};
use tracing::info;

/// An unfinished deployment as the engine keeps it between passes.
pub(in crate::engine) struct DeploymentView {
    pub(super) uid: JobId,
    /// The deployment record's revision up to which the view holds every
    /// change: the change feed is in store order, so when the record's
    /// change is routed, the targets another replica wrote before it are in.
    pub(super) routed: u64,
    pub(super) targets: Vec<TargetRecord>,
    pub(super) revisions: Vec<u64>,
    pub(super) index: HashMap<DeviceId, usize>,
    /// What each target's current job is doing (None: no job out, or its
    /// record is not there yet).
    pub(super) jobs: Vec<Option<Observed>>,
    /// The device's stored last-seen time (for devices on other replicas).
    pub(super) last_seen: Vec<Option<Timestamp>>,
    /// The device's site time zone as stored now, judged at every pass (a
    /// device that moved site mid-deployment is judged in its new zone);
    /// the target's own zone until the device's record is read.
    pub(super) zones: Vec<Option<String>>,
    /// Jobs of a canceled deployment whose cancel this replica requested.
    pub(super) cancel_asked: HashSet<JobId>,
    /// When a pass is next due without any change: a retry's backoff ends,
    /// a running attempt times out, or the deployment expires.
    pub(super) next_due: Option<Timestamp>,
}

impl DeploymentView {
    /// When each unended target's current job was acknowledged, for those
    /// the device acknowledged and has not started.
    pub(super) fn acked_at(&self) -> impl Iterator<Item = Timestamp> + '_ {
        self.targets
            .iter()
            .zip(&self.jobs)
            .filter(|(t, _)| t.end.is_none() && t.job.is_some())
            .filter_map(|(_, job)| match job {
                Some(Observed::Queued { acked: Some(at) }) => Some(*at),
                _ => None,
            })
    }

    /// The targets whose job was acknowledged a job timeout (plus grace)
    /// ago or more and has not started: (index, device, job, acked).
    pub(super) fn acked_overdue(&self, now: Timestamp) -> Vec<(usize, DeviceId, JobId, Timestamp)> {
        let timeout = SignedDuration::from_secs(i64::from(deployment::JOB_TIMEOUT_SECONDS))
            + deployment::RUNNING_GRACE;
        self.targets
            .iter()
            .zip(&self.jobs)
            .enumerate()
            .filter_map(|(index, (target, job))| {
                let id = target.job.filter(|_| target.end.is_none())?;
                match job {
                    Some(Observed::Queued { acked: Some(at) }) if now >= *at + timeout => {
                        Some((index, target.device.clone(), id, *at))
                    }
                    _ => None,
                }
            })
            .collect()
    }
}

#[derive(Default)]
pub(in crate::engine) struct DeploymentViews {
    pub(super) by_name: HashMap<String, DeploymentView>,
    pub(super) by_uid: HashMap<JobId, String>,
    /// The current attempt's job of every target in a view.
    pub(super) by_job: HashMap<JobId, (String, usize)>,
    /// The unfinished deployments each device is a target of.
    pub(super) by_device: HashMap<DeviceId, Vec<String>>,
}

impl DeploymentViews {
    /// Keeps a freshly loaded view of deployment `name`, indexed by its uid,
    /// its targets' current jobs and the devices of its unfinished targets.
    pub(super) fn insert(&mut self, name: &str, view: DeploymentView) {
        self.by_uid.insert(view.uid, name.to_owned());
        for (index, target) in view.targets.iter().enumerate() {
            if let Some(job) = target.job {
                self.by_job.insert(job, (name.to_owned(), index));
            }
            if target.end.is_none() {
                self.by_device
                    .entry(target.device.clone())
                    .or_default()
                    .push(name.to_owned());
            }
        }
        self.by_name.insert(name.to_owned(), view);
    }

    pub(super) fn forget(&mut self, name: &str) {
        let Some(view) = self.by_name.remove(name) else {
            return;
        };
        self.by_uid.remove(&view.uid);
        for target in &view.targets {
            if let Some(job) = target.job {
                self.by_job.remove(&job);
            }
            if let Some(names) = self.by_device.get_mut(&target.device) {
                names.retain(|n| n != name);
                if names.is_empty() {
                    self.by_device.remove(&target.device);
                }
            }
        }
    }

    /// Records a target's new state in the view, keeping the job index.
    pub(super) fn set_target(
        &mut self,
        name: &str,
        index: usize,
        record: TargetRecord,
        revision: u64,
    ) {
        let Some(view) = self.by_name.get_mut(name) else {
            return;
        };
        let old_job = view.targets[index].job;
        if old_job != record.job {
            if let Some(old) = old_job {
                self.by_job.remove(&old);
            }
            if let Some(new) = record.job {
                self.by_job.insert(new, (name.to_owned(), index));
            }
            view.jobs[index] = None;
        }
        view.targets[index] = record;
        view.revisions[index] = revision;
    }

    pub(super) fn add_target(
        &mut self,
        name: &str,
        record: TargetRecord,
        revision: u64,
        last_seen: Option<Timestamp>,
    ) {
        let Some(view) = self.by_name.get_mut(name) else {
            return;
        };
        if view.index.contains_key(&record.device) {
            return;
        }
        let index = view.targets.len();
        view.index.insert(record.device.clone(), index);
        self.by_device
            .entry(record.device.clone())
            .or_default()
            .push(name.to_owned());
        if let Some(job) = record.job {
            self.by_job.insert(job, (name.to_owned(), index));
        }
        view.zones.push(record.time_zone.clone());
        view.targets.push(record);
        view.revisions.push(revision);
        view.jobs.push(None);
        view.last_seen.push(last_seen);
    }
}

impl Engine {
    /// Follows one stored change that may concern a deployment.
    pub(in crate::engine) async fn route_deployment(
        &self,
        change: &Change,
        dirty: &mut HashSet<Todo>,
    ) -> Result<(), DbError> {
        let key = change.key.as_str();
        let mut views = self.deployments.lock().await;
        if let Some(name) = key.strip_prefix("deployments/") {
            if let Some(view) = views.by_name.get_mut(name) {
                view.routed = view.routed.max(change.revision);
            }
            dirty.insert(Todo::Deployment(name.to_string()));
            return Ok(());
        }
        if let Some(rest) = key.strip_prefix("targets/") {
            let Some((uid, device)) = rest.split_once('/') else {
                return Ok(());
            };
            let (Ok(uid), Ok(device)) = (uid.parse::<JobId>(), DeviceId::new(device)) else {
                return Ok(());
            };
            let Some(name) = views.by_uid.get(&uid).cloned() else {
                return Ok(());
            };
            let Some(view) = views.by_name.get(&name) else {
                return Ok(());
            };
            match view.index.get(&device) {
                Some(&index) if change.revision <= view.revisions[index] => {}
                Some(&index) => {
                    if let Some((revision, record)) = self.db.get::<TargetRecord>(key).await? {
                        views.set_target(&name, index, record, revision);
                        dirty.insert(Todo::Deployment(name.to_string()));
                    }
                }
                None => {
                    // Added by another replica ("add new devices").
                    if let Some((revision, record)) = self.db.get::<TargetRecord>(key).await? {
                        views.add_target(&name, record, revision, None);
                        dirty.insert(Todo::Deployment(name.to_string()));
                    }
                }
            }
        } else if let Some(rest) = key.strip_prefix("jobs/") {
            let Some((_, job)) = rest.split_once('/') else {
                return Ok(());
            };
            let Ok(job) = job.parse::<JobId>() else {
                return Ok(());
            };
            let Some((name, index)) = views.by_job.get(&job).cloned() else {
                return Ok(());
            };
            let record = self.db.get::<JobDelivery>(key).await?;
            if let Some(view) = views.by_name.get_mut(&name) {
                view.jobs[index] = record.map(|(_, j)| observe(&j, Timestamp::now()));
                dirty.insert(Todo::Deployment(name.to_string()));
            }
        } else if let Some(device) = key.strip_prefix("devices/") {
            let Ok(device) = DeviceId::new(device) else {
                return Ok(());
            };
            let Some(names) = views.by_device.get(&device).cloned() else {
                return Ok(());
            };
            let stored = self.db.get::<DeviceRecord>(key).await?.map(|(_, d)| d);
            let seen = stored.as_ref().and_then(|d| d.last_seen);
            let zone = stored.and_then(|d| d.time_zone);
            for name in names {
                if let Some(view) = views.by_name.get_mut(&name)
                    && let Some(&index) = view.index.get(&device)
                {
                    view.last_seen[index] = seen;
                    view.zones[index] = zone.clone();
                    if view.targets[index].job.is_none() && view.targets[index].end.is_none() {
                        dirty.insert(Todo::Deployment(name.to_string()));
                    }
                }
            }
        }
        Ok(())
    }

    /// Every unfinished deployment, views forgotten (a full pass).
    pub(in crate::engine) async fn all_deployments(&self) -> Result<Vec<Todo>, DbError> {
        *self.deployments.lock().await = DeploymentViews::default();
        Ok(self
            .db
            .list::<DeploymentRecord>("deployments/")
            .await?
            .into_iter()
            .filter(|(_, _, d)| !d.status.phase.is_terminal())
            .map(|(_, _, d)| Todo::Deployment(d.name))
            .collect())
    }

    /// The deployments in view, to pass over on a tick.
    pub(in crate::engine) async fn viewed_deployments(&self) -> Vec<Todo> {
        let views = self.deployments.lock().await;
        views
            .by_name
            .keys()
            .map(|name| Todo::Deployment(name.clone()))
            .collect()
    }

    /// Deployments in view whose next due moment has come.
    pub(in crate::engine) async fn due_deployments(&self, now: Timestamp) -> Vec<Todo> {
        let views = self.deployments.lock().await;
        views
            .by_name
            .iter()
            .filter(|(_, view)| view.next_due.is_some_and(|due| due <= now))
            .map(|(name, _)| Todo::Deployment(name.clone()))
            .collect()
    }

    /// Deployments with a pending target on a device that just arrived.
    pub(in crate::engine) async fn deployments_of(&self, devices: &[DeviceId]) -> Vec<Todo> {
        let views = self.deployments.lock().await;
        let mut names = HashSet::new();
        for device in devices {
            for name in views.by_device.get(device).into_iter().flatten() {
                if let Some(view) = views.by_name.get(name)
                    && let Some(&index) = view.index.get(device)
                    && view.targets[index].job.is_none()
                    && view.targets[index].end.is_none()
                {
                    names.insert(Todo::Deployment(name.clone()));
                }
            }
        }
        names.into_iter().collect()
    }

    /// Deployments still materialising (no view exists for them yet).
    pub(in crate::engine) async fn planning_deployments(&self) -> Result<Vec<Todo>, DbError> {
        Ok(self
            .db
            .list::<DeploymentRecord>("deployments/")
            .await?
            .into_iter()
            .filter(|(_, _, d)| d.status.phase == Phase::Planning)
            .map(|(_, _, d)| Todo::Deployment(d.name))
            .collect())
    }

    /// Builds the view of a running deployment from its stored targets.
    pub(super) async fn load_deployment_view(
        &self,
        revision: u64,
        record: &DeploymentRecord,
    ) -> Result<DeploymentView, DbError> {
        let stored = self
            .db
            .list::<TargetRecord>(&targets_prefix(record.uid))
            .await?;
        let mut view = DeploymentView {
            uid: record.uid,
            // Listed after the record was read at `revision`.
            routed: revision,
            targets: Vec::with_capacity(stored.len()),
            revisions: Vec::with_capacity(stored.len()),
            index: HashMap::with_capacity(stored.len()),
            jobs: Vec::with_capacity(stored.len()),
            last_seen: Vec::with_capacity(stored.len()),
            zones: Vec::with_capacity(stored.len()),
            cancel_asked: HashSet::new(),
            next_due: None,
        };
        let now = Timestamp::now();
        for (_, revision, target) in stored {
            let job = match target.job {
                Some(job) => self
                    .db
                    .get::<JobDelivery>(&job_key(&target.device, job))
                    .await?
                    .map(|(_, j)| observe(&j, now)),
                None => None,
            };
            let device = self
                .db
                .get::<DeviceRecord>(&device_key(&target.device))
                .await?
                .map(|(_, d)| d);
            let seen = device.as_ref().and_then(|d| d.last_seen);
            view.zones.push(match device {
                Some(device) => device.time_zone,
                None => target.time_zone.clone(),
            });
            view.index.insert(target.device.clone(), view.targets.len());
            view.targets.push(target);
            view.revisions.push(revision);
            view.jobs.push(job);
            view.last_seen.push(seen);
        }
        Ok(view)
    }

    /// When the clock of an acknowledged, not started job started: the later
    /// of its acknowledgement and the end of the last earlier job on the
    /// device (the agent runs one job at a time); None while an earlier one
    /// the device holds (acknowledged or reported on) is unfinished. An
    /// earlier job never acknowledged is not on the device and holds
    /// nothing up. The agent's own local jobs are not known here.
    pub(super) async fn waiting_since(
        &self,
        device: &DeviceId,
        job: JobId,
        acked: Timestamp,
    ) -> Result<Option<Timestamp>, DbError> {
        let jobs = self
            .db
            .list::<JobDelivery>(&drover_rules::records::device_jobs_prefix(device))
            .await?;
        let Some(created) = jobs
            .iter()
            .find(|(_, _, j)| j.intent.job_id == job)
            .map(|(_, _, j)| j.created_at)
        else {
            return Ok(Some(acked));
        };
        let mut since = acked;
        for (_, _, earlier) in jobs.iter().filter(|(_, _, j)| j.created_at < created) {
            let status = earlier.status.as_ref();
            let finished = status.is_some_and(|s| s.state.is_terminal())
                || matches!(earlier.delivery, Delivery::Expired { .. });
            let held = status.is_some() || matches!(earlier.delivery, Delivery::Acked { .. });
            if finished {
                let ended = earlier
                    .terminal_received_at
                    .or_else(|| status.and_then(|s| s.finished_at));
                since = since.max(ended.unwrap_or(since));
            } else if held {
                return Ok(None);
            }
        }
        Ok(Some(since))
    }

    /// Asks the current jobs of these targets of a canceled deployment to
    /// cancel (the delivery core sends the order when it sees the request),
    /// once per job and view; a request already stored is left alone.
    pub(super) async fn request_deployment_cancels(
        &self,
        view: &mut DeploymentView,
        targets: &[usize],
        now: Timestamp,
    ) -> Result<(), DbError> {
        let asking: Vec<(JobId, String)> = targets
            .iter()
            .filter_map(|&index| {
                let target = &view.targets[index];
                let job = target.job?;
                (!view.cancel_asked.contains(&job)).then(|| (job, job_key(&target.device, job)))
            })
            .collect();
        if asking.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = asking.iter().map(|(_, key)| key.clone()).collect();
        let settled = self.db.request_cancels(&keys, now).await?;
        for (job, key) in asking {
            if settled.contains(&key) {
                view.cancel_asked.insert(job);
            }
        }
        info!(
            asked = settled.len(),
            "cancel requested for the deployment's jobs that are out"
        );
        Ok(())
    }
}
