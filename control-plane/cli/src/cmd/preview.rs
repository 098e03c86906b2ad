//! `drover apply --dry-run`'s text: what each manifest would do, and the
//! targets a TaskRun or a Deployment would get now.

use agent_core::out;
use drover::watch::printable;
use serde_json::Value;

/// Prints the previews; true when one would be refused.
pub fn print(previews: &[Value]) -> bool {
    let mut refused = false;
    for item in previews {
        let text = |v: &Value| printable(v.as_str().unwrap_or("?"));
        let result = text(&item["result"]);
        refused |= result.starts_with("refused");
        out!(
            "{}/{} would be {result} (dry run)",
            text(&item["kind"]).to_lowercase(),
            text(&item["name"])
        );
        if let Some(count) = item["targets"].as_u64() {
            let first: Vec<String> = item["first"]
                .as_array()
                .into_iter()
                .flatten()
                .map(text)
                .collect();
            let more = count.saturating_sub(first.len() as u64);
            let canaries = item["canaries"].as_u64().unwrap_or(0);
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
            let excluded: Vec<String> = item["excluded"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(why, n)| format!("{} {}", n, words(why)))
                .collect();
            if !excluded.is_empty() {
                out!("  left out: {}", excluded.join(", "));
            }
        }
        if let Some(warning) = item["warning"].as_str() {
            out!("  warning: {}", printable(warning));
        }
    }
    refused
}

/// An exclusion's code in words.
fn words(code: &str) -> &str {
    match code {
        "decommissioned" => "decommissioned",
        "noAgentYet" => "without an agent yet",
        "agentLacksTheKind" => "whose agent does not run systemUpgradeV1",
        "noInventoryYet" => "without an inventory yet (run inventoryRefreshV1)",
        other => other,
    }
}
