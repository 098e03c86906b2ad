//! Drover's job model, shared by the agent and the control plane: validated
//! ids, intents, statuses and their outputs, the rules that parse an intent
//! or a cancel order off the wire, Ed25519 signatures and secrets sealed to
//! one device and job. Pure data and rules: no tokio, no store, no network,
//! so the control plane's rules crate can depend on it without a runtime.

pub mod credentials;
pub mod enroll;
pub mod failure;
pub mod ids;
pub mod layout;
pub mod logs;
pub mod model;
pub mod nkey;
pub mod reason;
pub mod sealed;
pub mod signing;
pub mod transport;
pub mod wire;

pub use ids::{DeviceId, IdError, JobId};
pub use model::{
    Heartbeat, Intent, JobKind, JobOutput, JobState, JobStatus, StepRecord, StepState,
};

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
