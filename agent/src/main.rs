//! drover-agent: the device daemon (`run`) and its local tools (`status`,
//! `jobs`). Only this binary reads config files; the libraries take values.

use agent_core::out;

mod config;
mod display;
mod link;
mod logs;
mod wiring;

use agent_core::executor::Agent;
use agent_core::status_socket::{self, Request, Response};
use agent_core::store::RedbStore;
use anyhow::{Context, Result, bail};
use clap::Parser;
use config::{Config, DEFAULT_SOCKET, Transport};
use drover_agent::cli::{Cli, Command};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// An ordinary error is one line with its whole cause chain (systemd's
/// journal shows it as the unit's last line), never a `Caused by:` list.
fn main() {
    if let Err(e) = run_cli() {
        eprintln!("drover-agent: {e:#}");
        let code = if e.downcast_ref::<ConfigProblem>().is_some() {
            EXIT_CONFIG
        } else {
            1
        };
        std::process::exit(code);
    }
}

fn run_cli() -> Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    match cli.command {
        Command::Run => {
            init_logging();
            runtime.block_on(run(&cli.config))
        }
        Command::VerifyStore { path } => {
            agent_core::dbfile::verify(&path).map_err(|e| anyhow::anyhow!(e))?;
            Ok(())
        }
        Command::ResetStore { yes } => {
            let config = Config::load(&cli.config)?;
            let path = config.state_dir.join("agent.redb");
            // Refused at once while an agent holds it, before asking.
            drop(agent_core::dbfile::hold(&path)?);
            agent_core::confirm::confirm(
                &format!(
                    "Move {} aside? The agent then starts with an empty database: it forgets \
                     every job it ran and every status not yet sent, with the records that \
                     stop a job from running twice.",
                    path.display()
                ),
                yes,
            )
            .map_err(|e| anyhow::anyhow!(e))?;
            let aside = agent_core::dbfile::move_aside(&path)?;
            out!("moved {} to {}", path.display(), aside.display());
            Ok(())
        }
        Command::Check { connect } => {
            let config = Config::load(&cli.config)?;
            config.transport.read_credentials()?;
            config.keep_ca()?;
            config.transport.check()?;
            let store = config.state_dir.join("agent.redb");
            // A running agent holds its database (and answers on its socket):
            // the database is in use, not damaged, and is left alone.
            let running = runtime
                .block_on(status_socket::request(
                    &config.status_socket,
                    &Request::Status,
                ))
                .ok();
            let running = match running {
                Some(Response::Status(info)) => Some(info),
                Some(_) => bail!(
                    "{} answered a status request with something else",
                    config.status_socket.display()
                ),
                None => None,
            };
            if store.exists() && running.is_none() {
                let checker = agent_core::dbfile::Checker::this_binary("drover-agent reset-store");
                RedbStore::open_checked(&store, &checker)?;
            }
            if running.is_some() {
                out!("the agent is running (its database is in use, so it is not checked now)");
            }
            let transport = match &config.transport {
                Transport::Websocket { server_url, .. } => format!("websocket to {server_url}"),
                Transport::Nats { url, .. } => format!("nats at {url}"),
                Transport::Mqtt { url, .. } => format!("mqtt at {url}"),
            };
            out!(
                "{}: device {}, {transport}, updater mode {}",
                cli.config.display(),
                config.device_id,
                config.updater.mode.name()
            );
            if connect {
                match running {
                    // The running agent holds the device's one connection: a
                    // second under the same identity would push it off (an
                    // MQTT broker makes a client's id its user name, the
                    // control plane keeps one session per device), so ask it.
                    Some(info) => out!("{}", link::running_link(&info.link)?),
                    None => {
                        let device_id = drover_model::DeviceId::new(config.device_id.clone())?;
                        drover_net::tls::install_default_provider();
                        out!("{}", runtime.block_on(link::probe(&config, &device_id))?);
                    }
                }
            }
            Ok(())
        }
        Command::Status { json, socket } => {
            let socket = socket_path(socket, &cli.config);
            match runtime.block_on(status_socket::request(&socket, &Request::Status))? {
                Response::Status(info) if json => {
                    out!("{}", serde_json::to_string_pretty(&info)?)
                }
                Response::Status(info) => display::print_status(&info),
                Response::Error(e) => bail!("the agent answered with an error: {e}"),
                Response::Jobs(_) | Response::Job(_) => {
                    bail!("the agent answered a different question")
                }
            }
            Ok(())
        }
        Command::Jobs {
            json,
            limit,
            socket,
        } => {
            let socket = socket_path(socket, &cli.config);
            let request = Request::Jobs { limit: Some(limit) };
            match runtime.block_on(status_socket::request(&socket, &request))? {
                Response::Jobs(jobs) if json => {
                    out!("{}", serde_json::to_string_pretty(&jobs)?)
                }
                Response::Jobs(jobs) => display::print_jobs(&jobs),
                Response::Error(e) => bail!("the agent answered with an error: {e}"),
                Response::Status(_) | Response::Job(_) => {
                    bail!("the agent answered a different question")
                }
            }
            Ok(())
        }
        Command::Upgrade { resume, socket } => {
            let socket = socket_path(socket, &cli.config);
            let request = match resume {
                Some(id) => Request::Resume {
                    job_id: id.parse().map_err(|e| anyhow::anyhow!("{e}"))?,
                },
                None => Request::Upgrade,
            };
            let succeeded = runtime.block_on(local_upgrade(&socket, request))?;
            if !succeeded {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Logs { job, tail } => logs::run(&cli.config, job.as_deref(), tail),
        Command::Assess { socket } => {
            let socket = socket_path(socket, &cli.config);
            let succeeded = runtime.block_on(local_upgrade(&socket, Request::Assess))?;
            if !succeeded {
                std::process::exit(1);
            }
            Ok(())
        }
    }
}

/// Asks the running agent for a local upgrade (or a resume) and prints each
/// step as it finishes. Local jobs go through the agent's queue, so they never
/// run beside a fleet job (A2). Returns whether the job succeeded.
async fn local_upgrade(socket: &Path, request: Request) -> Result<bool> {
    let job = match status_socket::request(socket, &request).await? {
        Response::Job(job) => job,
        Response::Error(e) => bail!("the agent refused: {e}"),
        Response::Status(_) | Response::Jobs(_) => bail!("the agent answered a different question"),
    };
    let job_id = job.job_id;
    out!("job {job_id}: {:?}", job.state);
    let mut printed = vec![false; job.steps.len()];
    loop {
        let job = match status_socket::request(socket, &Request::Job { job_id }).await? {
            Response::Job(job) => job,
            Response::Error(e) => bail!("the agent answered with an error: {e}"),
            Response::Status(_) | Response::Jobs(_) => {
                bail!("the agent answered a different question")
            }
        };
        printed.resize(job.steps.len(), false);
        for (done, step) in printed.iter_mut().zip(&job.steps) {
            let finished = matches!(
                step.state,
                drover_model::StepState::Done | drover_model::StepState::Failed
            );
            if finished && !*done {
                *done = true;
                out!(
                    "  {:<14} {:?} after {:.1} s, {} tries{}",
                    step.name,
                    step.state,
                    step.seconds.unwrap_or(0.0),
                    step.tries,
                    step.error
                        .as_ref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                );
            }
        }
        match job.state {
            state if state.is_terminal() => {
                out!("job {job_id}: {state:?}");
                if let Some(drover_model::JobOutput::Assessment(_)) = &job.output {
                    // What the assessment found, as `drover-agent jobs` shows it.
                    let text = agent_core::report::format_job(&job);
                    for line in text.lines().skip_while(|l| !l.contains("assessment:")) {
                        out!("{}", line.trim_start());
                    }
                }
                if let Some(error) = &job.error {
                    out!("error: {error}");
                    if state == drover_model::JobState::Failed && job.kind == "systemUpgradeV1" {
                        out!("continue it with: drover-agent upgrade --resume {job_id}");
                    }
                }
                return Ok(state == drover_model::JobState::Succeeded);
            }
            drover_model::JobState::AwaitingReboot => {
                out!("job {job_id}: the device is rebooting; the job is confirmed once it is back");
                return Ok(true);
            }
            _ => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
}

/// Queues the agent's own patch assessments when they are due
/// (`agent_core::assessments`): looks at the kept jobs as soon as a job
/// ends, else every minute (more often for a short period), reading the
/// store and writing nothing until one is due.
async fn assess_on_schedule(agent: Arc<Agent>, every_minutes: u32, shutdown: CancellationToken) {
    if every_minutes == 0 {
        info!("the agent's own patch assessments are off ([assessment] every_minutes = 0)");
        return;
    }
    let every = jiff::SignedDuration::from_mins(i64::from(every_minutes));
    let schedule = agent_core::assessments::Schedule::for_device(agent.device_id(), every);
    let started = agent_core::clock::now();
    let look_every = Duration::from_secs((u64::from(every_minutes) * 6).clamp(1, 60));
    loop {
        let jobs = agent.recent_jobs(KEPT_JOBS_LOOKED_AT).unwrap_or_default();
        if let Some(due) = agent_core::assessments::next_due(&jobs, started, &schedule)
            && due <= agent_core::clock::now()
        {
            match agent.admit_local(drover_model::JobKind::patch_assessment()) {
                Ok(reply) => info!(job_id = %reply.status.job_id, "patch assessment queued"),
                Err(e) => tracing::warn!(error = %e, "cannot queue a patch assessment"),
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(look_every) => {}
            // A job just ended: an upgrade makes an assessment due at once.
            _ = agent.job_ended().notified() => {}
        }
    }
}

/// How many of the newest kept jobs the assessment schedule reads.
const KEPT_JOBS_LOOKED_AT: usize = 50;

fn init_logging() {
    agent_core::logging::init("info");
}

/// The socket named on the command line, else the config's, else the default.
fn socket_path(explicit: Option<PathBuf>, config: &Path) -> PathBuf {
    explicit
        .or_else(|| Config::load(config).ok().map(|c| c.status_socket))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET))
}

/// Where the .deb records its own Debian version (cross/package-deb.sh).
const PACKAGE_VERSION_FILE: &str = "/usr/share/drover-agent/version";

/// The version this agent reports: the Debian version of the package it was
/// installed from (so an operator sees which revision runs, and a job that
/// upgraded the agent shows the new one once it restarted), else the crate's.
fn agent_version(package_file: &Path) -> String {
    let fallback = env!("CARGO_PKG_VERSION");
    let Ok(text) = std::fs::read_to_string(package_file) else {
        return fallback.to_owned();
    };
    let version = text.trim();
    let debian = |c: char| c.is_ascii_alphanumeric() || ".+-~:".contains(c);
    if version.is_empty() || version.len() > 64 || !version.chars().all(debian) {
        warn!(file = %package_file.display(), "ignoring a malformed package version file");
        return fallback.to_owned();
    }
    version.to_owned()
}

/// EX_CONFIG: the config is missing or wrong. The unit does not restart the
/// agent for it (RestartPreventExitStatus=78): nothing changes until the
/// operator fixes the file and restarts the agent.
const EXIT_CONFIG: i32 = 78;

/// A config the agent cannot run with (it exits with [`EXIT_CONFIG`]).
#[derive(Debug)]
struct ConfigProblem {
    path: PathBuf,
    error: anyhow::Error,
}

impl std::fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {:#}; fix it, then `systemctl restart drover-agent`",
            self.path.display(),
            self.error
        )
    }
}

