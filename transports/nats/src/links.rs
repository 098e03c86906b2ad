//! The control plane's side of the NATS mapping as an agent link. Intents
//! are put into the intent bucket (republished to each device's subject) and
//! deleted once decided. A status arrives as a request on its device's
//! status subject; the replica that takes it (a queue group) checks it (a
//! job whose intent it put itself is known given; any other is looked up
//! in the intent bucket) and
//! puts it into the status bucket under its job's key, then answers (a
//! status of a job it was never given, the agent's own assessment, goes to
//! the delivery core directly, which keeps or refuses it). The
//! delivery core reads statuses from one watch over that bucket, resumed
//! after the last position the control plane committed, so a status stored
//! by a replica that then died is still handed over. Hellos (answered
//! through the same queue group, only into the device's own inbox) and
//! heartbeats (the heartbeats module) come from plain subjects.

use crate::parsed::ParsedStatuses;
use crate::server::Buckets;
use crate::subjects::{Messages, own_inbox, reply_hello, status_event};
use crate::{HELLO_PREFIX, HELLO_QUEUE, MAX_VALUE_BYTES, STATUS_PREFIX, StatusReply, key};
use drover_contract::BoxFuture;
use drover_contract::link::{
    AgentHello, AgentLinks, Answer, Delivered, Event, HealthCell, Inbound, LinkError, LinkHealth,
    LinkState, Reply,
};
use drover_model::model::{Hello, Intent, JobStatus};
use drover_model::{DeviceId, JobId};
use futures_util::StreamExt;
use jiff::Timestamp;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub const TRANSPORT: drover_model::transport::Transport = drover_model::transport::Transport::Nats;
/// How long a hello waits for the delivery core.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// Status requests checked and stored at once; more wait in the
/// subscription (and past its limit, the agents send them again).
const STATUSES_IN_FLIGHT: usize = 256;

pub struct NatsLinks {
    pub(crate) buckets: Buckets,
    events: mpsc::Sender<Event>,
    /// The status watch's health: up once it follows the bucket, stalled
    /// when its watchdog finds it stopped short.
    health: HealthCell,
    /// Which backlogs are read: the link has caught up once both are.
    backlog: std::sync::Mutex<Backlog>,
    /// What lets devices join (the joining module), once handed over.
    pub(crate) joining: tokio::sync::watch::Sender<Option<Arc<Joining>>>,
    /// Log requests this replica sent and waits on.
    logs: Arc<drover_contract::logs::Waiters>,
    /// The job keys this replica put into the intent bucket and has not
    /// withdrawn: a status of one of them was given to its device, as the
    /// bucket's entry would prove, without asking the bucket (two messages
    /// and a round trip a status). A key not here (another replica's, or
    /// one put before a restart) is looked up in the bucket.
    given: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Statuses this replica put into the status bucket, as it read them,
    /// until its watch hands them over: each is read from JSON once.
    parsed: std::sync::Mutex<ParsedStatuses>,
    /// The devices heard from, which size the reconnect window.
    pub(crate) fleet: crate::spread::Fleet,
}

/// The most job keys [`NatsLinks::given`] remembers (about 25 MiB): five
/// undecided jobs for each of 50,000 devices; past it, statuses of the keys
/// it could not keep are checked in the bucket.
const GIVEN_KEYS: usize = 1 << 18;

/// What the link needs to let devices join (the joining module): the gate
/// that judges them, the keys that sign their JWTs, and a connection in the
/// system account that pushes the account's new JWT.
pub struct Joining {
    pub gate: Arc<dyn drover_contract::gate::DeviceGate>,
    pub authority: Arc<crate::authority::Authority>,
    pub system: async_nats::Client,
}

/// A readable status of the device that sent it, by whether the device was
/// given its job.
pub(crate) enum Checked {
    /// The intent bucket has (or had) the job's key: the status goes into
    /// the status bucket.
    Given(JobStatus),
    /// No intent ever named the job: the delivery core decides.
    NotGiven(JobStatus),
}

