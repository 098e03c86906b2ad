//! The `drover` command line, in the library so that its man page and
//! shell completions are generated from the very definitions the binary
//! parses (tests/tests/docs.rs).

use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;

mod access;
mod brokers;
mod serve;
pub use access::{AuditArgs, DevicesCommand, EnrollmentTokensCommand, OperatorsCommand};
pub use brokers::{MqttConfigArgs, NatsConfigArgs};
pub use serve::ServeArgs;

#[derive(Parser)]
#[command(name = "drover", version, about = "Drover's control plane and CLI")]
pub struct Cli {
    /// The control plane's API (default: the context's, else
    /// http://127.0.0.1:7180).
    #[arg(long, global = true, env = "DROVER_SERVER")]
    pub server: Option<String>,
    /// For an https:// server: the CA bundle to trust, or the server's own
    /// self-signed certificate (default: the context's, else the system's
    /// CAs).
    #[arg(long, global = true, env = "DROVER_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// The operator token (default: the context's token file, else
    /// DATA/operator.token).
    #[arg(long, global = true, env = "DROVER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The context to use from the CLI's config (~/.config/drover/config.toml,
    /// or DROVER_CONFIG); default: the current one (`drover config
    /// use-context`).
    #[arg(long, global = true, env = "DROVER_CONTEXT")]
    pub context: Option<String>,
    /// The control plane's data directory.
    #[arg(
        long,
        global = true,
        env = "DROVER_DATA",
        default_value = "/var/lib/drover"
    )]
    pub data: PathBuf,
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process; the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub enum Command {
    /// Run the control plane: the embedded store in --data by default, or
    /// NATS JetStream (--store nats) for several replicas.
    Serve(ServeArgs),
    /// Print a nats-server authorization block: the control plane may do
    /// anything; each device may read only its own intents and send only its
    /// own statuses, hello and heartbeat to the control plane, and may write
    /// no bucket (its password is derived from its device token and written
    /// as a bcrypt hash).
    NatsConfig(NatsConfigArgs),
    /// Write mosquitto's password and ACL files for the control plane and
    /// these devices (a device may read only its own intents and write only
    /// its own status, hello and heartbeat; its password is derived from its
    /// token), and
    /// print the mosquitto.conf lines that use them. Run it on the control
    /// plane's host with its --data.
    MqttConfig(MqttConfigArgs),
    /// Create or configure resources from a YAML or JSON file.
    Apply {
        /// A YAML or JSON file of one or more documents (all validated
        /// before any is applied); `-` reads standard input.
        #[arg(short = 'f', long = "filename")]
        file: PathBuf,
        /// Check and preview only (`--dry-run` or `--dry-run=server`):
        /// what would be created, configured or refused, and for a TaskRun
        /// or a Deployment the targets it would get now and who is left out
        /// and why. Nothing is stored.
        #[arg(
            long,
            value_name = "server",
            num_args = 0..=1,
            require_equals = true,
            default_missing_value = "server",
            value_parser = ["server"]
        )]
        dry_run: Option<String>,
    },
    /// Show devices, taskruns, taskschedules, deployments or packages: all
    /// of a kind, or with NAME that one (exit 1 when there is none). Each
    /// kind goes by its plural, its singular or a short name (dev, tr, ts,
    /// deploy, pkg).
    Get {
        #[arg(value_enum)]
        resource: Resource,
        name: Option<String>,
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
        /// After the listing, print a row (or, with -o json|yaml, an object)
        /// for every one that changes, until interrupted.
        #[arg(short = 'w', long)]
        watch: bool,
    },
    /// Follow task runs and deployments.
    Runs {
        #[command(subcommand)]
        command: RunsCommand,
    },
    /// Show one resource in detail: a deployment's counts, each site's
    /// window now, its latest errors and the retries waiting.
    Describe {
        #[arg(value_enum)]
        resource: Described,
        name: String,
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// A job's whole output, fetched from the device through its transport
    /// as it answers: each apt and dpkg call with its command and exit
    /// status, then what it printed (apt's and dpkg's own words, the
    /// maintainer scripts'). The device keeps its jobs' output for 30 days
    /// and 32 MiB; at most the last 4 MiB of one job come back.
    Logs {
        /// The device's id.
        device: String,
        /// A job id or its start (`drover describe device` lists them);
        /// the job whose output is newest when left out.
        job: Option<String>,
        /// Only the last N lines.
        #[arg(long, value_name = "N")]
        tail: Option<u32>,
        /// How long to wait for the device, in seconds (1 to 120).
        #[arg(long, value_name = "SECONDS", default_value_t = 30)]
        wait: u64,
    },
    /// The fleet's patch status from each device's latest assessment: up to
    /// date, with updates or security updates pending (and how long the
    /// oldest has waited), a reboot pending, not assessed lately.
    PatchStatus {
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Cancel a task run or a deployment: nothing more is released, jobs
    /// that have not started on their devices are canceled there, and jobs
    /// that have started run to their end (an upgrade is never cut short).
    /// It ends Failed with reason Canceled once every job is decided;
    /// `drover runs watch NAME` follows it.
    Cancel {
        #[arg(value_enum)]
        resource: Cancelable,
        name: String,
    },
    /// Delete a finished task run or deployment (its record, targets and
    /// jobs), a device (its registry record, inventory and finished jobs),
    /// a task schedule, a Secret or a package. What is still going is
    /// refused with the command to run first: cancel a run or a deployment;
    /// a Secret or a package an unfinished deployment needs stays.
    Delete {
        #[arg(value_enum)]
        resource: Deletable,
        name: String,
    },
    /// Act on deployments.
    Deployments {
        #[command(subcommand)]
        command: DeploymentsCommand,
    },
    /// What needs an operator's eye: failed canaries and deployments, runs
    /// past their deadline, devices offline, in a resume loop, with a
    /// security update waiting, a reboot pending or no recent assessment.
    /// Each says whether, by whom and when it was acknowledged.
    Alerts {
        #[command(subcommand)]
        command: Option<AlertsCommand>,
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Named operators, each with a role (viewer, operator, admin) and its
    /// own token: add, list, rotate, revoke. The bootstrap token
    /// (DATA/operator.token) is the admin named `admin`.
    Operators {
        #[command(subcommand)]
        command: OperatorsCommand,
    },
    /// Enrollment tokens: one in a device image lets every device made
    /// from it ask to join (create, list, revoke).
    EnrollmentTokens {
        #[command(subcommand)]
        command: EnrollmentTokensCommand,
    },
    /// Devices that enrolled their own key: pending, accept, reject.
    Devices {
        #[command(subcommand)]
        command: DevicesCommand,
    },
    /// The audit log: every change (who, what, when, from where, the
    /// outcome) and every refused request, oldest first.
    Audit(AuditArgs),
    /// The package store (for packageInstallV1 deployments).
    Packages {
        #[command(subcommand)]
        command: PackagesCommand,
    },
    /// The CLI's contexts: control planes by name, each with its server,
    /// CA and token file (kept in ~/.config/drover/config.toml, or
    /// DROVER_CONFIG; the token stays in its file).
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Print the bearer token a device's agent uses. Refused for a device
    /// the control plane does not know (it asks the API), unless
    /// --unregistered.
    Token {
        device: String,
        /// Print it for a device that is not registered (yet), without
        /// asking the API (a token never rotated).
        #[arg(long, conflicts_with = "rotate")]
        unregistered: bool,
        /// Revoke the device's token and print the next one (an admin's):
        /// the old one is refused from now on and its WebSocket session
        /// ends. Over MQTT or NATS, make the broker's files again.
        #[arg(long)]
        rotate: bool,
    },
    /// Move a damaged or empty control-plane database aside (DATA/drover.redb);
    /// the next `serve` starts with a new, empty one. Refused while a
    /// `serve` holds the database; asks first unless --yes.
    ResetStore {
        /// Do not ask: the database is moved aside (for scripts).
        #[arg(long)]
        yes: bool,
    },
    /// Check one database file (serve runs this before opening it).
    #[command(hide = true)]
    VerifyStore { path: PathBuf },
    /// Print the public key agents pin to check the control plane's intent
    /// signatures (`intent_public_keys` in the agent's config). Run it on the
    /// control plane's host with its --data.
    IntentKey,
    /// Make the data directory's keys before the first `serve` (device-token
    /// key, operator token, intent key), and with --tls-name a CA and a
    /// server certificate for those names: DATA/tls/server.pem and
    /// server.key for `serve`, DATA/tls/ca.pem for every agent (ca_file) and
    /// operator (DROVER_CA_FILE). Keeps whatever exists.
    Init {
        /// A DNS name or IP address agents and operators use to reach the
        /// control plane (repeat for each).
        #[arg(long = "tls-name", value_name = "NAME")]
        tls_names: Vec<String>,
        /// Replace an existing CA and server certificate (asks first
        /// unless --yes).
        #[arg(long)]
        renew_tls: bool,
        /// Do not ask before --renew-tls replaces the CA (for scripts).
        #[arg(long)]
        yes: bool,
    },
    /// Run the end-to-end demo: control plane, agents and a task run.
    Demo {
        #[arg(long, default_value_t = 3)]
        agents: usize,
        /// Keep the demo's temporary directory.
        #[arg(long)]
        keep: bool,
        /// The drover-agent binary (default: next to drover, or on PATH).
        #[arg(long, env = "DROVER_AGENT_BIN")]
        agent_bin: Option<PathBuf>,
        /// Run the real apt upgrade, each agent in its own disposable Debian
        /// root (needs root and debootstrap), instead of simulating it.
        #[arg(long)]
        upgrade: bool,
    },
}

/// Serving agents over MQTT as well.
#[derive(clap::Args)]
pub struct MqttArgs {
    /// mqtt://HOST:PORT (or mqtts://) of the broker (mosquitto).
    #[arg(long)]
    pub mqtt_url: Option<String>,
    #[arg(long, requires = "mqtt_url", default_value = "drover-control-plane")]
    pub mqtt_user: String,
    #[arg(
        long,
        env = "DROVER_MQTT_PASSWORD",
        hide_env_values = true,
        requires = "mqtt_url"
    )]
    pub mqtt_password: Option<String>,
    /// CA certificate of the broker (mqtts://).
    #[arg(long, requires = "mqtt_url")]
    pub mqtt_ca: Option<PathBuf>,
    /// Topic prefix.
    #[arg(long, default_value = transport_mqtt::DEFAULT_PREFIX)]
    pub mqtt_prefix: String,
    /// Requests (publishes, acknowledgements, subscriptions) that may wait
    /// for the link to send them; more wait in tasks of their own.
    #[arg(long, default_value_t = transport_mqtt::server::REQUEST_QUEUE)]
    pub mqtt_request_queue: usize,
    /// The MQTT keep-alive: the broker drops a control plane silent for 1.5
    /// times this, and the link calls itself stalled (and reconnects) after
    /// as long without moving.
    #[arg(long, default_value_t = 30)]
    pub mqtt_keep_alive_seconds: u64,
}

