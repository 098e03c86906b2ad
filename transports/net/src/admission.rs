//! Who may hold a socket of a listener. A connection still in its
//! handshakes (TLS, the WebSocket upgrade with its token) holds a *pending*
//! slot: a few per peer address, a bounded number in all, each for a
//! bounded time. One that finished them holds an *established* slot. So a
//! stranger with idle sockets exhausts only the pending slots of their own
//! address, never the established connections of real clients, nor the
//! handshakes of clients at other addresses.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How many connections a listener admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections in their handshakes, in all.
    pub pending: usize,
    /// Connections in their handshakes from one address.
    pub pending_per_peer: usize,
    /// Connections past their handshakes, in all.
    pub established: usize,
    /// Connections past their handshakes from one address; None for a
    /// listener whose clients may share an address by the thousand (agents
    /// behind one site's NAT, each authenticated by its own token).
    pub established_per_peer: Option<usize>,
}

/// Why a connection was turned away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("this address has too many connections in their handshakes")]
    PeerPending,
    #[error("too many connections are in their handshakes")]
    Pending,
    #[error("this address has too many connections")]
    PeerEstablished,
    #[error("the listener holds as many connections as it may")]
    Established,
}

/// The slots of one listener.
#[derive(Debug)]
pub struct Admission {
    limits: Limits,
    pending: Arc<Semaphore>,
    established: Arc<Semaphore>,
    /// A std Mutex: held only to count, never across an await.
    per_peer: Mutex<HashMap<IpAddr, (usize, usize)>>,
    refused: AtomicU64,
}

/// A connection in its handshakes; dropping it frees the slot.
#[derive(Debug)]
pub struct Pending {
    admission: Arc<Admission>,
    peer: IpAddr,
    _permit: OwnedSemaphorePermit,
}

/// A connection past its handshakes; dropping it frees the slot.
#[derive(Debug)]
pub struct Established {
    admission: Arc<Admission>,
    peer: IpAddr,
    _permit: OwnedSemaphorePermit,
}

impl Admission {
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            pending: Arc::new(Semaphore::new(limits.pending)),
            established: Arc::new(Semaphore::new(limits.established)),
            per_peer: Mutex::new(HashMap::new()),
            refused: AtomicU64::new(0),
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Connections turned away so far (callers log at powers of two).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    fn count(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, (usize, usize)>> {
        self.per_peer.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn refuse(&self, why: Refused) -> Result<Pending, Refused> {
        self.refused.fetch_add(1, Ordering::Relaxed);
        Err(why)
    }

    /// The next connection on `listener` that gets a pending slot, None at
    /// `shutdown`. Those turned away are closed at once and logged at
    /// powers of two; a failed accept (out of files) waits 100 ms.
    pub async fn accept(
        self: &Arc<Self>,
        what: &str,
        listener: &tokio::net::TcpListener,
        shutdown: &tokio_util::sync::CancellationToken,
    ) -> Option<(tokio::net::TcpStream, std::net::SocketAddr, Pending)> {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = shutdown.cancelled() => return None,
            };
            let (tcp, peer) = match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(error = %e, "{what}: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            match self.admit(peer.ip()) {
                Ok(pending) => return Some((tcp, peer, pending)),
                Err(why) => {
                    let refused = self.refused();
                    if refused.is_power_of_two() {
                        tracing::warn!(%peer, refused, reason = %why, "{what}: connection closed at once");
                    }
                }
            }
        }
    }

    /// A new connection from `peer`: a pending slot, or why not.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Pending, Refused> {
        let mut counts = self.count();
        let entry = counts.entry(peer).or_default();
        if entry.0 >= self.limits.pending_per_peer {
            drop(counts);
            return self.refuse(Refused::PeerPending);
        }
        let Ok(permit) = self.pending.clone().try_acquire_owned() else {
            drop(counts);
            return self.refuse(Refused::Pending);
        };
        entry.0 += 1;
        Ok(Pending {
            admission: self.clone(),
            peer,
            _permit: permit,
        })
    }

    fn forget(&self, peer: IpAddr, pending: bool) {
        let mut counts = self.count();
        if let Some(entry) = counts.get_mut(&peer) {
            if pending {
                entry.0 = entry.0.saturating_sub(1);
            } else {
                entry.1 = entry.1.saturating_sub(1);
            }
            if *entry == (0, 0) {
                counts.remove(&peer);
            }
        }
    }
}

impl Pending {
    /// The handshakes are done: an established slot in place of this one.
    pub fn establish(self) -> Result<Established, Refused> {
        let admission = self.admission.clone();
        let peer = self.peer;
        {
            let mut counts = admission.count();
            let entry = counts.entry(peer).or_default();
            if admission
                .limits
                .established_per_peer
                .is_some_and(|limit| entry.1 >= limit)
            {
                drop(counts);
                admission.refused.fetch_add(1, Ordering::Relaxed);
                return Err(Refused::PeerEstablished);
            }
            let Ok(permit) = admission.established.clone().try_acquire_owned() else {
                drop(counts);
                admission.refused.fetch_add(1, Ordering::Relaxed);
                return Err(Refused::Established);
            };
            entry.1 += 1;
            drop(counts);
            // `self` drops below and gives its pending slot back.
            drop(self);
            Ok(Established {
                admission,
                peer,
                _permit: permit,
            })
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.admission.forget(self.peer, true);
    }
}

impl Drop for Established {
    fn drop(&mut self) {
        self.admission.forget(self.peer, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn one_address_fills_only_its_own_pending_slots() {
        let admission = Admission::new(Limits {
            pending: 4,
            pending_per_peer: 2,
            established: 3,
            established_per_peer: None,
        });
        let a1 = admission.admit(ip(1)).expect("a1");
        let _a2 = admission.admit(ip(1)).expect("a2");
        assert_eq!(admission.admit(ip(1)).err(), Some(Refused::PeerPending));
        let b1 = admission
            .admit(ip(2))
            .expect("another address still gets in");
        let _b2 = admission.admit(ip(2)).expect("b2");
        assert_eq!(admission.admit(ip(3)).err(), Some(Refused::Pending));
        // Established connections do not count against the pending ones.
        let established = a1.establish().expect("established");
        let _c = admission.admit(ip(3)).expect("a freed pending slot");
        let _b = b1.establish().expect("b established");
        drop(established);
        assert_eq!(admission.refused(), 2);
    }

    #[test]
    fn established_slots_are_bounded_in_all_and_per_address_when_asked() {
        let admission = Admission::new(Limits {
            pending: 8,
            pending_per_peer: 8,
            established: 2,
            established_per_peer: Some(1),
        });
        let one = admission
            .admit(ip(1))
            .expect("one")
            .establish()
            .expect("one");
        let again = admission.admit(ip(1)).expect("pending");
        assert_eq!(again.establish().err(), Some(Refused::PeerEstablished));
        let _two = admission
            .admit(ip(2))
            .expect("two")
            .establish()
            .expect("two");
        assert_eq!(
            admission.admit(ip(3)).expect("pending").establish().err(),
            Some(Refused::Established)
        );
        drop(one);
        let _three = admission
            .admit(ip(3))
            .expect("three")
            .establish()
            .expect("freed");
        // Counts go back to nothing once connections close.
        assert!(admission.count().get(&ip(1)).is_none());
    }
}
