//! The patch-status benchmark (issue 31): what the control plane pays for
//! a fleet's assessments, and how fast it answers the fleet's patch views
//! with every device assessed. For each run a fresh `drover serve` (the
//! embedded store, WebSocket) in a temporary directory, N devices
//! registered, then two passes over the fleet, `batch` devices at a time
//! (one process cannot hold 20,000 connections here, and assessments are
//! spread over the day anyway):
//!
//! 1. each device connects, says hello and leaves (what a connection
//!    costs, measured to be subtracted; after a first such pass, unmeasured,
//!    in which each device's record learns of its agent);
//! 2. each device connects, says hello, reports one assessment of its
//!    own (a local `patchAssessmentV1` report, as the agent's schedule
//!    sends it), waits for the control plane to confirm it, and leaves.
//!
//! The difference of the two passes is the assessments' cost: CPU time per
//! assessment, store growth and bytes written per device. Then the fleet's
//! views are each asked `queries` times in turn: `GET /patch-status`, the
//! dashboard's fleet page filtered to security updates, the alerts, and
//! the first page of 500 devices `drover get devices` asks for.
//! It prints figures; it asserts nothing about time.

use crate::harness::{self, Api, timed};
use crate::procstat::{self, Usage};
use crate::spread::Spread;
use crate::ws::{Target, open};
use anyhow::{Context, Result, bail};
use drover_model::model::{
    JobOutput, JobState, JobStatus, PatchAssessment, PendingPackage, StepRecord, StepState,
};
use drover_model::{DeviceId, JobId};
use futures_util::{SinkExt, StreamExt};
use jiff::Timestamp;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;
use transport_websocket::protocol::{AgentMessage, ServerMessage};

#[derive(Debug, Clone)]
pub struct PatchOptions {
    pub devices: usize,
    pub drover: PathBuf,
    /// Devices connected at once.
    pub batch: usize,
    /// Requests timed per view.
    pub queries: usize,
    pub keep: bool,
}

/// One run's figures.
#[derive(Debug, Clone)]
pub struct PatchFigures {
    pub devices: usize,
    /// Pass 2's wall time: every device's assessment confirmed.
    pub report_seconds: f64,
    /// Control-plane CPU per assessment: pass 2 less pass 1, per device.
    pub cpu_ms_per_assessment: f64,
    /// The data directory's growth over pass 2, per device.
    pub store_kib_per_device: f64,
    /// Bytes the control plane wrote over pass 2 less pass 1, per device.
    pub written_kib_per_assessment: f64,
    pub patch_status_ms: Spread,
    pub fleet_page_ms: Spread,
    pub alerts_ms: Spread,
    /// `GET /devices?limit=500`: the first page `drover get devices` asks.
    pub devices_page_ms: Spread,
    pub load: (f64, f64),
}

pub fn header() -> &'static str {
    "| devices | runs | assessments reported (s) | CPU per assessment (ms) | store growth per device (KiB) | written per assessment (KiB) | GET /patch-status (ms) | fleet page, security filter (ms) | GET /alerts (ms) | GET /devices?limit=500 (ms) | load (1 min) |\n\
     |---|---|---|---|---|---|---|---|---|---|---|"
}

/// The runs of one size as one line: each figure's median (min–max); the
/// views' times are the medians of each run's requests.
pub fn row(runs: &[PatchFigures]) -> Option<String> {
    let first = runs.first()?;
    let show = |values: Vec<f64>, decimals| {
        Spread::of(values).map_or_else(|| "-".to_owned(), |s| s.show(decimals))
    };
    let each = |f: fn(&PatchFigures) -> f64| runs.iter().map(f).collect::<Vec<_>>();
    Some(format!(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        first.devices,
        runs.len(),
        show(each(|f| f.report_seconds), 1),
        show(each(|f| f.cpu_ms_per_assessment), 2),
        show(each(|f| f.store_kib_per_device), 2),
        show(each(|f| f.written_kib_per_assessment), 1),
        show(each(|f| f.patch_status_ms.median), 1),
        show(each(|f| f.fleet_page_ms.median), 1),
        show(each(|f| f.alerts_ms.median), 1),
        show(each(|f| f.devices_page_ms.median), 1),
        show(runs.iter().flat_map(|f| [f.load.0, f.load.1]).collect(), 2),
    ))
}

/// One run's own line (stderr), with every view's min/median/max.
pub fn run_line(f: &PatchFigures) -> String {
    format!(
        "{} devices: reported in {:.1} s, {:.2} ms CPU and {:.1} KiB written per assessment, \
         store +{:.2} KiB per device; /patch-status {} ms, fleet page {} ms, /alerts {} ms, /devices?limit=500 {} ms (median (min–max)); load {:.2} → {:.2}",
        f.devices,
        f.report_seconds,
        f.cpu_ms_per_assessment,
        f.written_kib_per_assessment,
        f.store_kib_per_device,
        f.patch_status_ms.show(1),
        f.fleet_page_ms.show(1),
        f.alerts_ms.show(1),
        f.devices_page_ms.show(1),
        f.load.0,
        f.load.1
    )
}

