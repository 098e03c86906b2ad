//! Several runs of one benchmark row as one line: each figure's median with
//! its minimum and maximum, how many runs completed, and how loaded the
//! machine was, so a figure in docs/benchmarks.md is one a stranger can reproduce.

use crate::bench::Figures;

/// Median, minimum and maximum of some measurements (NaN ignored).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut values: Vec<f64> = values.into_iter().filter(|v| !v.is_nan()).collect();
        if values.is_empty() {
            return None;
        }
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let median = if n % 2 == 1 {
            values[n / 2]
        } else {
            (values[n / 2 - 1] + values[n / 2]) / 2.0
        };
        Some(Self {
            min: values[0],
            median,
            max: values[n - 1],
        })
    }

    /// `median (min–max)`, or the one value when all are the same.
    pub fn show(&self, decimals: usize) -> String {
        let (min, median, max) = (
            format!("{:.*}", decimals, self.min),
            format!("{:.*}", decimals, self.median),
            format!("{:.*}", decimals, self.max),
        );
        if min == max {
            median
        } else {
            format!("{median} ({min}–{max})")
        }
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
