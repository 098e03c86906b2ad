//! Why a job failed or was refused, as a fact a reader can act on, and
//! the signals agents older than the fact sent instead.

use serde::{Deserialize, Serialize};

/// Why a job failed or was refused. The control plane acts on some of
/// these (an alert on [`Failure::ResumeLoop`]; nothing decided by a status
/// answering an intent whose signature did not hold).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Failure {
    /// One of the job's steps failed; the step's error says why.
    StepFailed,
    /// The agent stopped while the job ran more often than its limit: a
    /// crash or reboot loop (A10).
    ResumeLoop,
    /// The intent's signature did not hold: not the control plane's intent.
    SignatureRefused,
    /// The intent could not be read, or its parameters were invalid.
    Malformed,
    /// This agent does not know, or does not run, the job's kind.
    UnknownKind,
    /// The agent's queue of unfinished jobs was full.
    QueueFull,
    /// The intent named another device. Never recorded: only the transport
    /// hears it.
    OtherDevice,
    /// A reason this build does not know, from a newer agent.
    #[serde(other)]
    Other,
}

/// What an agent older than [`JobStatus::failure`] wrote in a job's error
/// when it gave up on a crash or reboot loop. Agents still write it, for
/// control planes older than the field.
pub const RESUME_LOOP_TEXT: &str = "a crash or reboot loop";

/// The kind an agent reports for an intent whose signature did not hold
/// (its kind was not read). Agents still write it, for older control planes.
pub const UNVERIFIED_KIND: &str = "unverified";
