//! Step chains: a job kind is a list of named, idempotent steps. A step
//! returns what should happen next; the executor records it durably and acts.

use drover_model::ids::JobId;
use drover_model::model::{JobKind, JobOutput};
use jiff::Timestamp;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a step asks for once it has run.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutcome {
    /// The step's work is done; go on to the next step.
    Done,
    /// Not yet: run this step again after `after` (a lock held, a wait).
    /// The step bounds its own waiting from its durable `started_at`.
    RetryAfter { after: Duration, reason: String },
    /// The device must reboot; the next step runs under a new boot id.
    Reboot,
    /// The job fails with this error.
    Fail(String),
    /// The job fails with this error, and `reason` holds the failing
    /// program's own words on why (apt's `E:` lines, say): they reach the
    /// job's status, cleaned and bounded.
    FailWithReason { error: String, reason: Vec<String> },
}

/// What a step may see and change while it runs.
pub struct StepContext<'a> {
    pub job_id: JobId,
    pub step: &'a str,
    /// What the job was asked to do, with its parameters; None for a job
    /// started locally (`drover-agent upgrade`).
    pub kind: Option<&'a JobKind>,
    /// The step's first start, durable across restarts: deadlines count from here.
    pub started_at: Timestamp,
    /// The job's durable start: the whole job's budget counts from here,
    /// across calls, retries and resumes.
    pub job_started_at: Timestamp,
    /// The whole job's budget (the intent's `timeoutSeconds`).
    pub budget: Duration,
    /// How many times this step already ran to an outcome.
    pub tries: u32,
    /// The job's output so far; a step fills in what it found.
    pub output: &'a mut Option<JobOutput>,
}

/// A job kind's implementation.
pub trait Chain: Send + Sync {
    /// The kind's wire name (`systemUpgradeV1`), also the capability advertised.
    fn kind(&self) -> &'static str;
    /// The step names, in order. They never change for a kind, so a job
    /// resumed by a newer agent finds its place.
    fn steps(&self) -> &'static [&'static str];
    fn run_step<'a>(&'a self, ctx: StepContext<'a>) -> BoxFuture<'a, StepOutcome>;
    /// Reboots the device. Called only after AwaitingReboot is durable.
    fn reboot(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async { Err("this job kind cannot reboot the device".to_owned()) })
    }
}
