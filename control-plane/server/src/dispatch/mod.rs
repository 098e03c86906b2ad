//! The delivery core: the one place where the control plane meets agents,
//! whatever the transport and whatever the kind of work. Links (one per
//! transport) hand it inbound events; it applies them to the store in
//! batches (every event that arrives together shares one commit) and
//! answers each only after its commit; it delivers what the engine releases
//! through the device's link, and one sweeper sends again what was not
//! acknowledged and expires what was never taken. The delivery rules are
//! the pure [`delivery::step`]; this is the shell that runs their effects.
//!
//! In memory (rebuilt from the store at start, and from the store's change
//! feed as other replicas write): the open jobs and their delivery state,
//! and each device's presence. Heartbeats and last-seen times stay in
//! memory and reach the store only when something material changed or the
//! stored time is older than [`PRESENCE_PERSIST`].

use crate::auth::IntentSigner;
use drover_contract::kv::{Change, Op};
use drover_contract::link::{
    AgentHello, AgentLinks, Answer, Delivered, Event, Inbound, LinkError, Reply,
};
use drover_model::DeviceId;
use drover_model::model::{Heartbeat, Intent, JobState, JobStatus};
use drover_model::transport::Transport;
use drover_rules::delivery::{self, Cancel, DeliveryEvent, Effect, JobFacts};
use drover_rules::records::{Delivery, DeviceRecord, JobDelivery, device_key};
use drover_rules::state::JobPhase;
use drover_store::db::{Db, DbError};
use jiff::{SignedDuration, Timestamp};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

mod agents;
use drover_rules::clean;
mod feed;
mod intake;
mod outbound;
mod presence;

use clean::{MAX_REPORTED, bounded_status, check_reported, check_text};
pub use presence::{Live, ONLINE_WINDOW, Presence};

/// A stored last-seen time older than this is written again.
pub const PRESENCE_PERSIST: SignedDuration = SignedDuration::from_secs(300);
/// Upper bound of events applied in one commit.
const MAX_BATCH: usize = 8192;
/// Upper bound of deliveries in flight at once.
const MAX_IN_FLIGHT: usize = 512;
/// How long a small batch waits for more events before its commit, when
/// events keep coming.
const GATHER: Duration = Duration::from_millis(3);
/// How often a batch that lost a revision race is tried again.
const ROUNDS: usize = 5;
/// How long events nobody waits on (statuses a broker handed over) are
/// committed again while the store fails; their cursor does not move past
/// them meanwhile, so a restart reads them again too.
const STORE_RETRY: Duration = Duration::from_secs(300);

#[derive(Debug, Clone)]
pub struct DispatchSettings {
    /// A job sent but not acknowledged within this is sent again.
    pub ack_timeout: Duration,
}

/// A job not yet decided, as the delivery core tracks it.
#[derive(Debug, Clone)]
struct OpenJob {
    intent: Intent,
    delivery: Delivery,
    /// The state of its latest stored status, if any.
    reported: Option<JobState>,
    /// The stored revision this state reflects.
    revision: u64,
    /// When a delivery was last tried; None: never.
    last_attempt: Option<Timestamp>,
    cancel: Cancel,
    /// Its acknowledgement is in the delivery histogram (or came before
    /// this process tracked it).
    ack_observed: bool,
}

impl OpenJob {
    fn facts(&self) -> JobFacts {
        JobFacts {
            delivery: self.delivery.clone(),
            has_status: self.reported.is_some(),
            finished: false,
            expires_at: self.intent.expires_at,
            cancel: self.cancel,
        }
    }
}

/// A write of a batch: its key and the record it put.
type Written = (
    String,
    Option<JobDelivery>,
    Option<(DeviceId, DeviceRecord)>,
);

