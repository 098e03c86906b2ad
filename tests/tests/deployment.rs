//! Deployments against a real control plane and real agents over
//! WebSocket: concurrency, each site's maintenance window, expiry, retries
//! as new jobs after their backoff, and "add new devices".

use drover_tests::{AgentProcess, ControlPlane, bin, eventually, hold_config};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const API_VERSION: &str = "fleet.nationtech.io/v1alpha1";

async fn apply_device(cp: &ControlPlane, id: &str, group: &str, zone: Option<&str>) {
    let mut spec = json!({"groups": [group]});
    if let Some(zone) = zone {
        spec["timeZone"] = json!(zone);
    }
    cp.apply(json!({
        "apiVersion": API_VERSION, "kind": "Device",
        "metadata": {"name": id}, "spec": spec
    }))
    .await;
}

async fn deployment(cp: &ControlPlane, name: &str) -> Value {
    cp.get(&format!("/deployments/{name}")).await
}

async fn targets(cp: &ControlPlane, name: &str) -> Vec<Value> {
    cp.get(&format!("/deployments/{name}/targets?limit=500"))
        .await["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Waits for the deployment to end; asserts on every look that no more
/// than `max` targets were queued or running at once.
async fn finish(cp: &ControlPlane, name: &str, max: u64, timeout: Duration) -> Value {
    eventually(timeout, &format!("deployment {name} to finish"), || async {
        let d = deployment(cp, name).await;
        let s = &d["status"];
        let active = s["queued"].as_u64().unwrap_or(0) + s["running"].as_u64().unwrap_or(0);
        assert!(active <= max, "{active} active, over {max}: {d}");
        matches!(s["phase"].as_str(), Some("Complete" | "Failed")).then_some(d)
    })
    .await
}

struct Held {
    agent: AgentProcess,
    hold: PathBuf,
    reached: PathBuf,
}

fn held_agent(cp: &ControlPlane, device: &str) -> Held {
    let dir = cp.dir.path().join(device);
    std::fs::create_dir_all(&dir).expect("dir");
    let hold = dir.join("hold");
    let reached = dir.join("reached");
    std::fs::write(&hold, "").expect("hold");
    let agent = AgentProcess::start(
        &dir,
        device,
        &cp.agent_url,
        &cp.device_token(device),
        &hold_config(&hold, &reached),
    );
    Held {
        agent,
        hold,
        reached,
    }
}

fn hhmm(t: jiff::Timestamp) -> String {
    jiff::tz::TimeZone::UTC
        .to_datetime(t)
        .strftime("%H:%M")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_keeps_to_its_concurrency_and_each_sites_window() {
    let cp = ControlPlane::start(&[]);
    let workers = ["w1", "w2", "w3", "w4"];
    for device in workers {
        apply_device(&cp, device, "fleet", None).await;
    }
    // Honolulu (UTC-10, no DST) is outside a UTC window around now.
    apply_device(&cp, "hnl", "fleet", Some("Pacific/Honolulu")).await;
    // Matches, but no agent ever connected: excluded.
    apply_device(&cp, "ghost", "fleet", None).await;
    apply_device(&cp, "elsewhere", "other", None).await;
    let held: Vec<Held> = workers.iter().map(|d| held_agent(&cp, d)).collect();
    let hnl = AgentProcess::start(
        &cp.dir.path().join("hnl"),
        "hnl",
        &cp.agent_url,
        &cp.device_token("hnl"),
        "",
    );
    let _elsewhere = AgentProcess::start(
        &cp.dir.path().join("elsewhere"),
        "elsewhere",
        &cp.agent_url,
        &cp.device_token("elsewhere"),
        "",
    );
    cp.wait_for_agents(&["w1", "w2", "w3", "w4", "hnl", "elsewhere"])
        .await;

    let now = jiff::Timestamp::now();
    let start = hhmm(now - jiff::SignedDuration::from_hours(1));
    let end = hhmm(now + jiff::SignedDuration::from_hours(2));
    cp.apply(json!({
        "apiVersion": API_VERSION, "kind": "Deployment",
        "metadata": {"name": "night-upgrade"},
        "spec": {
            "targets": {"filter": {"groups": ["fleet"]}},
            "systemUpgradeV1": {},
            "maxConcurrency": 2,
            "maintenanceWindow": {"start": start, "end": end, "timeZone": "UTC"},
            "deadlineSeconds": 40
        }
    }))
    .await;

    // `runs watch`, piped: a line per change, with why targets wait.
    let watch = Command::new(bin("drover"))
        .args(["--server", &cp.api, "--token", &cp.token])
        .args(["runs", "watch", "deployment/night-upgrade"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("drover runs watch");
    // Two jobs go out; the others wait for a free slot.
    let first: Vec<usize> = eventually(
        Duration::from_secs(30),
        "two agents to reach full-upgrade",
        || async {
            let reached: Vec<usize> = (0..held.len())
                .filter(|&i| held[i].reached.exists())
                .collect();
            (reached.len() == 2).then_some(reached)
        },
    )
    .await;
    let d = eventually(Duration::from_secs(10), "the counts", || async {
        let d = deployment(&cp, "night-upgrade").await;
        let s = &d["status"];
        (s["running"] == 2 && s["pending"] == 3).then_some(d)
    })
    .await;
    assert_eq!(d["status"]["targets"], 5, "{d}");
    assert_eq!(d["status"]["excludedCount"], 1, "{d}");
    for i in (0..held.len()).filter(|i| !first.contains(i)) {
        let jobs = held[i].agent.jobs();
        assert_eq!(
            jobs.as_array().map(Vec::len),
            Some(0),
            "{}: {jobs}",
            workers[i]
        );
    }
    // What the operator sees: UTC's window open, Honolulu's closed.
    let out = Command::new(bin("drover"))
        .args(["--server", &cp.api, "--token", &cp.token])
        .args(["describe", "deployment", "night-upgrade", "-o", "json"])
        .output()
        .expect("drover describe");
    assert!(out.status.success(), "{out:?}");
    let described: Value = serde_json::from_slice(&out.stdout).expect("json");
    let windows = described["windows"].as_array().cloned().unwrap_or_default();
    let open = |zone: &str| {
        windows
            .iter()
            .find(|w| w["timeZone"] == zone)
            .map(|w| w["open"].clone())
    };
    assert_eq!(open("UTC"), Some(json!(true)), "{described}");
    assert_eq!(open("Pacific/Honolulu"), Some(json!(false)), "{described}");
    // Issue 56: when Honolulu's window opens, there and as a moment, and
    // why each pending device waits: the same answer the engine acts on.
    let honolulu = windows
        .iter()
        .find(|w| w["timeZone"] == "Pacific/Honolulu")
        .expect("Honolulu's row");
    let opens: jiff::Timestamp = honolulu["opensAt"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("an opening time: {described}"));
    let zone = jiff::tz::TimeZone::get("Pacific/Honolulu").expect("tzdata");
    assert!(opens > now, "{described}");
    assert!(
        opens < now + jiff::SignedDuration::from_hours(24),
        "{described}"
    );
    assert_eq!(
        zone.to_datetime(opens).strftime("%H:%M").to_string(),
        start,
        "the window's start on Honolulu's clock: {described}"
    );
    let waits = described["waitingByCode"].clone();
    assert_eq!(
        waits,
        json!({"ConcurrencyLimit": 2, "WindowClosed": 1}),
        "{described}"
    );
    let page = cp.get("/deployments/night-upgrade/targets").await;
    let wait_of = |device: &str| {
        page["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|t| t["device"] == device)
            .map(|t| t["waiting"].clone())
            .unwrap_or(Value::Null)
    };
    assert_eq!(wait_of("hnl")["code"], "WindowClosed", "{page}");
    assert_eq!(wait_of("hnl")["until"], honolulu["opensAt"], "{page}");
    for i in (0..held.len()).filter(|i| !first.contains(i)) {
        assert_eq!(wait_of(workers[i])["code"], "ConcurrencyLimit", "{page}");
    }
    assert_eq!(wait_of(workers[first[0]]), Value::Null, "running: {page}");
    // Its durations in words, not counts of seconds.
    let out = Command::new(bin("drover"))
        .args(["--server", &cp.api, "--token", &cp.token])
        .args(["describe", "deployment", "night-upgrade"])
        .output()
        .expect("drover describe");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("(backoff 5 minutes, doubling), deadline 40 seconds"),
        "{text}"
    );
    let local = zone
        .to_datetime(opens)
        .strftime("%Y-%m-%d %H:%M")
        .to_string();
    assert!(
        text.contains(&format!("closed, opens {local} there (")),
        "Honolulu's window row: {text}"
    );
    assert!(
        text.contains("why targets wait (2 ConcurrencyLimit, 1 WindowClosed):"),
        "{text}"
    );
    let hnl_line = text
        .lines()
        .find(|l| l.trim_start().starts_with("hnl "))
        .unwrap_or_else(|| panic!("hnl's line: {text}"));
    assert!(
        hnl_line.contains(&format!(
            "maintenance window closed; opens {local} Pacific/Honolulu ("
        )),
        "{hnl_line}"
    );
    // The same sentence per waiting device in `get deployment NAME -o
    // wide`, under the deployment's row; the plain table says none.
    let get = |wide: bool| {
        let mut args = vec!["get", "deployment", "night-upgrade"];
        if wide {
            args.extend(["-o", "wide"]);
        }
        let out = Command::new(bin("drover"))
            .args(["--server", &cp.api, "--token", &cp.token])
            .args(&args)
            .output()
            .expect("drover get");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let wide = get(true);
    let wide_hnl = wide
        .lines()
        .skip_while(|l| *l != "why targets wait:")
        .find(|l| l.trim_start().starts_with("hnl "))
        .unwrap_or_else(|| panic!("hnl's wait in get -o wide: {wide}"));
    assert!(
        wide_hnl.contains(&format!(
            "maintenance window closed; opens {local} Pacific/Honolulu ("
        )),
        "{wide_hnl}"
    );
    assert_eq!(
        wide.lines().filter(|l| l.contains("concurrency")).count(),
        2,
        "{wide}"
    );
    assert!(!get(false).contains("why targets wait"));

    for h in &held {
        let _ = std::fs::remove_file(&h.hold);
    }
    let d = finish(&cp, "night-upgrade", 2, Duration::from_secs(90)).await;
    // A misspelt group: NoTargets at once, the group and the nearest named.
    cp.apply(json!({
        "apiVersion": API_VERSION, "kind": "Deployment",
        "metadata": {"name": "typo-upgrade"},
        "spec": {
            "targets": {"filter": {"groups": ["flet"]}},
            "systemUpgradeV1": {},
            "maxConcurrency": 1,
            "deadlineSeconds": 600
        }
    }))
    .await;
    let typo = eventually(Duration::from_secs(30), "NoTargets", || async {
        let d = deployment(&cp, "typo-upgrade").await;
        (d["status"]["reason"] == "NoTargets").then_some(d)
    })
    .await;
    assert_eq!(
        typo["status"]["latestError"],
        "no device with an agent matches the targets (0 matching devices excluded): \
         no device is in the group \"flet\" (did you mean \"fleet\"?)",
        "{typo}"
    );
    let watched = watch.wait_with_output().expect("runs watch");
    let watched = String::from_utf8_lossy(&watched.stdout);
    assert!(
        watched.lines().any(|l| l.contains("3 pending")
            && l.contains("; waiting: 2 ConcurrencyLimit, 1 WindowClosed (first: hnl: maintenance window closed; opens ")),
        "{watched}"
    );
    let s = &d["status"];
    assert_eq!(s["succeeded"], 4, "{d}");
    assert_eq!(s["expired"], 1, "the device outside its window: {d}");
    assert_eq!(s["failed"], 0, "{d}");
    assert_eq!(s["phase"], "Failed", "{d}");
    assert_eq!(s["reason"], "Expired", "{d}");
    assert_eq!(
        hnl.jobs().as_array().map(Vec::len),
        Some(0),
        "never released outside its window"
    );
    for h in &held {
        let jobs = h.agent.jobs();
        let jobs = jobs.as_array().expect("jobs");
        assert_eq!(jobs.len(), 1, "one job each: {jobs:?}");
        assert_eq!(jobs[0]["state"], "Succeeded");
    }
    let out = Command::new(bin("drover"))
        .args(["--server", &cp.api, "--token", &cp.token])
        .args(["get", "deployments"])
        .output()
        .expect("drover get");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("night-upgrade") && table.contains("Expired"),
        "{table}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempt_is_retried_after_its_backoff_as_a_new_job() {
    let cp = ControlPlane::start(&[]);
    apply_device(&cp, "r1", "retry", None).await;
    let dir = cp.dir.path().join("r1");
    // Attempt 1 fails its preflight: it asks for far more free space than any disk has.
    let mut agent = AgentProcess::start_with(
        &dir,
        "r1",
        &cp.agent_url,
        &cp.device_token("r1"),
        "",
        "mode = \"simulate\"\nmin_free_mib = 1000000",
        "",
    );
    cp.wait_for_agents(&["r1"]).await;
    cp.apply(json!({
        "apiVersion": API_VERSION, "kind": "Deployment",
        "metadata": {"name": "retrying"},
        "spec": {
            "targets": {"devices": ["r1"]},
            "systemUpgradeV1": {},
            "maxConcurrency": 1,
            "retries": 2,
            "retryBackoffSeconds": 5,
            "deadlineSeconds": 300
        }
    }))
    .await;
    let waiting = eventually(Duration::from_secs(30), "attempt 1 to fail", || async {
        let t = targets(&cp, "retrying").await.into_iter().next()?;
        (t["state"] == "waitingRetry").then_some(t)
    })
    .await;
    assert_eq!(waiting["attempt"], 1);
    // One state per target: the filter finds it under the row's name, and
    // an unknown name is refused rather than matching nothing.
    let page = cp
        .get("/deployments/retrying/targets?state=waitingRetry")
        .await;
    assert_eq!(page["total"], 1, "{page}");
    assert_eq!(
        page["items"][0]["stateLabel"], "Waiting to retry after a failed attempt",
        "{page}"
    );
    let refused = drover_tests::http_client()
        .get(format!(
            "{}/api/v1/deployments/retrying/targets?state=Waiting",
            cp.api
        ))
        .bearer_auth(&cp.token)
        .send()
        .await
        .expect("get");
    assert_eq!(refused.status(), 400);
    let message = refused.text().await.expect("body");
    assert!(
        message.contains("one of pending, waitingRetry"),
        "{message}"
    );
    assert!(
        waiting["lastError"]
            .as_str()
            .unwrap_or("")
            .contains("not enough free space"),
        "{waiting}"
    );
    let due: jiff::Timestamp = waiting["nextAttemptAt"]
        .as_str()
        .expect("nextAttemptAt")
        .parse()
        .expect("time");
    // The device is fixed (and offline a moment) before the retry is due.
    agent.kill9();
    let config = std::fs::read_to_string(&agent.config).expect("config");
    std::fs::write(
        &agent.config,
        config.replace("min_free_mib = 1000000", "min_free_mib = 10"),
    )
    .expect("config");
    agent.restart();
    let d = finish(&cp, "retrying", 1, Duration::from_secs(60)).await;
    assert_eq!(d["status"]["phase"], "Complete", "{d}\n{}", agent.log());
    let target = targets(&cp, "retrying").await.remove(0);
    assert_eq!(target["attempt"], 2, "{target}");
    assert_eq!(target["state"], "succeeded");
    let released: jiff::Timestamp = target["releasedAt"]
        .as_str()
        .expect("releasedAt")
        .parse()
        .expect("time");
    assert!(
        released >= due,
        "attempt 2 released at {released}, before {due}"
    );
    // Each attempt was its own job on the device.
    let jobs = agent.jobs();
    let jobs = jobs.as_array().expect("jobs");
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    let states: Vec<&str> = jobs.iter().filter_map(|j| j["state"].as_str()).collect();
    assert!(
        states.contains(&"Failed") && states.contains(&"Succeeded"),
        "{states:?}"
    );
    assert_ne!(jobs[0]["jobId"], jobs[1]["jobId"]);
    assert_eq!(
        Some(target["job"].clone()),
        jobs.iter()
            .find(|j| j["state"] == "Succeeded")
            .map(|j| j["jobId"].clone())
    );
    // Issue 56: the deployment deleted, the device's history keeps both
    // attempts, the failed one with its error, the other as its last
    // upgrade, each naming the deployment as deleted.
    let out = cp.cli(&["delete", "deployment", "retrying"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(cp.get_status("/deployments/retrying").await, 404);
    let history = cp.get("/devices/r1/jobs").await;
    let kept: Vec<&Value> = history["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|j| j["run"] == "deployment/retrying" && j["runDeleted"] == true)
        .collect();
    assert_eq!(kept.len(), 2, "{history}");
    assert!(
        kept.iter().any(|j| j["state"] == "failed"
            && j["error"]
                .as_str()
                .unwrap_or("")
                .contains("not enough free space")),
        "{history}"
    );
    assert_eq!(history["lastUpgrade"]["job"], target["job"], "{history}");
    assert_eq!(history["lastUpgrade"]["runDeleted"], true, "{history}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_new_devices_runs_the_targeting_again() {
    let cp = ControlPlane::start(&[]);
    apply_device(&cp, "a1", "lab", None).await;
    let first = held_agent(&cp, "a1");
    cp.wait_for_agents(&["a1"]).await;
    cp.apply(json!({
        "apiVersion": API_VERSION, "kind": "Deployment",
        "metadata": {"name": "growing"},
        "spec": {
            "targets": {"filter": {"groups": ["lab"]}},
            "systemUpgradeV1": {},
            "maxConcurrency": 10,
            "deadlineSeconds": 300
        }
    }))
    .await;
    eventually(Duration::from_secs(30), "the first target", || async {
        let d = deployment(&cp, "growing").await;
        (d["status"]["phase"] == "Running").then_some(())
    })
    .await;
    assert_eq!(
        deployment(&cp, "growing").await["status"]["excludedCount"],
        0
    );
    // A device enrolled after the start is not added by itself (nor one
    // enrolled without an agent, which "add new devices" counts as
    // excluded, issue 33 item 4)...
    apply_device(&cp, "a2", "lab", None).await;
    apply_device(&cp, "a3-no-agent", "lab", None).await;
    let second = AgentProcess::start(
        &cp.dir.path().join("a2"),
        "a2",
        &cp.agent_url,
        &cp.device_token("a2"),
        "",
    );
    cp.wait_for_agents(&["a2"]).await;
    assert_eq!(deployment(&cp, "growing").await["status"]["targets"], 1);
    // ...only when asked.
    let out = Command::new(bin("drover"))
        .args(["--server", &cp.api, "--token", &cp.token])
        .args(["deployments", "add-new-devices", "growing"])
        .output()
        .expect("drover deployments");
    assert!(out.status.success(), "{out:?}");
    eventually(
        Duration::from_secs(30),
        "the new device's job to succeed",
        || async {
            let done = targets(&cp, "growing")
                .await
                .iter()
                .any(|t| t["device"] == "a2" && t["state"] == "succeeded");
            done.then_some(())
        },
    )
    .await;
    std::fs::remove_file(&first.hold).expect("release the first device");
    let d = finish(&cp, "growing", 10, Duration::from_secs(60)).await;
    assert_eq!(d["status"]["targets"], 2, "{d}");
    assert_eq!(d["status"]["excludedCount"], 1, "{d}");
    assert_eq!(d["status"]["phase"], "Complete", "{d}");
    assert_eq!(second.jobs().as_array().map(Vec::len), Some(1));
}

/// Issue 33 item 2: a deployment that expires while its job waits in a
/// device's queue (behind a job of a task run that is held mid-upgrade)
/// cancels that job on the agent, as `drover cancel deployment` would: the
/// agent reports it Canceled at once, not Expired when the job before it
/// ends; the target ends Expired; the running job is never interrupted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_deployment_cancels_its_job_waiting_in_the_agents_queue() {
    let cp = ControlPlane::start(&[]);
    apply_device(&cp, "q1", "lab", None).await;
    let held = held_agent(&cp, "q1");
    cp.wait_for_agents(&["q1"]).await;
    cp.apply_upgrade_run("first", "lab", 3600).await;
    eventually(Duration::from_secs(30), "the first job to hold", || {
        let reached = held.reached.exists();
        async move { reached.then_some(()) }
    })
    .await;
    cp.apply(json!({
        "apiVersion": API_VERSION, "kind": "Deployment",
        "metadata": {"name": "short"},
        "spec": {
            "targets": {"devices": ["q1"]},
            "systemUpgradeV1": {},
            "maxConcurrency": 1,
            "deadlineSeconds": 8
        }
    }))
    .await;
    let job = eventually(
        Duration::from_secs(30),
        "the job queued on the agent",
        || async {
            let t = targets(&cp, "short").await;
            let job = t.first()?["job"].as_str()?.to_owned();
            let jobs = held.agent.jobs();
            jobs.as_array()?
                .iter()
                .any(|j| j["jobId"] == job.as_str())
                .then_some(job)
        },
    )
    .await;
    let d = finish(&cp, "short", 1, Duration::from_secs(60)).await;
    assert_eq!(d["status"]["expired"], 1, "{d}");
    let canceled = eventually(Duration::from_secs(30), "the agent's cancel", || async {
        let jobs = held.agent.jobs();
        jobs.as_array()?
            .iter()
            .find(|j| j["jobId"] == job.as_str() && j["state"] == "Canceled")
            .cloned()
    })
    .await;
    assert_eq!(canceled["state"], "Canceled", "{canceled}");
    // Canceled while the job before it still runs: not expired at the
    // head of the queue later.
    let first = cp.get("/taskruns/first").await;
    assert_eq!(first["status"]["phase"], "Running", "{first}");
    std::fs::remove_file(&held.hold).expect("release the first job");
    let run = cp.wait_run_finished("first", Duration::from_secs(60)).await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}");
}

/// Issue 33 item 3: the window is judged in the device's site zone at every
/// pass. A device in Honolulu waits outside a UTC window around now; its
/// site moves to UTC mid-deployment (the Device applied again) and the
/// next pass releases its job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_moves_site_mid_deployment_is_judged_in_its_new_zone() {
    let cp = ControlPlane::start(&[]);
    apply_device(&cp, "mover", "lab", Some("Pacific/Honolulu")).await;
    let agent = AgentProcess::start(
        &cp.dir.path().join("mover"),
        "mover",
        &cp.agent_url,
        &cp.device_token("mover"),
        "",
    );
    cp.wait_for_agents(&["mover"]).await;
    let now = jiff::Timestamp::now();
    let start = hhmm(now - jiff::SignedDuration::from_hours(1));
    let end = hhmm(now + jiff::SignedDuration::from_hours(2));
    cp.apply(json!({
        "apiVersion": API_VERSION, "kind": "Deployment",
        "metadata": {"name": "moving"},
        "spec": {
            "targets": {"devices": ["mover"]},
            "systemUpgradeV1": {},
            "maxConcurrency": 1,
            "maintenanceWindow": {"start": start, "end": end, "timeZone": "UTC"},
            "deadlineSeconds": 600
        }
    }))
    .await;
    let d = eventually(
        Duration::from_secs(30),
        "the deployment running",
        || async {
            let d = deployment(&cp, "moving").await;
            (d["status"]["phase"] == "Running").then_some(d)
        },
    )
    .await;
    assert_eq!(
        d["status"]["pending"], 1,
        "outside its window in Honolulu: {d}"
    );
    assert!(agent.jobs().as_array().is_some_and(Vec::is_empty));
    // The site moves to UTC: inside the window from the next pass.
    apply_device(&cp, "mover", "lab", Some("UTC")).await;
    let d = finish(&cp, "moving", 1, Duration::from_secs(60)).await;
    assert_eq!(d["status"]["phase"], "Complete", "{d}");
    assert_eq!(agent.jobs().as_array().map(Vec::len), Some(1));
}

/// Rollout safety (issue 33): a deployment with `failureThreshold` stops in
/// the pass that counts its second failed target. Targets sort by device:
/// `a-held` runs its job, held mid-upgrade; `b-queued` holds a task run's
/// job, so the deployment's job waits in its agent's queue; `c-fail` and
/// `d-fail` are offline at the start, then come back failing every
/// preflight; `e-idle` and `f-idle` are offline, pending. At the stop:
/// nothing more is released (the idle devices, back online, get no job),
/// the queued job is canceled on its agent, the running one finishes, an
/// alert is raised, and the deployment ends Failed `FailureThresholdReached`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_stops_at_its_failure_threshold_and_cancels_what_waits() {
    let cp = ControlPlane::start(&[]);
    let all = ["a-held", "b-queued", "c-fail", "d-fail", "e-idle", "f-idle"];
    for device in all {
        apply_device(&cp, device, "lab", None).await;
    }
    cp.apply(json!({
        "apiVersion": API_VERSION, "kind": "Device",
        "metadata": {"name": "b-queued"}, "spec": {"groups": ["lab", "busy"]}
    }))
    .await;
    let held = held_agent(&cp, "a-held");
    let queued = held_agent(&cp, "b-queued");
    let mut later: Vec<AgentProcess> = ["c-fail", "d-fail", "e-idle", "f-idle"]
        .iter()
        .map(|device| {
            AgentProcess::start(
                &cp.dir.path().join(device),
                device,
                &cp.agent_url,
                &cp.device_token(device),
                "",
            )
        })
        .collect();
    cp.wait_for_agents(&all).await;
    for agent in &mut later {
        agent.kill9();
    }
    // b-queued is busy with another job, held before its full-upgrade.
    cp.apply_upgrade_run("busy", "busy", 3600).await;
    eventually(Duration::from_secs(30), "b-queued busy", || {
        let reached = queued.reached.exists();
        async move { reached.then_some(()) }
    })
    .await;
    std::fs::remove_file(&queued.reached).expect("reset the marker");
    cp.apply(json!({
        "apiVersion": API_VERSION, "kind": "Deployment",
        "metadata": {"name": "careful"},
        "spec": {
            "targets": {"filter": {"groups": ["lab"]}},
            "systemUpgradeV1": {},
            "maxConcurrency": 4,
            "failureThreshold": {"failed": 2},
            "deadlineSeconds": 600
        }
    }))
    .await;
    // The two online targets are out: one running (held), one queued
    // behind the task run's job on its agent.
    let queued_job = eventually(
        Duration::from_secs(30),
        "a-held running and b-queued's job in its agent's queue",
        || async {
            let t = targets(&cp, "careful").await;
            let state = |device: &str| {
                t.iter()
                    .find(|t| t["device"] == device)
                    .map(|t| (t["state"].clone(), t["job"].clone()))
            };
            let (running, _) = state("a-held")?;
            let (_, job) = state("b-queued")?;
            let job = job.as_str()?.to_owned();
            let on_agent = queued
                .agent
                .jobs()
                .as_array()?
                .iter()
                .any(|j| j["jobId"] == job.as_str());
            (running == "running" && held.reached.exists() && on_agent).then_some(job)
        },
    )
    .await;
    let d = deployment(&cp, "careful").await;
    assert_eq!(d["status"]["pending"], 4, "the other four are offline: {d}");
    // The failing devices come back: released, each fails its preflight.
    for agent in &mut later[..2] {
        agent.fail_preflight();
    }
    let stopped = eventually(Duration::from_secs(60), "the threshold's stop", || async {
        let d = deployment(&cp, "careful").await;
        d["status"]["failureThresholdReachedAt"]
            .is_string()
            .then_some(d)
    })
    .await;
    let s = &stopped["status"];
    assert_eq!(s["phase"], "Canceling", "a-held still runs: {stopped}");
    assert_eq!(s["reason"], "FailureThresholdReached", "{stopped}");
    assert_eq!(s["failed"], 2, "{stopped}");
    assert!(
        s["latestError"]
            .as_str()
            .is_some_and(|e| e.contains("2 of 2 ended targets failed")),
        "{stopped}"
    );
    // The alert is up while the last job finishes.
    let alerts = cp.get("/alerts").await;
    let alert = alerts["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["kind"] == "FailureThresholdReached")
        .cloned()
        .unwrap_or_else(|| panic!("no FailureThresholdReached alert: {alerts}"));
    assert_eq!(alert["severity"], "critical");
    assert_eq!(alert["resource"], "deployment/careful");
    // The queued job is canceled on its agent (before it ever started).
    let canceled = eventually(Duration::from_secs(30), "b-queued's cancel", || async {
        let jobs = queued.agent.jobs();
        jobs.as_array()?
            .iter()
            .find(|j| j["jobId"] == queued_job.as_str() && j["state"] == "Canceled")
            .cloned()
    })
    .await;
    assert_eq!(canceled["state"], "Canceled", "{canceled}");
    // The idle devices come back online and get nothing.
    for agent in &mut later[2..] {
        agent.restart();
    }
    cp.wait_for_agents(&["e-idle", "f-idle"]).await;
    // The held job finishes; so does the deployment.
    std::fs::remove_file(&held.hold).expect("release a-held");
    let d = finish(&cp, "careful", 4, Duration::from_secs(60)).await;
    let s = &d["status"];
    assert_eq!(s["phase"], "Failed", "{d}");
    assert_eq!(s["reason"], "FailureThresholdReached", "{d}");
    assert_eq!(
        (&s["succeeded"], &s["failed"], &s["canceled"]),
        (&json!(1), &json!(2), &json!(3)),
        "{d}"
    );
    for agent in &later[2..] {
        assert!(
            agent.jobs().as_array().is_some_and(Vec::is_empty),
            "released after the stop: {}",
            agent.jobs()
        );
    }
    assert_eq!(later[0].jobs().as_array().map(Vec::len), Some(1));
    // `describe` says why, in words.
    let out = Command::new(bin("drover"))
        .args(["--server", &cp.api, "--token", &cp.token])
        .args(["describe", "deployment", "careful"])
        .output()
        .expect("drover describe");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("stops when 2 targets ended failed") && text.contains("reached"),
        "{text}"
    );
    std::fs::remove_file(&queued.hold).expect("release b-queued");
}

/// The seed's pass triggers, each on its own: with the engine's timer set
/// to ten minutes, only a change, a result and a hello can move this
/// deployment. `t1` is released by the pass its creation triggers; `t2`
/// (online) waits for the one slot and is released by the pass `t1`'s
/// result triggers; `t3` is offline, and is released by the pass its
/// agent's hello triggers. Each wait is far shorter than the timer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_pass_trigger_moves_a_deployment_without_the_timer() {
    let cp = ControlPlane::start(&["--pass-interval-ms", "600000"]);
    for device in ["t1", "t2", "t3"] {
        apply_device(&cp, device, "triggers", None).await;
    }
    let first = held_agent(&cp, "t1");
    let second = AgentProcess::start(
        &cp.dir.path().join("t2"),
        "t2",
        &cp.agent_url,
        &cp.device_token("t2"),
        "",
    );
    let mut third = AgentProcess::start(
        &cp.dir.path().join("t3"),
        "t3",
        &cp.agent_url,
        &cp.device_token("t3"),
        "",
    );
    cp.wait_for_agents(&["t1", "t2", "t3"]).await;
    third.kill9();
    cp.apply(json!({
        "apiVersion": API_VERSION, "kind": "Deployment",
        "metadata": {"name": "triggered"},
        "spec": {
            "targets": {"filter": {"groups": ["triggers"]}},
            "systemUpgradeV1": {},
            "maxConcurrency": 1,
            "deadlineSeconds": 3600
        }
    }))
    .await;
    let state = |targets: &[Value], device: &str| {
        targets
            .iter()
            .find(|t| t["device"] == device)
            .map(|t| t["state"].as_str().unwrap_or("").to_owned())
            .unwrap_or_default()
    };
    // The change feed: the new deployment's pass releases t1.
    eventually(Duration::from_secs(30), "t1 released and held", || {
        let reached = first.reached.exists();
        async move { reached.then_some(()) }
    })
    .await;
    let t = targets(&cp, "triggered").await;
    assert_eq!(
        (state(&t, "t2"), state(&t, "t3")),
        ("pending".into(), "pending".into()),
        "one slot: {t:?}"
    );
    // A result: t1's success frees the slot, and the pass it triggers
    // releases t2 (online), not t3 (offline).
    std::fs::remove_file(&first.hold).expect("release t1");
    eventually(
        Duration::from_secs(30),
        "t2 released by t1's result",
        || async {
            let t = targets(&cp, "triggered").await;
            (state(&t, "t1") == "succeeded" && state(&t, "t2") == "succeeded").then_some(())
        },
    )
    .await;
    assert_eq!(state(&targets(&cp, "triggered").await, "t3"), "pending");
    // A hello: t3 comes back, and its hello's pass releases it.
    third.restart();
    let d = finish(&cp, "triggered", 1, Duration::from_secs(30)).await;
    assert_eq!(d["status"]["phase"], "Complete", "{d}");
    assert_eq!(second.jobs().as_array().map(Vec::len), Some(1));
    assert_eq!(third.jobs().as_array().map(Vec::len), Some(1));
}
