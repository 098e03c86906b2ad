//! The audit log's entries (`audit/TIME-REPLICA-N`, create-only): written
//! by the API's gate (`api::access`) for every change and refusal, and by
//! the engine for what it does on its own (a schedule's runs).

use crate::db::Db;
use crate::records::AuditRecord;
use jiff::Timestamp;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where audit entries are kept.
pub const AUDIT_PREFIX: &str = "audit/";

/// Unique keys for this process's entries, in time order.
static SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// The key of an entry at `at` written by `replica`: time first, so a
/// listing is in time order on every replica.
fn key(at: Timestamp, replica: &str) -> String {
    let nanos = at.as_nanosecond().max(0);
    let n = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    format!("{AUDIT_PREFIX}{nanos:020}-{replica}-{n:08}")
}

/// Writes one entry. A store that refuses it is logged (the change it
/// tells of is already done).
pub async fn write(db: &Db, entry: AuditRecord) {
    let key = key(entry.at, &entry.replica);
    if let Err(e) = db.put(&key, &entry, 0).await {
        tracing::error!(error = %e, verb = %entry.verb, who = %entry.who, "cannot write the audit log");
    }
}

/// Deletes the entries older than `retention` at `now`; how many.
pub async fn prune_once(
    db: &Db,
    retention: std::time::Duration,
    now: Timestamp,
) -> Result<usize, crate::db::DbError> {
    let cutoff = now
        .checked_sub(jiff::SignedDuration::try_from(retention).unwrap_or_default())
        .unwrap_or(Timestamp::MIN);
    let cutoff = format!("{AUDIT_PREFIX}{:020}", cutoff.as_nanosecond().max(0));
    let old: Vec<String> = db
        .list::<AuditRecord>(AUDIT_PREFIX)
        .await?
        .into_iter()
        .map(|(key, _, _)| key)
        .filter(|key| key.as_str() < cutoff.as_str())
        .collect();
    if old.is_empty() {
        return Ok(0);
    }
    db.delete_all(&old).await
}

/// Deletes entries past their retention each hour, on every replica (a
/// delete another replica made first is no error), until `shutdown`.
pub async fn prune(
    db: Db,
    retention: std::time::Duration,
    shutdown: tokio_util::sync::CancellationToken,
) {
    loop {
        match prune_once(&db, retention, Timestamp::now()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "audit entries past their retention deleted"),
            Err(e) => tracing::warn!(error = %e, "cannot prune the audit log"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(std::time::Duration::from_secs(3600)) => {}
        }
    }
}

/// A run a schedule created (`who`: `schedule/NAME`, via the control plane).
pub async fn scheduled_run(db: &Db, replica: &str, schedule: &str, run: &str, at: Timestamp) {
    let entry = AuditRecord {
        at,
        who: format!("schedule/{schedule}"),
        role: None,
        via: "control-plane".to_owned(),
        peer: None,
        verb: "create".to_owned(),
        kind: Some("TaskRun".to_owned()),
        name: Some(run.to_owned()),
        request: None,
        body_digest: None,
        objects: Vec::new(),
        objects_total: 0,
        outcome: "applied".to_owned(),
        status: 0,
        reason: None,
        replica: replica.to_owned(),
    };
    write(db, entry).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn entries_past_their_retention_are_deleted_and_the_rest_kept() {
        let db = Db::new(std::sync::Arc::new(crate::store::mem::MemKv::default()));
        let now: Timestamp = "2026-12-04T12:00:00Z".parse().expect("time");
        let day = jiff::SignedDuration::from_hours(24);
        for days in [400, 2, 0] {
            let at = now.checked_sub(day * days).expect("time");
            scheduled_run(&db, "r1", "nightly", &format!("run-{days}"), at).await;
        }
        let retention = std::time::Duration::from_secs(30 * 86_400);
        assert_eq!(prune_once(&db, retention, now).await.expect("prune"), 1);
        let left: Vec<String> = db
            .list::<AuditRecord>(AUDIT_PREFIX)
            .await
            .expect("list")
            .into_iter()
            .filter_map(|(_, _, e)| e.name)
            .collect();
        assert_eq!(left, vec!["run-2", "run-0"], "in time order");
        assert_eq!(prune_once(&db, retention, now).await.expect("again"), 0);
    }
}
