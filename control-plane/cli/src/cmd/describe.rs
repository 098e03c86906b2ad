//! `drover describe`'s text for a run and a deployment.

use agent_core::out;
use drover::get::{age, moment, print_deployments, print_runs, print_table, table};
use drover::watch::printable;
use serde_json::Value;

/// A task run's counts, then one row per target: whether it is the canary,
/// its job's state (as the API names it), the step it is at (or ended in) and the error.
pub fn run(run: &Value, targets: &[Value]) {
    print_runs(std::slice::from_ref(run));
    let status = &run["status"];
    if let Some(reason) = drover::watch::reason(status) {
        out!("reason: {reason}");
    }
    if let Some(owner) = run["metadata"]["ownerReferences"][0]["name"].as_str() {
        out!(
            "made by: TaskSchedule {} (deleted by its history limits once newer runs finish)",
            printable(owner)
        );
    }
    out!("");
    let mut rows = table(&[
        "DEVICE", "CANARY", "STATE", "STEP", "UPDATED", "RESULT", "ERROR",
    ]);
    let now = jiff::Timestamp::now();
    for target in targets {
        let job = &target["status"];
        // The state the API computed (the dashboard and the metrics show
        // the same name).
        let mut state = target["state"].as_str().unwrap_or("?").to_owned();
        if target["afterRunEnded"] == true {
            state.push_str(" (after the run ended)");
        }
        let steps = job["steps"].as_array().cloned().unwrap_or_default();
        let step = steps
            .iter()
            .rev()
            .find(|s| s["startedAt"].is_string())
            .map(|s| {
                format!(
                    "{} ({})",
                    s["name"].as_str().unwrap_or("?"),
                    s["state"].as_str().unwrap_or("?")
                )
            })
            .unwrap_or_else(|| "-".into());
        let updated = ["finishedAt", "startedAt", "acceptedAt"]
            .iter()
            .find_map(|k| job[*k].as_str())
            .and_then(|t| t.parse::<jiff::Timestamp>().ok());
        rows.add_row(vec![
            printable(target["device"].as_str().unwrap_or("?")),
            if target["canary"] == true { "yes" } else { "" }.to_owned(),
            printable(&state),
            printable(&step),
            match updated {
                Some(_) => format!("{} ago", age(updated, now)),
                None => "-".into(),
            },
            printable(target["resultText"].as_str().unwrap_or("-")),
            printable(job["error"].as_str().unwrap_or("")),
        ]);
    }
    print_table(&rows);
}

/// A device: what it is, its latest jobs with what each did, and the
/// packages its last successful upgrade changed.
pub fn device(device: &Value, jobs: &Value, assessment: Option<&Value>) {
    let now = jiff::Timestamp::now();
    let text = |v: &Value| printable(v.as_str().unwrap_or("-"));
    out!("device:      {}", text(&device["id"]));
    out!(
        "online:      {}",
        if device["online"] == true {
            "yes"
        } else {
            "no"
        }
    );
    out!("last seen:   {}", moment(&device["lastSeen"], now));
    let groups: Vec<String> = device["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .map(text)
        .collect();
    out!(
        "groups:      {}",
        if groups.is_empty() {
            "-".into()
        } else {
            groups.join(", ")
        }
    );
    let labels: Vec<String> = device["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{}={}", printable(k), text(v)))
        .collect();
    out!(
        "labels:      {}",
        if labels.is_empty() {
            "-".into()
        } else {
            labels.join(", ")
        }
    );
    out!("time zone:   {}", text(&device["timeZone"]));
    out!("");
    match assessment {
        None => out!("patch status: not assessed yet"),
        Some(a) => {
            out!(
                "patch status: {} (assessed {})",
                text(&a["summary"]),
                moment(&a["assessedAt"], now)
            );
            if let Some(reason) = a["rebootPending"].as_str() {
                out!("reboot:       pending: {}", printable(reason));
            }
            out!(
                "kernel:       {} running{}",
                text(&a["runningKernel"]),
                match a["newestKernel"].as_str() {
                    Some(newest) => format!(", {} installed", printable(newest)),
                    None => String::new(),
                }
            );
            let pending = a["pending"].as_array().cloned().unwrap_or_default();
            if !pending.is_empty() {
                out!("");
                let mut rows = table(&["PENDING", "FROM", "TO", "SECURITY", "WAITING"]);
                for p in &pending {
                    let since = p["since"]
                        .as_str()
                        .and_then(|t| t.parse::<jiff::Timestamp>().ok());
                    rows.add_row(vec![
                        text(&p["name"]),
                        text(&p["from"]),
                        text(&p["to"]),
                        if p["security"] == true { "yes" } else { "" }.to_owned(),
                        match since {
                            Some(_) => age(since, now),
                            None => "-".into(),
                        },
                    ]);
                }
                print_table(&rows);
                if a["omitted"].as_u64().is_some_and(|n| n > 0) {
                    out!("({} more not listed)", a["omitted"]);
                }
            }
        }
    }
    out!("");
    let items = jobs["items"].as_array().cloned().unwrap_or_default();
    if items.is_empty() {
        out!("no jobs");
        return;
    }
    let mut rows = table(&["JOB", "KIND", "RUN", "STATE", "FINISHED", "RESULT"]);
    for job in &items {
        let id = job["job"].as_str().unwrap_or("?");
        rows.add_row(vec![
            printable(id.get(..8).unwrap_or(id)),
            text(&job["kind"]),
            text(&job["run"]),
            text(&job["state"]),
            match job["finishedAt"].as_str() {
                Some(_) => moment(&job["finishedAt"], now),
                None => "-".into(),
            },
            text(&job["resultText"]),
        ]);
    }
    print_table(&rows);
    // The last upgrade that succeeded (the API finds it among all the
    // device's jobs): when, and its packages, one a line.
    let job = &jobs["lastUpgrade"];
    if job.is_object() {
        let upgrade = &job["output"]["upgrade"];
        let id = job["job"].as_str().unwrap_or("?");
        out!("");
        out!(
            "last upgrade: {} (job {}): {}",
            moment(&job["finishedAt"], now),
            printable(id.get(..8).unwrap_or(id)),
            text(&job["resultText"])
        );
        for (key, label) in [("upgraded", "upgraded"), ("installed", "new")] {
            for change in upgrade[key].as_array().into_iter().flatten() {
                out!(
                    "  {label:<9} {} {} → {}",
                    text(&change["name"]),
                    text(&change["from"]),
                    text(&change["to"])
                );
            }
        }
        for name in upgrade["removed"].as_array().into_iter().flatten() {
            out!("  removed   {}", text(name));
        }
        for name in upgrade["keptBack"].as_array().into_iter().flatten() {
            out!("  kept back {}", text(name));
        }
        if upgrade["rebootRequired"] == true {
            out!("  the device rebooted for it");
        }
    }
}

