//! What a device, or something posing as one, can send at the two doors
//! enrollment opens (issue 55): the enrollment door and the key door of the
//! agents' port. Each row is a hand-made conversation and the answer it
//! must get; the positive controls are a good request (pending, then
//! accepted) and a good proof (a session that takes a hello).

use super::{Ran, hello};
use agent_core::identity::DeviceKey;
use drover_model::DeviceId;
use drover_model::enroll::{Signer, enroll_message, session_message};
use drover_model::signing::hex;
use drover_tests::ControlPlane;
use drover_tests::script::Ws;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

/// Opens `path` on the agents' port with `authorization`, if any.
async fn open(cp: &ControlPlane, path: &str, authorization: Option<&str>) -> Result<Ws, String> {
    drover_tests::agent_ws_at(cp, path, authorization).await
}

async fn next(ws: &mut Ws) -> Value {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
            Ok(Some(Ok(Message::Text(text)))) => {
                return serde_json::from_str(text.as_str()).unwrap_or(Value::Null);
            }
            Ok(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => continue,
            _ => return Value::Null,
        }
    }
}

fn key(dir: &std::path::Path, name: &str) -> DeviceKey {
    DeviceKey::load_or_create(&dir.join(name)).expect("a key")
}

/// A well-formed enroll frame for `device` by `key` over `challenge`.
fn enroll_frame(device: &str, key: &DeviceKey, token: &str, challenge: &str) -> Value {
    let id = DeviceId::new(device).expect("id");
    let public = key.public_key();
    json!({"type": "enroll", "deviceId": device, "publicKey": public, "token": token,
           "inventory": {"hostname": device},
           "signature": hex(&key.sign(&enroll_message(&id, &public, challenge)))})
}

/// One enrollment conversation: the challenge, then what `frame` makes of
/// it; the answer.
async fn ask(cp: &ControlPlane, door: &str, frame: impl FnOnce(&str) -> Message) -> Value {
    ask_from(cp, None, door, frame).await
}

/// [`ask`] from the loopback address `source`, as another host.
async fn ask_from(
    cp: &ControlPlane,
    source: Option<&str>,
    door: &str,
    frame: impl FnOnce(&str) -> Message,
) -> Value {
    let source = source.map(|s| s.parse().expect("an address"));
    let path = format!("/agent/v1/enroll/{door}");
    let mut ws = drover_tests::agent_ws_from(cp, source, &path, None)
        .await
        .expect("the enrollment door opens");
    let challenge = next(&mut ws).await;
    assert_eq!(challenge["type"], "challenge", "{challenge}");
    let challenge = challenge["challenge"].as_str().unwrap_or("").to_owned();
    ws.send(frame(&challenge)).await.expect("send");
    next(&mut ws).await
}

fn refused_with(answer: &Value, fragment: &str, what: &str) {
    assert_eq!(answer["type"], "refused", "{what}: {answer}");
    assert!(
        answer["message"].as_str().unwrap_or("").contains(fragment),
        "{what}: expected {fragment:?} in {answer}"
    );
}

