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
    /// While a reboot is pending: the control plane's time of the first
    /// assessment that found it so.
    pub reboot_since: Option<Timestamp>,
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
    let reboot_since = assessment.reboot_pending.as_ref().map(|_| {
        previous
            .and_then(|prev| prev.reboot_since)
            .unwrap_or(received_at)
    });
    Some(DeviceAssessment {
        device: device.clone(),
        finished_at,
        received_at,
        assessment,
        security_since,
        reboot_since,
    })
}

/// The prefix of the labels the control plane maintains; a manifest may not
/// set one.
pub const MAINTAINED_PREFIX: &str = "drover.io/";
/// `pending` while the latest assessment found a security update pending,
/// else `none` (absent before the first assessment).
pub const SECURITY_LABEL: &str = "drover.io/security-updates";
/// `pending` while the latest assessment found a reboot pending, else `none`.
pub const REBOOT_LABEL: &str = "drover.io/reboot";

impl DeviceAssessment {
    /// The labels the control plane maintains from this assessment: a
    /// selector or filter matches them like the operator's own, so "every
    /// production device with security updates pending" is
    /// `allowedGroups: [production]` and `matchLabels:
    /// {drover.io/security-updates: pending}` with the placement rule
    /// (groups AND labels) unchanged.
    pub fn maintained_labels(&self) -> [(&'static str, &'static str); 2] {
        let state = |pending: bool| if pending { "pending" } else { "none" };
        [
            (SECURITY_LABEL, state(self.assessment.security > 0)),
            (
                REBOOT_LABEL,
                state(self.assessment.reboot_pending.is_some()),
            ),
        ]
    }
}

/// The patch states a fleet listing filters by (the dashboard's select,
/// `GET /devices/page?patch=`).
pub const PATCH_FILTERS: [&str; 5] = [
    "up_to_date",
    "updates",
    "security",
    "reboot",
    "not_assessed",
];

/// Whether a device's latest assessment is in the named patch state;
/// `None` for a name that is none of [`PATCH_FILTERS`]. `not_assessed`
/// holds for a device never assessed or not for [`STALE_AFTER`].
pub fn in_patch_state(
    filter: &str,
    assessment: Option<&DeviceAssessment>,
    now: Timestamp,
) -> Option<bool> {
    let found = assessment.map(|a| &a.assessment);
    Some(match filter {
        "up_to_date" => found.is_some_and(|f| f.upgradable == 0),
        "updates" => found.is_some_and(|f| f.upgradable > 0),
        "security" => found.is_some_and(|f| f.security > 0),
        "reboot" => found.is_some_and(|f| f.reboot_pending.is_some()),
        "not_assessed" => {
            assessment.is_none_or(|a| now.duration_since(a.received_at) > STALE_AFTER)
        }
        _ => return None,
    })
}

/// When a device's patch status needs an operator: a security update
/// waiting longer than `security_after`, a reboot pending longer than
/// `reboot_after`, or no assessment for longer than [`STALE_AFTER`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlertLimits {
    pub security_after: jiff::SignedDuration,
    pub reboot_after: jiff::SignedDuration,
}

/// One patch alert of a device. `since` is when its condition began, so an
/// acknowledgement holds while it lasts, and one that clears and returns
/// (a new `since`) is an alert again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchAlert {
    /// SecurityUpdatesWaiting, RebootPending, NotAssessed.
    pub kind: &'static str,
    pub since: Timestamp,
    pub message: String,
}

fn waited(since: Timestamp, now: Timestamp) -> String {
    let seconds = now.duration_since(since).as_secs().max(0);
    crate::reasons::duration(u64::try_from(seconds).unwrap_or(0))
}

/// The patch alerts of one device with an agent, from its latest
/// assessment. A device never assessed is judged from when its agent first
/// connected (`first_connected`): no alert for [`STALE_AFTER`] (its first
/// assessment may wait up to an eighth of the period after its agent
/// starts), then NotAssessed; with no first connection known, none
/// (`drover patch-status` counts it).
pub fn alerts(
    assessment: Option<&DeviceAssessment>,
    first_connected: Option<Timestamp>,
    now: Timestamp,
    limits: &AlertLimits,
) -> Vec<PatchAlert> {
    let Some(a) = assessment else {
        return first_connected
            .filter(|first| now.duration_since(*first) > STALE_AFTER)
            .map(|first| PatchAlert {
                kind: "NotAssessed",
                since: first,
                message: format!(
                    "never assessed: its agent first connected {} ago (an agent too old to \
                     assess, assessments turned off, or each one failing)",
                    waited(first, now)
                ),
            })
            .into_iter()
            .collect();
    };
    let mut alerts = Vec::new();
    if let Some(oldest) = a.oldest_security()
        && now.duration_since(oldest) > limits.security_after
    {
        alerts.push(PatchAlert {
            kind: "SecurityUpdatesWaiting",
            since: oldest,
            message: format!(
                "{} security update{} pending, the oldest for {}",
                a.assessment.security,
                if a.assessment.security == 1 { "" } else { "s" },
                waited(oldest, now)
            ),
        });
    }
    if let Some(since) = a.reboot_since
        && now.duration_since(since) > limits.reboot_after
    {
        alerts.push(PatchAlert {
            kind: "RebootPending",
            since,
            message: format!(
                "a reboot pending for {}: {}",
                waited(since, now),
                a.assessment.reboot_pending.as_deref().unwrap_or("")
            ),
        });
    }
    if now.duration_since(a.received_at) > STALE_AFTER {
        alerts.push(PatchAlert {
            kind: "NotAssessed",
            since: a.received_at,
            message: format!("not assessed for {}", waited(a.received_at, now)),
        });
    }
    alerts
}

