//! drover: the control plane (`serve`) and the operators' CLI.

use agent_core::out;
use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use drover::client::ApiClient;
use drover::records::DeviceRecord;
use drover::serve::{self, ServeOptions};
use drover::watch::printable;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(name = "drover", version, about = "Drover's control plane and CLI")]
struct Cli {
    /// The control plane's API.
    #[arg(
        long,
        global = true,
        env = "DROVER_SERVER",
        default_value = "http://127.0.0.1:7180"
    )]
    server: String,
    /// For an https:// server: the CA bundle to trust, or the server's own
    /// self-signed certificate (default: the system's CAs).
    #[arg(long, global = true, env = "DROVER_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// The operator token (default: DATA/operator.token).
    #[arg(long, global = true, env = "DROVER_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The control plane's data directory.
    #[arg(
        long,
        global = true,
        env = "DROVER_DATA",
        default_value = "/var/lib/drover"
    )]
    data: PathBuf,
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process; the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the control plane on the embedded store.
    Serve {
        #[arg(long, default_value = "127.0.0.1:7180")]
        listen: SocketAddr,
        /// Where agents connect over WebSocket.
        #[arg(long, default_value = "127.0.0.1:7181")]
        agent_listen: SocketAddr,
        /// PEM certificate chain for wss:// (with --agent-tls-key).
        #[arg(long, requires = "agent_tls_key")]
        agent_tls_cert: Option<PathBuf>,
        #[arg(long, requires = "agent_tls_cert")]
        agent_tls_key: Option<PathBuf>,
        /// PEM certificate chain: serve the operators' API over https (with
        /// --api-tls-key). Without it the API is served only on loopback.
        #[arg(long, requires = "api_tls_key")]
        api_tls_cert: Option<PathBuf>,
        #[arg(long, requires = "api_tls_cert")]
        api_tls_key: Option<PathBuf>,
        /// Serve the API in clear on a non-loopback --listen address (only
        /// behind a TLS-terminating proxy).
        #[arg(long, conflicts_with = "api_tls_cert")]
        api_allow_plaintext: bool,
        /// A job sent but not acked within this returns to `created`.
        #[arg(long, default_value_t = 60)]
        ack_timeout_seconds: u64,
        #[arg(long, default_value_t = 1000)]
        pass_interval_ms: u64,
        /// Agent connections held at once (keep it below the open-file limit,
        /// LimitNOFILE in drover.service); more are closed at once.
        #[arg(long, default_value_t = 25_000)]
        max_agent_connections: usize,
        /// Where agents download packages (PackageInstallV1), with the same
        /// TLS as --agent-listen. Default: the agents' address, a free port
        /// (the links carry it).
        #[arg(long)]
        download_listen: Option<SocketAddr>,
        /// The base of download links as agents reach it
        /// (https://host:port), when not the listen address.
        #[arg(long)]
        download_url: Option<String>,
        /// Write the bound addresses here as JSON once listening.
        #[arg(long)]
        ready_file: Option<PathBuf>,
        #[command(flatten)]
        nats: NatsArgs,
        #[command(flatten)]
        mqtt: MqttArgs,
        /// Where the control plane keeps its state: `embedded` (redb in
        /// --data; one replica) or `nats` (JetStream KV; several replicas).
        #[arg(long, value_enum, default_value_t = StoreKind::Embedded)]
        store: StoreKind,
    },
    /// Print a nats-server authorization block: the control plane may do
    /// anything; each device may read only its own intents and write only its
    /// own statuses and heartbeat (its password is its device token).
    NatsConfig {
        /// A device to authorize (repeat for each).
        #[arg(long = "device", required = true)]
        devices: Vec<String>,
        #[arg(long, default_value = "drover-control-plane")]
        control_plane_user: String,
        #[arg(long, env = "DROVER_NATS_PASSWORD", hide_env_values = true)]
        control_plane_password: String,
    },
    /// Write mosquitto's password and ACL files for the control plane and
    /// these devices (a device may read only its own intents and write only
    /// its own status, hello and heartbeat; its password is its token), and
    /// print the mosquitto.conf lines that use them. Run it on the control
    /// plane's host with its --data.
    MqttConfig {
        /// A device to authorize (repeat for each).
        #[arg(long = "device", required = true)]
        devices: Vec<String>,
        #[arg(long, default_value = "drover-control-plane")]
        control_plane_user: String,
        #[arg(long, env = "DROVER_MQTT_PASSWORD", hide_env_values = true)]
        control_plane_password: String,
        #[arg(long, default_value = transport_mqtt::DEFAULT_PREFIX)]
        prefix: String,
        /// Where to write drover.passwd and drover.acl (replaced whole).
        #[arg(long)]
        out: PathBuf,
    },
    /// Create or configure resources from a YAML or JSON file.
    Apply {
        #[arg(short = 'f', long = "filename")]
        file: PathBuf,
    },
    /// Show devices, taskruns, one taskrun, taskschedules, one taskschedule,
    /// deployments or one deployment.
    Get {
        #[arg(value_enum)]
        resource: Resource,
        name: Option<String>,
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
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
    /// Act on deployments.
    Deployments {
        #[command(subcommand)]
        command: DeploymentsCommand,
    },
    /// The package store (for packageInstallV1 deployments).
    Packages {
        #[command(subcommand)]
        command: PackagesCommand,
    },
    /// Print the bearer token a device's agent uses.
    Token { device: String },
    /// Move a damaged or empty control-plane database aside (DATA/drover.redb);
    /// the next `serve` starts with a new, empty one.
    ResetStore,
    /// Check one database file (serve runs this before opening it).
    #[command(hide = true)]
    VerifyStore { path: PathBuf },
    /// Print the public key agents pin to check the control plane's intent
    /// signatures (`intent_public_keys` in the agent's config). Run it on the
    /// control plane's host with its --data; it makes the key on first use.
    IntentKey,
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
struct MqttArgs {
    /// mqtt://HOST:PORT (or mqtts://) of the broker (mosquitto).
    #[arg(long)]
    mqtt_url: Option<String>,
    #[arg(long, requires = "mqtt_url", default_value = "drover-control-plane")]
    mqtt_user: String,
    #[arg(
        long,
        env = "DROVER_MQTT_PASSWORD",
        hide_env_values = true,
        requires = "mqtt_url"
    )]
    mqtt_password: Option<String>,
    /// CA certificate of the broker (mqtts://).
    #[arg(long, requires = "mqtt_url")]
    mqtt_ca: Option<PathBuf>,
    /// Topic prefix.
    #[arg(long, default_value = transport_mqtt::DEFAULT_PREFIX)]
    mqtt_prefix: String,
}

