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
use crate::db::{Db, DbError};
use crate::delivery::{self, Cancel, DeliveryEvent, Effect, JobFacts};
use crate::records::{Delivery, DeviceRecord, JobDelivery, device_key};
use crate::store::{Change, Op};
use agent_core::DeviceId;
use agent_core::model::{Heartbeat, Intent, JobStatus};
use drover_contract::link::{
    AgentHello, AgentLinks, Answer, Delivered, Event, Inbound, LinkError, Reply,
};
use jiff::{SignedDuration, Timestamp};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

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

/// What this replica knows of a device's connection right now.
#[derive(Debug, Clone, PartialEq)]
pub struct Live {
    pub transport: &'static str,
    pub connected: bool,
    pub last_seen: Timestamp,
    pub last_heartbeat: Option<Timestamp>,
}

/// Live presence, shared with the API so that it can show fresh times.
#[derive(Default)]
pub struct Presence {
    /// A std Mutex: nothing awaits while it is held.
    live: Mutex<HashMap<DeviceId, Live>>,
    /// Devices whose agent said hello since the engine last looked: a
    /// deployment with a pending target there passes at once.
    arrivals: Mutex<Arrivals>,
    arrived: tokio::sync::Notify,
}

#[derive(Default)]
struct Arrivals {
    devices: Vec<DeviceId>,
    /// More arrived than are kept: every deployment should pass.
    overflow: bool,
}

/// Arrivals kept between two looks of the engine.
const MAX_ARRIVALS: usize = 65_536;

/// How long a device counts as online after it was last seen (its stored
/// last-seen time is refreshed every [`PRESENCE_PERSIST`]).
pub const ONLINE_WINDOW: SignedDuration = SignedDuration::from_secs(2 * 300 + 60);

impl Presence {
    /// Whether the device is online: connected to this replica and seen
    /// lately, or (when another replica holds it) seen lately as stored.
    pub fn online(
        &self,
        device: &DeviceId,
        stored_last_seen: Option<Timestamp>,
        now: Timestamp,
    ) -> bool {
        let recent = |seen: Timestamp| now.duration_since(seen) <= ONLINE_WINDOW;
        match self.get(device) {
            Some(live) => live.connected && recent(live.last_seen),
            None => stored_last_seen.is_some_and(recent),
        }
    }

    /// For tests that play the fleet: the device was seen at `at`.
    #[cfg(test)]
    pub(crate) fn simulate_seen(&self, device: &DeviceId, at: Timestamp, arrived: bool) {
        self.update(device, |_| {
            Some(Live {
                transport: "simulated",
                connected: true,
                last_seen: at,
                last_heartbeat: Some(at),
            })
        });
        if arrived {
            self.arrive(device);
        }
    }

    /// For tests that play the fleet: the device's connection ended.
    #[cfg(test)]
    pub(crate) fn simulate_gone(&self, device: &DeviceId) {
        self.update(device, |live| {
            live.map(|l| Live {
                connected: false,
                ..l.clone()
            })
        });
    }

    fn arrive(&self, device: &DeviceId) {
        {
            let mut arrivals = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
            if arrivals.devices.len() < MAX_ARRIVALS {
                arrivals.devices.push(device.clone());
            } else {
                arrivals.overflow = true;
            }
        }
        self.arrived.notify_one();
    }

    /// Resolves when a device arrived (see [`Presence::take_arrivals`]).
    pub async fn arrived(&self) {
        self.arrived.notified().await
    }

    /// The devices that arrived since the last call; `true` when more did
    /// than were kept.
    pub fn take_arrivals(&self) -> (Vec<DeviceId>, bool) {
        let mut arrivals = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
        let taken = std::mem::take(&mut *arrivals);
        (taken.devices, taken.overflow)
    }

    pub fn get(&self, device: &DeviceId) -> Option<Live> {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(device)
            .cloned()
    }

    /// Devices connected to this replica, per transport.
    pub fn connected(&self) -> HashMap<&'static str, usize> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let mut counts = HashMap::new();
        for entry in live.values().filter(|l| l.connected) {
            *counts.entry(entry.transport).or_insert(0) += 1;
        }
        counts
    }

    fn update(&self, device: &DeviceId, change: impl FnOnce(Option<&mut Live>) -> Option<Live>) {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        match live.get_mut(device) {
            Some(entry) => {
                if let Some(new) = change(Some(entry)) {
                    *entry = new;
                }
            }
            None => {
                if let Some(new) = change(None) {
                    live.insert(device.clone(), new);
                }
            }
        }
    }
}

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
    has_status: bool,
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
            has_status: self.has_status,
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
    inventories: HashMap<String, (u64, crate::deployment::DeviceInventory)>,
    cursors: HashMap<&'static str, u64>,
    /// Alerts this batch raises, created once (a conflict means it exists).
    alerts: Vec<(String, crate::alerts::AlertRecord)>,
    /// Brokers whose backlog is handed over once this batch is committed.
    caught_up: Vec<&'static str>,
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

