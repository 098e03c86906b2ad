//! What only MQTT has, against a real mosquitto with per-device passwords
//! and ACLs from `drover mqtt-config` (the scenarios every transport shares
//! are in scenarios.rs, among them mosquitto SIGKILLed mid-run and an agent
//! SIGKILLed mid-job): a device can neither read another's intent nor
//! publish another's status; a malformed intent is refused and the agent
//! keeps working; an intent the broker lost is published again; TLS.

use drover_contract::link::{AgentLinks, Inbound, LinkState};
use drover_tests::{AgentProcess, ControlPlane, Mosquitto, eventually};
use serde_json::json;
use std::path::PathBuf;
use std::time::Duration;

const CP_PASSWORD: &str = "cp-mqtt-secret";
/// The tests' own clients log in as a second control-plane user: under the
/// control plane's, the broker would give them its client id.
const WATCH_USER: &str = drover_tests::WATCH_BROKER_USER;

/// A mosquitto whose passwords and ACLs come from `drover mqtt-config`, and
/// a control plane serving over it.
fn fleet(devices: &[&str]) -> (Mosquitto, ControlPlane) {
    drover_tests::mqtt_fleet(devices, CP_PASSWORD)
}

fn agent(cp: &ControlPlane, broker: &Mosquitto, device: &str, extra: &str) -> AgentProcess {
    let token = cp.device_token(device);
    AgentProcess::start_mqtt(
        &cp.dir.path().join(device),
        device,
        &broker.url(),
        &token,
        extra,
    )
}

fn held(cp: &ControlPlane, device: &str) -> (PathBuf, PathBuf, String) {
    let dir = cp.dir.path().join(device);
    std::fs::create_dir_all(&dir).expect("dir");
    let hold = dir.join("hold");
    let reached = dir.join("reached");
    std::fs::write(&hold, "").expect("hold");
    let testing = drover_tests::hold_config(&hold, &reached);
    (hold, reached, testing)
}

async fn wait_for_file(path: &std::path::Path, what: &str) {
    eventually(Duration::from_secs(60), what, || async {
        path.exists().then_some(())
    })
    .await
}

/// A raw MQTT client logged in as `user`.
async fn client(
    broker: &Mosquitto,
    id: &str,
    user: &str,
    password: &str,
) -> (rumqttc::AsyncClient, rumqttc::EventLoop) {
    let mut options = rumqttc::MqttOptions::new(id, "127.0.0.1", broker.port);
    options.set_credentials(user, password);
    rumqttc::AsyncClient::new(options, 64)
}

