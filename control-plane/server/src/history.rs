//! Devices' histories in the store: the decided jobs of a run, deployment
//! or schedule being deleted are kept first (`drover_rules::history`
//! says what a record holds and what retention drops), then trimmed to
//! their retention per device, and each hour on every replica.

use drover_contract::kv::{KvError, Op};
use drover_model::{DeviceId, JobId};
use drover_rules::history::{
    HISTORY_PREFIX, HistoryRecord, Retention, device_history_prefix, history_key, record_of, trim,
};
use drover_rules::records::JobDelivery;
use drover_store::db::{Db, DbError};
use jiff::Timestamp;
use std::collections::BTreeMap;

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
    let mut by_device: BTreeMap<&DeviceId, Vec<HistoryRecord>> = BTreeMap::new();
    for job in jobs {
        if let Some(record) = record_of(job, now) {
            by_device
                .entry(&job.intent.device_id)
                .or_default()
                .push(record);
        }
    }
    let mut kept = 0;
    for (device, records) in by_device {
        let mut ops = Vec::with_capacity(records.len());
        for record in &records {
            ops.push(Op::Put {
                key: history_key(device, record.job),
                value: Db::encode(record)?,
                expected: 0,
            });
        }
        for result in db.commit(ops).await? {
            match result {
                Ok(_) => kept += 1,
                Err(KvError::Conflict { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        trim_device(db, device, retention, now).await?;
    }
    Ok(kept)
}

/// Applies `retention` to one device's history; how many records went.
async fn trim_device(
    db: &Db,
    device: &DeviceId,
    retention: Retention,
    now: Timestamp,
) -> Result<usize, DbError> {
    let history = db
        .list::<HistoryRecord>(&device_history_prefix(device))
        .await?;
    trim_listed(db, device, history, retention, now).await
}

async fn trim_listed(
    db: &Db,
    device: &DeviceId,
    history: Vec<(String, u64, HistoryRecord)>,
    retention: Retention,
    now: Timestamp,
) -> Result<usize, DbError> {
    let records: Vec<HistoryRecord> = history.iter().map(|(_, _, r)| r.clone()).collect();
    let trimmed = trim(&records, retention, now);
    if trimmed.is_empty() {
        return Ok(0);
    }
    let keys: Vec<String> = trimmed
        .delete
        .iter()
        .map(|job| history_key(device, *job))
        .collect();
    let deleted = db.delete_all(&keys).await?;
    let mut ops = Vec::new();
    for (key, revision, record) in &history {
        if trimmed.drop_report.contains(&record.job) {
            let mut record = record.clone();
            record.upgrade = None;
            ops.push(Op::Put {
                key: key.clone(),
                value: Db::encode(&record)?,
                expected: *revision,
            });
        }
    }
    if !ops.is_empty() {
        // A conflict is another replica trimming the same record: its
        // write does the same.
        for result in db.commit(ops).await? {
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
    let mut by_device: BTreeMap<String, Vec<(String, u64, HistoryRecord)>> = BTreeMap::new();
    for entry in db.list::<HistoryRecord>(HISTORY_PREFIX).await? {
        if let Some(device) = drover_rules::history::device_of_key(&entry.0) {
            by_device.entry(device.to_owned()).or_default().push(entry);
        }
    }
    let mut deleted = 0;
    for (device, history) in by_device {
        let Ok(device) = DeviceId::new(device) else {
            continue;
        };
        deleted += trim_listed(db, &device, history, retention, now).await?;
    }
    Ok(deleted)
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

/// Whether `job` is in `history` (a delete cut short leaves a job both
/// kept and still recorded; readers show it once).
pub fn contains(history: &[HistoryRecord], job: JobId) -> bool {
    history.iter().any(|r| r.job == job)
}
