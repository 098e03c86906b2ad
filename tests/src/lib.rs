//! Harness for Drover's end-to-end tests: the control plane and agents run as
//! real processes on loopback in temporary directories, and are killed when
//! the test ends. Binaries come from the workspace's target directory (the
//! README's test command builds them first).

use serde_json::Value;

pub use drover_sandbox as debroot;
mod agent;
mod brokers;
mod control_plane;
mod faults;
pub mod fleet;
pub mod script;
pub use agent::AgentProcess;
pub use brokers::{
    JETSTREAM_MAX_FILE_STORE, Mosquitto, NatsCluster, NatsServer, cluster_nats_server,
};
pub use control_plane::{ControlPlane, agent_ws, agent_ws_at, agent_ws_from};
pub use faults::{IntentPuts, SmallDisk};
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

pub fn toml_string(value: &str) -> String {
    serde_json::to_string(value).expect("string")
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

/// A nats-server that trusts Drover's operator (`drover nats-config
/// --authority`, keys beside the data directory, not in it), a control
/// plane serving over it with `--nats-authority`, and the enrollment
/// user's JWT every device's config carries.
pub fn nats_joining_fleet() -> (NatsServer, ControlPlane, String) {
    let dir = ControlPlane::prepare();
    let keys = dir.path().join("nats-authority");
    let resolver = dir.path().join("nats-accounts");
    let (keys_arg, resolver_arg) = (keys.display().to_string(), resolver.display().to_string());
    let config = ControlPlane::drover_in(
        dir.path(),
        &[
            "nats-config",
            "--authority",
            &keys_arg,
            "--resolver-dir",
            &resolver_arg,
        ],
    );
    let enroll_jwt = config
        .lines()
        .find_map(|line| line.strip_prefix("# enrollment_jwt = "))
        .map(|jwt| jwt.trim_matches('"').to_owned())
        .unwrap_or_else(|| panic!("no enrollment_jwt in:\n{config}"));
    let nats = NatsServer::start(&config);
    let url = nats.url();
    let cp = ControlPlane::start_in(dir, &["--nats-url", &url, "--nats-authority", &keys_arg]);
    (nats, cp, enroll_jwt)
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
    mqtt_fleet_configured(devices, password, false, extra)
}

/// A mosquitto set up for devices that join by themselves (`drover
/// mqtt-config --dynamic-security`, no device listed), and a control plane
/// serving over it with `password`.
pub fn mqtt_joining_fleet(password: &str) -> (Mosquitto, ControlPlane) {
    mqtt_fleet_configured::<&str>(&[], password, true, &[])
}

fn mqtt_fleet_configured<S: AsRef<str>>(
    devices: &[S],
    password: &str,
    dynamic_security: bool,
    extra: &[&str],
) -> (Mosquitto, ControlPlane) {
    let dir = ControlPlane::prepare();
    let broker_dir = Mosquitto::prepare();
    let out = broker_dir.path().join("auth").display().to_string();
    let plugin_file = broker_dir.path().join("dynsec.json").display().to_string();
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
    if dynamic_security {
        args.extend(["--dynamic-security", plugin_file.as_str()]);
    }
    let auth = ControlPlane::drover_in(dir.path(), &args);
    assert!(auth.contains("acl_file"), "{auth}");
    assert_eq!(
        auth.contains("plugin_opt_config_file"),
        dynamic_security,
        "{auth}"
    );
    let broker = Mosquitto::start_in(broker_dir, &auth, "");
    let url = broker.url();
    let mut args = vec!["--mqtt-url", url.as_str(), "--mqtt-password", password];
    args.extend_from_slice(extra);
    let cp = ControlPlane::start_in(dir, &args);
    (broker, cp)
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

/// A job's reason lines (the API's `reason`, the failing program's own
/// words), empty when it has none.
pub fn reason_lines(job: &Value) -> Vec<&str> {
    job["reason"]
        .as_array()
        .map(|lines| lines.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The lines of `text` from the first one that starts with `heading` on
/// (`describe`'s "why … failed:" block and what follows it).
pub fn block_from<'a>(text: &'a str, heading: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| !l.starts_with(heading))
        .collect()
}

/// Issue 56's real apt failure: a package whose dependency no archive
/// has, by the name a Deployment installs it ([`upload_needy_package`]).
pub const NEEDY_PACKAGE: &str = "drover-needy_1.0_all";
/// What apt says of it among the reason lines.
pub const NEEDY_UNMET: &str = "drover-needy : Depends: drover-missing (>= 2.0)";

/// A Deployment named `name` installing `package` on the devices of
/// `group`, one at a time, without retries.
pub fn install_deployment(name: &str, group: &str, package: &str) -> Value {
    serde_json::json!({
        "apiVersion": API_VERSION, "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "targets": {"filter": {"groups": [group]}},
            "packageInstallV1": {"package": package},
            "maxConcurrency": 1,
            "retries": 0,
            "deadlineSeconds": 600
        }
    })
}

/// Builds [`NEEDY_PACKAGE`] and uploads it to the control plane's
/// repository with `drover packages upload`.
pub fn upload_needy_package(cp: &ControlPlane) {
    let build = tempfile::tempdir().expect("build dir");
    let needy = debroot::Pkg::new("drover-needy", "1.0")
        .depends("drover-missing (>= 2.0)")
        .build(build.path(), build.path());
    let out = cp.cli(&["packages", "upload", needy.to_str().expect("path")]);
    assert!(out.status.success(), "{out:?}");
}
