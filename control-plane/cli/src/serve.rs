//! `drover serve`: the store, the engine, the delivery core, the agents'
//! links (WebSocket always, NATS JetStream when configured) and the
//! operators' API, started together and stopped together.

use anyhow::{Context, Result};
use drover_contract::link::AgentLinks;
use drover_net::admission::{Admission, Limits};
use drover_server::api::{self, ApiState};
use drover_server::auth::Secrets;
use drover_server::dispatch::{DispatchSettings, Dispatcher, Presence, cursor_key};
use drover_server::engine::Engine;
use drover_store::db::Db;
use drover_store::store::RedbKv;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use transport_websocket::links::WsLinks;

/// Inbound events waiting for the delivery core; a full queue slows the
/// links down rather than growing without bound.
const EVENT_QUEUE: usize = 1 << 16;

#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub data: PathBuf,
    pub listen: SocketAddr,
    pub agent_listen: SocketAddr,
    pub agent_tls: Option<(PathBuf, PathBuf)>,
    /// PEM certificate chain and key: serve the operators' API over TLS.
    pub api_tls: Option<(PathBuf, PathBuf)>,
    /// Serve the API in clear on a non-loopback address (behind a TLS proxy).
    pub api_allow_plaintext: bool,
    pub ack_timeout: Duration,
    pub pass_interval: Duration,
    pub operator_token: Option<String>,
    /// Serve agents over NATS JetStream too.
    pub nats: Option<transport_nats::NatsSettings>,
    /// The keys NATS servers trusting Drover's operator take JWTs from
    /// (issue 55); None: the servers' own users and passwords.
    pub nats_authority: Option<PathBuf>,
    /// Logins a second the NATS servers take, which sizes the window agents
    /// spread their reconnects over (0: none).
    pub nats_logins_per_second: u32,
    /// Keep the control plane's state in NATS JetStream KV (several replicas)
    /// instead of the embedded database (one replica).
    pub store_on_nats: bool,
    /// Agent connections held at once; more are closed at once.
    pub max_agent_connections: usize,
    /// Serve agents over MQTT too.
    pub mqtt: Option<transport_mqtt::MqttSettings>,
    /// The MQTT link's request queue ([`transport_mqtt::server::REQUEST_QUEUE`]).
    pub mqtt_request_queue: usize,
    /// Where package downloads are served; None: the agents' address on
    /// [`DOWNLOAD_PORT`] (on an ephemeral port when the agents' is one).
    pub download_listen: Option<SocketAddr>,
    /// The public base of download links (`https://host:port`), when agents
    /// reach the download listener under another name (a proxy, a wildcard
    /// listen address).
    pub download_url: Option<String>,
    /// A device not heard from for this long is an alert.
    pub offline_alert: Duration,
    /// When a device's patch status raises an alert.
    pub patch_alerts: drover_rules::patch::AlertLimits,
    /// The package store's quota and the uploads' stall timeout.
    pub uploads: drover_server::packages::UploadLimits,
    /// How long the audit log keeps an entry.
    pub audit_retention: Duration,
    /// What each device's history keeps of jobs whose run, deployment or
    /// schedule was deleted.
    pub history: drover_rules::history::Retention,
    /// Enrollment requests a minute per address, new devices a minute per
    /// token (0: none).
    pub enrollment_limits: (u32, u32),
}

/// The package downloads' port when `--download-listen` is not given: one
/// fixed port beside the API's 7180 and the agents' 7181, so links and
/// firewall rules stay the same across restarts.
pub const DOWNLOAD_PORT: u16 = 7182;

#[path = "serve_wiring.rs"]
mod wiring;

/// A started control plane.
pub struct Started {
    pub api_addr: SocketAddr,
    pub agent_addr: SocketAddr,
    pub download_addr: SocketAddr,
    /// The base of download links; None: downloads are off.
    pub download_url: Option<String>,
    pub secrets: Arc<Secrets>,
    pub tasks: Vec<JoinHandle<()>>,
    /// Notified when the embedded store's file system refused a write
    /// (never on the NATS store): see [`RedbKv::io_failed`].
    pub store_failed: Arc<tokio::sync::Notify>,
}

