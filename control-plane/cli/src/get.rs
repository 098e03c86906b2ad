//! `drover get`: one listing of a resource as the API gives it, printed as
//! a table in kubectl's style or as JSON or YAML; with `--watch`, the table
//! once, then a row for every object that changes (polled every second, as
//! `runs watch` is), until interrupted.

use crate::cli::{Output, Resource};
use crate::client::ApiClient;
use crate::devices::{device_manifest, device_rows};
pub use crate::table::{Listing, Row, age, number, print_table, table};
use crate::watch::printable;
use agent_core::out;
use anyhow::{Result, bail};
use drover_api::deployments::Deployment;
use drover_api::runs::TaskRun;
use drover_api::schedules::{Cadence, Package, TaskSchedule};
use serde_json::Value;
use std::collections::HashMap;
use std::time::Duration;

/// How often `--watch` asks the API.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// What `drover get` fetched: the objects as the API gave them (for -o
/// json|yaml; one object for a named taskrun), and their rows.
struct Fetched {
    structured: Value,
    /// Each object with its row key, for `--watch -o json|yaml`.
    objects: Vec<(String, Value)>,
    listing: Listing,
}

async fn fetch(
    api: &ApiClient,
    resource: Resource,
    name: Option<&str>,
    wide: bool,
) -> Result<Fetched> {
    let key_of = |object: &Value| -> String {
        object["metadata"]["name"]
            .as_str()
            .or_else(|| object["id"].as_str())
            .unwrap_or("?")
            .to_owned()
    };
    let path = match resource {
        Resource::Devices => "/devices",
        Resource::Taskruns => "/taskruns",
        Resource::Taskschedules => "/taskschedules",
        Resource::Deployments => "/deployments",
        Resource::Packages => "/packages",
    };
    // One rule for every kind: without NAME all of them (a list), with NAME
    // that one object, or an error (exit 1) when there is none.
    let objects: Vec<Value> = match name {
        None => api.list(path).await?,
        Some(name) => {
            let one = match resource {
                // The package store has no single-object route: its list.
                Resource::Packages => api.list(path).await?.into_iter().find(|p| p["id"] == name),
                _ => {
                    let escaped = name.replace('/', "%2F");
                    api.get_optional::<Value>(&format!("{path}/{escaped}"))
                        .await?
                }
            };
            match one {
                Some(object) => vec![object],
                None => bail!("{} {} not found", resource.singular(), printable(name)),
            }
        }
    };
    let mut listing = match resource {
        Resource::Devices => {
            let devices = objects
                .iter()
                .map(|d| {
                    Ok(serde_json::from_value::<drover_api::devices::Device>(
                        d.clone(),
                    )?)
                })
                .collect::<Result<Vec<_>>>()?;
            device_rows(&devices, wide)
        }
        Resource::Taskruns => run_rows(&typed::<TaskRun>(&objects)?),
        Resource::Taskschedules => schedule_rows(&typed::<TaskSchedule>(&objects)?),
        Resource::Deployments => deployment_rows(&typed::<Deployment>(&objects)?),
        Resource::Packages => package_rows(&typed::<Package>(&objects)?),
    };
    if let (Resource::Taskruns, [run]) = (resource, objects.as_slice())
        && name.is_some()
    {
        let run: TaskRun = serde_json::from_value(run.clone())?;
        listing.note = run
            .status
            .latest_error
            .map(|error| format!("latest error: {}", printable(&error)));
    }
    if let (true, Some(name), Resource::Taskruns | Resource::Deployments) = (wide, name, resource) {
        let waits = waits_note(api, resource, name).await?;
        listing.note = match (listing.note.take(), waits) {
            (Some(error), Some(waits)) => Some(format!("{error}\n{waits}")),
            (note, waits) => note.or(waits),
        };
    }
    // What -o json|yaml prints is what apply -f takes back: a device as
    // the manifest that registers it.
    let objects: Vec<Value> = match resource {
        Resource::Devices => objects.iter().map(device_manifest).collect(),
        _ => objects,
    };
    let keyed = objects.iter().map(|o| (key_of(o), o.clone())).collect();
    let structured = match (name, objects.as_slice()) {
        (Some(_), [one]) => one.clone(),
        _ => Value::Array(objects),
    };
    Ok(Fetched {
        structured,
        objects: keyed,
        listing,
    })
}

/// The most waiting targets `get NAME -o wide` names, and the most it
/// reads to find them (`describe` reads them all).
const WAITS_SHOWN: usize = 20;
const WAITS_READ: usize = 1000;

