//! The control plane's storage contract: a key-value store with a revision
//! on every key, where every write is a compare-and-set on that revision,
//! writes arriving together share one commit (one fsync), and every change
//! is announced, whichever replica made it. That is what lets passes and
//! replicas update the same records safely, and lets the engine and the
//! delivery core learn what changed instead of listing everything.

use crate::BoxFuture;
use tokio::sync::broadcast;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub revision: u64,
    pub value: Vec<u8>,
}

/// One write of a commit, checked on its own: `expected` is the key's
/// current revision (0: the key must not exist).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Put {
        key: String,
        value: Vec<u8>,
        expected: u64,
    },
    Delete {
        key: String,
        expected: u64,
    },
}

impl Op {
    pub fn key(&self) -> &str {
        match self {
            Op::Put { key, .. } | Op::Delete { key, .. } => key,
        }
    }
}

/// A key changed: its new revision, or its deletion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub key: String,
    pub revision: u64,
    pub deleted: bool,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum KvError {
    #[error("revision conflict on {key}: expected {expected}, found {found}")]
    Conflict {
        key: String,
        expected: u64,
        found: u64,
    },
    #[error("{reason}")]
    Open { path: String, reason: String },
    #[error("control-plane store error: {0}")]
    Db(String),
    /// The store's file system refused a read or write (full, or failing).
    #[error("control-plane store error: {0}")]
    Io(String),
}

impl KvError {
    pub fn is_conflict(&self) -> bool {
        matches!(self, KvError::Conflict { .. })
    }

    /// Whether the store's file system failed it: the embedded store then
    /// refuses every write until it is opened again.
    pub fn is_io(&self) -> bool {
        matches!(self, KvError::Io(_))
    }
}

/// Each op's result: its new revision, or why it was not applied.
pub type OpResults = Vec<Result<u64, KvError>>;

pub trait KvStore: Send + Sync + 'static {
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Entry>, KvError>>;

    /// All keys starting with `prefix`, in key order.
    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<(String, Entry)>, KvError>>;

    /// Applies `ops` in order, each under its own revision check; those that
    /// pass are durable together when this returns. The outer error means
    /// nothing was committed.
    fn commit(&self, ops: Vec<Op>) -> BoxFuture<'_, Result<OpResults, KvError>>;

    /// Every change from now on. A receiver that lags behind is told so
    /// (`RecvError::Lagged`) and must read what it needs again.
    fn changes(&self) -> broadcast::Receiver<Change>;
}
