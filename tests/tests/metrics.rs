//! `GET /metrics` (issue 17) against a real control plane with agents in
//! simulate mode: its counters agree with what the API says, it needs the
//! operator token, and it speaks the OpenMetrics text format.

use drover_tests::{AgentProcess, ControlPlane, http_client};
use serde_json::json;
use std::time::Duration;

/// The value of the sample `name{labels}` (labels as written), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_agree_with_the_api_after_a_run() {
    let cp = ControlPlane::start(&[]);
    let devices = ["m-1", "m-2", "m-3"];
    for device in devices {
        cp.apply_device(device, &["production"], json!({})).await;
    }
    // Registered, never connected: counted apart.
    cp.apply_device("m-never", &["elsewhere"], json!({})).await;
    let _agents: Vec<AgentProcess> = devices
        .iter()
        .map(|d| {
            AgentProcess::start(
                &cp.dir.path().join(d),
                d,
                &cp.agent_url,
                &cp.device_token(d),
                "",
            )
        })
        .collect();
    cp.wait_for_agents(&devices).await;
    cp.apply_upgrade_run("measured", "production", 600).await;
    let run = cp
        .wait_run_finished("measured", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}");

    let http = http_client();
    let url = format!("{}/metrics", cp.api);
    let refused = http.get(&url).send().await.expect("scrape");
    assert_eq!(refused.status(), 401, "the operator token is needed");
    let response = http
        .get(&url)
        .bearer_auth(&cp.token)
        .send()
        .await
        .expect("scrape");
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .expect("type")
            .starts_with("application/openmetrics-text"),
        "{:?}",
        response.headers()
    );
    let text = response.text().await.expect("text");
    let value =
        |series: &str| sample(&text, series).unwrap_or_else(|| panic!("no {series} in\n{text}"));
    let succeeded = run["status"]["succeeded"].as_f64().expect("succeeded");
    assert_eq!(succeeded, 3.0);
    assert_eq!(value("drover_devices{state=\"online\"}"), 3.0);
    assert_eq!(value("drover_devices{state=\"never_connected\"}"), 1.0);
    assert_eq!(
        value("drover_connected_agents{transport=\"websocket\"}"),
        3.0
    );
    assert_eq!(
        value("drover_jobs_released_total{kind=\"systemUpgradeV1\"}"),
        run["status"]["released"].as_f64().expect("released")
    );
    assert_eq!(
        value("drover_jobs_finished_total{state=\"succeeded\",kind=\"systemUpgradeV1\"}"),
        succeeded
    );
    assert_eq!(value("drover_delivery_seconds_count"), 3.0, "one per job");
    assert!(value("drover_status_intake_seconds_count") >= 3.0);
    assert!(value("drover_store_commit_seconds_count") >= 3.0);
    assert!(value("drover_engine_pass_seconds_count{kind=\"run\"}") >= 1.0);
    assert!(text.ends_with("# EOF\n"));
}
