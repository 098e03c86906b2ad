//! The fleet in memory: every device's record, and its latest assessment
//! without the package list. Loaded once, then kept from the store's change feed (a
//! feed that lagged loads it again), so `GET /patch-status`, the fleet
//! page's patch filter and the alerts read memory instead of decoding every
//! device and every assessment per request (issue 34, 4: about 300 ms at
//! 50,000 devices before). Each replica keeps its own; its feed carries
//! every replica's writes. A view first applies what the feed holds, so it
//! sees every write committed before it was asked; one asked before the
//! first load is done reads the store as before.

use drover_contract::kv::Change;
use drover_model::DeviceId;
use drover_rules::patch::DeviceAssessment;
use drover_rules::records::DeviceRecord;
use drover_store::db::{Db, DbError};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The index at one moment: every device's record and assessment.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    /// In id order, as the store lists them (the fleet page pages by it).
    pub devices: BTreeMap<DeviceId, Arc<DeviceRecord>>,
    /// Without the pending packages, and with only the oldest pending
    /// security update's time: what the counts and alerts read.
    pub assessments: HashMap<DeviceId, Arc<DeviceAssessment>>,
}

pub struct PatchIndex {
    db: Db,
    /// None until the first load is done.
    state: RwLock<Option<Arc<Snapshot>>>,
    /// The store's changes not applied yet. A view drains it before it
    /// reads (so it sees every write committed before it was asked); the
    /// index's own task drains it as changes come.
    feed: tokio::sync::Mutex<broadcast::Receiver<Change>>,
}

/// An assessment as the index keeps it.
fn slim(mut assessment: DeviceAssessment) -> DeviceAssessment {
    assessment.assessment.pending = Vec::new();
    if let Some((name, since)) = assessment
        .security_since
        .iter()
        .min_by_key(|(_, since)| **since)
        .map(|(n, s)| (n.clone(), *s))
    {
        assessment.security_since = [(name, since)].into();
    }
    assessment
}

impl PatchIndex {
    /// An index of `db`, empty until [`PatchIndex::run`] loads it; it
    /// follows every change from now on.
    pub fn new(db: Db) -> Self {
        let feed = tokio::sync::Mutex::new(db.changes());
        Self {
            db,
            state: RwLock::new(None),
            feed,
        }
    }

    fn snapshot(&self) -> Option<Arc<Snapshot>> {
        self.state.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The index with every change committed so far applied, or (before
    /// its first load) the same read from the store.
    pub async fn current(&self) -> Result<Arc<Snapshot>, DbError> {
        if self.snapshot().is_none() {
            return Ok(Arc::new(load(&self.db).await?));
        }
        self.catch_up().await?;
        self.snapshot()
            .map_or_else(|| Ok(Arc::new(Snapshot::default())), Ok)
    }

    /// Loads the index, then applies the store's changes as they come
    /// until `shutdown`.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        // Only a wake-up: the changes themselves are read from `feed`.
        let mut wake = self.db.changes();
        loop {
            match self.catch_up().await {
                Ok(()) => {}
                Err(e) => {
                    warn!(error = %e, "cannot bring the patch index up to date; the views read the store meanwhile");
                    tokio::select! {
                        _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => continue,
                        _ = shutdown.cancelled() => return,
                    }
                }
            }
            tokio::select! {
                change = wake.recv() => if let Err(RecvError::Closed) = change {
                    return;
                },
                _ = shutdown.cancelled() => return,
            }
        }
    }

    /// Applies every change in the feed; loads the whole index first (or
    /// again, when the feed overflowed).
    async fn catch_up(&self) -> Result<(), DbError> {
        let mut feed = self.feed.lock().await;
        let mut stale = self.snapshot().is_none();
        let mut changed = Vec::new();
        loop {
            match feed.try_recv() {
                Ok(change) => changed.push(change.key),
                Err(TryRecvError::Lagged(_)) => stale = true,
                Err(TryRecvError::Empty | TryRecvError::Closed) => break,
            }
        }
        if stale {
            let snapshot = load(&self.db).await?;
            info!(
                devices = snapshot.devices.len(),
                assessments = snapshot.assessments.len(),
                "patch index loaded"
            );
            *self.state.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(snapshot));
            return Ok(());
        }
        for key in changed {
            self.apply(&key).await?;
        }
        Ok(())
    }

