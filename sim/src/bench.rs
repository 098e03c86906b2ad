//! The fleet benchmark: for each fleet size, a fresh `drover serve` (and
//! nats-server for NATS) in a temporary directory, N devices registered in
//! one request, N simulated agents connected, then one TaskRun applied and
//! followed to Complete. It prints figures; it asserts nothing about time.
//!
//! Measured on the control plane's process: wall time from apply to
//! Complete, CPU time per device during the run, resident memory per
//! connected idle device, and bytes written to storage per device per run.

use crate::bench_fleet::{AGENTS_PER_PROCESS, AgentProcesses, Fleet, spawn_agents};
use crate::bench_usage::{
    between, cpu_between, mib, say_connect_cpu, say_writes, usages, written_between,
};
use crate::connect::Auth;
use crate::harness::{
    Api, MONITOR_KEY, NatsAuth, PROFILE_KEY, Process, Serve, Transport, http_builder,
    nats_endpoint, register, start_drover, start_mosquitto, start_nats, start_nats_cluster, timed,
    wait_for,
};
use crate::nats_counts::NatsCounts;
use crate::procstat;
use crate::profile::Profiler;
use crate::summary::{Figures, VIEW_QUERIES, VIEWS};
use crate::{Behaviour, device_ids};
use anyhow::{Context, Result, bail};
use drover_model::DeviceId;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use transport_nats::authority::Authority;

/// The name the control plane gives its NATS connections.
const CP_NAME: &str = "drover control plane";

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
    /// Where each run's CPU profiles go (`perf record`, issue 57), if asked.
    pub profile: Option<PathBuf>,
    /// How long a NATS server's own profiler samples from apply.
    pub profile_seconds: u64,
    /// How NATS devices log in: as accepted devices by their user JWTs
    /// (the servers trust Drover's operator, the control plane serves with
    /// `--nats-authority`), or as hand-registered ones by bcrypt passwords.
    pub nats_login: Auth,
    /// Over NATS: the agents' first attempts spread over this (zero: all
    /// at once, as after a server's restart with no spread).
    pub first_attempt_spread: Duration,
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

/// The store commits every replica has made (`/metrics`'
/// `drover_store_commit_seconds_count`).
async fn store_commits(apis: &[Api]) -> Result<u64> {
    let mut commits = 0;
    for api in apis {
        let text = api
            .http
            .get(format!("{}/metrics", api.base))
            .bearer_auth(&api.token)
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?;
        commits += text
            .lines()
            .find_map(|l| l.strip_prefix("drover_store_commit_seconds_count "))
            .and_then(|count| count.trim().parse::<f64>().ok())
            .unwrap_or(0.0) as u64;
    }
    Ok(commits)
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
    let keys = dir.path().join("keys");
    let (authority, broker) = start_broker(options, &keys, &tokens, (cluster, store_on_nats))?;
    let broker_url = broker.as_ref().map(|(_, url)| url.clone());
    let serve = Serve {
        transport: options.transport,
        broker_url: broker_url.as_deref(),
        nats_replicas: if cluster { 3 } else { 1 },
        store_on_nats,
        nats_authority: authority.is_some().then_some(keys.as_path()),
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
    let (before_agents, brokers_before) = (usages(&cps)?, usages(&brokers)?);

    let shutdown = CancellationToken::new();
    let agent_url = match (&broker_url, options.transport) {
        (Some(url), Transport::Nats | Transport::Mqtt) => url.clone(),
        _ => agent_addrs.join(","),
    };
    let login = authority
        .as_ref()
        .map(|authority| (authority, keys.as_path()));
    let mut fleet = start_fleet(options, dir.path(), &agent_url, &tokens, login, &shutdown)?;
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
    say_connect_cpu(&cps, &brokers, (&before_agents, &brokers_before), devices)?;
    // Idle: every agent connected, nothing to do.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle = usages(&cps)?;

    let run = format!("bench-{devices}");
    let (manifest, path, work) = work_manifest(&run, options.deployment_concurrency);
    let engines_before = engine_stats(&apis).await?;
    let nats_dirs = nats_dirs(dir.path(), broker.is_some(), options, cluster);
    let watch = Watch::start(&http, &apis, &cps, &brokers, &nats_dirs, devices, options).await?;
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
    let (nats, commits) = watch.finish(&http, &apis).await?;
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
    let broker_cpu = (!brokers.is_empty())
        .then(|| cpu_between(&brokers_start, &brokers_end).as_secs_f64() * 1000.0 / devices as f64);
    shutdown.cancel();
    drop(fleet);
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop((control_planes, broker));
    if options.keep {
        eprintln!("kept {}", dir.keep().display());
    }
    let n = devices as f64;
    let (cp_written, broker_written) = (
        written_between(&start, &end),
        written_between(&brokers_start, &brokers_end),
    );
    say_writes(cp_written, broker_written, commits, devices);
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
        written_kib_per_device: (cp_written + broker_written) as f64 / 1024.0 / n,
        complete,
        control_plane_rss_mib: mib(&idle),
        broker_rss_mib: mib(&brokers_end),
        cluster,
        nats_jwt: authority.is_some(),
        work,
        passes,
        pass_seconds,
        store_seconds,
        load: (load_before, load_after),
        views_ms,
        nats,
    })
}

