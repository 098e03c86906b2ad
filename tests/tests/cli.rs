//! The operator's CLI against a real control plane: the fleet-tasks seed's
//! TaskRun applies unchanged from YAML, `get` shows it, and `runs watch`
//! follows a run to its end with an exit code that says how it ended.

use drover_tests::{AgentProcess, ControlPlane, bin};
use serde_json::{Value, json};
use std::process::{Command, Output};

/// The seed's example, byte for byte.
const SEED_TASKRUN: &str = "apiVersion: fleet.nationtech.io/v1alpha1
kind: TaskRun
metadata:
  name: upgrade-device-1
spec:
  allowedGroups: [production]
  targetSelector:
    matchLabels:
      device-id: device-1
  deadlineSeconds: 21600
  systemUpgradeV1: {}
";

fn drover(cp: &ControlPlane, args: &[&str]) -> Output {
    Command::new(bin("drover"))
        .args(["--server", &cp.api, "--token", &cp.token])
        .args(args)
        .output()
        .expect("run drover")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_taskrun_applies_from_yaml_and_runs_watch_follows_it() {
    let cp = ControlPlane::start(&[]);
    let devices = cp.dir.path().join("devices.yaml");
    std::fs::write(
        &devices,
        "apiVersion: fleet.nationtech.io/v1alpha1\nkind: Device\nmetadata:\n  name: device-1\nspec:\n  groups: [production]\n\
         ---\napiVersion: fleet.nationtech.io/v1alpha1\nkind: Device\nmetadata:\n  name: device-2\nspec:\n  groups: [production]\n",
    )
    .expect("write");
    let out = drover(&cp, &["apply", "-f", devices.to_str().expect("utf-8")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "device/device-1 created\ndevice/device-2 created\n"
    );

    let token = cp.device_token("device-1");
    let _agent = AgentProcess::start(
        &cp.dir.path().join("device-1"),
        "device-1",
        &cp.agent_url,
        &token,
        "",
    );
    cp.wait_for_agents(&["device-1"]).await;

    let file = cp.dir.path().join("upgrade.yaml");
    std::fs::write(&file, SEED_TASKRUN).expect("write");
    let out = drover(&cp, &["apply", "-f", file.to_str().expect("utf-8")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "taskrun/upgrade-device-1 created\n"
    );

    let out = drover(&cp, &["runs", "watch", "upgrade-device-1"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "watch ends 0 on Complete: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("AllTargetsSucceeded"), "{stdout}");

    let out = drover(&cp, &["get", "taskrun", "upgrade-device-1", "-o", "json"]);
    let run: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(run["status"]["phase"], "Complete");
    // Only device-1 matched the selector; device-2 was never a target.
    assert_eq!(run["status"]["targets"], 1, "{run}");
    assert!(
        run["status"].get("devices").is_none(),
        "no per-device map in the run's status"
    );

    let out = drover(&cp, &["get", "devices"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("device-1") && table.contains("production"),
        "{table}"
    );

    // A run that fails makes watch exit non-zero with the reason.
    cp.apply(json!({
        "apiVersion": drover_tests::API_VERSION, "kind": "TaskRun", "metadata": {"name": "nobody"},
        "spec": {"allowedGroups": ["nowhere"], "deadlineSeconds": 60, "systemUpgradeV1": {}}
    }))
    .await;
    let out = drover(&cp, &["runs", "watch", "nobody"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("NoTargets"));

    // Without a token the CLI says what to do.
    let out = Command::new(bin("drover"))
        .args([
            "--server",
            &cp.api,
            "--data",
            "/nonexistent",
            "get",
            "devices",
        ])
        .env_remove("DROVER_TOKEN")
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no operator token"));
}
