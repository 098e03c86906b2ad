//! What only NATS JetStream has, against a real `nats-server -js` with
//! per-device credentials from `drover nats-config`: a device cannot read
//! another's intent or write another's status, a duplicate intent put by
//! hand does not run twice, and TLS works. The scenarios every transport
//! shares (the seed's TaskRun, an agent away at release, a failing canary,
//! an agent killed mid-job) and every broker shares (a broker killed
//! mid-run) are in scenarios.rs.

use drover_tests::{AgentProcess, ControlPlane, NatsServer, eventually};
use futures_util::StreamExt;
use futures_util::TryStreamExt as _;
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

const CP_USER: &str = "drover-control-plane";
const CP_PASSWORD: &str = "cp-secret";

/// A nats-server whose authorization comes from `drover nats-config`, and a
/// control plane serving over it.
/// The authorization block `drover nats-config` prints for these devices,
/// with the device tokens of the control plane in `dir`.
fn nats_config(dir: &Path, devices: &[&str]) -> String {
    let mut args = vec![
        "nats-config",
        "--control-plane-user",
        CP_USER,
        "--control-plane-password",
        CP_PASSWORD,
    ];
    for device in devices {
        args.push("--device");
        args.push(device);
    }
    ControlPlane::drover_in(dir, &args)
}

/// `serve`'s arguments for the nats-server at `url`, logging in as the
/// control plane's user.
fn cp_nats_args(url: &str) -> Vec<String> {
    [
        "--nats-url",
        url,
        "--nats-user",
        CP_USER,
        "--nats-password",
        CP_PASSWORD,
    ]
    .map(str::to_owned)
    .to_vec()
}

fn fleet(devices: &[&str], tls: Option<(&Path, &Path)>) -> (NatsServer, ControlPlane) {
    let dir = ControlPlane::prepare();
    let mut config = nats_config(dir.path(), devices);
    if let Some((cert, key)) = tls {
        config.push_str(&format!(
            "tls {{ cert_file: {:?}, key_file: {:?} }}\n",
            cert.display().to_string(),
            key.display().to_string()
        ));
    }
    let nats = NatsServer::start(&config);
    let url = if tls.is_some() {
        format!("nats://localhost:{}", nats.port)
    } else {
        nats.url()
    };
    let mut extra = cp_nats_args(&url);
    if let Some((cert, _)) = tls {
        extra.push("--nats-ca".into());
        extra.push(cert.display().to_string());
    }
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let cp = ControlPlane::start_in(dir, &extra);
    (nats, cp)
}

/// A nats-server for `devices` and two control-plane replicas on its
/// JetStream store; the second shares the first's secrets (device tokens,
/// operator token), not its data.
fn two_replicas(devices: &[&str]) -> (NatsServer, ControlPlane, ControlPlane) {
    let dir = ControlPlane::prepare();
    let nats = NatsServer::start(&nats_config(dir.path(), devices));
    let url = nats.url();
    let mut serve_args = vec!["--store".to_owned(), "nats".into()];
    serve_args.extend(cp_nats_args(&url));
    let serve_args: Vec<&str> = serve_args.iter().map(String::as_str).collect();
    let dir_b = ControlPlane::prepare_replica(dir.path());
    let first = ControlPlane::start_in(dir, &serve_args);
    let second = ControlPlane::start_in(dir_b, &serve_args);
    (nats, first, second)
}

/// An agent over NATS for each of `devices`, the first with the test hooks
/// `testing` (a hold).
fn agents_held_first(
    cp: &ControlPlane,
    url: &str,
    devices: &[&str],
    testing: &str,
) -> Vec<AgentProcess> {
    devices
        .iter()
        .enumerate()
        .map(|(i, d)| nats_agent(cp, url, d, None, if i == 0 { testing } else { "" }))
        .collect()
}

/// A connection of `device`'s own (its broker password, its inbox prefix)
/// beside its agent, and the server's errors to it as they come: a denied
/// publish or subscription comes back as an asynchronous -ERR
/// ("Permissions Violation for Publish to \"SUBJECT\""), never as a reply.
async fn device_keeping_errors(
    cp: &ControlPlane,
    url: &str,
    device: &str,
) -> (
    async_nats::Client,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    let errors = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let kept = errors.clone();
    let client = async_nats::ConnectOptions::with_user_and_password(
        device.into(),
        cp.broker_password(device),
    )
    .custom_inbox_prefix(format!("_INBOX_{device}"))
    .event_callback(move |event| {
        let kept = kept.clone();
        async move {
            if let async_nats::Event::ServerError(e) = event {
                kept.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(e.to_string());
            }
        }
    })
    .connect(url)
    .await
    .unwrap_or_else(|e| panic!("{device} connects: {e}"));
    (client, errors)
}

fn nats_agent(
    cp: &ControlPlane,
    nats_url: &str,
    device: &str,
    ca: Option<&Path>,
    extra: &str,
) -> AgentProcess {
    let token = cp.device_token(device);
    AgentProcess::start_nats(
        &cp.dir.path().join(device),
        device,
        nats_url,
        &token,
        ca,
        extra,
    )
}

