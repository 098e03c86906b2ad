//! The delivery core's way in: inbound events applied to the store in
//! batches that share one commit, and statuses.

use super::*;

impl Dispatcher {
    /// Applies a batch of inbound events in as few commits as it takes.
    pub(super) async fn handle(&mut self, batch: Vec<Event>) {
        let mut pending = batch;
        let started = std::time::Instant::now();
        let mut round = 0;
        let mut pause = Duration::from_millis(100);
        loop {
            let mut work = Work::default();
            for event in pending {
                self.apply(event, &mut work).await;
            }
            round += 1;
            pending = self.commit(work, round >= ROUNDS).await;
            if pending.is_empty() {
                break;
            }
            if round < ROUNDS {
                debug!(
                    events = pending.len(),
                    "events lost a revision race; applying them again"
                );
                continue;
            }
            // Past the quick rounds only events nobody waits on are left
            // (an agent with a reply resends its own): the store is failing
            // (a cluster electing a leader, say). Keep them, and try again.
            if started.elapsed() >= STORE_RETRY {
                error!(
                    events = pending.len(),
                    "the store failed for {STORE_RETRY:?}; these statuses wait for the next restart, which reads them again"
                );
                break;
            }
            warn!(
                events = pending.len(),
                "cannot commit what the broker handed over; trying again in {pause:?}"
            );
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
        }
        self.start_queued();
    }

    /// Commits a batch's writes, then answers its events and runs their
    /// effects. Returns the events to apply again (their keys lost a race).
    pub(super) async fn commit(&mut self, work: Work, last_round: bool) -> Vec<Event> {
        let (ops, written) = writes_of(&work);
        let results = if ops.is_empty() {
            Ok(Vec::new())
        } else {
            self.db.commit(ops).await
        };
        let results = match results {
            Ok(results) => results,
            Err(e) => {
                warn!(error = %e, "cannot commit what agents reported; agents send it again, what a broker handed over is tried again");
                let mut again = Vec::new();
                for outcome in work.outcomes {
                    let awaited = outcome.reply.as_ref().is_some_and(Reply::is_awaited);
                    match (outcome.reply, outcome.retry) {
                        (Some(reply), _) if awaited => reply.send(Answer::Failed(e.to_string())),
                        (reply, Some(mut event)) => {
                            put_reply(&mut event, reply);
                            again.push(event);
                        }
                        (_, None) => {}
                    }
                }
                return again;
            }
        };
        let mut lost: HashSet<String> = HashSet::new();
        for ((key, job, device), result) in written.into_iter().zip(&results) {
            match result {
                Ok(revision) => {
                    if let Some(job) = job {
                        let was_open = self.open.get(&key).map(|o| o.delivery.clone());
                        if let Some(open) = self.open.get_mut(&key) {
                            observe_commit(open, &job);
                        }
                        if self.track(&key, *revision, &job)
                            && let (Some(open), Some(delivery)) =
                                (self.open.get_mut(&key), was_open)
                            && matches!(job.delivery, Delivery::Created)
                        {
                            // The in-memory state (sent, acked) is ahead of the stored one.
                            open.delivery = delivery;
                        }
                    }
                    if let Some((id, record)) = device {
                        self.devices.insert(id, (*revision, record));
                    }
                }
                Err(e) if e.is_conflict() => {
                    if let Some((id, _)) = device {
                        self.devices.remove(&id);
                    }
                    lost.insert(key);
                }
                Err(e) => {
                    warn!(key, error = %e, "a write was not applied");
                    lost.insert(key);
                }
            }
        }
        // A broker's cursor moves only past a batch committed whole: on a
        // store that commits op by op (NATS), a status whose write failed
        // must not be skipped by the next start.
        if lost.is_empty() {
            self.commit_cursors(&work.cursors).await;
        }
        for transport in work.caught_up {
            if self.behind.remove(&transport) && self.behind.is_empty() {
                info!("every broker's backlog of statuses is committed");
                self.caught_up.send_replace(true);
            }
        }
        let mut again = Vec::new();
        for outcome in work.outcomes {
            let raced = outcome.keys.iter().any(|k| lost.contains(k));
            // An event nobody waits on is never dropped for a lost race or a
            // failed write: it is applied again (see `handle`).
            let awaited = outcome.reply.as_ref().is_some_and(Reply::is_awaited);
            if raced
                && (!last_round || !awaited)
                && let Some(mut event) = outcome.retry
            {
                put_reply(&mut event, outcome.reply);
                again.push(event);
                continue;
            }
            if let Some(reply) = outcome.reply {
                if raced {
                    reply.send(Answer::Failed("the record kept changing; try again".into()));
                } else {
                    reply.send(outcome.answer);
                }
            }
            if !raced {
                for (key, effect) in outcome.effects {
                    self.effect(key, effect);
                }
            }
        }
        again
    }

