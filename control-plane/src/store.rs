//! The control plane's storage: a key-value store with a revision on every
//! key, where every write is a compare-and-set on that revision. That is what
//! lets several passes (and, with a shared backend, several replicas) update
//! the same run safely: the embedded redb backend here, NATS JetStream KV later.

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub revision: u64,
    pub value: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error("revision conflict on {key}: expected {expected}, found {found}")]
    Conflict {
        key: String,
        expected: u64,
        found: u64,
    },
    #[error("cannot open the control-plane database {path}: {reason}")]
    Open { path: String, reason: String },
    #[error("control-plane database error: {0}")]
    Db(String),
}

impl KvError {
    pub fn is_conflict(&self) -> bool {
        matches!(self, KvError::Conflict { .. })
    }
}

macro_rules! db_err {
    ($($t:ty),*) => {$(
        impl From<$t> for KvError {
            fn from(e: $t) -> Self { KvError::Db(e.to_string()) }
        }
    )*};
}
db_err!(
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

pub trait KvStore: Send + Sync + 'static {
    fn get(&self, key: &str) -> Result<Option<Entry>, KvError>;
    /// Writes `value` if the key's revision is `expected` (0: the key must not
    /// exist). Returns the new revision. Durable when it returns.
    fn put(&self, key: &str, value: &[u8], expected: u64) -> Result<u64, KvError>;
    /// Deletes the key if its revision is `expected`.
    fn delete(&self, key: &str, expected: u64) -> Result<(), KvError>;
    /// All keys starting with `prefix`, in key order.
    fn list(&self, prefix: &str) -> Result<Vec<(String, Entry)>, KvError>;
}

const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// The embedded single-replica backend. redb serialises write transactions,
/// so the revision check and the write are atomic.
pub struct RedbKv {
    db: Database,
}

impl RedbKv {
    pub fn open(path: &Path) -> Result<Self, KvError> {
        let db = Database::create(path).map_err(|e| KvError::Open {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        let tx = db.begin_write()?;
        tx.open_table(KV)?;
        tx.open_table(META)?;
        tx.commit()?;
        Ok(Self { db })
    }
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

impl KvStore for RedbKv {
    fn get(&self, key: &str) -> Result<Option<Entry>, KvError> {
        let tx = self.db.begin_read()?;
        let table = tx.open_table(KV)?;
        Ok(table.get(key)?.map(|v| split(v.value())))
    }

    fn put(&self, key: &str, value: &[u8], expected: u64) -> Result<u64, KvError> {
        let tx = self.db.begin_write()?;
        let revision = {
            let mut table = tx.open_table(KV)?;
            let found = table
                .get(key)?
                .map(|v| split(v.value()).revision)
                .unwrap_or(0);
            if found != expected {
                return Err(KvError::Conflict {
                    key: key.to_owned(),
                    expected,
                    found,
                });
            }
            let mut meta = tx.open_table(META)?;
            let revision = meta.get("revision")?.map(|v| v.value()).unwrap_or(0) + 1;
            meta.insert("revision", revision)?;
            let mut stored = Vec::with_capacity(8 + value.len());
            stored.extend_from_slice(&revision.to_be_bytes());
            stored.extend_from_slice(value);
            table.insert(key, stored.as_slice())?;
            revision
        };
        tx.commit()?;
        Ok(revision)
    }

    fn delete(&self, key: &str, expected: u64) -> Result<(), KvError> {
        let tx = self.db.begin_write()?;
        {
            let mut table = tx.open_table(KV)?;
            let found = table
                .get(key)?
                .map(|v| split(v.value()).revision)
                .unwrap_or(0);
            if found != expected {
                return Err(KvError::Conflict {
                    key: key.to_owned(),
                    expected,
                    found,
                });
            }
            table.remove(key)?;
        }
        tx.commit()?;
        Ok(())
    }

    fn list(&self, prefix: &str) -> Result<Vec<(String, Entry)>, KvError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_and_set_on_revisions() {
        let dir = tempfile::tempdir().expect("tempdir");
        let kv = RedbKv::open(&dir.path().join("cp.redb")).expect("open");
        let r1 = kv.put("runs/a", b"one", 0).expect("create");
        assert!(
            kv.put("runs/a", b"again", 0).unwrap_err().is_conflict(),
            "create twice"
        );
        let r2 = kv.put("runs/a", b"two", r1).expect("update");
        assert!(
            kv.put("runs/a", b"stale", r1).unwrap_err().is_conflict(),
            "stale revision"
        );
        assert_eq!(
            kv.get("runs/a").expect("get"),
            Some(Entry {
                revision: r2,
                value: b"two".to_vec()
            })
        );
        kv.put("runs/b", b"x", 0).expect("create");
        kv.put("runt", b"y", 0).expect("create");
        let keys: Vec<String> = kv
            .list("runs/")
            .expect("list")
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(keys, vec!["runs/a", "runs/b"]);
        assert!(kv.delete("runs/a", r1).unwrap_err().is_conflict());
        kv.delete("runs/a", r2).expect("delete");
        assert_eq!(kv.get("runs/a").expect("get"), None);
    }
}

/// An in-memory backend with the same revision rules, for fast tests of the
/// engine at fleet scale.
#[cfg(test)]
pub mod mem {
    use super::{Entry, KvError, KvStore};
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    #[derive(Default)]
    pub struct MemKv {
        /// (next revision, entries). A std Mutex: nothing awaits while it is held.
        inner: Mutex<(u64, BTreeMap<String, Entry>)>,
    }

    impl KvStore for MemKv {
        fn get(&self, key: &str) -> Result<Option<Entry>, KvError> {
            Ok(self.inner.lock().expect("lock").1.get(key).cloned())
        }

        fn put(&self, key: &str, value: &[u8], expected: u64) -> Result<u64, KvError> {
            let mut inner = self.inner.lock().expect("lock");
            let found = inner.1.get(key).map(|e| e.revision).unwrap_or(0);
            if found != expected {
                return Err(KvError::Conflict {
                    key: key.to_owned(),
                    expected,
                    found,
                });
            }
            inner.0 += 1;
            let revision = inner.0;
            inner.1.insert(
                key.to_owned(),
                Entry {
                    revision,
                    value: value.to_vec(),
                },
            );
            Ok(revision)
        }

        fn delete(&self, key: &str, expected: u64) -> Result<(), KvError> {
            let mut inner = self.inner.lock().expect("lock");
            let found = inner.1.get(key).map(|e| e.revision).unwrap_or(0);
            if found != expected {
                return Err(KvError::Conflict {
                    key: key.to_owned(),
                    expected,
                    found,
                });
            }
            inner.1.remove(key);
            Ok(())
        }

        fn list(&self, prefix: &str) -> Result<Vec<(String, Entry)>, KvError> {
            let inner = self.inner.lock().expect("lock");
            Ok(inner
                .1
                .range(prefix.to_owned()..)
                .take_while(|(k, _)| k.starts_with(prefix))
                .map(|(k, e)| (k.clone(), e.clone()))
                .collect())
        }
    }
}
