//! Devices join by themselves (issue 55), over WebSocket: real agents with
//! no token and one enrollment token each make their key, ask to join, and
//! are accepted by an auto-accept token or by an operator, or rejected;
//! only the accepted ones get jobs, and a key once accepted is the
//! device's only way in.

use drover_tests::{AgentProcess, ControlPlane, eventually, toml_string};
use serde_json::Value;
use std::time::Duration;

fn enrollment_token(cp: &ControlPlane, args: &[&str]) -> String {
    let mut all = vec!["enrollment-tokens", "create"];
    all.extend_from_slice(args);
    let out = cp.cli(&all);
    assert!(
        out.status.success(),
        "create {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(token.starts_with("drover-enroll."), "{token}");
    token
}

/// An agent whose only credential is `token`, an enrollment token.
fn enrolling_agent(
    dir: &std::path::Path,
    device: &str,
    cp: &ControlPlane,
    token: &str,
) -> AgentProcess {
    let transport = format!(
        "kind = \"websocket\"\nserver_url = {}\nenrollment_token = {}\nheartbeat_seconds = 1\nbackoff_max_seconds = 1\n",
        toml_string(&cp.agent_url),
        toml_string(token)
    );
    AgentProcess::start_full(
        dir,
        device,
        &transport,
        "",
        "mode = \"simulate\"\nmin_free_mib = 10",
        "",
    )
}

async fn key_of(cp: &ControlPlane, device: &str) -> Option<Value> {
    cp.get("/device-keys")
        .await
        .as_array()
        .into_iter()
        .flatten()
        .find(|k| k["device"] == device)
        .cloned()
}

/// Waits until `device`'s key is pending, and checks it is not let in.
async fn wait_pending(cp: &ControlPlane, device: &str) {
    eventually(
        Duration::from_secs(20),
        "the device to be pending",
        || async { key_of(cp, device).await.filter(|k| k["state"] == "pending") },
    )
    .await;
    assert_eq!(
        cp.get_status(&format!("/devices/{device}")).await,
        404,
        "a pending device is not in the fleet"
    );
    assert!(
        !connected(cp, device).await,
        "a pending device is not let in"
    );
}

async fn connected(cp: &ControlPlane, device: &str) -> bool {
    let page = cp.get(&format!("/devices/{device}")).await;
    page["online"] == true
}

fn cli_ok(cp: &ControlPlane, args: &[&str]) -> String {
    let out = cp.cli(args);
    assert!(
        out.status.success(),
        "drover {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_enroll_and_are_accepted_by_token_or_operator_and_only_they_get_jobs() {
    let cp = ControlPlane::start(&[]);
    let dir = tempfile::tempdir().expect("tmp");
    let auto = enrollment_token(
        &cp,
        &[
            "line-3",
            "--groups",
            "kiosk",
            "--labels",
            "site=ghent",
            "--auto-accept",
        ],
    );
    let manual = enrollment_token(&cp, &["by-hand", "--groups", "kiosk", "--max-uses", "2"]);

    let a = enrolling_agent(&dir.path().join("a"), "en-auto", &cp, &auto);
    let b = enrolling_agent(&dir.path().join("b"), "en-manual", &cp, &manual);
    let c = enrolling_agent(&dir.path().join("c"), "en-rejected", &cp, &manual);

    // The auto-accept token: in the fleet at once, with its groups and labels.
    cp.wait_for_agents(&["en-auto"]).await;
    let device = cp.get("/devices/en-auto").await;
    assert_eq!(device["groups"], serde_json::json!(["kiosk"]), "{device}");
    assert_eq!(device["labels"]["site"], "ghent", "{device}");
    let key = key_of(&cp, "en-auto").await.expect("a's key");
    assert_eq!(key["state"], "accepted");
    assert_eq!(key["decidedBy"], "token/line-3");
    assert_eq!(
        key["publicKey"].as_str(),
        a.status()["publicKey"].as_str(),
        "the key the control plane holds is the agent's own"
    );

    // The other token: both wait, unconnected, listed as pending.
    for device in ["en-manual", "en-rejected"] {
        wait_pending(&cp, device).await;
    }
    let pending = cli_ok(&cp, &["devices", "pending"]);
    assert!(
        pending.contains("en-manual") && pending.contains("en-rejected"),
        "{pending}"
    );
    assert!(!pending.contains("en-auto"), "{pending}");
    // Pending on the control plane before the agent logs its answer.
    if drover_tests::within(Duration::from_secs(10), || async {
        b.logged("waiting for an operator").then_some(())
    })
    .await
    .is_none()
    {
        panic!("the device was not told to wait: {}", b.log());
    }

    // The operator accepts one and rejects the other.
    cli_ok(&cp, &["devices", "accept", "en-manual"]);
    cli_ok(&cp, &["devices", "reject", "en-rejected"]);
    cp.wait_for_agents(&["en-manual"]).await;
    let device = cp.get("/devices/en-manual").await;
    assert_eq!(
        device["groups"],
        serde_json::json!(["kiosk"]),
        "the token's groups: {device}"
    );
    eventually(
        Duration::from_secs(20),
        "the rejected agent to be told",
        || async {
            c.logged("an operator rejected this device's key")
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        key_of(&cp, "en-rejected").await.expect("key")["state"],
        "rejected"
    );

    // A run for the group reaches the two accepted devices and no other.
    cp.apply_upgrade_run("en-run", "kiosk", 600).await;
    let run = cp
        .wait_run_finished("en-run", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}");
    let mut targets: Vec<String> = cp
        .targets("en-run")
        .await
        .iter()
        .map(|t| t["device"].as_str().unwrap_or("").to_owned())
        .collect();
    targets.sort();
    assert_eq!(targets, ["en-auto", "en-manual"]);

    // Deleting the rejected device's key lets the id ask anew, and the
    // agent does: its token has enrolled its two devices, so it is refused.
    cli_ok(&cp, &["delete", "device", "en-rejected"]);
    eventually(
        Duration::from_secs(20),
        "the used-up token to refuse it",
        || async {
            c.logged("has enrolled as many devices as it may")
                .then_some(())
        },
    )
    .await;
    assert!(key_of(&cp, "en-rejected").await.is_none());

    // The audit log has the operator's decisions and the tokens.
    let audit = cli_ok(&cp, &["audit", "-o", "json"]);
    for verb in ["\"accept\"", "\"reject\"", "\"create\""] {
        assert!(audit.contains(verb), "{verb} in {audit}");
    }
    drop((a, b, c));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accepted_key_is_the_only_way_in_and_rejecting_it_cuts_the_device_off() {
    let cp = ControlPlane::start(&[]);
    let dir = tempfile::tempdir().expect("tmp");
    let auto = enrollment_token(&cp, &["auto", "--groups", "kiosk", "--auto-accept"]);
    let a = enrolling_agent(&dir.path().join("a"), "en-key", &cp, &auto);
    cp.wait_for_agents(&["en-key"]).await;

    // What the control plane's data directory can make (the device's
    // derived token) no longer opens the device's session once it has a
    // key; the positive control is a device without one.
    cp.apply_device("en-token", &["kiosk"], serde_json::json!({}))
        .await;
    let derived = cp.device_token("en-key");
    let refused = drover_tests::agent_ws(&cp, "en-key", &derived).await;
    assert!(
        refused.is_err(),
        "a derived token opened a keyed device's session"
    );
    let token = cp.device_token("en-token");
    let let_in = drover_tests::agent_ws(&cp, "en-token", &token).await;
    assert!(
        let_in.is_ok(),
        "the token of a device without a key: {:?}",
        let_in.err()
    );

    // Another key for the same id: a conflict shown to the operator, never
    // a takeover.
    let thief = enrolling_agent(&dir.path().join("thief"), "en-key", &cp, &auto);
    eventually(
        Duration::from_secs(20),
        "the conflict to be noted",
        || async {
            key_of(&cp, "en-key")
                .await
                .filter(|k| !k["conflict"].is_null())
        },
    )
    .await;
    // The control plane notes the conflict before it answers the thief,
    // which logs the answer after: wait for that line, do not race it.
    if drover_tests::within(Duration::from_secs(10), || async {
        thief.logged("enrolled with another key").then_some(())
    })
    .await
    .is_none()
    {
        panic!("the thief was not told: {}", thief.log());
    }
    drop(thief);
    assert!(
        connected(&cp, "en-key").await,
        "the device itself stays connected"
    );

    // Rejecting the accepted key ends its session within seconds, and it
    // is not let in again.
    cli_ok(&cp, &["devices", "reject", "en-key"]);
    eventually(Duration::from_secs(10), "the session to end", || async {
        (!connected(&cp, "en-key").await).then_some(())
    })
    .await;
    // It tries again (its backoff is 1 s) and is refused, twice, while it
    // stays out.
    let refusals = || {
        std::fs::read_to_string(a.dir.join("agent.log"))
            .unwrap_or_default()
            .matches("an operator rejected this device's key")
            .count()
    };
    eventually(
        Duration::from_secs(20),
        "two refusals after the rejection",
        || async { (refusals() >= 2).then_some(()) },
    )
    .await;
    assert!(
        !connected(&cp, "en-key").await,
        "a rejected key came back in"
    );
    assert!(
        a.logged("an operator rejected this device's key"),
        "{}",
        a.log()
    );
}

/// A device registered by hand with a token moves to its own key
/// (`enroll_key = true`): it enrolls the key with its token, is accepted at
/// once and keeps its groups; from then on its token (and so anything the
/// control plane's data directory can make) no longer opens its session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_device_moves_to_its_own_key_and_its_token_stops_working() {
    let cp = ControlPlane::start(&[]);
    let dir = tempfile::tempdir().expect("tmp");
    cp.apply_device("en-moved", &["kiosk"], serde_json::json!({"site": "ghent"}))
        .await;
    let token = cp.device_token("en-moved");
    // Before: the token opens the session (the positive control).
    let before = drover_tests::agent_ws(&cp, "en-moved", &token).await;
    assert!(before.is_ok(), "{:?}", before.err());
    drop(before);
    let transport = format!(
        "kind = \"websocket\"\nserver_url = {}\ntoken = {}\nenroll_key = true\nheartbeat_seconds = 1\nbackoff_max_seconds = 1\n",
        toml_string(&cp.agent_url),
        toml_string(&token)
    );
    let agent = AgentProcess::start_full(
        &dir.path().join("moved"),
        "en-moved",
        &transport,
        "",
        "mode = \"simulate\"\nmin_free_mib = 10",
        "",
    );
    let key = eventually(
        Duration::from_secs(20),
        "the key to be accepted",
        || async {
            key_of(&cp, "en-moved")
                .await
                .filter(|k| k["state"] == "accepted")
        },
    )
    .await;
    assert_eq!(key["decidedBy"], "device-token");
    assert_eq!(key["existingDevice"], true);
    assert_eq!(
        key["publicKey"].as_str(),
        agent.status()["publicKey"].as_str()
    );
    eventually(
        Duration::from_secs(20),
        "the device online by its key",
        || async { connected(&cp, "en-moved").await.then_some(()) },
    )
    .await;
    let device = cp.get("/devices/en-moved").await;
    assert_eq!(device["groups"], serde_json::json!(["kiosk"]), "{device}");
    assert_eq!(device["labels"]["site"], "ghent", "{device}");
    let after = drover_tests::agent_ws(&cp, "en-moved", &token).await;
    assert!(
        after.is_err(),
        "the token still opens a moved device's session"
    );
    // Its jobs reach it over the key's session.
    cp.apply_upgrade_run("moved-run", "kiosk", 600).await;
    let run = cp
        .wait_run_finished("moved-run", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}");
}

/// Pre-authorization: an operator accepts a device's key (read from the
/// device) before it asks; its agent is let in by the key at once, without
/// enrolling (its token's uses stay 0), with the groups and labels given.
/// Another key for the id is then a conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preauthorized_key_is_let_in_without_enrolling() {
    let cp = ControlPlane::start(&[]);
    let dir = tempfile::tempdir().expect("tmp");
    let manual = enrollment_token(&cp, &["spare", "--max-uses", "5"]);
    let agent_dir = dir.path().join("pre");
    // The key the agent will find in its state directory, as the device made it.
    let key = agent_core::identity::DeviceKey::load_or_create(&agent_dir.join("state"))
        .expect("key")
        .public_key_hex();
    let out = cli_ok(
        &cp,
        &[
            "devices",
            "preauthorize",
            "en-pre",
            "--public-key",
            &key,
            "--groups",
            "kiosk",
            "--labels",
            "site=ghent",
        ],
    );
    assert!(out.contains("pre-authorized"), "{out}");
    let other = "ab".repeat(32);
    let refused = cp.cli(&["devices", "preauthorize", "en-pre", "--public-key", &other]);
    assert!(
        !refused.status.success(),
        "another key for a pre-authorized id"
    );
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("has another key"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let _agent = enrolling_agent(&agent_dir, "en-pre", &cp, &manual);
    cp.wait_for_agents(&["en-pre"]).await;
    let device = cp.get("/devices/en-pre").await;
    assert_eq!(device["groups"], serde_json::json!(["kiosk"]), "{device}");
    assert_eq!(device["labels"]["site"], "ghent", "{device}");
    let key = key_of(&cp, "en-pre").await.expect("key");
    assert_eq!(key["state"], "accepted");
    assert_eq!(key["decidedBy"], "operator/admin");
    let tokens = cp.get("/enrollment-tokens").await;
    assert_eq!(tokens[0]["uses"], 0, "the agent did not enroll: {tokens}");
}

/// The brokers a joining fleet runs beside its control plane.
enum Broker {
    None,
    Mqtt(drover_tests::Mosquitto),
    Nats(drover_tests::NatsServer, String),
}

/// A control plane and what devices join it over, set up once for devices
/// that join by themselves: nothing for WebSocket, mosquitto with its
/// dynamic security plugin, nats-server trusting Drover's operator.
struct Joining {
    cp: ControlPlane,
    broker: Broker,
}

impl Joining {
    fn over(transport: &str) -> Self {
        match transport {
            "websocket" => Self {
                cp: ControlPlane::start(&[]),
                broker: Broker::None,
            },
            "mqtt" => {
                let (broker, cp) = drover_tests::mqtt_joining_fleet("cp-secret");
                Self {
                    cp,
                    broker: Broker::Mqtt(broker),
                }
            }
            "nats" => {
                let (nats, cp, enroll_jwt) = drover_tests::nats_joining_fleet();
                Self {
                    cp,
                    broker: Broker::Nats(nats, enroll_jwt),
                }
            }
            other => panic!("no joining fleet over {other}"),
        }
    }

    /// An agent whose only credential is `token`, an enrollment token (and
    /// over NATS the fleet's enrollment user's JWT).
    fn agent(&self, dir: &std::path::Path, device: &str, token: &str) -> AgentProcess {
        let transport = match &self.broker {
            Broker::None => {
                return enrolling_agent(dir, device, &self.cp, token);
            }
            Broker::Mqtt(broker) => format!(
                "kind = \"mqtt\"\nurl = {}\nenrollment_token = {}\n",
                toml_string(&broker.url()),
                toml_string(token)
            ),
            Broker::Nats(nats, enroll_jwt) => format!(
                "kind = \"nats\"\nurl = {}\nenrollment_token = {}\nenrollment_jwt = {}\n",
                toml_string(&nats.url()),
                toml_string(token),
                toml_string(enroll_jwt)
            ),
        };
        AgentProcess::start_full(
            dir,
            device,
            &format!("{transport}heartbeat_seconds = 1\nbackoff_max_seconds = 1\n"),
            "",
            "mode = \"simulate\"\nmin_free_mib = 10",
            "",
        )
    }

    /// Where agents connect: the agents' port or the broker.
    fn agents_url(&self) -> String {
        match &self.broker {
            Broker::None => self.cp.agent_url.clone(),
            Broker::Mqtt(broker) => broker.url(),
            Broker::Nats(nats, _) => nats.url(),
        }
    }

    /// An agent from the one file `drover enrollment-tokens create
    /// --agent-config` writes for token NAME (`args` its flags), as a
    /// device from the image has it; only the test's places (state
    /// directory, socket) and quicker timings are added.
    fn agent_from_file(&self, dir: &std::path::Path, device: &str, args: &[&str]) -> AgentProcess {
        let url = self.agents_url();
        let mut all = vec!["enrollment-tokens", "create"];
        all.extend_from_slice(args);
        all.extend([
            "--agent-config",
            &url,
            "--device-id",
            device,
            "--mode",
            "simulate",
        ]);
        let made = cli_ok(&self.cp, &all);
        assert!(
            made.contains("enrollment_token = \"drover-enroll."),
            "{made}"
        );
        if let Broker::Nats(_, jwt) = &self.broker {
            // The enrollment user's JWT came from the control plane.
            assert!(made.contains("enrollment_jwt = \"ey"), "{made}");
            assert!(!made.contains(jwt.as_str()), "each is signed anew");
        }
        std::fs::create_dir_all(dir).expect("agent dir");
        let config = dir.join("agent.toml");
        std::fs::write(
            &config,
            format!(
                "state_dir = {}\nstatus_socket = {}\n{}\n[assessment]\nevery_minutes = 0\n",
                toml_string(&dir.join("state").display().to_string()),
                toml_string(&dir.join("status.sock").display().to_string()),
                made.replace(
                    "[transport]\n",
                    "[transport]\nheartbeat_seconds = 1\nbackoff_max_seconds = 1\n"
                )
                .replace(
                    "mode = \"simulate\"",
                    "mode = \"simulate\"\nmin_free_mib = 10"
                ),
            ),
        )
        .expect("config");
        AgentProcess::start_written(dir, &config)
    }

    /// What the agent logs each time it is told no after its key was
    /// rejected.
    fn told_no(&self) -> &'static str {
        match self.broker {
            Broker::None => "an operator rejected this device's key",
            Broker::Mqtt(_) => "asked to join over MQTT",
            Broker::Nats(..) => "asked to join over NATS; not let in yet",
        }
    }

    /// What shows that the broker itself cut `device` (agent `agent`) off.
    fn cut_off_at_the_broker(&self, device: &str, agent: &AgentProcess) -> bool {
        match &self.broker {
            Broker::None => true,
            Broker::Mqtt(broker) => broker
                .log()
                .contains(&format!("deleteClient | username={device}")),
            Broker::Nats(..) => agent.logged("refused this device's JWT"),
        }
    }
}

/// Whether the broker lets `device` in with `password` (MQTT), or with
/// user and password or, when `jwt` is given, that JWT signed for by the
/// agent's own key (NATS). None over WebSocket (no broker).
async fn broker_opens(
    fleet: &Joining,
    agent: &AgentProcess,
    device: &str,
    password: &str,
    jwt: Option<String>,
) -> Option<bool> {
    match &fleet.broker {
        Broker::None => None,
        Broker::Mqtt(broker) => {
            let mut options = rumqttc::MqttOptions::new(device, "127.0.0.1", broker.port);
            options.set_credentials(device, password);
            let (_client, mut events) = rumqttc::AsyncClient::new(options, 4);
            let answer = tokio::time::timeout(Duration::from_secs(5), async {
                loop {
                    match events.poll().await {
                        Ok(rumqttc::Event::Incoming(rumqttc::Incoming::ConnAck(_))) => return true,
                        Ok(_) => {}
                        Err(_) => return false,
                    }
                }
            })
            .await;
            Some(answer.unwrap_or(false))
        }
        Broker::Nats(nats, _) => {
            let options = match jwt {
                Some(jwt) => {
                    let key = std::sync::Arc::new(
                        agent_core::identity::DeviceKey::load_or_create(&agent.dir.join("state"))
                            .expect("the agent's key"),
                    );
                    async_nats::ConnectOptions::new().jwt(jwt, move |nonce| {
                        let signature = drover_model::enroll::Signer::sign(key.as_ref(), &nonce);
                        async move { Ok(signature) }
                    })
                }
                None => async_nats::ConnectOptions::with_user_and_password(
                    device.into(),
                    password.into(),
                ),
            };
            Some(
                options
                    .max_reconnects(Some(1))
                    .connect(nats.url())
                    .await
                    .is_ok(),
            )
        }
    }
}

/// What a copy of the control plane's data directory can make (the
/// device's token and the broker password derived from it) opens no
/// joined device's session at its broker; the device's own key does.
async fn the_data_directory_opens_nothing(fleet: &Joining, agent: &AgentProcess, device: &str) {
    let id = drover_model::DeviceId::new(device).expect("id");
    let token = fleet.cp.device_token(device);
    let derived = drover_model::credentials::broker_password(&token, &id);
    for password in [&derived, &token] {
        assert_ne!(
            broker_opens(fleet, agent, device, password, None).await,
            Some(true),
            "what the data directory makes opened {device}'s session"
        );
    }
    let key = agent_core::identity::DeviceKey::load_or_create(&agent.dir.join("state"))
        .expect("the agent's key");
    let own = drover_model::enroll::key_broker_password(&key, &id);
    let jwt = std::fs::read_to_string(agent.dir.join("state/nats.jwt")).ok();
    assert_ne!(
        broker_opens(fleet, agent, device, &own, jwt).await,
        Some(false),
        "the device's own key did not open its session"
    );
}

/// How many times `agent` logged `what`.
fn times(agent: &AgentProcess, what: &str) -> usize {
    std::fs::read_to_string(agent.dir.join("agent.log"))
        .unwrap_or_default()
        .matches(what)
        .count()
}

/// Waits until `agent` has logged `what` twice more than `before`.
async fn twice_more(agent: &AgentProcess, what: &str, before: usize, waiting_for: &str) {
    eventually(Duration::from_secs(20), waiting_for, || async {
        (times(agent, what) >= before + 2).then_some(())
    })
    .await;
}

/// Devices join over each transport with nothing set up per device (the
/// auto-accepted one with only the file `--agent-config` made): an
/// auto-accept token or an operator accepts them (over MQTT the control
/// plane then hands the broker the device's login, over NATS it signs the
/// device a JWT of its own), a rejected one stays out, a run reaches the
/// accepted ones, and rejecting an accepted key cuts the device off (at the
/// broker, over MQTT and NATS) within seconds and keeps it out while the
/// other stays.
async fn devices_join_and_a_rejected_key_is_cut_off(transport: &str) {
    let fleet = Joining::over(transport);
    let cp = &fleet.cp;
    let dir = tempfile::tempdir().expect("tmp");
    // The auto-accepted device has only the file its token's
    // `--agent-config` made.
    let a = fleet.agent_from_file(
        &dir.path().join("a"),
        "j-auto",
        &[
            "line",
            "--groups",
            "kiosk",
            "--labels",
            "site=ghent",
            "--auto-accept",
        ],
    );
    let manual = enrollment_token(cp, &["hand", "--groups", "kiosk"]);
    let b = fleet.agent(&dir.path().join("b"), "j-manual", &manual);
    let c = fleet.agent(&dir.path().join("c"), "j-rejected", &manual);

    cp.wait_for_agents(&["j-auto"]).await;
    let device = cp.get("/devices/j-auto").await;
    assert_eq!(device["groups"], serde_json::json!(["kiosk"]), "{device}");
    assert_eq!(device["labels"]["site"], "ghent", "{device}");
    let key = key_of(cp, "j-auto").await.expect("a's key");
    assert_eq!(key["state"], "accepted");
    assert_eq!(key["decidedBy"], "token/line");
    assert_eq!(key["publicKey"].as_str(), a.status()["publicKey"].as_str());

    for device in ["j-manual", "j-rejected"] {
        wait_pending(cp, device).await;
    }
    cli_ok(cp, &["devices", "accept", "j-manual"]);
    let before = times(&c, fleet.told_no());
    cli_ok(cp, &["devices", "reject", "j-rejected"]);
    // The accepted one is let in at its next try (its backoff is 1 s).
    cp.wait_for_agents(&["j-manual"]).await;
    twice_more(
        &c,
        fleet.told_no(),
        before,
        "the rejected device to be told no twice",
    )
    .await;
    assert!(
        !connected(cp, "j-rejected").await,
        "a rejected device was let in"
    );

    cp.apply_upgrade_run("j-run", "kiosk", 600).await;
    let run = cp.wait_run_finished("j-run", Duration::from_secs(60)).await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}");
    assert_eq!(cp.targets("j-run").await.len(), 2);

    let before = times(&a, fleet.told_no());
    cli_ok(cp, &["devices", "reject", "j-auto"]);
    eventually(Duration::from_secs(10), "the connection to end", || async {
        (!connected(cp, "j-auto").await).then_some(())
    })
    .await;
    twice_more(
        &a,
        fleet.told_no(),
        before,
        "the cut-off device to be told no twice",
    )
    .await;
    assert!(
        !connected(cp, "j-auto").await,
        "a rejected key came back in"
    );
    assert!(
        fleet.cut_off_at_the_broker("j-auto", &a),
        "not cut off by the broker: {}",
        a.log()
    );
    assert!(connected(cp, "j-manual").await, "the other device stays in");
    the_data_directory_opens_nothing(&fleet, &b, "j-manual").await;
}

/// One test per transport, as the scenarios run.
macro_rules! joining_over {
    ($($transport:ident),+) => {
        mod devices_join_and_a_rejected_key_is_cut_off {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $transport() {
                    let over = stringify!($transport).trim_start_matches("over_");
                    super::devices_join_and_a_rejected_key_is_cut_off(over).await
                }
            )+
        }
    };
}

