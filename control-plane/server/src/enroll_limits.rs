//! How fast enrollment requests are taken (issue 55): per source address
//! (every request, before any work) and per enrollment token (each new
//! device the token would record). A flood from one host, or from many
//! hosts with one leaked image token, is refused with the time to wait;
//! a device already pending that asks again costs its token nothing.
//!
//! The limits are this replica's: with several replicas each takes its
//! own share. Over MQTT and NATS the control plane does not see a
//! device's address (the broker does), so only the token's limit applies
//! there; the brokers' own connection limits guard their doors.

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};
use std::net::IpAddr;
use std::num::NonZeroU32;

/// Requests a minute one address may send by default (a burst of as many).
pub const PER_ADDRESS_PER_MINUTE: u32 = 600;
/// New devices a minute one token may record by default (a burst of as
/// many): 10,000 devices of one image all started at once are in within
/// about eight minutes; a leaked token fills the pending cap no faster.
pub const PER_TOKEN_PER_MINUTE: u32 = 1200;
/// Keys held before the idle ones are dropped.
const PRUNE_ABOVE: usize = 4096;

/// The limits; a limit of 0 is none.
pub struct EnrollLimits {
    per_address: Option<DefaultKeyedRateLimiter<IpAddr>>,
    per_token: Option<DefaultKeyedRateLimiter<String>>,
    clock: DefaultClock,
}

impl std::fmt::Debug for EnrollLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnrollLimits")
            .field("per_address", &self.per_address.is_some())
            .field("per_token", &self.per_token.is_some())
            .finish()
    }
}

fn limiter<K: std::hash::Hash + Eq + Clone>(per_minute: u32) -> Option<DefaultKeyedRateLimiter<K>> {
    NonZeroU32::new(per_minute).map(|n| DefaultKeyedRateLimiter::keyed(Quota::per_minute(n)))
}

impl Default for EnrollLimits {
    fn default() -> Self {
        Self::new(PER_ADDRESS_PER_MINUTE, PER_TOKEN_PER_MINUTE)
    }
}

impl EnrollLimits {
    /// Requests a minute per address and new devices a minute per token.
    pub fn new(per_address_per_minute: u32, per_token_per_minute: u32) -> Self {
        Self {
            per_address: limiter(per_address_per_minute),
            per_token: limiter(per_token_per_minute),
            clock: DefaultClock::default(),
        }
    }

    /// No limit (tests of other things, benchmarks that measure the rest).
    pub fn none() -> Self {
        Self::new(0, 0)
    }

    /// Takes one request from `peer`; refused with what the device is told.
    pub fn address(&self, peer: IpAddr) -> Result<(), String> {
        let Some(limiter) = &self.per_address else {
            return Ok(());
        };
        prune(limiter);
        limiter.check_key(&peer).map_err(|not_until| {
            let wait = not_until.wait_time_from(self.clock.now());
            tracing::warn!(%peer, "enrollment requests from one address come too fast; refused");
            format!(
                "too many enrollment requests from {peer}; try again in {} s",
                wait.as_secs().max(1)
            )
        })
    }

    /// Takes one new device for the token named `name`.
    pub fn token(&self, name: &str) -> Result<(), String> {
        let Some(limiter) = &self.per_token else {
            return Ok(());
        };
        prune(limiter);
        limiter.check_key(&name.to_owned()).map_err(|not_until| {
            let wait = not_until.wait_time_from(self.clock.now());
            tracing::warn!(token = name, "new devices with one enrollment token come too fast; refused");
            format!(
                "too many new devices with the enrollment token {name} this minute; try again in {} s",
                wait.as_secs().max(1)
            )
        })
    }
}

/// Drops keys whose bucket is full again, when many are held: a flood from
/// many addresses costs memory for a minute, not for ever.
fn prune<K: std::hash::Hash + Eq + Clone>(limiter: &DefaultKeyedRateLimiter<K>) {
    if limiter.len() > PRUNE_ABOVE {
        limiter.retain_recent();
        limiter.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_past_its_burst_is_refused_and_another_is_not() {
        let limits = EnrollLimits::new(3, 0);
        let (a, b): (IpAddr, IpAddr) = ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        for _ in 0..3 {
            assert!(limits.address(a).is_ok());
        }
        let refused = limits.address(a).expect_err("the fourth in a minute");
        assert!(
            refused.contains("192.0.2.1") && refused.contains("try again in"),
            "{refused}"
        );
        assert!(
            limits.address(b).is_ok(),
            "another address has its own share"
        );
        assert!(limits.token("any").is_ok(), "no token limit was asked for");
    }

    #[test]
    fn a_token_past_its_burst_is_refused_and_another_is_not() {
        let limits = EnrollLimits::new(0, 2);
        assert!(limits.token("image").is_ok());
        assert!(limits.token("image").is_ok());
        let refused = limits.token("image").expect_err("the third");
        assert!(refused.contains("image"), "{refused}");
        assert!(limits.token("other").is_ok());
        assert!(limits.address("192.0.2.1".parse().unwrap()).is_ok());
    }

    #[test]
    fn idle_keys_are_dropped_when_many_are_held() {
        // A thousand a second: each bucket is full again a millisecond
        // after its one request, and then indistinguishable from none.
        let limits = EnrollLimits::new(60_000, 0);
        let held = |l: &EnrollLimits| l.per_address.as_ref().map_or(0, |l| l.len());
        for i in 0..=PRUNE_ABOVE as u32 {
            let peer = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            assert!(limits.address(peer).is_ok());
        }
        assert!(held(&limits) > PRUNE_ABOVE);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut next = 0x0b00_0000u32;
        while held(&limits) > PRUNE_ABOVE {
            assert!(
                std::time::Instant::now() < deadline,
                "idle keys were never dropped"
            );
            next += 1;
            assert!(
                limits
                    .address(IpAddr::from(std::net::Ipv4Addr::from(next)))
                    .is_ok()
            );
        }
        // Only those asked within the last millisecond or so are kept.
        assert!(held(&limits) < PRUNE_ABOVE / 2, "{}", held(&limits));
    }
}
