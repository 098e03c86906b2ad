//! What the control plane asks of mosquitto's dynamic security plugin
//! about devices' logins, and what it has heard back (issue 55): the
//! bookkeeping only, no I/O; `crate::joining` sends and reads.
//!
//! Three things found at 10,000 devices enrolling at once shaped it:
//! - **A window.** mosquitto reads one packet per connection per turn of
//!   its loop, and the plugin of mosquitto 2.0 writes its whole file at
//!   every change (≈20 ms with 10,000 logins). Thousands of commands sent
//!   at once sat in the control plane's socket ahead of its keep-alive
//!   ping, the broker answered the ping too late, and the link dropped
//!   every minute and a half, losing what was queued. At most
//!   [`WINDOW`] commands are unanswered at a time; the rest wait here.
//! - **Answers, not sends.** The plugin answers each command on its
//!   response topic at QoS 0: lost if the link drops. A command counts as
//!   done when its answer comes; one unanswered after a reconnect or for
//!   [`ANSWER_WITHIN`] is sent again.
//! - **Make, do not reset.** `setClientPassword` makes the plugin kick a
//!   connected client, so a device that asked twice before it got in was
//!   thrown out by its second admission. A login is made with
//!   `createClient`; only when one is there already and not known to be
//!   the same is its password set.
//!
//! Removals go first and are never held back by the window: a revoked
//! device is cut off within seconds however many admissions wait.

use drover_model::DeviceId;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::time::{Duration, Instant};

/// At most this many commands unanswered by the plugin at a time.
pub const WINDOW: usize = 16;
/// A command unanswered this long is taken as lost and sent again.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(30);
/// A device asking again within this long after its login was made is
/// let be (its request crossed the answer); after it, its login evidently
/// does not work and is made or set again.
pub const ADMIT_AGAIN_AFTER: Duration = Duration::from_secs(60);
/// Logins made are remembered at least this long once many are held.
const REMEMBER: Duration = Duration::from_secs(600);
const PRUNE_AT: usize = 16_384;

/// A command for the plugin about one device's login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `createClient` with this password.
    Create(String),
    /// `setClientPassword`.
    SetPassword(String),
    /// `deleteClient`.
    Delete,
}

impl Command {
    /// The plugin's name for it, as its answer says it.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Create(_) => "createClient",
            Command::SetPassword(_) => "setClientPassword",
            Command::Delete => "deleteClient",
        }
    }
}

/// A command wanted or sent, and what an existing login means for it.
#[derive(Debug, Clone)]
struct Order {
    command: Command,
    /// A `Create` sent again after its answer was lost: a login already
    /// there is taken to be the one the first made.
    again: bool,
}

#[derive(Debug)]
struct Sent {
    order: Order,
    at: Instant,
}

/// A login the plugin said it made or set: a digest of its password (keyed
/// per process, so nothing here opens a login), when, and whether it was
/// the plugin's own answer (not assumed after a lost one).
#[derive(Debug, Clone, Copy)]
struct Made {
    digest: u64,
    at: Instant,
    sure: bool,
}

#[derive(Default)]
pub struct Admissions {
    /// Devices in the order their commands are to go (removals in front);
    /// an id whose order was dropped meanwhile is skipped.
    queue: VecDeque<DeviceId>,
    wanted: HashMap<DeviceId, Order>,
    sent: HashMap<DeviceId, Sent>,
    made: HashMap<DeviceId, Made>,
    keys: std::collections::hash_map::RandomState,
}

impl Admissions {
    fn digest(&self, password: &str) -> u64 {
        self.keys.hash_one(password)
    }

    /// `device`, accepted, is to log in with `password`. False when nothing
    /// is to be done: the same is wanted or sent already, or its login was
    /// made lately.
    pub fn admit(&mut self, device: &DeviceId, password: &str, now: Instant) -> bool {
        let same = |command: &Command| matches!(command, Command::Create(p) | Command::SetPassword(p) if p == password);
        if self
            .sent
            .get(device)
            .is_some_and(|s| same(&s.order.command))
            || self.wanted.get(device).is_some_and(|o| same(&o.command))
        {
            return false;
        }
        let digest = self.digest(password);
        if self
            .made
            .get(device)
            .is_some_and(|m| m.digest == digest && now.duration_since(m.at) < ADMIT_AGAIN_AFTER)
        {
            return false;
        }
        self.want(device, Command::Create(password.to_owned()), false, false);
        true
    }

    /// `device`'s login is to go, before anything else waiting.
    pub fn remove(&mut self, device: &DeviceId) {
        self.made.remove(device);
        self.want(device, Command::Delete, false, true);
    }

