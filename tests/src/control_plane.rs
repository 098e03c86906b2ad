//! `drover serve` as a process, and the test's calls on its API.

use crate::{
    API_VERSION, LocalhostCert, TEST_INTENT_KEY, bin, eventually, http_client, localhost_cert,
    log_tail, script, signal_process, stop,
};
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

    /// Starts it again on the same data (new ports) with `extra` serve
    /// arguments instead of those it had.
    pub fn restart_with(&mut self, extra: &[&str]) {
        self.extra = extra.iter().map(|s| (*s).to_owned()).collect();
        self.restart();
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
    agent_ws_at(
        cp,
        &format!("/agent/v1/ws/{path_device}"),
        Some(&format!("Bearer {token}")),
    )
    .await
}

/// A WebSocket connection to `path` on the control plane's agent port,
/// with `authorization` if any (the enrollment door takes none).
pub async fn agent_ws_at(
    cp: &ControlPlane,
    path: &str,
    authorization: Option<&str>,
) -> Result<script::Ws, String> {
    agent_ws_from(cp, None, path, authorization).await
}

/// [`agent_ws_at`] from the loopback address `source` (127.0.0.2, …): as
/// another host, for what the control plane counts per address.
pub async fn agent_ws_from(
    cp: &ControlPlane,
    source: Option<std::net::IpAddr>,
    path: &str,
    authorization: Option<&str>,
) -> Result<script::Ws, String> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = format!("{}{path}", cp.agent_url);
    let mut request = url.into_client_request().map_err(|e| e.to_string())?;
    if let Some(value) = authorization {
        request.headers_mut().insert(
            "authorization",
            tokio_tungstenite::tungstenite::http::HeaderValue::from_str(value)
                .map_err(|e| e.to_string())?,
        );
    }
    let addr: std::net::SocketAddr = cp
        .agent_url
        .trim_start_matches("ws://")
        .parse()
        .map_err(|e| format!("the agents' address: {e}"))?;
    let socket = tokio::net::TcpSocket::new_v4().map_err(|e| e.to_string())?;
    if let Some(source) = source {
        socket
            .bind(std::net::SocketAddr::new(source, 0))
            .map_err(|e| e.to_string())?;
    }
    let tcp = socket.connect(addr).await.map_err(|e| e.to_string())?;
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
