//! `drover-agent logs [JOB]`: a job's output as this device keeps it, each
//! apt and dpkg call of each step with its command and exit status, read
//! from the calls directory (`updater_apt::output`), so a technician at the
//! device reads apt's whole words without knowing where they are kept.

use agent_core::job_logs::JobOutput;
use agent_core::out;
use anyhow::{Result, anyhow};
use drover_model::logs::Refusal;
use std::path::{Path, PathBuf};
use updater_apt::output::{self, CallLog};

/// `drover-agent logs`: [`print`] from the calls directory of the agent
/// configured in `config`.
pub fn run(config: &Path, job: Option<&str>, tail: Option<usize>) -> Result<()> {
    print(&crate::config::Config::load(config)?.calls_dir(), job, tail)
}

/// Prints `job`'s output (the job whose call started last when None; a
/// job is named by its id or the start of it), its last `tail` lines
/// when asked.
pub fn print(calls: &Path, job: Option<&str>, tail: Option<usize>) -> Result<()> {
    let text = text(calls, job, tail).map_err(|(_, why)| anyhow!(why))?;
    for line in text.lines() {
        out!("{line}");
    }
    Ok(())
}

/// A job's output kept in a calls directory: what `drover-agent logs`
/// prints and what the agent answers `drover logs` with.
pub struct CallsOutput {
    pub calls: PathBuf,
}

impl JobOutput for CallsOutput {
    fn text(&self, job: Option<&str>, tail: Option<usize>) -> Result<String, (Refusal, String)> {
        text(&self.calls, job, tail)
    }
}

/// `job`'s output as [`print`] shows it, or why there is none.
fn text(calls: &Path, job: Option<&str>, tail: Option<usize>) -> Result<String, (Refusal, String)> {
    let jobs = output::jobs(calls);
    let job = match job {
        None => jobs.first().cloned().ok_or_else(|| {
            (
                Refusal::NoSuchJob,
                "no job has left output on this device yet".to_owned(),
            )
        })?,
        Some(asked) => {
            let found: Vec<&String> = jobs.iter().filter(|j| j.starts_with(asked)).collect();
            match found.as_slice() {
                [one] => (*one).clone(),
                [] => {
                    return Err((
                        Refusal::NoSuchJob,
                        format!(
                            "no output of job {asked} on this device: only jobs that ran apt or \
                             dpkg have output, kept for {} days and {} MiB in all (the oldest \
                             go first)",
                            output::MAX_AGE.as_secs() / 86_400,
                            output::MAX_TOTAL_BYTES / (1024 * 1024)
                        ),
                    ));
                }
                many => {
                    return Err((
                        Refusal::Ambiguous,
                        format!("{asked} starts {} jobs' ids; give more of it", many.len()),
                    ));
                }
            }
        }
    };
    let text = render(&job, &output::job_calls(calls, &job));
    let Some(tail) = tail else {
        return Ok(text);
    };
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(tail);
    Ok(lines[from..]
        .iter()
        .map(|line| format!("{line}\n"))
        .collect())
}

/// A job's calls as text: a header line per call, then its stdout, then
/// its stderr after a `-- stderr --` line. Every line is made plain text
/// (no terminal escapes or control characters: what a package's script
/// printed cannot drive the terminal it is read on).
fn render(job: &str, calls: &[CallLog]) -> String {
    let mut text = String::new();
    for call in calls {
        let started = call.started.map_or_else(
            || "start unknown".to_owned(),
            |t| t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string(),
        );
        let ended = match (call.exit, call.lost) {
            (Some(code), _) => format!("exit {code}"),
            (None, true) => "ended without an exit status (killed, or a power cut)".to_owned(),
            (None, false) => "still running".to_owned(),
        };
        text.push_str(&format!(
            "== job {job}, step {} (try {}), {}: {} [{started}; {ended}]\n",
            call.step,
            call.tries + 1,
            call.purpose,
            drover_model::reason::plain(&call.argv.join(" "))
        ));
        for line in call.stdout.lines() {
            text.push_str(&drover_model::reason::plain(line));
            text.push('\n');
        }
        if !call.stderr.trim().is_empty() {
            text.push_str("-- stderr --\n");
            for line in call.stderr.lines() {
                text.push_str(&drover_model::reason::plain(line));
                text.push('\n');
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_call_has_a_header_and_its_words_are_plain_text() {
        let call = CallLog {
            step: "full-upgrade".into(),
            tries: 0,
            purpose: "full-upgrade".into(),
            argv: vec!["apt-get".into(), "-y".into(), "full-upgrade".into()],
            started: jiff::Timestamp::from_second(1_800_000_000).ok(),
            exit: Some(100),
            lost: false,
            stdout: "Reading package lists...\n\u{1b}[31mred\u{1b}[0m\n".into(),
            stderr: "E: Sub-process /usr/bin/dpkg returned an error code (1)\n".into(),
        };
        let text = render("1d506e04", &[call]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "== job 1d506e04, step full-upgrade (try 1), full-upgrade: apt-get -y full-upgrade [2027-01-15 08:00:00 UTC; exit 100]",
                "Reading package lists...",
                "red",
                "-- stderr --",
                "E: Sub-process /usr/bin/dpkg returned an error code (1)",
            ]
        );
    }
}
