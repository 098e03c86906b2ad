//! TaskSchedules (the fleet-tasks seed's recurring schedules): a schedule in
//! one of the forms daily, weekly, yearly or a five-field cron expression,
//! always UTC, and a TaskRun template. Each tick creates a new, immutable
//! TaskRun named after the schedule and the tick, so a replica or a restart
//! creating it twice is a no-op. At most one run of a schedule is active;
//! ticks during it are skipped and counted; after a downtime at most one
//! catch-up run is created, for the latest tick; suspension stops new runs
//! and leaves an active one alone. The rules are one pure function over
//! (schedule, state, now); the engine runs it.

use crate::records::TaskRunSpec;
use chrono::{DateTime, Utc};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// When a schedule ticks, in UTC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Cadence {
    /// Every day at `HH:MM`.
    Daily(String),
    /// Every week on a day (`mon` … `sun`) at `HH:MM`.
    Weekly { day: String, at: String },
    /// Every year on `MM-DD` at `HH:MM` (02-29: leap years only).
    Yearly { date: String, at: String },
    /// A five-field cron expression (minute hour day-of-month month day-of-week).
    Cron(String),
}

/// Upper bound of ticks counted in one look (a minutely schedule after a
/// month away is 43,200 ticks); beyond it the count says "at least".
const MAX_COUNTED: u64 = 100_000;

fn hh_mm(text: &str) -> Result<(u32, u32), String> {
    let (h, m) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?} is not HH:MM"))?;
    let hour: u32 = h.parse().map_err(|_| format!("{text:?} is not HH:MM"))?;
    let minute: u32 = m.parse().map_err(|_| format!("{text:?} is not HH:MM"))?;
    if hour > 23 || minute > 59 || h.len() != 2 || m.len() != 2 {
        return Err(format!("{text:?} is not a time of day HH:MM (UTC)"));
    }
    Ok((hour, minute))
}

impl Cadence {
    /// The cron expression this cadence means.
    pub fn cron_expression(&self) -> Result<String, String> {
        match self {
            Cadence::Daily(at) => {
                let (h, m) = hh_mm(at)?;
                Ok(format!("{m} {h} * * *"))
            }
            Cadence::Weekly { day, at } => {
                let (h, m) = hh_mm(at)?;
                let days = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];
                let index = days
                    .iter()
                    .position(|d| d.eq_ignore_ascii_case(day))
                    .ok_or_else(|| format!("weekly day {day:?} is not one of mon … sun"))?;
                Ok(format!("{m} {h} * * {index}"))
            }
            Cadence::Yearly { date, at } => {
                let (h, m) = hh_mm(at)?;
                let (month, day) = date
                    .split_once('-')
                    .and_then(|(mo, d)| Some((mo.parse::<u32>().ok()?, d.parse::<u32>().ok()?)))
                    .ok_or_else(|| format!("yearly date {date:?} is not MM-DD"))?;
                let days_in = [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
                if !(1..=12).contains(&month) || day == 0 || day > days_in[(month - 1) as usize] {
                    return Err(format!("yearly date {date:?} is not a day of the year"));
                }
                Ok(format!("{m} {h} {day} {month} *"))
            }
            Cadence::Cron(expression) => {
                let fields = expression.split_whitespace().count();
                if fields != 5 || expression.contains('@') {
                    return Err(format!(
                        "cron {expression:?} must have exactly five fields: minute hour day-of-month month day-of-week"
                    ));
                }
                Ok(expression.clone())
            }
        }
    }

    pub fn compile(&self) -> Result<Ticks, String> {
        let expression = self.cron_expression()?;
        let cron = expression
            .parse::<croner::Cron>()
            .map_err(|e| format!("cron {expression:?}: {e}"))?;
        Ok(Ticks { cron })
    }
}

/// A compiled cadence: its ticks in UTC.
#[derive(Debug, Clone)]
pub struct Ticks {
    cron: croner::Cron,
}

fn to_chrono(t: Timestamp) -> Option<DateTime<Utc>> {
    DateTime::<Utc>::from_timestamp(t.as_second(), 0)
}

fn to_jiff(t: DateTime<Utc>) -> Option<Timestamp> {
    Timestamp::from_second(t.timestamp()).ok()
}