/// The writes one batch of events makes, and what follows their commit.
#[derive(Default)]
struct Work {
    jobs: HashMap<String, (u64, JobDelivery)>,
    devices: HashMap<String, (u64, DeviceRecord)>,
    /// Installed packages from inventory results (`inventory/<device>`).
    inventories: HashMap<String, (u64, drover_rules::deployment::DeviceInventory)>,
    /// Each device's latest patch assessment (`assessments/<device>`).
    assessments: HashMap<String, (u64, drover_rules::patch::DeviceAssessment)>,
    cursors: HashMap<Transport, u64>,
    /// Alerts this batch raises, created once (a conflict means it exists).
    alerts: Vec<(String, drover_rules::records::AlertRecord)>,
    /// Brokers whose backlog is handed over once this batch is committed.
    caught_up: Vec<Transport>,
    /// Per event: its reply, its answer, the keys it wrote, its effects.
    outcomes: Vec<EventOutcome>,
}

struct EventOutcome {
    reply: Option<Reply>,
    answer: Answer,
    keys: Vec<String>,
    effects: Vec<(String, Effect)>,
    /// The event itself, to run again if its keys lost a revision race.
    retry: Option<Event>,
}

pub fn job_key(device: &DeviceId, job: drover_model::JobId) -> String {
    drover_rules::records::job_key(device, job)
}

pub struct Dispatcher {
    db: Db,
    links: HashMap<Transport, Arc<dyn AgentLinks>>,
    settings: DispatchSettings,
    open: HashMap<String, OpenJob>,
    by_device: HashMap<DeviceId, HashSet<String>>,
    /// Stored device records as last read or written, with their revision.
    devices: HashMap<DeviceId, (u64, DeviceRecord)>,
    presence: Arc<Presence>,
    /// Broker links that have not handed over their backlog yet.
    behind: HashSet<Transport>,
    caught_up: watch::Sender<bool>,
    in_flight: JoinSet<(Flight, Transport, Result<Delivered, LinkError>)>,
    queued: VecDeque<String>,
    /// The keys in `queued`, so a key is queued once.
    queued_keys: HashSet<String>,
    signer: Arc<IntentSigner>,
    /// Attaches what a job needs as it goes out (links, sealed secrets).
    enricher: Option<Arc<crate::secrets::Enricher>>,
    /// Where every decision reads the time.
    clock: Arc<dyn Clock>,
}

/// Where the delivery core reads the time: the wall clock when it serves,
/// a clock the test moves in its unit tests.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Timestamp;
}

/// The wall clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// What went out over a link, to handle its result.
enum Flight {
    /// The intent of the job at this key.
    Intent(String),
    /// The cancel order of the job at this key.
    Cancel(String),
    Withdrawal,
}

/// What the engine sends the delivery core: job keys it just released.
pub type Released = mpsc::UnboundedSender<Vec<String>>;

impl Dispatcher {
    pub fn new(
        db: Db,
        links: Vec<Arc<dyn AgentLinks>>,
        settings: DispatchSettings,
        presence: Arc<Presence>,
        caught_up: watch::Sender<bool>,
        signer: Arc<IntentSigner>,
    ) -> Self {
        let behind: HashSet<Transport> = links
            .iter()
            .filter(|l| l.brokered())
            .map(|l| l.transport())
            .collect();
        if behind.is_empty() {
            caught_up.send_replace(true);
        }
        Self {
            db,
            links: links.into_iter().map(|l| (l.transport(), l)).collect(),
            settings,
            open: HashMap::new(),
            by_device: HashMap::new(),
            devices: HashMap::new(),
            presence,
            behind,
            caught_up,
            in_flight: JoinSet::new(),
            queued: VecDeque::new(),
            queued_keys: HashSet::new(),
            signer,
            enricher: None,
            clock: Arc::new(SystemClock),
        }
    }

    /// Decisions read the time from `clock` (tests).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Jobs get what they need attached by `enricher` as they go out.
    pub fn with_enricher(mut self, enricher: Arc<crate::secrets::Enricher>) -> Self {
        self.enricher = Some(enricher);
        self
    }

    fn ack_timeout(&self) -> SignedDuration {
        SignedDuration::try_from(self.settings.ack_timeout).unwrap_or(SignedDuration::MAX)
    }

