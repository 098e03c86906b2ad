//! Drover over NATS JetStream (the fleet-tasks seed): both ends of the mapping
//! in one place. Buckets `system-upgrade-intent` and `system-upgrade-status`
//! hold one value per key `<device-id>.<run-uid>`, and only the control
//! plane writes them: an agent sends each status as a request on its own
//! status subject, and the control plane that answers checks it (its size,
//! its device, a job the device was given) and puts it under the job's key
//! before it answers, so one device can fill no bucket but its own keys'
//! slots. The intent bucket
//! republishes every change to a plain per-device subject, which each agent
//! subscribes to: one KV watch (a JetStream consumer) per device does not
//! scale on nats-server 2.9 (../shared/research/nats-mqtt.md). After every
//! (re)connect the agent sends a `hello` request with the jobs it holds; the
//! control plane answers with its time and puts again every intent the agent
//! lacks, so a reboot or an outage loses nothing. Devices create no
//! consumers: a consumer's deliver subject cannot be restricted by
//! nats-server permissions, so the right to create one would let a device
//! push its intents onto another device's subject. Heartbeats go to a
//! per-device subject. A status no control plane answers (none runs) is
//! published to the device's subject of the held-status stream instead,
//! whose broker time is its receive time; a replica takes it from there,
//! with the same checks, when one runs again.

pub mod agent;
#[cfg(feature = "server")]
pub mod authority;
pub mod enrolling;
#[cfg(feature = "server")]
mod heartbeats;
#[cfg(feature = "server")]
mod held;
#[cfg(feature = "server")]
pub mod joining;
#[cfg(feature = "server")]
pub mod jwt;
#[cfg(feature = "server")]
pub mod kv;
#[cfg(feature = "server")]
pub mod links;
pub mod logs;
#[cfg(feature = "server")]
mod parsed;
#[cfg(feature = "server")]
pub mod server;
pub mod spread;
#[cfg(feature = "server")]
mod subjects;

use drover_model::{DeviceId, JobId};
use std::path::PathBuf;
use std::time::Duration;

pub const INTENT_BUCKET: &str = "system-upgrade-intent";
pub const STATUS_BUCKET: &str = "system-upgrade-status";
/// Where the intent bucket republishes its changes: `<prefix>.<device>.<run-uid>`.
pub const INTENT_REPUBLISH_PREFIX: &str = "drover.rp.intent";
/// Heartbeats: `<prefix>.<device>`.
pub const HEARTBEAT_PREFIX: &str = "drover.heartbeat";
/// Hello requests: `<prefix>.<device>`, answered by one control-plane replica.
pub const HELLO_PREFIX: &str = "drover.hello";
/// The queue group control-plane replicas answer hellos and statuses in.
pub const HELLO_QUEUE: &str = "drover-control-plane";
/// Status requests: `<prefix>.<device>`, answered by one control-plane
/// replica once the status is in the status bucket.
pub const STATUS_PREFIX: &str = "drover.status";

/// Statuses an agent could hand to no control plane (none answered its
/// request): `<prefix>.<device>`, kept by JetStream, stamped with the
/// broker's time, until a replica takes them. That stamp is the status's
/// receive time (A12): a result made while every replica was down counts
/// from when the broker had it, on a clock no device sets.
pub const HELD_PREFIX: &str = "drover.held";
/// The stream that keeps held statuses (work-queue retention: a status
/// leaves it once a replica has stored it).
pub const HELD_STREAM: &str = "drover-held-statuses";
/// The one durable consumer every replica takes held statuses from.
pub const HELD_CONSUMER: &str = "drover-control-plane";
/// Held statuses one device may have in the stream; past it the broker
/// refuses more and they wait in the agent's outbox.
pub const HELD_PER_DEVICE: i64 = 256;

pub fn held_subject(device: &DeviceId) -> String {
    format!("{HELD_PREFIX}.{device}")
}