/// A backlog the link reads at its start.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Part {
    /// The status bucket, from the position the control plane committed.
    Watch,
    /// The held-status stream.
    Held,
}

#[derive(Debug, Default)]
struct Backlog {
    watch: bool,
    held: bool,
    said: bool,
}

fn link_error(e: impl std::fmt::Display) -> LinkError {
    LinkError {
        transport: TRANSPORT,
        reason: e.to_string(),
    }
}

impl NatsLinks {
    /// `logins_per_second`: what the servers take, which sizes the window
    /// agents spread their reconnects over (0: no window).
    pub fn new(buckets: Buckets, events: mpsc::Sender<Event>, logins_per_second: u32) -> Arc<Self> {
        Arc::new(Self {
            buckets,
            events,
            health: HealthCell::default(),
            backlog: Default::default(),
            joining: tokio::sync::watch::Sender::new(None),
            logs: Arc::default(),
            given: Default::default(),
            parsed: Default::default(),
            fleet: crate::spread::Fleet::new(logins_per_second),
        })
    }

    fn parsed(&self) -> std::sync::MutexGuard<'_, ParsedStatuses> {
        self.parsed.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn given(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.given.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks one backlog read; once both are, tells the delivery core the
    /// link has caught up. False only when the core is gone.
    pub(crate) async fn part_caught_up(&self, part: Part) -> bool {
        let say = {
            let mut backlog = self.backlog.lock().unwrap_or_else(|p| p.into_inner());
            match part {
                Part::Watch => backlog.watch = true,
                Part::Held => backlog.held = true,
            }
            let say = backlog.watch && backlog.held && !backlog.said;
            backlog.said |= say;
            say
        };
        !say || self.send(Inbound::CaughtUp).await
    }

    /// Runs the watchers until `shutdown`. Statuses are handed over from the
    /// bucket revision after `resume_after`.
    pub async fn run(self: Arc<Self>, resume_after: u64, shutdown: CancellationToken) {
        let statuses = tokio::spawn(self.clone().watch_statuses(resume_after, shutdown.clone()));
        let heartbeats = tokio::spawn(self.clone().heartbeats(shutdown.clone()));
        let hellos = tokio::spawn(self.clone().hellos(shutdown.clone()));
        let requests = tokio::spawn(self.clone().status_requests(shutdown.clone()));
        let held = tokio::spawn(self.clone().held_statuses(shutdown.clone()));
        let enrollments = tokio::spawn(self.clone().enrollments(shutdown.clone()));
        let logs = tokio::spawn(crate::logs::server::answers(
            self.buckets.client.clone(),
            self.logs.clone(),
            shutdown.clone(),
        ));
        shutdown.cancelled().await;
        logs.abort();
        enrollments.abort();
        statuses.abort();
        heartbeats.abort();
        hellos.abort();
        requests.abort();
        held.abort();
    }

    pub(crate) async fn send(&self, inbound: Inbound) -> bool {
        self.events
            .send(Event {
                transport: TRANSPORT,
                inbound,
            })
            .await
            .is_ok()
    }

    /// Hands over every status entry after `resume_after`, then follows new
    /// ones; after an error it resumes after the last one handed over.
    async fn watch_statuses(self: Arc<Self>, resume_after: u64, shutdown: CancellationToken) {
        let mut next = resume_after + 1;
        let mut caught_up = false;
        loop {
            // Everything up to the bucket's last revision now is backlog.
            let backlog_end = match crate::last_revision(&self.buckets.statuses).await {
                Ok(last) => Some(last),
                Err(e) => {
                    warn!(error = %e, "cannot read the status bucket's state");
                    None
                }
            };
            if !caught_up && backlog_end.is_some_and(|end| end < next) {
                caught_up = self.part_caught_up(Part::Watch).await;
            }
            match self.buckets.statuses.watch_all_from_revision(next).await {
                Ok(mut watch) => {
                    self.health.connected();
                    let mut check = crate::Watchdog::checks();
                    let mut dog = crate::Watchdog::default();
                    loop {
                        let entry = tokio::select! {
                            entry = watch.next() => entry,
                            _ = shutdown.cancelled() => return,
                            _ = check.tick() => {
                                let last = match crate::last_revision(&self.buckets.statuses).await {
                                    Ok(last) => Some(last),
                                    Err(e) => {
                                        warn!(error = %e, "cannot read the status bucket's state");
                                        None
                                    }
                                };
                                if dog.stalled(next - 1, last) {
                                    warn!(after = next - 1, last, "the status watch stopped short of the bucket; resuming");
                                    self.health.stalled(format!(
                                        "the status watch stopped at revision {} short of the bucket's {}; resuming",
                                        next - 1,
                                        last.map_or_else(|| "unknown last revision".to_owned(), |l| l.to_string())
                                    ));
                                    break;
                                }
                                continue;
                            }
                        };
                        match entry {
                            Some(Ok(entry)) => {
                                self.health.progress();
                                let revision = entry.revision;
                                let current = entry.seen_current
                                    || backlog_end.is_some_and(|end| revision >= end);
                                let parsed = self.parsed().take(revision, &entry.key);
                                if let Some(inbound) = status_event(entry, parsed)
                                    && !self.send(inbound).await
                                {
                                    return;
                                }
                                next = next.max(revision + 1);
                                if current && !caught_up {
                                    caught_up = self.part_caught_up(Part::Watch).await;
                                }
                            }
                            Some(Err(e)) => {
                                warn!(error = %e, after = next - 1, "status watch error; resuming");
                                break;
                            }
                            None => break,
                        }
                    }
                }
                Err(e) => {
                    warn!(error = %e, "cannot watch the status bucket");
                    self.health
                        .connecting(format!("cannot watch the status bucket: {e}"));
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }

    /// Answers agents' hellos (one replica each, through a queue group).
    async fn hellos(self: Arc<Self>, shutdown: CancellationToken) {
        let client = self.buckets.client.clone();
        let subscription = client
            .queue_subscribe(format!("{HELLO_PREFIX}.*"), HELLO_QUEUE.to_owned())
            .await;
        let Some(mut messages) = Messages::new(subscription, "hellos", &shutdown) else {
            return;
        };
        while let Some((device, message)) = messages.next().await {
            let Some(reply_to) = own_inbox(&device, &message, "hello") else {
                continue;
            };
            let answer = match serde_json::from_slice::<Hello>(&message.payload) {
                Err(e) => Some(format!("unreadable hello: {e}")),
                Ok(hello) if hello.device_id != device => Some(format!(
                    "hello names device {}, but came from {device}",
                    hello.device_id
                )),
                Ok(hello) => {
                    let (reply, answer) = Reply::channel();
                    let event = Inbound::Hello {
                        device: device.clone(),
                        hello: Box::new(AgentHello::from(hello)),
                        reply,
                    };
                    if !self.send(event).await {
                        return;
                    }
                    // Answered in its own task: hellos do not wait on each other.
                    let client = client.clone();
                    let reply_to = reply_to.clone();
                    self.fleet.heard(&device);
                    let window = self.fleet.window();
                    tokio::spawn(async move {
                        let answer = match tokio::time::timeout(ANSWER_TIMEOUT, answer).await {
                            Ok(Ok(Answer::Stored)) => Ok(window),
                            Ok(Ok(Answer::Refused(e) | Answer::Failed(e))) => Err(e),
                            Ok(Err(_)) | Err(_) => Err("the control plane did not answer".into()),
                        };
                        reply_hello(&client, reply_to, answer).await;
                    });
                    None
                }
            };
            if let Some(error) = answer {
                warn!(device = %device, %error, "hello refused");
                reply_hello(&client, reply_to, Err(error)).await;
            }
        }
    }

    /// Takes agents' statuses (one replica each, through a queue group):
    /// each is checked, put into the status bucket under its job's key and
    /// then answered, only into the device's own inbox.
    async fn status_requests(self: Arc<Self>, shutdown: CancellationToken) {
        let client = self.buckets.client.clone();
        let subscription = client
            .queue_subscribe(format!("{STATUS_PREFIX}.*"), HELLO_QUEUE.to_owned())
            .await;
        let Some(mut messages) = Messages::new(subscription, "statuses", &shutdown) else {
            return;
        };
        let slots = Arc::new(tokio::sync::Semaphore::new(STATUSES_IN_FLIGHT));
        while let Some((device, message)) = messages.next().await {
            let Some(reply_to) = own_inbox(&device, &message, "status") else {
                continue;
            };
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let links = self.clone();
            let client = client.clone();
            tokio::spawn(async move {
                let answer = links.store_status(&device, &message.payload).await;
                match &answer {
                    StatusReply::Stored => {}
                    StatusReply::Refused(reason) => {
                        warn!(device = %device, %reason, "status refused")
                    }
                    StatusReply::Failed(reason) => {
                        warn!(device = %device, %reason, "status not stored")
                    }
                }
                if let Ok(payload) = serde_json::to_vec(&answer)
                    && let Err(e) = client.publish(reply_to, payload.into()).await
                {
                    debug!(error = %e, "cannot answer a status");
                }
                drop(slot);
            });
        }
    }

    /// Checks one status a device sent and puts it into the status bucket
    /// under its job's key; a status of a job the device was not given goes
    /// to the delivery core instead (see [`Self::hand_to_core`]).
    async fn store_status(&self, device: &DeviceId, payload: &[u8]) -> StatusReply {
        let status = match self.check_status(device, payload).await {
            Ok(Checked::Given(status)) => status,
            Ok(Checked::NotGiven(status)) => return self.hand_to_core(device, status).await,
            Err(answer) => return answer,
        };
        let job_key = key(device, status.job_id);
        match self
            .buckets
            .statuses
            .put(&job_key, payload.to_vec().into())
            .await
        {
            Ok(revision) => {
                self.parsed().keep(revision, job_key, Box::new(status));
                StatusReply::Stored
            }
            Err(e) => StatusReply::Failed(format!("cannot store the status: {e}")),
        }
    }

    /// A status of a job the control plane never gave this device: the
    /// agent's own patch assessment, or a forgery. It is not put into the
    /// status bucket, whose keys a device may fill only for jobs it was
    /// given; it is handed to the delivery core directly, as the WebSocket
    /// link hands every status, and the core's answer is the device's. The
    /// core keeps what it knows how to keep (a local assessment's report as
    /// the device's latest, one record per device) and refuses the rest.
    async fn hand_to_core(&self, device: &DeviceId, status: JobStatus) -> StatusReply {
        let (reply, answer) = Reply::channel();
        let event = Inbound::Status {
            device: device.clone(),
            status: Box::new(status),
            received_at: Timestamp::now(),
            position: None,
            reply,
        };
        if !self.send(event).await {
            return StatusReply::Failed("the control plane is stopping".into());
        }
        match tokio::time::timeout(ANSWER_TIMEOUT, answer).await {
            Ok(Ok(Answer::Stored)) => StatusReply::Stored,
            Ok(Ok(Answer::Refused(reason))) => StatusReply::Refused(reason),
            Ok(Ok(Answer::Failed(reason))) => StatusReply::Failed(reason),
            Ok(Err(_)) | Err(_) => StatusReply::Failed("the control plane did not answer".into()),
        }
    }

    /// A status a device sent, if it may be taken: each at most
    /// [`MAX_VALUE_BYTES`], readable and naming the device that sent it;
    /// whether the device was given its job (an entry in the intent bucket,
    /// a deleted one included, proves that) decides where it goes. Else why
    /// not (Refused), or why not now (Failed).
    pub(crate) async fn check_status(
        &self,
        device: &DeviceId,
        payload: &[u8],
    ) -> Result<Checked, StatusReply> {
        if payload.len() > MAX_VALUE_BYTES as usize {
            return Err(StatusReply::Refused(format!(
                "a status of {} bytes is larger than the {MAX_VALUE_BYTES} bytes allowed",
                payload.len()
            )));
        }
        let status: JobStatus = serde_json::from_slice(payload)
            .map_err(|e| StatusReply::Refused(format!("unreadable status: {e}")))?;
        if &status.device_id != device {
            return Err(StatusReply::Refused(format!(
                "the status names device {}, but came from {device}",
                status.device_id
            )));
        }
        let job_key = key(device, status.job_id);
        if self.given().contains(&job_key) {
            return Ok(Checked::Given(status));
        }
        match self.buckets.intents.entry(job_key).await {
            Ok(Some(_)) => Ok(Checked::Given(status)),
            Ok(None) => Ok(Checked::NotGiven(status)),
            Err(e) => Err(StatusReply::Failed(format!(
                "cannot read the intent bucket: {e}"
            ))),
        }
    }
}

impl NatsLinks {
    /// Puts what the intent bucket keeps for a device's job (the signed
    /// intent, or the signed cancel order in its place); returns its revision.
    async fn put(
        &self,
        device: &DeviceId,
        job_id: JobId,
        signed: &serde_json::Value,
    ) -> Result<u64, LinkError> {
        let payload = serde_json::to_vec(signed).map_err(link_error)?;
        let job_key = key(device, job_id);
        let revision = self
            .buckets
            .intents
            .put(&job_key, payload.into())
            .await
            .map_err(link_error)?;
        let mut given = self.given();
        if given.len() < GIVEN_KEYS {
            given.insert(job_key);
        }
        Ok(revision)
    }
}

impl AgentLinks for NatsLinks {
    fn transport(&self) -> drover_model::transport::Transport {
        TRANSPORT
    }

    fn brokered(&self) -> bool {
        true
    }

    fn health(&self) -> LinkHealth {
        let mut health = self.health.get();
        let connection = self.buckets.client.connection_state();
        if connection != async_nats::connection::State::Connected {
            health.state = LinkState::Connecting;
            health.reason = Some(format!("not connected to NATS ({connection})"));
        }
        health
    }

    fn deliver<'a>(
        &'a self,
        intent: &'a Intent,
        signed: &'a serde_json::Value,
        _server_time: Timestamp,
    ) -> BoxFuture<'a, Result<Delivered, LinkError>> {
        Box::pin(async move {
            let revision = self.put(&intent.device_id, intent.job_id, signed).await?;
            info!(job_id = %intent.job_id, device = %intent.device_id, revision, "intent put");
            Ok(Delivered::Sent)
        })
    }

    fn cancel<'a>(
        &'a self,
        device: &'a DeviceId,
        job_id: JobId,
        signed: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<Delivered, LinkError>> {
        Box::pin(async move {
            // The order takes the intent's key: an agent that reads its keys
            // after a reconnect finds the order, never the intent.
            let revision = self.put(device, job_id, signed).await?;
            info!(job_id = %job_id, device = %device, revision, "cancel order put");
            Ok(Delivered::Sent)
        })
    }

    fn logs<'a>(
        &'a self,
        device: &'a DeviceId,
        job: Option<String>,
        tail: Option<u32>,
    ) -> BoxFuture<'a, Result<drover_contract::logs::LogStream, drover_contract::logs::AskError>>
    {
        Box::pin(async move {
            let stream = self.logs.open(device, job, tail)?;
            let payload = serde_json::to_vec(&stream.request).map_err(link_error)?;
            let subject = crate::logs::request_subject(device);
            self.buckets
                .client
                .publish(subject, payload.into())
                .await
                .map_err(link_error)?;
            Ok(stream)
        })
    }

    fn withdraw<'a>(
        &'a self,
        device: &'a DeviceId,
        job_id: JobId,
    ) -> BoxFuture<'a, Result<(), LinkError>> {
        Box::pin(async move {
            let job_key = key(device, job_id);
            self.buckets
                .intents
                .delete(&job_key)
                .await
                .map_err(link_error)?;
            // Its delete marker still proves the job was given.
            self.given().remove(&job_key);
            Ok(())
        })
    }
}