    /// Runs until `shutdown`.
    pub async fn run(
        mut self,
        mut events: mpsc::Receiver<Event>,
        mut released: mpsc::UnboundedReceiver<Vec<String>>,
        shutdown: CancellationToken,
    ) {
        let mut feed = self.db.changes();
        if let Err(e) = self.load().await {
            warn!(error = %e, "cannot load the open jobs; the sweeper will find them");
        }
        let period = sweep_period(self.settings.ack_timeout);
        let mut sweep = tokio::time::interval(period);
        let mut flush = tokio::time::interval(Duration::from_secs(60));
        let mut last_done = std::time::Instant::now()
            .checked_sub(GATHER)
            .unwrap_or_else(std::time::Instant::now);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                event = events.recv() => {
                    let Some(first) = event else { return };
                    let arrived = std::time::Instant::now();
                    let mut batch = vec![first];
                    drain(&mut events, &mut batch);
                    // Group commit: while events keep coming (the last
                    // batch ended moments ago), a small batch waits a few
                    // milliseconds for company and shares one commit and
                    // one fsync with it; an event that finds the core idle
                    // is committed at once, so a lone acceptance waits for
                    // nothing.
                    if batch.len() < MAX_BATCH / 8 && last_done.elapsed() < GATHER {
                        tokio::time::sleep(GATHER).await;
                        drain(&mut events, &mut batch);
                    }
                    let events = batch.len();
                    self.handle(batch).await;
                    last_done = std::time::Instant::now();
                    // Every event of the batch waited as long as its first.
                    let intake = crate::metrics::seconds(arrived);
                    for _ in 0..events {
                        crate::metrics::metrics().status_intake_seconds.observe(intake);
                    }
                }
                keys = released.recv() => {
                    let Some(mut keys) = keys else { continue };
                    while let Ok(more) = released.try_recv() {
                        keys.extend(more);
                    }
                    self.released(keys).await;
                }
                change = feed.recv() => match change {
                    Ok(change) => {
                        let mut changes = vec![change];
                        while let Ok(more) = feed.try_recv() {
                            changes.push(more);
                        }
                        self.changed(changes).await;
                    }
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        debug!(missed, "the change feed ran ahead; reloading the open jobs");
                        if let Err(e) = self.load().await {
                            warn!(error = %e, "cannot reload the open jobs");
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                done = self.in_flight.join_next(), if !self.in_flight.is_empty() => {
                    if let Some(Ok((flight, transport, result))) = done {
                        self.delivered(flight, transport, result);
                    }
                    self.start_queued();
                }
                _ = sweep.tick() => self.sweep().await,
                _ = flush.tick() => self.flush_presence().await,
            }
        }
    }

    /// Reads every undecided job from the store (at start, or after the
    /// change feed ran ahead).
    async fn load(&mut self) -> Result<(), DbError> {
        let now = self.clock.now();
        let jobs = self.db.list::<JobDelivery>("jobs/").await?;
        let mut count = 0usize;
        for (key, revision, job) in jobs {
            let remembered = self
                .open
                .get(&key)
                .map(|o| (o.delivery.clone(), o.last_attempt));
            if self.track(&key, revision, &job) {
                count += 1;
                if let Some(open) = self.open.get_mut(&key) {
                    match remembered {
                        Some((delivery, attempt)) => {
                            if matches!(delivery, Delivery::Sent { .. } | Delivery::Acked { .. })
                                && open.delivery == Delivery::Created
                            {
                                open.delivery = delivery;
                            }
                            open.last_attempt = attempt;
                        }
                        // Found at start: whoever released it may have sent
                        // it; the sweeper or a hello sends it again if needed.
                        None => open.last_attempt = Some(now),
                    }
                }
            }
        }
        info!(open = count, "undecided jobs loaded");
        Ok(())
    }

