//! The job lifecycle as pure functions: admission of an intent and the
//! transition of a job record on each event. No I/O happens here; the
//! executor persists what these return and then performs the next action.

use crate::chain::StepOutcome;
use crate::store::{JobRecord, Origin};
use drover_model::failure::{Failure, RESUME_LOOP_TEXT};
use drover_model::ids::DeviceId;
use drover_model::model::{Intent, JobState, JobStatus, StepRecord, StepState};
use drover_model::wire::{CancelOrder, IntentError};
use drover_model::{MAX_ERROR_BYTES, bounded};
use jiff::Timestamp;
use std::time::Duration;

/// What the agent knows when an intent arrives.
pub struct AdmitContext<'a> {
    pub device_id: &'a DeviceId,
    pub boot_id: &'a str,
    /// The device's clock, for the timestamps recorded.
    pub now: Timestamp,
    /// The control plane's time as the agent last heard it (or the device's
    /// own clock before it heard any): expiry is judged by it (A12).
    pub control_plane_now: Timestamp,
    pub arrival: u64,
    /// Jobs queued or running (A2).
    pub unfinished: usize,
    /// The steps of the intent's kind, or None when this agent lacks the kind.
    pub steps: Option<&'static [&'static str]>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// A new job, recorded as Accepted or Waiting (or Expired on arrival).
    New(JobRecord),
    /// The job id is known: answer with the stored status, run nothing (A1).
    Duplicate(JobRecord),
    /// Refused with a reason, recorded so a redelivery gets the same answer.
    Refused(JobRecord),
}

/// Upper bound of unfinished jobs an agent holds; beyond it an intent is
/// refused with a reason, so a flood cannot grow the queue without bound.
pub const MAX_UNFINISHED: usize = 64;

/// Decides what to do with an intent. `existing` is the stored record with
/// the same job id, if any. An error without a job id cannot be recorded and
/// is returned to the transport to log and answer; so is an intent addressed
/// to another device, which is dropped without a trace in the store so that
/// it can never shadow this device's own job of the same id (A11).
pub fn admit(
    existing: Option<JobRecord>,
    parsed: Result<Intent, IntentError>,
    ctx: &AdmitContext<'_>,
) -> Result<Admission, IntentError> {
    let addressee = match &parsed {
        Ok(intent) => Some(&intent.device_id),
        Err(error) => error.device_id.as_ref(),
    };
    if let Some(other) = addressee.filter(|d| *d != ctx.device_id) {
        let (job_id, attempt) = match &parsed {
            Ok(intent) => (Some(intent.job_id), intent.attempt),
            Err(error) => (error.job_id, error.attempt),
        };
        return Err(IntentError {
            job_id,
            device_id: Some(other.clone()),
            kind: None,
            attempt,
            reason: format!(
                "intent is for device {other}, this agent is {}; dropped without recording it",
                ctx.device_id
            ),
            failure: Failure::OtherDevice,
        });
    }
    // A recorded refusal never shadows a valid intent of the same id: the
    // control plane's own redelivery would have been refused the same way, so
    // the refused copy was not the control plane's intent.
    let superseded = match existing {
        Some(record) if record.gives_way() && parsed.is_ok() => Some(record.status.seq),
        Some(record) => return Ok(Admission::Duplicate(record)),
        None => None,
    };
    let intent = match parsed {
        Ok(intent) => intent,
        Err(error) => {
            let Some(job_id) = error.job_id else {
                return Err(error);
            };
            let mut status = new_status(ctx, job_id, error.attempt);
            status.kind = error.kind.clone().unwrap_or_else(|| "unknown".into());
            return Ok(Admission::Refused(refuse(
                status,
                &error.reason,
                error.failure,
                ctx,
            )));
        }
    };
    let mut status = new_status(ctx, intent.job_id, intent.attempt);
    status.kind = intent.kind.name().into();
    if let Some(seq) = superseded {
        status.seq = seq + 1;
    }
    if ctx.unfinished >= MAX_UNFINISHED {
        let reason = format!(
            "this agent's queue is full ({MAX_UNFINISHED} unfinished jobs); send it again later"
        );
        return Ok(Admission::Refused(refuse(
            status,
            &reason,
            Failure::QueueFull,
            ctx,
        )));
    }
    let Some(steps) = ctx.steps else {
        let reason = format!(
            "this agent does not support job kind {}",
            intent.kind.name()
        );
        return Ok(Admission::Refused(refuse(
            status,
            &reason,
            Failure::UnknownKind,
            ctx,
        )));
    };
    status.steps = steps.iter().map(|s| StepRecord::pending(s)).collect();
    if ctx.control_plane_now >= intent.expires_at {
        status.state = JobState::Expired;
        status.finished_at = Some(ctx.now);
        status.error = Some(format!(
            "intent expired at {} before it could start",
            intent.expires_at
        ));
    } else if ctx.unfinished > 0 {
        status.state = JobState::Waiting;
    }
    Ok(Admission::New(JobRecord {
        intent: Some(intent),
        status,
        origin: Origin::Fleet,
        arrival: ctx.arrival,
        resumes: 0,
        reboot_from_boot: None,
    }))
}

