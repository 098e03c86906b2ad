//! `drover-sim nats-connect` (issues 55 and 57): N devices connecting to one
//! nats-server at once, as a fleet does after the server restarts, by
//! bcrypt passwords from the server's configuration (`drover nats-config
//! --device`) or by user JWTs signed by Drover's account (`drover
//! nats-config --authority`). No control plane: the figure is the
//! server's cost of letting devices in. Each device that fails tries again
//! after the agent's own backoff, as the agent does. With `--restart`, once
//! every device is in the server is killed and started again under them,
//! and they come back by async-nats's reconnects timed by the agent's own
//! rule (`reconnect_delays`), each spreading its first attempt over the
//! window a control plane would name for the fleet (`--logins-per-second`,
//! decision 0020): the figures are then the restart's, from the kill until
//! the new server holds every device, and the attempts it took beyond one
//! per device. With `--cluster` the devices log in (by JWT) to three nodes
//! of one cluster, and `--restart` kills and starts all three.

use crate::harness::{
    MONITOR_KEY, NatsAuth, Process, free_port, nats_endpoint, respawn_nats, start_nats_cluster,
    start_nats_with,
};
use crate::procstat;
use agent_core::backoff::Backoff;
use anyhow::{Context, Result, bail};
use drover_model::DeviceId;
use std::path::{Path, PathBuf};
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

/// Connects once as `login`; with `reconnect`, a lost connection is made
/// again as the agent makes it (async-nats's reconnects, timed by the
/// agent's rule), without end.
async fn connect(
    url: &str,
    login: &Login,
    reconnect: Option<Duration>,
) -> Result<async_nats::Client> {
    let options = match login {
        Login::Password(user, password) => {
            async_nats::ConnectOptions::with_user_and_password(user.clone(), password.clone())
        }
        Login::Jwt(login) => crate::keys::jwt_options(&login.jwt, login.signer.clone()),
    };
    let options = match reconnect {
        Some(window) => {
            let state = Arc::new(transport_nats::spread::Reconnects::default());
            state.set_connected();
            state.set_window(Some(u64::try_from(window.as_millis()).unwrap_or(u64::MAX)));
            options.max_reconnects(None).reconnect_delay_callback(
                transport_nats::agent::reconnect_delays(
                    agent_core::backoff::DEFAULT_BACKOFF_MAX,
                    state,
                ),
            )
        }
        None => options.max_reconnects(Some(1)),
    };
    let addresses = url
        .split(',')
        .map(str::parse::<async_nats::ServerAddr>)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(options
        .connection_timeout(transport_nats::agent::CONNECT_TIMEOUT)
        .connect(addresses)
        .await?)
}

/// The server, or the three nodes of a cluster, that devices log in to.
struct Servers {
    /// Each node: its process, its directory and its client port.
    nodes: Vec<(Process, PathBuf, u16)>,
    /// Every node's URL, comma-separated, as an agent is given them.
    url: String,
}

impl Servers {
    /// One server with `config`; or, with `cluster`, three nodes trusting
    /// the operator whose keys `logins` left in DIR/keys.
    fn start(dir: &Path, config: &str, cluster: bool) -> Result<Self> {
        if !cluster {
            let port = free_port()?;
            let (server, url) = start_nats_with(dir, port, config)?;
            return Ok(Self {
                nodes: vec![(server, dir.to_path_buf(), port)],
                url,
            });
        }
        let authority = transport_nats::authority::Authority::load_or_create(&dir.join("keys"))?;
        let (nodes, urls) = start_nats_cluster(dir, NatsAuth::Operator(&authority))?;
        let nodes = nodes
            .into_iter()
            .zip(&urls)
            .enumerate()
            .map(|(i, (node, url))| {
                let port = url.rsplit(':').next().and_then(|p| p.parse().ok());
                Ok((
                    node,
                    dir.join(format!("n{i}")),
                    port.context("a node's port")?,
                ))
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            nodes,
            url: urls.join(","),
        })
    }

    /// The CPU every node has used.
    fn cpu(&self) -> Result<Duration> {
        self.nodes
            .iter()
            .try_fold(Duration::ZERO, |sum, (node, _, _)| {
                Ok(sum
                    + procstat::usage(node.0.id())
                        .context("a server's usage")?
                        .cpu)
            })
    }

