//! The operator's first hour (issue 16): certificates made by `drover init`
//! that agents trust, commands that refuse a wrong data directory instead of
//! printing tokens no server accepts, `drover-agent check --connect` saying
//! what is wrong, and `get devices` telling online from offline.

use drover_tests::{
    AgentProcess, ControlPlane, TEST_INTENT_KEY, TEST_INTENT_PUBLIC_KEY, bin, eventually,
    toml_string,
};
use serde_json::json;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn drover(data: &Path, args: &[&str]) -> Output {
    Command::new(bin("drover"))
        .arg("--data")
        .arg(data)
        .args(args)
        .env_remove("DROVER_TOKEN")
        .output()
        .expect("run drover")
}

fn check_connect(config: &Path) -> Output {
    Command::new(bin("drover-agent"))
        .arg("--config")
        .arg(config)
        .args(["check", "--connect"])
        .output()
        .expect("run drover-agent check")
}

fn websocket(url: &str, token: &str, ca: &Path) -> String {
    format!(
        "kind = \"websocket\"\nserver_url = {}\ntoken = {}\nca_file = {}\n\
         heartbeat_seconds = 1\nbackoff_max_seconds = 2\n",
        toml_string(url),
        toml_string(token),
        toml_string(&ca.display().to_string())
    )
}

const SIMULATE: &str = "mode = \"simulate\"\nmin_free_mib = 10";

