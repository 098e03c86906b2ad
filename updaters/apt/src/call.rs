//! Child calls that outlive the agent (A9). apt and dpkg run in their own
//! session — a transient systemd unit where systemd runs, `setsid` elsewhere —
//! under a small shell wrapper that writes the exit status to a file in the
//! call's directory, durably, when the command ends. A crash, a restart, or the
//! agent's own package being upgraded never kills dpkg: a restarted agent finds
//! the call's directory, waits for the running call or reads its outcome.
//!
//! A call directory holds `argv`, `started`, `pid` (written by the wrapper),
//! `out`, `err` and finally `exit`.

use jiff::Timestamp;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::Command;
use tracing::{info, warn};

/// The wrapper: records its pid, runs the command with no stdin, then writes
/// the exit status and syncs it before renaming it into place.
///
/// systemd expands `$$` and `${NAME}` in a unit's command line, a transient
/// one's included, so the wrapper uses neither: its own pid comes from
/// /proc/self, which a builtin's redirection opens in the shell itself.
const WRAPPER: &str = r#"d="$1"; shift
read -r me rest < /proc/self/stat
echo "$me" > "$d/pid.tmp" && mv "$d/pid.tmp" "$d/pid"
"$@" > "$d/out" 2> "$d/err" < /dev/null
rc=$?
echo "$rc" > "$d/exit.tmp"
sync "$d/exit.tmp" 2>/dev/null
mv "$d/exit.tmp" "$d/exit"
sync "$d" 2>/dev/null
exit 0"#;

const POLL: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// `systemd-run`: the call gets its own transient unit and cgroup.
    SystemdRun,
    /// `setsid`: the call gets its own session and process group.
    Setsid,
}

impl Launcher {
    pub fn detect() -> Self {
        if Path::new("/run/systemd/system").exists() {
            Launcher::SystemdRun
        } else {
            Launcher::Setsid
        }
    }
}

#[derive(Debug, Clone)]
pub struct CallOutcome {
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
    /// The outcome belongs to a call started before this agent process.
    pub reattached: bool,
}

impl CallOutcome {
    pub fn success(&self) -> bool {
        self.exit_code == 0
    }

    /// The last lines of stderr (or stdout), for an error message.
    pub fn tail(&self) -> String {
        crate::command::tail(&self.stdout, &self.stderr)
    }

    /// apt's or dpkg's own words on why the call failed, for the job's
    /// status.
    pub fn reason(&self) -> Vec<String> {
        crate::why::apt_reason(&self.stdout, &self.stderr)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("cannot prepare the call directory {path}: {source}")]
    Dir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start {program} through {launcher:?}: {reason}")]
    Start {
        program: String,
        launcher: Launcher,
        reason: String,
    },
    #[error("{program} did not finish within {seconds} s and was stopped")]
    Timeout { program: String, seconds: u64 },
    #[error("{program} was not run or was stopped: the job's budget ran out at {not_after}")]
    BudgetSpent {
        program: String,
        not_after: Timestamp,
    },
    #[error("{program} ended without recording an exit status (killed, or the machine lost power)")]
    Lost { program: String },
}

/// How long a call may run: at most `limit` from its own durable start, and
/// never past `not_after`, the end of the whole job's budget.
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    pub limit: Duration,
    pub not_after: Timestamp,
}

impl Bound {
    /// Only the per-call limit.
    pub fn limit(limit: Duration) -> Self {
        Self {
            limit,
            not_after: Timestamp::MAX,
        }
    }
}

/// Runs calls in `dir`, one subdirectory per call id.
#[derive(Debug, Clone)]
pub struct Calls {
    dir: PathBuf,
    launcher: Launcher,
}

impl Calls {
    pub fn new(dir: PathBuf, launcher: Launcher) -> Self {
        Self { dir, launcher }
    }

    /// Whether call `id` was started (by this agent process or an earlier one).
    pub fn started(&self, id: &str) -> bool {
        self.dir.join(id).join("started").exists()
    }

