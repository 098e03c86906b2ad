//! Log lines to the journal as native entries (systemd's journal
//! protocol, `sd_journal_sendv`'s datagrams), so each line of a job
//! carries `JOB_ID` (and `STEP` where it has one) as fields of its own:
//! `journalctl -u drover-agent JOB_ID=…` finds a job's lines at once. The
//! entry's `MESSAGE` is the same text a line on the journal stream had
//! (level, spans, fields), so `journalctl -u drover-agent` reads as
//! before, and `PRIORITY` is the level's.
//!
//! [`JobFields`] reads the job id and step of each event (its own fields,
//! then its spans') just before the line layer formats it, into a
//! thread-local; [`JournalWriter`] takes the formatted line (with the
//! `<N>` priority prefix of [`crate::logging::Prioritized`]) and sends it
//! with them. A line the journal's socket does not take (too big for one
//! datagram, journald gone) is written to stderr as before.

use std::cell::RefCell;
use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

/// Where journald takes native entries.
pub const SOCKET: &str = "/run/systemd/journal/socket";

/// The journal's socket: `$DROVER_JOURNAL_SOCKET` when set (a journald
/// socket mounted elsewhere, or a test's), else [`SOCKET`].
pub fn socket() -> PathBuf {
    std::env::var_os("DROVER_JOURNAL_SOCKET")
        .filter(|s| !s.is_empty())
        .map_or_else(|| PathBuf::from(SOCKET), PathBuf::from)
}

/// The job id and step an event is about.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct JobOf {
    job_id: Option<String>,
    step: Option<String>,
}

thread_local! {
    /// The event being written on this thread: set by [`JobFields`],
    /// read by [`JournalWriter`] (an event is formatted and written on the
    /// thread that emitted it, after every inner layer saw it).
    static CURRENT: RefCell<JobOf> = RefCell::new(JobOf::default());
}

struct Visitor<'a>(&'a mut JobOf);

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.set(field, value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if matches!(field.name(), "job_id" | "step") {
            self.set(field, format!("{value:?}"));
        }
    }
}

impl Visitor<'_> {
    fn set(&mut self, field: &Field, value: String) {
        match field.name() {
            "job_id" => self.0.job_id = Some(value),
            "step" => self.0.step = Some(value),
            _ => {}
        }
    }
}

/// Keeps each span's `job_id` and `step`, and puts each event's (its own
/// first, then the nearest span's) where [`JournalWriter`] reads them.
/// Must sit inside (be added before) the line layer.
pub struct JobFields;

impl<S> Layer<S> for JobFields
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut of = JobOf::default();
        attrs.record(&mut Visitor(&mut of));
        if of != JobOf::default()
            && let Some(span) = ctx.span(id)
        {
            span.extensions_mut().insert(of);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut of = JobOf::default();
        event.record(&mut Visitor(&mut of));
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope {
                if let Some(spans) = span.extensions().get::<JobOf>() {
                    of.job_id = of.job_id.or_else(|| spans.job_id.clone());
                    of.step = of.step.or_else(|| spans.step.clone());
                }
            }
        }
        CURRENT.with(|current| *current.borrow_mut() = of);
    }
}

/// Sends each formatted line to the journal's socket as one entry.
#[derive(Clone)]
pub struct JournalWriter {
    socket: Arc<UnixDatagram>,
    path: PathBuf,
    identifier: String,
}

impl JournalWriter {
    /// A writer to the journal at `path`, its entries named `identifier`
    /// (`SYSLOG_IDENTIFIER`); None when no socket can be made.
    pub fn to(path: &Path, identifier: &str) -> Option<Self> {
        Some(Self {
            socket: Arc::new(UnixDatagram::unbound().ok()?),
            path: path.to_owned(),
            identifier: identifier.to_owned(),
        })
    }

    /// The entry for one line `<N>TEXT\n` (the priority prefix optional).
    fn entry(&self, line: &[u8]) -> Vec<u8> {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let (priority, message) = match line {
            [b'<', p @ b'0'..=b'7', b'>', rest @ ..] => (*p, rest),
            _ => (b'6', line),
        };
        // The level is padded to five characters (" WARN"); the entry's
        // text starts at its first letter.
        let message = message.trim_ascii_start();
        let of = CURRENT.with(|current| current.borrow().clone());
        let mut entry = Vec::with_capacity(message.len() + 128);
        field(&mut entry, "PRIORITY", &[priority]);
        field(&mut entry, "SYSLOG_IDENTIFIER", self.identifier.as_bytes());
        if let Some(job) = &of.job_id {
            field(&mut entry, "JOB_ID", job.as_bytes());
        }
        if let Some(step) = &of.step {
            field(&mut entry, "STEP", step.as_bytes());
        }
        field(&mut entry, "MESSAGE", message);
        entry
    }
}

/// One field of an entry: `NAME=value\n`, or for a value with a newline
/// `NAME\n`, its length (64-bit little-endian), the value and `\n`.
fn field(entry: &mut Vec<u8>, name: &str, value: &[u8]) {
    entry.extend_from_slice(name.as_bytes());
    if value.contains(&b'\n') {
        entry.push(b'\n');
        entry.extend_from_slice(&(value.len() as u64).to_le_bytes());
    } else {
        entry.push(b'=');
    }
    entry.extend_from_slice(value);
    entry.push(b'\n');
}

impl Write for JournalWriter {
    /// The line layer writes each event's whole line at once.
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        if self.socket.send_to(&self.entry(line), &self.path).is_err() {
            let mut stderr = std::io::stderr().lock();
            stderr.write_all(line)?;
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for JournalWriter {
    type Writer = JournalWriter;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[cfg(test)]
mod tests;
