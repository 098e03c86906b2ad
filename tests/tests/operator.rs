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

/// `drover serve` for agents over wss with this certificate and key.
fn serve_with_tls(dir: tempfile::TempDir, cert: &Path, key: &Path) -> ControlPlane {
    ControlPlane::start_in(
        dir,
        &[
            "--agent-tls-cert",
            cert.to_str().expect("utf-8"),
            "--agent-tls-key",
            key.to_str().expect("utf-8"),
        ],
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
    // duplicate the block, and the file is 0640, for nats-server's group.
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
        0o640
    );
    // The token printed now is the one the server will accept.
    let out = drover(&data, &["token", "--unregistered", "tls-1"]);
    assert!(out.status.success(), "{}", text(&out));
    let token = String::from_utf8_lossy(&out.stdout).trim().to_owned();

    let cp = serve_with_tls(dir, &cert, &key);
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

    // check --connect trusting another CA: the handshake's reason and what
    // to do about it, read from rustls's error (not from its text).
    let stranger = drover_tests::localhost_cert(&agent_dir);
    let untrusting = agent_dir.join("untrusting.toml");
    write_config(
        &untrusting,
        "tls-1",
        &agent_dir.join("untrusting-state"),
        &websocket(&url, &"0".repeat(64), &stranger.cert_path),
    );
    let out = check_connect(&untrusting);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("TLS handshake failed")
            && text(&out).contains("the agent's ca_file does not hold the CA"),
        "{}",
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
    // check --connect beside the running agent asks it (over its status
    // socket) rather than connecting as the device: the device stays
    // online and the agent never had to reconnect.
    let out = check_connect(&agent.config);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("the running agent is connected over websocket"),
        "{}",
        text(&out)
    );
    let after = devices(&cp);
    assert!(
        after
            .lines()
            .any(|l| l.starts_with("tls-1 ") && l.contains(" online ")),
        "{after}"
    );
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

/// The command lines of the README's code blocks marked
/// `<!-- walk-through -->`, in order: continuation lines joined, comments
/// and heredoc bodies dropped, the shell's `sudo` left out.
fn readme_commands() -> Vec<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .expect("README");
    let mut commands = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "<!-- walk-through -->" {
            continue;
        }
        assert_eq!(
            lines.next().map(str::trim),
            Some("```sh"),
            "a marked block is sh"
        );
        let mut pending = String::new();
        let mut heredoc: Option<String> = None;
        for line in lines.by_ref() {
            if line.trim() == "```" {
                break;
            }
            if let Some(end) = &heredoc {
                if line == end {
                    heredoc = None;
                }
                continue;
            }
            if let Some((_, word)) = line.split_once("<<'") {
                heredoc = Some(word.trim_end_matches('\'').to_owned());
                continue;
            }
            let code = match line.find(" #") {
                Some(at) => &line[..at],
                None if line.trim_start().starts_with('#') => "",
                None => line,
            };
            pending.push_str(code.trim_end().trim_end_matches('\\'));
            pending.push(' ');
            if !code.trim_end().ends_with('\\') {
                let command = pending.split_whitespace().collect::<Vec<_>>().join(" ");
                let command = command.strip_prefix("sudo ").unwrap_or(&command).to_owned();
                // Drover's own commands; the device's apt and systemctl
                // lines are the package's business (tests/tests/package.rs,
                // the VM suite).
                if command.starts_with("drover ") || command.starts_with("drover-agent ") {
                    commands.push(command);
                }
                pending.clear();
            }
        }
    }
    assert!(
        !commands.is_empty(),
        "no block marked <!-- walk-through --> in the README"
    );
    commands
}

/// The README's commands in order, taken one at a time: each must be the one
/// the walk-through expects next, so the README cannot drift from what runs.
struct Readme(std::vec::IntoIter<String>);

impl Readme {
    fn next(&mut self, starts: &str) -> Vec<String> {
        let command = self
            .0
            .next()
            .unwrap_or_else(|| panic!("the README has no command {starts:?} left"));
        assert!(
            command.starts_with(starts),
            "the README's next command is {command:?}, the walk-through expects {starts:?}"
        );
        command.split(' ').map(str::to_owned).collect()
    }
}

