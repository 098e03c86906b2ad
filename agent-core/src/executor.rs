//! The sequential executor: admits intents durably, runs one job at a time
//! in arrival order, and reports through the durable outbox. Transports call
//! [`Agent`]'s methods; the worker loop is [`Agent::run`].

use crate::chain::{Chain, StepContext, StepOutcome};
use crate::clock::{self, ControlPlaneClock};
use crate::facts::{self, FactSources};
use crate::lifecycle::{self, Admission, AdmitContext, Event, Limits, Next, Persist};
use crate::store::{JobRecord, Origin, OutboxEntry, Store, StoreError};
use drover_model::failure::Failure;
use drover_model::ids::{DeviceId, JobId};
use drover_model::model::JobKind;
use drover_model::model::{Heartbeat, HeldJob, JobState, JobStatus};
use drover_model::signing::TrustedKeys;
use drover_model::wire::{IntentError, parse_intent_value};
use drover_model::{Intent, model::StepState};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info, info_span, warn};

/// A job's budget when its intent names none (local jobs): the package job's
/// 1500 s of the jobs seed.
pub const DEFAULT_JOB_BUDGET_SECONDS: u32 = 1500;

/// A test-only pause: before running `step`, the worker writes `reached` and
/// waits while `hold` exists, so a test can kill the agent mid-job.
#[derive(Debug, Clone)]
pub struct TestHold {
    pub step: String,
    pub hold: PathBuf,
    pub reached: PathBuf,
}

pub struct Settings {
    pub device_id: DeviceId,
    pub boot_id: String,
    pub agent_version: String,
    pub limits: Limits,
    /// Terminal jobs kept for `jobs` and duplicate detection.
    pub keep_jobs: usize,
    pub facts: FactSources,
    /// Set only by a binary built with its `testing` feature.
    pub test_hold: Option<TestHold>,
    /// The whole job's budget in place of the intent's `timeoutSeconds`; set
    /// only by a binary built with its `testing` feature.
    pub test_job_budget: Option<Duration>,
    /// The control-plane keys whose signature a fleet intent must carry (A11).
    pub trusted_keys: TrustedKeys,
    /// The device's own key (None in tests that need none).
    pub device_key: Option<Arc<crate::identity::DeviceKey>>,
    /// Answers the control plane's requests for a job's output.
    pub logs: crate::job_logs::Answering,
}