impl MqttArgs {
    pub fn settings(&self) -> Option<transport_mqtt::MqttSettings> {
        Some(transport_mqtt::MqttSettings {
            url: self.mqtt_url.clone()?,
            user: self.mqtt_user.clone(),
            password: self.mqtt_password.clone().unwrap_or_default(),
            ca_file: self.mqtt_ca.clone(),
            prefix: self.mqtt_prefix.clone(),
            keep_alive: Duration::from_secs(self.mqtt_keep_alive_seconds.max(1)),
        })
    }
}

/// Serving agents over NATS JetStream as well as WebSocket.
#[derive(clap::Args)]
pub struct NatsArgs {
    /// nats://HOST:PORT (or tls://) of a nats-server with JetStream; for a
    /// cluster, several, comma-separated.
    #[arg(long)]
    pub nats_url: Option<String>,
    /// Copies JetStream keeps of each bucket Drover creates: 1 on one
    /// server, 3 on a cluster of three (set before the buckets exist).
    #[arg(long, requires = "nats_url", default_value_t = 1)]
    pub nats_replicas: usize,
    #[arg(long, requires = "nats_url")]
    pub nats_user: Option<String>,
    #[arg(
        long,
        env = "DROVER_NATS_PASSWORD",
        hide_env_values = true,
        requires = "nats_url"
    )]
    pub nats_password: Option<String>,
    /// CA certificate of the nats-server (requires TLS).
    #[arg(long, requires = "nats_url")]
    pub nats_ca: Option<PathBuf>,
    /// Servers that trust Drover's operator (`drover nats-config
    /// --authority DIR`): the keys there sign this control plane's own JWT
    /// (instead of --nats-user and --nats-password), each accepted device's
    /// JWT, and the revocations pushed to the servers. Keep DIR outside the
    /// data directory, readable by this control plane only.
    #[arg(long, requires = "nats_url", value_name = "DIR")]
    pub nats_authority: Option<PathBuf>,
    /// Logins a second the NATS servers take: agents spread their first
    /// reconnect after a lost connection over the devices heard from
    /// divided by this (decision 0020); 0 for no spread.
    #[arg(long, requires = "nats_url", default_value_t = transport_nats::spread::DEFAULT_LOGINS_PER_SECOND)]
    pub nats_logins_per_second: u32,
}