pub fn job_key(device: &DeviceId, job: agent_core::JobId) -> String {
    crate::records::job_key(device, job)
}

pub struct Dispatcher {
    db: Db,
    links: HashMap<&'static str, Arc<dyn AgentLinks>>,
    settings: DispatchSettings,
    open: HashMap<String, OpenJob>,
    by_device: HashMap<DeviceId, HashSet<String>>,
    /// Stored device records as last read or written, with their revision.
    devices: HashMap<DeviceId, (u64, DeviceRecord)>,
    presence: Arc<Presence>,
    /// Broker links that have not handed over their backlog yet.
    behind: HashSet<&'static str>,
    caught_up: watch::Sender<bool>,
    in_flight: JoinSet<(Flight, &'static str, Result<Delivered, LinkError>)>,
    queued: VecDeque<String>,
    /// The keys in `queued`, so a key is queued once.
    queued_keys: HashSet<String>,
    signer: Arc<IntentSigner>,
    /// Attaches what a job needs as it goes out (links, sealed secrets).
    enricher: Option<Arc<crate::secrets::Enricher>>,
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
        let behind: HashSet<&'static str> = links
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
        }
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
        let period = (self.settings.ack_timeout / 4).max(Duration::from_millis(200));
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
        let now = Timestamp::now();
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
            has_status: job.status.is_some(),
            revision,
            last_attempt: None,
            cancel: Cancel::NotRequested,
            ack_observed: matches!(job.delivery, Delivery::Acked { .. }),
        });
        entry.revision = entry.revision.max(revision);
        if job.cancel_requested_at.is_some() && entry.cancel == Cancel::NotRequested {
            entry.cancel = Cancel::Requested;
        }
        entry.has_status |= job.status.is_some();
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
        let now = Timestamp::now();
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
    async fn resend(&mut self, transport: &'static str) -> Vec<(String, Effect)> {
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
                if job.cancel != Cancel::NotRequested {
                    job.cancel = Cancel::Requested;
                    effects.push((key, Effect::SendCancel));
                    continue;
                }
                if !matches!(job.delivery, Delivery::Acked { .. }) || !job.has_status {
                    job.delivery = Delivery::Created;
                }
                effects.push((key, Effect::Send));
            }
        }
        info!(
            transport,
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

    /// Other writers changed these keys (another replica, the API, or this
    /// process: those are skipped by revision).
    async fn changed(&mut self, changes: Vec<Change>) {
        let now = Timestamp::now();
        let mut consider = Vec::new();
        let mut cancels = Vec::new();
        for change in changes {
            if change.key.starts_with("devices/") {
                if let Some(id) = change
                    .key
                    .strip_prefix("devices/")
                    .and_then(|id| DeviceId::new(id).ok())
                    && self
                        .devices
                        .get(&id)
                        .is_some_and(|(rev, _)| change.deleted || *rev < change.revision)
                {
                    self.devices.remove(&id);
                }
                continue;
            }
            if !change.key.starts_with("jobs/") {
                continue;
            }
            if change.deleted {
                // A deleted job that was undecided (its run ended at the
                // deadline while the device still had it): a broker forgets
                // its intent too.
                if self.open.contains_key(&change.key) {
                    self.effect(change.key.clone(), Effect::Withdraw);
                }
                self.forget(&change.key);
                continue;
            }
            if self
                .open
                .get(&change.key)
                .is_some_and(|o| o.revision >= change.revision)
            {
                continue;
            }
            let known = self.open.contains_key(&change.key);
            let canceling = self
                .open
                .get(&change.key)
                .is_some_and(|o| o.cancel != Cancel::NotRequested);
            match self.db.get::<JobDelivery>(&change.key).await {
                Ok(Some((revision, job))) => {
                    if self.track(&change.key, revision, &job) {
                        if !known {
                            consider.push(change.key);
                        } else if !canceling && job.cancel_requested_at.is_some() {
                            cancels.push(change.key);
                        }
                    }
                }
                Ok(None) => self.forget(&change.key),
                Err(e) => warn!(key = %change.key, error = %e, "cannot read a changed job"),
            }
        }
        // A job whose cancel was just requested: its order goes out now (from
        // every replica that tracks it; a second order changes nothing).
        for key in cancels {
            self.ensure_device(&key).await;
            if let Some(job) = self.open.get_mut(&key) {
                let (delivery, effects) = delivery::step(&job.facts(), &DeliveryEvent::Cancel);
                job.delivery = delivery;
                info!(job_id = %job.intent.job_id, device = %job.intent.device_id, "canceling the job");
                for effect in effects {
                    self.effect(key.clone(), effect);
                }
            }
        }
        // A job another writer released: a link that reaches the device
        // only from here (a WebSocket connection) delivers it now; a broker
        // link leaves it to its releaser, and takes over after the ack
        // timeout (the sweeper).
        for key in consider {
            self.ensure_device(&key).await;
            let brokered = self.link_for_key(&key).is_none_or(|link| link.brokered());
            if brokered {
                if let Some(job) = self.open.get_mut(&key) {
                    job.last_attempt.get_or_insert(now);
                }
            } else {
                self.consider(&key, now);
            }
        }
        self.start_queued();
    }

    fn link_for_key(&self, key: &str) -> Option<Arc<dyn AgentLinks>> {
        let device = &self.open.get(key)?.intent.device_id;
        self.link_for(device)
    }

    /// The link a device is reached through: the one it is connected over
    /// here, else the one it last spoke over.
    fn link_for(&self, device: &DeviceId) -> Option<Arc<dyn AgentLinks>> {
        let transport = match self.presence.get(device) {
            Some(live) if live.connected => Some(live.transport.to_owned()),
            _ => self
                .devices
                .get(device)
                .and_then(|(_, d)| d.transport.clone()),
        }?;
        self.links.get(transport.as_str()).cloned()
    }

    fn effect(&mut self, key: String, effect: Effect) {
        match effect {
            Effect::Send => {
                if self.queued_keys.insert(key.clone()) {
                    self.queued.push_back(key);
                }
            }
            Effect::Withdraw => {
                let Some((device, job)) = parse_job_key(&key) else {
                    return;
                };
                let Some(link) = self.link_for(&device) else {
                    return;
                };
                self.in_flight.spawn(async move {
                    let result = link.withdraw(&device, job).await.map(|()| Delivered::Sent);
                    (Flight::Withdrawal, link.transport(), result)
                });
            }
            Effect::SendCancel => {
                let Some(job) = self.open.get_mut(&key) else {
                    return;
                };
                job.last_attempt = Some(Timestamp::now());
                let device = job.intent.device_id.clone();
                let order = serde_json::json!({
                    agent_core::wire::CANCEL_FIELD: job.intent.job_id,
                    "deviceId": device,
                    "attempt": job.intent.attempt,
                });
                let job_id = job.intent.job_id;
                let Some(link) = self.link_for(&device) else {
                    debug!(
                        key,
                        "no link reaches the device yet; the cancel order waits for it"
                    );
                    return;
                };
                let signed = self.signer.sign_value(order);
                self.in_flight.spawn(async move {
                    let result = link.cancel(&device, job_id, &signed).await;
                    (Flight::Cancel(key), link.transport(), result)
                });
            }
        }
    }

    /// Starts queued deliveries while fewer than [`MAX_IN_FLIGHT`] run.
    fn start_queued(&mut self) {
        let now = Timestamp::now();
        while self.in_flight.len() < MAX_IN_FLIGHT {
            let Some(key) = self.queued.pop_front() else {
                return;
            };
            self.queued_keys.remove(&key);
            let Some(job) = self.open.get_mut(&key) else {
                continue;
            };
            // A job being canceled never goes out again.
            if job.delivery != Delivery::Created || job.cancel != Cancel::NotRequested {
                continue;
            }
            job.last_attempt = Some(now);
            let mut intent = job.intent.clone();
            let Some(link) = self.link_for(&intent.device_id) else {
                debug!(key, "no link reaches the device yet; delivery waits for it");
                continue;
            };
            // Sent as it goes out, so that nothing sends it twice meanwhile;
            // a delivery that does not happen returns it to created.
            if let Some(job) = self.open.get_mut(&key) {
                let (delivery, _) =
                    delivery::step(&job.facts(), &DeliveryEvent::Delivered { at: now });
                job.delivery = delivery;
            }
            let (signer, enricher) = (self.signer.clone(), self.enricher.clone());
            self.in_flight.spawn(async move {
                // Enrichers: what a job needs is attached here, as it goes
                // out, and never stored; then the whole intent is signed.
                if let Some(enricher) = enricher
                    && let Err(e) = enricher.enrich(&mut intent, now).await
                {
                    warn!(key, error = %e, "cannot attach what the job needs; the device will fail it");
                }
                let signed = signer.sign(&intent);
                let result = link.deliver(&intent, &signed, Timestamp::now()).await;
                (Flight::Intent(key), link.transport(), result)
            });
        }
    }

    fn delivered(
        &mut self,
        flight: Flight,
        transport: &'static str,
        result: Result<Delivered, LinkError>,
    ) {
        let key = match flight {
            Flight::Intent(key) => key,
            Flight::Withdrawal => {
                if let Err(e) = result {
                    debug!(error = %e, "cannot withdraw an intent");
                }
                return;
            }
            Flight::Cancel(key) => {
                let (out, failed) = match result {
                    Ok(Delivered::Sent) => (true, false),
                    Ok(Delivered::NotConnected) => (false, false),
                    Err(e) => {
                        warn!(key, error = %e, "cannot deliver a cancel order; trying again at the next sweep");
                        (false, true)
                    }
                };
                if let Some(job) = self.open.get_mut(&key) {
                    job.cancel = if out {
                        Cancel::OrderOut
                    } else {
                        Cancel::Requested
                    };
                    if failed {
                        job.last_attempt = None;
                    }
                }
                return;
            }
        };
        let key = key.as_str();
        let (undo, failed) = match result {
            Ok(Delivered::Sent) => {
                debug!(key, transport, "intent delivered");
                (false, false)
            }
            Ok(Delivered::NotConnected) => {
                debug!(key, transport, "device not connected here");
                (true, false)
            }
            Err(e) => {
                warn!(key, error = %e, "cannot deliver an intent; trying again at the next sweep");
                (true, true)
            }
        };
        if undo
            && let Some(job) = self.open.get_mut(key)
            && matches!(job.delivery, Delivery::Sent { .. })
        {
            job.delivery = Delivery::Created;
            // A link that failed (a broker electing a leader, say) is tried
            // again at the next sweep, not a whole ack timeout later.
            if failed {
                job.last_attempt = None;
            }
        }
    }

    /// The sweeper: sends again what was not acknowledged in time, tries
    /// again what never got out, and expires what was never taken.
    async fn sweep(&mut self) {
        let now = Timestamp::now();
        let timeout = self.ack_timeout();
        let mut expired = Vec::new();
        let keys: Vec<String> = self.open.keys().cloned().collect();
        for key in keys {
            let Some(job) = self.open.get_mut(&key) else {
                continue;
            };
            let due = job
                .last_attempt
                .is_none_or(|at| now.duration_since(at) >= timeout);
            // A cancel order that did not get out is tried again as often as
            // an intent would be.
            if job.cancel == Cancel::Requested && !due {
                continue;
            }
            let retry_created =
                job.delivery == Delivery::Created && job.cancel == Cancel::NotRequested && due;
            if retry_created {
                self.ensure_device(&key).await;
            }
            let Some(job) = self.open.get_mut(&key) else {
                continue;
            };
            let event = if retry_created {
                DeliveryEvent::Consider { now }
            } else {
                DeliveryEvent::Tick {
                    now,
                    ack_timeout: timeout,
                }
            };
            let (delivery, effects) = delivery::step(&job.facts(), &event);
            if matches!(delivery, Delivery::Expired { .. }) {
                expired.push((key, delivery));
                continue;
            }
            if delivery == Delivery::Created && matches!(job.delivery, Delivery::Sent { .. }) {
                info!(job_id = %job.intent.job_id, device = %job.intent.device_id, "no ack in time; sending the job again");
            }
            job.delivery = delivery;
            for effect in effects {
                self.effect(key.clone(), effect);
            }
        }
        for (key, delivery) in expired {
            self.expire(&key, delivery).await;
        }
        self.start_queued();
        let gauge = &crate::metrics::metrics().jobs_undecided;
        gauge.clear();
        for ((state, kind), count) in undecided_counts(self.open.values()) {
            gauge
                .get_or_create(&vec![("delivery", state.into()), ("kind", kind.into())])
                .set(count);
        }
    }

    /// Moves the brokers' status cursors forward (never back).
    async fn commit_cursors(&self, cursors: &HashMap<&'static str, u64>) {
        let mut ops = Vec::new();
        for (transport, position) in cursors {
            let key = cursor_key(transport);
            match self.db.get::<u64>(&key).await {
                Ok(current) => {
                    let (expected, stored) = current.unwrap_or((0, 0));
                    if *position > stored
                        && let Ok(value) = Db::encode(position)
                    {
                        ops.push(Op::Put {
                            key,
                            value,
                            expected,
                        });
                    }
                }
                Err(e) => warn!(error = %e, "cannot read a status cursor"),
            }
        }
        if !ops.is_empty()
            && let Err(e) = self.db.commit(ops).await
        {
            warn!(error = %e, "cannot move a status cursor; a restart reads a little more again");
        }
    }

    async fn expire(&mut self, key: &str, delivery: Delivery) {
        let result = self
            .db
            .update::<JobDelivery, _>(key, |current| {
                let mut job = current?;
                if job.status.is_some() || matches!(job.delivery, Delivery::Expired { .. }) {
                    return None;
                }
                job.delivery = delivery.clone();
                Some(job)
            })
            .await;
        match result {
            Ok(Some(job)) if matches!(job.delivery, Delivery::Expired { .. }) => {
                info!(job_id = %job.intent.job_id, device = %job.intent.device_id, "intent expired before the device took it");
                self.forget(key);
                self.effect(key.to_owned(), Effect::Withdraw);
            }
            Ok(_) => {}
            Err(e) => warn!(key, error = %e, "cannot expire a job"),
        }
    }

    /// Applies a batch of inbound events in as few commits as it takes.
    async fn handle(&mut self, batch: Vec<Event>) {
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
    async fn commit(&mut self, work: Work, last_round: bool) -> Vec<Event> {
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
        for (key, (expected, inventory)) in &work.inventories {
            match Db::encode(inventory) {
                Ok(value) => {
                    ops.push(Op::Put {
                        key: key.clone(),
                        value,
                        expected: *expected,
                    });
                    written.push((key.clone(), None, None));
                }
                Err(e) => warn!(key, error = %e, "cannot encode an inventory"),
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
            if self.behind.remove(transport) && self.behind.is_empty() {
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

    async fn apply(&mut self, mut event: Event, work: &mut Work) {
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
                            at: Timestamp::now(),
                        },
                    );
                    job.delivery = delivery;
                }
                Ok((Answer::Stored, Vec::new(), Vec::new()))
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

    /// The current record of a job: this batch's pending write, else the store.
    async fn job_record(
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
    async fn status(
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
        if status.state == agent_core::JobState::Rejected
            && status.kind == agent_core::executor::UNVERIFIED_KIND
        {
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
        let now = Timestamp::now();
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
        // The package list goes to the device's inventory record, written in
        // the same commit; the job keeps the rest of the output.
        if let Some(agent_core::JobOutput::Software(software)) = &mut status.output
            && status.state == agent_core::JobState::Succeeded
        {
            let inventory_key = crate::deployment::inventory_key(device);
            let expected = match work.inventories.get(&inventory_key) {
                Some((expected, _)) => *expected,
                None => self
                    .db
                    .get::<crate::deployment::DeviceInventory>(&inventory_key)
                    .await?
                    .map_or(0, |(revision, _)| revision),
            };
            let packages = std::mem::take(&mut software.packages);
            let inventory = crate::deployment::DeviceInventory {
                device: device.clone(),
                collected_at: received_at.min(now),
                packages: packages.into_iter().map(|p| (p.name, p.version)).collect(),
                truncated: software.omitted > 0,
            };
            work.inventories
                .insert(inventory_key.clone(), (expected, inventory));
            keys.push(inventory_key);
        }
        if status.state == agent_core::JobState::Failed
            && let Some(error) = status
                .error
                .as_deref()
                .filter(|e| e.contains(agent_core::lifecycle::RESUME_LOOP))
        {
            work.alerts.push(crate::alerts::resume_loop(
                device,
                &job,
                error,
                received_at.min(now),
            ));
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

    /// A decommissioned device's credentials open nothing any more.
    async fn revoked(&mut self, device: &DeviceId, work: &Work) -> Result<Option<Answer>, DbError> {
        let (_, record) = self.device_record(device, work).await?;
        Ok(record.decommissioned.then(|| {
            Answer::Refused(format!(
                "device {device} is decommissioned; its credentials are no longer accepted"
            ))
        }))
    }

    /// The stored device record (cached), or a new one.
    async fn device_record(
        &mut self,
        device: &DeviceId,
        work: &Work,
    ) -> Result<(u64, DeviceRecord), DbError> {
        let key = device_key(device);
        if let Some(pending) = work.devices.get(&key) {
            return Ok(pending.clone());
        }
        if let Some(cached) = self.devices.get(device) {
            return Ok(cached.clone());
        }
        let found = self
            .db
            .get::<DeviceRecord>(&key)
            .await?
            .unwrap_or_else(|| (0, DeviceRecord::new(device.clone())));
        self.devices.insert(device.clone(), found.clone());
        Ok(found)
    }

    /// Writes the device record if `change` altered anything an operator or
    /// the planner reads, or its last-seen time is stale in the store.
    async fn touch_device(
        &mut self,
        device: &DeviceId,
        work: &mut Work,
        change: impl FnOnce(&mut DeviceRecord),
    ) -> Result<Vec<String>, DbError> {
        let (expected, stored) = self.device_record(device, work).await?;
        let mut record = stored.clone();
        change(&mut record);
        let now = Timestamp::now();
        let stale = record
            .last_seen
            .is_none_or(|seen| now.duration_since(seen) >= PRESENCE_PERSIST);
        if record == stored && !stale && expected != 0 {
            return Ok(Vec::new());
        }
        record.last_seen = Some(now);
        let key = device_key(device);
        work.devices.insert(key.clone(), (expected, record));
        Ok(vec![key])
    }

    async fn hello(
        &mut self,
        transport: &'static str,
        device: &DeviceId,
        hello: &AgentHello,
        work: &mut Work,
    ) -> Result<(Answer, Vec<String>, Vec<(String, Effect)>), DbError> {
        if let Some(refusal) = self.revoked(device, work).await? {
            return Ok((refusal, Vec::new(), Vec::new()));
        }
        if let Some(problem) =
            check_reported(&hello.agent_version, &hello.boot_id, &hello.capabilities)
        {
            return Ok((Answer::Refused(problem), Vec::new(), Vec::new()));
        }
        let now = Timestamp::now();
        self.presence.update(device, |live| {
            Some(Live {
                transport,
                connected: true,
                last_seen: now,
                last_heartbeat: live.and_then(|l| l.last_heartbeat),
            })
        });
        let keys = self
            .touch_device(device, work, |record| {
                record.agent_present = true;
                record.agent_version = Some(hello.agent_version.clone());
                record.boot_id = Some(hello.boot_id.clone());
                record.capabilities = hello.capabilities.clone();
                record.transport = Some(transport.to_owned());
            })
            .await?;
        // Resync: jobs it holds are acknowledged; jobs sent but not held
        // were lost on the way and go out again.
        let held: HashSet<_> = hello.held.iter().map(|h| h.job_id).collect();
        let mut effects = Vec::new();
        let open: Vec<String> = self
            .by_device
            .get(device)
            .map(|keys| keys.iter().cloned().collect())
            .unwrap_or_default();
        for key in open {
            let Some(job) = self.open.get_mut(&key) else {
                continue;
            };
            let holds = held.contains(&job.intent.job_id);
            let (delivery, these) =
                delivery::step(&job.facts(), &DeliveryEvent::Hello { holds, at: now });
            job.delivery = delivery;
            effects.extend(these.into_iter().map(|e| (key.clone(), e)));
        }
        self.presence.arrive(device);
        info!(device = %device, transport, held = hello.held.len(), "agent connected");
        Ok((Answer::Stored, keys, effects))
    }

    async fn heartbeat(
        &mut self,
        transport: &'static str,
        device: &DeviceId,
        heartbeat: &Heartbeat,
        work: &mut Work,
    ) -> Result<(Answer, Vec<String>, Vec<(String, Effect)>), DbError> {
        if &heartbeat.device_id != device {
            return Ok((
                Answer::Refused(format!(
                    "heartbeat for device {} refused on the connection of {device}",
                    heartbeat.device_id
                )),
                Vec::new(),
                Vec::new(),
            ));
        }
        if let Some(refusal) = self.revoked(device, work).await? {
            return Ok((refusal, Vec::new(), Vec::new()));
        }
        let reported = [&heartbeat.os_release, &heartbeat.architecture];
        if let Some(problem) = check_reported(
            &heartbeat.agent_version,
            &heartbeat.boot_id,
            &heartbeat.capabilities,
        )
        .or_else(|| {
            reported
                .iter()
                .find_map(|text| check_text("a reported field", text, MAX_REPORTED))
        }) {
            return Ok((Answer::Refused(problem), Vec::new(), Vec::new()));
        }
        let now = Timestamp::now();
        self.presence.update(device, |_| {
            Some(Live {
                transport,
                connected: true,
                last_seen: now,
                last_heartbeat: Some(now),
            })
        });
        let keys = self
            .touch_device(device, work, |record| {
                record.agent_present = true;
                record.boot_id = Some(heartbeat.boot_id.clone());
                record.capabilities = heartbeat.capabilities.clone();
                record.agent_version = Some(heartbeat.agent_version.clone());
                record.os_release = Some(heartbeat.os_release.clone());
                record.architecture = Some(heartbeat.architecture.clone());
                record.transport = Some(transport.to_owned());
                if record
                    .last_heartbeat
                    .is_none_or(|at| now.duration_since(at) >= PRESENCE_PERSIST)
                {
                    record.last_heartbeat = Some(now);
                }
            })
            .await?;
        Ok((Answer::Stored, keys, Vec::new()))
    }

    /// Writes last-seen times that went stale in the store, in one commit.
    async fn flush_presence(&mut self) {
        let now = Timestamp::now();
        let stale: Vec<DeviceId> = self
            .devices
            .iter()
            .filter(|(id, (_, record))| {
                self.presence.get(id).is_some_and(|live| {
                    live.connected
                        && record
                            .last_seen
                            .is_none_or(|seen| now.duration_since(seen) >= PRESENCE_PERSIST)
                })
            })
            .map(|(id, _)| id.clone())
            .collect();
        if stale.is_empty() {
            return;
        }
        let mut work = Work::default();
        for device in &stale {
            if let Err(e) = self.touch_device(device, &mut work, |_| {}).await {
                warn!(device = %device, error = %e, "cannot refresh a last-seen time");
            }
        }
        let _ = self.commit(work, true).await;
    }
}

/// Upper bound of a field a device reports about itself (version, boot id,
/// one capability, OS name, architecture).
const MAX_REPORTED: usize = 256;
/// Upper bound of the capabilities a device may report.
const MAX_CAPABILITIES: usize = 32;

/// Why a text a device sent cannot be kept: too long, or holding control
/// characters (escape sequences would reach an operator's terminal).
fn check_text(what: &str, text: &str, max: usize) -> Option<String> {
    if text.len() > max {
        return Some(format!(
            "{what} is {} bytes, over the limit of {max}",
            text.len()
        ));
    }
    if text.chars().any(|c| c.is_control() || is_bidi_override(c)) {
        return Some(format!(
            "{what} holds control or bidirectional-override characters"
        ));
    }
    None
}

/// Unicode's bidirectional embedding, override and isolate characters.
pub fn is_bidi_override(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

fn check_reported(version: &str, boot_id: &str, capabilities: &[String]) -> Option<String> {
    if capabilities.len() > MAX_CAPABILITIES {
        return Some(format!(
            "{} capabilities reported, over the limit of {MAX_CAPABILITIES}",
            capabilities.len()
        ));
    }
    check_text("the agent version", version, MAX_REPORTED)
        .or_else(|| check_text("the boot id", boot_id, MAX_REPORTED))
        .or_else(|| {
            capabilities
                .iter()
                .find_map(|c| check_text("a capability", c, MAX_REPORTED))
        })
}

/// `text` with every control character but newline and tab, and every
/// bidirectional override, replaced by U+FFFD: what a device reports can
/// neither drive an operator's terminal nor reorder what the dashboard
/// shows. Cleaned where it enters, once, so every reader sees the same.
pub fn printable(text: String) -> String {
    let unsafe_char = |c: char| (c.is_control() && c != '\n' && c != '\t') || is_bidi_override(c);
    if !text.chars().any(unsafe_char) {
        return text;
    }
    text.chars()
        .map(|c| if unsafe_char(c) { '\u{FFFD}' } else { c })
        .collect()
}

/// A status as the control plane keeps it: every field bounded and
/// [`printable`], whatever a device sent (errors ≤ 1 KiB, at most 16
/// steps, bounded lists).
fn bounded_status(status: &JobStatus) -> JobStatus {
    use agent_core::{MAX_ERROR_BYTES, MAX_STEPS};
    let bounded = |text: String, max: usize| agent_core::bounded(printable(text), max);
    let mut status = status.clone();
    status.error = status.error.map(|e| bounded(e, MAX_ERROR_BYTES));
    status.kind = bounded(status.kind, 64);
    status.boot_id = bounded(status.boot_id, MAX_REPORTED);
    status.steps.truncate(MAX_STEPS);
    for step in &mut status.steps {
        step.name = bounded(std::mem::take(&mut step.name), 64);
        step.error = step.error.take().map(|e| bounded(e, MAX_ERROR_BYTES));
    }
    if let Some(agent_core::JobOutput::Upgrade(report)) = &mut status.output {
        let max = agent_core::model::MAX_LISTED_PACKAGES;
        let before = report.upgraded.len()
            + report.installed.len()
            + report.removed.len()
            + report.kept_back.len();
        report.upgraded.truncate(max);
        report.installed.truncate(max);
        report.removed.truncate(max);
        report.kept_back.truncate(max);
        for change in report
            .upgraded
            .iter_mut()
            .chain(report.installed.iter_mut())
        {
            change.name = bounded(std::mem::take(&mut change.name), 256);
            change.to = bounded(std::mem::take(&mut change.to), 256);
            change.from = change.from.take().map(|f| bounded(f, 256));
        }
        for name in report.removed.iter_mut().chain(report.kept_back.iter_mut()) {
            *name = bounded(std::mem::take(name), 256);
        }
        let after = report.upgraded.len()
            + report.installed.len()
            + report.removed.len()
            + report.kept_back.len();
        report.omitted = report.omitted.saturating_add((before - after) as u32);
    }
    if let Some(agent_core::JobOutput::Software(software)) = &mut status.output {
        let before = software.packages.len();
        software
            .packages
            .truncate(agent_core::model::MAX_INVENTORY_PACKAGES);
        software.packages.retain(|p| {
            (1..=128).contains(&p.name.len())
                && (1..=128).contains(&p.version.len())
                && !p
                    .name
                    .chars()
                    .chain(p.version.chars())
                    .any(char::is_control)
        });
        software.omitted = software
            .omitted
            .saturating_add((before - software.packages.len()) as u32);
    }
    if let Some(agent_core::JobOutput::Inventory(inventory))
    | Some(agent_core::JobOutput::Software(agent_core::model::SoftwareInventory {
        inventory,
        ..
    })) = &mut status.output
    {
        inventory.os_release = bounded(std::mem::take(&mut inventory.os_release), MAX_REPORTED);
        inventory.architecture = bounded(std::mem::take(&mut inventory.architecture), MAX_REPORTED);
        inventory.kernel = bounded(std::mem::take(&mut inventory.kernel), MAX_REPORTED);
        inventory.disks.truncate(64);
        for disk in &mut inventory.disks {
            disk.mount_point = bounded(std::mem::take(&mut disk.mount_point), MAX_REPORTED);
        }
    }
    status
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
    if let Some(status) = job.status.as_ref().filter(|s| s.state.is_terminal()) {
        metrics
            .jobs_finished
            .get_or_create(&vec![
                ("state", format!("{:?}", status.state)),
                ("kind", job.intent.kind.name().into()),
            ])
            .inc();
    }
}

/// The undecided jobs by delivery state and kind, for the gauge.
fn undecided_counts<'a>(
    open: impl Iterator<Item = &'a OpenJob>,
) -> HashMap<(&'static str, &'static str), i64> {
    let mut counts = HashMap::new();
    for job in open {
        let state = match (&job.delivery, job.cancel) {
            (_, Cancel::Requested | Cancel::OrderOut) => "canceling",
            (Delivery::Created, _) => "created",
            (Delivery::Sent { .. }, _) => "sent",
            (Delivery::Acked { .. }, _) => "acked",
            (Delivery::Expired { .. }, _) => "expired",
        };
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
pub fn cursor_key(transport: &str) -> String {
    format!("cursors/{transport}")
}

fn parse_job_key(key: &str) -> Option<(DeviceId, agent_core::JobId)> {
    let mut parts = key.strip_prefix("jobs/")?.splitn(2, '/');
    let device = DeviceId::new(parts.next()?).ok()?;
    let job = parts.next()?.parse().ok()?;
    Some((device, job))
}
