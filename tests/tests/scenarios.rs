//! The end-to-end scenarios every transport must pass, written once and run
//! over WebSocket, NATS JetStream and MQTT (issue 29): a fourth transport
//! adds a `Fleet` constructor and inherits them. Each is a real control
//! plane, the transport's real broker and real agents.
//!
//! - the seed's TaskRun on five agents: canary first, every job once;
//! - an agent away when its job is released finds it when it returns;
//! - a failing canary stops the rollout before anyone else gets anything;
//! - an agent killed mid-job runs it once and reports it;
//! - the agent's own patch assessment (a local job the control plane never
//!   sent) reaches `drover patch-status`;
//! - `drover logs` fetches a job's whole output from the device;
//! - a real apt failure's reason lines reach the control plane, and its
//!   whole output through `drover logs`;
//!
//! and, over the two brokers (NATS JetStream, MQTT):
//!
//! - a broker killed mid-run, while a job ends, loses no status;
//! - an intent for another device, published on a device's own topic or
//!   subject, is dropped and never shadows the device's own job;
//! - an agent the broker knows by its token moves to its broker password
//!   when the broker does.
//!
//! What only one transport has (broker ACLs, retained topics, KV buckets,
//! TLS to each broker) stays in nats.rs, mqtt.rs and the WebSocket files.

use drover_tests::fleet::Fleet;
use drover_tests::{AgentProcess, eventually};
use serde_json::json;
use std::time::Duration;

/// A test of `scenario` per named transport (`over_websocket`, `over_nats`,
/// `over_mqtt`), each on its own fleet whose devices are `devices`
/// prefixed with the transport's name.
macro_rules! run_over {
    ($scenario:ident, $devices:expr, $($transport:ident),+) => {
        mod $scenario {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $transport() {
                    let over = stringify!($transport).trim_start_matches("over_");
                    let devices: Vec<String> =
                        $devices.iter().map(|d| format!("{over}-{d}")).collect();
                    super::$scenario(super::fleet_over(over, &devices), devices).await
                }
            )+
        }
    };
}

/// Every transport: WebSocket, NATS JetStream, MQTT.
macro_rules! on_every_transport {
    ($scenario:ident, $devices:expr) => {
        run_over!($scenario, $devices, over_websocket, over_nats, over_mqtt);
    };
}

/// What needs a broker: NATS JetStream and MQTT.
macro_rules! on_every_broker {
    ($scenario:ident, $devices:expr) => {
        run_over!($scenario, $devices, over_nats, over_mqtt);
    };
}

/// The fleet of one transport, by its name in the tests' names.
fn fleet_over(transport: &str, devices: &[String]) -> Fleet {
    let devices: Vec<&str> = devices.iter().map(String::as_str).collect();
    match transport {
        "websocket" => Fleet::websocket(),
        "nats" => Fleet::nats(&devices),
        "mqtt" => Fleet::mqtt(&devices),
        other => panic!("no fleet over {other}"),
    }
}

on_every_transport!(
    the_seed_taskrun_completes_on_five_agents_canary_first,
    ["canary", "w1", "w2", "w3", "w4"]
);
on_every_transport!(
    an_agent_away_at_release_finds_its_job_when_it_returns,
    ["away"]
);
on_every_transport!(
    a_failing_canary_stops_the_rollout_before_anyone_else_gets_anything,
    ["canary", "w1", "w2"]
);
on_every_transport!(an_agent_killed_mid_job_runs_the_job_once, ["kill"]);
on_every_transport!(an_agents_own_assessment_reaches_patch_status, ["assess"]);
on_every_transport!(a_jobs_output_comes_back_through_drover_logs, ["logs"]);
on_every_transport!(
    a_failed_jobs_reason_in_apts_words_comes_over_the_transport,
    ["needy"]
);
on_every_broker!(a_broker_killed_mid_run_loses_no_status, ["canary", "w1"]);
on_every_broker!(
    a_foreign_intent_is_dropped_and_never_shadows_the_devices_job,
    ["canary", "b"]
);
on_every_broker!(
    an_agent_moves_from_its_token_to_its_broker_password_when_the_broker_does,
    ["mig"]
);