impl NatsArgs {
    pub fn settings(&self) -> Option<transport_nats::NatsSettings> {
        Some(transport_nats::NatsSettings {
            url: self.nats_url.clone()?,
            user: self.nats_user.clone(),
            password: self.nats_password.clone(),
            ca_file: self.nats_ca.clone(),
            connect_timeout: Duration::from_secs(10),
            replicas: self.nats_replicas,
            key_login: None,
        })
    }
}

#[derive(Subcommand)]
pub enum RunsCommand {
    /// A live progress bar of a task run or a deployment until it finishes
    /// (NAME, or deployment/NAME, taskrun/NAME).
    Watch { name: String },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StoreKind {
    Embedded,
    Nats,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Resource {
    #[value(aliases = ["device", "dev"])]
    Devices,
    #[value(aliases = ["taskrun", "tr"])]
    Taskruns,
    #[value(aliases = ["taskschedule", "ts"])]
    Taskschedules,
    #[value(aliases = ["deployment", "deploy"])]
    Deployments,
    #[value(aliases = ["package", "pkg"])]
    Packages,
}

impl Resource {
    /// The kind's singular name, as `-o name` prints it (`device/pi-1`).
    pub fn singular(self) -> &'static str {
        match self {
            Resource::Devices => "device",
            Resource::Taskruns => "taskrun",
            Resource::Taskschedules => "taskschedule",
            Resource::Deployments => "deployment",
            Resource::Packages => "package",
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Described {
    Deployment,
    /// A task run with a table of its targets: state, current step, what
    /// each job did, error.
    Taskrun,
    /// A device: its record, its patch status with the pending packages,
    /// its latest jobs and what each did, and the packages its last
    /// successful upgrade changed (from → to).
    Device,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Cancelable {
    Taskrun,
    Deployment,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Deletable {
    Taskrun,
    Device,
    Deployment,
    /// The schedule only: the runs it made stay until deleted.
    Taskschedule,
    Secret,
    Package,
}

#[derive(Subcommand)]
pub enum DeploymentsCommand {
    /// Run a deployment's targeting again and add the devices that match
    /// now and are not targets yet (within its 20,000 targets).
    AddNewDevices { name: String },
}

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Make or change a context: the API's address from --server, the CA
    /// to trust from --ca-file (init's tls/ca.pem), and the token file.
    SetContext {
        name: String,
        /// The file holding the operator token (mode 0600; the config
        /// keeps its path, not the token).
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
        /// Make it the current context too.
        #[arg(long = "use")]
        use_it: bool,
    },
    /// Make a context the current one.
    UseContext { name: String },
    /// List the contexts, the current one marked with *.
    GetContexts,
    /// Print the current context's name.
    CurrentContext,
    /// Remove a context.
    DeleteContext { name: String },
}

#[derive(Subcommand)]
pub enum AlertsCommand {
    /// Acknowledge an alert as it stands: listed as acknowledged while its
    /// condition lasts, raised again once it clears and returns.
    Ack {
        /// The alert's kind (SecurityUpdatesWaiting, RebootPending, …).
        kind: String,
        /// What it is about, as listed (device/ID, taskrun/NAME, …).
        resource: String,
    },
}

#[derive(Subcommand)]
pub enum PackagesCommand {
    /// Store a .deb: its name, version and architecture are read from it,
    /// its size and SHA-256 recorded. The same file again changes nothing;
    /// another file under the same name, version and architecture is refused.
    /// The file is streamed with a progress bar at a terminal; an upload
    /// that keeps moving is never cut off, one that stops is sent again
    /// (3 attempts in all).
    Upload {
        file: PathBuf,
        /// Give up on an attempt when the control plane takes no bytes for
        /// this many seconds.
        #[arg(long, default_value_t = 60, value_name = "SECONDS")]
        stall_seconds: u64,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    /// The table with more columns (devices: OS, architecture, transport,
    /// time zone, boot id).
    Wide,
    Json,
    Yaml,
    /// `kind/name` per object, one per line (for scripts).
    Name,
}
