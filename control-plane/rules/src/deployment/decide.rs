//! One pass over a deployment's targets: [`decide`], pure over (targets,
//! now) with the clock injected.

use super::*;

/// One pass over a deployment's targets at `now`:
///
/// - a succeeded attempt ends the target; a failed one, one running past
///   its timeout plus [`RUNNING_GRACE`], or one acknowledged and not started
///   that long after it could have started (`waiting_since`), returns the
///   target to pending after
///   the backoff while retries are left (each retry a new job), else ends it;
/// - a pending target is released when its backoff is over, its device is
///   online and inside its maintenance window, and fewer than
///   `max_concurrency` targets are queued or running;
/// - past the deadline, pending and queued targets expire, each queued job
///   canceled on its agent (it would never start there anyway: its intent
///   expires with the deployment, A3), and no attempt starts; running ones
///   finish or time out;
/// - once the targets that ended failed reach the spec's failure threshold,
///   the pass that counts them releases nothing and stops the rollout as an
///   operator's cancel does (pending targets end canceled, queued jobs are
///   canceled on their agents, running ones finish);
/// - with `max_releases_per_minute`, no more than that are released in any
///   60 seconds, counting the last minute's releases the record keeps.
pub fn decide(facts: &Facts<'_>, targets: &[TargetInput<'_>], now: Timestamp) -> Decision {
    let decision = pass(facts, targets, now);
    match facts.spec.failure_threshold {
        Some(threshold) if !facts.canceling && threshold.reached(&decision.counts) => {
            // Judged on the targets this pass ended; the same pass then
            // stops, so nothing is released once it is reached.
            let stopping = Facts {
                canceling: true,
                ..facts.clone()
            };
            Decision {
                threshold_reached: true,
                ..pass(&stopping, targets, now)
            }
        }
        _ => decision,
    }
}

fn pass(facts: &Facts<'_>, targets: &[TargetInput<'_>], now: Timestamp) -> Decision {
    let spec = facts.spec;
    let expired = now >= facts.deadline();
    let timeout = SignedDuration::from_secs(i64::from(JOB_TIMEOUT_SECONDS)) + RUNNING_GRACE;
    let mut decision = Decision::default();
    let mut active = 0u32;
    let mut pending = Vec::new();
    // The targets this pass changes, sparse: a pass costs what changed.
    let mut records: std::collections::BTreeMap<usize, TargetRecord> = Default::default();

    let observing = Observing {
        facts,
        now,
        expired,
        timeout,
    };
    for (index, target) in targets.iter().enumerate() {
        let record = target.record;
        if record.end.is_some() {
            continue;
        }
        let changed = observing.target(index, target, &mut decision, &mut active, &mut pending);
        if let Some(next) = changed
            && next != *record
        {
            records.insert(index, next);
        }
    }

    let window_open = now - RATE_WINDOW;
    let last_minute = || facts.recent_releases.iter().filter(|r| r.at > window_open);

    // Release in target order while there is room (a canceled deployment
    // has no pending targets left).
    for index in pending {
        if active >= spec.max_concurrency {
            break;
        }
        let target = &targets[index];
        let record = records
            .get(&index)
            .cloned()
            .unwrap_or_else(|| target.record.clone());
        // What every surface shows as its reason to wait holds it here.
        let device = DeviceNow {
            online: target.online,
            last_seen: None,
            time_zone: target.time_zone,
        };
        if wait_of(spec, &record, device, active, now).is_some() {
            continue;
        }
        let released = decision.released.len() as u32;
        if let Some(wait) = rate_wait(spec, facts.recent_releases, released, now) {
            decision.next_release_at = wait.until();
            break;
        }
        let mut next = record;
        next.attempt += 1;
        next.job = Some(attempt_job_id(facts.uid, &next.device, next.attempt));
        next.released_at = Some(now);
        next.running_since = None;
        next.next_attempt_at = None;
        records.insert(index, next);
        decision.released.push(index);
        active += 1;
    }

    if spec.max_releases_per_minute.is_some() && !decision.released.is_empty() {
        let mut kept: Vec<Releases> = last_minute().copied().collect();
        kept.push(Releases {
            at: now,
            count: decision.released.len() as u32,
        });
        // Too many batches: the oldest merge into the next, counted as
        // released later than they were (the limit holds all the same).
        while kept.len() > MAX_RELEASE_BATCHES {
            let oldest = kept.remove(0);
            kept[0].count += oldest.count;
        }
        decision.recent_releases = Some(kept);
    }

    let released_now: std::collections::HashSet<usize> =
        decision.released.iter().copied().collect();
    for (index, target) in targets.iter().enumerate() {
        let record = records.get(&index).unwrap_or(target.record);
        let counts = &mut decision.counts;
        // A target released in this pass has no job to observe yet.
        let job = match released_now.contains(&index) {
            true => None,
            false => target.job.as_ref(),
        };
        match TargetState::of(record, job, now) {
            TargetState::Succeeded => counts.succeeded += 1,
            TargetState::Failed => counts.failed += 1,
            TargetState::Expired => counts.expired += 1,
            TargetState::Canceled => counts.canceled += 1,
            TargetState::Pending => counts.pending += 1,
            TargetState::WaitingRetry => {
                counts.pending += 1;
                counts.waiting_retry += 1;
                if let Some(at) = record.next_attempt_at {
                    decision.next_retry_at = Some(
                        decision
                            .next_retry_at
                            .map_or(at, |earliest| earliest.min(at)),
                    );
                }
            }
            TargetState::Running => counts.running += 1,
            TargetState::Queued => counts.queued += 1,
        }
    }
    let c = &decision.counts;
    decision.finished = c.total() == c.succeeded + c.failed + c.expired + c.canceled;
    decision.changes = records.into_iter().collect();
    decision
}

