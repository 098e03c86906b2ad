//! Asking a device for a job's output (`drover logs DEVICE [JOB]`): a
//! request and the chunks that answer it, the same on every transport.
//!
//! Not a job: a log request must not wait behind an upgrade in the agent's
//! one-at-a-time queue, and it changes nothing on the device. So it is not
//! signed either (A11 guards what a device does): the device answers only
//! on its own answer channel, which only the control plane reads, so a
//! request from anyone else gains them nothing.

use serde::{Deserialize, Serialize};

/// The most text one chunk carries, in bytes: with JSON's escapes at most
/// twice this, under the smallest transport's message limit (WebSocket's
/// 128 KiB).
pub const CHUNK_BYTES: usize = 32 * 1024;
/// The most text one answer carries: the end of a job's output when it is
/// longer (apt's reason is at its end).
pub const MAX_BYTES: usize = 4 * 1024 * 1024;
/// The most chunks one answer has.
pub const MAX_CHUNKS: u32 = (MAX_BYTES / CHUNK_BYTES) as u32 + 2;
/// The largest `tail` asked for, in lines.
pub const MAX_TAIL: u32 = 1_000_000;
/// The longest job name asked for: a job id (36 characters) or its start.
pub const MAX_JOB_CHARS: usize = 36;

/// The control plane's request for a job's output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogRequest {
    /// Chosen at random by the control plane; every chunk of the answer
    /// carries it.
    pub request: u64,
    /// A job id or its start; None for the job whose output is newest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// Only the last lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<u32>,
}

impl LogRequest {
    /// Why a request cannot be answered as asked, or Ok.
    pub fn check(&self) -> Result<(), String> {
        if let Some(job) = &self.job {
            let fits = !job.is_empty()
                && job.len() <= MAX_JOB_CHARS
                && job.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
            if !fits {
                return Err(format!(
                    "a job is named by its id or the start of it (1 to {MAX_JOB_CHARS} \
                     hexadecimal digits and dashes)"
                ));
            }
        }
        if self.tail.is_some_and(|tail| tail > MAX_TAIL) {
            return Err(format!("tail is at most {MAX_TAIL} lines"));
        }
        Ok(())
    }
}

/// Why a device did not answer with output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Refusal {
    /// No job of that name left output on the device (or none at all).
    NoSuchJob,
    /// The name starts several jobs' ids.
    Ambiguous,
    /// The device is answering another request; ask again.
    Busy,
    /// The request is malformed.
    BadRequest,
    /// This agent keeps no output (an agent built without it).
    NotKept,
    /// A refusal a newer agent knows and this control plane does not.
    #[serde(other)]
    Other,
}

/// One piece of an answer. Chunks come numbered from 0; the last says
/// `done`. A refusal is one chunk, `done`, with no text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogChunk {
    pub request: u64,
    pub seq: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub text: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub done: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<Refusal>,
    /// The refusal in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl LogChunk {
    /// The one chunk that refuses `request`.
    pub fn refusal(request: u64, refused: Refusal, message: impl Into<String>) -> Self {
        Self {
            request,
            seq: 0,
            text: String::new(),
            done: true,
            refused: Some(refused),
            message: Some(crate::bounded(message, crate::MAX_ERROR_BYTES)),
        }
    }

    /// Whether a chunk is one a device may send: its text within
    /// [`CHUNK_BYTES`], its number within [`MAX_CHUNKS`], its words bounded.
    pub fn check(&self) -> Result<(), String> {
        if self.text.len() > CHUNK_BYTES {
            return Err(format!(
                "a chunk of {} bytes, over {CHUNK_BYTES}",
                self.text.len()
            ));
        }
        if self.seq >= MAX_CHUNKS {
            return Err(format!("chunk {} of at most {MAX_CHUNKS}", self.seq));
        }
        if self
            .message
            .as_ref()
            .is_some_and(|m| m.len() > crate::MAX_ERROR_BYTES)
        {
            return Err("a refusal's words over 1 KiB".into());
        }
        Ok(())
    }
}

