//! Patch assessments against real apt inside a disposable Debian root
//! (issue 31): a real drover-agent in upgrade mode, pointed at the root,
//! assesses it as it changes: up to date; an ordinary update pending; a
//! security update pending from a local archive whose Release names a
//! `-security` suite; a reboot pending. The job refreshes the lists and
//! installs nothing. The same job runs from the control plane (a scripted
//! one here, sending the signed intent) and from the device itself
//! (`drover-agent assess`, through the running agent's queue).

use drover_tests::debroot::{Pkg, Sandbox};
use drover_tests::script::{Script, intent, new_job};
use drover_tests::{API_VERSION, AgentProcess, ControlPlane, eventually, toml_string};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::net::TcpListener;

const DEVICE: &str = "assess-1";
const APT_TIMEOUT: Duration = Duration::from_secs(180);

/// `device` registered in the production group, and its agent in upgrade
/// mode on the sandbox's root, connected to `cp` over WebSocket.
async fn device_on(cp: &ControlPlane, sandbox: &Sandbox, device: &str) -> AgentProcess {
    cp.apply_device(device, &["production"], json!({})).await;
    let transport = format!(
        "kind = \"websocket\"\nserver_url = {}\ntoken = {}\nheartbeat_seconds = 1\nbackoff_max_seconds = 2\n",
        toml_string(&cp.agent_url),
        toml_string(&cp.device_token(device))
    );
    let agent = AgentProcess::start_full(
        &sandbox.dir.path().join("agent"),
        device,
        &transport,
        "",
        &format!(
            "mode = \"upgrade\"\nroot = {}\nmin_free_mib = 10",
            toml_string(&sandbox.root.display().to_string())
        ),
        "",
    );
    cp.wait_for_agents(&[device]).await;
    agent
}

/// A task run upgrading the production group, followed to Complete; when
/// it ended.
async fn upgrade_of_production(cp: &ControlPlane, name: &str) -> jiff::Timestamp {
    cp.apply_upgrade_run(name, "production", 600).await;
    let run = cp.wait_run_finished(name, Duration::from_secs(60)).await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}");
    run["status"]["completionTime"]
        .as_str()
        .expect("completion time")
        .parse()
        .expect("time")
}

/// One assessment sent as a fleet job; its output.
async fn assess(server: &mut Script) -> Value {
    let job = new_job();
    server
        .send_job(intent(&job, DEVICE, json!({"patchAssessmentV1": {}}), 600))
        .await;
    let result = server.result_within(&job, APT_TIMEOUT).await;
    let status = &result["status"];
    assert_eq!(status["state"], "Succeeded", "{status}");
    status["output"]["assessment"].clone()
}

