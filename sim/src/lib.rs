//! A fleet simulator: one process that plays many Drover agents, each with
//! its own connection and its own device token, following the agent's side
//! of docs/protocol.md (WebSocket) or the NATS mapping. A simulated agent
//! answers a job at once with the statuses a real agent in simulate mode
//! sends (accepted, running through five steps, succeeded) and a completion
//! heartbeat; it keeps unconfirmed statuses and sends them again on the next
//! connection, as the real outbox does. The end-to-end tests use it at small
//! N; [`bench`] drives it at fleet scale.

pub mod acceptance;
pub mod bench;
pub mod bench_fleet;
pub(crate) mod bench_usage;
pub mod connect;
pub mod connect_mqtt;
pub mod enroll;
pub mod enroll_mqtt;
pub mod enroll_nats;
pub mod floor;
pub mod footprint;
pub mod harness;
pub(crate) mod keys;
pub mod logins;
pub mod mqtt;
pub mod nats;
pub mod nats_counts;
pub mod patch;
pub mod procstat;
pub mod profile;
pub mod reconnect;
pub mod spread;
pub mod summary;
pub mod ws;

use drover_model::model::{Heartbeat, HeldJob, Intent, JobState, JobStatus, StepRecord, StepState};
use drover_model::{DeviceId, JobId};
use jiff::Timestamp;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// The steps of `systemUpgradeV1`, as a real agent reports them.
const STEPS: &[&str] = updater_apt::SYSTEM_UPGRADE_STEPS;

/// How the simulated agents behave.
#[derive(Debug, Clone)]
pub struct Behaviour {
    pub heartbeat: Duration,
    /// Statuses sent per job, the final one included (a real agent in
    /// simulate mode sends 7: accepted, running at each of 5 steps, succeeded).
    pub statuses_per_job: usize,
    /// Over NATS: each agent makes its first attempt at a random moment
    /// within this, as a fleet spreading its reconnects after a server's
    /// restart would (zero: all at once).
    pub first_attempt_spread: Duration,
}

impl Default for Behaviour {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_secs(30),
            statuses_per_job: 7,
            first_attempt_spread: Duration::ZERO,
        }
    }
}

/// What the simulated fleet has done so far, shared by every agent.
#[derive(Debug, Default)]
pub struct Stats {
    /// Agents whose connection is up and whose hello went out.
    pub connected: AtomicUsize,
    pub jobs_received: AtomicUsize,
    /// Jobs whose final status the control plane confirmed.
    pub jobs_confirmed: AtomicUsize,
    pub reconnects: AtomicUsize,
    pub errors: AtomicUsize,
    next_boot: AtomicU64,
}

impl Stats {
    pub fn snapshot(&self) -> String {
        format!(
            "connected {}, jobs received {}, confirmed {}, reconnects {}, errors {}",
            self.connected.load(Ordering::Relaxed),
            self.jobs_received.load(Ordering::Relaxed),
            self.jobs_confirmed.load(Ordering::Relaxed),
            self.reconnects.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed)
        )
    }
}

/// One simulated device: its jobs and its outbox. Small on purpose: a
/// benchmark holds tens of thousands.
pub struct SimAgent {
    pub device: DeviceId,
    pub boot_id: String,
    /// Jobs seen, with their last status (never pruned: a simulation is short).
    jobs: Vec<(JobId, JobStatus)>,
    /// Unconfirmed statuses: (outbox id, status).
    outbox: Vec<(u64, JobStatus)>,
    next_outbox: u64,
    heartbeat_seq: u64,
    pub behaviour: Arc<Behaviour>,
    pub stats: Arc<Stats>,
}

impl SimAgent {
    pub fn new(device: DeviceId, behaviour: Arc<Behaviour>, stats: Arc<Stats>) -> Self {
        let boot = stats.next_boot.fetch_add(1, Ordering::Relaxed);
        Self {
            device,
            boot_id: format!("sim-boot-{boot}"),
            jobs: Vec::new(),
            outbox: Vec::new(),
            next_outbox: 1,
            heartbeat_seq: 0,
            behaviour,
            stats,
        }
    }

    pub fn capabilities() -> Vec<String> {
        vec!["systemUpgradeV1".into(), "inventoryRefreshV1".into()]
    }

    /// Jobs not yet finished or whose final status is unconfirmed.
    pub fn held(&self) -> Vec<HeldJob> {
        self.jobs
            .iter()
            .filter(|(id, status)| {
                !status.state.is_terminal() || self.outbox.iter().any(|(_, s)| s.job_id == *id)
            })
            .map(|(id, status)| HeldJob {
                job_id: *id,
                state: status.state,
            })
            .collect()
    }

