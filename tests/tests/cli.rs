//! The operator's CLI against a real control plane: the fleet-tasks seed's
//! TaskRun applies unchanged from YAML, `get` shows it, and `runs watch`
//! follows a run to its end with an exit code that says how it ended.

use drover_tests::{API_VERSION, AgentProcess, ControlPlane, bin};
use serde_json::{Value, json};
use std::process::{Command, Output};

/// The seed's example, byte for byte.
const SEED_TASKRUN: &str = "apiVersion: fleet.nationtech.io/v1alpha1
kind: TaskRun
metadata:
  name: upgrade-device-1
spec:
  allowedGroups: [production]
  targetSelector:
    matchLabels:
      device-id: device-1
  deadlineSeconds: 21600
  systemUpgradeV1: {}
";

fn drover(cp: &ControlPlane, args: &[&str]) -> Output {
    cp.cli(args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_taskrun_applies_from_yaml_and_runs_watch_follows_it() {
    let cp = ControlPlane::start(&[]);
    let devices = cp.dir.path().join("devices.yaml");
    std::fs::write(
        &devices,
        "apiVersion: fleet.nationtech.io/v1alpha1\nkind: Device\nmetadata:\n  name: device-1\nspec:\n  groups: [production]\n\
         ---\napiVersion: fleet.nationtech.io/v1alpha1\nkind: Device\nmetadata:\n  name: device-2\nspec:\n  groups: [production]\n",
    )
    .expect("write");
    let out = drover(&cp, &["apply", "-f", devices.to_str().expect("utf-8")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "device/device-1 created\ndevice/device-2 created\n"
    );

    let token = cp.device_token("device-1");
    let _agent = AgentProcess::start(
        &cp.dir.path().join("device-1"),
        "device-1",
        &cp.agent_url,
        &token,
        "",
    );
    cp.wait_for_agents(&["device-1"]).await;

    let file = cp.dir.path().join("upgrade.yaml");
    std::fs::write(&file, SEED_TASKRUN).expect("write");
    let out = drover(&cp, &["apply", "-f", file.to_str().expect("utf-8")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "taskrun/upgrade-device-1 created\n"
    );

    let out = drover(&cp, &["runs", "watch", "upgrade-device-1"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "watch ends 0 on Complete: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("AllTargetsSucceeded"), "{stdout}");
    // Piped, it prints one line per change, and never "0/0" while planning.
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("upgrade-device-1 1/1 Complete")),
        "{stdout}"
    );
    assert!(!stdout.contains("0/0"), "{stdout}");

    let out = drover(&cp, &["get", "taskrun", "upgrade-device-1", "-o", "json"]);
    let run: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(run["status"]["phase"], "Complete");
    // What get prints, apply takes back: one object, and a whole list.
    let dir = tempfile::tempdir().expect("tempdir");
    for (args, file) in [
        (
            &["get", "taskrun", "upgrade-device-1", "-o", "yaml"][..],
            "one.yaml",
        ),
        (&["get", "taskruns", "-o", "yaml"][..], "all.yaml"),
        (&["get", "taskruns", "-o", "json"][..], "all.json"),
    ] {
        let printed = drover(&cp, args);
        assert!(printed.status.success(), "{printed:?}");
        let path = dir.path().join(file);
        std::fs::write(&path, &printed.stdout).expect("write");
        let applied = drover(&cp, &["apply", "-f", path.to_str().expect("utf-8")]);
        let said = String::from_utf8_lossy(&applied.stdout);
        assert!(
            applied.status.success() && said.contains("taskrun/upgrade-device-1 unchanged"),
            "{file}: {said}{}",
            String::from_utf8_lossy(&applied.stderr)
        );
    }
    // Only device-1 matched the selector; device-2 was never a target.
    assert_eq!(run["status"]["targets"], 1, "{run}");
    assert!(
        run["status"].get("devices").is_none(),
        "no per-device map in the run's status"
    );

    let out = drover(&cp, &["get", "devices"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("device-1") && table.contains("production"),
        "{table}"
    );

    // A run that fails makes watch exit non-zero with the reason.
    cp.apply(json!({
        "apiVersion": drover_tests::API_VERSION, "kind": "TaskRun", "metadata": {"name": "nobody"},
        "spec": {"allowedGroups": ["nowhere"], "deadlineSeconds": 60, "systemUpgradeV1": {}}
    }))
    .await;
    let out = drover(&cp, &["runs", "watch", "nobody"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("NoTargets"));

    // Without a token the CLI says what to do.
    let out = Command::new(bin("drover"))
        .args([
            "--server",
            &cp.api,
            "--data",
            "/nonexistent",
            "get",
            "devices",
        ])
        .env_remove("DROVER_TOKEN")
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no operator token"));
}

fn drover_at(
    server: &str,
    token: &str,
    ca_file: Option<&std::path::Path>,
    args: &[&str],
) -> Output {
    let mut command = Command::new(bin("drover"));
    command.args(["--server", server, "--token", token]);
    if let Some(ca) = ca_file {
        command.arg("--ca-file").arg(ca);
    }
    command
        .args(args)
        .env_remove("DROVER_CA_FILE")
        .output()
        .expect("run drover")
}

/// `init`'s certificate names the host itself whatever names it is given,
/// so with TLS on the API the CLI on the control plane's own host reaches
/// it at https://localhost and https://127.0.0.1; init again with the same
/// names changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inits_certificate_serves_the_cli_on_its_own_host() {
    let dir = ControlPlane::prepare();
    let init = ControlPlane::drover_in(dir.path(), &["init", "--tls-name", "drover.example.org"]);
    assert!(init.contains("server.pem"), "{init}");
    let tls = dir.path().join("data/tls");
    let ca = std::fs::read(tls.join("ca.pem")).expect("ca");
    let again = ControlPlane::drover_in(dir.path(), &["init", "--tls-name", "drover.example.org"]);
    assert_eq!(
        std::fs::read(tls.join("ca.pem")).expect("ca"),
        ca,
        "{again}"
    );
    let (cert, key) = (tls.join("server.pem"), tls.join("server.key"));
    let cp = ControlPlane::start_in(
        dir,
        &[
            "--api-tls-cert",
            cert.to_str().expect("utf-8"),
            "--api-tls-key",
            key.to_str().expect("utf-8"),
        ],
    );
    let port = cp.api_port().to_owned();
    for host in ["localhost", "127.0.0.1"] {
        let out = drover_at(
            &format!("https://{host}:{port}"),
            &cp.token,
            Some(&tls.join("ca.pem")),
            &["get", "devices"],
        );
        assert!(out.status.success(), "{host}: {out:?}");
    }
}

/// `drover get` follows one rule for every kind, as kubectl does: plural,
/// singular and short names alike; without NAME all of a kind, with NAME
/// that one object (or exit 1); `-o name` prints `kind/name`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_follows_one_rule_for_every_kind() {
    let cp = ControlPlane::start(&[]);
    cp.apply_device("get-1", &["lab"], json!({})).await;
    cp.apply_device("get-2", &["lab"], json!({})).await;
    let run = |args: &[&str]| {
        let out = drover(&cp, args);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for kind in ["devices", "device", "dev"] {
        let (code, stdout, _) = run(&["get", kind]);
        assert_eq!(code, Some(0), "{kind}");
        assert!(
            stdout.contains("get-1") && stdout.contains("get-2"),
            "{kind}: {stdout}"
        );
    }
    // NAME gives that one object, in a table or as one JSON object.
    let (code, stdout, _) = run(&["get", "devices", "get-1"]);
    assert_eq!(code, Some(0));
    assert!(
        stdout.contains("get-1") && !stdout.contains("get-2"),
        "{stdout}"
    );
    let (_, stdout, _) = run(&["get", "dev", "get-2", "-o", "json"]);
    let one: Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(one["kind"], "Device", "{one}");
    assert_eq!(one["metadata"]["name"], "get-2", "{one}");
    assert_eq!(one["spec"]["groups"], json!(["lab"]), "{one}");
    assert!(
        one["status"]["online"].is_boolean(),
        "the list's view: {one}"
    );
    // What get prints, apply takes back: the same devices, unchanged.
    let (code, yaml, _) = run(&["get", "devices", "-o", "yaml"]);
    assert_eq!(code, Some(0));
    let file = cp.dir.path().join("devices.yaml");
    std::fs::write(&file, yaml).expect("write");
    let (code, stdout, stderr) = run(&["apply", "-f", file.to_str().expect("utf-8")]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        stdout, "device/get-1 unchanged\ndevice/get-2 unchanged\n",
        "{stderr}"
    );
    // A name that is not there: exit 1, saying so.
    for (kind, singular) in [
        ("devices", "device"),
        ("tr", "taskrun"),
        ("taskschedules", "taskschedule"),
        ("deploy", "deployment"),
        ("pkg", "package"),
    ] {
        let (code, _, stderr) = run(&["get", kind, "ghost"]);
        assert_eq!(code, Some(1), "{kind}: {stderr}");
        assert!(
            stderr.contains(&format!("{singular} ghost not found")),
            "{kind}: {stderr}"
        );
    }
    let (code, stdout, _) = run(&["get", "devices", "-o", "name"]);
    assert_eq!(code, Some(0));
    assert_eq!(stdout, "device/get-1\ndevice/get-2\n");
    let (code, stdout, _) = run(&["get", "taskruns", "-o", "name"]);
    assert_eq!((code, stdout.as_str()), (Some(0), ""));
}

/// Listings come in pages when asked (`?limit=&continue=`, the next page
/// in a Link header) and `drover get` reads every page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_come_in_pages_and_get_reads_them_all() {
    const COUNT: usize = 1201;
    let cp = ControlPlane::start(&[]);
    let items: Vec<Value> = (0..COUNT)
        .map(|i| {
            json!({"apiVersion": API_VERSION, "kind": "Device",
                   "metadata": {"name": format!("paged-{i:05}")}, "spec": {"groups": ["lab"]}})
        })
        .collect();
    let answer = cp
        .apply(json!({"apiVersion": "v1", "kind": "List", "items": items}))
        .await;
    assert_eq!(answer["items"].as_array().map(Vec::len), Some(COUNT));
    let http = reqwest::Client::new();
    let mut next = Some("/api/v1/devices?limit=500".to_owned());
    let mut pages = Vec::new();
    let mut seen = Vec::new();
    while let Some(path) = next.take() {
        let response = http
            .get(format!("{}{path}", cp.api))
            .bearer_auth(&cp.token)
            .send()
            .await
            .expect("page");
        assert_eq!(response.status(), 200, "{path}");
        next = response
            .headers()
            .get("link")
            .and_then(|l| l.to_str().ok())
            .and_then(|l| l.strip_prefix('<'))
            .and_then(|l| l.split_once(">; rel=\"next\""))
            .map(|(target, _)| target.to_owned());
        let page: Vec<Value> = response.json().await.expect("json");
        pages.push(page.len());
        seen.extend(
            page.iter()
                .map(|d| d["id"].as_str().expect("id").to_owned()),
        );
    }
    assert_eq!(
        pages,
        [500, 500, 201],
        "three pages, the last without a Link"
    );
    let expected: Vec<String> = (0..COUNT).map(|i| format!("paged-{i:05}")).collect();
    assert_eq!(seen, expected, "every device once, in name order");
    // Without a limit, every object in one answer, as before.
    let all = cp.get("/devices").await;
    assert_eq!(all.as_array().map(Vec::len), Some(COUNT));
    // limit=0 is a clear error.
    let response = http
        .get(format!("{}/api/v1/taskruns?limit=0", cp.api))
        .bearer_auth(&cp.token)
        .send()
        .await
        .expect("limit 0");
    assert_eq!(response.status(), 400);
    assert!(
        response
            .text()
            .await
            .unwrap_or_default()
            .contains("limit must be 1 to 500"),
        "a clear error"
    );
    // The CLI asks a page at a time and prints them all.
    let out = drover(&cp, &["get", "devices", "-o", "name"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim_start_matches("device/").to_owned())
        .collect();
    assert_eq!(names, expected);
}

/// `drover token` prints a token only for a device the control plane knows
/// (a typo would otherwise make a token for a device nobody registered);
/// --unregistered prints it anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_is_refused_for_a_device_that_is_not_registered() {
    let cp = ControlPlane::start(&[]);
    cp.apply_device("known-1", &["lab"], json!({})).await;
    let data = cp.dir.path().join("data");
    let token = |args: &[&str]| {
        Command::new(bin("drover"))
            .args(["--server", &cp.api, "--token", &cp.token, "--data"])
            .arg(&data)
            .arg("token")
            .args(args)
            .output()
            .expect("drover token")
    };
    let out = token(&["known-1"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        cp.device_token("known-1")
    );
    let out = token(&["knwon-1"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("device knwon-1 is not registered"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "no token printed");
    let out = token(&["--unregistered", "knwon-1"]);
    assert!(out.status.success(), "{out:?}");
}

/// An agent pointed at the operators' API port is told it has the wrong
/// port, not that its token was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_pointed_at_the_api_port_is_told_the_port_is_wrong() {
    let cp = ControlPlane::start(&[]);
    cp.apply_device("port-1", &["lab"], json!({})).await;
    let wrong = cp.api.replace("http://", "ws://");
    assert_ne!(wrong, cp.agent_url);
    let agent = AgentProcess::start(
        &cp.dir.path().join("port-1"),
        "port-1",
        &wrong,
        &cp.device_token("port-1"),
        "",
    );
    drover_tests::eventually(
        std::time::Duration::from_secs(20),
        "the agent to say why it cannot connect",
        || async { agent.logged("not its agents' port").then_some(()) },
    )
    .await;
    assert!(
        !agent.logged("refused this device's token"),
        "{}",
        agent.log()
    );
}

/// `apply --dry-run` checks and previews without storing anything: the
/// targets a TaskRun would get now and who is left out and why; a
/// Deployment naming a device that is not registered is refused, in the
/// preview and in the real apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_previews_targets_and_stores_nothing() {
    let cp = ControlPlane::start(&[]);
    cp.apply_device("dry-1", &["lab"], json!({"canary": "true"}))
        .await;
    cp.apply_device("dry-2", &["lab"], json!({})).await;
    let _agent = AgentProcess::start(
        &cp.dir.path().join("dry-1"),
        "dry-1",
        &cp.agent_url,
        &cp.device_token("dry-1"),
        "",
    );
    cp.wait_for_agents(&["dry-1"]).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let run = dir.path().join("run.yaml");
    std::fs::write(
        &run,
        "apiVersion: fleet.nationtech.io/v1alpha1\nkind: TaskRun\nmetadata:\n  name: dry-run\n\
         spec:\n  allowedGroups: [lab]\n  deadlineSeconds: 600\n  systemUpgradeV1: {}\n",
    )
    .expect("run");
    let file = run.to_str().expect("utf-8");
    let out = drover(&cp, &["apply", "-f", file, "--dry-run"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{out:?}");
    assert!(
        text.contains("taskrun/dry-run would be created (dry run)"),
        "{text}"
    );
    assert!(text.contains("targets: 1 (1 canary): dry-1"), "{text}");
    assert!(text.contains("left out: 1 without an agent yet"), "{text}");
    let runs: Vec<Value> = serde_json::from_value(cp.get("/taskruns").await).expect("runs");
    assert!(runs.is_empty(), "a dry run stores nothing: {runs:?}");

    // Issue 56: a selection that matches nothing says which part, with the
    // nearest name that exists, and the dry run exits non-zero.
    let typo = dir.path().join("typo.yaml");
    let now = jiff::Timestamp::now();
    let hhmm = |hours: i64| {
        (now + jiff::SignedDuration::from_hours(hours))
            .strftime("%H:%M")
            .to_string()
    };
    let (start, end) = (hhmm(2), hhmm(3));
    std::fs::write(
        &typo,
        format!(
            "apiVersion: fleet.nationtech.io/v1alpha1\nkind: TaskRun\nmetadata:\n  name: typo-run\n\
             spec:\n  allowedGroups: [lba]\n  targetSelector: {{matchLabels: {{canary: \"ture\"}}}}\n  \
             deadlineSeconds: 600\n  systemUpgradeV1: {{}}\n---\n\
             apiVersion: fleet.nationtech.io/v1alpha1\nkind: Deployment\nmetadata:\n  name: windowed\n\
             spec:\n  targets: {{filter: {{groups: [lab]}}}}\n  maxConcurrency: 1\n  deadlineSeconds: 600\n  \
             maintenanceWindow: {{start: \"{start}\", end: \"{end}\", timeZone: UTC}}\n  \
             systemUpgradeV1: {{}}\n"
        ),
    )
    .expect("typo");
    let out = drover(
        &cp,
        &["apply", "-f", typo.to_str().expect("utf-8"), "--dry-run"],
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("taskrun/typo-run would be created (dry run)"),
        "{text}"
    );
    assert!(
        text.contains(r#"matched nothing: no device is in the group "lba" (did you mean "lab"?)"#),
        "{text}"
    );
    assert!(
        text.contains("matched nothing: no device has canary=ture (did you mean canary=true?)"),
        "{text}"
    );
    assert!(text.contains("targets: 1: dry-1"), "{text}");
    assert!(
        text.contains("window in UTC (1 targets): closed, opens ")
            && text.contains(&format!(" {start} there")),
        "{text}"
    );
    // A misspelt group beside one that selects: the targets come from
    // the good one, and the empty one is named (the dry run still passes);
    // `describe deployment` names it too once applied.
    let partly = dir.path().join("partly.yaml");
    std::fs::write(
        &partly,
        format!(
            "apiVersion: fleet.nationtech.io/v1alpha1\nkind: Deployment\nmetadata:\n  name: partly\n\
             spec:\n  targets: {{filter: {{groups: [lab, lba]}}}}\n  maxConcurrency: 1\n  deadlineSeconds: 600\n  \
             maintenanceWindow: {{start: \"{start}\", end: \"{end}\", timeZone: UTC}}\n  \
             systemUpgradeV1: {{}}\n"
        ),
    )
    .expect("partly");
    let partly = partly.to_str().expect("utf-8");
    let out = drover(&cp, &["apply", "-f", partly, "--dry-run"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    assert!(text.contains("targets: 1: dry-1"), "{text}");
    let said = r#"no device is in the group "lba" (did you mean "lab"?)"#;
    assert!(text.contains(&format!("matched nothing: {said}")), "{text}");
    assert!(drover(&cp, &["apply", "-f", partly]).status.success());
    let out = drover(&cp, &["describe", "deployment", "partly"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains(&format!("matches no device: {said}")),
        "{text}"
    );
    let out = drover(&cp, &["cancel", "deployment", "partly"]);
    assert!(out.status.success(), "{out:?}");
    // Once canceled it may go: the listing below is of what dry runs stored.
    drover_tests::eventually(
        std::time::Duration::from_secs(30),
        "partly deleted once its cancel ended",
        || async {
            drover(&cp, &["delete", "deployment", "partly"])
                .status
                .success()
                .then_some(())
        },
    )
    .await;

    let deployment = dir.path().join("deployment.yaml");
    std::fs::write(
        &deployment,
        "apiVersion: fleet.nationtech.io/v1alpha1\nkind: Deployment\nmetadata:\n  name: typo\n\
         spec:\n  targets: {devices: [dry-1, pi-kichen]}\n  maxConcurrency: 1\n  \
         deadlineSeconds: 600\n  systemUpgradeV1: {}\n",
    )
    .expect("deployment");
    let file = deployment.to_str().expect("utf-8");
    let out = drover(&cp, &["apply", "-f", file, "--dry-run=server"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(text.contains("would be refused: spec.targets.devices names 1 device that is not registered: pi-kichen"), "{text}");
    let out = drover(&cp, &["apply", "-f", file]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not registered: pi-kichen"), "{stderr}");
    let deployments: Vec<Value> =
        serde_json::from_value(cp.get("/deployments").await).expect("deployments");
    assert!(deployments.is_empty(), "{deployments:?}");
}

/// A remote operator names a control plane once (`drover config
/// set-context`: server, CA, token file) and then runs plain `drover get`,
/// with no variable exported; `--context` picks another, an unknown one is
/// refused by name, and a token file others can read is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_remembers_the_server_its_ca_and_the_token_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let (cp, cert) = ControlPlane::start_with_api_tls(dir.path());
    let https = format!("https://localhost:{}", cp.api_port());
    let config = dir.path().join("home/drover/config.toml");
    let token = dir.path().join("lab.token");
    std::fs::write(&token, format!("{}\n", cp.token)).expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let empty = dir.path().join("no-data");
    let drover = |args: &[&str]| {
        let out = Command::new(bin("drover"))
            .args(args)
            .env("DROVER_CONFIG", &config)
            .env("DROVER_DATA", &empty)
            .env_remove("DROVER_SERVER")
            .env_remove("DROVER_TOKEN")
            .env_remove("DROVER_CA_FILE")
            .env_remove("DROVER_CONTEXT")
            .output()
            .expect("drover");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let set = [
        "config",
        "set-context",
        "lab",
        "--server",
        &https,
        "--ca-file",
        cert.cert_path.to_str().expect("utf-8"),
        "--token-file",
        token.to_str().expect("utf-8"),
    ];
    let (ok, out) = drover(&set);
    assert!(!ok && out.contains("chmod 600"), "{out}");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let (ok, out) = drover(&set);
    assert!(ok && out.contains("context lab made"), "{out}");
    let saved = std::fs::read_to_string(&config).expect("config");
    assert!(
        !saved.contains(&cp.token),
        "the config keeps the token's file, not the token"
    );

    let (ok, out) = drover(&["get", "devices"]);
    assert!(ok, "through the current context: {out}");
    let (ok, out) = drover(&["config", "get-contexts"]);
    assert!(
        ok && out.lines().any(|l| l.starts_with('*') && l.contains("lab")),
        "{out}"
    );
    let (ok, out) = drover(&["--context", "prod", "get", "devices"]);
    assert!(!ok && out.contains("no context \"prod\""), "{out}");
    let (ok, _) = drover(&[
        "config",
        "set-context",
        "other",
        "--server",
        "https://localhost:1",
    ]);
    assert!(ok);
    let (ok, out) = drover(&["config", "use-context", "other"]);
    assert!(ok, "{out}");
    let (ok, out) = drover(&["--context", "lab", "get", "devices"]);
    assert!(ok, "--context picks lab over the current one: {out}");
    let (ok, out) = drover(&["config", "current-context"]);
    assert!(ok && out.trim() == "other", "{out}");
}

/// The operators' API over TLS: the CLI speaks https and pins the server's
/// self-signed certificate with --ca-file; without it, or in clear, it gets
/// nothing. Plain http is refused towards any other machine before a byte
/// is sent, and `serve` refuses a plain-text API on a non-loopback address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_speaks_tls_and_the_token_never_crosses_a_network_in_clear() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cp, cert) = ControlPlane::start_with_api_tls(dir.path());
    let cert_path = cert.cert_path.clone();
    let port = cp.api_port().to_owned();
    let https = format!("https://localhost:{port}");

    std::fs::write(
        dir.path().join("device.yaml"),
        "apiVersion: fleet.nationtech.io/v1alpha1\nkind: Device\nmetadata:\n  name: tls-api-1\nspec:\n  groups: [lab]\n",
    )
    .expect("manifest");
    let manifest = dir.path().join("device.yaml");
    let out = drover_at(
        &https,
        &cp.token,
        Some(&cert_path),
        &["apply", "-f", manifest.to_str().expect("utf-8")],
    );
    assert!(out.status.success(), "apply over https: {out:?}");
    let out = drover_at(&https, &cp.token, Some(&cert_path), &["get", "devices"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("tls-api-1"),
        "get over https: {out:?}"
    );

    // Over TLS every answer tells the browser to stay on https (HSTS); the
    // plain-http API (the dashboard's tests) sends no such header.
    let pinned = ControlPlane::pinned_client(&cert, std::time::Duration::from_secs(30));
    let health = pinned
        .get(format!("{https}/healthz"))
        .send()
        .await
        .expect("healthz over https");
    assert_eq!(
        health
            .headers()
            .get("strict-transport-security")
            .map(|v| v.to_str().unwrap_or("")),
        Some("max-age=31536000"),
        "{:?}",
        health.headers()
    );

    // Not trusting the certificate: no answer, and the error says why.
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("cert");
    let other_path = dir.path().join("other.pem");
    std::fs::write(&other_path, other.cert.pem()).expect("write cert");
    for ca in [None, Some(other_path.as_path())] {
        let out = drover_at(&https, &cp.token, ca, &["get", "devices"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "an untrusted server answered: {out:?}"
        );
        assert!(
            stderr.contains("cannot reach the control plane") && stderr.contains("certificate"),
            "{stderr}"
        );
        // The agent's advice, worded for the CLI.
        assert!(
            stderr.contains("--ca-file (or the context's ca-file) does not hold the CA"),
            "{stderr}"
        );
    }
    // Plain http against the TLS port gets nothing.
    let out = drover_at(
        &format!("http://127.0.0.1:{port}"),
        &cp.token,
        None,
        &["get", "devices"],
    );
    assert!(!out.status.success(), "{out:?}");

    // The token is never sent in clear to another machine.
    let started = std::time::Instant::now();
    let out = drover_at(
        "http://192.0.2.1:7180",
        &cp.token,
        None,
        &["get", "devices"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("refusing to send the operator token in clear to 192.0.2.1"),
        "{stderr}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "refused before connecting"
    );

    // And serve will not offer it in clear beyond loopback.
    let data = dir.path().join("plain");
    let mut serve = Command::new(bin("drover"))
        .arg("--data")
        .arg(&data)
        .args([
            "serve",
            "--listen",
            "0.0.0.0:0",
            "--agent-listen",
            "127.0.0.1:0",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run drover serve");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while serve.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = serve.kill();
            panic!("serve started with a plain-text API on 0.0.0.0");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = serve.wait_with_output().expect("output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("refusing to serve the operators' API in clear on 0.0.0.0:0"),
        "{stderr}"
    );
}

/// A file of several documents that fails partway says which item failed
/// and what was applied before it (devices go in first, together), so the
/// operator knows what to fix and what is already there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_document_apply_that_fails_partway_says_what_it_applied() {
    let cp = ControlPlane::start(&[]);
    let run = |name: &str, deadline: u64| {
        format!(
            "apiVersion: fleet.nationtech.io/v1alpha1\nkind: TaskRun\nmetadata:\n  name: {name}\n\
             spec:\n  allowedGroups: [production]\n  deadlineSeconds: {deadline}\n  systemUpgradeV1: {{}}\n"
        )
    };
    let first = cp.dir.path().join("first.yaml");
    std::fs::write(&first, run("kept", 600)).expect("write");
    let out = drover(&cp, &["apply", "-f", first.to_str().expect("utf-8")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The second file: a new run, the existing one with another spec (a
    // run's spec never changes: 409), a run after it, and a device.
    let file = cp.dir.path().join("many.yaml");
    std::fs::write(
        &file,
        format!(
            "{}---\n{}---\n{}---\napiVersion: fleet.nationtech.io/v1alpha1\nkind: Device\nmetadata:\n  name: late-device\nspec:\n  groups: [production]\n",
            run("fresh", 600),
            run("kept", 900),
            run("never", 600)
        ),
    )
    .expect("write");
    let out = drover(&cp, &["apply", "-f", file.to_str().expect("utf-8")]);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("item 1 (TaskRun/kept)"), "{said}");
    assert!(
        said.contains("applied: TaskRun/fresh created, Device/late-device created"),
        "{said}"
    );
    assert!(
        said.contains("the items after it were not applied"),
        "{said}"
    );
    let runs = drover(&cp, &["get", "taskruns"]);
    let runs = String::from_utf8_lossy(&runs.stdout);
    assert!(runs.contains("fresh") && !runs.contains("never"), "{runs}");
}

/// A minimal Debian has no CA bundle (ca-certificates is not installed by
/// debootstrap's minbase): the CLI still reaches the control plane on its
/// own machine over plain http, where it trusts no certificate anyway. It
/// once refused to start there ("No CA certificates were loaded").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_needs_no_ca_bundle_to_reach_the_api_on_its_own_host() {
    let cp = ControlPlane::start(&[]);
    cp.apply_device("no-ca-1", &["lab"], json!({})).await;
    let empty = tempfile::tempdir().expect("tempdir");
    let out = Command::new(bin("drover"))
        .args(["--server", &cp.api, "--token", &cp.token, "get", "devices"])
        .env("SSL_CERT_FILE", empty.path().join("none.pem"))
        .env("SSL_CERT_DIR", empty.path())
        .env_remove("DROVER_CA_FILE")
        .output()
        .expect("run drover");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("no-ca-1"),
        "{out:?}"
    );
}