/// Device A, logged in with its own credentials, can publish on its own
/// topics (the positive control: a watcher with the control plane's user
/// sees it) but not on B's, and reads none of B's messages. Each "nothing
/// arrived" is judged at a barrier: a message sent after the forbidden one,
/// on a topic the reader may read, so anything forwarded would have come
/// first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_can_neither_read_anothers_intent_nor_publish_anothers_status() {
    let (broker, cp) = fleet(&["acl-a", "acl-b"]);
    cp.apply_device("acl-b", &["fleet"], json!({})).await;
    let (hold, reached, testing) = held(&cp, "acl-b");
    let _b = agent(&cp, &broker, "acl-b", &testing);
    cp.wait_for_agents(&["acl-b"]).await;
    // A watcher with the control plane's credentials sees every device's
    // statuses and heartbeats.
    let (watcher, watcher_events) = client(&broker, "acl-watch", WATCH_USER, CP_PASSWORD).await;
    watcher
        .subscribe("drover/v1/devices/+/status/+", rumqttc::QoS::AtLeastOnce)
        .await
        .expect("subscribe call");
    watcher
        .subscribe(
            "drover/v1/devices/acl-a/heartbeat",
            rumqttc::QoS::AtLeastOnce,
        )
        .await
        .expect("subscribe call");
    let mut watched = Watched::new(watcher_events);
    watched.until_subscribed(2).await;
    // Device A logs in with its own credentials and tries B's topics.
    let (a, a_events) = client(&broker, "acl-a", "acl-a", &cp.broker_password("acl-a")).await;
    let mut a_seen = Watched::new(a_events);
    a.subscribe(
        "drover/v1/devices/acl-b/intents/+",
        rumqttc::QoS::AtLeastOnce,
    )
    .await
    .expect("subscribe call");
    a.subscribe("drover/v1/#", rumqttc::QoS::AtLeastOnce)
        .await
        .expect("subscribe call");
    // Its own intents, which it may read (where the barrier below arrives).
    a.subscribe(
        "drover/v1/devices/acl-a/intents/+",
        rumqttc::QoS::AtLeastOnce,
    )
    .await
    .expect("subscribe call");
    a_seen.until_subscribed(3).await;
    // The positive control: A publishes on its own topic, and it arrives.
    a.publish(
        "drover/v1/devices/acl-a/heartbeat",
        rumqttc::QoS::AtLeastOnce,
        false,
        "own-1",
    )
    .await
    .expect("publish call");
    let before = watched.until_payload("own-1").await;
    assert!(
        before.iter().all(|(topic, _)| !topic.contains("acl-b")),
        "{before:?}"
    );

    cp.apply_upgrade_run("acl-run", "fleet", 600).await;
    wait_for_file(&reached, "B's job to run").await;
    let uid = cp.get("/taskruns/acl-run").await["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_owned();
    // A reads nothing of B's: B's retained intent was published before this
    // barrier on A's own intent topic (which A may read).
    watcher
        .publish(
            "drover/v1/devices/acl-a/intents/00000000-0000-4000-8000-00000000ba11",
            rumqttc::QoS::AtLeastOnce,
            false,
            "barrier",
        )
        .await
        .expect("publish call");
    let read = a_seen.until_payload("barrier").await;
    let of_b: Vec<&String> = read
        .iter()
        .map(|(topic, _)| topic)
        .filter(|topic| topic.contains("acl-b"))
        .collect();
    assert!(of_b.is_empty(), "A received B's messages: {of_b:?}");

    // A publishes a status on B's topic: mosquitto refuses it and drops A's
    // connection (the denial, seen), and no subscriber gets it.
    let forged = json!({
        "jobId": uid, "deviceId": "acl-b", "attempt": 1, "kind": "systemUpgradeV1",
        "state": "Failed", "steps": [], "error": "forged by A", "output": null,
        "acceptedAt": "2026-11-30T00:00:00Z", "startedAt": null, "finishedAt": null,
        "bootId": "x", "completionHeartbeatAt": null, "seq": 999
    });
    a.publish(
        format!("drover/v1/devices/acl-b/status/{uid}"),
        rumqttc::QoS::AtLeastOnce,
        false,
        forged.to_string(),
    )
    .await
    .expect("publish call");
    a_seen.until_closed().await;
    // The barrier: published after the broker handled (and refused) A's
    // message, on a topic the watcher reads; anything forwarded comes first.
    watcher
        .publish(
            "drover/v1/devices/acl-a/heartbeat",
            rumqttc::QoS::AtLeastOnce,
            false,
            "after",
        )
        .await
        .expect("publish call");
    let between = watched.until_payload("after").await;
    assert!(
        between
            .iter()
            .all(|(_, payload)| !payload.contains("forged by A")),
        "A's status on B's topic reached the broker's subscribers: {between:?}"
    );
    std::fs::remove_file(&hold).expect("release");
    let run = cp
        .wait_run_finished("acl-run", Duration::from_secs(60))
        .await;
    assert_eq!(
        run["status"]["phase"], "Complete",
        "the forged status never counted: {run}"
    );
    let targets = cp.targets("acl-run").await;
    assert_ne!(targets[0]["status"]["error"], "forged by A");
}

/// A raw client's event loop, driven by a task of its own (so every
/// client's loop moves at once), read until a condition: what it received
/// on the way, as (topic, payload).
struct Watched {
    events: tokio::sync::mpsc::UnboundedReceiver<rumqttc::Event>,
}