impl MqttArgs {
    fn settings(&self) -> Option<transport_mqtt::MqttSettings> {
        Some(transport_mqtt::MqttSettings {
            url: self.mqtt_url.clone()?,
            user: self.mqtt_user.clone(),
            password: self.mqtt_password.clone().unwrap_or_default(),
            ca_file: self.mqtt_ca.clone(),
            prefix: self.mqtt_prefix.clone(),
            keep_alive: Duration::from_secs(30),
        })
    }
}

/// Serving agents over NATS JetStream as well as WebSocket.
#[derive(clap::Args)]
struct NatsArgs {
    /// nats://HOST:PORT (or tls://) of a nats-server with JetStream.
    #[arg(long)]
    nats_url: Option<String>,
    #[arg(long, requires = "nats_url")]
    nats_user: Option<String>,
    #[arg(
        long,
        env = "DROVER_NATS_PASSWORD",
        hide_env_values = true,
        requires = "nats_url"
    )]
    nats_password: Option<String>,
    /// CA certificate of the nats-server (requires TLS).
    #[arg(long, requires = "nats_url")]
    nats_ca: Option<PathBuf>,
}

impl NatsArgs {
    fn settings(&self) -> Option<transport_nats::NatsSettings> {
        Some(transport_nats::NatsSettings {
            url: self.nats_url.clone()?,
            user: self.nats_user.clone(),
            password: self.nats_password.clone(),
            ca_file: self.nats_ca.clone(),
            connect_timeout: Duration::from_secs(10),
        })
    }
}

