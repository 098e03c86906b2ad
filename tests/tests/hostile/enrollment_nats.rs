//! What a device, or something posing as one, can send to the enrollment
//! subject over NATS (issue 55), logged in as the enrollment user (a bearer
//! JWT every device's config carries). Each row is a hand-made request and
//! the answer it must get; the positive controls are a good request (pending)
//! and a publish the enrollment user may make (it arrives).

use super::Ran;
use agent_core::identity::DeviceKey;
use drover_model::DeviceId;
use drover_model::enroll::{Inventory, Signer, key_broker_password};
use futures_util::StreamExt;
use std::time::Duration;
use transport_nats::{EnrollReply, EnrollRequest, enroll_inbox_prefix, enroll_subject};

fn key(dir: &std::path::Path, name: &str) -> DeviceKey {
    DeviceKey::load_or_create(&dir.join(name)).expect("a key")
}

/// A well-formed request for `device` by `key`.
fn request(device: &str, key: &DeviceKey, token: &str) -> EnrollRequest {
    let id = DeviceId::new(device).expect("id");
    EnrollRequest {
        public_key: key.public_key(),
        token: token.to_owned(),
        inventory: Inventory {
            hostname: Some(device.to_owned()),
            ..Inventory::default()
        },
        signature: key_broker_password(key, &id),
    }
}

/// A connection as the enrollment user, its inbox under `inbox_of`'s
/// enrollment inbox.
async fn enroller(url: &str, enroll_jwt: &str, inbox_of: &str) -> async_nats::Client {
    let id = DeviceId::new(inbox_of).expect("id");
    async_nats::ConnectOptions::new()
        .jwt(enroll_jwt.to_owned(), |_| async { Ok(Vec::new()) })
        .custom_inbox_prefix(enroll_inbox_prefix(&id))
        .connect(url)
        .await
        .expect("the enrollment user is let in")
}

/// Sends `payload` as `device`'s request; the answer, or None when none
/// came within 3 s.
async fn ask(client: &async_nats::Client, device: &str, payload: Vec<u8>) -> Option<EnrollReply> {
    let id = DeviceId::new(device).expect("id");
    let answer = tokio::time::timeout(
        Duration::from_secs(3),
        client.request(enroll_subject(&id), payload.into()),
    )
    .await
    .ok()?
    .ok()?;
    serde_json::from_slice(&answer.payload).ok()
}

fn refused_with(answer: Option<EnrollReply>, fragment: &str, what: &str) {
    match answer {
        Some(EnrollReply::Refused { message }) if message.contains(fragment) => {}
        other => panic!("{what}: expected a refusal with {fragment:?}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enrollment_over_nats_table() {
    let mut ran = Ran::new("enrollment over NATS");
    let (nats, cp, enroll_jwt) = drover_tests::nats_joining_fleet();
    let dir = tempfile::tempdir().expect("tmp");
    let out = cp.cli(&["enrollment-tokens", "create", "manual"]);
    assert!(out.status.success());
    let manual = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let (good, other) = (key(dir.path(), "good"), key(dir.path(), "other"));
    let json = |r: &EnrollRequest| serde_json::to_vec(r).expect("json");

    // The positive control: a good request waits for an operator.
    ran.row();
    let client = enroller(&nats.url(), &enroll_jwt, "nx-1").await;
    let answer = ask(&client, "nx-1", json(&request("nx-1", &good, &manual))).await;
    assert!(
        matches!(answer, Some(EnrollReply::Pending { .. })),
        "{answer:?}"
    );

    let client2 = enroller(&nats.url(), &enroll_jwt, "nx-2").await;
    let mut forged = request("nx-2", &other, &manual);
    forged.signature = key_broker_password(&good, &DeviceId::new("nx-2").expect("id"));
    let mut bad_key = request("nx-2", &other, &manual);
    bad_key.public_key = "ZZ".into();
    let mut big = request("nx-2", &other, &manual);
    big.inventory.hostname = Some("h".repeat(8192));
    let rows: Vec<(&str, &async_nats::Client, &str, Vec<u8>, &str)> = vec![
        (
            "an unknown token",
            &client2,
            "nx-2",
            json(&request("nx-2", &other, "drover-enroll.manual.guess")),
            "not one this control plane issued",
        ),
        (
            "a signature by another key",
            &client2,
            "nx-2",
            json(&forged),
            "broker password is not the key's signature",
        ),
        (
            "another key for a pending id",
            &client,
            "nx-1",
            json(&request("nx-1", &other, &manual)),
            "enrolled with another key",
        ),
        (
            "a public key that is not one",
            &client2,
            "nx-2",
            json(&bad_key),
            "64 lowercase hex",
        ),
        (
            "an oversize request",
            &client2,
            "nx-2",
            json(&big),
            "at most 4096",
        ),
        (
            "a request that is not JSON",
            &client2,
            "nx-2",
            b"{{{".to_vec(),
            "unreadable enrollment request",
        ),
    ];
    for (what, client, device, payload, fragment) in rows {
        ran.row();
        refused_with(ask(client, device, payload).await, fragment, what);
    }

    // A request whose answer would go into another device's inbox is not
    // answered (a reply subject is the sender's to choose).
    ran.row();
    assert_eq!(
        ask(&client, "nx-3", json(&request("nx-3", &other, &manual))).await,
        None,
        "answered into another device's enrollment inbox"
    );

    // The enrollment user may publish nowhere else: a hello on a device's
    // subject never reaches the control plane's side; a request to join
    // (the positive control) does.
    ran.row();
    let authority =
        transport_nats::authority::Authority::load_or_create(&cp.dir.path().join("nats-authority"))
            .expect("keys");
    let login = authority
        .control_plane_login("test-observer")
        .expect("login");
    let observer = async_nats::ConnectOptions::new()
        .jwt(login.jwt.clone(), move |nonce| {
            let signature = login.signer.sign(&nonce);
            async move { Ok(signature) }
        })
        .connect(nats.url())
        .await
        .expect("an observer");
    let mut seen = observer.subscribe("drover.>").await.expect("subscribe");
    observer.flush().await.expect("flush");
    let hello = transport_nats::hello_subject(&DeviceId::new("nx-1").expect("id"));
    let _ = client.publish(hello, "posing".into()).await;
    let _ = client
        .publish(
            enroll_subject(&DeviceId::new("nx-9").expect("id")),
            "allowed".into(),
        )
        .await;
    let _ = client.flush().await;
    let mut subjects = Vec::new();
    while let Ok(Some(message)) = tokio::time::timeout(Duration::from_secs(2), seen.next()).await {
        subjects.push(message.subject.to_string());
    }
    assert!(
        subjects.iter().any(|s| s == "drover.enroll.nx-9"),
        "the allowed publish did not arrive: {subjects:?}"
    );
    assert!(
        !subjects.iter().any(|s| s.starts_with("drover.hello")),
        "the enrollment user published a hello: {subjects:?}"
    );
    ran.record();
}