/// The agent assesses on its own (a `patchAssessmentV1` job it queues
/// itself, within its offset after the start: at most 15 s with a
/// two-minute period): the report reaches the control plane over the
/// transport, and `drover patch-status` counts the device as assessed, not
/// as never assessed. Over NATS every such status was once refused ("job …
/// was never given to DEVICE"), as no intent of the control plane's named
/// it.
async fn an_agents_own_assessment_reaches_patch_status(fleet: Fleet, devices: Vec<String>) {
    let cp = &fleet.cp;
    let device = &devices[0];
    register(&fleet, &devices).await;
    let agent = fleet.agent(device, "[assessment]\nevery_minutes = 2\n");
    cp.wait_for_agents(&names(&devices)).await;
    let patch_status = || {
        let out = cp.cli(&["patch-status"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let line = |text: &str, label: &str| -> String {
        text.lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no '{label}' line in:\n{text}"))
            .trim_start_matches(label)
            .trim()
            .to_owned()
    };
    // Before the agent's first assessment the device is never assessed:
    // the count the assertion below needs to see move.
    let before = patch_status();
    assert_eq!(line(&before, "devices:"), "1", "{before}");
    let assessed = eventually(
        Duration::from_secs(90),
        "the agent's own assessment in the device's patch status",
        || async {
            let device = cp.get(&format!("/devices/{device}")).await;
            device["patch"]["assessedAt"].as_str().map(str::to_owned)
        },
    )
    .await;
    let after = patch_status();
    assert_eq!(line(&after, "never assessed:"), "0", "{after}");
    // The report came from the agent's own job, as the agent keeps it.
    let jobs = agent.jobs();
    assert!(
        jobs.as_array()
            .into_iter()
            .flatten()
            .any(|j| j["kind"] == "patchAssessmentV1" && j["state"] == "Succeeded"),
        "{jobs}"
    );
    assert!(
        !agent.logged("never given"),
        "the agent was told its own job was never given to it (assessed at {assessed}):\n{}",
        agent.log()
    );
}

/// Issue 56, item 3: `drover logs DEVICE [JOB]` fetches a job's whole
/// output from the device over its transport, byte for byte what
/// `drover-agent logs` prints on the device, in many chunks; `--tail`;
/// the device's refusals in its own words; a bad job name refused before
/// anything is sent; and a device that is gone named, within `--wait`.
///
/// The agents here simulate, and a simulation keeps no output, so the
/// job's call is written where the agent keeps calls, as the agent writes
/// them (apt_upgrade.rs fetches a real dpkg failure's).
async fn a_jobs_output_comes_back_through_drover_logs(fleet: Fleet, devices: Vec<String>) {
    let cp = &fleet.cp;
    let device = &devices[0];
    register(&fleet, &devices).await;
    let mut agent = fleet.agent(device, "");
    cp.wait_for_agents(&names(&devices)).await;
    let logs = |args: &[&str]| {
        let mut all = vec!["logs", device.as_str()];
        all.extend_from_slice(args);
        let out = cp.cli(&all);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // Nothing kept yet: the device says so.
    let (ok, _, err) = logs(&[]);
    assert!(!ok && err.contains("no job has left output"), "{err}");

    let job = "0480de1c-3d6a-4678-b410-2dde8ea1f1f1";
    // Some 300 KB: ten chunks and more, with a script's escape sequences.
    let mut stdout = String::new();
    for n in 0..6000 {
        stdout.push_str(&format!(
            "Unpacking package-{n} (1.{n}) over (1.0) ... \u{1b}[1mok\u{1b}[0m\n"
        ));
    }
    agent.stage_call(
        job,
        100,
        &stdout,
        "E: Sub-process /usr/bin/dpkg returned an error code (1)\n",
    );
    let (ok, on_device) = agent.cli(&["logs", job]);
    assert!(ok, "{on_device}");
    let (ok, fetched, err) = logs(&[&job[..8]]);
    assert!(ok, "{err}\n{}", cp.log());
    assert!(fetched.len() > 250_000, "{} bytes", fetched.len());
    assert!(
        fetched == on_device,
        "drover logs differs from drover-agent logs"
    );
    assert!(!fetched.contains('\u{1b}'), "escape sequences came through");
    assert!(
        fetched
            .ends_with("-- stderr --\nE: Sub-process /usr/bin/dpkg returned an error code (1)\n"),
        "{}",
        &fetched[fetched.len() - 200..]
    );
    // The newest job's when none is named; its end with --tail.
    let (ok, newest, _) = logs(&[]);
    assert!(ok && newest == fetched);
    let (ok, tail, err) = logs(&["--tail", "2"]);
    assert!(ok, "{err}");
    assert_eq!(
        tail,
        "-- stderr --\nE: Sub-process /usr/bin/dpkg returned an error code (1)\n"
    );
    // The device's refusal, in its words; a bad name never reaches it.
    let (ok, _, err) = logs(&["ffffffff"]);
    assert!(
        !ok && err.contains("404") && err.contains("no output of job ffffffff"),
        "{err}"
    );
    let (ok, _, err) = logs(&["../etc/passwd"]);
    assert!(
        !ok && err.contains("400") && err.contains("hexadecimal"),
        "{err}"
    );

    // A device that is gone: named at once over WebSocket (no session),
    // after the wait over a broker (no answer).
    agent.kill9();
    let (ok, _, err) = logs(&["--wait", "3"]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("is not connected") || err.contains("no answer from the device within 3 s"),
        "{err}"
    );
}

/// Issue 56, items 2 and 3 over each transport: a package whose
/// dependency no archive has, installed by a real apt in a disposable
/// Debian root, fails; apt's own words on why (the unmet dependency, its
/// `E:` line) reach the control plane in the job's status, and its whole
/// output comes back through `drover logs`.
async fn a_failed_jobs_reason_in_apts_words_comes_over_the_transport(
    fleet: Fleet,
    devices: Vec<String>,
) {
    let cp = &fleet.cp;
    let device = &devices[0];
    drover_tests::upload_needy_package(cp);
    let root = drover_sandbox::Sandbox::new();
    register(&fleet, &devices).await;
    let agent = fleet.agent_updating(
        device,
        &format!(
            "mode = \"upgrade\"\nroot = {}\nmin_free_mib = 10",
            drover_tests::toml_string(&root.root.display().to_string())
        ),
    );
    cp.wait_for_agents(&names(&devices)).await;
    cp.apply(drover_tests::install_deployment(
        "needy",
        "fleet",
        drover_tests::NEEDY_PACKAGE,
    ))
    .await;
    let finished = eventually(
        Duration::from_secs(120),
        "the deployment to end",
        || async {
            let d = cp.get("/deployments/needy").await;
            matches!(d["status"]["phase"].as_str(), Some("Complete" | "Failed")).then_some(d)
        },
    )
    .await;
    assert_eq!(
        finished["status"]["phase"],
        "Failed",
        "{finished}\n{}",
        agent.log()
    );
    let jobs = cp.get(&format!("/devices/{device}/jobs")).await;
    let job = &jobs["items"][0];
    let reason = drover_tests::reason_lines(job);
    assert!(
        reason.iter().any(|l| l.contains(drover_tests::NEEDY_UNMET)),
        "apt's unmet dependency is not in the reason: {reason:#?}\n{job:#}"
    );
    assert!(reason.iter().any(|l| l.starts_with("E: ")), "{reason:#?}");
    let job_id = job["job"].as_str().expect("the job's id");
    let out = cp.cli(&["logs", device, &job_id[..8]]);
    let logs = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        logs.contains("drover-missing") && logs.lines().any(|l| l.starts_with("E: ")),
        "{logs}"
    );
}

/// Registers `devices` in group `fleet`, the first labelled canary.
async fn register(fleet: &Fleet, devices: &[String]) {
    for (i, device) in devices.iter().enumerate() {
        let labels = if i == 0 {
            json!({"canary": "true"})
        } else {
            json!({})
        };
        fleet.cp.apply_device(device, &["fleet"], labels).await;
    }
}

fn names(devices: &[String]) -> Vec<&str> {
    devices.iter().map(String::as_str).collect()
}

async fn the_seed_taskrun_completes_on_five_agents_canary_first(
    fleet: Fleet,
    devices: Vec<String>,
) {
    let cp = &fleet.cp;
    register(&fleet, &devices).await;
    let agents: Vec<AgentProcess> = devices.iter().map(|d| fleet.agent(d, "")).collect();
    cp.wait_for_agents(&names(&devices)).await;
    cp.apply_upgrade_run("seed-run", "fleet", 600).await;
    let run = cp
        .wait_run_finished("seed-run", Duration::from_secs(120))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}\n{}", cp.log());
    assert_eq!(run["status"]["succeeded"], 5, "{run}");

    // The canary finished before any other device accepted its job.
    let targets = cp.targets("seed-run").await;
    let canary_done = targets
        .iter()
        .find(|t| t["canary"] == true)
        .and_then(|t| t["status"]["finishedAt"].as_str())
        .expect("the canary finished")
        .to_owned();
    for target in targets.iter().filter(|t| t["canary"] != true) {
        let accepted = target["status"]["acceptedAt"].as_str().expect("accepted");
        assert!(
            accepted > canary_done.as_str(),
            "{} accepted before the canary finished",
            target["device"]
        );
        assert_eq!(target["state"], "succeeded", "{target}");
    }

    // Every agent ran its one job once, over this transport.
    for agent in &agents {
        let jobs = agent.jobs();
        assert_eq!(jobs.as_array().map(Vec::len), Some(1), "{jobs}");
        assert_eq!(jobs[0]["state"], "Succeeded", "{jobs}");
        assert_eq!(agent.status()["link"]["transport"], fleet.transport());
    }
    // Each device made its own key at first start: private to the agent,
    // its public half shown by `status`, and no two alike.
    let mut keys = std::collections::BTreeSet::new();
    for agent in &agents {
        let status = agent.status();
        let key = status["publicKey"].as_str().unwrap_or_default().to_owned();
        assert!(
            key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit()),
            "{status}"
        );
        keys.insert(key);
        use std::os::unix::fs::PermissionsExt;
        let file = agent.dir.join("state").join("device.key");
        let mode = std::fs::metadata(&file)
            .expect("device.key")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{}", file.display());
    }
    assert_eq!(keys.len(), agents.len(), "one key per device");

    // A decided job's intent leaves its broker; over NATS its status stays
    // in the status bucket under the seed's key.
    let uid = run["metadata"]["uid"].as_str().expect("uid").to_owned();
    for device in &devices {
        eventually(Duration::from_secs(20), "the intent withdrawn", || async {
            fleet.kept(device, &uid).await.is_none().then_some(())
        })
        .await;
        if fleet.transport() == "nats" {
            let status = fleet.kept_status(device, &uid).await;
            assert_eq!(
                status.as_ref().map(|s| &s["state"]),
                Some(&json!("Succeeded")),
                "{status:?}"
            );
        }
    }
}

async fn an_agent_away_at_release_finds_its_job_when_it_returns(
    fleet: Fleet,
    devices: Vec<String>,
) {
    let cp = &fleet.cp;
    let device = &devices[0];
    cp.apply_device(device, &["fleet"], json!({})).await;
    let mut agent = fleet.agent(device, "");
    cp.wait_for_agents(&[device]).await;
    agent.kill9();
    cp.apply_upgrade_run("away-run", "fleet", 600).await;
    eventually(Duration::from_secs(20), "the job released", || async {
        let targets = cp.targets("away-run").await;
        (targets.first()?["state"] == "undelivered").then_some(())
    })
    .await;
    agent.restart();
    let run = cp
        .wait_run_finished("away-run", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}\n{}", agent.log());
    let jobs = agent.jobs();
    assert_eq!(jobs.as_array().map(Vec::len), Some(1), "{jobs}");
    assert!(
        !agent.log().contains("cannot read current intents"),
        "{}",
        agent.log()
    );
}

async fn a_failing_canary_stops_the_rollout_before_anyone_else_gets_anything(
    fleet: Fleet,
    devices: Vec<String>,
) {
    let cp = &fleet.cp;
    register(&fleet, &devices).await;
    let agents: Vec<AgentProcess> = devices
        .iter()
        .enumerate()
        .map(|(i, device)| {
            let mut agent = fleet.agent(device, "");
            if i == 0 {
                agent.fail_preflight();
            }
            agent
        })
        .collect();
    cp.wait_for_agents(&names(&devices)).await;
    cp.apply_upgrade_run("canary-run", "fleet", 600).await;
    let run = cp
        .wait_run_finished("canary-run", Duration::from_secs(60))
        .await;
    let status = &run["status"];
    assert_eq!(status["phase"], "Failed", "{run}");
    assert_eq!(status["reason"], "CanaryFailed", "{run}");
    assert!(
        status["latestError"]
            .as_str()
            .unwrap_or("")
            .contains("not enough free space"),
        "{run}"
    );
    assert_eq!(status["released"], 1, "only the canary was released: {run}");
    for target in cp.targets("canary-run").await {
        let want = if target["canary"] == true {
            "failed"
        } else {
            "notReleased"
        };
        assert_eq!(target["state"], want, "{target}");
        // Why the canary failed is a fact on its status, over each transport.
        if target["canary"] == true {
            assert_eq!(target["status"]["failure"], "stepFailed", "{target}");
        }
    }
    // The workers never received an intent.
    for agent in &agents[1..] {
        assert_eq!(agent.jobs(), json!([]), "{}", agent.log());
    }
    // A terminal run never advances, even after more passes.
    cp.engine_barrier().await;
    let later = cp.get("/taskruns/canary-run").await;
    assert_eq!(later["status"], run["status"]);
}

async fn an_agent_killed_mid_job_runs_the_job_once(fleet: Fleet, devices: Vec<String>) {
    let cp = &fleet.cp;
    let device = &devices[0];
    cp.apply_device(device, &["fleet"], json!({})).await;
    let (mut agent, hold, reached) = fleet.held_agent(device);
    cp.wait_for_agents(&[device]).await;
    cp.apply_upgrade_run("kill-run", "fleet", 600).await;
    eventually(Duration::from_secs(30), "the job to be mid-way", || async {
        reached.exists().then_some(())
    })
    .await;
    agent.kill9();
    std::fs::remove_file(&hold).expect("release");
    agent.restart();
    let run = cp
        .wait_run_finished("kill-run", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}\n{}", agent.log());
    agent.assert_one_job_run_once();
}

/// The broker dies without saving (its sessions, retained messages or
/// unsynced stream data gone) while the canary is mid-job; the job ends
/// while no broker runs, so its result waits in the agent's outbox. When
/// the broker returns, nothing is lost: the run completes, every job once.
async fn a_broker_killed_mid_run_loses_no_status(mut fleet: Fleet, devices: Vec<String>) {
    let (canary, worker) = (&devices[0], &devices[1]);
    register(&fleet, &devices).await;
    let (held, hold, reached) = fleet.held_agent(canary);
    let other = fleet.agent(worker, "");
    fleet.cp.wait_for_agents(&[canary, worker]).await;
    fleet.cp.apply_upgrade_run("crash-run", "fleet", 600).await;
    eventually(
        Duration::from_secs(30),
        "the canary to be mid-job",
        || async { reached.exists().then_some(()) },
    )
    .await;
    fleet.kill_broker();
    std::fs::remove_file(&hold).expect("release");
    eventually(
        Duration::from_secs(60),
        "the canary to finish with its result unsent",
        || async {
            let status = held.status();
            (status["currentJob"].is_null() && status["outboxPending"].as_u64() > Some(0))
                .then_some(())
        },
    )
    .await;
    fleet.restart_broker();
    let cp = &fleet.cp;
    let run = cp
        .wait_run_finished("crash-run", Duration::from_secs(90))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}\n{}", cp.log());
    assert_eq!(run["status"]["succeeded"], 2, "{run}");
    held.assert_one_job_run_once();
    assert_eq!(other.jobs().as_array().map(Vec::len), Some(1));
}