/// What device `index` has pending: a quarter up to date, the rest 3 to 22
/// updates of which up to two are security updates, a tenth with a reboot
/// pending: the mix a real fleet reports, package names and all.
pub fn assessment_of(index: usize) -> PatchAssessment {
    let upgradable = if index.is_multiple_of(4) {
        0
    } else {
        3 + index % 20
    };
    let security = if upgradable == 0 { 0 } else { index % 3 };
    let pending = (0..upgradable)
        .map(|k| PendingPackage {
            name: format!("libexample{k}"),
            from: Some(format!("1.{k}.0-1")),
            to: format!("1.{k}.0-1+deb12u{}", 1 + index % 3),
            security: k < security,
        })
        .collect();
    PatchAssessment {
        upgradable: upgradable as u32,
        security: security as u32,
        kept_back: 0,
        security_archive: true,
        reboot_pending: index
            .is_multiple_of(10)
            .then(|| "/run/reboot-required exists".to_owned()),
        running_kernel: "6.1.0-28-arm64".into(),
        newest_kernel: None,
        pending,
        omitted: 0,
    }
}

/// The finished report of a local assessment, as the agent's schedule
/// sends it (a job the control plane never sent).
fn report(device: &DeviceId, index: usize) -> JobStatus {
    let now = Timestamp::now();
    let mut steps: Vec<StepRecord> = updater_apt::assess::STEPS
        .iter()
        .map(|s| StepRecord::pending(s))
        .collect();
    for step in &mut steps {
        step.state = StepState::Done;
        step.tries = 1;
        step.seconds = Some(1.0);
    }
    JobStatus {
        job_id: JobId::random(),
        device_id: device.clone(),
        attempt: 1,
        kind: "patchAssessmentV1".into(),
        state: JobState::Succeeded,
        steps,
        error: None,
        output: Some(JobOutput::Assessment(assessment_of(index))),
        accepted_at: now,
        started_at: Some(now),
        finished_at: Some(now),
        boot_id: "patch-bench".into(),
        completion_heartbeat_at: Some(now),
        seq: 3,
        failure: None,
        reason: Vec::new(),
    }
}

/// One device's visit: connect, hello, then (with `assess`) one
/// assessment, confirmed; leave.
async fn visit(
    target: Target,
    index: usize,
    device: &DeviceId,
    token: &str,
    assess: bool,
) -> Result<()> {
    let (mut sink, mut stream) = open(target, index, device, token).await?.split();
    let hello = AgentMessage::Hello(drover_model::model::Hello {
        device_id: device.clone(),
        agent_version: "sim".into(),
        boot_id: "patch-bench".into(),
        capabilities: vec!["patchAssessmentV1".into()],
        jobs: Vec::new(),
    });
    sink.send(Message::text(hello.encode())).await?;
    if assess {
        let result = AgentMessage::Result {
            outbox_id: 1,
            status: report(device, index),
        };
        sink.send(Message::text(result.encode())).await?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            let frame = tokio::time::timeout_at(deadline, stream.next())
                .await
                .context("no confirmation within 120 s")?;
            let Some(frame) = frame else {
                bail!("the server closed the connection before confirming");
            };
            let Message::Text(text) = frame? else {
                continue;
            };
            match ServerMessage::decode(text.as_str()) {
                Ok(ServerMessage::Received { outbox_id: 1 }) => break,
                Ok(ServerMessage::Error { message }) => bail!("refused: {message}"),
                _ => {}
            }
        }
    }
    let _ = sink.send(Message::Close(None)).await;
    Ok(())
}