fn new_status(ctx: &AdmitContext<'_>, job_id: drover_model::JobId, attempt: u32) -> JobStatus {
    JobStatus {
        job_id,
        device_id: ctx.device_id.clone(),
        attempt,
        kind: String::new(),
        state: JobState::Accepted,
        steps: Vec::new(),
        error: None,
        output: None,
        accepted_at: ctx.now,
        started_at: None,
        finished_at: None,
        boot_id: ctx.boot_id.to_owned(),
        completion_heartbeat_at: None,
        seq: 1,
        failure: None,
        reason: Vec::new(),
    }
}

fn refuse(
    mut status: JobStatus,
    reason: &str,
    failure: Failure,
    ctx: &AdmitContext<'_>,
) -> JobRecord {
    status.state = JobState::Rejected;
    status.error = Some(bounded(reason, MAX_ERROR_BYTES));
    status.failure = Some(failure);
    status.finished_at = Some(ctx.now);
    ended_without_intent(status, ctx)
}

/// The record of a fleet job decided without its intent (refused, or
/// canceled before it arrived).
fn ended_without_intent(status: JobStatus, ctx: &AdmitContext<'_>) -> JobRecord {
    JobRecord {
        intent: None,
        status,
        origin: Origin::Fleet,
        arrival: ctx.arrival,
        resumes: 0,
        reboot_from_boot: None,
    }
}

/// The record of a job the control plane canceled before this device
/// received it: Canceled at once and reported, so the control plane can
/// decide the job, and kept so the intent, should it still arrive (a relay
/// that held it back), is answered with this status and never runs (A1).
pub fn canceled_unreceived(order: &CancelOrder, ctx: &AdmitContext<'_>) -> JobRecord {
    let mut status = new_status(ctx, order.cancel_job, order.attempt);
    status.state = JobState::Canceled;
    status.finished_at = Some(ctx.now);
    status.error = Some("canceled by the control plane before this device received it".into());
    ended_without_intent(status, ctx)
}

/// Something that happens to a job.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The worker takes the job up: for the first time, or again after the
    /// agent stopped while it ran. `control_plane_now` judges expiry (A12).
    Pick {
        now: Timestamp,
        control_plane_now: Timestamp,
        boot_id: String,
    },
    /// The current step ran to an outcome.
    StepFinished {
        now: Timestamp,
        boot_id: String,
        outcome: StepOutcome,
    },
    /// An operator or the control plane asked to cancel.
    Cancel { now: Timestamp },
    /// An operator asked to continue a failed local job from its failed step
    /// (`drover-agent upgrade --resume`). Fleet jobs never resume.
    Resume { now: Timestamp },
}

/// How the new record must be made durable before the next action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persist {
    Nothing,
    Save,
    /// Save and append the status to the outbox in the same transaction.
    Report,
}

/// What the executor does once the record is durable.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    RunStep(usize),
    RetryStep {
        index: usize,
        after: Duration,
    },
    Reboot,
    /// Nothing more to do for this job now (terminal, or refused an event).
    Stop,
}

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A job picked up again more often than this fails (A10).
    pub max_resumes: u32,
}

/// The transition table of a job. Pure: same inputs, same outputs. Every
/// change bumps the status sequence number, so receivers can drop stale copies.
pub fn transition(record: JobRecord, event: Event, limits: Limits) -> (JobRecord, Persist, Next) {
    let (mut record, persist, next) = decide(record, event, limits);
    if persist != Persist::Nothing {
        record.status.seq += 1;
    }
    (record, persist, next)
}

