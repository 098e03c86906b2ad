//! Where a benchmark's simulated agents run: in the benchmark's own
//! process, or spread over `drover-sim agents` processes when one process
//! cannot hold them all (its open files).

use crate::harness::{Process, Transport};
use crate::nats::NatsLogin;
use crate::{Behaviour, SimAgent, Stats};
use anyhow::{Context, Result, bail};
use drover_model::DeviceId;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio_util::sync::CancellationToken;

/// Starts a simulated agent for each of `tokens`, the first being device
/// number `first` of the fleet; returns their shared counters. Over
/// WebSocket and NATS `agent_url` may name several places, comma-separated
/// (replicas' agent ports, a cluster's nodes): device number `i` goes to
/// place `i % places`, so several simulator processes spread a fleet alike.
/// Over NATS with `authority` each device logs in as an accepted one, by
/// the user JWT `authority` signs for its key; else by its token.
pub fn spawn_agents(
    transport: Transport,
    agent_url: &str,
    first: usize,
    tokens: &[(DeviceId, String)],
    authority: Option<&transport_nats::authority::Authority>,
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
                let login = match authority {
                    Some(authority) => {
                        NatsLogin::Key(crate::keys::nats_login(authority, index, device)?)
                    }
                    None => NatsLogin::Token(token),
                };
                tokio::spawn(crate::nats::play(
                    places[index % places.len()].to_owned(),
                    login,
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
pub(crate) struct AgentProcesses {
    processes: Vec<Process>,
    logs: Vec<PathBuf>,
}

impl AgentProcesses {
    pub(crate) fn start(
        dir: &Path,
        transport: Transport,
        agent_url: &str,
        devices: usize,
        processes: usize,
        behaviour: &Behaviour,
        nats_authority: Option<&Path>,
    ) -> Result<Self> {
        let sim = std::env::current_exe().context("this simulator's own path")?;
        let mut started = Self {
            processes: Vec::new(),
            logs: Vec::new(),
        };
        for (i, (first, count)) in shares(devices, processes).into_iter().enumerate() {
            let log_path = dir.join(format!("agents-{i}.log"));
            let log = std::fs::File::create(&log_path)?;
            let mut command = Command::new(&sim);
            command
                .arg("agents")
                .args(["--transport", transport_name(transport)])
                .args(["--url", agent_url])
                .arg("--data")
                .arg(dir.join("data"))
                .args(["--prefix", "bench-"])
                .args(["--first", &first.to_string()])
                .args(["--devices", &count.to_string()])
                .args([
                    "--statuses-per-job",
                    &behaviour.statuses_per_job.to_string(),
                ])
                .args([
                    "--first-attempt-spread-ms",
                    &behaviour.first_attempt_spread.as_millis().to_string(),
                ]);
            if let Some(keys) = nats_authority {
                command.arg("--nats-authority").arg(keys);
            }
            let child = command
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
pub(crate) enum Fleet {
    Here(Arc<Stats>),
    Elsewhere(AgentProcesses),
}

impl Fleet {
    /// Whether every agent says it is connected (always true for agents in
    /// other processes: the control plane's count decides), or an error if
    /// a simulator process died.
    pub(crate) fn connected(&mut self, devices: usize) -> Result<bool> {
        match self {
            Self::Here(stats) => Ok(stats.connected.load(Ordering::Relaxed) >= devices),
            Self::Elsewhere(processes) => processes.check().map(|()| true),
        }
    }

    pub(crate) fn snapshot(&self) -> String {
        match self {
            Self::Here(stats) => stats.snapshot(),
            Self::Elsewhere(processes) => processes.snapshot(),
        }
    }
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
