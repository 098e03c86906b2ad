//! The control plane against a hand-driven agent connection: delivery is
//! re-sent when not acked in time, bad input gets an error and the session
//! goes on, and a device's token opens only that device.

use drover_tests::ControlPlane;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

async fn connect(cp: &ControlPlane, device: &str, token: &str) -> Result<Ws, String> {
    drover_tests::agent_ws(cp, device, token).await
}

async fn hello(ws: &mut Ws, device: &str, jobs: Value) {
    let hello = json!({
        "type": "hello", "deviceId": device, "agentVersion": "hand", "bootId": "boot-1",
        "capabilities": ["systemUpgradeV1"], "jobs": jobs
    });
    ws.send(Message::text(hello.to_string()))
        .await
        .expect("hello");
}

async fn next_json(ws: &mut Ws, wait: Duration) -> Option<Value> {
    loop {
        let frame = tokio::time::timeout(wait, ws.next()).await.ok()??.ok()?;
        if let Message::Text(text) = frame {
            return serde_json::from_str(text.as_str()).ok();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_not_acked_in_time_is_sent_again_on_the_open_connection_and_after_reconnect() {
    let cp = ControlPlane::start(&["--ack-timeout-seconds", "2"]);
    cp.apply_device("hand-1", &["hand"], json!({})).await;
    let token = cp.device_token("hand-1");
    let mut ws = connect(&cp, "hand-1", &token).await.expect("connect");
    hello(&mut ws, "hand-1", json!([])).await;
    cp.wait_for_agents(&["hand-1"]).await;
    cp.apply_upgrade_run("hand-run", "hand", 600).await;
    let job = next_json(&mut ws, Duration::from_secs(15))
        .await
        .expect("a job");
    assert_eq!(job["type"], "job", "{job}");
    let job_id = job["intent"]["jobId"].clone();
    assert_eq!(job["intent"]["deviceId"], "hand-1");
    assert!(
        job["intent"]["expiresAt"].is_string(),
        "deadline copied into the intent: {job}"
    );
    // No ack within the ack timeout (2 s): the job returns to created and
    // is sent again on the connection that stays open.
    let started = std::time::Instant::now();
    let again = next_json(&mut ws, Duration::from_secs(10))
        .await
        .expect("the job again on the same connection");
    assert_eq!(again["type"], "job");
    assert_eq!(again["intent"]["jobId"], job_id);
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "not before the ack timeout"
    );
    drop(ws);

    let mut ws = connect(&cp, "hand-1", &token).await.expect("reconnect");
    hello(&mut ws, "hand-1", json!([])).await;
    let again = next_json(&mut ws, Duration::from_secs(10))
        .await
        .expect("the job again");
    assert_eq!(again["type"], "job");
    assert_eq!(again["intent"]["jobId"], job_id);

    // Acked now: another reconnect that lists the job as held gets nothing.
    ws.send(Message::text(
        json!({"type": "ack", "jobId": job_id}).to_string(),
    ))
    .await
    .expect("ack");
    drop(ws);
    let mut ws = connect(&cp, "hand-1", &token).await.expect("reconnect");
    let hello_boot2 = json!({
        "type": "hello", "deviceId": "hand-1", "agentVersion": "hand", "bootId": "boot-2",
        "capabilities": ["systemUpgradeV1"], "jobs": [{"jobId": job_id, "state": "Running"}]
    });
    ws.send(Message::text(hello_boot2.to_string()))
        .await
        .expect("hello");
    // The hello is handled (its boot id is committed), and whatever it makes
    // the core send goes out at once. An ack is kept in the core's memory,
    // not in a record (issue 29's state model would show it), so the check
    // is the connection itself: nothing arrives in the second after.
    drover_tests::eventually(
        Duration::from_secs(10),
        "the hello to be handled",
        || async { (cp.get("/devices/hand-1").await["bootId"] == "boot-2").then_some(()) },
    )
    .await;
    assert!(
        next_json(&mut ws, Duration::from_secs(1)).await.is_none(),
        "a held job is not re-sent"
    );
    let targets = cp.targets("hand-run").await;
    assert!(targets[0]["status"].is_null(), "{}", targets[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_an_error_and_the_session_goes_on() {
    let cp = ControlPlane::start(&[]);
    let token = cp.device_token("hand-2");
    let mut ws = connect(&cp, "hand-2", &token).await.expect("connect");
    hello(&mut ws, "hand-2", json!([])).await;
    let status = json!({
        "jobId": uuid::Uuid::new_v4().to_string(), "deviceId": "hand-2", "attempt": 1, "kind": "systemUpgradeV1",
        "state": "Succeeded", "steps": [], "error": null, "output": null, "acceptedAt": "2026-11-30T00:00:00Z",
        "startedAt": null, "finishedAt": null, "bootId": "b", "completionHeartbeatAt": null, "seq": 3
    });
    let cases: Vec<(String, &str)> = vec![
        ("{{{".into(), "not valid JSON"),
        (
            json!({"type": "launch"}).to_string(),
            "unknown message type",
        ),
        (
            json!({"type": "ack", "jobId": 7}).to_string(),
            "malformed ack",
        ),
        (
            json!({"type": "hello", "deviceId": "hand-2"}).to_string(),
            "malformed hello",
        ),
        (
            format!(
                r#"{{"type":"error","message":"{}"}}"#,
                "y".repeat(150 * 1024)
            ),
            "over the protocol limit",
        ),
        (
            json!({"type": "result", "outboxId": 5, "status": status}).to_string(),
            "unknown job",
        ),
    ];
    for (text, expected) in cases {
        ws.send(Message::text(text)).await.expect("send");
        let reply = next_json(&mut ws, Duration::from_secs(5))
            .await
            .expect("a reply");
        assert_eq!(reply["type"], "error", "{reply}");
        assert!(
            reply["message"].as_str().unwrap_or("").contains(expected),
            "{expected}: {reply}"
        );
    }
    // The refused result is still confirmed, so the agent can drop it.
    let received = next_json(&mut ws, Duration::from_secs(5))
        .await
        .expect("received");
    assert_eq!(received, json!({"type": "received", "outboxId": 5}));
    // The session still works: a heartbeat lands in the registry.
    let heartbeat = json!({"type": "heartbeat", "heartbeat": {
        "deviceId": "hand-2", "bootId": "boot-9", "seq": 1, "agentVersion": "hand", "capabilities": ["systemUpgradeV1"],
        "uptimeSeconds": 5, "osRelease": "Debian", "architecture": "arm64", "inventoryDigest": "d", "sentAt": "2026-11-30T00:00:00Z"
    }});
    ws.send(Message::text(heartbeat.to_string()))
        .await
        .expect("heartbeat");
    drover_tests::eventually(
        Duration::from_secs(5),
        "the heartbeat in the registry",
        || async {
            let device = cp.get("/devices/hand-2").await;
            (device["bootId"] == "boot-9" && device["architecture"] == "arm64").then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_token_opens_only_its_own_device() {
    let cp = ControlPlane::start(&[]);
    let token_a = cp.device_token("dev-a");
    assert!(connect(&cp, "dev-a", &token_a).await.is_ok());
    let refused = connect(&cp, "dev-b", &token_a)
        .await
        .expect_err("A's token must not open B");
    assert!(refused.contains("401"), "{refused}");
    let refused = connect(&cp, "dev-a", "").await.expect_err("no token");
    assert!(refused.contains("401"), "{refused}");
    // A hello naming another device on A's connection is refused too.
    let mut ws = connect(&cp, "dev-a", &token_a).await.expect("connect");
    hello(&mut ws, "dev-b", json!([])).await;
    let reply = next_json(&mut ws, Duration::from_secs(5))
        .await
        .expect("reply");
    assert!(
        reply["message"]
            .as_str()
            .unwrap_or("")
            .contains("token is for dev-a"),
        "{reply}"
    );
    // The operator API needs the operator token.
    let anonymous = drover_tests::http_client()
        .get(format!("{}/api/v1/devices", cp.api))
        .send()
        .await
        .expect("get");
    assert_eq!(anonymous.status(), 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_after_the_deadline_cannot_reopen_a_failed_run() {
    let cp = ControlPlane::start(&["--ack-timeout-seconds", "60"]);
    cp.apply_device("late-1", &["late"], json!({})).await;
    let token = cp.device_token("late-1");
    let mut ws = connect(&cp, "late-1", &token).await.expect("connect");
    hello(&mut ws, "late-1", json!([])).await;
    cp.wait_for_agents(&["late-1"]).await;
    cp.apply(json!({
        "apiVersion": drover_tests::API_VERSION, "kind": "TaskRun", "metadata": {"name": "late-run"},
        "spec": {"allowedGroups": ["late"], "deadlineSeconds": 3, "systemUpgradeV1": {}}
    }))
    .await;
    let job = next_json(&mut ws, Duration::from_secs(10))
        .await
        .expect("job");
    let job_id = job["intent"]["jobId"].as_str().expect("job id").to_owned();
    ws.send(Message::text(
        json!({"type": "ack", "jobId": job_id}).to_string(),
    ))
    .await
    .expect("ack");
    let run = cp
        .wait_run_finished("late-run", Duration::from_secs(20))
        .await;
    assert_eq!(run["status"]["phase"], "Failed");
    assert_eq!(run["status"]["reason"], "DeadlineExceeded");
    // The device finishes late and says so.
    let now = jiff::Timestamp::now().to_string();
    let status = json!({
        "jobId": job_id, "deviceId": "late-1", "attempt": 1, "kind": "systemUpgradeV1",
        "state": "Succeeded", "steps": [], "error": null, "output": null, "acceptedAt": now,
        "startedAt": now, "finishedAt": now, "bootId": "boot-1", "completionHeartbeatAt": now, "seq": 9
    });
    ws.send(Message::text(
        json!({"type": "result", "outboxId": 1, "status": status}).to_string(),
    ))
    .await
    .expect("late result");
    let received = next_json(&mut ws, Duration::from_secs(5))
        .await
        .expect("received");
    assert_eq!(received["type"], "received");
    // The engine's passes after the late result was committed are over.
    cp.engine_barrier().await;
    let after = cp.get("/taskruns/late-run").await;
    assert_eq!(
        after["status"], run["status"],
        "a terminal run never advances"
    );
}
