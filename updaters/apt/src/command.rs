//! Running one child program with a time bound, no stdin, a fixed locale, and
//! bounded captured output, so a misbehaving child can neither hang the agent
//! nor fill its memory.

use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::process::Command;

/// Upper bound of captured stdout and of captured stderr, each.
const MAX_CAPTURE_BYTES: u64 = 4 * 1024 * 1024;

#[derive(Debug, Clone)]
pub struct CommandOutput {
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl CommandOutput {
    pub fn success(&self) -> bool {
        self.status == Some(0)
    }

    /// The last lines of stderr (or stdout), for an error message.
    pub fn tail(&self) -> String {
        tail(&self.stdout, &self.stderr)
    }

    /// apt's or dpkg's own words on why the command failed.
    pub fn reason(&self) -> Vec<String> {
        crate::why::apt_reason(&self.stdout, &self.stderr)
    }
}

/// The last four non-empty lines of stderr, or of stdout when stderr is empty.
pub(crate) fn tail(stdout: &str, stderr: &str) -> String {
    let text = if stderr.trim().is_empty() {
        stdout
    } else {
        stderr
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(4)..].join(" | ")
}

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} did not finish within {seconds} s and was killed")]
    Timeout { program: String, seconds: u64 },
    #[error("waiting for {program} failed: {source}")]
    Wait {
        program: String,
        #[source]
        source: std::io::Error,
    },
}

/// Runs `argv` to completion or until `limit`, then kills it.
pub async fn run_bounded(argv: &[String], limit: Duration) -> Result<CommandOutput, CommandError> {
    let program = argv.first().cloned().unwrap_or_default();
    let mut child = Command::new(&program)
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("LC_ALL", "C")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| CommandError::Spawn {
            program: program.clone(),
            source,
        })?;
    let mut stdout = child.stdout.take().map(|s| s.take(MAX_CAPTURE_BYTES));
    let mut stderr = child.stderr.take().map(|s| s.take(MAX_CAPTURE_BYTES));
    let run = async {
        let mut out = Vec::new();
        let mut err = Vec::new();
        let read_out = async {
            if let Some(s) = stdout.as_mut() {
                let _ = s.read_to_end(&mut out).await;
            }
        };
        let read_err = async {
            if let Some(s) = stderr.as_mut() {
                let _ = s.read_to_end(&mut err).await;
            }
        };
        tokio::join!(read_out, read_err);
        let status = child.wait().await;
        (status, out, err)
    };
    match tokio::time::timeout(limit, run).await {
        Ok((status, out, err)) => {
            let status = status.map_err(|source| CommandError::Wait {
                program: program.clone(),
                source,
            })?;
            Ok(CommandOutput {
                status: status.code(),
                stdout: String::from_utf8_lossy(&out).into_owned(),
                stderr: String::from_utf8_lossy(&err).into_owned(),
            })
        }
        Err(_) => Err(CommandError::Timeout {
            program,
            seconds: limit.as_secs(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    #[tokio::test]
    async fn captures_output_and_status() {
        let out = run_bounded(
            &argv(&["sh", "-c", "echo hi; echo oops >&2; exit 3"]),
            Duration::from_secs(5),
        )
        .await
        .expect("runs");
        assert_eq!(out.status, Some(3));
        assert_eq!(out.stdout, "hi\n");
        assert_eq!(out.tail(), "oops");
    }

    #[tokio::test]
    async fn kills_a_child_past_its_limit_and_names_a_missing_program() {
        let err = run_bounded(&argv(&["sleep", "5"]), Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(matches!(err, CommandError::Timeout { .. }), "{err}");
        let err = run_bounded(&argv(&["/nonexistent/apt-get"]), Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("cannot start /nonexistent/apt-get"),
            "{err}"
        );
    }
}