/// The table: which event, in which state, leads where. Each row that
/// does more than stop is a function below.
fn decide(record: JobRecord, event: Event, limits: Limits) -> (JobRecord, Persist, Next) {
    use JobState::*;
    let state = record.status.state;
    match (state, event) {
        (Failed, Event::Resume { now }) if record.origin == Origin::Local => {
            resume_failed(record, now)
        }
        (Succeeded | Failed | Expired | Rejected | Canceled, _) => {
            (record, Persist::Nothing, Next::Stop)
        }
        (
            Accepted | Waiting,
            Event::Pick {
                now,
                control_plane_now,
                ..
            },
        ) => start(record, now, control_plane_now),
        (Running, Event::Pick { now, .. }) => pick_up_again(record, now, limits),
        (AwaitingReboot, Event::Pick { now, boot_id, .. }) => {
            after_reboot(record, now, boot_id, limits)
        }
        (
            Running,
            Event::StepFinished {
                now,
                boot_id,
                outcome,
            },
        ) => step_finished(record, now, boot_id, outcome),
        (Accepted | Waiting, Event::Cancel { now }) => {
            let mut record = record;
            finish(&mut record, Canceled, now);
            record.status.error = Some("canceled before it started".into());
            (record, Persist::Report, Next::Stop)
        }
        // A started job is never interrupted: apt and dpkg run to the end (A3).
        (Running | AwaitingReboot, Event::Cancel { .. }) => (record, Persist::Nothing, Next::Stop),
        // A step cannot finish while the job is not running; ignore the stray event.
        (Accepted | Waiting | AwaitingReboot, Event::StepFinished { .. }) => {
            (record, Persist::Nothing, Next::Stop)
        }
        // Only a failed job can be resumed.
        (Accepted | Waiting | Running | AwaitingReboot, Event::Resume { .. }) => {
            (record, Persist::Nothing, Next::Stop)
        }
    }
}

/// A failed local job resumes from its failed step.
fn resume_failed(mut record: JobRecord, now: Timestamp) -> (JobRecord, Persist, Next) {
    use JobState::*;
    let Some(index) = record
        .status
        .steps
        .iter()
        .position(|s| s.state == StepState::Failed)
    else {
        return (record, Persist::Nothing, Next::Stop);
    };
    let step = &mut record.status.steps[index];
    step.state = StepState::Running;
    // A new durable start: the step's own deadlines count from here.
    step.started_at = Some(now);
    step.error = None;
    record.status.state = Running;
    record.status.error = None;
    record.status.finished_at = None;
    record.resumes = 0;
    (record, Persist::Report, Next::RunStep(index))
}

/// A queued job is taken up: it starts, unless its intent expired.
fn start(
    mut record: JobRecord,
    now: Timestamp,
    control_plane_now: Timestamp,
) -> (JobRecord, Persist, Next) {
    use JobState::*;
    let expired = record
        .intent
        .as_ref()
        .is_some_and(|intent| control_plane_now >= intent.expires_at);
    if expired {
        let expires_at = record.intent.as_ref().map(|i| i.expires_at);
        finish(&mut record, Expired, now);
        record.status.error =
            expires_at.map(|at| format!("intent expired at {at} while it waited in the queue"));
        return (record, Persist::Report, Next::Stop);
    }
    record.status.state = Running;
    record.status.started_at = Some(now);
    run_from(record, 0, now)
}

/// A running job is taken up again after the agent stopped while it ran.
fn pick_up_again(
    mut record: JobRecord,
    now: Timestamp,
    limits: Limits,
) -> (JobRecord, Persist, Next) {
    record.resumes += 1;
    if record.resumes > limits.max_resumes {
        return give_up(record, now);
    }
    let index = current_step(&record);
    match index {
        Some(index) => {
            start_step(&mut record, index, now);
            // Visible in `drover-agent jobs` until the step ends.
            record.status.steps[index].error = Some(format!(
                "the agent stopped while this step ran; resumed ({} of at most {})",
                record.resumes, limits.max_resumes
            ));
            (record, Persist::Save, Next::RunStep(index))
        }
        None => succeeded(record, now),
    }
}

/// A job that asked for a reboot is taken up again: after one, or not.
fn after_reboot(
    mut record: JobRecord,
    now: Timestamp,
    boot_id: String,
    limits: Limits,
) -> (JobRecord, Persist, Next) {
    use JobState::*;
    let rebooted = record
        .reboot_from_boot
        .as_deref()
        .is_some_and(|before| before != boot_id);
    if !rebooted {
        // The agent restarted but the device did not: ask again.
        record.resumes += 1;
        if record.resumes > limits.max_resumes {
            return give_up(record, now);
        }
        return (record, Persist::Save, Next::Reboot);
    }
    record.reboot_from_boot = None;
    record.status.state = Running;
    record.status.boot_id = boot_id;
    let Some(index) = current_step(&record) else {
        return succeeded(record, now);
    };
    complete_step(&mut record, index, now);
    run_from(record, index + 1, now)
}

