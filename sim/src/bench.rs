//! The fleet benchmark: for each fleet size, a fresh `drover serve` (and
//! nats-server for NATS) in a temporary directory, N devices registered in
//! one request, N simulated agents connected, then one TaskRun applied and
//! followed to Complete. It prints figures; it asserts nothing about time.
//!
//! Measured on the control plane's process: wall time from apply to
//! Complete, CPU time per device during the run, resident memory per
//! connected idle device, and bytes written to storage per device per run.

use crate::procstat::{self, Usage};
use crate::{Behaviour, SimAgent, Stats, device_ids};
use agent_core::DeviceId;
use anyhow::{Context, Result, bail};
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
}

/// One row of the benchmark's table.
#[derive(Debug, Clone)]
pub struct Figures {
    pub devices: usize,
    pub transport: Transport,
    pub connect_seconds: f64,
    pub run_seconds: f64,
    pub cpu_ms_per_device: f64,
    pub idle_rss_kib_per_device: f64,
    pub written_kib_per_device: f64,
    pub complete: bool,
    pub control_plane_rss_mib: u64,
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
}

impl Figures {
    pub fn header() -> &'static str {
        "| devices | transport | work | connect (s) | apply → Complete (s) | CPU per device (ms) | idle RSS per device (KiB) | written per device per run (KiB) | control plane RSS (MiB) | broker RSS (MiB) | passes | pass time (s, % of run) | of which store waits (s) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    }

