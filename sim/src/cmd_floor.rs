//! `drover-sim nats-floor`: its arguments and its table.

use anyhow::Result;
use clap::Args;
use drover_sim::floor::{FloorFigures, measure};
use drover_sim::spread::Spread;

#[derive(Args)]
pub(crate) struct FloorArgs {
    /// Stream replicas, comma-separated: 1 (one nats-server) and 3 (a
    /// three-node cluster).
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    replicas: Vec<usize>,
    /// Messages each run publishes.
    #[arg(long, default_value_t = 20_000)]
    messages: usize,
    /// Each message's size in bytes (a status is a few hundred).
    #[arg(long, default_value_t = 300)]
    size: usize,
    /// Acknowledgements awaited at once, comma-separated (1: one round
    /// trip each).
    #[arg(long, value_delimiter = ',', default_value = "1,256,4096")]
    outstanding: Vec<usize>,
    /// Runs of each row: each figure's median with its minimum and maximum.
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

/// `nats-floor`: one stream's rate of small messages, acknowledgements
/// pipelined.
pub(crate) async fn floor_cmd(args: FloorArgs) -> Result<()> {
    println!(
        "| replicas | messages | bytes each | acks outstanding | messages/s | servers' CPU per message, µs | written per message, bytes | load before → after |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for replicas in &args.replicas {
        for outstanding in &args.outstanding {
            let mut runs = Vec::new();
            for run in 1..=args.runs.max(1) {
                match measure(*replicas, args.messages, args.size, *outstanding).await {
                    Ok(one) => {
                        eprintln!("run {run}: R{replicas}, {outstanding} outstanding: {one:?}");
                        runs.push(one);
                    }
                    Err(e) => eprintln!("run {run}, R{replicas}: failed: {e:#}"),
                }
            }
            let spread = |f: &dyn Fn(&FloorFigures) -> f64, decimals| {
                Spread::of(runs.iter().map(f)).map_or_else(|| "-".to_owned(), |s| s.show(decimals))
            };
            println!(
                "| {replicas} | {} | {} | {outstanding} | {} | {} | {} | {} |",
                args.messages,
                args.size,
                spread(&|r| r.per_second(), 0),
                spread(&|r| r.server_cpu_per_message.as_secs_f64() * 1e6, 1),
                spread(&|r| r.written_per_message, 0),
                runs.iter()
                    .map(|r| format!("{:.1} → {:.1}", r.load.0, r.load.1))
                    .collect::<Vec<_>>()
                    .join(", "),
            );
        }
    }
    Ok(())
}