/// Intents signed with the control plane's own key but for another device,
/// published where device B reads its intents: a good signature does not
/// make another device's intent B's. The first arrives under the job id B's
/// own intent will have, before it exists; the second while B's job runs.
async fn a_foreign_intent_is_dropped_and_never_shadows_the_devices_job(
    fleet: Fleet,
    devices: Vec<String>,
) {
    let cp = &fleet.cp;
    let (canary, b) = (&devices[0], &devices[1]);
    register(&fleet, &devices).await;
    let (_canary, canary_hold, canary_reached) = fleet.held_agent(canary);
    let (agent, b_hold, b_reached) = fleet.held_agent(b);
    cp.wait_for_agents(&[canary, b]).await;
    cp.apply_upgrade_run("fi-run", "fleet", 600).await;
    let reached = |path: std::path::PathBuf, what: &'static str| async move {
        eventually(Duration::from_secs(30), what, || async {
            path.exists().then_some(())
        })
        .await
    };
    reached(canary_reached, "the canary to be mid-job").await;
    let uid = cp.get("/taskruns/fi-run").await["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_owned();
    let foreign = |job: &str| {
        drover_tests::sign_intent(json!({
            "jobId": job, "deviceId": "fi-other", "kind": {"systemUpgradeV1": {}}, "attempt": 1,
            "createdAt": jiff::Timestamp::now().to_string(),
            "expiresAt": (jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1)).to_string(),
            "timeoutSeconds": 1500
        }))
        .to_string()
    };
    fleet.publish_intent(b, &uid, foreign(&uid)).await;
    eventually(
        Duration::from_secs(20),
        "B to handle the foreign intent",
        || async {
            (agent.log().contains("is for device fi-other") || agent.jobs() != json!([]))
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        agent.jobs(),
        json!([]),
        "nothing recorded for a foreign intent"
    );
    // The canary finishes; B receives its own intent and runs it.
    std::fs::remove_file(&canary_hold).expect("release");
    reached(b_reached, "B's own job to run").await;
    let other = "00000000-0000-4000-8000-0000000000aa";
    fleet.publish_intent(b, other, foreign(other)).await;
    eventually(
        Duration::from_secs(20),
        "B to drop the second foreign intent",
        || async { (agent.log().matches("is for device fi-other").count() >= 2).then_some(()) },
    )
    .await;
    std::fs::remove_file(&b_hold).expect("release");
    let run = cp
        .wait_run_finished("fi-run", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}\n{}", agent.log());
    let jobs = agent.jobs();
    assert_eq!(jobs.as_array().map(Vec::len), Some(1), "{jobs}");
    assert_eq!(jobs[0]["jobId"], uid.as_str());
    assert_eq!(jobs[0]["state"], "Succeeded");
}