/// `text` as the chunks that answer `request`: its last [`MAX_BYTES`]
/// (from a line start, saying how much went) in pieces of at most
/// [`CHUNK_BYTES`] cut on character boundaries, the last one `done`.
pub fn chunks(request: u64, text: &str) -> Vec<LogChunk> {
    let mut text = text;
    let mut note = String::new();
    if text.len() > MAX_BYTES {
        let mut from = text.len() - (MAX_BYTES - 200);
        while !text.is_char_boundary(from) {
            from += 1;
        }
        if let Some(newline) = text[from..].find('\n') {
            from += newline + 1;
        }
        note = format!(
            "[drover: the first {from} bytes of this job's output are left out; \
             the device keeps them, `drover-agent logs` shows them all]\n"
        );
        text = &text[from..];
    }
    let mut pieces: Vec<String> = Vec::new();
    let mut rest = text;
    let mut first = note;
    while !rest.is_empty() || !first.is_empty() {
        let room = CHUNK_BYTES - first.len();
        let mut cut = rest.len().min(room);
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let mut piece = std::mem::take(&mut first);
        piece.push_str(&rest[..cut]);
        pieces.push(piece);
        rest = &rest[cut..];
    }
    if pieces.is_empty() {
        pieces.push(String::new());
    }
    let last = pieces.len() - 1;
    pieces
        .into_iter()
        .enumerate()
        .map(|(seq, text)| LogChunk {
            request,
            seq: seq as u32,
            text,
            done: seq == last,
            refused: None,
            message: None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_cut_into_bounded_chunks_that_join_back() {
        let text = "é line\n".repeat(20_000);
        let answer = chunks(7, &text);
        assert!(answer.len() > 1);
        for (n, chunk) in answer.iter().enumerate() {
            assert_eq!(chunk.seq as usize, n);
            assert_eq!(chunk.request, 7);
            assert_eq!(chunk.done, n == answer.len() - 1);
            chunk.check().expect("a chunk within bounds");
        }
        let joined: String = answer.iter().map(|c| c.text.as_str()).collect();
        assert_eq!(joined, text);
        let empty = chunks(1, "");
        assert_eq!(empty.len(), 1);
        assert!(empty[0].done && empty[0].text.is_empty());
    }

    #[test]
    fn an_output_over_the_bound_keeps_its_end_and_says_so() {
        let mut text = "early line\n".repeat(500_000);
        text.push_str("E: the reason at the end\n");
        let answer = chunks(1, &text);
        assert!(answer.len() as u32 <= MAX_CHUNKS);
        let joined: String = answer.iter().map(|c| c.text.as_str()).collect();
        assert!(joined.len() <= MAX_BYTES, "{}", joined.len());
        assert!(
            joined.starts_with("[drover: the first "),
            "{}",
            &joined[..80]
        );
        assert!(joined.ends_with("E: the reason at the end\n"));
        assert!(
            joined
                .lines()
                .skip(1)
                .all(|l| l == "early line" || l.starts_with("E:"))
        );
    }

    #[test]
    fn bad_requests_and_chunks_are_named() {
        let ok = LogRequest {
            request: 1,
            job: Some("1d506e04".into()),
            tail: Some(10),
        };
        ok.check().expect("a job's start");
        for (job, tail) in [
            (Some("../etc"), None),
            (Some(""), None),
            (Some("a".repeat(37).as_str()), None),
            (None, Some(MAX_TAIL + 1)),
        ] {
            let bad = LogRequest {
                request: 1,
                job: job.map(str::to_owned),
                tail,
            };
            assert!(bad.check().is_err(), "{bad:?}");
        }
        let mut chunk = chunks(1, "x").remove(0);
        chunk.text = "x".repeat(CHUNK_BYTES + 1);
        assert!(chunk.check().is_err());
        let unknown: LogChunk =
            serde_json::from_str(r#"{"request":1,"seq":0,"done":true,"refused":"tooTired"}"#)
                .expect("a newer refusal still decodes");
        assert_eq!(unknown.refused, Some(Refusal::Other));
    }
}
