//! What a device, or something posing as one, can publish on the
//! enrollment topics over MQTT (issue 55), logged in as the enrollment user
//! whose password is no secret. MQTT carries no answer: each row is a
//! hand-made request and what it must leave behind (nothing recorded); the
//! positive control is a good request, recorded as pending.

use super::Ran;
use agent_core::identity::DeviceKey;
use drover_model::DeviceId;
use drover_model::enroll::{Inventory, Signer, key_broker_password};
use drover_tests::{ControlPlane, eventually};
use std::time::Duration;
use transport_mqtt::{ENROLL_PASSWORD, ENROLL_USER, EnrollPublish, Topics};

fn request(device: &str, key: &DeviceKey, token: &str) -> EnrollPublish {
    EnrollPublish {
        public_key: key.public_key(),
        token: token.to_owned(),
        inventory: Inventory::default(),
        password: key_broker_password(key, &DeviceId::new(device).expect("id")),
    }
}

/// Publishes each `(topic, payload)` as the enrollment user, QoS 1, and
/// waits for the broker's PUBACKs (or its refusal).
async fn publish(port: u16, messages: Vec<(String, Vec<u8>)>) {
    let mut options = rumqttc::MqttOptions::new(ENROLL_USER, "127.0.0.1", port);
    options.set_credentials(ENROLL_USER, ENROLL_PASSWORD);
    options.set_max_packet_size(64 * 1024, 64 * 1024);
    let (client, mut events) = rumqttc::AsyncClient::new(options, 16);
    let count = messages.len();
    for (topic, payload) in messages {
        client
            .publish(topic, rumqttc::QoS::AtLeastOnce, false, payload)
            .await
            .expect("queued");
    }
    let mut acked = 0;
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while acked < count {
            match events.poll().await {
                Ok(rumqttc::Event::Incoming(rumqttc::Incoming::PubAck(_))) => acked += 1,
                Ok(_) => {}
                Err(_) => break,
            }
        }
    })
    .await;
}

async fn key_state(cp: &ControlPlane, device: &str) -> Option<String> {
    cp.get("/device-keys")
        .await
        .as_array()
        .into_iter()
        .flatten()
        .find(|k| k["device"] == device)
        .and_then(|k| k["state"].as_str().map(str::to_owned))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enrollment_over_mqtt_table() {
    let mut ran = Ran::new("enrollment over MQTT");
    let (broker, cp) = drover_tests::mqtt_joining_fleet("cp-secret");
    let dir = tempfile::tempdir().expect("tmp");
    let out = cp.cli(&["enrollment-tokens", "create", "manual"]);
    assert!(out.status.success());
    let manual = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let good = DeviceKey::load_or_create(&dir.path().join("good")).expect("key");
    let other = DeviceKey::load_or_create(&dir.path().join("other")).expect("key");
    let topics = Topics::new(transport_mqtt::DEFAULT_PREFIX);
    let topic = |d: &str| topics.enroll(&DeviceId::new(d).expect("id"));
    let json = |r: &EnrollPublish| serde_json::to_vec(r).expect("json");

    let mut forged = request("mx-2", &other, &manual);
    forged.password = key_broker_password(&good, &DeviceId::new("mx-2").expect("id"));
    let mut big = request("mx-4", &other, &manual);
    big.inventory.hostname = Some("h".repeat(8192));
    let rows: Vec<(&str, &str, Vec<u8>)> = vec![
        (
            "an unknown token",
            "mx-1",
            json(&request("mx-1", &other, "drover-enroll.manual.guess")),
        ),
        ("a password signed by another key", "mx-2", json(&forged)),
        ("a request that is not JSON", "mx-3", b"{{{".to_vec()),
        ("an oversize request", "mx-4", json(&big)),
    ];
    let mut messages: Vec<(String, Vec<u8>)> = rows
        .iter()
        .map(|(_, device, payload)| (topic(device), payload.clone()))
        .collect();
    // The positive control last: once it is recorded, the ones before it
    // were judged.
    messages.push((topic("mx-ok"), json(&request("mx-ok", &good, &manual))));
    // And a hello on a device's topic, which the enrollment user may not
    // publish (the broker drops it).
    messages.push((
        topics.hello(&DeviceId::new("mx-ok").expect("id")),
        b"{}".to_vec(),
    ));
    // A control-plane user watches what the broker lets through.
    let mut options =
        rumqttc::MqttOptions::new(drover_tests::WATCH_BROKER_USER, "127.0.0.1", broker.port);
    options.set_credentials(drover_tests::WATCH_BROKER_USER, "cp-secret");
    options.set_max_packet_size(64 * 1024, 64 * 1024);
    let (watcher, mut watched) = rumqttc::AsyncClient::new(options, 16);
    watcher
        .subscribe("drover/v1/#", rumqttc::QoS::AtMostOnce)
        .await
        .expect("subscribe");
    let (subscribed_tx, subscribed) = tokio::sync::oneshot::channel::<()>();
    let seen = tokio::spawn(async move {
        let mut subscribed_tx = Some(subscribed_tx);
        let mut topics = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(8), async {
            loop {
                match watched.poll().await {
                    Ok(rumqttc::Event::Incoming(rumqttc::Incoming::SubAck(_))) => {
                        if let Some(tx) = subscribed_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(rumqttc::Event::Incoming(rumqttc::Incoming::Publish(p))) => {
                        topics.push(p.topic.clone());
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        })
        .await;
        topics
    });
    subscribed.await.expect("the watcher subscribed");
    publish(broker.port, messages).await;
    ran.row();
    eventually(
        Duration::from_secs(20),
        "the good request to be pending",
        || async { (key_state(&cp, "mx-ok").await.as_deref() == Some("pending")).then_some(()) },
    )
    .await;
    for (what, device, _) in rows {
        ran.row();
        assert_eq!(key_state(&cp, device).await, None, "{what}: recorded");
    }
    ran.row();
    let topics = seen.await.expect("watcher");
    assert!(
        topics.iter().any(|t| t == "drover/v1/enroll/mx-ok"),
        "the allowed publish did not arrive: {topics:?}"
    );
    assert!(
        !topics.iter().any(|t| t.ends_with("/hello")),
        "the enrollment user published a hello: {topics:?}"
    );
    ran.record();
}
