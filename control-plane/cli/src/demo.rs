//! `drover demo`: the whole system on one machine with nothing to install. A
//! control plane in a temporary directory, three agents as real processes over
//! WebSocket in simulate mode (one of them a canary), and a TaskRun followed
//! to its end: the canary finishes before the others are released.

use crate::client::ApiClient;
use crate::serve::{self, ServeOptions};
use agent_core::out;
use anyhow::{Context, Result, bail};
use drover_api::jobs::StepState;
use drover_api::runs::{Phase, RunTargets, TaskRun};
use drover_model::DeviceId;
use drover_model::model::JobStatus;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

pub struct DemoOptions {
    pub agents: usize,
    pub keep: bool,
    pub agent_bin: Option<PathBuf>,
    /// Run the real upgrade, each agent inside its own disposable Debian root,
    /// instead of simulating it on this machine.
    pub upgrade: bool,
}

const RUN: &str = "demo-upgrade";
const GROUP: &str = "demo";

/// Finds drover-agent: given, next to this binary, or on PATH.
fn find_agent_binary(given: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(path) = given {
        return Ok(path);
    }
    if let Ok(exe) = std::env::current_exe()
        && let Some(sibling) = exe.parent().map(|d| d.join("drover-agent"))
        && sibling.exists()
    {
        return Ok(sibling);
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let candidate = dir.join("drover-agent");
            if candidate.exists() {
                return Ok(candidate);
            }
        }
    }
    bail!("drover-agent not found next to drover or on PATH; build both with `cargo build --bins`")
}

fn toml_string(value: &str) -> String {
    // A JSON string literal is a valid TOML basic string.
    serde_json::to_string(value).unwrap_or_else(|_| "\"\"".into())
}

fn agent_config(
    dir: &Path,
    device: &str,
    agent_addr: &str,
    token: &str,
    intent_key: &str,
    root: Option<&Path>,
) -> String {
    let updater = match root {
        Some(root) => format!(
            "mode = \"upgrade\"\nroot = {}",
            toml_string(&root.display().to_string())
        ),
        None => "mode = \"simulate\"".to_owned(),
    };
    format!(
        "device_id = {device}\nintent_public_keys = [{key}]\nstate_dir = {state}\nstatus_socket = {socket}\n\n\
         [transport]\nkind = \"websocket\"\nserver_url = {url}\ntoken = {token}\n\
         heartbeat_seconds = 5\nbackoff_max_seconds = 5\n\n\
         [updater]\n{updater}\nmin_free_mib = 50\n",
        device = toml_string(device),
        key = toml_string(intent_key),
        state = toml_string(&dir.join("state").display().to_string()),
        socket = toml_string(&dir.join("status.sock").display().to_string()),
        url = toml_string(&format!("ws://{agent_addr}")),
        token = toml_string(token),
    )
}

struct Agents(Vec<Child>);

