//! `drover apply --dry-run`'s text: what each manifest would do, and the
//! targets a TaskRun or a Deployment would get now.

use agent_core::out;
use drover::watch::printable;
use drover_api::changes::PreviewItem;

/// Prints the previews; true when one would be refused or would select
/// no device.
pub fn print(previews: &[PreviewItem]) -> bool {
    let mut refused = false;
    for item in previews {
        refused |= item.refused() || item.targets == Some(0);
        out!(
            "{}/{} would be {}{} (dry run)",
            item.kind.name().to_lowercase(),
            printable(&item.name),
            item.result.name(),
            item.reason
                .as_deref()
                .map(|why| format!(": {}", printable(why)))
                .unwrap_or_default()
        );
        if let Some(count) = item.targets {
            let first: Vec<String> = item.first.iter().flatten().map(|n| printable(n)).collect();
            let more = count.saturating_sub(first.len() as u64);
            let canaries = item.canaries.unwrap_or(0);
            out!(
                "  targets: {count}{}{}{}",
                if canaries > 0 {
                    format!(" ({canaries} canary)")
                } else {
                    String::new()
                },
                if first.is_empty() {
                    String::new()
                } else {
                    format!(": {}", first.join(", "))
                },
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            );
            let excluded: Vec<String> = item
                .excluded
                .iter()
                .flatten()
                .map(|(why, n)| format!("{} {}", n, words(why)))
                .collect();
            if !excluded.is_empty() {
                out!("  left out: {}", excluded.join(", "));
            }
        }
        if let Some(warning) = &item.warning {
            out!("  warning: {}", printable(warning));
        }
        for part in &item.unmatched {
            out!("  matched nothing: {}", printable(part));
        }
        for zone in &item.windows {
            let state = match (&zone.opens_local, zone.open) {
                (_, true) => "open now".to_owned(),
                (Some(local), false) => format!("closed, opens {local} there"),
                (None, false) => "closed, does not open in the next days".to_owned(),
            };
            out!(
                "  window in {} ({} targets): {state}",
                printable(&zone.time_zone),
                zone.targets
            );
        }
    }
    refused
}

/// An exclusion's code in words.
fn words(code: &str) -> &str {
    match code {
        "decommissioned" => "decommissioned",
        "noAgentYet" => "without an agent yet",
        "agentLacksTheKind" => "whose agent does not run the job's kind",
        "noInventoryYet" => "without an inventory yet (run inventoryRefreshV1)",
        other => other,
    }
}