fn pending(assessment: &Value) -> Vec<(String, Option<String>, String, bool)> {
    assessment["pending"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p["name"].as_str().unwrap_or("?").to_owned(),
                p["from"].as_str().map(str::to_owned),
                p["to"].as_str().unwrap_or("?").to_owned(),
                p["security"] == true,
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assessments_read_what_is_pending_security_first_and_install_nothing() {
    let sandbox = Sandbox::new();
    let base = [
        Pkg::new("drover-assess-app", "1.0"),
        Pkg::new("drover-assess-lib", "1.0"),
    ];
    sandbox.publish(&base);
    sandbox.install(&["drover-assess-app", "drover-assess-lib"]);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("ws://{}", listener.local_addr().expect("addr"));
    let agent = AgentProcess::start_with(
        &sandbox.dir.path().join("agent"),
        DEVICE,
        &url,
        "token",
        "",
        &format!(
            "mode = \"upgrade\"\nroot = {}\nmin_free_mib = 10",
            toml_string(&sandbox.root.display().to_string())
        ),
        "",
    );
    let mut server = Script::accept(&listener, DEVICE).await;

    // Up to date: nothing pending, no security archive among the sources.
    let first = assess(&mut server).await;
    assert_eq!(first["upgradable"], 0, "{first}");
    assert_eq!(first["security"], 0, "{first}");
    assert_eq!(first["securityArchive"], false, "{first}");
    assert!(first["rebootPending"].is_null(), "{first}");
    assert!(
        first["runningKernel"]
            .as_str()
            .is_some_and(|k| !k.is_empty()),
        "{first}"
    );

    // An ordinary update: the app's 2.0 in the main archive. The job
    // refreshed the lists itself (nobody ran apt-get update here).
    sandbox.publish(&[
        Pkg::new("drover-assess-app", "2.0"),
        Pkg::new("drover-assess-lib", "1.0"),
    ]);
    let second = assess(&mut server).await;
    assert_eq!(second["upgradable"], 1, "{second}");
    assert_eq!(second["security"], 0, "{second}");
    assert_eq!(
        pending(&second),
        [(
            "drover-assess-app".to_owned(),
            Some("1.0".to_owned()),
            "2.0".to_owned(),
            false
        )]
    );

    // A security update: the lib's 1.1 from the security archive. It is
    // listed first, and the device now has a security archive.
    sandbox.publish_security(&[Pkg::new("drover-assess-lib", "1.1")]);
    let third = assess(&mut server).await;
    assert_eq!(third["upgradable"], 2, "{third}");
    assert_eq!(third["security"], 1, "{third}");
    assert_eq!(third["securityArchive"], true, "{third}");
    assert_eq!(
        pending(&third),
        [
            (
                "drover-assess-lib".to_owned(),
                Some("1.0".to_owned()),
                "1.1".to_owned(),
                true
            ),
            (
                "drover-assess-app".to_owned(),
                Some("1.0".to_owned()),
                "2.0".to_owned(),
                false
            ),
        ]
    );

    // A reboot pending: the device asks for one; the assessment says why.
    std::fs::create_dir_all(sandbox.path("/run")).expect("run dir");
    std::fs::write(sandbox.path("/run/reboot-required"), "").expect("reboot-required");
    let fourth = assess(&mut server).await;
    assert!(
        fourth["rebootPending"]
            .as_str()
            .is_some_and(|r| r.contains("reboot-required")),
        "{fourth}"
    );
    // Assessing installed nothing, and never rebooted the root.
    assert_eq!(
        sandbox.package("drover-assess-app").as_deref(),
        Some("1.0 ii")
    );
    assert_eq!(
        sandbox.package("drover-assess-lib").as_deref(),
        Some("1.0 ii")
    );
    assert!(!sandbox.path("/run/drover-reboot-requested").exists());

    // On the device itself: `drover-agent assess` goes through the running
    // agent's queue and prints what is pending, security first.
    let text = agent.assess();
    assert!(
        text.contains("assessment: 2 upgradable, 1 security") && text.contains("reboot pending"),
        "{text}"
    );
    let lib = text.find("drover-assess-lib").expect("the lib listed");
    let app = text.find("drover-assess-app").expect("the app listed");
    assert!(lib < app, "the security update first: {text}");
    assert!(
        text.lines()
            .any(|l| l.contains("drover-assess-lib") && l.trim_end().ends_with("security")),
        "{text}"
    );
}

/// The fleet's view: a Deployment asks a real device (upgrade mode, a
/// disposable root with an ordinary and a security update pending) for an
/// assessment; the control plane keeps it as the device's latest, and
/// `get devices -o wide` and `describe device` show it. Then the device
/// assesses on its own (`drover-agent assess`: a local job the control
/// plane never sent) after a reboot became pending, and that report
/// replaces it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_keeps_each_devices_latest_assessment_from_the_fleet_or_the_device() {
    let sandbox = Sandbox::new();
    sandbox.publish(&[
        Pkg::new("drover-assess-app", "1.0"),
        Pkg::new("drover-assess-lib", "1.0"),
    ]);
    sandbox.install(&["drover-assess-app", "drover-assess-lib"]);
    sandbox.publish(&[
        Pkg::new("drover-assess-app", "2.0"),
        Pkg::new("drover-assess-lib", "1.0"),
    ]);
    sandbox.publish_security(&[Pkg::new("drover-assess-lib", "1.1")]);
    let cp = ControlPlane::start(&[]);
    let agent = device_on(&cp, &sandbox, "patch-1").await;
    let drover = |args: &[&str]| {
        let out = cp.cli(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Before any assessment: when its agent first connected is kept (a
    // device never assessed is judged from it, NotAssessed after 2 days).
    let before = cp.get("/devices/patch-1").await;
    assert!(before["patch"].is_null(), "{before}");
    assert!(before["firstConnected"].is_string(), "{before}");
    assert_eq!(cp.get_status("/devices/patch-1/assessment").await, 404);

    cp.apply(json!({
        "apiVersion": API_VERSION, "kind": "Deployment", "metadata": {"name": "assess-now"},
        "spec": {"targets": {"all": true}, "patchAssessmentV1": {}, "maxConcurrency": 10,
                 "deadlineSeconds": 3600}
    }))
    .await;
    let patch = eventually(APT_TIMEOUT, "the fleet's assessment kept", || async {
        let device = cp.get("/devices/patch-1").await;
        (!device["patch"].is_null()).then(|| device["patch"].clone())
    })
    .await;
    assert_eq!(patch["upgradable"], 2, "{patch}");
    assert_eq!(patch["security"], 1, "{patch}");
    assert!(patch["oldestSecuritySince"].is_string(), "{patch}");
    assert!(patch["rebootPending"].is_null(), "{patch}");
    let wide = drover(&["get", "devices", "-o", "wide"]);
    let header = wide.lines().next().unwrap_or("");
    for column in ["UPDATES", "SECURITY", "OLDEST", "REBOOT"] {
        assert!(header.contains(column), "{wide}");
    }
    let row: Vec<&str> = wide
        .lines()
        .find(|l| l.starts_with("patch-1 "))
        .unwrap_or_else(|| panic!("{wide}"))
        .split_whitespace()
        .collect();
    // UPDATES, SECURITY, OLDEST (an age), REBOOT.
    let n = row.len();
    assert_eq!(
        (row[n - 4], row[n - 3], row[n - 1]),
        ("2", "1", "no"),
        "{wide}"
    );
    let described = drover(&["describe", "device", "patch-1"]);
    assert!(
        described.contains("patch status: 2 updates pending, 1 security"),
        "{described}"
    );
    let lib_row = described
        .lines()
        .find(|l| l.starts_with("drover-assess-lib "))
        .unwrap_or_else(|| panic!("{described}"));
    assert!(
        lib_row.contains("1.0") && lib_row.contains("1.1") && lib_row.contains("yes"),
        "{described}"
    );
    let first_since = patch["oldestSecuritySince"].clone();
    // The fleet's summary: the API, the CLI and the metrics say the same.
    let fleet = cp.get("/patch-status").await;
    for (key, count) in [
        ("devices", 1),
        ("upToDate", 0),
        ("withUpdates", 1),
        ("withSecurityUpdates", 1),
        ("securityUnder1Day", 1),
        ("rebootPending", 0),
        ("neverAssessed", 0),
    ] {
        assert_eq!(fleet[key], count, "{key}: {fleet}");
    }
    let summary = drover(&["patch-status"]);
    assert!(
        summary
            .lines()
            .any(|l| l.starts_with("with security updates:") && l.contains(" 1  (")),
        "{summary}"
    );
    // The labels the control plane maintains: shown beside the device's
    // own, matched by a selector, refused in a manifest.
    assert!(
        wide.lines()
            .any(|l| l.starts_with("patch-1 ") && l.contains("drover.io/security-updates=pending")),
        "{wide}"
    );
    let selecting = |value: &str| {
        format!(
            "apiVersion: {API_VERSION}\nkind: TaskRun\nmetadata:\n  name: security-now\nspec:\n  \
             allowedGroups: [production]\n  targetSelector:\n    matchLabels:\n      \
             drover.io/security-updates: {value}\n  deadlineSeconds: 600\n  systemUpgradeV1: {{}}\n"
        )
    };
    let file = cp.dir.path().join("security-now.yaml");
    for (value, targets, exit) in [("pending", "targets: 1", 0), ("none", "targets: 0", 1)] {
        std::fs::write(&file, selecting(value)).expect("write");
        let out = cp.cli(&["apply", "-f", file.to_str().expect("utf-8"), "--dry-run"]);
        let dry = String::from_utf8_lossy(&out.stdout);
        assert!(dry.contains(targets), "{value}: {dry}");
        // A selection of no device says why and exits 1.
        assert_eq!(out.status.code(), Some(exit), "{value}: {dry}");
    }
    assert!(
        String::from_utf8_lossy(
            &cp.cli(&["apply", "-f", file.to_str().expect("utf-8"), "--dry-run"])
                .stdout
        )
        .contains(
            "matched nothing: no device has drover.io/security-updates=none (its values: pending)"
        ),
        "the value no device has"
    );
    let labelled = cp.dir.path().join("labelled.yaml");
    std::fs::write(
        &labelled,
        format!(
            "apiVersion: {API_VERSION}\nkind: Device\nmetadata:\n  name: patch-1\n  labels:\n    \
             drover.io/security-updates: none\nspec:\n  groups: [production]\n"
        ),
    )
    .expect("write");
    let out = cp.cli(&["apply", "-f", labelled.to_str().expect("utf-8")]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("labels under drover.io/ are maintained"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metrics = cp.metrics().await;
    for line in [
        "drover_devices_patch{state=\"with_security_updates\"} 1",
        "drover_devices_patch{state=\"up_to_date\"} 0",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in:\n{metrics}");
    }

    // The device assesses on its own after a reboot became pending: the
    // control plane never sent that job, and keeps its report.
    std::fs::create_dir_all(sandbox.path("/run")).expect("run dir");
    std::fs::write(sandbox.path("/run/reboot-required"), "").expect("reboot-required");
    agent.assess();
    let patch = eventually(
        Duration::from_secs(30),
        "the device's own assessment kept",
        || async {
            let device = cp.get("/devices/patch-1").await;
            device["patch"]["rebootPending"]
                .is_string()
                .then(|| device["patch"].clone())
        },
    )
    .await;
    assert_eq!(
        patch["oldestSecuritySince"], first_since,
        "the security update still waits since the first assessment saw it"
    );
    let wide = drover(&["get", "devices", "-o", "wide"]);
    let row = wide
        .lines()
        .find(|l| l.starts_with("patch-1 "))
        .unwrap_or_else(|| panic!("{wide}"));
    assert!(row.trim_end().ends_with("yes"), "{wide}");
    assert_eq!(cp.get("/patch-status").await["rebootPending"], 1);
}

/// The agent assesses on its own schedule: a first time after its start
/// (within its offset, an eighth of the period at most), and at once after
/// an upgrade ends; each report reaches the control plane. Simulate mode:
/// apt only reads the host's lists, nothing is refreshed or changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_assesses_after_its_start_and_after_every_upgrade() {
    let cp = ControlPlane::start(&[]);
    cp.apply_device("sched-assess-1", &["production"], json!({}))
        .await;
    let token = cp.device_token("sched-assess-1");
    let dir = tempfile::tempdir().expect("tempdir");
    let _agent = AgentProcess::start_with(
        dir.path(),
        "sched-assess-1",
        &cp.agent_url,
        &token,
        "",
        "mode = \"simulate\"\nmin_free_mib = 10",
        // A two-minute period: the first assessment within 15 s of the
        // start, the schedule looked at every 12 s; the next periodic one
        // two minutes after the first.
        "[assessment]\nevery_minutes = 2\n",
    );
    cp.wait_for_agents(&["sched-assess-1"]).await;
    let assessed_at = |device: Value| {
        device["patch"]["assessedAt"]
            .as_str()
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
    };
    let first = eventually(
        Duration::from_secs(60),
        "the agent's first assessment at the control plane",
        || async { assessed_at(cp.get("/devices/sched-assess-1").await) },
    )
    .await;
    // An upgrade: once it ends, an assessment follows at once (well before
    // the next period would bring one).
    let ended = upgrade_of_production(&cp, "upgrade-then-assess").await;
    let after = eventually(
        Duration::from_secs(30),
        "an assessment after the upgrade",
        || async {
            assessed_at(cp.get("/devices/sched-assess-1").await)
                .filter(|t| *t > first && *t >= ended)
        },
    )
    .await;
    assert!(
        after.duration_since(ended) < jiff::SignedDuration::from_secs(30),
        "the assessment followed the upgrade at once: {ended} → {after}"
    );
}

/// "At once after an upgrade" means seconds, not the next look of the
/// schedule (a minute apart with the default daily period): the agent looks
/// again as soon as a job ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_default_daily_period_an_assessment_follows_an_upgrade_within_seconds() {
    let cp = ControlPlane::start(&[]);
    cp.apply_device("daily-assess-1", &["production"], json!({}))
        .await;
    let token = cp.device_token("daily-assess-1");
    let dir = tempfile::tempdir().expect("tempdir");
    let agent = AgentProcess::start_with(
        dir.path(),
        "daily-assess-1",
        &cp.agent_url,
        &token,
        "",
        "mode = \"simulate\"\nmin_free_mib = 10",
        "[assessment]\nevery_minutes = 1440\n",
    );
    // The schedule's first assessment waits for this device's offset (up to
    // three hours); the upgrade's end makes one due at once.
    cp.wait_for_agents(&["daily-assess-1"]).await;
    upgrade_of_production(&cp, "daily-upgrade").await;
    eventually(
        Duration::from_secs(90),
        "the assessment's report at the control plane",
        || async {
            let patch = &cp.get("/devices/daily-assess-1").await["patch"];
            (!patch.is_null()).then_some(())
        },
    )
    .await;
    // On the agent's own clock, from its job list: when the upgrade ended
    // and when the assessment was queued (not how long apt took for it).
    let jobs = agent.jobs();
    let time_of = |kind: &str, field: &str| -> jiff::Timestamp {
        jobs.as_array()
            .into_iter()
            .flatten()
            .find(|j| j["kind"] == kind)
            .and_then(|j| j[field].as_str())
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{kind} {field} in {jobs}"))
    };
    let ended = time_of("systemUpgradeV1", "finishedAt");
    let queued = time_of("patchAssessmentV1", "acceptedAt");
    assert!(
        queued.duration_since(ended) < jiff::SignedDuration::from_secs(3),
        "the assessment was queued at once after the upgrade: {ended} → {queued}"
    );
}

/// Alerts an operator acts on: with the limits at zero, a pending security
/// update and a pending reboot raise alerts at once; an acknowledgement
/// (by whom, when) holds while the condition lasts, through further
/// assessments; once the condition clears the alert goes, and when it
/// returns it is raised again, unacknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_alert_stays_quiet_until_its_condition_clears_and_returns() {
    let sandbox = Sandbox::new();
    sandbox.publish(&[Pkg::new("drover-assess-lib", "1.0")]);
    sandbox.install(&["drover-assess-lib"]);
    sandbox.publish_security(&[Pkg::new("drover-assess-lib", "1.1")]);
    let cp = ControlPlane::start(&["--security-alert-days", "0", "--reboot-alert-hours", "0"]);
    let agent = device_on(&cp, &sandbox, "alert-1").await;
    let assess = || {
        agent.assess();
    };
    let alert = |kind: &'static str| {
        let cp = &cp;
        async move {
            let alerts = cp.get("/alerts").await;
            alerts["items"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|a| a["kind"] == kind && a["resource"] == "device/alert-1")
                .cloned()
        }
    };
    assess();
    let raised = eventually(Duration::from_secs(30), "the security alert", || {
        alert("SecurityUpdatesWaiting")
    })
    .await;
    assert_eq!(raised["severity"], "critical", "{raised}");
    assert!(raised["acknowledged"].is_null(), "{raised}");
    let listed = cp.cli(&["alerts"]);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(
        text.lines()
            .any(|l| l.contains("SecurityUpdatesWaiting") && l.contains("device/alert-1")),
        "{text}"
    );

    // Acknowledged: said so, by whom.
    let out = cp.cli(&["alerts", "ack", "SecurityUpdatesWaiting", "device/alert-1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let acked = alert("SecurityUpdatesWaiting").await.expect("still listed");
    assert_eq!(
        acked["acknowledged"]["by"], "operator/admin (cli)",
        "{acked}"
    );
    // Another assessment, the update still pending: still acknowledged.
    let before = cp.get("/devices/alert-1").await["patch"]["assessedAt"].clone();
    assess();
    eventually(Duration::from_secs(30), "the next assessment", || async {
        (cp.get("/devices/alert-1").await["patch"]["assessedAt"] != before).then_some(())
    })
    .await;
    let still = alert("SecurityUpdatesWaiting").await.expect("still raised");
    assert_eq!(still["at"], raised["at"], "the same condition");
    assert!(!still["acknowledged"].is_null(), "{still}");
    // An ack for an alert that is not raised is refused.
    let out = cp.cli(&["alerts", "ack", "RebootPending", "device/alert-1"]);
    assert!(!out.status.success());

    // The condition clears: the security archive leaves the sources.
    std::fs::remove_file(sandbox.path("/etc/apt/sources.list.d/security.list")).expect("rm");
    assess();
    eventually(Duration::from_secs(30), "the alert cleared", || async {
        alert("SecurityUpdatesWaiting")
            .await
            .is_none()
            .then_some(())
    })
    .await;
    // It returns: raised again, not acknowledged.
    std::fs::write(
        sandbox.path("/etc/apt/sources.list.d/security.list"),
        "deb [trusted=yes] file:/srv/security ./\n",
    )
    .expect("sources");
    assess();
    let again = eventually(Duration::from_secs(30), "the alert raised again", || {
        alert("SecurityUpdatesWaiting")
    })
    .await;
    assert!(again["acknowledged"].is_null(), "{again}");
    assert_ne!(again["at"], raised["at"], "a new condition: {again}");
}
