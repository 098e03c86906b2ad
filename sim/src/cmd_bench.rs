//! `drover-sim bench`: its arguments, and its tables over each fleet size.

use crate::beside_this;
use anyhow::Result;
use clap::Args;
use drover_sim::bench::{self, BenchOptions};
use drover_sim::connect::Auth;
use drover_sim::harness::Transport;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args)]
pub(crate) struct BenchArgs {
    /// Fleet sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    devices: Vec<usize>,
    #[arg(long, value_enum, default_value_t = Transport::Websocket)]
    transport: Transport,
    /// The drover binary (default: next to this one).
    #[arg(long)]
    drover: Option<PathBuf>,
    #[arg(long, default_value_t = 7)]
    statuses_per_job: usize,
    #[arg(long, default_value_t = 600)]
    run_timeout_seconds: u64,
    #[arg(long)]
    keep: bool,
    /// Apply a Deployment over the whole fleet with this maxConcurrency
    /// instead of a TaskRun.
    #[arg(long)]
    deployment_concurrency: Option<u32>,
    /// With --transport nats: three nodes as one JetStream cluster, every
    /// bucket with three replicas, the agents spread over the nodes.
    #[arg(long)]
    nats_cluster: bool,
    /// Runs of each row: the table shows each figure's median with its
    /// minimum and maximum (each run's own row goes to stderr).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// With --transport websocket: this many `drover serve` replicas on
    /// one JetStream store (`--store nats`; its three nodes with
    /// --nats-cluster), each holding its share of the agents.
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// Simulator processes playing the agents (0: this one up to 15,000
    /// agents, else one per 15,000, as a process may hold 20,000 files).
    #[arg(long, default_value_t = 0)]
    agent_processes: usize,
    /// CPU profiles of the control plane and the brokers from apply to
    /// Complete (`perf record`), each run's flat report written here.
    #[arg(long)]
    profile: Option<PathBuf>,
    /// With --profile: seconds a NATS server's own profiler samples from
    /// apply (its binary has no symbols for perf).
    #[arg(long, default_value_t = 10)]
    profile_seconds: u64,
    /// With --transport nats: how the devices log in. `jwt`: as accepted
    /// devices, each by the user JWT signed for its key (the servers trust
    /// Drover's operator; the control plane serves with --nats-authority).
    /// `password`: as hand-registered devices, by bcrypt passwords in the
    /// servers' configuration.
    #[arg(long, value_enum, default_value_t = Auth::Jwt)]
    nats_login: Auth,
    /// With --transport nats: each simulated agent makes its first attempt
    /// at a random moment within this many seconds, as a fleet spreading
    /// its reconnects after a server's restart would (0: all at once).
    #[arg(long, default_value_t = 0.0)]
    first_attempt_spread_seconds: f64,
}

/// `bench`: measures a run (or Deployment) over each fleet size.
pub(crate) async fn bench_cmd(args: BenchArgs) -> Result<()> {
    let BenchArgs {
        devices,
        transport,
        drover,
        statuses_per_job,
        run_timeout_seconds,
        keep,
        deployment_concurrency,
        nats_cluster,
        runs,
        replicas,
        agent_processes,
        profile,
        profile_seconds,
        nats_login,
        first_attempt_spread_seconds,
    } = args;
    let drover = beside_this(drover, "drover")?;
    let options = BenchOptions {
        sizes: devices.clone(),
        transport,
        drover,
        statuses_per_job,
        run_timeout: Duration::from_secs(run_timeout_seconds),
        keep,
        deployment_concurrency,
        nats_cluster,
        replicas,
        agent_processes,
        profile,
        profile_seconds,
        nats_login,
        first_attempt_spread: Duration::from_secs_f64(first_attempt_spread_seconds.max(0.0)),
    };
    println!("{}", drover_sim::summary::header());
    let mut counted = Vec::new();
    for size in devices {
        let mut figures = Vec::new();
        for run in 1..=runs.max(1) {
            match bench::measure(&options, size).await {
                Ok(one) => {
                    eprintln!("run {run} of {runs}: {}", one.row());
                    if let Some(counts) = &one.nats {
                        eprintln!(
                            "run {run} of {runs}, per device: {}",
                            counts.per_device(size)
                        );
                    }
                    figures.push(one);
                }
                Err(e) => eprintln!("run {run} of {runs}, {size} devices: failed: {e:#}"),
            }
        }
        match drover_sim::summary::row(&figures) {
            Some(row) => println!("{row}"),
            None => println!(
                "| {size} | {transport:?} | every run failed (see stderr) | | | | | | | | | | | | | | |"
            ),
        }
        counted.push(figures);
    }
    // What the runs cost the NATS servers, counted by them.
    if let Some(table) = drover_sim::summary::nats_table(&counted) {
        println!("\n{table}");
    }
    Ok(())
}
