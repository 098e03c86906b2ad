//! The control plane's store on NATS JetStream KV, for several replicas over
//! one fleet. Every write is a compare-and-set on the key's revision (the
//! stream sequence); writes of one commit go out together. Reads come from
//! a mirror of the bucket that one watch keeps current (one consumer per
//! replica, not one per listing), and every change the watch sees, whichever
//! replica made it, is announced on the change feed. A read may lag a write
//! of another replica; the write that follows it then fails its revision
//! check, the key is read again from the server, and the caller retries.
//! Keys map `/` to `.`, the bucket's subject separator.

use async_nats::jetstream::{self, kv, stream};
use drover_contract::BoxFuture;
use drover_contract::kv::{Change, Entry, KvError, KvStore, Op, OpResults};
use futures_util::StreamExt;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast;
use tracing::warn;

pub const BUCKET: &str = "drover-control-plane";
/// Writes of one commit in flight at once.
const IN_FLIGHT: usize = 256;

fn db_error(e: impl std::fmt::Display) -> KvError {
    KvError::Db(format!("NATS KV: {e}"))
}

fn to_nats(key: &str) -> String {
    key.replace('/', ".")
}

fn from_nats(key: &str) -> String {
    key.replace('.', "/")
}

#[derive(Default)]
struct Mirror {
    entries: BTreeMap<String, Entry>,
}

pub struct NatsKv {
    kv: kv::Store,
    /// A std Mutex: nothing awaits while it is held.
    mirror: Arc<Mutex<Mirror>>,
    changes: broadcast::Sender<Change>,
}

/// Applies a change to the mirror if it is newer; returns whether it was.
fn apply(mirror: &Mutex<Mirror>, key: &str, revision: u64, value: Option<Vec<u8>>) -> bool {
    let mut mirror = mirror.lock().unwrap_or_else(|p| p.into_inner());
    if mirror
        .entries
        .get(key)
        .is_some_and(|e| e.revision >= revision)
    {
        return false;
    }
    match value {
        Some(value) => {
            mirror
                .entries
                .insert(key.to_owned(), Entry { revision, value });
        }
        None => {
            mirror.entries.remove(key);
        }
    }
    true
}

impl NatsKv {
    /// Opens the bucket, creating its stream if needed (directly: async-nats
    /// 0.51 cannot create a bucket on nats-server 2.9), and fills the mirror.
    pub async fn open(client: async_nats::Client, replicas: usize) -> Result<Self, KvError> {
        let js = jetstream::new(client);
        let config = stream::Config {
            name: format!("KV_{BUCKET}"),
            subjects: vec![format!("$KV.{BUCKET}.>")],
            max_messages_per_subject: 1,
            storage: stream::StorageType::File,
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            discard: stream::DiscardPolicy::New,
            duplicate_window: Duration::from_secs(120),
            max_message_size: -1,
            num_replicas: replicas,
            ..Default::default()
        };
        let mut created = js.get_or_create_stream(config).await.map_err(db_error)?;
        // The stream's leader answers this: how far the mirror must get
        // before this replica reads from it. The watch's own "caught up"
        // is not enough: its consumer may sit on a node still catching up
        // after a restart, and a replica acting on that node's stale view
        // would write from it.
        let last = created.info().await.map_err(db_error)?.state.last_sequence;
        let kv = js.get_key_value(BUCKET).await.map_err(db_error)?;
        let mirror = Arc::new(Mutex::new(Mirror::default()));
        let (changes, _) = broadcast::channel(1 << 16);
        let (ready_tx, ready) = tokio::sync::oneshot::channel();
        tokio::spawn(follow(
            kv.clone(),
            mirror.clone(),
            changes.clone(),
            ready_tx,
            last,
        ));
        tokio::time::timeout(Duration::from_secs(120), ready)
            .await
            .map_err(|_| db_error("the bucket's mirror did not fill within 120 s"))?
            .map_err(|_| db_error("the bucket's watch stopped"))?;
        Ok(Self {
            kv,
            mirror,
            changes,
        })
    }

