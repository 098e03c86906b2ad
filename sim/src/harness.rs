//! What a measurement drives: the processes it starts (nats-server, a
//! NATS cluster, mosquitto, `drover serve`) and stops, the operators' API
//! it calls, and the waits and timings around them. Shared by the fleet
//! benchmark, the patch benchmark and the footprint measurement.

use crate::spread::Spread;
use anyhow::{Context, Result, bail};
use drover_model::DeviceId;
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    Websocket,
    Nats,
    Mqtt,
}

pub(crate) struct Process(pub(crate) Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub(crate) const CP_USER: &str = "drover-control-plane";
pub(crate) const CP_PASSWORD: &str = "bench-secret";

/// How nats-server lets devices and the control plane in.
#[derive(Clone, Copy)]
pub(crate) enum NatsAuth<'a> {
    /// Hand-registered devices: a user and a bcrypt password per device
    /// in the server's configuration (`drover nats-config --device`).
    Passwords(&'a [(DeviceId, String)]),
    /// Accepted devices: the servers trust Drover's operator
    /// (`drover nats-config --authority`), and each device logs in by the
    /// user JWT the control plane signed for it.
    Operator(&'a transport_nats::authority::Authority),
}

impl NatsAuth<'_> {
    /// The server's lines for it; a node's resolver keeps the accounts'
    /// JWTs in `node_dir`/accounts.
    fn config(&self, node_dir: &Path) -> Result<String> {
        match self {
            Self::Passwords(tokens) => transport_nats::server::authorization_config(
                (CP_USER, CP_PASSWORD),
                &broker_passwords(tokens),
                transport_nats::server::DirectStatusPuts::Denied,
            )
            .map_err(anyhow::Error::msg),
            Self::Operator(authority) => Ok(authority.server_config(&node_dir.join("accounts"))?),
        }
    }
}

/// Starts nats-server with JetStream, letting in by `auth`.
pub(crate) fn start_nats(dir: &Path, auth: NatsAuth<'_>) -> Result<(Process, String)> {
    let port = free_port()?;
    start_nats_with(dir, port, &auth.config(dir)?)
}

/// Starts nats-server with JetStream on `port` and `auth_config` (its
/// users, or the operator it trusts).
pub(crate) fn start_nats_with(
    dir: &Path,
    port: u16,
    auth_config: &str,
) -> Result<(Process, String)> {
    let config = format!(
        "listen: \"127.0.0.1:{port}\"\nmax_connections: 100000\nwrite_deadline: \"30s\"\n\
         jetstream {{ store_dir: {:?}, max_file_store: 64G }}\n{auth_config}",
        dir.join("js").display().to_string()
    );
    let process = spawn_nats(dir, &config, port)?;
    Ok((process, format!("nats://127.0.0.1:{port}")))
}

/// Starts nats-server with `config` (written to DIR/nats.conf, its log to
/// DIR/nats.log) and waits until it listens on `port`. The binary is
/// `$DROVER_NATS_SERVER`, else the one on PATH (`scripts/bench.sh` gives
/// the 2.10 a cluster needs, see docs/operations.md).
fn spawn_nats(dir: &Path, config: &str, port: u16) -> Result<Process> {
    let path = dir.join("nats.conf");
    // Its monitoring and profiling endpoints too, which the fleet
    // benchmark reads ([`nats_endpoint`]).
    let config = format!(
        "{config}\n{MONITOR_KEY}\"127.0.0.1:{}\"\n{PROFILE_KEY}{}\n",
        free_port()?,
        free_port()?
    );
    std::fs::write(&path, config)?;
    respawn_nats(dir, port)
}

/// Starts nats-server again from the configuration [`spawn_nats`] wrote
/// in `dir` (the same port, store and endpoints), its log appended to,
/// and waits until it listens on `port`.
pub(crate) fn respawn_nats(dir: &Path, port: u16) -> Result<Process> {
    let path = dir.join("nats.conf");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("nats.log"))?;
    let binary = std::env::var_os("DROVER_NATS_SERVER").unwrap_or_else(|| "nats-server".into());
    let child = Command::new(binary)
        .arg("-c")
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("cannot start nats-server (apt-get install nats-server)")?;
    let process = Process(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!(
                "nats-server did not start; see {}",
                dir.join("nats.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(process)
}

/// nats-server's monitoring endpoint (`/varz`, `/jsz`, ...).
pub(crate) const MONITOR_KEY: &str = "http: ";
/// nats-server's Go profiler (`/debug/pprof/profile`).
pub(crate) const PROFILE_KEY: &str = "prof_port: ";

/// An endpoint (`http://127.0.0.1:PORT`) of the nats-server started in
/// `dir`, by its config key there ([`MONITOR_KEY`], [`PROFILE_KEY`]).
pub(crate) fn nats_endpoint(dir: &Path, key: &str) -> Result<String> {
    let config = std::fs::read_to_string(dir.join("nats.conf"))?;
    config
        .lines()
        .find_map(|line| line.strip_prefix(key))
        .map(|address| match address.trim_matches('"') {
            // prof_port is a port on the listen address's host.
            port if !port.contains(':') => format!("http://127.0.0.1:{port}"),
            address => format!("http://{address}"),
        })
        .with_context(|| format!("no {key:?} in {}/nats.conf", dir.display()))
}

/// Starts three nats-server nodes as one JetStream cluster (routes on
/// loopback, one store directory each); returns them and their client URLs.
pub(crate) fn start_nats_cluster(
    dir: &Path,
    auth: NatsAuth<'_>,
) -> Result<(Vec<Process>, Vec<String>)> {
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_>>()?;
    let routes: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_>>()?;
    let mut nodes = Vec::new();
    for i in 0..3 {
        // All three routes on every node (a route to itself is skipped):
        // a node sizes a new meta group by its routes.
        let all: Vec<String> = routes
            .iter()
            .map(|port| format!("\"nats-route://127.0.0.1:{port}\""))
            .collect();
        let node = dir.join(format!("n{i}"));
        std::fs::create_dir_all(&node)?;
        let auth = auth.config(&node)?;
        let config = format!(
            "server_name: n{i}\nlisten: \"127.0.0.1:{}\"\nmax_connections: 100000\nwrite_deadline: \"30s\"\n\
             jetstream {{ store_dir: {:?}, max_file_store: 64G }}\n\
             cluster {{ name: drover, listen: \"127.0.0.1:{}\", routes: [{}] }}\n{auth}",
            ports[i],
            node.join("js").display().to_string(),
            routes[i],
            all.join(", ")
        );
        nodes.push(spawn_nats(&node, &config, ports[i])?);
    }
    let urls = ports
        .iter()
        .map(|port| format!("nats://127.0.0.1:{port}"))
        .collect();
    Ok((nodes, urls))
}

/// Each device with the broker password its agent derives from its token,
/// as `drover nats-config` and `drover mqtt-config` write them.
pub(crate) fn broker_passwords(tokens: &[(DeviceId, String)]) -> Vec<(DeviceId, String)> {
    tokens
        .iter()
        .map(|(device, token)| {
            let password = drover_model::credentials::broker_password(token, device);
            (device.clone(), password)
        })
        .collect()
}

/// Starts mosquitto with one password and ACL entry per device.
pub(crate) fn start_mosquitto(
    dir: &Path,
    tokens: &[(DeviceId, String)],
    extra: &str,
) -> Result<(Process, String)> {
    let port = free_port()?;
    let (passwords, acl) = transport_mqtt::mosquitto::mosquitto_files(
        &transport_mqtt::Topics::new(transport_mqtt::DEFAULT_PREFIX),
        &[CP_USER],
        CP_PASSWORD,
        &broker_passwords(tokens),
    );
    std::fs::write(dir.join("drover.passwd"), passwords)?;
    std::fs::write(dir.join("drover.acl"), acl)?;
    let config = format!(
        "user root\nlistener {port} 127.0.0.1\n{}\nmax_connections -1\n{}\n\
         persistence false\nper_listener_settings false\nallow_anonymous false\n\
         password_file {}\nacl_file {}\n{extra}\n",
        transport_mqtt::Topics::listener_settings(),
        transport_mqtt::Topics::broker_settings(),
        dir.join("drover.passwd").display(),
        dir.join("drover.acl").display()
    );
    let path = dir.join("mosquitto.conf");
    std::fs::write(&path, config)?;
    let log = std::fs::File::create(dir.join("mosquitto.log"))?;
    let child = Command::new("mosquitto")
        .arg("-c")
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("cannot start mosquitto (apt-get install mosquitto)")?;
    let process = Process(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!(
                "mosquitto did not start; see {}",
                dir.join("mosquitto.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((process, format!("mqtt://127.0.0.1:{port}")))
}

/// mosquitto with the dynamic security plugin as `drover mqtt-config
/// --dynamic-security` sets it up (its file in DIR/dynsec.json, returned),
/// beside the control plane's password and ACL entries.
pub(crate) fn start_mosquitto_dynsec(dir: &Path) -> Result<(Process, String, std::path::PathBuf)> {
    let topics = transport_mqtt::Topics::new(transport_mqtt::DEFAULT_PREFIX);
    let file = dir.join("dynsec.json");
    std::fs::write(&file, transport_mqtt::dynsec::initial_config(&topics))?;
    let plugin = format!(
        "plugin {}\nplugin_opt_config_file {}",
        transport_mqtt::dynsec::plugin_path(),
        file.display()
    );
    let (broker, url) = start_mosquitto(dir, &[], &plugin)?;
    Ok((broker, url, file))
}

/// How `drover serve` keeps its state and reaches its agents' broker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Serve<'a> {
    pub(crate) transport: Transport,
    /// The broker (NATS or MQTT) the agents use, or the JetStream store's.
    pub(crate) broker_url: Option<&'a str>,
    /// Each bucket's replicas (3 on a three-node cluster).
    pub(crate) nats_replicas: usize,
    /// On the JetStream store (`--store nats`, several replicas) instead of
    /// the embedded one.
    pub(crate) store_on_nats: bool,
    /// Servers trusting Drover's operator: the control plane logs in by the
    /// keys in this directory (`--nats-authority`), not by a password.
    pub(crate) nats_authority: Option<&'a Path>,
}

/// `drover serve` with its data in DIR/data; returns the process, API and agent addresses.
pub(crate) fn start_drover(
    drover: &Path,
    dir: &Path,
    serve: Serve<'_>,
) -> Result<(Process, String, String)> {
    start_drover_on(drover, dir, serve, "127.0.0.1:0")
}

/// [`start_drover`] with the agents' port at `agent_listen` (the same one
/// again after a restart).
pub(crate) fn start_drover_on(
    drover: &Path,
    dir: &Path,
    serve: Serve<'_>,
    agent_listen: &str,
) -> Result<(Process, String, String)> {
    let ready = dir.join("ready.json");
    let _ = std::fs::remove_file(&ready);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("drover.log"))?;
    let mut command = Command::new(drover);
    command
        .arg("--data")
        .arg(dir.join("data"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--agent-listen",
            agent_listen,
        ])
        .arg("--ready-file")
        .arg(&ready)
        // Every simulated device is on 127.0.0.1, and a benchmark measures
        // the work of enrolling, not the limits on how fast it is asked.
        .args(["--enrollments-per-address-per-minute", "0"])
        .args(["--enrollments-per-token-per-minute", "0"])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    let nats = serve.transport == Transport::Nats || serve.store_on_nats;
    match serve.broker_url {
        Some(url) if nats => {
            command.args(["--nats-url", url]);
            match serve.nats_authority {
                Some(keys) => {
                    command.arg("--nats-authority").arg(keys);
                }
                None => {
                    command.args(["--nats-user", CP_USER, "--nats-password", CP_PASSWORD]);
                }
            }
            command.args(["--nats-replicas", &serve.nats_replicas.to_string()]);
            if serve.store_on_nats {
                command.args(["--store", "nats"]);
            }
        }
        Some(url) if serve.transport == Transport::Mqtt => {
            command.args([
                "--mqtt-url",
                url,
                "--mqtt-user",
                CP_USER,
                "--mqtt-password",
                CP_PASSWORD,
            ]);
        }
        _ => {}
    }
    let process = Process(
        command
            .spawn()
            .with_context(|| format!("cannot start {}", drover.display()))?,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let addresses: Value = loop {
        if let Ok(text) = std::fs::read_to_string(&ready) {
            break serde_json::from_str(&text)?;
        }
        if Instant::now() > deadline {
            bail!(
                "drover serve did not start; see {}",
                dir.join("drover.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let field = |name: &str| -> Result<String> {
        Ok(addresses[name]
            .as_str()
            .context("ready file without addresses")?
            .to_owned())
    };
    Ok((process, field("api")?, field("agents")?))
}

pub(crate) struct Api {
    pub(crate) base: String,
    pub(crate) token: String,
    pub(crate) http: reqwest::Client,
}

impl Api {
    pub(crate) async fn post(&self, path: &str, body: &Value) -> Result<Value> {
        let response = self
            .http
            .post(format!("{}/api/v1{path}", self.base))
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .await?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("{path} answered {status}: {body}");
        }
        Ok(body)
    }

    pub(crate) async fn get(&self, path: &str) -> Result<Value> {
        Ok(self
            .http
            .get(format!("{}/api/v1{path}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?)
    }
}

/// Registers every device, as Lists of at most 20,000 Device manifests (the
/// most one request may carry).
pub async fn register(api_base: &str, token: &str, devices: &[DeviceId]) -> Result<()> {
    let api = Api {
        base: api_base.to_owned(),
        token: token.to_owned(),
        http: http_builder().timeout(Duration::from_secs(300)).build()?,
    };
    for chunk in devices.chunks(20_000) {
        let items: Vec<Value> = chunk
            .iter()
            .map(|d| {
                json!({"apiVersion": drover_rules::records::API_VERSION, "kind": "Device",
                       "metadata": {"name": d.as_str()}, "spec": {"groups": ["bench"]}})
            })
            .collect();
        api.post(
            "/apply",
            &json!({"apiVersion": "v1", "kind": "List", "items": items}),
        )
        .await?;
    }
    Ok(())
}

pub(crate) async fn wait_for(
    what: &str,
    timeout: Duration,
    mut ready: impl AsyncFnMut() -> Result<bool>,
) -> Result<f64> {
    let start = Instant::now();
    loop {
        if ready().await? {
            return Ok(start.elapsed().as_secs_f64());
        }
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `queries` requests to `path` one after another; their times in ms.
pub(crate) async fn timed(api: &Api, path: &str, queries: usize) -> Result<Spread> {
    let mut times = Vec::new();
    for _ in 0..queries.max(1) {
        let started = Instant::now();
        api.get(path).await?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    Spread::of(times).context("no request timed")
}

/// reqwest's builder, after setting this process's rustls provider (reqwest
/// is built without aws-lc and looks one up).
pub(crate) fn http_builder() -> reqwest::ClientBuilder {
    drover_net::tls::install_default_provider();
    reqwest::Client::builder()
}
