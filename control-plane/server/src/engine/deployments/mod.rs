//! The engine's deployment side: materialises a deployment's targets once,
//! then passes over them with the pure [`deployment::decide`], writes what
//! it decided and hands the new jobs to the delivery core, as the run side
//! does. A view of each unfinished deployment (its targets and what their
//! current jobs are doing) is kept in memory and updated from the store's
//! change feed, so a pass reads nothing from the store but the deployment's
//! own record.
//!
//! One pass at a time per deployment, across replicas: a pass that has
//! something to write first takes a lease on the deployment record (a
//! compare-and-set), writes, then stores the status and drops the lease in
//! one more compare-and-set. Another replica skips a leased deployment; its
//! change feed, ordered like the store, brings it the leaseholder's writes
//! before the record that ends the lease. Job ids are derived from
//! (deployment, device, attempt), so a release repeated after a crash
//! creates the same job, once.

use super::Engine;
use drover_contract::kv::Op;
use drover_model::DeviceId;
use drover_model::model::Intent;
use drover_rules::deployment::{
    self, Adds, Decision, DeploymentRecord, DeploymentStatus, Lease, MAX_TARGETS, Selection,
    TargetInput, TargetRecord, next_status,
};
use drover_rules::records::{Delivery, JobDelivery, Phase, deployment_key, job_key, target_key};
use drover_store::db::{Db, DbError};
use jiff::{SignedDuration, Timestamp};
use std::collections::{HashMap, HashSet};
use tracing::{info, warn};

/// How long a pass may hold a deployment before another replica takes over.
const LEASE: SignedDuration = SignedDuration::from_secs(30);
/// A held lease is renewed (a commit of its own) once less than this is left.
const LEASE_RENEW_BEFORE: SignedDuration = SignedDuration::from_secs(10);
/// Target records written per commit when a deployment starts.
const TARGET_CHUNK: usize = 1000;

use views::DeploymentView;
pub(super) use views::DeploymentViews;

impl Engine {
    fn online(&self, device: &DeviceId, stored: Option<Timestamp>, now: Timestamp) -> bool {
        match &self.presence {
            Some(presence) => presence.online(device, stored, now),
            None => stored
                .is_some_and(|seen| now.duration_since(seen) <= crate::dispatch::ONLINE_WINDOW),
        }
    }

