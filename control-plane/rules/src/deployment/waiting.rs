//! Why a target not released yet waits (issue 56): one answer that the
//! engine's pass acts on ([`super::decide`] releases a target only when
//! [`wait_of`] finds nothing holding it) and that every surface shows, in
//! the same words (the API's targets and `describe`, the CLI, the
//! dashboard).

use super::{DeploymentSpec, RATE_WINDOW, Releases, TargetRecord, Window, time_zone};
use jiff::Timestamp;
use jiff::tz::TimeZone;

/// What holds a pending target back, first that applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// Its last attempt failed; the next waits out the retry backoff.
    Backoff { until: Timestamp },
    /// Its device is not connected (last heard from then, if ever).
    Offline { last_seen: Option<Timestamp> },
    /// Outside the maintenance window in `zone`; it opens then (None: it
    /// never opens, a window that DST skips in full).
    Window {
        zone: String,
        opens_at: Option<Timestamp>,
    },
    /// `limit` targets are queued or running already.
    Concurrency { limit: u32 },
    /// `limit` releases in the last minute already; room again then.
    Rate {
        limit: u32,
        until: Option<Timestamp>,
    },
    /// A task run's target held back until every canary succeeded.
    Canaries,
    /// The device holds the job behind an earlier one (it runs one at a
    /// time).
    EarlierJob,
}

/// What the caller knows of a target's device now.
#[derive(Debug, Clone, Copy)]
pub struct DeviceNow<'a> {
    pub online: bool,
    pub last_seen: Option<Timestamp>,
    /// Its site's time zone (None or unknown: the window's own).
    pub time_zone: Option<&'a str>,
}

/// Why the pending `record` is not released at `now`, with `active`
/// targets queued or running; None when the next pass releases it (as the
/// release rate allows: [`rate_wait`]).
pub fn wait_of(
    spec: &DeploymentSpec,
    record: &TargetRecord,
    device: DeviceNow<'_>,
    active: u32,
    now: Timestamp,
) -> Option<Wait> {
    if let Some(until) = record.next_attempt_at.filter(|at| now < *at) {
        return Some(Wait::Backoff { until });
    }
    if !device.online {
        return Some(Wait::Offline {
            last_seen: device.last_seen,
        });
    }
    if let Some(window) = &spec.maintenance_window {
        let (zone_name, zone) = zone_of(window, device.time_zone);
        if !window.contains(&zone, now) {
            return Some(Wait::Window {
                zone: zone_name,
                opens_at: window.next_open(&zone, now),
            });
        }
    }
    (active >= spec.max_concurrency).then_some(Wait::Concurrency {
        limit: spec.max_concurrency,
    })
}

/// The zone a device's window is judged in, by name and looked up: its
/// site's when known, else the window's own (else UTC).
pub fn zone_of(window: &Window, site: Option<&str>) -> (String, TimeZone) {
    site.and_then(|name| Some((name.to_owned(), time_zone(name)?)))
        .or_else(|| Some((window.time_zone.clone(), time_zone(&window.time_zone)?)))
        .unwrap_or_else(|| ("UTC".to_owned(), TimeZone::UTC))
}

/// The release rate's hold, when `max_releases_per_minute` releases were
/// made in the last minute (`recent`) and `released` more in this pass.
pub fn rate_wait(
    spec: &DeploymentSpec,
    recent: &[Releases],
    released: u32,
    now: Timestamp,
) -> Option<Wait> {
    let limit = spec.max_releases_per_minute?;
    let since = now - RATE_WINDOW;
    let last_minute = || recent.iter().filter(|r| r.at > since);
    let used: u32 = last_minute().map(|r| r.count).sum::<u32>() + released;
    (used >= limit).then(|| Wait::Rate {
        limit,
        // Room again when the oldest of the last minute's releases leaves
        // the window.
        until: last_minute()
            .map(|r| r.at + RATE_WINDOW)
            .min()
            .or(Some(now + RATE_WINDOW)),
    })
}