/// The largest status a device may send, and the largest value either
/// bucket takes: Drover's largest status, with room.
pub const MAX_VALUE_BYTES: i32 = 256 * 1024;

/// The control plane's answer to a status request.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StatusReply {
    /// In the status bucket: the agent drops it from its outbox (A4).
    Stored,
    /// Never to be stored (unreadable, too large, another device's, or a job
    /// the control plane does not know and no local report): the agent logs
    /// it and drops it, since
    /// sending it again cannot help.
    Refused(String),
    /// Not stored now (the bucket could not be reached): sent again later.
    Failed(String),
}

pub fn status_subject(device: &DeviceId) -> String {
    format!("{STATUS_PREFIX}.{device}")
}

/// The control plane's answer to a hello: its clock, by which the agent
/// judges expiry (A12), or why the hello was refused; and the window over
/// which the agent spreads its first reconnect after a loss
/// ([`spread`]; absent from an older control plane: none).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HelloReply {
    pub server_time: jiff::Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconnect_spread_ms: Option<u64>,
}

pub fn hello_subject(device: &DeviceId) -> String {
    format!("{HELLO_PREFIX}.{device}")
}

/// Where a device with no JWT yet asks to join (issue 55), as the
/// enrollment user (a bearer JWT that may publish only here and read only
/// its answers): `drover.enroll.<device-id>`, answered into
/// `_ENROLL_INBOX.<device-id>.…` (a root no device's inbox can have).
pub const ENROLL_PREFIX: &str = "drover.enroll";
pub const ENROLL_INBOX: &str = "_ENROLL_INBOX";

pub fn enroll_subject(device: &DeviceId) -> String {
    format!("{ENROLL_PREFIX}.{device}")
}

pub fn enroll_inbox_prefix(device: &DeviceId) -> String {
    format!("{ENROLL_INBOX}.{device}")
}

/// A request to join over NATS: the device's key, the enrollment token it
/// was given, what it says of itself, and its key's signature over
/// `drover_model::enroll::broker_password_message` (no round trip comes
/// before the request; a replay asks for what the device asked).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnrollRequest {
    pub public_key: String,
    pub token: String,
    #[serde(default)]
    pub inventory: drover_model::enroll::Inventory,
    pub signature: String,
}

/// The control plane's answer: `accepted` with the device's user JWT
/// (its own subjects, bound to its key), `pending`, or `refused`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum EnrollReply {
    Accepted { jwt: String },
    Pending { message: String },
    Refused { message: String },
}

pub fn stream_name(bucket: &str) -> String {
    format!("KV_{bucket}")
}

pub fn key(device: &DeviceId, job: JobId) -> String {
    format!("{device}.{job}")
}

/// The stream subject of a key.
pub fn key_subject(bucket: &str, key: &str) -> String {
    format!("$KV.{bucket}.{key}")
}

/// Splits `<device>.<run-uid>` back into its parts.
pub fn parse_key(key: &str) -> Option<(DeviceId, JobId)> {
    let (device, job) = key.split_once('.')?;
    Some((DeviceId::new(device).ok()?, job.parse().ok()?))
}

pub fn heartbeat_subject(device: &DeviceId) -> String {
    format!("{HEARTBEAT_PREFIX}.{device}")
}

/// The inbox prefix of a device's connection, so its permissions can allow
/// replies to it and to no one else.
pub fn inbox_prefix(device: &DeviceId) -> String {
    format!("_INBOX_{device}")
}

#[derive(Debug, Clone)]
pub struct NatsSettings {
    /// `nats://host:port` or `tls://host:port`; several, comma-separated, for
    /// the nodes of a cluster (a client also learns the others from the
    /// one it reaches, and moves to a survivor when its node goes).
    pub url: String,
    pub user: Option<String>,
    pub password: Option<String>,
    /// CA certificate to trust; setting it requires TLS.
    pub ca_file: Option<PathBuf>,
    pub connect_timeout: Duration,
    /// The control plane's: copies JetStream keeps of every bucket it
    /// creates (3 on a cluster of three). Agents create nothing.
    pub replicas: usize,
    /// A user JWT and the key that signs the server's nonce for it (a
    /// server trusting an operator, issue 55); instead of user and password.
    pub key_login: Option<KeyLogin>,
}

