//! A deployment's daily maintenance window, judged in a device's time zone.

use jiff::Timestamp;
use jiff::tz::TimeZone;
use serde::{Deserialize, Serialize};

/// A daily maintenance window in local time, `[start, end)` in minutes after
/// midnight; `start > end` crosses midnight. `time_zone` is used for devices
/// whose site has none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Window {
    pub start_minute: u16,
    pub end_minute: u16,
    pub time_zone: String,
}

impl Window {
    /// Whether `now` falls in the window on the wall clock of `zone`. Local
    /// times a DST change skips are never in it; local times it repeats are
    /// in it both times.
    pub fn contains(&self, zone: &TimeZone, now: Timestamp) -> bool {
        let time = zone.to_datetime(now).time();
        let minute = time.hour() as u16 * 60 + time.minute() as u16;
        if self.start_minute < self.end_minute {
            self.start_minute <= minute && minute < self.end_minute
        } else {
            minute >= self.start_minute || minute < self.end_minute
        }
    }

    /// When the window next opens in `zone` after `now`; None while it is
    /// open, or when it does not open in the next days (a window inside
    /// the hour a DST change skips opens at the jump, if any of it is
    /// left after it).
    pub fn next_open(&self, zone: &TimeZone, now: Timestamp) -> Option<Timestamp> {
        if self.contains(zone, now) {
            return None;
        }
        let today = zone.to_datetime(now).date();
        let (hour, minute) = (
            (self.start_minute / 60) as i8,
            (self.start_minute % 60) as i8,
        );
        (0..3).find_map(|days| {
            let date = today.checked_add(jiff::Span::new().days(days)).ok()?;
            let start = zone
                .to_ambiguous_timestamp(date.at(hour, minute, 0, 0))
                .compatible()
                .ok()?;
            (start > now && self.contains(zone, start)).then_some(start)
        })
    }
}

/// "HH:MM" to minutes after midnight.
pub fn parse_minute(text: &str) -> Option<u16> {
    let (h, m) = text.split_once(':')?;
    if h.len() != 2 || m.len() != 2 {
        return None;
    }
    let (h, m): (u16, u16) = (h.parse().ok()?, m.parse().ok()?);
    (h < 24 && m < 60).then_some(h * 60 + m)
}

pub fn format_minute(minute: u16) -> String {
    format!("{:02}:{:02}", minute / 60, minute % 60)
}

/// Looks a zone up in the system's tz database (tzdata).
pub fn time_zone(name: &str) -> Option<TimeZone> {
    if name == "UTC" {
        return Some(TimeZone::UTC);
    }
    TimeZone::get(name).ok()
}