/// A device not assessed for longer than this counts as stale.
pub const STALE_AFTER: jiff::SignedDuration = jiff::SignedDuration::from_hours(48);

/// The fleet's patch status: how many devices are in each state. A device
/// counts once in each line that holds for it (one with a security update
/// pending also has updates pending); decommissioned devices are left out.
/// The counts come from each device's latest assessment, however old;
/// `stale` says how many of those are older than [`STALE_AFTER`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetPatchStatus {
    pub devices: u32,
    pub up_to_date: u32,
    pub with_updates: u32,
    pub with_security_updates: u32,
    /// Of those, by how long the oldest pending security update has waited.
    pub security_under_1_day: u32,
    pub security_1_to_7_days: u32,
    pub security_over_7_days: u32,
    /// With no security archive among the device's sources.
    pub no_security_archive: u32,
    pub reboot_pending: u32,
    /// Assessed, but not for over two days.
    pub stale: u32,
    pub never_assessed: u32,
}

impl FleetPatchStatus {
    /// Counts one device (not decommissioned) with its latest assessment.
    pub fn add(&mut self, assessment: Option<&DeviceAssessment>, now: Timestamp) {
        self.devices += 1;
        let Some(a) = assessment else {
            self.never_assessed += 1;
            return;
        };
        if now.duration_since(a.received_at) > STALE_AFTER {
            self.stale += 1;
        }
        let found = &a.assessment;
        if found.upgradable == 0 {
            self.up_to_date += 1;
        } else {
            self.with_updates += 1;
        }
        if !found.security_archive {
            self.no_security_archive += 1;
        }
        if found.security > 0 {
            self.with_security_updates += 1;
            let waited = a
                .oldest_security()
                .map_or(jiff::SignedDuration::ZERO, |since| {
                    now.duration_since(since)
                });
            if waited < jiff::SignedDuration::from_hours(24) {
                self.security_under_1_day += 1;
            } else if waited <= jiff::SignedDuration::from_hours(7 * 24) {
                self.security_1_to_7_days += 1;
            } else {
                self.security_over_7_days += 1;
            }
        }
        if found.reboot_pending.is_some() {
            self.reboot_pending += 1;
        }
    }

