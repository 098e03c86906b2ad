//! `drover-sim mqtt-connect`: its arguments and its table.

use anyhow::Result;
use clap::Args;
use drover_sim::connect_mqtt::Logins;

#[derive(Args)]
pub(crate) struct MqttConnectArgs {
    /// Fleet sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    devices: Vec<usize>,
    /// Where the broker keeps the logins (both by default, side by side).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "file,dynsec")]
    logins: Vec<Logins>,
    /// Runs of each row: each figure's median with its minimum and maximum.
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

/// `mqtt-connect`: N devices connecting to one mosquitto at once.
pub(crate) async fn mqtt_connect_cmd(args: MqttConnectArgs) -> Result<()> {
    use drover_sim::connect_mqtt::{MqttConnectFigures, measure};
    use drover_sim::spread::Spread;
    println!(
        "| devices | logins | all connected, s | broker CPU per device, ms | retries | load before → after |"
    );
    println!("|---|---|---|---|---|---|");
    for size in &args.devices {
        for logins in &args.logins {
            let mut runs = Vec::new();
            for run in 1..=args.runs.max(1) {
                match measure(*size, *logins).await {
                    Ok(one) => {
                        eprintln!("run {run}: {logins:?} {one:?}");
                        runs.push(one);
                    }
                    Err(e) => eprintln!("run {run}, {size} devices, {logins:?}: failed: {e:#}"),
                }
            }
            let spread = |f: &dyn Fn(&MqttConnectFigures) -> f64, decimals| {
                Spread::of(runs.iter().map(f)).map_or_else(|| "-".to_owned(), |s| s.show(decimals))
            };
            let kept = match logins {
                Logins::File => "password file",
                Logins::Dynsec => "dynamic security",
            };
            println!(
                "| {size} | {kept} | {} | {} | {} | {} |",
                spread(&|r| r.connected.as_secs_f64(), 2),
                spread(&|r| r.broker_cpu_per_device.as_secs_f64() * 1000.0, 2),
                spread(&|r| r.retries as f64, 0),
                runs.iter()
                    .map(|r| format!("{:.1} → {:.1}", r.load.0, r.load.1))
                    .collect::<Vec<_>>()
                    .join(", "),
            );
        }
    }
    Ok(())
}