/// What the benchmark watches around a run beside the processes' usage:
/// the NATS servers' counters, the store commits, the profiles.
struct Watch {
    monitors: Vec<String>,
    nats_before: Option<NatsCounts>,
    commits_before: u64,
    profiler: Option<Profiler>,
}

impl Watch {
    async fn start(
        http: &reqwest::Client,
        apis: &[Api],
        cps: &[&Process],
        brokers: &[&Process],
        nats_dirs: &[PathBuf],
        devices: usize,
        options: &BenchOptions,
    ) -> Result<Self> {
        let monitors = nats_dirs
            .iter()
            .map(|dir| nats_endpoint(dir, MONITOR_KEY))
            .collect::<Result<Vec<_>>>()?;
        let nats_before = match monitors.is_empty() {
            true => None,
            false => Some(NatsCounts::read(http, &monitors, CP_NAME).await?),
        };
        let profiler = match &options.profile {
            Some(out) => Some(start_profiles(
                http, out, cps, brokers, nats_dirs, devices, options,
            )?),
            None => None,
        };
        Ok(Self {
            monitors,
            nats_before,
            commits_before: store_commits(apis).await?,
            profiler,
        })
    }

    /// What the NATS servers counted during the run and the commits made;
    /// the profiles written (their paths on stderr).
    async fn finish(
        self,
        http: &reqwest::Client,
        apis: &[Api],
    ) -> Result<(Option<NatsCounts>, u64)> {
        let commits = store_commits(apis)
            .await?
            .saturating_sub(self.commits_before);
        if let Some(profiler) = self.profiler {
            for report in profiler.finish().await? {
                eprintln!("profile: {}", report.display());
            }
        }
        let nats = match self.nats_before {
            Some(before) => Some(
                NatsCounts::read(http, &self.monitors, CP_NAME)
                    .await?
                    .since(&before),
            ),
            None => None,
        };
        Ok((nats, commits))
    }
}

/// The directories of the NATS servers the run has (none over MQTT, or
/// over WebSocket on the embedded store).
fn nats_dirs(dir: &Path, brokered: bool, options: &BenchOptions, cluster: bool) -> Vec<PathBuf> {
    let nats = options.transport == Transport::Nats || options.replicas > 1;
    match (brokered && nats, cluster) {
        (false, _) => Vec::new(),
        (true, true) => (0..3).map(|i| dir.join(format!("n{i}"))).collect(),
        (true, false) => vec![dir.to_owned()],
    }
}

