//! TaskRun rules through the real API and real agents (a failing canary is
//! in scenarios.rs, over every transport): a spec is immutable, a
//! selector with no match fails with NoTargets, matchExpressions fail closed,
//! and the agents' link works over TLS.

use drover_tests::{API_VERSION, AgentProcess, ControlPlane};
use serde_json::json;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn specs_are_immutable_and_bad_runs_are_refused() {
    let cp = ControlPlane::start(&[]);
    cp.apply_device("lone-1", &["prod"], json!({})).await;
    let run = |name: &str, groups: serde_json::Value, selector: serde_json::Value| {
        json!({
            "apiVersion": API_VERSION, "kind": "TaskRun", "metadata": {"name": name},
            "spec": {"allowedGroups": groups, "targetSelector": selector, "deadlineSeconds": 600, "systemUpgradeV1": {}}
        })
    };
    let http = drover_tests::http_client();
    let post = |body: serde_json::Value| {
        let request = http
            .post(format!("{}/api/v1/apply", cp.api))
            .bearer_auth(&cp.token)
            .json(&body);
        async move {
            let response = request.send().await.expect("post");
            let status = response.status().as_u16();
            (
                status,
                response.json::<serde_json::Value>().await.expect("json"),
            )
        }
    };
    // The device has no agent, so nothing matches: NoTargets.
    let (code, _) = post(run("empty", json!(["prod"]), json!({}))).await;
    assert_eq!(code, 201);
    let finished = cp.wait_run_finished("empty", Duration::from_secs(10)).await;
    assert_eq!(finished["status"]["reason"], "NoTargets", "{finished}");
    // A device was selected (it has no agent): nothing unmatched to name.
    assert_eq!(
        finished["status"]["latestError"],
        "no authorized device with an agent matches the selector",
        "{finished}"
    );
    // A misspelt group: the run's error names it and the nearest group.
    let (code, _) = post(run("typo", json!(["prdo"]), json!({}))).await;
    assert_eq!(code, 201);
    let finished = cp.wait_run_finished("typo", Duration::from_secs(10)).await;
    assert_eq!(
        finished["status"]["latestError"],
        "no authorized device with an agent matches the selector: \
         no device is in the group \"prdo\" (did you mean \"prod\"?)",
        "{finished}"
    );
    // Same spec again: unchanged. A changed spec: refused.
    let (code, body) = post(run("empty", json!(["prod"]), json!({}))).await;
    assert_eq!((code, body["result"].as_str()), (200, Some("unchanged")));
    let (code, body) = post(run("empty", json!(["prod", "lab"]), json!({}))).await;
    assert_eq!(code, 409, "{body}");
    assert!(
        body["error"].as_str().unwrap_or("").contains("immutable"),
        "{body}"
    );
    // matchExpressions fail closed; allowedGroups must not be empty.
    let (code, body) = post(run(
        "exprs",
        json!(["prod"]),
        json!({"matchExpressions": [{"key": "a", "operator": "In"}]}),
    ))
    .await;
    assert_eq!(code, 422, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or("")
            .contains("matchExpressions"),
        "{body}"
    );
    let (code, body) = post(run("nogroups", json!([]), json!({}))).await;
    assert_eq!(code, 422, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_connect_over_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let drover_tests::LocalhostCert {
        pem: _,
        cert_path,
        key_path,
    } = drover_tests::localhost_cert(dir.path());
    let cp = ControlPlane::start(&[
        "--agent-tls-cert",
        cert_path.to_str().expect("utf-8"),
        "--agent-tls-key",
        key_path.to_str().expect("utf-8"),
    ]);
    cp.apply_device("tls-1", &["secure"], json!({})).await;
    let port = cp.agent_url.rsplit(':').next().expect("port");
    let url = format!("wss://localhost:{port}");
    let extra = "";
    let agent_dir = cp.dir.path().join("tls-1");
    let token = cp.device_token("tls-1");
    let agent = AgentProcess::start(&agent_dir, "tls-1", &url, &token, extra);
    // Point the agent at the test CA instead of the system bundle.
    let config = std::fs::read_to_string(&agent.config).expect("config");
    let config = config.replace(
        "heartbeat_seconds = 1",
        &format!(
            "heartbeat_seconds = 1\nca_file = {:?}",
            cert_path.display().to_string()
        ),
    );
    std::fs::write(&agent.config, config).expect("config");
    let mut agent = agent;
    agent.kill9();
    agent.restart();
    cp.wait_for_agents(&["tls-1"]).await;
    cp.apply_upgrade_run("tls-run", "secure", 600).await;
    let run = cp
        .wait_run_finished("tls-run", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}\n{}", agent.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_revoked_before_release_fails_the_run_with_target_revoked() {
    let cp = ControlPlane::start(&[]);
    cp.apply_device("rv-canary", &["fleet"], json!({"canary": "true"}))
        .await;
    cp.apply_device("rv-worker", &["fleet"], json!({})).await;
    let canary_dir = cp.dir.path().join("rv-canary");
    std::fs::create_dir_all(&canary_dir).expect("dir");
    let hold = canary_dir.join("hold");
    let reached = canary_dir.join("reached");
    std::fs::write(&hold, "").expect("hold");
    let testing = drover_tests::hold_config(&hold, &reached);
    let _canary = AgentProcess::start(
        &canary_dir,
        "rv-canary",
        &cp.agent_url,
        &cp.device_token("rv-canary"),
        &testing,
    );
    let worker = AgentProcess::start(
        &cp.dir.path().join("rv-worker"),
        "rv-worker",
        &cp.agent_url,
        &cp.device_token("rv-worker"),
        "",
    );
    cp.wait_for_agents(&["rv-canary", "rv-worker"]).await;
    cp.apply_upgrade_run("rv-run", "fleet", 600).await;
    drover_tests::eventually(
        Duration::from_secs(30),
        "the canary to be mid-job",
        || async { reached.exists().then_some(()) },
    )
    .await;
    // The worker leaves the allowed group while the canary runs.
    cp.apply_device("rv-worker", &["elsewhere"], json!({}))
        .await;
    std::fs::remove_file(&hold).expect("release");
    let run = cp
        .wait_run_finished("rv-run", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Failed", "{run}");
    assert_eq!(run["status"]["reason"], "TargetRevoked", "{run}");
    assert!(
        run["status"]["latestError"]
            .as_str()
            .unwrap_or("")
            .contains("rv-worker"),
        "{run}"
    );
    assert_eq!(
        run["status"]["targets"], 2,
        "the frozen plan kept both; nobody was substituted"
    );
    assert_eq!(
        worker.jobs(),
        json!([]),
        "the revoked device never received an intent"
    );
}

/// Issue 8, 4: a device whose clock is two hours fast is neither refused as
/// expired on arrival nor failed as late: expiry is judged on the control
/// plane's time (sent with every job) and success by when the result
/// reached the control plane (A12).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_device_clock_is_not_failed_early() {
    let cp = ControlPlane::start(&[]);
    cp.apply_device("fast-1", &["fleet"], json!({})).await;
    let dir = cp.dir.path().join("fast-1");
    let token = cp.device_token("fast-1");
    let agent = AgentProcess::start(
        &dir,
        "fast-1",
        &cp.agent_url,
        &token,
        "[testing]\nclock_offset_seconds = 7200\n",
    );
    cp.wait_for_agents(&["fast-1"]).await;
    cp.apply_upgrade_run("fast-run", "fleet", 600).await;
    let run = cp
        .wait_run_finished("fast-run", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}\n{}", agent.log());
    let targets = cp.targets("fast-run").await;
    let status = &targets[0]["status"];
    let start: jiff::Timestamp = run["status"]["startTime"]
        .as_str()
        .expect("start")
        .parse()
        .expect("time");
    let claimed: jiff::Timestamp = status["completionHeartbeatAt"]
        .as_str()
        .expect("completion")
        .parse()
        .expect("time");
    assert!(
        claimed > start + jiff::SignedDuration::from_secs(600),
        "the device's clock was past the deadline: {status}"
    );
}
