//! The agent's local configuration file (TOML). Unknown keys are errors, so
//! a typo is reported instead of silently ignored. Nothing here can change
//! what the system upgrade runs (A8): only its mode and a sandbox root.

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use std::path::{Path, PathBuf};

pub const DEFAULT_SOCKET: &str = "/run/drover-agent/status.sock";

mod ca;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The device's id, or a template of it made on this machine: `{serial}`
    /// (the device tree's serial number), `{machine-id}` and `{hostname}`
    /// are replaced (`pi-{serial}`), so one image serves every device.
    pub device_id: String,
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    #[serde(default = "default_socket")]
    pub status_socket: PathBuf,
    /// The agent's database: redb (`agent.redb` in the state directory).
    /// `sled` (`agent.sled`) exists only in agents built with the
    /// `sled-store` feature, to measure it beside redb.
    #[serde(default)]
    pub store: StoreKind,
    /// Test hook: where the boot id is read, so a test can play a reboot.
    #[cfg(feature = "testing")]
    #[serde(default = "default_boot_id_path")]
    pub boot_id_path: PathBuf,
    /// Test hook: where the running kernel's release is read, so a test can
    /// play a Raspberry Pi's kernel.
    #[cfg(feature = "testing")]
    #[serde(default = "default_kernel_release_path")]
    pub kernel_release_path: PathBuf,
    /// Test hook: the stand-in for `/` where a `device_id` template's facts
    /// (serial number, machine id, host name) are read.
    #[cfg(feature = "testing")]
    #[serde(default)]
    pub identity_root: Option<PathBuf>,
    /// The control plane's Ed25519 public keys (hex), one or two (two while a
    /// key is rolled over): a fleet intent must be signed by one of them.
    /// `drover intent-key` prints the current one.
    #[serde(default)]
    pub intent_public_keys: Vec<String>,
    /// Members of this group may read the status socket (if the group exists).
    #[serde(default = "default_status_group")]
    pub status_group: String,
    /// The CA that signed the control plane's (or its broker's) certificate,
    /// inline (PEM), so that one file configures a device: it stands for
    /// the transport's `ca_file`, which must then be left out. The agent
    /// keeps it as `ca.pem` in its state directory.
    #[serde(default)]
    pub ca_pem: Option<String>,
    pub transport: Transport,
    pub updater: Updater,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub assessment: Assessment,
    #[cfg(feature = "testing")]
    #[serde(default)]
    pub testing: Option<Testing>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    #[default]
    Redb,
    Sled,
}

/// Keys only an agent built with its `testing` feature accepts; a release
/// agent (the .deb) refuses them by name.
const TEST_HOOK_KEYS: &[&str] = &[
    "testing",
    "boot_id_path",
    "kernel_release_path",
    "identity_root",
];

#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum Transport {
    Websocket {
        server_url: String,
        token: Option<String>,
        token_file: Option<PathBuf>,
        /// Without a token: the device asks to join with this enrollment
        /// token (`drover enrollment-tokens create`), then is let in by its
        /// own key (`device.key` in the state directory).
        enrollment_token: Option<String>,
        enrollment_token_file: Option<PathBuf>,
        /// With a token: move this device to its own key (`device.key`),
        /// enrolled with the token itself and accepted at once; from then on
        /// only the key lets it in, and the control plane's data directory
        /// can make nothing that does. Needs a control plane that knows
        /// enrollment.
        #[serde(default)]
        enroll_key: bool,
        /// Default: the system's bundle (a public CA), or `ca_pem`.
        ca_file: Option<PathBuf>,
        #[serde(default = "default_heartbeat")]
        heartbeat_seconds: u64,
        #[serde(default = "default_backoff_max")]
        backoff_max_seconds: u64,
    },
    /// NATS JetStream: the device logs in with its id as user and its token
    /// as password.
    Nats {
        url: String,
        token: Option<String>,
        token_file: Option<PathBuf>,
        /// Without a token: the device asks to join with this enrollment
        /// token, then logs in with the user JWT it is given and its own key
        /// (servers set up with `drover nats-config --authority`).
        enrollment_token: Option<String>,
        enrollment_token_file: Option<PathBuf>,
        /// The enrollment user's JWT, the same for every device of the
        /// fleet (`drover nats-config --authority` prints it); no secret.
        enrollment_jwt: Option<String>,
        /// CA certificate of the nats-server; setting it requires TLS.
        ca_file: Option<PathBuf>,
        #[serde(default = "default_heartbeat")]
        heartbeat_seconds: u64,
        #[serde(default = "default_backoff_max")]
        backoff_max_seconds: u64,
    },
    /// MQTT 3.1.1 with a persistent session: the device logs in with its id
    /// as user and its token as password.
    Mqtt {
        /// `mqtt://HOST:PORT` (loopback or a trusted network) or `mqtts://HOST:PORT`.
        url: String,
        token: Option<String>,
        token_file: Option<PathBuf>,
        /// Without a token: the device asks to join with this enrollment
        /// token, then logs in with its id and its own key's password (a
        /// broker set up with `drover mqtt-config --dynamic-security`).
        enrollment_token: Option<String>,
        enrollment_token_file: Option<PathBuf>,
        /// CA certificate of the broker, for `mqtts://`.
        ca_file: Option<PathBuf>,
        #[serde(default = "default_mqtt_prefix")]
        prefix: String,
        #[serde(default = "default_heartbeat")]
        heartbeat_seconds: u64,
        #[serde(default = "default_backoff_max")]
        backoff_max_seconds: u64,
    },
}