    pub(super) async fn apply(&mut self, mut event: Event, work: &mut Work) {
        let transport = event.transport;
        let reply = take_reply(&mut event);
        let outcome = match &event.inbound {
            Inbound::Status {
                device,
                status,
                received_at,
                position,
                ..
            } => {
                if let Some(position) = position {
                    let cursor = work.cursors.entry(transport).or_insert(0);
                    *cursor = (*cursor).max(*position);
                }
                self.status(device, status, *received_at, work).await
            }
            Inbound::Ack { device, job_id } => {
                let key = job_key(device, *job_id);
                if let Some(job) = self.open.get_mut(&key) {
                    let (delivery, _) = delivery::step(
                        &job.facts(),
                        &DeliveryEvent::Ack {
                            at: self.clock.now(),
                        },
                    );
                    job.delivery = delivery;
                }
                self.store_acked(&key, work)
                    .await
                    .map(|keys| (Answer::Stored, keys, Vec::new()))
            }
            Inbound::Hello { device, hello, .. } => {
                self.hello(transport, device, hello, work).await
            }
            Inbound::Heartbeat {
                device, heartbeat, ..
            } => self.heartbeat(transport, device, heartbeat, work).await,
            Inbound::Gone { device } => {
                self.presence.update(device, |live| {
                    let live = live?;
                    (live.transport == transport).then(|| Live {
                        connected: false,
                        ..live.clone()
                    })
                });
                Ok((Answer::Stored, Vec::new(), Vec::new()))
            }
            Inbound::CaughtUp => {
                work.caught_up.push(transport);
                Ok((Answer::Stored, Vec::new(), Vec::new()))
            }
            Inbound::Resend => {
                let effects = self.resend(transport).await;
                Ok((Answer::Stored, Vec::new(), effects))
            }
        };
        let (answer, keys, effects) = match outcome {
            Ok(outcome) => outcome,
            Err(e) => (Answer::Failed(e.to_string()), Vec::new(), Vec::new()),
        };
        let retry = (!keys.is_empty()).then_some(event);
        work.outcomes.push(EventOutcome {
            reply,
            answer,
            keys,
            effects,
            retry,
        });
    }

    /// A finished assessment's findings become the device's latest
    /// assessment, unless a newer one is kept; returns the key written.
    async fn assessed(
        &self,
        device: &DeviceId,
        status: &JobStatus,
        received_at: Timestamp,
        work: &mut Work,
    ) -> Result<Vec<String>, DbError> {
        let (Some(drover_model::JobOutput::Assessment(assessment)), Some(finished_at)) =
            (&status.output, status.finished_at)
        else {
            return Ok(Vec::new());
        };
        if status.state != drover_model::JobState::Succeeded {
            return Ok(Vec::new());
        }
        if let Err(why) = assessment.check() {
            warn!(device = %device, job_id = %status.job_id, "an assessment beyond the protocol's bounds is not kept: {why}");
            return Ok(Vec::new());
        }
        let key = drover_rules::patch::assessment_key(device);
        let (expected, previous) = match work.assessments.get(&key) {
            Some((expected, previous)) => (*expected, Some(previous.clone())),
            None => match self
                .db
                .get::<drover_rules::patch::DeviceAssessment>(&key)
                .await?
            {
                Some((revision, previous)) => (revision, Some(previous)),
                None => (0, None),
            },
        };
        let Some(next) = drover_rules::patch::next(
            previous.as_ref(),
            device,
            assessment.clone(),
            finished_at,
            received_at,
        ) else {
            return Ok(Vec::new());
        };
        work.assessments.insert(key.clone(), (expected, next));
        Ok(vec![key])
    }

