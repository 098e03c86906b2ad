//! What a process has used, from /proc: CPU time, resident memory, and bytes
//! it caused to be written to storage.

use std::time::Duration;

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub cpu: Duration,
    pub rss_bytes: u64,
    /// `write_bytes` of /proc/PID/io: what reached the block layer.
    pub written_bytes: u64,
}

/// Clock ticks per second of /proc/PID/stat (USER_HZ, 100 on Linux).
const TICKS: u64 = 100;

pub fn usage(pid: u32) -> Option<Usage> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state(0) ... utime(11) stime(12).
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())?;
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    let written_bytes = io
        .lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    Some(Usage {
        cpu: Duration::from_millis((utime + stime) * 1000 / TICKS),
        rss_bytes: rss_kib * 1024,
        written_bytes,
    })
}

/// Bytes written by the process's live threads alone (the sum of
/// /proc/PID/task/*/io). Unlike /proc/PID/io it leaves out reaped children
/// (and threads that have exited, which the kernel folds in with them).
pub fn threads_written(pid: u32) -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let io = std::fs::read_to_string(task.ok()?.path().join("io")).unwrap_or_default();
        total += io
            .lines()
            .find_map(|l| l.strip_prefix("write_bytes:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    Some(total)
}

/// A process's memory and threads: resident, proportional (its share of
/// pages it shares with other processes) and peak resident set, in KiB;
/// and the resident set split by what the pages are: its own binary's file
/// pages, other files' (shared libraries), and private memory (heap and
/// stacks).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Memory {
    pub rss_kib: u64,
    pub pss_kib: u64,
    pub peak_rss_kib: u64,
    pub threads: u64,
    pub binary_kib: u64,
    pub other_files_kib: u64,
    pub private_kib: u64,
}

pub fn memory(pid: u32) -> Option<Memory> {
    let field = |text: &str, name: &str| -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let file_kib = field(&status, "RssFile:").unwrap_or(0);
    let binary_kib = binary_resident_kib(pid).unwrap_or(0).min(file_kib);
    Some(Memory {
        rss_kib: field(&status, "VmRSS:")?,
        pss_kib: field(&rollup, "Pss:").unwrap_or(0),
        peak_rss_kib: field(&status, "VmHWM:")?,
        threads: field(&status, "Threads:")?,
        binary_kib,
        other_files_kib: file_kib - binary_kib,
        private_kib: field(&status, "RssAnon:").unwrap_or(0)
            + field(&status, "RssShmem:").unwrap_or(0),
    })
}

/// The resident KiB of the mappings of the process's own executable
/// (/proc/PID/smaps: each mapping's header names its file, its `Rss:`
/// line follows).
fn binary_resident_kib(pid: u32) -> Option<u64> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let exe = exe.to_str()?;
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let mut ours = false;
    let mut total = 0;
    for line in smaps.lines() {
        if let Some(rss) = line.strip_prefix("Rss:") {
            if ours {
                total += rss.split_whitespace().next()?.parse::<u64>().ok()?;
            }
        } else if line
            .split_whitespace()
            .next()
            .is_some_and(|w| w.contains('-'))
        {
            // A mapping's header: address range, permissions, offset,
            // device, inode, then the path (if any).
            ours = line.split_whitespace().nth(5) == Some(exe);
        }
    }
    Some(total)
}

/// The one-minute load average (/proc/loadavg), printed beside figures so a
/// reader knows how busy the machine was.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let usage = usage(std::process::id()).expect("own usage");
        assert!(usage.rss_bytes > 0);
        let memory = memory(std::process::id()).expect("own memory");
        assert!(memory.pss_kib > 0 && memory.peak_rss_kib >= memory.rss_kib);
        assert!(memory.threads >= 1);
        assert!(memory.binary_kib > 0, "this test binary's own pages");
        assert!(
            memory.binary_kib + memory.other_files_kib + memory.private_kib <= memory.rss_kib + 4,
            "{memory:?}"
        );
        // In the checkout, not /tmp: a tmpfs reaches no block layer.
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).expect("tempdir");
        let before = threads_written(std::process::id()).expect("own threads");
        let path = dir.path().join("written");
        std::fs::write(&path, vec![7u8; 64 * 1024]).expect("write");
        std::fs::File::open(&path)
            .expect("open")
            .sync_all()
            .expect("sync");
        let after = threads_written(std::process::id()).expect("own threads");
        assert!(
            after - before >= 64 * 1024,
            "the synced 64 KiB counted: {before} → {after}"
        );
    }
}
