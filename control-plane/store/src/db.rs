//! Typed access to the key-value store: records in, records out, with
//! compare-and-set and the change feed.

use crate::records::{Delivery, JobDelivery};
use crate::stored::Record;
use drover_contract::kv::{Change, KvError, KvStore, Op, OpResults};
use jiff::Timestamp;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error("corrupt record {key}: {reason}")]
    Corrupt { key: String, reason: String },
    #[error("cannot encode a record: {0}")]
    Encode(#[from] postcard::Error),
    #[error("{key} kept changing under concurrent writers; gave up after {tries} tries")]
    Contention { key: String, tries: u32 },
}

/// Typed access to the key-value store.
#[derive(Clone)]
pub struct Db {
    kv: Arc<dyn KvStore>,
    /// Told how long each commit took (the server's metrics).
    on_commit: Option<fn(Duration)>,
}

impl Db {
    pub fn new(kv: Arc<dyn KvStore>) -> Self {
        Self {
            kv,
            on_commit: None,
        }
    }

    /// Tells `observe` how long each commit took.
    pub fn observe_commits(mut self, observe: fn(Duration)) -> Self {
        self.on_commit = Some(observe);
        self
    }

    fn committed(&self, since: Instant) {
        if let Some(observe) = self.on_commit {
            observe(since.elapsed());
        }
    }

    pub fn decode<T: Record>(key: &str, bytes: &[u8]) -> Result<T, DbError> {
        T::from_bytes(bytes).map_err(|e| DbError::Corrupt {
            key: key.to_owned(),
            reason: e.to_string(),
        })
    }

    pub fn encode<T: Record>(value: &T) -> Result<Vec<u8>, DbError> {
        Ok(value.to_bytes()?)
    }

    pub async fn get<T: Record>(&self, key: &str) -> Result<Option<(u64, T)>, DbError> {
        match self.kv.get(key).await? {
            Some(entry) => Ok(Some((entry.revision, Self::decode(key, &entry.value)?))),
            None => Ok(None),
        }
    }

    /// One write, committed on its own (it still shares an fsync with
    /// whatever else is being committed at that moment).
    pub async fn put<T: Record>(
        &self,
        key: &str,
        value: &T,
        expected: u64,
    ) -> Result<u64, DbError> {
        let op = Op::Put {
            key: key.to_owned(),
            value: Self::encode(value)?,
            expected,
        };
        let since = Instant::now();
        let mut results = self.kv.commit(vec![op]).await?;
        self.committed(since);
        Ok(results
            .pop()
            .unwrap_or_else(|| Err(KvError::Db("the store answered nothing".into())))?)
    }

    /// Many writes in one commit; each is checked on its own.
    pub async fn commit(&self, ops: Vec<Op>) -> Result<OpResults, DbError> {
        let since = Instant::now();
        let results = self.kv.commit(ops).await?;
        self.committed(since);
        Ok(results)
    }

    pub async fn list<T: Record>(&self, prefix: &str) -> Result<Vec<(String, u64, T)>, DbError> {
        self.kv
            .list(prefix)
            .await?
            .into_iter()
            .map(|(key, entry)| {
                let value = Self::decode(&key, &entry.value)?;
                Ok((key, entry.revision, value))
            })
            .collect()
    }

    /// One page of a listing in key order: the records whose key comes
    /// after `prefix` + `after`, at most `limit` of them (only those are
    /// decoded), and whether more follow.
    pub async fn page<T: Record>(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<(String, u64, T)>, bool), DbError> {
        let mut entries = self.kv.list(prefix).await?;
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let start = match after {
            Some(after) => {
                let from = format!("{prefix}{after}");
                entries.partition_point(|(key, _)| *key <= from)
            }
            None => 0,
        };
        let more = entries.len() > start.saturating_add(limit);
        let page = entries
            .into_iter()
            .skip(start)
            .take(limit)
            .map(|(key, entry)| {
                let value = Self::decode(&key, &entry.value)?;
                Ok((key, entry.revision, value))
            })
            .collect::<Result<Vec<_>, DbError>>()?;
        Ok((page, more))
    }