    /// The counts by name, as the metrics label them.
    pub fn by_state(&self) -> [(&'static str, u32); 11] {
        [
            ("devices", self.devices),
            ("up_to_date", self.up_to_date),
            ("with_updates", self.with_updates),
            ("with_security_updates", self.with_security_updates),
            ("security_under_1_day", self.security_under_1_day),
            ("security_1_to_7_days", self.security_1_to_7_days),
            ("security_over_7_days", self.security_over_7_days),
            ("no_security_archive", self.no_security_archive),
            ("reboot_pending", self.reboot_pending),
            ("stale", self.stale),
            ("never_assessed", self.never_assessed),
        ]
    }
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

    #[test]
    fn the_fleet_counts_each_device_in_every_line_that_holds() {
        let now = t("2026-12-10T12:00:00Z");
        let device = DeviceId::new("pi-1").expect("id");
        let record = |assessment: PatchAssessment, received: &str, since: &[(&str, &str)]| {
            DeviceAssessment {
                device: device.clone(),
                finished_at: t(received),
                received_at: t(received),
                assessment,
                security_since: since
                    .iter()
                    .map(|(name, at)| ((*name).to_owned(), t(at)))
                    .collect(),
                reboot_since: None,
            }
        };
        let mut fleet = FleetPatchStatus::default();
        // Up to date, assessed an hour ago.
        fleet.add(
            Some(&record(
                PatchAssessment {
                    security_archive: true,
                    ..PatchAssessment::default()
                },
                "2026-12-10T11:00:00Z",
                &[],
            )),
            now,
        );
        // Security pending 3 days, a reboot pending too.
        let mut security = pending(&[("openssl", true)]);
        security.reboot_pending = Some("/run/reboot-required exists".into());
        fleet.add(
            Some(&record(
                security,
                "2026-12-10T03:00:00Z",
                &[("openssl", "2026-12-07T03:00:00Z")],
            )),
            now,
        );
        // Security pending 9 days, last assessed 3 days ago (stale).
        fleet.add(
            Some(&record(
                pending(&[("libc6", true)]),
                "2026-12-07T03:00:00Z",
                &[("libc6", "2026-12-01T03:00:00Z")],
            )),
            now,
        );
        // Ordinary updates only, no security archive (32-bit Raspberry Pi OS).
        fleet.add(
            Some(&record(
                PatchAssessment {
                    upgradable: 4,
                    ..PatchAssessment::default()
                },
                "2026-12-10T10:00:00Z",
                &[],
            )),
            now,
        );
        // Never assessed.
        fleet.add(None, now);
        assert_eq!(
            fleet,
            FleetPatchStatus {
                devices: 5,
                up_to_date: 1,
                with_updates: 3,
                with_security_updates: 2,
                security_under_1_day: 0,
                security_1_to_7_days: 1,
                security_over_7_days: 1,
                no_security_archive: 1,
                reboot_pending: 1,
                stale: 1,
                never_assessed: 1,
            }
        );
    }

    #[test]
    fn alerts_past_their_limits_each_with_the_start_of_its_condition() {
        let limits = AlertLimits {
            security_after: jiff::SignedDuration::from_hours(7 * 24),
            reboot_after: jiff::SignedDuration::from_hours(24),
        };
        let device = DeviceId::new("pi-1").expect("id");
        let mut waiting = pending(&[("openssl", true)]);
        waiting.reboot_pending = Some("/run/reboot-required exists".into());
        let record = DeviceAssessment {
            device,
            finished_at: t("2026-12-09T03:00:00Z"),
            received_at: t("2026-12-09T03:00:01Z"),
            assessment: waiting,
            security_since: BTreeMap::from([("openssl".to_owned(), t("2026-12-01T03:00:00Z"))]),
            reboot_since: Some(t("2026-12-08T11:00:00Z")),
        };
        // Day 9, noon: the security update waited 8 days 9 hours, the
        // reboot 25 hours: both past their limits; assessed 9 hours ago.
        let now = t("2026-12-09T12:00:00Z");
        let found = alerts(Some(&record), None, now, &limits);
        let kinds: Vec<(&str, Timestamp)> = found.iter().map(|a| (a.kind, a.since)).collect();
        assert_eq!(
            kinds,
            [
                ("SecurityUpdatesWaiting", t("2026-12-01T03:00:00Z")),
                ("RebootPending", t("2026-12-08T11:00:00Z")),
            ]
        );
        assert_eq!(
            found[0].message,
            "1 security update pending, the oldest for 8 days 9 hours"
        );
        // Not yet: under every limit.
        assert!(alerts(Some(&record), None, t("2026-12-07T12:00:00Z"), &limits).is_empty());
        // Three days without an assessment.
        let stale = alerts(Some(&record), None, t("2026-12-12T04:00:00Z"), &limits);
        assert!(
            stale
                .iter()
                .any(|a| a.kind == "NotAssessed" && a.since == record.received_at)
        );
        // Never assessed: none while its agent's first connection is
        // unknown or under two days old; then NotAssessed, from it.
        assert!(alerts(None, None, now, &limits).is_empty());
        let first = t("2026-12-07T13:00:00Z");
        assert!(alerts(None, Some(first), now, &limits).is_empty());
        let never = alerts(None, Some(first), t("2026-12-09T13:00:01Z"), &limits);
        assert_eq!(
            never.iter().map(|a| (a.kind, a.since)).collect::<Vec<_>>(),
            [("NotAssessed", first)]
        );
        assert!(
            never[0]
                .message
                .starts_with("never assessed: its agent first connected 2 days ago ("),
            "{}",
            never[0].message
        );
    }

    #[test]
    fn a_pending_reboot_waits_from_the_first_assessment_that_saw_it() {
        let device = DeviceId::new("pi-1").expect("id");
        let rebooting = || PatchAssessment {
            reboot_pending: Some("kernel 6.1.0-29-arm64 is installed".into()),
            ..PatchAssessment::default()
        };
        let first = next(
            None,
            &device,
            rebooting(),
            t("2026-12-01T03:00:00Z"),
            t("2026-12-01T03:00:01Z"),
        )
        .expect("first");
        assert_eq!(first.reboot_since, Some(t("2026-12-01T03:00:01Z")));
        let second = next(
            Some(&first),
            &device,
            rebooting(),
            t("2026-12-02T03:00:00Z"),
            t("2026-12-02T03:00:01Z"),
        )
        .expect("second");
        assert_eq!(second.reboot_since, first.reboot_since);
        let rebooted = next(
            Some(&second),
            &device,
            PatchAssessment::default(),
            t("2026-12-02T05:00:00Z"),
            t("2026-12-02T05:00:01Z"),
        )
        .expect("third");
        assert_eq!(rebooted.reboot_since, None);
    }
}