impl Ticks {
    /// The first tick strictly after `after`.
    pub fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        let start = to_chrono(after)?;
        to_jiff(self.cron.find_next_occurrence(&start, false).ok()?)
    }

    /// The latest tick in `(after, until]`, and how many ticks there are in
    /// it (at most [`MAX_COUNTED`]).
    pub fn latest_between(&self, after: Timestamp, until: Timestamp) -> Option<(Timestamp, u64)> {
        let latest = to_jiff(
            self.cron
                .find_previous_occurrence(&to_chrono(until)?, true)
                .ok()?,
        )?;
        if latest <= after {
            return None;
        }
        let mut count = 0u64;
        let mut tick = after;
        while let Some(next) = self.next_after(tick) {
            if next > until || count >= MAX_COUNTED {
                break;
            }
            count += 1;
            tick = next;
        }
        Some((latest, count.max(1)))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleSpec {
    pub schedule: Cadence,
    #[serde(default)]
    pub suspend: bool,
    pub template: TaskRunSpec,
    /// How many finished runs that completed are kept (newest first); older
    /// ones are deleted with their jobs' records, as `drover delete
    /// taskrun` does. Kubernetes CronJobs' name and default.
    #[serde(default = "default_successful_history")]
    pub successful_runs_history_limit: u32,
    /// How many finished runs that failed (or were canceled) are kept.
    #[serde(default = "default_failed_history")]
    pub failed_runs_history_limit: u32,
}

/// Kubernetes CronJobs keep 3 successful and 1 failed job; so do schedules.
pub const DEFAULT_SUCCESSFUL_HISTORY: u32 = 3;
pub const DEFAULT_FAILED_HISTORY: u32 = 1;
/// The largest history limit a manifest may ask for: each pass of the
/// engine looks at every run, so the history stays bounded.
pub const MAX_HISTORY: u32 = 1000;

fn default_successful_history() -> u32 {
    DEFAULT_SUCCESSFUL_HISTORY
}

fn default_failed_history() -> u32 {
    DEFAULT_FAILED_HISTORY
}

/// A finished run of a schedule, as the history limit sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub name: String,
    pub created_at: Timestamp,
    pub succeeded: bool,
}

/// The pure history rule: of a schedule's finished runs, the ones past its
/// limits, oldest first. The newest `successful_runs_history_limit` that
/// completed and the newest `failed_runs_history_limit` that failed stay;
/// a run still going is never passed in and never deleted.
pub fn past_history(spec: &ScheduleSpec, mut finished: Vec<Finished>) -> Vec<String> {
    // Newest first; runs of one schedule are named after their tick, so the
    // name breaks a tie of creation times the same way on every replica.
    finished.sort_by(|a, b| {
        b.created_at
            .cmp(&a.created_at)
            .then_with(|| b.name.cmp(&a.name))
    });
    let (mut kept_ok, mut kept_failed) = (0u32, 0u32);
    let mut past = Vec::new();
    for run in finished {
        let (kept, limit) = if run.succeeded {
            (&mut kept_ok, spec.successful_runs_history_limit)
        } else {
            (&mut kept_failed, spec.failed_runs_history_limit)
        };
        if *kept < limit {
            *kept += 1;
        } else {
            past.push(run.name);
        }
    }
    past.reverse();
    past
}

/// What the schedule has done, kept with it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleStatus {
    /// The latest tick looked at (acted on, skipped or suspended).
    pub last_tick: Option<Timestamp>,
    /// The run created for the latest tick that got one.
    pub last_run: Option<String>,
    /// That run while it is not finished.
    pub active_run: Option<String>,
    /// Ticks that got no run: during an active run, or missed while no
    /// control plane ran (all but the latest).
    pub skipped: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskScheduleRecord {
    pub name: String,
    pub created_at: Timestamp,
    pub spec: ScheduleSpec,
    pub status: ScheduleStatus,
}

/// What one look at a schedule decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Create this run (name, tick) from the template.
    pub create: Option<(String, Timestamp)>,
    pub status: ScheduleStatus,
}

/// The run a tick creates: `<schedule>-<YYYYMMDDHHMM>` (a schedule name is
/// at most 50 characters, so this stays a valid run name).
pub fn run_name(schedule: &str, tick: Timestamp) -> String {
    format!("{schedule}-{}", tick.strftime("%Y%m%d%H%M"))
}