    /// Takes a job: a known job id is answered with its last status again; a
    /// new one runs to success at once. Returns the job id to ack.
    pub fn take(&mut self, intent: &Intent) -> Option<JobId> {
        if intent.device_id != self.device {
            return None;
        }
        if let Some((_, status)) = self.jobs.iter().find(|(id, _)| *id == intent.job_id) {
            let status = status.clone();
            self.push(status);
            return Some(intent.job_id);
        }
        self.stats.jobs_received.fetch_add(1, Ordering::Relaxed);
        let now = Timestamp::now();
        let mut status = JobStatus {
            job_id: intent.job_id,
            device_id: self.device.clone(),
            attempt: intent.attempt,
            kind: intent.kind.name().into(),
            state: JobState::Accepted,
            steps: STEPS.iter().map(|s| StepRecord::pending(s)).collect(),
            error: None,
            output: None,
            accepted_at: now,
            started_at: None,
            finished_at: None,
            boot_id: self.boot_id.clone(),
            completion_heartbeat_at: None,
            seq: 1,
            failure: None,
            reason: Vec::new(),
        };
        let total = self.behaviour.statuses_per_job.max(1);
        for index in 0..total {
            let last = index + 1 == total;
            if index > 0 {
                status.seq += 1;
                status.state = JobState::Running;
                status.started_at.get_or_insert(now);
                let step = (index - 1).min(STEPS.len() - 1);
                for (i, record) in status.steps.iter_mut().enumerate() {
                    if i < step {
                        record.state = StepState::Done;
                        record.tries = 1;
                        record.seconds = Some(0.0);
                    } else if i == step {
                        record.state = StepState::Running;
                        record.started_at = Some(now);
                    }
                }
            }
            if last {
                status.state = JobState::Succeeded;
                status.finished_at = Some(now);
                status.completion_heartbeat_at = Some(now);
                for record in &mut status.steps {
                    record.state = StepState::Done;
                    record.tries = 1;
                    record.seconds = Some(0.0);
                }
            }
            self.push(status.clone());
        }
        self.jobs.push((intent.job_id, status));
        Some(intent.job_id)
    }

    fn push(&mut self, status: JobStatus) {
        let id = self.next_outbox;
        self.next_outbox += 1;
        self.outbox.push((id, status));
    }

    /// Statuses still waiting for confirmation, oldest first.
    pub fn pending(&self) -> &[(u64, JobStatus)] {
        &self.outbox
    }

    /// The control plane stored this status.
    pub fn confirm(&mut self, outbox_id: u64) {
        if let Some(position) = self.outbox.iter().position(|(id, _)| *id == outbox_id) {
            let (_, status) = self.outbox.remove(position);
            if status.state.is_terminal() {
                self.stats.jobs_confirmed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub fn heartbeat(&mut self) -> Heartbeat {
        self.heartbeat_seq += 1;
        Heartbeat {
            device_id: self.device.clone(),
            boot_id: self.boot_id.clone(),
            seq: self.heartbeat_seq,
            agent_version: "sim".into(),
            capabilities: Self::capabilities(),
            uptime_seconds: 1,
            os_release: "Drover simulator".into(),
            architecture: "amd64".into(),
            inventory_digest: "sim".into(),
            sent_at: Timestamp::now(),
        }
    }
}

/// `sim-00001`-style device ids.
pub fn device_ids(prefix: &str, count: usize) -> Vec<DeviceId> {
    device_id_range(prefix, 0, count)
}

/// `count` device ids from number `first` on: one simulator process's share
/// of a fleet played by several.
pub fn device_id_range(prefix: &str, first: usize, count: usize) -> Vec<DeviceId> {
    (first..first + count)
        .filter_map(|i| DeviceId::new(format!("{prefix}{i:05}")).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_yields_the_statuses_of_a_real_agent_and_a_duplicate_is_answered_again() {
        let stats = Arc::new(Stats::default());
        let device = DeviceId::new("sim-1").expect("id");
        let mut agent = SimAgent::new(device.clone(), Arc::default(), stats.clone());
        let intent = Intent {
            job_id: JobId::random(),
            device_id: device,
            kind: drover_model::JobKind::system_upgrade(),
            attempt: 1,
            created_at: Timestamp::now(),
            expires_at: Timestamp::now(),
            timeout_seconds: 1500,
        };
        assert_eq!(agent.take(&intent), Some(intent.job_id));
        let states: Vec<JobState> = agent.pending().iter().map(|(_, s)| s.state).collect();
        assert_eq!(states.len(), 7);
        assert_eq!(states[0], JobState::Accepted);
        assert_eq!(states[6], JobState::Succeeded);
        let seqs: Vec<u64> = agent.pending().iter().map(|(_, s)| s.seq).collect();
        assert_eq!(seqs, vec![1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(agent.held().len(), 1, "held until the result is confirmed");
        let ids: Vec<u64> = agent.pending().iter().map(|(id, _)| *id).collect();
        for id in ids {
            agent.confirm(id);
        }
        assert!(agent.held().is_empty());
        assert_eq!(stats.jobs_confirmed.load(Ordering::Relaxed), 1);
        agent.take(&intent);
        assert_eq!(agent.pending().len(), 1, "a duplicate is answered, not run");
        assert_eq!(stats.jobs_received.load(Ordering::Relaxed), 1);
        let other = Intent {
            device_id: DeviceId::new("sim-2").expect("id"),
            ..intent
        };
        assert_eq!(
            agent.take(&other),
            None,
            "another device's intent is dropped"
        );
    }
}
