//! The scale path as operators run it (issue 18): three `nats-server -js`
//! nodes as one cluster, every Drover bucket with three replicas, three
//! control-plane replicas on the NATS store, and agents given every node's
//! URL. Mid-rollout one node (the JetStream meta leader in one test, a
//! follower in the other) and one control-plane replica are SIGKILLed and
//! later restarted. The run completes, every device ran its job once, no
//! status is lost, and the job records show each intent released once.
//! The nodes run `cluster_nats_server()`: 2.10 or later (see there).

use drover_tests::{
    AgentProcess, CP_BROKER_USER, ControlPlane, NatsCluster, eventually, hold_config, nats_auth,
    within,
};
use serde_json::{Value, json};
use std::time::Duration;

const PASSWORD: &str = "cluster-secret";

/// Three control-plane replicas sharing the secrets (not the data
/// directory), all on the cluster's store with three replicas per bucket.
fn replicas(first: tempfile::TempDir, urls: &str) -> Vec<ControlPlane> {
    let args = [
        "--store",
        "nats",
        "--nats-url",
        urls,
        "--nats-user",
        CP_BROKER_USER,
        "--nats-password",
        PASSWORD,
        "--nats-replicas",
        "3",
    ];
    let mut dirs = vec![first];
    for _ in 0..2 {
        let dir = ControlPlane::prepare_replica(dirs[0].path());
        dirs.push(dir);
    }
    dirs.into_iter()
        .map(|dir| ControlPlane::start_in(dir, &args))
        .collect()
}

async fn a_rollout_survives_a_killed_node_and_replica(kill_leader: bool) {
    let devices: Vec<String> = (0..6).map(|i| format!("cl-{i}")).collect();
    let dir = ControlPlane::prepare();
    let mut cluster = NatsCluster::start(&nats_auth(dir.path(), &devices, PASSWORD)).await;
    let urls = cluster.urls();
    let mut cps = replicas(dir, &urls);
    for device in &devices {
        let labels = if device == "cl-0" {
            json!({"canary": "true"})
        } else {
            json!({})
        };
        cps[1].apply_device(device, &["production"], labels).await;
    }
    let canary_dir = cps[0].dir.path().join("cl-0");
    std::fs::create_dir_all(&canary_dir).expect("dir");
    let hold = canary_dir.join("hold");
    let reached = canary_dir.join("reached");
    std::fs::write(&hold, "").expect("hold");
    let testing = hold_config(&hold, &reached);
    // Every agent is given every node, in a different order.
    let agents: Vec<AgentProcess> = devices
        .iter()
        .enumerate()
        .map(|(i, device)| {
            let mut nodes: Vec<String> = cluster.nodes.iter().map(|n| n.url()).collect();
            nodes.rotate_left(i % 3);
            AgentProcess::start_nats(
                &cps[0].dir.path().join(device),
                device,
                &nodes.join(","),
                &cps[0].device_token(device),
                None,
                if device == "cl-0" { &testing } else { "" },
            )
        })
        .collect();
    let names: Vec<&str> = devices.iter().map(String::as_str).collect();
    cps[1].wait_for_agents(&names).await;
    // Every intent put from here on, as each node's subscriber saw it: the
    // subscribers on the two nodes that live through the test see every put,
    // restarts included.
    let mut puts = Vec::new();
    for node in &cluster.nodes {
        puts.push(drover_tests::IntentPuts::record(&node.url(), CP_BROKER_USER, PASSWORD).await);
    }
    cps[1]
        .apply_upgrade_run("clustered", "production", 600)
        .await;
    eventually(Duration::from_secs(60), "the canary mid-job", || async {
        reached.exists().then_some(())
    })
    .await;

    // Mid-rollout: a node and a replica die.
    let leader = cluster.meta_leader().await.expect("a meta leader");
    let victim = if kill_leader {
        leader
    } else {
        (leader + 1) % 3
    };
    cluster.nodes[victim].kill9();
    cps[0].kill9();
    if kill_leader {
        eventually(Duration::from_secs(60), "a new meta leader", || async {
            cluster.meta_leader().await.filter(|new| *new != victim)
        })
        .await;
    }
    // The agents are all on the surviving nodes (their configs name every
    // node; async-nats also learns the cluster's nodes from the one it has).
    eventually(
        Duration::from_secs(60),
        "every agent on a survivor",
        || async {
            let users = cluster.connected_users().await;
            devices.iter().all(|d| users.contains(d)).then_some(())
        },
    )
    .await;
    std::fs::remove_file(&hold).expect("release the canary");
    let finished = tokio::time::timeout(
        Duration::from_secs(180),
        cps[1].wait_run_finished("clustered", Duration::from_secs(200)),
    )
    .await;
    let Ok(run) = finished else {
        let targets = cps[1].targets("clustered").await;
        let jobs: Vec<Value> = agents.iter().map(AgentProcess::status).collect();
        panic!(
            "the run did not finish (victim n{victim}):\n{targets:#?}\nagents: {jobs:#?}\n{}\n\
             replica 1:\n{}\nreplica 2:\n{}",
            cluster.stream_report().await,
            drover_tests::log_tail(&cps[1].dir.path().join("drover.log")),
            drover_tests::log_tail(&cps[2].dir.path().join("drover.log"))
        );
    };
    assert_eq!(
        run["status"]["phase"],
        "Complete",
        "{run}\n{}\n{}",
        cps[1].log(),
        cps[2].log()
    );
    assert_eq!(run["status"]["succeeded"], 6, "{run}");
    assert_eq!(run["status"]["released"], 6, "{run}");

    // Both come back; every replica agrees, nothing is released again.
    cluster.nodes[victim].restart();
    cps[0].restart();
    let agreed = within(Duration::from_secs(60), || async {
        let seen = cps[0].get("/taskruns/clustered").await;
        (seen["status"] == run["status"]).then_some(())
    })
    .await;
    if agreed.is_none() {
        panic!(
            "the restarted replica does not agree (victim n{victim}):\n{}\nvs {}\n{}\n{}",
            cps[0].get("/taskruns/clustered").await["status"],
            run["status"],
            cluster.stream_report().await,
            drover_tests::log_tail(&cps[0].dir.path().join("drover.log"))
        );
    }
    // Each device ran the job once: one job, every step tried once.
    for agent in &agents {
        agent.assert_one_job_run_once();
    }
    // No status lost, each intent released once, by the control plane's
    // own records: one job record per target, created once (create-only)
    // before the kills or after, each holding the device's terminal status.
    // Every replica's view converges (a replica whose watch lost its
    // consumer with the killed node starts it again, see kv.rs).
    let uid = run["metadata"]["uid"].as_str().expect("uid");
    for (i, cp) in cps.iter().enumerate() {
        let converged = within(Duration::from_secs(60), || async {
            let targets = cp.targets("clustered").await;
            targets
                .iter()
                .all(|t| t["status"]["state"] == "Succeeded")
                .then_some(())
        })
        .await;
        if converged.is_none() {
            panic!(
                "replica {i}'s view of the jobs lags (victim n{victim}):\n{:#?}\n{}\n{}",
                cp.targets("clustered").await,
                cluster.stream_report().await,
                drover_tests::log_tail(&cp.dir.path().join("drover.log"))
            );
        }
    }
    let targets = cps[2].targets("clustered").await;
    assert_eq!(targets.len(), 6);
    for target in &targets {
        assert_eq!(target["released"], true, "{target}");
        assert_eq!(target["status"]["state"], "Succeeded", "{target}");
        assert_eq!(target["status"]["jobId"], uid, "{target}");
    }
    // Released once, by the broker's record of every put, kills and
    // restarts included: each device's key got one signed intent, and no
    // other key was put. Not "exactly one put": a put whose acknowledgement
    // was lost with the killed node is sent again (seen here, cl-1's twice),
    // and the broker's record cannot tell a resend the stream refused from
    // one it stored. Each agent ran its job once (above), and the control
    // plane's records show each target released once.
    for (node, recorded) in puts.iter().enumerate() {
        if node == victim {
            continue;
        }
        let counts = recorded.assert_one_intent_each(&names, uid);
        eprintln!("puts per key seen on n{node}: {counts:?}");
    }
    let released: f64 =
        metric_sum(&cps, "drover_jobs_released_total{kind=\"systemUpgradeV1\"}").await;
    assert!(
        released <= 6.0,
        "the surviving replicas released at most one job per device: {released}"
    );
    let memory = cluster.memory().await;
    assert!(memory.iter().all(Option::is_some), "{memory:?}");
}

