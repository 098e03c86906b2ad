//! The agent's footprint, measured on the real `drover-agent` binary beside
//! Debian's `mender-client` daemon: memory and threads after a connected
//! idle period, bytes written to storage while idle and per job, peak memory
//! during jobs, and binary sizes. For each transport a fresh `drover serve`
//! (and its broker) runs in a temporary directory with one device; the agent
//! runs in simulate mode (`apt-get -s`, changes nothing on this machine).
//! It prints figures; it asserts nothing.

use crate::acceptance::{Acceptance, accept_latency};
use crate::harness::{self, Api, Process, Transport};
use crate::procstat::{self, Memory};
use anyhow::{Context, Result, bail};
use drover_model::DeviceId;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct FootprintOptions {
    /// The agent builds to measure, each with its label (the store it was
    /// built with, say); the first is measured over every transport.
    pub agents: Vec<(String, PathBuf)>,
    pub drover: PathBuf,
    pub transports: Vec<Transport>,
    /// How long the agent stays connected and idle before it is measured.
    pub idle: Duration,
    /// Jobs run one after another to measure the writes per job.
    pub jobs: usize,
    /// Deployments of one quick job each (inventory refresh), released one
    /// after another, to measure intent → accepted at the control plane.
    pub latency_jobs: usize,
}

/// One transport's figures for the agent.
#[derive(Debug, Clone)]
pub struct AgentFigures {
    pub label: String,
    pub transport: Transport,
    pub idle: Memory,
    /// Bytes written while idle, scaled to an hour.
    pub idle_written_per_hour: u64,
    pub written_per_job: u64,
    /// The agent's own threads only: without the apt calls it reaps.
    pub own_written_per_job: u64,
    pub seconds_per_job: f64,
    /// The same for a patch assessment (simulate mode: apt reads the
    /// host's lists, its simulation runs for real).
    pub written_per_assessment: u64,
    pub own_written_per_assessment: u64,
    pub seconds_per_assessment: f64,
    /// Intent → accepted at the control plane, in ms.
    pub accept_ms: Option<Acceptance>,
    /// Peak resident set over the idle period and the upgrade jobs.
    pub peak_rss_kib: u64,
    /// Peak resident set once the acceptance jobs (inventory refreshes,
    /// whose statuses carry the package list) ran too.
    pub inventory_peak_rss_kib: Option<u64>,
}

/// Mender's daemon, idle against an unreachable server.
#[derive(Debug, Clone)]
pub struct MenderFigures {
    pub version: String,
    pub idle: Memory,
    pub idle_written_per_hour: u64,
    pub binary_bytes: u64,
}