/// A served count of seconds in words ("1 hour 30 minutes").
fn words(seconds: &Value) -> String {
    match seconds.as_u64() {
        Some(seconds) => drover_rules::reasons::duration(seconds),
        None => "-".into(),
    }
}

pub fn deployment(described: &Value) {
    let now = jiff::Timestamp::now();
    let deployment = &described["deployment"];
    print_deployments(std::slice::from_ref(deployment));
    let spec = &deployment["spec"];
    let status = &deployment["status"];
    out!("");
    out!(
        "max concurrency {}, retries {} (backoff {}, doubling), deadline {}",
        spec["maxConcurrency"],
        spec["retries"],
        words(&spec["retryBackoffSeconds"]),
        words(&spec["deadlineSeconds"])
    );
    let threshold = &spec["failureThreshold"];
    let limit = match (threshold["failed"].as_u64(), threshold["percent"].as_u64()) {
        (Some(n), _) => Some(format!("{n} targets ended failed")),
        (_, Some(p)) => Some(format!("{p}% of the ended targets failed")),
        _ => None,
    };
    match (limit, threshold["minEnded"].as_u64().filter(|n| *n > 0)) {
        (Some(limit), Some(min)) => out!("stops when {limit}, once {min} have ended"),
        (Some(limit), None) => out!("stops when {limit}"),
        (None, _) => out!("no failure threshold: it runs to the end however many fail"),
    }
    if status["failureThresholdReachedAt"].is_string() {
        out!(
            "  reached {}: nothing more is released",
            moment(&status["failureThresholdReachedAt"], now)
        );
    }
    if let Some(rate) = spec["maxReleasesPerMinute"].as_u64() {
        out!("at most {rate} releases a minute");
    }
    match spec["maintenanceWindow"].as_object() {
        Some(window) => {
            out!(
                "maintenance window {}-{} in each site's time zone (default {})",
                window["start"].as_str().unwrap_or("?"),
                window["end"].as_str().unwrap_or("?"),
                window["timeZone"].as_str().unwrap_or("?")
            );
            for zone in described["windows"].as_array().into_iter().flatten() {
                out!(
                    "  {:<32} {:>6} targets  local {}  {}",
                    zone["timeZone"].as_str().unwrap_or("?"),
                    zone["targets"],
                    zone["localTime"].as_str().unwrap_or("?"),
                    if zone["open"] == true {
                        "open"
                    } else {
                        "closed"
                    }
                );
            }
        }
        None => out!("no maintenance window: targets are released at any time"),
    }
    if let Some(reason) = drover::watch::reason(status) {
        out!("reason: {reason}");
    }
    if let Some(error) = status["latestError"].as_str() {
        out!("latest error: {}", printable(error));
    }
    let errors = described["latestErrors"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !errors.is_empty() {
        out!("errors:");
        for e in errors {
            out!(
                "  {:<24} attempt {:<3} {}",
                e["device"].as_str().unwrap_or("?"),
                e["attempt"],
                printable(e["error"].as_str().unwrap_or(""))
            );
        }
    }
    let waiting = described["waitingRetry"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !waiting.is_empty() {
        out!(
            "waiting for a retry ({} in all):",
            described["waitingRetryTotal"]
        );
        for w in waiting {
            out!(
                "  {:<24} attempt {:<3} at {}",
                w["device"].as_str().unwrap_or("?"),
                w["attempt"].as_u64().unwrap_or(0) + 1,
                moment(&w["nextAttemptAt"], now)
            );
        }
    }
}

/// The fleet's patch status, a line per state (`drover patch-status`).
pub fn patch_status(fleet: &Value) {
    let n = |key: &str| drover::get::number(&fleet[key]);
    out!("devices:                     {}", n("devices"));
    out!("up to date:                  {}", n("upToDate"));
    out!("with updates pending:        {}", n("withUpdates"));
    out!(
        "with security updates:       {}  (the oldest waiting under 1 day: {}, 1-7 days: {}, over 7 days: {})",
        n("withSecurityUpdates"),
        n("securityUnder1Day"),
        n("security1To7Days"),
        n("securityOver7Days")
    );
    out!("no security archive:         {}", n("noSecurityArchive"));
    out!("reboot pending:              {}", n("rebootPending"));
    out!(
        "not assessed for {} hours:    {}",
        n("staleAfterHours"),
        n("stale")
    );
    out!("never assessed:              {}", n("neverAssessed"));
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
