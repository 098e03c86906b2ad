//! Logging for both binaries: tracing's text lines on stderr.
//!
//! - Colour only for a person at a terminal, and never with `NO_COLOR` set
//!   (no-color.org).
//! - Under systemd, when stderr is the journal stream `$JOURNAL_STREAM`
//!   names, each line goes to the journal as a native entry
//!   ([`crate::journal`]): its `MESSAGE` is the line with every field and
//!   span and no timestamp of its own (the journal stamps every entry),
//!   its `PRIORITY` the level's, and a job's lines carry `JOB_ID` (and
//!   `STEP`) as fields, so `journalctl -u drover-agent JOB_ID=…` finds
//!   them and `journalctl -p warning` filters by level. Without the
//!   journal's socket each line goes to the stream with its syslog
//!   priority in front (`<3>` error, `<4>` warning, `<6>` info, `<7>`
//!   debug), which journald takes as the entry's `PRIORITY`.
//!   (tracing-journald would put only the bare message in `MESSAGE` and
//!   every field beside it, where a plain `journalctl -u` shows none of
//!   them; docs/operations.md, "Logs", says why.)
//! - `RUST_LOG` takes a level and `target=level` pairs (`info,agent_core=debug`),
//!   tracing-subscriber's `Targets` filter. Its `EnvFilter` would also match
//!   spans and fields, but it brings a regex engine and Unicode tables
//!   (about 300 KiB of the agent's binary) for directives nobody here uses.
//!   A `RUST_LOG` that does not parse is reported and the default used.