    /// The current record of a job: this batch's pending write, else the store.
    /// Stores that an open job was acknowledged (by an ack or a hello
    /// that holds it) unless its record already says so, so the API shows
    /// it acked, not created, before any status arrives; written with the
    /// batch's commit, and nothing when its status came in the same batch.
    pub(super) async fn store_acked(
        &mut self,
        key: &str,
        work: &mut Work,
    ) -> Result<Vec<String>, DbError> {
        let Some(Delivery::Acked { at }) = self.open.get(key).map(|o| o.delivery.clone()) else {
            return Ok(Vec::new());
        };
        let Some((expected, mut job)) = self.job_record(key, work).await? else {
            return Ok(Vec::new());
        };
        if matches!(
            job.delivery,
            Delivery::Acked { .. } | Delivery::Expired { .. }
        ) {
            return Ok(Vec::new());
        }
        job.delivery = Delivery::Acked { at };
        work.jobs.insert(key.to_owned(), (expected, job));
        Ok(vec![key.to_owned()])
    }

    pub(super) async fn job_record(
        &self,
        key: &str,
        work: &Work,
    ) -> Result<Option<(u64, JobDelivery)>, DbError> {
        if let Some((expected, job)) = work.jobs.get(key) {
            return Ok(Some((*expected, job.clone())));
        }
        self.db.get::<JobDelivery>(key).await
    }

    /// A status, whatever the transport: stored unless stale, a duplicate,
    /// for another device or another attempt; a finished job's status never
    /// changes again.
    pub(super) async fn status(
        &mut self,
        device: &DeviceId,
        status: &JobStatus,
        received_at: Timestamp,
        work: &mut Work,
    ) -> Result<(Answer, Vec<String>, Vec<(String, Effect)>), DbError> {
        if &status.device_id != device {
            return Ok((
                Answer::Refused(format!(
                    "status for device {} refused on the connection of {device}",
                    status.device_id
                )),
                Vec::new(),
                Vec::new(),
            ));
        }
        if status.failure() == Some(drover_model::failure::Failure::SignatureRefused) {
            // The device refused an intent whose signature did not hold: not
            // the control plane's intent, so it decides nothing; a device
            // that refuses the genuine ones has the wrong key pinned.
            warn!(
                device = %device,
                job_id = %status.job_id,
                error = status.error.as_deref().unwrap_or(""),
                "the device refused an intent whose signature did not hold"
            );
            return Ok((Answer::Stored, Vec::new(), Vec::new()));
        }
        if let Some(refusal) = self.revoked(device, work).await? {
            return Ok((refusal, Vec::new(), Vec::new()));
        }
        let status = &bounded_status(status);
        let key = job_key(device, status.job_id);
        let Some((expected, mut job)) = self.job_record(&key, work).await? else {
            if crate::kinds::kind(&status.kind).is_some_and(|k| k.keeps_local_reports()) {
                // The agent assessed on its own (a local job the control
                // plane never sent): its finished report is kept as the
                // device's latest assessment; its other statuses are
                // confirmed and dropped.
                let keys = self
                    .assessed(device, status, received_at.min(Timestamp::now()), work)
                    .await?;
                return Ok((Answer::Stored, keys, Vec::new()));
            }
            return Ok((
                Answer::Refused(format!("unknown job {}", status.job_id)),
                Vec::new(),
                Vec::new(),
            ));
        };
        if job.intent.attempt != status.attempt {
            return Ok((
                Answer::Refused(format!(
                    "status for attempt {} of job {} refused: the current attempt is {}",
                    status.attempt, status.job_id, job.intent.attempt
                )),
                Vec::new(),
                Vec::new(),
            ));
        }
        let finished = job.status.as_ref().is_some_and(|s| s.state.is_terminal());
        if let Some(old) = &job.status
            && (finished || old.seq >= status.seq)
        {
            debug!(job_id = %status.job_id, seq = status.seq, "duplicate or stale status ignored");
            let effects = if finished {
                vec![(key.clone(), Effect::Withdraw)]
            } else {
                Vec::new()
            };
            return Ok((Answer::Stored, Vec::new(), effects));
        }
        let now = self.clock.now();
        let terminal = status.state.is_terminal();
        let facts = JobFacts {
            delivery: self
                .open
                .get(&key)
                .map_or_else(|| job.delivery.clone(), |o| o.delivery.clone()),
            has_status: job.status.is_some(),
            finished,
            expires_at: job.intent.expires_at,
            cancel: self.open.get(&key).map_or(
                if job.cancel_requested_at.is_some() {
                    Cancel::Requested
                } else {
                    Cancel::NotRequested
                },
                |o| o.cancel,
            ),
        };
        let (delivery, effects) =
            delivery::step(&facts, &DeliveryEvent::Status { terminal, at: now });
        // `Sent` is never stored.
        job.delivery = match delivery {
            Delivery::Sent { .. } => Delivery::Created,
            other => other,
        };
        let mut status = status.clone();
        let mut keys = vec![key.clone()];
        // What the report writes beside the job, in the same commit, is its
        // kind's business (`crate::kinds`).
        let writes = crate::kinds::on_report(&mut crate::kinds::Report {
            device,
            job: &job,
            status: &mut status,
            at: received_at.min(now),
        });
        for write in writes {
            match write {
                crate::kinds::ReportWrite::Inventory(inventory) => {
                    let inventory_key = drover_rules::deployment::inventory_key(device);
                    let expected = match work.inventories.get(&inventory_key) {
                        Some((expected, _)) => *expected,
                        None => self
                            .db
                            .get::<drover_rules::deployment::DeviceInventory>(&inventory_key)
                            .await?
                            .map_or(0, |(revision, _)| revision),
                    };
                    work.inventories
                        .insert(inventory_key.clone(), (expected, inventory));
                    keys.push(inventory_key);
                }
                crate::kinds::ReportWrite::Alert(key, alert) => work.alerts.push((key, alert)),
                crate::kinds::ReportWrite::Assessment => {
                    keys.extend(
                        self.assessed(device, &status, received_at.min(now), work)
                            .await?,
                    );
                }
            }
        }
        debug!(job_id = %status.job_id, state = ?status.state, seq = status.seq, "status stored");
        job.status = Some(status);
        if terminal {
            job.terminal_received_at = Some(received_at.min(now));
        }
        work.jobs.insert(key.clone(), (expected, job));
        let effects = effects.into_iter().map(|e| (key.clone(), e)).collect();
        Ok((Answer::Stored, keys, effects))
    }
}

