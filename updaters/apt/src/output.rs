//! What calls leave on disk, and reading it back. Each call's stdout and
//! stderr go to files in its directory as apt and dpkg write them (the
//! shell's redirection: no sync per line); when the call ends each stream
//! is cut to its last [`MAX_STREAM_BYTES`]. The calls directory is kept
//! within [`MAX_AGE`] and [`MAX_TOTAL_BYTES`]: past the age a call goes,
//! then the oldest finished calls until the total fits. A job's calls are
//! read back, in order, for `drover-agent logs`.

use jiff::Timestamp;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The most of each stream (stdout, stderr) a finished call keeps: its
/// last bytes, from a line's start.
pub const MAX_STREAM_BYTES: u64 = 1024 * 1024;
/// The most the calls directory holds; the oldest finished calls go first.
pub const MAX_TOTAL_BYTES: u64 = 32 * 1024 * 1024;
/// The most the line saying what was cut takes.
const MARKER_ROOM: u64 = 80;
/// A call older than this goes, whatever the total.
pub const MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);

/// Cuts the file at `path` to its last `max` bytes, from the first line
/// start within them, after a line saying how much went. Whether it cut.
/// Written in place of the file (a new file renamed over it), unsynced:
/// it is a log, and a power cut leaves either whole file.
pub fn bound_stream(path: &Path, max: u64) -> std::io::Result<bool> {
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    if len <= max {
        return Ok(false);
    }
    // Room for the line that says what went, so a cut file is within
    // `max` and cutting it again does nothing.
    let keep = max.saturating_sub(MARKER_ROOM);
    file.seek(SeekFrom::Start(len - keep))?;
    let mut kept = Vec::new();
    file.take(keep).read_to_end(&mut kept)?;
    let from = kept
        .iter()
        .position(|b| *b == b'\n')
        .map_or(0, |newline| newline + 1);
    let dropped = len - keep + from as u64;
    let tmp = path.with_extension("cut");
    let mut out = std::fs::File::create(&tmp)?;
    writeln!(
        out,
        "[drover: the first {dropped} bytes of this output were dropped]"
    )?;
    out.write_all(&kept[from..])?;
    drop(out);
    std::fs::rename(&tmp, path)?;
    Ok(true)
}

/// Bounds a finished call's two streams.
pub fn bound_call(dir: &Path) {
    for stream in ["out", "err"] {
        if let Err(e) = bound_stream(&dir.join(stream), MAX_STREAM_BYTES)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %dir.display(), stream, error = %e, "cannot bound a call's output");
        }
    }
}

/// One call directory as pruning sees it.
struct Entry {
    path: PathBuf,
    modified: SystemTime,
    bytes: u64,
    finished: bool,
}

