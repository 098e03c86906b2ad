//! An agent killed with SIGKILL in the middle of a job, then restarted: the
//! job resumes at the step it was in, no finished step runs again, the job is
//! not run a second time, and its final status reaches the control plane.

use drover_tests::{AgentProcess, ControlPlane, SmallDisk, eventually};
use serde_json::json;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_interrupted_by_sigkill_resumes_and_reports_once() {
    sigkill_mid_job("").await;
}

/// The same crash on sled, the store measured beside redb (issue 15): the
/// test binaries are built with every feature, so the agent has it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_interrupted_by_sigkill_resumes_and_reports_once_on_sled() {
    sigkill_mid_job("store = \"sled\"").await;
}

async fn sigkill_mid_job(top: &str) {
    let cp = ControlPlane::start(&[]);
    cp.apply_device("crash-1", &["crash"], json!({})).await;
    let dir = cp.dir.path().join("agent-crash-1");
    let hold = dir.join("hold");
    let reached = dir.join("reached");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(&hold, "").expect("hold file");
    let testing = drover_tests::hold_config(&hold, &reached);
    let token = cp.device_token("crash-1");
    let mut agent = AgentProcess::start_with(
        &dir,
        "crash-1",
        &cp.agent_url,
        &token,
        top,
        "mode = \"simulate\"\nmin_free_mib = 10",
        &testing,
    );
    cp.wait_for_agents(&["crash-1"]).await;
    cp.apply_upgrade_run("crash-run", "crash", 600).await;

    eventually(
        Duration::from_secs(30),
        "the agent to reach full-upgrade",
        || async { reached.exists().then_some(()) },
    )
    .await;
    // The control plane saw the job running full-upgrade before the crash
    // (the agent reports the step's start as it reaches the hold).
    eventually(
        Duration::from_secs(10),
        "full-upgrade's start at the control plane",
        || async {
            let targets = cp.targets("crash-run").await;
            let status = &targets.first()?["status"];
            (status["state"] == "Running" && status["steps"][2]["startedAt"].is_string())
                .then_some(())
        },
    )
    .await;
    agent.kill9();
    let before = cp.targets("crash-run").await;
    let started_before = before[0]["status"]["steps"][2]["startedAt"].clone();
    assert!(
        started_before.is_string(),
        "full-upgrade had started: {before:?}"
    );

    std::fs::remove_file(&hold).expect("release the hold");
    agent.restart();
    let run = cp
        .wait_run_finished("crash-run", Duration::from_secs(90))
        .await;
    assert_eq!(
        run["status"]["phase"],
        "Complete",
        "{run}\n{}\n{}",
        agent.log(),
        cp.log()
    );

    let targets = cp.targets("crash-run").await;
    let status = &targets[0]["status"];
    assert_eq!(status["state"], "Succeeded");
    let steps = status["steps"].as_array().expect("steps");
    let tries: Vec<u64> = steps
        .iter()
        .map(|s| s["tries"].as_u64().unwrap_or(99))
        .collect();
    assert_eq!(tries, vec![1, 1, 1, 1, 1], "no step ran twice: {steps:?}");
    assert_eq!(
        steps[2]["startedAt"], started_before,
        "full-upgrade resumed from its durable start, not a new one"
    );
    assert!(status["completionHeartbeatAt"].is_string());

    // The agent holds exactly one record of the job, and it ran once.
    let jobs = agent.jobs();
    let jobs = jobs.as_array().expect("jobs");
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0]["state"], "Succeeded");
    assert!(
        agent.log().contains("job progress"),
        "the restarted agent resumed the job"
    );
    let store = if top.contains("sled") {
        "agent.sled"
    } else {
        "agent.redb"
    };
    assert!(
        dir.join("state").join(store).exists(),
        "the agent kept its jobs in {store}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_in_a_crash_loop_fails_with_a_clear_reason() {
    // Any device offline is an alert at once here.
    let cp = ControlPlane::start(&["--offline-alert-minutes", "0"]);
    cp.apply_device("loop-1", &["loop"], json!({})).await;
    let dir = cp.dir.path().join("agent-loop-1");
    let hold = dir.join("hold");
    let reached = dir.join("reached");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(&hold, "").expect("hold file");
    // The hold is never released: every start dies in the same step.
    let extra = format!(
        "[limits]\nmax_resumes = 2\n\n{}",
        drover_tests::hold_config(&hold, &reached)
    );
    let token = cp.device_token("loop-1");
    let mut agent = AgentProcess::start(&dir, "loop-1", &cp.agent_url, &token, &extra);
    cp.wait_for_agents(&["loop-1"]).await;
    cp.apply_upgrade_run("loop-run", "loop", 600).await;
    for _ in 0..3 {
        eventually(
            Duration::from_secs(30),
            "the agent to reach the step",
            || async { reached.exists().then_some(()) },
        )
        .await;
        std::fs::remove_file(&reached).expect("reset marker");
        agent.kill9();
        agent.restart();
    }
    let run = cp
        .wait_run_finished("loop-run", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Failed", "{run}");
    let error = run["status"]["latestError"].as_str().unwrap_or("");
    assert!(error.contains("crash or reboot loop"), "{error}");
    // The loop is a fact on the status too, which the alert follows.
    let targets = cp.targets("loop-run").await;
    assert_eq!(targets[0]["status"]["failure"], "resumeLoop", "{targets:?}");
    assert!(!reached.exists(), "the step did not run a fourth time");
    // The dashboard's alerts name the device stuck in the loop and, once
    // its agent is gone, the device offline.
    let alerts = cp.get("/alerts").await;
    let has = |alerts: &serde_json::Value, kind: &str| {
        alerts["items"].as_array().is_some_and(|items| {
            items
                .iter()
                .any(|a| a["kind"] == kind && a["resource"] == "device/loop-1")
        })
    };
    assert!(has(&alerts, "ResumeLoop"), "{alerts}");
    assert!(!has(&alerts, "DeviceOffline"), "{alerts}");
    agent.kill9();
    eventually(Duration::from_secs(30), "the offline alert", || async {
        let alerts = cp.get("/alerts").await;
        has(&alerts, "DeviceOffline").then_some(())
    })
    .await;
}

/// The state store's file system fills up: the agent says so in its log and
/// exits with EX_IOERR (74) rather than running on with a store that refuses
/// every write (redb does until it is opened again). The job is not lost:
/// it was never acknowledged, so once space returns and the service manager
/// restarts the agent, the control plane delivers it again and it runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_the_agent_clearly_and_loses_no_job() {
    let cp = ControlPlane::start(&[]);
    let dir = cp.dir.path().join("agent-full-1");
    let Some(disk) = SmallDisk::mount(&dir.join("state"), "1m") else {
        drover_tests::cannot_run_here(
            "a_full_disk_stops_the_agent_clearly_and_loses_no_job",
            "mounting a small tmpfs needs root",
        );
        return;
    };
    cp.apply_device("full-1", &["full"], json!({})).await;
    let token = cp.device_token("full-1");
    let mut agent = AgentProcess::start(&dir, "full-1", &cp.agent_url, &token, "");
    cp.wait_for_agents(&["full-1"]).await;
    agent.wait_idle_and_flushed(Duration::from_secs(20)).await;

    let filler = disk.fill();
    cp.apply_upgrade_run("full-run", "full", 600).await;
    let code = agent.wait_exit(Duration::from_secs(60)).await;
    let log = agent.log();
    assert_eq!(code, Some(74), "exit status EX_IOERR\n{log}");
    assert!(
        log.contains("free space on its file system") && log.contains(&dir.display().to_string()),
        "the log names the problem and the state directory\n{log}"
    );
    let run = cp.get("/taskruns/full-run").await;
    assert_ne!(run["status"]["phase"], "Complete", "{run}");

    std::fs::remove_file(&filler).expect("free the space");
    agent.restart();
    let run = cp
        .wait_run_finished("full-run", Duration::from_secs(90))
        .await;
    assert_eq!(
        run["status"]["phase"],
        "Complete",
        "{run}\n{}\n{}",
        agent.log(),
        cp.log()
    );
    let jobs = agent.jobs();
    let jobs = jobs.as_array().expect("jobs");
    assert_eq!(jobs.len(), 1, "the job ran once: {jobs:?}");
    assert_eq!(jobs[0]["state"], "Succeeded");
}