impl Drop for Agents {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for child in &mut self.0 {
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub async fn run(options: DemoOptions) -> Result<bool> {
    if !Path::new("/usr/bin/apt-get").exists() {
        bail!(
            "this machine has no apt-get: the demo's agents simulate a full system upgrade with \
             `apt-get -s full-upgrade`, which needs a Debian-based system (Debian, Raspberry Pi OS, Ubuntu)"
        );
    }
    if options.agents == 0 {
        bail!("the demo needs at least one agent");
    }
    let agent_bin = find_agent_binary(options.agent_bin)?;
    if options.upgrade {
        check_sandbox_tools()?;
    }
    let dir = tempfile::Builder::new().prefix("drover-demo-").tempdir()?;
    out!("demo directory: {}", dir.path().display());
    let shutdown = CancellationToken::new();
    let started = serve::start(demo_serve_options(dir.path())?, shutdown.clone()).await?;
    out!(
        "control plane: API http://{}, agents ws://{}",
        started.api_addr,
        started.agent_addr
    );
    let client = ApiClient::new(
        &format!("http://{}", started.api_addr),
        started.secrets.operator_token(),
        None,
    )?;

    let devices: Vec<String> = (1..=options.agents)
        .map(|i| format!("device-{i}"))
        .collect();
    register(&client, &devices).await?;
    out!(
        "devices: {} in group {GROUP:?}; {} labelled canary=true",
        devices.join(", "),
        devices[0]
    );

    let sandboxes = sandboxes(options.upgrade, &devices);
    let intent_key =
        drover_server::auth::IntentSigner::load_or_create(&dir.path().join("control-plane"))?
            .public_key();
    let agents = start_agents(
        dir.path(),
        &devices,
        &started,
        &agent_bin,
        &intent_key,
        &sandboxes,
    )?;
    out!(
        "agents: {} drover-agent processes started (simulate mode)",
        devices.len()
    );
    wait_for_agents(&client, &devices, dir.path()).await?;

    let result: drover_api::changes::Changed = client
        .post(
            "/apply",
            &json!({
                "apiVersion": drover_rules::records::API_VERSION, "kind": "TaskRun",
                "metadata": {"name": RUN},
                "spec": {"allowedGroups": [GROUP], "targetSelector": {"matchLabels": {}},
                         "deadlineSeconds": 600, "systemUpgradeV1": {}}
            }),
        )
        .await?;
    out!(
        "taskrun {RUN} applied (uid {})",
        result.uid.as_deref().unwrap_or("?")
    );
    let complete = follow(&client, RUN).await?;

    report(&client, &devices, &sandboxes).await?;
    drop(agents);
    shutdown.cancel();
    for task in started.tasks {
        let _ = task.await;
    }
    if options.keep {
        let kept = dir.keep();
        out!("kept the demo directory {}", kept.display());
    }
    out!(
        "\nrun {RUN} is {}",
        if complete { "Complete" } else { "not Complete" }
    );
    Ok(complete)
}

/// The control plane the demo serves: on loopback, in `dir`, passing
/// often so the run moves quickly.
fn demo_serve_options(dir: &Path) -> Result<ServeOptions> {
    Ok(ServeOptions {
        data: dir.join("control-plane"),
        listen: "127.0.0.1:0".parse()?,
        agent_listen: "127.0.0.1:0".parse()?,
        agent_tls: None,
        api_tls: None,
        api_allow_plaintext: false,
        ack_timeout: Duration::from_secs(60),
        pass_interval: Duration::from_millis(250),
        operator_token: None,
        nats: None,
        nats_authority: None,
        nats_logins_per_second: transport_nats::spread::DEFAULT_LOGINS_PER_SECOND,
        store_on_nats: false,
        max_agent_connections: 1000,
        mqtt: None,
        mqtt_request_queue: transport_mqtt::server::REQUEST_QUEUE,
        download_listen: None,
        download_url: None,
        offline_alert: Duration::from_secs(3600),
        patch_alerts: drover_rules::patch::AlertLimits {
            security_after: jiff::SignedDuration::from_hours(7 * 24),
            reboot_after: jiff::SignedDuration::from_hours(24),
        },
        uploads: drover_server::packages::UploadLimits::default(),
        audit_retention: std::time::Duration::from_secs(400 * 86_400),
        history: Default::default(),
        enrollment_limits: (
            drover_server::enroll_limits::PER_ADDRESS_PER_MINUTE,
            drover_server::enroll_limits::PER_TOKEN_PER_MINUTE,
        ),
    })
}

/// The demo's devices, in its group; the first labelled canary.
async fn register(client: &ApiClient, devices: &[String]) -> Result<()> {
    for (i, device) in devices.iter().enumerate() {
        let mut labels = BTreeMap::new();
        if i == 0 {
            labels.insert("canary", "true");
        }
        client
            .post::<drover_api::changes::Changed>(
                "/apply",
                &json!({
                    "apiVersion": drover_rules::records::API_VERSION, "kind": "Device",
                    "metadata": {"name": device, "labels": labels},
                    "spec": {"groups": [GROUP]}
                }),
            )
            .await?;
    }
    Ok(())
}

/// One disposable Debian root per device for the upgrade demo (none
/// otherwise), with the demo's packages 1.0 installed and 2.0 published.
fn sandboxes(upgrade: bool, devices: &[String]) -> Vec<drover_sandbox::Sandbox> {
    if upgrade {
        out!(
            "preparing {} disposable Debian roots (debootstrap the first time, about a minute; cached in {})",
            devices.len(),
            drover_sandbox::cache_dir().display()
        );
        tokio::task::block_in_place(|| {
            devices
                .iter()
                .map(|_| {
                    let sandbox = drover_sandbox::Sandbox::new();
                    sandbox.publish(&demo_packages("1.0"));
                    sandbox.install(&["drover-demo-tool", "drover-demo-conf"]);
                    sandbox.publish(&demo_packages("2.0"));
                    sandbox
                })
                .collect::<Vec<_>>()
        })
    } else {
        Vec::new()
    }
}

/// One agent process per device, in simulate mode (on its root, for the
/// upgrade demo).
fn start_agents(
    dir: &Path,
    devices: &[String],
    started: &serve::Started,
    agent_bin: &Path,
    intent_key: &str,
    sandboxes: &[drover_sandbox::Sandbox],
) -> Result<Agents> {
    let mut agents = Agents(Vec::new());
    for (i, device) in devices.iter().enumerate() {
        let agent_dir = dir.join("agents").join(device);
        std::fs::create_dir_all(&agent_dir)?;
        let token = started
            .secrets
            .device_token(&DeviceId::new(device.clone())?);
        let config = agent_dir.join("agent.toml");
        let root = sandboxes.get(i).map(|s| s.root.as_path());
        std::fs::write(
            &config,
            agent_config(
                &agent_dir,
                device,
                &started.agent_addr.to_string(),
                &token,
                intent_key,
                root,
            ),
        )?;
        let log = std::fs::File::create(agent_dir.join("agent.log"))?;
        let child = Command::new(agent_bin)
            .arg("--config")
            .arg(&config)
            .arg("run")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", agent_bin.display()))?;
        agents.0.push(child);
    }
    Ok(agents)
}

/// The run's final status, each device's steps and, for the upgrade demo,
/// the packages each root now has.
async fn report(
    client: &ApiClient,
    devices: &[String],
    sandboxes: &[drover_sandbox::Sandbox],
) -> Result<()> {
    let run: TaskRun = client.get(&format!("/taskruns/{RUN}")).await?;
    out!(
        "\nfinal status of {RUN}:\n{}",
        serde_json::to_string_pretty(&run.status)?
    );
    let targets: RunTargets = client.get(&format!("/taskruns/{RUN}/targets")).await?;
    out!("\nsteps on each device:");
    for item in targets.items {
        // The agent's own report of a job, from the API's copy of its
        // status (the same fields the agent sent).
        let status = item
            .status
            .map(serde_json::to_value)
            .transpose()?
            .map(serde_json::from_value::<JobStatus>)
            .transpose();
        match status {
            Ok(Some(status)) => out!(
                "{}",
                agent_core::report::format_job(&status).trim_end_matches('\n')
            ),
            _ => out!("{}: no status", item.device),
        }
    }
    for (device, sandbox) in devices.iter().zip(sandboxes) {
        let versions: Vec<String> = ["drover-demo-tool", "drover-demo-conf"]
            .iter()
            .map(|p| {
                format!(
                    "{p} {}",
                    sandbox.package(p).unwrap_or_else(|| "missing".into())
                )
            })
            .collect();
        out!("{device} root now has: {}", versions.join(", "));
    }
    Ok(())
}

/// The packages of the upgrade demo: a tool and a conffile, 1.0 then 2.0.
fn demo_packages(version: &str) -> Vec<drover_sandbox::Pkg> {
    vec![
        drover_sandbox::Pkg::new("drover-demo-tool", version),
        drover_sandbox::Pkg::new("drover-demo-conf", version).conffile(
            "/etc/drover-demo/demo.conf",
            &format!("setting = {version}\n"),
        ),
    ]
}

/// The upgrade demo runs apt in chroots: it needs root and the root-making tools.
fn check_sandbox_tools() -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(1)
        != 0
    {
        bail!("drover demo --upgrade needs root: it runs apt inside disposable chroots");
    }
    for (tool, package) in [
        ("debootstrap", "debootstrap"),
        ("dpkg-scanpackages", "dpkg-dev"),
        ("chroot", "coreutils"),
    ] {
        let found = std::env::var_os("PATH")
            .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(tool).exists()));
        if !found {
            bail!("drover demo --upgrade needs {tool}: apt-get install {package}");
        }
    }
    Ok(())
}