/// CPU profiles of every control plane and broker for this run, their
/// files named by the fleet and the time it started: `perf record` until
/// Complete, or a NATS server's own profiler for the first seconds.
fn start_profiles(
    http: &reqwest::Client,
    out: &Path,
    cps: &[&Process],
    brokers: &[&Process],
    nats_dirs: &[PathBuf],
    devices: usize,
    options: &BenchOptions,
) -> Result<Profiler> {
    let label = format!(
        "{devices}-{:?}-{}",
        options.transport,
        jiff::Timestamp::now().strftime("%H%M%S")
    )
    .to_lowercase();
    let mut recorded: Vec<(String, u32)> = cps
        .iter()
        .enumerate()
        .map(|(i, p)| (format!("control-plane-{i}"), p.0.id()))
        .collect();
    if nats_dirs.is_empty() {
        recorded.extend(brokers.iter().map(|p| ("broker".to_owned(), p.0.id())));
    }
    let mut profiler = Profiler::start(out, &label, &recorded)?;
    for (i, dir) in nats_dirs.iter().enumerate() {
        let endpoint = nats_endpoint(dir, PROFILE_KEY)?;
        let name = format!("nats-{i}");
        profiler.go_profile(http, out, &label, &name, &endpoint, options.profile_seconds);
    }
    Ok(profiler)
}

/// A broker's processes (a cluster's nodes) and its URLs, comma-separated.
type Broker = (Vec<Process>, String);

/// The broker the agents (or the replicas' store) need: one nats-server,
/// a three-node cluster, or mosquitto; none for WebSocket on one replica.
/// NATS devices logging in by JWTs: with the authority in `keys` the
/// servers trust.
fn start_broker(
    options: &BenchOptions,
    keys: &Path,
    tokens: &[(DeviceId, String)],
    (cluster, store_on_nats): (bool, bool),
) -> Result<(Option<Authority>, Option<Broker>)> {
    let transport = options.transport;
    let dir = keys.parent().context("the keys' directory")?;
    let authority = (transport == Transport::Nats && options.nats_login == Auth::Jwt)
        .then(|| Authority::load_or_create(keys))
        .transpose()?;
    let nats_auth = match &authority {
        Some(authority) => NatsAuth::Operator(authority),
        None => NatsAuth::Passwords(tokens),
    };
    let broker = match transport {
        Transport::Nats | Transport::Websocket if cluster => {
            let (nodes, urls) = start_nats_cluster(dir, nats_auth)?;
            Some((nodes, urls.join(",")))
        }
        Transport::Nats => {
            let (process, url) = start_nats(dir, nats_auth)?;
            Some((vec![process], url))
        }
        Transport::Websocket if store_on_nats => {
            let (process, url) = start_nats(dir, nats_auth)?;
            Some((vec![process], url))
        }
        Transport::Mqtt => {
            let (process, url) = start_mosquitto(dir, tokens, "")?;
            Some((vec![process], url))
        }
        Transport::Websocket => None,
    };
    Ok((authority, broker))
}

/// The simulated agents: in this process up to [`AGENTS_PER_PROCESS`]
/// (unless told otherwise), else spread over simulator processes.
fn start_fleet(
    options: &BenchOptions,
    dir: &Path,
    agent_url: &str,
    tokens: &[(DeviceId, String)],
    login: Option<(&Authority, &Path)>,
    shutdown: &CancellationToken,
) -> Result<Fleet> {
    let processes = match options.agent_processes {
        0 => tokens.len().div_ceil(AGENTS_PER_PROCESS),
        n => n,
    };
    let behaviour = Behaviour {
        statuses_per_job: options.statuses_per_job,
        first_attempt_spread: options.first_attempt_spread,
        ..Behaviour::default()
    };
    Ok(if processes <= 1 && options.agent_processes == 0 {
        Fleet::Here(spawn_agents(
            options.transport,
            agent_url,
            0,
            tokens,
            login.map(|(authority, _)| authority),
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
            &behaviour,
            login.map(|(_, keys)| keys),
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
