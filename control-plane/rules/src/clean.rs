//! What a device reports is checked and bounded where it enters, once:
//! lengths, control and bidi characters.

use drover_model::model::JobStatus;

/// Upper bound of a field a device reports about itself (version, boot id,
/// one capability, OS name, architecture).
pub const MAX_REPORTED: usize = 256;
/// Upper bound of the capabilities a device may report.
const MAX_CAPABILITIES: usize = 32;

/// Why a text a device sent cannot be kept: too long, or holding control
/// characters (escape sequences would reach an operator's terminal).
pub fn check_text(what: &str, text: &str, max: usize) -> Option<String> {
    if text.len() > max {
        return Some(format!(
            "{what} is {} bytes, over the limit of {max}",
            text.len()
        ));
    }
    if text.chars().any(|c| c.is_control() || is_bidi_override(c)) {
        return Some(format!(
            "{what} holds control or bidirectional-override characters"
        ));
    }
    None
}

/// Unicode's bidirectional embedding, override and isolate characters.
pub fn is_bidi_override(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

pub fn check_reported(version: &str, boot_id: &str, capabilities: &[String]) -> Option<String> {
    if capabilities.len() > MAX_CAPABILITIES {
        return Some(format!(
            "{} capabilities reported, over the limit of {MAX_CAPABILITIES}",
            capabilities.len()
        ));
    }
    check_text("the agent version", version, MAX_REPORTED)
        .or_else(|| check_text("the boot id", boot_id, MAX_REPORTED))
        .or_else(|| {
            capabilities
                .iter()
                .find_map(|c| check_text("a capability", c, MAX_REPORTED))
        })
}

/// `text` with every control character but newline and tab, and every
/// bidirectional override, replaced by U+FFFD: what a device reports can
/// neither drive an operator's terminal nor reorder what the dashboard
/// shows. Cleaned where it enters, once, so every reader sees the same.
pub fn printable(text: String) -> String {
    let unsafe_char = |c: char| (c.is_control() && c != '\n' && c != '\t') || is_bidi_override(c);
    if !text.chars().any(unsafe_char) {
        return text;
    }
    text.chars()
        .map(|c| if unsafe_char(c) { '\u{FFFD}' } else { c })
        .collect()
}

/// A status as the control plane keeps it: every field bounded and
/// [`printable`], whatever a device sent (errors ≤ 1 KiB, at most 16
/// steps, bounded lists).
pub fn bounded_status(status: &JobStatus) -> JobStatus {
    use drover_model::{MAX_ERROR_BYTES, MAX_STEPS};
    let bounded = |text: String, max: usize| drover_model::bounded(printable(text), max);
    let mut status = status.clone();
    status.error = status.error.map(|e| bounded(e, MAX_ERROR_BYTES));
    status.kind = bounded(status.kind, 64);
    status.boot_id = bounded(status.boot_id, MAX_REPORTED);
    // Printable, with the agent's own cleaning on top: one line each,
    // no escape sequences, bounded in number and length.
    status.reason = drover_model::reason::bounded_reason(&status.reason)
        .into_iter()
        .map(printable)
        .collect();
    status.steps.truncate(MAX_STEPS);
    for step in &mut status.steps {
        step.name = bounded(std::mem::take(&mut step.name), 64);
        step.error = step.error.take().map(|e| bounded(e, MAX_ERROR_BYTES));
    }
    if let Some(drover_model::JobOutput::Upgrade(report)) = &mut status.output {
        let max = drover_model::model::MAX_LISTED_PACKAGES;
        let before = report.upgraded.len()
            + report.installed.len()
            + report.removed.len()
            + report.kept_back.len();
        report.upgraded.truncate(max);
        report.installed.truncate(max);
        report.removed.truncate(max);
        report.kept_back.truncate(max);
        for change in report
            .upgraded
            .iter_mut()
            .chain(report.installed.iter_mut())
        {
            change.name = bounded(std::mem::take(&mut change.name), 256);
            change.to = bounded(std::mem::take(&mut change.to), 256);
            change.from = change.from.take().map(|f| bounded(f, 256));
        }
        for name in report.removed.iter_mut().chain(report.kept_back.iter_mut()) {
            *name = bounded(std::mem::take(name), 256);
        }
        let after = report.upgraded.len()
            + report.installed.len()
            + report.removed.len()
            + report.kept_back.len();
        report.omitted = report.omitted.saturating_add((before - after) as u32);
    }
    if let Some(drover_model::JobOutput::Software(software)) = &mut status.output {
        let before = software.packages.len();
        software
            .packages
            .truncate(drover_model::model::MAX_INVENTORY_PACKAGES);
        software.packages.retain(|p| {
            (1..=128).contains(&p.name.len())
                && (1..=128).contains(&p.version.len())
                && !p
                    .name
                    .chars()
                    .chain(p.version.chars())
                    .any(char::is_control)
        });
        software.omitted = software
            .omitted
            .saturating_add((before - software.packages.len()) as u32);
    }
    if let Some(drover_model::JobOutput::Inventory(inventory))
    | Some(drover_model::JobOutput::Software(drover_model::model::SoftwareInventory {
        inventory,
        ..
    })) = &mut status.output
    {
        inventory.os_release = bounded(std::mem::take(&mut inventory.os_release), MAX_REPORTED);
        inventory.architecture = bounded(std::mem::take(&mut inventory.architecture), MAX_REPORTED);
        inventory.kernel = bounded(std::mem::take(&mut inventory.kernel), MAX_REPORTED);
        inventory.disks.truncate(64);
        for disk in &mut inventory.disks {
            disk.mount_point = bounded(std::mem::take(&mut disk.mount_point), MAX_REPORTED);
        }
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_model::reason::{MAX_REASON_LINE_BYTES, MAX_REASON_LINES};

    /// Whatever reason lines a peer sends, the control plane keeps at most
    /// 40 of at most 300 bytes, one line each, with no escape sequence,
    /// control character or direction override.
    #[test]
    fn a_peers_reason_lines_are_kept_bounded_and_printable() {
        let mut lines: Vec<String> = (0..500)
            .map(|i| format!("E: \u{1b}[31m{i}\u{1b}[0m gpj\u{202E}.exe\u{7}\nsecond line"))
            .collect();
        lines.insert(0, "x".repeat(10_000));
        let status: JobStatus = serde_json::from_value(serde_json::json!({
            "jobId": "00000000-0000-4000-8000-000000000001", "deviceId": "pi-1",
            "attempt": 1, "kind": "systemUpgradeV1", "state": "Failed", "steps": [],
            "error": "step full-upgrade failed", "output": null,
            "acceptedAt": "2026-12-01T00:00:00Z", "startedAt": null, "finishedAt": null,
            "bootId": "b", "completionHeartbeatAt": null, "seq": 1, "reason": lines,
        }))
        .expect("a status");
        let kept = bounded_status(&status).reason;
        assert_eq!(kept.len(), MAX_REASON_LINES);
        assert!(kept[0].len() <= MAX_REASON_LINE_BYTES, "{}", kept[0].len());
        assert_eq!(kept[1], "E: 0 gpj\u{FFFD}.exesecond line");
        for line in &kept {
            assert!(
                !line.chars().any(|c| c.is_control() || is_bidi_override(c)),
                "{line:?}"
            );
        }
    }
}
