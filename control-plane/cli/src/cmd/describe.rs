//! `drover describe`'s text for a run and a deployment.

use agent_core::out;
use drover::get::{age, moment_of, print_deployments, print_runs, print_table, table};
use drover::watch::printable;
use drover::watch::reason_of;
use drover_api::deployments::DeploymentDescription;
use drover_api::devices::{Assessment, Device, DeviceJobs, PatchStatus};
use drover_api::jobs::JobOutput;
use drover_api::runs::{RunTarget, TaskRun};

/// A task run's counts, then one row per target: whether it is the canary,
/// its job's state (as the API names it), the step it is at (or ended in) and the error.
pub fn run(run: &TaskRun, targets: &[RunTarget]) {
    print_runs(std::slice::from_ref(run));
    let status = &run.status;
    if let Some(reason) = reason_of(status.reason.as_deref(), status.reason_text.as_deref()) {
        out!("reason: {reason}");
    }
    if let Some(owner) = run.metadata.owner_references.iter().flatten().next() {
        out!(
            "made by: TaskSchedule {} (deleted by its history limits once newer runs finish)",
            printable(&owner.name)
        );
    }
    out!("");
    let mut rows = table(&[
        "DEVICE", "CANARY", "STATE", "STEP", "UPDATED", "RESULT", "ERROR",
    ]);
    let now = jiff::Timestamp::now();
    for target in targets {
        let job = target.status.as_ref();
        // The state the API computed (the dashboard and the metrics show
        // the same name).
        let mut state = target.state.clone();
        if target.after_run_ended {
            state.push_str(" (after the run ended)");
        }
        let step = job
            .and_then(|job| job.steps.iter().rev().find(|s| s.started_at.is_some()))
            .map(|s| format!("{} ({})", s.name, s.state.name()))
            .unwrap_or_else(|| "-".into());
        let updated =
            job.and_then(|job| job.finished_at.or(job.started_at).or(Some(job.accepted_at)));
        rows.add_row(vec![
            printable(&target.device),
            if target.canary { "yes" } else { "" }.to_owned(),
            printable(&state),
            printable(&step),
            match updated {
                Some(_) => format!("{} ago", age(updated, now)),
                None => "-".into(),
            },
            printable(target.result_text.as_deref().unwrap_or("-")),
            printable(job.and_then(|job| job.error.as_deref()).unwrap_or("")),
        ]);
    }
    print_table(&rows);
    let waiting: Vec<(&str, &str)> = targets
        .iter()
        .filter_map(|t| Some((t.device.as_str(), t.waiting.as_ref()?.text.as_str())))
        .collect();
    if !waiting.is_empty() {
        out!("");
        out!("why targets wait:");
        for (device, text) in waiting.iter().take(20) {
            out!("  {:<24} {}", printable(device), printable(text));
        }
    }
    let failed: Vec<(&str, &[String])> = targets
        .iter()
        .filter_map(|t| {
            let job = t.status.as_ref()?;
            (!job.reason.is_empty()).then_some((t.device.as_str(), job.reason.as_slice()))
        })
        .collect();
    print_reasons(&failed, "each device's own: drover describe device DEVICE");
}

/// How many failed jobs' reasons `describe` prints in full.
const REASONS_SHOWN: usize = 5;

/// Each failed job's reason in the failing program's own words, under its
/// name, one indented line each: the first few, then how many more.
fn print_reasons(failed: &[(&str, &[String])], more: &str) {
    for (name, reason) in failed.iter().take(REASONS_SHOWN) {
        out!("");
        out!("why {} failed:", printable(name));
        for line in reason.iter() {
            out!("  {}", printable(line));
        }
    }
    if failed.len() > REASONS_SHOWN {
        out!("");
        out!(
            "({} more failed with a reason; {more})",
            failed.len() - REASONS_SHOWN
        );
    }
}