pub async fn start(options: ServeOptions, shutdown: CancellationToken) -> Result<Started> {
    check_api_listen(&options)?;
    let capacity = Capacity::from_open_file_limit(options.max_agent_connections);
    let api_tls = wiring::acceptor(options.api_tls.as_ref())?;
    drover_server::auth::ensure_data_dir(&options.data)?;
    let (nats_client, authority) = wiring::connect_nats(&options).await?;
    let (db, store_failed) = wiring::open_store(&options, nats_client.as_ref()).await?;
    let secrets = Arc::new(Secrets::load_or_create(
        &options.data,
        options.operator_token.clone(),
    )?);
    drover_server::api::tokens::ensure_bootstrap(&db)
        .await
        .context("cannot store the bootstrap operator")?;
    let (events_tx, events) = mpsc::channel(EVENT_QUEUE);
    let (released_tx, released) = mpsc::unbounded_channel();
    let wake = Arc::new(Notify::new());
    let presence = Arc::new(Presence::default());
    let engine = wiring::engine(&options, &db, &wake, released_tx, &presence);

    let websocket = WsLinks::new(events_tx.clone());
    let mut links: Vec<Arc<dyn AgentLinks>> = vec![websocket.clone()];
    let mut tasks = Vec::new();
    let brokered = wiring::broker_links(
        &options,
        (nats_client, authority),
        &db,
        &events_tx,
        &shutdown,
        &mut links,
        &mut tasks,
    )
    .await?;
    let tls = wiring::acceptor(options.agent_tls.as_ref())?;
    let signer = Arc::new(drover_server::auth::IntentSigner::load_or_create(
        &options.data,
    )?);
    info!(public_key = %signer.public_key(), "intents are signed; agents pin this key");
    let agent_trust = Arc::new(wiring::agent_trust(&signer, &brokered)?);
    let (caught_up, intake_ready) = tokio::sync::watch::channel(false);
    let wiring::DownloadsServed {
        listener: download_listener,
        addr: download_addr,
        base: download_base,
        downloads,
    } = wiring::downloads(&options, &secrets).await?;
    let vault = Arc::new(drover_server::secrets::Vault::load_or_create(
        &options.data,
    )?);
    let enricher = Arc::new(drover_server::secrets::Enricher {
        db: db.clone(),
        secrets: secrets.clone(),
        vault: vault.clone(),
        downloads: downloads.clone(),
    });
    let dispatcher = Dispatcher::new(
        db.clone(),
        links.clone(),
        DispatchSettings {
            ack_timeout: options.ack_timeout,
        },
        presence.clone(),
        caught_up,
        signer,
    )
    .with_enricher(enricher);
    let (api_listener, agent_listener) = wiring::bind(&options).await?;
    let api_addr = api_listener.local_addr()?;
    let agent_addr = agent_listener.local_addr()?;
    let patch_index = wiring::upkeep(&options, &db, &shutdown, &mut tasks);
    let router = api::router(ApiState {
        links,
        db: db.clone(),
        patch_index,
        secrets: secrets.clone(),
        engine: engine.clone(),
        engine_wake: wake.clone(),
        presence,
        data: options.data.clone(),
        downloads: downloads.is_some(),
        vault,
        offline_alert: jiff::SignedDuration::try_from(options.offline_alert)
            .unwrap_or(jiff::SignedDuration::MAX),
        patch_alerts: options.patch_alerts,
        secure_cookies: options.api_tls.is_some(),
        logins: Arc::new(drover_server::api::ui::LoginLimiter::default()),
        uploads: options.uploads,
        replica: replica_id(&options.data)?,
        budgets: Arc::new(drover_server::audit::AuditBudgets::default()),
        package_quota: Arc::new(drover_server::packages::PackageQuota::default()),
        agent_trust,
    });
    if let Some(downloads) = &downloads {
        tasks.push(wiring::serve_downloads(
            download_listener,
            tls.clone(),
            &db,
            &secrets,
            downloads,
            capacity,
            shutdown.clone(),
        ));
    }
    tasks.push(tokio::spawn(dispatcher.run(
        events,
        released,
        shutdown.clone(),
    )));
    tasks.push(tokio::spawn(engine.run(
        options.pass_interval,
        intake_ready,
        shutdown.clone(),
    )));
    let gate = wiring::devices_gate(
        (&db, &secrets, options.enrollment_limits),
        &websocket,
        brokered,
        &shutdown,
        &mut tasks,
    )
    .await?;
    tasks.push(wiring::serve_agents(
        websocket,
        agent_listener,
        tls,
        gate,
        capacity,
        shutdown.clone(),
    ));
    tasks.push(tokio::spawn(crate::listen::serve(
        "API",
        api_listener,
        api_tls,
        router,
        Admission::new(capacity.api),
        shutdown.clone(),
    )));
    wiring::log_serving(&options, api_addr, agent_addr, capacity);
    Ok(Started {
        api_addr,
        agent_addr,
        download_addr,
        download_url: download_base,
        secrets,
        tasks,
        store_failed,
    })
}

/// How many connections each listener admits, sized from the open-file
/// limit (raised to its hard limit first): what the store, the logs, the
/// package files and the brokers need is set aside, most of the rest goes
/// to agents, and the API and downloads get a bounded share.
#[derive(Debug, Clone, Copy)]
pub struct Capacity {
    pub open_files: u64,
    pub agents: Limits,
    pub api: Limits,
    pub downloads: Limits,
}