/// `get taskrun|deployment NAME -o wide`: why each target not released
/// yet waits, one line each (the targets API's `waiting`, the sentence
/// `describe`, `runs watch` and the dashboard show); None when none waits.
async fn waits_note(api: &ApiClient, resource: Resource, name: &str) -> Result<Option<String>> {
    let plural = match resource {
        Resource::Taskruns => "taskruns",
        _ => "deployments",
    };
    let path = format!(
        "/{plural}/{}/targets?offset=0&limit={WAITS_READ}",
        name.replace('/', "%2F")
    );
    // Each target with its wait, by the API's types of either kind.
    let (total, waiting): (u64, Vec<(String, String)>) = match resource {
        Resource::Taskruns => {
            let page: drover_api::runs::RunTargets = api.get(&path).await?;
            let waits = page.items.into_iter();
            (
                page.total,
                waits
                    .filter_map(|t| Some((t.device, t.waiting?.text)))
                    .collect(),
            )
        }
        _ => {
            let page: drover_api::deployments::DeploymentTargets = api.get(&path).await?;
            let waits = page.items.into_iter();
            (
                page.total,
                waits
                    .filter_map(|t| Some((t.device, t.waiting?.text)))
                    .collect(),
            )
        }
    };
    if waiting.is_empty() {
        return Ok(None);
    }
    Ok(Some(waits_lines(
        &waiting,
        total as usize,
        resource.singular(),
        name,
    )))
}

/// The note's lines: the first WAITS_SHOWN waits, then how many more wait
/// among the targets read and how many targets were not read at all.
fn waits_lines(waiting: &[(String, String)], total: usize, kind: &str, name: &str) -> String {
    let width = waiting.iter().map(|(d, _)| d.len()).max().unwrap_or(0);
    let mut lines = vec!["why targets wait:".to_owned()];
    for (device, text) in waiting.iter().take(WAITS_SHOWN) {
        lines.push(format!(
            "  {:width$}  {}",
            printable(device),
            printable(text)
        ));
    }
    let more = waiting.len().saturating_sub(WAITS_SHOWN);
    let unread = total.saturating_sub(WAITS_READ);
    let mut rest = Vec::new();
    if more > 0 {
        rest.push(format!("{more} more waiting"));
    }
    if unread > 0 {
        rest.push(format!(
            "{unread} targets past the first {WAITS_READ} not read"
        ));
    }
    if !rest.is_empty() {
        lines.push(format!(
            "  … {} (drover describe {kind} {name})",
            rest.join("; ")
        ));
    }
    lines.join("\n")
}

/// The objects of a listing read as the API's type for their kind.
fn typed<T: serde::de::DeserializeOwned>(objects: &[Value]) -> Result<Vec<T>> {
    objects
        .iter()
        .map(|o| Ok(serde_json::from_value(o.clone())?))
        .collect()
}

/// `drover get`: once, or with `watch` until interrupted.
pub async fn get(
    api: &ApiClient,
    resource: Resource,
    name: Option<&str>,
    output: Output,
    watch: bool,
) -> Result<()> {
    let wide = output == Output::Wide;
    let fetched = fetch(api, resource, name, wide).await?;
    if !watch {
        if output == Output::Name {
            for (key, _) in &fetched.objects {
                out!("{}/{}", resource.singular(), printable(key));
            }
        } else if !structured(output, &fetched.structured)? {
            print_listing(&fetched.listing);
        }
        return Ok(());
    }
    let mut watcher = Watcher::default();
    let mut fetched = fetched;
    loop {
        match output {
            Output::Table | Output::Wide | Output::Name => watcher.rows(&fetched.listing),
            Output::Json | Output::Yaml => watcher.objects(output, &fetched.objects)?,
        }
        tokio::time::sleep(WATCH_EVERY).await;
        fetched = fetch(api, resource, name, wide).await?;
    }
}

/// A listing as one table, and its note under it.
pub fn print_listing(listing: &Listing) {
    let mut rows = table(&listing.headers);
    for row in &listing.rows {
        rows.add_row(row.cells.clone());
    }
    print_table(&rows);
    if let Some(note) = &listing.note {
        out!("{note}");
    }
}

pub fn print_runs(runs: &[TaskRun]) {
    print_listing(&run_rows(runs));
}

pub fn print_deployments(deployments: &[Deployment]) {
    print_listing(&deployment_rows(deployments));
}

/// What `--watch` printed last, to print only what changed.
#[derive(Default)]
struct Watcher {
    /// Column widths, fixed by the first listing (a longer cell widens its
    /// own line only, as kubectl does).
    widths: Vec<usize>,
    seen: HashMap<String, String>,
}