/// A device: what it is, its latest jobs with what each did, and the
/// packages its last successful upgrade changed.
pub fn device(device: &Device, jobs: &DeviceJobs, assessment: Option<&Assessment>) {
    let now = jiff::Timestamp::now();
    let text = |v: Option<&str>| printable(v.unwrap_or("-"));
    let when = |at: Option<jiff::Timestamp>| at.map_or_else(|| "-".into(), |at| moment_of(at, now));
    out!("device:      {}", printable(&device.id));
    out!("online:      {}", if device.online { "yes" } else { "no" });
    out!("last seen:   {}", when(device.last_seen));
    let groups: Vec<String> = device.groups.iter().map(|g| printable(g)).collect();
    out!(
        "groups:      {}",
        if groups.is_empty() {
            "-".into()
        } else {
            groups.join(", ")
        }
    );
    let labels: Vec<String> = device
        .labels
        .iter()
        .map(|(k, v)| format!("{}={}", printable(k), printable(v)))
        .collect();
    out!(
        "labels:      {}",
        if labels.is_empty() {
            "-".into()
        } else {
            labels.join(", ")
        }
    );
    out!("time zone:   {}", text(device.time_zone.as_deref()));
    out!("");
    match assessment {
        None => out!("patch status: not assessed yet"),
        Some(a) => {
            let s = &a.summary;
            out!(
                "patch status: {} (assessed {})",
                printable(&s.summary),
                moment_of(s.assessed_at, now)
            );
            if let Some(reason) = &s.reboot_pending {
                out!("reboot:       pending: {}", printable(reason));
            }
            out!(
                "kernel:       {} running{}",
                printable(&s.running_kernel),
                match &s.newest_kernel {
                    Some(newest) => format!(", {} installed", printable(newest)),
                    None => String::new(),
                }
            );
            if !a.pending.is_empty() {
                out!("");
                let mut rows = table(&["PENDING", "FROM", "TO", "SECURITY", "WAITING"]);
                for p in &a.pending {
                    rows.add_row(vec![
                        printable(&p.name),
                        text(p.from.as_deref()),
                        printable(&p.to),
                        if p.security { "yes" } else { "" }.to_owned(),
                        match p.since {
                            Some(since) => age(Some(since), now),
                            None => "-".into(),
                        },
                    ]);
                }
                print_table(&rows);
                if a.omitted > 0 {
                    out!("({} more not listed)", a.omitted);
                }
            }
        }
    }
    out!("");
    if jobs.items.is_empty() {
        out!("no jobs");
        return;
    }
    let mut rows = table(&["JOB", "KIND", "RUN", "STATE", "FINISHED", "RESULT"]);
    for job in &jobs.items {
        rows.add_row(vec![
            printable(job.job.get(..8).unwrap_or(&job.job)),
            printable(&job.kind),
            match (&job.run, job.run_deleted) {
                // Its run is gone; the device's history kept the job.
                (Some(run), true) => format!("{} (deleted)", printable(run)),
                (run, _) => text(run.as_deref()),
            },
            printable(&job.state),
            when(job.finished_at),
            text(job.result_text.as_deref()),
        ]);
    }
    print_table(&rows);
    let failed: Vec<(String, &[String])> = jobs
        .items
        .iter()
        .filter(|job| !job.reason.is_empty())
        .map(|job| {
            let id = job.job.get(..8).unwrap_or(&job.job);
            (format!("job {id}"), job.reason.as_slice())
        })
        .collect();
    let failed: Vec<(&str, &[String])> = failed.iter().map(|(n, r)| (n.as_str(), *r)).collect();
    print_reasons(&failed, "the dashboard's device page lists them");
    // The last upgrade that succeeded (the API finds it among all the
    // device's jobs): when, and its packages, one a line.
    if let Some(job) = &jobs.last_upgrade {
        out!("");
        out!(
            "last upgrade: {} (job {}): {}",
            when(job.finished_at),
            printable(job.job.get(..8).unwrap_or(&job.job)),
            text(job.result_text.as_deref())
        );
        if let Some(JobOutput::Upgrade(upgrade)) = &job.output {
            for (changes, label) in [(&upgrade.upgraded, "upgraded"), (&upgrade.installed, "new")] {
                for change in changes {
                    out!(
                        "  {label:<9} {} {} → {}",
                        printable(&change.name),
                        text(change.from.as_deref()),
                        printable(&change.to)
                    );
                }
            }
            for name in &upgrade.removed {
                out!("  removed   {}", printable(name));
            }
            for name in &upgrade.kept_back {
                out!("  kept back {}", printable(name));
            }
            if upgrade.reboot_required {
                out!("  the device rebooted for it");
            }
        }
    }
}

/// A count of seconds in words ("1 hour 30 minutes").
fn words(seconds: u64) -> String {
    drover_rules::reasons::duration(seconds)
}