/// What a pass knows while it observes each target.
struct Observing<'a> {
    facts: &'a Facts<'a>,
    now: Timestamp,
    /// The deployment's deadline has passed.
    expired: bool,
    /// How long a job may run, or wait acknowledged, before it fails.
    timeout: SignedDuration,
}

impl Observing<'_> {
    /// What became of one unfinished target since the last pass: its new
    /// record when it changes; a running or queued one counts as `active`,
    /// one not released yet joins `pending`.
    fn target(
        &self,
        index: usize,
        target: &TargetInput<'_>,
        decision: &mut Decision,
        active: &mut u32,
        pending: &mut Vec<usize>,
    ) -> Option<TargetRecord> {
        let Observing {
            facts,
            now,
            expired,
            timeout,
        } = *self;
        let spec = facts.spec;
        let record = target.record;
        let fail = |record: &mut TargetRecord, at: Timestamp, error: String| {
            record.last_error = Some(bounded(error, MAX_ERROR_BYTES));
            record.job = None;
            record.released_at = None;
            record.running_since = None;
            if record.attempt <= spec.retries && !expired && !facts.canceling {
                record.next_attempt_at = Some(at + backoff(spec, record.attempt));
            } else {
                record.end = Some(TargetEnd::Failed { at });
            }
        };
        // Cloned only when this target changes: a pass costs what changed.
        let mut changed: Option<TargetRecord> = None;
        match (&record.job, &target.job) {
            (Some(_), Some(Observed::Succeeded { at })) => {
                let next = changed.insert(record.clone());
                next.end = Some(TargetEnd::Succeeded { at: *at });
                next.next_attempt_at = None;
            }
            (Some(_), Some(Observed::Failed { at, error })) => {
                let next = changed.insert(record.clone());
                fail(next, *at, error.clone());
                decision.latest_error = latest_error(next);
            }
            (Some(_), Some(Observed::Canceled { at })) => {
                let next = changed.insert(record.clone());
                next.job = None;
                next.released_at = None;
                next.running_since = None;
                next.end = Some(TargetEnd::Canceled { at: *at });
                next.last_error = Some("canceled on the device before it started".into());
            }
            (Some(_), Some(Observed::Running)) if facts.canceling => {
                // A started job is never interrupted (A3); the order is sent
                // all the same, and its end decides the target.
                decision.cancel.push(index);
                if record.running_since.is_none() {
                    changed.insert(record.clone()).running_since = Some(now);
                }
                *active += 1;
            }
            (Some(_), Some(Observed::Running)) => match record.running_since {
                None => {
                    changed.insert(record.clone()).running_since = Some(now);
                    *active += 1;
                }
                Some(since) if now >= since + timeout => {
                    let error = timed_out(&format!(
                        "still running {}s after it started",
                        now.duration_since(since).as_secs()
                    ));
                    let next = changed.insert(record.clone());
                    fail(next, now, error);
                    decision.latest_error = latest_error(next);
                }
                Some(_) => *active += 1,
            },
            // Acknowledged, not started, and its clock ran out: the
            // device took it and never started it (the seed's job timeout,
            // counted from when it could have started).
            (Some(_), Some(Observed::Queued { acked: Some(_) }))
                if !expired
                    && !facts.canceling
                    && target
                        .waiting_since
                        .is_some_and(|since| now >= since + timeout) =>
            {
                let since = target.waiting_since.unwrap_or(now);
                let error = timed_out(&format!(
                    "acknowledged by the device and not started {}s after it could have",
                    now.duration_since(since).as_secs()
                ));
                let next = changed.insert(record.clone());
                fail(next, now, error);
                decision.latest_error = latest_error(next);
            }
            // Out and not started (or its record is not readable yet).
            (Some(_), Some(Observed::Queued { .. }) | None) => {
                if expired {
                    // The agent that holds it is told to cancel it, as an
                    // operator's cancel would: it would expire there too
                    // (its intent expires with the deployment), but only
                    // when it reached the head of the queue.
                    decision.cancel.push(index);
                    let next = changed.insert(record.clone());
                    next.job = None;
                    next.end = Some(TargetEnd::Expired { at: now });
                    next.last_error =
                        Some("the deployment expired before the device started the job".into());
                } else {
                    if facts.canceling {
                        decision.cancel.push(index);
                    }
                    *active += 1;
                }
            }
            (None, _) => {
                if facts.canceling {
                    let next = changed.insert(record.clone());
                    next.end = Some(TargetEnd::Canceled { at: now });
                    next.next_attempt_at = None;
                    next.last_error = Some(record.last_error.clone().unwrap_or_else(|| {
                        "canceled by an operator before it was released".into()
                    }));
                } else if expired {
                    let next = changed.insert(record.clone());
                    next.end = Some(TargetEnd::Expired { at: now });
                    next.last_error =
                        Some(record.last_error.clone().unwrap_or_else(|| {
                            "the deployment expired before it was released".into()
                        }));
                } else {
                    pending.push(index);
                }
            }
        }
        changed
    }
}

/// A target's error as the deployment's latest: prefixed with its device.
fn latest_error(target: &TargetRecord) -> Option<String> {
    target
        .last_error
        .as_ref()
        .map(|e| bounded(format!("{}: {e}", target.device), MAX_ERROR_BYTES))
}

/// A timed-out attempt's error: what it was doing, and the limit.
fn timed_out(doing: &str) -> String {
    format!(
        "timed out: {doing} (job timeout {JOB_TIMEOUT_SECONDS}s + {}s)",
        RUNNING_GRACE.as_secs()
    )
}