/// The README's first run, step by step as written, every `drover` and
/// `drover-agent` command taken from the README's marked blocks and run as
/// written (its data directory, names and ports mapped to this test's), on
/// a fresh control plane with TLS on the API and on the agents' port:
/// `init` with TLS names, `serve` with the certificate it made, a CLI
/// context trusting `tls/ca.pem` with the token in a file, the device's
/// one file from `enrollment-tokens create --agent-config`, its agent over
/// wss asking to join, `devices pending` and `accept`, `check --connect`; the README's TaskRun dry run, apply, `runs
/// watch`, `describe` of the run and the device, `get` in each form and
/// `-w`; a 200 MB package uploaded with the CLI's memory under 64 MiB; the
/// README's Secret, Deployment and TaskSchedule dry run and applied; the
/// Deployment canceled (the device away, so there is something to cancel)
/// and watched to Canceled; then every kind deleted: deployment, taskrun,
/// taskschedule, secret, package, device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_walk_through_works_as_written() {
    let mut readme = Readme(readme_commands().into_iter());
    let dir = ControlPlane::prepare();
    let data = dir.path().join("data");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).expect("work dir");
    // The README's names and places, as this test has them.
    let data_text = data.display().to_string();
    let map = |words: &[String], api: &str| -> Vec<String> {
        words
            .iter()
            .map(|w| {
                w.replace("/var/lib/drover", &data_text)
                    .replace("drover.example.org:7180", api)
                    .replace("drover.example.org", "localhost")
                    .replace("10.0.0.5", "127.0.0.1")
            })
            .collect()
    };

    let init = map(&readme.next("drover --data /var/lib/drover init"), "");
    let out = Command::new(bin("drover"))
        .args(&init[1..])
        .env_remove("DROVER_TOKEN")
        .output()
        .expect("drover init");
    assert!(out.status.success(), "{init:?}: {}", text(&out));
    assert!(text(&out).contains("server.pem"), "{}", text(&out));
    let tls = data.join("tls");
    let ca = tls.join("ca.pem");

    // serve as the README has it; this test's harness picks the ports.
    let serve = map(&readme.next("drover --data /var/lib/drover serve"), "");
    let mut extra = Vec::new();
    let mut words = serve[4..].iter();
    while let Some(word) = words.next() {
        match word.as_str() {
            "--listen" | "--agent-listen" => {
                words.next();
            }
            other => extra.push(other.to_owned()),
        }
    }
    for flag in ["--api-tls-cert", "--agent-tls-cert"] {
        assert!(
            extra.iter().any(|w| w == flag),
            "the README serves the API and the agents over TLS ({flag}): {serve:?}"
        );
    }
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let mut cp = ControlPlane::start_in(dir, &extra);
    // The harness's own requests go over https too, trusting init's CA.
    cp.trust_api(&ca);
    let api = format!("localhost:{}", cp.api_port());
    let wss = cp.agent_url.replace("ws://127.0.0.1", "wss://localhost");
    // The CLI as the README runs it: the context it made, nothing from the
    // environment but the data directory, in a working directory of its own.
    let config = work.join("drover-config.toml");
    let run = |words: &[String]| {
        let words = map(words, &api);
        let (args, into) = match words.iter().position(|w| w == ">") {
            Some(at) => (&words[1..at], Some(work.join(&words[at + 1]))),
            None => (&words[1..], None),
        };
        let out = Command::new(bin(&words[0]))
            .args(args)
            .current_dir(&work)
            .env_remove("DROVER_SERVER")
            .env_remove("DROVER_TOKEN")
            .env_remove("DROVER_CA_FILE")
            .env_remove("DROVER_CONTEXT")
            .env("DROVER_DATA", &data)
            // Never the real home's contexts.
            .env("DROVER_CONFIG", &config)
            .output()
            .expect("run the README's command");
        if let Some(into) = into {
            std::fs::write(into, &out.stdout).expect("redirect");
        }
        out
    };
    let cli = |words: Vec<String>| {
        let out = run(&words);
        assert!(out.status.success(), "{words:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let drover = |args: &[&str]| {
        let mut words = vec!["drover".to_owned()];
        words.extend(args.iter().map(|a| (*a).to_owned()));
        words
    };

    // The operator's context: https, init's CA, the token file.
    cli(readme.next("drover config set-context prod"));
    let context = std::fs::read_to_string(&config).expect("the context file");
    assert!(
        context.contains(&format!("https://{api}")) && !context.contains(&cp.token),
        "the context keeps the server and the token file, never the token: {context}"
    );
    cli(readme.next("drover get devices"));

    // The device's one file, made with its enrollment token: the README's
    // agents' address is this test's.
    let create: Vec<String> = readme
        .next("drover enrollment-tokens create kitchen")
        .into_iter()
        .map(|w| w.replace("wss://drover.example.org:7181", &wss))
        .collect();
    cli(create);
    let made = std::fs::read_to_string(work.join("agent.toml")).expect("the agent config");
    for expected in [
        "device_id = \"pi-kitchen\"",
        TEST_INTENT_PUBLIC_KEY,
        "enrollment_token = \"",
        "-----BEGIN CERTIFICATE-----",
        &wss,
    ] {
        assert!(made.contains(expected), "{expected}: {made}");
    }

    // On the device: that file alone, with this test's state directory and
    // socket, and simulate mode (this is the test's own machine).
    let device = cp.dir.path().join("device");
    std::fs::create_dir_all(&device).expect("device dir");
    let installed = device.join("agent.toml");
    assert!(made.contains("mode = \"upgrade\""), "{made}");
    std::fs::write(
        &installed,
        format!(
            "state_dir = {}\nstatus_socket = {}\n{}\n[assessment]\nevery_minutes = 0\n",
            toml_string(&device.join("state").display().to_string()),
            toml_string(&device.join("status.sock").display().to_string()),
            made.replace("mode = \"upgrade\"", SIMULATE)
        ),
    )
    .expect("install the config");
    let mut agent = AgentProcess::start_written(&device, &installed);
    // It asks to join, and waits for the operator.
    let pending = readme.next("drover devices pending");
    eventually(
        Duration::from_secs(30),
        "the device asks to join",
        || async { cli(pending.clone()).contains("pi-kitchen").then_some(()) },
    )
    .await;
    cli(readme.next("drover devices accept pi-kitchen"));
    cp.wait_for_agents(&["pi-kitchen"]).await;
    // `check --connect` beside the running agent: its database is in use,
    // not damaged (a fresh clone's CI once found the check calling it so).
    let check = readme.next("drover-agent check --connect");
    let mut words = vec![check[0].clone(), "--config".into()];
    words.push(agent.config.display().to_string());
    words.extend(check[1..].iter().cloned());
    let checked = run(&words);
    assert!(checked.status.success(), "{}", text(&checked));
    assert!(
        text(&checked).contains("the agent is running"),
        "{}",
        text(&checked)
    );

    // The README's TaskRun: a dry run stores nothing and names the target.
    std::fs::write(work.join("upgrade.yaml"), readme_heredoc("upgrade.yaml")).expect("write");
    let dry = cli(readme.next("drover apply -f upgrade.yaml --dry-run"));
    assert!(
        dry.contains("taskrun/upgrade-pi-kitchen") && dry.contains("pi-kitchen"),
        "{dry}"
    );
    assert_eq!(
        cp.get_status("/taskruns/upgrade-pi-kitchen").await,
        404,
        "a dry run stores nothing"
    );
    assert!(
        cli(readme.next("drover apply -f upgrade.yaml")).contains("upgrade-pi-kitchen"),
        "the README names the run upgrade-pi-kitchen"
    );
    let watched = cli(readme.next("drover runs watch upgrade-pi-kitchen"));
    assert!(watched.contains("Complete"), "{watched}");
    let described = cli(readme.next("drover describe taskrun upgrade-pi-kitchen"));
    let row = described
        .lines()
        .find(|l| l.starts_with("pi-kitchen "))
        .unwrap_or_else(|| panic!("{described}"));
    assert!(
        row.contains("yes") && row.contains(" succeeded ") && row.contains("(Done)"),
        "{described}"
    );
    let described = cli(readme.next("drover describe device pi-kitchen"));
    assert!(described.contains("upgrade-pi-kitchen"), "{described}");
    // The agent here simulates, and a simulation keeps no output: the
    // upgrade's call is written where the agent keeps calls
    // (scenarios.rs and apt_upgrade.rs fetch large and real ones).
    let job = cp.targets("upgrade-pi-kitchen").await[0]["status"]["jobId"]
        .as_str()
        .expect("the run's job")
        .to_owned();
    agent.stage_call(&job, 0, "Setting up hello (2.10-3) ...\n", "");
    let fetched = cli(readme.next("drover logs pi-kitchen"));
    assert!(
        fetched.starts_with(&format!("== job {job}, step full-upgrade"))
            && fetched.ends_with("Setting up hello (2.10-3) ...\n"),
        "{fetched}"
    );
    let listed = cli(readme.next("drover get taskruns"));
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("upgrade-pi-kitchen ") && l.contains("Complete")),
        "{listed}"
    );
    let yaml = cli(readme.next("drover get taskrun upgrade-pi-kitchen -o yaml"));
    assert!(
        yaml.contains("name: upgrade-pi-kitchen") && yaml.contains("phase: Complete"),
        "{yaml}"
    );
    let devices = cli(readme.next("drover get devices -o wide"));
    assert!(
        devices.lines().any(|l| l.starts_with("pi-kitchen ")
            && l.contains("online")
            && l.contains("websocket")),
        "{devices}"
    );
    let fleet = cli(readme.next("drover patch-status"));
    assert!(
        fleet.contains("devices:") && fleet.contains("never assessed:"),
        "{fleet}"
    );
    // `-w` runs until stopped: the table comes first.
    let watch = map(&readme.next("drover get taskruns -w"), &api);
    let mut watching = Command::new(bin(&watch[0]))
        .args(&watch[1..])
        .env("DROVER_CONFIG", &config)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("drover get -w");
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(watching.stdout.take().expect("stdout")),
        &mut first,
    )
    .expect("a line");
    let _ = watching.kill();
    let _ = watching.wait();
    assert!(
        first.starts_with("NAME"),
        "the table's header first: {first:?}"
    );

    // The README's package: 200 MB, streamed over https, the CLI's memory
    // flat.
    let deb = drover_tests::big_deb(&work, "kiosk-app", "2.1-1", 200);
    let size = std::fs::metadata(&deb).expect("deb").len();
    let upload = map(
        &readme.next("drover packages upload ./kiosk-app_2.1-1_all.deb"),
        &api,
    );
    let mut child = Command::new(bin(&upload[0]))
        .args(&upload[1..])
        .current_dir(&work)
        .env("DROVER_CONFIG", &config)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("drover packages upload");
    let pid = child.id();
    let mut peak = 0;
    while child.try_wait().expect("wait").is_none() {
        peak = peak.max(drover_tests::peak_kib(pid).unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let out = child.wait_with_output().expect("output");
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("({size} bytes,")),
        "the whole file: {}",
        text(&out)
    );
    println!("uploaded {size} bytes over https; the CLI's peak RSS {peak} KiB");
    assert!(
        peak > 0 && peak < 64 * 1024,
        "the CLI's peak RSS was {peak} KiB for a {size}-byte upload"
    );
    let packages = cli(readme.next("drover get packages"));
    assert!(packages.contains("kiosk-app_2.1-1_all"), "{packages}");

    // The README's Secret, Deployment and TaskSchedule. The device is away,
    // so the deployment's job waits for it and there is something to cancel.
    // The schedule's tick is moved 12 hours from now, so it cannot fall
    // inside this test.
    let hour = (jiff::Timestamp::now().as_second() / 3600 + 12) % 24;
    std::fs::write(
        work.join("fleet.yaml"),
        readme_heredoc("fleet.yaml")
            .replace("daily: \"03:00\"", &format!("daily: \"{hour:02}:00\"")),
    )
    .expect("write");
    agent.kill9();
    let dry = cli(readme.next("drover apply -f fleet.yaml --dry-run"));
    assert!(
        dry.contains("secret/kiosk")
            && dry.contains("deployment/kiosk-rollout")
            && dry.contains("taskschedule/nightly-upgrade")
            && dry.contains("pi-kitchen"),
        "{dry}"
    );
    for path in [
        "/deployments/kiosk-rollout",
        "/taskschedules/nightly-upgrade",
    ] {
        assert_eq!(
            cp.get_status(path).await,
            404,
            "a dry run stores nothing: {path}"
        );
    }
    let applied = cli(readme.next("drover apply -f fleet.yaml"));
    for created in [
        "secret/kiosk created",
        "deployment/kiosk-rollout created",
        "taskschedule/nightly-upgrade created",
    ] {
        assert!(applied.contains(created), "{applied}");
    }
    // It starts: its one target chosen, waiting for the device (a
    // deployment releases a job to a device that is connected).
    eventually(
        Duration::from_secs(30),
        "the deployment started with the device as its target",
        || async {
            let page = cp.get("/deployments/kiosk-rollout/targets").await;
            let target = page["items"].as_array()?.first()?.clone();
            (target["device"] == "pi-kitchen").then_some(())
        },
    )
    .await;
    let described = cli(readme.next("drover describe deployment kiosk-rollout"));
    assert!(described.contains("kiosk-rollout"), "{described}");
    let schedules = cli(readme.next("drover get taskschedules"));
    assert!(schedules.contains("nightly-upgrade"), "{schedules}");

    // Cancel: the device comes back to the cancel order, never the job.
    let canceled = cli(readme.next("drover cancel deployment kiosk-rollout"));
    assert!(canceled.contains("cancel requested"), "{canceled}");
    agent.restart();
    let watched = run(&readme.next("drover runs watch kiosk-rollout"));
    assert!(
        !watched.status.success(),
        "a canceled deployment is not Complete"
    );
    assert!(text(&watched).contains("Canceled"), "{}", text(&watched));

    // Delete every kind; the device once its agent is gone.
    for (command, said) in [
        ("drover delete deployment kiosk-rollout", "deleted"),
        ("drover delete taskrun upgrade-pi-kitchen", "deleted"),
        ("drover delete taskschedule nightly-upgrade", "deleted"),
        ("drover delete secret kiosk", "deleted"),
        ("drover delete package kiosk-app_2.1-1_all", "deleted"),
    ] {
        let out = cli(readme.next(command));
        assert!(out.contains(said), "{command}: {out}");
    }
    agent.kill9();
    let deleted = cli(readme.next("drover delete device pi-kitchen"));
    assert!(deleted.contains("device/pi-kitchen deleted"), "{deleted}");
    for (kind, name) in [
        ("deployment", "kiosk-rollout"),
        ("taskrun", "upgrade-pi-kitchen"),
        ("taskschedule", "nightly-upgrade"),
        ("package", "kiosk-app_2.1-1_all"),
        ("device", "pi-kitchen"),
    ] {
        let out = run(&drover(&["get", kind, name]));
        assert_eq!(out.status.code(), Some(1), "{kind} {name}: {}", text(&out));
    }
    assert_eq!(cp.get("/secrets").await, json!([]), "the secret is gone");
    let left: Vec<String> = readme.0.collect();
    assert!(
        left.is_empty(),
        "README commands the walk-through does not run: {left:?}"
    );
}