fn default_mqtt_prefix() -> String {
    transport_mqtt::DEFAULT_PREFIX.to_owned()
}

impl Transport {
    pub fn token(&self) -> (Option<&String>, Option<&PathBuf>) {
        match self {
            Transport::Websocket {
                token, token_file, ..
            }
            | Transport::Nats {
                token, token_file, ..
            }
            | Transport::Mqtt {
                token, token_file, ..
            } => (token.as_ref(), token_file.as_ref()),
        }
    }

    pub fn heartbeat_seconds(&self) -> u64 {
        match self {
            Transport::Websocket {
                heartbeat_seconds, ..
            }
            | Transport::Nats {
                heartbeat_seconds, ..
            }
            | Transport::Mqtt {
                heartbeat_seconds, ..
            } => *heartbeat_seconds,
        }
    }

    /// Checks the URL and TLS files as `run` would use them.
    pub fn check(&self) -> Result<()> {
        match self {
            Transport::Websocket {
                server_url,
                ca_file,
                ..
            } => transport_websocket::client::check_settings(
                server_url,
                &ca_file.clone().unwrap_or_else(default_ca_file),
            )
            .map_err(|e| anyhow::anyhow!("transport: {e}")),
            Transport::Mqtt {
                url,
                ca_file,
                prefix,
                ..
            } => {
                let (host, _, tls) = transport_mqtt::parse_url(url)
                    .map_err(|e| anyhow::anyhow!("transport: {e}"))?;
                if !tls && !drover_net::tls::is_loopback(&host) {
                    bail!(
                        "transport.url {url:?}: refusing plain mqtt:// to {host}, which is not a loopback address; use mqtts://"
                    );
                }
                match (tls, ca_file) {
                    (true, Some(ca)) => {
                        transport_mqtt::tls_config(ca)
                            .map_err(|e| anyhow::anyhow!("transport.ca_file: {e}"))?;
                    }
                    (true, None) => bail!("transport: mqtts:// needs ca_file"),
                    (false, _) => {}
                }
                if prefix.is_empty() || prefix.contains(['+', '#']) {
                    bail!("transport.prefix {prefix:?} must be a plain topic path");
                }
                Ok(())
            }
            Transport::Nats { url, ca_file, .. } => {
                let addresses = transport_nats::parse_addresses(url)
                    .map_err(|e| anyhow::anyhow!("transport.url: {e}"))?;
                // As over WebSocket and MQTT: a token never crosses a
                // network in clear. A ca_file makes every connection TLS.
                if ca_file.is_none()
                    && let Some(plain) = addresses
                        .iter()
                        .find(|a| !a.tls_required() && !drover_net::tls::is_loopback(a.host()))
                {
                    bail!(
                        "transport.url {url:?}: refusing plain nats:// to {}, which is not a loopback address; \
                         use tls:// with ca_file (or set ca_file, which makes every connection TLS)",
                        plain.host()
                    );
                }
                if let Some(ca) = ca_file {
                    std::fs::read(ca).with_context(|| {
                        format!("transport.ca_file {} is not readable", ca.display())
                    })?;
                }
                Ok(())
            }
        }
    }