    /// The key's last message, from the stream's leader: its revision and
    /// its value (None for a delete or purge marker); Ok(None) when the
    /// stream has no message for it. Not a direct get: any replica may
    /// answer one, and a node still catching up after a restart answers
    /// with a stale value (a create then looks like a conflict with nothing,
    /// a lost race like a race with an older write).
    async fn last_on_leader(&self, key: &str) -> Result<Option<(u64, Option<Vec<u8>>)>, KvError> {
        let subject = format!("$KV.{BUCKET}.{}", to_nats(key));
        match self
            .kv
            .stream
            .get_last_raw_message_by_subject(&subject)
            .await
        {
            // A put has no operation header; deletes and purges have one.
            Ok(message) => Ok(Some((
                message.sequence,
                message
                    .headers
                    .get("KV-Operation")
                    .is_none()
                    .then(|| message.payload.to_vec()),
            ))),
            Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(db_error(e)),
        }
    }

    /// Reads a key from the stream's leader into the mirror (after a lost
    /// race). What is newer than the mirror goes out on the change feed
    /// too, as the watch would have sent it: a watch that stalls (a cluster
    /// node lost) must not leave the engines and the delivery core without
    /// the change while the mirror already has it, since the watch's replay
    /// then looks old.
    async fn refresh(&self, key: &str) {
        match self.last_on_leader(key).await {
            Ok(Some((revision, value))) => {
                let deleted = value.is_none();
                if apply(&self.mirror, key, revision, value) {
                    let _ = self.changes.send(Change {
                        key: key.to_owned(),
                        revision,
                        deleted,
                    });
                }
            }
            // Gone from the server altogether (purged): gone here too.
            Ok(None) => {
                let mut mirror = self.mirror.lock().unwrap_or_else(|p| p.into_inner());
                mirror.entries.remove(key);
            }
            Err(_) => {}
        }
    }

    /// Creates a key that has no value: none ever, or a delete marker last.
    /// Err(None) when it has a value (a lost race).
    async fn create(&self, key: &str, value: Vec<u8>) -> Result<u64, Option<KvError>> {
        let nats_key = to_nats(key);
        let update = |expected| self.kv.update(&nats_key, value.clone().into(), expected);
        let lost = match update(0).await {
            Ok(revision) => return Ok(revision),
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => None,
            Err(e) => Some(db_error(e)),
        };
        match self.last_on_leader(key).await.map_err(Some)? {
            Some((marker, None)) => match update(marker).await {
                Ok(revision) => Ok(revision),
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Err(None),
                Err(e) => Err(Some(db_error(e))),
            },
            Some((_, Some(_))) => Err(None),
            None => Err(lost),
        }
    }

    async fn write(&self, op: Op) -> Result<u64, KvError> {
        let key = op.key().to_owned();
        let nats_key = to_nats(&key);
        let result = match &op {
            Op::Put {
                value, expected: 0, ..
            } => self.create(&key, value.clone()).await,
            Op::Put {
                value, expected, ..
            } => match self
                .kv
                .update(&nats_key, value.clone().into(), *expected)
                .await
            {
                Ok(revision) => Ok(revision),
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Err(None),
                Err(e) => Err(Some(db_error(e))),
            },
            Op::Delete { expected, .. } => self
                .kv
                .delete_expect_revision(&nats_key, Some(*expected))
                .await
                .map(|()| 0)
                .map_err(|_| None),
        };
        match result {
            Ok(revision) => {
                let value = match op {
                    Op::Put { value, .. } => Some(value),
                    Op::Delete { .. } => None,
                };
                let deleted = value.is_none();
                if revision > 0 && apply(&self.mirror, &key, revision, value) {
                    let _ = self.changes.send(Change {
                        key,
                        revision,
                        deleted,
                    });
                } else if deleted {
                    self.refresh(&key).await;
                }
                Ok(revision)
            }
            Err(None) => {
                self.refresh(&key).await;
                let found = self
                    .mirror
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entries
                    .get(&key)
                    .map(|e| e.revision)
                    .unwrap_or(0);
                let expected = match op {
                    Op::Put { expected, .. } | Op::Delete { expected, .. } => expected,
                };
                Err(KvError::Conflict {
                    key,
                    expected,
                    found,
                })
            }
            Err(Some(e)) => Err(e),
        }
    }
}

