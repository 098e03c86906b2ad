//! The arguments of `drover nats-config` and `drover mqtt-config`.

use clap::Args;
use std::path::PathBuf;

/// `drover nats-config`'s arguments.
#[derive(Args)]
pub struct NatsConfigArgs {
    /// A device to authorize by its token (repeat for each).
    #[arg(
        long = "device",
        required_unless_present = "authority",
        conflicts_with = "authority"
    )]
    pub devices: Vec<String>,
    #[arg(long, default_value = "drover-control-plane")]
    pub control_plane_user: String,
    /// The control plane's own NATS password (better given in
    /// DROVER_NATS_PASSWORD than on the command line).
    #[arg(
        long,
        env = "DROVER_NATS_PASSWORD",
        hide_env_values = true,
        required_unless_present = "authority"
    )]
    pub control_plane_password: Option<String>,
    /// Let devices join by themselves (`drover enrollment-tokens`): the
    /// servers trust Drover's operator once, whose keys are made in DIR
    /// (outside the data directory; the control plane serves with
    /// `--nats-authority DIR`), and take each device by the JWT the control
    /// plane signs it when it is accepted. Prints the servers' lines and the
    /// `enrollment_jwt` every device's config carries.
    #[arg(long, value_name = "DIR")]
    pub authority: Option<PathBuf>,
    /// Where the servers keep the accounts' JWTs (with --authority): a
    /// directory nats-server's user may write.
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/nats/drover-accounts",
        requires = "authority"
    )]
    pub resolver_dir: PathBuf,
    /// Write the block to this file (replaced whole) for nats-server's
    /// `include`, instead of printing it: running it again never
    /// duplicates the block.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also print, as comments, what each node of a three-node JetStream
    /// cluster needs and how replicas and agents name the nodes.
    #[arg(long)]
    pub cluster: bool,
    /// Also let each device put its statuses into the status bucket
    /// itself, as agents did before statuses became requests to the
    /// control plane. Only while such agents remain: a device that may
    /// put there can fill the bucket for every device.
    #[arg(long)]
    pub allow_direct_status_puts: bool,
    /// The group the --out file is given (mode 0640), so nats-server
    /// reads it as its own user: Debian's runs as `nats`. Empty: leave
    /// the group as it is.
    #[arg(long, default_value = "nats")]
    pub group: String,
    /// Take every device's token as never rotated instead of asking the
    /// control plane (`GET /api/v1/devices/token-generations`) which were:
    /// for a first set-up before `serve` runs. Without it, a control plane
    /// not listening is taken the same way, and said so.
    #[arg(long)]
    pub offline: bool,
}

/// `drover mqtt-config`'s arguments.
#[derive(Args)]
pub struct MqttConfigArgs {
    /// A device to authorize by its token (repeat for each).
    #[arg(long = "device", required_unless_present = "dynamic_security")]
    pub devices: Vec<String>,
    /// Let devices join by themselves (`drover enrollment-tokens`): write
    /// mosquitto's dynamic security plugin's file here unless it exists
    /// (from then on the broker keeps it, and the control plane adds and
    /// removes each accepted device's login; this never replaces it), and
    /// print the plugin's lines. In a directory the broker's user may
    /// write: Debian's /var/lib/mosquitto.
    #[arg(long, value_name = "FILE")]
    pub dynamic_security: Option<PathBuf>,
    /// The control plane's broker user; repeat it to give each replica
    /// its own (the broker makes a client's id its user name, so two
    /// replicas under one user would push each other off). Each
    /// replica serves with `--mqtt-user` set to its own.
    #[arg(long = "control-plane-user", default_value = "drover-control-plane")]
    pub control_plane_users: Vec<String>,
    #[arg(long, env = "DROVER_MQTT_PASSWORD", hide_env_values = true)]
    pub control_plane_password: String,
    #[arg(long, default_value = transport_mqtt::DEFAULT_PREFIX)]
    pub prefix: String,
    /// Where to write drover.passwd and drover.acl (replaced whole).
    #[arg(long)]
    pub out: PathBuf,
    /// The group the files are given (mode 0640), so the broker reads
    /// them after dropping to its own user: Debian's mosquitto runs as
    /// `mosquitto`. Empty: leave the group as it is.
    #[arg(long, default_value = "mosquitto")]
    pub group: String,
    /// Take every device's token as never rotated instead of asking the
    /// control plane (`GET /api/v1/devices/token-generations`) which were:
    /// for a first set-up before `serve` runs. Without it, a control plane
    /// not listening is taken the same way, and said so.
    #[arg(long)]
    pub offline: bool,
}
