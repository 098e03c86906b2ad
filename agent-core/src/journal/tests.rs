use super::*;
use crate::logging::Prioritized;
use tracing_subscriber::layer::SubscriberExt;

/// The fields of one native entry, as journald reads them.
fn parse(entry: &[u8]) -> Vec<(String, String)> {
    let mut fields = Vec::new();
    let mut rest = entry;
    while !rest.is_empty() {
        let end = rest.iter().position(|b| *b == b'\n').expect("a field ends");
        let head = &rest[..end];
        if let Some(eq) = head.iter().position(|b| *b == b'=') {
            fields.push((
                String::from_utf8_lossy(&head[..eq]).into_owned(),
                String::from_utf8_lossy(&head[eq + 1..]).into_owned(),
            ));
            rest = &rest[end + 1..];
        } else {
            let name = String::from_utf8_lossy(head).into_owned();
            let len_at = end + 1;
            let len = u64::from_le_bytes(rest[len_at..len_at + 8].try_into().expect("8 bytes"));
            let value = &rest[len_at + 8..len_at + 8 + len as usize];
            fields.push((name, String::from_utf8_lossy(value).into_owned()));
            rest = &rest[len_at + 8 + len as usize + 1..];
        }
    }
    fields
}

fn value<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

#[test]
fn a_jobs_lines_reach_the_journal_with_its_id_step_and_priority() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("socket");
    let journal = UnixDatagram::bind(&path).expect("bind");
    journal
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .expect("timeout");
    let writer = JournalWriter::to(&path, "drover-agent").expect("writer");
    let subscriber = tracing_subscriber::registry().with(JobFields).with(
        tracing_subscriber::fmt::layer()
            .with_writer(writer)
            .with_ansi(false)
            .event_format(Prioritized(
                tracing_subscriber::fmt::format::Format::default().without_time(),
            )),
    );
    tracing::subscriber::with_default(subscriber, || {
        let span = tracing::info_span!("job", job_id = %"6f1c3b1e-0000-4000-8000-000000000001", kind = "systemUpgradeV1");
        let _entered = span.enter();
        tracing::warn!(step = "full-upgrade", "apt is slow");
        tracing::info!("job progress\nsecond line");
        drop(_entered);
        tracing::error!("cannot record");
    });
    let mut entries = Vec::new();
    let mut buf = vec![0u8; 65_536];
    for _ in 0..3 {
        let n = journal.recv(&mut buf).expect("an entry");
        entries.push(parse(&buf[..n]));
    }
    let slow = &entries[0];
    assert_eq!(value(slow, "PRIORITY"), Some("4"));
    assert_eq!(value(slow, "SYSLOG_IDENTIFIER"), Some("drover-agent"));
    assert_eq!(
        value(slow, "JOB_ID"),
        Some("6f1c3b1e-0000-4000-8000-000000000001")
    );
    assert_eq!(value(slow, "STEP"), Some("full-upgrade"));
    // The message is the line the journal stream had, without its prefix.
    let message = value(slow, "MESSAGE").expect("message");
    assert!(message.starts_with("WARN job{job_id=6f1c3b1e"), "{message}");
    assert!(
        message.contains("apt is slow") && message.contains("step=\"full-upgrade\""),
        "{message}"
    );
    // A message with a newline goes whole (the length-prefixed form).
    let progress = &entries[1];
    assert_eq!(value(progress, "PRIORITY"), Some("6"));
    assert_eq!(value(progress, "STEP"), None, "no step on this line");
    assert!(
        value(progress, "MESSAGE")
            .expect("message")
            .contains("job progress\nsecond line")
    );
    assert_eq!(value(progress, "JOB_ID"), value(slow, "JOB_ID"));
    // Outside the job's span: no job id (the positive control of the field).
    let error = &entries[2];
    assert_eq!(value(error, "PRIORITY"), Some("3"));
    assert_eq!(value(error, "JOB_ID"), None);
}

#[test]
fn a_line_the_journal_does_not_take_is_not_lost() {
    // No socket at the path: the writer says it wrote the line (it went
    // to stderr), and the subscriber goes on.
    let dir = tempfile::tempdir().expect("tmp");
    let mut writer = JournalWriter::to(&dir.path().join("none"), "drover-agent").expect("writer");
    assert_eq!(writer.write(b"<6> INFO hello\n").expect("write"), 15);
}