/// A user JWT, and the key it is bound to.
#[derive(Clone)]
pub struct KeyLogin {
    pub jwt: String,
    pub signer: std::sync::Arc<dyn drover_model::enroll::Signer>,
}

impl std::fmt::Debug for KeyLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyLogin")
            .field("public_key", &self.signer.public_key())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    #[error("cannot connect to NATS at {url}: {reason}")]
    Connect { url: String, reason: String },
    /// The server refused the credentials (authorization violation).
    #[error("cannot connect to NATS at {url}: {reason}")]
    Refused { url: String, reason: String },
    #[error("JetStream: {0}")]
    JetStream(String),
}

/// How often a watch is checked against its stream's last revision.
pub const WATCHDOG: Duration = Duration::from_secs(2);

/// Tells a stalled watch: on a cluster, a watch whose consumer was lost with
/// a node can stop without an error. Behind the stream's last revision on
/// two checks in a row without moving means stalled; so does a check that
/// cannot read the stream's state (no stream leader, a lost node) after one
/// that was behind or could not tell either, since an idle watch cannot
/// show it is alive. The watch is then started again from where it was
/// (replays are harmless: the mirror and the delivery core take only what
/// is newer).
#[derive(Debug, Default)]
pub struct Watchdog {
    behind_at: Option<u64>,
}

impl Watchdog {
    /// Waits for the next check, [`WATCHDOG`] after the one before.
    pub fn checks() -> tokio::time::Interval {
        tokio::time::interval_at(tokio::time::Instant::now() + WATCHDOG, WATCHDOG)
    }

    /// `seen`: the last revision the watch delivered; `last`: the stream's,
    /// or None when it could not be read.
    pub fn stalled(&mut self, seen: u64, last: Option<u64>) -> bool {
        if last.is_some_and(|last| seen >= last) {
            self.behind_at = None;
            false
        } else if self.behind_at == Some(seen) {
            true
        } else {
            self.behind_at = Some(seen);
            false
        }
    }
}

/// The last revision of a bucket's stream now, as the stream's leader
/// answers. Not `kv::Store::status()`: async-nats answers that from the
/// stream info cached when the bucket was opened, so a watchdog comparing
/// against it never saw a watch fall behind.
pub async fn last_revision(
    store: &async_nats::jetstream::kv::Store,
) -> Result<u64, async_nats::jetstream::stream::InfoError> {
    Ok(store.stream.clone().info().await?.state.last_sequence)
}

impl NatsSettings {
    /// The server addresses in `url`.
    pub fn addresses(&self) -> Result<Vec<async_nats::ServerAddr>, NatsError> {
        parse_addresses(&self.url)
    }
}

/// Parses `nats://a:4222,nats://b:4222`: each a nats:// or tls:// URL.
pub fn parse_addresses(urls: &str) -> Result<Vec<async_nats::ServerAddr>, NatsError> {
    let bad = |reason: String| NatsError::Connect {
        url: urls.to_owned(),
        reason,
    };
    let addresses: Vec<async_nats::ServerAddr> = urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|u| {
            let scheme = u.split("://").next().unwrap_or("");
            if !u.contains("://") || !["nats", "tls"].contains(&scheme) {
                return Err(bad(format!("{u:?}: the scheme must be nats:// or tls://")));
            }
            u.parse::<async_nats::ServerAddr>()
                .map_err(|e| bad(format!("{u:?}: {e}")))
        })
        .collect::<Result<_, _>>()?;
    if addresses.is_empty() {
        return Err(bad("no server URL".into()));
    }
    Ok(addresses)
}