/// Device A, logged in with its own credentials beside its agent, reads its
/// own intent and sends its own status through the calls its agent uses (a
/// subscription to its intent subject, a request on its status subject):
/// the positive control. The same calls on B's subjects, a put into B's
/// status key and a consumer on B's intents are each refused by nats-server
/// with a permissions violation naming the subject, and nothing of them
/// arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_cannot_read_anothers_intent_or_write_anothers_status() {
    let (nats, cp) = fleet(&["dev-a", "dev-b"], None);
    cp.apply_device("dev-a", &["solo"], json!({})).await;
    cp.apply_device("dev-b", &["fleet"], json!({})).await;
    let _agent_a = nats_agent(&cp, &nats.url(), "dev-a", None, "");
    let _agent_b = nats_agent(&cp, &nats.url(), "dev-b", None, "");
    cp.wait_for_agents(&["dev-a", "dev-b"]).await;

    // Device A logs in with its own credentials; the server's errors to it
    // (permissions violations among them) are kept.
    let (client, violations) = device_keeping_errors(&cp, &nats.url(), "dev-a").await;
    // A violation names the subject: `Permissions Violation for Publish to
    // "SUBJECT"`; matched up to the subject's start (a consumer's create
    // subject ends in parts async-nats chooses).
    let refused = |subject: &str, operation: &'static str| {
        let needle = format!("Permissions Violation for {operation} to \"{subject}");
        let violations = violations.clone();
        async move {
            eventually(Duration::from_secs(5), &needle.clone(), || async {
                violations
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .any(|v| v.contains(&needle))
                    .then_some(())
            })
            .await
        }
    };
    let mut own = client
        .subscribe("drover.rp.intent.dev-a.>")
        .await
        .expect("subscribe call");
    let mut snoop = client
        .subscribe("drover.rp.intent.dev-b.>")
        .await
        .expect("subscribe call");
    client.flush().await.expect("flush");
    refused("drover.rp.intent.dev-b.>", "Subscription").await;
    let cp_client =
        async_nats::ConnectOptions::with_user_and_password(CP_USER.into(), CP_PASSWORD.into())
            .connect(nats.url())
            .await
            .expect("connect");
    let statuses = async_nats::jetstream::new(cp_client)
        .get_key_value("system-upgrade-status")
        .await
        .expect("bucket");
    let status_answer = |subject: &'static str, payload: Vec<u8>| {
        let client = client.clone();
        async move {
            let reply = tokio::time::timeout(
                Duration::from_secs(5),
                client.request(subject, payload.into()),
            )
            .await
            .ok()?
            .ok()?;
            serde_json::from_slice::<Value>(&reply.payload).ok()
        }
    };

    // The positive control: A's own job reaches this connection's
    // subscription as it reaches A's agent, and A's own last status for it,
    // sent again through the agent's call, is answered as stored.
    cp.apply_upgrade_run("a-run", "solo", 600).await;
    let run = cp.wait_run_finished("a-run", Duration::from_secs(60)).await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}");
    let intent = tokio::time::timeout(Duration::from_secs(5), own.next())
        .await
        .expect("A's own intent on its own subscription")
        .expect("A's subscription open");
    let intent: Value = serde_json::from_slice(&intent.payload).expect("an intent");
    let job_a = intent["jobId"].as_str().expect("jobId").to_owned();
    let stored_a = statuses
        .entry(format!("dev-a.{job_a}"))
        .await
        .expect("get")
        .expect("A's status in the bucket");
    assert_eq!(
        status_answer("drover.status.dev-a", stored_a.value.to_vec()).await,
        Some(json!("stored")),
        "A's own status through its own subject"
    );

    // B gets a job; A sees nothing of it and changes nothing of it through
    // the same calls on B's subjects, each refused by name.
    cp.apply_upgrade_run("b-run", "fleet", 600).await;
    let run = cp.wait_run_finished("b-run", Duration::from_secs(60)).await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}");
    let job_b = run["metadata"]["uid"].as_str().expect("uid").to_owned();
    let key_b = format!("dev-b.{job_b}");
    let stored_b = statuses
        .entry(key_b.clone())
        .await
        .expect("get")
        .expect("B's status in the bucket");
    let mut forged: Value = serde_json::from_slice(&stored_b.value).expect("B's status");
    forged["state"] = json!("Failed");
    forged["seq"] = json!(forged["seq"].as_u64().unwrap_or(0) + 100);
    let forged = forged.to_string().into_bytes();
    assert_eq!(
        status_answer("drover.status.dev-b", forged.clone()).await,
        None,
        "A's request on B's status subject was answered"
    );
    refused("drover.status.dev-b", "Publish").await;
    let js = async_nats::jetstream::new(client.clone());
    let forged_key = format!("$KV.system-upgrade-status.{key_b}");
    if let Ok(ack) = js.publish(forged_key.clone(), forged.into()).await {
        let acked = tokio::time::timeout(Duration::from_secs(3), ack).await;
        assert!(!matches!(acked, Ok(Ok(_))), "A put into B's status key");
    }
    refused(&forged_key, "Publish").await;
    let config = async_nats::jetstream::consumer::pull::Config {
        name: Some("intent-dev-b".into()),
        filter_subject: "$KV.system-upgrade-intent.dev-b.>".into(),
        ..Default::default()
    };
    let consumer = tokio::time::timeout(
        Duration::from_secs(5),
        js.create_consumer_on_stream(config, "KV_system-upgrade-intent"),
    )
    .await;
    assert!(
        !matches!(consumer, Ok(Ok(_))),
        "A must not read B's intents through a consumer"
    );
    refused(
        "$JS.API.CONSUMER.CREATE.KV_system-upgrade-intent.",
        "Publish",
    )
    .await;
    let seen = tokio::time::timeout(Duration::from_secs(1), snoop.next()).await;
    assert!(!matches!(seen, Ok(Some(_))), "A received B's intent");
    // B's status is as B's agent left it.
    let after = statuses
        .entry(key_b)
        .await
        .expect("get")
        .expect("B's status in the bucket");
    assert_eq!(
        after.revision, stored_b.revision,
        "B's status was rewritten"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_intent_put_by_hand_does_not_run_twice() {
    let (nats, cp) = fleet(&["dup-1"], None);
    cp.apply_device("dup-1", &["fleet"], json!({})).await;
    let agent = nats_agent(&cp, &nats.url(), "dup-1", None, "");
    cp.wait_for_agents(&["dup-1"]).await;
    cp.apply_upgrade_run("dup-run", "fleet", 600).await;
    let run = cp
        .wait_run_finished("dup-run", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete");
    let targets = cp.targets("dup-run").await;
    let intent = serde_json::json!({
        "jobId": run["metadata"]["uid"], "deviceId": "dup-1", "kind": {"systemUpgradeV1": {}}, "attempt": 1,
        "createdAt": jiff::Timestamp::now().to_string(),
        "expiresAt": (jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1)).to_string(),
        "timeoutSeconds": 1500
    });
    let client =
        async_nats::ConnectOptions::with_user_and_password(CP_USER.into(), CP_PASSWORD.into())
            .connect(nats.url())
            .await
            .expect("connect");
    let intents = async_nats::jetstream::new(client)
        .get_key_value("system-upgrade-intent")
        .await
        .expect("bucket");
    let key = format!("dup-1.{}", run["metadata"]["uid"].as_str().expect("uid"));
    intents
        .put(&key, drover_tests::sign_intent(intent).to_string().into())
        .await
        .expect("put by hand");
    eventually(
        Duration::from_secs(20),
        "the agent to answer the duplicate",
        || async {
            agent
                .log()
                .contains("duplicate delivery answered with the stored status")
                .then_some(())
        },
    )
    .await;
    agent.assert_one_job_run_once();
    let again = cp.targets("dup-run").await;
    assert_eq!(
        again[0]["status"], targets[0]["status"],
        "the stored status is unchanged"
    );
}

/// A fleet whose broker went away must not meet it all at once and then
/// every few milliseconds (async-nats's own reconnect delays: 0, 2, 4 … ms,
/// at most 4 s, the same on every device): the agent tries again after its
/// backoff, jittered, from about a second, doubling. A listener on the dead
/// broker's port counts the agent's attempts (the control plane is stopped
/// first, so every connection is the agent's) and closes each at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_lost_its_broker_tries_again_after_its_backoff_not_at_once() {
    let (mut nats, mut cp) = fleet(&["away-1"], None);
    cp.apply_device("away-1", &["fleet"], json!({})).await;
    // The other tests' agents cap their backoff at 2 s; this one at 8 s, so
    // that its first three delays double: 0.5-1 s, 1-2 s, 2-4 s.
    let transport = format!(
        "kind = \"nats\"\nurl = {}\ntoken = {}\nheartbeat_seconds = 1\nbackoff_max_seconds = 8\n",
        drover_tests::toml_string(&nats.url()),
        drover_tests::toml_string(&cp.device_token("away-1")),
    );
    let agent = AgentProcess::start_full(
        &cp.dir.path().join("away-1"),
        "away-1",
        &transport,
        "",
        "mode = \"simulate\"\nmin_free_mib = 10",
        "",
    );
    cp.wait_for_agents(&["away-1"]).await;
    cp.kill9();
    nats.kill9();
    let lost = std::time::Instant::now();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", nats.port))
        .await
        .expect("the dead broker's port");
    let mut attempts = Vec::new();
    while attempts.len() < 3 {
        let accepted = tokio::time::timeout(Duration::from_secs(30), listener.accept()).await;
        let Ok(Ok((stream, _))) = accepted else {
            panic!(
                "the agent tried {} times in 30 s: {attempts:?}\n{}",
                attempts.len(),
                agent.log()
            );
        };
        attempts.push(lost.elapsed());
        drop(stream);
    }
    // Each wait is at least half its ceiling (0.5, 1 and 2 s; async-nats
    // alone waits 0, 2 and 4 ms), less a tenth for the clock of a busy
    // machine: the gaps between attempts, not only their sum, must grow.
    let gaps = [
        attempts[0],
        attempts[1] - attempts[0],
        attempts[2] - attempts[1],
    ];
    for (gap, floor) in gaps.iter().zip([450, 900, 1800]) {
        assert!(
            *gap >= Duration::from_millis(floor),
            "the agent's attempts after the broker went away: {attempts:?} (gaps {gaps:?})"
        );
    }
}

