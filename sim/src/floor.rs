//! The floor of the NATS path (issue 57): how many small messages a second
//! one file-backed JetStream stream takes when they are published with
//! their acknowledgements pipelined (many outstanding, not one round trip
//! each), on one nats-server (R1) and on a three-node cluster (R3). That
//! rate, times the messages and KV writes a device needs, is the floor
//! every NATS figure of `bench` is compared with.

use crate::harness::{
    CP_PASSWORD, CP_USER, NatsAuth, free_port, start_nats_cluster, start_nats_with,
};
use crate::procstat;
use anyhow::{Context, Result, bail};
use async_nats::jetstream::{self, stream};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// What one run measured.
#[derive(Debug, Clone, Copy)]
pub struct FloorFigures {
    pub messages: usize,
    /// From the first publish to the last acknowledgement.
    pub elapsed: Duration,
    /// The servers' CPU (all nodes) over the publishing, per message.
    pub server_cpu_per_message: Duration,
    /// What the servers wrote to storage (all nodes), per message.
    pub written_per_message: f64,
    /// The one-minute load before and after.
    pub load: (f64, f64),
}

impl FloorFigures {
    pub fn per_second(&self) -> f64 {
        self.messages as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Publishes `messages` messages of `size` bytes to a new file-backed
/// stream of `replicas` (1: one server; 3: a three-node cluster) with at
/// most `outstanding` acknowledgements awaited at once.
pub async fn measure(
    replicas: usize,
    messages: usize,
    size: usize,
    outstanding: usize,
) -> Result<FloorFigures> {
    let dir = tempfile::tempdir()?;
    let auth = transport_nats::server::authorization_config(
        (CP_USER, CP_PASSWORD),
        &[],
        transport_nats::server::DirectStatusPuts::Denied,
    )
    .map_err(anyhow::Error::msg)?;
    let (nodes, urls) = match replicas {
        1 => {
            let (node, url) = start_nats_with(dir.path(), free_port()?, &auth)?;
            (vec![node], vec![url])
        }
        3 => start_nats_cluster(dir.path(), NatsAuth::Passwords(&[]))?,
        other => bail!("replicas is 1 (one server) or 3 (a cluster), not {other}"),
    };
    let client = async_nats::ConnectOptions::with_user_and_password(
        CP_USER.to_owned(),
        CP_PASSWORD.to_owned(),
    )
    .connect(
        urls.iter()
            .map(|url| url.parse::<async_nats::ServerAddr>())
            .collect::<Result<Vec<_>, _>>()?,
    )
    .await
    .context("connect to nats-server")?;
    let js = jetstream::new(client);
    // A cluster forms its meta group after it listens: try until it takes
    // the stream.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let created = js
            .get_or_create_stream(stream::Config {
                name: "FLOOR".into(),
                subjects: vec!["floor.>".into()],
                storage: stream::StorageType::File,
                num_replicas: replicas,
                ..Default::default()
            })
            .await;
        match created {
            Ok(_) => break,
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(error = %e, "the stream is not taken yet");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => return Err(e).context("create the stream"),
        }
    }
    let pids: Vec<u32> = nodes.iter().map(|n| n.0.id()).collect();
    let used = || -> (Duration, u64) {
        pids.iter()
            .filter_map(|pid| procstat::usage(*pid))
            .fold((Duration::ZERO, 0), |(cpu, written), u| {
                (cpu + u.cpu, written + u.written_bytes)
            })
    };
    let payload = vec![b'x'; size];
    let load_before = procstat::load_average().unwrap_or(f64::NAN);
    let (cpu_before, written_before) = used();
    let started = Instant::now();
    let mut waiting = VecDeque::with_capacity(outstanding);
    for n in 0..messages {
        if waiting.len() >= outstanding.max(1) {
            let ack: jetstream::context::PublishAckFuture =
                waiting.pop_front().context("an acknowledgement")?;
            ack.await.context("an acknowledgement")?;
        }
        let subject = format!("floor.{}", n % 1000);
        waiting.push_back(js.publish(subject, payload.clone().into()).await?);
    }
    for ack in waiting {
        ack.await.context("an acknowledgement")?;
    }
    let elapsed = started.elapsed();
    let (cpu_after, written_after) = used();
    let load_after = procstat::load_average().unwrap_or(f64::NAN);
    drop(js);
    drop(nodes);
    Ok(FloorFigures {
        messages,
        elapsed,
        server_cpu_per_message: (cpu_after.saturating_sub(cpu_before)) / messages.max(1) as u32,
        written_per_message: written_after.saturating_sub(written_before) as f64
            / messages.max(1) as f64,
        load: (load_before, load_after),
    })
}
