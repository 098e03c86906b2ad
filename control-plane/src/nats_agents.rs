//! The agents' side of the control plane over NATS JetStream. Intents the
//! engine releases to NATS-connected devices are put into the intent bucket;
//! statuses are read from a watch over the status bucket (one consumer for the
//! whole fleet, on the control plane's side) that resumes after the last
//! revision processed, kept in the store, so a status put while no control
//! plane ran is still processed; they are accepted only for the right device
//! and attempt; a terminal status removes its intent; heartbeats on
//! `drover.heartbeat.<device>` and hellos on `drover.hello.<device>` feed the
//! registry. The control plane is the source of truth: an intent the bucket
//! lost, or an agent lacks after a hello, is put again.

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
use transport_nats::{
    HEARTBEAT_PREFIX, HELLO_PREFIX, HELLO_QUEUE, Hello, HelloReply, inbox_prefix, key, parse_key,
};

/// Where the status watch's progress is kept: every status bucket revision
/// up to this one has been processed by some replica.
const STATUS_CURSOR_KEY: &str = "cursors/nats-status";
/// How often the cursor is written while statuses flow.
const CURSOR_EVERY: Duration = Duration::from_secs(1);

pub const TRANSPORT: &str = "nats";

pub struct NatsAgents {
    pub db: Db,
    pub hub: Arc<Hub>,
    pub intake: Intake,
    pub buckets: Buckets,
    /// Set once the statuses put while this replica was not running are
    /// processed; the engine judges no deadline before (A12).
    pub caught_up: tokio::sync::watch::Sender<bool>,
}

impl NatsAgents {
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let statuses = tokio::spawn(self.clone().watch_statuses(shutdown.clone()));
        let heartbeats = tokio::spawn(self.clone().heartbeats(shutdown.clone()));
        let hellos = tokio::spawn(self.clone().hellos(shutdown.clone()));
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
        hellos.abort();
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

    /// The last status bucket revision processed by any replica.
    fn load_cursor(&self) -> Result<u64, DbError> {
        Ok(self
            .db
            .get::<u64>(STATUS_CURSOR_KEY)?
            .map(|(_, revision)| revision)
            .unwrap_or(0))
    }

    /// Moves the cursor forward (never back: another replica may be ahead).
    fn save_cursor(&self, revision: u64) -> Result<(), DbError> {
        self.db.update::<u64, _>(STATUS_CURSOR_KEY, |current| {
            (current.unwrap_or(0) < revision).then_some(revision)
        })?;
        Ok(())
    }

