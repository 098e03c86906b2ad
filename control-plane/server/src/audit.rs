//! The audit log's entries (`audit/TIME-REPLICA-N`, create-only): written
//! by the API's gate (`api::access`) for every change and refusal, and by
//! the engine for what it does on its own (a schedule's runs).

use drover_rules::records::AuditRecord;
use drover_store::db::Db;
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

/// The longest request line (method and path) an entry keeps, in
/// characters; a longer one is cut and says how much was cut.
pub const REQUEST_CHARS: usize = 256;
/// The longest reason an entry keeps, in characters.
pub const REASON_CHARS: usize = 512;
/// The longest name (of a caller, kind, object, verb, replica or address)
/// an entry keeps, in characters.
pub const NAME_CHARS: usize = 253;

/// The longest name of an object among an entry's objects (a manifest's
/// name or a device id is at most 63), in characters.
pub const OBJECT_NAME_CHARS: usize = 128;
/// The longest kind or result of an object, in characters.
pub const WORD_CHARS: usize = 32;

/// Cuts `text` to `max` characters, saying how many were cut.
fn clip(text: &mut String, max: usize) {
    let Some((cut, _)) = text.char_indices().nth(max) else {
        return;
    };
    let more = text[cut..].chars().count();
    text.truncate(cut);
    text.push_str(&format!("… ({more} more characters)"));
}

fn clip_opt(text: &mut Option<String>, max: usize) {
    if let Some(text) = text {
        clip(text, max);
    }
}

/// The entry as it is stored: every field a caller can make long cut to
/// its bound, at most [`AUDIT_OBJECTS`](drover_rules::records::AUDIT_OBJECTS)
/// objects, so no entry exceeds [`MAX_ENTRY_BYTES`].
pub fn bounded(mut entry: AuditRecord) -> AuditRecord {
    for name in [
        &mut entry.who,
        &mut entry.via,
        &mut entry.verb,
        &mut entry.outcome,
        &mut entry.replica,
    ] {
        clip(name, NAME_CHARS);
    }
    clip_opt(&mut entry.peer, NAME_CHARS);
    clip_opt(&mut entry.kind, NAME_CHARS);
    clip_opt(&mut entry.name, NAME_CHARS);
    clip_opt(&mut entry.body_digest, 64);
    clip_opt(&mut entry.request, REQUEST_CHARS);
    clip_opt(&mut entry.reason, REASON_CHARS);
    entry.objects.truncate(drover_rules::records::AUDIT_OBJECTS);
    for object in &mut entry.objects {
        clip(&mut object.kind, WORD_CHARS);
        clip(&mut object.name, OBJECT_NAME_CHARS);
        clip_opt(&mut object.result, WORD_CHARS);
        clip_opt(&mut object.digest, 64);
    }
    entry
}

/// The most bytes one entry can take as JSON (the API's answer; postcard
/// in the store is smaller), every field at its bound, every character
/// four bytes: measured by the test
/// `an_entry_at_every_bound_fits_max_entry_bytes`, stated in
/// docs/internals/security.md.
pub const MAX_ENTRY_BYTES: usize = 128 * 1024;
/// The most bytes one stored entry without objects (every refusal and
/// login) can take.
pub const MAX_REFUSAL_BYTES: usize = 12 * 1024;

/// How many entries of each sort one caller may add, per replica: a burst,
/// then so many an hour (a token bucket).
#[derive(Debug, Clone, Copy)]
pub struct Allowance {
    pub burst: u32,
    pub per_hour: u32,
}

/// Changes one operator may make, each one entry: beyond it a change is
/// refused (429) before it is made, never made unrecorded.
pub const CHANGES: Allowance = Allowance {
    burst: 600,
    per_hour: 1200,
};
/// Refused and failed requests recorded for one operator (by role, CSRF,
/// a revoked token of theirs, a 4xx or 5xx answer), and, all together, for
/// callers with no valid credential: those beyond are counted and told in
/// the next entry written.
pub const REFUSALS: Allowance = Allowance {
    burst: 30,
    per_hour: 30,
};
/// Dashboard logins one operator may make, each one entry.
pub const LOGINS: Allowance = Allowance {
    burst: 30,
    per_hour: 60,
};
/// Budgets remembered at once (the oldest full ones are forgotten first;
/// a key is only ever a verified operator's name).
const BUDGETS_KEPT: usize = 10_000;

