//! The fleet simulator (`drover-sim agents`, one process playing many
//! agents, each with its own connection and device token) against a real
//! control plane, at small N: the devices register in one request, every
//! simulated agent connects, and a TaskRun completes on all of them, over
//! WebSocket and over NATS. `drover-sim bench` runs the same at fleet scale.

use drover_tests::{API_VERSION, ControlPlane, NatsServer, bin, eventually};
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_fleet_over_nats_completes_a_run() {
    let dir = ControlPlane::prepare();
    let devices: Vec<String> = (0..30).map(|i| format!("fsn-{i:05}")).collect();
    let mut args = vec![
        "nats-config".to_owned(),
        "--control-plane-password".into(),
        "cp-secret".into(),
    ];
    for device in &devices {
        args.push("--device".into());
        args.push(device.clone());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let nats = NatsServer::start(&ControlPlane::drover_in(dir.path(), &args));
    let url = nats.url();
    let cp = ControlPlane::start_in(
        dir,
        &[
            "--nats-url",
            &url,
            "--nats-user",
            "drover-control-plane",
            "--nats-password",
            "cp-secret",
        ],
    );
    register(&cp, "fsn-", 30).await;
    let _sim = sim(&cp, "nats", &url, 30, "fsn-");
    run_to_completion(&cp, 30, "sim-nats").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_fleet_over_mqtt_completes_a_run() {
    let dir = ControlPlane::prepare();
    let out = dir.path().join("mqtt").display().to_string();
    let devices: Vec<String> = (0..30).map(|i| format!("fsm-{i:05}")).collect();
    let mut args = vec![
        "mqtt-config".to_owned(),
        "--control-plane-password".into(),
        "cp-secret".into(),
        "--out".into(),
        out,
    ];
    for device in &devices {
        args.push("--device".into());
        args.push(device.clone());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let broker = drover_tests::Mosquitto::start(&ControlPlane::drover_in(dir.path(), &args));
    let url = broker.url();
    let cp = ControlPlane::start_in(dir, &["--mqtt-url", &url, "--mqtt-password", "cp-secret"]);
    register(&cp, "fsm-", 30).await;
    let _sim = sim(&cp, "mqtt", &url, 30, "fsm-");
    run_to_completion(&cp, 30, "sim-mqtt").await;
}
