//! `drover-sim enroll --transport nats` (issue 55): N devices of one image
//! joining at once over NATS, as a fleet's first boot would: each asks on
//! its enrollment subject as the enrollment user (the bearer JWT
//! `/api/v1/agent-trust` hands out) with one auto-accept token, is answered
//! with its own user JWT, then logs in with it (signing the server's nonce
//! with its key) and says hello. The servers trust Drover's operator
//! (`drover nats-config --authority`); the control plane serves with
//! `--nats-authority`. Prints the time until every device is accepted,
//! until every one is in by its JWT, and the control plane's and the
//! server's CPU per device.

use crate::enroll::{EnrollFigures, image_token};
use crate::harness::{Process, Serve, Transport, free_port, start_drover, start_nats_with};
use crate::keys::key;
use crate::procstat;
use anyhow::{Context, Result, bail};
use drover_model::DeviceId;
use drover_model::model::Hello;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use transport_nats::enrolling::{Asked, Joining};
use transport_nats::{HelloReply, NatsSettings, hello_subject, inbox_prefix};

/// nats-server trusting the authority in DIR/keys, its accounts in
/// DIR/accounts; returns it and its URL.
fn start_server(dir: &Path) -> Result<(Process, String)> {
    let authority = transport_nats::authority::Authority::load_or_create(&dir.join("keys"))?;
    let trust = authority.server_config(&dir.join("accounts"))?;
    start_nats_with(dir, free_port()?, &trust)
}

/// What every simulated device shares.
struct Fleet {
    url: String,
    token: String,
    enroll_jwt: String,
    jwts: std::path::PathBuf,
    accepted: AtomicUsize,
    greeted: AtomicUsize,
    retries: AtomicUsize,
}

impl Fleet {
    fn settings(&self) -> NatsSettings {
        NatsSettings {
            url: self.url.clone(),
            user: None,
            password: None,
            ca_file: None,
            connect_timeout: Duration::from_secs(20),
            replicas: 1,
            key_login: None,
        }
    }

    /// After a failure: jitter as the agent's backoff has it.
    async fn again(&self, device: &DeviceId, what: &str) {
        if self.retries.fetch_add(1, Ordering::Relaxed) < 3 {
            eprintln!("{device}: {what}; trying again");
        }
        tokio::time::sleep(Duration::from_millis(200 + fastrand::u64(0..800))).await;
    }
}