/// The control plane's data directory fills up: a write the API asked for
/// fails with an error, and `serve` says so in its log and exits with
/// EX_IOERR (74) rather than running on with a store that refuses every
/// write until it is opened again (redb). Once space returns and it is
/// started again (systemd does), what it had stored is there and writes
/// go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_the_control_plane_clearly_and_loses_nothing() {
    let dir = ControlPlane::prepare();
    let data = dir.path().join("data");
    let kept = dir.path().join("data.prepared");
    std::fs::rename(&data, &kept).expect("set the prepared data aside");
    let Some(disk) = SmallDisk::mount(&data, "8m") else {
        drover_tests::cannot_run_here(
            "a_full_disk_stops_the_control_plane_clearly_and_loses_nothing",
            "mounting a small tmpfs needs root",
        );
        return;
    };
    for entry in std::fs::read_dir(&kept).expect("prepared data") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), data.join(entry.file_name())).expect("copy");
    }
    let mut cp = ControlPlane::start_in(dir, &[]);
    cp.apply_device("before-full", &["g"], json!({})).await;

    // redb has room inside its file for a few commits: writes go on until
    // the file must grow. Every write answered Ok must survive.
    let filler = disk.fill();
    let mut stored = vec!["before-full".to_owned()];
    let mut refused = None;
    for i in 0..2000 {
        let name = format!("while-full-{i}");
        match cp
            .try_apply(json!({
                "apiVersion": drover_tests::API_VERSION, "kind": "Device",
                "metadata": {"name": name, "labels": {"padding": "x".repeat(60)}},
                "spec": {"groups": ["g"]}
            }))
            .await
        {
            Ok(_) => stored.push(name),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let refused = refused.expect("a write on a full disk fails");
    assert!(
        refused.starts_with("503") && refused.contains("No space left"),
        "the API says why: {refused}"
    );
    let code = cp.wait_exit(Duration::from_secs(30)).await;
    let log = cp.log();
    assert_eq!(code, Some(74), "exit status EX_IOERR\n{log}");
    assert!(
        log.contains("refused a write") && log.contains(&data.display().to_string()),
        "the log names the problem and the data directory\n{log}"
    );

    std::fs::remove_file(&filler).expect("free the space");
    cp.restart();
    let devices = cp.get("/devices").await;
    let ids: Vec<&str> = devices
        .as_array()
        .expect("devices")
        .iter()
        .filter_map(|d| d["id"].as_str())
        .collect();
    for name in &stored {
        assert!(ids.contains(&name.as_str()), "{name} was stored: {ids:?}");
    }
    cp.apply_device("after-full", &["g"], json!({})).await;
}
