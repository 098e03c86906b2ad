//! Harness for Drover's end-to-end tests: the control plane and agents run as
//! real processes on loopback in temporary directories, and are killed when
//! the test ends. Binaries come from the workspace's target directory (the
//! README's test command builds them first).

use serde_json::{Value, json};

pub use drover_sandbox as debroot;
pub mod fleet;
pub mod script;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const API_VERSION: &str = "fleet.nationtech.io/v1alpha1";

/// The intent-signing key every test control plane uses (Ed25519, PKCS#8 in
/// hex), so agents and scripted servers share it. A test key: it signs
/// nothing outside the tests.
pub const TEST_INTENT_KEY: &str = "3051020101300506032b6570042204202b41388b61c239a6ec002d71952e6baa6eb521912236b4836fc3249af4751ce58121004131ea6931676e90420f76f3c1b8042b04b929b48156310c02c9a7b80adfe065";
/// Its public key, which every test agent pins.
pub const TEST_INTENT_PUBLIC_KEY: &str =
    "4131ea6931676e90420f76f3c1b8042b04b929b48156310c02c9a7b80adfe065";

/// Signs an intent with the test key, as the control plane does.
pub fn sign_intent(mut intent: Value) -> Value {
    sign_intent_with(&mut intent, TEST_INTENT_KEY);
    intent
}

/// Signs an intent in place with the key `pkcs8_hex`.
pub fn sign_intent_with(intent: &mut Value, pkcs8_hex: &str) {
    let bytes = drover_model::signing::unhex(pkcs8_hex).expect("hex key");
    let key = ring::signature::Ed25519KeyPair::from_pkcs8(&bytes).expect("PKCS#8 key");
    let message = drover_model::signing::canonical(intent).expect("an intent object");
    let signature = key.sign(&message);
    intent[drover_model::signing::SIGNATURE_FIELD] =
        Value::String(drover_model::signing::hex(signature.as_ref()));
}

/// An HTTP client (reqwest needs this process's rustls provider set first).
pub fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// A self-signed certificate for `localhost`, written as `cert.pem` and
/// `key.pem` in `dir`, for TLS listeners under test.
pub struct LocalhostCert {
    /// The certificate, PEM (what a client pins).
    pub pem: String,
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
}

pub fn localhost_cert(dir: &Path) -> LocalhostCert {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("cert");
    let cert_path = dir.join("cert.pem");
    let key_path = dir.join("key.pem");
    std::fs::write(&cert_path, cert.cert.pem()).expect("write cert");
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).expect("write key");
    LocalhostCert {
        pem: cert.cert.pem(),
        cert_path,
        key_path,
    }
}

/// A built binary of the workspace.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target directory");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the binaries first (cargo build --workspace --bins)",
        path.display()
    );
    path
}

/// The last lines of a log file, for failure messages.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

fn kill(child: &mut Child, signal: &str) {
    let _ = Command::new("kill")
        .arg(signal)
        .arg(child.id().to_string())
        .status();
}

fn stop(child: &mut Child) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    kill(child, "-TERM");
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Every regular file under `dir`, at any depth (sockets and the like left out).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                files.push(entry.path());
            }
        }
    }
    files.sort();
    files
}

/// The files under `dir` that hold `needle` anywhere in their bytes.
pub fn files_holding(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    files_under(dir)
        .into_iter()
        .filter(|file| {
            std::fs::read(file)
                .map(|bytes| bytes.windows(needle.len()).any(|w| w == needle))
                .unwrap_or(false)
        })
        .collect()
}

/// A test that cannot run on this machine (it needs root, say). Under CI
/// (`CI=true`), where every test must run, that is a failure. Elsewhere it
/// says why on stderr and adds a line to `target/test-artefacts/skipped.txt`,
/// which `scripts/test.sh` prints and counts at the end, so a skip is never
/// silent.
pub fn cannot_run_here(test: &str, reason: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test} cannot run here ({reason}), and CI runs every test");
    }
    eprintln!("SKIPPED {test}: {reason}");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-artefacts");
    let _ = std::fs::create_dir_all(&dir);
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("skipped.txt"))
    {
        use std::io::Write;
        let _ = writeln!(file, "{test}: {reason}");
    }
}

/// Polls `check` until it returns Some, or panics with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    within(timeout, check)
        .await
        .unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
}

/// Polls `check` until it returns Some; None after `timeout` (for a caller
/// that explains the failure itself).
pub async fn within<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The agent's `[testing]` table: before `full-upgrade` it writes `reached`
/// and waits while `hold` exists, so a test can act in the middle of a job.
pub fn hold_config(hold: &Path, reached: &Path) -> String {
    format!(
        "[testing]\nhold_before_step = \"full-upgrade\"\nhold_file = {}\nreached_file = {}\n",
        toml_string(&hold.display().to_string()),
        toml_string(&reached.display().to_string())
    )
}

/// A free TCP port on loopback, bound and released, each handed out once
/// per test process. Taken below the kernel's ephemeral range: a port the
/// kernel picks (`bind(0)`) can be given to any outgoing connection of the
/// processes under test before the server meant for it binds (a cluster
/// node once lost its monitoring port that way).
/// Ports a test binary takes from its own block when several run at once.
const PORT_BLOCK: u32 = 400;