/// The sum of one series over the replicas' /metrics.
async fn metric_sum(cps: &[ControlPlane], series: &str) -> f64 {
    let http = drover_tests::http_client();
    let mut sum = 0.0;
    for cp in cps {
        let text = http
            .get(format!("{}/metrics", cp.api))
            .bearer_auth(&cp.token)
            .send()
            .await
            .expect("scrape")
            .text()
            .await
            .expect("text");
        sum += text
            .lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
    }
    sum
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_survives_the_meta_leader_and_a_replica_killed_mid_run() {
    a_rollout_survives_a_killed_node_and_replica(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_survives_a_follower_and_a_replica_killed_mid_run() {
    a_rollout_survives_a_killed_node_and_replica(false).await;
}

/// Every bucket Drover creates on a cluster has three replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bucket_on_the_cluster_has_three_replicas() {
    let dir = ControlPlane::prepare();
    // `nats-config --cluster` says what each node and replica needs.
    let printed = ControlPlane::drover_in(
        dir.path(),
        &[
            "nats-config",
            "--device",
            "one",
            "--control-plane-password",
            PASSWORD,
            "--cluster",
        ],
    );
    for needed in [
        "server_name",
        "routes",
        "--nats-replicas 3",
        "authorization {",
    ] {
        assert!(printed.contains(needed), "{needed}: {printed}");
    }
    let cluster = NatsCluster::start(&nats_auth(dir.path(), &["one"], PASSWORD)).await;
    let cps = replicas(dir, &cluster.urls());
    cps[0].apply_device("one", &["g"], json!({})).await;
    let client =
        async_nats::ConnectOptions::with_user_and_password(CP_BROKER_USER.into(), PASSWORD.into())
            .connect(cluster.nodes[0].url())
            .await
            .expect("connect");
    let js = async_nats::jetstream::new(client);
    for stream in [
        "KV_system-upgrade-intent",
        "KV_system-upgrade-status",
        "KV_drover-control-plane",
        "drover-held-statuses",
    ] {
        let mut found = js.get_stream(stream).await.expect(stream);
        let info: Value =
            serde_json::to_value(found.info().await.expect("info").config.clone()).expect("json");
        assert_eq!(info["num_replicas"], 3, "{stream}: {info}");
    }
}
