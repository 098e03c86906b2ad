//! TaskSchedules end to end: a schedule applied from YAML ticks (every
//! minute, UTC), creates an immutable TaskRun named after the tick, which
//! runs on a real agent; `drover get taskschedules` shows the last and next
//! tick and the active run; a time-zone field is refused; suspension stops
//! new runs. The tick rules themselves are table-tested with an injected
//! clock (control-plane/rules/src/schedule.rs, control-plane/server/src/engine/tests.rs).

use drover_tests::{AgentProcess, ControlPlane, eventually};
use serde_json::json;
use std::process::Output;
use std::time::Duration;

const SCHEDULE: &str = "apiVersion: fleet.nationtech.io/v1alpha1
kind: TaskSchedule
metadata:
  name: every-minute
spec:
  schedule:
    cron: \"* * * * *\"
  template:
    spec:
      allowedGroups: [production]
      deadlineSeconds: 600
      systemUpgradeV1: {}
";

fn drover(cp: &ControlPlane, args: &[&str]) -> Output {
    cp.cli(args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_ticks_into_immutable_runs_and_can_be_suspended() {
    let cp = ControlPlane::start(&[]);
    cp.apply_device("sched-1", &["production"], json!({})).await;
    let token = cp.device_token("sched-1");
    let _agent = AgentProcess::start(
        &cp.dir.path().join("sched-1"),
        "sched-1",
        &cp.agent_url,
        &token,
        "",
    );
    cp.wait_for_agents(&["sched-1"]).await;

    // A time zone is refused with a clear reason.
    let zoned = cp.dir.path().join("zoned.yaml");
    std::fs::write(
        &zoned,
        SCHEDULE.replace(
            "    cron: \"* * * * *\"",
            "    daily: \"03:00\"\n  timeZone: Europe/Sofia",
        ),
    )
    .expect("write");
    let out = drover(&cp, &["apply", "-f", zoned.to_str().expect("utf-8")]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("schedules are always UTC"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let file = cp.dir.path().join("schedule.yaml");
    std::fs::write(&file, SCHEDULE).expect("write");
    let out = drover(&cp, &["apply", "-f", file.to_str().expect("utf-8")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "taskschedule/every-minute created\n"
    );

    // Within a minute the first tick creates a run, which completes.
    let run_name = eventually(
        Duration::from_secs(75),
        "the first scheduled run",
        || async {
            let schedule = cp.get("/taskschedules/every-minute").await;
            schedule["status"]["lastRun"].as_str().map(str::to_owned)
        },
    )
    .await;
    assert!(run_name.starts_with("every-minute-2"), "{run_name}");
    let run = cp
        .wait_run_finished(&run_name, Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}");
    let schedule = cp.get("/taskschedules/every-minute").await;
    let last: jiff::Timestamp = schedule["status"]["lastTick"]
        .as_str()
        .expect("last")
        .parse()
        .expect("time");
    let next: jiff::Timestamp = schedule["status"]["nextTick"]
        .as_str()
        .expect("next")
        .parse()
        .expect("time");
    assert!(next > last, "{schedule}");
    assert_eq!(schedule["status"]["skippedTicks"], 0, "{schedule}");

    let out = drover(&cp, &["get", "taskschedules"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("every-minute") && table.contains("cron * * * * *"),
        "{table}"
    );

    // The run names its schedule.
    let out = drover(&cp, &["describe", "taskrun", &run_name]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("made by: TaskSchedule every-minute"),
        "{text}"
    );

    // While its run is there, the device's job is its run's, not kept.
    let jobs = cp.get("/devices/sched-1/jobs").await;
    assert!(
        jobs["items"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|job| job["run"] == run_name.as_str() && job["runDeleted"].is_null()),
        "{jobs}"
    );

    // Suspended, and keeping no completed run: the finished run is deleted
    // by the history limit, and no new run comes, however many ticks pass.
    std::fs::write(
        &file,
        SCHEDULE.replace(
            "spec:\n  schedule:",
            "spec:\n  suspend: true\n  successfulRunsHistoryLimit: 0\n  schedule:",
        ),
    )
    .expect("write");
    let out = drover(&cp, &["apply", "-f", file.to_str().expect("utf-8")]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "taskschedule/every-minute configured\n"
    );
    eventually(
        Duration::from_secs(30),
        "the completed run deleted by the history limit",
        || async {
            let gone = cp.get_status(&format!("/taskruns/{run_name}")).await == 404;
            gone.then_some(())
        },
    )
    .await;
    let runs_before = cp.get("/taskruns").await.as_array().map(Vec::len);
    assert_eq!(runs_before, Some(0), "its jobs' run is gone too");
    // Issue 56: the device's history kept the pruned run's job. It is
    // still listed (its run named as deleted) and is still the device's
    // last upgrade, in the API and in `describe device`.
    let jobs = cp.get("/devices/sched-1/jobs").await;
    let kept = jobs["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|job| job["run"] == run_name.as_str())
        .unwrap_or_else(|| panic!("the pruned run's job is not in the history: {jobs}"));
    assert_eq!(kept["state"], "succeeded", "{jobs}");
    assert_eq!(kept["runDeleted"], true, "{jobs}");
    assert!(jobs["lastUpgrade"]["run"].is_string(), "{jobs}");
    let out = drover(&cp, &["describe", "device", "sched-1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("{run_name} (deleted)")) && text.contains("last upgrade:"),
        "{text}"
    );
    let schedule = cp.get("/taskschedules/every-minute").await;
    assert!(
        schedule["status"]["nextTick"].is_null(),
        "a suspended schedule has no next tick: {schedule}"
    );
    let wait_past = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(62);
    eventually(Duration::from_secs(75), "a tick to pass", || async {
        (jiff::Timestamp::now() > wait_past).then_some(())
    })
    .await;
    assert_eq!(
        cp.get("/taskruns").await.as_array().map(Vec::len),
        runs_before,
        "no run while suspended"
    );
}