impl Watched {
    fn new(mut event_loop: rumqttc::EventLoop) -> Self {
        let (tx, events) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(event) = event_loop.poll().await {
                if tx.send(event).is_err() {
                    return;
                }
            }
        });
        Self { events }
    }

    async fn next(&mut self) -> rumqttc::Event {
        self.next_or_closed()
            .await
            .expect("the MQTT connection ended")
    }

    /// The next event, or None once the connection ended.
    async fn next_or_closed(&mut self) -> Option<rumqttc::Event> {
        tokio::time::timeout(Duration::from_secs(20), self.events.recv())
            .await
            .expect("an MQTT event within 20 s")
    }

    /// Reads until the broker ends the connection.
    async fn until_closed(&mut self) {
        while self.next_or_closed().await.is_some() {}
    }

    /// Waits for the broker's SUBACKs of `count` subscriptions.
    async fn until_subscribed(&mut self, mut count: usize) {
        while count > 0 {
            if let rumqttc::Event::Incoming(rumqttc::Incoming::SubAck(_)) = self.next().await {
                count -= 1;
            }
        }
    }

    /// Reads until a message with `payload` arrives; returns what came before.
    async fn until_payload(&mut self, payload: &str) -> Vec<(String, String)> {
        let mut before = Vec::new();
        loop {
            if let rumqttc::Event::Incoming(rumqttc::Incoming::Publish(p)) = self.next().await {
                let text = String::from_utf8_lossy(&p.payload).into_owned();
                if text == payload {
                    return before;
                }
                before.push((p.topic, text));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_intent_is_refused_and_the_agent_keeps_working() {
    let (broker, cp) = fleet(&["bad-1"]);
    cp.apply_device("bad-1", &["fleet"], json!({})).await;
    let agent = agent(&cp, &broker, "bad-1", "");
    cp.wait_for_agents(&["bad-1"]).await;
    let (admin, mut admin_events) = client(&broker, "admin-1", WATCH_USER, CP_PASSWORD).await;
    let junk_job = "00000000-0000-4000-8000-0000000000c1";
    for payload in [
        json!({"jobId": junk_job, "kind": 7}).to_string(),
        "not json at all".to_owned(),
    ] {
        admin
            .publish(
                format!("drover/v1/devices/bad-1/intents/{junk_job}"),
                rumqttc::QoS::AtLeastOnce,
                false,
                payload,
            )
            .await
            .expect("publish");
    }
    let pump = tokio::spawn(async move {
        for _ in 0..20 {
            if tokio::time::timeout(Duration::from_millis(200), admin_events.poll())
                .await
                .is_err()
            {
                break;
            }
        }
    });
    eventually(
        Duration::from_secs(20),
        "the malformed intent to be refused",
        || async {
            let jobs = agent.jobs();
            jobs.as_array()
                .into_iter()
                .flatten()
                .any(|j| j["jobId"] == junk_job && j["state"] == "Rejected")
                .then_some(())
        },
    )
    .await;
    let _ = pump.await;
    assert!(
        agent.log().contains("unusable intent dropped"),
        "the unreadable one is dropped"
    );
    cp.apply_upgrade_run("bad-run", "fleet", 600).await;
    let run = cp
        .wait_run_finished("bad-run", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}");
}

/// The control plane's store is the truth: an intent the broker lost in a
/// crash (retained, never saved) is published again when the broker comes
/// back without the control plane's session, long before any ack timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intent_the_broker_lost_is_published_again() {
    let (mut broker, cp) = fleet(&["lost-1"]);
    cp.apply_device("lost-1", &["fleet"], json!({})).await;
    let mut agent = agent(&cp, &broker, "lost-1", "");
    cp.wait_for_agents(&["lost-1"]).await;
    agent.kill9();
    cp.apply_upgrade_run("lost-run", "fleet", 600).await;
    eventually(
        Duration::from_secs(20),
        "the intent to be released",
        || async {
            let targets = cp.targets("lost-run").await;
            (targets.first()?["released"] == true).then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    broker.kill9();
    broker.restart();
    agent.restart();
    let run = cp
        .wait_run_finished("lost-run", Duration::from_secs(30))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}\n{}", cp.log());
    assert!(
        cp.log().contains("sending undecided intents again"),
        "{}",
        cp.log()
    );
}

/// TLS with rustls (ring) against mosquitto with a test certificate: the
/// control plane and an agent speak mqtts://, and plain text is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_and_the_control_plane_speak_tls_to_mosquitto() {
    // The broker's files, its key among them, where its user reads them.
    let broker_dir = Mosquitto::prepare();
    let drover_tests::LocalhostCert {
        pem: _,
        cert_path,
        key_path,
    } = drover_tests::localhost_cert(broker_dir.path());
    let dir = ControlPlane::prepare();
    let out = broker_dir.path().join("auth").display().to_string();
    let auth = ControlPlane::drover_in(
        dir.path(),
        &[
            "mqtt-config",
            "--control-plane-password",
            CP_PASSWORD,
            "--out",
            &out,
            "--device",
            "tls-m1",
        ],
    );
    let listener = format!(
        "cafile {}\ncertfile {}\nkeyfile {}",
        cert_path.display(),
        cert_path.display(),
        key_path.display()
    );
    let broker = Mosquitto::start_in(broker_dir, &auth, &listener);
    let url = format!("mqtts://localhost:{}", broker.port);
    let cert_arg = cert_path.display().to_string();
    let cp = ControlPlane::start_in(
        dir,
        &[
            "--mqtt-url",
            &url,
            "--mqtt-password",
            CP_PASSWORD,
            "--mqtt-ca",
            &cert_arg,
        ],
    );
    cp.apply_device("tls-m1", &["fleet"], json!({})).await;
    let token = cp.device_token("tls-m1");
    let _agent = AgentProcess::start_mqtt_with(
        &cp.dir.path().join("tls-m1"),
        "tls-m1",
        &url,
        &token,
        Some(&cert_path),
        "",
    );
    cp.wait_for_agents(&["tls-m1"]).await;
    cp.apply_upgrade_run("tls-mqtt-run", "fleet", 600).await;
    let run = cp
        .wait_run_finished("tls-mqtt-run", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}\n{}", cp.log());
    // A plain MQTT client cannot talk to the TLS listener.
    let (plain, mut events) = client(&broker, "plain-1", "drover-control-plane", CP_PASSWORD).await;
    let connected = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match events.poll().await {
                Ok(rumqttc::Event::Incoming(rumqttc::Incoming::ConnAck(_))) => return true,
                Ok(_) => continue,
                Err(_) => return false,
            }
        }
    })
    .await;
    assert!(
        !matches!(connected, Ok(true)),
        "plain text must not connect"
    );
    drop(plain);
}