    /// Awaits a write, counting the wait as the store's, not the pass's.
    async fn store_wait<T>(&self, write: impl std::future::Future<Output = T>) -> T {
        let since = std::time::Instant::now();
        let result = write.await;
        self.stats.deployment_store_micros.fetch_add(
            since.elapsed().as_micros() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        result
    }

    /// Takes the deployment's lease (a compare-and-set on its record), unless
    /// another replica holds it. Returns the record's new revision.
    async fn lease(
        &self,
        revision: u64,
        record: &DeploymentRecord,
        now: Timestamp,
    ) -> Result<Option<u64>, DbError> {
        if let Some(lease) = &record.status.lease
            && lease.holder != self.id
            && lease.until > now
        {
            return Ok(None);
        }
        let mut leased = record.clone();
        leased.status.lease = Some(Lease {
            holder: self.id.clone(),
            until: now + LEASE,
        });
        match self
            .store_wait(
                self.db
                    .put(&deployment_key(&record.name), &leased, revision),
            )
            .await
        {
            Ok(revision) => Ok(Some(revision)),
            // Changed meanwhile; the change feed brings it and a new pass.
            Err(DbError::Kv(e)) if e.is_conflict() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Stores the deployment's new status and ends the lease; the record's
    /// new revision, None if the lease was lost.
    async fn release_lease(
        &self,
        revision: u64,
        mut record: DeploymentRecord,
    ) -> Result<Option<u64>, DbError> {
        record.status.lease = None;
        match self
            .store_wait(
                self.db
                    .put(&deployment_key(&record.name), &record, revision),
            )
            .await
        {
            Ok(revision) => Ok(Some(revision)),
            // The lease ran out and another replica went on; its pass stands.
            Err(DbError::Kv(e)) if e.is_conflict() => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(super) async fn pass_deployment(&self, name: &str, now: Timestamp) -> Result<(), DbError> {
        let Some((revision, record)) = self
            .db
            .get::<DeploymentRecord>(&deployment_key(name))
            .await?
        else {
            self.deployments.lock().await.forget(name);
            return Ok(());
        };
        match record.status.phase {
            Phase::Complete | Phase::Failed => {
                self.deployments.lock().await.forget(name);
                Ok(())
            }
            Phase::Planning => self.materialise(revision, record, now).await,
            Phase::Running | Phase::Canceling => {
                self.advance_deployment(revision, record, now).await
            }
        }
    }

    /// The targets of `record`'s spec among the registered devices, and how
    /// many matched but were left out.
    async fn select_targets(
        &self,
        record: &DeploymentRecord,
    ) -> Result<(Vec<(TargetRecord, Option<Timestamp>)>, u32), DbError> {
        let devices = crate::patch_labels::placed_devices(&self.db).await?;
        let inventories = self.inventories(&record.spec.targets).await?;
        let mut targets = Vec::new();
        let mut excluded = 0u32;
        let mut registered = HashSet::new();
        for device in devices {
            registered.insert(device.id.clone());
            let inventory = inventories.get(&device.id);
            match deployment::select(&record.spec.targets, &record.spec.job, &device, inventory) {
                Selection::Target => {
                    let zone = match device.time_zone {
                        Some(zone) if deployment::time_zone(&zone).is_some() => Some(zone),
                        Some(zone) => {
                            warn!(deployment = %record.name, device = %device.id, %zone,
                                "unknown time zone; the window's own is used");
                            None
                        }
                        None => None,
                    };
                    targets.push((TargetRecord::new(device.id, zone), device.last_seen));
                }
                Selection::Excluded => excluded += 1,
                Selection::NotSelected => {}
            }
        }
        if let deployment::Targeting::Devices(list) = &record.spec.targets {
            excluded += list.iter().filter(|d| !registered.contains(*d)).count() as u32;
        }
        Ok((targets, excluded))
    }

    /// The devices' inventories, by device, when `targets` has software
    /// conditions to judge them by (else none is read).
    async fn inventories(
        &self,
        targets: &deployment::Targeting,
    ) -> Result<HashMap<DeviceId, deployment::DeviceInventory>, DbError> {
        Ok(match targets {
            deployment::Targeting::Filter(filter) if filter.needs_inventory() => self
                .db
                .list::<deployment::DeviceInventory>("inventory/")
                .await?
                .into_iter()
                .map(|(_, _, inventory)| (inventory.device.clone(), inventory))
                .collect(),
            _ => HashMap::new(),
        })
    }

    /// What in the deployment's filter matched no device (for its
    /// NoTargets error): its groups and labels, or the software condition
    /// that ruled out every device they select.
    async fn unmatched(&self, record: &DeploymentRecord) -> Result<Vec<String>, DbError> {
        let deployment::Targeting::Filter(filter) = &record.spec.targets else {
            return Ok(Vec::new());
        };
        let devices = crate::patch_labels::placed_devices(&self.db).await?;
        let inventories = self.inventories(&record.spec.targets).await?;
        Ok(drover_rules::unmatched::of_filter(filter, &devices, |d| {
            inventories.get(&d.id)
        }))
    }

    /// Planning -> Running: writes the target records (create-only, so a
    /// second try after a crash keeps the first), then the counts.
    async fn materialise(
        &self,
        revision: u64,
        record: DeploymentRecord,
        now: Timestamp,
    ) -> Result<(), DbError> {
        let Some(leased) = self.lease(revision, &record, now).await? else {
            return Ok(());
        };
        let (targets, excluded) = self.select_targets(&record).await?;
        let mut done = record.clone();
        let status = &mut done.status;
        status.excluded = excluded;
        status.start_time = Some(now);
        if targets.len() > MAX_TARGETS {
            status.phase = Phase::Failed;
            status.reason = Some("TooManyTargets".into());
            status.completion_time = Some(now);
            status.latest_error = Some(format!(
                "too_many_targets: {} devices match; a deployment has at most {MAX_TARGETS} targets",
                targets.len()
            ));
        } else if targets.is_empty() {
            let unmatched = match excluded {
                0 => self.unmatched(&record).await?,
                _ => Vec::new(),
            };
            let status = &mut done.status;
            status.phase = Phase::Failed;
            status.reason = Some("NoTargets".into());
            status.completion_time = Some(now);
            status.latest_error = Some(drover_rules::unmatched::with_unmatched(
                &format!(
                    "no device with an agent matches the targets ({excluded} matching devices excluded)"
                ),
                &unmatched,
            ));
        } else {
            for chunk in targets.chunks(TARGET_CHUNK) {
                let mut ops = Vec::with_capacity(chunk.len());
                for (target, _) in chunk {
                    ops.push(Op::Put {
                        key: target_key(record.uid, &target.device),
                        value: Db::encode(target)?,
                        expected: 0,
                    });
                }
                for result in self.store_wait(self.db.commit(ops)).await? {
                    match result {
                        Ok(_) => {}
                        // Written by an earlier try of this start.
                        Err(e) if e.is_conflict() => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            status.phase = Phase::Running;
            status.targets = targets.len() as u32;
            status.counts = deployment::Counts {
                pending: targets.len() as u32,
                ..Default::default()
            };
        }
        info!(deployment = %record.name, targets = targets.len(), excluded, phase = ?done.status.phase,
            "deployment started");
        self.release_lease(leased, done).await.map(|_| ())
    }

    async fn advance_deployment(
        &self,
        revision: u64,
        record: DeploymentRecord,
        now: Timestamp,
    ) -> Result<(), DbError> {
        let name = record.name.clone();
        let mut views = self.deployments.lock().await;
        if !views.by_name.contains_key(&name) {
            let view = self.load_deployment_view(revision, &record).await?;
            views.insert(&name, view);
        }

        if views
            .by_name
            .get(&name)
            .is_some_and(|v| v.routed < revision)
        {
            // Another replica wrote since the view last caught up; its
            // changes are still on the way through the feed, whose routing
            // of this record will pass again.
            return Ok(());
        }

        // "Add new devices": the filter again, for devices not yet targets.
        let handling_adds = record.add_requests > record.status.add_requests_handled;
        let (adds, add_error, add_excluded) =
            // A canceled deployment takes no new devices; the request is handled.
            if handling_adds && record.status.phase != Phase::Canceling {
                let Some(view) = views.by_name.get(&name) else {
                    return Ok(());
                };
                self.new_targets(&record, view).await?
            } else {
                (Vec::new(), None, None)
            };

        let Some(view) = views.by_name.get(&name) else {
            // Loaded above, under the same lock.
            return Ok(());
        };
        // Jobs acknowledged a timeout ago and not started: when each one's
        // clock started depends on the device's other jobs (read only for
        // these few).
        let overdue = view.acked_overdue(now);
        let mut waiting = HashMap::new();
        for (index, device, job, acked) in overdue {
            if let Some(since) = self.waiting_since(&device, job, acked).await? {
                waiting.insert(index, since);
            }
        }
        let Some(view) = views.by_name.get(&name) else {
            return Ok(());
        };
        let inputs = self.target_inputs(view, &waiting, now);
        let decision = deployment::decide(&record.facts(), &inputs, now);
        drop(inputs);
        if !decision.cancel.is_empty()
            && let Some(view) = views.by_name.get_mut(&name)
        {
            self.request_deployment_cancels(view, &decision.cancel, now)
                .await?;
        }
        let Some(view) = views.by_name.get(&name) else {
            // Loaded above, under the same lock.
            return Ok(());
        };
        let next_due = next_due(&record, view, &decision, now);
        let mut status = next_status(
            &record,
            &decision,
            Adds {
                count: adds.len(),
                error: add_error,
                handled: handling_adds,
                excluded: add_excluded,
            },
            now,
        );
        let mut unleased = record.status.clone();
        unleased.lease = None;
        if decision.changes.is_empty() && adds.is_empty() && status == unleased {
            if let Some(view) = views.by_name.get_mut(&name) {
                view.next_due = next_due;
            }
            return Ok(());
        }
        let Some((leased, lease)) = self.pass_lease(revision, &record, now).await? else {
            return Ok(());
        };
        if let Some(view) = views.by_name.get_mut(&name) {
            view.routed = view.routed.max(leased);
        }
        let Some(view) = views.by_name.get(&name) else {
            // Loaded above, under the same lock.
            return Ok(());
        };
        let finished = status.phase.is_terminal();
        // A finished deployment lets its lease go.
        status.lease = (!finished).then_some(lease);

        let kind = record.spec.job.kind().name().to_owned();
        let ended = (status.phase, status.reason.clone());
        let (ops, job_keys) =
            writes::pass_ops(record, status, leased, &decision, &adds, view, now)?;
        let results = self.store_wait(self.db.commit(ops)).await?;
        let (released_keys, stale) = writes::apply_pass_results(
            &mut views,
            &name,
            results,
            job_keys,
            decision.changes,
            adds,
        )?;
        if let Some(view) = views.by_name.get_mut(&name) {
            view.next_due = next_due;
        }
        if stale {
            // Someone else wrote a target: reload the view on the next pass.
            warn!(deployment = %name, "targets changed under the pass; reloading");
            views.forget(&name);
        }
        if finished {
            views.forget(&name);
        }
        drop(views);
        if !released_keys.is_empty() {
            info!(deployment = %name, released = released_keys.len(), "deployment released jobs");
            crate::metrics::metrics()
                .jobs_released
                .get_or_create(&vec![("kind", kind)])
                .inc_by(released_keys.len() as u64);
            if let Some(released) = &self.released {
                let _ = released.send(released_keys);
            }
        }
        if finished {
            let (phase, reason) = ended;
            info!(deployment = %name, phase = ?phase, reason = ?reason, "deployment finished");
        }
        Ok(())
    }

    /// The lease: kept across passes while this replica passes, so a
    /// pass is one commit (the work and the record together); taken or
    /// renewed with a commit of its own only when missing or running out.
    /// None when another replica holds it.
    async fn pass_lease(
        &self,
        revision: u64,
        record: &DeploymentRecord,
        now: Timestamp,
    ) -> Result<Option<(u64, Lease)>, DbError> {
        let held = record
            .status
            .lease
            .clone()
            .filter(|lease| lease.holder == self.id && lease.until > now + LEASE_RENEW_BEFORE);
        Ok(match held {
            Some(lease) => Some((revision, lease)),
            None => self.lease(revision, record, now).await?.map(|leased| {
                (
                    leased,
                    Lease {
                        holder: self.id.clone(),
                        until: now + LEASE,
                    },
                )
            }),
        })
    }

    /// What `decide` reads of each target: its record, its job while one
    /// is out, whether its device is online (asked only for a pending
    /// target), its site's time zone and since when its job waits.
    fn target_inputs<'v>(
        &self,
        view: &'v DeploymentView,
        waiting: &HashMap<usize, Timestamp>,
        now: Timestamp,
    ) -> Vec<TargetInput<'v>> {
        view.targets
            .iter()
            .enumerate()
            .map(|(i, target)| TargetInput {
                record: target,
                job: if target.end.is_none() {
                    target.job.and(view.jobs[i].clone())
                } else {
                    None
                },
                // Only a pending target's device needs asking.
                online: target.job.is_none()
                    && target.end.is_none()
                    && self.online(&target.device, view.last_seen[i], now),
                time_zone: view.zones[i].as_deref(),
                waiting_since: waiting.get(&i).copied(),
            })
            .collect()
    }

    /// "Add new devices": the devices the filter selects now that are not
    /// targets yet, or none and why when they would be too many.
    async fn new_targets(
        &self,
        record: &DeploymentRecord,
        view: &DeploymentView,
    ) -> Result<
        (
            Vec<(TargetRecord, Option<Timestamp>)>,
            Option<String>,
            Option<u32>,
        ),
        DbError,
    > {
        let (selected, excluded) = self.select_targets(record).await?;
        let adds: Vec<_> = selected
            .into_iter()
            .filter(|(t, _)| !view.index.contains_key(&t.device))
            .collect();
        if view.targets.len() + adds.len() > MAX_TARGETS {
            let error = format!(
                "too_many_targets: adding {} new devices would make {} targets; at most {MAX_TARGETS}",
                adds.len(),
                view.targets.len() + adds.len()
            );
            return Ok((Vec::new(), Some(error), Some(excluded)));
        }
        Ok((adds, None, Some(excluded)))
    }
}

/// When the deployment's next pass is due without any change: a running
/// attempt times out, a waiting retry becomes due, the release rate has
/// room again, or the deadline passes.
fn next_due(
    record: &DeploymentRecord,
    view: &DeploymentView,
    decision: &Decision,
    now: Timestamp,
) -> Option<Timestamp> {
    let deadline = record.facts().deadline();
    let timeout = SignedDuration::from_secs(i64::from(deployment::JOB_TIMEOUT_SECONDS))
        + deployment::RUNNING_GRACE;
    view.targets
        .iter()
        .filter(|t| t.end.is_none())
        .filter_map(|t| t.running_since.map(|since| since + timeout))
        // An acknowledged job's clock starts at its ack at the earliest.
        .chain(view.acked_at().map(|acked| acked + timeout))
        .chain(decision.next_retry_at)
        .chain(decision.next_release_at)
        .chain((deadline > now).then_some(deadline))
        .min()
}

#[cfg(test)]
mod sim_tests;
mod views;
mod writes;
