//! The fleet benchmark: for each fleet size, a fresh `drover serve` (and
//! nats-server for NATS) in a temporary directory, N devices registered in
//! one request, N simulated agents connected, then one TaskRun applied and
//! followed to Complete. It prints figures; it asserts nothing about time.
//!
//! Measured on the control plane's process: wall time from apply to
//! Complete, CPU time per device during the run, resident memory per
//! connected idle device, and bytes written to storage per device per run.

use crate::procstat::{self, Usage};
use crate::summary::Spread;
use crate::{Behaviour, SimAgent, Stats, device_ids};
use anyhow::{Context, Result, bail};
use drover_model::DeviceId;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    Websocket,
    Nats,
    Mqtt,
}

#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub sizes: Vec<usize>,
    pub transport: Transport,
    /// The `drover` binary to benchmark (a release build, normally).
    pub drover: PathBuf,
    /// Statuses each simulated agent sends per job.
    pub statuses_per_job: usize,
    /// How long to wait for a run to complete before giving up on a size.
    pub run_timeout: Duration,
    /// Keep the temporary directories.
    pub keep: bool,
    /// What is applied: a TaskRun, or a Deployment with this concurrency.
    pub deployment_concurrency: Option<u32>,
    /// Over NATS: three nats-server nodes as one cluster, every bucket with
    /// three replicas, the simulated agents spread over the nodes.
    pub nats_cluster: bool,
    /// `drover serve` replicas on one JetStream store (`--store nats`), the
    /// WebSocket agents spread over them; 1: one on the embedded store.
    pub replicas: usize,
    /// Simulator processes playing the agents; 0: this one up to
    /// [`AGENTS_PER_PROCESS`] agents, else as many as that limit needs.
    pub agent_processes: usize,
}

/// One row of the benchmark's table.
#[derive(Debug, Clone)]
pub struct Figures {
    pub devices: usize,
    pub transport: Transport,
    /// Control-plane replicas (1: the embedded store).
    pub replicas: usize,
    pub connect_seconds: f64,
    pub run_seconds: f64,
    /// The control planes' CPU time during the run, all replicas together.
    pub cpu_ms_per_device: f64,
    /// The brokers' CPU time during the run, every node together (none
    /// over WebSocket on the embedded store).
    pub broker_cpu_ms_per_device: Option<f64>,
    /// Growth of the control planes' RSS, all replicas together, once the
    /// agents connected.
    pub idle_rss_kib_per_device: f64,
    /// Control planes' and brokers' writes during the run.
    pub written_kib_per_device: f64,
    pub complete: bool,
    /// Each replica's RSS with every agent connected.
    pub control_plane_rss_mib: Vec<u64>,
    /// Each broker process's RSS after the run (three for a cluster).
    pub broker_rss_mib: Vec<u64>,
    pub cluster: bool,
    /// "TaskRun", or "Deployment (N at once)".
    pub work: String,
    /// Passes over the run or deployment, and the time they took in all.
    pub passes: u64,
    pub pass_seconds: f64,
    /// Of the pass time, waiting for the store's commits (deployments only).
    pub store_seconds: Option<f64>,
    /// The one-minute load average when the run was applied and when it ended.
    pub load: (f64, f64),
    /// The operator's views on the first replica once the run ended, every
    /// agent still connected: each asked [`VIEW_QUERIES`] times.
    pub views_ms: Vec<(&'static str, Spread)>,
}

/// The operator's views the benchmark times: `drover get devices`' first
/// page, the dashboard's fleet page, the alerts and the patch summary.
pub const VIEWS: [(&str, &str); 4] = [
    ("get devices", "/devices?limit=500"),
    ("fleet page", "/devices/page?offset=0&limit=50&q="),
    ("alerts", "/alerts"),
    ("patch summary", "/patch-status"),
];

/// Requests timed per view.
pub const VIEW_QUERIES: usize = 10;

impl Figures {
    /// The transport column's words.
    pub fn transport_label(&self) -> String {
        let transport = match (self.transport, self.cluster, self.replicas > 1) {
            (Transport::Websocket, _, false) => "WebSocket",
            (Transport::Websocket, false, true) => "WebSocket, JetStream store",
            (Transport::Websocket, true, true) => "WebSocket, JetStream store on 3 nodes (R3)",
            (Transport::Nats, false, _) => "NATS",
            (Transport::Nats, true, _) => "NATS, 3-node cluster (R3)",
            (Transport::Mqtt, _, _) => "MQTT",
        };
        if self.replicas > 1 {
            format!("{transport}, {} replicas", self.replicas)
        } else {
            transport.to_owned()
        }
    }