/// The window an agent spreads its first reconnect over (decision 0020) is
/// named by its control plane in each hello's answer: the devices heard
/// from over `--nats-logins-per-second` (one device at one login a second:
/// 1,000 ms), shown on the agent's status socket. After a control plane
/// set to 0 (no spread) takes over and the broker restarts under the
/// agent, the agent comes back and takes the new window, 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_takes_the_reconnect_window_its_control_plane_names() {
    let dir = ControlPlane::prepare();
    let mut nats = NatsServer::start(&nats_config(dir.path(), &["wide-1"]));
    let url = nats.url();
    let serve = |rate: &str| {
        let mut args = cp_nats_args(&url);
        args.extend(["--nats-logins-per-second".to_owned(), rate.to_owned()]);
        args
    };
    let args = serve("1");
    let mut cp = ControlPlane::start_in(dir, &args.iter().map(String::as_str).collect::<Vec<_>>());
    cp.apply_device("wide-1", &["fleet"], json!({})).await;
    let agent = nats_agent(&cp, &url, "wide-1", None, "");
    cp.wait_for_agents(&["wide-1"]).await;
    let window = |agent: &AgentProcess| agent.status()["link"]["reconnectSpreadMs"].as_u64();
    eventually(Duration::from_secs(20), "a window of 1000 ms", || async {
        (window(&agent) == Some(1000)).then_some(())
    })
    .await;

    let args = serve("0");
    cp.restart_with(&args.iter().map(String::as_str).collect::<Vec<_>>());
    nats.restart();
    eventually(
        Duration::from_secs(30),
        "no window after the restart",
        || async { (window(&agent) == Some(0)).then_some(()) },
    )
    .await;
    assert!(
        agent.log().contains("reconnected to NATS"),
        "the agent came back by reconnecting:\n{}",
        agent.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_and_the_control_plane_speak_tls_to_nats() {
    let dir = tempfile::tempdir().expect("tempdir");
    let drover_tests::LocalhostCert {
        pem: _,
        cert_path,
        key_path,
    } = drover_tests::localhost_cert(dir.path());
    let (nats, cp) = fleet(&["tls-n1"], Some((&cert_path, &key_path)));
    cp.apply_device("tls-n1", &["fleet"], json!({})).await;
    let url = format!("nats://localhost:{}", nats.port);
    let _agent = nats_agent(&cp, &url, "tls-n1", Some(&cert_path), "");
    cp.wait_for_agents(&["tls-n1"]).await;
    cp.apply_upgrade_run("tls-run", "fleet", 600).await;
    let run = cp
        .wait_run_finished("tls-run", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}");
    // A plain connection is refused by the TLS-only server.
    let plain = tokio::time::timeout(
        Duration::from_secs(5),
        async_nats::ConnectOptions::with_user_and_password(CP_USER.into(), CP_PASSWORD.into())
            .connect(nats.url()),
    )
    .await;
    assert!(!matches!(plain, Ok(Ok(_))), "plain text must not connect");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_jetstream_kv_survive_a_killed_replica_without_releasing_twice() {
    let devices = ["rep-1", "rep-2", "rep-3", "rep-4", "rep-5"];
    let (nats, mut first, second) = two_replicas(&devices);
    let url = nats.url();

    for device in devices {
        let labels = if device == "rep-1" {
            json!({"canary": "true"})
        } else {
            json!({})
        };
        first.apply_device(device, &["production"], labels).await;
    }
    let canary_dir = first.dir.path().join("rep-1");
    std::fs::create_dir_all(&canary_dir).expect("dir");
    let hold = canary_dir.join("hold");
    let reached = canary_dir.join("reached");
    std::fs::write(&hold, "").expect("hold");
    let testing = drover_tests::hold_config(&hold, &reached);
    let agents = agents_held_first(&first, &url, &devices, &testing);
    second.wait_for_agents(&devices).await;
    // Every intent put from here on, restarts included, as the broker saw it.
    let puts = drover_tests::IntentPuts::record(&url, CP_USER, CP_PASSWORD).await;
    first
        .apply_upgrade_run("replicated", "production", 600)
        .await;
    eventually(
        Duration::from_secs(30),
        "the canary to be mid-job",
        || async { reached.exists().then_some(()) },
    )
    .await;

    // One replica dies mid-run; the other carries on.
    first.kill9();
    std::fs::remove_file(&hold).expect("release");
    let run = second
        .wait_run_finished("replicated", Duration::from_secs(90))
        .await;
    assert_eq!(
        run["status"]["phase"],
        "Complete",
        "{run}\n{}",
        second.log()
    );
    assert_eq!(run["status"]["succeeded"], 5);
    let uid = run["metadata"]["uid"].as_str().expect("uid").to_owned();
    // Released once, by the broker's own record: the intent bucket saw
    // exactly one put and one withdrawal per device, whichever replica
    // delivered it.
    let client =
        async_nats::ConnectOptions::with_user_and_password(CP_USER.into(), CP_PASSWORD.into())
            .connect(url.clone())
            .await
            .expect("connect");
    let js = async_nats::jetstream::new(client);
    let mut intents = js
        .get_stream("KV_system-upgrade-intent")
        .await
        .expect("intent stream");
    let state = intents.info().await.expect("info").state.clone();
    assert_eq!(
        state.last_sequence,
        2 * devices.len() as u64,
        "one put and one delete per device: {state:?}"
    );
    puts.assert_one_release_each(&devices, &uid);

    // The dead replica comes back and agrees; nothing is released again,
    // through the event that would carry a second release: the restarted
    // replica passes over runs again (a second run proves it) and answers
    // the agents' hellos.
    first.restart();
    eventually(
        Duration::from_secs(30),
        "the restarted replica to agree",
        || async {
            let seen = first.get("/taskruns/replicated").await;
            (seen["status"] == run["status"]).then_some(())
        },
    )
    .await;
    first
        .apply_upgrade_run("after-restart", "production", 600)
        .await;
    let after = first
        .wait_run_finished("after-restart", Duration::from_secs(90))
        .await;
    assert_eq!(after["status"]["phase"], "Complete", "{after}");
    let keys = puts.per_key();
    for device in devices {
        let key = format!("{device}.{uid}");
        assert_eq!(
            keys.get(&key).map(Vec::len),
            Some(1),
            "the first run's intent for {device} was put again after the restart"
        );
    }
    for agent in &agents {
        agent.assert_jobs_run_once(2);
    }
}

/// A hold before full-upgrade plus any other test hooks, for `device`'s directory.
fn held(
    cp: &ControlPlane,
    device: &str,
    more: &str,
) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let dir = cp.dir.path().join(device);
    std::fs::create_dir_all(&dir).expect("dir");
    let hold = dir.join("hold");
    let reached = dir.join("reached");
    std::fs::write(&hold, "").expect("hold");
    let testing = format!("{}{more}\n", drover_tests::hold_config(&hold, &reached));
    (hold, reached, testing)
}

/// One NATS device (test hooks `more`) in a run `<device>-run` of
/// `deadline_seconds`, its job held before full-upgrade: the broker, the
/// control plane, the agent, the hold file and the run's deadline.
async fn run_held_mid_job(
    device: &str,
    more: &str,
    deadline_seconds: u64,
) -> (
    NatsServer,
    ControlPlane,
    AgentProcess,
    std::path::PathBuf,
    jiff::Timestamp,
) {
    let (nats, cp) = fleet(&[device], None);
    cp.apply_device(device, &["fleet"], json!({})).await;
    let (hold, reached, testing) = held(&cp, device, more);
    let agent = nats_agent(&cp, &nats.url(), device, None, &testing);
    cp.wait_for_agents(&[device]).await;
    let name = format!("{device}-run");
    cp.apply_upgrade_run(&name, "fleet", deadline_seconds).await;
    wait_for_file(&reached, "the job to reach full-upgrade").await;
    let run = cp.get(&format!("/taskruns/{name}")).await;
    let start: jiff::Timestamp = run["status"]["startTime"]
        .as_str()
        .expect("start")
        .parse()
        .expect("time");
    let deadline = start + jiff::SignedDuration::from_secs(deadline_seconds as i64);
    (nats, cp, agent, hold, deadline)
}

async fn wait_for_file(path: &Path, what: &str) {
    eventually(Duration::from_secs(60), what, || async {
        path.exists().then_some(())
    })
    .await
}

/// The statuses the held-status stream keeps for `device` now, as the
/// control plane's user reads the stream.
async fn held_statuses(nats: &NatsServer, device: &str) -> u64 {
    let client =
        async_nats::ConnectOptions::with_user_and_password(CP_USER.into(), CP_PASSWORD.into())
            .connect(nats.url())
            .await
            .expect("the control plane's user connects");
    let js = async_nats::jetstream::new(client);
    let stream = js
        .get_stream("drover-held-statuses")
        .await
        .expect("the held-status stream");
    let subject = format!("drover.held.{device}");
    let info = stream
        .info_with_subjects(&subject)
        .await
        .expect("stream info");
    let counts: std::collections::HashMap<String, usize> =
        info.try_collect().await.expect("subjects");
    counts.get(&subject).copied().unwrap_or(0) as u64
}

/// Issue 8, 1, since statuses are requests a control plane answers (issue
/// 28, 3) and the broker holds what none answers (issue 33, 5): a job that
/// finishes while no control plane runs has its statuses held in the
/// held-status stream (the agent's outbox is empty: the broker confirmed
/// them), and they are processed when the control plane comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_made_while_the_control_plane_is_down_is_processed_when_it_returns() {
    let (nats, mut cp) = fleet(&["down-1"], None);
    cp.apply_device("down-1", &["fleet"], json!({})).await;
    let (hold, reached, testing) = held(&cp, "down-1", "");
    let agent = nats_agent(&cp, &nats.url(), "down-1", None, &testing);
    cp.wait_for_agents(&["down-1"]).await;
    cp.apply_upgrade_run("down-run", "fleet", 600).await;
    wait_for_file(&reached, "the job to reach full-upgrade").await;
    cp.kill9();
    std::fs::remove_file(&hold).expect("release");
    // The job finishes; the broker holds its statuses for the control plane.
    agent.wait_idle_and_flushed(Duration::from_secs(60)).await;
    assert_eq!(agent.jobs()[0]["state"], "Succeeded");
    assert!(held_statuses(&nats, "down-1").await > 0);
    cp.restart();
    let run = cp
        .wait_run_finished("down-run", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}\n{}", cp.log());
    assert_eq!(run["status"]["succeeded"], 1);
    assert_eq!(run["status"]["failed"], 0);
    assert_eq!(run["status"]["released"], 1);
    // Taken from the stream once stored.
    eventually(
        Duration::from_secs(30),
        "the held statuses taken",
        || async { (held_statuses(&nats, "down-1").await == 0).then_some(()) },
    )
    .await;
}

