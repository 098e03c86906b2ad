//! The fleet benchmark: for each fleet size, a fresh `drover serve` (and
//! nats-server for NATS) in a temporary directory, N devices registered in
//! one request, N simulated agents connected, then one TaskRun applied and
//! followed to Complete. It prints figures; it asserts nothing about time.
//!
//! Measured on the control plane's process: wall time from apply to
//! Complete, CPU time per device during the run, resident memory per
//! connected idle device, and bytes written to storage per device per run.

use crate::harness::{
    Api, Process, Serve, Transport, http_builder, register, start_drover, start_mosquitto,
    start_nats, start_nats_cluster, timed, wait_for,
};
use crate::procstat::{self, Usage};
use crate::summary::{Figures, VIEW_QUERIES, VIEWS};
use crate::{Behaviour, SimAgent, Stats, device_ids};
use anyhow::{Context, Result, bail};
use drover_model::DeviceId;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

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
                Ok(crate::ws::Target::spread(
                    place
                        .trim_start_matches("ws://")
                        .parse()
                        .with_context(|| format!("agent address {place}"))?,
                ))
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
    let broker = start_broker(
        options.transport,
        dir.path(),
        &tokens,
        cluster,
        store_on_nats,
    )?;
    let broker_url = broker.as_ref().map(|(_, url)| url.clone());
    let serve = Serve {
        transport: options.transport,
        broker_url: broker_url.as_deref(),
        nats_replicas: if cluster { 3 } else { 1 },
        store_on_nats,
        nats_authority: None,
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
    let mut fleet = start_fleet(options, dir.path(), &agent_url, &tokens, &shutdown)?;
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
    let (manifest, path, work) = work_manifest(&run, options.deployment_concurrency);
    let engines_before = engine_stats(&apis).await?;
    let start = usages(&cps)?;
    let brokers_start = usages(&brokers)?;
    let load_before = procstat::load_average().unwrap_or(f64::NAN);
    let started = Instant::now();
    api.post("/apply", &manifest).await?;
    let complete = wait_complete(api, &path, &work, options.run_timeout, started, &fleet).await?;
    let run_seconds = started.elapsed().as_secs_f64();
    let end = usages(&cps)?;
    let brokers_end = usages(&brokers)?;
    let load_after = procstat::load_average().unwrap_or(f64::NAN);
    let mut views_ms = Vec::new();
    for (name, path) in VIEWS {
        views_ms.push((name, timed(api, path, VIEW_QUERIES).await?));
    }
    // Every replica's engine: whichever held the lease made the passes.
    let engines_after = engine_stats(&apis).await?;
    let (passes, pass_seconds, store_seconds) = pass_figures(
        &engines_before,
        &engines_after,
        options.deployment_concurrency.is_some(),
    );
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

/// The broker the agents (or the replicas' store) need: one nats-server,
/// a three-node cluster, or mosquitto; none for WebSocket on one replica.
fn start_broker(
    transport: Transport,
    dir: &Path,
    tokens: &[(DeviceId, String)],
    cluster: bool,
    store_on_nats: bool,
) -> Result<Option<(Vec<Process>, String)>> {
    Ok(match transport {
        Transport::Nats | Transport::Websocket if cluster => {
            let (nodes, urls) = start_nats_cluster(dir, tokens)?;
            Some((nodes, urls.join(",")))
        }
        Transport::Nats => {
            let (process, url) = start_nats(dir, tokens)?;
            Some((vec![process], url))
        }
        Transport::Websocket if store_on_nats => {
            let (process, url) = start_nats(dir, tokens)?;
            Some((vec![process], url))
        }
        Transport::Mqtt => {
            let (process, url) = start_mosquitto(dir, tokens, "")?;
            Some((vec![process], url))
        }
        Transport::Websocket => None,
    })
}

/// The simulated agents: in this process up to [`AGENTS_PER_PROCESS`]
/// (unless told otherwise), else spread over simulator processes.
fn start_fleet(
    options: &BenchOptions,
    dir: &Path,
    agent_url: &str,
    tokens: &[(DeviceId, String)],
    shutdown: &CancellationToken,
) -> Result<Fleet> {
    let processes = match options.agent_processes {
        0 => tokens.len().div_ceil(AGENTS_PER_PROCESS),
        n => n,
    };
    Ok(if processes <= 1 && options.agent_processes == 0 {
        let behaviour = Behaviour {
            statuses_per_job: options.statuses_per_job,
            ..Behaviour::default()
        };
        Fleet::Here(spawn_agents(
            options.transport,
            agent_url,
            0,
            tokens,
            behaviour,
            shutdown,
        )?)
    } else {
        Fleet::Elsewhere(AgentProcesses::start(
            dir,
            options.transport,
            agent_url,
            tokens.len(),
            processes,
            options.statuses_per_job,
        )?)
    })
}

/// What the benchmark applies over the fleet: a TaskRun, or a Deployment
/// with this concurrency; with the path that shows it and its name in the
/// table.
fn work_manifest(run: &str, deployment_concurrency: Option<u32>) -> (Value, String, String) {
    match deployment_concurrency {
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
    }
}

/// Waits until the work is Complete (true), Failed, or past `timeout`.
async fn wait_complete(
    api: &Api,
    path: &str,
    work: &str,
    timeout: Duration,
    started: Instant,
    fleet: &Fleet,
) -> Result<bool> {
    let mut complete = false;
    loop {
        let status = api.get(path).await?;
        let phase = status["status"]["phase"].as_str().unwrap_or("");
        if phase == "Complete" {
            complete = true;
            break;
        }
        if phase == "Failed" {
            eprintln!("{work} failed: {}", status["status"]);
            break;
        }
        if started.elapsed() > timeout {
            eprintln!(
                "{work} not complete after {:?}: {}; agents: {}",
                timeout,
                status["status"],
                fleet.snapshot()
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(complete)
}

/// The engines' passes over the work, their seconds, and (for a
/// Deployment) the seconds they spent in the store: grown across every
/// replica, since whichever held the lease made the passes.
fn pass_figures(before: &[Value], after: &[Value], deployment: bool) -> (u64, f64, Option<f64>) {
    let (passes_key, seconds_key) = if deployment {
        ("deploymentPasses", "deploymentPassSeconds")
    } else {
        ("runPasses", "runPassSeconds")
    };
    let grown = |key: &str| -> f64 {
        before
            .iter()
            .zip(after)
            .map(|(b, a)| a[key].as_f64().unwrap_or(0.0) - b[key].as_f64().unwrap_or(0.0))
            .sum()
    };
    let passes = grown(passes_key).round() as u64;
    let pass_seconds = grown(seconds_key);
    let store_seconds = deployment.then(|| grown("deploymentStoreSeconds"));
    (passes, pass_seconds, store_seconds)
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