    /// Tracks a stored job; returns whether it is open (undecided).
    fn track(&mut self, key: &str, revision: u64, job: &JobDelivery) -> bool {
        let finished = job.status.as_ref().is_some_and(|s| s.state.is_terminal());
        let expired = matches!(job.delivery, Delivery::Expired { .. });
        if finished || expired {
            self.forget(key);
            return false;
        }
        let device = job.intent.device_id.clone();
        let entry = self.open.entry(key.to_owned()).or_insert_with(|| OpenJob {
            intent: job.intent.clone(),
            delivery: job.delivery.clone(),
            reported: job.status.as_ref().map(|s| s.state),
            revision,
            last_attempt: None,
            cancel: Cancel::NotRequested,
            ack_observed: matches!(job.delivery, Delivery::Acked { .. }),
        });
        entry.revision = entry.revision.max(revision);
        if job.cancel_requested_at.is_some() && entry.cancel == Cancel::NotRequested {
            entry.cancel = Cancel::Requested;
        }
        if let Some(status) = &job.status {
            entry.reported = Some(status.state);
        }
        // A stored Acked wins over an in-memory Created or Sent.
        if matches!(job.delivery, Delivery::Acked { .. }) {
            entry.delivery = job.delivery.clone();
        }
        self.by_device
            .entry(device)
            .or_default()
            .insert(key.to_owned());
        true
    }

    fn forget(&mut self, key: &str) {
        if let Some(job) = self.open.remove(key)
            && let Some(keys) = self.by_device.get_mut(&job.intent.device_id)
        {
            keys.remove(key);
            if keys.is_empty() {
                self.by_device.remove(&job.intent.device_id);
            }
        }
    }

    /// The engine released these jobs: deliver them now.
    async fn released(&mut self, keys: Vec<String>) {
        let now = self.clock.now();
        for key in keys {
            if !self.open.contains_key(&key) {
                match self.db.get::<JobDelivery>(&key).await {
                    Ok(Some((revision, job))) => {
                        self.track(&key, revision, &job);
                    }
                    Ok(None) => continue,
                    Err(e) => {
                        warn!(key, error = %e, "cannot read a released job");
                        continue;
                    }
                }
            }
            self.ensure_device(&key).await;
            self.consider(&key, now);
        }
        self.start_queued();
    }

    /// Every undecided job of a device reached over `transport` is sent
    /// again (its broker lost what it kept).
    async fn resend(&mut self, transport: Transport) -> Vec<(String, Effect)> {
        let keys: Vec<String> = self.open.keys().cloned().collect();
        let mut effects = Vec::new();
        for key in keys {
            self.ensure_device(&key).await;
            let over = self
                .link_for_key(&key)
                .is_some_and(|link| link.transport() == transport);
            if let Some(job) = self.open.get_mut(&key)
                && over
                && !matches!(job.delivery, Delivery::Expired { .. })
            {
                // An order that got out to the lost broker is out no more.
                if job.cancel == Cancel::OrderOut {
                    job.cancel = Cancel::Requested;
                }
                let (delivery, effect) = delivery::step(&job.facts(), &DeliveryEvent::BrokerLost);
                job.delivery = delivery;
                effects.extend(effect.into_iter().map(|e| (key.clone(), e)));
            }
        }
        info!(
            %transport,
            jobs = effects.len(),
            "the broker lost its state; sending undecided intents again"
        );
        effects
    }

    /// Reads the device's record into the cache if it is not there: the
    /// link a device is reached through may come from it.
    async fn ensure_device(&mut self, key: &str) {
        let Some(device) = self.open.get(key).map(|o| o.intent.device_id.clone()) else {
            return;
        };
        if self.devices.contains_key(&device) || self.presence.get(&device).is_some() {
            return;
        }
        match self.db.get::<DeviceRecord>(&device_key(&device)).await {
            Ok(Some(found)) => {
                self.devices.insert(device, found);
            }
            Ok(None) => {}
            Err(e) => warn!(device = %device, error = %e, "cannot read a device record"),
        }
    }