    fn want(&mut self, device: &DeviceId, command: Command, again: bool, first: bool) {
        let fresh = self
            .wanted
            .insert(device.clone(), Order { command, again })
            .is_none();
        if first {
            self.queue.push_front(device.clone());
        } else if fresh {
            self.queue.push_back(device.clone());
        }
    }

    /// The plugin answered `name` for `device` (`error` if it failed).
    /// Returns whether it was the answer to what was sent.
    pub fn answered(
        &mut self,
        device: &DeviceId,
        name: &str,
        error: Option<&str>,
        now: Instant,
    ) -> bool {
        let Some(sent) = self.sent.get(device) else {
            return false;
        };
        if sent.order.command.name() != name {
            return false;
        }
        let Some(Sent { order, .. }) = self.sent.remove(device) else {
            return false;
        };
        match (order.command, error) {
            (Command::Create(password) | Command::SetPassword(password), None) => {
                self.made_now(device, &password, now, true);
            }
            (Command::Create(password), Some("Client already exists")) => {
                let digest = self.digest(&password);
                let known = self
                    .made
                    .get(device)
                    .is_some_and(|m| m.digest == digest && m.sure);
                if order.again {
                    self.made_now(device, &password, now, false);
                } else if known {
                    self.made_now(device, &password, now, true);
                } else if !self.wanted.contains_key(device) {
                    self.want(device, Command::SetPassword(password), false, true);
                }
            }
            _ => {}
        }
        true
    }

    fn made_now(&mut self, device: &DeviceId, password: &str, now: Instant, sure: bool) {
        if self.made.len() >= PRUNE_AT {
            self.made.retain(|_, m| now.duration_since(m.at) < REMEMBER);
        }
        let digest = self.digest(password);
        self.made.insert(
            device.clone(),
            Made {
                digest,
                at: now,
                sure,
            },
        );
    }

    /// The link to the broker was lost and is back: answers to what was
    /// sent may have been lost with it, so it goes again, first.
    pub fn reconnected(&mut self) {
        let sent: Vec<_> = self.sent.drain().collect();
        for (device, sent) in sent {
            self.again(device, sent.order);
        }
    }

    /// Sends `order` again for `device` unless something newer is wanted.
    fn again(&mut self, device: DeviceId, order: Order) {
        if self.wanted.contains_key(&device) {
            return;
        }
        let again = matches!(order.command, Command::Create(_));
        self.want(&device, order.command, again, true);
    }

    /// The next command to send now, if the window has room: removals
    /// always; commands unanswered for [`ANSWER_WITHIN`] go again. A
    /// device with a command unanswered gets no other until it is.
    pub fn next(&mut self, now: Instant) -> Option<(DeviceId, Command)> {
        let lost: Vec<DeviceId> = self
            .sent
            .iter()
            .filter(|(_, s)| now.duration_since(s.at) >= ANSWER_WITHIN)
            .map(|(device, _)| device.clone())
            .collect();
        for device in lost {
            if let Some(sent) = self.sent.remove(&device) {
                self.again(device, sent.order);
            }
        }
        let mut index = 0;
        while index < self.queue.len() {
            let device = &self.queue[index];
            let Some(order) = self.wanted.get(device) else {
                self.queue.remove(index);
                continue;
            };
            let removal = order.command == Command::Delete;
            if !removal && self.sent.len() >= WINDOW {
                return None;
            }
            if self.sent.contains_key(device) && !removal {
                index += 1;
                continue;
            }
            let device = self.queue.remove(index)?;
            let order = self.wanted.remove(&device)?;
            let command = order.command.clone();
            self.sent.insert(device.clone(), Sent { order, at: now });
            return Some((device, command));
        }
        None
    }

    /// What [`Admissions::next`] gave for `device` was not sent after all.
    pub fn dropped(&mut self, device: &DeviceId) {
        self.sent.remove(device);
    }

    /// Commands sent and not answered.
    pub fn unanswered(&self) -> usize {
        self.sent.len()
    }

    /// Commands waiting for room.
    pub fn waiting(&self) -> usize {
        self.wanted.len()
    }
}

/// What is asked of the broker's plugin about devices' logins, and what
/// wakes the task that sends it (by `crate::joining`).
#[derive(Default)]
pub(crate) struct Logins {
    state: std::sync::Mutex<Admissions>,
    pub(crate) wake: tokio::sync::Notify,
}