/// Open files kept for everything but connections.
const RESERVED_FILES: u64 = 256;

impl Capacity {
    /// Raises the soft open-file limit to the hard one and sizes the caps;
    /// `max_agents` (--max-agent-connections) is an upper bound.
    pub fn from_open_file_limit(max_agents: usize) -> Self {
        let open_files = match rlimit::increase_nofile_limit(u64::MAX) {
            Ok(limit) => limit,
            Err(e) => {
                warn!(error = %e, "cannot read or raise the open-file limit; assuming 1024");
                1024
            }
        };
        Self::for_open_files(open_files, max_agents)
    }

    pub fn for_open_files(open_files: u64, max_agents: usize) -> Self {
        let budget = usize::try_from(open_files.saturating_sub(RESERVED_FILES).max(64))
            .unwrap_or(usize::MAX);
        let share = |percent: usize, at_most: usize| {
            (budget.saturating_mul(percent) / 100).clamp(8, at_most)
        };
        // One address may hold at most a quarter of a kind of slot, so a
        // stranger at one address always leaves three quarters to others.
        let quarter = |slots: usize, at_most: usize| (slots / 4).clamp(1, at_most);
        let (agents_pending, api_pending, api_established) =
            (share(5, 1024), share(2, 128), share(4, 512));
        let (downloads_pending, downloads_established) = (share(2, 256), share(5, 1024));
        Self {
            open_files,
            agents: Limits {
                pending: agents_pending,
                pending_per_peer: quarter(agents_pending, 64),
                established: share(80, max_agents.max(1)),
                // Agents behind one site's NAT share an address; each is
                // authenticated by its own token.
                established_per_peer: None,
            },
            api: Limits {
                pending: api_pending,
                pending_per_peer: quarter(api_pending, 16),
                established: api_established,
                established_per_peer: Some(quarter(api_established, 64)),
            },
            downloads: Limits {
                pending: downloads_pending,
                pending_per_peer: quarter(downloads_pending, 64),
                established: downloads_established,
                established_per_peer: Some(quarter(downloads_established, 256)),
            },
        }
    }
}

/// The operator token must not cross a network in clear: a plain-text API is
/// served only on loopback, unless the operator says a TLS proxy fronts it.
fn check_api_listen(options: &ServeOptions) -> Result<()> {
    if options.api_tls.is_none() && !options.listen.ip().is_loopback() {
        if !options.api_allow_plaintext {
            anyhow::bail!(
                "refusing to serve the operators' API in clear on {}: the operator token would \
                 cross the network unencrypted. Pass --api-tls-cert and --api-tls-key, listen on \
                 loopback, or pass --api-allow-plaintext when a TLS proxy on this host fronts it",
                options.listen
            );
        }
        tracing::warn!(listen = %options.listen, "serving the operators' API in clear (--api-allow-plaintext)");
    }
    Ok(())
}

/// This data directory's replica id (`replica.id`, made on first use).
fn replica_id(data: &std::path::Path) -> Result<String> {
    let path = data.join("replica.id");
    if let Ok(id) = std::fs::read_to_string(&path)
        && !id.trim().is_empty()
    {
        return Ok(id.trim().to_owned());
    }
    let id = drover_model::JobId::random().to_string()[..8].to_owned();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, &id).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(id)
}

fn tokio_rustls_acceptor(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<drover_net::tls::Acceptor> {
    Ok(drover_net::tls::acceptor(cert, key)?)
}

#[cfg(test)]
mod capacity_tests {
    use super::*;

    #[test]
    fn caps_follow_the_open_file_limit_and_no_address_takes_more_than_a_quarter() {
        for (open_files, agents) in [
            (512, 25_000),
            (1024, 25_000),
            (20_000, 25_000),
            (1 << 20, 25_000),
        ] {
            let c = Capacity::for_open_files(open_files, agents);
            let total = c.agents.pending
                + c.agents.established
                + c.api.pending
                + c.api.established
                + c.downloads.pending
                + c.downloads.established;
            assert!(
                total as u64 <= open_files.saturating_sub(RESERVED_FILES).max(64) + 48,
                "{open_files}: {c:?}"
            );
            for limits in [c.agents, c.api, c.downloads] {
                assert!(
                    limits.pending_per_peer * 4 <= limits.pending.max(4),
                    "{open_files}: {limits:?}"
                );
                if let Some(per_peer) = limits.established_per_peer {
                    assert!(
                        per_peer * 4 <= limits.established.max(4),
                        "{open_files}: {limits:?}"
                    );
                }
            }
        }
        // --max-agent-connections bounds the agents' share.
        assert_eq!(
            Capacity::for_open_files(1 << 20, 100).agents.established,
            100
        );
        assert_eq!(
            Capacity::for_open_files(20_000, 25_000).agents.established,
            15_795
        );
    }
}
