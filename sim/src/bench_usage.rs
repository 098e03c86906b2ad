//! What the fleet benchmark reads of its processes: CPU, memory and
//! writes from /proc, summed over several (the replicas, a cluster's
//! nodes), and the lines it prints of them beside its table.

use crate::harness::Process;
use crate::procstat::{self, Usage};
use anyhow::{Context, Result};
use std::time::Duration;

/// CPU, memory and writes of several processes, summed (memory: each one's).
pub(crate) fn usages(processes: &[&Process]) -> Result<Vec<Usage>> {
    processes
        .iter()
        .map(|p| procstat::usage(p.0.id()).context("a process's usage"))
        .collect()
}

/// What several processes used between two readings, summed.
pub(crate) fn between<T: std::iter::Sum>(
    before: &[Usage],
    after: &[Usage],
    grown: impl Fn(&Usage, &Usage) -> T,
) -> T {
    before.iter().zip(after).map(|(b, a)| grown(b, a)).sum()
}

pub(crate) fn cpu_between(before: &[Usage], after: &[Usage]) -> Duration {
    between(before, after, |b, a| a.cpu.saturating_sub(b.cpu))
}

pub(crate) fn written_between(before: &[Usage], after: &[Usage]) -> u64 {
    between(before, after, |b, a| {
        a.written_bytes.saturating_sub(b.written_bytes)
    })
}

/// Each process's RSS in MiB.
pub(crate) fn mib(usages: &[Usage]) -> Vec<u64> {
    usages.iter().map(|u| u.rss_bytes / (1024 * 1024)).collect()
}

/// The control planes' and the brokers' writes apart, with the store's
/// commits (stderr).
pub(crate) fn say_writes(control_planes: u64, brokers: u64, commits: u64, devices: usize) {
    let n = devices.max(1) as f64;
    eprintln!(
        "written per device: control planes {:.1} KiB in {commits} store commits ({:.2} per device), brokers {:.1} KiB",
        control_planes as f64 / 1024.0 / n,
        commits as f64 / n,
        brokers as f64 / 1024.0 / n
    );
}

/// The control planes' and the brokers' CPU per device from `before`
/// (control planes, brokers) until now: what the fleet's connecting cost
/// them (stderr).
pub(crate) fn say_connect_cpu(
    control_planes: &[&Process],
    brokers: &[&Process],
    before: (&[Usage], &[Usage]),
    devices: usize,
) -> Result<()> {
    let n = devices.max(1) as f64;
    let per_device =
        |was: &[Usage], now: &[Usage]| cpu_between(was, now).as_secs_f64() * 1000.0 / n;
    eprintln!(
        "while connecting, CPU per device: control planes {:.2} ms, brokers {:.2} ms",
        per_device(before.0, &usages(control_planes)?),
        per_device(before.1, &usages(brokers)?)
    );
    Ok(())
}
