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
}

/// The package downloads' port when `--download-listen` is not given: one
/// fixed port beside the API's 7180 and the agents' 7181, so links and
/// firewall rules stay the same across restarts.
pub const DOWNLOAD_PORT: u16 = 7182;

/// The base of download links when none is given: the listen address when
/// agents can reach it as it is; for a wildcard address, the first DNS name
/// of the agents' TLS certificate (the name agents already trust and
/// reach the control plane by). None when neither says where agents reach.
fn download_base(
    listen: SocketAddr,
    agent_cert: Option<&std::path::Path>,
) -> Result<Option<String>> {
    if !listen.ip().is_unspecified() {
        let scheme = if agent_cert.is_some() {
            "https"
        } else {
            "http"
        };
        return Ok(Some(format!("{scheme}://{listen}")));
    }
    let Some(cert) = agent_cert else {
        return Ok(None);
    };
    let name = crate::listen::certificate_dns_names(cert)?
        .into_iter()
        .find(|name| !name.starts_with('*'));
    Ok(name.map(|name| format!("https://{name}:{}", listen.port())))
}

/// How long `serve` waits for JetStream to take its buckets: a cluster's
/// nodes and the control plane may start in any order, and JetStream
/// answers only once its nodes have elected a meta leader.
const JETSTREAM_READY: Duration = Duration::from_secs(120);