    /// Kills every node as a crash would (SIGKILL), then starts each again
    /// on its port, configuration and store.
    fn restart(&mut self) -> Result<()> {
        for (node, _, _) in &mut self.nodes {
            let _ = node.0.kill();
            let _ = node.0.wait();
        }
        for (node, dir, port) in &mut self.nodes {
            let old = std::mem::replace(node, respawn_nats(dir, *port)?);
            // Its handle's own drop would signal a process already gone.
            std::mem::forget(old);
        }
        Ok(())
    }
}

/// One run: a fresh server (or, with `cluster`, three nodes), N devices
/// connecting at once; with `restart` (the reconnect window a control
/// plane named), then every server killed and started again under them.
pub async fn measure(
    devices: usize,
    auth: Auth,
    restart: Option<Duration>,
    cluster: bool,
) -> Result<ConnectFigures> {
    if cluster && auth != Auth::Jwt {
        bail!("a cluster's devices log in by JWT here (--auth jwt)");
    }
    let dir = tempfile::Builder::new()
        .prefix("drover-nats-connect-")
        .tempdir()?;
    let (config, logins) = logins(dir.path(), devices, auth)?;
    let mut servers = Servers::start(dir.path(), &config, cluster)?;
    let url = servers.url.clone();
    let retries = Arc::new(AtomicUsize::new(0));
    let mut before = servers.cpu()?;
    let mut load_before = procstat::load_average().unwrap_or(f64::NAN);
    // A cluster's fleet comes in spread over the window, as after a
    // restart: all at once, 50,000 take minutes (decision 0019), and only
    // the restart is measured.
    let first_spread = restart.filter(|_| cluster).unwrap_or_default();
    let started = Instant::now();
    let tasks: Vec<_> = logins
        .into_iter()
        .map(|login| {
            let (url, retries) = (url.clone(), retries.clone());
            tokio::spawn(async move {
                tokio::time::sleep(agent_core::backoff::within(first_spread)).await;
                let mut backoff = Backoff::new(RECONNECT_INITIAL, Duration::from_secs(60));
                let deadline = Instant::now() + Duration::from_secs(600);
                loop {
                    let attempt = Instant::now();
                    match connect(&url, &login, restart).await {
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
    let mut connected = started.elapsed();
    let mut retries = retries.load(Ordering::Relaxed);
    if restart.is_some() {
        load_before = procstat::load_average().unwrap_or(f64::NAN);
        let killed = Instant::now();
        servers.restart()?;
        before = servers.cpu()?;
        let attempts = all_in_again(&servers, devices).await?;
        connected = killed.elapsed();
        retries = attempts.saturating_sub(devices);
    }
    let after = servers.cpu()?;
    let load_after = procstat::load_average().unwrap_or(f64::NAN);
    // Closed before the next run, which needs the file descriptors.
    let closing: Vec<_> = clients
        .into_iter()
        .map(|client| tokio::spawn(async move { client.drain().await }))
        .collect();
    for closed in closing {
        let _ = closed.await;
    }
    drop(servers);
    Ok(ConnectFigures {
        devices,
        connected,
        server_cpu_per_device: after.saturating_sub(before) / devices.max(1) as u32,
        retries,
        load: (load_before, load_after),
    })
}

/// Waits until the restarted servers hold `devices` clients between them;
/// returns the connections they accepted in all (`/varz`
/// `total_connections`), attempts that failed included.
async fn all_in_again(servers: &Servers, devices: usize) -> Result<usize> {
    let monitors = servers
        .nodes
        .iter()
        .map(|(_, dir, _)| nats_endpoint(dir, MONITOR_KEY))
        .collect::<Result<Vec<_>>>()?;
    let http = crate::harness::http_builder().build()?;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let (mut connections, mut total) = (0, 0);
        for monitor in &monitors {
            let varz: serde_json::Value = match http.get(format!("{monitor}/varz")).send().await {
                Ok(answer) => answer.json().await.unwrap_or_default(),
                Err(_) => serde_json::Value::Null,
            };
            connections += varz["connections"].as_u64().unwrap_or(0);
            total += varz["total_connections"].as_u64().unwrap_or(0);
        }
        if connections >= devices as u64 {
            return Ok(total as usize);
        }
        if Instant::now() > deadline {
            bail!("{connections} of {devices} in again after ten minutes");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
