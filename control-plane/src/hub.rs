//! Which devices this replica holds a live agent connection for, so that a
//! released intent is pushed at once. In memory on purpose: it describes this
//! replica's sockets, and nothing another replica needs.

use agent_core::DeviceId;
use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::mpsc;

#[derive(Default)]
pub struct Hub {
    /// A std Mutex: no await happens while it is held.
    sessions: Mutex<HashMap<DeviceId, (u64, mpsc::Sender<()>)>>,
    next_id: std::sync::atomic::AtomicU64,
    /// Woken on every release, for transports that deliver to all devices
    /// at once (NATS puts intents into a bucket).
    any: tokio::sync::Notify,
}

impl Hub {
    /// Registers a session; the returned receiver wakes when it has work.
    pub fn register(&self, device: &DeviceId) -> (u64, mpsc::Receiver<()>) {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Capacity 1: several wake-ups before the session looks coalesce.
        let (tx, rx) = mpsc::channel(1);
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions.insert(device.clone(), (id, tx));
        (id, rx)
    }

    /// Removes the session if it is still the device's current one.
    pub fn unregister(&self, device: &DeviceId, id: u64) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if sessions
            .get(device)
            .is_some_and(|(current, _)| *current == id)
        {
            sessions.remove(device);
        }
    }

    pub fn notify(&self, device: &DeviceId) {
        self.any.notify_one();
        let sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, tx)) = sessions.get(device) {
            let _ = tx.try_send(());
        }
    }

    /// Resolves after the next release of any intent.
    pub async fn released(&self) {
        self.any.notified().await
    }

    pub fn connected(&self) -> usize {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }
}
