//! When the agent assesses on its own (issue 31): a `patchAssessmentV1`
//! local job every period (a day by default), and at once after every job
//! that changed packages (an upgrade or a package install, once it is
//! decided, so after its reboot). The first one after the agent starts
//! waits an offset derived from the device id, up to an eighth of the
//! period, so a fleet installed or restarted together does not hit its
//! mirrors at once; after that each device keeps its own phase. The jobs go
//! through the agent's queue like any other, so an assessment never runs
//! beside a job; one queued or running is never doubled. The rule is pure
//! over the jobs the agent keeps; the loop that applies it lives with the
//! binary.

use drover_model::DeviceId;
use drover_model::model::JobStatus;
use jiff::{SignedDuration, Timestamp};

/// The kinds whose end makes an assessment due at once.
const CHANGES_PACKAGES: [&str; 2] = ["systemUpgradeV1", "packageInstallV1"];
const KIND: &str = "patchAssessmentV1";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// The period between assessments.
    pub every: SignedDuration,
    /// This device's wait before its first assessment after a start.
    pub offset: SignedDuration,
}

impl Schedule {
    /// A schedule of `every` for this device, its offset spread over the
    /// first eighth of the period by a hash of its id (FNV-1a: stable
    /// across builds and architectures).
    pub fn for_device(device: &DeviceId, every: SignedDuration) -> Self {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in device.as_str().bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        let spread = (every.as_secs() / 8).max(1) as u64;
        let offset = SignedDuration::from_secs((hash % spread) as i64);
        Self { every, offset }
    }
}

/// When the next assessment is due, or `None` while one is queued or
/// running. `jobs` are the jobs the agent keeps (any order); `started` is
/// when this agent process started.
pub fn next_due(jobs: &[JobStatus], started: Timestamp, schedule: &Schedule) -> Option<Timestamp> {
    let ended = |job: &JobStatus| job.finished_at.unwrap_or(job.accepted_at);
    if jobs
        .iter()
        .any(|j| j.kind == KIND && !j.state.is_terminal())
    {
        return None;
    }
    let last_assessment = jobs.iter().filter(|j| j.kind == KIND).map(ended).max();
    let last_change = jobs
        .iter()
        .filter(|j| CHANGES_PACKAGES.contains(&j.kind.as_str()) && j.state.is_terminal())
        .map(ended)
        .max();
    match (last_assessment, last_change) {
        // Packages changed since the last assessment (or before any).
        (None, Some(change)) => Some(change),
        (Some(last), Some(change)) if change > last => Some(change),
        (Some(last), _) => Some(last.checked_add(schedule.every).unwrap_or(Timestamp::MAX)),
        (None, None) => Some(
            started
                .checked_add(schedule.offset)
                .unwrap_or(Timestamp::MAX),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_model::model::JobState;

    fn t(text: &str) -> Timestamp {
        text.parse().expect("time")
    }

    fn job(kind: &str, state: JobState, finished: Option<&str>) -> JobStatus {
        JobStatus {
            job_id: drover_model::JobId::random(),
            device_id: DeviceId::new("pi-1").expect("id"),
            attempt: 1,
            kind: kind.into(),
            state,
            steps: Vec::new(),
            error: None,
            output: None,
            accepted_at: t("2026-12-01T00:00:00Z"),
            started_at: None,
            finished_at: finished.map(t),
            boot_id: "b".into(),
            completion_heartbeat_at: None,
            seq: 1,
            failure: None,
            reason: Vec::new(),
        }
    }

    #[test]
    fn due_after_the_offset_the_period_and_every_change_of_packages() {
        let schedule = Schedule {
            every: SignedDuration::from_hours(24),
            offset: SignedDuration::from_mins(42),
        };
        let started = t("2026-12-03T10:00:00Z");
        // Never assessed, nothing changed: the device's offset after start.
        assert_eq!(
            next_due(&[], started, &schedule),
            Some(t("2026-12-03T10:42:00Z"))
        );
        // Assessed yesterday: a day after it (its phase kept).
        let assessed = job(KIND, JobState::Succeeded, Some("2026-12-02T08:00:00Z"));
        assert_eq!(
            next_due(std::slice::from_ref(&assessed), started, &schedule),
            Some(t("2026-12-03T08:00:00Z"))
        );
        // A failed assessment counts too (a broken mirror is tried again
        // next period, not in a loop).
        let failed = job(KIND, JobState::Failed, Some("2026-12-02T08:00:00Z"));
        assert_eq!(
            next_due(&[failed], started, &schedule),
            Some(t("2026-12-03T08:00:00Z"))
        );
        // An upgrade ended after it: due at once (its end).
        let upgraded = job(
            "systemUpgradeV1",
            JobState::Succeeded,
            Some("2026-12-02T09:00:00Z"),
        );
        assert_eq!(
            next_due(&[assessed.clone(), upgraded.clone()], started, &schedule),
            Some(t("2026-12-02T09:00:00Z"))
        );
        // A package install that failed changed packages too, perhaps.
        let install = job(
            "packageInstallV1",
            JobState::Failed,
            Some("2026-12-02T07:00:00Z"),
        );
        assert_eq!(
            next_due(std::slice::from_ref(&install), started, &schedule),
            Some(t("2026-12-02T07:00:00Z"))
        );
        // An upgrade still awaiting its reboot: not yet.
        let rebooting = job("systemUpgradeV1", JobState::AwaitingReboot, None);
        assert_eq!(
            next_due(&[assessed.clone(), rebooting], started, &schedule),
            Some(t("2026-12-03T08:00:00Z"))
        );
        // An inventory changes nothing.
        let inventory = job(
            "inventoryRefreshV1",
            JobState::Succeeded,
            Some("2026-12-02T09:30:00Z"),
        );
        assert_eq!(
            next_due(&[assessed.clone(), inventory], started, &schedule),
            Some(t("2026-12-03T08:00:00Z"))
        );
        // One queued or running: none more.
        for state in [JobState::Accepted, JobState::Waiting, JobState::Running] {
            let pending = job(KIND, state, None);
            assert_eq!(
                next_due(&[upgraded.clone(), pending], started, &schedule),
                None
            );
        }
    }

    #[test]
    fn offsets_spread_over_the_first_eighth_of_the_period() {
        let every = SignedDuration::from_hours(24);
        let offsets: Vec<i64> = (0..1000)
            .map(|i| {
                let device = DeviceId::new(format!("pi-{i:04}")).expect("id");
                Schedule::for_device(&device, every).offset.as_secs()
            })
            .collect();
        assert!(offsets.iter().all(|o| (0..3 * 3600).contains(o)));
        // Spread: every half hour of the three gets some devices.
        for slot in 0..6 {
            let count = offsets
                .iter()
                .filter(|o| (slot * 1800..(slot + 1) * 1800).contains(*o))
                .count();
            assert!(count > 100, "slot {slot}: {count}");
        }
        // Stable for a device.
        let device = DeviceId::new("pi-kitchen").expect("id");
        assert_eq!(
            Schedule::for_device(&device, every),
            Schedule::for_device(&device, every)
        );
    }
}