/// Removes the calls in `dir` older than `max_age`, then the oldest
/// finished ones until the rest hold at most `max_total` bytes. A call
/// still running (no exit status yet) never goes for its size.
pub fn prune(dir: &Path, max_age: Duration, max_total: u64) {
    let Ok(read) = std::fs::read_dir(dir) else {
        return;
    };
    let now = SystemTime::now();
    let mut entries = Vec::new();
    for entry in read.flatten() {
        let path = entry.path();
        let Ok(modified) = entry.metadata().and_then(|m| m.modified()) else {
            continue;
        };
        if now.duration_since(modified).is_ok_and(|age| age > max_age) {
            let _ = std::fs::remove_dir_all(&path);
            continue;
        }
        let bytes = dir_bytes(&path);
        let finished = path.join("exit").exists() || is_lost(&path);
        entries.push(Entry {
            path,
            modified,
            bytes,
            finished,
        });
    }
    let mut total: u64 = entries.iter().map(|e| e.bytes).sum();
    entries.sort_by_key(|e| e.modified);
    for entry in entries.iter().filter(|e| e.finished) {
        if total <= max_total {
            break;
        }
        if std::fs::remove_dir_all(&entry.path).is_ok() {
            total = total.saturating_sub(entry.bytes);
        }
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|read| {
            read.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// A call that ended without an exit status, set aside (`ID.lost-SECONDS`).
fn is_lost(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.starts_with("lost-"))
}

/// One call of a job, as its directory holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallLog {
    /// The step that made the call, and how many times that step had
    /// already run to an outcome (0: its first try).
    pub step: String,
    pub tries: u32,
    /// What the call was for (`update`, `full-upgrade`, `install`, …).
    pub purpose: String,
    pub argv: Vec<String>,
    pub started: Option<Timestamp>,
    /// None while it runs, and for a call that ended without one.
    pub exit: Option<i32>,
    /// It ended without an exit status (killed, or a power cut).
    pub lost: bool,
    pub stdout: String,
    pub stderr: String,
}

/// A call directory's name: `JOB-STEP-TRY-PURPOSE` (see
/// `upgrade::call_id`), with `.lost-SECONDS` after it for a lost call.
struct Name {
    job: String,
    step: String,
    tries: u32,
    purpose: String,
}

/// The parts of a call directory's name. The job id is a UUID (36
/// characters); the try is the first part of the rest that is a number
/// (no step's name has one).
fn parse_name(name: &str) -> Option<Name> {
    let name = name.split_once(".lost-").map_or(name, |(id, _)| id);
    let job = name.get(..36)?;
    let parts: Vec<&str> = name.get(36..)?.strip_prefix('-')?.split('-').collect();
    let at = parts
        .iter()
        .position(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))?;
    Some(Name {
        job: job.to_owned(),
        step: parts[..at].join("-"),
        tries: parts[at].parse().ok()?,
        purpose: parts[at + 1..].join("-"),
    })
}

/// The jobs with calls in `dir`, the one whose latest call started last
/// first.
pub fn jobs(dir: &Path) -> Vec<String> {
    let mut latest: std::collections::BTreeMap<String, Option<Timestamp>> = Default::default();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(parsed) = parse_name(&name) {
            let started = read_started(&entry.path());
            let slot = latest.entry(parsed.job).or_default();
            *slot = (*slot).max(started);
        }
    }
    let mut jobs: Vec<(String, Option<Timestamp>)> = latest.into_iter().collect();
    jobs.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    jobs.into_iter().map(|(job, _)| job).collect()
}

/// The calls of `job` in `dir`, in the order they started, each stream
/// read up to [`MAX_STREAM_BYTES`] (its end).
pub fn job_calls(dir: &Path, job: &str) -> Vec<CallLog> {
    let mut calls = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(parsed) = parse_name(&name) else {
            continue;
        };
        if parsed.job != job {
            continue;
        }
        let path = entry.path();
        let exit = std::fs::read_to_string(path.join("exit"))
            .ok()
            .and_then(|s| s.trim().parse().ok());
        calls.push(CallLog {
            step: parsed.step,
            tries: parsed.tries,
            purpose: parsed.purpose,
            argv: std::fs::read_to_string(path.join("argv"))
                .map(|a| a.lines().map(str::to_owned).collect())
                .unwrap_or_default(),
            started: read_started(&path),
            exit,
            lost: is_lost(&path),
            stdout: read_end(&path.join("out"), MAX_STREAM_BYTES),
            stderr: read_end(&path.join("err"), MAX_STREAM_BYTES),
        });
    }
    calls.sort_by(|a, b| a.started.cmp(&b.started).then(a.tries.cmp(&b.tries)));
    calls
}

fn read_started(dir: &Path) -> Option<Timestamp> {
    let seconds: i64 = std::fs::read_to_string(dir.join("started"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Timestamp::from_second(seconds).ok()
}

/// The last `max` bytes of the file at `path`, as text (invalid UTF-8
/// replaced); empty when it is missing.
pub fn read_end(path: &Path, max: u64) -> String {
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if len > max {
        let _ = file.seek(SeekFrom::Start(len - max));
    }
    let mut bytes = Vec::new();
    let _ = file.take(max).read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests;