impl Logins {
    pub(crate) fn state(&self) -> std::sync::MutexGuard<'_, Admissions> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The link is connected again: what was unanswered goes again.
    pub(crate) fn reconnected(&self) {
        self.state().reconnected();
        self.wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> DeviceId {
        DeviceId::new(name).expect("id")
    }

    fn drain(a: &mut Admissions, now: Instant) -> Vec<(String, Command)> {
        std::iter::from_fn(|| a.next(now))
            .map(|(d, c)| (d.as_str().to_owned(), c))
            .collect()
    }

    #[test]
    fn at_most_a_window_of_commands_is_unanswered_and_answers_make_room() {
        let mut a = Admissions::default();
        let now = Instant::now();
        for n in 0..100 {
            assert!(a.admit(&id(&format!("pi-{n}")), "pw", now));
        }
        let first = drain(&mut a, now);
        assert_eq!(first.len(), WINDOW);
        assert_eq!(first[0], ("pi-0".to_owned(), Command::Create("pw".into())));
        assert_eq!(a.waiting(), 100 - WINDOW);
        assert!(a.answered(&id("pi-0"), "createClient", None, now));
        assert!(!a.answered(&id("pi-0"), "createClient", None, now), "once");
        assert_eq!(
            drain(&mut a, now),
            [(format!("pi-{WINDOW}"), Command::Create("pw".into()))]
        );
        // A removal is not held back by a full window, and goes first.
        a.remove(&id("pi-99"));
        assert_eq!(drain(&mut a, now), [("pi-99".to_owned(), Command::Delete)]);
    }

    #[test]
    fn a_device_asking_again_is_not_admitted_twice() {
        let mut a = Admissions::default();
        let now = Instant::now();
        let pi = id("pi-1");
        assert!(a.admit(&pi, "pw", now));
        assert!(!a.admit(&pi, "pw", now), "waiting");
        assert_eq!(drain(&mut a, now).len(), 1);
        assert!(!a.admit(&pi, "pw", now), "sent");
        a.answered(&pi, "createClient", None, now);
        assert!(
            !a.admit(&pi, "pw", now + ADMIT_AGAIN_AFTER / 2),
            "made lately"
        );
        // Asking long after its login was made: it evidently does not work.
        assert!(a.admit(&pi, "pw", now + ADMIT_AGAIN_AFTER));
        // Another password (another key) is never held back.
        let mut b = Admissions::default();
        b.admit(&pi, "pw", now);
        drain(&mut b, now);
        b.answered(&pi, "createClient", None, now);
        assert!(b.admit(&pi, "other", now));
    }

    #[test]
    fn an_existing_login_gets_its_password_set_only_when_not_known_to_be_the_same() {
        let now = Instant::now();
        let pi = id("pi-1");
        // Unknown login (a stale one, or made before a restart): set.
        let mut a = Admissions::default();
        a.admit(&pi, "pw", now);
        drain(&mut a, now);
        a.answered(&pi, "createClient", Some("Client already exists"), now);
        assert_eq!(
            drain(&mut a, now),
            [("pi-1".to_owned(), Command::SetPassword("pw".into()))]
        );
        a.answered(&pi, "setClientPassword", None, now);
        // Made by this control plane with this password: left alone.
        let later = now + ADMIT_AGAIN_AFTER;
        assert!(a.admit(&pi, "pw", later));
        drain(&mut a, later);
        a.answered(&pi, "createClient", Some("Client already exists"), later);
        assert!(drain(&mut a, later).is_empty());
    }

    #[test]
    fn commands_whose_answers_were_lost_go_again_and_an_existing_login_is_then_ours() {
        let now = Instant::now();
        let (pi, gone) = (id("pi-1"), id("pi-2"));
        let mut a = Admissions::default();
        a.admit(&pi, "pw", now);
        a.admit(&gone, "pw", now);
        assert_eq!(drain(&mut a, now).len(), 2);
        // A removal does not wait for the answer to what went before.
        a.remove(&gone);
        assert_eq!(drain(&mut a, now), [("pi-2".to_owned(), Command::Delete)]);
        // The link dropped: both go again, the removal in pi-2's place.
        a.reconnected();
        let again = drain(&mut a, now);
        assert_eq!(again.len(), 2, "{again:?}");
        assert!(again.contains(&("pi-2".to_owned(), Command::Delete)));
        assert!(again.contains(&("pi-1".to_owned(), Command::Create("pw".into()))));
        // The first had made it: no password set, no device kicked.
        a.answered(&pi, "createClient", Some("Client already exists"), now);
        assert!(drain(&mut a, now).is_empty());
        assert!(!a.admit(&pi, "pw", now));
        // Unanswered for ANSWER_WITHIN: sent again.
        a.answered(&gone, "deleteClient", None, now);
        a.remove(&pi);
        assert_eq!(drain(&mut a, now).len(), 1);
        assert!(drain(&mut a, now + ANSWER_WITHIN / 2).is_empty());
        assert_eq!(
            drain(&mut a, now + ANSWER_WITHIN),
            [("pi-1".to_owned(), Command::Delete)]
        );
        // An answer to something else is not taken for it.
        assert!(!a.answered(&pi, "createClient", None, now));
        assert!(a.answered(&pi, "deleteClient", Some("Client not found"), now));
        assert_eq!(a.unanswered(), 0);
    }
}
