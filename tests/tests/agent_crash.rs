//! An agent killed with SIGKILL in the middle of a job, then restarted: the
//! job resumes at the step it was in, no finished step runs again, the job is
//! not run a second time, and its final status reaches the control plane.

use drover_tests::{AgentProcess, ControlPlane, eventually};
use serde_json::json;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_interrupted_by_sigkill_resumes_and_reports_once() {
    let cp = ControlPlane::start(&[]);
    cp.apply_device("crash-1", &["crash"], json!({})).await;
    let dir = cp.dir.path().join("agent-crash-1");
    let hold = dir.join("hold");
    let reached = dir.join("reached");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(&hold, "").expect("hold file");
    let testing = drover_tests::hold_config(&hold, &reached);
    let token = cp.device_token("crash-1");
    let mut agent = AgentProcess::start(&dir, "crash-1", &cp.agent_url, &token, &testing);
    cp.wait_for_agents(&["crash-1"]).await;
    cp.apply_upgrade_run("crash-run", "crash", 600).await;

    eventually(
        Duration::from_secs(30),
        "the agent to reach full-upgrade",
        || async { reached.exists().then_some(()) },
    )
    .await;
    // The control plane saw the job running before the crash.
    eventually(
        Duration::from_secs(10),
        "a Running status at the control plane",
        || async {
            let targets = cp.targets("crash-run").await;
            (targets.first()?["status"]["state"] == "Running").then_some(())
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_in_a_crash_loop_fails_with_a_clear_reason() {
    let cp = ControlPlane::start(&[]);
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
    assert!(!reached.exists(), "the step did not run a fourth time");
}