#[derive(Subcommand)]
enum RunsCommand {
    /// A live progress bar of a task run or a deployment until it finishes
    /// (NAME, or deployment/NAME, taskrun/NAME).
    Watch { name: String },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StoreKind {
    Embedded,
    Nats,
}

#[derive(Clone, Copy, ValueEnum)]
enum Resource {
    Devices,
    Taskruns,
    Taskrun,
    Taskschedules,
    Taskschedule,
    Deployments,
    Deployment,
    Packages,
}

#[derive(Clone, Copy, ValueEnum)]
enum Described {
    Deployment,
}

#[derive(Subcommand)]
enum DeploymentsCommand {
    /// Run a deployment's targeting again and add the devices that match
    /// now and are not targets yet (within its 20,000 targets).
    AddNewDevices { name: String },
}

#[derive(Subcommand)]
enum PackagesCommand {
    /// Store a .deb: its name, version and architecture are read from it,
    /// its size and SHA-256 recorded. The same file again changes nothing;
    /// another file under the same name, version and architecture is refused.
    Upload { file: PathBuf },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        let default = if matches!(cli.command, Command::Serve { .. }) {
            "info"
        } else {
            "warn"
        };
        tracing_subscriber::EnvFilter::new(default)
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal: not in the journal or a
        // file, and never when NO_COLOR is set (no-color.org).
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        )
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let code = runtime.block_on(dispatch(cli))?;
    std::process::exit(code);
}

fn client(cli: &Cli) -> Result<ApiClient> {
    let token = match &cli.token {
        Some(token) if token.trim().is_empty() => {
            bail!("the operator token given (--token or DROVER_TOKEN) is empty")
        }
        Some(token) => token.clone(),
        None => std::fs::read_to_string(cli.data.join("operator.token"))
            .map(|t| t.trim().to_owned())
            .with_context(|| {
                format!(
                    "no operator token: pass --token, set DROVER_TOKEN, or point --data at the control plane's \
                     directory ({} was not readable)",
                    cli.data.join("operator.token").display()
                )
            })?,
    };
    ApiClient::new(&cli.server, &token, cli.ca_file.as_deref())
}