pub(crate) fn connect_options(settings: &NatsSettings) -> async_nats::ConnectOptions {
    let mut options =
        async_nats::ConnectOptions::new().connection_timeout(settings.connect_timeout);
    if let Some(login) = &settings.key_login {
        let signer = login.signer.clone();
        options = options.jwt(login.jwt.clone(), move |nonce| {
            let signature = signer.sign(&nonce);
            async move { Ok(signature) }
        });
    } else if let (Some(user), Some(password)) = (&settings.user, &settings.password) {
        options = options.user_and_password(user.clone(), password.clone());
    }
    if let Some(ca) = &settings.ca_file {
        options = options.add_root_certificates(ca.clone()).require_tls(true);
    }
    options
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request and the answer in docs/protocol.md are what an agent
    /// sends and the control plane answers.
    #[test]
    fn the_enrollment_examples_in_the_protocol_document_read_back_the_same() {
        let doc = include_str!("../../../docs/protocol.md");
        let section = doc
            .split("## Enrollment over NATS")
            .nth(1)
            .expect("the section");
        let examples: Vec<&str> = section
            .split("```json\n")
            .skip(1)
            .filter_map(|rest| rest.split("```").next())
            .collect();
        assert_eq!(examples.len(), 2);
        let request: EnrollRequest = serde_json::from_str(examples[0]).expect("a request");
        assert_eq!(request.inventory.hostname.as_deref(), Some("pi-8f3a"));
        let answer: EnrollReply = serde_json::from_str(examples[1]).expect("an answer");
        let theirs: serde_json::Value = serde_json::from_str(examples[1]).expect("json");
        assert_eq!(serde_json::to_value(&answer).expect("encode"), theirs);
    }

    #[test]
    fn several_server_urls_parse_and_bad_ones_are_named() {
        assert_eq!(
            parse_addresses("nats://a:4222, nats://b:4223,tls://c:4224")
                .expect("three")
                .len(),
            3
        );
        let bad = parse_addresses("nats://a:4222,http://b:80").expect_err("http");
        assert!(bad.to_string().contains("http://b:80"), "{bad}");
        assert!(parse_addresses(" , ").is_err());
    }

    #[test]
    fn a_watch_is_stalled_only_when_behind_twice_without_moving() {
        let mut dog = Watchdog::default();
        assert!(!dog.stalled(10, Some(10)), "current");
        assert!(!dog.stalled(8, Some(12)), "behind once");
        assert!(!dog.stalled(9, Some(12)), "behind, but moving");
        assert!(dog.stalled(9, Some(13)), "behind and not moving");
        assert!(!dog.stalled(13, Some(13)), "caught up again");
    }

    #[test]
    fn a_watch_whose_stream_cannot_be_read_twice_is_stalled() {
        let mut dog = Watchdog::default();
        assert!(!dog.stalled(10, None), "unknown once");
        assert!(dog.stalled(10, None), "unknown twice, not moving");
        let mut dog = Watchdog::default();
        assert!(!dog.stalled(10, Some(12)), "behind");
        assert!(dog.stalled(10, None), "then unknown, not moving");
        let mut dog = Watchdog::default();
        assert!(!dog.stalled(10, None), "unknown");
        assert!(!dog.stalled(11, None), "unknown, but moving");
        assert!(!dog.stalled(11, Some(11)), "current again");
        assert!(!dog.stalled(11, None), "unknown after current: once");
    }

    #[test]
    fn keys_round_trip() {
        let device = DeviceId::new("pi-1").expect("valid");
        let job = JobId::random();
        let k = key(&device, job);
        assert_eq!(parse_key(&k), Some((device, job)));
        assert_eq!(parse_key("pi-1"), None);
        assert_eq!(parse_key("Pi.x"), None);
        assert_eq!(
            key_subject(INTENT_BUCKET, &k),
            format!("$KV.system-upgrade-intent.{k}")
        );
    }
}
