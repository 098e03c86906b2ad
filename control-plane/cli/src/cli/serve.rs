//! The arguments of `drover serve`.

use super::{MqttArgs, NatsArgs, StoreKind};
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;

/// `drover serve`'s arguments.
#[derive(Args)]
pub struct ServeArgs {
    #[arg(long, default_value = "127.0.0.1:7180")]
    pub listen: SocketAddr,
    /// Where agents connect over WebSocket.
    #[arg(long, default_value = "127.0.0.1:7181")]
    pub agent_listen: SocketAddr,
    /// PEM certificate chain for wss:// (with --agent-tls-key).
    #[arg(long, requires = "agent_tls_key")]
    pub agent_tls_cert: Option<PathBuf>,
    #[arg(long, requires = "agent_tls_cert")]
    pub agent_tls_key: Option<PathBuf>,
    /// PEM certificate chain: serve the operators' API over https (with
    /// --api-tls-key). Without it the API is served only on loopback.
    #[arg(long, requires = "api_tls_key")]
    pub api_tls_cert: Option<PathBuf>,
    #[arg(long, requires = "api_tls_cert")]
    pub api_tls_key: Option<PathBuf>,
    /// Serve the API in clear on a non-loopback --listen address (only
    /// behind a TLS-terminating proxy).
    #[arg(long, conflicts_with = "api_tls_cert")]
    pub api_allow_plaintext: bool,
    /// A job sent but not acked within this returns to `created`.
    #[arg(long, default_value_t = 60)]
    pub ack_timeout_seconds: u64,
    #[arg(long, default_value_t = 1000)]
    pub pass_interval_ms: u64,
    /// Agent connections held at once (keep it below the open-file limit,
    /// LimitNOFILE in drover.service); more are closed at once.
    #[arg(long, default_value_t = 25_000)]
    pub max_agent_connections: usize,
    /// Where agents download packages (PackageInstallV1), with the same
    /// TLS as --agent-listen. Default: the agents' address on port 7182
    /// (an ephemeral port when --agent-listen's is 0).
    #[arg(long)]
    pub download_listen: Option<SocketAddr>,
    /// The base of download links as agents reach it
    /// (https://host:port). Default: the listen address; for a wildcard
    /// one (0.0.0.0), the first DNS name of --agent-tls-cert.
    #[arg(long)]
    pub download_url: Option<String>,
    /// The dashboard (and GET /api/v1/alerts) raises an alert for a
    /// device not heard from for this long.
    #[arg(long, default_value_t = 60)]
    pub offline_alert_minutes: u64,
    /// An alert for a device whose oldest pending security update has
    /// waited longer than this (from the first assessment that saw it).
    #[arg(long, default_value_t = 7)]
    pub security_alert_days: u64,
    /// An alert for a device with a reboot pending for longer than this.
    #[arg(long, default_value_t = 24)]
    pub reboot_alert_hours: u64,
    /// The most the package store (the uploaded .debs in --data) may
    /// hold, e.g. 20GiB or 500MiB; an upload that would pass it is
    /// refused (507) and nothing of it is kept.
    #[arg(long, default_value = "20GiB", value_parser = drover_server::packages::parse_size)]
    pub package_quota: u64,
    /// An upload that sends no bytes for this many seconds is cut off
    /// (408); a slow upload that keeps moving is never cut off.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub upload_stall_seconds: u64,
    /// Days the audit log keeps an entry (every change and every
    /// refused request); older ones are deleted each hour.
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u64).range(1..))]
    pub audit_retention_days: u64,
    /// Jobs each device's history keeps (newest first) once the run,
    /// deployment or schedule that made them is deleted; `describe
    /// device` and the device page show them.
    #[arg(long, default_value_t = drover_rules::history::JOBS_PER_DEVICE, value_parser = clap::value_parser!(u32).range(1..))]
    pub history_jobs_per_device: u32,
    /// Days a device's history keeps a job (by when it ended); older
    /// ones are deleted each hour.
    #[arg(long, default_value_t = drover_rules::history::DAYS, value_parser = clap::value_parser!(u32).range(1..))]
    pub history_days: u32,
    /// Enrollment requests a minute one address may send (all at once, or
    /// spread); more are refused with the time to wait. 0: no limit.
    /// Applies where the control plane sees the device's address (the
    /// agents' WebSocket port).
    #[arg(long, default_value_t = drover_server::enroll_limits::PER_ADDRESS_PER_MINUTE)]
    pub enrollments_per_address_per_minute: u32,
    /// New devices a minute one enrollment token may record (pending or
    /// accepted), on every transport; a pending device asking again is
    /// not counted. 0: no limit.
    #[arg(long, default_value_t = drover_server::enroll_limits::PER_TOKEN_PER_MINUTE)]
    pub enrollments_per_token_per_minute: u32,
    /// Write the bound addresses here as JSON once listening.
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    #[command(flatten)]
    pub nats: NatsArgs,
    #[command(flatten)]
    pub mqtt: MqttArgs,
    /// Where the control plane keeps its state: `embedded` (redb in
    /// --data; one replica) or `nats` (JetStream KV; several replicas).
    #[arg(long, value_enum, default_value_t = StoreKind::Embedded)]
    pub store: StoreKind,
}