    /// Runs the delivery step of `Consider` for an open job.
    fn consider(&mut self, key: &str, now: Timestamp) {
        let Some(job) = self.open.get_mut(key) else {
            return;
        };
        let (delivery, effects) = delivery::step(&job.facts(), &DeliveryEvent::Consider { now });
        job.delivery = delivery;
        for effect in effects {
            self.effect(key.to_owned(), effect);
        }
    }
}

/// How often the sweeper runs: a sixtieth of the ack timeout, between
/// 200 ms and a second, so a job with no ack goes back to created at the
/// timeout give or take a second (a quarter of it, as before, let 60 s
/// become 75). The sweep reads memory only; each job is sent again at most
/// once per timeout however often it runs.
fn sweep_period(ack_timeout: Duration) -> Duration {
    (ack_timeout / 60).clamp(Duration::from_millis(200), Duration::from_secs(1))
}

/// Records what a committed record of an open job shows: its first
/// acknowledgement (how long delivery took, on the control plane's clock),
/// its terminal status.
fn observe_commit(open: &mut OpenJob, job: &JobDelivery) {
    let metrics = crate::metrics::metrics();
    if let Delivery::Acked { at } = job.delivery
        && !open.ack_observed
    {
        open.ack_observed = true;
        let took = at.duration_since(job.created_at).as_secs_f64().max(0.0);
        metrics.delivery_seconds.observe(took);
    }
    if job.status.as_ref().is_some_and(|s| s.state.is_terminal()) {
        count_decided(job);
    }
}

/// Counts a decided job under the state the API shows for it.
fn count_decided(job: &JobDelivery) {
    crate::metrics::metrics()
        .jobs_finished
        .get_or_create(&vec![
            ("state", JobPhase::of_job(job).name().into()),
            ("kind", job.intent.kind.name().into()),
        ])
        .inc();
}

/// The undecided jobs by state (the same names the API, the CLI and the
/// dashboard show) and kind, for the gauge.
fn undecided_counts<'a>(
    open: impl Iterator<Item = &'a OpenJob>,
) -> HashMap<(&'static str, &'static str), i64> {
    let mut counts = HashMap::new();
    for job in open {
        let cancel = job.cancel != Cancel::NotRequested;
        let state = JobPhase::of(&job.delivery, job.reported, cancel).name();
        *counts.entry((state, job.intent.kind.name())).or_insert(0) += 1;
    }
    counts
}

fn drain(events: &mut mpsc::Receiver<Event>, batch: &mut Vec<Event>) {
    while batch.len() < MAX_BATCH {
        match events.try_recv() {
            Ok(next) => batch.push(next),
            Err(_) => break,
        }
    }
}

fn take_reply(event: &mut Event) -> Option<Reply> {
    match &mut event.inbound {
        Inbound::Hello { reply, .. }
        | Inbound::Status { reply, .. }
        | Inbound::Heartbeat { reply, .. } => Some(std::mem::replace(reply, Reply::none())),
        Inbound::Ack { .. } | Inbound::Gone { .. } | Inbound::CaughtUp | Inbound::Resend => None,
    }
}

fn put_reply(event: &mut Event, reply: Option<Reply>) {
    let Some(reply) = reply else { return };
    match &mut event.inbound {
        Inbound::Hello { reply: slot, .. }
        | Inbound::Status { reply: slot, .. }
        | Inbound::Heartbeat { reply: slot, .. } => *slot = reply,
        Inbound::Ack { .. } | Inbound::Gone { .. } | Inbound::CaughtUp | Inbound::Resend => {}
    }
}

/// Where a transport's replay position is kept: every status up to it is committed.
pub fn cursor_key(transport: Transport) -> String {
    format!("cursors/{transport}")
}

fn parse_job_key(key: &str) -> Option<(DeviceId, drover_model::JobId)> {
    let mut parts = key.strip_prefix("jobs/")?.splitn(2, '/');
    let device = DeviceId::new(parts.next()?).ok()?;
    let job = parts.next()?.parse().ok()?;
    Some((device, job))
}
#[cfg(test)]
mod tests;
