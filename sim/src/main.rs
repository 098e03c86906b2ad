//! drover-sim: play many agents against a control plane (`agents`), or run
//! the fleet benchmark (`bench`), which prints a table of figures.

mod cmd_bench;
mod cmd_floor;
mod cmd_mqtt_connect;
mod cmd_reconnect;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use drover_sim::footprint::{self, FootprintOptions};
use drover_sim::harness::Transport;
use drover_sim::patch::{self, PatchOptions};
use drover_sim::{Behaviour, device_id_range};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "drover-sim",
    version,
    about = "Drover's fleet simulator and benchmark"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Play N agents (devices PREFIX00000…) until interrupted.
    Agents(AgentsArgs),
    /// Measure the real agent's memory, threads, disk writes (idle and per
    /// job) and binary size, per transport, beside Debian's mender-client
    /// daemon when it is installed; prints a Markdown table.
    Footprint(FootprintArgs),
    /// Measure what a fleet's assessments cost the control plane (CPU,
    /// store growth, bytes written per assessment) and how fast it answers
    /// the patch views (patch-status, the fleet page, the alerts) with
    /// every device assessed; prints a Markdown table.
    Patch(PatchArgs),
    /// Measure apply → Complete, CPU, memory and disk writes of `drover serve`
    /// for each fleet size; prints a Markdown table.
    Bench(cmd_bench::BenchArgs),
    /// Measure N devices of one image enrolling at once with an
    /// auto-accept token over WebSocket, then connecting by their keys;
    /// prints a Markdown table.
    Enroll(EnrollArgs),
    /// Measure N devices connecting to one nats-server at once, by bcrypt
    /// passwords or by user JWTs (no control plane); prints a Markdown table.
    NatsConnect(NatsConnectArgs),
    /// Measure mosquitto's dynamic security plugin taking N devices' logins
    /// at once, as the control plane hands them over; prints a Markdown table.
    MqttLogins(MqttLoginsArgs),
    /// Measure N WebSocket devices behind one address (a site's NAT)
    /// coming back after the control plane restarts; prints a Markdown table.
    Reconnect(cmd_reconnect::ReconnectArgs),
    /// Measure N devices connecting to one mosquitto at once (no control
    /// plane), by the password file or the dynamic security plugin's
    /// logins; prints a Markdown table.
    MqttConnect(cmd_mqtt_connect::MqttConnectArgs),
    /// Measure the floor of the NATS path: how many small messages a second
    /// one file-backed JetStream stream takes with acknowledgements
    /// pipelined, on one nats-server (R1) and a three-node cluster (R3);
    /// prints a Markdown table.
    NatsFloor(cmd_floor::FloorArgs),
}

#[derive(Args)]
struct MqttLoginsArgs {
    /// Numbers of logins, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000,10000")]
    devices: Vec<usize>,
    /// Runs of each row: each figure's median with its minimum and maximum.
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

#[derive(Args)]
struct NatsConnectArgs {
    /// Fleet sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    devices: Vec<usize>,
    /// How devices log in (both by default, side by side).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "password,jwt"
    )]
    auth: Vec<drover_sim::connect::Auth>,
    /// Runs of each row: each figure's median with its minimum and maximum.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Once every device is in, kill the server (SIGKILL) and start it
    /// again on the same port and store: the figures are then from the
    /// kill until every device is in again by the agent's own reconnect
    /// rule, and the attempts the new server took beyond one per device.
    #[arg(long)]
    restart: bool,
    /// With --restart: the logins a second the control plane sizes the
    /// agents' reconnect window by (its `--nats-logins-per-second`); 0 for
    /// no window, as before decision 0020.
    #[arg(long, default_value_t = transport_nats::spread::DEFAULT_LOGINS_PER_SECOND)]
    logins_per_second: u32,
    /// Three nodes as one cluster (devices given all three, by JWT); with
    /// --restart all three are killed and started again.
    #[arg(long)]
    cluster: bool,
}

