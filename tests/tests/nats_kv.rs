//! The control plane's store on JetStream KV (`transport_nats::kv`) against
//! a real `nats-server -js`: compare-and-set through two stores on one
//! bucket, a key created again after its delete, and the change feed.

use drover_contract::kv::{Change, KvError, KvStore, Op};
use drover_tests::{NatsServer, eventually};
use std::time::Duration;
use transport_nats::kv::NatsKv;

async fn open(server: &NatsServer) -> NatsKv {
    let client = async_nats::connect(server.url()).await.expect("connect");
    NatsKv::open(client, 1).await.expect("open the bucket")
}

fn put(key: &str, value: &[u8], expected: u64) -> Op {
    Op::Put {
        key: key.into(),
        value: value.to_vec(),
        expected,
    }
}

async fn commit_one(kv: &NatsKv, op: Op) -> Result<u64, KvError> {
    kv.commit(vec![op])
        .await
        .expect("the commit went out")
        .pop()
        .expect("one result")
}

/// Two replicas race for one key: the loser gets a conflict naming the
/// winner's revision, its mirror holds the winner's value at once (read
/// from the stream's leader), and its change feed announces it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_race_is_a_conflict_and_the_loser_sees_the_winner() {
    let server = NatsServer::start("");
    let a = open(&server).await;
    let b = open(&server).await;
    let mut b_changes = b.changes();

    let won = commit_one(&a, put("runs/r1", b"from a", 0))
        .await
        .expect("a creates");
    match commit_one(&b, put("runs/r1", b"from b", 0)).await {
        Err(KvError::Conflict { found, .. }) => assert_eq!(found, won),
        other => panic!("b must lose the race: {other:?}"),
    }
    let seen = b.get("runs/r1").await.expect("get").expect("b has it");
    assert_eq!(
        (seen.revision, seen.value.as_slice()),
        (won, &b"from a"[..])
    );
    let change: Change = eventually(Duration::from_secs(10), "b's change feed", || {
        let next = b_changes.try_recv().ok();
        async move { next }
    })
    .await;
    assert_eq!((change.key.as_str(), change.revision), ("runs/r1", won));

    // An update on a stale revision loses too; on the right one it wins.
    let updated = commit_one(&a, put("runs/r1", b"a again", won))
        .await
        .expect("a updates");
    assert!(matches!(
        commit_one(&b, put("runs/r1", b"stale", won)).await,
        Err(KvError::Conflict { found, .. }) if found == updated
    ));
    let last = commit_one(&b, put("runs/r1", b"from b", updated))
        .await
        .expect("b updates on the revision it was told");
    eventually(Duration::from_secs(10), "a sees b's update", || async {
        let entry = a.get("runs/r1").await.expect("get")?;
        (entry.revision == last).then_some(())
    })
    .await;
}

/// A deleted key is gone from every mirror and can be created again
/// (`delete taskrun`, then a run of the same name); a key that holds a
/// value cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_key_can_be_created_again() {
    let server = NatsServer::start("");
    let a = open(&server).await;
    let b = open(&server).await;
    let first = commit_one(&a, put("taskruns/r", b"one", 0))
        .await
        .expect("create");
    commit_one(
        &a,
        Op::Delete {
            key: "taskruns/r".into(),
            expected: first,
        },
    )
    .await
    .expect("delete");
    assert!(a.get("taskruns/r").await.expect("get").is_none());
    eventually(Duration::from_secs(10), "b sees the delete", || async {
        b.get("taskruns/r")
            .await
            .expect("get")
            .is_none()
            .then_some(())
    })
    .await;
    let again = commit_one(&b, put("taskruns/r", b"two", 0))
        .await
        .expect("created again after its delete");
    assert!(again > first);
    assert!(matches!(
        commit_one(&a, put("taskruns/r", b"three", 0)).await,
        Err(KvError::Conflict { found, .. }) if found == again
    ));
    // A third store opened now fills its mirror with the live value only.
    let c = open(&server).await;
    let entry = c.get("taskruns/r").await.expect("get").expect("present");
    assert_eq!(
        (entry.revision, entry.value.as_slice()),
        (again, &b"two"[..])
    );
}

/// The watchdogs compare a watch with its stream's last revision now: a
/// value cached when the bucket was opened (what async-nats's
/// `kv::Store::status()` returns) made a watch whose consumer was lost with
/// a cluster node look current forever (issue 18's kill tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buckets_last_revision_is_read_fresh() {
    let server = NatsServer::start("");
    // The bucket as the control plane creates it (async-nats cannot
    // create one on nats-server 2.9), then opened as a plain KV store.
    let _store = open(&server).await;
    let client = async_nats::connect(server.url()).await.expect("connect");
    let bucket = async_nats::jetstream::new(client)
        .get_key_value(transport_nats::kv::BUCKET)
        .await
        .expect("bucket");
    assert_eq!(
        transport_nats::last_revision(&bucket).await.expect("last"),
        0
    );
    let mut last = 0;
    for value in ["one", "two", "three"] {
        last = bucket.put("k", value.into()).await.expect("put");
    }
    assert_eq!(last, 3);
    assert_eq!(
        transport_nats::last_revision(&bucket).await.expect("last"),
        last
    );
}