impl std::error::Error for ConfigProblem {}

/// The config, checked as `check` checks it, or a [`ConfigProblem`].
fn configured(config_path: &Path) -> Result<Config> {
    let checked = || -> Result<Config> {
        let config = Config::load(config_path)?;
        drover_model::DeviceId::new(config.device_id.clone())?;
        config.transport.read_credentials()?;
        config.keep_ca()?;
        config.transport.check()?;
        Ok(config)
    };
    checked().map_err(|error| {
        anyhow::Error::new(ConfigProblem {
            path: config_path.to_owned(),
            error,
        })
    })
}

async fn run(config_path: &Path) -> Result<()> {
    let config = configured(config_path)?;
    let device_id = drover_model::DeviceId::new(config.device_id.clone())?;
    #[cfg(feature = "testing")]
    let boot_id_path = config.boot_id_path.clone();
    #[cfg(not(feature = "testing"))]
    let boot_id_path = std::path::PathBuf::from(agent_core::boot::DEFAULT_BOOT_ID_PATH);
    let boot_id = agent_core::boot::read_boot_id(&boot_id_path)?;
    config.create_state_dir()?;
    let device_key = std::sync::Arc::new(agent_core::identity::DeviceKey::load_or_create(
        &config.state_dir,
    )?);
    let public_key = device_key.public_key_hex();
    let agent = wiring::agent(&config, &device_id, &boot_id, device_key.clone())?;
    info!(device = %device_id, boot_id = %boot_id, %public_key, "drover-agent starting");

    let shutdown = CancellationToken::new();
    if let Some(parent) = config.status_socket.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let gid = group_id(&config.status_group);
    let socket = tokio::spawn({
        let (path, agent, shutdown) = (
            config.status_socket.clone(),
            agent.clone(),
            shutdown.clone(),
        );
        async move {
            if let Err(e) = status_socket::serve(&path, gid, agent, shutdown).await {
                tracing::error!(error = %e, "status socket stopped");
            }
        }
    });
    let worker = tokio::spawn(agent.clone().run(shutdown.clone()));
    let assessing = tokio::spawn(assess_on_schedule(
        agent.clone(),
        config.assessment.every_minutes,
        shutdown.clone(),
    ));
    let credentials = config.transport.read_credentials()?;
    let transport = link::spawn(
        link::link_settings(&config, &device_id, credentials, device_key)?,
        agent.clone(),
        shutdown.clone(),
    );

    // Tell systemd we are up (a no-op without NOTIFY_SOCKET), then keep its
    // watchdog fed while the agent can still read its own store.
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
    let watchdog = tokio::spawn(feed_watchdog(agent.clone(), shutdown.clone()));
    let exit = tokio::select! {
        _ = agent_core::shutdown::wait_for_signal() => None,
        _ = wait_for_new_binary(agent.clone()) => Some(EXIT_NEW_BINARY),
        _ = agent.store_failed().notified() => {
            tracing::error!(
                state_dir = %config.state_dir.display(),
                "the state store refused a write: free space on its file system; \
                 exiting so the service manager restarts the agent, which opens the store again"
            );
            Some(EXIT_STORE_FAILED)
        }
    };
    info!("stopping at a safe point");
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    shutdown.cancel();
    let _ = tokio::join!(worker, transport, socket, watchdog, assessing);
    if let Some(code) = exit {
        // systemd restarts us on these statuses (Restart=on-failure,
        // RestartForceExitStatus=75).
        std::process::exit(code);
    }
    Ok(())
}