    /// The transport column's words.
    pub fn transport_label(&self) -> &'static str {
        match (self.transport, self.cluster) {
            (Transport::Websocket, _) => "WebSocket",
            (Transport::Nats, false) => "NATS",
            (Transport::Nats, true) => "NATS, 3-node cluster (R3)",
            (Transport::Mqtt, _) => "MQTT",
        }
    }

    pub fn row(&self) -> String {
        format!(
            "| {} | {} | {} | {:.1} | {}{:.1} | {:.2} | {:.1} | {:.1} | {} | {} | {} | {:.2} ({:.1} %) | {} |",
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
            self.idle_rss_kib_per_device,
            self.written_kib_per_device,
            self.control_plane_rss_mib,
            if self.broker_rss_mib.is_empty() {
                "-".to_owned()
            } else {
                self.broker_rss_mib
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(" / ")
            },
            self.passes,
            self.pass_seconds,
            if self.run_seconds > 0.0 {
                100.0 * self.pass_seconds / self.run_seconds
            } else {
                0.0
            },
            self.store_seconds
                .map_or_else(|| "-".to_owned(), |s| format!("{s:.2}")),
        )
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
/// the 2.10 a cluster needs, see ARCHITECTURE.md "Operations").
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
            let password = agent_core::credentials::broker_password(token, device);
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

/// `drover serve` on the embedded store; returns the process, API and agent addresses.
pub(crate) fn start_drover(
    drover: &Path,
    dir: &Path,
    transport: Transport,
    broker_url: Option<&str>,
    nats_replicas: usize,
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
    match (transport, broker_url) {
        (Transport::Nats, Some(url)) => {
            command.args([
                "--nats-url",
                url,
                "--nats-user",
                CP_USER,
                "--nats-password",
                CP_PASSWORD,
                "--nats-replicas",
                &nats_replicas.to_string(),
            ]);
        }
        (Transport::Mqtt, Some(url)) => {
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
                json!({"apiVersion": drover::records::API_VERSION, "kind": "Device",
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

/// Starts `count` simulated agents; returns their shared counters.
pub fn spawn_agents(
    transport: Transport,
    agent_url: &str,
    tokens: &[(DeviceId, String)],
    behaviour: Behaviour,
    shutdown: &CancellationToken,
) -> Result<Arc<Stats>> {
    let stats = Arc::new(Stats::default());
    let behaviour = Arc::new(behaviour);
    let ws_target = match transport {
        Transport::Websocket => Some(crate::ws::Target {
            addr: agent_url
                .trim_start_matches("ws://")
                .parse()
                .context("agent address")?,
        }),
        Transport::Nats | Transport::Mqtt => None,
    };
    for (index, (device, token)) in tokens.iter().enumerate() {
        let agent = SimAgent::new(device.clone(), behaviour.clone(), stats.clone());
        let token = token.clone();
        let shutdown = shutdown.clone();
        match ws_target {
            Some(target) => {
                tokio::spawn(crate::ws::play(target, index, token, agent, shutdown));
            }
            None if transport == Transport::Mqtt => {
                tokio::spawn(crate::mqtt::play(
                    agent_url.to_owned(),
                    token,
                    agent,
                    shutdown,
                ));
            }
            None => {
                // A cluster's nodes, comma-separated: the agents spread over them.
                let nodes: Vec<&str> = agent_url.split(',').collect();
                tokio::spawn(crate::nats::play(
                    nodes[index % nodes.len()].to_owned(),
                    token,
                    agent,
                    shutdown,
                ));
            }
        }
    }
    Ok(stats)
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

/// Runs the benchmark for one fleet size.
pub async fn measure(options: &BenchOptions, devices: usize) -> Result<Figures> {
    let dir = tempfile::Builder::new().prefix("drover-bench-").tempdir()?;
    let secrets = drover::auth::Secrets::load_or_create(&dir.path().join("data"), None)?;
    let ids = device_ids("bench-", devices);
    let tokens: Vec<(DeviceId, String)> = ids
        .iter()
        .map(|d| (d.clone(), secrets.device_token(d)))
        .collect();
    let cluster = options.nats_cluster && options.transport == Transport::Nats;
    let broker: Option<(Vec<Process>, String)> = match options.transport {
        Transport::Nats if cluster => {
            let (nodes, urls) = start_nats_cluster(dir.path(), &tokens)?;
            Some((nodes, urls.join(",")))
        }
        Transport::Nats => {
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
    let (cp, api_base, agent_addr) = start_drover(
        &options.drover,
        dir.path(),
        options.transport,
        broker_url.as_deref(),
        if cluster { 3 } else { 1 },
    )?;
    let pid = cp.0.id();
    let api = Api {
        base: format!("http://{api_base}"),
        token: secrets.operator_token().to_owned(),
        http: http_builder().timeout(Duration::from_secs(300)).build()?,
    };
    register(&api.base, &api.token, &ids).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before_agents = procstat::usage(pid).context("control-plane usage")?;

    let shutdown = CancellationToken::new();
    let agent_url = match &broker_url {
        Some(url) => url.clone(),
        None => format!("ws://{agent_addr}"),
    };
    let behaviour = Behaviour {
        statuses_per_job: options.statuses_per_job,
        ..Behaviour::default()
    };
    let stats = spawn_agents(options.transport, &agent_url, &tokens, behaviour, &shutdown)?;
    let connect_seconds = wait_for(
        "every simulated agent to be registered",
        Duration::from_secs(600),
        async || {
            if stats.connected.load(Ordering::Relaxed) < devices {
                return Ok(false);
            }
            let summary = api.get("/summary").await?;
            Ok(summary["agentsPresent"].as_u64() == Some(devices as u64))
        },
    )
    .await?;
    // Idle: every agent connected, nothing to do.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle = procstat::usage(pid).context("control-plane usage")?;

    let run = format!("bench-{devices}");
    let (manifest, path, work) = match options.deployment_concurrency {
        None => (
            json!({"apiVersion": drover::records::API_VERSION, "kind": "TaskRun",
                   "metadata": {"name": run},
                   "spec": {"allowedGroups": ["bench"], "deadlineSeconds": 3600, "systemUpgradeV1": {}}}),
            format!("/taskruns/{run}"),
            "TaskRun".to_owned(),
        ),
        Some(concurrency) => (
            json!({"apiVersion": drover::records::API_VERSION, "kind": "Deployment",
                   "metadata": {"name": run},
                   "spec": {"targets": {"filter": {"groups": ["bench"]}}, "systemUpgradeV1": {},
                            "maxConcurrency": concurrency, "deadlineSeconds": 3600}}),
            format!("/deployments/{run}"),
            format!("Deployment ({concurrency} at once)"),
        ),
    };
    let engine_before = api.get("/summary").await?["engine"].clone();
    let start: Usage = procstat::usage(pid).context("control-plane usage")?;
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
                stats.snapshot()
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let run_seconds = started.elapsed().as_secs_f64();
    let end = procstat::usage(pid).context("control-plane usage")?;
    let load_after = procstat::load_average().unwrap_or(f64::NAN);
    let engine_after = api.get("/summary").await?["engine"].clone();
    let (passes_key, seconds_key) = if options.deployment_concurrency.is_some() {
        ("deploymentPasses", "deploymentPassSeconds")
    } else {
        ("runPasses", "runPassSeconds")
    };
    let passes = engine_after[passes_key].as_u64().unwrap_or(0)
        - engine_before[passes_key].as_u64().unwrap_or(0);
    let pass_seconds = engine_after[seconds_key].as_f64().unwrap_or(0.0)
        - engine_before[seconds_key].as_f64().unwrap_or(0.0);
    let store_seconds = options.deployment_concurrency.map(|_| {
        engine_after["deploymentStoreSeconds"]
            .as_f64()
            .unwrap_or(0.0)
            - engine_before["deploymentStoreSeconds"]
                .as_f64()
                .unwrap_or(0.0)
    });
    let broker_rss: Vec<u64> = broker
        .iter()
        .flat_map(|(processes, _)| processes)
        .filter_map(|process| procstat::usage(process.0.id()))
        .map(|u| u.rss_bytes / (1024 * 1024))
        .collect();
    shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(cp);
    drop(broker);
    if options.keep {
        let kept = dir.keep();
        eprintln!("kept {}", kept.display());
    }
    let n = devices as f64;
    Ok(Figures {
        devices,
        transport: options.transport,
        connect_seconds,
        run_seconds,
        cpu_ms_per_device: (end.cpu.saturating_sub(start.cpu)).as_secs_f64() * 1000.0 / n,
        idle_rss_kib_per_device: idle.rss_bytes.saturating_sub(before_agents.rss_bytes) as f64
            / 1024.0
            / n,
        written_kib_per_device: end.written_bytes.saturating_sub(start.written_bytes) as f64
            / 1024.0
            / n,
        complete,
        control_plane_rss_mib: idle.rss_bytes / (1024 * 1024),
        broker_rss_mib: broker_rss,
        cluster,
        work,
        passes,
        pass_seconds,
        store_seconds,
        load: (load_before, load_after),
    })
}

/// reqwest's builder, after setting this process's rustls provider (reqwest
/// is built without aws-lc and looks one up).
pub(crate) fn http_builder() -> reqwest::ClientBuilder {
    transport_websocket::tls::install_default_provider();
    reqwest::Client::builder()
}