/// A replica looks for held statuses every second; a look whose request
/// the broker lost (the server frozen with the request unread, then killed
/// and restarted) must not stop it looking. async-nats sets no timeout on
/// a fetch, and the replica's reader waited for ever: on a three-node
/// cluster under 50,000 agents 455,794 held statuses stayed unread while
/// their devices counted them delivered. Here a status held after the
/// restart (published as the device would, when no replica answers) is
/// stored: the job's status as the control plane shows it is that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_status_is_taken_after_the_broker_lost_a_look_for_them() {
    let (mut nats, cp, _agent, _hold, _deadline) = run_held_mid_job("lost-1", "", 600).await;
    let run = cp.get("/taskruns/lost-1-run").await;
    let uid = run["metadata"]["uid"].as_str().expect("uid").to_owned();
    let key = format!("lost-1.{uid}");
    let client =
        async_nats::ConnectOptions::with_user_and_password(CP_USER.into(), CP_PASSWORD.into())
            .connect(nats.url())
            .await
            .expect("connect");
    let stored = async_nats::jetstream::new(client)
        .get_key_value("system-upgrade-status")
        .await
        .expect("bucket")
        .get(&key)
        .await
        .expect("get")
        .expect("a status");
    let mut status: Value = serde_json::from_slice(&stored).expect("json");

    // Frozen long enough for the replica's next look to be sent and unread.
    nats.freeze();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    nats.restart();

    // The device holds a status (its next one) in the stream.
    let seq = status["seq"].as_u64().expect("seq") + 1;
    status["seq"] = json!(seq);
    let device = async_nats::ConnectOptions::with_user_and_password(
        "lost-1".into(),
        cp.broker_password("lost-1"),
    )
    .custom_inbox_prefix("_INBOX_lost-1")
    .connect(nats.url())
    .await
    .expect("the device connects");
    async_nats::jetstream::new(device)
        .publish("drover.held.lost-1", status.to_string().into())
        .await
        .expect("publish")
        .await
        .expect("the broker holds it");
    let taken = drover_tests::within(Duration::from_secs(40), || async {
        let targets = cp.targets("lost-1-run").await;
        (targets[0]["status"]["seq"] == json!(seq)).then_some(())
    })
    .await;
    assert!(
        taken.is_some(),
        "the held status was not stored ({} held now)\n{}",
        held_statuses(&nats, "lost-1").await,
        cp.log()
    );
}

