//! What `GET /metrics` shows Prometheus (the OpenMetrics text format of the
//! prometheus-client crate): devices by state, connected agents per
//! transport, undecided jobs by delivery state and kind, finished jobs by
//! state and kind, how long delivery and the status intake take, store
//! commits and engine passes. One registry per process
//! ([`metrics`]); the delivery core, the store and the engine record into it
//! as they work, and the API sets the gauges that are cheaper to compute on
//! a scrape (devices, connections).

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::{LazyLock, Mutex};

/// Label pairs: the family's key.
pub type Labels = Vec<(&'static str, String)>;

pub struct Metrics {
    registry: Mutex<Registry>,
    pub devices: Family<Labels, Gauge>,
    pub patch: Family<Labels, Gauge>,
    pub agents: Family<Labels, Gauge>,
    pub jobs_undecided: Family<Labels, Gauge>,
    pub jobs_released: Family<Labels, Counter>,
    pub jobs_finished: Family<Labels, Counter>,
    pub delivery_seconds: Histogram,
    pub status_intake_seconds: Histogram,
    pub store_commit_seconds: Histogram,
    pub engine_pass_seconds: Family<Labels, Histogram>,
    pub link_up: Family<Labels, Gauge>,
    pub link_last_progress: Family<Labels, Gauge>,
    pub link_stalls: Family<Labels, Gauge>,
}

/// 1 ms to about 33 s, doubling.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("drover");
        let metrics = Self {
            registry: Mutex::new(Registry::default()),
            devices: Family::default(),
            patch: Family::default(),
            agents: Family::default(),
            jobs_undecided: Family::default(),
            jobs_released: Family::default(),
            jobs_finished: Family::default(),
            delivery_seconds: latency(),
            status_intake_seconds: latency(),
            store_commit_seconds: latency(),
            engine_pass_seconds: Family::new_with_constructor(latency),
            link_up: Family::default(),
            link_last_progress: Family::default(),
            link_stalls: Family::default(),
        };
        registry.register(
            "devices",
            "Registered devices by state: online, offline, never_connected, decommissioned",
            metrics.devices.clone(),
        );
        registry.register(
            "devices_patch",
            "Devices (not decommissioned) by patch status, from each one's latest assessment: devices, up_to_date, with_updates, with_security_updates, security_under_1_day, security_1_to_7_days, security_over_7_days (the oldest pending security update's wait), no_security_archive, reboot_pending, stale (not assessed for over 2 days), never_assessed; a device counts in each that holds",
            metrics.patch.clone(),
        );
        registry.register(
            "connected_agents",
            "Agents connected to this replica, by transport",
            metrics.agents.clone(),
        );
        registry.register(
            "jobs_undecided",
            "Jobs not decided yet, by state (undelivered, accepted, waiting, running, awaitingReboot, canceling: the names the API, CLI and dashboard show) and kind",
            metrics.jobs_undecided.clone(),
        );
        registry.register(
            "jobs_released",
            "Jobs released by the engines, by kind",
            metrics.jobs_released.clone(),
        );
        registry.register(
            "jobs_finished",
            "Jobs decided (by a terminal status, or expired before delivery), by state and kind",
            metrics.jobs_finished.clone(),
        );
        registry.register(
            "delivery_seconds",
            "From a job's release to the agent's acknowledgement, on the control plane's clock",
            metrics.delivery_seconds.clone(),
        );
        registry.register(
            "status_intake_seconds",
            "From an agent's event reaching the delivery core to its commit",
            metrics.status_intake_seconds.clone(),
        );
        registry.register(
            "store_commit_seconds",
            "One commit to the store (embedded or NATS)",
            metrics.store_commit_seconds.clone(),
        );
        registry.register(
            "engine_pass_seconds",
            "One engine pass over a task run or a deployment",
            metrics.engine_pass_seconds.clone(),
        );
        registry.register(
            "link_up",
            "1 while an agent link is connected and moving, by transport (0: connecting or stalled)",
            metrics.link_up.clone(),
        );
        registry.register(
            "link_last_progress_timestamp_seconds",
            "When a brokered agent link last moved (a packet in or out, a connection attempt), Unix time",
            metrics.link_last_progress.clone(),
        );
        registry.register(
            "link_stalls",
            "Times an agent link stopped moving while connected and was reconnected, since the process started",
            metrics.link_stalls.clone(),
        );
        *metrics.registry.lock().unwrap_or_else(|p| p.into_inner()) = registry;
        metrics
    }

    /// The registry in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut text, &registry);
        text
    }
}

/// The content type of [`Metrics::encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// This process's metrics.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

/// Records one store commit's duration (`Db::observe_commits`).
pub fn store_commit(took: std::time::Duration) {
    metrics().store_commit_seconds.observe(took.as_secs_f64());
}

/// Seconds between two instants, for a histogram.
pub fn seconds(since: std::time::Instant) -> f64 {
    since.elapsed().as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_names_every_family_with_its_labels() {
        let m = metrics();
        m.devices
            .get_or_create(&vec![("state", "online".into())])
            .set(3);
        // A kind no other test uses: the registry is one per process, and
        // the delivery core's unit tests count their jobs in it too.
        m.jobs_finished
            .get_or_create(&vec![
                ("state", "succeeded".into()),
                ("kind", "metricsTestV1".into()),
            ])
            .inc();
        // Likewise: the engine's unit tests time their passes here.
        m.engine_pass_seconds
            .get_or_create(&vec![("kind", "metricsTest".into())])
            .observe(0.002);
        let text = m.encode();
        assert!(
            text.contains("drover_devices{state=\"online\"} 3"),
            "{text}"
        );
        assert!(
            text.contains(
                "drover_jobs_finished_total{state=\"succeeded\",kind=\"metricsTestV1\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("drover_engine_pass_seconds_bucket{le=\"0.002\",kind=\"metricsTest\"} 1")
                || text.contains(
                    "drover_engine_pass_seconds_bucket{kind=\"metricsTest\",le=\"0.002\"} 1"
                ),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
