//! The executor's worker: the loop that runs one job at a time in arrival
//! order, each job's steps through its chain, and the durable record of
//! every change before it is acted on or reported (A4).

use super::*;

impl Agent {
    /// Saves a job that just arrived (its arrival number given in the same
    /// durable commit) and reports it, as `persist` with `Persist::Report`.
    pub(super) fn arrived(&self, record: &mut JobRecord) -> Result<(), StoreError> {
        self.checked(self.store.arrive(record))?;
        self.outbox_changed.notify_one();
        if record.status.state.is_terminal() {
            self.job_ended.notify_one();
        }
        Ok(())
    }

    pub(super) fn persist(&self, record: &JobRecord, persist: Persist) -> Result<(), StoreError> {
        match persist {
            Persist::Nothing => return Ok(()),
            Persist::Save => self.checked(self.store.save(record, false))?,
            Persist::Report => {
                self.checked(self.store.save(record, true))?;
                self.outbox_changed.notify_one();
            }
        }
        if record.status.state == JobState::Succeeded {
            self.heartbeat_wanted.notify_one();
        }
        if record.status.state.is_terminal() {
            self.job_ended.notify_one();
        }
        Ok(())
    }

    /// The next job to work on: an interrupted one first, else the oldest queued.
    fn next_job(&self) -> Result<Option<JobRecord>, StoreError> {
        let jobs = self.store.summaries()?;
        let next = jobs
            .iter()
            .find(|j| matches!(j.state, JobState::Running | JobState::AwaitingReboot))
            .or_else(|| {
                jobs.iter()
                    .find(|j| matches!(j.state, JobState::Accepted | JobState::Waiting))
            });
        match next {
            Some(summary) => self.store.job(summary.job_id),
            None => Ok(None),
        }
    }

