//! `drover-sim reconnect`: its arguments and its table.

use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub(crate) struct ReconnectArgs {
    /// Fleet sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    devices: Vec<usize>,
    /// The drover binary (default: next to this one).
    #[arg(long)]
    drover: Option<PathBuf>,
    /// Runs of each size: each figure's median with its minimum and maximum.
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

/// `reconnect`: devices behind one address back after a restart.
pub(crate) async fn reconnect_cmd(args: ReconnectArgs) -> Result<()> {
    use drover_sim::reconnect::{ReconnectFigures, measure};
    use drover_sim::spread::Spread;
    let drover = crate::beside_this(args.drover, "drover")?;
    println!(
        "| devices | all in again, s | reconnection attempts | control-plane CPU per device, ms | load before → after |"
    );
    println!("|---|---|---|---|---|");
    for size in args.devices {
        let mut runs = Vec::new();
        for run in 1..=args.runs.max(1) {
            match measure(&drover, size).await {
                Ok(one) => {
                    eprintln!("run {run}: {one:?}");
                    runs.push(one);
                }
                Err(e) => eprintln!("run {run}, {size} devices: failed: {e:#}"),
            }
        }
        let spread = |f: &dyn Fn(&ReconnectFigures) -> f64, decimals| {
            Spread::of(runs.iter().map(f)).map_or_else(|| "-".to_owned(), |s| s.show(decimals))
        };
        println!(
            "| {size} | {} | {} | {} | {} |",
            spread(&|r| r.back.as_secs_f64(), 1),
            spread(&|r| r.retries as f64, 0),
            spread(&|r| r.cpu_per_device.as_secs_f64() * 1000.0, 2),
            runs.iter()
                .map(|r| format!("{:.1} → {:.1}", r.load.0, r.load.1))
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
    Ok(())
}
