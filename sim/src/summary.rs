//! Several runs of one benchmark row as one line: each figure's median with
//! its minimum and maximum, how many runs completed, and how loaded the
//! machine was, so a figure in docs/benchmarks.md is one a stranger can reproduce.

use crate::harness::Transport;
use crate::spread::Spread;

/// One row of the benchmark's table.
#[derive(Debug, Clone)]
pub struct Figures {
    pub devices: usize,
    pub transport: Transport,
    /// Control-plane replicas (1: the embedded store).
    pub replicas: usize,
    pub connect_seconds: f64,
    pub run_seconds: f64,
    /// The control planes' CPU time during the run, all replicas together.
    pub cpu_ms_per_device: f64,
    /// The brokers' CPU time during the run, every node together (none
    /// over WebSocket on the embedded store).
    pub broker_cpu_ms_per_device: Option<f64>,
    /// Growth of the control planes' RSS, all replicas together, once the
    /// agents connected.
    pub idle_rss_kib_per_device: f64,
    /// Control planes' and brokers' writes during the run.
    pub written_kib_per_device: f64,
    pub complete: bool,
    /// Each replica's RSS with every agent connected.
    pub control_plane_rss_mib: Vec<u64>,
    /// Each broker process's RSS after the run (three for a cluster).
    pub broker_rss_mib: Vec<u64>,
    pub cluster: bool,
    /// Over NATS: the devices logged in by their user JWTs (else by
    /// passwords).
    pub nats_jwt: bool,
    /// "TaskRun", or "Deployment (N at once)".
    pub work: String,
    /// Passes over the run or deployment, and the time they took in all.
    pub passes: u64,
    pub pass_seconds: f64,
    /// Of the pass time, waiting for the store's commits (deployments only).
    pub store_seconds: Option<f64>,
    /// The one-minute load average when the run was applied and when it ended.
    pub load: (f64, f64),
    /// The operator's views on the first replica once the run ended, every
    /// agent still connected: each asked [`VIEW_QUERIES`] times.
    pub views_ms: Vec<(&'static str, Spread)>,
    /// What the run cost the NATS servers (NATS agents or store only).
    pub nats: Option<crate::nats_counts::NatsCounts>,
}

/// The operator's views the benchmark times: `drover get devices`' first
/// page, the dashboard's fleet page, the alerts and the patch summary.
pub const VIEWS: [(&str, &str); 4] = [
    ("get devices", "/devices?limit=500"),
    ("fleet page", "/devices/page?offset=0&limit=50&q="),
    ("alerts", "/alerts"),
    ("patch summary", "/patch-status"),
];

/// Requests timed per view.
pub const VIEW_QUERIES: usize = 10;

impl Figures {
    /// The transport column's words.
    pub fn transport_label(&self) -> String {
        let transport = match (self.transport, self.cluster, self.replicas > 1) {
            (Transport::Websocket, _, false) => "WebSocket",
            (Transport::Websocket, false, true) => "WebSocket, JetStream store",
            (Transport::Websocket, true, true) => "WebSocket, JetStream store on 3 nodes (R3)",
            (Transport::Nats, false, _) if self.nats_jwt => "NATS, JWT logins",
            (Transport::Nats, false, _) => "NATS, password logins",
            (Transport::Nats, true, _) if self.nats_jwt => "NATS, JWT logins, 3-node cluster (R3)",
            (Transport::Nats, true, _) => "NATS, password logins, 3-node cluster (R3)",
            (Transport::Mqtt, _, _) => "MQTT",
        };
        if self.replicas > 1 {
            format!("{transport}, {} replicas", self.replicas)
        } else {
            transport.to_owned()
        }
    }

    /// One run's figures on one line (stderr, beside the table's medians).
    pub fn row(&self) -> String {
        let list = |values: &[u64]| {
            if values.is_empty() {
                "-".to_owned()
            } else {
                values
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(" / ")
            }
        };
        format!(
            "| {} | {} | {} | {:.1} | {}{:.1} | {:.2} | {} | {:.1} | {:.1} | {} | {} | {} | {:.2} ({:.1} %) | {} |",
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
            self.broker_cpu_ms_per_device
                .map_or_else(|| "-".to_owned(), |c| format!("{c:.2}")),
            self.idle_rss_kib_per_device,
            self.written_kib_per_device,
            list(&self.control_plane_rss_mib),
            list(&self.broker_rss_mib),
            self.passes,
            self.pass_seconds,
            if self.run_seconds > 0.0 {
                100.0 * self.pass_seconds / self.run_seconds
            } else {
                0.0
            },
            self.store_seconds
                .map_or_else(|| "-".to_owned(), |s| format!("{s:.2}")),
        ) + &format!(
            " views (ms, median (min–max) of {VIEW_QUERIES}): {}",
            self.views_ms
                .iter()
                .map(|(name, spread)| format!("{name} {}", spread.show(1)))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }

    /// The slowest view by its median: its name and median.
    pub fn slowest_view(&self) -> Option<(&'static str, f64)> {
        self.views_ms
            .iter()
            .map(|(name, spread)| (*name, spread.median))
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }
}

fn show(values: impl IntoIterator<Item = f64>, decimals: usize) -> String {
    Spread::of(values).map_or_else(|| "-".to_owned(), |s| s.show(decimals))
}

/// Memory of several processes (replicas, broker nodes) over the runs: the
/// median with its range for one process, else each one's median.
fn per_process<'a>(runs: impl Iterator<Item = &'a [u64]> + Clone) -> String {
    let count = runs.clone().map(<[u64]>::len).max().unwrap_or(0);
    match count {
        0 => "-".to_owned(),
        1 => show(runs.filter_map(|r| r.first().map(|m| *m as f64)), 0),
        _ => (0..count)
            .map(|i| {
                Spread::of(runs.clone().filter_map(|r| r.get(i).map(|m| *m as f64)))
                    .map_or_else(|| "-".to_owned(), |s| format!("{:.0}", s.median))
            })
            .collect::<Vec<_>>()
            .join(" / "),
    }
}

/// The view slowest in most runs, with its medians over the runs: what
/// the operator waits for at worst (each run's every view is on stderr).
fn slowest_view(runs: &[Figures]) -> String {
    let slowest: Vec<(&str, f64)> = runs.iter().filter_map(Figures::slowest_view).collect();
    let Some(name) = slowest
        .iter()
        .map(|(name, _)| *name)
        .max_by_key(|name| slowest.iter().filter(|(n, _)| n == name).count())
    else {
        return "-".to_owned();
    };
    format!("{} ({name})", show(slowest.iter().map(|(_, ms)| *ms), 1))
}

pub fn header() -> &'static str {
    "| devices | transport | work | runs complete | connect (s) | apply → Complete (s) | control-plane CPU per device (ms) | broker CPU per device (ms) | idle RSS per device (KiB) | written per device per run (KiB) | control plane RSS (MiB, per replica) | broker RSS (MiB, per node) | passes | pass time (s) | of which store waits (s) | slowest operator view (ms) | load (1 min) |\n\
     |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
}