/// An agent config for `check --connect`: the device, its state directory
/// and the `[transport]` table given.
fn write_config(path: &Path, device: &str, state_dir: &Path, transport: &str) {
    std::fs::write(
        path,
        format!(
            "device_id = {}\nintent_public_keys = [{}]\nstate_dir = {}\n[transport]\n{transport}\n[updater]\n{SIMULATE}\n",
            toml_string(device),
            toml_string(TEST_INTENT_PUBLIC_KEY),
            toml_string(&state_dir.display().to_string()),
        ),
    )
    .expect("config");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_makes_tls_that_agents_trust_and_check_connect_names_a_wrong_token() {
    // A directory before `drover init` made anything but the intent key
    // the tests' agents pin (init keeps an existing one).
    let dir = tempfile::Builder::new()
        .prefix("drover-cp-")
        .tempdir()
        .expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data");
    std::fs::write(data.join("intent.key"), TEST_INTENT_KEY).expect("intent key");

    // A wrong --data is refused and left as it was.
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let wrong = elsewhere.path().join("data");
    for args in [
        &["token", "tls-1"][..],
        &["intent-key"],
        &[
            "nats-config",
            "--device",
            "tls-1",
            "--control-plane-password",
            "p",
        ],
    ] {
        let out = drover(&wrong, args);
        assert!(!out.status.success(), "{args:?}: {}", text(&out));
        assert!(
            text(&out).contains("holds no control-plane state") && text(&out).contains("init"),
            "{args:?}: {}",
            text(&out)
        );
        assert!(
            !wrong.join("secret.key").exists(),
            "{args:?} made no new key"
        );
    }

    let out = drover(
        &data,
        &["init", "--tls-name", "localhost", "--tls-name", "127.0.0.1"],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(TEST_INTENT_PUBLIC_KEY),
        "{}",
        text(&out)
    );
    let tls = data.join("tls");
    let (cert, key, ca) = (
        tls.join("server.pem"),
        tls.join("server.key"),
        tls.join("ca.pem"),
    );
    // nats-config --out replaces its file whole: a second run does not
    // duplicate the block, and the file (every device's password) is 0600.
    let include = data.join("nats-drover.conf");
    let args = [
        "nats-config",
        "--device",
        "tls-1",
        "--control-plane-password",
        "p",
        "--out",
        include.to_str().expect("utf-8"),
    ];
    for _ in 0..2 {
        let out = drover(&data, &args);
        assert!(out.status.success(), "{}", text(&out));
    }
    let block = std::fs::read_to_string(&include).expect("include file");
    assert_eq!(block.matches("authorization").count(), 1, "{block}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&include)
            .expect("meta")
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    // The token printed now is the one the server will accept.
    let out = drover(&data, &["token", "tls-1"]);
    assert!(out.status.success(), "{}", text(&out));
    let token = String::from_utf8_lossy(&out.stdout).trim().to_owned();

    let cp = ControlPlane::start_in(
        dir,
        &[
            "--agent-tls-cert",
            cert.to_str().expect("utf-8"),
            "--agent-tls-key",
            key.to_str().expect("utf-8"),
        ],
    );
    cp.apply_device("tls-1", &["tls"], json!({})).await;
    let url = cp.agent_url.replace("ws://127.0.0.1", "wss://localhost");
    assert!(url.starts_with("wss://localhost:"), "{url}");

    // check --connect: a wrong token is named as such, not "connection lost".
    let agent_dir = cp.dir.path().join("agent-tls-1");
    let bad = agent_dir.join("bad.toml");
    std::fs::create_dir_all(&agent_dir).expect("dir");
    write_config(
        &bad,
        "tls-1",
        &agent_dir.join("bad-state"),
        &websocket(&url, &"0".repeat(64), &ca),
    );
    let out = check_connect(&bad);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("refused this device's token") && text(&out).contains("drover token"),
        "{}",
        text(&out)
    );
    assert_eq!(
        text(&out)
            .lines()
            .filter(|l| l.contains("drover-agent:"))
            .count(),
        1,
        "one line with the cause chain: {}",
        text(&out)
    );

    // The right token, checked before the agent starts, as the README says.
    let good = agent_dir.join("good.toml");
    std::fs::write(
        &good,
        std::fs::read_to_string(&bad)
            .expect("config")
            .replace(&"0".repeat(64), &token),
    )
    .expect("config");
    let out = check_connect(&good);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("let in"), "{}", text(&out));
    let mut agent = AgentProcess::start_full(
        &agent_dir,
        "tls-1",
        &websocket(&url, &token, &ca),
        "",
        SIMULATE,
        "",
    );
    cp.wait_for_agents(&["tls-1"]).await;

    // get devices: online while connected, offline once the agent is gone.
    let devices = |cp: &ControlPlane| {
        let out = Command::new(bin("drover"))
            .args(["--server", &cp.api, "--token", &cp.token, "get", "devices"])
            .output()
            .expect("drover get devices");
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let table = devices(&cp);
    let row = table
        .lines()
        .find(|l| l.starts_with("tls-1 "))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains(" online "), "{table}");
    let header = table.lines().next().expect("header");
    assert_eq!(
        header.find("STATE"),
        row.find("online"),
        "columns line up:\n{table}"
    );
    // check --connect beside the running agent leaves its session alone:
    // the device stays online and the agent never had to reconnect.
    let out = check_connect(&good);
    assert!(out.status.success(), "{}", text(&out));
    let after = devices(&cp);
    assert!(
        after
            .lines()
            .any(|l| l.starts_with("tls-1 ") && l.contains(" online ")),
        "{after}"
    );
    eventually(
        Duration::from_secs(10),
        "the control plane to log the connection check",
        || async { cp.log().contains("connection check").then_some(()) },
    )
    .await;
    let agent_log = std::fs::read_to_string(agent_dir.join("agent.log")).expect("agent log");
    assert_eq!(
        agent_log.matches("connected to the control plane").count(),
        1,
        "the agent kept its one connection:\n{}",
        agent.log()
    );
    // -o wide adds the OS, architecture, transport, time zone and boot id.
    let out = Command::new(bin("drover"))
        .args(["--server", &cp.api, "--token", &cp.token])
        .args(["get", "devices", "-o", "wide"])
        .output()
        .expect("drover get devices -o wide");
    let wide = String::from_utf8_lossy(&out.stdout);
    assert!(
        wide.lines().next().is_some_and(|h| h.contains("TRANSPORT"))
            && wide
                .lines()
                .any(|l| l.starts_with("tls-1 ") && l.contains(" websocket ")),
        "{wide}"
    );
    agent.kill9();
    eventually(
        Duration::from_secs(20),
        "the device to show offline",
        || {
            let table = devices(&cp);
            async move {
                table
                    .lines()
                    .any(|l| l.starts_with("tls-1 ") && l.contains(" offline "))
                    .then_some(())
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_certificate_served_as_the_servers_own_gets_a_sentence_saying_what_to_do() {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let scratch = tempfile::tempdir().expect("tempdir");
    // What `openssl req -x509` makes by default: a self-signed CA:TRUE.
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("cert");
    let (cert_path, key_path) = (scratch.path().join("c.pem"), scratch.path().join("k.pem"));
    std::fs::write(&cert_path, cert.pem()).expect("cert");
    std::fs::write(&key_path, key.serialize_pem()).expect("key");
    let cp = ControlPlane::start(&[
        "--agent-tls-cert",
        cert_path.to_str().expect("utf-8"),
        "--agent-tls-key",
        key_path.to_str().expect("utf-8"),
    ]);
    let url = cp.agent_url.replace("ws://127.0.0.1", "wss://localhost");
    let config = scratch.path().join("agent.toml");
    write_config(
        &config,
        "ca-1",
        &scratch.path().join("state"),
        &websocket(&url, &cp.device_token("ca-1"), &cert_path),
    );
    let out = check_connect(&config);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("CaUsedAsEndEntity") && text(&out).contains("drover init --tls-name"),
        "{}",
        text(&out)
    );
}

#[test]
fn an_agent_without_a_usable_config_exits_78_so_its_unit_waits_instead_of_looping() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("agent.toml");
    // A token file that does not exist yet: the commonest first-hour mistake.
    std::fs::write(
        &config,
        format!(
            "device_id = \"pi-1\"\nintent_public_keys = [{}]\nstate_dir = {}\nstatus_socket = {}\n\
             [transport]\nkind = \"websocket\"\nserver_url = \"ws://127.0.0.1:9\"\ntoken_file = {}\n\
             [updater]\n{SIMULATE}\n",
            toml_string(TEST_INTENT_PUBLIC_KEY),
            toml_string(&dir.path().join("state").display().to_string()),
            toml_string(&dir.path().join("s.sock").display().to_string()),
            toml_string(&dir.path().join("agent.token").display().to_string()),
        ),
    )
    .expect("config");
    let out = Command::new(bin("drover-agent"))
        .arg("--config")
        .arg(&config)
        .arg("run")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(78), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or("");
    assert!(
        last.contains("agent.token") && last.contains("systemctl restart drover-agent"),
        "{stderr}"
    );
    // The unit the package installs does not restart it for that.
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../systemd/drover-agent.service"),
    )
    .expect("unit");
    assert!(unit.contains("RestartPreventExitStatus=78"), "{unit}");
}

/// The body of the README's `cat > FILE <<'YAML'` block.
fn readme_heredoc(file: &str) -> String {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .expect("README");
    let start = format!("cat > {file} <<'YAML'\n");
    let from = readme
        .find(&start)
        .unwrap_or_else(|| panic!("no {start:?} in README"))
        + start.len();
    let len = readme[from..].find("\nYAML\n").expect("end of the heredoc");
    format!("{}\n", &readme[from..from + len])
}

/// The README's "Using it" manifests apply as written with `drover apply -f`,
/// and its TaskRun finds the device it registers and completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_manifests_apply_as_written_and_the_run_completes() {
    let cp = ControlPlane::start(&[]);
    let cli = |args: &[&str]| {
        let out = Command::new(bin("drover"))
            .args(["--server", &cp.api, "--token", &cp.token])
            .args(args)
            .output()
            .expect("drover");
        assert!(out.status.success(), "drover {args:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // `apply -f -` reads the manifest from standard input.
    let mut apply = Command::new(bin("drover"))
        .args([
            "--server", &cp.api, "--token", &cp.token, "apply", "-f", "-",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("drover apply");
    std::io::Write::write_all(
        &mut apply.stdin.take().expect("stdin"),
        readme_heredoc("pi-kitchen.yaml").as_bytes(),
    )
    .expect("write");
    let out = apply.wait_with_output().expect("apply");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("device/pi-kitchen created"),
        "{}",
        text(&out)
    );
    let token = cp.device_token("pi-kitchen");
    let _agent = AgentProcess::start(
        &cp.dir.path().join("agent-pi-kitchen"),
        "pi-kitchen",
        &cp.agent_url,
        &token,
        "",
    );
    cp.wait_for_agents(&["pi-kitchen"]).await;
    let run = cp.dir.path().join("upgrade.yaml");
    std::fs::write(&run, readme_heredoc("upgrade.yaml")).expect("write");
    assert!(
        cli(&["apply", "-f", run.to_str().expect("utf-8")]).contains("upgrade-pi-kitchen"),
        "the README names the run upgrade-pi-kitchen"
    );
    let finished = cp
        .wait_run_finished("upgrade-pi-kitchen", Duration::from_secs(60))
        .await;
    assert_eq!(finished["status"]["phase"], "Complete", "{finished}");
    assert_eq!(finished["status"]["targets"], 1, "{finished}");
    // describe taskrun: a row per target with its state and last step.
    let described = cli(&["describe", "taskrun", "upgrade-pi-kitchen"]);
    let row = described
        .lines()
        .find(|l| l.starts_with("pi-kitchen "))
        .unwrap_or_else(|| panic!("{described}"));
    assert!(
        row.contains("yes") && row.contains("Succeeded") && row.contains("(Done)"),
        "{described}"
    );
    // -o yaml for scripts, as kubectl users expect.
    let yaml = cli(&["get", "taskrun", "upgrade-pi-kitchen", "-o", "yaml"]);
    assert!(
        yaml.contains("name: upgrade-pi-kitchen") && yaml.contains("phase: Complete"),
        "{yaml}"
    );
}