/// Every device visits once, `batch` at a time; how long it took.
async fn pass(
    target: Target,
    tokens: &[(DeviceId, String)],
    batch: usize,
    assess: bool,
) -> Result<f64> {
    let started = Instant::now();
    let failures: Vec<anyhow::Error> = futures_util::stream::iter(
        tokens
            .iter()
            .enumerate()
            .map(|(index, (device, token))| visit(target, index, device, token, assess)),
    )
    .buffer_unordered(batch.max(1))
    .filter_map(|r| async move { r.err() })
    .collect()
    .await;
    if let Some(first) = failures.first() {
        bail!(
            "{} of {} visits failed, the first: {first:#}",
            failures.len(),
            tokens.len()
        );
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Bytes of the files under `dir` (the store as an operator's `du
/// --apparent-size` sees it).
fn size_of(dir: &Path) -> u64 {
    let mut total = 0;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    for entry in entries.flatten() {
        match entry.metadata() {
            Ok(m) if m.is_dir() => total += size_of(&entry.path()),
            Ok(m) => total += m.len(),
            Err(_) => {}
        }
    }
    total
}

pub async fn measure(options: &PatchOptions) -> Result<PatchFigures> {
    let dir = tempfile::Builder::new().prefix("drover-patch-").tempdir()?;
    let data = dir.path().join("data");
    let secrets = drover_server::auth::Secrets::load_or_create(&data, None)?;
    let ids = crate::device_ids("patch-", options.devices);
    let tokens: Vec<(DeviceId, String)> = ids
        .iter()
        .map(|d| (d.clone(), secrets.device_token(d)))
        .collect();
    let (cp, api_base, agent_addr) = harness::start_drover(
        &options.drover,
        dir.path(),
        harness::Serve {
            transport: harness::Transport::Websocket,
            broker_url: None,
            nats_replicas: 1,
            store_on_nats: false,
            nats_authority: None,
        },
    )?;
    let pid = cp.0.id();
    let api = Api {
        base: format!("http://{api_base}"),
        token: secrets.operator_token().to_owned(),
        http: harness::http_builder()
            .timeout(Duration::from_secs(300))
            .build()?,
    };
    harness::register(&api.base, &api.token, &ids).await?;
    let target = Target::spread(agent_addr.parse().context("agent address")?);
    let n = options.devices as f64;
    let usage = || procstat::usage(pid).context("the control plane ended");

    // First connections (each device's record learns its agent), then
    // pass 1: connections alone, as pass 2 makes them, to be subtracted.
    pass(target, &tokens, options.batch, false).await?;
    harness::wait_for(
        "every device's hello",
        Duration::from_secs(300),
        async || {
            let summary = api.get("/summary").await?;
            Ok(summary["agentsPresent"].as_u64() == Some(options.devices as u64))
        },
    )
    .await?;
    let before_hello = usage()?;
    pass(target, &tokens, options.batch, false).await?;
    let after_hello = usage()?;

    // Pass 2: connections with an assessment each.
    let load_before = procstat::load_average().unwrap_or(f64::NAN);
    let store_before = size_of(&data);
    let before: Usage = usage()?;
    let report_seconds = pass(target, &tokens, options.batch, true).await?;
    let after: Usage = usage()?;
    let store_after = size_of(&data);
    let load_after = procstat::load_average().unwrap_or(f64::NAN);
    let fleet = api.get("/patch-status").await?;
    if fleet["neverAssessed"].as_u64() != Some(0)
        || fleet["devices"].as_u64() != Some(options.devices as u64)
    {
        bail!("not every device's assessment was kept: {fleet}");
    }

    let patch_status_ms = timed(&api, "/patch-status", options.queries).await?;
    let fleet_page_ms = timed(
        &api,
        "/devices/page?offset=0&limit=50&q=&patch=security",
        options.queries,
    )
    .await?;
    let alerts_ms = timed(&api, "/alerts", options.queries).await?;
    let devices_page_ms = timed(&api, "/devices?limit=500", options.queries).await?;
    drop(cp);
    if options.keep {
        eprintln!("kept {}", dir.keep().display());
    }
    let per_device = |assessed: Duration, connected: Duration| {
        assessed.saturating_sub(connected).as_secs_f64() * 1000.0 / n
    };
    let hello_cpu = after_hello.cpu.saturating_sub(before_hello.cpu);
    let hello_written = after_hello
        .written_bytes
        .saturating_sub(before_hello.written_bytes);
    Ok(PatchFigures {
        devices: options.devices,
        report_seconds,
        cpu_ms_per_assessment: per_device(after.cpu.saturating_sub(before.cpu), hello_cpu),
        store_kib_per_device: store_after.saturating_sub(store_before) as f64 / 1024.0 / n,
        written_kib_per_assessment: after
            .written_bytes
            .saturating_sub(before.written_bytes)
            .saturating_sub(hello_written) as f64
            / 1024.0
            / n,
        patch_status_ms,
        fleet_page_ms,
        alerts_ms,
        devices_page_ms,
        load: (load_before, load_after),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_simulated_fleet_mixes_up_to_date_security_and_reboots_within_bounds() {
        let all: Vec<PatchAssessment> = (0..100).map(assessment_of).collect();
        assert!(all.iter().any(|a| a.upgradable == 0));
        assert!(all.iter().any(|a| a.security > 0));
        assert!(all.iter().any(|a| a.reboot_pending.is_some()));
        for a in &all {
            assert_eq!(a.pending.len(), a.upgradable as usize);
            assert!(a.pending.len() <= drover_model::model::MAX_LISTED_PACKAGES);
            assert_eq!(
                a.pending.iter().filter(|p| p.security).count(),
                a.security as usize
            );
        }
    }
}
