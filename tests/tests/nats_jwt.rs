//! NATS decentralized authentication against a real nats-server (issue
//! 55): the server is configured once with Drover's operator; the control
//! plane and each device come in by a user JWT the account's signing key
//! signed, each device confined to its own subjects; an account JWT with a
//! device's revocation, pushed at run time, cuts that device off at once
//! and keeps it out, while the others stay.

use drover_model::DeviceId;
use drover_tests::{NatsServer, eventually};
use nkeys::KeyPair;
use std::collections::BTreeMap;
use std::time::Duration;
use transport_nats::authority::{Authority, CLAIMS_UPDATE};
use transport_nats::jwt::{Permissions, creds};

async fn connect(nats: &NatsServer, creds: &str) -> Result<async_nats::Client, String> {
    async_nats::ConnectOptions::with_credentials(creds)
        .map_err(|e| e.to_string())?
        .max_reconnects(Some(1))
        .connect(nats.url())
        .await
        .map_err(|e| e.to_string())
}

fn user_creds(
    authority: &Authority,
    name: &str,
    permissions: Option<&Permissions>,
) -> (KeyPair, String) {
    let user = KeyPair::new_user();
    let jwt = authority
        .user_jwt(&user.public_key(), name, permissions)
        .expect("jwt");
    let seed = user.seed().expect("seed");
    (user, creds(&jwt, &seed))
}

fn device_creds(authority: &Authority, device: &str) -> (KeyPair, String) {
    let id = DeviceId::new(device).expect("id");
    let (publish, subscribe) = transport_nats::server::device_permissions(
        &id,
        transport_nats::server::DirectStatusPuts::Denied,
    );
    user_creds(authority, device, Some(&Permissions { publish, subscribe }))
}

/// Whether a hello `device` publishes on `subject` reaches the control plane.
async fn reaches(
    client: &async_nats::Client,
    hellos: &mut async_nats::Subscriber,
    subject: String,
    body: &'static str,
) -> bool {
    use futures_util::StreamExt;
    let _ = client.publish(subject, body.into()).await;
    let _ = client.flush().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while let Ok(Some(message)) = tokio::time::timeout_at(deadline, hellos.next()).await {
        if message.payload.as_ref() == body.as_bytes() {
            return true;
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_trusts_one_operator_and_each_device_by_its_jwt_until_revoked() {
    let keys = tempfile::tempdir().expect("tmp");
    let resolver = tempfile::tempdir().expect("tmp");
    let authority = Authority::load_or_create(keys.path()).expect("keys");
    let nats = NatsServer::start(&authority.server_config(resolver.path()).expect("config"));

    // The control plane may do anything, JetStream included.
    let (_, cp_creds) = user_creds(&authority, "drover-control-plane", None);
    let cp = connect(&nats, &cp_creds).await.expect("the control plane");
    transport_nats::server::ensure_buckets(cp.clone(), Default::default())
        .await
        .expect("JetStream in the account");
    let mut hellos = cp.subscribe("drover.>").await.expect("subscribe");

    let (pi1_key, pi1_creds) = device_creds(&authority, "pi-1");
    let (_, pi2_creds) = device_creds(&authority, "pi-2");
    let pi1 = connect(&nats, &pi1_creds).await.expect("pi-1 by its JWT");
    let pi2 = connect(&nats, &pi2_creds).await.expect("pi-2 by its JWT");
    let hello = |device: &str| transport_nats::hello_subject(&DeviceId::new(device).expect("id"));
    assert!(reaches(&pi1, &mut hellos, hello("pi-1"), "pi-1 own").await);
    assert!(
        !reaches(&pi1, &mut hellos, hello("pi-2"), "pi-1 as pi-2").await,
        "a device published on another device's subject"
    );

    // A JWT the account did not sign opens nothing.
    let stranger = KeyPair::new_account();
    let user = KeyPair::new_user();
    let forged = transport_nats::jwt::encode(
        &stranger,
        &user.public_key(),
        "pi-1",
        transport_nats::jwt::user_claims(&authority.account(), None, false),
        jiff::Timestamp::now().as_second(),
    )
    .expect("jwt");
    assert!(
        connect(&nats, &creds(&forged, &user.seed().expect("seed")))
            .await
            .is_err(),
        "a JWT signed by another key was let in"
    );

    // Revoking pi-1: the account's new JWT, pushed from the system account.
    let system = connect(&nats, &authority.system_user_creds().expect("creds"))
        .await
        .expect("the system account");
    let revocations = BTreeMap::from([(pi1_key.public_key(), jiff::Timestamp::now().as_second())]);
    let answer = system
        .request(
            CLAIMS_UPDATE,
            authority.account_jwt(&revocations).expect("jwt").into(),
        )
        .await
        .expect("the server answers");
    let answer = String::from_utf8_lossy(&answer.payload).into_owned();
    assert!(answer.contains("jwt updated"), "{answer}");
    eventually(Duration::from_secs(5), "pi-1 to be cut off", || async {
        (pi1.connection_state() != async_nats::connection::State::Connected).then_some(())
    })
    .await;
    assert!(
        connect(&nats, &pi1_creds).await.is_err(),
        "a revoked device came back in"
    );
    assert!(
        reaches(&pi2, &mut hellos, hello("pi-2"), "pi-2 still").await,
        "the revocation cut off another device"
    );
}