/// The running step ended with `outcome`.
fn step_finished(
    mut record: JobRecord,
    now: Timestamp,
    boot_id: String,
    outcome: StepOutcome,
) -> (JobRecord, Persist, Next) {
    use JobState::*;
    let Some(index) = current_step(&record) else {
        return succeeded(record, now);
    };
    record.status.steps[index].tries += 1;
    match outcome {
        StepOutcome::Done => {
            complete_step(&mut record, index, now);
            run_from(record, index + 1, now)
        }
        StepOutcome::RetryAfter { after, reason } => {
            record.status.steps[index].error = Some(bounded(reason, MAX_ERROR_BYTES));
            (record, Persist::Save, Next::RetryStep { index, after })
        }
        StepOutcome::Reboot => {
            record.status.state = AwaitingReboot;
            record.reboot_from_boot = Some(boot_id);
            (record, Persist::Report, Next::Reboot)
        }
        StepOutcome::Fail(error) => step_failed(record, index, now, error, Vec::new()),
        StepOutcome::FailWithReason { error, reason } => {
            step_failed(record, index, now, error, reason)
        }
    }
}

/// Step `index` failed, and with it the job.
fn step_failed(
    mut record: JobRecord,
    index: usize,
    now: Timestamp,
    error: String,
    reason: Vec<String>,
) -> (JobRecord, Persist, Next) {
    use JobState::*;
    let error = bounded(error, MAX_ERROR_BYTES);
    let step = &mut record.status.steps[index];
    step.state = StepState::Failed;
    step.seconds = seconds_since(step.started_at, now);
    step.error = Some(error.clone());
    finish(&mut record, Failed, now);
    let message = format!("step {} failed: {error}", step_name(&record, index));
    record.status.error = Some(bounded(message, MAX_ERROR_BYTES));
    record.status.failure = Some(Failure::StepFailed);
    record.status.reason = drover_model::reason::bounded_reason(reason);
    (record, Persist::Report, Next::Stop)
}

/// Runs the steps from `index` on; with none left, the job succeeded.
fn run_from(mut record: JobRecord, index: usize, now: Timestamp) -> (JobRecord, Persist, Next) {
    match start_step(&mut record, index, now) {
        Some(next) => (record, Persist::Report, Next::RunStep(next)),
        None => succeeded(record, now),
    }
}

/// Every step is done: the job succeeded, which is reported.
fn succeeded(mut record: JobRecord, now: Timestamp) -> (JobRecord, Persist, Next) {
    succeed(&mut record, now);
    (record, Persist::Report, Next::Stop)
}

fn step_name(record: &JobRecord, index: usize) -> String {
    record.status.steps[index].name.clone()
}

/// The first step not yet done.
fn current_step(record: &JobRecord) -> Option<usize> {
    record
        .status
        .steps
        .iter()
        .position(|s| s.state != StepState::Done)
}

/// Marks step `index` running if it is pending; returns it when it exists.
fn start_step(record: &mut JobRecord, index: usize, now: Timestamp) -> Option<usize> {
    let step = record.status.steps.get_mut(index)?;
    if step.state == StepState::Pending {
        step.state = StepState::Running;
        step.started_at = Some(now);
    }
    Some(index)
}

fn complete_step(record: &mut JobRecord, index: usize, now: Timestamp) {
    if let Some(step) = record.status.steps.get_mut(index) {
        step.state = StepState::Done;
        step.seconds = seconds_since(step.started_at, now);
        step.error = None;
    }
}

fn seconds_since(start: Option<Timestamp>, now: Timestamp) -> Option<f64> {
    start.map(|s| (now.as_millisecond() - s.as_millisecond()).max(0) as f64 / 1000.0)
}

fn finish(record: &mut JobRecord, state: JobState, now: Timestamp) {
    record.status.state = state;
    record.status.finished_at = Some(now);
}

fn succeed(record: &mut JobRecord, now: Timestamp) {
    finish(record, JobState::Succeeded, now);
    // The heartbeat the executor sends right after this is the completion
    // heartbeat; its time is recorded with the status it confirms (A6).
    record.status.completion_heartbeat_at = Some(now);
    record.status.error = None;
}

fn give_up(mut record: JobRecord, now: Timestamp) -> (JobRecord, Persist, Next) {
    let resumes = record.resumes;
    if let Some(index) = current_step(&record) {
        let step = &mut record.status.steps[index];
        step.state = StepState::Failed;
        step.error = Some("interrupted too many times".into());
    }
    finish(&mut record, JobState::Failed, now);
    record.status.error = Some(format!(
        "job was picked up again {resumes} times after the agent stopped while it ran \
         ({RESUME_LOOP_TEXT}); giving up instead of looping"
    ));
    record.status.failure = Some(Failure::ResumeLoop);
    (record, Persist::Report, Next::Stop)
}

#[cfg(test)]
#[path = "lifecycle_tests.rs"]
mod tests;