    /// Runs `argv` as call `id`, or re-attaches to the call of that id if an
    /// earlier agent process started it. The bound's limit counts from the
    /// call's durable start; a call is never started past the job's budget.
    pub async fn run(
        &self,
        id: &str,
        argv: &[String],
        bound: Bound,
    ) -> Result<CallOutcome, CallError> {
        let dir = self.dir.join(id);
        let program = program_name(argv);
        if dir.join("exit").exists() {
            info!(
                call = id,
                "reading the outcome of a call an earlier agent started"
            );
            return Ok(read_outcome(&dir, true));
        }
        if dir.join("started").exists() {
            if let Some(pid) = live_pid(&dir) {
                info!(call = id, pid, "re-attaching to a call still running");
                return self.wait(&dir, &program, pid, bound, true).await;
            }
            if dir.join("exit").exists() {
                return Ok(read_outcome(&dir, true));
            }
            if dir.join("pid").exists() {
                // It ran and died without an outcome; the step is idempotent,
                // so report it and let the step decide to run it again.
                let lost = dir.with_extension(format!("lost-{}", unix_seconds()));
                let _ = std::fs::rename(&dir, &lost);
                return Err(CallError::Lost { program });
            }
            // Started but the wrapper never ran (the agent died in between): start over.
            let _ = std::fs::remove_dir_all(&dir);
        }
        if agent_core::clock::now() >= bound.not_after {
            return Err(CallError::BudgetSpent {
                program,
                not_after: bound.not_after,
            });
        }
        self.prune();
        let io = |source| CallError::Dir {
            path: dir.display().to_string(),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(io)?;
        write_durably(&dir.join("argv"), argv.join("\n").as_bytes()).map_err(io)?;
        write_durably(&dir.join("started"), unix_seconds().to_string().as_bytes()).map_err(io)?;
        sync_dir(&dir);
        self.launch(id, &dir, argv).await?;
        // The wrapper writes its pid first thing; wait for it (or for the exit).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if dir.join("exit").exists() {
                return Ok(read_outcome(&dir, false));
            }
            if let Some(pid) = read_pid(&dir) {
                return self.wait(&dir, &program, pid, bound, false).await;
            }
            if tokio::time::Instant::now() > deadline {
                return Err(CallError::Start {
                    program,
                    launcher: self.launcher,
                    reason: "the wrapper did not start within 30 s".into(),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn launch(&self, id: &str, dir: &Path, argv: &[String]) -> Result<(), CallError> {
        let program = program_name(argv);
        let mut command = match self.launcher {
            Launcher::Setsid => {
                let mut c = Command::new("setsid");
                c.arg("sh");
                c
            }
            Launcher::SystemdRun => {
                let mut c = Command::new("systemd-run");
                c.arg(format!("--unit=drover-call-{id}"))
                    .args(["--collect", "--quiet", "--service-type=exec"])
                    .args([
                        "--setenv=DEBIAN_FRONTEND=noninteractive",
                        "--setenv=LC_ALL=C",
                    ])
                    .args(["--", "sh"]);
                c
            }
        };
        command
            .arg("-c")
            .arg(WRAPPER)
            .arg("drover-call")
            .arg(dir)
            .args(argv)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .env("LC_ALL", "C")
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = command.spawn().map_err(|e| CallError::Start {
            program: program.clone(),
            launcher: self.launcher,
            reason: e.to_string(),
        })?;
        match self.launcher {
            // setsid execs the wrapper; reap it in the background so it never
            // lingers as a zombie while this agent lives.
            Launcher::Setsid => {
                tokio::spawn(async move {
                    let _ = child.wait().await;
                });
                Ok(())
            }
            // systemd-run returns once the unit started.
            Launcher::SystemdRun => match child.wait().await {
                Ok(status) if status.success() => Ok(()),
                Ok(status) => Err(CallError::Start {
                    program,
                    launcher: self.launcher,
                    reason: format!("systemd-run exited with {status}"),
                }),
                Err(e) => Err(CallError::Start {
                    program,
                    launcher: self.launcher,
                    reason: e.to_string(),
                }),
            },
        }
    }

    async fn wait(
        &self,
        dir: &Path,
        program: &str,
        pid: u32,
        bound: Bound,
        reattached: bool,
    ) -> Result<CallOutcome, CallError> {
        let started = std::fs::read_to_string(dir.join("started"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or_else(unix_seconds);
        loop {
            if dir.join("exit").exists() {
                return Ok(read_outcome(dir, reattached));
            }
            if !alive(pid, dir) {
                // The wrapper may have written `exit` just before it ended.
                if dir.join("exit").exists() {
                    return Ok(read_outcome(dir, reattached));
                }
                let lost = dir.with_extension(format!("lost-{}", unix_seconds()));
                let _ = std::fs::rename(dir, &lost);
                return Err(CallError::Lost {
                    program: program.to_owned(),
                });
            }
            if unix_seconds().saturating_sub(started) > bound.limit.as_secs() {
                warn!(
                    pid,
                    program, "call over its time limit; stopping its process group"
                );
                stop_group(pid, dir).await;
                return Err(CallError::Timeout {
                    program: program.to_owned(),
                    seconds: bound.limit.as_secs(),
                });
            }
            if agent_core::clock::now() >= bound.not_after {
                warn!(
                    pid,
                    program, "the job's budget ran out; stopping the call's process group"
                );
                stop_group(pid, dir).await;
                if dir.join("exit").exists() {
                    return Ok(read_outcome(dir, reattached));
                }
                return Err(CallError::BudgetSpent {
                    program: program.to_owned(),
                    not_after: bound.not_after,
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Keeps the calls directory within its age and size
    /// ([`crate::output::prune`]).
    fn prune(&self) {
        crate::output::prune(
            &self.dir,
            crate::output::MAX_AGE,
            crate::output::MAX_TOTAL_BYTES,
        );
    }
}

/// The program a call runs, for messages: past `chroot ROOT` in a sandbox.
fn program_name(argv: &[String]) -> String {
    match argv {
        [chroot, _root, program, ..] if chroot == "chroot" => program.clone(),
        [program, ..] => program.clone(),
        [] => String::new(),
    }
}

/// The device's clock in seconds: the call's start and its limits are
/// measured on the same clock as the job's records.
fn unix_seconds() -> u64 {
    u64::try_from(agent_core::clock::now().as_second()).unwrap_or(0)
}

fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::File::create(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

fn sync_dir(dir: &Path) {
    if let Ok(file) = std::fs::File::open(dir) {
        let _ = file.sync_all();
    }
}

fn read_pid(dir: &Path) -> Option<u32> {
    std::fs::read_to_string(dir.join("pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The call's wrapper pid if that process still runs. The wrapper's command
/// line holds the call directory, so a reused pid is not mistaken for it.
fn live_pid(dir: &Path) -> Option<u32> {
    let pid = read_pid(dir)?;
    alive(pid, dir).then_some(pid)
}

fn alive(pid: u32, dir: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    if is_zombie(pid) {
        return false;
    }
    let marker = dir.display().to_string();
    cmdline
        .split(|b| *b == 0)
        .any(|arg| arg == marker.as_bytes())
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

async fn stop_group(pid: u32, dir: &Path) {
    let group = format!("-{pid}");
    let _ = Command::new("kill")
        .args(["-TERM", "--", &group])
        .status()
        .await;
    for _ in 0..150 {
        if dir.join("exit").exists() || !alive(pid, dir) {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
    let _ = Command::new("kill")
        .args(["-KILL", "--", &group])
        .status()
        .await;
}

/// A finished call's outcome, its output first cut to its bound
/// ([`crate::output::bound_call`]).
fn read_outcome(dir: &Path, reattached: bool) -> CallOutcome {
    crate::output::bound_call(dir);
    let exit_code = std::fs::read_to_string(dir.join("exit"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(-1);
    CallOutcome {
        exit_code,
        stdout: crate::output::read_end(&dir.join("out"), crate::output::MAX_STREAM_BYTES),
        stderr: crate::output::read_end(&dir.join("err"), crate::output::MAX_STREAM_BYTES),
        reattached,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What systemd makes of a word of a unit's command line: `$$` is a
    /// literal `$`, and `${NAME}` the variable's value (empty here).
    fn systemd_expanded(word: &str) -> String {
        let mut out = String::new();
        let mut rest = word;
        while let Some(at) = rest.find('$') {
            out.push_str(&rest[..at]);
            rest = &rest[at..];
            if let Some(after) = rest.strip_prefix("$$") {
                out.push('$');
                rest = after;
            } else if let Some(end) = rest.strip_prefix("${").and_then(|r| r.find('}')) {
                rest = &rest[end + 3..];
            } else {
                out.push('$');
                rest = &rest[1..];
            }
        }
        out + rest
    }

    #[test]
    fn the_wrapper_reaches_sh_unchanged_through_systemd_run() {
        // Under systemd-run a `$$` became `$`: the pid file held "$", and
        // a restarted agent took a running apt for a lost call (VM suite).
        assert_eq!(systemd_expanded("a $$ ${X} $1"), "a $  $1");
        assert_eq!(systemd_expanded(WRAPPER), WRAPPER);
    }

    fn argv(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    #[tokio::test]
    async fn a_call_records_its_outcome_and_is_not_run_twice() {
        let dir = tempfile::tempdir().expect("tempdir");
        let calls = Calls::new(dir.path().to_owned(), Launcher::Setsid);
        let counter = dir.path().join("count");
        let script = format!(
            "echo run >> {}; echo out; echo err >&2; exit 7",
            counter.display()
        );
        let first = calls
            .run(
                "job-a",
                &argv(&["sh", "-c", &script]),
                Bound::limit(Duration::from_secs(10)),
            )
            .await
            .expect("runs");
        assert_eq!(
            (first.exit_code, first.stdout.as_str(), first.reattached),
            (7, "out\n", false)
        );
        assert_eq!(first.tail(), "err");
        let again = calls
            .run(
                "job-a",
                &argv(&["sh", "-c", &script]),
                Bound::limit(Duration::from_secs(10)),
            )
            .await
            .expect("reads");
        assert!(again.reattached);
        assert_eq!(again.exit_code, 7);
        assert_eq!(
            std::fs::read_to_string(&counter).expect("count"),
            "run\n",
            "ran once"
        );
    }

    /// Issue 56: a call's output stays on disk within its bound, its end
    /// kept, whatever the program printed.
    #[tokio::test]
    async fn a_calls_output_is_cut_to_its_end_when_it_finishes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let calls = Calls::new(dir.path().to_owned(), Launcher::Setsid);
        let script = "seq 1 400000; echo the-last-line; echo E: failed >&2; exit 100";
        let outcome = calls
            .run(
                "job-big",
                &argv(&["sh", "-c", script]),
                Bound::limit(Duration::from_secs(30)),
            )
            .await
            .expect("runs");
        assert_eq!(outcome.exit_code, 100);
        let out = dir.path().join("job-big").join("out");
        let kept = std::fs::metadata(&out).expect("out").len();
        assert!(kept <= crate::output::MAX_STREAM_BYTES, "{kept} bytes kept");
        let text = std::fs::read_to_string(&out).expect("read");
        assert!(text.starts_with("[drover: the first "), "{}", &text[..80]);
        assert!(text.ends_with("400000\nthe-last-line\n"));
        assert!(outcome.stdout.ends_with("the-last-line\n"));
        assert_eq!(outcome.tail(), "E: failed");
    }

    #[tokio::test]
    async fn a_call_outlives_the_caller_and_is_re_attached() {
        let dir = tempfile::tempdir().expect("tempdir");
        let calls = Calls::new(dir.path().to_owned(), Launcher::Setsid);
        let done = dir.path().join("done");
        let script = format!("sleep 1; touch {}; exit 0", done.display());
        let args = argv(&["sh", "-c", &script]);
        // The first caller gives up waiting (as a killed agent would).
        let first = tokio::time::timeout(
            Duration::from_millis(400),
            calls.run("job-b", &args, Bound::limit(Duration::from_secs(30))),
        )
        .await;
        assert!(first.is_err(), "the caller stopped waiting");
        assert!(!done.exists(), "the call still runs");
        let outcome = calls
            .run("job-b", &args, Bound::limit(Duration::from_secs(30)))
            .await
            .expect("re-attaches");
        assert!(outcome.reattached && outcome.success());
        assert!(done.exists());
    }

    #[tokio::test]
    async fn a_call_over_its_limit_is_stopped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let calls = Calls::new(dir.path().to_owned(), Launcher::Setsid);
        let err = calls
            .run(
                "job-c",
                &argv(&["sleep", "30"]),
                Bound::limit(Duration::from_secs(1)),
            )
            .await
            .expect_err("times out");
        assert!(matches!(err, CallError::Timeout { .. }), "{err}");
    }

    #[tokio::test]
    async fn the_jobs_budget_stops_a_call_and_refuses_a_new_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let calls = Calls::new(dir.path().to_owned(), Launcher::Setsid);
        let bound = Bound {
            limit: Duration::from_secs(60),
            not_after: agent_core::clock::now() + jiff::SignedDuration::from_secs(1),
        };
        let err = calls
            .run("job-e", &argv(&["sleep", "30"]), bound)
            .await
            .expect_err("stopped at the budget");
        assert!(matches!(err, CallError::BudgetSpent { .. }), "{err}");
        let err = calls
            .run("job-f", &argv(&["true"]), bound)
            .await
            .expect_err("not started past the budget");
        assert!(matches!(err, CallError::BudgetSpent { .. }), "{err}");
        assert!(!dir.path().join("job-f").exists(), "nothing was started");
    }

    #[tokio::test]
    async fn a_missing_program_is_an_exit_status_not_a_hang() {
        let dir = tempfile::tempdir().expect("tempdir");
        let calls = Calls::new(dir.path().to_owned(), Launcher::Setsid);
        let outcome = calls
            .run(
                "job-d",
                &argv(&["/nonexistent/apt-get"]),
                Bound::limit(Duration::from_secs(10)),
            )
            .await
            .expect("outcome");
        assert_eq!(outcome.exit_code, 127);
    }
}