/// How an intent was answered.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmitReply {
    pub status: JobStatus,
    pub duplicate: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    #[error("no job {0} on this device")]
    Unknown(JobId),
    #[error(
        "job {job_id} cannot be resumed: only a failed local job can ({origin:?} job, {state:?})"
    )]
    NotResumable {
        job_id: JobId,
        origin: Origin,
        state: JobState,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    /// The intent could not even be tied to a job id; nothing was recorded.
    #[error("{0}")]
    Unreadable(IntentError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub struct Agent {
    settings: Settings,
    store: Arc<dyn Store>,
    chains: Vec<Arc<dyn Chain>>,
    /// Serialises admission's read-check-write. A std Mutex: no await while held.
    admission: Mutex<()>,
    wake: Notify,
    outbox_changed: Notify,
    heartbeat_wanted: Notify,
    job_ended: Notify,
    link: Mutex<LinkState>,
    control_plane_clock: ControlPlaneClock,
    /// Woken when the store refused a write on I/O (a full disk): the
    /// process must open it again, so the daemon exits and is restarted.
    store_failed: Notify,
    /// This process's number among the agent's starts, saved once on the
    /// first heartbeat: the high half of every heartbeat's sequence.
    heartbeat_epoch: OnceLock<u64>,
    /// Heartbeats sent by this process: the low half, never saved.
    heartbeats: AtomicU64,
}

/// Heartbeats a process can number before its sequence would reach the
/// next start's (one every second for 136 years).
const HEARTBEATS_PER_START: u64 = 1 << 32;

impl Agent {
    pub fn new(
        settings: Settings,
        store: Arc<dyn Store>,
        chains: Vec<Arc<dyn Chain>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            settings,
            store,
            chains,
            admission: Mutex::new(()),
            wake: Notify::new(),
            outbox_changed: Notify::new(),
            heartbeat_wanted: Notify::new(),
            job_ended: Notify::new(),
            link: Mutex::new(LinkState::default()),
            control_plane_clock: ControlPlaneClock::default(),
            store_failed: Notify::new(),
            heartbeat_epoch: OnceLock::new(),
            heartbeats: AtomicU64::new(0),
        })
    }

    /// Where a transport hands a request for a job's output.
    pub fn logs(&self) -> &crate::job_logs::Answering {
        &self.settings.logs
    }

    pub fn device_id(&self) -> &DeviceId {
        &self.settings.device_id
    }

    pub fn boot_id(&self) -> &str {
        &self.settings.boot_id
    }

    /// The version this agent reports in its hello and heartbeats.
    pub fn agent_version(&self) -> &str {
        &self.settings.agent_version
    }

    pub fn capabilities(&self) -> Vec<String> {
        self.chains.iter().map(|c| c.kind().to_owned()).collect()
    }

    /// Resolves once the store refused a write on I/O (see [`StoreError::is_io`]).
    pub fn store_failed(&self) -> &Notify {
        &self.store_failed
    }

    /// Notes a store error: one on I/O means the store must be opened again.
    fn checked<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(e) = &result
            && e.is_io()
        {
            error!(error = %e, "the agent's state store refused a write (is its file system full?)");
            self.store_failed.notify_one();
        }
        result
    }

    /// A transport calls this with every time the control plane sends, so
    /// that expiry is judged on the control plane's clock (A12).
    pub fn observe_control_plane_time(&self, time: Timestamp) {
        self.control_plane_clock.observe(time);
    }

    fn chain(&self, kind: &str) -> Option<&Arc<dyn Chain>> {
        self.chains.iter().find(|c| c.kind() == kind)
    }

    /// Records an intent durably before anything else happens to it (A1) and
    /// returns the status to report. A known job id is answered with its
    /// stored status and never runs again.
    pub fn admit(&self, parsed: Result<Intent, IntentError>) -> Result<AdmitReply, AdmitError> {
        self.admit_from(parsed, Origin::Fleet)
    }

    /// Records an intent as a transport received it: its signature is
    /// checked first (A11). One that does not verify is recorded as refused
    /// under the job id it names (so `drover-agent jobs` shows it), reported
    /// as `unverified`, and never shadows a valid intent of that id.
    pub fn admit_signed(
        &self,
        intent: Result<serde_json::Value, IntentError>,
    ) -> Result<AdmitReply, AdmitError> {
        let value = match intent {
            Ok(value) => value,
            Err(e) => return self.admit(Err(e)),
        };
        let size = serde_json::to_vec(&value)
            .map(|b| b.len())
            .unwrap_or(usize::MAX);
        if size > drover_model::wire::MAX_INTENT_BYTES {
            return self.admit(Err(IntentError {
                job_id: None,
                device_id: None,
                kind: None,
                attempt: 0,
                reason: format!(
                    "intent is {size} bytes, over the limit of {}",
                    drover_model::wire::MAX_INTENT_BYTES
                ),
                failure: Failure::Malformed,
            }));
        }
        if drover_model::wire::is_cancel_order(&value) {
            return self.cancel_signed(value);
        }
        match self.settings.trusted_keys.verify(&value) {
            Ok(()) => self.admit(parse_intent_value(value)),
            Err(problem) => {
                let mut error = match parse_intent_value(value) {
                    Ok(intent) => IntentError {
                        job_id: Some(intent.job_id),
                        device_id: Some(intent.device_id),
                        kind: None,
                        attempt: intent.attempt,
                        reason: String::new(),
                        failure: Failure::SignatureRefused,
                    },
                    Err(error) => error,
                };
                warn!(job_id = ?error.job_id, %problem, "intent refused: its signature does not hold");
                // Its fields are not the control plane's, so no kind is
                // repeated; the kind named is the one older control planes
                // know the refusal by.
                error.kind = Some(drover_model::failure::UNVERIFIED_KIND.into());
                error.reason = problem.to_string();
                error.failure = Failure::SignatureRefused;
                self.admit(Err(error))
            }
        }
    }

    /// Queues a local, on-demand job (`drover-agent upgrade`). It goes through
    /// the same queue as fleet jobs, so it never runs beside one (A2).
    pub fn admit_local(&self, kind: JobKind) -> Result<AdmitReply, AdmitError> {
        let now = clock::now();
        let intent = Intent {
            job_id: JobId::random(),
            device_id: self.settings.device_id.clone(),
            kind,
            attempt: 1,
            created_at: now,
            expires_at: now + jiff::SignedDuration::from_hours(24),
            timeout_seconds: DEFAULT_JOB_BUDGET_SECONDS,
        };
        self.admit_from(Ok(intent), Origin::Local)
    }

    /// Continues a failed local job from its failed step.
    pub fn resume_local(&self, job_id: JobId) -> Result<JobStatus, ResumeError> {
        let _guard = self.admission.lock().unwrap_or_else(|p| p.into_inner());
        let record = self
            .store
            .job(job_id)?
            .ok_or(ResumeError::Unknown(job_id))?;
        let (origin, state) = (record.origin, record.status.state);
        let (record, persist, _) = lifecycle::transition(
            record,
            Event::Resume { now: clock::now() },
            self.settings.limits,
        );
        if persist == Persist::Nothing {
            return Err(ResumeError::NotResumable {
                job_id,
                origin,
                state,
            });
        }
        self.persist(&record, persist)?;
        self.wake.notify_one();
        Ok(record.status)
    }

    pub fn job(&self, job_id: JobId) -> Result<Option<JobStatus>, StoreError> {
        Ok(self.store.job(job_id)?.map(|r| r.status))
    }

    fn admit_from(
        &self,
        parsed: Result<Intent, IntentError>,
        origin: Origin,
    ) -> Result<AdmitReply, AdmitError> {
        let _guard = self.admission.lock().unwrap_or_else(|p| p.into_inner());
        let job_id = match &parsed {
            Ok(intent) => Some(intent.job_id),
            Err(e) => e.job_id,
        };
        let existing = match job_id {
            Some(id) => self.store.job(id)?,
            None => None,
        };
        // A new job, or one that takes the place of a recorded refusal.
        let fresh = existing.as_ref().is_none_or(|r| r.gives_way());
        let unfinished = if fresh {
            self.store
                .summaries()?
                .iter()
                .filter(|j| !j.state.is_terminal() && Some(j.job_id) != job_id)
                .count()
        } else {
            0
        };
        let steps = match &parsed {
            Ok(intent) => self.chain(intent.kind.name()).map(|c| c.steps()),
            Err(_) => None,
        };
        let ctx = AdmitContext {
            device_id: &self.settings.device_id,
            boot_id: &self.settings.boot_id,
            now: clock::now(),
            control_plane_now: self.control_plane_clock.now_or_local(),
            // A fresh job's number is given by the store as it is saved.
            arrival: 0,
            unfinished,
            steps,
        };
        let admission = lifecycle::admit(existing, parsed, &ctx).map_err(AdmitError::Unreadable)?;
        let (mut record, duplicate) = match admission {
            Admission::New(record) => {
                info!(job_id = %record.status.job_id, state = ?record.status.state, "job admitted");
                (record, false)
            }
            Admission::Refused(record) => {
                warn!(job_id = %record.status.job_id, error = ?record.status.error, "intent refused");
                (record, false)
            }
            Admission::Duplicate(record) => {
                info!(job_id = %record.status.job_id, state = ?record.status.state, "duplicate delivery answered with the stored status");
                (record, true)
            }
        };
        if !duplicate {
            record.origin = origin;
        }
        if fresh && !duplicate {
            // Its arrival number and its record in one durable commit.
            self.arrived(&mut record)?;
        } else {
            // A duplicate's status is reported again: the sender evidently
            // lacks it.
            self.checked(self.store.save(&record, true))?;
            self.outbox_changed.notify_one();
        }
        self.wake.notify_one();
        Ok(AdmitReply {
            status: record.status,
            duplicate,
        })
    }

    /// Carries out the control plane's signed order to cancel a job. A job
    /// that has not started is Canceled and reported; a started one is never
    /// interrupted (A3) and reports its own end; a finished one reports its
    /// status again. A job this agent never received is recorded as Canceled
    /// and reported, so the intent can never run should it still arrive.
    /// An order that is unsigned, badly signed or for another device changes
    /// nothing: a cancel must not let a broker shadow a job (A11).
    fn cancel_signed(&self, value: serde_json::Value) -> Result<AdmitReply, AdmitError> {
        let unusable = |job_id, reason: String| {
            AdmitError::Unreadable(IntentError {
                job_id,
                device_id: None,
                kind: None,
                attempt: 0,
                reason,
                failure: Failure::Malformed,
            })
        };
        let named = value
            .get(drover_model::wire::CANCEL_FIELD)
            .and_then(|v| v.as_str())
            .and_then(|s| s.parse::<JobId>().ok());
        if let Err(problem) = self.settings.trusted_keys.verify(&value) {
            warn!(job_id = ?named, %problem, "cancel order ignored: its signature does not hold");
            return Err(unusable(named, format!("cancel order ignored: {problem}")));
        }
        let order =
            drover_model::wire::parse_cancel_order(value).map_err(AdmitError::Unreadable)?;
        if order.device_id != self.settings.device_id {
            return Err(unusable(
                Some(order.cancel_job),
                format!(
                    "cancel order is for device {}, this agent is {}; ignored",
                    order.device_id, self.settings.device_id
                ),
            ));
        }
        let span = tracing::info_span!("job", job_id = %order.cancel_job);
        let _span = span.enter();
        let _guard = self.admission.lock().unwrap_or_else(|p| p.into_inner());
        let (record, persist) = match self.store.job(order.cancel_job)? {
            Some(record) if record.status.state.is_terminal() => (record, Persist::Report),
            Some(record) => {
                let (record, persist, _) = lifecycle::transition(
                    record,
                    Event::Cancel { now: clock::now() },
                    self.settings.limits,
                );
                (record, persist)
            }
            None => {
                let ctx = AdmitContext {
                    device_id: &self.settings.device_id,
                    boot_id: &self.settings.boot_id,
                    now: clock::now(),
                    control_plane_now: self.control_plane_clock.now_or_local(),
                    arrival: 0,
                    unfinished: 0,
                    steps: None,
                };
                let mut record = lifecycle::canceled_unreceived(&order, &ctx);
                self.arrived(&mut record)?;
                (record, Persist::Nothing)
            }
        };
        self.persist(&record, persist)?;
        info!(state = ?record.status.state, "cancel order carried out");
        Ok(AdmitReply {
            status: record.status,
            duplicate: false,
        })
    }

    /// Jobs the agent still holds: unfinished ones and those whose final
    /// status has not been confirmed yet.
    pub fn held_jobs(&self) -> Result<Vec<HeldJob>, StoreError> {
        let unconfirmed: std::collections::HashSet<JobId> = self
            .store
            .outbox(usize::MAX)?
            .into_iter()
            .map(|e| e.status.job_id)
            .collect();
        Ok(self
            .store
            .summaries()?
            .into_iter()
            .filter(|j| !j.state.is_terminal() || unconfirmed.contains(&j.job_id))
            .map(|j| HeldJob {
                job_id: j.job_id,
                state: j.state,
            })
            .collect())
    }

    pub fn outbox(&self, limit: usize) -> Result<Vec<OutboxEntry>, StoreError> {
        self.store.outbox(limit)
    }

    pub fn outbox_ack(&self, id: u64) -> Result<(), StoreError> {
        self.checked(self.store.outbox_ack(id))
    }

    /// Woken whenever a status enters the outbox.
    pub fn outbox_changed(&self) -> &Notify {
        &self.outbox_changed
    }

    /// Woken when a heartbeat should go out now (a job just completed).
    pub fn heartbeat_wanted(&self) -> &Notify {
        &self.heartbeat_wanted
    }

    /// Woken when a job's final state was stored (the assessment schedule
    /// looks at once whether one is due).
    pub fn job_ended(&self) -> &Notify {
        &self.job_ended
    }

    /// A heartbeat's sequence: increasing across heartbeats and across the
    /// agent's restarts, at the cost of one durable write per process start
    /// rather than one per heartbeat (an SD card wears out on the latter).
    fn heartbeat_seq(&self) -> Result<u64, StoreError> {
        let epoch = match self.heartbeat_epoch.get() {
            Some(epoch) => *epoch,
            None => {
                let next = self.checked(self.store.next("agent-start"))?;
                *self.heartbeat_epoch.get_or_init(|| next)
            }
        };
        let count = self.heartbeats.fetch_add(1, Ordering::Relaxed) + 1;
        Ok(epoch
            .saturating_mul(HEARTBEATS_PER_START)
            .saturating_add(count.min(HEARTBEATS_PER_START - 1)))
    }

    pub fn heartbeat(&self) -> Result<Heartbeat, StoreError> {
        Ok(Heartbeat {
            device_id: self.settings.device_id.clone(),
            boot_id: self.settings.boot_id.clone(),
            seq: self.heartbeat_seq()?,
            agent_version: self.settings.agent_version.clone(),
            capabilities: self.capabilities(),
            uptime_seconds: facts::uptime_seconds(),
            os_release: self.settings.facts.os_release(),
            architecture: facts::debian_architecture().to_owned(),
            inventory_digest: self.settings.facts.inventory_digest(),
            sent_at: clock::now(),
        })
    }
}

#[path = "executor_info.rs"]
mod info;
pub use info::{AgentInfo, LinkState};

#[path = "executor_worker.rs"]
mod worker;

#[cfg(test)]
#[path = "executor_tests.rs"]
mod tests;
