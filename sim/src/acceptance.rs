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
/// The agent's own stamp of its acceptance (the same machine's clock) splits
/// it in two: the way out, and the way back.
pub(crate) async fn accept_latency(api: &Api, count: usize) -> Result<Option<Acceptance>> {
    if count == 0 {
        return Ok(None);
    }
    let mut samples = Vec::with_capacity(count);
    let (mut out, mut back) = (Vec::new(), Vec::new());
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
        let (created, acked, agent) = loop {
            if started.elapsed() > Duration::from_secs(60) {
                bail!("{name}: the agent did not accept its job within 60 s");
            }
            let targets = api.get(&format!("/deployments/{name}/targets")).await?;
            let item = &targets["items"][0];
            if let (Some(created), Some(acked)) = (
                item["createdAt"].as_str(),
                item["delivery"]["acked"]["at"].as_str(),
            ) {
                let agent = item["status"]["acceptedAt"].as_str();
                break (
                    created.parse::<jiff::Timestamp>()?,
                    acked.parse::<jiff::Timestamp>()?,
                    agent.and_then(|a| a.parse::<jiff::Timestamp>().ok()),
                );
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        let ms = |from: jiff::Timestamp, to: jiff::Timestamp| {
            to.duration_since(from).as_secs_f64() * 1000.0
        };
        samples.push(ms(created, acked));
        if let Some(agent) = agent {
            out.push(ms(created, agent));
            back.push(ms(agent, acked));
        }
    }
    let p50_p99 = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        (percentile(&values, 0.5), percentile(&values, 0.99))
    };
    Ok(Some(Acceptance {
        jobs: samples.len(),
        total: p50_p99(samples),
        out: p50_p99(out),
        back: p50_p99(back),
    }))
}

/// Intent → accepted (p50, p99 in ms), and its two halves: made → the
/// agent's stamp of its acceptance, and that stamp → accepted (of the
/// samples whose target showed the agent's status when read).
#[derive(Debug, Clone, Copy)]
pub struct Acceptance {
    pub jobs: usize,
    pub total: (f64, f64),
    pub out: (f64, f64),
    pub back: (f64, f64),
}
