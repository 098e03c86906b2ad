//! CPU profiles of a benchmark's processes during the run (issue 57, item
//! 2). The control plane (and mosquitto): `perf record` sampling each
//! process from apply to Complete, then `perf report`'s flat summary (self
//! time by binary and function) written beside the samples; its release
//! binary is stripped unless built with `CARGO_PROFILE_RELEASE_STRIP=false`
//! (the same code, with its symbols). nats-server: Debian strips its
//! symbols, so its own Go profiler (`prof_port`) is asked for the run's
//! first seconds, and `go tool pprof -top` (apt-get install golang-go)
//! summarises it where Go is installed.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Samples a second: odd, so it does not beat with timers.
const FREQUENCY: &str = "499";

/// `perf record` running against some processes, and Go profiles being
/// taken.
pub struct Profiler {
    recorders: Vec<(PathBuf, Child)>,
    go: Vec<(PathBuf, tokio::task::JoinHandle<Result<()>>)>,
}

impl Profiler {
    /// Starts one `perf record` per process (name, pid), its samples in
    /// `out/LABEL-NAME.data`.
    pub fn start(out: &Path, label: &str, processes: &[(String, u32)]) -> Result<Self> {
        std::fs::create_dir_all(out)?;
        let mut recorders = Vec::new();
        for (name, pid) in processes {
            let data = out.join(format!("{label}-{name}.data"));
            let child = Command::new("perf")
                .args([
                    "record",
                    "-q",
                    "-F",
                    FREQUENCY,
                    "-p",
                    &pid.to_string(),
                    "-o",
                ])
                .arg(&data)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("cannot start perf (apt-get install linux-perf)")?;
            recorders.push((data, child));
        }
        Ok(Self {
            recorders,
            go: Vec::new(),
        })
    }

    /// Asks a Go program's profiler (`http://HOST:PORT`) for `seconds` of
    /// CPU profile, written to `out/LABEL-NAME.pb.gz`.
    pub fn go_profile(
        &mut self,
        http: &reqwest::Client,
        out: &Path,
        label: &str,
        name: &str,
        endpoint: &str,
        seconds: u64,
    ) {
        let data = out.join(format!("{label}-{name}.pb.gz"));
        let url = format!("{endpoint}/debug/pprof/profile?seconds={seconds}");
        let (http, path) = (http.clone(), data.clone());
        let task = tokio::spawn(async move {
            let bytes = http
                .get(&url)
                .send()
                .await?
                .error_for_status()?
                .bytes()
                .await?;
            std::fs::write(&path, &bytes)?;
            Ok(())
        });
        self.go.push((data, task));
    }