joining_over!(over_websocket, over_mqtt, over_nats);

/// Sends mosquitto's dynamic security plugin `command` as the control
/// plane's broker user would, and waits for its answer.
async fn dynsec_command(broker: &drover_tests::Mosquitto, password: &str, command: Vec<u8>) {
    let mut options = rumqttc::MqttOptions::new("test-dynsec", "127.0.0.1", broker.port);
    options.set_credentials(drover_tests::CP_BROKER_USER, password);
    options.set_max_packet_size(256 * 1024, 256 * 1024);
    let (client, mut events) = rumqttc::AsyncClient::new(options, 8);
    let response = transport_mqtt::dynsec::response_topic();
    client
        .subscribe(&response, rumqttc::QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    let answered = tokio::time::timeout(Duration::from_secs(10), async {
        let mut sent = false;
        loop {
            match events.poll().await.expect("the broker") {
                rumqttc::Event::Incoming(rumqttc::Incoming::SubAck(_)) if !sent => {
                    client
                        .publish(
                            transport_mqtt::dynsec::CONTROL_TOPIC,
                            rumqttc::QoS::AtLeastOnce,
                            false,
                            command.clone(),
                        )
                        .await
                        .expect("publish");
                    sent = true;
                }
                rumqttc::Event::Incoming(rumqttc::Incoming::Publish(p)) if p.topic == response => {
                    return transport_mqtt::dynsec::failures(&p.payload);
                }
                _ => {}
            }
        }
    })
    .await
    .expect("the plugin answered");
    assert!(answered.is_empty(), "{answered:?}");
}

/// A login at the MQTT broker that no accepted key backs (a removal the
/// broker never got: it was down, or the control plane stopped first) is
/// found and removed when the control plane starts; the accepted device's
/// login stays, and its agent comes back in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_login_that_outlived_its_key_is_removed_when_the_control_plane_starts() {
    let mut fleet = Joining::over("mqtt");
    let dir = tempfile::tempdir().expect("tmp");
    let kept = fleet.agent_from_file(
        &dir.path().join("kept"),
        "m-kept",
        &["kept", "--groups", "kiosk", "--auto-accept"],
    );
    fleet.cp.wait_for_agents(&["m-kept"]).await;
    fleet.cp.kill9();
    let Broker::Mqtt(broker) = &fleet.broker else {
        unreachable!("an MQTT fleet")
    };
    // What a lost removal leaves: a device's login, made as the control
    // plane makes them, with no accepted key behind it.
    let ghost = drover_model::DeviceId::new("m-ghost").expect("id");
    dynsec_command(
        broker,
        "cp-secret",
        transport_mqtt::dynsec::command(
            &ghost,
            &transport_mqtt::admissions::Command::Create("ghost-password".into()),
        ),
    )
    .await;
    assert_eq!(
        broker_opens(&fleet, &kept, "m-ghost", "ghost-password", None).await,
        Some(true),
        "the stale login opens the broker before the control plane starts"
    );
    fleet.cp.restart();
    eventually(
        Duration::from_secs(30),
        "the stale login to be removed",
        || async {
            (broker_opens(&fleet, &kept, "m-ghost", "ghost-password", None).await == Some(false))
                .then_some(())
        },
    )
    .await;
    let Broker::Mqtt(broker) = &fleet.broker else {
        unreachable!("an MQTT fleet")
    };
    assert!(
        broker.log().contains("deleteClient | username=m-ghost"),
        "{}",
        broker.log()
    );
    fleet.cp.wait_for_agents(&["m-kept"]).await;
    assert!(
        !broker.log().contains("deleteClient | username=m-kept"),
        "an accepted device's login was removed"
    );
}