/// A broker set up before per-device broker passwords knows a device by
/// its token; the agent logs in with it (saying so). When the broker moves
/// to the password `drover nats-config` / `mqtt-config` write, the same
/// agent follows without a restart and runs the next job.
async fn an_agent_moves_from_its_token_to_its_broker_password_when_the_broker_does(
    mut fleet: Fleet,
    devices: Vec<String>,
) {
    let device = devices[0].as_str();
    fleet.know_by_token(device);
    fleet.cp.apply_device(device, &["fleet"], json!({})).await;
    let agent = fleet.agent(device, "");
    fleet.cp.wait_for_agents(&[device]).await;
    fleet.cp.apply_upgrade_run("mig-1", "fleet", 600).await;
    let run = fleet
        .cp
        .wait_run_finished("mig-1", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}\n{}", agent.log());
    let broker = match fleet.transport() {
        "nats" => "NATS server",
        _ => "MQTT broker",
    };
    assert!(
        agent.logged(&format!("the {broker} knows this device by its token")),
        "{}",
        agent.log()
    );

    fleet.know_by_password(&[device]);
    fleet.cp.apply_upgrade_run("mig-2", "fleet", 600).await;
    let run = fleet
        .cp
        .wait_run_finished("mig-2", Duration::from_secs(90))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}\n{}", agent.log());
    assert_eq!(
        agent.status()["link"]["connected"],
        true,
        "{}",
        agent.status()
    );
}
