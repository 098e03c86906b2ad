//! The parts `serve` wires together: the store, the brokers' links, the
//! package downloads' listener and the devices' token generations.

use super::*;

/// The control plane's store: on NATS JetStream (`--store nats`, several
/// replicas) or embedded in the data directory; with what is notified when
/// the embedded store's file system refuses a write.
pub(super) async fn open_store(
    options: &ServeOptions,
    nats_client: Option<&async_nats::Client>,
) -> Result<(Db, Arc<Notify>)> {
    let mut store_failed = Arc::new(tokio::sync::Notify::new());
    let db = match (nats_client, options.store_on_nats) {
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
    Ok((db, store_failed))
}

/// The brokers' links the options ask for (NATS JetStream, MQTT), added to
/// `links` with their tasks.
pub(super) async fn broker_links(
    options: &ServeOptions,
    (nats_client, authority): (Option<async_nats::Client>, Option<NatsAuthority>),
    db: &Db,
    events_tx: &mpsc::Sender<drover_contract::link::Event>,
    shutdown: &CancellationToken,
    links: &mut Vec<Arc<dyn AgentLinks>>,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<Brokered> {
    let mut nats_link = None;
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
        let link = transport_nats::links::NatsLinks::new(
            buckets,
            events_tx.clone(),
            options.nats_logins_per_second,
        );
        links.push(link.clone());
        info!(url = %nats.url, resume_after, "serving agents over NATS JetStream");
        tasks.push(tokio::spawn(
            link.clone().run(resume_after, shutdown.clone()),
        ));
        nats_link = Some(link);
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
        tasks.push(tokio::spawn(link.clone().run(event_loop, shutdown.clone())));
        return Ok(Brokered {
            mqtt: Some(link),
            nats: nats_link,
            authority,
        });
    }
    Ok(Brokered {
        mqtt: None,
        nats: nats_link,
        authority,
    })
}

/// The control plane's NATS connection, when it serves over NATS: with its
/// user and password, or with a JWT from the keys of `--nats-authority`;
/// then with those keys too, and a connection in the system account that
/// pushes revocations.
pub(super) async fn connect_nats(
    options: &ServeOptions,
) -> Result<(Option<async_nats::Client>, Option<NatsAuthority>)> {
    let Some(nats) = &options.nats else {
        return Ok((None, None));
    };
    let Some(dir) = &options.nats_authority else {
        let client = transport_nats::server::connect(nats, "drover control plane").await?;
        return Ok((Some(client), None));
    };
    let authority = Arc::new(transport_nats::authority::Authority::load_or_create(dir)?);
    let own = transport_nats::NatsSettings {
        key_login: Some(authority.control_plane_login("drover-control-plane")?),
        ..nats.clone()
    };
    let client = transport_nats::server::connect(&own, "drover control plane").await?;
    let system = transport_nats::NatsSettings {
        key_login: Some(authority.system_login()?),
        ..nats.clone()
    };
    let system = transport_nats::server::connect(&system, "drover control plane (system)")
        .await
        .context("cannot connect to NATS as the system account's user (--nats-authority)")?;
    Ok((Some(client), Some(NatsAuthority { authority, system })))
}

/// The keys that sign NATS JWTs, and the system account's connection.
pub(super) struct NatsAuthority {
    pub authority: Arc<transport_nats::authority::Authority>,
    pub system: async_nats::Client,
}

/// The brokers' links a device's key decides on: MQTT's logins, NATS's
/// JWTs (with the keys that sign them).
pub(super) struct Brokered {
    pub mqtt: Option<Arc<transport_mqtt::server::MqttLinks>>,
    pub nats: Option<Arc<transport_nats::links::NatsLinks>>,
    pub authority: Option<NatsAuthority>,
}

/// What every device's agent config pins (`GET /api/v1/agent-trust`).
pub(super) fn agent_trust(
    signer: &drover_server::auth::IntentSigner,
    brokered: &Brokered,
) -> Result<drover_api::enrollment::AgentTrust> {
    Ok(drover_api::enrollment::AgentTrust {
        intent_public_keys: vec![signer.public_key()],
        nats_enrollment_jwt: brokered
            .authority
            .as_ref()
            .map(|nats| nats.authority.enroll_jwt())
            .transpose()
            .context("cannot sign the NATS enrollment user's JWT")?,
    })
}

/// The package downloads' listener, and where links point (None: off).
pub(super) struct DownloadsServed {
    pub listener: TcpListener,
    pub addr: SocketAddr,
    pub base: Option<String>,
    pub downloads: Option<Arc<drover_server::packages::Downloads>>,
}

/// Binds the package downloads' listener and decides the links' base.
pub(super) async fn downloads(
    options: &ServeOptions,
    secrets: &Arc<Secrets>,
) -> Result<DownloadsServed> {
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
    Ok(DownloadsServed {
        listener: download_listener,
        addr: download_addr,
        base: download_base,
        downloads,
    })
}

/// A TLS acceptor for a listener given a certificate and key.
pub(super) fn acceptor(
    files: Option<&(PathBuf, PathBuf)>,
) -> Result<Option<drover_net::tls::Acceptor>> {
    files
        .map(|(cert, key)| tokio_rustls_acceptor(cert, key))
        .transpose()
}

/// The engine, told who is online; alone on the embedded store, which one
/// process opens at a time.
pub(super) fn engine(
    options: &ServeOptions,
    db: &Db,
    wake: &Arc<Notify>,
    released_tx: mpsc::UnboundedSender<Vec<String>>,
    presence: &Arc<Presence>,
) -> Arc<Engine> {
    let engine = Engine::new(db.clone(), wake.clone(), Some(released_tx))
        .with_presence(presence.clone())
        .with_history(options.history);
    Arc::new(if options.store_on_nats {
        engine
    } else {
        engine.alone()
    })
}

/// Serves package downloads on their listener.
pub(super) fn serve_downloads(
    download_listener: TcpListener,
    tls: Option<drover_net::tls::Acceptor>,
    db: &Db,
    secrets: &Arc<Secrets>,
    downloads: &Arc<drover_server::packages::Downloads>,
    capacity: Capacity,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    let router = drover_server::packages::download_router(drover_server::packages::DownloadState {
        db: db.clone(),
        secrets: secrets.clone(),
        downloads: downloads.clone(),
    });
    tokio::spawn(crate::listen::serve(
        "downloads",
        download_listener,
        tls,
        router,
        Admission::new(capacity.downloads),
        shutdown,
    ))
}

/// Says where the control plane serves, and its connection caps.
pub(super) fn log_serving(
    options: &ServeOptions,
    api_addr: SocketAddr,
    agent_addr: SocketAddr,
    capacity: Capacity,
) {
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
}

/// Binds the operators' API and the agents' port.
pub(super) async fn bind(options: &ServeOptions) -> Result<(TcpListener, TcpListener)> {
    let api_listener = TcpListener::bind(options.listen)
        .await
        .with_context(|| format!("cannot listen on {}", options.listen))?;
    let agent_listener = TcpListener::bind(options.agent_listen)
        .await
        .with_context(|| format!("cannot listen on {}", options.agent_listen))?;
    Ok((api_listener, agent_listener))
}

/// The patch index and the audit log's pruning, running until `shutdown`.
pub(super) fn upkeep(
    options: &ServeOptions,
    db: &Db,
    shutdown: &CancellationToken,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Arc<drover_server::patch_index::PatchIndex> {
    let patch_index = Arc::new(drover_server::patch_index::PatchIndex::new(db.clone()));
    tasks.push(tokio::spawn(patch_index.clone().run(shutdown.clone())));
    tasks.push(tokio::spawn(drover_server::audit::prune(
        db.clone(),
        options.audit_retention,
        shutdown.clone(),
    )));
    tasks.push(tokio::spawn(drover_server::history::prune(
        db.clone(),
        options.history,
        shutdown.clone(),
    )));
    patch_index
}

/// Serves agents over WebSocket, each let in by its token of its
/// device's current generation or by its accepted key, and devices that
/// ask to join.
pub(super) fn serve_agents(
    websocket: Arc<WsLinks>,
    agent_listener: TcpListener,
    tls: Option<drover_net::tls::Acceptor>,
    gate: drover_server::enrollment::Gate,
    capacity: Capacity,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(websocket.serve(
        agent_listener,
        tls,
        Arc::new(gate),
        Admission::new(capacity.agents),
        shutdown,
    ))
}

/// The gate that judges devices at every door, once the devices' token
/// generations and keys are read (and then followed); handed to the MQTT
/// link here, to the agents' port by the caller.
pub(super) async fn devices_gate(
    (db, secrets, (per_address, per_token)): (&Db, &Arc<Secrets>, (u32, u32)),
    websocket: &Arc<WsLinks>,
    brokered: Brokered,
    shutdown: &CancellationToken,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<drover_server::enrollment::Gate> {
    let Brokered {
        mqtt,
        nats,
        authority,
    } = brokered;
    let (generations, follower) = follow_generations(
        db.clone(),
        websocket.clone(),
        (mqtt.clone(), nats.clone()),
        shutdown.clone(),
    )
    .await;
    tasks.push(follower);
    let gate = drover_server::enrollment::Gate {
        secrets: secrets.clone(),
        credentials: generations,
        db: db.clone(),
        limits: Arc::new(drover_server::enroll_limits::EnrollLimits::new(
            per_address,
            per_token,
        )),
    };
    if let Some(mqtt) = &mqtt {
        mqtt.judge_with(Arc::new(gate.clone()));
    }
    if let (Some(nats), Some(NatsAuthority { authority, system })) = (&nats, authority) {
        nats.judge_with(transport_nats::links::Joining {
            gate: Arc::new(gate.clone()),
            authority,
            system,
        });
    }
    Ok(gate)
}

/// Follows devices' token generations: read before the first agent is let
/// in (this returns once they are), then followed; a raised one ends the
/// device's session here, and a key that is gone its login at the MQTT
/// broker.
async fn follow_generations(
    db: Db,
    websocket: Arc<WsLinks>,
    (mqtt, nats): (
        Option<Arc<transport_mqtt::server::MqttLinks>>,
        Option<Arc<transport_nats::links::NatsLinks>>,
    ),
    shutdown: CancellationToken,
) -> (
    Arc<drover_server::device_tokens::Generations>,
    JoinHandle<()>,
) {
    let generations = Arc::new(drover_server::device_tokens::Generations::default());
    let follower = {
        let generations = generations.clone();
        let (loaded_tx, loaded) = tokio::sync::oneshot::channel::<()>();
        let mut loaded_tx = Some(loaded_tx);
        let follower = tokio::spawn(async move {
            generations
                .run(
                    db,
                    |device| {
                        websocket.disconnect(device, "the device's token was rotated");
                    },
                    |device, key| {
                        if let Some(mqtt) = &mqtt {
                            mqtt.revoke(device);
                        }
                        if let Some(nats) = &nats {
                            nats.revoke(device, key);
                        }
                    },
                    || {
                        if let Some(tx) = loaded_tx.take() {
                            let _ = tx.send(());
                        }
                    },
                    shutdown,
                )
                .await;
        });
        let _ = loaded.await;
        follower
    };
    (generations, follower)
}

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