/// Issue 33, 5: a job that finishes before its run's deadline while no
/// control plane runs, the deadline passing before one returns. The broker
/// held the result from before the deadline (its own clock, not the
/// device's), so the run completes; a control plane that started judging
/// deadlines before reading what the broker held, or that counted the
/// result from when it read it, would fail the run DeadlineExceeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_the_broker_held_counts_from_when_the_broker_had_it() {
    // The deadline leaves the agent 30 s to finish and flush with no
    // control plane: 15 s once ran out on a 2-core machine busy with a
    // fleet benchmark beside the test.
    let (nats, mut cp, agent, hold, deadline) = run_held_mid_job("held-1", "", 40).await;
    cp.kill9();
    std::fs::remove_file(&hold).expect("release");
    agent.wait_idle_and_flushed(Duration::from_secs(30)).await;
    let finished = jiff::Timestamp::now();
    assert!(
        finished < deadline,
        "the job and its statuses were not done before the deadline ({finished} >= {deadline}): the test needs a longer deadline"
    );
    assert!(held_statuses(&nats, "held-1").await > 0);
    eventually(Duration::from_secs(60), "the deadline to pass", || async {
        (jiff::Timestamp::now() > deadline + jiff::SignedDuration::from_secs(2)).then_some(())
    })
    .await;
    cp.restart();
    let run = cp
        .wait_run_finished("held-1-run", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}\n{}", cp.log());
    assert_eq!(run["status"]["succeeded"], 1, "{run}");
    assert!(
        cp.log().contains("a status the broker held is stored"),
        "{}",
        cp.log()
    );
}

/// Issue 8, 3b: no device may create a consumer at all, so none can push its
/// intents onto another device's subject.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_cannot_create_a_consumer_that_delivers_to_another_device() {
    let (nats, cp) = fleet(&["shadow-a", "shadow-b"], None);
    // Filtered to A's own keys (what the old permissions allowed), delivering to B.
    let config = || async_nats::jetstream::consumer::push::Config {
        name: Some("intent-shadow-a".into()),
        deliver_subject: "drover.rp.intent.shadow-b.00000000-0000-4000-8000-000000000001".into(),
        filter_subject: "$KV.system-upgrade-intent.shadow-a.>".into(),
        ..Default::default()
    };
    // The server's answers to A, kept: a denied publish comes back as an
    // asynchronous -ERR, never as the request's reply.
    let (client, errors) = device_keeping_errors(&cp, &nats.url(), "shadow-a").await;
    let js = async_nats::jetstream::new(client);
    let created = tokio::time::timeout(
        Duration::from_secs(5),
        js.create_consumer_on_stream(config(), "KV_system-upgrade-intent"),
    )
    .await;
    assert!(
        !matches!(created, Ok(Ok(_))),
        "A created a consumer delivering to B's intent subject"
    );
    // Refused for the reason that matters: the JetStream API is not A's.
    let denial = eventually(
        Duration::from_secs(10),
        "the server's permissions violation",
        || async {
            errors
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .find(|e| {
                    e.to_lowercase().contains("permissions violation")
                        && e.contains("$JS.API.CONSUMER")
                })
                .cloned()
        },
    )
    .await;
    assert!(
        denial.contains("shadow") || denial.contains("Publish"),
        "{denial}"
    );
    // The positive control: the same consumer is creatable by the control
    // plane's user, so A's failure is the permission, not the request.
    let cp_client =
        async_nats::ConnectOptions::with_user_and_password(CP_USER.into(), CP_PASSWORD.into())
            .connect(nats.url())
            .await
            .expect("the control plane's user connects");
    let cp_js = async_nats::jetstream::new(cp_client);
    cp_js
        .create_consumer_on_stream(config(), "KV_system-upgrade-intent")
        .await
        .expect("the control plane's user creates the same consumer");
}

