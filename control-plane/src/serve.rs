//! `drover serve`: the embedded store, the run engine, the agents' WebSocket
//! listener and the operators' API, started together and stopped together.

use crate::agents::AgentService;
use crate::api::{self, ApiState};
use crate::auth::Secrets;
use crate::engine::Engine;
use crate::hub::Hub;
use crate::intake::Intake;
use crate::records::Db;
use crate::store::RedbKv;
use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::info;

#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub data: PathBuf,
    pub listen: SocketAddr,
    pub agent_listen: SocketAddr,
    pub agent_tls: Option<(PathBuf, PathBuf)>,
    pub ack_timeout: Duration,
    pub pass_interval: Duration,
    pub operator_token: Option<String>,
    /// Serve agents over NATS JetStream too.
    pub nats: Option<transport_nats::NatsSettings>,
    /// Keep the control plane's state in NATS JetStream KV (several replicas)
    /// instead of the embedded database (one replica).
    pub store_on_nats: bool,
}

/// A started control plane.
pub struct Started {
    pub api_addr: SocketAddr,
    pub agent_addr: SocketAddr,
    pub secrets: Arc<Secrets>,
    pub tasks: Vec<JoinHandle<()>>,
}

pub async fn start(options: ServeOptions, shutdown: CancellationToken) -> Result<Started> {
    std::fs::create_dir_all(&options.data).with_context(|| {
        format!(
            "cannot create the data directory {}",
            options.data.display()
        )
    })?;
    let nats_client = match &options.nats {
        Some(nats) => Some(transport_nats::server::connect(nats, "drover control plane").await?),
        None => None,
    };
    let db = match (&nats_client, options.store_on_nats) {
        (Some(client), true) => Db::new(Arc::new(
            crate::store_nats::NatsKv::open(client.clone()).await?,
        )),
        (None, true) => anyhow::bail!("--store nats needs --nats-url"),
        (_, false) => Db::new(Arc::new(RedbKv::open(&options.data.join("drover.redb"))?)),
    };
    let secrets = Arc::new(Secrets::load_or_create(
        &options.data,
        options.operator_token.clone(),
    )?);
    let hub = Arc::new(Hub::default());
    let wake = Arc::new(Notify::new());
    let engine = Arc::new(Engine::new(db.clone(), hub.clone(), wake.clone()));
    let tls = match &options.agent_tls {
        Some((cert, key)) => Some(tokio_rustls::TlsAcceptor::from(
            transport_websocket::tls::server_config(cert, key)?,
        )),
        None => None,
    };
    let agents = Arc::new(AgentService {
        db: db.clone(),
        hub: hub.clone(),
        secrets: secrets.clone(),
        intake: Intake {
            db: db.clone(),
            engine_wake: wake.clone(),
        },
        tls,
        ack_timeout: options.ack_timeout,
    });
    let api_listener = TcpListener::bind(options.listen)
        .await
        .with_context(|| format!("cannot listen on {}", options.listen))?;
    let agent_listener = TcpListener::bind(options.agent_listen)
        .await
        .with_context(|| format!("cannot listen on {}", options.agent_listen))?;
    let api_addr = api_listener.local_addr()?;
    let agent_addr = agent_listener.local_addr()?;
    let router = api::router(ApiState {
        db: db.clone(),
        secrets: secrets.clone(),
        engine: engine.clone(),
        engine_wake: wake.clone(),
    });
    let mut tasks = Vec::new();
    // The engine judges no deadline before the statuses agents reported while
    // this control plane was down are read (A12); only NATS keeps such a backlog.
    let (caught_up, intake_ready) = tokio::sync::watch::channel(options.nats.is_none());
    if let (Some(nats), Some(client)) = (&options.nats, nats_client) {
        let buckets = transport_nats::server::ensure_buckets(
            client,
            transport_nats::server::BucketLimits::default(),
        )
        .await?;
        let service = Arc::new(crate::nats_agents::NatsAgents {
            db: db.clone(),
            hub: hub.clone(),
            intake: Intake {
                db: db.clone(),
                engine_wake: wake.clone(),
            },
            buckets,
            caught_up,
        });
        info!(url = %nats.url, "serving agents over NATS JetStream");
        tasks.push(tokio::spawn(service.run(shutdown.clone())));
    }
    tasks.push(tokio::spawn(engine.run(
        options.pass_interval,
        intake_ready,
        shutdown.clone(),
    )));
    tasks.push(tokio::spawn(agents.serve(agent_listener, shutdown.clone())));
    let api_shutdown = shutdown.clone();
    tasks.push(tokio::spawn(async move {
        let served = axum::serve(api_listener, router)
            .with_graceful_shutdown(async move { api_shutdown.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "API server stopped");
        }
    }));
    info!(api = %api_addr, agents = %agent_addr, data = %options.data.display(), "drover control plane serving");
    Ok(Started {
        api_addr,
        agent_addr,
        secrets,
        tasks,
    })
}
