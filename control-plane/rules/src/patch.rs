//! Each device's latest patch assessment as the control plane keeps it
//! (`assessments/<device>`, issue 31), and since when each pending security
//! update has waited. An assessment comes from a `patchAssessmentV1` job,
//! whether the control plane sent it (a Deployment) or the agent ran it on
//! its own; the newest one the device finished wins, whatever order they
//! arrive in. A security update counts as waiting since the first
//! assessment that saw it pending, and stops counting once one does not.

use drover_model::DeviceId;
use drover_model::model::PatchAssessment;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceAssessment {
    pub device: DeviceId,
    /// When the device finished the assessment (its clock; orders a
    /// device's own assessments only).
    pub finished_at: Timestamp,
    /// When the control plane received it (its clock: what ages are
    /// counted from).
    pub received_at: Timestamp,
    pub assessment: PatchAssessment,
    /// Each pending security update (by package) and the control plane's
    /// time of the first assessment that found it pending.
    pub security_since: BTreeMap<String, Timestamp>,
}

pub fn assessment_key(device: &DeviceId) -> String {
    format!("assessments/{device}")
}

impl DeviceAssessment {
    /// Since when the oldest pending security update has waited.
    pub fn oldest_security(&self) -> Option<Timestamp> {
        self.security_since.values().min().copied()
    }
}

/// The record after a new assessment, or `None` when the one kept is newer
/// (an older report that arrived late changes nothing).
pub fn next(
    previous: Option<&DeviceAssessment>,
    device: &DeviceId,
    assessment: PatchAssessment,
    finished_at: Timestamp,
    received_at: Timestamp,
) -> Option<DeviceAssessment> {
    if previous.is_some_and(|p| p.finished_at >= finished_at) {
        return None;
    }
    let security_since = assessment
        .pending
        .iter()
        .filter(|p| p.security)
        .map(|p| {
            let since = previous
                .and_then(|prev| prev.security_since.get(&p.name))
                .copied()
                .unwrap_or(received_at);
            (p.name.clone(), since)
        })
        .collect();
    Some(DeviceAssessment {
        device: device.clone(),
        finished_at,
        received_at,
        assessment,
        security_since,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_model::model::PendingPackage;

    fn t(text: &str) -> Timestamp {
        text.parse().expect("time")
    }

    fn pending(names: &[(&str, bool)]) -> PatchAssessment {
        PatchAssessment {
            upgradable: names.len() as u32,
            security: names.iter().filter(|(_, s)| *s).count() as u32,
            security_archive: true,
            pending: names
                .iter()
                .map(|(name, security)| PendingPackage {
                    name: (*name).into(),
                    from: Some("1".into()),
                    to: "2".into(),
                    security: *security,
                })
                .collect(),
            ..PatchAssessment::default()
        }
    }

    #[test]
    fn security_updates_wait_from_the_first_assessment_that_saw_them() {
        let device = DeviceId::new("pi-1").expect("id");
        let day1 = next(
            None,
            &device,
            pending(&[("openssl", true), ("vim", false)]),
            t("2026-12-01T03:00:00Z"),
            t("2026-12-01T03:00:05Z"),
        )
        .expect("first");
        assert_eq!(day1.oldest_security(), Some(t("2026-12-01T03:00:05Z")));
        assert!(!day1.security_since.contains_key("vim"));
        // Day 2: openssl still pending (keeps its day), libc6 new.
        let day2 = next(
            Some(&day1),
            &device,
            pending(&[("openssl", true), ("libc6", true)]),
            t("2026-12-02T03:00:00Z"),
            t("2026-12-02T03:00:04Z"),
        )
        .expect("second");
        assert_eq!(
            day2.security_since,
            BTreeMap::from([
                ("libc6".to_owned(), t("2026-12-02T03:00:04Z")),
                ("openssl".to_owned(), t("2026-12-01T03:00:05Z")),
            ])
        );
        assert_eq!(day2.oldest_security(), Some(t("2026-12-01T03:00:05Z")));
        // An older assessment arriving late changes nothing.
        assert_eq!(
            next(
                Some(&day2),
                &device,
                pending(&[]),
                t("2026-12-01T12:00:00Z"),
                t("2026-12-02T04:00:00Z"),
            ),
            None
        );
        // Upgraded: nothing waits any more; a later return starts afresh.
        let day3 = next(
            Some(&day2),
            &device,
            pending(&[]),
            t("2026-12-03T03:00:00Z"),
            t("2026-12-03T03:00:02Z"),
        )
        .expect("third");
        assert_eq!(day3.oldest_security(), None);
        let day4 = next(
            Some(&day3),
            &device,
            pending(&[("openssl", true)]),
            t("2026-12-04T03:00:00Z"),
            t("2026-12-04T03:00:01Z"),
        )
        .expect("fourth");
        assert_eq!(day4.oldest_security(), Some(t("2026-12-04T03:00:01Z")));
    }
}