/// Whether the enrollment user `drover.enroll.007` can log in.
async fn enroll_user_opens(fleet: &Joining, agent: &AgentProcess) -> Option<bool> {
    let password = transport_mqtt::ENROLL_PASSWORD;
    broker_opens(fleet, agent, "drover.enroll.007", password, None).await
}

/// A broker set up before there were many enrollment users (one,
/// `drover.enroll`): an agent asking as a numbered one is refused and asks
/// as the one, and joins; the control plane, when it starts, gives the
/// broker the numbered users.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_with_one_enrollment_user_takes_requests_and_is_given_the_others() {
    let mut fleet = Joining::over("mqtt");
    let Broker::Mqtt(broker) = &fleet.broker else {
        unreachable!("an MQTT fleet")
    };
    // After the control plane's first look at the broker's logins (the
    // next is minutes away), as if the broker had never had them.
    eventually(
        Duration::from_secs(30),
        "the control plane to list the logins",
        || async { broker.log().contains("listClients").then_some(()) },
    )
    .await;
    let numbered: Vec<Value> = (0..transport_mqtt::ENROLL_LOGINS)
        .map(|n| serde_json::json!({"command": "deleteClient", "username": transport_mqtt::enroll_user(n)}))
        .collect();
    dynsec_command(
        broker,
        "cp-secret",
        serde_json::to_vec(&serde_json::json!({ "commands": numbered })).expect("json"),
    )
    .await;
    let dir = tempfile::tempdir().expect("tmp");
    let agent = fleet.agent_from_file(
        &dir.path().join("old-broker"),
        "m-old-broker",
        &["old", "--groups", "kiosk", "--auto-accept"],
    );
    assert_eq!(
        enroll_user_opens(&fleet, &agent).await,
        Some(false),
        "the numbered users are gone"
    );
    fleet.cp.wait_for_agents(&["m-old-broker"]).await;
    fleet.cp.restart();
    eventually(
        Duration::from_secs(30),
        "the numbered enrollment users to be made",
        || async { (enroll_user_opens(&fleet, &agent).await == Some(true)).then_some(()) },
    )
    .await;
}