#[derive(Args)]
struct EnrollArgs {
    /// Fleet sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    devices: Vec<usize>,
    /// What devices join over: the agents' port, NATS servers trusting
    /// Drover's operator (`nats-config --authority`), or mosquitto with the
    /// dynamic security plugin (`mqtt-config --dynamic-security`; the
    /// plugin's own cost alone: `mqtt-logins`).
    #[arg(long, value_enum, default_value_t = Transport::Websocket)]
    transport: Transport,
    /// The drover binary (default: next to this one).
    #[arg(long)]
    drover: Option<PathBuf>,
    /// Runs of each size: each figure's median with its minimum and maximum.
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

#[derive(Args)]
struct AgentsArgs {
    #[arg(long, value_enum, default_value_t = Transport::Websocket)]
    transport: Transport,
    /// ws://HOST:PORT of `drover serve --agent-listen`, or nats://HOST:PORT;
    /// several, comma-separated (replicas, a cluster's nodes), spread
    /// device number N to the (N mod count)th.
    #[arg(long)]
    url: String,
    /// The control plane's data directory, whose secret.key makes the device tokens.
    #[arg(long)]
    data: PathBuf,
    #[arg(long, default_value_t = 100)]
    devices: usize,
    #[arg(long, default_value = "sim-")]
    prefix: String,
    /// The number of the first device (PREFIX plus five digits): one
    /// process's share of a fleet played by several.
    #[arg(long, default_value_t = 0)]
    first: usize,
    #[arg(long, default_value_t = 30)]
    heartbeat_seconds: u64,
    #[arg(long, default_value_t = 7)]
    statuses_per_job: usize,
    /// Over NATS: log each device in as an accepted one, by the user JWT
    /// the keys in DIR (`drover nats-config --authority`) sign for its key,
    /// instead of by its token's password.
    #[arg(long)]
    nats_authority: Option<PathBuf>,
    /// Over NATS: each agent's first attempt at a random moment within
    /// this many milliseconds (0: all at once).
    #[arg(long, default_value_t = 0)]
    first_attempt_spread_ms: u64,
}

#[derive(Args)]
struct FootprintArgs {
    /// The drover-agent binary (default: next to this one).
    #[arg(long)]
    agent: Option<PathBuf>,
    /// Another agent build to measure beside it over the first transport
    /// (idle and per-job figures), as LABEL=PATH: the agent built with
    /// another store, say.
    #[arg(long)]
    variant: Vec<String>,
    /// The drover binary (default: next to this one).
    #[arg(long)]
    drover: Option<PathBuf>,
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "websocket,nats,mqtt"
    )]
    transports: Vec<Transport>,
    #[arg(long, default_value_t = 60)]
    idle_seconds: u64,
    #[arg(long, default_value_t = 3)]
    jobs: usize,
    /// One-job Deployments released in turn per transport to measure
    /// intent → accepted (p50/p99); 0 skips it. At most about 550: each is
    /// a change by the one operator, who may make 600 at once (the API's
    /// limit), and the set-up makes a few.
    #[arg(long, default_value_t = 500)]
    latency_jobs: usize,
    /// Cross-built agents to size too, as ARCH=PATH (stripped with ARCH's strip).
    #[arg(long)]
    cross: Vec<String>,
}

#[derive(Args)]
struct PatchArgs {
    /// Fleet sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "20000")]
    devices: Vec<usize>,
    /// The drover binary (default: next to this one).
    #[arg(long)]
    drover: Option<PathBuf>,
    /// Devices connected at once.
    #[arg(long, default_value_t = 500)]
    batch: usize,
    /// Requests timed per view.
    #[arg(long, default_value_t = 20)]
    queries: usize,
    /// Runs of each size: each figure's median with its minimum and maximum.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    #[arg(long)]
    keep: bool,
}

