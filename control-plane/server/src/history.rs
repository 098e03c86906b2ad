//! Devices' histories in the store: the decided jobs of a run, deployment
//! or schedule being deleted are kept first (`drover_rules::history`
//! says what a record holds and what retention drops), then trimmed to
//! their retention per device, and each hour on every replica.

use drover_contract::kv::{KvError, Op};
use drover_model::DeviceId;
use drover_rules::history::{
    HISTORY_PREFIX, HistoryRecord, Retention, device_history_prefix, history_key, record_of, trim,
};
use drover_rules::records::JobDelivery;
use drover_store::db::{Db, DbError};
use jiff::Timestamp;
use std::collections::BTreeMap;

/// One device's history as listed: key, revision, record.
type Listed = Vec<(String, u64, HistoryRecord)>;

/// Writes per commit: a run of 10,000 targets is kept in 20 commits, not
/// 10,000 (each commit is an fsync).
const CHUNK: usize = 500;

/// Keeps the decided jobs among `jobs` in their devices' histories (a job
/// kept before, by a delete cut short and run again, stays as it was),
/// then trims each of those devices' histories. Durable before the
/// caller deletes the jobs' records. How many were kept.
pub async fn archive(
    db: &Db,
    jobs: &[JobDelivery],
    retention: Retention,
    now: Timestamp,
) -> Result<usize, DbError> {
    let mut ops = Vec::new();
    let mut devices: std::collections::BTreeSet<&DeviceId> = Default::default();
    for job in jobs {
        if let Some(record) = record_of(job, now) {
            let device = &job.intent.device_id;
            devices.insert(device);
            ops.push(Op::Put {
                key: history_key(device, record.job),
                value: Db::encode(&record)?,
                expected: 0,
            });
        }
    }
    let mut kept = 0;
    for chunk in ops.chunks(CHUNK) {
        for result in db.commit(chunk.to_vec()).await? {
            match result {
                Ok(_) => kept += 1,
                Err(KvError::Conflict { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    let mut listed = Vec::with_capacity(devices.len());
    for device in devices {
        let history = db
            .list::<HistoryRecord>(&device_history_prefix(device))
            .await?;
        listed.push((device.clone(), history));
    }
    apply_trims(db, listed, retention, now).await?;
    Ok(kept)
}

/// Applies `retention` to each listed device's history at once: one
/// delete of everything past it, reports dropped in chunked commits. How
/// many records went.
async fn apply_trims(
    db: &Db,
    listed: Vec<(DeviceId, Listed)>,
    retention: Retention,
    now: Timestamp,
) -> Result<usize, DbError> {
    let mut deletes = Vec::new();
    let mut rewrites = Vec::new();
    for (device, history) in listed {
        let records: Vec<HistoryRecord> = history.iter().map(|(_, _, r)| r.clone()).collect();
        let trimmed = trim(&records, retention, now);
        deletes.extend(trimmed.delete.iter().map(|job| history_key(&device, *job)));
        for (key, revision, record) in &history {
            if trimmed.drop_report.contains(&record.job) {
                let mut record = record.clone();
                record.upgrade = None;
                rewrites.push(Op::Put {
                    key: key.clone(),
                    value: Db::encode(&record)?,
                    expected: *revision,
                });
            }
        }
    }
    let deleted = db.delete_all(&deletes).await?;
    for chunk in rewrites.chunks(CHUNK) {
        // A conflict is another replica trimming the same record: its
        // write does the same.
        for result in db.commit(chunk.to_vec()).await? {
            if let Err(e) = result
                && !matches!(e, KvError::Conflict { .. })
            {
                return Err(e.into());
            }
        }
    }
    Ok(deleted)
}

/// One device's history, newest first.
pub async fn of_device(db: &Db, device: &DeviceId) -> Result<Vec<HistoryRecord>, DbError> {
    let mut history: Vec<HistoryRecord> = db
        .list::<HistoryRecord>(&device_history_prefix(device))
        .await?
        .into_iter()
        .map(|(_, _, record)| record)
        .collect();
    history.sort_by(|a, b| b.ended_at().cmp(&a.ended_at()).then(b.job.cmp(&a.job)));
    Ok(history)
}

/// Applies `retention` to every device's history at `now`; how many
/// records went.
pub async fn prune_once(db: &Db, retention: Retention, now: Timestamp) -> Result<usize, DbError> {
    let mut by_device: BTreeMap<String, Listed> = BTreeMap::new();
    for entry in db.list::<HistoryRecord>(HISTORY_PREFIX).await? {
        if let Some(device) = drover_rules::history::device_of_key(&entry.0) {
            by_device.entry(device.to_owned()).or_default().push(entry);
        }
    }
    let listed = by_device
        .into_iter()
        .filter_map(|(device, history)| Some((DeviceId::new(device).ok()?, history)))
        .collect();
    apply_trims(db, listed, retention, now).await
}

/// Trims every device's history each hour, on every replica (what
/// another replica deleted first is no error), until `shutdown`: a
/// history gains records only when jobs are deleted, so its age limit
/// needs this sweep.
pub async fn prune(db: Db, retention: Retention, shutdown: tokio_util::sync::CancellationToken) {
    loop {
        match prune_once(&db, retention, Timestamp::now()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "device history past its retention deleted"),
            Err(e) => tracing::warn!(error = %e, "cannot prune the devices' history"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(std::time::Duration::from_secs(3600)) => {}
        }
    }
}
