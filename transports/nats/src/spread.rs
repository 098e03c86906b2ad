//! How a fleet comes back after its NATS server restarts (decision 0020):
//! the control plane names a window in its answer to each hello, the
//! fleet's size over the logins a second the servers take, and each agent
//! waits a random part of it before its first reconnect after a loss. A
//! handful of devices gets a window of milliseconds; 50,000 at the default
//! rate get 50 s. On the build machine's three-node cluster, 50,000
//! arriving spread over 30 to 50 s were in within 52.6 to 74.9 s, where
//! all at once took 136.7 s (docs/benchmarks.md, "Connecting by key").

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// The logins a second the control plane sizes the window by when the
/// operator does not say (`--nats-logins-per-second`): what one
/// nats-server on the 2-core build machine took by JWT (about 1,000 to
/// 1,700; docs/benchmarks.md, "Connecting by key").
pub const DEFAULT_LOGINS_PER_SECOND: u32 = 1000;

/// The widest window an agent honours, whatever a control plane names:
/// ten minutes, for a million devices at 1,700 logins a second.
pub const MAX_RECONNECT_SPREAD: Duration = Duration::from_secs(600);

/// The window for a fleet of `devices` when the servers take
/// `logins_per_second` logins a second; zero when the rate is zero (the
/// operator turned the spread off).
pub fn reconnect_spread(devices: usize, logins_per_second: u32) -> Duration {
    if logins_per_second == 0 {
        return Duration::ZERO;
    }
    let millis = (devices as u64).saturating_mul(1000) / u64::from(logins_per_second);
    Duration::from_millis(millis).min(MAX_RECONNECT_SPREAD)
}

/// The window an agent takes from a hello's answer: at most
/// [`MAX_RECONNECT_SPREAD`], and none when the control plane named none
/// (an older one).
fn honoured(named_ms: Option<u64>) -> Duration {
    named_ms.map_or(Duration::ZERO, |ms| {
        Duration::from_millis(ms).min(MAX_RECONNECT_SPREAD)
    })
}

/// One agent session's reconnect state, shared with async-nats's delay
/// callback: whether the session has connected, and the window the
/// control plane named in its last answer to a hello.
#[derive(Debug, Default)]
pub struct Reconnects {
    connected: AtomicBool,
    window_ms: AtomicU64,
}

impl Reconnects {
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    pub fn set_connected(&self) {
        self.connected.store(true, Ordering::Relaxed);
    }

    pub fn window(&self) -> Duration {
        Duration::from_millis(self.window_ms.load(Ordering::Relaxed))
    }

    /// Takes the window a control plane named (at most
    /// [`MAX_RECONNECT_SPREAD`]) and returns it.
    pub fn set_window(&self, named_ms: Option<u64>) -> Duration {
        let window = honoured(named_ms);
        self.window_ms.store(
            u64::try_from(window.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        window
    }
}

/// The devices a control plane replica has heard from since it started: a
/// hello (answered by one replica of the queue group) or a heartbeat
/// (which every replica reads), so every replica counts the whole fleet
/// once each device has sent one heartbeat. A device deleted since still
/// counts; the count only sizes a window.
#[cfg(feature = "server")]
pub(crate) struct Fleet {
    seen: std::sync::Mutex<std::collections::HashSet<drover_model::DeviceId>>,
    logins_per_second: u32,
}

/// The most devices [`Fleet`] remembers (about 64 MiB); past it the window
/// stops growing, at [`MAX_RECONNECT_SPREAD`] for the default rate.
#[cfg(feature = "server")]
const MAX_COUNTED: usize = 1 << 20;

#[cfg(feature = "server")]
impl Fleet {
    pub(crate) fn new(logins_per_second: u32) -> Self {
        Self {
            seen: Default::default(),
            logins_per_second,
        }
    }

    /// `device` was heard from.
    pub(crate) fn heard(&self, device: &drover_model::DeviceId) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() < MAX_COUNTED && !seen.contains(device) {
            seen.insert(device.clone());
        }
    }

    /// The window to name in a hello's answer.
    pub(crate) fn window(&self) -> Duration {
        let devices = self.seen.lock().unwrap_or_else(|p| p.into_inner()).len();
        reconnect_spread(devices, self.logins_per_second)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_the_fleet_over_the_logins_a_second_and_bounded() {
        assert_eq!(reconnect_spread(3, 1000), Duration::from_millis(3));
        assert_eq!(reconnect_spread(50_000, 1000), Duration::from_secs(50));
        assert_eq!(reconnect_spread(50_000, 0), Duration::ZERO);
        assert_eq!(reconnect_spread(usize::MAX, 1), MAX_RECONNECT_SPREAD);
        assert_eq!(honoured(None), Duration::ZERO);
        assert_eq!(honoured(Some(1500)), Duration::from_millis(1500));
        assert_eq!(honoured(Some(u64::MAX)), MAX_RECONNECT_SPREAD);
    }

    #[cfg(feature = "server")]
    #[test]
    fn a_replica_counts_each_device_once() {
        let fleet = Fleet::new(2);
        let a = drover_model::DeviceId::new("dev-a").unwrap();
        let b = drover_model::DeviceId::new("dev-b").unwrap();
        assert_eq!(fleet.window(), Duration::ZERO);
        fleet.heard(&a);
        fleet.heard(&a);
        assert_eq!(fleet.window(), Duration::from_millis(500));
        fleet.heard(&b);
        assert_eq!(fleet.window(), Duration::from_secs(1));
    }
}