fn kib(bytes: u64) -> f64 {
    bytes as f64 / 1024.0
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn written(pid: u32) -> Result<u64> {
    Ok(procstat::usage(pid)
        .context("the process ended early")?
        .written_bytes)
}

fn own_written(pid: u32) -> Result<u64> {
    procstat::threads_written(pid).context("the process ended early")
}

/// Waits `idle`, then reads memory and the bytes written meanwhile (per hour).
async fn idle_figures(pid: u32, idle: Duration) -> Result<(Memory, u64)> {
    let before = written(pid)?;
    tokio::time::sleep(idle).await;
    let after = written(pid)?;
    let memory = procstat::memory(pid).context("the process ended early")?;
    let per_hour = (after.saturating_sub(before) as f64 * 3600.0 / idle.as_secs_f64()) as u64;
    Ok((memory, per_hour))
}

fn agent_config(
    store: &str,
    dir: &Path,
    device: &DeviceId,
    token: &str,
    key: &str,
    transport: Transport,
    url: &str,
) -> String {
    let link = match transport {
        Transport::Websocket => format!("kind = \"websocket\"\nserver_url = \"ws://{url}\""),
        Transport::Nats => format!("kind = \"nats\"\nurl = \"{url}\""),
        Transport::Mqtt => format!("kind = \"mqtt\"\nurl = \"{url}\""),
    };
    format!(
        "device_id = \"{device}\"\nstore = \"{store}\"\nstate_dir = \"{}\"\nstatus_socket = \"{}\"\n\
         intent_public_keys = [\"{key}\"]\n[transport]\n{link}\ntoken = \"{token}\"\n\
         [updater]\nmode = \"simulate\"\n",
        dir.join("agent-state").display(),
        dir.join("agent.sock").display(),
    )
}

/// Waits until the agent runs nothing and has nothing queued (asked
/// through its status socket, as `drover-agent status --json` does).
async fn agent_idle(agent: &Path, socket: &Path) -> Result<()> {
    harness::wait_for(
        "the agent to be idle",
        Duration::from_secs(300),
        async || {
            let out = Command::new(agent)
                .args(["status", "--json", "--socket"])
                .arg(socket)
                .stdin(Stdio::null())
                .output()?;
            let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            Ok(info["currentJob"].is_null()
                && info["queuedJobs"] == 0
                && info["outboxPending"] == 0)
        },
    )
    .await?;
    Ok(())
}

/// One agent build over one transport: idle, then `jobs` upgrade jobs in
/// turn (each with the assessment the agent makes after it), then `jobs`
/// assessments alone, then `latency_jobs` quick ones for the acceptance
/// latency.
pub async fn measure_agent(
    options: &FootprintOptions,
    (label, agent_path): &(String, PathBuf),
    transport: Transport,
    latency_jobs: usize,
) -> Result<AgentFigures> {
    let dir = tempfile::Builder::new()
        .prefix("drover-footprint-")
        .tempdir()?;
    let data = dir.path().join("data");
    let secrets = drover_server::auth::Secrets::load_or_create(&data, None)?;
    let key = drover_server::auth::IntentSigner::load_or_create(&data)?.public_key();
    let device = DeviceId::new("footprint-1")?;
    let token = secrets.device_token(&device);
    let tokens = vec![(device.clone(), token.clone())];
    let broker = match transport {
        Transport::Nats => Some(harness::start_nats(
            dir.path(),
            harness::NatsAuth::Passwords(&tokens),
        )?),
        Transport::Mqtt => Some(harness::start_mosquitto(dir.path(), &tokens, "")?),
        Transport::Websocket => None,
    };
    let broker_url = broker.as_ref().map(|(_, url)| url.clone());
    let (_cp, api_base, agent_addr) = harness::start_drover(
        &options.drover,
        dir.path(),
        harness::Serve {
            transport,
            broker_url: broker_url.as_deref(),
            nats_replicas: 1,
            store_on_nats: false,
            nats_authority: None,
        },
    )?;
    let api = Api {
        base: format!("http://{api_base}"),
        token: secrets.operator_token().to_owned(),
        http: harness::http_builder()
            .timeout(Duration::from_secs(60))
            .build()?,
    };
    harness::register(&api.base, &api.token, std::slice::from_ref(&device)).await?;
    let url = broker_url.unwrap_or(agent_addr);
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        agent_config(label, dir.path(), &device, &token, &key, transport, &url),
    )?;
    let log = std::fs::File::create(dir.path().join("agent.log"))?;
    let agent = Process(
        Command::new(agent_path)
            .arg("--config")
            .arg(&config)
            .arg("run")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", agent_path.display()))?,
    );
    let pid = agent.0.id();
    harness::wait_for(
        "the agent to connect",
        Duration::from_secs(60),
        async || {
            let devices = api.get("/devices").await?;
            Ok(devices.as_array().into_iter().flatten().any(|d| {
                d["id"] == device.as_str()
                    && d["agentPresent"] == true
                    && d["lastHeartbeat"].is_string()
            }))
        },
    )
    .await
    .with_context(|| format!("see {}", dir.path().join("agent.log").display()))?;
    // Let start-up writes (the store's creation, the first heartbeat) settle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (idle, idle_written_per_hour) = idle_figures(pid, options.idle).await?;

    let before = written(pid)?;
    let own_before = own_written(pid)?;
    let started = Instant::now();
    upgrade_jobs(&api, agent_path, dir.path(), options.jobs).await?;
    let seconds_per_job = started.elapsed().as_secs_f64() / options.jobs.max(1) as f64;
    let written_per_job = written(pid)?.saturating_sub(before) / options.jobs.max(1) as u64;
    let own_written_per_job =
        own_written(pid)?.saturating_sub(own_before) / options.jobs.max(1) as u64;
    let peak_rss_kib = procstat::memory(pid)
        .context("the agent ended")?
        .peak_rss_kib;
    let (seconds_per_assessment, written_per_assessment, own_written_per_assessment) =
        assessments(agent_path, dir.path(), pid, options.jobs).await?;
    let accept_ms = accept_latency(&api, latency_jobs).await?;
    // The acceptance jobs are inventory refreshes: their statuses carry the
    // package list, the largest thing the agent handles.
    let inventory_peak_rss_kib = match accept_ms {
        Some(_) => Some(
            procstat::memory(pid)
                .context("the agent ended")?
                .peak_rss_kib,
        ),
        None => None,
    };
    drop(agent);
    drop(broker);
    Ok(AgentFigures {
        label: label.clone(),
        transport,
        idle,
        idle_written_per_hour,
        written_per_job,
        own_written_per_job,
        seconds_per_job,
        written_per_assessment,
        own_written_per_assessment,
        seconds_per_assessment,
        accept_ms,
        peak_rss_kib,
        inventory_peak_rss_kib,
    })
}