async fn wait_for_agents(client: &ApiClient, devices: &[String], dir: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listed: Vec<drover_api::devices::Device> = client
            .list("/devices")
            .await?
            .into_iter()
            .map(serde_json::from_value)
            .collect::<Result<_, _>>()?;
        let ready = devices.iter().all(|d| {
            listed
                .iter()
                .any(|r| &r.id == d && r.agent_present && !r.capabilities.is_empty())
        });
        if ready {
            out!(
                "agents: all {} connected and advertising systemUpgradeV1",
                devices.len()
            );
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "agents did not connect within 30 s; see their logs under {}",
                dir.join("agents").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Prints each change of the run and of its targets until the run ends.
async fn follow(client: &ApiClient, name: &str) -> Result<bool> {
    let start = Instant::now();
    let stamp = || format!("[{:>6.1}s]", start.elapsed().as_secs_f64());
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let mut last_phase = None;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let run: TaskRun = client.get(&format!("/taskruns/{name}")).await?;
        let status = &run.status;
        let targets: RunTargets = client.get(&format!("/taskruns/{name}/targets")).await?;
        for item in targets.items {
            let canary = if item.canary { " (canary)" } else { "" };
            // The state the API names (as `describe` and the dashboard do),
            // with the step a running job is at.
            if item.state == "notReleased" {
                continue;
            }
            let step = item.status.as_ref().and_then(|status| {
                status
                    .steps
                    .iter()
                    .find(|s| s.state == StepState::Running)
                    .map(|s| s.name.clone())
            });
            let state = match step {
                Some(step) if item.state == "running" => format!("running step {step}"),
                _ => item.state.clone(),
            };
            if seen.get(&item.device) != Some(&state) {
                out!("{} {}{canary}: {state}", stamp(), item.device);
                seen.insert(item.device, state);
            }
        }
        if last_phase != Some(status.phase) {
            out!(
                "{} run {name}: {} ({} targets, {} canary, {} succeeded, {} failed)",
                stamp(),
                status.phase.name(),
                status.targets,
                status.canaries,
                status.succeeded,
                status.failed
            );
            last_phase = Some(status.phase);
        }
        if status.phase.is_terminal() {
            return Ok(status.phase == Phase::Complete);
        }
        if Instant::now() > deadline {
            bail!("run {name} did not finish within 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}
