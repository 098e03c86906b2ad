//! Canceling a task run or a deployment against real processes, over each
//! transport (WebSocket, NATS JetStream, MQTT): a job that started runs to
//! its end (an upgrade is never cut short, A3); a device that was away when
//! the run was canceled finds the signed cancel order where its intent was
//! (the NATS key, the MQTT retained topic, the WebSocket hello) and never
//! runs the job; the run ends Failed with reason Canceled; a finished run and
//! a device can then be deleted, and a run still going cannot.

use drover_tests::fleet::{Broker, Fleet};
use drover_tests::{AgentProcess, eventually};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

async fn wait_for_file(path: &Path, what: &str) {
    eventually(Duration::from_secs(60), what, || async {
        path.exists().then_some(())
    })
    .await
}

fn target<'a>(targets: &'a [Value], device: &str) -> &'a Value {
    targets
        .iter()
        .find(|t| t["device"] == device)
        .expect("target")
}

/// The scenario on one transport. Two targets, no canary: `busy` is held in
/// its upgrade when the run is canceled; `away` is stopped before the run is
/// released and comes back after the cancel.
async fn cancel_a_run(fleet: &Fleet, prefix: &str) -> (AgentProcess, AgentProcess) {
    let cp = &fleet.cp;
    let (busy_id, away_id) = (format!("{prefix}-busy"), format!("{prefix}-away"));
    for device in [&busy_id, &away_id] {
        cp.apply_device(device, &["fleet"], json!({})).await;
    }
    let (busy, hold, reached) = fleet.held_agent(&busy_id);
    let mut away = fleet.agent(&away_id, "");
    cp.wait_for_agents(&[&busy_id, &away_id]).await;
    away.kill9();
    let run = format!("{prefix}-run");
    cp.apply_upgrade_run(&run, "fleet", 600).await;
    wait_for_file(&reached, "the busy device's job to start").await;
    let uid = cp.get(&format!("/taskruns/{run}")).await["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_owned();

    let out = cp.cli(&["cancel", "taskrun", &run]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("cancel requested"), "{said}");
    // Both released jobs are asked to cancel.
    eventually(Duration::from_secs(30), "cancel requests", || async {
        let targets = cp.targets(&run).await;
        targets
            .iter()
            .all(|t| t["cancelRequestedAt"].is_string())
            .then_some(())
    })
    .await;
    assert_eq!(
        cp.get(&format!("/taskruns/{run}")).await["status"]["phase"],
        "Canceling"
    );
    // A run still going cannot be deleted.
    let refused = cp.cli(&["delete", "taskrun", &run]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("still canceling"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    // A broker keeps the signed order in the away device's intent's place.
    if !matches!(fleet.broker, Broker::None) {
        let kept = eventually(Duration::from_secs(20), "the cancel order", || async {
            fleet
                .kept(&away_id, &uid)
                .await
                .filter(|v| v["cancelJob"] == uid.as_str())
        })
        .await;
        assert!(kept["signature"].is_string(), "{kept}");
        assert!(kept.get("kind").is_none(), "the intent is gone: {kept}");
    }

    // The started job runs to its end; the away device comes back, finds
    // the order and never runs the job.
    std::fs::remove_file(&hold).expect("release");
    away.restart();
    let ended = cp.wait_run_finished(&run, Duration::from_secs(90)).await;
    assert_eq!(ended["status"]["phase"], "Failed", "{ended}\n{}", cp.log());
    assert_eq!(ended["status"]["reason"], "Canceled", "{ended}");
    assert_eq!(ended["status"]["succeeded"], 1, "{ended}");
    assert_eq!(ended["status"]["failed"], 1, "{ended}");
    let message = ended["status"]["latestError"].as_str().unwrap_or("");
    assert!(
        message.contains("canceled by an operator: 1 of 2 targets succeeded"),
        "{message}"
    );
    let targets = cp.targets(&run).await;
    assert_eq!(target(&targets, &busy_id)["status"]["state"], "Succeeded");
    let canceled = &target(&targets, &away_id)["status"];
    assert_eq!(canceled["state"], "Canceled", "{canceled}");
    assert!(canceled["startedAt"].is_null(), "{canceled}");
    away.wait_idle_and_flushed(Duration::from_secs(30)).await;
    let jobs = away.jobs();
    let job = jobs
        .as_array()
        .into_iter()
        .flatten()
        .find(|j| j["jobId"] == uid.as_str())
        .unwrap_or_else(|| panic!("{jobs}"));
    assert_eq!(job["state"], "Canceled", "{job}");
    // The device got only the order, never the intent it replaced: a device
    // that got both could start the job before the order arrives (over MQTT
    // a persistent session once queued the intent, and under load the job
    // ran: "2 of 2 targets succeeded" after the cancel).
    assert!(
        job["error"]
            .as_str()
            .is_some_and(|e| e.contains("before this device received it")),
        "the away device saw the intent: {job}"
    );
    assert!(
        job["steps"]
            .as_array()
            .is_none_or(|steps| steps.iter().all(|s| s["state"] == "Pending")),
        "no step ran: {job}"
    );
    // A decided job's order is withdrawn from the broker.
    if !matches!(fleet.broker, Broker::None) {
        eventually(Duration::from_secs(20), "the order withdrawn", || async {
            fleet.kept(&away_id, &uid).await.is_none().then_some(())
        })
        .await;
    }
    (busy, away)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_canceled_over_websocket_lets_a_started_job_end_and_a_returning_device_never_runs_it()
{
    let fleet = Fleet::websocket();
    let (mut busy, _away) = cancel_a_run(&fleet, "ws").await;
    let cp = &fleet.cp;

    // A device whose agent is stopped is deleted for good; the ended run
    // keeps its history: the device's row reads as the run ended.
    busy.kill9();
    let out = cp.cli(&["delete", "device", "ws-busy"]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{said}");
    assert!(!said.contains("register it again"), "{said}");
    assert!(
        said.contains("1 job record(s) stay with their runs' history"),
        "{said}"
    );
    let listed = cp.get("/devices").await;
    assert!(
        !listed
            .as_array()
            .into_iter()
            .flatten()
            .any(|d| d["id"] == "ws-busy"),
        "{listed}"
    );
    let targets = cp.targets("ws-run").await;
    let kept = target(&targets, "ws-busy");
    assert_eq!(kept["state"], "succeeded", "{kept}");
    assert_eq!(kept["status"]["state"], "Succeeded", "{kept}");

    // The finished run is deleted with its plan and jobs, the deleted
    // device's included.
    let out = cp.cli(&["delete", "taskrun", "ws-run"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("deleted with 2 job record(s)"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let gone = cp.cli(&["get", "taskrun", "ws-run"]);
    assert!(!gone.status.success(), "the run is gone");
    // One whose agent still runs is deleted, with a warning that it comes back.
    let out = cp.cli(&["delete", "device", "ws-away"]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{said}");
    assert!(said.contains("will register it again"), "{said}");
    // Nothing is left to cancel in a finished run.
    let out = cp.cli(&["cancel", "taskrun", "ws-run"]);
    assert!(!out.status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_canceled_over_nats_leaves_the_signed_order_in_the_intents_place() {
    let fleet = Fleet::nats(&["nats-busy", "nats-away"]);
    cancel_a_run(&fleet, "nats").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_canceled_over_mqtt_leaves_the_signed_order_retained_in_the_intents_place() {
    let fleet = Fleet::mqtt(&["mqtt-busy", "mqtt-away"]);
    cancel_a_run(&fleet, "mqtt").await;
}

/// A deployment canceled while one target runs and one waits for a slot:
/// the waiting one is canceled at once and never released, the running one
/// ends, and the deployment ends Failed with reason Canceled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canceled_deployment_releases_nothing_more_and_ends_canceled() {
    let fleet = Fleet::websocket();
    let cp = &fleet.cp;
    for device in ["dep-busy", "dep-next"] {
        cp.apply_device(device, &["fleet"], json!({})).await;
    }
    let (_busy, hold, reached) = fleet.held_agent("dep-busy");
    let _next = fleet.agent("dep-next", "");
    cp.wait_for_agents(&["dep-busy", "dep-next"]).await;
    cp.apply(json!({
        "apiVersion": drover_tests::API_VERSION, "kind": "Deployment",
        "metadata": {"name": "one-at-a-time"},
        "spec": {
            "targets": {"devices": ["dep-busy", "dep-next"]},
            "systemUpgradeV1": {},
            "maxConcurrency": 1,
            "deadlineSeconds": 600
        }
    }))
    .await;
    wait_for_file(&reached, "the first target's job to start").await;
    let out = cp.cli(&["cancel", "deployment", "one-at-a-time"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let canceling = eventually(
        Duration::from_secs(30),
        "the waiting target canceled",
        || async {
            let d = cp.get("/deployments/one-at-a-time").await;
            (d["status"]["canceled"] == 1).then_some(d)
        },
    )
    .await;
    assert_eq!(canceling["status"]["phase"], "Canceling", "{canceling}");
    assert_eq!(canceling["status"]["running"], 1, "{canceling}");
    std::fs::remove_file(&hold).expect("release");
    let ended = eventually(Duration::from_secs(60), "the deployment to end", || async {
        let d = cp.get("/deployments/one-at-a-time").await;
        (d["status"]["phase"] == "Failed").then_some(d)
    })
    .await;
    assert_eq!(ended["status"]["reason"], "Canceled", "{ended}");
    assert_eq!(ended["status"]["succeeded"], 1, "{ended}");
    assert_eq!(ended["status"]["canceled"], 1, "{ended}");
    let targets = cp.get("/deployments/one-at-a-time/targets?limit=10").await;
    let next = targets["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["device"] == "dep-next")
        .cloned()
        .unwrap_or_default();
    assert_eq!(next["state"], "canceled", "{targets}");
    assert_eq!(next["attempt"], 0, "never released: {next}");
}