    /// One changed key: the device's facts or assessment read again.
    async fn apply(&self, key: &str) -> Result<(), DbError> {
        let db = &self.db;
        if let Some(id) = key.strip_prefix("devices/") {
            let Ok(id) = DeviceId::new(id) else {
                return Ok(());
            };
            let record = db.get::<DeviceRecord>(key).await?.map(|(_, d)| d);
            self.edit(|s| match record {
                Some(record) => {
                    s.devices.insert(id, Arc::new(record));
                }
                None => {
                    s.devices.remove(&id);
                }
            });
        } else if key.starts_with("assessments/") {
            let assessment = db.get::<DeviceAssessment>(key).await?.map(|(_, a)| a);
            let Some(id) = key
                .strip_prefix("assessments/")
                .and_then(|id| DeviceId::new(id).ok())
            else {
                return Ok(());
            };
            self.edit(|s| match assessment {
                Some(a) => {
                    s.assessments.insert(id, Arc::new(slim(a)));
                }
                None => {
                    s.assessments.remove(&id);
                }
            });
        }
        Ok(())
    }

    /// Changes the snapshot in place, or a copy of it while a reader holds
    /// it (the reader keeps the one it has).
    fn edit(&self, change: impl FnOnce(&mut Snapshot)) {
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        if let Some(current) = state.as_mut() {
            let snapshot = Arc::make_mut(current);
            change(snapshot);
        }
    }
}