use std::fmt;
use std::path::Path;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::fmt::format::{self, FormatEvent, FormatFields, Writer};
use tracing_subscriber::layer::{Layer as _, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

/// Installs the global subscriber; `default` is the filter when `RUST_LOG`
/// is unset.
pub fn init(default: &str) {
    let (filter, refused) = filter(std::env::var("RUST_LOG").ok().as_deref(), default);
    let socket = crate::journal::socket();
    let under_journal = stderr_is_the_journal();
    let journal = (under_journal && socket.exists())
        .then(|| crate::journal::JournalWriter::to(&socket, &identifier()))
        .flatten();
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    if let Some(journal) = journal {
        // Native entries: each line with its JOB_ID and STEP as fields.
        let layer = tracing_subscriber::fmt::layer()
            .with_writer(journal)
            .with_ansi(false)
            .event_format(Prioritized(format().without_time()));
        tracing_subscriber::registry()
            .with(crate::journal::JobFields.with_filter(filter.clone()))
            .with(layer.with_filter(filter))
            .init();
    } else if under_journal {
        let layer = layer
            .with_ansi(false)
            .event_format(Prioritized(format().without_time()));
        tracing_subscriber::registry()
            .with(layer.with_filter(filter))
            .init();
    } else {
        let layer = layer.with_ansi(colour());
        tracing_subscriber::registry()
            .with(layer.with_filter(filter))
            .init();
    }
    if let Some(error) = refused {
        tracing::warn!(%error, "RUST_LOG does not parse; logging at {default}");
    }
}

/// This program's name, as its journal entries' `SYSLOG_IDENTIFIER`.
fn identifier() -> String {
    std::env::args_os()
        .next()
        .as_deref()
        .map(Path::new)
        .and_then(Path::file_name)
        .map_or_else(|| "drover".to_owned(), |n| n.to_string_lossy().into_owned())
}

/// The filter `RUST_LOG` asks for, else `default`'s, with the reason a
/// `RUST_LOG` was refused.
fn filter(asked: Option<&str>, default: &str) -> (Targets, Option<String>) {
    let fallback = || default.parse().unwrap_or_else(|_| Targets::new());
    match asked.map(str::trim).filter(|a| !a.is_empty()) {
        None => (fallback(), None),
        Some(asked) => match asked.parse::<Targets>() {
            Ok(targets) => (targets, None),
            Err(e) => (fallback(), Some(e.to_string())),
        },
    }
}

fn format() -> format::Format {
    format::Format::default()
}

fn colour() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Whether stderr is the stream systemd connected to the journal: its
/// device and inode are the ones in `$JOURNAL_STREAM` (systemd.exec(5)), so a
/// process started from a unit whose stderr was redirected is not fooled.
pub fn stderr_is_the_journal() -> bool {
    names_the_stream(
        std::env::var_os("JOURNAL_STREAM").as_deref(),
        std::path::Path::new("/proc/self/fd/2"),
    )
}

/// Whether `stream` (`DEVICE:INODE`) names the file `file` refers to.
fn names_the_stream(stream: Option<&std::ffi::OsStr>, file: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some((device, inode)) = stream
        .and_then(|s| s.to_str())
        .and_then(|s| s.split_once(':'))
    else {
        return false;
    };
    let Ok(found) = std::fs::metadata(file) else {
        return false;
    };
    device.parse() == Ok(found.dev()) && inode.parse() == Ok(found.ino())
}

/// The syslog priority journald reads from a line's `<N>` prefix.
pub fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// A line format with the event's syslog priority in front.
pub struct Prioritized<F>(pub F);

impl<S, N, F> FormatEvent<S, N> for Prioritized<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        write!(writer, "<{}>", priority(event.metadata().level()))?;
        self.0.format_event(ctx, writer, event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::fmt::MakeWriter;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    #[test]
    fn journal_lines_carry_their_priority_and_every_field_without_a_timestamp() {
        let captured = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(captured.clone())
            .with_ansi(false)
            .event_format(Prioritized(format().without_time()))
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("job", job_id = "6f1c3b1e");
            let _entered = span.enter();
            tracing::warn!(step = "full-upgrade", "apt is slow");
            tracing::info!("job progress");
            tracing::error!("cannot record");
        });
        let text = String::from_utf8(captured.0.lock().expect("lock").clone()).expect("utf-8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[0].starts_with("<4> WARN job{job_id=\"6f1c3b1e\"}:"),
            "{text}"
        );
        assert!(lines[0].contains("step=\"full-upgrade\""), "{text}");
        assert!(lines[1].starts_with("<6> INFO job{"), "{text}");
        assert!(lines[2].starts_with("<3>ERROR job{"), "{text}");
    }

    #[test]
    fn rust_log_sets_levels_by_target_and_a_bad_one_keeps_the_default() {
        let enabled =
            |filter: &Targets, target: &str, level: Level| filter.would_enable(target, &level);
        let (f, refused) = filter(Some("warn,drover=debug"), "info");
        assert!(refused.is_none());
        assert!(enabled(&f, "drover::engine", Level::DEBUG));
        assert!(!enabled(&f, "agent_core::store", Level::INFO));
        assert!(enabled(&f, "agent_core::store", Level::WARN));
        let (f, refused) = filter(None, "info");
        assert!(refused.is_none());
        assert!(enabled(&f, "anything", Level::INFO));
        assert!(!enabled(&f, "anything", Level::DEBUG));
        let (f, refused) = filter(Some("drover=loud"), "info");
        assert!(refused.is_some(), "a level that is no level is refused");
        assert!(enabled(&f, "drover", Level::INFO));
        assert!(!enabled(&f, "drover", Level::DEBUG));
    }

    #[test]
    fn only_the_stream_systemd_names_is_the_journal() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let (file, other) = (dir.path().join("stream"), dir.path().join("other"));
        std::fs::write(&file, "").expect("file");
        std::fs::write(&other, "").expect("file");
        let meta = std::fs::metadata(&file).expect("metadata");
        let named = format!("{}:{}", meta.dev(), meta.ino());
        let named = std::ffi::OsStr::new(&named);
        assert!(names_the_stream(Some(named), &file));
        assert!(!names_the_stream(Some(named), &other), "another file");
        assert!(!names_the_stream(None, &file), "no JOURNAL_STREAM");
        assert!(!names_the_stream(Some(std::ffi::OsStr::new("junk")), &file));
    }
}