pub fn deployment(described: &DeploymentDescription) {
    let now = jiff::Timestamp::now();
    let deployment = &described.deployment;
    print_deployments(std::slice::from_ref(deployment));
    let spec = &deployment.spec;
    let status = &deployment.status;
    out!("");
    out!(
        "max concurrency {}, retries {} (backoff {}, doubling), deadline {}",
        spec.max_concurrency,
        spec.retries,
        words(spec.retry_backoff_seconds),
        words(spec.deadline_seconds)
    );
    let threshold = spec.failure_threshold.as_ref();
    let limit = match threshold.map(|t| (t.failed, t.percent)) {
        Some((Some(n), _)) => Some(format!("{n} targets ended failed")),
        Some((_, Some(p))) => Some(format!("{p}% of the ended targets failed")),
        _ => None,
    };
    match (
        limit,
        threshold.and_then(|t| t.min_ended).filter(|n| *n > 0),
    ) {
        (Some(limit), Some(min)) => out!("stops when {limit}, once {min} have ended"),
        (Some(limit), None) => out!("stops when {limit}"),
        (None, _) => out!("no failure threshold: it runs to the end however many fail"),
    }
    for part in &described.unmatched {
        out!("matches no device: {}", printable(part));
    }
    if let Some(at) = status.failure_threshold_reached_at {
        out!("  reached {}: nothing more is released", moment_of(at, now));
    }
    if let Some(rate) = spec.max_releases_per_minute {
        out!("at most {rate} releases a minute");
    }
    match &spec.maintenance_window {
        Some(window) => {
            out!(
                "maintenance window {}-{} in each site's time zone (default {})",
                printable(&window.start),
                printable(&window.end),
                printable(&window.time_zone)
            );
            for zone in &described.windows {
                let state = match (&zone.opens_local, zone.opens_at) {
                    _ if zone.open => "open".to_owned(),
                    (Some(local), Some(at)) => {
                        format!("closed, opens {local} there ({})", moment_of(at, now))
                    }
                    _ => "closed".to_owned(),
                };
                out!(
                    "  {:<32} {:>6} targets  local {}  {state}",
                    printable(&zone.time_zone),
                    zone.targets,
                    zone.local_time,
                );
            }
        }
        None => out!("no maintenance window: targets are released at any time"),
    }
    if let Some(reason) = reason_of(status.reason.as_deref(), status.reason_text.as_deref()) {
        out!("reason: {reason}");
    }
    if let Some(error) = &status.latest_error {
        out!("latest error: {}", printable(error));
    }
    if !described.latest_errors.is_empty() {
        out!("errors:");
        for e in &described.latest_errors {
            out!(
                "  {:<24} attempt {:<3} {}",
                printable(&e.device),
                e.attempt,
                printable(&e.error)
            );
        }
        let failed: Vec<(String, &[String])> = described
            .latest_errors
            .iter()
            .filter(|e| !e.reason.is_empty())
            .map(|e| {
                (
                    format!("{} (attempt {})", e.device, e.attempt),
                    e.reason.as_slice(),
                )
            })
            .collect();
        let failed: Vec<(&str, &[String])> = failed.iter().map(|(n, r)| (n.as_str(), *r)).collect();
        print_reasons(&failed, "drover describe device DEVICE");
    }
    if !described.waiting.is_empty() {
        let counts: Vec<String> = described
            .waiting_by_code
            .iter()
            .map(|(code, n)| format!("{n} {}", printable(code)))
            .collect();
        out!("why targets wait ({}):", counts.join(", "));
        for w in &described.waiting {
            out!("  {:<24} {}", printable(&w.device), printable(&w.wait.text));
        }
    }
    if !described.waiting_retry.is_empty() {
        out!(
            "waiting for a retry ({} in all):",
            described.waiting_retry_total
        );
        for w in &described.waiting_retry {
            out!(
                "  {:<24} attempt {:<3} at {}",
                printable(&w.device),
                w.attempt + 1,
                moment_of(w.next_attempt_at, now)
            );
        }
    }
}

/// The fleet's patch status, a line per state (`drover patch-status`).
pub fn patch_status(fleet: &PatchStatus) {
    out!("devices:                     {}", fleet.devices);
    out!("up to date:                  {}", fleet.up_to_date);
    out!("with updates pending:        {}", fleet.with_updates);
    out!(
        "with security updates:       {}  (the oldest waiting under 1 day: {}, 1-7 days: {}, over 7 days: {})",
        fleet.with_security_updates,
        fleet.security_under_1_day,
        fleet.security_1_to_7_days,
        fleet.security_over_7_days
    );
    out!("no security archive:         {}", fleet.no_security_archive);
    out!("reboot pending:              {}", fleet.reboot_pending);
    out!(
        "not assessed for {} hours:    {}",
        fleet.stale_after_hours,
        fleet.stale
    );
    out!("never assessed:              {}", fleet.never_assessed);
}

/// Every alert, a row each: severity, kind, what it is about, since when,
/// the message, and who acknowledged it (`drover alerts`).
pub fn alerts(alerts: &drover_api::fleet::Alerts) {
    let now = jiff::Timestamp::now();
    let items = &alerts.items;
    if items.is_empty() {
        out!("nothing needs attention");
        return;
    }
    let mut rows = table(&[
        "SEVERITY",
        "ALERT",
        "ABOUT",
        "SINCE",
        "ACKNOWLEDGED",
        "WHAT",
    ]);
    for alert in items {
        let acknowledged = match &alert.acknowledged {
            Some(ack) => format!(
                "{} ({})",
                printable(&ack.by),
                age(Some(ack.at), now) + " ago"
            ),
            None => "-".into(),
        };
        rows.add_row(vec![
            alert.severity.name().to_owned(),
            printable(&alert.kind),
            printable(&alert.resource),
            match alert.at {
                Some(at) => drover::get::moment_of(at, now),
                None => "-".into(),
            },
            acknowledged,
            printable(&alert.message),
        ]);
    }
    print_table(&rows);
}
