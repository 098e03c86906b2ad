//! Statuses a replica put into the status bucket, kept as it read them
//! until its status watch brings them back, so that each is read from
//! JSON once (issue 57).

use drover_model::model::JobStatus;

/// Statuses as the replica that put them read them, by revision, with
/// their keys; at most [`PARSED_STATUSES`], past which the watch reads
/// them from JSON again.
#[derive(Default)]
pub(crate) struct ParsedStatuses(std::collections::BTreeMap<u64, (String, Box<JobStatus>)>);

/// 16 for each of the 256 statuses the NATS link takes at once.
const PARSED_STATUSES: usize = 4096;

impl ParsedStatuses {
    pub(crate) fn keep(&mut self, revision: u64, key: String, status: Box<JobStatus>) {
        if self.0.len() < PARSED_STATUSES {
            self.0.insert(revision, (key, status));
        }
    }

    /// The status put at `revision` under `key`. Every one kept up to
    /// `revision` goes: one the watch passed before its put was answered
    /// is not kept past the watch's next status.
    pub(crate) fn take(&mut self, revision: u64, key: &str) -> Option<Box<JobStatus>> {
        let later = self.0.split_off(&(revision + 1));
        let (kept, status) = std::mem::replace(&mut self.0, later).remove(&revision)?;
        (kept == key).then_some(status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_model::{DeviceId, JobId};
    use jiff::Timestamp;

    fn status(seq: u64) -> Box<JobStatus> {
        Box::new(JobStatus {
            job_id: JobId::random(),
            device_id: DeviceId::new("d1".to_owned()).expect("id"),
            attempt: 1,
            kind: "system-upgrade".into(),
            state: drover_model::JobState::Running,
            steps: Vec::new(),
            error: None,
            output: None,
            accepted_at: Timestamp::UNIX_EPOCH,
            started_at: None,
            finished_at: None,
            boot_id: "b".into(),
            completion_heartbeat_at: None,
            seq,
            failure: None,
            reason: Vec::new(),
        })
    }

    #[test]
    fn a_kept_status_is_taken_once_by_its_revision_and_key() {
        let mut parsed = ParsedStatuses::default();
        parsed.keep(5, "d1.a".into(), status(1));
        parsed.keep(7, "d1.b".into(), status(2));
        // Another key at that revision (another stream's view) is not it.
        assert!(parsed.take(5, "d1.z").is_none());
        // Taken once: the revision is gone after it.
        assert_eq!(parsed.take(7, "d1.b").map(|s| s.seq), Some(2));
        assert!(parsed.take(7, "d1.b").is_none());
        assert!(parsed.0.is_empty());
    }

    #[test]
    fn a_status_the_watch_passed_before_it_was_kept_goes_at_the_next_one() {
        let mut parsed = ParsedStatuses::default();
        // The watch brought revision 3 before its put was answered.
        assert!(parsed.take(3, "d1.a").is_none());
        parsed.keep(3, "d1.a".into(), status(1));
        parsed.keep(4, "d1.b".into(), status(2));
        assert_eq!(parsed.take(4, "d1.b").map(|s| s.seq), Some(2));
        assert!(parsed.0.is_empty(), "revision 3 is not kept forever");
        // And the bound holds: past it nothing more is kept.
        for revision in 0..(PARSED_STATUSES as u64 + 10) {
            parsed.keep(revision + 10, format!("d1.{revision}"), status(revision));
        }
        assert_eq!(parsed.0.len(), PARSED_STATUSES);
    }
}
