//! The fleet simulator (`drover-sim agents`, one process playing many
//! agents, each with its own connection and device token) against a real
//! control plane, at small N: the devices register in one request, every
//! simulated agent connects, and a TaskRun completes on all of them, over
//! WebSocket and over NATS. `drover-sim bench` runs the same at fleet scale.

use drover_tests::{API_VERSION, ControlPlane, bin, eventually};
use serde_json::{Value, json};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Sim(Child);

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

fn sim(cp: &ControlPlane, transport: &str, url: &str, devices: usize, prefix: &str) -> Sim {
    let log = std::fs::File::create(cp.dir.path().join("sim.log")).expect("log");
    Sim(Command::new(bin("drover-sim"))
        .args(["agents", "--transport", transport, "--url", url, "--data"])
        .arg(cp.dir.path().join("data"))
        .args(["--devices", &devices.to_string(), "--prefix", prefix])
        .args(["--heartbeat-seconds", "2"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start drover-sim"))
}

/// Registers `count` devices in one List request.
async fn register(cp: &ControlPlane, prefix: &str, count: usize) {
    let items: Vec<Value> = (0..count)
        .map(|i| {
            json!({"apiVersion": API_VERSION, "kind": "Device",
                   "metadata": {"name": format!("{prefix}{i:05}"), "labels": if i == 0 { json!({"canary": "true"}) } else { json!({}) }},
                   "spec": {"groups": ["sim"]}})
        })
        .collect();
    let answer = cp
        .apply(json!({"apiVersion": "v1", "kind": "List", "items": items}))
        .await;
    let results = answer["items"].as_array().expect("items");
    assert_eq!(results.len(), count);
    assert!(results.iter().all(|r| r["result"] == "created"), "{answer}");
}

async fn run_to_completion(cp: &ControlPlane, count: usize, run: &str) {
    eventually(Duration::from_secs(60), "every simulated agent", || async {
        let summary = cp.get("/summary").await;
        (summary["agentsPresent"] == count).then_some(())
    })
    .await;
    cp.apply_upgrade_run(run, "sim", 600).await;
    let done = cp.wait_run_finished(run, Duration::from_secs(90)).await;
    assert_eq!(done["status"]["phase"], "Complete", "{done}\n{}", cp.log());
    assert_eq!(done["status"]["succeeded"], count);
    assert_eq!(done["status"]["canaries"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_fleet_over_websocket_completes_a_run() {
    let cp = ControlPlane::start(&[]);
    register(&cp, "fsw-", 60).await;
    let _sim = sim(&cp, "websocket", &cp.agent_url, 60, "fsw-");
    run_to_completion(&cp, 60, "sim-ws").await;
    // The simulated agents do not run patchAssessmentV1: a Deployment of
    // it leaves every one out (as a task run would) instead of sending 60
    // jobs they would refuse.
    cp.apply(json!({
        "apiVersion": API_VERSION, "kind": "Deployment",
        "metadata": {"name": "sim-assess"},
        "spec": {"targets": {"filter": {"groups": ["sim"]}}, "patchAssessmentV1": {},
                 "maxConcurrency": 10, "deadlineSeconds": 600}
    }))
    .await;
    let d = eventually(Duration::from_secs(30), "the deployment to end", || async {
        let d = cp.get("/deployments/sim-assess").await;
        (d["status"]["phase"] == "Failed").then_some(d)
    })
    .await;
    assert_eq!(d["status"]["reason"], "NoTargets", "{d}");
    assert_eq!(d["status"]["excludedCount"], 60, "{d}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_fleet_over_nats_completes_a_run() {
    let devices: Vec<String> = (0..30).map(|i| format!("fsn-{i:05}")).collect();
    let (nats, cp) = drover_tests::nats_fleet(&devices, "cp-secret");
    let url = nats.url();
    register(&cp, "fsn-", 30).await;
    let _sim = sim(&cp, "nats", &url, 30, "fsn-");
    run_to_completion(&cp, 30, "sim-nats").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_fleet_over_mqtt_completes_a_run() {
    let devices: Vec<String> = (0..30).map(|i| format!("fsm-{i:05}")).collect();
    let (broker, cp) = drover_tests::mqtt_fleet(&devices, "cp-secret");
    let url = broker.url();
    register(&cp, "fsm-", 30).await;
    let _sim = sim(&cp, "mqtt", &url, 30, "fsm-");
    run_to_completion(&cp, 30, "sim-mqtt").await;
}

/// The MQTT link's event loop is the only thing that drains its request
/// queue, so it must never wait for room there (issue 26: from about 5,000
/// devices the queue of 10,000 filled and the link stopped for good). A
/// queue of 8 makes the same happen with a few hundred devices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mqtt_fleet_finishes_when_the_links_request_queue_is_tiny() {
    let count = 300;
    let devices: Vec<String> = (0..count).map(|i| format!("fsq-{i:05}")).collect();
    let (broker, cp) =
        drover_tests::mqtt_fleet_with(&devices, "cp-secret", &["--mqtt-request-queue", "1"]);
    let url = broker.url();
    register(&cp, "fsq-", count).await;
    let _sim = sim(&cp, "mqtt", &url, count, "fsq-");
    run_to_completion(&cp, count, "sim-mqtt-queue").await;
}
