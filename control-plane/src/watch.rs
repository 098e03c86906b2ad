//! `drover runs watch NAME`: a live progress bar of a run's counts until it
//! finishes. Exits non-zero unless the run is Complete.

use crate::client::ApiClient;
use agent_core::out;
use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use std::time::Duration;

pub async fn watch(client: &ApiClient, name: &str) -> Result<bool> {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {prefix} [{bar:30}] {pos}/{len} done  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(name.to_owned());
    loop {
        let run: Value = client.get(&format!("/taskruns/{name}")).await?;
        let status = &run["status"];
        let count = |k: &str| status[k].as_u64().unwrap_or(0);
        bar.set_length(count("targets"));
        bar.set_position(count("succeeded") + count("failed"));
        let phase = status["phase"].as_str().unwrap_or("?");
        bar.set_message(format!(
            "{phase}: {} released, {} succeeded, {} failed",
            count("released"),
            count("succeeded"),
            count("failed")
        ));
        if phase == "Complete" || phase == "Failed" {
            bar.finish();
            if let Some(reason) = status["reason"].as_str() {
                out!("reason: {reason}");
            }
            if let Some(error) = status["latestError"].as_str() {
                out!("latest error: {error}");
            }
            return Ok(phase == "Complete");
        }
        bar.tick();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
