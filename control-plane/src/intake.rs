//! What agents tell the control plane, whatever the transport: hellos and
//! heartbeats feed the device registry; statuses are stored unless stale, a
//! duplicate, for another device, or for another attempt. A finished job's
//! status never changes again.

use crate::records::{
    Db, DbError, Delivery, DeviceRecord, JobDelivery, device_jobs_prefix, device_key, job_key,
};
use agent_core::DeviceId;
use agent_core::model::{Heartbeat, HeldJob, JobStatus};
use jiff::Timestamp;
use std::collections::HashSet;
use std::sync::Arc;
use tokio::sync::Notify;
use tracing::debug;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatusOutcome {
    /// Stored; `terminal` says whether the job is finished.
    Stored { terminal: bool },
    /// A duplicate or stale copy; `terminal` says whether the stored one is final.
    Ignored { terminal: bool },
    /// Refused with a reason to report back.
    Refused(String),
}

#[derive(Clone)]
pub struct Intake {
    pub db: Db,
    pub engine_wake: Arc<Notify>,
}

impl Intake {
    pub fn on_hello(
        &self,
        device: &DeviceId,
        version: &str,
        boot_id: &str,
        capabilities: &[String],
        transport: &str,
    ) -> Result<(), DbError> {
        let now = Timestamp::now();
        self.db
            .update::<DeviceRecord, _>(&device_key(device), |current| {
                let mut record = current.unwrap_or_else(|| DeviceRecord::new(device.clone()));
                record.agent_present = true;
                record.agent_version = Some(version.to_owned());
                record.boot_id = Some(boot_id.to_owned());
                record.capabilities = capabilities.to_vec();
                record.last_seen = Some(now);
                record.transport = Some(transport.to_owned());
                Some(record)
            })?;
        self.engine_wake.notify_one();
        Ok(())
    }

    /// After a hello, whatever the transport: jobs the agent holds are acked;
    /// jobs sent but not held were lost on the way and return to `created`,
    /// so they go out again now. Returns whether anything must be delivered.
    pub fn resync(&self, device: &DeviceId, held: &[HeldJob]) -> Result<bool, DbError> {
        let held: HashSet<_> = held.iter().map(|h| h.job_id).collect();
        let now = Timestamp::now();
        let mut deliver = false;
        for (key, _, job) in self.db.list::<JobDelivery>(&device_jobs_prefix(device))? {
            let holds = held.contains(&job.intent.job_id);
            let finished = job.status.as_ref().is_some_and(|s| s.state.is_terminal());
            let needs = match job.delivery {
                Delivery::Created | Delivery::Sent { .. } if holds => {
                    Some(Delivery::Acked { at: now })
                }
                Delivery::Sent { .. } if job.status.is_none() => Some(Delivery::Created),
                _ => None,
            };
            deliver |= !finished
                && (needs == Some(Delivery::Created) || job.delivery == Delivery::Created)
                && !holds;
            if let Some(delivery) = needs {
                self.db.update::<JobDelivery, _>(&key, |current| {
                    let mut job = current?;
                    job.delivery = delivery.clone();
                    Some(job)
                })?;
            }
        }
        Ok(deliver)
    }

    /// Stores a status. `received_at` is when it reached the control plane's
    /// side, on the control plane's clock (or the broker's, for a status the
    /// broker kept while no control plane ran); it decides whether a result
    /// came before the deadline (A12).
    pub fn on_status(
        &self,
        device: &DeviceId,
        status: JobStatus,
        received_at: Timestamp,
    ) -> Result<StatusOutcome, DbError> {
        if &status.device_id != device {
            return Ok(StatusOutcome::Refused(format!(
                "status for device {} refused on the connection of {device}",
                status.device_id
            )));
        }
        let key = job_key(device, status.job_id);
        let Some((_, job)) = self.db.get::<JobDelivery>(&key)? else {
            return Ok(StatusOutcome::Refused(format!(
                "unknown job {}",
                status.job_id
            )));
        };
        if job.intent.attempt != status.attempt {
            return Ok(StatusOutcome::Refused(format!(
                "status for attempt {} of job {} refused: the current attempt is {}",
                status.attempt, status.job_id, job.intent.attempt
            )));
        }
        let now = Timestamp::now();
        let mut stored = false;
        let mut terminal = false;
        self.db.update::<JobDelivery, _>(&key, |current| {
            let mut job = current?;
            if let Some(old) = &job.status {
                // A finished job's status never changes; older copies are stale.
                if old.state.is_terminal() || old.seq >= status.seq {
                    terminal = old.state.is_terminal();
                    return None;
                }
            }
            job.status = Some(status.clone());
            if status.state.is_terminal() {
                job.terminal_received_at = Some(received_at.min(now));
            }
            if !matches!(job.delivery, Delivery::Acked { .. }) {
                job.delivery = Delivery::Acked { at: now };
            }
            stored = true;
            terminal = status.state.is_terminal();
            Some(job)
        })?;
        if stored {
            debug!(job_id = %status.job_id, state = ?status.state, seq = status.seq, "status stored");
            self.engine_wake.notify_one();
            Ok(StatusOutcome::Stored { terminal })
        } else {
            debug!(job_id = %status.job_id, seq = status.seq, "duplicate or stale status ignored");
            Ok(StatusOutcome::Ignored { terminal })
        }
    }

    /// Records a heartbeat; returns a problem to report back, if any.
    pub fn on_heartbeat(
        &self,
        device: &DeviceId,
        heartbeat: &Heartbeat,
        transport: &str,
    ) -> Result<Option<String>, DbError> {
        if &heartbeat.device_id != device {
            return Ok(Some(format!(
                "heartbeat for device {} refused on the connection of {device}",
                heartbeat.device_id
            )));
        }
        let now = Timestamp::now();
        let mut first = false;
        self.db
            .update::<DeviceRecord, _>(&device_key(device), |current| {
                let mut record = current.unwrap_or_else(|| DeviceRecord::new(device.clone()));
                first = !record.agent_present;
                record.agent_present = true;
                record.boot_id = Some(heartbeat.boot_id.clone());
                record.capabilities = heartbeat.capabilities.clone();
                record.agent_version = Some(heartbeat.agent_version.clone());
                record.os_release = Some(heartbeat.os_release.clone());
                record.architecture = Some(heartbeat.architecture.clone());
                record.last_heartbeat = Some(now);
                record.last_seen = Some(now);
                record.transport = Some(transport.to_owned());
                Some(record)
            })?;
        if first {
            self.engine_wake.notify_one();
        }
        Ok(None)
    }
}
