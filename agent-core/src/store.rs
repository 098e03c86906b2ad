//! The agent's durable state: job records, the status outbox and a few
//! counters. Every write is one redb transaction committed with immediate
//! durability (fsync) before the caller acts on it or reports it (A4).

use crate::dbfile::{self, Checker};
use drover_model::ids::JobId;
use drover_model::layout::{JobStatusV1, JobStatusV2};
use drover_model::model::{Intent, JobStatus};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Where a job came from: fleet jobs never resume once terminal; local jobs
/// (`drover-agent upgrade`) may be resumed from their failed step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Origin {
    Fleet,
    Local,
}

/// Everything the agent keeps about one job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// None for a refused intent that could not be parsed.
    pub intent: Option<Intent>,
    pub status: JobStatus,
    pub origin: Origin,
    /// Arrival order (A2: queued jobs run in arrival order).
    pub arrival: u64,
    /// How many times the job was picked up again after the agent stopped
    /// while it ran (A10).
    pub resumes: u32,
    /// The boot id under which a reboot was requested, while awaiting it.
    pub reboot_from_boot: Option<String>,
}

impl JobRecord {
    /// A recorded refusal gives way to a valid intent of the same id: the
    /// control plane's own redelivery would have been refused the same way,
    /// so the refused copy was not its intent. A signed cancel's record does
    /// not: the control plane withdrew that job.
    pub fn gives_way(&self) -> bool {
        self.intent.is_none() && self.status.state == drover_model::model::JobState::Rejected
    }
}

/// A status waiting in the outbox until a transport confirms it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboxEntry {
    pub id: u64,
    pub status: JobStatus,
}

/// What the scans over every job need, kept beside each record (written in
/// the same transaction) so that admitting, picking, pruning and status
/// queries never decode whole records: a finished inventory carries up to
/// 100 KiB of package list, and with 200 of them kept every admission
/// decoded 20 MB and the agent's RSS reached 55 MiB (`drover-sim
/// footprint`, 1,000 inventory refreshes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSummary {
    pub job_id: JobId,
    pub state: drover_model::model::JobState,
    pub arrival: u64,
}

impl JobRecord {
    pub fn summary(&self) -> JobSummary {
        JobSummary {
            job_id: self.status.job_id,
            state: self.status.state,
            arrival: self.arrival,
        }
    }
}

#[derive(Serialize, Deserialize)]
enum StoredSummary {
    V1(JobSummary),
}

/// Records on disk are versioned enums: postcard writes the variant index
/// first, which is the schema version byte. V1 until statuses carried their
/// failure, V2 until they carried their reason lines, V3 since.
#[derive(Serialize, Deserialize)]
enum StoredJob {
    V1(JobRecordV1),
    V2(JobRecordV2),
    V3(JobRecord),
}

/// Frozen: a job's record as V1 wrote it. Never change it.
#[derive(Serialize, Deserialize)]
struct JobRecordV1 {
    intent: Option<Intent>,
    status: JobStatusV1,
    origin: Origin,
    arrival: u64,
    resumes: u32,
    reboot_from_boot: Option<String>,
}

impl From<JobRecordV1> for JobRecord {
    fn from(v1: JobRecordV1) -> Self {
        JobRecord {
            intent: v1.intent,
            status: v1.status.into(),
            origin: v1.origin,
            arrival: v1.arrival,
            resumes: v1.resumes,
            reboot_from_boot: v1.reboot_from_boot,
        }
    }
}

/// Frozen: a job's record as V2 wrote it. Never change it.
#[derive(Serialize, Deserialize)]
struct JobRecordV2 {
    intent: Option<Intent>,
    status: JobStatusV2,
    origin: Origin,
    arrival: u64,
    resumes: u32,
    reboot_from_boot: Option<String>,
}

impl From<JobRecordV2> for JobRecord {
    fn from(v2: JobRecordV2) -> Self {
        JobRecord {
            intent: v2.intent,
            status: v2.status.into(),
            origin: v2.origin,
            arrival: v2.arrival,
            resumes: v2.resumes,
            reboot_from_boot: v2.reboot_from_boot,
        }
    }
}