    /// Deletes these keys, each at the revision it has when read (a key
    /// written meanwhile is read and deleted again); returns how many were
    /// there. Commits in chunks, so a long list is not one huge commit.
    pub async fn delete_all(&self, keys: &[String]) -> Result<usize, DbError> {
        const CHUNK: usize = 500;
        const TRIES: u32 = 10;
        let mut deleted = 0;
        for chunk in keys.chunks(CHUNK) {
            let mut left: Vec<&String> = chunk.iter().collect();
            for _ in 0..TRIES {
                let mut ops = Vec::new();
                for key in &left {
                    if let Some(entry) = self.kv.get(key).await? {
                        ops.push(Op::Delete {
                            key: (*key).clone(),
                            expected: entry.revision,
                        });
                    }
                }
                if ops.is_empty() {
                    left.clear();
                    break;
                }
                let tried: Vec<String> = ops.iter().map(|op| op.key().to_owned()).collect();
                let mut again = Vec::new();
                for (key, result) in tried.iter().zip(self.kv.commit(ops).await?) {
                    match result {
                        Ok(_) => deleted += 1,
                        Err(e) if e.is_conflict() => again.push(key.clone()),
                        Err(e) => return Err(e.into()),
                    }
                }
                left = chunk.iter().filter(|k| again.contains(k)).collect();
                if left.is_empty() {
                    break;
                }
            }
            if let Some(key) = left.first() {
                return Err(DbError::Contention {
                    key: (*key).clone(),
                    tries: TRIES,
                });
            }
        }
        Ok(deleted)
    }

    /// Writes `cancelRequestedAt` on these jobs' records where the job is
    /// undecided and not asked yet, in commits of a few hundred. Returns the
    /// keys that are settled (asked now, asked before, decided or gone); a
    /// key that lost a revision race is left out, for the next pass.
    pub async fn request_cancels(
        &self,
        keys: &[String],
        now: Timestamp,
    ) -> Result<std::collections::HashSet<String>, DbError> {
        const CHUNK: usize = 500;
        let mut settled = std::collections::HashSet::new();
        for chunk in keys.chunks(CHUNK) {
            let mut ops = Vec::new();
            for key in chunk {
                let Some((revision, mut job)) = self.get::<JobDelivery>(key).await? else {
                    settled.insert(key.clone());
                    continue;
                };
                let decided = job.status.as_ref().is_some_and(|s| s.state.is_terminal())
                    || matches!(job.delivery, Delivery::Expired { .. });
                if decided || job.cancel_requested_at.is_some() {
                    settled.insert(key.clone());
                    continue;
                }
                job.cancel_requested_at = Some(now);
                ops.push(Op::Put {
                    key: key.clone(),
                    value: Self::encode(&job)?,
                    expected: revision,
                });
            }
            let tried: Vec<String> = ops.iter().map(|op| op.key().to_owned()).collect();
            if ops.is_empty() {
                continue;
            }
            for (key, result) in tried.into_iter().zip(self.kv.commit(ops).await?) {
                match result {
                    Ok(_) => {
                        settled.insert(key);
                    }
                    Err(e) if e.is_conflict() => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(settled)
    }

    pub fn changes(&self) -> tokio::sync::broadcast::Receiver<Change> {
        self.kv.changes()
    }

    /// Read-modify-write under a revision check, retried on conflict. `change`
    /// returns None to leave the record as it is.
    pub async fn update<T, F>(&self, key: &str, mut change: F) -> Result<Option<T>, DbError>
    where
        T: Record + Clone,
        F: FnMut(Option<T>) -> Option<T>,
    {
        const TRIES: u32 = 50;
        for _ in 0..TRIES {
            let current = self.get::<T>(key).await?;
            let (revision, value) = match current {
                Some((revision, value)) => (revision, Some(value)),
                None => (0, None),
            };
            let Some(next) = change(value.clone()) else {
                return Ok(value);
            };
            match self.put(key, &next, revision).await {
                Ok(_) => return Ok(Some(next)),
                Err(DbError::Kv(e)) if e.is_conflict() => continue,
                Err(e) => return Err(e),
            }
        }
        Err(DbError::Contention {
            key: key.to_owned(),
            tries: TRIES,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pages_follow_key_order_and_say_when_more_follow() {
        let db = Db::new(Arc::new(crate::store::mem::MemKv::default()));
        for n in [3u64, 1, 5, 2, 4] {
            db.put(&format!("runs/r{n}"), &n, 0).await.expect("put");
        }
        // Another prefix is never part of the page.
        db.put("runsx/r0", &0u64, 0).await.expect("put");
        let names =
            |page: &[(String, u64, u64)]| page.iter().map(|(_, _, n)| *n).collect::<Vec<_>>();
        let (first, more) = db.page::<u64>("runs/", None, 2).await.expect("page");
        assert_eq!((names(&first), more), (vec![1, 2], true));
        let (second, more) = db.page::<u64>("runs/", Some("r2"), 2).await.expect("page");
        assert_eq!((names(&second), more), (vec![3, 4], true));
        let (last, more) = db.page::<u64>("runs/", Some("r4"), 2).await.expect("page");
        assert_eq!((names(&last), more), (vec![5], false));
        // Exactly the rest: no more.
        let (rest, more) = db.page::<u64>("runs/", Some("r3"), 2).await.expect("page");
        assert_eq!((names(&rest), more), (vec![4, 5], false));
        // After a key that is gone (deleted between pages): the next one.
        let (after_gone, _) = db.page::<u64>("runs/", Some("r2a"), 1).await.expect("page");
        assert_eq!(names(&after_gone), vec![3]);
    }
}