/// Keeps the mirror current from one watch over the whole bucket (last
/// value of every key, then every change); says when it first reached
/// revision `ready_at`.
async fn follow(
    kv: kv::Store,
    mirror: Arc<Mutex<Mirror>>,
    changes: broadcast::Sender<Change>,
    ready: tokio::sync::oneshot::Sender<()>,
    ready_at: u64,
) {
    let mut ready = Some(ready);
    if ready_at == 0
        && let Some(ready) = ready.take()
    {
        let _ = ready.send(());
    }
    loop {
        match kv.watch_with_history(">").await {
            Ok(mut watch) => {
                // A watch whose consumer was lost with a cluster node can
                // stall without an error: twice in a row behind the stream's
                // last revision without moving, and it is started again (the
                // mirror takes only newer revisions, so a full replay is
                // harmless).
                // It is judged by what this watch delivered, not by the
                // mirror: this replica's own writes move the mirror on and
                // would hide a watch that stopped before other replicas'.
                let mut check = crate::Watchdog::checks();
                let mut dog = crate::Watchdog::default();
                let mut delivered = 0;
                loop {
                    let entry = tokio::select! {
                        entry = watch.next() => entry,
                        _ = check.tick() => {
                            let last = match crate::last_revision(&kv).await {
                                Ok(last) => Some(last),
                                Err(e) => {
                                    warn!(error = %e, "cannot read the store's stream state");
                                    None
                                }
                            };
                            let seen = delivered;
                            if dog.stalled(seen, last) {
                                warn!(seen, last, "the store's watch stopped short of the stream; watching again");
                                break;
                            }
                            continue;
                        }
                    };
                    let Some(entry) = entry else { break };
                    let entry = match entry {
                        Ok(entry) => entry,
                        Err(e) => {
                            warn!(error = %e, "the store's watch failed; watching again");
                            break;
                        }
                    };
                    delivered = delivered.max(entry.revision);
                    let key = from_nats(&entry.key);
                    let deleted = entry.operation != kv::Operation::Put;
                    let value = (!deleted).then(|| entry.value.to_vec());
                    if apply(&mirror, &key, entry.revision, value) {
                        let _ = changes.send(Change {
                            key,
                            revision: entry.revision,
                            deleted,
                        });
                    }
                    if delivered >= ready_at
                        && let Some(ready) = ready.take()
                    {
                        let _ = ready.send(());
                    }
                }
            }
            Err(e) => warn!(error = %e, "cannot watch the store's bucket"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

impl KvStore for NatsKv {
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Entry>, KvError>> {
        let found = self
            .mirror
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entries
            .get(key)
            .cloned();
        Box::pin(async move { Ok(found) })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<(String, Entry)>, KvError>> {
        let found: Vec<(String, Entry)> = self
            .mirror
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entries
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, e)| (k.clone(), e.clone()))
            .collect();
        Box::pin(async move { Ok(found) })
    }

    fn commit(&self, ops: Vec<Op>) -> BoxFuture<'_, Result<OpResults, KvError>> {
        Box::pin(async move {
            let results: OpResults = futures_util::stream::iter(ops)
                .map(|op| self.write(op))
                .buffered(IN_FLIGHT)
                .collect()
                .await;
            Ok(results)
        })
    }

    fn changes(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }
}