/// A broker that stops answering (SIGSTOP: connections held, nothing
/// answered) is noticed through missed keep-alives: the control plane logs
/// it at warn, `/healthz` answers 503 naming the MQTT link, the metrics say
/// the link is down, and once the broker answers again the link is back
/// and a run completes (issue 26).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_stops_answering_is_noticed_and_the_link_recovers() {
    let device = "mq-hang";
    let (broker, cp) =
        drover_tests::mqtt_fleet_with(&[device], CP_PASSWORD, &["--mqtt-keep-alive-seconds", "1"]);
    cp.apply_device(device, &["hang"], json!({})).await;
    let agent = agent(&cp, &broker, device, "");
    cp.wait_for_agents(&[device]).await;
    // The positive control: everything is up before the broker hangs.
    assert_eq!(cp.healthz().await, (200, "ok\n".to_owned()));
    assert!(
        cp.metrics()
            .await
            .contains("drover_link_up{transport=\"mqtt\"} 1"),
        "{}",
        cp.metrics().await
    );
    broker.pause();
    let trouble = eventually(
        Duration::from_secs(30),
        "/healthz to report the link",
        || async {
            let (code, body) = cp.healthz().await;
            (code == 503).then_some(body)
        },
    )
    .await;
    assert!(trouble.starts_with("mqtt: "), "{trouble}");
    assert!(!trouble.contains("websocket"), "{trouble}");
    assert!(
        cp.metrics()
            .await
            .contains("drover_link_up{transport=\"mqtt\"} 0")
    );
    assert!(
        cp.log().contains("WARN") && cp.log().contains("MQTT connection failed; reconnecting"),
        "{}",
        cp.log()
    );
    broker.resume();
    eventually(
        Duration::from_secs(30),
        "/healthz to be ok again",
        || async { (cp.healthz().await.0 == 200).then_some(()) },
    )
    .await;
    cp.apply_upgrade_run("after-hang", "hang", 600).await;
    let run = cp
        .wait_run_finished("after-hang", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}\n{}", cp.log());
    agent.assert_one_job_run_once();
}