impl Watcher {
    fn rows(&mut self, listing: &Listing) {
        if self.widths.is_empty() {
            self.widths = listing.headers.iter().map(|h| h.chars().count()).collect();
            for row in &listing.rows {
                for (width, cell) in self.widths.iter_mut().zip(&row.cells) {
                    *width = (*width).max(cell.chars().count());
                }
            }
            let headers: Vec<String> = listing.headers.iter().map(|h| h.to_string()).collect();
            out!("{}", self.line(&headers));
        }
        for row in &listing.rows {
            let compared: Vec<&str> = row
                .cells
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    if listing.volatile.contains(&i) {
                        ""
                    } else {
                        c.as_str()
                    }
                })
                .collect();
            let compared = compared.join("\u{1f}");
            if self.seen.get(&row.key) != Some(&compared) {
                out!("{}", self.line(&row.cells));
                self.seen.insert(row.key.clone(), compared);
            }
        }
    }

    fn objects(&mut self, output: Output, objects: &[(String, Value)]) -> Result<()> {
        for (key, object) in objects {
            let text = serde_json::to_string(object)?;
            if self.seen.get(key) != Some(&text) {
                match output {
                    Output::Yaml => out!("---\n{}", serde_yaml_ng::to_string(object)?.trim_end()),
                    _ => out!("{text}"),
                }
                self.seen.insert(key.clone(), text);
            }
        }
        Ok(())
    }

    fn line(&self, cells: &[String]) -> String {
        let mut line = String::new();
        for (i, cell) in cells.iter().enumerate() {
            line.push_str(cell);
            if i + 1 < cells.len() {
                let width = self.widths.get(i).copied().unwrap_or(0);
                let pad = width.saturating_sub(cell.chars().count()) + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        line.trim_end().to_owned()
    }
}

fn package_rows(packages: &[Package]) -> Listing {
    let now = jiff::Timestamp::now();
    let rows = packages
        .iter()
        .map(|p| {
            let id = printable(&p.id);
            Row {
                key: id.clone(),
                cells: vec![
                    id,
                    p.size.to_string(),
                    printable(&p.sha256),
                    moment_of(p.uploaded_at, now),
                ],
            }
        })
        .collect();
    Listing {
        headers: vec!["PACKAGE", "BYTES", "SHA256", "UPLOADED"],
        rows,
        volatile: Vec::new(),
        note: None,
    }
}

/// A time the API served (RFC 3339, to the nanosecond) as an operator
/// reads it: to the second, with how long ago or ahead it is.
pub fn moment(value: &Value, now: jiff::Timestamp) -> String {
    match value
        .as_str()
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
    {
        Some(at) => moment_of(at, now),
        None => match value.as_str() {
            Some(text) => printable(text),
            None => "-".into(),
        },
    }
}

/// A time as an operator reads it: to the second, with how long ago or
/// ahead it is.
pub fn moment_of(at: jiff::Timestamp, now: jiff::Timestamp) -> String {
    let whole = jiff::Timestamp::from_second(at.as_second()).unwrap_or(at);
    if whole > now {
        format!("{whole} (in {})", age(Some(now), whole))
    } else {
        format!("{whole} ({} ago)", age(Some(whole), now))
    }
}

/// A string field for a table, escaped; "" when absent.
pub fn shown(value: &Value) -> String {
    printable(value.as_str().unwrap_or(""))
}

fn schedule_rows(schedules: &[TaskSchedule]) -> Listing {
    let headers = vec![
        "NAME",
        "SCHEDULE (UTC)",
        "SUSPENDED",
        "LAST TICK",
        "NEXT TICK",
        "ACTIVE RUN",
        "SKIPPED",
    ];
    let mut rows = Vec::new();
    let time = |t: Option<jiff::Timestamp>| {
        t.map(|t| t.strftime("%Y-%m-%d %H:%M").to_string())
            .unwrap_or_else(|| "-".into())
    };
    for schedule in schedules {
        // The form's name and its fields, as the manifest writes them.
        let cadence = match &schedule.spec.schedule {
            Cadence::Daily(at) => format!("daily {at}"),
            Cadence::Weekly { day, at } => format!("weekly {at} {day}"),
            Cadence::Yearly { date, at } => format!("yearly {at} {date}"),
            Cadence::Cron(expression) => format!("cron {expression}"),
        };
        let status = &schedule.status;
        let name = printable(&schedule.metadata.name);
        rows.push(Row {
            key: name.clone(),
            cells: vec![
                name,
                printable(&cadence),
                if schedule.spec.suspend { "yes" } else { "no" }.to_owned(),
                time(status.last_tick),
                time(status.next_tick),
                printable(status.active_run.as_deref().unwrap_or("-")),
                status.skipped_ticks.to_string(),
            ],
        });
    }
    Listing {
        headers,
        rows,
        volatile: Vec::new(),
        note: None,
    }
}

fn run_rows(runs: &[TaskRun]) -> Listing {
    let headers = vec![
        "NAME",
        "PHASE",
        "TARGETS",
        "RELEASED",
        "SUCCEEDED",
        "FAILED",
        "REASON",
    ];
    let mut rows = Vec::new();
    for run in runs {
        let s = &run.status;
        let name = printable(&run.metadata.name);
        rows.push(Row {
            key: name.clone(),
            cells: vec![
                name,
                s.phase.name().to_owned(),
                s.targets.to_string(),
                s.released.to_string(),
                s.succeeded.to_string(),
                s.failed.to_string(),
                printable(s.reason.as_deref().unwrap_or("")),
            ],
        });
    }
    Listing {
        headers,
        rows,
        volatile: Vec::new(),
        note: None,
    }
}

fn deployment_rows(deployments: &[Deployment]) -> Listing {
    let headers = vec![
        "NAME",
        "PHASE",
        "TARGETS",
        "EXCLUDED",
        "PENDING",
        "QUEUED",
        "RUNNING",
        "SUCCEEDED",
        "FAILED",
        "EXPIRED",
        "CANCELED",
        "REASON",
    ];
    let mut rows = Vec::new();
    for deployment in deployments {
        let s = &deployment.status;
        let mut row = vec![
            printable(&deployment.metadata.name),
            s.phase.name().to_owned(),
        ];
        for count in [
            s.targets,
            s.excluded_count,
            s.pending,
            s.queued,
            s.running,
            s.succeeded,
            s.failed,
            s.expired,
            s.canceled,
        ] {
            row.push(count.to_string());
        }
        row.push(printable(s.reason.as_deref().unwrap_or("")));
        rows.push(Row {
            key: row[0].clone(),
            cells: row,
        });
    }
    Listing {
        headers,
        rows,
        volatile: Vec::new(),
        note: None,
    }
}

/// Prints `value` as JSON or YAML when asked; false for a table.
pub fn structured(output: Output, value: &impl serde::Serialize) -> Result<bool> {
    match output {
        Output::Json => out!("{}", serde_json::to_string_pretty(value)?),
        Output::Yaml => out!("{}", serde_yaml_ng::to_string(value)?.trim_end()),
        Output::Table | Output::Wide => return Ok(false),
        Output::Name => bail!("-o name is for `drover get`; use -o json or yaml here"),
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_served_time_reads_to_the_second_with_how_far_it_is() {
        let now: jiff::Timestamp = "2026-12-02T21:20:00Z".parse().expect("time");
        let past = serde_json::json!("2026-12-02T21:15:00.123456789Z");
        assert_eq!(moment(&past, now), "2026-12-02T21:15:00Z (5m ago)");
        let ahead = serde_json::json!("2026-12-02T23:20:00.5Z");
        assert_eq!(moment(&ahead, now), "2026-12-02T23:20:00Z (in 2h)");
        assert_eq!(moment(&Value::Null, now), "-");
        assert_eq!(moment(&serde_json::json!("soon"), now), "soon");
    }

    #[test]
    fn the_waits_note_counts_the_unread_targets_apart_from_the_waiting_ones() {
        let wait = |n: usize| -> Vec<(String, String)> {
            (0..n)
                .map(|i| (format!("d{i}"), "waiting for the canaries".to_owned()))
                .collect()
        };
        // All read, all shown: no tail line.
        let note = waits_lines(&wait(3), 3, "taskrun", "r");
        assert_eq!(note.lines().count(), 4, "{note}");
        // More waiting than shown.
        let note = waits_lines(&wait(25), 25, "taskrun", "r");
        assert!(
            note.ends_with("  … 5 more waiting (drover describe taskrun r)"),
            "{note}"
        );
        // Few waiting among the first 1000, the rest not read: no "0 more".
        let note = waits_lines(&wait(2), 5000, "deployment", "d");
        assert!(
            note.ends_with(
                "  … 4000 targets past the first 1000 not read (drover describe deployment d)"
            ),
            "{note}"
        );
        let note = waits_lines(&wait(30), 5000, "deployment", "d");
        assert!(
            note.contains("… 10 more waiting; 4000 targets past"),
            "{note}"
        );
    }
}
