//! Operators with names and roles, tokens revoked one by one, and the audit
//! log (issue 35): each role allowed and refused what it says on the API
//! and the CLI, and the whole story read back from `drover audit`.

use drover_tests::{ControlPlane, bin};
use serde_json::{Value, json};
use std::process::{Command, Output};

const API_VERSION: &str = "fleet.nationtech.io/v1alpha1";

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `drover ARGS` against `cp` with `token`.
fn drover(cp: &ControlPlane, token: &str, args: &[&str]) -> Output {
    Command::new(bin("drover"))
        .args(["--server", &cp.api, "--token", token])
        .args(args)
        .env_remove("DROVER_TOKEN")
        .output()
        .expect("run drover")
}

/// Adds an operator with the CLI as `by` and returns its token.
fn add(cp: &ControlPlane, by: &str, name: &str, role: &str) -> String {
    let out = drover(cp, by, &["operators", "add", name, "--role", role]);
    assert!(out.status.success(), "add {name}: {}", text(&out));
    let token = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(token.starts_with(&format!("drover-op.{name}.")), "{token}");
    token
}

/// The status and JSON body of a request with `token`.
async fn call(
    cp: &ControlPlane,
    token: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let http = reqwest::Client::new();
    let mut request = http
        .request(method, format!("{}/api/v1{path}", cp.api))
        .bearer_auth(token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn device(name: &str) -> Value {
    json!({"apiVersion": API_VERSION, "kind": "Device",
           "metadata": {"name": name}, "spec": {"groups": ["lab"]}})
}

/// The audit log's entries as `drover audit ARGS -o json` prints them.
fn audit(cp: &ControlPlane, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["audit", "-o", "json"];
    all.extend_from_slice(args);
    let out = drover(cp, &cp.token, &all);
    assert!(out.status.success(), "audit: {}", text(&out));
    serde_json::from_slice::<Value>(&out.stdout)
        .expect("json")
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The one entry of `who` doing `verb` with `outcome`.
fn entry<'a>(entries: &'a [Value], who: &str, verb: &str, outcome: &str) -> &'a Value {
    entries
        .iter()
        .find(|e| e["who"] == who && e["verb"] == verb && e["outcome"] == outcome)
        .unwrap_or_else(|| {
            panic!(
                "no entry of {who} {verb} {outcome} in:\n{}",
                serde_json::to_string_pretty(entries).unwrap_or_default()
            )
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_is_allowed_and_refused_what_it_says_and_the_audit_log_tells_it_all() {
    let cp = ControlPlane::start(&[]);
    // The bootstrap token is the admin named `admin`.
    let listed = drover(&cp, &cp.token, &["operators", "list"]);
    assert!(listed.status.success(), "{}", text(&listed));
    let listed = text(&listed);
    assert!(
        listed.contains("admin") && listed.contains("DATA/operator.token"),
        "{listed}"
    );
    let viewer = add(&cp, &cp.token, "vera", "viewer");
    let operator = add(&cp, &cp.token, "otto", "operator");
    let admin = add(&cp, &cp.token, "ada", "admin");

    // A viewer reads, and is refused any change, naming the role needed.
    let (status, _) = call(&cp, &viewer, reqwest::Method::GET, "/devices", None).await;
    assert_eq!(status, 200);
    let (status, body) = call(
        &cp,
        &viewer,
        reqwest::Method::POST,
        "/apply",
        Some(device("lab-1")),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"].as_str().is_some_and(
            |e| e.contains("needs the operator role") && e.contains("vera has the viewer role")
        ),
        "{body}"
    );
    let out = drover(&cp, &viewer, &["get", "devices"]);
    assert!(out.status.success(), "{}", text(&out));
    let manifest = tempfile::NamedTempFile::new().expect("file");
    std::fs::write(manifest.path(), device("lab-1").to_string()).expect("write");
    let path = manifest.path().to_str().expect("utf-8");
    let out = drover(&cp, &viewer, &["apply", "-f", path]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("needs the operator role"),
        "{}",
        text(&out)
    );

    // An operator applies, and may not delete or manage operators.
    let out = drover(&cp, &operator, &["apply", "-f", path]);
    assert!(out.status.success(), "{}", text(&out));
    let out = drover(&cp, &operator, &["delete", "device", "lab-1"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("needs the admin role"),
        "{}",
        text(&out)
    );
    let out = drover(
        &cp,
        &operator,
        &["operators", "add", "mallory", "--role", "admin"],
    );
    assert!(!out.status.success(), "an operator made an admin");
    assert!(
        text(&out).contains("needs the admin role"),
        "{}",
        text(&out)
    );
    let (status, _) = call(&cp, &operator, reqwest::Method::GET, "/operators", None).await;
    assert_eq!(status, 200, "reading the operators is a viewer's");

    // An admin deletes and manages operators.
    let out = drover(&cp, &admin, &["delete", "device", "lab-1"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = drover(&cp, &admin, &["operators", "revoke", "vera"]);
    assert!(out.status.success(), "{}", text(&out));
    let (status, _) = call(&cp, &viewer, reqwest::Method::GET, "/devices", None).await;
    assert_eq!(status, 401, "a revoked token is refused");
    let out = drover(&cp, &admin, &["operators", "rotate", "otto"]);
    assert!(out.status.success(), "{}", text(&out));
    let rotated = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let (status, _) = call(&cp, &operator, reqwest::Method::GET, "/devices", None).await;
    assert_eq!(status, 401, "the token before a rotate is refused");
    let (status, _) = call(&cp, &rotated, reqwest::Method::GET, "/devices", None).await;
    assert_eq!(status, 200, "the rotated token opens");
    // The bootstrap token still works, and the last admin stays.
    let out = drover(&cp, &cp.token, &["operators", "revoke", "ada"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = drover(&cp, &cp.token, &["operators", "revoke", "admin"]);
    assert!(!out.status.success(), "the last admin was revoked");
    assert!(text(&out).contains("last admin"), "{}", text(&out));
    // A made-up token: refused, recorded without it.
    let (status, _) = call(
        &cp,
        "drover-op.ada.guess",
        reqwest::Method::POST,
        "/apply",
        Some(device("lab-2")),
    )
    .await;
    assert_eq!(status, 401);

    // The whole story, from `drover audit`.
    let entries = audit(&cp, &[]);
    let added = entry(&entries, "operator/admin", "add", "applied");
    assert_eq!(added["kind"], "Operator");
    assert_eq!(added["via"], "cli");
    assert!(
        added["peer"].as_str().is_some_and(|p| p == "127.0.0.1"),
        "{added}"
    );
    let refused = entry(&entries, "operator/vera", "apply", "refused");
    assert_eq!(refused["status"], 403);
    assert_eq!(refused["role"], "viewer");
    let applied = entry(&entries, "operator/otto", "apply", "applied");
    assert_eq!(applied["objects"][0]["kind"], "Device");
    assert_eq!(applied["objects"][0]["name"], "lab-1");
    assert_eq!(applied["objects"][0]["result"], "created");
    assert_eq!(
        applied["objects"][0]["digest"].as_str().map(str::len),
        Some(64),
        "the manifest's SHA-256: {applied}"
    );
    entry(&entries, "operator/otto", "delete", "refused");
    entry(&entries, "operator/otto", "add", "refused");
    let deleted = entry(&entries, "operator/ada", "delete", "applied");
    assert_eq!(
        (&deleted["kind"], &deleted["name"]),
        (&json!("Device"), &json!("lab-1"))
    );
    let revoked = entry(&entries, "operator/ada", "revoke", "applied");
    assert_eq!(revoked["name"], "vera");
    entry(&entries, "operator/ada", "rotate", "applied");
    let last = entry(&entries, "operator/admin", "revoke", "failed");
    assert_eq!(last["status"], 409);
    let unknown = entry(&entries, "unknown", "apply", "refused");
    assert_eq!(unknown["status"], 401);
    assert!(
        unknown["reason"]
            .as_str()
            .is_some_and(|r| r.contains("naming operator ada")),
        "{unknown}"
    );
    let everything = serde_json::to_string(&entries).expect("json");
    for token in [&viewer, &operator, &admin, &rotated, &cp.token] {
        assert!(
            !everything.contains(token.as_str()),
            "a token in the audit log"
        );
    }
    assert!(
        !everything.contains("guess"),
        "a refused token in the audit log"
    );
    // Times in order; reads are not changes.
    let times: Vec<&str> = entries.iter().filter_map(|e| e["at"].as_str()).collect();
    let mut sorted = times.clone();
    sorted.sort_by_key(|t| t.parse::<jiff::Timestamp>().expect("time"));
    assert_eq!(times, sorted);
    assert!(
        entries
            .iter()
            .all(|e| e["verb"] != "read" || e["outcome"] == "refused")
    );

    // Filtered by operator and kind, since an age, and as JSON lines.
    let otto = audit(&cp, &["--operator", "otto"]);
    assert!(!otto.is_empty() && otto.iter().all(|e| e["who"] == "operator/otto"));
    let operators = audit(&cp, &["--kind", "Operator", "--since", "1h"]);
    assert!(
        operators.iter().all(|e| e["kind"] == "Operator"),
        "{operators:?}"
    );
    assert!(operators.len() >= 7, "{operators:?}");
    assert!(audit(&cp, &["--since", "2999-01-01T00:00:00Z"]).is_empty());
    let out = drover(&cp, &cp.token, &["audit", "--jsonl"]);
    assert!(out.status.success(), "{}", text(&out));
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines.len(), entries.len());
    let table = drover(&cp, &cp.token, &["audit"]);
    assert!(table.status.success(), "{}", text(&table));
    assert!(
        text(&table).contains("Device/lab-1 created"),
        "{}",
        text(&table)
    );

    // The bootstrap token retired: another admin revokes `admin`, and the
    // file's token is refused saying why.
    let successor = add(&cp, &cp.token, "root2", "admin");
    let out = drover(&cp, &successor, &["operators", "revoke", "admin"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = drover(&cp, &cp.token, &["get", "devices"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("DATA/operator.token (the bootstrap admin's) no longer opens the API"),
        "{}",
        text(&out)
    );
}

/// `drover --data DATA ARGS` on the control plane's host, as `token`.
fn drover_on_host(cp: &ControlPlane, token: &str, args: &[&str]) -> Output {
    Command::new(bin("drover"))
        .arg("--data")
        .arg(cp.dir.path().join("data"))
        .args(["--server", &cp.api, "--token", token])
        .args(args)
        .env_remove("DROVER_TOKEN")
        .output()
        .expect("run drover")
}

/// Issue 35, item 4: a device's token is revoked and a new one issued
/// without re-registering it. An operator may not; an admin may. The
/// connected agent's session ends at once, its old token is refused at the
/// handshake, the new one is let in and runs a job; the audit log says who.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_devices_token_is_rotated_without_registering_it_again() {
    let cp = ControlPlane::start(&[]);
    cp.apply_device("rot-1", &["rot"], json!({})).await;
    let old = cp.device_token("rot-1");
    let printed = drover_on_host(&cp, &cp.token, &["token", "rot-1"]);
    assert!(printed.status.success(), "{}", text(&printed));
    assert_eq!(String::from_utf8_lossy(&printed.stdout).trim(), old);
    let agent_dir = cp.dir.path().join("rot-1");
    let mut agent = drover_tests::AgentProcess::start(&agent_dir, "rot-1", &cp.agent_url, &old, "");
    cp.wait_for_agents(&["rot-1"]).await;

    let operator = add(&cp, &cp.token, "otto", "operator");
    let refused = drover_on_host(&cp, &operator, &["token", "rot-1", "--rotate"]);
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains("needs the admin role"),
        "{}",
        text(&refused)
    );
    let rotated = drover_on_host(&cp, &cp.token, &["token", "rot-1", "--rotate"]);
    assert!(rotated.status.success(), "{}", text(&rotated));
    let new = String::from_utf8_lossy(&rotated.stdout).trim().to_owned();
    assert_ne!(new, old);
    assert_eq!(
        cp.get("/devices/rot-1").await["tokenGeneration"],
        1,
        "the device stays registered, one generation on"
    );
    let printed = drover_on_host(&cp, &cp.token, &["token", "rot-1"]);
    assert_eq!(String::from_utf8_lossy(&printed.stdout).trim(), new);

    // The agent's open session ends, and its token no longer gets in.
    drover_tests::eventually(
        std::time::Duration::from_secs(10),
        "the old token's session to end",
        || async { (cp.get("/devices/rot-1").await["online"] == false).then_some(()) },
    )
    .await;
    assert!(
        drover_tests::agent_ws(&cp, "rot-1", &old).await.is_err(),
        "the old token opened a session"
    );
    agent.kill9();
    let _agent = drover_tests::AgentProcess::start(&agent_dir, "rot-1", &cp.agent_url, &new, "");
    cp.wait_for_agents(&["rot-1"]).await;
    cp.apply_upgrade_run("after-rotate", "rot", 600).await;
    let run = cp
        .wait_run_finished("after-rotate", std::time::Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}");

    let entries = audit(&cp, &["--kind", "Device"]);
    let done = entry(&entries, "operator/admin", "rotate-token", "applied");
    assert_eq!(done["name"], "rot-1");
    assert_eq!(done["objects"][0]["result"], "token rotated");
    entry(&entries, "operator/otto", "rotate-token", "refused");
    let everything = serde_json::to_string(&entries).expect("json");
    assert!(!everything.contains(&new) && !everything.contains(&old));
}