/// One device: ask until accepted, then log in by its JWT and say hello
/// until answered; returns its connection, kept open.
async fn device(fleet: Arc<Fleet>, index: usize) -> Result<async_nats::Client> {
    let device = DeviceId::new(format!("enn-{index:05}"))?;
    let signer: Arc<dyn drover_model::enroll::Signer> = Arc::new(key(index)?);
    let joining = Joining {
        signer: signer.clone(),
        token: fleet.token.clone(),
        enroll_jwt: fleet.enroll_jwt.clone(),
        jwt_file: fleet.jwts.join(device.as_str()),
    };
    let deadline = Instant::now() + Duration::from_secs(600);
    let settings = fleet.settings();
    let jwt = loop {
        match joining.ask(&settings, &device, Default::default()).await {
            Ok(Asked::Accepted(jwt)) => break jwt,
            Ok(Asked::NotYet(message)) if Instant::now() < deadline => {
                fleet.again(&device, &message).await
            }
            Err(e) if Instant::now() < deadline => fleet.again(&device, &e.to_string()).await,
            Ok(Asked::NotYet(message)) => bail!("{device}: {message}"),
            Err(e) => return Err(e.into()),
        }
    };
    fleet.accepted.fetch_add(1, Ordering::Relaxed);
    loop {
        let client = crate::keys::jwt_options(&jwt, signer.clone())
            .custom_inbox_prefix(inbox_prefix(&device))
            .connection_timeout(Duration::from_secs(20))
            .connect(&fleet.url)
            .await;
        let client = match client {
            Ok(client) => client,
            Err(e) if Instant::now() < deadline => {
                fleet.again(&device, &e.to_string()).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if hello(&client, &device).await {
            fleet.greeted.fetch_add(1, Ordering::Relaxed);
            return Ok(client);
        }
        if Instant::now() >= deadline {
            bail!("{device}: no answer to its hello");
        }
        fleet.again(&device, "no answer to its hello").await;
    }
}

async fn hello(client: &async_nats::Client, device: &DeviceId) -> bool {
    let hello = Hello {
        device_id: device.clone(),
        agent_version: "sim".into(),
        boot_id: "sim-boot".into(),
        capabilities: vec!["systemUpgradeV1".into()],
        jobs: Vec::new(),
    };
    let Ok(payload) = serde_json::to_vec(&hello) else {
        return false;
    };
    let request = client.request(hello_subject(device), payload.into());
    match tokio::time::timeout(Duration::from_secs(10), request).await {
        Ok(Ok(reply)) => serde_json::from_slice::<HelloReply>(&reply.payload)
            .is_ok_and(|reply| reply.error.is_none()),
        _ => false,
    }
}

/// One run: a fresh server and control plane, N devices joining at once.
pub async fn measure(drover: &Path, devices: usize) -> Result<EnrollFigures> {
    let dir = tempfile::Builder::new()
        .prefix("drover-enroll-nats-")
        .tempdir()?;
    let (server, url) = start_server(dir.path())?;
    let keys = dir.path().join("keys");
    let (process, api_base, _) = start_drover(
        drover,
        dir.path(),
        Serve {
            transport: Transport::Nats,
            broker_url: Some(&url),
            nats_replicas: 1,
            store_on_nats: false,
            nats_authority: Some(&keys),
        },
    )?;
    let (api, token) = image_token(dir.path(), &api_base).await?;
    let trust = api.get("/agent-trust").await?;
    let jwts = dir.path().join("jwts");
    std::fs::create_dir_all(&jwts)?;
    let fleet = Arc::new(Fleet {
        url,
        token,
        enroll_jwt: trust["natsEnrollmentJwt"]
            .as_str()
            .context("no enrollment JWT: is --nats-authority given?")?
            .to_owned(),
        jwts,
        accepted: AtomicUsize::new(0),
        greeted: AtomicUsize::new(0),
        retries: AtomicUsize::new(0),
    });
    let cp_before = procstat::usage(process.0.id()).context("the control plane's usage")?;
    let server_before = procstat::usage(server.0.id()).context("the server's usage")?;
    let load_before = procstat::load_average().unwrap_or(f64::NAN);
    let started = Instant::now();
    let tasks: Vec<_> = (0..devices)
        .map(|i| tokio::spawn(device(fleet.clone(), i)))
        .collect();
    let mut accepted_at = None;
    while !tasks.iter().all(|t| t.is_finished()) {
        if accepted_at.is_none() && fleet.accepted.load(Ordering::Relaxed) >= devices {
            accepted_at = Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let connected = started.elapsed();
    let mut clients = Vec::new();
    for task in tasks {
        clients.push(task.await??);
    }
    let cp_after = procstat::usage(process.0.id()).context("the control plane's usage")?;
    let server_after = procstat::usage(server.0.id()).context("the server's usage")?;
    let load_after = procstat::load_average().unwrap_or(f64::NAN);
    for client in clients {
        let _ = client.drain().await;
    }
    let per_device =
        |before: Duration, after: Duration| after.saturating_sub(before) / devices.max(1) as u32;
    Ok(EnrollFigures {
        devices,
        accepted: accepted_at.unwrap_or(connected),
        connected,
        cpu_per_device: per_device(cp_before.cpu, cp_after.cpu),
        broker_cpu_per_device: Some(per_device(server_before.cpu, server_after.cpu)),
        retries: fleet.retries.load(Ordering::Relaxed),
        load: (load_before, load_after),
    })
}
