//! Drover over MQTT (3.1.1, QoS 1; the control plane's session persistent,
//! each agent's clean, since all a device is sent is retained): both ends of the
//! mapping in one place. Under a prefix (default `drover/v1`):
//!
//! - `devices/<id>/intents/<job>`: the signed intent, retained, QoS 1; an
//!   empty retained payload withdraws it.
//! - `devices/<id>/status/<job>`: the agent's statuses, retained, QoS 1;
//!   the broker's PUBACK confirms one to the agent's outbox (A4); the
//!   control plane acknowledges it to the broker only once committed, so its
//!   persistent session keeps what it has not stored, and a control plane
//!   that subscribes again gets each job's latest status even if its
//!   session lost some; a decided job's retained status is then cleared.
//! - `devices/<id>/hello`: after every connect, the jobs the agent holds;
//!   the control plane answers on `devices/<id>/control` with its clock.
//! - `devices/<id>/heartbeat`: heartbeats, and the last will
//!   `{"deviceId":…,"offline":true}` that says the device went away.
//!
//! - `enroll/<id>`: a device with no account at the broker asks to join
//!   ([`EnrollPublish`]), logged in as [`ENROLL_USER`], whose only right is
//!   to publish there; once accepted it logs in with its id and its
//!   broker password, which the control plane handed to mosquitto's
//!   dynamic security plugin (`crate::dynsec`).
//!
//! Payloads are JSON, so `mosquitto_sub -v -t 'drover/v1/#'` shows what
//! happens.

#[cfg(feature = "server")]
pub mod admissions;
pub mod agent;
#[cfg(feature = "server")]
pub mod dynsec;
pub mod enrolling;
#[cfg(feature = "server")]
mod inbound;
#[cfg(feature = "server")]
mod joining;
#[cfg(feature = "server")]
pub mod mosquitto;
#[cfg(feature = "server")]
pub mod server;

use drover_model::{DeviceId, JobId};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub const DEFAULT_PREFIX: &str = "drover/v1";
/// The largest payload Drover sends or takes over MQTT: a status with its
/// bounded steps and output, as over WebSocket. The topic and packet
/// headers come on top.
pub const MAX_MESSAGE_BYTES: usize = 192 * 1024;
/// What the control plane's client reads before it can judge a message:
/// MQTT's own limit, so no message a broker hands over fails the link;
/// whatever is over [`MAX_MESSAGE_BYTES`] is then dropped (see the server).
#[cfg(feature = "server")]
pub const SERVER_READ_LIMIT: usize = 268_435_455;
pub const TRANSPORT: drover_model::transport::Transport = drover_model::transport::Transport::Mqtt;

/// The topics of one prefix.
#[derive(Debug, Clone)]
pub struct Topics {
    prefix: String,
}

/// What a topic under the prefix is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topic {
    Intent(DeviceId, JobId),
    Status(DeviceId, JobId),
    Hello(DeviceId),
    Heartbeat(DeviceId),
    Control(DeviceId),
    Enroll(DeviceId),
    /// A log request to the device (`drover logs`).
    LogsAsk(DeviceId),
    /// A chunk of the device's answer.
    LogsAnswer(DeviceId),
}

/// The broker user devices ask to join as, with [`ENROLL_PASSWORD`]. Not a
/// device id (the dot), so no device pattern of the ACL file is its. Its
/// password is no secret: it opens only the enrollment topic, and what
/// counts is the enrollment token inside each request. A client's id is its
/// user name, so devices asking at once as one user push each other off:
/// each asks as one of [`ENROLL_LOGINS`] users ([`enroll_user`]) picked at
/// random, and as this one only where those are not there yet.
pub const ENROLL_USER: &str = "drover.enroll";
/// How many enrollment users a broker has (`drover.enroll.000` …): a fleet
/// of one image asking at once shares them, so a request is pushed off by
/// another only when both picked the same one within its few milliseconds.
/// With one user, 10,000 devices asking at once never got through (each
/// connection closed the one before it; `drover-sim enroll --transport
/// mqtt`, docs/benchmarks.md).
pub const ENROLL_LOGINS: usize = 256;

/// The enrollment user numbered `n` (modulo [`ENROLL_LOGINS`]).
pub fn enroll_user(n: usize) -> String {
    format!("{ENROLL_USER}.{:03}", n % ENROLL_LOGINS)
}

