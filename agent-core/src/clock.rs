//! The device's wall clock, and the agent's estimate of the control plane's.
//! Timestamps the agent records (accepted, started, finished) are the
//! device's own; decisions that must not depend on a device's clock (A12:
//! is an intent past its `expiresAt`?) use the control plane's time as last
//! heard from it, carried forward on the monotonic clock so that an NTP step
//! on the device does not move it.

use jiff::{SignedDuration, Timestamp};
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

/// A test-only offset of the device's clock in milliseconds. Zero unless a
/// binary built with its `testing` feature sets it from a test config, so a
/// test can play a device whose clock is wrong.
static TEST_OFFSET_MS: AtomicI64 = AtomicI64::new(0);

/// The device's wall clock. Every agent-side timestamp comes from here.
pub fn now() -> Timestamp {
    let offset = TEST_OFFSET_MS.load(Ordering::Relaxed);
    let now = Timestamp::now();
    if offset == 0 {
        return now;
    }
    now.checked_add(SignedDuration::from_millis(offset))
        .unwrap_or(now)
}

/// Skews [`now`] by `offset`. Only the agent binary's `testing` feature calls this.
pub fn set_test_offset(offset: SignedDuration) {
    let millis = i64::try_from(offset.as_millis()).unwrap_or(0);
    TEST_OFFSET_MS.store(millis, Ordering::Relaxed);
}

/// The control plane's time as last reported by it, carried forward on the
/// monotonic clock.
#[derive(Default)]
pub struct ControlPlaneClock {
    /// A std Mutex: nothing awaits while it is held.
    reference: Mutex<Option<(Timestamp, Instant)>>,
}

impl ControlPlaneClock {
    /// Records a time the control plane just sent.
    pub fn observe(&self, control_plane_time: Timestamp) {
        let mut reference = self.reference.lock().unwrap_or_else(|p| p.into_inner());
        *reference = Some((control_plane_time, Instant::now()));
    }

    /// The control plane's time now, or None before it ever said.
    pub fn estimate(&self) -> Option<Timestamp> {
        let reference = *self.reference.lock().unwrap_or_else(|p| p.into_inner());
        let (at, seen) = reference?;
        let elapsed = SignedDuration::try_from(seen.elapsed()).unwrap_or(SignedDuration::ZERO);
        at.checked_add(elapsed).ok()
    }

    /// The best time to judge expiry by: the control plane's estimate, else
    /// the device's own clock.
    pub fn now_or_local(&self) -> Timestamp {
        self.estimate().unwrap_or_else(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_follows_the_control_plane_not_the_device() {
        let clock = ControlPlaneClock::default();
        assert_eq!(clock.estimate(), None);
        let reported = Timestamp::from_second(1_000_000_000).expect("time");
        clock.observe(reported);
        let estimate = clock.estimate().expect("estimate");
        assert!(estimate >= reported);
        assert!(estimate.duration_since(reported) < SignedDuration::from_secs(5));
        // Far from the device's own clock, as a device with a wrong clock would be.
        assert!(now().duration_since(estimate) > SignedDuration::from_hours(24 * 365));
    }
}
