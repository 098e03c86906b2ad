//! What a deployment's pass writes in its one commit, and how the
//! commit's results are read back into the views.

use super::*;

/// Reads a pass's commit results in the order `pass_ops` wrote them (the
/// released jobs, the changed targets, the added ones, then the record)
/// into the views. Returns the released jobs' keys, and whether another
/// writer changed a target or the record first.
pub(super) fn apply_pass_results(
    views: &mut super::views::DeploymentViews,
    name: &str,
    results: drover_contract::kv::OpResults,
    job_keys: Vec<String>,
    changes: Vec<(usize, TargetRecord)>,
    adds: Vec<(TargetRecord, Option<Timestamp>)>,
) -> Result<(Vec<String>, bool), DbError> {
    let mut results = results.into_iter();
    let mut released_keys = Vec::new();
    for key in job_keys {
        match results.next() {
            Some(Ok(_)) => released_keys.push(key),
            // Released already (by a pass whose lease ran out, or before
            // a crash): the delivery core has it from the store; sending
            // it again would deliver it twice.
            Some(Err(e)) if e.is_conflict() => {}
            Some(Err(e)) => return Err(e.into()),
            None => break,
        }
    }
    let mut stale = false;
    for (index, target) in changes {
        match results.next() {
            Some(Ok(revision)) => views.set_target(name, index, target, revision),
            Some(Err(e)) if e.is_conflict() => stale = true,
            Some(Err(e)) => return Err(e.into()),
            None => break,
        }
    }
    for (target, seen) in adds {
        match results.next() {
            Some(Ok(revision)) => {
                views.add_target(name, target, revision, seen);
            }
            Some(Err(e)) if e.is_conflict() => stale = true,
            Some(Err(e)) => return Err(e.into()),
            None => break,
        }
    }
    match results.next() {
        Some(Ok(revision)) => {
            if let Some(view) = views.by_name.get_mut(name) {
                view.routed = view.routed.max(revision);
            }
        }
        // The lease ran out and another replica went on.
        Some(Err(e)) if e.is_conflict() => stale = true,
        Some(Err(e)) => return Err(e.into()),
        None => {}
    }
    Ok((released_keys, stale))
}

/// One pass's writes, in one commit: the jobs released first, then the
/// targets that name them (a crash in between leaves a job the next pass
/// releases again under the same id), the new targets, and last the
/// deployment's record with `status`, under the lease (`leased`): it fails
/// only if the lease was lost, and then the next pass starts from the
/// store again. Also the released jobs' keys, in the order of their writes.
pub(super) fn pass_ops(
    record: DeploymentRecord,
    status: DeploymentStatus,
    leased: u64,
    decision: &Decision,
    adds: &[(TargetRecord, Option<Timestamp>)],
    view: &DeploymentView,
    now: Timestamp,
) -> Result<(Vec<Op>, Vec<String>), DbError> {
    let name = record.name.clone();
    let mut ops = Vec::new();
    let mut job_keys = Vec::new();
    for &index in &decision.released {
        // `decide` lists every released target among the changes, with
        // its job: one that is not is skipped, never released half-made.
        let Some((target, job_id)) = decision
            .changes
            .iter()
            .find(|(i, _)| *i == index)
            .and_then(|(_, t)| Some((t, t.job?)))
        else {
            continue;
        };
        let job = JobDelivery {
            intent: Intent {
                job_id,
                device_id: target.device.clone(),
                kind: record.spec.job.kind(),
                attempt: target.attempt,
                created_at: now,
                expires_at: record.facts().deadline(),
                timeout_seconds: deployment::JOB_TIMEOUT_SECONDS,
            },
            run: Some(drover_rules::records::deployment_run(&name)),
            delivery: Delivery::Created,
            status: None,
            created_at: now,
            terminal_received_at: None,
            cancel_requested_at: None,
        };
        let key = job_key(&target.device, job_id);
        ops.push(Op::Put {
            key: key.clone(),
            value: Db::encode(&job)?,
            expected: 0,
        });
        job_keys.push(key);
    }
    for (index, target) in &decision.changes {
        ops.push(Op::Put {
            key: target_key(record.uid, &target.device),
            value: Db::encode(target)?,
            expected: view.revisions[*index],
        });
    }
    for (target, _) in adds {
        ops.push(Op::Put {
            key: target_key(record.uid, &target.device),
            value: Db::encode(target)?,
            expected: 0,
        });
    }
    let mut done = record;
    done.status = status;
    ops.push(Op::Put {
        key: deployment_key(&name),
        value: Db::encode(&done)?,
        expected: leased,
    });
    Ok((ops, job_keys))
}