/// The sorts of entries a budget counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sort {
    Change,
    Refusal,
    Login,
}

impl Sort {
    pub fn allowance(self) -> Allowance {
        match self {
            Sort::Change => CHANGES,
            Sort::Refusal => REFUSALS,
            Sort::Login => LOGINS,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Level {
    left: f64,
    at: std::time::Instant,
    skipped: u64,
}

impl Level {
    fn refill(&mut self, allowance: Allowance, now: std::time::Instant) {
        let back = now.saturating_duration_since(self.at).as_secs_f64()
            * f64::from(allowance.per_hour)
            / 3600.0;
        self.left = (self.left + back).min(f64::from(allowance.burst));
        self.at = now;
    }
}

/// What each caller may still add to the audit log ([`CHANGES`],
/// [`REFUSALS`], [`LOGINS`] per operator; [`REFUSALS`] for all callers
/// without a valid credential together); one per replica, in memory.
#[derive(Default)]
pub struct AuditBudgets {
    /// A std Mutex: held only to count, never across an await. Keyed by
    /// sort and operator name; `""` is every caller without a credential.
    levels: std::sync::Mutex<std::collections::HashMap<(Sort, String), Level>>,
}

impl AuditBudgets {
    /// One more entry of `sort` for `operator` (`None`: a caller without a
    /// valid credential): how many were not recorded before it, or how
    /// long until one is allowed.
    pub fn take(
        &self,
        sort: Sort,
        operator: Option<&str>,
        now: std::time::Instant,
    ) -> Result<u64, std::time::Duration> {
        let allowance = sort.allowance();
        let key = (sort, operator.unwrap_or_default().to_owned());
        let mut levels = self.levels.lock().unwrap_or_else(|e| e.into_inner());
        if levels.len() >= BUDGETS_KEPT && !levels.contains_key(&key) {
            levels.retain(|(sort, _), level| {
                let mut level = *level;
                level.refill(sort.allowance(), now);
                level.left < f64::from(sort.allowance().burst) || level.skipped > 0
            });
            if levels.len() >= BUDGETS_KEPT
                && let Some(oldest) = levels
                    .iter()
                    .min_by_key(|(_, level)| level.at)
                    .map(|(key, _)| key.clone())
            {
                levels.remove(&oldest);
            }
        }
        let level = levels.entry(key).or_insert(Level {
            left: f64::from(allowance.burst),
            at: now,
            skipped: 0,
        });
        level.refill(allowance, now);
        if level.left < 1.0 {
            level.skipped += 1;
            let wait = (1.0 - level.left) * 3600.0 / f64::from(allowance.per_hour.max(1));
            return Err(std::time::Duration::from_secs_f64(wait));
        }
        level.left -= 1.0;
        Ok(std::mem::take(&mut level.skipped))
    }
}

/// Writes one entry, [`bounded`]. A store that refuses it is logged (the
/// change it tells of is already done).
pub async fn write(db: &Db, entry: AuditRecord) {
    let entry = bounded(entry);
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
) -> Result<usize, drover_store::db::DbError> {
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
    use drover_rules::records::{AUDIT_OBJECTS, AuditObject};
    use std::time::{Duration, Instant};

    /// Every field as long as a caller could make it, of four-byte characters.
    fn huge_entry() -> AuditRecord {
        let long = "\u{1F600}".repeat(40_000);
        let object = AuditObject {
            kind: long.clone(),
            name: long.clone(),
            result: Some(long.clone()),
            digest: Some(long.clone()),
        };
        AuditRecord {
            at: Timestamp::now(),
            who: long.clone(),
            role: Some(drover_rules::records::Role::Admin),
            via: long.clone(),
            peer: Some(long.clone()),
            verb: long.clone(),
            kind: Some(long.clone()),
            name: Some(long.clone()),
            request: Some(long.clone()),
            body_digest: Some(long.clone()),
            objects: vec![object; AUDIT_OBJECTS * 3],
            objects_total: u64::MAX,
            outcome: long.clone(),
            status: u16::MAX,
            reason: Some(long.clone()),
            replica: long,
        }
    }

    #[test]
    fn an_entry_at_every_bound_fits_max_entry_bytes() {
        let entry = bounded(huge_entry());
        assert_eq!(entry.objects.len(), AUDIT_OBJECTS);
        let request = entry.request.as_deref().expect("request");
        assert!(
            request.ends_with("… (39744 more characters)"),
            "says what was cut: {}",
            &request[request.len() - 40..]
        );
        let stored = serde_json::to_vec(&entry).expect("json").len();
        eprintln!("largest entry: {stored} bytes (bound {MAX_ENTRY_BYTES})");
        assert!(stored <= MAX_ENTRY_BYTES, "{stored} > {MAX_ENTRY_BYTES}");
        // A refusal lists no objects: the bound a viewer can reach.
        let mut refusal = huge_entry();
        refusal.objects.clear();
        let stored = serde_json::to_vec(&bounded(refusal)).expect("json").len();
        eprintln!("largest entry without objects: {stored} bytes (bound {MAX_REFUSAL_BYTES})");
        assert!(
            stored <= MAX_REFUSAL_BYTES,
            "{stored} > {MAX_REFUSAL_BYTES}"
        );
        // An entry within every bound is stored as it is.
        let small = AuditRecord {
            at: Timestamp::now(),
            who: "operator/otto".into(),
            role: Some(drover_rules::records::Role::Operator),
            via: "cli".into(),
            peer: Some("127.0.0.1".into()),
            verb: "apply".into(),
            kind: None,
            name: None,
            request: Some(format!("POST /{}", "a".repeat(REQUEST_CHARS - 6))),
            body_digest: Some("0".repeat(64)),
            objects: vec![
                AuditObject {
                    kind: "Device".into(),
                    name: "d".repeat(OBJECT_NAME_CHARS),
                    result: Some("created".into()),
                    digest: None,
                };
                AUDIT_OBJECTS
            ],
            objects_total: AUDIT_OBJECTS as u64,
            outcome: "applied".into(),
            status: 200,
            reason: None,
            replica: "r1".into(),
        };
        assert_eq!(bounded(small.clone()), small);
    }

    #[test]
    fn each_operator_has_budgets_of_its_own_and_strangers_share_one() {
        let budgets = AuditBudgets::default();
        let start = Instant::now();
        for _ in 0..REFUSALS.burst {
            assert_eq!(budgets.take(Sort::Refusal, None, start), Ok(0));
        }
        assert!(
            budgets.take(Sort::Refusal, None, start).is_err(),
            "strangers' burst used"
        );
        assert!(budgets.take(Sort::Refusal, None, start).is_err());
        // Strangers spending theirs leaves an operator's whole.
        assert_eq!(budgets.take(Sort::Refusal, Some("vera"), start), Ok(0));
        // Two minutes give one back, which tells of the two skipped.
        let later = start + Duration::from_secs(120);
        assert_eq!(budgets.take(Sort::Refusal, None, later), Ok(2));
        // Changes: the burst, then one per 3 s (1,200 an hour).
        for _ in 0..CHANGES.burst {
            budgets
                .take(Sort::Change, Some("otto"), start)
                .expect("within the burst");
        }
        let wait = budgets
            .take(Sort::Change, Some("otto"), start)
            .expect_err("over the burst");
        assert_eq!(wait, Duration::from_secs(3));
        assert!(
            budgets
                .take(Sort::Change, Some("otto"), start + Duration::from_secs(3))
                .is_ok()
        );
        assert!(
            budgets.take(Sort::Change, Some("ana"), start).is_ok(),
            "another operator's own"
        );
    }

    #[tokio::test]
    async fn entries_past_their_retention_are_deleted_and_the_rest_kept() {
        let db = Db::new(std::sync::Arc::new(
            drover_store::store::mem::MemKv::default(),
        ));
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
