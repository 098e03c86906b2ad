//! `drover runs watch NAME`: a live progress bar of a task run's or a
//! deployment's counts until it finishes. Exits non-zero unless it is
//! Complete.

use crate::client::ApiClient;
use agent_core::out;
use anyhow::Result;
use drover_api::deployments::{Deployment, DeploymentDescription};
use drover_api::runs::{Phase, TaskRun};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use std::time::Duration;

/// Follows the task run or deployment `name` (`deployment/NAME` or
/// `taskrun/NAME` to say which; a bare name is a task run if one exists).
pub async fn watch(client: &ApiClient, name: &str) -> Result<bool> {
    let (path, name) = match name.split_once('/') {
        Some(("deployment" | "deployments", name)) => (format!("/deployments/{name}"), name),
        Some(("taskrun" | "taskruns", name)) => (format!("/taskruns/{name}"), name),
        Some((kind, _)) => anyhow::bail!("cannot watch a {kind}; watch a taskrun or a deployment"),
        None => {
            if client
                .get_optional::<Value>(&format!("/taskruns/{name}"))
                .await?
                .is_some()
            {
                (format!("/taskruns/{name}"), name)
            } else if client
                .get_optional::<Value>(&format!("/deployments/{name}"))
                .await?
                .is_some()
            {
                (format!("/deployments/{name}"), name)
            } else {
                anyhow::bail!("no task run or deployment named {name}");
            }
        }
    };
    let deployment = path.starts_with("/deployments/");
    let bar = ProgressBar::new(0);
    let template = if deployment {
        "{spinner} {prefix} [{bar:30}] {pos}/{len} ended  {msg}"
    } else {
        "{spinner} {prefix} [{bar:30}] {pos}/{len} done  {msg}"
    };
    let style = |template: &str| {
        ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ")
    };
    // While the plan is made there is nothing to count: a spinner, not "0/0".
    bar.set_style(style("{spinner} {prefix} {msg}"));
    bar.set_prefix(name.to_owned());
    // No terminal (piped, in a log): one line per change instead of a bar.
    let lines = bar.is_hidden();
    let mut last_line = String::new();
    let mut counting = false;
    // Why pending targets wait, asked again when the counts move or every
    // few seconds (describe reads every target).
    let mut waits = String::new();
    let mut waits_asked: Option<(tokio::time::Instant, (u32, u32, u32))> = None;
    loop {
        let (phase, targets, ended, message, reason, latest_error) = if deployment {
            let d: Deployment = client.get(&path).await?;
            let s = d.status;
            let phase = s.phase;
            let counts = (s.pending, s.queued, s.running);
            if s.pending == 0 || phase.is_terminal() {
                waits.clear();
            } else if waits_asked
                .is_none_or(|(at, seen)| seen != counts || at.elapsed() >= WAITS_EVERY)
            {
                waits_asked = Some((tokio::time::Instant::now(), counts));
                let described: DeploymentDescription =
                    client.get(&format!("{path}/describe")).await?;
                waits = waits_of(&described);
            }
            (
                phase,
                s.targets,
                s.succeeded + s.failed + s.expired + s.canceled,
                format!(
                    "{}: {} pending ({} waiting to retry), {} queued, {} running, {} succeeded, {} failed, {} expired, {} canceled{waits}",
                    phase.name(),
                    s.pending,
                    s.waiting_retry,
                    s.queued,
                    s.running,
                    s.succeeded,
                    s.failed,
                    s.expired,
                    s.canceled
                ),
                reason_of(s.reason.as_deref(), s.reason_text.as_deref()),
                s.latest_error,
            )
        } else {
            let run: TaskRun = client.get(&path).await?;
            let s = run.status;
            (
                s.phase,
                s.targets,
                s.succeeded + s.failed,
                format!(
                    "{}: {} released, {} succeeded, {} failed",
                    s.phase.name(),
                    s.released,
                    s.succeeded,
                    s.failed
                ),
                reason_of(s.reason.as_deref(), s.reason_text.as_deref()),
                s.latest_error,
            )
        };
        let (targets, ended) = (u64::from(targets), u64::from(ended));
        if lines {
            let line = if targets == 0 {
                format!("{name} {message}")
            } else {
                format!("{name} {ended}/{targets} {message}")
            };
            if line != last_line {
                out!("{line}");
                last_line = line;
            }
        } else {
            if targets > 0 && !counting {
                bar.set_style(style(template));
                counting = true;
            }
            bar.set_length(targets);
            bar.set_position(ended);
            bar.set_message(message);
        }
        if phase.is_terminal() {
            bar.finish();
            if let Some(reason) = reason {
                out!("reason: {reason}");
            }
            if let Some(error) = latest_error {
                out!("latest error: {}", printable(&error));
            }
            return Ok(phase == Phase::Complete);
        }
        bar.tick();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// How often `runs watch` asks why a deployment's pending targets wait.
const WAITS_EVERY: Duration = Duration::from_secs(5);

/// "; waiting: 2 ConcurrencyLimit, 1 WindowClosed (first: …)", or nothing.
fn waits_of(described: &DeploymentDescription) -> String {
    if described.waiting_by_code.is_empty() {
        return String::new();
    }
    let counts: Vec<String> = described
        .waiting_by_code
        .iter()
        .map(|(code, n)| format!("{n} {}", printable(code)))
        .collect();
    let first = described
        .waiting
        .first()
        .map(|w| {
            format!(
                " (first: {}: {})",
                printable(&w.device),
                printable(&w.wait.text)
            )
        })
        .unwrap_or_default();
    format!("; waiting: {}{first}", counts.join(", "))
}

/// Text a device or an old record supplied, with control and
/// bidirectional characters escaped, so nothing reaches the terminal raw.
pub fn printable(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            if c.is_control() || drover_rules::clean::is_bidi_override(c) {
                c.escape_unicode().collect::<Vec<char>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// A run's or deployment's reason as the API gives it: the sentence with
/// the code beside it, or the code alone when this control plane has no
/// sentence for it.
pub fn reason_of(code: Option<&str>, text: Option<&str>) -> Option<String> {
    let code = code?;
    Some(match text {
        Some(text) => format!("{} ({})", printable(text), printable(code)),
        None => printable(code),
    })
}
