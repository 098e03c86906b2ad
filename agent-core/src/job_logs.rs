//! Answering the control plane's request for a job's output
//! (`drover logs DEVICE [JOB]`, `drover_model::logs`): every transport
//! hands the request here and sends back the chunks it gets. Where the
//! output is and how it reads is the updaters' ([`JobOutput`]); this keeps
//! the bounds: one answer at a time, at most `drover_model::logs::MAX_BYTES`
//! in memory for it.

use drover_model::logs::{LogChunk, LogRequest, Refusal, chunks};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tracing::{debug, warn};

/// Where a job's output comes from.
pub trait JobOutput: Send + Sync {
    /// The output of `job` (a job id or its start; the job whose output is
    /// newest when None) as plain text, its last `tail` lines when asked.
    fn text(&self, job: Option<&str>, tail: Option<usize>) -> Result<String, (Refusal, String)>;
}

/// The agent's side of log requests.
#[derive(Default)]
pub struct Answering {
    source: Option<Arc<dyn JobOutput>>,
    busy: AtomicBool,
}

impl Answering {
    pub fn new(source: Arc<dyn JobOutput>) -> Self {
        Self {
            source: Some(source),
            busy: AtomicBool::new(false),
        }
    }

    /// Answers `request`: hands `send` the chunks of the output, or one
    /// refusal, until it says the link is gone (false). Reads files and
    /// waits on `send`: call it off the async threads (`spawn_blocking`).
    /// A request that comes before the last answer is sent is refused as
    /// busy, so a flood of requests costs a refusal each and never holds
    /// more than one answer in memory.
    pub fn answer(&self, request: &LogRequest, mut send: impl FnMut(LogChunk) -> bool) {
        let id = request.request;
        if let Err(why) = request.check() {
            warn!(request = id, %why, "a log request refused");
            send(LogChunk::refusal(id, Refusal::BadRequest, why));
            return;
        }
        let Some(source) = &self.source else {
            send(LogChunk::refusal(
                id,
                Refusal::NotKept,
                "this agent keeps no job output",
            ));
            return;
        };
        if self.busy.swap(true, Ordering::AcqRel) {
            send(LogChunk::refusal(
                id,
                Refusal::Busy,
                "the device is answering another log request; ask again",
            ));
            return;
        }
        let _busy = Busy(&self.busy);
        let answer = match source.text(request.job.as_deref(), request.tail.map(|t| t as usize)) {
            Ok(text) => {
                debug!(request = id, bytes = text.len(), "answering a log request");
                chunks(id, &text)
            }
            Err((refused, why)) => vec![LogChunk::refusal(id, refused, why)],
        };
        for chunk in answer {
            if !send(chunk) {
                break;
            }
        }
    }
}

/// Runs `answer` (a call of [`Answering::answer`]) off the async threads
/// and hands its chunks to `publish` in order, until `publish` says the
/// link is gone (false): how a transport sends an answer without holding
/// up its loop.
pub async fn relay<A, P, F>(answer: A, mut publish: P)
where
    A: FnOnce(&mut dyn FnMut(LogChunk) -> bool) + Send + 'static,
    P: FnMut(LogChunk) -> F,
    F: std::future::Future<Output = bool>,
{
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    let reader = tokio::task::spawn_blocking(move || {
        let mut send = |chunk| tx.blocking_send(chunk).is_ok();
        answer(&mut send)
    });
    while let Some(chunk) = rx.recv().await {
        if !publish(chunk).await {
            break;
        }
    }
    drop(rx);
    let _ = reader.await;
}

/// Frees [`Answering`] for the next request however its answer ended.
struct Busy<'a>(&'a AtomicBool);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;
    impl JobOutput for Fixed {
        fn text(
            &self,
            job: Option<&str>,
            tail: Option<usize>,
        ) -> Result<String, (Refusal, String)> {
            match job {
                Some("ab") => Err((Refusal::NoSuchJob, "no output of job ab".into())),
                _ => Ok(format!("lines, tail {tail:?}\n")),
            }
        }
    }

    fn request(job: Option<&str>) -> LogRequest {
        LogRequest {
            request: 9,
            job: job.map(str::to_owned),
            tail: Some(3),
        }
    }

    fn answered(answering: &Answering, request: &LogRequest) -> Vec<LogChunk> {
        let mut sent = Vec::new();
        answering.answer(request, |chunk| {
            sent.push(chunk);
            true
        });
        sent
    }

    #[test]
    fn a_request_is_answered_refused_or_named_bad() {
        let answering = Answering::new(Arc::new(Fixed));
        let answer = answered(&answering, &request(None));
        assert_eq!(answer.len(), 1);
        assert_eq!(answer[0].text, "lines, tail Some(3)\n");
        assert!(answer[0].done && answer[0].refused.is_none());

        let refused = answered(&answering, &request(Some("ab")));
        assert_eq!(refused[0].refused, Some(Refusal::NoSuchJob));
        let bad = answered(&answering, &request(Some("../x")));
        assert_eq!(bad[0].refused, Some(Refusal::BadRequest));
        let none = answered(&Answering::default(), &request(None));
        assert_eq!(none[0].refused, Some(Refusal::NotKept));
    }

    #[test]
    fn a_request_while_another_is_answered_is_refused_as_busy() {
        let answering = Answering::new(Arc::new(Fixed));
        let mut inner = Vec::new();
        answering.answer(&request(None), |chunk| {
            // While this answer is being sent, another request is busy.
            inner = answered(&answering, &request(None));
            assert!(chunk.refused.is_none());
            true
        });
        assert_eq!(inner[0].refused, Some(Refusal::Busy));
        assert_eq!(answered(&answering, &request(None))[0].refused, None);
    }
}