    fn backoff_max_seconds(&self) -> u64 {
        match self {
            Transport::Websocket {
                backoff_max_seconds,
                ..
            }
            | Transport::Nats {
                backoff_max_seconds,
                ..
            }
            | Transport::Mqtt {
                backoff_max_seconds,
                ..
            } => *backoff_max_seconds,
        }
    }

    /// What lets this device in: its token, or (over WebSocket, without a
    /// token) its own key and the enrollment token it asks to join with.
    pub fn read_credentials(&self) -> Result<Credentials> {
        if self.token() != (None, None) {
            return self.read_token().map(Credentials::Token);
        }
        match self.enrollment_token() {
            (Some(token), _) => Ok(Credentials::Enrollment(token.clone())),
            (None, Some(file)) => Ok(Credentials::Enrollment(
                std::fs::read_to_string(file)
                    .with_context(|| {
                        format!("cannot read the enrollment token file {}", file.display())
                    })?
                    .trim()
                    .to_owned(),
            )),
            (None, None) => self.read_token().map(Credentials::Token),
        }
    }

    /// The enrollment token, inline or as a file (WebSocket and MQTT).
    fn enrollment_token(&self) -> (Option<&String>, Option<&PathBuf>) {
        match self {
            Transport::Websocket {
                enrollment_token,
                enrollment_token_file,
                ..
            }
            | Transport::Mqtt {
                enrollment_token,
                enrollment_token_file,
                ..
            }
            | Transport::Nats {
                enrollment_token,
                enrollment_token_file,
                ..
            } => (enrollment_token.as_ref(), enrollment_token_file.as_ref()),
        }
    }

    /// Whether the config names any credential.
    fn has_credentials(&self) -> bool {
        self.token() != (None, None) || self.enrollment_token() != (None, None)
    }

    /// The device's token, inline or from its file.
    pub fn read_token(&self) -> Result<String> {
        match self.token() {
            (Some(token), _) => Ok(token.clone()),
            (None, Some(file)) => Ok(std::fs::read_to_string(file)
                .with_context(|| format!("cannot read the token file {}", file.display()))?
                .trim()
                .to_owned()),
            (None, None) => bail!("transport needs token or token_file (or enrollment_token_file)"),
        }
    }
}

/// What the config gives the agent to be let in with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// A bearer token (`drover token DEVICE`).
    Token(String),
    /// An enrollment token: the device's own key is its credential.
    Enrollment(String),
}

#[derive(Debug, Deserialize, PartialEq, Eq, Clone, Copy)]
#[serde(rename_all = "lowercase")]
pub enum UpdaterMode {
    /// `apt-get -s full-upgrade`: report only, change nothing.
    Simulate,
    /// The real full upgrade, with dpkg repair and reboot.
    Upgrade,
}

impl UpdaterMode {
    /// The name the config writes (`mode = "simulate"`).
    pub fn name(self) -> &'static str {
        match self {
            UpdaterMode::Simulate => "simulate",
            UpdaterMode::Upgrade => "upgrade",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Updater {
    pub mode: UpdaterMode,
    /// A sandbox root (chroot directory) for tests and demos.
    pub root: Option<PathBuf>,
    #[serde(default = "default_min_free_mib")]
    pub min_free_mib: u64,
    /// Free space an upgrade needs on /boot and /boot/firmware where each
    /// is a filesystem of its own (a kernel and its initramfs are written
    /// there).
    #[serde(default = "default_min_free_boot_mib")]
    pub min_free_boot_mib: u64,
    /// CA certificates trusted for package downloads (`https://` links from
    /// the control plane). Default: the WebSocket transport's `ca_file`, or
    /// the system bundle.
    pub download_ca_file: Option<PathBuf>,
}

impl Config {
    /// The CA file package downloads trust.
    pub fn download_ca_file(&self) -> PathBuf {
        match (&self.updater.download_ca_file, &self.transport) {
            (Some(file), _) => file.clone(),
            (None, Transport::Websocket { ca_file, .. }) => {
                ca_file.clone().unwrap_or_else(default_ca_file)
            }
            (None, _) => default_ca_file(),
        }
    }
}

/// The agent's own patch assessments (`[assessment]`): every
/// `every_minutes` (a day by default; 0 turns them off) and after every job
/// that changed packages.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Assessment {
    #[serde(default = "default_assess_every_minutes")]
    pub every_minutes: u32,
}

impl Default for Assessment {
    fn default() -> Self {
        Self {
            every_minutes: default_assess_every_minutes(),
        }
    }
}

fn default_assess_every_minutes() -> u32 {
    24 * 60
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(default = "default_max_resumes")]
    pub max_resumes: u32,
    #[serde(default = "default_keep_jobs")]
    pub keep_jobs: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_resumes: default_max_resumes(),
            keep_jobs: default_keep_jobs(),
        }
    }
}

