//! The agents' side of the control plane over NATS JetStream. Intents the
//! engine releases to NATS-connected devices are put into the intent bucket;
//! statuses are read from a watch over the status bucket (one consumer for the
//! whole fleet, on the control plane's side) and accepted only for the right
//! device and attempt; a terminal status removes its intent; heartbeats on
//! `drover.heartbeat.<device>` feed the registry. The control plane is the
//! source of truth: an intent the bucket lost is put again.

use crate::hub::Hub;
use crate::intake::{Intake, StatusOutcome};
use crate::records::{Db, DbError, Delivery, DeviceRecord, JobDelivery, device_key};
use agent_core::DeviceId;
use agent_core::model::{Heartbeat, JobStatus};
use futures_util::StreamExt;
use jiff::Timestamp;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use transport_nats::server::Buckets;
use transport_nats::{HEARTBEAT_PREFIX, key, parse_key};

pub const TRANSPORT: &str = "nats";

pub struct NatsAgents {
    pub db: Db,
    pub hub: Arc<Hub>,
    pub intake: Intake,
    pub buckets: Buckets,
}

impl NatsAgents {
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let statuses = tokio::spawn(self.clone().watch_statuses(shutdown.clone()));
        let heartbeats = tokio::spawn(self.clone().heartbeats(shutdown.clone()));
        loop {
            if let Err(e) = self.deliver().await {
                warn!(error = %e, "cannot deliver intents over NATS; retrying");
            }
            tokio::select! {
                _ = self.hub.released() => {}
                _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                _ = shutdown.cancelled() => break,
            }
        }
        statuses.abort();
        heartbeats.abort();
    }

    /// Puts every `created` intent of a NATS device into the bucket and marks
    /// it `sent`. Putting the same value again is harmless: agents run a job
    /// id once.
    async fn deliver(&self) -> Result<(), DbError> {
        for (key_name, _, job) in self.db.list::<JobDelivery>("jobs/")? {
            if job.delivery != Delivery::Created
                || job.status.as_ref().is_some_and(|s| s.state.is_terminal())
            {
                continue;
            }
            let device = &job.intent.device_id;
            let on_nats = self
                .db
                .get::<DeviceRecord>(&device_key(device))?
                .is_some_and(|(_, d)| d.transport.as_deref() == Some(TRANSPORT));
            if !on_nats {
                continue;
            }
            let Ok(payload) = serde_json::to_vec(&job.intent) else {
                continue;
            };
            let bucket_key = key(device, job.intent.job_id);
            match self.buckets.intents.put(&bucket_key, payload.into()).await {
                Ok(revision) => {
                    info!(job_id = %job.intent.job_id, device = %device, revision, "intent put");
                    let now = Timestamp::now();
                    self.db.update::<JobDelivery, _>(&key_name, |current| {
                        let mut job = current?;
                        (job.delivery == Delivery::Created).then(|| {
                            job.delivery = Delivery::Sent { at: now };
                            job
                        })
                    })?;
                }
                Err(e) => {
                    warn!(key = %bucket_key, error = %e, "cannot put an intent; retrying");
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    async fn watch_statuses(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let watch = self.buckets.statuses.watch_all().await;
            match watch {
                Ok(mut watch) => loop {
                    let entry = tokio::select! {
                        entry = watch.next() => entry,
                        _ = shutdown.cancelled() => return,
                    };
                    match entry {
                        Some(Ok(entry)) => self.on_status_entry(entry).await,
                        Some(Err(e)) => {
                            warn!(error = %e, "status watch error");
                            break;
                        }
                        None => break,
                    }
                },
                Err(e) => warn!(error = %e, "cannot watch the status bucket"),
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }

    async fn on_status_entry(&self, entry: async_nats::jetstream::kv::Entry) {
        if entry.operation != async_nats::jetstream::kv::Operation::Put {
            return;
        }
        let Some((device, job)) = parse_key(&entry.key) else {
            warn!(key = %entry.key, "status under a malformed key ignored");
            return;
        };
        let status: JobStatus = match serde_json::from_slice(&entry.value) {
            Ok(status) => status,
            Err(e) => {
                warn!(key = %entry.key, error = %e, "unreadable status ignored");
                return;
            }
        };
        if status.job_id != job {
            warn!(key = %entry.key, "status names another job than its key; ignored");
            return;
        }
        match self.intake.on_status(&device, status) {
            Ok(
                StatusOutcome::Stored { terminal: true }
                | StatusOutcome::Ignored { terminal: true },
            ) => {
                // The run is decided for this device: withdraw the intent.
                // Terminal status stays in its bucket for bounded diagnostics.
                if let Err(e) = self.buckets.intents.delete(&entry.key).await {
                    debug!(key = %entry.key, error = %e, "cannot remove a terminal intent");
                }
            }
            Ok(StatusOutcome::Stored { .. } | StatusOutcome::Ignored { .. }) => {}
            Ok(StatusOutcome::Refused(reason)) => {
                warn!(key = %entry.key, %reason, "status refused")
            }
            Err(e) => warn!(key = %entry.key, error = %e, "cannot store a status"),
        }
    }

    async fn heartbeats(self: Arc<Self>, shutdown: CancellationToken) {
        let mut subscription = match self
            .buckets
            .client
            .subscribe(format!("{HEARTBEAT_PREFIX}.*"))
            .await
        {
            Ok(subscription) => subscription,
            Err(e) => {
                warn!(error = %e, "cannot subscribe to heartbeats");
                return;
            }
        };
        loop {
            let message = tokio::select! {
                message = subscription.next() => message,
                _ = shutdown.cancelled() => return,
            };
            let Some(message) = message else { return };
            let device = message
                .subject
                .as_str()
                .rsplit('.')
                .next()
                .and_then(|d| DeviceId::new(d).ok());
            let Some(device) = device else { continue };
            let heartbeat: Heartbeat = match serde_json::from_slice(&message.payload) {
                Ok(heartbeat) => heartbeat,
                Err(e) => {
                    debug!(device = %device, error = %e, "unreadable heartbeat ignored");
                    continue;
                }
            };
            match self.intake.on_heartbeat(&device, &heartbeat, TRANSPORT) {
                Ok(Some(problem)) => warn!(device = %device, %problem, "heartbeat refused"),
                Ok(None) => {}
                Err(e) => warn!(device = %device, error = %e, "cannot record a heartbeat"),
            }
        }
    }
}