async fn dispatch(cli: Cli) -> Result<i32> {
    match &cli.command {
        Command::Serve {
            listen,
            agent_listen,
            agent_tls_cert,
            agent_tls_key,
            api_tls_cert,
            api_tls_key,
            api_allow_plaintext,
            ack_timeout_seconds,
            pass_interval_ms,
            max_agent_connections,
            download_listen,
            download_url,
            ready_file,
            nats,
            mqtt,
            store,
        } => {
            let shutdown = CancellationToken::new();
            let started = serve::start(
                ServeOptions {
                    data: cli.data.clone(),
                    listen: *listen,
                    agent_listen: *agent_listen,
                    agent_tls: agent_tls_cert.clone().zip(agent_tls_key.clone()),
                    api_tls: api_tls_cert.clone().zip(api_tls_key.clone()),
                    api_allow_plaintext: *api_allow_plaintext,
                    ack_timeout: Duration::from_secs(*ack_timeout_seconds),
                    pass_interval: Duration::from_millis(*pass_interval_ms),
                    operator_token: cli.token.clone(),
                    nats: nats.settings(),
                    store_on_nats: *store == StoreKind::Nats,
                    max_agent_connections: *max_agent_connections,
                    mqtt: mqtt.settings(),
                    download_listen: *download_listen,
                    download_url: download_url.clone(),
                },
                shutdown.clone(),
            )
            .await?;
            if let Some(path) = ready_file {
                let ready = serde_json::json!({"api": started.api_addr, "agents": started.agent_addr, "downloads": started.download_addr});
                let tmp = path.with_extension("tmp");
                std::fs::write(&tmp, ready.to_string())?;
                std::fs::rename(&tmp, path)?;
            }
            agent_core::shutdown::wait_for_signal().await;
            shutdown.cancel();
            for task in started.tasks {
                let _ = task.await;
            }
            Ok(0)
        }
        Command::Apply { file } => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            for result in client(&cli)?.apply_text(&text).await? {
                out!(
                    "{}/{} {}",
                    result["kind"].as_str().unwrap_or("?").to_lowercase(),
                    result["name"].as_str().unwrap_or("?"),
                    result["result"].as_str().unwrap_or("?")
                );
            }
            Ok(0)
        }
        Command::Get {
            resource,
            name,
            output,
        } => {
            let api = client(&cli)?;
            match resource {
                Resource::Devices => {
                    let devices: Vec<DeviceRecord> = api.get("/devices").await?;
                    if *output == Output::Json {
                        out!("{}", serde_json::to_string_pretty(&devices)?);
                    } else {
                        print_devices(&devices);
                    }
                }
                Resource::Taskruns => {
                    let runs: Vec<Value> = api.get("/taskruns").await?;
                    if *output == Output::Json {
                        out!("{}", serde_json::to_string_pretty(&runs)?);
                    } else {
                        print_runs(&runs);
                    }
                }
                Resource::Taskschedules | Resource::Taskschedule => {
                    let schedules: Vec<Value> = match (resource, name) {
                        (Resource::Taskschedule, Some(name)) => {
                            vec![api.get(&format!("/taskschedules/{name}")).await?]
                        }
                        (Resource::Taskschedule, None) => bail!("drover get taskschedule NAME"),
                        _ => api.get("/taskschedules").await?,
                    };
                    if *output == Output::Json {
                        out!("{}", serde_json::to_string_pretty(&schedules)?);
                    } else {
                        print_schedules(&schedules);
                    }
                }
                Resource::Deployments | Resource::Deployment => {
                    let deployments: Vec<Value> = match (resource, name) {
                        (Resource::Deployment, Some(name)) => {
                            vec![api.get(&format!("/deployments/{name}")).await?]
                        }
                        (Resource::Deployment, None) => bail!("drover get deployment NAME"),
                        _ => api.get("/deployments").await?,
                    };
                    if *output == Output::Json {
                        out!("{}", serde_json::to_string_pretty(&deployments)?);
                    } else {
                        print_deployments(&deployments);
                    }
                }
                Resource::Packages => {
                    let packages: Vec<Value> = api.get("/packages").await?;
                    if *output == Output::Json {
                        out!("{}", serde_json::to_string_pretty(&packages)?);
                    } else {
                        out!(
                            "{:<40} {:>12}  {:<64}  UPLOADED",
                            "PACKAGE",
                            "BYTES",
                            "SHA256"
                        );
                        for p in &packages {
                            out!(
                                "{:<40} {:>12}  {:<64}  {}",
                                shown(&p["id"]),
                                p["size"],
                                shown(&p["sha256"]),
                                shown(&p["uploadedAt"])
                            );
                        }
                    }
                }
                Resource::Taskrun => {
                    let Some(name) = name else {
                        bail!("drover get taskrun NAME")
                    };
                    let run: Value = api.get(&format!("/taskruns/{name}")).await?;
                    if *output == Output::Json {
                        out!("{}", serde_json::to_string_pretty(&run)?);
                    } else {
                        print_runs(std::slice::from_ref(&run));
                        if let Some(error) = run["status"]["latestError"].as_str() {
                            out!("latest error: {}", printable(error));
                        }
                    }
                }
            }
            Ok(0)
        }
        Command::VerifyStore { path } => {
            agent_core::dbfile::verify(path).map_err(|e| anyhow::anyhow!(e))?;
            Ok(0)
        }
        Command::ResetStore => {
            let path = cli.data.join("drover.redb");
            let aside = agent_core::dbfile::move_aside(&path)
                .with_context(|| format!("cannot move {} aside", path.display()))?;
            out!("moved {} to {}", path.display(), aside.display());
            Ok(0)
        }
        Command::MqttConfig {
            devices,
            control_plane_user,
            control_plane_password,
            prefix,
            out,
        } => {
            if control_plane_password.is_empty() {
                bail!("the control plane's MQTT password is empty");
            }
            let secrets = drover::auth::Secrets::load_or_create(&cli.data, cli.token.clone())?;
            let devices = devices
                .iter()
                .map(|d| {
                    let id = agent_core::DeviceId::new(d.clone())?;
                    let token = secrets.device_token(&id);
                    Ok((id, token))
                })
                .collect::<Result<Vec<_>>>()?;
            let (passwords, acl) = transport_mqtt::server::mosquitto_files(
                &transport_mqtt::Topics::new(prefix),
                (control_plane_user, control_plane_password),
                &devices,
            );
            std::fs::create_dir_all(out)
                .with_context(|| format!("cannot create {}", out.display()))?;
            for (name, text) in [("drover.passwd", &passwords), ("drover.acl", &acl)] {
                let path = out.join(name);
                let tmp = path.with_extension("tmp");
                {
                    use std::os::unix::fs::OpenOptionsExt;
                    let mut file = std::fs::OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(true)
                        .mode(0o640)
                        .open(&tmp)
                        .with_context(|| format!("cannot write {}", tmp.display()))?;
                    std::io::Write::write_all(&mut file, text.as_bytes())?;
                    file.sync_all()?;
                }
                std::fs::rename(&tmp, &path)
                    .with_context(|| format!("cannot write {}", path.display()))?;
            }
            out!(
                "per_listener_settings false\nallow_anonymous false\npassword_file {}\nacl_file {}\n\
                 # a large fleet's statuses must never be dropped from the control plane's queue\n{}",
                out.join("drover.passwd").display(),
                out.join("drover.acl").display(),
                transport_mqtt::Topics::broker_settings()
            );
            Ok(0)
        }
        Command::IntentKey => {
            let signer = drover::auth::IntentSigner::load_or_create(&cli.data)?;
            out!("{}", signer.public_key());
            Ok(0)
        }
        Command::Describe {
            resource: Described::Deployment,
            name,
            output,
        } => {
            let described: Value = client(&cli)?
                .get(&format!("/deployments/{name}/describe"))
                .await?;
            if *output == Output::Json {
                out!("{}", serde_json::to_string_pretty(&described)?);
            } else {
                print_described_deployment(&described);
            }
            Ok(0)
        }
        Command::Packages {
            command: PackagesCommand::Upload { file },
        } => {
            let answer = client(&cli)?.post_file("/packages", file).await?;
            out!(
                "package {} ({} bytes, sha256 {}) is in the store",
                shown(&answer["id"]),
                answer["size"],
                shown(&answer["sha256"])
            );
            Ok(0)
        }
        Command::Deployments {
            command: DeploymentsCommand::AddNewDevices { name },
        } => {
            let answer = client(&cli)?
                .post(
                    &format!("/deployments/{name}/add-new-devices"),
                    &Value::Null,
                )
                .await?;
            out!(
                "deployment/{name} {}",
                answer["result"].as_str().unwrap_or("?")
            );
            Ok(0)
        }
        Command::Runs {
            command: RunsCommand::Watch { name },
        } => {
            let complete = drover::watch::watch(&client(&cli)?, name).await?;
            Ok(if complete { 0 } else { 1 })
        }
        Command::NatsConfig {
            devices,
            control_plane_user,
            control_plane_password,
        } => {
            let secrets = drover::auth::Secrets::load_or_create(&cli.data, cli.token.clone())?;
            let devices = devices
                .iter()
                .map(|d| {
                    let id = agent_core::DeviceId::new(d.clone())?;
                    let token = secrets.device_token(&id);
                    Ok((id, token))
                })
                .collect::<Result<Vec<_>>>()?;
            let config = transport_nats::server::authorization_config(
                (control_plane_user, control_plane_password),
                &devices,
            );
            out!("{}", config.trim_end());
            Ok(0)
        }
        Command::Token { device } => {
            let device = agent_core::DeviceId::new(device.clone())?;
            let secrets = drover::auth::Secrets::load_or_create(&cli.data, cli.token.clone())?;
            out!("{}", secrets.device_token(&device));
            Ok(0)
        }
        Command::Demo {
            agents,
            keep,
            agent_bin,
            upgrade,
        } => {
            let complete = drover::demo::run(drover::demo::DemoOptions {
                agents: *agents,
                keep: *keep,
                agent_bin: agent_bin.clone(),
                upgrade: *upgrade,
            })
            .await?;
            Ok(if complete { 0 } else { 1 })
        }
    }
}