/// A status in the outbox: V1, V2 and V3 as for [`StoredJob`].
#[derive(Serialize, Deserialize)]
enum StoredStatus {
    V1(JobStatusV1),
    V2(JobStatusV2),
    V3(JobStatus),
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    File(#[from] dbfile::DbFileError),
    #[error("agent database error: {0}")]
    Db(String),
    /// The store's file system refused a read or write (full, or failing).
    #[error("agent database error: {0}")]
    Io(String),
    #[error("corrupt record in the agent database ({what}): {source}")]
    Corrupt {
        what: &'static str,
        #[source]
        source: postcard::Error,
    },
    #[error("cannot encode a record: {0}")]
    Encode(#[from] postcard::Error),
}

impl StoreError {
    /// The store's file system refused a write (full, or failing). redb then
    /// refuses every write until the database is opened again.
    pub fn is_io(&self) -> bool {
        matches!(self, StoreError::Io(_))
    }
}

macro_rules! db_err {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                // redb's I/O error, and every error after the first.
                match redb::Error::from(e) {
                    e @ (redb::Error::Io(_) | redb::Error::PreviousIo) => {
                        StoreError::Io(e.to_string())
                    }
                    e => StoreError::Db(e.to_string()),
                }
            }
        }
    )*};
}
db_err!(
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

/// The agent's storage, behind a trait so that another backend can be
/// measured beside redb (DESIGN.md: Stores).
pub trait Store: Send + Sync + 'static {
    fn job(&self, id: JobId) -> Result<Option<JobRecord>, StoreError>;
    /// All job records in arrival order.
    fn jobs(&self) -> Result<Vec<JobRecord>, StoreError>;
    /// Every job's summary in arrival order: what the scans need, without
    /// decoding the records.
    fn summaries(&self) -> Result<Vec<JobSummary>, StoreError>;
    /// Writes the record and, when `report` is set, appends its status to the
    /// outbox in the same durable transaction.
    fn save(&self, record: &JobRecord, report: bool) -> Result<(), StoreError>;
    /// Saves a job that just arrived, as `save` with its status reported,
    /// after giving it the next arrival number (A2's order) from a durable
    /// counter in the same transaction: one durable commit, not two.
    fn arrive(&self, record: &mut JobRecord) -> Result<(), StoreError>;
    /// The oldest unconfirmed statuses.
    fn outbox(&self, limit: usize) -> Result<Vec<OutboxEntry>, StoreError>;
    /// Drops a confirmed status from the outbox.
    fn outbox_ack(&self, id: u64) -> Result<(), StoreError>;
    /// Increments and returns a durable counter.
    fn next(&self, counter: &str) -> Result<u64, StoreError>;
    /// Removes the oldest terminal jobs beyond `keep` whose statuses left.
    fn prune(&self, keep: usize) -> Result<usize, StoreError>;
}

const JOBS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("jobs");
const OUTBOX: TableDefinition<u64, &[u8]> = TableDefinition::new("outbox");
const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");
const SUMMARIES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("summaries");

pub struct RedbStore {
    db: Database,
    /// The database's lock, held while the store is open.
    _hold: dbfile::Hold,
}

impl RedbStore {
    /// Opens the agent's database, checking it in this process.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_checked(path, &Checker::in_process("drover-agent reset-store"))
    }

    /// Opens the agent's database, or creates it; refuses an empty or
    /// damaged file by name (see [`crate::dbfile`]).
    pub fn open_checked(path: &Path, checker: &Checker) -> Result<Self, StoreError> {
        let (db, hold) = dbfile::open_or_create(path, checker, |db| {
            // Create the tables once so readers never meet a missing table.
            let init = || -> Result<(), StoreError> {
                let tx = db.begin_write()?;
                tx.open_table(JOBS)?;
                tx.open_table(OUTBOX)?;
                tx.open_table(COUNTERS)?;
                tx.open_table(SUMMARIES)?;
                tx.commit()?;
                Ok(())
            };
            init().map_err(|e| e.to_string())
        })?;
        let store = Self { db, _hold: hold };
        store.rebuild_summaries()?;
        Ok(store)
    }

    /// A database from before summaries were kept (or any whose summaries
    /// do not match its records) gets them made from the records, once.
    fn rebuild_summaries(&self) -> Result<(), StoreError> {
        use redb::ReadableTableMetadata;
        let tx = self.db.begin_write()?;
        {
            let jobs = tx.open_table(JOBS)?;
            let mut summaries = tx.open_table(SUMMARIES)?;
            if jobs.len()? == summaries.len()? {
                return Ok(());
            }
            summaries.retain(|_, _| false)?;
            for item in jobs.iter()? {
                let (key, bytes) = item?;
                let record = decode_job(bytes.value())?;
                summaries.insert(key.value(), encode_summary(&record)?.as_slice())?;
            }
        }
        tx.commit()?;
        Ok(())
    }
}