/// `jobs` full upgrades, one TaskRun each, each awaited to Complete and to
/// the agent's idleness after it (the assessment that follows an upgrade).
async fn upgrade_jobs(api: &Api, agent_path: &Path, dir: &Path, jobs: usize) -> Result<()> {
    for n in 0..jobs {
        let name = format!("footprint-{n}");
        api.post(
            "/apply",
            &json!({"apiVersion": drover_rules::records::API_VERSION, "kind": "TaskRun",
                    "metadata": {"name": name},
                    "spec": {"allowedGroups": ["bench"], "deadlineSeconds": 600, "systemUpgradeV1": {}}}),
        )
        .await?;
        harness::wait_for("a job to complete", Duration::from_secs(300), async || {
            let run = api.get(&format!("/taskruns/{name}")).await?;
            match run["status"]["phase"].as_str() {
                Some("Complete") => Ok(true),
                Some("Failed" | "DeadlineExceeded") => bail!("{name} ended: {}", run["status"]),
                _ => Ok(false),
            }
        })
        .await?;
        // The assessment the agent makes after every upgrade is part of
        // the job's cost on the device.
        agent_idle(agent_path, &dir.join("agent.sock")).await?;
    }
    Ok(())
}

/// `jobs` assessments alone: the seconds each took, and the bytes written
/// per assessment by the agent and its children, and by the agent alone.
async fn assessments(
    agent_path: &Path,
    dir: &Path,
    pid: u32,
    jobs: usize,
) -> Result<(f64, u64, u64)> {
    // Assessments alone (issue 31), through the agent's status socket as
    // `drover-agent assess` sends them.
    let assess = || -> Result<()> {
        let out = Command::new(agent_path)
            .arg("assess")
            .arg("--socket")
            .arg(dir.join("agent.sock"))
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            bail!(
                "drover-agent assess failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    };
    let before = written(pid)?;
    let own_before = own_written(pid)?;
    let started = Instant::now();
    for _ in 0..jobs {
        assess()?;
    }
    let seconds_per_assessment = started.elapsed().as_secs_f64() / jobs.max(1) as f64;
    agent_idle(agent_path, &dir.join("agent.sock")).await?;
    let written_per_assessment = written(pid)?.saturating_sub(before) / jobs.max(1) as u64;
    let own_written_per_assessment =
        own_written(pid)?.saturating_sub(own_before) / jobs.max(1) as u64;
    Ok((
        seconds_per_assessment,
        written_per_assessment,
        own_written_per_assessment,
    ))
}

pub const MENDER: &str = "/usr/bin/mender";

/// Debian's mender-client daemon, pointed at a loopback port nothing
/// listens on, measured like the agent. None when it is not installed.
pub async fn measure_mender(idle: Duration) -> Result<Option<MenderFigures>> {
    if !Path::new(MENDER).exists() {
        return Ok(None);
    }
    let version = Command::new(MENDER)
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_owned()
        })
        .unwrap_or_default();
    let dir = tempfile::Builder::new()
        .prefix("drover-mender-")
        .tempdir()?;
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data)?;
    std::fs::write(data.join("device_type"), "device_type=bench\n")?;
    let config = dir.path().join("mender.conf");
    std::fs::write(
        &config,
        json!({"ServerURL": format!("https://127.0.0.1:{}", harness::free_port()?),
               "RootfsPartA": "/dev/null", "RootfsPartB": "/dev/null",
               "UpdatePollIntervalSeconds": 1800, "InventoryPollIntervalSeconds": 28800,
               "RetryPollIntervalSeconds": 300})
        .to_string(),
    )?;
    let log = std::fs::File::create(dir.path().join("mender.log"))?;
    let mender = Process(
        Command::new(MENDER)
            .arg("--config")
            .arg(&config)
            .arg("--data")
            .arg(&data)
            .arg("daemon")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("cannot start mender")?,
    );
    let pid = mender.0.id();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (memory, per_hour) = idle_figures(pid, idle).await.with_context(|| {
        format!(
            "mender stopped; see {}",
            dir.path().join("mender.log").display()
        )
    })?;
    Ok(Some(MenderFigures {
        version,
        idle: memory,
        idle_written_per_hour: per_hour,
        binary_bytes: std::fs::metadata(MENDER)?.len(),
    }))
}