fn main() -> Result<()> {
    agent_core::logging::init("warn");
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Agents(args) => agents(args).await,
            Command::Footprint(args) => footprint_cmd(args).await,
            Command::Patch(args) => patch_cmd(args).await,
            Command::Bench(args) => cmd_bench::bench_cmd(args).await,
            Command::Enroll(args) => enroll_cmd(args).await,
            Command::NatsConnect(args) => nats_connect_cmd(args).await,
            Command::MqttLogins(args) => mqtt_logins_cmd(args).await,
            Command::Reconnect(args) => cmd_reconnect::reconnect_cmd(args).await,
            Command::MqttConnect(args) => cmd_mqtt_connect::mqtt_connect_cmd(args).await,
            Command::NatsFloor(args) => cmd_floor::floor_cmd(args).await,
        }
    })
}

/// `agents`: plays the devices until interrupted, printing their counts.
async fn agents(args: AgentsArgs) -> Result<()> {
    let AgentsArgs {
        transport,
        url,
        data,
        devices,
        prefix,
        first,
        heartbeat_seconds,
        statuses_per_job,
        nats_authority,
        first_attempt_spread_ms,
    } = args;
    let authority = nats_authority
        .map(|dir| transport_nats::authority::Authority::load_or_create(&dir))
        .transpose()?;
    let secrets = drover_server::auth::Secrets::load_or_create(&data, None)?;
    let tokens: Vec<_> = device_id_range(&prefix, first, devices)
        .into_iter()
        .map(|d| {
            let token = secrets.device_token(&d);
            (d, token)
        })
        .collect();
    let shutdown = CancellationToken::new();
    let behaviour = Behaviour {
        heartbeat: Duration::from_secs(heartbeat_seconds.max(1)),
        statuses_per_job,
        first_attempt_spread: Duration::from_millis(first_attempt_spread_ms),
    };
    let stats = drover_sim::bench_fleet::spawn_agents(
        transport,
        &url,
        first,
        &tokens,
        authority.as_ref(),
        behaviour,
        &shutdown,
    )?;
    let mut report = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = report.tick() => eprintln!("{}", stats.snapshot()),
            _ = agent_core::shutdown::wait_for_signal() => break,
        }
    }
    shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(300)).await;
    eprintln!("{}", stats.snapshot());
    Ok(())
}

/// `footprint`: measures the agent per transport (and its variants), mender-client and the binaries' sizes.
async fn footprint_cmd(args: FootprintArgs) -> Result<()> {
    let FootprintArgs {
        agent,
        variant,
        drover,
        transports,
        idle_seconds,
        jobs,
        latency_jobs,
        cross,
    } = args;
    let mut builds = vec![(
        agent_core::store::STORE_NAME.to_owned(),
        beside_this(agent, "drover-agent")?,
    )];
    for entry in variant {
        let (label, path) = entry
            .split_once('=')
            .context("--variant takes LABEL=PATH")?;
        builds.push((label.to_owned(), PathBuf::from(path)));
    }
    let options = FootprintOptions {
        agents: builds.clone(),
        drover: beside_this(drover, "drover")?,
        transports: transports.clone(),
        idle: Duration::from_secs(idle_seconds),
        jobs,
        latency_jobs,
    };
    let mut agents = Vec::new();
    for transport in &transports {
        eprintln!(
            "measuring the agent over {transport:?} ({idle_seconds} s idle, {jobs} jobs, {latency_jobs} acceptances)"
        );
        agents
            .push(footprint::measure_agent(&options, &builds[0], *transport, latency_jobs).await?);
    }
    for build in &builds[1..] {
        let transport = transports[0];
        eprintln!("measuring the {} agent over {transport:?}", build.0);
        agents.push(footprint::measure_agent(&options, build, transport, 0).await?);
    }
    eprintln!("measuring mender-client ({idle_seconds} s idle)");
    let mender = footprint::measure_mender(options.idle).await?;
    let mut sizes = vec![(
        "amd64".to_owned(),
        footprint::stripped_size(&builds[0].1, "strip")?,
    )];
    for (label, path) in &builds[1..] {
        sizes.push((
            format!("amd64, {label}"),
            footprint::stripped_size(path, "strip")?,
        ));
    }
    for entry in cross {
        let (arch, path) = entry.split_once('=').context("--cross takes ARCH=PATH")?;
        let strip = match arch {
            "arm64" => "aarch64-linux-gnu-strip",
            "armhf" => "arm-linux-gnueabihf-strip",
            other => anyhow::bail!("no strip known for {other}"),
        };
        sizes.push((
            arch.to_owned(),
            footprint::stripped_size(Path::new(path), strip)?,
        ));
    }
    footprint::print(&agents, mender.as_ref(), &sizes);
    Ok(())
}

