//! What a run costs the NATS servers, counted by the servers themselves
//! (issue 57, item 2): their monitoring endpoints read before the run is
//! applied and after it completes. `/varz` counts every message into and
//! out of a server (clients' and, on a cluster, routes'); `/connz` the
//! control plane's own connections; `/jsz` each stream's last sequence (a
//! KV bucket is a stream: one sequence per put, delete or purge) and the
//! JetStream API requests the server answered.

use anyhow::{Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;

/// Counters summed over every node (a stream's writes: its highest
/// sequence on any node, since each replica holds the same stream).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NatsCounts {
    /// Messages the servers took in and sent out, every connection.
    pub in_msgs: u64,
    pub out_msgs: u64,
    /// The control plane's connections' share: messages it published and
    /// messages delivered to it.
    pub control_plane_in: u64,
    pub control_plane_out: u64,
    /// JetStream API requests answered (stream info, consumer creation,
    /// `STREAM.MSG.GET`; puts and direct gets are not API requests).
    pub api_requests: u64,
    /// Each stream's writes: its last sequence.
    pub writes: BTreeMap<String, u64>,
}

impl NatsCounts {
    /// Reads every node's monitoring endpoint (`http://127.0.0.1:PORT`);
    /// the control plane's connections are those whose name begins with
    /// `control_plane_name`, among each node's busiest (a control plane
    /// logged in by a JWT is known to the server by a key it makes at
    /// each start, so not by its user).
    pub async fn read(
        http: &reqwest::Client,
        monitors: &[String],
        control_plane_name: &str,
    ) -> Result<Self> {
        let mut counts = Self::default();
        for monitor in monitors {
            let get = async |path: &str| -> Result<Value> {
                http.get(format!("{monitor}{path}"))
                    .send()
                    .await?
                    .error_for_status()?
                    .json()
                    .await
                    .with_context(|| format!("{monitor}{path}"))
            };
            let varz = get("/varz").await?;
            counts.in_msgs += varz["in_msgs"].as_u64().unwrap_or(0);
            counts.out_msgs += varz["out_msgs"].as_u64().unwrap_or(0);
            let connz = get("/connz?sort=msgs_from&limit=16").await?;
            let connections = connz["connections"].as_array().into_iter().flatten();
            for connection in connections.filter(|c| {
                c["name"]
                    .as_str()
                    .is_some_and(|name| name.starts_with(control_plane_name))
            }) {
                // A client's in_msgs are what it published, its out_msgs
                // what the server delivered to it.
                counts.control_plane_in += connection["in_msgs"].as_u64().unwrap_or(0);
                counts.control_plane_out += connection["out_msgs"].as_u64().unwrap_or(0);
            }
            let jsz = get("/jsz?accounts=true&streams=true").await?;
            counts.api_requests += jsz["api"]["total"].as_u64().unwrap_or(0);
            counts.add_streams(&jsz);
        }
        Ok(counts)
    }

    fn add_streams(&mut self, jsz: &Value) {
        let accounts = jsz["account_details"].as_array().into_iter().flatten();
        for stream in accounts.flat_map(|a| a["stream_detail"].as_array().into_iter().flatten()) {
            let Some(name) = stream["name"].as_str() else {
                continue;
            };
            let last = stream["state"]["last_seq"].as_u64().unwrap_or(0);
            let kept = self.writes.entry(name.to_owned()).or_default();
            *kept = (*kept).max(last);
        }
    }

    /// What grew from `before` to `self`.
    pub fn since(&self, before: &Self) -> Self {
        Self {
            in_msgs: self.in_msgs.saturating_sub(before.in_msgs),
            out_msgs: self.out_msgs.saturating_sub(before.out_msgs),
            control_plane_in: self
                .control_plane_in
                .saturating_sub(before.control_plane_in),
            control_plane_out: self
                .control_plane_out
                .saturating_sub(before.control_plane_out),
            api_requests: self.api_requests.saturating_sub(before.api_requests),
            writes: self
                .writes
                .iter()
                .map(|(name, last)| {
                    let was = before.writes.get(name).copied().unwrap_or(0);
                    (name.clone(), last.saturating_sub(was))
                })
                .collect(),
        }
    }

    /// Per device, one line: messages in and out (the control plane's
    /// share), API requests and each stream's writes (streams with none
    /// left out).
    pub fn per_device(&self, devices: usize) -> String {
        let n = devices.max(1) as f64;
        let per = |count: u64| format!("{:.1}", count as f64 / n);
        let writes: Vec<String> = self
            .writes
            .iter()
            .filter(|(_, count)| **count > 0)
            .map(|(name, count)| format!("{name} {}", per(*count)))
            .collect();
        format!(
            "messages in {} (control plane {}), out {} (to the control plane {}); JetStream API {}; writes: {}",
            per(self.in_msgs),
            per(self.control_plane_in),
            per(self.out_msgs),
            per(self.control_plane_out),
            per(self.api_requests),
            if writes.is_empty() {
                "none".to_owned()
            } else {
                writes.join(", ")
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_runs_counts_are_what_grew_per_stream_and_per_device() {
        let mut before = NatsCounts::default();
        before.add_streams(&json!({"account_details": [{"stream_detail": [
            {"name": "KV_system-upgrade-status", "state": {"last_seq": 10}},
        ]}]}));
        let mut after = NatsCounts {
            in_msgs: 500,
            out_msgs: 700,
            control_plane_in: 200,
            control_plane_out: 300,
            api_requests: 4,
            ..Default::default()
        };
        // The same stream on two nodes counts once; a new stream from zero.
        for node in [30, 28] {
            after.add_streams(&json!({"account_details": [{"stream_detail": [
                {"name": "KV_system-upgrade-status", "state": {"last_seq": node}},
                {"name": "KV_system-upgrade-intent", "state": {"last_seq": 10}},
                {"name": "drover-held-statuses", "state": {"last_seq": 0}},
            ]}]}));
        }
        let run = after.since(&before);
        assert_eq!(run.writes["KV_system-upgrade-status"], 20);
        assert_eq!(run.writes["KV_system-upgrade-intent"], 10);
        assert_eq!(
            run.per_device(10),
            "messages in 50.0 (control plane 20.0), out 70.0 (to the control plane 30.0); \
             JetStream API 0.4; writes: KV_system-upgrade-intent 1.0, KV_system-upgrade-status 2.0"
        );
    }
}