/// Every enrollment user a broker should have: [`ENROLL_USER`] (agents
/// that ask as it, brokers set up before the numbered ones) and the
/// numbered ones.
pub fn enroll_users() -> Vec<String> {
    std::iter::once(ENROLL_USER.to_owned())
        .chain((0..ENROLL_LOGINS).map(enroll_user))
        .collect()
}
pub const ENROLL_PASSWORD: &str = "drover-enroll";
/// Where mosquitto's dynamic security plugin takes its commands.
pub const DYNSEC_TOPIC: &str = "$CONTROL/dynamic-security/v1";
/// The dynamic security role that gives the enrollment users their one
/// right.
pub const ENROLL_ROLE: &str = "drover-enroll";

/// What a device publishes on `enroll/<id>`: its key, the enrollment
/// token it was given, what it says of itself, and its broker password,
/// which is its key's signature (so it proves the key) and the password
/// the broker will take from it once it is accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnrollPublish {
    pub public_key: String,
    pub token: String,
    #[serde(default)]
    pub inventory: drover_model::enroll::Inventory,
    pub password: String,
}

impl Topics {
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.trim_end_matches('/').to_owned(),
        }
    }

    fn device(&self, device: &DeviceId) -> String {
        format!("{}/devices/{device}", self.prefix)
    }

    pub fn intent(&self, device: &DeviceId, job: JobId) -> String {
        format!("{}/intents/{job}", self.device(device))
    }

    pub fn intents_of(&self, device: &DeviceId) -> String {
        format!("{}/intents/+", self.device(device))
    }

    pub fn status(&self, device: &DeviceId, job: JobId) -> String {
        format!("{}/status/{job}", self.device(device))
    }

    pub fn hello(&self, device: &DeviceId) -> String {
        format!("{}/hello", self.device(device))
    }

    pub fn heartbeat(&self, device: &DeviceId) -> String {
        format!("{}/heartbeat", self.device(device))
    }

    pub fn control(&self, device: &DeviceId) -> String {
        format!("{}/control", self.device(device))
    }

    /// Where the control plane asks `device` for a job's output.
    pub fn logs_ask(&self, device: &DeviceId) -> String {
        format!("{}/logs/ask", self.device(device))
    }

    /// Where `device` answers, and only the control plane reads.
    pub fn logs_answer(&self, device: &DeviceId) -> String {
        format!("{}/logs/answer", self.device(device))
    }

    pub fn enroll(&self, device: &DeviceId) -> String {
        format!("{}/enroll/{device}", self.prefix)
    }

    /// The filters the control plane subscribes to.
    pub fn server_filters(&self) -> [String; 5] {
        [
            format!("{}/devices/+/status/+", self.prefix),
            format!("{}/devices/+/hello", self.prefix),
            format!("{}/devices/+/heartbeat", self.prefix),
            format!("{}/enroll/+", self.prefix),
            format!("{}/devices/+/logs/answer", self.prefix),
        ]
    }

    /// The mosquitto settings the control plane's session needs: no limit on
    /// the QoS 1 messages queued or in flight for it (the defaults, 1,000 and
    /// 20, drop statuses of a large fleet finishing at once, or slow it to the
    /// broker's pace), and no Nagle delay on the broker's sockets: with it, a
    /// small message waits for the peer's delayed ACK (40 ms on Linux), which
    /// was most of an intent's way to an agent and back (p50 48 ms).
    ///
    /// And a limit on what any client may send (`max_packet_size`, a whole
    /// packet): Drover's largest message is [`MAX_MESSAGE_BYTES`], so the
    /// broker disconnects a device that sends more instead of keeping it.
    pub fn broker_settings() -> String {
        format!(
            "max_queued_messages 0\nmax_inflight_messages 0\nset_tcp_nodelay true\n\
             max_packet_size {}",
            MAX_MESSAGE_BYTES + 64 * 1024
        )
    }

    /// The mosquitto settings of each listener the devices use (listener
    /// options: they apply to the `listener` line above them): a client's id
    /// is its user name, whatever id it sends, so no device can take another
    /// device's id, or a control-plane replica's, and push it off the broker.
    /// Each replica therefore logs in as a user of its own.
    pub fn listener_settings() -> &'static str {
        "use_username_as_clientid true"
    }

    /// The ACL patterns of a device (mosquitto's `%u` is its user name, the
    /// device id): read its own intents, control and log requests, write its
    /// own status, hello, heartbeat and log answers.
    pub fn device_acl(&self) -> Vec<String> {
        let base = format!("{}/devices/%u", self.prefix);
        vec![
            format!("pattern read {base}/intents/+"),
            format!("pattern read {base}/control"),
            format!("pattern read {base}/logs/ask"),
            format!("pattern write {base}/status/+"),
            format!("pattern write {base}/hello"),
            format!("pattern write {base}/heartbeat"),
            format!("pattern write {base}/logs/answer"),
        ]
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Reads a topic back; None for anything else.
    pub fn parse(&self, topic: &str) -> Option<Topic> {
        let under = topic.strip_prefix(&self.prefix)?;
        if let Some(id) = under.strip_prefix("/enroll/") {
            return Some(Topic::Enroll(DeviceId::new(id).ok()?));
        }
        let rest = under.strip_prefix("/devices/")?;
        let mut parts = rest.split('/');
        let device = DeviceId::new(parts.next()?).ok()?;
        let topic = match (parts.next()?, parts.next(), parts.next()) {
            ("intents", Some(job), None) => Topic::Intent(device, job.parse().ok()?),
            ("status", Some(job), None) => Topic::Status(device, job.parse().ok()?),
            ("hello", None, None) => Topic::Hello(device),
            ("heartbeat", None, None) => Topic::Heartbeat(device),
            ("control", None, None) => Topic::Control(device),
            ("logs", Some("ask"), None) => Topic::LogsAsk(device),
            ("logs", Some("answer"), None) => Topic::LogsAnswer(device),
            _ => return None,
        };
        Some(topic)
    }
}