/// The size of `binary` once stripped (a stripped copy; the original stays).
pub fn stripped_size(binary: &Path, strip: &str) -> Result<u64> {
    let dir = tempfile::tempdir()?;
    let copy = dir.path().join("binary");
    std::fs::copy(binary, &copy)?;
    let status = Command::new(strip)
        .arg("--strip-unneeded")
        .arg(&copy)
        .status()
        .with_context(|| format!("cannot run {strip}"))?;
    if !status.success() {
        bail!("{strip} failed on {}", binary.display());
    }
    Ok(std::fs::metadata(&copy)?.len())
}

/// Prints the table: each agent row beside Mender's idle figures.
pub fn print(agents: &[AgentFigures], mender: Option<&MenderFigures>, sizes: &[(String, u64)]) {
    println!(
        "| figure | drover-agent | {} | goal |",
        mender.map_or("mender-client (not installed)".to_owned(), |m| format!(
            "Mender {}",
            m.version
        ))
    );
    println!("|---|---|---|---|");
    for a in agents {
        let t = format!("{:?}, {}", a.transport, a.label).to_lowercase();
        let ratio = |ours: u64, theirs: u64| {
            if ours == 0 {
                String::new()
            } else {
                format!(" ({:.1}× less)", theirs as f64 / ours as f64)
            }
        };
        println!(
            "| idle RSS / PSS after the idle period, {t} | {:.1} / {:.1} MiB, {} threads | {} | ≤ 4 MiB RSS |",
            mib(a.idle.rss_kib),
            mib(a.idle.pss_kib),
            a.idle.threads,
            mender.map_or("–".to_owned(), |m| format!(
                "{:.1} / {:.1} MiB, {} threads{}",
                mib(m.idle.rss_kib),
                mib(m.idle.pss_kib),
                m.idle.threads,
                ratio(a.idle.rss_kib, m.idle.rss_kib)
            )),
        );
        println!(
            "| idle RSS by kind, {t}: the agent binary's pages / shared libraries / private | {:.1} / {:.1} / {:.1} MiB | {} | |",
            mib(a.idle.binary_kib),
            mib(a.idle.other_files_kib),
            mib(a.idle.private_kib),
            mender.map_or("–".to_owned(), |m| format!(
                "{:.1} / {:.1} / {:.1} MiB",
                mib(m.idle.binary_kib),
                mib(m.idle.other_files_kib),
                mib(m.idle.private_kib)
            )),
        );
        println!(
            "| peak RSS during upgrade jobs, {t} | {:.1} MiB | – | |",
            mib(a.peak_rss_kib)
        );
        if let Some(peak) = a.inventory_peak_rss_kib {
            println!(
                "| peak RSS once inventory refreshes ran too, {t} | {:.1} MiB | – | |",
                mib(peak)
            );
        }
        println!(
            "| written while idle, {t} | {:.1} KiB per hour, {:.1} KiB per day | {} | ≤ 64 KiB per day |",
            kib(a.idle_written_per_hour),
            kib(a.idle_written_per_hour * 24),
            mender.map_or("–".to_owned(), |m| format!(
                "{:.1} KiB per hour",
                kib(m.idle_written_per_hour)
            )),
        );
        println!(
            "| written per job (system upgrade, simulate, with the assessment that follows it), {t}: the agent's threads / with the apt calls it reaps | {:.1} / {:.1} KiB ({:.1} s a job) | – | ≤ 64 KiB |",
            kib(a.own_written_per_job),
            kib(a.written_per_job),
            a.seconds_per_job
        );
        println!(
            "| written per patch assessment (simulate), {t}: the agent's threads / with the apt calls it reaps | {:.1} / {:.1} KiB ({:.1} s each) | – | |",
            kib(a.own_written_per_assessment),
            kib(a.written_per_assessment),
            a.seconds_per_assessment
        );
        if let Some(Acceptance {
            jobs,
            total,
            out,
            back,
        }) = a.accept_ms
        {
            println!(
                "| intent → accepted at the control plane, {t}, {jobs} jobs | p50 {:.1} ms, p99 {:.1} ms | – | p99 ≤ 20 ms |",
                total.0, total.1
            );
            println!(
                "| of it: made → the agent's acceptance / → accepted at the control plane, {t} | p50 {:.1} / {:.1} ms, p99 {:.1} / {:.1} ms | – | |",
                out.0, back.0, out.1, back.1
            );
        }
    }
    for (what, bytes) in sizes {
        println!(
            "| stripped binary, {what} | {:.2} MiB ({bytes} bytes) | {} | ≤ 4 MiB |",
            *bytes as f64 / (1024.0 * 1024.0),
            mender.map_or("–".to_owned(), |m| format!(
                "{:.2} MiB",
                m.binary_bytes as f64 / (1024.0 * 1024.0)
            )),
        );
    }
}