/// The link's loop watches itself: stuck for 1.5 keep-alives on anything,
/// here on a delivery core that takes no event, it says so in its health,
/// drops the connection, connects again, and the broker hands over again
/// what was not acknowledged, so nothing is lost once the core takes
/// events again (issue 26).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_stuck_on_its_core_calls_itself_stalled_and_loses_nothing() {
    use transport_mqtt::server::MqttLinks;
    let broker = Mosquitto::start("allow_anonymous true");
    let settings = transport_mqtt::MqttSettings {
        url: broker.url(),
        user: "cp".into(),
        password: String::new(),
        ca_file: None,
        prefix: transport_mqtt::DEFAULT_PREFIX.into(),
        keep_alive: Duration::from_secs(1),
    };
    // Room for one event: the second waits on a core that reads nothing.
    let (events_tx, mut events) = tokio::sync::mpsc::channel(1);
    let (link, event_loop) =
        MqttLinks::new(&settings, "drover-cp-stall", 16, events_tx).expect("link");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(link.clone().run(event_loop, shutdown.clone()));
    eventually(Duration::from_secs(10), "the link to connect", || async {
        (link.health().state == LinkState::Up).then_some(())
    })
    .await;
    // The positive control: a link that moves is up and reports progress.
    assert!(link.health().last_progress.is_some());
    assert_eq!(link.health().stalls, 0);

    let device = client_with_id("mq-stall-dev", &broker).await;
    let topics = transport_mqtt::Topics::new(transport_mqtt::DEFAULT_PREFIX);
    let sent = 5;
    for i in 0..sent {
        let heartbeat = json!({"offline": true, "deviceId": format!("dev-{i}")});
        device
            .publish(
                topics.heartbeat(&drover_model::DeviceId::new(format!("dev-{i}")).expect("id")),
                rumqttc::QoS::AtLeastOnce,
                false,
                heartbeat.to_string(),
            )
            .await
            .expect("publish");
    }
    let health = eventually(
        Duration::from_secs(15),
        "the link to call itself stalled",
        || async {
            let health = link.health();
            (health.stalls > 0).then_some(health)
        },
    )
    .await;
    assert!(
        health
            .last_stall
            .as_ref()
            .is_some_and(|(_, why)| why.contains("delivery core")),
        "{health:?}"
    );
    // The core takes events again: every message arrives (some twice: the
    // broker resends what was not acknowledged), and the link is up.
    let mut gone = std::collections::BTreeSet::new();
    eventually(
        Duration::from_secs(20),
        "every message after the stall",
        || {
            while let Ok(event) = events.try_recv() {
                if let Inbound::Gone { device } = event.inbound {
                    gone.insert(device.to_string());
                }
            }
            let done = gone.len() == sent;
            async move { done.then_some(()) }
        },
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "the link to be up again",
        || async { (link.health().state == LinkState::Up).then_some(()) },
    )
    .await;
    shutdown.cancel();
    let _ = running.await;
}

/// A plain MQTT client with its own id, connected, its event loop driven.
async fn client_with_id(id: &str, broker: &Mosquitto) -> rumqttc::AsyncClient {
    let options = rumqttc::MqttOptions::new(id, "127.0.0.1", broker.port);
    let (client, mut event_loop) = rumqttc::AsyncClient::new(options, 64);
    let (connected_tx, connected) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut connected_tx = Some(connected_tx);
        while let Ok(event) = event_loop.poll().await {
            if let rumqttc::Event::Incoming(rumqttc::Incoming::ConnAck(_)) = event
                && let Some(tx) = connected_tx.take()
            {
                let _ = tx.send(());
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(10), connected)
        .await
        .expect("connected in time")
        .expect("connected");
    client
}

/// `drover mqtt-config` writes files the broker reads as Debian runs it:
/// started as root, mosquitto drops to its own user before it opens the
/// password and ACL files, which mqtt-config gives to the group
/// `mosquitto` (mode 0640). The broker here runs so (its process's user
/// is `mosquitto`), and a device logs in through those files. A group that
/// does not exist is a clear error that writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_reads_what_mqtt_config_wrote_as_its_own_user() {
    use std::os::unix::fs::MetadataExt;
    if !nix::unistd::geteuid().is_root() {
        drover_tests::cannot_run_here(
            "the_broker_reads_what_mqtt_config_wrote_as_its_own_user",
            "mosquitto drops to its own user only when started as root",
        );
        return;
    }
    let mosquitto = nix::unistd::User::from_name("mosquitto")
        .expect("look up mosquitto")
        .expect("the user mosquitto exists");
    let (broker, cp) = fleet(&["perm-1"]);
    assert_eq!(
        drover_tests::effective_uid(broker.pid()),
        mosquitto.uid.as_raw().to_string(),
        "the broker runs as mosquitto"
    );
    for name in ["drover.passwd", "drover.acl"] {
        let meta = std::fs::metadata(broker.dir.path().join("auth").join(name)).expect(name);
        assert_eq!(meta.mode() & 0o777, 0o640, "{name}");
        assert_eq!(meta.gid(), mosquitto.gid.as_raw(), "{name}'s group");
    }
    cp.apply_device("perm-1", &["perm"], json!({})).await;
    let _agent = agent(&cp, &broker, "perm-1", "");
    cp.wait_for_agents(&["perm-1"]).await;

    let out = std::process::Command::new(drover_tests::bin("drover"))
        .arg("--data")
        .arg(cp.dir.path().join("data"))
        .args([
            "mqtt-config",
            "--control-plane-password",
            "x",
            "--device",
            "perm-2",
        ])
        .arg("--out")
        .arg(cp.dir.path().join("elsewhere"))
        .args(["--group", "no-such-group-here"])
        .output()
        .expect("run drover");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("no group \"no-such-group-here\""),
        "{stderr}"
    );
    assert!(!cp.dir.path().join("elsewhere/drover.passwd").exists());
}