/// The ops that commit a batch's writes, and what each put of a job or a
/// device wrote, in the order of their results.
fn writes_of(work: &Work) -> (Vec<Op>, Vec<Written>) {
    let mut ops = Vec::new();
    let mut written: Vec<Written> = Vec::new();
    for (key, (expected, job)) in &work.jobs {
        match Db::encode(job) {
            Ok(value) => {
                ops.push(Op::Put {
                    key: key.clone(),
                    value,
                    expected: *expected,
                });
                written.push((key.clone(), Some(job.clone()), None));
            }
            Err(e) => warn!(key, error = %e, "cannot encode a job record"),
        }
    }
    for (key, (expected, device)) in &work.devices {
        match Db::encode(device) {
            Ok(value) => {
                ops.push(Op::Put {
                    key: key.clone(),
                    value,
                    expected: *expected,
                });
                written.push((key.clone(), None, Some((device.id.clone(), device.clone()))));
            }
            Err(e) => warn!(key, error = %e, "cannot encode a device record"),
        }
    }
    // What reports write beside their jobs: devices' inventories and
    // latest assessments.
    let beside = work
        .inventories
        .iter()
        .map(|(key, (expected, inventory))| (key, *expected, Db::encode(inventory)))
        .chain(
            work.assessments
                .iter()
                .map(|(key, (expected, assessment))| (key, *expected, Db::encode(assessment))),
        );
    for (key, expected, encoded) in beside {
        match encoded {
            Ok(value) => {
                ops.push(Op::Put {
                    key: key.clone(),
                    value,
                    expected,
                });
                written.push((key.clone(), None, None));
            }
            Err(e) => warn!(key, error = %e, "cannot encode a report's record"),
        }
    }
    // After every op whose result is read below: an alert that exists
    // already (create-only) is no lost write.
    for (key, alert) in &work.alerts {
        if let Ok(value) = Db::encode(alert) {
            ops.push(Op::Put {
                key: key.clone(),
                value,
                expected: 0,
            });
        }
    }
    (ops, written)
}