/// Issue 8, 4: a device whose clock is an hour slow finishes after the
/// deadline while no control plane runs; its own completion time says "in
/// time", but the control plane judges by when the result reached it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_device_clock_cannot_succeed_past_the_deadline() {
    let (_nats, mut cp, agent, hold, deadline) =
        run_held_mid_job("slow-1", "clock_offset_seconds = -3600", 15).await;
    cp.kill9();
    eventually(Duration::from_secs(30), "the deadline to pass", || async {
        (jiff::Timestamp::now() > deadline + jiff::SignedDuration::from_secs(1)).then_some(())
    })
    .await;
    std::fs::remove_file(&hold).expect("release");
    // The broker holds its statuses from after the deadline.
    agent.wait_idle_and_flushed(Duration::from_secs(60)).await;
    cp.restart();
    let run = cp
        .wait_run_finished("slow-1-run", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Failed", "{run}\n{}", cp.log());
    assert_eq!(run["status"]["succeeded"], 0, "{run}");
    // Judged by the control plane's clock either way: the result read
    // before the first pass judged the deadline, or the deadline judged
    // first (the late result then reopens nothing).
    let error = run["status"]["latestError"].as_str().unwrap_or("");
    assert!(
        (error.contains("reached the control plane at") && error.contains("after the deadline"))
            || error.contains("had not finished by the deadline"),
        "{run}"
    );
    let targets = cp.targets("slow-1-run").await;
    let status = &targets[0]["status"];
    if status["state"] == "Succeeded" {
        // The device's clock claims it was in time.
        let claimed: jiff::Timestamp = status["completionHeartbeatAt"]
            .as_str()
            .expect("completion")
            .parse()
            .expect("time");
        assert!(
            claimed < deadline,
            "the device's clock claims it was in time"
        );
    }
}

/// A11 over NATS: whoever controls the broker (here, its admin user) cannot
/// start a job: an unsigned intent and one signed by another key are
/// refused and never run; and the control plane answers a hello only into
/// the sending device's own inbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_cannot_start_a_job_and_hellos_are_answered_only_in_the_devices_inbox() {
    let (nats, cp) = fleet(&["br-1", "br-2"], None);
    cp.apply_device("br-1", &["fleet"], json!({})).await;
    let agent = nats_agent(&cp, &nats.url(), "br-1", None, "");
    cp.wait_for_agents(&["br-1"]).await;
    let admin =
        async_nats::ConnectOptions::with_user_and_password(CP_USER.into(), CP_PASSWORD.into())
            .connect(nats.url())
            .await
            .expect("connect");
    let intents = async_nats::jetstream::new(admin.clone())
        .get_key_value("system-upgrade-intent")
        .await
        .expect("bucket");
    let forged = |job: &str| {
        json!({
            "jobId": job, "deviceId": "br-1", "kind": {"systemUpgradeV1": {}}, "attempt": 1,
            "createdAt": jiff::Timestamp::now().to_string(),
            "expiresAt": (jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1)).to_string(),
            "timeoutSeconds": 1500
        })
    };
    let unsigned = "00000000-0000-4000-8000-0000000000b1";
    intents
        .put(
            format!("br-1.{unsigned}"),
            forged(unsigned).to_string().into(),
        )
        .await
        .expect("put");
    let other_key = "00000000-0000-4000-8000-0000000000b2";
    let mut resigned = forged(other_key);
    let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new())
        .expect("key");
    drover_tests::sign_intent_with(&mut resigned, &drover_model::signing::hex(pkcs8.as_ref()));
    intents
        .put(format!("br-1.{other_key}"), resigned.to_string().into())
        .await
        .expect("put");
    eventually(
        Duration::from_secs(20),
        "both refusals on the device",
        || async {
            let jobs = agent.jobs();
            let refused = jobs
                .as_array()
                .into_iter()
                .flatten()
                .filter(|j| j["state"] == "Rejected" && j["kind"] == "unverified")
                .count();
            (refused == 2).then_some(())
        },
    )
    .await;
    let jobs = agent.jobs();
    assert!(
        jobs.as_array().into_iter().flatten().all(|j| j["steps"]
            .as_array()
            .is_none_or(|s| s.iter().all(|s| s["tries"] == 0))),
        "nothing ran: {jobs}"
    );
    // A hello whose reply subject is B's intent subject gets no answer there.
    let mut snoop = admin
        .subscribe("drover.rp.intent.br-2.>")
        .await
        .expect("subscribe");
    let token = cp.broker_password("br-1");
    let device = async_nats::ConnectOptions::with_user_and_password("br-1".into(), token)
        .custom_inbox_prefix("_INBOX_br-1")
        .connect(nats.url())
        .await
        .expect("br-1 connects");
    let hello = json!({"deviceId": "br-1", "agentVersion": "x", "bootId": "b", "capabilities": [], "jobs": []});
    device
        .publish_with_reply(
            "drover.hello.br-1",
            "drover.rp.intent.br-2.00000000-0000-4000-8000-0000000000b3",
            hello.to_string().into(),
        )
        .await
        .expect("publish");
    device.flush().await.expect("flush");
    let seen = tokio::time::timeout(Duration::from_secs(3), snoop.next()).await;
    assert!(
        !matches!(seen, Ok(Some(_))),
        "the control plane answered into B's subject"
    );
    // With its own inbox, the same hello is answered.
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        device.request("drover.hello.br-1", hello.to_string().into()),
    )
    .await
    .expect("in time")
    .expect("answered");
    let reply: Value = serde_json::from_slice(&reply.payload).expect("json");
    assert!(
        reply["serverTime"].is_string() && reply.get("error").is_none(),
        "{reply}"
    );
}