/// The pure rule. `active` says whether the status's active run exists and
/// is unfinished.
pub fn decide(
    record: &TaskScheduleRecord,
    ticks: &Ticks,
    active: bool,
    now: Timestamp,
) -> Decision {
    let mut status = record.status.clone();
    if !active {
        status.active_run = None;
    }
    // Ticks before the schedule existed never count.
    let after = status.last_tick.unwrap_or(record.created_at);
    let Some((latest, count)) = ticks.latest_between(after, now) else {
        return Decision {
            create: None,
            status,
        };
    };
    status.last_tick = Some(latest);
    if record.spec.suspend {
        // Suspended: no run, and the ticks are not owed later.
        return Decision {
            create: None,
            status,
        };
    }
    if active {
        status.skipped = status.skipped.saturating_add(count);
        return Decision {
            create: None,
            status,
        };
    }
    // One run for the latest tick; earlier ones missed while away are skipped.
    status.skipped = status.skipped.saturating_add(count - 1);
    let name = run_name(&record.name, latest);
    status.last_run = Some(name.clone());
    status.active_run = Some(name.clone());
    Decision {
        create: Some((name, latest)),
        status,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::TargetSelector;

    fn t(text: &str) -> Timestamp {
        text.parse().expect("timestamp")
    }

    fn ticks(cadence: Cadence) -> Ticks {
        cadence.compile().expect("compiles")
    }

    fn next_n(cadence: Cadence, from: &str, n: usize) -> Vec<String> {
        let ticks = ticks(cadence);
        let mut at = t(from);
        let mut out = Vec::new();
        for _ in 0..n {
            at = ticks.next_after(at).expect("a next tick");
            out.push(at.to_string());
        }
        out
    }

    #[test]
    fn next_ticks_of_each_form() {
        // Daily, across a year boundary.
        assert_eq!(
            next_n(Cadence::Daily("23:59".into()), "2026-12-30T12:00:00Z", 3),
            [
                "2026-12-30T23:59:00Z",
                "2026-12-31T23:59:00Z",
                "2027-01-01T23:59:00Z"
            ]
        );
        // Weekly on Monday.
        assert_eq!(
            next_n(
                Cadence::Weekly {
                    day: "mon".into(),
                    at: "03:00".into()
                },
                "2026-11-30T03:00:00Z",
                2
            ),
            ["2026-12-07T03:00:00Z", "2026-12-14T03:00:00Z"]
        );
        // Yearly on Feb 29: leap years only.
        assert_eq!(
            next_n(
                Cadence::Yearly {
                    date: "02-29".into(),
                    at: "00:00".into()
                },
                "2026-01-01T00:00:00Z",
                2
            ),
            ["2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"]
        );
        // Yearly on Dec 31, across year ends.
        assert_eq!(
            next_n(
                Cadence::Yearly {
                    date: "12-31".into(),
                    at: "23:30".into()
                },
                "2026-12-31T23:30:00Z",
                1
            ),
            ["2027-12-31T23:30:00Z"]
        );
        // Cron on the 31st: only months that have one.
        assert_eq!(
            next_n(
                Cadence::Cron("0 0 31 * *".into()),
                "2027-01-31T00:00:00Z",
                4
            ),
            [
                "2027-03-31T00:00:00Z",
                "2027-05-31T00:00:00Z",
                "2027-07-31T00:00:00Z",
                "2027-08-31T00:00:00Z"
            ]
        );
        // Cron, last minute of February in a leap year and not.
        assert_eq!(
            next_n(
                Cadence::Cron("59 23 28,29 2 *".into()),
                "2028-02-28T23:59:00Z",
                2
            ),
            ["2028-02-29T23:59:00Z", "2029-02-28T23:59:00Z"]
        );
        // Every 15 minutes, across midnight.
        assert_eq!(
            next_n(
                Cadence::Cron("*/15 * * * *".into()),
                "2026-12-31T23:50:00Z",
                2
            ),
            ["2027-01-01T00:00:00Z", "2027-01-01T00:15:00Z"]
        );
    }

    #[test]
    fn bad_cadences_are_clear_errors() {
        for (cadence, fragment) in [
            (Cadence::Daily("3:00".into()), "not a time of day"),
            (Cadence::Daily("24:00".into()), "not a time of day"),
            (
                Cadence::Weekly {
                    day: "funday".into(),
                    at: "03:00".into(),
                },
                "not one of mon",
            ),
            (
                Cadence::Yearly {
                    date: "02-30".into(),
                    at: "03:00".into(),
                },
                "not a day of the year",
            ),
            (
                Cadence::Yearly {
                    date: "13-01".into(),
                    at: "03:00".into(),
                },
                "not a day of the year",
            ),
            (Cadence::Cron("0 3 * *".into()), "exactly five fields"),
            (Cadence::Cron("0 0 3 * * *".into()), "exactly five fields"),
            (Cadence::Cron("@daily".into()), "exactly five fields"),
            (Cadence::Cron("61 3 * * *".into()), "cron"),
        ] {
            let err = cadence.compile().expect_err("refused");
            assert!(err.contains(fragment), "{cadence:?}: {err}");
        }
    }

    fn record(cadence: Cadence, created: &str, suspend: bool) -> TaskScheduleRecord {
        TaskScheduleRecord {
            name: "nightly".into(),
            created_at: t(created),
            spec: ScheduleSpec {
                schedule: cadence,
                suspend,
                template: TaskRunSpec {
                    allowed_groups: vec!["g".into()],
                    target_selector: TargetSelector::default(),
                    deadline_seconds: 3600,
                    system_upgrade_v1: drover_model::model::Empty {},
                },
                successful_runs_history_limit: DEFAULT_SUCCESSFUL_HISTORY,
                failed_runs_history_limit: DEFAULT_FAILED_HISTORY,
            },
            status: ScheduleStatus::default(),
        }
    }

    #[test]
    fn scheduler_table() {
        let daily = || Cadence::Daily("03:00".into());
        let ticks = ticks(daily());
        // Before the first tick: nothing.
        let r = record(daily(), "2026-12-01T10:00:00Z", false);
        assert_eq!(
            decide(&r, &ticks, false, t("2026-12-02T02:59:00Z")).create,
            None
        );
        // The first tick creates one run, named after it.
        let d = decide(&r, &ticks, false, t("2026-12-02T03:00:30Z"));
        assert_eq!(
            d.create,
            Some(("nightly-202612020300".into(), t("2026-12-02T03:00:00Z")))
        );
        assert_eq!(d.status.active_run.as_deref(), Some("nightly-202612020300"));
        assert_eq!(d.status.skipped, 0);
        // Looking again in the same minute: nothing more.
        let mut r2 = r.clone();
        r2.status = d.status.clone();
        assert_eq!(
            decide(&r2, &ticks, true, t("2026-12-02T03:00:40Z")).create,
            None
        );
        // The next two ticks come while the run is still active: skipped.
        let d = decide(&r2, &ticks, true, t("2026-12-04T03:05:00Z"));
        assert_eq!(d.create, None);
        assert_eq!(d.status.skipped, 2);
        assert_eq!(d.status.last_tick, Some(t("2026-12-04T03:00:00Z")));
        // Once it finished, the next tick gets a run.
        let mut r3 = r2.clone();
        r3.status = d.status;
        let d = decide(&r3, &ticks, false, t("2026-12-05T03:00:10Z"));
        assert_eq!(d.create.map(|c| c.0), Some("nightly-202612050300".into()));
        assert_eq!(d.status.skipped, 2);
        // A month without a control plane: one catch-up run, for the latest tick.
        let mut r4 = r3.clone();
        r4.status = d.status;
        r4.status.active_run = None;
        let d = decide(&r4, &ticks, false, t("2027-01-05T12:00:00Z"));
        assert_eq!(d.create.map(|c| c.0), Some("nightly-202701050300".into()));
        assert_eq!(d.status.skipped, 2 + 30, "31 ticks missed, one caught up");
        // Suspended: no run, ticks not owed later; an active run is left alone.
        let mut suspended = record(daily(), "2026-12-01T10:00:00Z", true);
        suspended.status.active_run = Some("nightly-202612020300".into());
        let d = decide(&suspended, &ticks, true, t("2026-12-10T04:00:00Z"));
        assert_eq!(d.create, None);
        assert_eq!(d.status.active_run.as_deref(), Some("nightly-202612020300"));
        assert_eq!(d.status.last_tick, Some(t("2026-12-10T03:00:00Z")));
        let mut resumed = suspended.clone();
        resumed.spec.suspend = false;
        resumed.status = d.status;
        assert_eq!(
            decide(&resumed, &ticks, false, t("2026-12-10T05:00:00Z")).create,
            None,
            "no catch-up for ticks while suspended"
        );
    }

    #[test]
    fn history_keeps_the_newest_of_each_outcome_and_deletes_the_rest() {
        let spec = |ok, failed| ScheduleSpec {
            successful_runs_history_limit: ok,
            failed_runs_history_limit: failed,
            ..record(
                Cadence::Daily("03:00".into()),
                "2026-12-01T00:00:00Z",
                false,
            )
            .spec
        };
        let run = |day: u32, succeeded| Finished {
            name: format!("nightly-202612{day:02}0300"),
            created_at: t(&format!("2026-12-{day:02}T03:00:00Z")),
            succeeded,
        };
        let history = || {
            vec![
                run(5, true),
                run(1, true),
                run(2, false),
                run(4, false),
                run(3, true),
                run(6, true),
            ]
        };
        // 3 and 1: days 3, 5, 6 succeeded and day 4 failed stay.
        assert_eq!(
            past_history(&spec(3, 1), history()),
            ["nightly-202612010300", "nightly-202612020300"]
        );
        // Nothing past a limit: nothing deleted.
        assert!(past_history(&spec(10, 10), history()).is_empty());
        // 0 keeps none of that outcome.
        assert_eq!(
            past_history(&spec(0, 5), history()),
            [
                "nightly-202612010300",
                "nightly-202612030300",
                "nightly-202612050300",
                "nightly-202612060300"
            ]
        );
        // Equal creation times: the name decides, the same on every replica.
        let mut twins = vec![run(1, true), run(1, true)];
        twins[1].name = "nightly-b".into();
        assert_eq!(past_history(&spec(1, 1), twins), ["nightly-202612010300"]);
    }
}