fn token(cp: &ControlPlane, args: &[&str]) -> String {
    let mut all = vec!["enrollment-tokens", "create"];
    all.extend_from_slice(args);
    let out = cp.cli(&all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enrollment_doors_table() {
    let mut ran = Ran::new("enrollment doors");
    let cp = ControlPlane::start(&[]);
    let dir = tempfile::tempdir().expect("tmp");
    let manual = token(&cp, &["manual"]);
    let once = token(&cp, &["once", "--max-uses", "1", "--auto-accept"]);
    let revoked = token(&cp, &["gone"]);
    assert!(
        cp.cli(&["enrollment-tokens", "revoke", "gone"])
            .status
            .success()
    );
    let (good, other) = (key(dir.path(), "good"), key(dir.path(), "other"));

    // The positive control: a good request waits for an operator.
    ran.row();
    let answer = ask(&cp, "en-1", |c| {
        Message::text(enroll_frame("en-1", &good, &manual, c).to_string())
    })
    .await;
    assert_eq!(answer["type"], "enrollment", "{answer}");
    assert_eq!(answer["state"], "pending", "{answer}");

    type Frame<'a> = Box<dyn FnOnce(&str) -> Message + 'a>;
    let rows: Vec<(&str, &str, Frame<'_>, &str)> = vec![
        (
            "an unknown token",
            "en-2",
            Box::new(|c: &str| {
                let frame = enroll_frame("en-2", &other, "drover-enroll.manual.guess", c);
                Message::text(frame.to_string())
            }),
            "not one this control plane issued",
        ),
        (
            "a revoked token",
            "en-2",
            Box::new(|c: &str| {
                Message::text(enroll_frame("en-2", &other, &revoked, c).to_string())
            }),
            "was revoked",
        ),
        (
            "a request signed over an earlier challenge (a replay)",
            "en-2",
            Box::new(|_: &str| {
                let frame = enroll_frame("en-2", &other, &manual, &"00".repeat(32));
                Message::text(frame.to_string())
            }),
            "signature is not the key's over this challenge",
        ),
        (
            "another key for a pending id",
            "en-1",
            Box::new(|c: &str| Message::text(enroll_frame("en-1", &other, &manual, c).to_string())),
            "enrolled with another key",
        ),
        (
            "a request naming another device than its door",
            "en-3",
            Box::new(|c: &str| Message::text(enroll_frame("en-4", &other, &manual, c).to_string())),
            "names device en-4",
        ),
        (
            "an oversize inventory",
            "en-3",
            Box::new(|c: &str| {
                let mut frame = enroll_frame("en-3", &other, &manual, c);
                frame["inventory"]["hostname"] = json!("h".repeat(8192));
                Message::text(frame.to_string())
            }),
            "at most 4096",
        ),
        (
            "a public key that is not one",
            "en-3",
            Box::new(|c: &str| {
                let mut frame = enroll_frame("en-3", &other, &manual, c);
                frame["publicKey"] = json!("ZZ");
                Message::text(frame.to_string())
            }),
            "64 lowercase hex",
        ),
        (
            "a frame that is not JSON",
            "en-3",
            Box::new(|_: &str| Message::text("{{{")),
            "not a proof or enroll frame",
        ),
        (
            "a proof at the enrollment door",
            "en-3",
            Box::new(|_: &str| {
                Message::text(json!({"type": "proof", "signature": "00"}).to_string())
            }),
            "a proof at the enrollment door",
        ),
        (
            "a binary frame",
            "en-3",
            Box::new(|_: &str| Message::binary(vec![0u8; 16])),
            "not a text frame",
        ),
    ];
    for (what, door, frame, fragment) in rows {
        ran.row();
        let answer = ask(&cp, door, frame).await;
        refused_with(&answer, fragment, what);
    }

    // A token's last use goes to the first device; the next is refused.
    ran.row();
    let answer = ask(&cp, "en-5", |c| {
        Message::text(enroll_frame("en-5", &other, &once, c).to_string())
    })
    .await;
    assert_eq!(answer["state"], "accepted", "{answer}");
    let third = key(dir.path(), "third");
    let answer = ask(&cp, "en-6", |c| {
        Message::text(enroll_frame("en-6", &third, &once, c).to_string())
    })
    .await;
    refused_with(&answer, "as many devices as it may", "a used-up token");

    // The key door. A key that is not the device's accepted one: 401.
    ran.row();
    let wrong = format!("Drover-Key {}", good.public_key());
    assert!(open(&cp, "/agent/v1/ws/en-5", Some(&wrong)).await.is_err());
    // The accepted key, with a bad proof: refused and closed.
    ran.row();
    let right = format!("Drover-Key {}", other.public_key());
    let mut ws = open(&cp, "/agent/v1/ws/en-5", Some(&right))
        .await
        .expect("the key door");
    let challenge = next(&mut ws).await;
    assert_eq!(challenge["type"], "challenge", "{challenge}");
    let id = DeviceId::new("en-5").expect("id");
    let forged = hex(&good.sign(&session_message(
        &id,
        challenge["challenge"].as_str().unwrap_or(""),
    )));
    ws.send(Message::text(
        json!({"type": "proof", "signature": forged}).to_string(),
    ))
    .await
    .expect("send");
    refused_with(
        &next(&mut ws).await,
        "not this device's key's",
        "a proof by another key",
    );
    // The positive control: the right proof, then a hello, is a session.
    ran.row();
    let mut ws = open(&cp, "/agent/v1/ws/en-5", Some(&right))
        .await
        .expect("the key door");
    let challenge = next(&mut ws).await;
    let proof = hex(&other.sign(&session_message(
        &id,
        challenge["challenge"].as_str().unwrap_or(""),
    )));
    ws.send(Message::text(
        json!({"type": "proof", "signature": proof}).to_string(),
    ))
    .await
    .expect("send");
    ws.send(hello("en-5")).await.expect("hello");
    drover_tests::eventually(Duration::from_secs(10), "the keyed session", || async {
        (cp.get("/devices/en-5").await["online"] == true).then_some(())
    })
    .await;
    ran.record();
}

/// A good enroll frame for `device` by `key` with `token`, from `from`.
async fn enroll_from(
    cp: &ControlPlane,
    device: &str,
    key: &DeviceKey,
    token: &str,
    from: &str,
) -> Value {
    ask_from(cp, Some(from), device, |c| {
        Message::text(enroll_frame(device, key, token, c).to_string())
    })
    .await
}

/// Floods at the enrollment door, on a control plane that takes three
/// requests a minute per address and two new devices a minute per token:
/// each limit refuses with the time to wait, records nothing, and leaves
/// other addresses, other tokens and devices already pending alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enrollment_floods_table() {
    let mut ran = Ran::new("enrollment floods");
    let cp = ControlPlane::start(&[
        "--enrollments-per-address-per-minute",
        "3",
        "--enrollments-per-token-per-minute",
        "2",
    ]);
    let dir = tempfile::tempdir().expect("tmp");
    let (image, other) = (token(&cp, &["image"]), token(&cp, &["other"]));
    let keys: Vec<DeviceKey> = (1..=3)
        .map(|i| key(dir.path(), &format!("fl-{i}")))
        .collect();
    let enroll = |device, key, token, from| enroll_from(&cp, device, key, token, from);
    let pending = |answer: Value, what: &str| {
        assert_eq!(answer["type"], "enrollment", "{what}: {answer}");
        assert_eq!(answer["state"], "pending", "{what}: {answer}");
    };

    // The positive control: three requests from one address are taken.
    ran.row();
    for _ in 0..3 {
        pending(
            enroll("fl-1", &keys[0], &image, "127.0.0.2").await,
            "within the address's share",
        );
    }
    // The fourth from that address within the minute is refused.
    ran.row();
    refused_with(
        &enroll("fl-1", &keys[0], &image, "127.0.0.2").await,
        "too many enrollment requests from 127.0.0.2; try again in",
        "a flood from one address",
    );
    // Another address has its own share: a second new device on the token.
    ran.row();
    pending(
        enroll("fl-2", &keys[1], &image, "127.0.0.3").await,
        "another address",
    );
    // A third new device on the token within the minute is refused, and
    // nothing is recorded for it.
    ran.row();
    refused_with(
        &enroll("fl-3", &keys[2], &image, "127.0.0.4").await,
        "too many new devices with the enrollment token image",
        "a flood of new devices with one token",
    );
    let listed = cp.get("/device-keys").await;
    let devices: Vec<&str> = listed
        .as_array()
        .map(|keys| keys.iter().filter_map(|k| k["device"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(devices, ["fl-1", "fl-2"], "{listed}");
    // A device already pending asks again with the spent token: not a new
    // device, so not refused; another token has its own share.
    ran.row();
    pending(
        enroll("fl-2", &keys[1], &image, "127.0.0.5").await,
        "a pending device asking again",
    );
    pending(
        enroll("fl-3", &keys[2], &other, "127.0.0.5").await,
        "another token",
    );
    ran.record();
}