/// A nats-server started as Debian's unit starts it, ended on drop.
struct DebianNats(std::process::Child);

impl Drop for DebianNats {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Issue 28: the README's NATS set-up works with Debian's nats-server as
/// its unit runs it: as the user `nats`, from a main config that enables
/// JetStream in a directory of nats's own and includes, by a path relative
/// to itself, the file `drover nats-config --out` wrote (mode 0640, group
/// nats). The server reads it as its own user, the control plane and an
/// agent log in through it, and a run completes. What nats-config prints
/// names the include by a relative path (nats-server 2.9 reads even an
/// absolute include path relative to the including file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debians_nats_server_reads_what_nats_config_wrote_as_its_own_user() {
    use std::os::unix::fs::MetadataExt;
    if !nix::unistd::geteuid().is_root() {
        drover_tests::cannot_run_here(
            "debians_nats_server_reads_what_nats_config_wrote_as_its_own_user",
            "starting nats-server as the user nats needs root",
        );
        return;
    }
    let nats_user = nix::unistd::User::from_name("nats")
        .expect("look up nats")
        .expect("the user nats exists (Debian's nats-server package makes it)");
    let dir = ControlPlane::prepare();
    // /etc's shape: a root-owned directory holding the main config and
    // nats-server.d/; JetStream in a directory owned by nats.
    let etc = tempfile::Builder::new()
        .prefix("drover-etc-")
        .tempdir()
        .expect("tempdir");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(etc.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let js = etc.path().join("var-lib-nats");
    std::fs::create_dir_all(etc.path().join("nats-server.d")).expect("dir");
    std::fs::create_dir_all(&js).expect("dir");
    std::os::unix::fs::chown(
        &js,
        Some(nats_user.uid.as_raw()),
        Some(nats_user.gid.as_raw()),
    )
    .expect("chown");
    let include = etc.path().join("nats-server.d/drover.conf");
    let printed = ControlPlane::drover_in(
        dir.path(),
        &[
            "nats-config",
            "--control-plane-user",
            CP_USER,
            "--control-plane-password",
            CP_PASSWORD,
            "--device",
            "deb-1",
            "--out",
            include.to_str().expect("utf-8"),
        ],
    );
    assert!(printed.contains("include ../"), "{printed}");
    let meta = std::fs::metadata(&include).expect("include file");
    assert_eq!(meta.mode() & 0o777, 0o640);
    assert_eq!(meta.gid(), nats_user.gid.as_raw(), "its group");
    assert_eq!(meta.uid(), 0, "owned by root");

    let port = drover_tests::free_port();
    let config = etc.path().join("nats-server.conf");
    std::fs::write(
        &config,
        format!(
            "host: 127.0.0.1\nport: {port}\njetstream {{ store_dir: {:?}, max_file_store: {} }}\ninclude nats-server.d/drover.conf\n",
            js.join("jetstream").display().to_string(),
            drover_tests::JETSTREAM_MAX_FILE_STORE
        ),
    )
    .expect("config");
    let log = std::fs::File::create(etc.path().join("nats.log")).expect("log");
    let server = DebianNats(
        std::process::Command::new("setpriv")
            .args([
                "--reuid=nats",
                "--regid=nats",
                "--init-groups",
                "nats-server",
                "-c",
            ])
            .arg(&config)
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start nats-server as nats"),
    );
    eventually(Duration::from_secs(15), "nats-server to listen", || async {
        std::net::TcpStream::connect(("127.0.0.1", port))
            .ok()
            .map(|_| ())
    })
    .await;
    assert_eq!(
        drover_tests::effective_uid(server.0.id()),
        nats_user.uid.as_raw().to_string(),
        "nats-server runs as nats"
    );

    let url = format!("nats://127.0.0.1:{port}");
    let cp = ControlPlane::start_in(
        dir,
        &[
            "--nats-url",
            &url,
            "--nats-user",
            CP_USER,
            "--nats-password",
            CP_PASSWORD,
        ],
    );
    cp.apply_device("deb-1", &["fleet"], json!({})).await;
    let agent = nats_agent(&cp, &url, "deb-1", None, "");
    cp.wait_for_agents(&["deb-1"]).await;
    cp.apply_upgrade_run("deb-run", "fleet", 600).await;
    let run = cp
        .wait_run_finished("deb-run", Duration::from_secs(60))
        .await;
    assert_eq!(
        run["status"]["phase"],
        "Complete",
        "{run}\n{}\n{}",
        agent.log(),
        std::fs::read_to_string(etc.path().join("nats.log")).unwrap_or_default()
    );
}

/// The jobs seed's "one pass per deployment at a time; several replicas
/// safe", end to end: a Deployment over six NATS agents on two replicas
/// sharing the JetStream store, at most two targets out at once. One
/// replica is killed while a target's job is held mid-upgrade; the other
/// finishes the rollout. By the agents' own job lists never more than two
/// ran at once (and neither replica ever shows more than two out); the
/// broker saw exactly one intent put per device, and each agent ran one
/// job once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_on_two_replicas_keeps_its_limit_and_releases_each_device_once() {
    let devices = ["dep-1", "dep-2", "dep-3", "dep-4", "dep-5", "dep-6"];
    let (nats, mut first, second) = two_replicas(&devices);
    let url = nats.url();
    for device in devices {
        first.apply_device(device, &["fleet"], json!({})).await;
    }
    let (hold, reached, testing) = held(&first, "dep-1", "");
    let agents = agents_held_first(&first, &url, &devices, &testing);
    second.wait_for_agents(&devices).await;
    let puts = drover_tests::IntentPuts::record(&url, CP_USER, CP_PASSWORD).await;
    first
        .apply(json!({
            "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Deployment",
            "metadata": {"name": "replicated"},
            "spec": {
                "targets": {"filter": {"groups": ["fleet"]}},
                "systemUpgradeV1": {},
                "maxConcurrency": 2,
                "deadlineSeconds": 600
            }
        }))
        .await;
    let out_at_most_two = |d: &Value| {
        let s = &d["status"];
        let out = s["queued"].as_u64().unwrap_or(0) + s["running"].as_u64().unwrap_or(0);
        assert!(out <= 2, "{out} targets out, over 2: {d}");
    };
    wait_for_file(&reached, "dep-1's job held mid-upgrade").await;
    for cp in [&first, &second] {
        out_at_most_two(&cp.get("/deployments/replicated").await);
    }
    first.kill9();
    std::fs::remove_file(&hold).expect("release dep-1");
    let done = eventually(
        Duration::from_secs(90),
        "the deployment to finish",
        || async {
            let d = second.get("/deployments/replicated").await;
            out_at_most_two(&d);
            matches!(d["status"]["phase"].as_str(), Some("Complete" | "Failed")).then_some(d)
        },
    )
    .await;
    assert_eq!(
        done["status"]["phase"],
        "Complete",
        "{done}\n{}",
        second.log()
    );
    assert_eq!(done["status"]["succeeded"], 6, "{done}");
    // One release per device, by the broker's record: one put each.
    puts.assert_put_once_each(&devices);
    for agent in &agents {
        agent.assert_jobs_run_once(1);
    }
    // The limit by what the agents ran, not by the engine's own counters:
    // each job from when its agent accepted it to when it finished.
    let at_once = most_jobs_at_once(&agents);
    assert!(
        (1..=2).contains(&at_once),
        "{at_once} jobs ran at once, over maxConcurrency 2: {:#?}",
        agents.iter().map(AgentProcess::jobs).collect::<Vec<_>>()
    );
    // The killed replica comes back and agrees.
    first.restart();
    eventually(
        Duration::from_secs(30),
        "the restarted replica to agree",
        || async {
            let seen = first.get("/deployments/replicated").await;
            (seen["status"]["phase"] == "Complete").then_some(())
        },
    )
    .await;
}

