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
