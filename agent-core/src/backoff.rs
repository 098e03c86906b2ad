//! How an agent's link waits between connection attempts, one rule for all
//! three transports: exponential from `initial`, capped at `max`, jittered
//! in the upper half so a fleet does not reconnect in step; a connection
//! that lasted longer than `max` starts the count again, so a broker or
//! control plane restarted after a day of service is retried within
//! `initial`, not after `max`.

use crate::executor::Agent;
use drover_model::transport::Transport;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How one session of a link (a connection and everything done on it)
/// ended, which decides when the next one starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEnd {
    /// The agent is stopping: no next session.
    Shutdown,
    /// The peer ended it cleanly (a control plane restarting): the next
    /// one starts soon, counting from the start.
    Closed,
    /// Refused with one credential and another is left to try: at once.
    RetryNow,
    /// It failed (already logged by the link, with its reason): the next
    /// one waits its backoff; the reason becomes the link's last error.
    Failed(String),
}

/// The one reconnect rule of every transport's agent link. A link's loop
/// is `loop { supervisor.start(); let end = session().await; if
/// !supervisor.ended(&agent, end, &shutdown).await { return } }`: when the
/// next session starts, the backoff's reset, and the link state the status
/// socket shows (`connected`, `last_error`) are decided here, once.
pub struct Supervisor {
    backoff: Backoff,
    started: tokio::time::Instant,
    transport: Transport,
}

impl Supervisor {
    pub fn new(agent: &Agent, transport: Transport, backoff: Backoff) -> Self {
        agent.update_link(|l| l.transport = Some(transport));
        Self {
            backoff,
            started: tokio::time::Instant::now(),
            transport,
        }
    }

    /// Failed sessions in a row so far.
    pub fn failures(&self) -> u32 {
        self.backoff.failures()
    }

    /// A session starts now.
    pub fn start(&mut self) {
        self.started = tokio::time::Instant::now();
    }

    /// The session ended with `end`: waits as long as the rule says and
    /// returns true for another session, false when the link should stop.
    pub async fn ended(
        &mut self,
        agent: &Agent,
        end: SessionEnd,
        shutdown: &CancellationToken,
    ) -> bool {
        if end != SessionEnd::RetryNow {
            agent.update_link(|l| l.connected = false);
        }
        if shutdown.is_cancelled() {
            return false;
        }
        let delay = match end {
            SessionEnd::Shutdown => return false,
            SessionEnd::RetryNow => return true,
            SessionEnd::Closed => {
                self.backoff.reset();
                self.backoff.first()
            }
            SessionEnd::Failed(reason) => {
                agent.update_link(|l| l.last_error = Some(reason));
                self.backoff.failed(self.started.elapsed())
            }
        };
        tracing::debug!(
            ?delay,
            transport = %self.transport,
            "reconnecting after a delay"
        );
        tokio::select! {
            _ = tokio::time::sleep(delay) => true,
            _ = shutdown.cancelled() => false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    failures: u32,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max: max.max(initial),
            failures: 0,
        }
    }

    /// A connection (or an attempt) ended after `lasted`: the delay before
    /// the next attempt.
    pub fn failed(&mut self, lasted: Duration) -> Duration {
        if lasted > self.max {
            self.failures = 0;
        }
        self.failures = self.failures.saturating_add(1);
        delay(self.failures, self.initial, self.max)
    }

    /// A connection ended as it should (no error): the next attempt counts
    /// from the start.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// The delay of a first attempt (after a connection ended cleanly).
    pub fn first(&self) -> Duration {
        delay(1, self.initial, self.max)
    }

    /// Failures in a row so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

/// The cap of an agent's backoff unless its config says otherwise
/// (`[transport] backoff_max_seconds`).
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(60);

/// The delay before attempt `failures` (1-based): `initial` doubled per
/// failure, capped at `max`, anywhere in the upper half of that ceiling.
pub fn delay(failures: u32, initial: Duration, max: Duration) -> Duration {
    let exp = initial.saturating_mul(2u32.saturating_pow(failures.saturating_sub(1).min(20)));
    let ceiling = exp.min(max);
    let half = ceiling / 2;
    half + Duration::from_millis(fastrand::u64(0..=half.as_millis() as u64))
}

/// A random wait in `[0, window]`: where in a window one device starts
/// (a fleet spread over it, decision 0020).
pub fn within(window: Duration) -> Duration {
    let millis = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(fastrand::u64(0..=millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_grows_to_its_cap_with_jitter() {
        let initial = Duration::from_secs(1);
        let max = Duration::from_secs(60);
        for failures in 1..40 {
            let d = delay(failures, initial, max);
            let ceiling = initial
                .saturating_mul(2u32.saturating_pow((failures - 1).min(20)))
                .min(max);
            assert!(d >= ceiling / 2 && d <= ceiling, "{failures}: {d:?}");
        }
        assert!(delay(30, initial, max) <= max);
    }

    #[test]
    fn a_connection_that_lasted_starts_the_count_again() {
        let initial = Duration::from_secs(1);
        let max = Duration::from_secs(60);
        let mut backoff = Backoff::new(initial, max);
        // Quick failures in a row climb to the cap.
        for _ in 0..10 {
            backoff.failed(Duration::from_millis(5));
        }
        assert_eq!(backoff.failures(), 10);
        assert!(backoff.failed(Duration::from_millis(5)) >= max / 2);
        // A connection that served for longer than the cap ended: the next
        // attempt comes within `initial`, not after the cap.
        let next = backoff.failed(Duration::from_secs(3600));
        assert_eq!(backoff.failures(), 1);
        assert!(next <= initial, "{next:?}");
        backoff.reset();
        assert_eq!(backoff.failures(), 0);
    }
}
