//! The agent against a scripted control plane speaking the WebSocket
//! protocol: duplicates, expired intents, malformed, oversize and foreign
//! messages. The agent answers each clearly and keeps working.

use drover_tests::script::{Script, intent, new_job};
use drover_tests::{AgentProcess, eventually};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;

async fn start() -> (TcpListener, tempfile::TempDir, AgentProcess) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("ws://{}", listener.local_addr().expect("addr"));
    let dir = tempfile::tempdir().expect("tempdir");
    let agent = AgentProcess::start(&dir.path().join("agent"), "proto-1", &url, "test-token", "");
    (listener, dir, agent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_delivery_of_a_finished_job_is_not_executed() {
    let (listener, _dir, mut agent) = start().await;
    let mut server = Script::accept(&listener, "proto-1").await;
    let job = new_job();
    let payload = intent(&job, "proto-1", json!({"inventoryRefreshV1": {}}), 600);
    server.send_job(payload.clone()).await;
    server
        .until("ack", |m| m["type"] == "ack" && m["jobId"] == job.as_str())
        .await;
    let first = server.result_of(&job).await;
    assert_eq!(first["status"]["state"], "Succeeded", "{first}");

    server.send_job(payload).await;
    server
        .until("ack of the duplicate", |m| {
            m["type"] == "ack" && m["jobId"] == job.as_str()
        })
        .await;
    let again = server.result_of(&job).await;
    assert_eq!(
        again["status"], first["status"],
        "the duplicate is answered with the stored status"
    );
    // One job at a time, in arrival order (A2): a duplicate queued to run
    // again would run before a job sent after it, so once that job's result
    // is in, a re-run would have shown itself.
    let next = new_job();
    server
        .send_job(intent(
            &next,
            "proto-1",
            json!({"inventoryRefreshV1": {}}),
            600,
        ))
        .await;
    let after = server.result_of(&next).await;
    assert_eq!(after["status"]["state"], "Succeeded", "{after}");
    let reruns = server
        .seen
        .iter()
        .filter(|m| {
            m["type"] == "progress"
                && m["status"]["jobId"] == job.as_str()
                && m["status"]["state"] == "Running"
        })
        .count();
    assert_eq!(reruns, 1, "the job ran once: {:#?}", server.seen);
    let jobs = agent.jobs();
    assert_eq!(jobs.as_array().map(Vec::len), Some(2), "{jobs}");
    let first_job = jobs
        .as_array()
        .into_iter()
        .flatten()
        .find(|j| j["jobId"] == job.as_str())
        .expect("the duplicated job");
    assert_eq!(first_job["steps"][0]["tries"], 1, "{jobs}");
    assert!(agent.is_running());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intent_past_its_expiry_is_reported_expired_and_never_started() {
    let (listener, _dir, mut agent) = start().await;
    let mut server = Script::accept(&listener, "proto-1").await;
    let job = new_job();
    server
        .send_job(intent(&job, "proto-1", json!({"systemUpgradeV1": {}}), -30))
        .await;
    let result = server.result_of(&job).await;
    let status = &result["status"];
    assert_eq!(status["state"], "Expired", "{result}");
    assert!(
        status["error"].as_str().unwrap_or("").contains("expired"),
        "{result}"
    );
    for step in status["steps"].as_array().expect("steps") {
        assert_eq!(step["state"], "Pending", "no step started: {result}");
        assert!(step["startedAt"].is_null());
    }
    assert!(agent.is_running());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_get_clear_errors_and_the_agent_keeps_working() {
    let (listener, _dir, mut agent) = start().await;
    let mut server = Script::accept(&listener, "proto-1").await;

    let cases: Vec<(Message, &str)> = vec![
        (Message::text("this is not json"), "not valid JSON"),
        (
            Message::text(r#"{"type":"reboot","now":true}"#),
            "unknown message type",
        ),
        (Message::text(r#"{"no":"type"}"#), "no string field"),
        (
            Message::text(r#"{"type":"cancel","jobId":42}"#),
            "malformed cancel",
        ),
        (Message::Binary(vec![0u8; 16].into()), "binary frames"),
        (
            Message::text(format!(
                r#"{{"type":"error","message":"{}"}}"#,
                "x".repeat(200 * 1024)
            )),
            "over the protocol limit",
        ),
        (
            Message::text(r#"{"type":"job","intent":{"jobId":"nope"}}"#),
            "job refused",
        ),
    ];
    for (frame, expected) in cases {
        server.ws.send(frame).await.expect("send");
        let error = server.next_of("error").await;
        let message = error["message"].as_str().unwrap_or("");
        assert!(
            message.contains(expected),
            "expected {expected:?} in {message:?}"
        );
    }

    // A job with a readable id but an unknown kind is recorded as Rejected
    // with the reason; one for another device is dropped with an error and
    // never recorded (A11).
    let unknown = new_job();
    server
        .send_job(intent(
            &unknown,
            "proto-1",
            json!({"containerV1": {"image": "x"}}),
            600,
        ))
        .await;
    let rejected = server.result_of(&unknown).await;
    assert_eq!(rejected["status"]["state"], "Rejected");
    assert!(
        rejected["status"]["error"]
            .as_str()
            .unwrap_or("")
            .contains("unknown job kind"),
        "{rejected}"
    );
    let foreign = new_job();
    server
        .send_job(intent(
            &foreign,
            "someone-else",
            json!({"inventoryRefreshV1": {}}),
            600,
        ))
        .await;
    let error = server.next_of("error").await;
    let message = error["message"].as_str().unwrap_or("");
    assert!(message.contains("is for device someone-else"), "{message}");
    assert!(
        agent
            .jobs()
            .as_array()
            .is_some_and(|jobs| jobs.iter().all(|j| j["jobId"] != foreign.as_str())),
        "nothing recorded for another device's job"
    );
    let smuggled = new_job();
    server
        .send_job(intent(
            &smuggled,
            "proto-1",
            json!({"systemUpgradeV1": {"packages": ["evil"]}}),
            600,
        ))
        .await;
    let rejected = server.result_of(&smuggled).await;
    assert_eq!(
        rejected["status"]["state"], "Rejected",
        "A8: no parameters reach the upgrade"
    );

    // After all that, a good job still runs to the end.
    let good = new_job();
    server
        .send_job(intent(
            &good,
            "proto-1",
            json!({"inventoryRefreshV1": {}}),
            600,
        ))
        .await;
    let done = server.result_of(&good).await;
    assert_eq!(done["status"]["state"], "Succeeded", "{done}");
    assert!(agent.is_running(), "the agent survived:\n{}", agent.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_not_confirmed_are_sent_again_on_the_next_connection() {
    let (listener, _dir, agent) = start().await;
    let mut server = Script::accept(&listener, "proto-1").await;
    let job = new_job();
    server
        .send_job(intent(
            &job,
            "proto-1",
            json!({"inventoryRefreshV1": {}}),
            600,
        ))
        .await;
    // Read the result without confirming it, then drop the connection.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let frame = tokio::time::timeout_at(deadline, server.ws.next())
            .await
            .expect("result")
            .expect("open")
            .expect("frame");
        let Message::Text(text) = frame else { continue };
        let message: Value = serde_json::from_str(text.as_str()).expect("json");
        if message["type"] == "result" && message["status"]["jobId"] == job.as_str() {
            break;
        }
    }
    drop(server);
    let mut server = Script::accept(&listener, "proto-1").await;
    let hello = server.seen.first().cloned().expect("hello");
    assert!(
        hello["jobs"]
            .as_array()
            .expect("held jobs")
            .iter()
            .any(|j| j["jobId"] == job.as_str()),
        "the hello lists the job whose result is unconfirmed: {hello}"
    );
    let again = server.result_of(&job).await;
    assert_eq!(again["status"]["state"], "Succeeded");
    // Once confirmed, the outbox empties.
    eventually(Duration::from_secs(10), "the outbox to empty", || async {
        let out = std::process::Command::new(drover_tests::bin("drover-agent"))
            .args(["status", "--json", "--socket"])
            .arg(&agent.socket)
            .output()
            .ok()?;
        let status: Value = serde_json::from_slice(&out.stdout).ok()?;
        (status["outboxPending"] == 0).then_some(())
    })
    .await;
}
