//! sled 0.34 behind the same [`Store`] trait as redb, so that the choice of
//! store is measured rather than assumed (`drover-sim footprint --variant`).
//! Built only with the `sled-store` feature; the agent's `store = "sled"`
//! selects it. Same records, same guarantees: a state change is in sled's
//! log and flushed (`Db::flush`, an fsync) before `save` returns; an
//! acknowledgement is not flushed on its own, as in [`RedbStore`].
//!
//! Not covered: redb's damaged-file check in a child process
//! ([`crate::dbfile`]); a damaged sled directory is whatever sled reports.
//!
//! [`RedbStore`]: crate::store::RedbStore

use crate::store::{
    JobRecord, JobSummary, OutboxEntry, Store, StoreError, decode_job, decode_status,
    decode_summary, doomed, encode_job, encode_status, encode_summary,
};
use drover_model::ids::JobId;
use sled::Transactional;
use sled::transaction::{ConflictableTransactionError, TransactionError};
use std::path::Path;

pub struct SledStore {
    db: sled::Db,
    jobs: sled::Tree,
    summaries: sled::Tree,
    outbox: sled::Tree,
    counters: sled::Tree,
}

fn db_err(e: sled::Error) -> StoreError {
    match e {
        sled::Error::Io(io) => StoreError::Io(format!("I/O error: {io}")),
        other => StoreError::Db(other.to_string()),
    }
}

fn tx_err(e: TransactionError<()>) -> StoreError {
    match e {
        TransactionError::Storage(e) => db_err(e),
        TransactionError::Abort(()) => StoreError::Db("transaction aborted".into()),
    }
}

fn counter_value(bytes: Option<sled::IVec>) -> u64 {
    bytes
        .and_then(|b| <[u8; 8]>::try_from(b.as_ref()).ok())
        .map_or(0, u64::from_be_bytes)
}

impl SledStore {
    /// Opens the sled directory at `path`, or creates it (mode 0700).
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = sled::Config::new()
            .path(path)
            // Every state change is flushed by the store itself before it
            // is reported; no background flusher thread is needed.
            .flush_every_ms(None)
            .open()
            .map_err(db_err)?;
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700));
        }
        let tree = |name: &str| db.open_tree(name).map_err(db_err);
        Ok(Self {
            jobs: tree("jobs")?,
            summaries: tree("summaries")?,
            outbox: tree("outbox")?,
            counters: tree("counters")?,
            db,
        })
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().map_err(db_err)?;
        Ok(())
    }

    /// Writes the record, its summary and, when `report` is set, its status
    /// to the outbox in one transaction, first giving it the next arrival
    /// number when `arrive` is set; flushes; returns the arrival number.
    fn put(&self, record: &JobRecord, report: bool, arrive: bool) -> Result<u64, StoreError> {
        let status_bytes = if report {
            Some(encode_status(&record.status)?)
        } else {
            None
        };
        let key = record.status.job_id.as_bytes();
        let arrival = (&self.jobs, &self.summaries, &self.outbox, &self.counters)
            .transaction(|(jobs, summaries, outbox, counters)| {
                let mut record = record.clone();
                if arrive {
                    record.arrival = counter_value(counters.get("arrival")?) + 1;
                    counters.insert("arrival", &record.arrival.to_be_bytes())?;
                }
                let abort = |_| ConflictableTransactionError::Abort(());
                let job_bytes = encode_job(&record).map_err(abort)?;
                let summary_bytes = encode_summary(&record).map_err(abort)?;
                jobs.insert(key.as_slice(), job_bytes.as_slice())?;
                summaries.insert(key.as_slice(), summary_bytes.as_slice())?;
                if let Some(bytes) = &status_bytes {
                    // Ids from a durable counter, as in redb: an emptied
                    // outbox never hands out an id again.
                    let next = counter_value(counters.get("outbox")?) + 1;
                    counters.insert("outbox", &next.to_be_bytes())?;
                    outbox.insert(&next.to_be_bytes(), bytes.as_slice())?;
                }
                Ok::<u64, ConflictableTransactionError<()>>(record.arrival)
            })
            .map_err(tx_err)?;
        self.flush()?;
        Ok(arrival)
    }
}

impl Store for SledStore {
    fn job(&self, id: JobId) -> Result<Option<JobRecord>, StoreError> {
        match self.jobs.get(id.as_bytes()).map_err(db_err)? {
            Some(bytes) => Ok(Some(decode_job(&bytes)?)),
            None => Ok(None),
        }
    }

    fn jobs(&self) -> Result<Vec<JobRecord>, StoreError> {
        let mut records = Vec::new();
        for item in self.jobs.iter() {
            let (_, bytes) = item.map_err(db_err)?;
            records.push(decode_job(&bytes)?);
        }
        records.sort_by_key(|r| r.arrival);
        Ok(records)
    }

    fn summaries(&self) -> Result<Vec<JobSummary>, StoreError> {
        let mut summaries = Vec::new();
        for item in self.summaries.iter() {
            let (_, bytes) = item.map_err(db_err)?;
            summaries.push(decode_summary(&bytes)?);
        }
        summaries.sort_by_key(|j| j.arrival);
        Ok(summaries)
    }

    fn save(&self, record: &JobRecord, report: bool) -> Result<(), StoreError> {
        self.put(record, report, false).map(drop)
    }

    fn arrive(&self, record: &mut JobRecord) -> Result<(), StoreError> {
        let arrival = self.put(record, true, true)?;
        record.arrival = arrival;
        Ok(())
    }

    fn outbox(&self, limit: usize) -> Result<Vec<OutboxEntry>, StoreError> {
        let mut entries = Vec::new();
        for item in self.outbox.iter().take(limit) {
            let (id, bytes) = item.map_err(db_err)?;
            entries.push(OutboxEntry {
                id: counter_value(Some(id)),
                status: decode_status(&bytes)?,
            });
        }
        Ok(entries)
    }

    fn outbox_ack(&self, id: u64) -> Result<(), StoreError> {
        // Not flushed on its own (see RedbStore::outbox_ack).
        self.outbox.remove(id.to_be_bytes()).map_err(db_err)?;
        Ok(())
    }

    fn next(&self, counter: &str) -> Result<u64, StoreError> {
        let value = self
            .counters
            .update_and_fetch(counter, |old| {
                Some(
                    (counter_value(old.map(sled::IVec::from)) + 1)
                        .to_be_bytes()
                        .to_vec(),
                )
            })
            .map_err(db_err)?;
        self.flush()?;
        Ok(counter_value(value))
    }

    fn prune(&self, keep: usize) -> Result<usize, StoreError> {
        let doomed = doomed(self.summaries()?, self.outbox(usize::MAX)?, keep);
        if doomed.is_empty() {
            return Ok(0);
        }
        (&self.jobs, &self.summaries)
            .transaction(|(jobs, summaries)| {
                for id in &doomed {
                    jobs.remove(id.as_bytes().as_slice())?;
                    summaries.remove(id.as_bytes().as_slice())?;
                }
                Ok::<(), ConflictableTransactionError<()>>(())
            })
            .map_err(tx_err)?;
        self.flush()?;
        Ok(doomed.len())
    }
}