/// Whether the broker lets `user` in with `password` (its CONNACK).
async fn logs_in(broker: &Mosquitto, user: &str, password: &str) -> bool {
    let (_client, mut events) = client(broker, user, user, password).await;
    loop {
        match tokio::time::timeout(Duration::from_secs(10), events.poll()).await {
            Ok(Ok(rumqttc::Event::Incoming(rumqttc::Incoming::ConnAck(_)))) => return true,
            Ok(Ok(_)) => continue,
            Ok(Err(_)) => return false,
            Err(_) => panic!("no answer from the broker to {user}'s login"),
        }
    }
}

/// Issue 35, item 4, over MQTT: after `drover token --rotate`, the broker's
/// files made again (with the control plane up, which says which tokens
/// were rotated) refuse the device's old password and take the new one;
/// made while nothing answers, they are said to take every token as never
/// rotated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_devices_old_broker_password_is_refused_once_the_files_are_made_again() {
    let (broker, cp) = fleet(&["mq-rot", "mq-other"]);
    cp.apply_device("mq-rot", &["g"], json!({})).await;
    let old = cp.broker_password("mq-rot");
    assert!(
        logs_in(&broker, "mq-rot", &old).await,
        "the positive control"
    );
    let data = cp.dir.path().join("data");
    let drover = |args: &[&str]| {
        std::process::Command::new(drover_tests::bin("drover"))
            .arg("--data")
            .arg(&data)
            .args(["--server", &cp.api, "--token", &cp.token])
            .args(args)
            .output()
            .expect("drover")
    };
    let rotated = drover(&["token", "mq-rot", "--rotate"]);
    assert!(
        rotated.status.success(),
        "{}",
        String::from_utf8_lossy(&rotated.stderr)
    );
    let token = String::from_utf8_lossy(&rotated.stdout).trim().to_owned();
    let out = broker.dir.path().join("auth").display().to_string();
    let config = [
        "mqtt-config",
        "--control-plane-password",
        CP_PASSWORD,
        "--control-plane-user",
        drover_tests::CP_BROKER_USER,
        "--control-plane-user",
        WATCH_USER,
        "--device",
        "mq-rot",
        "--device",
        "mq-other",
        "--out",
        &out,
    ];
    let made = drover(&config);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    broker.reload();
    let new = drover_model::credentials::broker_password(
        &token,
        &drover_model::DeviceId::new("mq-rot").expect("id"),
    );
    eventually(
        Duration::from_secs(10),
        "the old password refused",
        || async { (!logs_in(&broker, "mq-rot", &old).await).then_some(()) },
    )
    .await;
    assert!(logs_in(&broker, "mq-rot", &new).await, "the new password");
    assert!(
        logs_in(&broker, "mq-other", &cp.broker_password("mq-other")).await,
        "another device is untouched"
    );
    // With nothing answering at the server's address: said so.
    let offline = std::process::Command::new(drover_tests::bin("drover"))
        .arg("--data")
        .arg(&data)
        .args(["--server", "http://127.0.0.1:9", "--token", &cp.token])
        .args(config)
        .output()
        .expect("drover");
    assert!(offline.status.success());
    assert!(
        String::from_utf8_lossy(&offline.stderr).contains("taken as never rotated"),
        "{}",
        String::from_utf8_lossy(&offline.stderr)
    );
}