/// The most jobs that ran at once across `agents`, by each agent's own job
/// list: a job counts from its `acceptedAt` to its `finishedAt` (one not
/// finished counts to the end). A finish and an acceptance at the same
/// instant count the finish first.
fn most_jobs_at_once(agents: &[AgentProcess]) -> usize {
    let mut edges: Vec<(jiff::Timestamp, i32)> = Vec::new();
    for agent in agents {
        let jobs = agent.jobs();
        for job in jobs.as_array().into_iter().flatten() {
            let at = |field: &str| job[field].as_str().and_then(|t| t.parse().ok());
            let accepted = at("acceptedAt").unwrap_or_else(|| panic!("acceptedAt in {job}"));
            edges.push((accepted, 1));
            edges.push((at("finishedAt").unwrap_or(jiff::Timestamp::MAX), -1));
        }
    }
    edges.sort();
    let (mut now, mut most) = (0, 0);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

/// Issue 35 on two replicas sharing one NATS store: an operator added on
/// one is known on the other; revoked on one, its token and a dashboard
/// session made on the other are refused on both within a second; and the
/// audit log read from the other replica tells the whole story.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_revoked_on_one_replica_is_refused_on_both_within_a_second() {
    let (_nats, first, second) = two_replicas(&["ops-1"]);
    let out = first.cli(&["operators", "add", "otto", "--role", "operator"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let http = reqwest::Client::new();
    let by_token = |cp: &ControlPlane| {
        http.get(format!("{}/api/v1/devices", cp.api))
            .bearer_auth(&token)
            .send()
    };
    eventually(
        Duration::from_secs(10),
        "the operator known on the second replica",
        || async { (by_token(&second).await.ok()?.status() == 200).then_some(()) },
    )
    .await;
    let (cookie, _) = second.dashboard_session(&token).await;
    let by_session = |cp: &ControlPlane| {
        http.get(format!("{}/api/v1/devices", cp.api))
            .header("cookie", &cookie)
            .send()
    };
    for cp in [&first, &second] {
        assert_eq!(by_token(cp).await.expect("get").status(), 200);
        assert_eq!(by_session(cp).await.expect("get").status(), 200);
    }

    let out = first.cli(&["operators", "revoke", "otto"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let revoked = std::time::Instant::now();
    let mut refused = [None; 4];
    // Each round is four requests, which pace it: no sleep between rounds,
    // so each refusal is timed to the request that first saw it.
    while refused.iter().any(Option::is_none) && revoked.elapsed() < Duration::from_secs(5) {
        for (n, cp) in [&first, &second].into_iter().enumerate() {
            if refused[2 * n].is_none() && by_token(cp).await.expect("get").status() == 401 {
                refused[2 * n] = Some(revoked.elapsed());
            }
            if refused[2 * n + 1].is_none() && by_session(cp).await.expect("get").status() == 401 {
                refused[2 * n + 1] = Some(revoked.elapsed());
            }
        }
    }
    eprintln!("refused after (token, session) on the first, then the second: {refused:?}");
    for (what, after) in [
        "token on the first",
        "session on the first",
        "token on the second",
        "session on the second",
    ]
    .iter()
    .zip(refused)
    {
        let after = after.unwrap_or_else(|| panic!("the revoked {what} still opens after 5 s"));
        assert!(
            after < Duration::from_secs(1),
            "the revoked {what} opened for {after:?}"
        );
    }

    // The story, read from the replica that did not revoke.
    let out = second.cli(&["audit", "-o", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let entries: Vec<Value> = serde_json::from_slice(&out.stdout).expect("json");
    let find = |verb: &str, outcome: &str| {
        entries
            .iter()
            .find(|e| e["verb"] == verb && e["outcome"] == outcome)
            .unwrap_or_else(|| panic!("no {verb} {outcome} in {entries:?}"))
    };
    let added = find("add", "applied");
    let revoke = find("revoke", "applied");
    assert_eq!(revoke["who"], "operator/admin");
    assert_eq!(revoke["name"], "otto");
    assert_eq!(
        added["replica"], revoke["replica"],
        "both written by the first"
    );
    let refusals: Vec<&Value> = entries
        .iter()
        .filter(|e| e["outcome"] == "refused" && e["status"] == 401)
        .collect();
    let replicas: std::collections::BTreeSet<&str> = refusals
        .iter()
        .filter_map(|e| e["replica"].as_str())
        .collect();
    assert_eq!(replicas.len(), 2, "refused on both replicas: {refusals:?}");
    assert!(
        refusals.iter().any(|e| e["via"] == "dashboard")
            && refusals.iter().any(|e| e["reason"]
                .as_str()
                .is_some_and(|r| r.contains("naming operator otto"))),
        "{refusals:?}"
    );
}