/// Test hooks, compiled only with the `testing` feature: pause before a step
/// while `hold_file` exists (after writing `reached_file`), so a test can
/// act in the middle of a job; skew the device's clock; shorten the job's
/// budget.
#[cfg(feature = "testing")]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Testing {
    pub hold_before_step: Option<String>,
    pub hold_file: Option<PathBuf>,
    pub reached_file: Option<PathBuf>,
    /// Seconds added to the device's clock (negative: a slow clock).
    #[serde(default)]
    pub clock_offset_seconds: i64,
    /// The whole job's budget in place of the intent's `timeoutSeconds`.
    pub job_budget_seconds: Option<u64>,
}

fn default_state_dir() -> PathBuf {
    PathBuf::from("/var/lib/drover-agent")
}
fn default_socket() -> PathBuf {
    PathBuf::from(DEFAULT_SOCKET)
}
fn default_status_group() -> String {
    "drover".into()
}
#[cfg(feature = "testing")]
fn default_boot_id_path() -> PathBuf {
    PathBuf::from(agent_core::boot::DEFAULT_BOOT_ID_PATH)
}
#[cfg(feature = "testing")]
fn default_kernel_release_path() -> PathBuf {
    PathBuf::from(updater_apt::kernel::RELEASE_PATH)
}
pub(crate) fn default_ca_file() -> PathBuf {
    PathBuf::from(drover_net::tls::SYSTEM_CA_BUNDLE)
}
fn default_heartbeat() -> u64 {
    30
}
fn default_backoff_max() -> u64 {
    agent_core::backoff::DEFAULT_BACKOFF_MAX.as_secs()
}
fn default_min_free_mib() -> u64 {
    300
}
/// Room for one kernel and its initramfs beside the old ones (a Raspberry
/// Pi OS 64-bit image writes two flavours' of each to /boot/firmware).
fn default_min_free_boot_mib() -> u64 {
    64
}
fn default_max_resumes() -> u32 {
    5
}
fn default_keep_jobs() -> usize {
    200
}