/// The store this build of the agent uses unless its config names another.
pub const STORE_NAME: &str = "redb";

/// A stored record's layout version, borrowed for encoding: postcard
/// writes the variant index and then the value, the same bytes as
/// `StoredJob::V3` and its siblings, without cloning the record first.
#[derive(Serialize)]
enum Layout<'a, T> {
    V1(&'a T),
    #[allow(dead_code)] // holds V2's place: the index is the version
    V2(&'a T),
    V3(&'a T),
}

fn encode<T: Serialize>(value: Layout<'_, T>) -> Result<Vec<u8>, StoreError> {
    Ok(postcard::to_stdvec(&value)?)
}

fn decode<S: serde::de::DeserializeOwned>(
    bytes: &[u8],
    what: &'static str,
) -> Result<S, StoreError> {
    postcard::from_bytes(bytes).map_err(|source| StoreError::Corrupt { what, source })
}

pub(crate) fn encode_job(record: &JobRecord) -> Result<Vec<u8>, StoreError> {
    encode(Layout::V3(record))
}

pub(crate) fn decode_job(bytes: &[u8]) -> Result<JobRecord, StoreError> {
    Ok(match decode(bytes, "job")? {
        StoredJob::V1(v1) => v1.into(),
        StoredJob::V2(v2) => v2.into(),
        StoredJob::V3(record) => record,
    })
}

pub(crate) fn encode_summary(record: &JobRecord) -> Result<Vec<u8>, StoreError> {
    encode(Layout::V1(&record.summary()))
}

pub(crate) fn decode_summary(bytes: &[u8]) -> Result<JobSummary, StoreError> {
    let StoredSummary::V1(summary) = decode(bytes, "job summary")?;
    Ok(summary)
}

pub(crate) fn encode_status(status: &JobStatus) -> Result<Vec<u8>, StoreError> {
    encode(Layout::V3(status))
}

pub(crate) fn decode_status(bytes: &[u8]) -> Result<JobStatus, StoreError> {
    Ok(match decode(bytes, "outbox")? {
        StoredStatus::V1(v1) => v1.into(),
        StoredStatus::V2(v2) => v2.into(),
        StoredStatus::V3(status) => status,
    })
}

/// The jobs `prune` removes: the oldest terminal ones beyond `keep` whose
/// statuses have all left the outbox.
pub(crate) fn doomed(
    summaries: Vec<JobSummary>,
    outbox: Vec<OutboxEntry>,
    keep: usize,
) -> Vec<JobId> {
    let pending: std::collections::HashSet<JobId> =
        outbox.into_iter().map(|e| e.status.job_id).collect();
    let terminal: Vec<JobId> = summaries
        .iter()
        .filter(|j| j.state.is_terminal() && !pending.contains(&j.job_id))
        .map(|j| j.job_id)
        .collect();
    let excess = terminal.len().saturating_sub(keep);
    terminal[..excess].to_vec()
}

/// Writes a job's record, its summary when it changed and, when `report`
/// is set, its status to the outbox, in `tx`.
fn put(tx: &redb::WriteTransaction, record: &JobRecord, report: bool) -> Result<(), StoreError> {
    let job_bytes = encode_job(record)?;
    let summary_bytes = encode_summary(record)?;
    let mut jobs = tx.open_table(JOBS)?;
    jobs.insert(
        record.status.job_id.as_bytes().as_slice(),
        job_bytes.as_slice(),
    )?;
    // Written only when it changed (the job's state): an unchanged table
    // costs no page in this commit.
    let mut summaries = tx.open_table(SUMMARIES)?;
    let key = record.status.job_id.as_bytes();
    let unchanged = summaries
        .get(key.as_slice())?
        .is_some_and(|stored| stored.value() == summary_bytes.as_slice());
    if !unchanged {
        summaries.insert(key.as_slice(), summary_bytes.as_slice())?;
    }
    if report {
        // Ids come from a durable counter, never from the table's last key:
        // an emptied outbox must not hand out an id again.
        let mut counters = tx.open_table(COUNTERS)?;
        let next_id = counters.get("outbox")?.map(|v| v.value()).unwrap_or(0) + 1;
        counters.insert("outbox", next_id)?;
        let mut outbox = tx.open_table(OUTBOX)?;
        let bytes = encode_status(&record.status)?;
        outbox.insert(next_id, bytes.as_slice())?;
    }
    Ok(())
}

impl Store for RedbStore {
    fn job(&self, id: JobId) -> Result<Option<JobRecord>, StoreError> {
        let tx = self.db.begin_read()?;
        let table = tx.open_table(JOBS)?;
        match table.get(id.as_bytes().as_slice())? {
            Some(bytes) => Ok(Some(decode_job(bytes.value())?)),
            None => Ok(None),
        }
    }

    fn jobs(&self) -> Result<Vec<JobRecord>, StoreError> {
        let tx = self.db.begin_read()?;
        let table = tx.open_table(JOBS)?;
        let mut records = Vec::new();
        for item in table.iter()? {
            let (_, bytes) = item?;
            records.push(decode_job(bytes.value())?);
        }
        records.sort_by_key(|r| r.arrival);
        Ok(records)
    }

    fn summaries(&self) -> Result<Vec<JobSummary>, StoreError> {
        let tx = self.db.begin_read()?;
        let table = tx.open_table(SUMMARIES)?;
        let mut summaries = Vec::new();
        for item in table.iter()? {
            let (_, bytes) = item?;
            summaries.push(decode_summary(bytes.value())?);
        }
        summaries.sort_by_key(|j| j.arrival);
        Ok(summaries)
    }

    fn save(&self, record: &JobRecord, report: bool) -> Result<(), StoreError> {
        let tx = self.db.begin_write()?;
        put(&tx, record, report)?;
        tx.commit()?;
        Ok(())
    }

    fn arrive(&self, record: &mut JobRecord) -> Result<(), StoreError> {
        let tx = self.db.begin_write()?;
        {
            let mut counters = tx.open_table(COUNTERS)?;
            let arrival = counters.get("arrival")?.map(|v| v.value()).unwrap_or(0) + 1;
            counters.insert("arrival", arrival)?;
            record.arrival = arrival;
        }
        put(&tx, record, true)?;
        tx.commit()?;
        Ok(())
    }

    fn outbox(&self, limit: usize) -> Result<Vec<OutboxEntry>, StoreError> {
        let tx = self.db.begin_read()?;
        let table = tx.open_table(OUTBOX)?;
        let mut entries = Vec::new();
        for item in table.iter()?.take(limit) {
            let (id, bytes) = item?;
            entries.push(OutboxEntry {
                id: id.value(),
                status: decode_status(bytes.value())?,
            });
        }
        Ok(entries)
    }

    fn outbox_ack(&self, id: u64) -> Result<(), StoreError> {
        let mut tx = self.db.begin_write()?;
        // Not flushed on its own: an acknowledgement lost to a crash only
        // sends its status again, which the control plane drops as a
        // duplicate (same sequence). The next durable commit (a job's next
        // state change) carries it to disk. On an SD card this saves a
        // forced flush per status.
        tx.set_durability(redb::Durability::None)
            .map_err(|e| StoreError::Db(e.to_string()))?;
        tx.open_table(OUTBOX)?.remove(id)?;
        tx.commit()?;
        Ok(())
    }

    fn next(&self, counter: &str) -> Result<u64, StoreError> {
        let tx = self.db.begin_write()?;
        let value = {
            let mut table = tx.open_table(COUNTERS)?;
            let value = table.get(counter)?.map(|v| v.value()).unwrap_or(0) + 1;
            table.insert(counter, value)?;
            value
        };
        tx.commit()?;
        Ok(value)
    }

    fn prune(&self, keep: usize) -> Result<usize, StoreError> {
        let doomed = doomed(self.summaries()?, self.outbox(usize::MAX)?, keep);
        if doomed.is_empty() {
            return Ok(0);
        }
        let tx = self.db.begin_write()?;
        {
            let mut jobs = tx.open_table(JOBS)?;
            let mut summaries = tx.open_table(SUMMARIES)?;
            for id in &doomed {
                jobs.remove(id.as_bytes().as_slice())?;
                summaries.remove(id.as_bytes().as_slice())?;
            }
        }
        tx.commit()?;
        Ok(doomed.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_model::ids::DeviceId;
    use drover_model::model::{JobState, JobStatus};

    pub(crate) fn status(state: JobState) -> JobStatus {
        JobStatus {
            job_id: JobId::random(),
            device_id: DeviceId::new("device-1").expect("valid"),
            attempt: 1,
            kind: "systemUpgradeV1".into(),
            state,
            steps: vec![],
            error: None,
            output: None,
            accepted_at: jiff::Timestamp::UNIX_EPOCH,
            started_at: None,
            finished_at: None,
            boot_id: "boot-a".into(),
            completion_heartbeat_at: None,
            seq: 1,
            failure: None,
            reason: Vec::new(),
        }
    }

    fn record(state: JobState, arrival: u64) -> JobRecord {
        JobRecord {
            intent: None,
            status: status(state),
            origin: Origin::Fleet,
            arrival,
            resumes: 0,
            reboot_from_boot: None,
        }
    }

    type Opener = fn(&Path) -> Box<dyn Store>;

    /// Every store this build has, each opened at a path.
    fn stores() -> Vec<(&'static str, Opener)> {
        #[allow(unused_mut)]
        let mut stores: Vec<(&'static str, Opener)> =
            vec![("redb", |p| Box::new(RedbStore::open(p).expect("open redb")))];
        #[cfg(feature = "sled-store")]
        stores.push(("sled", |p| {
            Box::new(crate::store_sled::SledStore::open(p).expect("open sled"))
        }));
        stores
    }

    #[test]
    fn records_and_outbox_survive_reopening() {
        for (name, open) in stores() {
            eprintln!("{name}");
            records_and_outbox_survive_reopening_in(open);
        }
    }

    fn records_and_outbox_survive_reopening_in(open: Opener) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("agent.store");
        let first = record(JobState::Accepted, 2);
        let second = record(JobState::Succeeded, 1);
        {
            let store = open(&path);
            store.save(&first, true).expect("save");
            store.save(&second, false).expect("save");
            assert_eq!(store.next("heartbeat").expect("counter"), 1);
            assert_eq!(store.next("heartbeat").expect("counter"), 2);
        }
        let store = open(&path);
        let jobs = store.jobs().expect("jobs");
        assert_eq!(jobs, vec![second.clone(), first.clone()], "arrival order");
        assert_eq!(
            store.summaries().expect("summaries"),
            vec![second.summary(), first.summary()],
            "a summary per record, in arrival order"
        );
        let outbox = store.outbox(10).expect("outbox");
        assert_eq!(outbox.len(), 1);
        assert_eq!(outbox[0].status, first.status);
        store.outbox_ack(outbox[0].id).expect("ack");
        assert!(store.outbox(10).expect("outbox").is_empty());
        store.save(&first, true).expect("save again");
        let again = store.outbox(10).expect("outbox");
        assert!(
            again[0].id > outbox[0].id,
            "an emptied outbox never reuses an id"
        );
        assert_eq!(store.next("heartbeat").expect("counter"), 3);
    }

    #[test]
    fn an_arriving_job_takes_the_next_arrival_number_with_its_record() {
        for (name, open) in stores() {
            eprintln!("{name}");
            an_arriving_job_takes_the_next_arrival_number_with_its_record_in(open);
        }
    }

    fn an_arriving_job_takes_the_next_arrival_number_with_its_record_in(open: Opener) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("agent.store");
        let mut first = record(JobState::Accepted, 0);
        {
            let store = open(&path);
            // The counter a store from before `arrive` kept goes on.
            assert_eq!(store.next("arrival").expect("counter"), 1);
            store.arrive(&mut first).expect("arrive");
            assert_eq!(first.arrival, 2);
        }
        let store = open(&path);
        assert_eq!(
            store.job(first.status.job_id).expect("job"),
            Some(first.clone())
        );
        assert_eq!(store.summaries().expect("summaries"), vec![first.summary()]);
        let outbox = store.outbox(10).expect("outbox");
        assert_eq!(outbox.len(), 1, "an arriving job's status is reported");
        assert_eq!(outbox[0].status, first.status);
        let mut second = record(JobState::Waiting, 0);
        store.arrive(&mut second).expect("arrive");
        assert_eq!(second.arrival, 3, "numbers survive reopening");
        let order: Vec<JobId> = store
            .jobs()
            .expect("jobs")
            .iter()
            .map(|r| r.status.job_id)
            .collect();
        assert_eq!(order, vec![first.status.job_id, second.status.job_id]);
    }

    #[test]
    fn prune_keeps_recent_and_unreported_jobs() {
        for (name, open) in stores() {
            eprintln!("{name}");
            prune_keeps_recent_and_unreported_jobs_in(open);
        }
    }

    fn prune_keeps_recent_and_unreported_jobs_in(open: Opener) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(&dir.path().join("agent.store"));
        for arrival in 0..5 {
            store
                .save(&record(JobState::Succeeded, arrival), false)
                .expect("save");
        }
        let unreported = record(JobState::Failed, 5);
        store.save(&unreported, true).expect("save");
        let running = record(JobState::Running, 6);
        store.save(&running, false).expect("save");
        assert_eq!(store.prune(2).expect("prune"), 3);
        let left: Vec<u64> = store
            .jobs()
            .expect("jobs")
            .iter()
            .map(|r| r.arrival)
            .collect();
        assert_eq!(left, vec![3, 4, 5, 6]);
        let summarised: Vec<u64> = store
            .summaries()
            .expect("summaries")
            .iter()
            .map(|j| j.arrival)
            .collect();
        assert_eq!(
            summarised, left,
            "pruned records take their summaries along"
        );
    }

    #[test]
    fn records_are_encoded_as_the_versioned_enums_wrote_them() {
        let job = record(JobState::Running, 3);
        assert_eq!(
            encode_job(&job).expect("encode"),
            postcard::to_stdvec(&StoredJob::V3(job.clone())).expect("postcard")
        );
        assert_eq!(
            encode_status(&job.status).expect("encode"),
            postcard::to_stdvec(&StoredStatus::V3(job.status.clone())).expect("postcard")
        );
        assert_eq!(
            decode_summary(&encode_summary(&job).expect("encode")).expect("decode"),
            job.summary()
        );
    }

    #[test]
    fn a_database_without_summaries_gets_them_from_its_records() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("agent.redb");
        let running = record(JobState::Running, 7);
        {
            // The layout before summaries: jobs, outbox and counters only.
            let db = redb::Database::create(&path).expect("create");
            let tx = db.begin_write().expect("tx");
            {
                let mut jobs = tx.open_table(JOBS).expect("jobs");
                jobs.insert(
                    running.status.job_id.as_bytes().as_slice(),
                    encode_job(&running).expect("encode").as_slice(),
                )
                .expect("insert");
                tx.open_table(OUTBOX).expect("outbox");
                tx.open_table(COUNTERS).expect("counters");
            }
            tx.commit().expect("commit");
        }
        let store = RedbStore::open(&path).expect("open");
        assert_eq!(
            store.summaries().expect("summaries"),
            vec![running.summary()]
        );
    }

    #[test]
    fn a_corrupt_file_is_a_clear_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("agent.redb");
        std::fs::write(&path, b"this is not a database").expect("write");
        let err = RedbStore::open(&path).err().expect("must fail");
        let message = err.to_string();
        assert!(
            message.contains("is damaged") && message.contains("agent.redb"),
            "{message}"
        );
        assert!(message.contains("drover-agent reset-store"), "{message}");
        // An empty file is refused, not taken as a new store.
        std::fs::write(&path, b"").expect("truncate");
        let err = RedbStore::open(&path).err().expect("must fail");
        assert!(err.to_string().contains("is empty (0 bytes)"), "{err}");
        // A new one is made whole, mode 0600.
        let fresh = dir.path().join("new.redb");
        RedbStore::open(&fresh).expect("created");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&fresh)
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!dir.path().join("new.redb.new").exists());
    }
}