async fn load(db: &Db) -> Result<Snapshot, DbError> {
    let devices = db
        .list::<DeviceRecord>("devices/")
        .await?
        .into_iter()
        .map(|(_, _, d)| (d.id.clone(), Arc::new(d)))
        .collect();
    let assessments = db
        .list::<DeviceAssessment>("assessments/")
        .await?
        .into_iter()
        .map(|(_, _, a)| (a.device.clone(), Arc::new(slim(a))))
        .collect();
    Ok(Snapshot {
        devices,
        assessments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::Timestamp;

    #[test]
    fn an_indexed_assessment_keeps_what_the_views_read() {
        let device = DeviceId::new("pi-1").expect("id");
        let t = |s: &str| s.parse::<Timestamp>().expect("time");
        let full = DeviceAssessment {
            device: device.clone(),
            finished_at: t("2026-12-01T10:00:00Z"),
            received_at: t("2026-12-01T10:00:01Z"),
            assessment: drover_model::model::PatchAssessment {
                upgradable: 3,
                security: 2,
                kept_back: 0,
                security_archive: true,
                reboot_pending: Some("/run/reboot-required".into()),
                running_kernel: "6.1.0-50-amd64".into(),
                newest_kernel: None,
                pending: vec![drover_model::model::PendingPackage {
                    name: "openssl".into(),
                    from: Some("1".into()),
                    to: "2".into(),
                    security: true,
                }],
                omitted: 0,
            },
            security_since: [
                ("openssl".to_owned(), t("2026-11-20T00:00:00Z")),
                ("libc6".to_owned(), t("2026-11-10T00:00:00Z")),
            ]
            .into(),
            reboot_since: Some(t("2026-11-30T00:00:00Z")),
        };
        let kept = slim(full.clone());
        assert!(kept.assessment.pending.is_empty());
        assert_eq!(kept.oldest_security(), full.oldest_security());
        let now = t("2026-12-02T00:00:00Z");
        let limits = drover_rules::patch::AlertLimits {
            security_after: jiff::SignedDuration::from_hours(24),
            reboot_after: jiff::SignedDuration::from_hours(1),
        };
        assert_eq!(
            drover_rules::patch::alerts(Some(&kept), None, now, &limits),
            drover_rules::patch::alerts(Some(&full), None, now, &limits)
        );
        for filter in drover_rules::patch::PATCH_FILTERS {
            assert_eq!(
                drover_rules::patch::in_patch_state(filter, Some(&kept), now),
                drover_rules::patch::in_patch_state(filter, Some(&full), now),
                "{filter}"
            );
        }
        let mut a = drover_rules::patch::FleetPatchStatus::default();
        let mut b = drover_rules::patch::FleetPatchStatus::default();
        a.add(Some(&kept), now);
        b.add(Some(&full), now);
        assert_eq!(a, b);
    }

    /// The index sees every write committed before a view asks, follows
    /// decommissions and deletes, and loads itself again when its feed
    /// overflowed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_index_follows_the_store_and_answers_after_every_write() {
        use drover_rules::records::device_key;
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::new(Arc::new(
            drover_store::store::RedbKv::open(&dir.path().join("drover.redb")).expect("store"),
        ));
        let index = Arc::new(PatchIndex::new(db.clone()));
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(index.clone().run(shutdown.clone()));
        let device = |name: &str| {
            let mut d = DeviceRecord::new(DeviceId::new(name).expect("id"));
            d.agent_present = true;
            d
        };
        for name in ["a", "b"] {
            db.put(
                &device_key(&DeviceId::new(name).expect("id")),
                &device(name),
                0,
            )
            .await
            .expect("device");
        }
        // Read at once after the writes: no wait for the index's task.
        let now = index.current().await.expect("index");
        assert_eq!(now.devices.len(), 2);
        assert!(now.assessments.is_empty());
        let a = DeviceId::new("a").expect("id");
        let assessment = DeviceAssessment {
            device: a.clone(),
            finished_at: Timestamp::UNIX_EPOCH,
            received_at: Timestamp::UNIX_EPOCH,
            assessment: drover_model::model::PatchAssessment {
                upgradable: 1,
                security: 0,
                kept_back: 0,
                security_archive: true,
                reboot_pending: None,
                running_kernel: "6.1".into(),
                newest_kernel: None,
                pending: Vec::new(),
                omitted: 0,
            },
            security_since: Default::default(),
            reboot_since: None,
        };
        db.put(&drover_rules::patch::assessment_key(&a), &assessment, 0)
            .await
            .expect("assessment");
        let now = index.current().await.expect("index");
        assert_eq!(now.assessments[&a].assessment.upgradable, 1);
        // Decommissioned, then deleted.
        db.update::<DeviceRecord, _>(&device_key(&a), |d| {
            let mut d = d?;
            d.decommissioned = true;
            Some(d)
        })
        .await
        .expect("decommission");
        assert!(index.current().await.expect("index").devices[&a].decommissioned);
        let (revision, _) = db
            .get::<DeviceRecord>(&device_key(&a))
            .await
            .expect("get")
            .expect("a");
        db.commit(vec![drover_contract::kv::Op::Delete {
            key: device_key(&a),
            expected: revision,
        }])
        .await
        .expect("delete");
        assert!(
            !index
                .current()
                .await
                .expect("index")
                .devices
                .contains_key(&a)
        );
        // More changes than the feed holds: loaded again, none lost.
        let many = drover_store::store::CHANGE_FEED + 10;
        let mut ops = Vec::new();
        for i in 0..many {
            let d = device(&format!("n{i}"));
            ops.push(drover_contract::kv::Op::Put {
                key: device_key(&d.id),
                value: Db::encode(&d).expect("encode"),
                expected: 0,
            });
        }
        for chunk in ops.chunks(5000) {
            db.commit(chunk.to_vec()).await.expect("commit");
        }
        assert_eq!(
            index.current().await.expect("index").devices.len(),
            many + 1
        );
        shutdown.cancel();
        task.await.expect("task");
    }
}