/// Under systemd the agent's lines carry their syslog priority for journald
/// (`<4>` a warning, `<6>` info) and no timestamp of their own, and keep
/// their fields; anywhere else they are the usual timestamped lines. The
/// test plays systemd: stderr is a file, and JOURNAL_STREAM names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_systemd_the_agents_lines_carry_their_priority_for_journald() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("agent.toml");
    // Nothing listens on port 9: the agent warns that it cannot connect.
    std::fs::write(
        &config,
        format!(
            "device_id = \"pi-journal\"\nintent_public_keys = [{}]\nstate_dir = {}\nstatus_socket = {}\n\
             [transport]\nkind = \"websocket\"\nserver_url = \"ws://127.0.0.1:9\"\ntoken = \"t\"\n\
             backoff_max_seconds = 1\n[updater]\n{SIMULATE}\n",
            toml_string(TEST_INTENT_PUBLIC_KEY),
            toml_string(&dir.path().join("state").display().to_string()),
            toml_string(&dir.path().join("s.sock").display().to_string()),
        ),
    )
    .expect("config");
    let run = |name: &str, journal: bool| {
        let log = dir.path().join(name);
        let file = std::fs::File::create(&log).expect("log");
        let meta = file.metadata().expect("metadata");
        let mut command = Command::new(bin("drover-agent"));
        command
            .arg("--config")
            .arg(&config)
            .arg("run")
            .env_remove("JOURNAL_STREAM")
            .env_remove("RUST_LOG")
            // No journal socket: lines go to the stream.
            .env("DROVER_JOURNAL_SOCKET", dir.path().join("no-journal"))
            .stderr(file);
        if journal {
            command.env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()));
        }
        (command.spawn().expect("agent"), log)
    };
    for journal in [true, false] {
        let (mut child, log) = run(if journal { "journal.log" } else { "plain.log" }, journal);
        let text = eventually(Duration::from_secs(30), "a warning", || async {
            let text = std::fs::read_to_string(&log).ok()?;
            text.lines().any(|l| l.contains("WARN")).then_some(text)
        })
        .await;
        let _ = child.kill();
        let _ = child.wait();
        let warning = text.lines().find(|l| l.contains("WARN")).expect("warning");
        let info = text.lines().find(|l| l.contains("INFO")).expect("info");
        if journal {
            assert!(warning.starts_with("<4> WARN "), "{text}");
            assert!(info.starts_with("<6> INFO "), "{text}");
            assert!(
                text.lines().all(|l| l.starts_with('<')),
                "every line has a priority: {text}"
            );
        } else {
            assert!(
                warning.starts_with("20") && !warning.starts_with('<'),
                "a timestamp, no priority: {text}"
            );
        }
        assert!(!text.contains('\u{1b}'), "no colour in a file: {text}");
    }
    // Issue 56, item 7: with the journal's socket there, each line is a
    // native entry (its level as PRIORITY, the whole line as MESSAGE, the
    // agent's name as SYSLOG_IDENTIFIER) and the stream gets nothing.
    // (A job's lines carry JOB_ID and STEP as fields: agent-core's
    // journal::tests, and the VM's agent-restart scenario under systemd.)
    let socket = dir.path().join("journal.socket");
    let journal = std::os::unix::net::UnixDatagram::bind(&socket).expect("bind");
    journal
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let stream = dir.path().join("stream.log");
    let file = std::fs::File::create(&stream).expect("log");
    let meta = file.metadata().expect("metadata");
    let mut child = Command::new(bin("drover-agent"))
        .arg("--config")
        .arg(&config)
        .arg("run")
        .env_remove("RUST_LOG")
        .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .env("DROVER_JOURNAL_SOCKET", &socket)
        .stderr(file)
        .spawn()
        .expect("agent");
    let mut warning = None;
    let mut buf = vec![0u8; 65_536];
    for _ in 0..200 {
        let Ok(n) = journal.recv(&mut buf) else { break };
        let entry = String::from_utf8_lossy(&buf[..n]).into_owned();
        if entry.contains("PRIORITY=4\n") {
            warning = Some(entry);
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let warning = warning.expect("a warning entry on the journal's socket");
    assert!(
        warning.contains("SYSLOG_IDENTIFIER=drover-agent\n"),
        "{warning}"
    );
    assert!(warning.contains("MESSAGE=WARN "), "{warning}");
    assert_eq!(
        std::fs::read_to_string(&stream).expect("stream"),
        "",
        "the stream got lines the journal took"
    );
}

/// `drover get taskruns -w` prints the table once, then a row each time a
/// run changes, as kubectl does: the run is seen going to Complete without
/// asking again. With -o json it prints each changed object on one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_watch_prints_a_row_for_every_change() {
    let cp = ControlPlane::start(&[]);
    cp.apply_device("pi-watch", &["production"], json!({}))
        .await;
    let _agent = AgentProcess::start(
        &cp.dir.path().join("pi-watch"),
        "pi-watch",
        &cp.agent_url,
        &cp.device_token("pi-watch"),
        "",
    );
    cp.wait_for_agents(&["pi-watch"]).await;
    let watch = |output: &str| {
        let mut child = Command::new(bin("drover"))
            .args([
                "--server", &cp.api, "--token", &cp.token, "get", "taskruns", "-w", "-o", output,
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("drover get -w");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        (child, rx)
    };
    let (mut table, table_lines) = watch("table");
    let (mut json_watch, json_lines) = watch("json");
    cp.apply_upgrade_run("watched", "production", 600).await;
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !seen.iter().any(|l: &String| l.contains("Complete")) {
        assert!(std::time::Instant::now() < deadline, "{seen:?}");
        if let Ok(line) = table_lines.recv_timeout(Duration::from_secs(1)) {
            seen.push(line);
        }
    }
    let _ = table.kill();
    assert_eq!(seen[0].split_whitespace().next(), Some("NAME"), "{seen:?}");
    assert_eq!(
        seen.iter().filter(|l| l.starts_with("NAME")).count(),
        1,
        "one header: {seen:?}"
    );
    let rows: Vec<&String> = seen.iter().filter(|l| l.starts_with("watched ")).collect();
    assert!(rows.len() >= 2, "the run before and at Complete: {seen:?}");
    assert!(
        rows.windows(2).all(|w| w[0] != w[1]),
        "a row only on a change: {seen:?}"
    );
    // The JSON watch saw the same run complete, one object per line.
    let mut objects = Vec::new();
    while let Ok(line) = json_lines.recv_timeout(Duration::from_secs(3)) {
        let object: serde_json::Value =
            serde_json::from_str(&line).expect("one JSON object a line");
        let done = object["status"]["phase"] == "Complete";
        objects.push(object);
        if done {
            break;
        }
    }
    let _ = json_watch.kill();
    assert_eq!(
        objects.last().map(|o| o["status"]["phase"].clone()),
        Some(json!("Complete")),
        "{objects:?}"
    );
}