    /// One run's figures on one line (stderr, beside the table's medians).
    pub fn row(&self) -> String {
        let list = |values: &[u64]| {
            if values.is_empty() {
                "-".to_owned()
            } else {
                values
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(" / ")
            }
        };
        format!(
            "| {} | {} | {} | {:.1} | {}{:.1} | {:.2} | {} | {:.1} | {:.1} | {} | {} | {} | {:.2} ({:.1} %) | {} |",
            self.devices,
            self.transport_label(),
            self.work,
            self.connect_seconds,
            if self.complete {
                ""
            } else {
                "not complete after "
            },
            self.run_seconds,
            self.cpu_ms_per_device,
            self.broker_cpu_ms_per_device
                .map_or_else(|| "-".to_owned(), |c| format!("{c:.2}")),
            self.idle_rss_kib_per_device,
            self.written_kib_per_device,
            list(&self.control_plane_rss_mib),
            list(&self.broker_rss_mib),
            self.passes,
            self.pass_seconds,
            if self.run_seconds > 0.0 {
                100.0 * self.pass_seconds / self.run_seconds
            } else {
                0.0
            },
            self.store_seconds
                .map_or_else(|| "-".to_owned(), |s| format!("{s:.2}")),
        ) + &format!(
            " views (ms, median (min–max) of {VIEW_QUERIES}): {}",
            self.views_ms
                .iter()
                .map(|(name, spread)| format!("{name} {}", spread.show(1)))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }

    /// The slowest view by its median: its name and median.
    pub fn slowest_view(&self) -> Option<(&'static str, f64)> {
        self.views_ms
            .iter()
            .map(|(name, spread)| (*name, spread.median))
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }
}

pub(crate) struct Process(pub(crate) Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

const CP_USER: &str = "drover-control-plane";
const CP_PASSWORD: &str = "bench-secret";

/// Starts nats-server with JetStream and one user per device.
pub(crate) fn start_nats(dir: &Path, tokens: &[(DeviceId, String)]) -> Result<(Process, String)> {
    let port = free_port()?;
    let auth = transport_nats::server::authorization_config(
        (CP_USER, CP_PASSWORD),
        &broker_passwords(tokens),
        transport_nats::server::DirectStatusPuts::Denied,
    )
    .map_err(anyhow::Error::msg)?;
    let config = format!(
        "listen: \"127.0.0.1:{port}\"\nmax_connections: 100000\nwrite_deadline: \"30s\"\n\
         jetstream {{ store_dir: {:?} }}\n{auth}",
        dir.join("js").display().to_string()
    );
    let process = spawn_nats(dir, &config, port)?;
    Ok((process, format!("nats://127.0.0.1:{port}")))
}

/// Starts nats-server with `config` (written to DIR/nats.conf, its log to
/// DIR/nats.log) and waits until it listens on `port`. The binary is
/// `$DROVER_NATS_SERVER`, else the one on PATH (`scripts/bench.sh` gives
/// the 2.10 a cluster needs, see docs/operations.md).
fn spawn_nats(dir: &Path, config: &str, port: u16) -> Result<Process> {
    let path = dir.join("nats.conf");
    std::fs::write(&path, config)?;
    let log = std::fs::File::create(dir.join("nats.log"))?;
    let binary = std::env::var_os("DROVER_NATS_SERVER").unwrap_or_else(|| "nats-server".into());
    let child = Command::new(binary)
        .arg("-c")
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("cannot start nats-server (apt-get install nats-server)")?;
    let process = Process(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!(
                "nats-server did not start; see {}",
                dir.join("nats.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(process)
}

/// Starts three nats-server nodes as one JetStream cluster (routes on
/// loopback, one store directory each); returns them and their client URLs.
pub(crate) fn start_nats_cluster(
    dir: &Path,
    tokens: &[(DeviceId, String)],
) -> Result<(Vec<Process>, Vec<String>)> {
    let auth = transport_nats::server::authorization_config(
        (CP_USER, CP_PASSWORD),
        &broker_passwords(tokens),
        transport_nats::server::DirectStatusPuts::Denied,
    )
    .map_err(anyhow::Error::msg)?;
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_>>()?;
    let routes: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_>>()?;
    let mut nodes = Vec::new();
    for i in 0..3 {
        let others: Vec<String> = (0..3)
            .filter(|j| *j != i)
            .map(|j| format!("\"nats-route://127.0.0.1:{}\"", routes[j]))
            .collect();
        let node = dir.join(format!("n{i}"));
        std::fs::create_dir_all(&node)?;
        let config = format!(
            "server_name: n{i}\nlisten: \"127.0.0.1:{}\"\nmax_connections: 100000\nwrite_deadline: \"30s\"\n\
             jetstream {{ store_dir: {:?} }}\n\
             cluster {{ name: drover, listen: \"127.0.0.1:{}\", routes: [{}] }}\n{auth}",
            ports[i],
            node.join("js").display().to_string(),
            routes[i],
            others.join(", ")
        );
        nodes.push(spawn_nats(&node, &config, ports[i])?);
    }
    let urls = ports
        .iter()
        .map(|port| format!("nats://127.0.0.1:{port}"))
        .collect();
    Ok((nodes, urls))
}

/// Each device with the broker password its agent derives from its token,
/// as `drover nats-config` and `drover mqtt-config` write them.
fn broker_passwords(tokens: &[(DeviceId, String)]) -> Vec<(DeviceId, String)> {
    tokens
        .iter()
        .map(|(device, token)| {
            let password = drover_model::credentials::broker_password(token, device);
            (device.clone(), password)
        })
        .collect()
}

/// Starts mosquitto with one password and ACL entry per device.
pub(crate) fn start_mosquitto(
    dir: &Path,
    tokens: &[(DeviceId, String)],
) -> Result<(Process, String)> {
    let port = free_port()?;
    let (passwords, acl) = transport_mqtt::server::mosquitto_files(
        &transport_mqtt::Topics::new(transport_mqtt::DEFAULT_PREFIX),
        &[CP_USER],
        CP_PASSWORD,
        &broker_passwords(tokens),
    );
    std::fs::write(dir.join("drover.passwd"), passwords)?;
    std::fs::write(dir.join("drover.acl"), acl)?;
    let config = format!(
        "user root\nlistener {port} 127.0.0.1\n{}\nmax_connections -1\n{}\n\
         persistence false\nper_listener_settings false\nallow_anonymous false\n\
         password_file {}\nacl_file {}\n",
        transport_mqtt::Topics::listener_settings(),
        transport_mqtt::Topics::broker_settings(),
        dir.join("drover.passwd").display(),
        dir.join("drover.acl").display()
    );
    let path = dir.join("mosquitto.conf");
    std::fs::write(&path, config)?;
    let log = std::fs::File::create(dir.join("mosquitto.log"))?;
    let child = Command::new("mosquitto")
        .arg("-c")
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("cannot start mosquitto (apt-get install mosquitto)")?;
    let process = Process(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!(
                "mosquitto did not start; see {}",
                dir.join("mosquitto.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((process, format!("mqtt://127.0.0.1:{port}")))
}

/// How `drover serve` keeps its state and reaches its agents' broker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Serve<'a> {
    pub(crate) transport: Transport,
    /// The broker (NATS or MQTT) the agents use, or the JetStream store's.
    pub(crate) broker_url: Option<&'a str>,
    /// Each bucket's replicas (3 on a three-node cluster).
    pub(crate) nats_replicas: usize,
    /// On the JetStream store (`--store nats`, several replicas) instead of
    /// the embedded one.
    pub(crate) store_on_nats: bool,
}

/// `drover serve` with its data in DIR/data; returns the process, API and agent addresses.
pub(crate) fn start_drover(
    drover: &Path,
    dir: &Path,
    serve: Serve<'_>,
) -> Result<(Process, String, String)> {
    let ready = dir.join("ready.json");
    let log = std::fs::File::create(dir.join("drover.log"))?;
    let mut command = Command::new(drover);
    command
        .arg("--data")
        .arg(dir.join("data"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--agent-listen",
            "127.0.0.1:0",
        ])
        .arg("--ready-file")
        .arg(&ready)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    let nats = serve.transport == Transport::Nats || serve.store_on_nats;
    match serve.broker_url {
        Some(url) if nats => {
            command.args([
                "--nats-url",
                url,
                "--nats-user",
                CP_USER,
                "--nats-password",
                CP_PASSWORD,
                "--nats-replicas",
                &serve.nats_replicas.to_string(),
            ]);
            if serve.store_on_nats {
                command.args(["--store", "nats"]);
            }
        }
        Some(url) if serve.transport == Transport::Mqtt => {
            command.args([
                "--mqtt-url",
                url,
                "--mqtt-user",
                CP_USER,
                "--mqtt-password",
                CP_PASSWORD,
            ]);
        }
        _ => {}
    }
    let process = Process(
        command
            .spawn()
            .with_context(|| format!("cannot start {}", drover.display()))?,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let addresses: Value = loop {
        if let Ok(text) = std::fs::read_to_string(&ready) {
            break serde_json::from_str(&text)?;
        }
        if Instant::now() > deadline {
            bail!(
                "drover serve did not start; see {}",
                dir.join("drover.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let field = |name: &str| -> Result<String> {
        Ok(addresses[name]
            .as_str()
            .context("ready file without addresses")?
            .to_owned())
    };
    Ok((process, field("api")?, field("agents")?))
}

pub(crate) struct Api {
    pub(crate) base: String,
    pub(crate) token: String,
    pub(crate) http: reqwest::Client,
}

impl Api {
    pub(crate) async fn post(&self, path: &str, body: &Value) -> Result<Value> {
        let response = self
            .http
            .post(format!("{}/api/v1{path}", self.base))
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .await?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("{path} answered {status}: {body}");
        }
        Ok(body)
    }

    pub(crate) async fn get(&self, path: &str) -> Result<Value> {
        Ok(self
            .http
            .get(format!("{}/api/v1{path}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?)
    }
}

/// Registers every device, as Lists of at most 20,000 Device manifests (the
/// most one request may carry).
pub async fn register(api_base: &str, token: &str, devices: &[DeviceId]) -> Result<()> {
    let api = Api {
        base: api_base.to_owned(),
        token: token.to_owned(),
        http: http_builder().timeout(Duration::from_secs(300)).build()?,
    };
    for chunk in devices.chunks(20_000) {
        let items: Vec<Value> = chunk
            .iter()
            .map(|d| {
                json!({"apiVersion": drover_rules::records::API_VERSION, "kind": "Device",
                       "metadata": {"name": d.as_str()}, "spec": {"groups": ["bench"]}})
            })
            .collect();
        api.post(
            "/apply",
            &json!({"apiVersion": "v1", "kind": "List", "items": items}),
        )
        .await?;
    }
    Ok(())
}

/// Starts a simulated agent for each of `tokens`, the first being device
/// number `first` of the fleet; returns their shared counters. Over
/// WebSocket and NATS `agent_url` may name several places, comma-separated
/// (replicas' agent ports, a cluster's nodes): device number `i` goes to
/// place `i % places`, so several simulator processes spread a fleet alike.
pub fn spawn_agents(
    transport: Transport,
    agent_url: &str,
    first: usize,
    tokens: &[(DeviceId, String)],
    behaviour: Behaviour,
    shutdown: &CancellationToken,
) -> Result<Arc<Stats>> {
    let stats = Arc::new(Stats::default());
    let behaviour = Arc::new(behaviour);
    let places: Vec<&str> = agent_url.split(',').map(str::trim).collect();
    let ws_targets: Vec<crate::ws::Target> = match transport {
        Transport::Websocket => places
            .iter()
            .map(|place| {
                Ok(crate::ws::Target {
                    addr: place
                        .trim_start_matches("ws://")
                        .parse()
                        .with_context(|| format!("agent address {place}"))?,
                })
            })
            .collect::<Result<_>>()?,
        Transport::Nats | Transport::Mqtt => Vec::new(),
    };
    for (offset, (device, token)) in tokens.iter().enumerate() {
        let index = first + offset;
        let agent = SimAgent::new(device.clone(), behaviour.clone(), stats.clone());
        let token = token.clone();
        let shutdown = shutdown.clone();
        match transport {
            Transport::Websocket => {
                let target = ws_targets[index % ws_targets.len()];
                tokio::spawn(crate::ws::play(target, index, token, agent, shutdown));
            }
            Transport::Mqtt => {
                tokio::spawn(crate::mqtt::play(
                    agent_url.to_owned(),
                    token,
                    agent,
                    shutdown,
                ));
            }
            Transport::Nats => {
                tokio::spawn(crate::nats::play(
                    places[index % places.len()].to_owned(),
                    token,
                    agent,
                    shutdown,
                ));
            }
        }
    }
    Ok(stats)
}

/// The most simulated agents one simulator process plays: each holds a
/// connection (an open file), and this machine allows 20,000 per process.
pub const AGENTS_PER_PROCESS: usize = 15_000;

/// Simulated agents played by other processes (`drover-sim agents`), each
/// its share of the fleet; they stop when dropped.
struct AgentProcesses {
    processes: Vec<Process>,
    logs: Vec<PathBuf>,
}

impl AgentProcesses {
    fn start(
        dir: &Path,
        transport: Transport,
        agent_url: &str,
        devices: usize,
        processes: usize,
        statuses_per_job: usize,
    ) -> Result<Self> {
        let sim = std::env::current_exe().context("this simulator's own path")?;
        let mut started = Self {
            processes: Vec::new(),
            logs: Vec::new(),
        };
        for (i, (first, count)) in shares(devices, processes).into_iter().enumerate() {
            let log_path = dir.join(format!("agents-{i}.log"));
            let log = std::fs::File::create(&log_path)?;
            let child = Command::new(&sim)
                .arg("agents")
                .args(["--transport", transport_name(transport)])
                .args(["--url", agent_url])
                .arg("--data")
                .arg(dir.join("data"))
                .args(["--prefix", "bench-"])
                .args(["--first", &first.to_string()])
                .args(["--devices", &count.to_string()])
                .args(["--statuses-per-job", &statuses_per_job.to_string()])
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .context("cannot start a simulator process")?;
            started.processes.push(Process(child));
            started.logs.push(log_path);
        }
        Ok(started)
    }

    /// An error naming the first process that has exited, with its last words.
    fn check(&mut self) -> Result<()> {
        for (process, log) in self.processes.iter_mut().zip(&self.logs) {
            if let Ok(Some(exit)) = process.0.try_wait() {
                bail!(
                    "a simulator process ended ({exit}): {}",
                    last_line(log).unwrap_or_default()
                );
            }
        }
        Ok(())
    }

    /// Each process's last counters (its log's last line).
    fn snapshot(&self) -> String {
        self.logs
            .iter()
            .map(|log| last_line(log).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Splits devices 0..`devices` into at most `processes` runs of numbers
/// (first, count), as even as can be.
fn shares(devices: usize, processes: usize) -> Vec<(usize, usize)> {
    let processes = processes.clamp(1, devices.max(1));
    (0..processes)
        .map(|i| {
            let first = devices * i / processes;
            (first, devices * (i + 1) / processes - first)
        })
        .filter(|(_, count)| *count > 0)
        .collect()
}

fn last_line(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()?
        .lines()
        .last()
        .map(str::to_owned)
}

fn transport_name(transport: Transport) -> &'static str {
    match transport {
        Transport::Websocket => "websocket",
        Transport::Nats => "nats",
        Transport::Mqtt => "mqtt",
    }
}

/// Where the simulated agents run: in this process, or in others.
enum Fleet {
    Here(Arc<Stats>),
    Elsewhere(AgentProcesses),
}

impl Fleet {
    /// Whether every agent says it is connected (always true for agents in
    /// other processes: the control plane's count decides), or an error if
    /// a simulator process died.
    fn connected(&mut self, devices: usize) -> Result<bool> {
        match self {
            Self::Here(stats) => Ok(stats.connected.load(Ordering::Relaxed) >= devices),
            Self::Elsewhere(processes) => processes.check().map(|()| true),
        }
    }

    fn snapshot(&self) -> String {
        match self {
            Self::Here(stats) => stats.snapshot(),
            Self::Elsewhere(processes) => processes.snapshot(),
        }
    }
}

pub(crate) async fn wait_for(
    what: &str,
    timeout: Duration,
    mut ready: impl AsyncFnMut() -> Result<bool>,
) -> Result<f64> {
    let start = Instant::now();
    loop {
        if ready().await? {
            return Ok(start.elapsed().as_secs_f64());
        }
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A data directory for replica `index` beside the first one (DIR/data):
/// its own database, the first one's `secret.key` and `operator.token`
/// (docs/internals/control-plane.md, "Several replicas").
fn replica_dir(dir: &Path, index: usize) -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let replica = dir.join(format!("replica-{index}"));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(replica.join("data"))?;
    for file in ["secret.key", "operator.token"] {
        std::fs::copy(dir.join("data").join(file), replica.join("data").join(file))
            .with_context(|| format!("copy {file} to replica {index}"))?;
    }
    Ok(replica)
}

/// CPU, memory and writes of several processes, summed (memory: each one's).
fn usages(processes: &[&Process]) -> Result<Vec<Usage>> {
    processes
        .iter()
        .map(|p| procstat::usage(p.0.id()).context("a process's usage"))
        .collect()
}

/// What several processes used between two readings, summed.
fn between<T: std::iter::Sum>(
    before: &[Usage],
    after: &[Usage],
    grown: impl Fn(&Usage, &Usage) -> T,
) -> T {
    before.iter().zip(after).map(|(b, a)| grown(b, a)).sum()
}

fn cpu_between(before: &[Usage], after: &[Usage]) -> Duration {
    between(before, after, |b, a| a.cpu.saturating_sub(b.cpu))
}

fn written_between(before: &[Usage], after: &[Usage]) -> u64 {
    between(before, after, |b, a| {
        a.written_bytes.saturating_sub(b.written_bytes)
    })
}

/// Each replica's engine counters (`/summary`'s `engine`).
async fn engine_stats(apis: &[Api]) -> Result<Vec<Value>> {
    let mut stats = Vec::new();
    for api in apis {
        stats.push(api.get("/summary").await?["engine"].clone());
    }
    Ok(stats)
}

/// Runs the benchmark for one fleet size.
pub async fn measure(options: &BenchOptions, devices: usize) -> Result<Figures> {
    let dir = tempfile::Builder::new().prefix("drover-bench-").tempdir()?;
    let secrets = drover_server::auth::Secrets::load_or_create(&dir.path().join("data"), None)?;
    let ids = device_ids("bench-", devices);
    let tokens: Vec<(DeviceId, String)> = ids
        .iter()
        .map(|d| (d.clone(), secrets.device_token(d)))
        .collect();
    let replicas = options.replicas.max(1);
    let store_on_nats = replicas > 1;
    if store_on_nats && options.transport == Transport::Mqtt {
        bail!("several replicas are measured with WebSocket or NATS agents");
    }
    let cluster = options.nats_cluster && (options.transport == Transport::Nats || store_on_nats);
    let broker: Option<(Vec<Process>, String)> = match options.transport {
        Transport::Nats | Transport::Websocket if cluster => {
            let (nodes, urls) = start_nats_cluster(dir.path(), &tokens)?;
            Some((nodes, urls.join(",")))
        }
        Transport::Nats => {
            let (process, url) = start_nats(dir.path(), &tokens)?;
            Some((vec![process], url))
        }
        Transport::Websocket if store_on_nats => {
            let (process, url) = start_nats(dir.path(), &tokens)?;
            Some((vec![process], url))
        }
        Transport::Mqtt => {
            let (process, url) = start_mosquitto(dir.path(), &tokens)?;
            Some((vec![process], url))
        }
        Transport::Websocket => None,
    };
    let broker_url = broker.as_ref().map(|(_, url)| url.clone());
    let serve = Serve {
        transport: options.transport,
        broker_url: broker_url.as_deref(),
        nats_replicas: if cluster { 3 } else { 1 },
        store_on_nats,
    };
    let mut control_planes = Vec::new();
    let mut agent_addrs = Vec::new();
    let mut api_bases = Vec::new();
    for index in 0..replicas {
        let replica = if index == 0 {
            dir.path().to_owned()
        } else {
            replica_dir(dir.path(), index)?
        };
        let (process, api, agents) = start_drover(&options.drover, &replica, serve)?;
        api_bases.push(format!("http://{api}"));
        control_planes.push(process);
        agent_addrs.push(format!("ws://{agents}"));
    }
    let cps: Vec<&Process> = control_planes.iter().collect();
    let brokers: Vec<&Process> = broker.iter().flat_map(|(p, _)| p).collect();
    let http = http_builder().timeout(Duration::from_secs(300)).build()?;
    let apis: Vec<Api> = api_bases
        .iter()
        .map(|base| Api {
            base: base.clone(),
            token: secrets.operator_token().to_owned(),
            http: http.clone(),
        })
        .collect();
    let api = &apis[0];
    register(&api.base, &api.token, &ids).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before_agents = usages(&cps)?;

    let shutdown = CancellationToken::new();
    let agent_url = match (&broker_url, options.transport) {
        (Some(url), Transport::Nats | Transport::Mqtt) => url.clone(),
        _ => agent_addrs.join(","),
    };
    let processes = match options.agent_processes {
        0 => devices.div_ceil(AGENTS_PER_PROCESS),
        n => n,
    };
    let mut fleet = if processes <= 1 && options.agent_processes == 0 {
        let behaviour = Behaviour {
            statuses_per_job: options.statuses_per_job,
            ..Behaviour::default()
        };
        Fleet::Here(spawn_agents(
            options.transport,
            &agent_url,
            0,
            &tokens,
            behaviour,
            &shutdown,
        )?)
    } else {
        Fleet::Elsewhere(AgentProcesses::start(
            dir.path(),
            options.transport,
            &agent_url,
            devices,
            processes,
            options.statuses_per_job,
        )?)
    };
    let connect_seconds = wait_for(
        "every simulated agent to be registered",
        Duration::from_secs(600),
        async || {
            if !fleet.connected(devices)? {
                return Ok(false);
            }
            let summary = api.get("/summary").await?;
            Ok(summary["agentsPresent"].as_u64() == Some(devices as u64))
        },
    )
    .await?;
    // Idle: every agent connected, nothing to do.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle = usages(&cps)?;

    let run = format!("bench-{devices}");
    let (manifest, path, work) = match options.deployment_concurrency {
        None => (
            json!({"apiVersion": drover_rules::records::API_VERSION, "kind": "TaskRun",
                   "metadata": {"name": run},
                   "spec": {"allowedGroups": ["bench"], "deadlineSeconds": 3600, "systemUpgradeV1": {}}}),
            format!("/taskruns/{run}"),
            "TaskRun".to_owned(),
        ),
        Some(concurrency) => (
            json!({"apiVersion": drover_rules::records::API_VERSION, "kind": "Deployment",
                   "metadata": {"name": run},
                   "spec": {"targets": {"filter": {"groups": ["bench"]}}, "systemUpgradeV1": {},
                            "maxConcurrency": concurrency, "deadlineSeconds": 3600}}),
            format!("/deployments/{run}"),
            format!("Deployment ({concurrency} at once)"),
        ),
    };
    let engines_before = engine_stats(&apis).await?;
    let start = usages(&cps)?;
    let brokers_start = usages(&brokers)?;
    let load_before = procstat::load_average().unwrap_or(f64::NAN);
    let started = Instant::now();
    api.post("/apply", &manifest).await?;
    let mut complete = false;
    loop {
        let status = api.get(&path).await?;
        let phase = status["status"]["phase"].as_str().unwrap_or("");
        if phase == "Complete" {
            complete = true;
            break;
        }
        if phase == "Failed" {
            eprintln!("{work} failed: {}", status["status"]);
            break;
        }
        if started.elapsed() > options.run_timeout {
            eprintln!(
                "{work} not complete after {:?}: {}; agents: {}",
                options.run_timeout,
                status["status"],
                fleet.snapshot()
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let run_seconds = started.elapsed().as_secs_f64();
    let end = usages(&cps)?;
    let brokers_end = usages(&brokers)?;
    let load_after = procstat::load_average().unwrap_or(f64::NAN);
    let mut views_ms = Vec::new();
    for (name, path) in VIEWS {
        views_ms.push((name, crate::patch::timed(api, path, VIEW_QUERIES).await?));
    }
    // Every replica's engine: whichever held the lease made the passes.
    let engines_after = engine_stats(&apis).await?;
    let (passes_key, seconds_key) = if options.deployment_concurrency.is_some() {
        ("deploymentPasses", "deploymentPassSeconds")
    } else {
        ("runPasses", "runPassSeconds")
    };
    let grown = |key: &str| -> f64 {
        engines_before
            .iter()
            .zip(&engines_after)
            .map(|(b, a)| a[key].as_f64().unwrap_or(0.0) - b[key].as_f64().unwrap_or(0.0))
            .sum()
    };
    let passes = grown(passes_key).round() as u64;
    let pass_seconds = grown(seconds_key);
    let store_seconds = options
        .deployment_concurrency
        .map(|_| grown("deploymentStoreSeconds"));
    let broker_rss: Vec<u64> = brokers_end
        .iter()
        .map(|u| u.rss_bytes / (1024 * 1024))
        .collect();
    let broker_cpu = (!brokers.is_empty())
        .then(|| cpu_between(&brokers_start, &brokers_end).as_secs_f64() * 1000.0 / devices as f64);
    shutdown.cancel();
    drop(fleet);
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(control_planes);
    drop(broker);
    if options.keep {
        let kept = dir.keep();
        eprintln!("kept {}", kept.display());
    }
    let n = devices as f64;
    let idle_growth: u64 = between(&before_agents, &idle, |b, a| {
        a.rss_bytes.saturating_sub(b.rss_bytes)
    });
    Ok(Figures {
        devices,
        transport: options.transport,
        replicas,
        connect_seconds,
        run_seconds,
        cpu_ms_per_device: cpu_between(&start, &end).as_secs_f64() * 1000.0 / n,
        broker_cpu_ms_per_device: broker_cpu,
        idle_rss_kib_per_device: idle_growth as f64 / 1024.0 / n,
        written_kib_per_device: (written_between(&start, &end)
            + written_between(&brokers_start, &brokers_end)) as f64
            / 1024.0
            / n,
        complete,
        control_plane_rss_mib: idle.iter().map(|u| u.rss_bytes / (1024 * 1024)).collect(),
        broker_rss_mib: broker_rss,
        cluster,
        work,
        passes,
        pass_seconds,
        store_seconds,
        load: (load_before, load_after),
        views_ms,
    })
}

/// reqwest's builder, after setting this process's rustls provider (reqwest
/// is built without aws-lc and looks one up).
pub(crate) fn http_builder() -> reqwest::ClientBuilder {
    transport_websocket::tls::install_default_provider();
    reqwest::Client::builder()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fleet_is_shared_among_simulator_processes_without_gap_or_overlap() {
        assert_eq!(shares(10, 3), vec![(0, 3), (3, 3), (6, 4)]);
        assert_eq!(shares(50_000, 4).iter().map(|s| s.1).sum::<usize>(), 50_000);
        assert_eq!(shares(2, 5), vec![(0, 1), (1, 1)]);
        assert_eq!(shares(0, 2), Vec::<(usize, usize)>::new());
        for (devices, processes) in [(7, 2), (50_000, 4), (15_001, 2)] {
            let mut next = 0;
            for (first, count) in shares(devices, processes) {
                assert_eq!(first, next, "{devices} over {processes}");
                next += count;
            }
            assert_eq!(next, devices);
        }
    }
}