/// Runs `attempt` until it succeeds or [`JETSTREAM_READY`] has passed,
/// logging why it waits.
async fn until_jetstream_ready<T, E, F, Fut>(what: &str, mut attempt: F) -> Result<T>
where
    E: std::fmt::Display + Send + Sync + 'static,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, E>>,
{
    let started = std::time::Instant::now();
    loop {
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(e) if started.elapsed() < JETSTREAM_READY => {
                warn!(error = %e, "JetStream cannot take {what} yet; trying again in 1 s");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => {
                anyhow::bail!("JetStream did not take {what} within {JETSTREAM_READY:?}: {e}")
            }
        }
    }
}

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
    let api_tls = match &options.api_tls {
        Some((cert, key)) => Some(tokio_rustls_acceptor(cert, key)?),
        None => None,
    };
    drover_server::auth::ensure_data_dir(&options.data)?;
    let nats_client = match &options.nats {
        Some(nats) => Some(transport_nats::server::connect(nats, "drover control plane").await?),
        None => None,
    };
    let mut store_failed = Arc::new(tokio::sync::Notify::new());
    let db = match (&nats_client, options.store_on_nats) {
        (Some(client), true) => {
            let replicas = options.nats.as_ref().map_or(1, |n| n.replicas);
            let kv = until_jetstream_ready("the control plane's bucket", || {
                transport_nats::kv::NatsKv::open(client.clone(), replicas)
            })
            .await?;
            Db::new(Arc::new(kv)).observe_commits(drover_server::metrics::store_commit)
        }
        (None, true) => anyhow::bail!("--store nats needs --nats-url"),
        (_, false) => {
            let path = options.data.join("drover.redb");
            let checker = agent_core::dbfile::Checker::this_binary("drover reset-store");
            let kv = RedbKv::open_checked(&path, &checker)?;
            store_failed = kv.io_failed();
            Db::new(Arc::new(kv)).observe_commits(drover_server::metrics::store_commit)
        }
    };
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
    let engine =
        Engine::new(db.clone(), wake.clone(), Some(released_tx)).with_presence(presence.clone());
    // The embedded store is opened by one process at a time.
    let engine = Arc::new(if options.store_on_nats {
        engine
    } else {
        engine.alone()
    });

    let websocket = WsLinks::new(events_tx.clone());
    let mut links: Vec<Arc<dyn AgentLinks>> = vec![websocket.clone()];
    let mut tasks = Vec::new();
    if let (Some(nats), Some(client)) = (&options.nats, nats_client) {
        let buckets = until_jetstream_ready("the intent and status buckets", || {
            transport_nats::server::ensure_buckets(
                client.clone(),
                transport_nats::server::BucketLimits {
                    replicas: nats.replicas,
                    ..Default::default()
                },
            )
        })
        .await?;
        let resume_after = db
            .get::<u64>(&cursor_key(transport_nats::links::TRANSPORT))
            .await?
            .map(|(_, position)| position)
            .unwrap_or(0);
        let link = transport_nats::links::NatsLinks::new(buckets, events_tx.clone());
        links.push(link.clone());
        info!(url = %nats.url, resume_after, "serving agents over NATS JetStream");
        tasks.push(tokio::spawn(link.run(resume_after, shutdown.clone())));
    }
    if let Some(mqtt) = &options.mqtt {
        // A stable client id per data directory: the broker keeps this
        // replica's session (and what it has not acknowledged) across restarts.
        let id = replica_id(&options.data)?;
        let (link, event_loop) = transport_mqtt::server::MqttLinks::new(
            mqtt,
            &format!("drover-cp-{id}"),
            options.mqtt_request_queue,
            events_tx.clone(),
        )?;
        links.push(link.clone());
        info!(url = %mqtt.url, prefix = %mqtt.prefix, "serving agents over MQTT");
        tasks.push(tokio::spawn(link.run(event_loop, shutdown.clone())));
    }
    let tls = match &options.agent_tls {
        Some((cert, key)) => Some(tokio_rustls_acceptor(cert, key)?),
        None => None,
    };
    let signer = Arc::new(drover_server::auth::IntentSigner::load_or_create(
        &options.data,
    )?);
    info!(public_key = %signer.public_key(), "intents are signed; agents pin this key");
    let (caught_up, intake_ready) = tokio::sync::watch::channel(false);
    let download_listen = options.download_listen.unwrap_or_else(|| {
        let port = match options.agent_listen.port() {
            0 => 0,
            _ => DOWNLOAD_PORT,
        };
        SocketAddr::new(options.agent_listen.ip(), port)
    });
    let download_listener = TcpListener::bind(download_listen).await.with_context(|| {
        format!("cannot listen for package downloads on {download_listen} (--download-listen)")
    })?;
    let download_addr = download_listener.local_addr()?;
    let download_base = match &options.download_url {
        Some(url) => Some(url.clone()),
        None => download_base(
            download_addr,
            options.agent_tls.as_ref().map(|(cert, _)| cert.as_path()),
        )?,
    };
    match &download_base {
        Some(base) => info!(listen = %download_addr, links = %base, "package downloads served"),
        None => warn!(
            listen = %download_addr,
            "package downloads are off: agents reach this wildcard address by a name this control plane does not know; pass --download-url https://HOST:{}",
            download_addr.port()
        ),
    }
    let downloads = download_base.clone().map(|base| {
        Arc::new(drover_server::packages::Downloads::new(
            secrets.clone(),
            base,
            &options.data,
        ))
    });
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
    let api_listener = TcpListener::bind(options.listen)
        .await
        .with_context(|| format!("cannot listen on {}", options.listen))?;
    let agent_listener = TcpListener::bind(options.agent_listen)
        .await
        .with_context(|| format!("cannot listen on {}", options.agent_listen))?;
    let api_addr = api_listener.local_addr()?;
    let agent_addr = agent_listener.local_addr()?;
    let patch_index = Arc::new(drover_server::patch_index::PatchIndex::new(db.clone()));
    tasks.push(tokio::spawn(patch_index.clone().run(shutdown.clone())));
    tasks.push(tokio::spawn(drover_server::audit::prune(
        db.clone(),
        options.audit_retention,
        shutdown.clone(),
    )));
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
    });
    if let Some(downloads) = &downloads {
        let router =
            drover_server::packages::download_router(drover_server::packages::DownloadState {
                db: db.clone(),
                secrets: secrets.clone(),
                downloads: downloads.clone(),
            });
        tasks.push(tokio::spawn(crate::listen::serve(
            "downloads",
            download_listener,
            tls.clone(),
            router,
            Admission::new(capacity.downloads),
            shutdown.clone(),
        )));
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
    // Devices' token generations: read before the first agent is let in,
    // then followed; a raised one ends the device's session here.
    let generations = Arc::new(drover_server::device_tokens::Generations::default());
    {
        let (generations, db, websocket, shutdown) = (
            generations.clone(),
            db.clone(),
            websocket.clone(),
            shutdown.clone(),
        );
        let (loaded_tx, loaded) = tokio::sync::oneshot::channel::<()>();
        let mut loaded_tx = Some(loaded_tx);
        tasks.push(tokio::spawn(async move {
            generations
                .run(
                    db,
                    |device| {
                        websocket.disconnect(device, "the device's token was rotated");
                    },
                    || {
                        if let Some(tx) = loaded_tx.take() {
                            let _ = tx.send(());
                        }
                    },
                    shutdown,
                )
                .await;
        }));
        let _ = loaded.await;
    }
    let verify = secrets.clone();
    let known = generations.clone();
    tasks.push(tokio::spawn(websocket.serve(
        agent_listener,
        tls,
        Arc::new(move |device, token| verify.verify_device_at(device, known.get(device), token)),
        Admission::new(capacity.agents),
        shutdown.clone(),
    )));
    tasks.push(tokio::spawn(crate::listen::serve(
        "API",
        api_listener,
        api_tls,
        router,
        Admission::new(capacity.api),
        shutdown.clone(),
    )));
    info!(
        api = %api_addr,
        api_tls = options.api_tls.is_some(),
        agents = %agent_addr,
        data = %options.data.display(),
        open_files = capacity.open_files,
        agent_connections = capacity.agents.established,
        api_connections = capacity.api.established,
        download_connections = capacity.downloads.established,
        "drover control plane serving (connection caps sized from the open-file limit)"
    );
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