/// `patch`: measures a fleet's assessments and the patch views per fleet size.
async fn patch_cmd(args: PatchArgs) -> Result<()> {
    let PatchArgs {
        devices,
        drover,
        batch,
        queries,
        runs,
        keep,
    } = args;
    let drover = beside_this(drover, "drover")?;
    println!("{}", drover_sim::patch::header());
    for size in devices {
        let options = PatchOptions {
            devices: size,
            drover: drover.clone(),
            batch,
            queries,
            keep,
        };
        let mut figures = Vec::new();
        for run in 1..=runs.max(1) {
            match patch::measure(&options).await {
                Ok(one) => {
                    eprintln!("run {run} of {runs}: {}", patch::run_line(&one));
                    figures.push(one);
                }
                Err(e) => eprintln!("run {run} of {runs}, {size} devices: failed: {e:#}"),
            }
        }
        match patch::row(&figures) {
            Some(row) => println!("{row}"),
            None => println!("| {size} | every run failed (see stderr) | | | | | | | | |"),
        }
    }
    Ok(())
}

/// `enroll`: devices enrolling at once, for each fleet size.
async fn enroll_cmd(args: EnrollArgs) -> Result<()> {
    use drover_sim::spread::Spread;
    let drover = beside_this(args.drover, "drover")?;
    println!(
        "| devices | all accepted, s | all in by key, s | control-plane CPU per device, ms | broker CPU per device, ms | retries | load before → after |"
    );
    println!("|---|---|---|---|---|---|---|");
    for size in args.devices {
        let mut runs = Vec::new();
        for run in 1..=args.runs.max(1) {
            let measured = match args.transport {
                Transport::Nats => drover_sim::enroll_nats::measure(&drover, size).await,
                Transport::Mqtt => drover_sim::enroll_mqtt::measure(&drover, size).await,
                _ => drover_sim::enroll::measure(&drover, size).await,
            };
            match measured {
                Ok(one) => {
                    eprintln!("run {run}: {one:?}");
                    runs.push(one);
                }
                Err(e) => eprintln!("run {run}, {size} devices: failed: {e:#}"),
            }
        }
        let spread = |f: &dyn Fn(&drover_sim::enroll::EnrollFigures) -> f64, decimals| {
            Spread::of(runs.iter().map(f)).map_or_else(|| "-".to_owned(), |s| s.show(decimals))
        };
        let broker = if runs.iter().all(|r| r.broker_cpu_per_device.is_some()) {
            spread(
                &|r| r.broker_cpu_per_device.unwrap_or_default().as_secs_f64() * 1000.0,
                2,
            )
        } else {
            "-".to_owned()
        };
        println!(
            "| {size} | {} | {} | {} | {broker} | {} | {} |",
            spread(&|r| r.accepted.as_secs_f64(), 1),
            spread(&|r| r.connected.as_secs_f64(), 1),
            spread(&|r| r.cpu_per_device.as_secs_f64() * 1000.0, 2),
            spread(&|r| r.retries as f64, 0),
            runs.iter()
                .map(|r| format!("{:.1} → {:.1}", r.load.0, r.load.1))
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
    Ok(())
}

/// `nats-connect`: devices connecting at once, for each way of logging in
/// and each fleet size.
async fn nats_connect_cmd(args: NatsConnectArgs) -> Result<()> {
    use drover_sim::connect::{ConnectFigures, measure};
    use drover_sim::spread::Spread;
    // With --restart, a column for the window each row's agents spread over.
    let (connected, window_column) = match args.restart {
        true => (
            "reconnect window, s | all in again after the server's restart, s",
            "---|",
        ),
        false => ("all connected, s", ""),
    };
    println!(
        "| devices | login | {connected} | server CPU per device, ms | retries | load before → after |"
    );
    println!("|---|---|{window_column}---|---|---|---|");
    for size in &args.devices {
        let window = transport_nats::spread::reconnect_spread(*size, args.logins_per_second);
        let restart = args.restart.then_some(window);
        for auth in &args.auth {
            let mut runs = Vec::new();
            for run in 1..=args.runs.max(1) {
                match measure(*size, *auth, restart, args.cluster).await {
                    Ok(one) => {
                        eprintln!("run {run}: {auth:?} {one:?}");
                        runs.push(one);
                    }
                    Err(e) => eprintln!("run {run}, {size} devices, {auth:?}: failed: {e:#}"),
                }
            }
            let spread = |f: &dyn Fn(&ConnectFigures) -> f64, decimals| {
                Spread::of(runs.iter().map(f)).map_or_else(|| "-".to_owned(), |s| s.show(decimals))
            };
            let login = match auth {
                drover_sim::connect::Auth::Password => "bcrypt password",
                drover_sim::connect::Auth::Jwt => "user JWT",
            };
            println!(
                "| {size} | {login} | {}{} | {} | {} | {} |",
                restart.map_or(String::new(), |w| format!("{:.1} | ", w.as_secs_f64())),
                spread(&|r| r.connected.as_secs_f64(), 1),
                spread(&|r| r.server_cpu_per_device.as_secs_f64() * 1000.0, 2),
                spread(&|r| r.retries as f64, 0),
                runs.iter()
                    .map(|r| format!("{:.1} → {:.1}", r.load.0, r.load.1))
                    .collect::<Vec<_>>()
                    .join(", "),
            );
        }
    }
    Ok(())
}

/// `mqtt-logins`: the dynamic security plugin taking N logins at once.
async fn mqtt_logins_cmd(args: MqttLoginsArgs) -> Result<()> {
    use drover_sim::logins::{LoginFigures, measure};
    use drover_sim::spread::Spread;
    println!(
        "| logins | all answered, s | broker CPU per login, ms | plugin file, MiB | load before → after |"
    );
    println!("|---|---|---|---|---|");
    for size in args.devices {
        let mut runs = Vec::new();
        for run in 1..=args.runs.max(1) {
            match measure(size).await {
                Ok(one) => {
                    eprintln!("run {run}: {one:?}");
                    runs.push(one);
                }
                Err(e) => eprintln!("run {run}, {size} logins: failed: {e:#}"),
            }
        }
        let spread = |f: &dyn Fn(&LoginFigures) -> f64, decimals| {
            Spread::of(runs.iter().map(f)).map_or_else(|| "-".to_owned(), |s| s.show(decimals))
        };
        println!(
            "| {size} | {} | {} | {} | {} |",
            spread(&|r| r.answered.as_secs_f64(), 1),
            spread(&|r| r.broker_cpu_per_login.as_secs_f64() * 1000.0, 2),
            spread(&|r| r.file_bytes as f64 / (1024.0 * 1024.0), 1),
            runs.iter()
                .map(|r| format!("{:.1} → {:.1}", r.load.0, r.load.1))
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
    Ok(())
}

/// `explicit`, else the binary NAME in this one's directory.
pub(crate) fn beside_this(explicit: Option<PathBuf>, name: &str) -> anyhow::Result<PathBuf> {
    match explicit {
        Some(path) => Ok(path),
        None => Ok(std::env::current_exe()?
            .parent()
            .context("no directory of this binary")?
            .join(name)),
    }
}