fn print_devices(devices: &[DeviceRecord]) {
    out!(
        "{:<20} {:<16} {:<24} {:<6} {:<21} CAPABILITIES",
        "DEVICE",
        "GROUPS",
        "LABELS",
        "AGENT",
        "LAST HEARTBEAT"
    );
    for d in devices {
        let groups: Vec<&str> = d.groups.iter().map(String::as_str).collect();
        let labels: Vec<String> = d
            .labels
            .iter()
            .map(|(k, v)| printable(&format!("{k}={v}")))
            .collect();
        out!(
            "{:<20} {:<16} {:<24} {:<6} {:<21} {}",
            d.id,
            printable(&groups.join(",")),
            labels.join(","),
            if d.agent_present { "yes" } else { "no" },
            d.last_heartbeat
                .map(|t| t.strftime("%Y-%m-%d %H:%M:%S").to_string())
                .unwrap_or_else(|| "-".into()),
            printable(&d.capabilities.join(","))
        );
    }
}

fn print_schedules(schedules: &[Value]) {
    out!(
        "{:<24} {:<22} {:<9} {:<21} {:<21} {:<28} SKIPPED",
        "NAME",
        "SCHEDULE (UTC)",
        "SUSPENDED",
        "LAST TICK",
        "NEXT TICK",
        "ACTIVE RUN"
    );
    let time = |v: &Value| {
        v.as_str()
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .map(|t| t.strftime("%Y-%m-%d %H:%M").to_string())
            .unwrap_or_else(|| "-".into())
    };
    for schedule in schedules {
        let cadence = &schedule["spec"]["schedule"];
        let cadence = match cadence.as_object().and_then(|m| m.iter().next()) {
            Some((form, Value::String(value))) => format!("{form} {value}"),
            Some((form, Value::Object(fields))) => format!(
                "{form} {}",
                fields
                    .values()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            _ => "?".into(),
        };
        let status = &schedule["status"];
        out!(
            "{:<24} {:<22} {:<9} {:<21} {:<21} {:<28} {}",
            schedule["metadata"]["name"].as_str().unwrap_or("?"),
            cadence,
            if schedule["spec"]["suspend"] == true {
                "yes"
            } else {
                "no"
            },
            time(&status["lastTick"]),
            time(&status["nextTick"]),
            status["activeRun"].as_str().unwrap_or("-"),
            status["skippedTicks"].as_u64().unwrap_or(0)
        );
    }
}

fn print_runs(runs: &[Value]) {
    out!(
        "{:<24} {:<9} {:>7} {:>8} {:>9} {:>6}  REASON",
        "NAME",
        "PHASE",
        "TARGETS",
        "RELEASED",
        "SUCCEEDED",
        "FAILED"
    );
    for run in runs {
        let s = &run["status"];
        out!(
            "{:<24} {:<9} {:>7} {:>8} {:>9} {:>6}  {}",
            run["metadata"]["name"].as_str().unwrap_or("?"),
            s["phase"].as_str().unwrap_or("?"),
            s["targets"],
            s["released"],
            s["succeeded"],
            s["failed"],
            s["reason"].as_str().unwrap_or("")
        );
    }
}

fn print_deployments(deployments: &[Value]) {
    out!(
        "{:<24} {:<9} {:>7} {:>8} {:>7} {:>6} {:>7} {:>9} {:>6} {:>7}  REASON",
        "NAME",
        "PHASE",
        "TARGETS",
        "EXCLUDED",
        "PENDING",
        "QUEUED",
        "RUNNING",
        "SUCCEEDED",
        "FAILED",
        "EXPIRED"
    );
    for deployment in deployments {
        let s = &deployment["status"];
        out!(
            "{:<24} {:<9} {:>7} {:>8} {:>7} {:>6} {:>7} {:>9} {:>6} {:>7}  {}",
            deployment["metadata"]["name"].as_str().unwrap_or("?"),
            s["phase"].as_str().unwrap_or("?"),
            s["targets"],
            s["excludedCount"],
            s["pending"],
            s["queued"],
            s["running"],
            s["succeeded"],
            s["failed"],
            s["expired"],
            s["reason"].as_str().unwrap_or("")
        );
    }
}

fn print_described_deployment(described: &Value) {
    let deployment = &described["deployment"];
    print_deployments(std::slice::from_ref(deployment));
    let spec = &deployment["spec"];
    let status = &deployment["status"];
    out!("");
    out!(
        "max concurrency {}, retries {} (backoff {}s, doubling), deadline {}s",
        spec["maxConcurrency"],
        spec["retries"],
        spec["retryBackoffSeconds"],
        spec["deadlineSeconds"]
    );
    match spec["maintenanceWindow"].as_object() {
        Some(window) => {
            out!(
                "maintenance window {}-{} in each site's time zone (default {})",
                window["start"].as_str().unwrap_or("?"),
                window["end"].as_str().unwrap_or("?"),
                window["timeZone"].as_str().unwrap_or("?")
            );
            for zone in described["windows"].as_array().into_iter().flatten() {
                out!(
                    "  {:<32} {:>6} targets  local {}  {}",
                    zone["timeZone"].as_str().unwrap_or("?"),
                    zone["targets"],
                    zone["localTime"].as_str().unwrap_or("?"),
                    if zone["open"] == true {
                        "open"
                    } else {
                        "closed"
                    }
                );
            }
        }
        None => out!("no maintenance window: targets are released at any time"),
    }
    if let Some(error) = status["latestError"].as_str() {
        out!("latest error: {}", printable(error));
    }
    let errors = described["latestErrors"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !errors.is_empty() {
        out!("errors:");
        for e in errors {
            out!(
                "  {:<24} attempt {:<3} {}",
                e["device"].as_str().unwrap_or("?"),
                e["attempt"],
                printable(e["error"].as_str().unwrap_or(""))
            );
        }
    }
    let waiting = described["waitingRetry"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !waiting.is_empty() {
        out!(
            "waiting for a retry ({} in all):",
            described["waitingRetryTotal"]
        );
        for w in waiting {
            out!(
                "  {:<24} attempt {:<3} at {}",
                w["device"].as_str().unwrap_or("?"),
                w["attempt"].as_u64().unwrap_or(0) + 1,
                w["nextAttemptAt"].as_str().unwrap_or("?")
            );
        }
    }
}

/// A string field of an API answer, safe to print.
fn shown(value: &Value) -> String {
    drover::watch::printable(value.as_str().unwrap_or(""))
}
