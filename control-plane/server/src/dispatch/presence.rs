//! What this replica knows of each device's connection, shared with the
//! API and the engine.

use drover_model::DeviceId;
use drover_model::transport::Transport;
use jiff::{SignedDuration, Timestamp};
use std::collections::HashMap;
use std::sync::Mutex;

/// What this replica knows of a device's connection right now.
#[derive(Debug, Clone, PartialEq)]
pub struct Live {
    pub transport: Transport,
    pub connected: bool,
    pub last_seen: Timestamp,
    pub last_heartbeat: Option<Timestamp>,
}

/// Live presence, shared with the API so that it can show fresh times.
#[derive(Default)]
pub struct Presence {
    /// A std Mutex: nothing awaits while it is held.
    live: Mutex<HashMap<DeviceId, Live>>,
    /// Devices whose agent said hello since the engine last looked: a
    /// deployment with a pending target there passes at once.
    arrivals: Mutex<Arrivals>,
    arrived: tokio::sync::Notify,
}

#[derive(Default)]
struct Arrivals {
    devices: Vec<DeviceId>,
    /// More arrived than are kept: every deployment should pass.
    overflow: bool,
}

/// Arrivals kept between two looks of the engine.
const MAX_ARRIVALS: usize = 65_536;

/// How long a device counts as online after it was last seen (its stored
/// last-seen time is refreshed every [`super::PRESENCE_PERSIST`]).
pub const ONLINE_WINDOW: SignedDuration = SignedDuration::from_secs(2 * 300 + 60);

impl Presence {
    /// Whether the device is online: connected to this replica and seen
    /// lately, or (when another replica holds it) seen lately as stored.
    pub fn online(
        &self,
        device: &DeviceId,
        stored_last_seen: Option<Timestamp>,
        now: Timestamp,
    ) -> bool {
        let recent = |seen: Timestamp| now.duration_since(seen) <= ONLINE_WINDOW;
        match self.get(device) {
            Some(live) => live.connected && recent(live.last_seen),
            None => stored_last_seen.is_some_and(recent),
        }
    }

    /// For tests that play the fleet: the device was seen at `at`.
    #[cfg(test)]
    pub(crate) fn simulate_seen(&self, device: &DeviceId, at: Timestamp, arrived: bool) {
        self.update(device, |_| {
            // Any transport: no link of a test that plays the fleet sends.
            Some(Live {
                transport: Transport::WebSocket,
                connected: true,
                last_seen: at,
                last_heartbeat: Some(at),
            })
        });
        if arrived {
            self.arrive(device);
        }
    }

    /// For tests that play the fleet: the device's connection ended.
    #[cfg(test)]
    pub(crate) fn simulate_gone(&self, device: &DeviceId) {
        self.update(device, |live| {
            live.map(|l| Live {
                connected: false,
                ..l.clone()
            })
        });
    }

    pub(super) fn arrive(&self, device: &DeviceId) {
        {
            let mut arrivals = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
            if arrivals.devices.len() < MAX_ARRIVALS {
                arrivals.devices.push(device.clone());
            } else {
                arrivals.overflow = true;
            }
        }
        self.arrived.notify_one();
    }

    /// Resolves when a device arrived (see [`Presence::take_arrivals`]).
    pub async fn arrived(&self) {
        self.arrived.notified().await
    }

    /// The devices that arrived since the last call; `true` when more did
    /// than were kept.
    pub fn take_arrivals(&self) -> (Vec<DeviceId>, bool) {
        let mut arrivals = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
        let taken = std::mem::take(&mut *arrivals);
        (taken.devices, taken.overflow)
    }

    pub fn get(&self, device: &DeviceId) -> Option<Live> {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(device)
            .cloned()
    }

    /// Devices connected to this replica, per transport.
    pub fn connected(&self) -> HashMap<Transport, usize> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let mut counts = HashMap::new();
        for entry in live.values().filter(|l| l.connected) {
            *counts.entry(entry.transport).or_insert(0) += 1;
        }
        counts
    }

    pub(super) fn update(
        &self,
        device: &DeviceId,
        change: impl FnOnce(Option<&mut Live>) -> Option<Live>,
    ) {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        match live.get_mut(device) {
            Some(entry) => {
                if let Some(new) = change(Some(entry)) {
                    *entry = new;
                }
            }
            None => {
                if let Some(new) = change(None) {
                    live.insert(device.clone(), new);
                }
            }
        }
    }
}