impl Config {
    /// Where apt's and dpkg's calls keep their state and output.
    pub fn calls_dir(&self) -> PathBuf {
        self.state_dir.join("calls")
    }

    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the agent config {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("invalid agent config {}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Self> {
        if !cfg!(feature = "testing") {
            let table: toml::Table = toml::from_str(text).map_err(|e| one_line(text, &e))?;
            if let Some(key) = TEST_HOOK_KEYS.iter().find(|k| table.contains_key(**k)) {
                bail!(
                    "`{key}` is a test hook, and this drover-agent was built without test hooks \
                     (cargo feature `testing`); remove it from the config"
                );
            }
        }
        let mut config: Config = toml::from_str(text).map_err(|e| one_line(text, &e))?;
        // A template (`pi-{serial}`) becomes this machine's id here.
        #[cfg(feature = "testing")]
        let sources = config
            .identity_root
            .as_deref()
            .map(agent_core::identity::Sources::under)
            .unwrap_or_default();
        #[cfg(not(feature = "testing"))]
        let sources = agent_core::identity::Sources::default();
        config.device_id = agent_core::identity::device_id(&config.device_id, &sources)?
            .as_str()
            .to_owned();
        config.resolve_ca()?;
        bounded(
            "transport.heartbeat_seconds",
            config.transport.heartbeat_seconds(),
            1,
            3600,
        )?;
        bounded(
            "transport.backoff_max_seconds",
            config.transport.backoff_max_seconds(),
            1,
            3600,
        )?;
        bounded(
            "updater.min_free_mib",
            config.updater.min_free_mib,
            0,
            1_000_000,
        )?;
        bounded(
            "updater.min_free_boot_mib",
            config.updater.min_free_boot_mib,
            0,
            1_000_000,
        )?;
        bounded(
            "limits.max_resumes",
            config.limits.max_resumes.into(),
            1,
            100,
        )?;
        bounded(
            "limits.keep_jobs",
            config.limits.keep_jobs as u64,
            1,
            10_000,
        )?;
        if !config.transport.has_credentials() {
            bail!("transport needs token or token_file (or enrollment_token_file)");
        }
        if config.intent_public_keys.is_empty() {
            bail!(
                "intent_public_keys is empty: this agent would refuse every fleet job; \
                 put the control plane's key there (`drover intent-key` on its host prints it)"
            );
        }
        if config.intent_public_keys.len() > 2 {
            bail!("intent_public_keys takes one key, or two while a key is rolled over");
        }
        drover_model::signing::TrustedKeys::from_hex(&config.intent_public_keys)
            .map_err(|e| anyhow::anyhow!("intent_public_keys: {e}"))?;
        Ok(config)
    }
}

/// A number from the config within its bounds, or an error naming the key.
fn bounded(key: &str, value: u64, min: u64, max: u64) -> Result<()> {
    if value < min || value > max {
        bail!("{key} is {value}; it must be between {min} and {max}");
    }
    Ok(())
}

/// A TOML error as one line, the way a log or `check` shows it: where
/// (line and column) and what, without the multi-line excerpt the toml
/// crate draws under its message.
fn one_line(text: &str, error: &toml::de::Error) -> anyhow::Error {
    let message = error.message().trim().replace('\n', " ");
    match error.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |at| at + 1) + 1;
            anyhow::anyhow!("line {line}, column {column}: {message}")
        }
        None => anyhow::anyhow!("{message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) const GOOD: &str = r#"
device_id = "device-1"
intent_public_keys = ["d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"]
[transport]
kind = "websocket"
server_url = "ws://127.0.0.1:7181"
token = "abc"
[updater]
mode = "simulate"
"#;

    #[test]
    fn a_good_config_parses_with_defaults() {
        let config = Config::parse(GOOD).expect("parses");
        assert_eq!(config.limits.max_resumes, 5);
        assert_eq!(config.status_socket, PathBuf::from(DEFAULT_SOCKET));
    }

    /// A device with no token and an enrollment token (over WebSocket):
    /// its key is its credential; the same over NATS or MQTT is refused by
    /// name, and a config with neither says what it needs.
    #[test]
    fn an_enrollment_token_stands_for_a_token_over_every_transport() {
        let enrolling = GOOD.replace(
            "token = \"abc\"",
            "enrollment_token = \"drover-enroll.a.b\"",
        );
        let config = Config::parse(&enrolling).expect("parses");
        assert_eq!(
            config.transport.read_credentials().expect("credentials"),
            Credentials::Enrollment("drover-enroll.a.b".into())
        );
        let both = GOOD.replace(
            "token = \"abc\"",
            "token = \"abc\"\nenrollment_token = \"e\"",
        );
        assert_eq!(
            Config::parse(&both)
                .expect("parses")
                .transport
                .read_credentials()
                .expect("credentials"),
            Credentials::Token("abc".into()),
            "a token, when there is one, is used"
        );
        let neither = GOOD.replace("token = \"abc\"", "");
        let error = format!("{:#}", Config::parse(&neither).expect_err("no credential"));
        assert!(error.contains("enrollment_token_file"), "{error}");
        let nats = GOOD
            .replace("kind = \"websocket\"", "kind = \"nats\"")
            .replace(
                "server_url = \"ws://127.0.0.1:7181\"",
                "url = \"nats://127.0.0.1:4222\"",
            )
            .replace("token = \"abc\"", "enrollment_token = \"e\"");
        assert_eq!(
            Config::parse(&nats)
                .expect("parses over nats")
                .transport
                .read_credentials()
                .expect("credentials"),
            Credentials::Enrollment("e".into())
        );
        let mqtt = GOOD
            .replace("kind = \"websocket\"", "kind = \"mqtt\"")
            .replace(
                "server_url = \"ws://127.0.0.1:7181\"",
                "url = \"mqtt://127.0.0.1:1883\"",
            )
            .replace(
                "token = \"abc\"",
                "enrollment_token = \"drover-enroll.a.b\"",
            );
        assert_eq!(
            Config::parse(&mqtt)
                .expect("parses over mqtt")
                .transport
                .read_credentials()
                .expect("credentials"),
            Credentials::Enrollment("drover-enroll.a.b".into())
        );
    }

    /// One config for many devices: the id is made on the machine (here a
    /// stand-in root with a Raspberry Pi's serial number).
    #[cfg(feature = "testing")]
    #[test]
    fn a_device_id_template_is_made_on_the_machine() {
        let root = tempfile::tempdir().expect("tempdir");
        let serial = root.path().join("proc/device-tree/serial-number");
        std::fs::create_dir_all(serial.parent().expect("parent")).expect("dirs");
        std::fs::write(&serial, b"10000000CAFE0042\0").expect("serial");
        let text = GOOD.replace("device_id = \"device-1\"", "device_id = \"pi-{serial}\"");
        let with_root = format!(
            "identity_root = {:?}\n{text}",
            root.path().display().to_string()
        );
        let config = Config::parse(&with_root).expect("parses");
        assert_eq!(config.device_id, "pi-10000000cafe0042");
        // No serial number: the config says why instead of starting.
        std::fs::remove_file(&serial).expect("rm");
        let error = format!("{:#}", Config::parse(&with_root).expect_err("no serial"));
        assert!(error.contains("needs {serial}"), "{error}");
    }

    #[test]
    fn a_nats_transport_takes_every_node_of_a_cluster() {
        let nats = |url: &str| {
            GOOD.replace(
                "kind = \"websocket\"\nserver_url = \"ws://127.0.0.1:7181\"",
                &format!("kind = \"nats\"\nurl = \"{url}\""),
            )
        };
        let three = Config::parse(&nats(
            "nats://127.0.0.1:4222,nats://127.0.0.2:4222,tls://n3:4222",
        ))
        .expect("three nodes");
        three.transport.check().expect("three nodes check");
        let plain = Config::parse(&nats("tls://n1:4222,nats://n2:4222"))
            .expect("parses")
            .transport
            .check()
            .expect_err("plain NATS to another host");
        assert!(
            format!("{plain:#}").contains("refusing plain nats:// to n2"),
            "{plain:#}"
        );
        let bad = Config::parse(&nats("nats://n1:4222,http://n2:80"))
            .expect("parses")
            .transport
            .check()
            .expect_err("http is no NATS URL");
        assert!(format!("{bad:#}").contains("http://n2:80"), "{bad:#}");
    }

    #[test]
    fn bad_configs_are_clear_errors() {
        let cases = [
            (GOOD.replace("device-1", "Device 1"), "device id must be"),
            (
                GOOD.replace("mode = \"simulate\"", "mode = \"yolo\""),
                "unknown variant",
            ),
            (
                // A8: the config cannot add packages, commands or repositories.
                GOOD.replace(
                    "mode = \"simulate\"",
                    "mode = \"upgrade\"\npackages = [\"x\"]",
                ),
                "unknown field `packages`",
            ),
            (GOOD.replace("token = \"abc\"", ""), "token or token_file"),
            #[cfg(not(feature = "testing"))]
            (
                format!("{GOOD}\n[testing]\nclock_offset_seconds = 5\n"),
                "`testing` is a test hook",
            ),
            #[cfg(not(feature = "testing"))]
            (
                format!("boot_id_path = \"/tmp/b\"\n{GOOD}"),
                "`boot_id_path` is a test hook",
            ),
            (format!("{GOOD}\ncommand = \"rm -rf /\"\n"), "unknown field"),
            ("device_id = ".to_owned(), "line 1, column 13: "),
            (format!("{GOOD}\nstore = 5\n"), "line "),
        ];
        for (text, expected) in cases {
            let err = format!("{:#}", Config::parse(&text).unwrap_err());
            assert!(err.contains(expected), "{expected}: {err}");
            // One line, as the docs promise: no excerpt drawn under it.
            assert_eq!(err.lines().count(), 1, "{err}");
        }
    }
}