pub fn free_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    const SPAN: u32 = 10_000;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    if ephemeral_low <= SPAN + 1024 {
        return std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
    }
    let low = ephemeral_low - SPAN;
    // Test binaries run side by side (scripts/test.sh gives each its own
    // block, DROVER_TEST_PORT_BLOCK) or one after another (a start that
    // differs per process keeps one from reusing the ports of the one
    // before).
    let start = match std::env::var("DROVER_TEST_PORT_BLOCK")
        .ok()
        .and_then(|b| b.parse::<u32>().ok())
    {
        Some(block) => block.wrapping_mul(PORT_BLOCK) % SPAN,
        None => std::process::id().wrapping_mul(7919) % SPAN,
    };
    loop {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        assert!(n < SPAN, "no free test port left");
        let port = u16::try_from(low + (start + n) % SPAN).expect("a port");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

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
        let text = format!(
            "listen: \"127.0.0.1:{}\"\njetstream {{ store_dir: {} }}\n{extra}\n",
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
                let others: Vec<String> = (0..3)
                    .filter(|j| *j != i)
                    .map(|j| format!("\"nats-route://127.0.0.1:{}\"", routes[j]))
                    .collect();
                NatsServer::start_binary(
                    &cluster_nats_server(),
                    &format!(
                        "server_name: n{i}\nhttp: \"127.0.0.1:{}\"\n\
                     cluster {{ name: drover, listen: \"127.0.0.1:{}\", routes: [{}] }}\n{auth}",
                        monitors[i],
                        routes[i],
                        others.join(", ")
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
    /// has both others as current peers: only then can a stream with
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
        agreed && peers.len() == 2 && peers.iter().all(|p| p["current"] == true)
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

/// Marks, among `serve`'s extra arguments, the open-file limit to run it
/// with (never passed to `drover`).
const PRLIMIT_MARK: &str = "\u{0}prlimit-nofile=";

/// `drover serve` as a process.
pub struct ControlPlane {
    child: Child,
    pub dir: tempfile::TempDir,
    pub api: String,
    pub agent_url: String,
    pub token: String,
    extra: Vec<String>,
    http: reqwest::Client,
}

impl ControlPlane {
    pub fn start(extra: &[&str]) -> Self {
        Self::start_in(Self::prepare(), extra)
    }

    /// A control plane whose operators' API speaks TLS with a certificate
    /// for `localhost` made in `cert_dir`, and that certificate.
    pub fn start_with_api_tls(cert_dir: &Path) -> (Self, LocalhostCert) {
        let cert = localhost_cert(cert_dir);
        let cp = Self::start(&[
            "--api-tls-cert",
            cert.cert_path.to_str().expect("utf-8"),
            "--api-tls-key",
            cert.key_path.to_str().expect("utf-8"),
        ]);
        (cp, cert)
    }

    /// From now on, reach the operators' API over https as `localhost`,
    /// trusting only the CA in `ca_pem` (the control plane was started with
    /// `--api-tls-cert`): the harness's own requests then go the way the
    /// CLI's do.
    pub fn trust_api(&mut self, ca_pem: &Path) {
        let _ = http_client();
        let pem = std::fs::read(ca_pem).expect("CA");
        self.api = format!("https://localhost:{}", self.api_port());
        self.http = reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(&pem).expect("pem")])
            .build()
            .expect("client");
    }

    /// The operators' API's port.
    pub fn api_port(&self) -> &str {
        self.api
            .rsplit(':')
            .next()
            .expect("the API's address has a port")
    }

    /// An HTTP client that trusts only `cert` (pinned), with `timeout`.
    pub fn pinned_client(cert: &LocalhostCert, timeout: Duration) -> reqwest::Client {
        let _ = http_client();
        reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(cert.pem.as_bytes()).expect("pem")])
            .timeout(timeout)
            .build()
            .expect("client")
    }

    /// The control plane's directory, before it starts (its data is
    /// `DIR/data`), made as an operator makes it: `drover init`, with the
    /// tests' intent key (which the tests' agents pin) put there first.
    pub fn prepare() -> tempfile::TempDir {
        let dir = tempfile::Builder::new()
            .prefix("drover-cp-")
            .tempdir()
            .expect("tempdir");
        let data = dir.path().join("data");
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&data)
                .expect("data directory");
        }
        std::fs::write(data.join("intent.key"), TEST_INTENT_KEY).expect("intent key");
        Self::drover_in(dir.path(), &["init"]);
        dir
    }

    /// Another replica's directory: its own data directory with the secrets
    /// of the one in `of` (device tokens, operator token), not its database.
    pub fn prepare_replica(of: &Path) -> tempfile::TempDir {
        let dir = Self::prepare();
        for file in ["secret.key", "operator.token"] {
            std::fs::copy(
                of.join("data").join(file),
                dir.path().join("data").join(file),
            )
            .expect("copy secret");
        }
        dir
    }

    /// Runs `drover --data DIR/data ARGS` and returns its stdout (asserting success).
    pub fn drover_in(dir: &Path, args: &[&str]) -> String {
        let out = Command::new(bin("drover"))
            .arg("--data")
            .arg(dir.join("data"))
            .args(args)
            .output()
            .expect("run drover");
        assert!(
            out.status.success(),
            "drover {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn start_in(dir: tempfile::TempDir, extra: &[&str]) -> Self {
        Self::start_limited(dir, extra, None)
    }

    /// [`ControlPlane::start_in`] with its open-file limit (soft and hard)
    /// set to `open_files` through util-linux's prlimit, as a small
    /// machine or a unit's LimitNOFILE would have it.
    pub fn start_limited(dir: tempfile::TempDir, extra: &[&str], open_files: Option<u64>) -> Self {
        let mut extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        if let Some(limit) = open_files {
            extra.insert(0, format!("{PRLIMIT_MARK}{limit}"));
        }
        let (child, api, agent_url) = Self::spawn(dir.path(), &extra);
        let token = std::fs::read_to_string(dir.path().join("data/operator.token"))
            .expect("operator token")
            .trim()
            .to_owned();
        Self {
            child,
            api,
            agent_url,
            token,
            dir,
            extra,
            http: http_client(),
        }
    }

    fn spawn(dir: &Path, extra: &[String]) -> (Child, String, String) {
        let (limit, extra): (Vec<&String>, Vec<&String>) =
            extra.iter().partition(|a| a.starts_with(PRLIMIT_MARK));
        let data = dir.join("data");
        if !data.join("intent.key").exists() {
            use std::os::unix::fs::DirBuilderExt;
            let _ = std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&data);
            std::fs::write(data.join("intent.key"), TEST_INTENT_KEY).expect("intent key");
        }
        let ready = dir.join("ready.json");
        let _ = std::fs::remove_file(&ready);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("drover.log"))
            .expect("log");
        let mut command = match limit.first() {
            Some(mark) => {
                let mut command = Command::new("prlimit");
                let limit = mark.trim_start_matches(PRLIMIT_MARK);
                command
                    .arg(format!("--nofile={limit}:{limit}"))
                    .arg(bin("drover"));
                command
            }
            None => Command::new(bin("drover")),
        };
        let child = command
            .arg("--data")
            .arg(dir.join("data"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--agent-listen",
                "127.0.0.1:0",
            ])
            // A test may set its own pass interval.
            .args(match extra.iter().any(|a| *a == "--pass-interval-ms") {
                true => &[][..],
                false => &["--pass-interval-ms", "200"][..],
            })
            .arg("--ready-file")
            .arg(&ready)
            .args(extra)
            .env("RUST_LOG", "info,drover=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start drover serve");
        // Serve waits up to 120 s for JetStream (a cluster electing leaders
        // after a node was killed: a watch's first request can time out
        // and be tried again); most starts take well under a second.
        let deadline = Instant::now() + Duration::from_secs(60);
        let addresses: Value = loop {
            if let Ok(text) = std::fs::read_to_string(&ready) {
                break serde_json::from_str(&text).expect("ready file");
            }
            assert!(
                Instant::now() < deadline,
                "drover serve did not start:\n{}",
                log_tail(&dir.join("drover.log"))
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        (
            child,
            format!("http://{}", addresses["api"].as_str().expect("api")),
            format!("ws://{}", addresses["agents"].as_str().expect("agents")),
        )
    }

    /// SIGKILL: the control plane dies without any shutdown path.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGSTOP: the control plane holds its connections but does nothing,
    /// so what reaches a broker meanwhile stays there for a test to see.
    pub fn pause(&self) {
        signal_process(self.child.id(), "-STOP");
    }

    /// SIGCONT after [`ControlPlane::pause`].
    pub fn resume(&self) {
        signal_process(self.child.id(), "-CONT");
    }

    /// Starts it again on the same data (new ports).
    pub fn restart(&mut self) {
        self.kill9();
        let (child, api, agent_url) = Self::spawn(self.dir.path(), &self.extra);
        self.child = child;
        self.api = api;
        self.agent_url = agent_url;
    }

    pub fn log(&self) -> String {
        log_tail(&self.dir.path().join("drover.log"))
    }

    pub fn device_token(&self, device: &str) -> String {
        let out = Command::new(bin("drover"))
            .arg("--data")
            .arg(self.dir.path().join("data"))
            .args(["token", "--unregistered", device])
            .output()
            .expect("drover token");
        assert!(
            out.status.success(),
            "drover token failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The password `device` gives an MQTT or NATS broker, derived from its
    /// token as its agent derives it: what a raw broker client of the
    /// tests logs in with.
    pub fn broker_password(&self, device: &str) -> String {
        let id = drover_model::DeviceId::new(device).expect("device id");
        drover_model::credentials::broker_password(&self.device_token(device), &id)
    }

    pub async fn apply(&self, manifest: Value) -> Value {
        self.try_apply(manifest)
            .await
            .unwrap_or_else(|e| panic!("apply failed with {e}"))
    }

    /// Applies `manifest`; the status and body when the API refuses it.
    pub async fn try_apply(&self, manifest: Value) -> Result<Value, String> {
        let response = self
            .http
            .post(format!("{}/api/v1/apply", self.api))
            .bearer_auth(&self.token)
            .json(&manifest)
            .send()
            .await
            .map_err(|e| format!("no answer: {e}"))?;
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        if !status.is_success() {
            return Err(format!("{status}: {body}"));
        }
        Ok(serde_json::from_str(&body).expect("json"))
    }

    /// Waits until the control plane exits by itself; its exit status.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for drover") {
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "drover serve did not exit within {timeout:?}\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// An operator's GET of `path` under `/api/v1`.
    async fn send_get(&self, path: &str) -> reqwest::Response {
        self.http
            .get(format!("{}/api/v1{path}", self.api))
            .bearer_auth(&self.token)
            .send()
            .await
            .expect("get")
    }

    pub async fn get(&self, path: &str) -> Value {
        self.send_get(path).await.json().await.expect("json")
    }

    /// The status code of an operator's GET, for checks that something is
    /// (or is no longer) there.
    pub async fn get_status(&self, path: &str) -> u16 {
        self.send_get(path).await.status().as_u16()
    }

    /// Returns once the engine has finished every pass that began before
    /// this call, so that a check of "nothing changed" follows the passes
    /// that would have changed it: two runs with no targets, applied one
    /// after the other; the engine ends each (NoTargets) in a pass, and a
    /// pass starts only after the one before it ended.
    pub async fn engine_barrier(&self) {
        for _ in 0..2 {
            let name = format!("barrier-{}", uuid::Uuid::new_v4());
            self.apply(json!({
                "apiVersion": API_VERSION, "kind": "TaskRun", "metadata": {"name": name},
                "spec": {"allowedGroups": ["drover-test-no-such-group"], "deadlineSeconds": 600, "systemUpgradeV1": {}}
            }))
            .await;
            let run = self.wait_run_finished(&name, Duration::from_secs(30)).await;
            assert_eq!(run["status"]["reason"], "NoTargets", "{run}");
        }
    }

    /// `GET /healthz`: its status code and body (no token needed).
    pub async fn healthz(&self) -> (u16, String) {
        let response = self
            .http
            .get(format!("{}/healthz", self.api))
            .send()
            .await
            .expect("healthz");
        let code = response.status().as_u16();
        (code, response.text().await.unwrap_or_default())
    }

    /// `GET /metrics` as text.
    pub async fn metrics(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.api))
            .bearer_auth(&self.token)
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text")
    }

    pub async fn apply_device(&self, id: &str, groups: &[&str], labels: Value) {
        self.apply(json!({
            "apiVersion": API_VERSION, "kind": "Device",
            "metadata": {"name": id, "labels": labels},
            "spec": {"groups": groups}
        }))
        .await;
    }

    pub async fn apply_upgrade_run(&self, name: &str, group: &str, deadline_seconds: u64) {
        self.apply(json!({
            "apiVersion": API_VERSION, "kind": "TaskRun",
            "metadata": {"name": name},
            "spec": {"allowedGroups": [group], "deadlineSeconds": deadline_seconds, "systemUpgradeV1": {}}
        }))
        .await;
    }

    /// Waits until every named device has an agent that advertised its capabilities.
    pub async fn wait_for_agents(&self, devices: &[&str]) {
        // On progress, not a fixed time for all: 30 s for the next device to
        // register (the first included), so a loaded machine that registers
        // them slowly is waited for, and one where registration stalls is not.
        const STALL: Duration = Duration::from_secs(30);
        let started = Instant::now();
        let mut progress = Instant::now();
        let mut most = 0;
        loop {
            let listed = self.get("/devices").await;
            let missing: Vec<&str> = devices
                .iter()
                .copied()
                .filter(|d| {
                    !listed.as_array().into_iter().flatten().any(|r| {
                        r["id"] == *d
                            && r["agentPresent"] == true
                            && r["capabilities"].as_array().is_some_and(|c| !c.is_empty())
                    })
                })
                .collect();
            if missing.is_empty() {
                return;
            }
            let registered = devices.len() - missing.len();
            if registered > most {
                most = registered;
                progress = Instant::now();
            }
            assert!(
                progress.elapsed() < STALL,
                "agents to register: {registered} of {} after {:.1} s, none more for {} s; \
                 missing {missing:?}",
                devices.len(),
                started.elapsed().as_secs_f64(),
                STALL.as_secs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits for a run to reach a terminal phase and returns it.
    pub async fn wait_run_finished(&self, name: &str, timeout: Duration) -> Value {
        eventually(timeout, &format!("run {name} to finish"), || async {
            let run = self.get(&format!("/taskruns/{name}")).await;
            let phase = run["status"]["phase"].as_str().unwrap_or("").to_owned();
            (phase == "Complete" || phase == "Failed").then_some(run)
        })
        .await
    }

    pub async fn targets(&self, name: &str) -> Vec<Value> {
        let page = self.get(&format!("/taskruns/{name}/targets")).await;
        page["items"].as_array().cloned().unwrap_or_default()
    }

    /// `drover operators add NAME --role ROLE` as the bootstrap admin: the
    /// new operator's token.
    pub fn add_operator(&self, name: &str, role: &str) -> String {
        let out = self.cli(&["operators", "add", name, "--role", role]);
        assert!(
            out.status.success(),
            "add operator {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// A dashboard login with `token`: the session's cookie pair
    /// (`drover_session=…`) and its CSRF token.
    pub async fn dashboard_session(&self, token: &str) -> (String, String) {
        let login = self
            .http
            .post(format!("{}/ui/login", self.api))
            .json(&serde_json::json!({"token": token}))
            .send()
            .await
            .expect("login");
        assert_eq!(login.status(), 200, "login");
        let cookie = login.headers()["set-cookie"]
            .to_str()
            .expect("cookie")
            .split(';')
            .next()
            .expect("pair")
            .to_owned();
        let csrf = self.session_csrf(&cookie).await;
        (cookie, csrf)
    }

    /// The CSRF token of a dashboard session (`cookie` is `drover_session=…`).
    pub async fn session_csrf(&self, cookie: &str) -> String {
        let session: Value = self
            .http
            .get(format!("{}/ui/session", self.api))
            .header("cookie", cookie)
            .send()
            .await
            .expect("session")
            .json()
            .await
            .expect("json");
        session["csrf"].as_str().expect("csrf").to_owned()
    }

    /// Runs the `drover` CLI against this control plane as its operator
    /// (the token in DROVER_TOKEN, as the CLI asks: a flag shows in `ps`).
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(bin("drover"))
            .args(["--server", &self.api])
            .env("DROVER_TOKEN", &self.token)
            .args(args)
            .output()
            .expect("run drover")
    }
}

/// A WebSocket connection to the control plane's agent port as device
/// `path_device` with `token`, as a hand-driven agent.
pub async fn agent_ws(
    cp: &ControlPlane,
    path_device: &str,
    token: &str,
) -> Result<script::Ws, String> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = format!("{}/agent/v1/ws/{path_device}", cp.agent_url);
    let mut request = url.into_client_request().map_err(|e| e.to_string())?;
    request.headers_mut().insert(
        "authorization",
        tokio_tungstenite::tungstenite::http::HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|e| e.to_string())?,
    );
    let addr = cp.agent_url.trim_start_matches("ws://").to_owned();
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    tokio_tungstenite::client_async(request, tcp)
        .await
        .map(|(ws, _)| ws)
        .map_err(|e| e.to_string())
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// `drover-agent run` as a process with its own directory.
pub struct AgentProcess {
    child: Option<Child>,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub socket: PathBuf,
}

pub fn toml_string(value: &str) -> String {
    serde_json::to_string(value).expect("string")
}

impl AgentProcess {
    /// Writes a config (simulate mode, 1 s heartbeats) and starts the agent.
    /// `extra` is appended to the config as TOML.
    pub fn start(dir: &Path, device: &str, server_url: &str, token: &str, extra: &str) -> Self {
        Self::start_with(
            dir,
            device,
            server_url,
            token,
            "",
            "mode = \"simulate\"\nmin_free_mib = 10",
            extra,
        )
    }

    /// An agent in simulate mode speaking NATS (user = device id, password = token).
    pub fn start_nats(
        dir: &Path,
        device: &str,
        nats_url: &str,
        token: &str,
        ca_file: Option<&Path>,
        extra: &str,
    ) -> Self {
        let ca = ca_file
            .map(|p| format!("ca_file = {}\n", toml_string(&p.display().to_string())))
            .unwrap_or_default();
        let transport = format!(
            "kind = \"nats\"\nurl = {}\ntoken = {}\n{ca}heartbeat_seconds = 1\nbackoff_max_seconds = 2\n",
            toml_string(nats_url),
            toml_string(token)
        );
        Self::start_full(
            dir,
            device,
            &transport,
            "",
            "mode = \"simulate\"\nmin_free_mib = 10",
            extra,
        )
    }

    /// An agent in simulate mode speaking MQTT (user = device id, password = token).
    pub fn start_mqtt(dir: &Path, device: &str, url: &str, token: &str, extra: &str) -> Self {
        Self::start_mqtt_with(dir, device, url, token, None, extra)
    }

    /// Like [`AgentProcess::start_mqtt`], trusting `ca_file` for `mqtts://`.
    pub fn start_mqtt_with(
        dir: &Path,
        device: &str,
        url: &str,
        token: &str,
        ca_file: Option<&Path>,
        extra: &str,
    ) -> Self {
        let ca = ca_file
            .map(|p| format!("ca_file = {}\n", toml_string(&p.display().to_string())))
            .unwrap_or_default();
        let transport = format!(
            "kind = \"mqtt\"\nurl = {}\ntoken = {}\n{ca}heartbeat_seconds = 1\nbackoff_max_seconds = 2\n",
            toml_string(url),
            toml_string(token)
        );
        Self::start_full(
            dir,
            device,
            &transport,
            "",
            "mode = \"simulate\"\nmin_free_mib = 10",
            extra,
        )
    }

    /// Like [`AgentProcess::start`], with top-level keys (`top`) and the
    /// `[updater]` table given by the test.
    pub fn start_with(
        dir: &Path,
        device: &str,
        server_url: &str,
        token: &str,
        top: &str,
        updater: &str,
        extra: &str,
    ) -> Self {
        let transport = format!(
            "kind = \"websocket\"\nserver_url = {}\ntoken = {}\nheartbeat_seconds = 1\nbackoff_max_seconds = 2\n",
            toml_string(server_url),
            toml_string(token)
        );
        Self::start_full(dir, device, &transport, top, updater, extra)
    }

    /// An agent with the `[transport]` table given whole.
    pub fn start_full(
        dir: &Path,
        device: &str,
        transport: &str,
        top: &str,
        updater: &str,
        extra: &str,
    ) -> Self {
        std::fs::create_dir_all(dir).expect("agent dir");
        let config = dir.join("agent.toml");
        let socket = dir.join("status.sock");
        // The agent's own assessments are off unless a test asks for them:
        // a local job after every upgrade would change what most tests see.
        let assessment = if extra.contains("[assessment]") {
            ""
        } else {
            "[assessment]\nevery_minutes = 0\n"
        };
        let text = format!(
            "device_id = {}\nintent_public_keys = [{}]\nstate_dir = {}\nstatus_socket = {}\n{top}\n\n\
             [transport]\n{transport}\n[updater]\n{updater}\n\n{assessment}{extra}\n",
            toml_string(device),
            toml_string(TEST_INTENT_PUBLIC_KEY),
            toml_string(&dir.join("state").display().to_string()),
            toml_string(&socket.display().to_string()),
        );
        std::fs::write(&config, text).expect("config");
        let mut agent = Self {
            child: None,
            dir: dir.to_owned(),
            config,
            socket,
        };
        agent.restart();
        agent
    }

    pub fn restart(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("agent.log"))
            .expect("log");
        let child = Command::new(bin("drover-agent"))
            .arg("--config")
            .arg(&self.config)
            .arg("run")
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start drover-agent");
        self.child = Some(child);
    }

    /// SIGKILL: no shutdown path runs.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits for the agent to exit on its own; its exit code, or `None` on
    /// a signal. Panics after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let child = self.child.as_mut().expect("the agent was started");
            if let Some(status) = child.try_wait().expect("wait for the agent") {
                self.child = None;
                return status.code();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the agent did not exit within {timeout:?}\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    pub fn log(&self) -> String {
        log_tail(&self.dir.join("agent.log"))
    }

    /// `drover-agent assess` against this running agent (a local
    /// assessment through its queue); what it printed.
    pub fn assess(&self) -> String {
        let out = Command::new(bin("drover-agent"))
            .args(["assess", "--socket"])
            .arg(&self.socket)
            .output()
            .expect("drover-agent assess");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    }

    /// Whether any line of the agent's whole log contains `text`.
    pub fn logged(&self, text: &str) -> bool {
        std::fs::read_to_string(self.dir.join("agent.log"))
            .unwrap_or_default()
            .contains(text)
    }

    /// The agent's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Restarts the agent demanding more free space than any disk has, so
    /// every upgrade fails its preflight (a failing canary).
    pub fn fail_preflight(&mut self) {
        let config = std::fs::read_to_string(&self.config).expect("config");
        std::fs::write(
            &self.config,
            config.replace("min_free_mib = 10", "min_free_mib = 1000000"),
        )
        .expect("write config");
        self.kill9();
        self.restart();
    }

    /// `drover-agent status --json` against this agent's socket.
    pub fn status(&self) -> Value {
        let out = Command::new(bin("drover-agent"))
            .args(["status", "--json", "--socket"])
            .arg(&self.socket)
            .output()
            .expect("drover-agent status");
        assert!(
            out.status.success(),
            "status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("status json")
    }

    /// Waits until the agent holds no running or queued job and its outbox is
    /// empty: every status it has is confirmed by the transport.
    pub async fn wait_idle_and_flushed(&self, timeout: Duration) {
        eventually(
            timeout,
            "the agent to finish and flush its outbox",
            || async {
                let status = self.status();
                (status["currentJob"].is_null()
                    && status["queuedJobs"] == 0
                    && status["outboxPending"] == 0)
                    .then_some(())
            },
        )
        .await
    }

    /// Asserts the agent holds one job whose every step ran once: nothing
    /// ran twice.
    pub fn assert_one_job_run_once(&self) {
        self.assert_jobs_run_once(1);
    }

    /// Asserts the agent holds `count` jobs, each an upgrade whose every
    /// step ran once.
    pub fn assert_jobs_run_once(&self, count: usize) {
        let jobs = self.jobs();
        assert_eq!(jobs.as_array().map(Vec::len), Some(count), "{jobs}");
        for job in jobs.as_array().into_iter().flatten() {
            let tries: Vec<u64> = job["steps"]
                .as_array()
                .expect("steps")
                .iter()
                .map(|s| s["tries"].as_u64().unwrap_or(9))
                .collect();
            assert_eq!(tries, vec![1, 1, 1, 1, 1], "nothing ran twice: {jobs}");
        }
    }

    /// `drover-agent jobs --json` against this agent's socket.
    pub fn jobs(&self) -> Value {
        let out = Command::new(bin("drover-agent"))
            .args(["jobs", "--json", "--socket"])
            .arg(&self.socket)
            .output()
            .expect("drover-agent jobs");
        assert!(
            out.status.success(),
            "jobs failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("jobs json")
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop(&mut child);
        }
    }
}

/// `kill SIGNAL PID`, which must succeed.
fn signal_process(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {signal} {pid}");
}

/// The control plane's user on a broker (`drover nats-config` and
/// `mqtt-config` name it so by default).
pub const CP_BROKER_USER: &str = "drover-control-plane";

/// A second control-plane user on the tests' MQTT brokers, with the same
/// password, for the tests' own clients: the broker makes a client's id its
/// user name, so a test client under [`CP_BROKER_USER`] would push the
/// control plane off (as a second replica under one user would).
pub const WATCH_BROKER_USER: &str = "drover-watch";

/// The effective user id a process runs as (from /proc/PID/status).
pub fn effective_uid(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or_else(|| panic!("no effective uid in {status}"))
        .to_owned()
}

/// A nats-server whose authorization `drover nats-config` made for
/// `devices`, and a control plane serving over it with `password`.
pub fn nats_fleet<S: AsRef<str>>(devices: &[S], password: &str) -> (NatsServer, ControlPlane) {
    let dir = ControlPlane::prepare();
    let nats = NatsServer::start(&nats_auth(dir.path(), devices, password));
    let url = nats.url();
    let cp = ControlPlane::start_in(
        dir,
        &[
            "--nats-url",
            &url,
            "--nats-user",
            CP_BROKER_USER,
            "--nats-password",
            password,
        ],
    );
    (nats, cp)
}

/// The authorization block `drover nats-config` prints for `devices`, with
/// the keys of the control plane in `dir` and its password.
pub fn nats_auth<S: AsRef<str>>(dir: &Path, devices: &[S], password: &str) -> String {
    let mut args = vec!["nats-config", "--control-plane-password", password];
    for device in devices {
        args.extend(["--device", device.as_ref()]);
    }
    ControlPlane::drover_in(dir, &args)
}

/// A mosquitto whose passwords and ACLs `drover mqtt-config` made for
/// `devices`, and a control plane serving over it with `password`.
pub fn mqtt_fleet<S: AsRef<str>>(devices: &[S], password: &str) -> (Mosquitto, ControlPlane) {
    mqtt_fleet_with(devices, password, &[])
}

/// [`mqtt_fleet`], with more arguments for `drover serve`.
pub fn mqtt_fleet_with<S: AsRef<str>>(
    devices: &[S],
    password: &str,
    extra: &[&str],
) -> (Mosquitto, ControlPlane) {
    let dir = ControlPlane::prepare();
    let broker_dir = Mosquitto::prepare();
    let out = broker_dir.path().join("auth").display().to_string();
    let mut args = vec![
        "mqtt-config",
        "--control-plane-password",
        password,
        "--control-plane-user",
        CP_BROKER_USER,
        "--control-plane-user",
        WATCH_BROKER_USER,
        "--out",
        &out,
    ];
    for device in devices {
        args.extend(["--device", device.as_ref()]);
    }
    let auth = ControlPlane::drover_in(dir.path(), &args);
    assert!(auth.contains("acl_file"), "{auth}");
    let broker = Mosquitto::start_in(broker_dir, &auth, "");
    let url = broker.url();
    let mut args = vec!["--mqtt-url", url.as_str(), "--mqtt-password", password];
    args.extend_from_slice(extra);
    let cp = ControlPlane::start_in(dir, &args);
    (broker, cp)
}

/// A small tmpfs (a full disk on demand), unmounted on drop. None when
/// not root (mount needs it).
pub struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    /// Mounts `size` (tmpfs's `size=`, e.g. `1m`) at `at`.
    pub fn mount(at: &std::path::Path, size: &str) -> Option<Self> {
        let uid = std::process::Command::new("id")
            .arg("-u")
            .output()
            .expect("run id");
        if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
            return None;
        }
        std::fs::create_dir_all(at).expect("mount point");
        let options = format!("size={size},mode=0700");
        let out = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &options,
                "drover-test",
                &at.display().to_string(),
            ])
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mount a tmpfs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(Self(at.to_owned()))
    }

    /// Writes a filler file until the file system refuses with ENOSPC.
    pub fn fill(&self) -> std::path::PathBuf {
        use std::io::Write;
        let path = self.0.join("filler");
        let mut file = std::fs::File::create(&path).expect("filler");
        let chunk = vec![0u8; 4096];
        loop {
            match file.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
                Err(e) => panic!("filling the disk: {e}"),
            }
        }
        // Any partial chunk too, so that not one byte is free.
        let _ = file.write(&[0u8; 1]);
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// One put: the key (`<device>.<job>`) and the payload.
type Put = (String, Vec<u8>);

/// Every put on the intent bucket's subjects that one NATS connection saw
/// from the moment it subscribed, in order: what the control plane released,
/// counted at the broker across kills and restarts, each put the control
/// plane sent whether or not the stream stored it (a delete, a withdrawn
/// intent, carries no payload and is not kept). Not counted on the stream
/// itself: it keeps one message per key (the withdrawal replaces the put),
/// so a consumer recreated after a node was killed never sees the puts
/// replaced meanwhile.
pub struct IntentPuts {
    seen: std::sync::Arc<std::sync::Mutex<Vec<Put>>>,
    task: tokio::task::JoinHandle<()>,
}

impl IntentPuts {
    /// Subscribes on `url` (one node) as `user`; returns once subscribed.
    pub async fn record(url: &str, user: &str, password: &str) -> Self {
        use futures_util::StreamExt;
        let client =
            async_nats::ConnectOptions::with_user_and_password(user.into(), password.into())
                .connect(url)
                .await
                .expect("connect the intent recorder");
        let mut subscription = client
            .subscribe("$KV.system-upgrade-intent.>")
            .await
            .expect("subscribe to the intent bucket's subjects");
        client.flush().await.expect("flush the subscription");
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = seen.clone();
        let task = tokio::spawn(async move {
            let _client = client;
            while let Some(message) = subscription.next().await {
                let operation = message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("KV-Operation"))
                    .map(|v| v.as_str().to_owned());
                if operation.is_none() && !message.payload.is_empty() {
                    let key = message
                        .subject
                        .as_str()
                        .trim_start_matches("$KV.system-upgrade-intent.")
                        .to_owned();
                    kept.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((key, message.payload.to_vec()));
                }
            }
        });
        Self { seen, task }
    }

    /// Key (`<device>.<job>`) → every payload put there, in order.
    pub fn per_key(&self) -> std::collections::BTreeMap<String, Vec<Vec<u8>>> {
        let mut keys: std::collections::BTreeMap<String, Vec<Vec<u8>>> = Default::default();
        for (key, payload) in self.seen.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            keys.entry(key.clone()).or_default().push(payload.clone());
        }
        keys
    }

    /// Checks one release per device: each device has exactly one key, and
    /// exactly one put was sent under it (a put sent twice fails, the same
    /// intent or not). Returns each device's key and its intent.
    pub fn assert_put_once_each(&self, devices: &[&str]) -> Vec<(String, Value)> {
        let keys = self.per_key();
        assert_eq!(
            keys.len(),
            devices.len(),
            "one key per device: {:?}",
            keys.keys().collect::<Vec<_>>()
        );
        devices
            .iter()
            .map(|device| {
                let (key, payloads) = keys
                    .iter()
                    .find(|(k, _)| k.starts_with(&format!("{device}.")))
                    .unwrap_or_else(|| panic!("no intent for {device}: {:?}", keys.keys()));
                assert_eq!(
                    payloads.len(),
                    1,
                    "{key} was put {} times: {:?}",
                    payloads.len(),
                    texts(payloads)
                );
                let intent: Value =
                    serde_json::from_slice(payloads[0].as_slice()).expect("an intent");
                (key.clone(), intent)
            })
            .collect()
    }

    /// Checks one release per device for `job`: each device's key
    /// (`<device>.<job>`) was put exactly once, with an intent for this job,
    /// and no other key was put.
    pub fn assert_one_release_each(&self, devices: &[&str], job: &str) {
        for (key, intent) in self.assert_put_once_each(devices) {
            assert!(
                key.ends_with(&format!(".{job}")),
                "{key} is not job {job}'s"
            );
            assert_eq!(intent["jobId"], job, "{intent}");
        }
    }

    /// Checks one release per device for `job` where a broker node was
    /// killed mid-run: each device's key was put with one and the same
    /// signed intent for this job and no other key was put, but a put may
    /// have been sent again (its acknowledgement lost with the node: seen
    /// here, the same intent twice). Returns how many puts each key saw.
    pub fn assert_one_intent_each(&self, devices: &[&str], job: &str) -> Vec<(String, usize)> {
        let keys = self.per_key();
        let expected: std::collections::BTreeSet<String> =
            devices.iter().map(|d| format!("{d}.{job}")).collect();
        let got: std::collections::BTreeSet<String> = keys.keys().cloned().collect();
        assert_eq!(got, expected, "the keys the intent bucket was put under");
        let mut counts = Vec::new();
        for (key, payloads) in &keys {
            let distinct: std::collections::BTreeSet<&Vec<u8>> = payloads.iter().collect();
            assert_eq!(
                distinct.len(),
                1,
                "{key} was released {} different ways: {:?}",
                distinct.len(),
                texts(distinct.iter().copied())
            );
            counts.push((key.clone(), payloads.len()));
        }
        counts
    }
}