    /// Processes every status entry after the cursor, then follows new ones.
    /// A replica that crashed reads at most the last second of statuses
    /// again, which intake treats as duplicates.
    async fn watch_statuses(self: Arc<Self>, shutdown: CancellationToken) {
        let mut next = loop {
            match self.load_cursor() {
                Ok(cursor) => break cursor + 1,
                Err(e) => warn!(error = %e, "cannot read the status cursor; retrying"),
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = shutdown.cancelled() => return,
            }
        };
        let mut saved = next - 1;
        let mut save_tick = tokio::time::interval(CURSOR_EVERY);
        loop {
            // Everything up to the bucket's last revision now is backlog.
            let backlog_end = match self.buckets.statuses.status().await {
                Ok(status) => Some(status.info.state.last_sequence),
                Err(e) => {
                    warn!(error = %e, "cannot read the status bucket's state");
                    None
                }
            };
            if backlog_end.is_some_and(|end| end < next) {
                self.mark_caught_up(next - 1);
            }
            match self.buckets.statuses.watch_all_from_revision(next).await {
                Ok(mut watch) => loop {
                    let entry = tokio::select! {
                        entry = watch.next() => entry,
                        _ = save_tick.tick() => {
                            if saved + 1 < next {
                                match self.save_cursor(next - 1) {
                                    Ok(()) => saved = next - 1,
                                    Err(e) => warn!(error = %e, "cannot save the status cursor"),
                                }
                            }
                            continue;
                        }
                        _ = shutdown.cancelled() => return,
                    };
                    match entry {
                        Some(Ok(entry)) => {
                            let revision = entry.revision;
                            let current = entry.seen_current
                                || backlog_end.is_some_and(|end| revision >= end);
                            self.on_status_entry(entry).await;
                            next = next.max(revision + 1);
                            if current {
                                self.mark_caught_up(revision);
                            }
                        }
                        Some(Err(e)) => {
                            warn!(error = %e, after = next - 1, "status watch error; resuming");
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

    fn mark_caught_up(&self, revision: u64) {
        if !*self.caught_up.borrow() {
            info!(
                revision,
                "statuses put while this control plane was away are processed"
            );
            self.caught_up.send_replace(true);
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
        // When JetStream stored it: the broker's clock, which no device sets,
        // so a result put while no control plane ran counts from then (A12).
        let now = Timestamp::now();
        let received_at = Timestamp::from_nanosecond(entry.created.unix_timestamp_nanos())
            .map_or(now, |stored| stored.min(now));
        match self.intake.on_status(&device, status, received_at) {
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

    /// Answers agents' hellos (one replica each, through a queue group):
    /// records the agent, puts again what it lacks, replies with the time.
    async fn hellos(self: Arc<Self>, shutdown: CancellationToken) {
        let client = &self.buckets.client;
        let mut subscription = match client
            .queue_subscribe(format!("{HELLO_PREFIX}.*"), HELLO_QUEUE.to_owned())
            .await
        {
            Ok(subscription) => subscription,
            Err(e) => {
                warn!(error = %e, "cannot subscribe to hellos");
                return;
            }
        };
        loop {
            let message = tokio::select! {
                message = subscription.next() => message,
                _ = shutdown.cancelled() => return,
            };
            let Some(message) = message else { return };
            let Some(device) = message
                .subject
                .as_str()
                .rsplit('.')
                .next()
                .and_then(|d| DeviceId::new(d).ok())
            else {
                continue;
            };
            // Answer only into the device's own inbox: a reply subject is the
            // sender's to choose, and must not aim intents or replies at
            // another device's subjects (A11).
            let Some(reply_to) = message
                .reply
                .as_ref()
                .filter(|r| {
                    r.as_str()
                        .starts_with(&format!("{}.", inbox_prefix(&device)))
                })
                .cloned()
            else {
                warn!(device = %device, reply = ?message.reply, "hello without the device's own inbox ignored");
                continue;
            };
            let reply = match self.on_hello(&device, &message.payload) {
                Ok(()) => HelloReply {
                    server_time: Timestamp::now(),
                    error: None,
                },
                Err(error) => {
                    warn!(device = %device, %error, "hello refused");
                    HelloReply {
                        server_time: Timestamp::now(),
                        error: Some(error),
                    }
                }
            };
            if let Ok(payload) = serde_json::to_vec(&reply)
                && let Err(e) = client.publish(reply_to, payload.into()).await
            {
                debug!(device = %device, error = %e, "cannot answer a hello");
            }
        }
    }

    fn on_hello(&self, device: &DeviceId, payload: &[u8]) -> Result<(), String> {
        let hello: Hello =
            serde_json::from_slice(payload).map_err(|e| format!("unreadable hello: {e}"))?;
        if &hello.device_id != device {
            return Err(format!(
                "hello names device {}, but came from {device}",
                hello.device_id
            ));
        }
        self.intake
            .on_hello(
                device,
                &hello.agent_version,
                &hello.boot_id,
                &hello.capabilities,
                TRANSPORT,
            )
            .map_err(|e| e.to_string())?;
        if self
            .intake
            .resync(device, &hello.jobs)
            .map_err(|e| e.to_string())?
        {
            self.hub.notify(device);
        }
        info!(device = %device, held = hello.jobs.len(), "agent said hello over NATS");
        Ok(())
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
