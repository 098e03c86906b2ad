//! Drover's device-side core: the job model shared with the control plane, the
//! durable job store, the sequential executor that runs step chains, boot
//! tracking and the local status socket. It does no network I/O: transports
//! turn bytes into calls on [`executor::Agent`].

pub mod backoff;
pub mod boot;
pub mod chain;
pub mod clock;
pub mod credentials;
pub mod dbfile;
pub mod executor;
pub mod facts;
pub mod ids;
pub mod lifecycle;
pub mod logging;
pub mod model;
pub mod report;
pub mod sealed;
pub mod shutdown;
pub mod signing;
pub mod status_socket;
pub mod store;
#[cfg(test)]
mod store_fixtures;
#[cfg(feature = "sled-store")]
pub mod store_sled;
pub mod wire;

pub use ids::{DeviceId, IdError, JobId};
pub use model::{
    Heartbeat, Intent, JobKind, JobOutput, JobState, JobStatus, StepRecord, StepState,
};

/// `println!` for command-line tools: ends the process quietly when stdout
/// was closed (a pager, `head` or `grep -q` went away) instead of panicking
/// on the broken pipe.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout().lock(), $($arg)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
        }
    }};
}

/// Upper bound of a job's latest error and of each step's error, in bytes.
pub const MAX_ERROR_BYTES: usize = 1024;
/// Upper bound of the step records a job may hold.
pub const MAX_STEPS: usize = 16;

/// Cuts `text` to at most `max` bytes on a character boundary, marking the cut.
pub fn bounded(text: impl Into<String>, max: usize) -> String {
    let mut text = text.into();
    if text.len() <= max {
        return text;
    }
    let marker = "…[truncated]";
    let mut cut = max.saturating_sub(marker.len());
    while cut > 0 && !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    text.push_str(marker);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_keeps_short_text_and_cuts_long_text_on_a_char_boundary() {
        assert_eq!(bounded("abc", 10), "abc");
        let long = "é".repeat(2000);
        let cut = bounded(long, MAX_ERROR_BYTES);
        assert!(cut.len() <= MAX_ERROR_BYTES);
        assert!(cut.ends_with("[truncated]"));
    }
}
