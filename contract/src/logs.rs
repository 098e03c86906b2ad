//! A job's output asked of a device (`drover logs`, `drover_model::logs`):
//! the requests one link has open and the chunks that come back for them.
//! Every link keeps a [`Waiters`]; a chunk reaches its request only from
//! the device it was asked of, in order and within bounds, and a request
//! nobody waits on any more is forgotten.

use drover_model::DeviceId;
use drover_model::logs::{LogChunk, LogRequest, MAX_CHUNKS};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// At most this many log requests wait on one link at a time.
pub const MAX_WAITING: usize = 64;

/// Why a log request could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    #[error("the device is not connected to this control plane")]
    NotConnected,
    #[error("{MAX_WAITING} log requests are waiting for devices already; ask again shortly")]
    TooMany,
    #[error("the {0} transport does not carry log requests")]
    Unsupported(drover_model::transport::Transport),
    /// The link could not send it (a broker's error), in words.
    #[error("{0}")]
    Link(String),
}

/// What comes back for one request: chunks in order, or why the answer
/// broke off (a chunk out of order or over its bounds).
pub type Item = Result<LogChunk, String>;

struct Waiter {
    device: DeviceId,
    next: u32,
    tx: mpsc::Sender<Item>,
}

/// The requests a link has open.
#[derive(Default)]
pub struct Waiters {
    /// A std Mutex: nothing awaits while it is held.
    open: Mutex<HashMap<u64, Waiter>>,
}

/// The answer to one request as it comes; dropping it forgets the request.
pub struct LogStream {
    pub request: LogRequest,
    rx: mpsc::Receiver<Item>,
    waiters: Arc<Waiters>,
}

impl LogStream {
    /// The next chunk; None once the request is forgotten.
    pub async fn next(&mut self) -> Option<Item> {
        self.rx.recv().await
    }
}

impl Drop for LogStream {
    fn drop(&mut self) {
        self.waiters.forget(self.request.request);
    }
}

impl Waiters {
    /// Opens a request for `device`'s output of `job` (newest when None),
    /// its last `tail` lines; an error when [`MAX_WAITING`] are open.
    pub fn open(
        self: &Arc<Self>,
        device: &DeviceId,
        job: Option<String>,
        tail: Option<u32>,
    ) -> Result<LogStream, AskError> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.len() >= MAX_WAITING {
            return Err(AskError::TooMany);
        }
        let mut id = rand_id();
        while open.contains_key(&id) {
            id = rand_id();
        }
        // Room for a whole answer: a device's chunks never wait on the
        // reader, and what they hold is bounded by `MAX_CHUNKS` chunks.
        let (tx, rx) = mpsc::channel(MAX_CHUNKS as usize + 1);
        open.insert(
            id,
            Waiter {
                device: device.clone(),
                next: 0,
                tx,
            },
        );
        Ok(LogStream {
            request: LogRequest {
                request: id,
                job,
                tail,
            },
            rx,
            waiters: self.clone(),
        })
    }

    /// A chunk `device` sent: to its request when that was asked of this
    /// device and the chunk is the next one and within bounds. A chunk
    /// out of order or over its bounds ends the answer, saying why; one for
    /// a request not open here (another replica's, or one given up) is
    /// dropped. Returns whether the chunk was taken.
    pub fn deliver(&self, device: &DeviceId, chunk: LogChunk) -> bool {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let Some(waiter) = open.get_mut(&chunk.request) else {
            return false;
        };
        if &waiter.device != device {
            tracing::warn!(%device, asked = %waiter.device, "a log chunk for another device's request dropped");
            return false;
        }
        let id = chunk.request;
        let problem = if chunk.seq != waiter.next {
            Some(format!(
                "the device's answer broke off: chunk {} came where {} was due",
                chunk.seq, waiter.next
            ))
        } else {
            chunk
                .check()
                .err()
                .map(|why| format!("the device's answer broke off: {why}"))
        };
        let done = problem.is_some() || chunk.done;
        let item = match problem {
            Some(why) => Err(why),
            None => Ok(chunk),
        };
        waiter.next += 1;
        let taken = waiter.tx.try_send(item).is_ok();
        if done || !taken {
            open.remove(&id);
        }
        taken
    }

    fn forget(&self, request: u64) {
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&request);
    }

    /// Requests open now.
    pub fn len(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A request id no one can guess (a random UUID's first half): a chunk
/// for a request is taken only from the device asked, and ids apart keep
/// answers to different replicas apart.
fn rand_id() -> u64 {
    let uuid = drover_model::JobId::random();
    let mut half = [0u8; 8];
    half.copy_from_slice(&uuid.as_bytes()[..8]);
    u64::from_le_bytes(half)
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_model::logs::{Refusal, chunks};

    fn device(name: &str) -> DeviceId {
        DeviceId::new(name).expect("device id")
    }

    #[tokio::test]
    async fn chunks_reach_their_request_only_from_the_device_asked_and_in_order() {
        let waiters = Arc::new(Waiters::default());
        let mut stream = waiters.open(&device("pi-1"), None, None).expect("open");
        let id = stream.request.request;
        let answer = chunks(id, &"line\n".repeat(10_000));
        assert!(answer.len() > 1);
        // Another device cannot answer for pi-1; a request not open is dropped.
        assert!(!waiters.deliver(&device("pi-2"), answer[0].clone()));
        let mut stray = answer[0].clone();
        stray.request = id.wrapping_add(1);
        assert!(!waiters.deliver(&device("pi-1"), stray));
        for chunk in &answer {
            assert!(waiters.deliver(&device("pi-1"), chunk.clone()));
        }
        for chunk in &answer {
            assert_eq!(stream.next().await, Some(Ok(chunk.clone())));
        }
        assert!(waiters.is_empty(), "a done answer is forgotten");
    }

    #[tokio::test]
    async fn a_chunk_out_of_order_or_too_big_ends_the_answer() {
        let waiters = Arc::new(Waiters::default());
        let mut stream = waiters.open(&device("pi-1"), None, None).expect("open");
        let mut chunk = chunks(stream.request.request, "x").remove(0);
        chunk.seq = 3;
        assert!(waiters.deliver(&device("pi-1"), chunk));
        let ended = stream.next().await.expect("an item");
        assert!(ended.unwrap_err().contains("chunk 3 came where 0 was due"));
        assert!(waiters.is_empty());

        let mut stream = waiters.open(&device("pi-1"), None, None).expect("open");
        let mut big = chunks(stream.request.request, "x").remove(0);
        big.text = "x".repeat(drover_model::logs::CHUNK_BYTES + 1);
        waiters.deliver(&device("pi-1"), big);
        assert!(stream.next().await.expect("an item").is_err());
    }

    #[test]
    fn requests_are_bounded_and_forgotten_when_dropped() {
        let waiters = Arc::new(Waiters::default());
        let streams: Vec<LogStream> = (0..MAX_WAITING)
            .map(|_| waiters.open(&device("pi-1"), None, None).expect("open"))
            .collect();
        assert!(matches!(
            waiters.open(&device("pi-1"), None, None),
            Err(AskError::TooMany)
        ));
        let refusal = LogChunk::refusal(streams[0].request.request, Refusal::Busy, "busy");
        drop(streams);
        assert!(waiters.is_empty());
        assert!(!waiters.deliver(&device("pi-1"), refusal));
    }
}
