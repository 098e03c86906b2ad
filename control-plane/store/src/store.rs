//! The embedded single-replica store: redb, one table of `revision ‖ value`.
//! Writes go to one writer thread, which takes every commit waiting, applies
//! them in one write transaction (each op under its own revision check) and
//! makes them durable with one fsync: writes that arrive together share one
//! commit (group commit). Readers never wait for the writer (redb's MVCC).

use agent_core::dbfile::Checker;
use drover_contract::BoxFuture;
use drover_contract::kv::{Change, Entry, KvError, KvStore, Op, OpResults};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc;
use tokio::sync::{Notify, broadcast, oneshot};

macro_rules! db_err {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreFailure {
            fn from(e: $t) -> Self {
                // redb's I/O error, and every error after the first.
                match redb::Error::from(e) {
                    e @ (redb::Error::Io(_) | redb::Error::PreviousIo) => {
                        StoreFailure(KvError::Io(e.to_string()))
                    }
                    e => StoreFailure(KvError::Db(e.to_string())),
                }
            }
        }
    )*};
}

/// A redb error on its way to becoming a [`KvError`].
struct StoreFailure(KvError);

db_err!(
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// Upper bound of ops in one group commit.
const MAX_OPS_PER_COMMIT: usize = 50_000;
/// Capacity of the change feed; a reader further behind is told it lagged.
pub const CHANGE_FEED: usize = 1 << 16;

struct CommitRequest {
    ops: Vec<Op>,
    done: oneshot::Sender<Result<OpResults, KvError>>,
}

pub struct RedbKv {
    db: Arc<Database>,
    writer: mpsc::Sender<CommitRequest>,
    changes: broadcast::Sender<Change>,
    io_failed: Arc<Notify>,
    /// The database's lock, held while the store is open.
    _hold: agent_core::dbfile::Hold,
}

fn split(stored: &[u8]) -> Entry {
    let (rev, value) = stored.split_at(8.min(stored.len()));
    let mut bytes = [0u8; 8];
    bytes[..rev.len()].copy_from_slice(rev);
    Entry {
        revision: u64::from_be_bytes(bytes),
        value: value.to_vec(),
    }
}

impl RedbKv {
    /// Opens the database, checking it in this process (tests and tools).
    pub fn open(path: &Path) -> Result<Self, KvError> {
        Self::open_checked(path, &Checker::in_process("drover reset-store"))
    }

    /// Opens the database or creates it; refuses an empty or damaged file by
    /// name (see `agent_core::dbfile`).
    pub fn open_checked(path: &Path, checker: &Checker) -> Result<Self, KvError> {
        let (db, hold) = agent_core::dbfile::open_or_create(path, checker, |db| {
            let init = || -> Result<(), StoreFailure> {
                let tx = db.begin_write()?;
                tx.open_table(KV)?;
                tx.open_table(META)?;
                tx.commit()?;
                Ok(())
            };
            init().map_err(|e| e.0.to_string())
        })
        .map_err(|e| KvError::Open {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        let db = Arc::new(db);
        let (changes, _) = broadcast::channel(CHANGE_FEED);
        let (writer, requests) = mpsc::channel::<CommitRequest>();
        let thread_db = db.clone();
        let thread_changes = changes.clone();
        let io_failed = Arc::new(Notify::new());
        let thread_failed = io_failed.clone();
        std::thread::Builder::new()
            .name("drover-store-writer".into())
            .spawn(move || write_loop(&thread_db, &requests, &thread_changes, &thread_failed))
            .map_err(|e| KvError::Db(format!("cannot start the store's writer: {e}")))?;
        Ok(Self {
            db,
            writer,
            changes,
            io_failed,
            _hold: hold,
        })
    }

    /// Notified once a commit failed on I/O (a full or failing file
    /// system). redb then refuses every write until the database is opened
    /// again, so the only way on is a new process: `serve` exits with
    /// EX_IOERR and the service manager starts it again.
    pub fn io_failed(&self) -> Arc<Notify> {
        self.io_failed.clone()
    }

    fn read(&self, key: &str) -> Result<Option<Entry>, StoreFailure> {
        let tx = self.db.begin_read()?;
        let table = tx.open_table(KV)?;
        Ok(table.get(key)?.map(|v| split(v.value())))
    }

    fn scan(&self, prefix: &str) -> Result<Vec<(String, Entry)>, StoreFailure> {
        let tx = self.db.begin_read()?;
        let table = tx.open_table(KV)?;
        let mut out = Vec::new();
        for item in table.range(prefix..)? {
            let (key, value) = item?;
            let key = key.value();
            if !key.starts_with(prefix) {
                break;
            }
            out.push((key.to_owned(), split(value.value())));
        }
        Ok(out)
    }
}

/// The writer thread: one transaction and one fsync for every commit
/// request waiting when it gets to them.
fn write_loop(
    db: &Database,
    requests: &mpsc::Receiver<CommitRequest>,
    changes: &broadcast::Sender<Change>,
    io_failed: &Notify,
) {
    while let Ok(first) = requests.recv() {
        let mut batch = vec![first];
        let mut ops = batch[0].ops.len();
        while ops < MAX_OPS_PER_COMMIT {
            match requests.try_recv() {
                Ok(next) => {
                    ops += next.ops.len();
                    batch.push(next);
                }
                Err(_) => break,
            }
        }
        match apply(db, &batch) {
            Ok((results, changed)) => {
                for change in changed {
                    let _ = changes.send(change);
                }
                for (request, result) in batch.into_iter().zip(results) {
                    let _ = request.done.send(Ok(result));
                }
            }
            Err(StoreFailure(e)) => {
                // Every writer hears first, so an API request can answer
                // 503 before the process begins to shut down.
                for request in batch {
                    let _ = request.done.send(Err(e.clone()));
                }
                if e.is_io() {
                    tracing::error!(error = %e, "the store's file system refused a write");
                    io_failed.notify_one();
                }
            }
        }
    }
}

type Applied = (Vec<OpResults>, Vec<Change>);

fn apply(db: &Database, batch: &[CommitRequest]) -> Result<Applied, StoreFailure> {
    let tx = db.begin_write()?;
    let mut results = Vec::with_capacity(batch.len());
    let mut changed = Vec::new();
    {
        let mut table = tx.open_table(KV)?;
        let mut meta = tx.open_table(META)?;
        let mut revision = meta.get("revision")?.map(|v| v.value()).unwrap_or(0);
        for request in batch {
            let mut these = Vec::with_capacity(request.ops.len());
            for op in &request.ops {
                let found = table
                    .get(op.key())?
                    .map(|v| split(v.value()).revision)
                    .unwrap_or(0);
                let (expected, value) = match op {
                    Op::Put {
                        expected, value, ..
                    } => (*expected, Some(value)),
                    Op::Delete { expected, .. } => (*expected, None),
                };
                if found != expected {
                    these.push(Err(KvError::Conflict {
                        key: op.key().to_owned(),
                        expected,
                        found,
                    }));
                    continue;
                }
                revision += 1;
                match value {
                    Some(value) => {
                        let mut stored = Vec::with_capacity(8 + value.len());
                        stored.extend_from_slice(&revision.to_be_bytes());
                        stored.extend_from_slice(value);
                        table.insert(op.key(), stored.as_slice())?;
                    }
                    None => {
                        table.remove(op.key())?;
                    }
                }
                changed.push(Change {
                    key: op.key().to_owned(),
                    revision,
                    deleted: value.is_none(),
                });
                these.push(Ok(revision));
            }
            results.push(these);
        }
        meta.insert("revision", revision)?;
    }
    tx.commit()?;
    Ok((results, changed))
}

impl KvStore for RedbKv {
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Entry>, KvError>> {
        Box::pin(async move { self.read(key).map_err(|e| e.0) })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<(String, Entry)>, KvError>> {
        Box::pin(async move { self.scan(prefix).map_err(|e| e.0) })
    }

    fn commit(&self, ops: Vec<Op>) -> BoxFuture<'_, Result<OpResults, KvError>> {
        Box::pin(async move {
            if ops.is_empty() {
                return Ok(Vec::new());
            }
            let (done, answer) = oneshot::channel();
            self.writer
                .send(CommitRequest { ops, done })
                .map_err(|_| KvError::Db("the store's writer stopped".into()))?;
            answer
                .await
                .map_err(|_| KvError::Db("the store's writer stopped".into()))?
        })
    }

    fn changes(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }
}

/// An in-memory backend with the same rules, for fast tests of the engine
/// and the delivery core at fleet scale.
pub mod mem {
    use super::{BoxFuture, CHANGE_FEED, Change, Entry, KvError, KvStore, Op, OpResults};
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use tokio::sync::broadcast;

    pub struct MemKv {
        /// (last revision, entries). A std Mutex: nothing awaits while it is held.
        inner: Mutex<(u64, BTreeMap<String, Entry>)>,
        changes: broadcast::Sender<Change>,
    }

    impl Default for MemKv {
        fn default() -> Self {
            Self {
                inner: Mutex::default(),
                changes: broadcast::channel(CHANGE_FEED).0,
            }
        }
    }

    impl KvStore for MemKv {
        fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Entry>, KvError>> {
            let found = self
                .inner
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .1
                .get(key)
                .cloned();
            Box::pin(async move { Ok(found) })
        }

        fn list<'a>(
            &'a self,
            prefix: &'a str,
        ) -> BoxFuture<'a, Result<Vec<(String, Entry)>, KvError>> {
            let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let found: Vec<(String, Entry)> = inner
                .1
                .range(prefix.to_owned()..)
                .take_while(|(k, _)| k.starts_with(prefix))
                .map(|(k, e)| (k.clone(), e.clone()))
                .collect();
            Box::pin(async move { Ok(found) })
        }

        fn commit(&self, ops: Vec<Op>) -> BoxFuture<'_, Result<OpResults, KvError>> {
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let mut results = Vec::with_capacity(ops.len());
            for op in ops {
                let found = inner.1.get(op.key()).map(|e| e.revision).unwrap_or(0);
                let expected = match &op {
                    Op::Put { expected, .. } | Op::Delete { expected, .. } => *expected,
                };
                if found != expected {
                    results.push(Err(KvError::Conflict {
                        key: op.key().to_owned(),
                        expected,
                        found,
                    }));
                    continue;
                }
                inner.0 += 1;
                let revision = inner.0;
                let (key, deleted) = match op {
                    Op::Put { key, value, .. } => {
                        inner.1.insert(key.clone(), Entry { revision, value });
                        (key, false)
                    }
                    Op::Delete { key, .. } => {
                        inner.1.remove(&key);
                        (key, true)
                    }
                };
                let _ = self.changes.send(Change {
                    key,
                    revision,
                    deleted,
                });
                results.push(Ok(revision));
            }
            Box::pin(async move { Ok(results) })
        }

        fn changes(&self) -> broadcast::Receiver<Change> {
            self.changes.subscribe()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, value: &[u8], expected: u64) -> Op {
        Op::Put {
            key: key.into(),
            value: value.to_vec(),
            expected,
        }
    }

    #[tokio::test]
    async fn compare_and_set_on_revisions_and_a_change_feed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let kv = RedbKv::open(&dir.path().join("cp.redb")).expect("open");
        let mut feed = kv.changes();
        let results = kv
            .commit(vec![put("runs/a", b"one", 0), put("runs/a", b"again", 0)])
            .await
            .expect("commit");
        let r1 = *results[0].as_ref().expect("created");
        assert!(results[1].as_ref().expect_err("create twice").is_conflict());
        let r2 = kv
            .commit(vec![put("runs/a", b"two", r1)])
            .await
            .expect("commit")[0]
            .clone()
            .expect("update");
        let stale = kv
            .commit(vec![put("runs/a", b"stale", r1)])
            .await
            .expect("commit");
        assert!(stale[0].as_ref().expect_err("stale").is_conflict());
        assert_eq!(
            kv.get("runs/a").await.expect("get"),
            Some(Entry {
                revision: r2,
                value: b"two".to_vec()
            })
        );
        kv.commit(vec![put("runs/b", b"x", 0), put("runt", b"y", 0)])
            .await
            .expect("commit");
        let keys: Vec<String> = kv
            .list("runs/")
            .await
            .expect("list")
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(keys, vec!["runs/a", "runs/b"]);
        let deleted = kv
            .commit(vec![
                Op::Delete {
                    key: "runs/a".into(),
                    expected: r1,
                },
                Op::Delete {
                    key: "runs/a".into(),
                    expected: r2,
                },
            ])
            .await
            .expect("commit");
        assert!(deleted[0].is_err() && deleted[1].is_ok());
        assert_eq!(kv.get("runs/a").await.expect("get"), None);
        let first = feed.recv().await.expect("change");
        assert_eq!((first.key.as_str(), first.revision), ("runs/a", r1));
    }

    /// Many writers at once share commits: far fewer fsyncs than writes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_writes_share_commits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let kv = Arc::new(RedbKv::open(&dir.path().join("cp.redb")).expect("open"));
        let mut tasks = Vec::new();
        for i in 0..2000 {
            let kv = kv.clone();
            tasks.push(tokio::spawn(async move {
                kv.commit(vec![put(&format!("jobs/{i:05}"), b"v", 0)])
                    .await
                    .expect("commit")[0]
                    .clone()
                    .expect("created")
            }));
        }
        for task in tasks {
            task.await.expect("task");
        }
        assert_eq!(kv.list("jobs/").await.expect("list").len(), 2000);
    }
}