/// The exit status that asks systemd to start the new binary.
const EXIT_NEW_BINARY: i32 = 75;
/// The exit status after the store refused a write on I/O (EX_IOERR): a
/// restart opens it again once there is space.
const EXIT_STORE_FAILED: i32 = 74;

/// Resolves once the agent's own binary was replaced on disk (its package was
/// upgraded) and no job is running or queued: the safe point to restart. The
/// package itself never restarts the agent, so an upgrade of the agent's own
/// package never interrupts apt (A9).
async fn wait_for_new_binary(agent: Arc<Agent>) {
    loop {
        tokio::time::sleep(Duration::from_secs(30)).await;
        let replaced = std::fs::read_link("/proc/self/exe")
            .map(|p| p.to_string_lossy().ends_with(" (deleted)"))
            .unwrap_or(false);
        if !replaced {
            continue;
        }
        match agent.info() {
            Ok(info) if info.current_job.is_none() && info.queued_jobs == 0 => {
                info!("a new drover-agent binary is installed; restarting into it");
                return;
            }
            Ok(_) => tracing::debug!("a new binary is installed; restarting after the current job"),
            Err(e) => tracing::warn!(error = %e, "cannot read the job queue"),
        }
    }
}

async fn feed_watchdog(agent: Arc<Agent>, shutdown: CancellationToken) {
    let Some(timeout) = sd_notify::watchdog_enabled() else {
        return;
    };
    loop {
        tokio::select! {
            _ = tokio::time::sleep(timeout / 2) => {}
            _ = shutdown.cancelled() => return,
        }
        if agent.info().is_ok() {
            let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
        }
    }
}

/// The id of group `name` from /etc/group, if it exists.
fn group_id(name: &str) -> Option<u32> {
    let groups = std::fs::read_to_string("/etc/group").ok()?;
    groups.lines().find_map(|line| {
        let mut fields = line.split(':');
        (fields.next()? == name).then(|| fields.nth(1)?.parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::agent_version;

    #[test]
    fn the_reported_version_is_the_packages_when_it_is_well_formed() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("version");
        assert_eq!(agent_version(&file), env!("CARGO_PKG_VERSION"));
        std::fs::write(&file, "0.1.0-99\n").unwrap();
        assert_eq!(agent_version(&file), "0.1.0-99");
        for bad in ["", "0.1 0", "0.1.0\u{1b}[31m", &"9".repeat(65)] {
            std::fs::write(&file, bad).unwrap();
            assert_eq!(agent_version(&file), env!("CARGO_PKG_VERSION"), "{bad:?}");
        }
    }
}
