//! The arguments of `drover operators` and `drover audit` (issue 35).

use super::Output;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum OperatorsCommand {
    /// Every operator, its role and whether it is revoked.
    List {
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Add an operator and print its token (shown once, stored as a digest).
    Add {
        name: String,
        /// viewer: reads; operator: also applies, cancels, uploads; admin:
        /// also deletes and manages operators and devices' tokens.
        #[arg(long)]
        role: String,
    },
    /// Give an operator a new token; the old one and its dashboard
    /// sessions stop working at once.
    Rotate { name: String },
    /// Revoke an operator: its token and dashboard sessions are refused on
    /// every replica.
    Revoke { name: String },
}

#[derive(clap::Args)]
pub struct AuditArgs {
    /// Only entries since this time (RFC 3339) or age (30m, 24h, 7d).
    #[arg(long)]
    pub since: Option<String>,
    /// Only this operator's entries.
    #[arg(long)]
    pub operator: Option<String>,
    /// Only entries about this kind (TaskRun, Deployment, Device, Operator, …).
    #[arg(long)]
    pub kind: Option<String>,
    /// One JSON object per line (for a SIEM).
    #[arg(long, conflicts_with = "output")]
    pub jsonl: bool,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// `drover enrollment-tokens` (issue 55).
#[derive(Subcommand)]
pub enum EnrollmentTokensCommand {
    /// Every enrollment token: its groups, labels, uses and state.
    List {
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Make a token and print it (shown once, stored as a digest): put it
    /// in the devices' enrollment file.
    Create {
        name: String,
        /// Groups a device accepted through it joins (comma-separated or
        /// repeated).
        #[arg(long, value_delimiter = ',')]
        groups: Vec<String>,
        /// Labels it gets, KEY=VALUE (comma-separated or repeated).
        #[arg(long, value_delimiter = ',')]
        labels: Vec<String>,
        /// Devices it may enroll; without it, any number.
        #[arg(long)]
        max_uses: Option<u64>,
        /// When it stops enrolling: an age from now (30m, 24h, 7d) or a
        /// time (2026-12-31T00:00:00Z); without it, never.
        #[arg(long)]
        expires: Option<String>,
        /// Accept devices enrolled with it at once, without an operator.
        #[arg(long)]
        auto_accept: bool,
        /// Print, instead of the token alone, the whole agent config of the
        /// devices enrolled with it, for /etc/drover/agent.toml: the
        /// address agents connect to (wss://HOST:7181, the agents' port;
        /// mqtts://HOST:8883, the MQTT broker; tls://HOST:4222, NATS), the
        /// token, the CA and the keys intents are signed with.
        #[arg(long, value_name = "AGENTS_URL")]
        agent_config: Option<String>,
        /// With --agent-config: the device id, or a template each device
        /// fills in: {serial} (the device tree's serial number),
        /// {machine-id}, {hostname} [default: {machine-id}].
        #[arg(long, requires = "agent_config")]
        device_id: Option<String>,
        /// With --agent-config: the CA the agents trust, put in the config
        /// [default: this command's --ca-file, the control plane's CA].
        #[arg(long, value_name = "FILE", requires = "agent_config")]
        agent_ca_file: Option<std::path::PathBuf>,
        /// With --agent-config: "upgrade" (apt full-upgrade) or "simulate"
        /// (apt-get -s, changes nothing) [default: upgrade].
        #[arg(long, requires = "agent_config", value_parser = ["upgrade", "simulate"])]
        mode: Option<String>,
    },
    /// Revoke a token: devices that enrolled with it stay; no new one can.
    Revoke { name: String },
}

/// `drover devices` (issue 55): the keys devices enrolled.
#[derive(Subcommand)]
pub enum DevicesCommand {
    /// Devices that enrolled and wait for an operator.
    Pending {
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Every enrolled key: pending, accepted and rejected.
    Keys {
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Accept a pending device: it joins with its token's groups and labels.
    Accept { id: String },
    /// Reject a device's key: it opens nothing, asking again is refused,
    /// and an open session ends.
    Reject { id: String },
    /// Accept a device's key before it asks (the key `drover-agent status`
    /// prints on the device): its agent is let in by the key at once.
    Preauthorize {
        id: String,
        /// The device's Ed25519 public key, 64 hex digits.
        #[arg(long)]
        public_key: String,
        /// Groups it joins (comma-separated or repeated).
        #[arg(long, value_delimiter = ',')]
        groups: Vec<String>,
        /// Labels it gets, KEY=VALUE (comma-separated or repeated).
        #[arg(long, value_delimiter = ',')]
        labels: Vec<String>,
    },
}
