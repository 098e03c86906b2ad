//! `drover-sim nats-connect` (issues 55 and 57): N devices connecting to one
//! nats-server at once, as a fleet does after the server restarts, by
//! bcrypt passwords from the server's configuration (`drover nats-config
//! --device`) or by user JWTs signed by Drover's account (`drover
//! nats-config --authority`). No control plane: the figure is the
//! server's cost of letting devices in. Each device that fails tries again
//! after the agent's own backoff, as the agent does.

use crate::harness::{free_port, start_nats_with};
use crate::procstat;
use agent_core::backoff::Backoff;
use anyhow::{Context, Result};
use drover_model::DeviceId;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use transport_nats::agent::RECONNECT_INITIAL;

/// How devices log in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Auth {
    /// Users and bcrypt passwords in the server's configuration.
    Password,
    /// User JWTs signed by the account's signing key; the device signs the
    /// server's nonce.
    Jwt,
}

/// One run's figures.
#[derive(Debug, Clone)]
pub struct ConnectFigures {
    pub devices: usize,
    /// From the first attempt until every device was connected.
    pub connected: Duration,
    /// The server's CPU over that time, per device.
    pub server_cpu_per_device: Duration,
    /// Attempts that failed and were made again.
    pub retries: usize,
    pub load: (f64, f64),
}

/// How one device logs in.
enum Login {
    Password(String, String),
    Jwt(transport_nats::KeyLogin),
}

/// The server's configuration and each device's login.
fn logins(dir: &Path, devices: usize, auth: Auth) -> Result<(String, Vec<Login>)> {
    let ids: Vec<DeviceId> = (0..devices)
        .map(|i| DeviceId::new(format!("nc-{i:05}")))
        .collect::<Result<_, _>>()?;
    match auth {
        Auth::Password => {
            let passwords: Vec<(DeviceId, String)> = ids
                .iter()
                .map(|id| (id.clone(), format!("{:064x}", fastrand::u128(..))))
                .collect();
            let config = transport_nats::server::authorization_config(
                ("drover-control-plane", "connect-bench"),
                &passwords,
                transport_nats::server::DirectStatusPuts::Denied,
            )
            .map_err(anyhow::Error::msg)?;
            let logins = passwords
                .into_iter()
                .map(|(id, password)| Login::Password(id.to_string(), password))
                .collect();
            Ok((config, logins))
        }
        Auth::Jwt => {
            let authority =
                transport_nats::authority::Authority::load_or_create(&dir.join("keys"))?;
            let config = authority.server_config(&dir.join("accounts"))?;
            let mut logins = Vec::with_capacity(devices);
            for (index, id) in ids.iter().enumerate() {
                logins.push(Login::Jwt(crate::keys::nats_login(&authority, index, id)?));
            }
            Ok((config, logins))
        }
    }
}

/// Connects once as `login`.
async fn connect(url: &str, login: &Login) -> Result<async_nats::Client> {
    let options = match login {
        Login::Password(user, password) => {
            async_nats::ConnectOptions::with_user_and_password(user.clone(), password.clone())
        }
        Login::Jwt(login) => {
            let signer = login.signer.clone();
            async_nats::ConnectOptions::new().jwt(login.jwt.clone(), move |nonce| {
                let signature = signer.sign(&nonce);
                async move { Ok(signature) }
            })
        }
    };
    Ok(options
        .connection_timeout(transport_nats::agent::CONNECT_TIMEOUT)
        .max_reconnects(Some(1))
        .connect(url)
        .await?)
}

/// One run: a fresh server, N devices connecting at once.
pub async fn measure(devices: usize, auth: Auth) -> Result<ConnectFigures> {
    let dir = tempfile::Builder::new()
        .prefix("drover-nats-connect-")
        .tempdir()?;
    let (config, logins) = logins(dir.path(), devices, auth)?;
    let (server, url) = start_nats_with(dir.path(), free_port()?, &config)?;
    let retries = Arc::new(AtomicUsize::new(0));
    let before = procstat::usage(server.0.id()).context("the server's usage")?;
    let load_before = procstat::load_average().unwrap_or(f64::NAN);
    let started = Instant::now();
    let tasks: Vec<_> = logins
        .into_iter()
        .map(|login| {
            let (url, retries) = (url.clone(), retries.clone());
            tokio::spawn(async move {
                let mut backoff = Backoff::new(RECONNECT_INITIAL, Duration::from_secs(60));
                let deadline = Instant::now() + Duration::from_secs(600);
                loop {
                    let attempt = Instant::now();
                    match connect(&url, &login).await {
                        Ok(client) => return Ok(client),
                        Err(e) if Instant::now() < deadline => {
                            if retries.fetch_add(1, Ordering::Relaxed) < 3 {
                                eprintln!("a connection failed: {e:#}; trying again");
                            }
                            tokio::time::sleep(backoff.failed(attempt.elapsed())).await;
                        }
                        Err(e) => return Err(e),
                    }
                }
            })
        })
        .collect();
    let mut clients = Vec::with_capacity(devices);
    for task in tasks {
        clients.push(task.await??);
    }
    let connected = started.elapsed();
    let after = procstat::usage(server.0.id()).context("the server's usage")?;
    let load_after = procstat::load_average().unwrap_or(f64::NAN);
    // Closed before the next run, which needs the file descriptors.
    let closing: Vec<_> = clients
        .into_iter()
        .map(|client| tokio::spawn(async move { client.drain().await }))
        .collect();
    for closed in closing {
        let _ = closed.await;
    }
    drop(server);
    Ok(ConnectFigures {
        devices,
        connected,
        server_cpu_per_device: after.cpu.saturating_sub(before.cpu) / devices.max(1) as u32,
        retries: retries.load(Ordering::Relaxed),
        load: (load_before, load_after),
    })
}