/// One line for the runs of one row: `median (min–max)` per figure. The
/// time to Complete counts completed runs only; the load is the one-minute
/// average when each run was applied and when it ended.
pub fn row(runs: &[Figures]) -> Option<String> {
    let first = runs.first()?;
    let complete: Vec<&Figures> = runs.iter().filter(|f| f.complete).collect();
    let all = || runs.iter();
    Some(format!(
        "| {} | {} | {} | {} of {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        first.devices,
        first.transport_label(),
        first.work,
        complete.len(),
        runs.len(),
        show(all().map(|f| f.connect_seconds), 1),
        show(complete.iter().map(|f| f.run_seconds), 1),
        show(complete.iter().map(|f| f.cpu_ms_per_device), 2),
        show(
            complete.iter().filter_map(|f| f.broker_cpu_ms_per_device),
            2
        ),
        show(all().map(|f| f.idle_rss_kib_per_device), 1),
        show(complete.iter().map(|f| f.written_kib_per_device), 1),
        per_process(runs.iter().map(|f| f.control_plane_rss_mib.as_slice())),
        per_process(runs.iter().map(|f| f.broker_rss_mib.as_slice())),
        show(complete.iter().map(|f| f.passes as f64), 0),
        show(complete.iter().map(|f| f.pass_seconds), 2),
        show(complete.iter().filter_map(|f| f.store_seconds), 2),
        slowest_view(runs),
        show(all().flat_map(|f| [f.load.0, f.load.1]), 2),
    ))
}

/// What each fleet's runs cost the NATS servers, per device: one row per
/// size, each count's median with its range over the runs (None when no
/// run counted any).
pub fn nats_table(sizes: &[Vec<Figures>]) -> Option<String> {
    let mut lines = vec![
        "| devices | transport | messages in | of them from the control plane | messages out | of them to the control plane | JetStream API requests | writes by stream |".to_owned(),
        "|---|---|---|---|---|---|---|---|".to_owned(),
    ];
    for runs in sizes {
        let counted: Vec<(&Figures, &crate::nats_counts::NatsCounts)> = runs
            .iter()
            .filter_map(|f| Some((f, f.nats.as_ref()?)))
            .collect();
        let Some((first, _)) = counted.first() else {
            continue;
        };
        let per = |count: fn(&crate::nats_counts::NatsCounts) -> u64| {
            show(
                counted
                    .iter()
                    .map(|(f, c)| count(c) as f64 / f.devices.max(1) as f64),
                1,
            )
        };
        let mut streams: Vec<&String> = counted.iter().flat_map(|(_, c)| c.writes.keys()).collect();
        streams.sort();
        streams.dedup();
        let writes: Vec<String> = streams
            .into_iter()
            .filter_map(|name| {
                let each = counted.iter().map(|(f, c)| {
                    c.writes.get(name).copied().unwrap_or(0) as f64 / f.devices.max(1) as f64
                });
                let spread = Spread::of(each)?;
                (spread.max > 0.0).then(|| format!("{name} {}", spread.show(1)))
            })
            .collect();
        lines.push(format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            first.devices,
            first.transport_label(),
            per(|c| c.in_msgs),
            per(|c| c.control_plane_in),
            per(|c| c.out_msgs),
            per(|c| c.control_plane_out),
            per(|c| c.api_requests),
            writes.join("; ")
        ));
    }
    (lines.len() > 2).then(|| lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads() {
        for (values, expected) in [
            (vec![], None),
            (vec![2.0], Some((2.0, 2.0, 2.0))),
            (vec![3.0, 1.0, 2.0], Some((1.0, 2.0, 3.0))),
            (vec![4.0, 1.0, 2.0, 3.0], Some((1.0, 2.5, 4.0))),
            (vec![f64::NAN, 5.0], Some((5.0, 5.0, 5.0))),
        ] {
            let spread = Spread::of(values.clone()).map(|s| (s.min, s.median, s.max));
            assert_eq!(spread, expected, "{values:?}");
        }
        let spread = Spread::of([5.2, 6.5, 5.9]).expect("spread");
        assert_eq!(spread.show(1), "5.9 (5.2–6.5)");
        assert_eq!(Spread::of([3.0, 3.0]).expect("spread").show(1), "3.0");
    }
}