    /// The worker loop: one job at a time until `shutdown`. A job interrupted
    /// by shutdown stays Running and resumes at its current step next time.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            match self.next_job() {
                Ok(Some(record)) => {
                    let job_id = record.status.job_id;
                    let span = info_span!("job", job_id = %job_id, kind = %record.status.kind);
                    let result = self.run_job(record, &shutdown).instrument(span).await;
                    if let Err(e) = result {
                        // A store error is not the job's fault; wait and pick it up again.
                        error!(job_id = %job_id, error = %e, "cannot record job progress; retrying in 5 s");
                        sleep_or_shutdown(Duration::from_secs(5), &shutdown).await;
                    }
                    if let Err(e) = self.checked(self.store.prune(self.settings.keep_jobs)) {
                        warn!(error = %e, "cannot prune old jobs");
                    }
                }
                Ok(None) => {
                    tokio::select! {
                        _ = self.wake.notified() => {}
                        _ = shutdown.cancelled() => return,
                    }
                }
                Err(e) => {
                    error!(error = %e, "cannot read the job queue; retrying in 5 s");
                    sleep_or_shutdown(Duration::from_secs(5), &shutdown).await;
                }
            }
        }
    }

    async fn run_job(
        &self,
        mut record: JobRecord,
        shutdown: &CancellationToken,
    ) -> Result<(), StoreError> {
        let limits = self.settings.limits;
        let chain = self.chain(&record.status.kind).cloned();
        let mut event = self.pick_event();
        if record.status.state == JobState::Running {
            warn!(
                step = current_step_name(&record),
                resumes = record.resumes + 1,
                "the agent stopped while this job ran; resuming it at its current step"
            );
        }
        let job_id = record.status.job_id;
        let mut first = true;
        loop {
            let (next_record, persist, next) = if first {
                // The pick reads the record again under the admission lock: a
                // cancel order that came after the queue scan wins, and the
                // job never starts.
                first = false;
                let _guard = self.admission.lock().unwrap_or_else(|p| p.into_inner());
                let Some(fresh) = self.store.job(job_id)? else {
                    return Ok(());
                };
                let picked = lifecycle::transition(fresh, event, limits);
                self.persist(&picked.0, picked.1)?;
                picked
            } else {
                let stepped = lifecycle::transition(record, event, limits);
                self.persist(&stepped.0, stepped.1)?;
                stepped
            };
            record = next_record;
            if persist == Persist::Report {
                info!(state = ?record.status.state, step = current_step_name(&record), "job progress");
            }
            let Some(chain) = chain.as_ref() else {
                if next != Next::Stop {
                    // Only a job stored by an agent that had this kind gets here.
                    event = Event::StepFinished {
                        now: clock::now(),
                        boot_id: self.settings.boot_id.clone(),
                        outcome: StepOutcome::Fail(format!(
                            "this agent no longer supports {}",
                            record.status.kind
                        )),
                    };
                    continue;
                }
                return Ok(());
            };
            let index = match next {
                Next::Stop => return Ok(()),
                Next::RunStep(index) => index,
                Next::RetryStep { index, after } => {
                    if !sleep_or_shutdown(after, shutdown).await {
                        return Ok(());
                    }
                    index
                }
                Next::Reboot => {
                    info!("rebooting the device");
                    match chain.reboot().await {
                        Ok(()) => {
                            // The device goes down under us; nothing more to do in this boot.
                            shutdown.cancelled().await;
                            return Ok(());
                        }
                        Err(e) => {
                            error!(error = %e, "reboot failed; asking again in 60 s");
                            if !sleep_or_shutdown(Duration::from_secs(60), shutdown).await {
                                return Ok(());
                            }
                            event = self.pick_event();
                            continue;
                        }
                    }
                }
            };
            let step_name = record.status.steps[index].name.clone();
            if !self.test_hold(&step_name, shutdown).await {
                return Ok(());
            }
            let step = &record.status.steps[index];
            let mut output = record.status.output.clone();
            let now = clock::now();
            let budget = self.settings.test_job_budget.unwrap_or_else(|| {
                Duration::from_secs(
                    record
                        .intent
                        .as_ref()
                        .map_or(DEFAULT_JOB_BUDGET_SECONDS, |i| i.timeout_seconds)
                        .into(),
                )
            });
            let ctx = StepContext {
                job_id: record.status.job_id,
                step: &step_name,
                kind: record.intent.as_ref().map(|i| &i.kind),
                started_at: step.started_at.unwrap_or(now),
                job_started_at: record.status.started_at.unwrap_or(now),
                budget,
                tries: step.tries,
                output: &mut output,
            };
            let outcome = tokio::select! {
                outcome = chain.run_step(ctx) => outcome,
                _ = shutdown.cancelled() => {
                    info!(step = %step_name, "stopping mid-step; the job resumes at this step");
                    return Ok(());
                }
            };
            record.status.output = output;
            event = Event::StepFinished {
                now: clock::now(),
                boot_id: self.settings.boot_id.clone(),
                outcome,
            };
        }
    }

    fn pick_event(&self) -> Event {
        Event::Pick {
            now: clock::now(),
            control_plane_now: self.control_plane_clock.now_or_local(),
            boot_id: self.settings.boot_id.clone(),
        }
    }

    /// Returns false when shutdown came while holding.
    async fn test_hold(&self, step: &str, shutdown: &CancellationToken) -> bool {
        let Some(hold) = &self.settings.test_hold else {
            return true;
        };
        if hold.step != step {
            return true;
        }
        if let Err(e) = std::fs::write(&hold.reached, step) {
            warn!(error = %e, "test hold: cannot write the reached marker");
        }
        while hold.hold.exists() {
            if !sleep_or_shutdown(Duration::from_millis(100), shutdown).await {
                return false;
            }
        }
        true
    }
}

fn current_step_name(record: &JobRecord) -> &str {
    record
        .status
        .steps
        .iter()
        .find(|s| s.state != StepState::Done)
        .map(|s| s.name.as_str())
        .unwrap_or("-")
}

/// Sleeps; returns false if shutdown came first.
async fn sleep_or_shutdown(duration: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(duration) => true,
        _ = shutdown.cancelled() => false,
    }
}