/// What the control plane tells one agent: its clock (A12), or why its
/// hello was refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Control {
    pub server_time: jiff::Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The last will on the heartbeat topic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Offline {
    pub device_id: DeviceId,
    pub offline: bool,
}

#[derive(Debug, Clone)]
pub struct MqttSettings {
    /// `mqtt://host:port` (plain, loopback or a trusted network) or `mqtts://host:port`.
    pub url: String,
    pub user: String,
    pub password: String,
    /// CA certificate of the broker, for `mqtts://`.
    pub ca_file: Option<PathBuf>,
    pub prefix: String,
    pub keep_alive: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum MqttError {
    #[error("bad MQTT url {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("TLS: {0}")]
    Tls(String),
}

/// Host, port and whether TLS is used, from `mqtt://` or `mqtts://`.
pub fn parse_url(url: &str) -> Result<(String, u16, bool), MqttError> {
    let fail = |reason: &str| MqttError::Url {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| fail("expected mqtt://HOST:PORT or mqtts://HOST:PORT"))?;
    let tls = match scheme {
        "mqtt" | "tcp" => false,
        "mqtts" | "ssl" => true,
        _ => return Err(fail("scheme must be mqtt:// or mqtts://")),
    };
    let rest = rest.trim_end_matches('/');
    let (host, port) = match rest.rsplit_once(':') {
        Some((host, port)) => (
            host,
            port.parse::<u16>()
                .map_err(|_| fail("port is not a number"))?,
        ),
        None => (rest, if tls { 8883 } else { 1883 }),
    };
    if host.is_empty() {
        return Err(fail("no host"));
    }
    Ok((host.trim_matches(['[', ']']).to_owned(), port, tls))
}

/// A rustls client configuration (ring) trusting the CAs in `ca_file`.
pub fn tls_config(ca_file: &Path) -> Result<Arc<rustls::ClientConfig>, MqttError> {
    let fail = |e: String| MqttError::Tls(format!("{}: {e}", ca_file.display()));
    let mut roots = rustls::RootCertStore::empty();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca_file)
        .map_err(|e| fail(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| fail(e.to_string()))?;
    if certs.is_empty() {
        return Err(fail("no PEM certificate found".into()));
    }
    for cert in certs {
        let _ = roots.add(cert);
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| fail(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(config))
}

/// rumqttc options for a client id, from the settings: persistent session
/// (clean session off), credentials, TLS when asked.
pub fn options(
    settings: &MqttSettings,
    client_id: &str,
) -> Result<rumqttc::MqttOptions, MqttError> {
    let (host, port, tls) = parse_url(&settings.url)?;
    let mut options = rumqttc::MqttOptions::new(client_id, host, port);
    options
        .set_clean_session(false)
        .set_keep_alive(settings.keep_alive)
        .set_credentials(settings.user.clone(), settings.password.clone())
        .set_max_packet_size(256 * 1024, 256 * 1024);
    if tls {
        let ca = settings
            .ca_file
            .as_deref()
            .ok_or_else(|| MqttError::Tls("mqtts:// needs a CA file (ca_file)".into()))?;
        options.set_transport(rumqttc::Transport::Tls(rumqttc::TlsConfiguration::Rustls(
            tls_config(ca)?,
        )));
    }
    Ok(options)
}

/// A client and its event loop for `options`, with Nagle's algorithm off:
/// Drover's messages are small and each waits for an answer, so none may
/// sit in a socket buffer waiting for the peer's delayed ACK.
pub fn client(
    options: rumqttc::MqttOptions,
    queue: usize,
) -> (rumqttc::AsyncClient, rumqttc::EventLoop) {
    let (client, mut event_loop) = rumqttc::AsyncClient::new(options, queue);
    let mut network = event_loop.network_options();
    network.set_tcp_nodelay(true);
    event_loop.set_network_options(network);
    (client, event_loop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_round_trip() {
        let topics = Topics::new("drover/v1/");
        let device = DeviceId::new("pi-1").expect("id");
        let job = JobId::random();
        for (topic, expected) in [
            (
                topics.intent(&device, job),
                Topic::Intent(device.clone(), job),
            ),
            (
                topics.status(&device, job),
                Topic::Status(device.clone(), job),
            ),
            (topics.hello(&device), Topic::Hello(device.clone())),
            (topics.heartbeat(&device), Topic::Heartbeat(device.clone())),
            (topics.control(&device), Topic::Control(device.clone())),
            (topics.enroll(&device), Topic::Enroll(device.clone())),
            (topics.logs_ask(&device), Topic::LogsAsk(device.clone())),
            (
                topics.logs_answer(&device),
                Topic::LogsAnswer(device.clone()),
            ),
        ] {
            assert_eq!(topics.parse(&topic), Some(expected), "{topic}");
        }
        assert_eq!(
            topics.intent(&device, job),
            format!("drover/v1/devices/pi-1/intents/{job}")
        );
        for bad in [
            "drover/v1/devices/Pi 1/hello",
            "drover/v1/devices/pi-1/intents/not-a-uuid",
            "drover/v1/devices/pi-1/hello/extra",
            "other/devices/pi-1/hello",
            "drover/v1/devices/pi-1",
            "drover/v1/enroll/pi-1/x",
            "drover/v1/enroll/Pi",
        ] {
            assert_eq!(topics.parse(bad), None, "{bad}");
        }
    }

    /// The request in docs/protocol.md is what an agent sends and the
    /// control plane reads.
    #[test]
    fn the_enrollment_example_in_the_protocol_document_reads_back_the_same() {
        let doc = include_str!("../../../docs/protocol.md");
        let section = doc
            .split("## Enrollment over MQTT")
            .nth(1)
            .expect("the section");
        let example = section
            .split("```json\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .expect("its example");
        let request: EnrollPublish = serde_json::from_str(example).expect("an EnrollPublish");
        let theirs: serde_json::Value = serde_json::from_str(example).expect("json");
        let ours = serde_json::to_value(&request).expect("encode");
        assert_eq!(ours["publicKey"], theirs["publicKey"]);
        assert_eq!(ours["password"], theirs["password"]);
        assert_eq!(
            ours["inventory"]["hostname"],
            theirs["inventory"]["hostname"]
        );
    }

    #[test]
    fn urls() {
        assert_eq!(
            parse_url("mqtt://127.0.0.1:1883").expect("ok"),
            ("127.0.0.1".into(), 1883, false)
        );
        assert_eq!(
            parse_url("mqtts://broker.example.org").expect("ok"),
            ("broker.example.org".into(), 8883, true)
        );
        for bad in ["http://x:1", "mqtt://:1", "mqtt://x:port", "x"] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }
}