/// Payloads as text, for a failure message.
fn texts<'a>(payloads: impl IntoIterator<Item = &'a Vec<u8>>) -> Vec<String> {
    payloads
        .into_iter()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect()
}

impl Drop for IntentPuts {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `drover --data DATA serve --listen 127.0.0.1:0 EXTRA` started on its
/// own (no harness around it), returned once its ready file appears, with
/// that file's JSON (the bound addresses, the download links' base).
pub fn serve_until_ready(data: &Path, extra: &[&str]) -> (Child, Value) {
    let ready = data.with_extension("ready.json");
    let _ = std::fs::remove_file(&ready);
    let mut child = Command::new(bin("drover"))
        .arg("--data")
        .arg(data)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(extra)
        .arg("--ready-file")
        .arg(&ready)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("drover serve");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready.exists() {
        assert!(child.try_wait().expect("wait").is_none(), "serve exited");
        assert!(Instant::now() < deadline, "serve did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = std::fs::read_to_string(&ready).expect("ready");
    (child, serde_json::from_str(&text).expect("json"))
}

/// A .deb `NAME_VERSION_all.deb` of about `mib` MiB of incompressible
/// bytes, stored uncompressed, built in `dir` with dpkg-deb (uploads of a
/// realistic size).
pub fn big_deb(dir: &Path, name: &str, version: &str, mib: u64) -> PathBuf {
    let tree = dir.join(format!("{name}-tree"));
    std::fs::create_dir_all(tree.join("DEBIAN")).expect("DEBIAN");
    std::fs::create_dir_all(tree.join("usr/share").join(name)).expect("tree");
    std::fs::write(
        tree.join("DEBIAN/control"),
        format!(
            "Package: {name}\nVersion: {version}\nArchitecture: all\nMaintainer: Drover tests \
             <tests@drover.invalid>\nDescription: a big package\n"
        ),
    )
    .expect("control");
    let mut urandom = std::fs::File::open("/dev/urandom").expect("urandom");
    let mut data =
        std::fs::File::create(tree.join("usr/share").join(name).join("data")).expect("data");
    std::io::copy(&mut std::io::Read::take(&mut urandom, mib << 20), &mut data)
        .expect("random bytes");
    let deb = dir.join(format!("{name}_{version}_all.deb"));
    let out = Command::new("dpkg-deb")
        .args(["-Znone", "--root-owner-group", "--build"])
        .arg(&tree)
        .arg(&deb)
        .output()
        .expect("dpkg-deb");
    assert!(out.status.success(), "{out:?}");
    std::fs::remove_dir_all(&tree).expect("clean");
    deb
}

/// The peak resident memory (VmHWM, KiB) of a running process, if it
/// still runs.
pub fn peak_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