impl Wait {
    /// A stable name for it (the API's `code`).
    pub fn code(&self) -> &'static str {
        match self {
            Wait::Backoff { .. } => "RetryBackoff",
            Wait::Offline { .. } => "Offline",
            Wait::Window { .. } => "WindowClosed",
            Wait::Concurrency { .. } => "ConcurrencyLimit",
            Wait::Rate { .. } => "ReleaseRate",
            Wait::Canaries => "WaitingForCanaries",
            Wait::EarlierJob => "EarlierJobOnDevice",
        }
    }

    /// When it ends by itself, if known.
    pub fn until(&self) -> Option<Timestamp> {
        match self {
            Wait::Backoff { until } => Some(*until),
            Wait::Window { opens_at, .. } => *opens_at,
            Wait::Rate { until, .. } => *until,
            Wait::Offline { .. } | Wait::Concurrency { .. } | Wait::Canaries | Wait::EarlierJob => {
                None
            }
        }
    }

    /// The sentence an operator reads: local time for a window, UTC
    /// otherwise.
    pub fn text(&self) -> String {
        let utc = |at: &Timestamp| at.strftime("%Y-%m-%d %H:%M UTC").to_string();
        match self {
            Wait::Backoff { until } => {
                format!("retry backoff after a failed attempt, until {}", utc(until))
            }
            Wait::Offline {
                last_seen: Some(at),
            } => {
                format!("device offline, last heard from {}", utc(at))
            }
            Wait::Offline { last_seen: None } => "device offline, never heard from".to_owned(),
            Wait::Window {
                zone,
                opens_at: Some(at),
            } => {
                let local = time_zone(zone).unwrap_or(TimeZone::UTC).to_datetime(*at);
                format!(
                    "maintenance window closed; opens {} {zone} ({})",
                    local.strftime("%Y-%m-%d %H:%M"),
                    utc(at)
                )
            }
            Wait::Window {
                zone,
                opens_at: None,
            } => {
                format!("maintenance window closed in {zone}; it does not open in the next days")
            }
            Wait::Concurrency { limit } => {
                format!("concurrency limit: {limit} targets queued or running")
            }
            Wait::Rate { limit, until } => match until {
                Some(at) => format!(
                    "release rate: {limit} released in the last minute; room again {}",
                    utc(at)
                ),
                None => format!("release rate: {limit} released in the last minute"),
            },
            Wait::Canaries => "waiting for every canary to succeed".to_owned(),
            Wait::EarlierJob => "behind an earlier job on the device".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deployment::tests::spec;

    fn ts(text: &str) -> Timestamp {
        text.parse().expect("timestamp")
    }

    #[test]
    fn a_waiting_target_says_the_first_thing_that_holds_it() {
        let mut spec = spec(2, None, 0);
        spec.maintenance_window = Some(Window {
            start_minute: 22 * 60,
            end_minute: 4 * 60,
            time_zone: "Europe/Sofia".into(),
        });
        let now = ts("2026-12-07T10:00:00Z"); // 12:00 in Sofia
        let mut record = TargetRecord::new(drover_model::DeviceId::new("pi-1").unwrap(), None);
        let online = DeviceNow {
            online: true,
            last_seen: Some(now),
            time_zone: None,
        };
        let wait = wait_of(&spec, &record, online, 0, now).expect("held");
        assert_eq!(
            wait,
            Wait::Window {
                zone: "Europe/Sofia".into(),
                opens_at: Some(ts("2026-12-07T20:00:00Z"))
            }
        );
        assert_eq!(wait.code(), "WindowClosed");
        assert_eq!(
            wait.text(),
            "maintenance window closed; opens 2026-12-07 22:00 Europe/Sofia (2026-12-07 20:00 UTC)"
        );
        // The device's own site zone: 22:00 in Tokyo is 13:00 UTC.
        let tokyo = DeviceNow {
            time_zone: Some("Asia/Tokyo"),
            ..online
        };
        assert_eq!(
            wait_of(&spec, &record, tokyo, 0, now).and_then(|w| w.until()),
            Some(ts("2026-12-07T13:00:00Z"))
        );
        // Offline comes before the window, a backoff before both.
        let offline = DeviceNow {
            online: false,
            ..online
        };
        assert_eq!(
            wait_of(&spec, &record, offline, 0, now),
            Some(Wait::Offline {
                last_seen: Some(now)
            })
        );
        record.next_attempt_at = Some(ts("2026-12-07T10:05:00Z"));
        assert_eq!(
            wait_of(&spec, &record, offline, 0, now).map(|w| w.code()),
            Some("RetryBackoff")
        );
        // Inside the window: only the concurrency limit holds it.
        let night = ts("2026-12-07T21:00:00Z");
        assert_eq!(wait_of(&spec, &record, online, 1, night), None);
        assert_eq!(
            wait_of(&spec, &record, online, 2, night),
            Some(Wait::Concurrency { limit: 2 })
        );
    }

    #[test]
    fn the_release_rate_holds_once_its_minute_is_used() {
        let mut spec = spec(10, None, 0);
        let now = ts("2026-12-07T10:00:00Z");
        assert_eq!(rate_wait(&spec, &[], 100, now), None, "no limit");
        spec.max_releases_per_minute = Some(5);
        let recent = [Releases {
            at: ts("2026-12-07T09:59:30Z"),
            count: 3,
        }];
        assert_eq!(rate_wait(&spec, &recent, 1, now), None);
        assert_eq!(
            rate_wait(&spec, &recent, 2, now),
            Some(Wait::Rate {
                limit: 5,
                until: Some(ts("2026-12-07T10:00:30Z"))
            })
        );
    }

    /// A window inside the hour that spring's DST change skips does not
    /// open that night; the next night it opens as usual.
    #[test]
    fn a_window_the_clock_skips_opens_the_next_night() {
        let window = Window {
            start_minute: 3 * 60,
            end_minute: 3 * 60 + 30,
            time_zone: "Europe/Sofia".into(),
        };
        let zone = time_zone("Europe/Sofia").expect("tzdata");
        // 2027-03-28: Sofia's clocks jump from 03:00 to 04:00.
        let evening = ts("2027-03-27T20:00:00Z");
        assert_eq!(
            window.next_open(&zone, evening),
            Some(ts("2027-03-29T00:00:00Z")),
            "03:00 on the 29th, UTC+3"
        );
        assert_eq!(
            window.next_open(&zone, ts("2027-03-29T00:10:00Z")),
            None,
            "open"
        );
    }
}
