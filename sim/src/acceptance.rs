//! Intent → accepted at the control plane, as `drover-sim footprint`
//! measures it: one-job Deployments released in turn, each timed by the
//! control plane's own stamps.

use crate::harness::Api;
use anyhow::{Result, bail};
use serde_json::json;
use std::time::{Duration, Instant};

/// The value at fraction `q` of sorted `values` (nearest rank).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Releases `count` one-job Deployments (inventory refresh) one after
/// another and reads, for each, the control plane's own stamps: when it made
/// the job, and when the agent's acceptance reached it. Both are the control
/// plane's clock, so the figure is the whole round trip: store commit,
/// delivery over the transport, the agent's durable record, its answer.
pub(crate) async fn accept_latency(api: &Api, count: usize) -> Result<Option<(f64, f64, usize)>> {
    if count == 0 {
        return Ok(None);
    }
    let mut samples = Vec::with_capacity(count);
    for n in 0..count {
        let name = format!("latency-{n}");
        api.post(
            "/apply",
            &json!({"apiVersion": drover_rules::records::API_VERSION, "kind": "Deployment",
                    "metadata": {"name": name},
                    "spec": {"targets": {"filter": {"groups": ["bench"]}}, "inventoryRefreshV1": {},
                             "maxConcurrency": 1, "deadlineSeconds": 600}}),
        )
        .await?;
        let started = Instant::now();
        let (created, acked) = loop {
            if started.elapsed() > Duration::from_secs(60) {
                bail!("{name}: the agent did not accept its job within 60 s");
            }
            let targets = api.get(&format!("/deployments/{name}/targets")).await?;
            let item = &targets["items"][0];
            if let (Some(created), Some(acked)) = (
                item["createdAt"].as_str(),
                item["delivery"]["acked"]["at"].as_str(),
            ) {
                break (
                    created.parse::<jiff::Timestamp>()?,
                    acked.parse::<jiff::Timestamp>()?,
                );
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        samples.push(acked.duration_since(created).as_secs_f64() * 1000.0);
    }
    samples.sort_by(f64::total_cmp);
    Ok(Some((
        percentile(&samples, 0.5),
        percentile(&samples, 0.99),
        samples.len(),
    )))
}