    /// Stops every recorder (SIGINT: perf writes its file and exits), then
    /// writes each one's flat report beside its samples; returns the
    /// reports' paths.
    pub async fn finish(self) -> Result<Vec<PathBuf>> {
        let mut reports = Vec::new();
        for (data, task) in self.go {
            task.await?.with_context(|| format!("{}", data.display()))?;
            // By self time, then by time in a function and what it calls.
            let top = |order: &str| {
                Command::new("go")
                    .args(["tool", "pprof", "-top", order, "-nodecount=40"])
                    .arg(&data)
                    .output()
                    .ok()
                    .filter(|out| out.status.success())
                    .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            };
            match (top("-flat"), top("-cum")) {
                (Some(flat), Some(cum)) => {
                    let report = data.with_extension("").with_extension("txt");
                    std::fs::write(&report, format!("{flat}\n{cum}"))?;
                    reports.push(report);
                }
                // No Go here: the profile itself, for `go tool pprof` elsewhere.
                _ => reports.push(data),
            }
        }
        for (data, mut child) in self.recorders {
            let _ = Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status();
            child.wait()?;
            let out = Command::new("perf")
                .args(["report", "--stdio", "--no-children", "-q"])
                .args(["--sort", "dso,sym", "-i"])
                .arg(&data)
                .output()
                .context("perf report")?;
            if !out.status.success() {
                bail!(
                    "perf report {}: {}",
                    data.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            let report = data.with_extension("txt");
            let flat = String::from_utf8_lossy(&out.stdout);
            let top: Vec<&str> = flat
                .lines()
                .filter(|l| !l.trim().is_empty())
                .take(40)
                .collect();
            std::fs::write(
                &report,
                format!("{}\n\n{}\n", by_part(&flat), top.join("\n")),
            )?;
            reports.push(report);
        }
        Ok(reports)
    }
}

/// `perf report`'s flat lines (`  7.19%  libc.so.6  [.] symbol`) summed
/// by the part of the program they are in: the crate a Rust function
/// comes from, the allocator, memory copies, the kernel; largest first.
pub fn by_part(flat: &str) -> String {
    let mut parts: std::collections::BTreeMap<String, f64> = Default::default();
    for line in flat.lines() {
        let mut words = line.split_whitespace();
        let (Some(percent), Some(dso), Some(_)) = (words.next(), words.next(), words.next()) else {
            continue;
        };
        // The symbol is the rest: `<&mut X as Y>::f` has spaces.
        let symbol = words.collect::<Vec<_>>().join(" ");
        let Ok(percent) = percent.trim_end_matches('%').parse::<f64>() else {
            continue;
        };
        *parts.entry(part_of(dso, &symbol)).or_default() += percent;
    }
    let mut parts: Vec<(String, f64)> = parts.into_iter().collect();
    parts.sort_by(|a, b| b.1.total_cmp(&a.1));
    parts
        .iter()
        .map(|(part, percent)| format!("{percent:6.2}%  {part}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// How ring's C and assembly functions begin.
const RING_C: [&str; 8] = [
    "ring_core_",
    "fiat_",
    "fe_",
    "fe4_",
    "ge_",
    "sc_",
    "x25519_",
    "constant_time_",
];

fn part_of(dso: &str, symbol: &str) -> String {
    const ALLOCATOR: [&str; 8] = [
        "malloc",
        "free",
        "_int_",
        "cfree",
        "realloc",
        "calloc",
        "unlink_chunk",
        "tcache",
    ];
    if dso.contains("kernel") {
        return "kernel".to_owned();
    }
    if dso.starts_with("libc") {
        if ALLOCATOR.iter().any(|a| symbol.contains(a)) {
            return "allocator (libc)".to_owned();
        }
        if ["memmove", "memcpy", "memcmp", "memset", "memchr"]
            .iter()
            .any(|m| symbol.contains(m))
        {
            return "memory copies (libc)".to_owned();
        }
        return "libc, other".to_owned();
    }
    // `<serde_json::read::SliceRead as ...>::parse_str`: the type's crate.
    let path = symbol
        .trim_start_matches('<')
        .trim_start_matches('&')
        .trim_start_matches("mut ")
        .trim_start_matches("dyn ");
    match path.split_once("::") {
        Some((krate, _)) if !krate.contains(' ') => krate.to_owned(),
        // ring's C and assembly (its Ed25519 signatures: every intent).
        _ if RING_C.iter().any(|p| symbol.starts_with(p)) => "ring".to_owned(),
        _ => dso.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flat_profile_is_summed_by_the_part_of_the_program() {
        let flat = "     7.19%  libc.so.6          [.] __memmove_avx512_unaligned_erms
     3.77%  libc.so.6          [.] _int_free
     3.08%  libc.so.6          [.] malloc_consolidate
     3.42%  [kernel.kallsyms]  [k] finish_task_switch.isra.0
     2.05%  drover             [.] uuid::parser::decode_hex32
     1.03%  drover             [.] <serde_json::read::SliceRead as serde_json::read::Read>::parse_str
     1.37%  drover             [.] serde_json::read::SliceRead::skip_to_escape
     1.00%  drover             [.] <&mut serde_json::de::Deserializer<R> as serde_core::de::Deserializer>::deserialize_any
     0.50%  drover             [.] 0x0000000000025271
     1.56%  drover             [.] constant_time_conditional_memxor.constprop.0
";
        assert_eq!(
            by_part(flat),
            "  7.19%  memory copies (libc)\n  6.85%  allocator (libc)\n  3.42%  kernel\n  \
             3.40%  serde_json\n  2.05%  uuid\n  1.56%  ring\n  0.50%  drover"
        );
    }
}