/// A revocation the NATS servers missed (none was up when the key was
/// rejected, or the device deleted) is pushed again when the control plane
/// starts: before, the restarted server still takes the rejected and the
/// deleted device's JWTs; after, it refuses both, and the accepted device
/// stays in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_the_nats_servers_missed_is_pushed_again_when_the_control_plane_starts() {
    let mut fleet = Joining::over("nats");
    let dir = tempfile::tempdir().expect("tmp");
    let flags = ["line", "--groups", "kiosk", "--auto-accept"];
    let kept = fleet.agent_from_file(&dir.path().join("kept"), "n-kept", &flags);
    let mut flags_gone = flags;
    flags_gone[0] = "line-2";
    let mut gone = fleet.agent_from_file(&dir.path().join("gone"), "n-gone", &flags_gone);
    flags_gone[0] = "line-3";
    let mut deleted = fleet.agent_from_file(&dir.path().join("deleted"), "n-deleted", &flags_gone);
    fleet
        .cp
        .wait_for_agents(&["n-kept", "n-gone", "n-deleted"])
        .await;
    let jwt = std::fs::read_to_string(gone.dir.join("state/nats.jwt")).expect("n-gone's JWT");
    let deleted_jwt =
        std::fs::read_to_string(deleted.dir.join("state/nats.jwt")).expect("n-deleted's JWT");
    gone.kill9();
    deleted.kill9();

    let Broker::Nats(nats, _) = &mut fleet.broker else {
        unreachable!("a NATS fleet")
    };
    nats.kill9();
    cli_ok(&fleet.cp, &["devices", "reject", "n-gone"]);
    cli_ok(&fleet.cp, &["delete", "device", "n-deleted"]);
    eventually(
        Duration::from_secs(60),
        "the control plane to fail to revoke with no server up",
        || async {
            fleet
                .cp
                .log()
                .contains("cannot revoke the device's JWT on the NATS servers")
                .then_some(())
        },
    )
    .await;
    let Broker::Nats(nats, _) = &mut fleet.broker else {
        unreachable!("a NATS fleet")
    };
    nats.restart();
    assert_eq!(
        broker_opens(&fleet, &gone, "n-gone", "", Some(jwt.clone())).await,
        Some(true),
        "the restarted server missed the revocation: the rejected JWT opens it"
    );
    assert_eq!(
        broker_opens(&fleet, &deleted, "n-deleted", "", Some(deleted_jwt.clone())).await,
        Some(true),
        "the restarted server missed the revocation: the deleted device's JWT opens it"
    );

    fleet.cp.restart();
    eventually(
        Duration::from_secs(30),
        "the rejected device's JWT to be refused",
        || async {
            (broker_opens(&fleet, &gone, "n-gone", "", Some(jwt.clone())).await == Some(false))
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        broker_opens(&fleet, &deleted, "n-deleted", "", Some(deleted_jwt)).await,
        Some(false),
        "the deleted device's JWT is refused too"
    );
    assert!(
        fleet
            .cp
            .log()
            .contains("a revoked key was missing from the NATS servers' revocations"),
        "{}",
        fleet.cp.log()
    );
    fleet.cp.wait_for_agents(&["n-kept"]).await;
    drop(kept);
}
