//! The brokers the tests start: `nats-server -js` (one, or a three-node
//! cluster) and mosquitto, each in its own directory on free loopback ports.

use crate::{free_port, http_client, log_tail, signal_process, stop, toml_string, within};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What the tests' nats-servers may store, whatever the disk's free space.
pub const JETSTREAM_MAX_FILE_STORE: &str = "64G";

/// `nats-server -js` as a process with its own store directory and config.
pub struct NatsServer {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub port: u16,
    config: PathBuf,
    binary: PathBuf,
}

/// The nats-server the cluster tests run: `$DROVER_TEST_CLUSTER_NATS_SERVER`
/// (the README's test command fetches Debian trixie's 2.10 there, see
/// `scripts/fetch-nats-server.sh`), else the one on PATH. A cluster needs
/// 2.10 or later: on bookworm's 2.9.10 a SIGKILLed node, restarted, took
/// writes before it had rejoined its streams' Raft groups, and its copy of
/// the control plane's bucket diverged from the others' for good.
pub fn cluster_nats_server() -> PathBuf {
    std::env::var_os("DROVER_TEST_CLUSTER_NATS_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("nats-server"))
}

impl NatsServer {
    /// Starts a server; `extra` is appended to its config (authorization, tls).
    pub fn start(extra: &str) -> Self {
        Self::start_binary(Path::new("nats-server"), extra)
    }

    /// Starts `binary` as the server.
    pub fn start_binary(binary: &Path, extra: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("drover-nats-")
            .tempdir()
            .expect("tempdir");
        let port = free_port();
        let config = dir.path().join("nats.conf");
        let mut server = Self {
            child: None,
            dir,
            port,
            config,
            binary: binary.to_owned(),
        };
        server.write_config(extra);
        server.restart();
        server
    }

    fn write_config(&self, extra: &str) {
        // JetStream's own limit, given: left to itself it is three quarters
        // of the disk's free space at start, and a machine with 3 GB free
        // refuses the buckets' reservations (1 GiB each) the tests never
        // fill.
        let text = format!(
            "listen: \"127.0.0.1:{}\"\njetstream {{ store_dir: {}, max_file_store: {JETSTREAM_MAX_FILE_STORE} }}\n{extra}\n",
            self.port,
            toml_string(&self.dir.path().join("js").display().to_string())
        );
        std::fs::write(&self.config, text).expect("config");
    }

    /// Restarts with `extra` in place of the config's first one (the same
    /// port and store), as an operator who rewrote its authorization.
    pub fn reconfigure(&mut self, extra: &str) {
        self.write_config(extra);
        self.restart();
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// SIGKILL, as a crash would.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP: the server hangs, its clients' sockets stay open, and what
    /// they send waits unread (lost if it is then killed).
    pub fn freeze(&self) {
        if let Some(child) = &self.child {
            let status = Command::new("kill")
                .args(["-STOP", &child.id().to_string()])
                .status()
                .expect("kill -STOP");
            assert!(status.success(), "kill -STOP nats-server");
        }
    }

    /// Starts (again) on the same port and store directory.
    pub fn restart(&mut self) {
        self.kill9();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("nats.log"))
            .expect("log");
        let child = Command::new(&self.binary)
            .arg("-c")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("nats-server is installed (the README's test command installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(15);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nats-server did not start:\n{}",
                log_tail(&self.dir.path().join("nats.log"))
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop(&mut child);
        }
    }
}

/// Three `nats-server -js` processes on loopback as one cluster (routes, a
/// shared cluster name, JetStream on each), each with its own store
/// directory and monitoring port; `auth` (what `drover nats-config`
/// prints) goes into every node's config.
pub struct NatsCluster {
    pub nodes: Vec<NatsServer>,
    monitors: Vec<u16>,
}

impl NatsCluster {
    pub async fn start(auth: &str) -> Self {
        let routes: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let monitors: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let nodes: Vec<NatsServer> = (0..3)
            .map(|i| {
                // Every node lists all three routes, its own included
                // (nats-server skips a route to itself): a node sizes a
                // new meta group by its routes, and with only the two
                // others it would expect two and could form a group of
                // two that the third must join later.
                let all: Vec<String> = routes
                    .iter()
                    .map(|port| format!("\"nats-route://127.0.0.1:{port}\""))
                    .collect();
                NatsServer::start_binary(
                    &cluster_nats_server(),
                    &format!(
                        "server_name: n{i}\nhttp: \"127.0.0.1:{}\"\n\
                     cluster {{ name: drover, listen: \"127.0.0.1:{}\", routes: [{}] }}\n{auth}",
                        monitors[i],
                        routes[i],
                        all.join(", ")
                    ),
                )
            })
            .collect();
        let cluster = Self { nodes, monitors };
        let formed = within(Duration::from_secs(60), || async {
            cluster.formed().await.then_some(())
        })
        .await;
        if formed.is_none() {
            let meta: Vec<Value> = cluster
                .monitor("/jsz")
                .await
                .into_iter()
                .map(|j| j.map_or(Value::Null, |j| j["meta_cluster"].clone()))
                .collect();
            panic!("the three nodes did not form JetStream's meta group in 60 s: {meta:#?}");
        }
        cluster
    }

    /// Every node is up and names the same meta leader, and the leader
    /// counts a group of three with both others as current peers: only then can a stream with
    /// three replicas be placed (before, JetStream answers "no suitable
    /// peers for placement").
    async fn formed(&self) -> bool {
        let jsz = self.monitor("/jsz").await;
        let Some(leader) = jsz
            .first()
            .and_then(|j| j.as_ref()?["meta_cluster"]["leader"].as_str())
            .filter(|l| !l.is_empty())
        else {
            return false;
        };
        let agreed = jsz.iter().all(|j| {
            j.as_ref()
                .is_some_and(|j| j["meta_cluster"]["leader"] == leader)
        });
        // Node i is named n{i}; only the leader lists its peers.
        let Some(leader_jsz) = leader
            .strip_prefix('n')
            .and_then(|i| i.parse::<usize>().ok())
            .and_then(|i| jsz.get(i)?.as_ref())
        else {
            return false;
        };
        let peers = leader_jsz["meta_cluster"]["replicas"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        agreed
            && leader_jsz["meta_cluster"]["cluster_size"] == 3
            && peers.len() == 2
            && peers.iter().all(|p| p["current"] == true)
    }

    /// Every node's client URL, comma-separated, as configs take them.
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(NatsServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Each node's monitoring endpoint `path` as JSON; None for a node that
    /// is down.
    async fn monitor(&self, path: &str) -> Vec<Option<Value>> {
        let http = http_client();
        let mut out = Vec::new();
        for port in &self.monitors {
            let response = http
                .get(format!("http://127.0.0.1:{port}{path}"))
                .timeout(Duration::from_secs(2))
                .send()
                .await;
            out.push(match response {
                Ok(response) => response.json::<Value>().await.ok(),
                Err(_) => None,
            });
        }
        out
    }

    /// The node that leads JetStream's meta group now, as the monitoring
    /// endpoint (`/jsz`) of the first live node says.
    pub async fn meta_leader(&self) -> Option<usize> {
        let jsz = self.monitor("/jsz").await.into_iter().flatten().next()?;
        let leader = jsz["meta_cluster"]["leader"].as_str()?;
        leader.strip_prefix('n')?.parse().ok()
    }

    /// The users connected to the live nodes now (`/connz?auth=1`).
    pub async fn connected_users(&self) -> std::collections::BTreeSet<String> {
        let mut users = std::collections::BTreeSet::new();
        for connz in self
            .monitor("/connz?auth=1&limit=10000")
            .await
            .into_iter()
            .flatten()
        {
            for connection in connz["connections"].as_array().into_iter().flatten() {
                if let Some(user) = connection["authorized_user"].as_str() {
                    users.insert(user.to_owned());
                }
            }
        }
        users
    }

    /// What each live node says of every stream and consumer (`/jsz`): for
    /// a failure's message.
    pub async fn stream_report(&self) -> String {
        let mut out = String::new();
        let jsz = self
            .monitor("/jsz?accounts=true&streams=true&consumers=true")
            .await;
        for (i, node) in jsz.iter().enumerate() {
            let Some(node) = node else {
                out.push_str(&format!("n{i}: down\n"));
                continue;
            };
            out.push_str(&format!(
                "n{i}: meta leader {}\n",
                node["meta_cluster"]["leader"]
            ));
            for account in node["account_details"].as_array().into_iter().flatten() {
                for stream in account["stream_detail"].as_array().into_iter().flatten() {
                    out.push_str(&format!(
                        "  {} last {} leader {} replicas {}\n",
                        stream["name"],
                        stream["state"]["last_seq"],
                        stream["cluster"]["leader"],
                        stream["cluster"]["replicas"]
                    ));
                    for consumer in stream["consumer_detail"].as_array().into_iter().flatten() {
                        out.push_str(&format!(
                            "    consumer {} delivered {} pending {} leader {}\n",
                            consumer["name"],
                            consumer["delivered"]["stream_seq"],
                            consumer["num_pending"],
                            consumer["cluster"]["leader"]
                        ));
                    }
                }
            }
        }
        out
    }

    /// Resident memory of each node (`/varz`), in bytes; None for a node
    /// that is down.
    pub async fn memory(&self) -> Vec<Option<u64>> {
        self.monitor("/varz")
            .await
            .into_iter()
            .map(|varz| varz.and_then(|v| v["mem"].as_u64()))
            .collect()
    }
}

/// `mosquitto` as a process with its own config, password and ACL files and
/// persistence directory, on a free loopback port. Started as root, it
/// drops to Debian's `mosquitto` user as the package's service does, so it
/// reads only what that user may read.
pub struct Mosquitto {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub port: u16,
    config: PathBuf,
}

impl Mosquitto {
    /// A directory for a broker's files (its persistence, its log, the
    /// files `drover mqtt-config` writes), owned by the broker's user.
    pub fn prepare() -> tempfile::TempDir {
        let dir = tempfile::Builder::new()
            .prefix("drover-mosquitto-")
            .tempdir()
            .expect("tempdir");
        if nix::unistd::geteuid().is_root() {
            let user = nix::unistd::User::from_name("mosquitto")
                .expect("look up the user mosquitto")
                .expect("the user mosquitto exists (Debian's mosquitto package makes it)");
            std::os::unix::fs::chown(dir.path(), Some(user.uid.as_raw()), Some(user.gid.as_raw()))
                .expect("chown the broker's directory");
        }
        dir
    }

    /// Starts a broker; `auth` holds the mosquitto.conf lines `drover
    /// mqtt-config` printed (password and ACL files).
    pub fn start(auth: &str) -> Self {
        Self::start_in(Self::prepare(), auth, "")
    }

    /// Like [`Mosquitto::start`] in a directory from [`Mosquitto::prepare`],
    /// with lines for the listener (TLS files).
    pub fn start_in(dir: tempfile::TempDir, auth: &str, listener: &str) -> Self {
        let port = free_port();
        let config = dir.path().join("mosquitto.conf");
        let text = format!(
            // No `user` line: started as root, mosquitto drops to its
            // default user, `mosquitto`, as Debian's service runs it.
            "listener {port} 127.0.0.1\n{listener}\npersistence true\npersistence_location {}/\n\
             autosave_interval 3600\nlog_dest file {}\n{auth}\n",
            dir.path().display(),
            dir.path().join("mosquitto.log").display()
        );
        std::fs::write(&config, text).expect("config");
        let mut broker = Self {
            child: None,
            dir,
            port,
            config,
        };
        broker.restart();
        broker
    }

    /// The broker's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("mosquitto runs").id()
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    /// The broker's whole log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mosquitto.log")).unwrap_or_default()
    }

    /// SIGKILL, as a crash would.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP: the broker holds its connections but answers nothing, as a
    /// hung broker or a black-holed network would.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT after [`Mosquitto::pause`].
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// SIGHUP: mosquitto reads its password and ACL files again.
    pub fn reload(&self) {
        self.signal("-HUP");
    }

    fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("mosquitto runs");
        signal_process(child.id(), signal);
    }

    pub fn restart(&mut self) {
        self.kill9();
        let child = Command::new("mosquitto")
            .arg("-c")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mosquitto is installed (the README's test command installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(15);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "mosquitto did not start:\n{}",
                log_tail(&self.dir.path().join("mosquitto.log"))
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop(&mut child);
        }
    }
}
