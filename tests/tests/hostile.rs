//! Hostile inputs and faults, as an attacker and a careless operator would
//! try them: one table per surface (the agent's config, the operators' API,
//! the control plane's agent endpoint, the agent's WebSocket link, the
//! daemons' files, NATS), every row asserting its exact outcome, and after
//! each table the target still works. Together well over 80 rows
//! (`the_tables_hold_at_least_80_rows`).

use drover_tests::script::{Script, intent, new_job};
use drover_tests::{
    AgentProcess, ControlPlane, TEST_INTENT_PUBLIC_KEY, bin, eventually, sign_intent,
    sign_intent_with, toml_string, within,
};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;

const API_VERSION: &str = drover_tests::API_VERSION;

#[path = "hostile/enrollment.rs"]
mod enrollment;
#[path = "hostile/enrollment_mqtt.rs"]
mod enrollment_mqtt;
#[path = "hostile/enrollment_nats.rs"]
mod enrollment_nats;
#[path = "hostile/misuse.rs"]
mod misuse;

// ---------------------------------------------------------------- config ---

const GOOD_CONFIG: &str = r#"device_id = "cfg-1"
intent_public_keys = ["4131ea6931676e90420f76f3c1b8042b04b929b48156310c02c9a7b80adfe065"]
[transport]
kind = "websocket"
server_url = "ws://127.0.0.1:9"
token = "t"
[updater]
mode = "simulate"
"#;

/// (what, replace this, with this, the error `check` must give).
const CONFIG_CASES: &[(&str, &str, &str, &str)] = &[
    (
        "plain NATS to another host",
        "kind = \"websocket\"\nserver_url = \"ws://127.0.0.1:9\"",
        "kind = \"nats\"\nurl = \"nats://127.0.0.1:4222,nats://10.0.0.5:4222\"",
        "refusing plain nats:// to 10.0.0.5, which is not a loopback address",
    ),
    (
        "heartbeat that overflows",
        "token = \"t\"",
        "token = \"t\"\nheartbeat_seconds = 18446744073709551615",
        "transport.heartbeat_seconds is 18446744073709551615; it must be between 1 and 3600",
    ),
    (
        "zero heartbeat",
        "token = \"t\"",
        "token = \"t\"\nheartbeat_seconds = 0",
        "transport.heartbeat_seconds is 0",
    ),
    (
        "huge backoff",
        "token = \"t\"",
        "token = \"t\"\nbackoff_max_seconds = 99999999",
        "transport.backoff_max_seconds is 99999999",
    ),
    (
        "plain ws:// to a remote host",
        "ws://127.0.0.1:9",
        "ws://drover.example.org:7181",
        "refusing plain ws:// to drover.example.org",
    ),
    (
        "http:// URL",
        "ws://127.0.0.1:9",
        "http://127.0.0.1:9",
        "scheme must be ws:// or wss://",
    ),
    ("not a URL", "ws://127.0.0.1:9", "::::", "not a URL"),
    (
        "wss:// with a missing CA file",
        "ws://127.0.0.1:9\"",
        "wss://drover.example.org:7181\"\nca_file = \"/nonexistent/ca.pem\"",
        "/nonexistent/ca.pem",
    ),
    (
        "no intent key",
        "intent_public_keys = [\"4131ea6931676e90420f76f3c1b8042b04b929b48156310c02c9a7b80adfe065\"]",
        "",
        "intent_public_keys is empty",
    ),
    (
        "a key that is not hex",
        "4131ea6931676e90420f76f3c1b8042b04b929b48156310c02c9a7b80adfe065",
        "not-a-key",
        "is not an Ed25519 public key",
    ),
    (
        "three keys",
        "\"4131ea6931676e90420f76f3c1b8042b04b929b48156310c02c9a7b80adfe065\"]",
        "\"4131ea6931676e90420f76f3c1b8042b04b929b48156310c02c9a7b80adfe065\", \"4131ea6931676e90420f76f3c1b8042b04b929b48156310c02c9a7b80adfe065\", \"4131ea6931676e90420f76f3c1b8042b04b929b48156310c02c9a7b80adfe065\"]",
        "two while a key is rolled over",
    ),
    (
        "an unknown key (typo)",
        "mode = \"simulate\"",
        "mode = \"simulate\"\nmin_free_mb = 10",
        "unknown field `min_free_mb`",
    ),
    (
        "packages smuggled into the updater (A8)",
        "mode = \"simulate\"",
        "mode = \"simulate\"\npackages = [\"evil\"]",
        "unknown field `packages`",
    ),
    ("a bad device id", "cfg-1", "Cfg 1", "device id must be"),
    (
        "no token",
        "token = \"t\"",
        "",
        "transport needs token or token_file",
    ),
    (
        "a token file that is missing",
        "token = \"t\"",
        "token_file = \"/nonexistent/token\"",
        "cannot read the token file /nonexistent/token",
    ),
    (
        "max_resumes 0",
        "mode = \"simulate\"",
        "mode = \"simulate\"\n[limits]\nmax_resumes = 0",
        "limits.max_resumes is 0",
    ),
    (
        "keep_jobs too large",
        "mode = \"simulate\"",
        "mode = \"simulate\"\n[limits]\nkeep_jobs = 99999999",
        "limits.keep_jobs is 99999999",
    ),
    (
        "min_free_mib absurd",
        "mode = \"simulate\"",
        "mode = \"simulate\"\nmin_free_mib = 99999999999",
        "updater.min_free_mib is 99999999999",
    ),
    (
        "a NATS URL with the wrong scheme",
        "kind = \"websocket\"\nserver_url = \"ws://127.0.0.1:9\"",
        "kind = \"nats\"\nurl = \"http://127.0.0.1:4222\"",
        "scheme must be nats:// or tls://",
    ),
    (
        "a NATS CA file that is missing",
        "kind = \"websocket\"\nserver_url = \"ws://127.0.0.1:9\"",
        "kind = \"nats\"\nurl = \"tls://127.0.0.1:4222\"\nca_file = \"/nonexistent/nats-ca.pem\"",
        "transport.ca_file /nonexistent/nats-ca.pem is not readable",
    ),
    (
        "plain mqtt:// to a remote broker",
        "kind = \"websocket\"\nserver_url = \"ws://127.0.0.1:9\"",
        "kind = \"mqtt\"\nurl = \"mqtt://broker.example.org:1883\"",
        "refusing plain mqtt:// to broker.example.org",
    ),
    (
        "mqtts:// without a CA file",
        "kind = \"websocket\"\nserver_url = \"ws://127.0.0.1:9\"",
        "kind = \"mqtt\"\nurl = \"mqtts://broker.example.org:8883\"",
        "mqtts:// needs ca_file",
    ),
    (
        "an MQTT URL with the wrong scheme",
        "kind = \"websocket\"\nserver_url = \"ws://127.0.0.1:9\"",
        "kind = \"mqtt\"\nurl = \"http://127.0.0.1:1883\"",
        "scheme must be mqtt:// or mqtts://",
    ),
    (
        "an MQTT prefix with a wildcard",
        "kind = \"websocket\"\nserver_url = \"ws://127.0.0.1:9\"",
        "kind = \"mqtt\"\nurl = \"mqtt://127.0.0.1:1883\"\nprefix = \"drover/#\"",
        "must be a plain topic path",
    ),
    (
        "not TOML",
        "device_id = \"cfg-1\"",
        "device_id = ",
        "column 13: string values must be quoted",
    ),
];

fn check(config: &str) -> (bool, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agent.toml");
    let text = format!(
        "state_dir = {}\n{config}",
        toml_string(&dir.path().join("state").display().to_string())
    );
    std::fs::write(&path, text).expect("config");
    let out = Command::new(bin("drover-agent"))
        .arg("--config")
        .arg(&path)
        .arg("check")
        .output()
        .expect("drover-agent check");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn agent_config_table() {
    let mut ran_rows = Ran::new("agent config");
    let (ok, output) = check(GOOD_CONFIG);
    assert!(ok, "the good config passes: {output}");
    for (what, from, to, expected) in CONFIG_CASES {
        ran_rows.row();
        assert!(
            GOOD_CONFIG.contains(from),
            "{what}: the base config holds {from:?}"
        );
        let (ok, output) = check(&GOOD_CONFIG.replacen(from, to, 1));
        assert!(!ok, "{what}: check passed: {output}");
        assert!(
            output.contains(expected),
            "{what}: expected {expected:?} in {output}"
        );
        assert!(!output.contains("panicked"), "{what}: {output}");
    }
    ran_rows.record();
}

// ------------------------------------------------------------------- API ---

/// How a row authenticates.
#[derive(Clone, Copy)]
enum Auth {
    Good,
    None,
    Empty,
    Wrong,
    /// A viewer's own token (issue 35's roles; made by `operator_api_table`).
    Viewer,
    /// An operator's own token.
    Operator,
    /// The token of an operator since revoked.
    Revoked,
    /// A dashboard session of an operator since revoked, with its CSRF token.
    RevokedSession,
    /// The viewer's session with its name changed to `admin`.
    ForgedSession,
    /// A made-up token in the named form, claiming to be `admin`'s.
    ClaimsAdmin,
}

/// The operators the role rows act as, made once by `operator_api_table`.
struct Cast {
    viewer: String,
    operator: String,
    revoked: String,
    revoked_session: (String, String),
    viewer_session: String,
}

static CAST: std::sync::OnceLock<Cast> = std::sync::OnceLock::new();

fn cast() -> &'static Cast {
    CAST.get().expect("operator_api_table made the cast first")
}

/// Makes the role rows' operators: a viewer, an operator, and one revoked
/// after it opened a dashboard session.
async fn make_cast(cp: &ControlPlane) {
    let add = |name: &str, role: &str| {
        let out = cp.cli(&["operators", "add", name, "--role", role]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let viewer = add("vera", "viewer");
    let operator = add("otto", "operator");
    let revoked = add("gone", "operator");
    let revoked_session = cp.dashboard_session(&revoked).await;
    let out = cp.cli(&["operators", "revoke", "gone"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (viewer_session, _) = cp.dashboard_session(&viewer).await;
    let _ = CAST.set(Cast {
        viewer,
        operator,
        revoked,
        revoked_session,
        viewer_session,
    });
}

/// (what, auth, method, path, body, status, a fragment of the error).
type ApiCase = (
    &'static str,
    Auth,
    &'static str,
    &'static str,
    fn() -> Vec<u8>,
    u16,
    &'static str,
);

fn device(name: &str, labels: Value, spec: Value) -> Value {
    json!({"apiVersion": API_VERSION, "kind": "Device", "metadata": {"name": name, "labels": labels}, "spec": spec})
}

fn run(name: &str, spec: Value) -> Value {
    json!({"apiVersion": API_VERSION, "kind": "TaskRun", "metadata": {"name": name}, "spec": spec})
}

fn bytes(value: Value) -> Vec<u8> {
    value.to_string().into_bytes()
}

/// A Secret manifest with one key.
fn secret(name: &str, key: &str) -> Vec<u8> {
    bytes(
        json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Secret",
                 "metadata": {"name": name}, "spec": {"data": {key: "x"}}}),
    )
}

/// One regular file in a ustar archive: header, data, padding.
fn tar_member(name: &str, data: &[u8]) -> Vec<u8> {
    let mut header = [0u8; 512];
    header[..name.len()].copy_from_slice(name.as_bytes());
    header[100..108].copy_from_slice(b"0000644\0");
    header[108..116].copy_from_slice(b"0000000\0");
    header[116..124].copy_from_slice(b"0000000\0");
    header[124..136].copy_from_slice(format!("{:011o}\0", data.len()).as_bytes());
    header[136..148].copy_from_slice(b"00000000000\0");
    header[156] = b'0';
    header[257..263].copy_from_slice(b"ustar\0");
    header[263..265].copy_from_slice(b"00");
    header[148..156].copy_from_slice(b"        ");
    let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
    header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let mut out = header.to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

/// A .deb made by hand (ar of debian-binary, control.tar.gz, data.tar), so
/// that it can hold what `dpkg-deb --build` would refuse to make.
fn handmade_deb(control_members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut control_tar = Vec::new();
    for (name, data) in control_members {
        control_tar.extend(tar_member(name, data));
    }
    control_tar.extend([0u8; 1024]);
    let mut gzip = Command::new("gzip")
        .args(["-n", "-c"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("gzip");
    let mut stdin = gzip.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        stdin.write_all(&control_tar).expect("gzip input");
    });
    let gz = gzip.wait_with_output().expect("gzip output").stdout;
    writer.join().expect("gzip writer");
    let mut deb = b"!<arch>\n".to_vec();
    for (name, data) in [
        ("debian-binary", b"2.0\n".to_vec()),
        ("control.tar.gz", gz),
        ("data.tar", vec![0u8; 1024]),
    ] {
        deb.extend(
            format!(
                "{name:<16}{:<12}{:<6}{:<6}{:<8}{:<10}`\n",
                0,
                0,
                0,
                100644,
                data.len()
            )
            .as_bytes(),
        );
        deb.extend(&data);
        if data.len() % 2 == 1 {
            deb.push(b'\n');
        }
    }
    deb
}

const GOOD_CONTROL: &[u8] = b"Package: handmade\nVersion: 1.0\nArchitecture: all\nMaintainer: T <t@t.invalid>\nDescription: d\n";

const API_CASES: &[ApiCase] = &[
    (
        "no Authorization header",
        Auth::None,
        "GET",
        "/devices",
        Vec::new,
        401,
        "missing or bad operator token",
    ),
    (
        "an empty bearer token",
        Auth::Empty,
        "GET",
        "/devices",
        Vec::new,
        401,
        "missing or bad operator token",
    ),
    (
        "a wrong token",
        Auth::Wrong,
        "GET",
        "/devices",
        Vec::new,
        401,
        "missing or bad operator token",
    ),
    (
        "an empty token cannot apply",
        Auth::Empty,
        "POST",
        "/apply",
        || bytes(device("x-1", json!({}), json!({}))),
        401,
        "missing or bad operator token",
    ),
    (
        "truncated JSON",
        Auth::Good,
        "POST",
        "/apply",
        || b"{\"apiVersion\":".to_vec(),
        400,
        "not acceptable JSON",
    ),
    (
        "duplicate keys (kind twice)",
        Auth::Good,
        "POST",
        "/apply",
        || {
            br#"{"apiVersion":"fleet.nationtech.io/v1alpha1","kind":"TaskRun","metadata":{"name":"d"},"spec":{},"kind":"Device"}"#.to_vec()
        },
        400,
        "duplicate key \\\"kind\\\"",
    ),
    (
        "200 levels of nesting",
        Auth::Good,
        "POST",
        "/apply",
        || format!("{}{}", "[".repeat(200), "]".repeat(200)).into_bytes(),
        400,
        "recursion limit exceeded",
    ),
    (
        "a 17 MiB body",
        Auth::Good,
        "POST",
        "/apply",
        || vec![b' '; 17 * 1024 * 1024],
        413,
        "",
    ),
    (
        "an array holding a non-manifest",
        Auth::Good,
        "POST",
        "/apply",
        || bytes(json!([{"hello": 1}])),
        422,
        "item 0: not a manifest",
    ),
    (
        "a List without items",
        Auth::Good,
        "POST",
        "/apply",
        || bytes(json!({"kind": "List", "items": 3})),
        422,
        "a List needs an array `items`",
    ),
    (
        "a List over 20,000 items",
        Auth::Good,
        "POST",
        "/apply",
        || bytes(json!(vec![json!(null); 20_001])),
        413,
        "at most 20000 manifests",
    ),
    (
        "an unknown kind",
        Auth::Good,
        "POST",
        "/apply",
        || {
            bytes(
                json!({"apiVersion": API_VERSION, "kind": "Job", "metadata": {"name": "j"}, "spec": {}}),
            )
        },
        422,
        "unknown kind \\\"Job\\\"",
    ),
    (
        "a wrong apiVersion",
        Auth::Good,
        "POST",
        "/apply",
        || {
            bytes(
                json!({"apiVersion": "v1", "kind": "Device", "metadata": {"name": "d"}, "spec": {}}),
            )
        },
        422,
        "apiVersion must be",
    ),
    (
        "a device id with spaces",
        Auth::Good,
        "POST",
        "/apply",
        || bytes(device("Bad Name", json!({}), json!({}))),
        422,
        "device id must be",
    ),
    (
        "a 5,000-character label value",
        Auth::Good,
        "POST",
        "/apply",
        || bytes(device("d-1", json!({"site": "x".repeat(5000)}), json!({}))),
        422,
        "label value",
    ),
    (
        "a NUL in a label",
        Auth::Good,
        "POST",
        "/apply",
        || bytes(device("d-1", json!({"site": "a\u{0}b"}), json!({}))),
        422,
        "label value",
    ),
    (
        "a right-to-left override in a label",
        Auth::Good,
        "POST",
        "/apply",
        || bytes(device("d-1", json!({"site": "abc\u{202E}def"}), json!({}))),
        422,
        "label value",
    ),
    (
        "an escape sequence in a label key",
        Auth::Good,
        "POST",
        "/apply",
        || bytes(device("d-1", json!({"\u{1b}[31mred": "x"}), json!({}))),
        422,
        "label key",
    ),
    (
        "a 20,000-character group",
        Auth::Good,
        "POST",
        "/apply",
        || {
            bytes(device(
                "d-1",
                json!({}),
                json!({"groups": ["g".repeat(20_000)]}),
            ))
        },
        422,
        "spec.groups: group",
    ),
    (
        "65 labels",
        Auth::Good,
        "POST",
        "/apply",
        || {
            bytes(device(
                "d-1",
                Value::Object((0..65).map(|i| (format!("k{i}"), json!("v"))).collect()),
                json!({}),
            ))
        },
        422,
        "at most 64 labels",
    ),
    (
        "a time zone that is a path",
        Auth::Good,
        "POST",
        "/apply",
        || {
            bytes(device(
                "d-1",
                json!({}),
                json!({"timeZone": "../../etc/passwd"}),
            ))
        },
        422,
        "is not an IANA time zone name",
    ),
    (
        "the implicit device-id label",
        Auth::Good,
        "POST",
        "/apply",
        || bytes(device("d-1", json!({"device-id": "other"}), json!({}))),
        422,
        "implicit",
    ),
    (
        "an unknown Device spec field",
        Auth::Good,
        "POST",
        "/apply",
        || bytes(device("d-1", json!({}), json!({"root": true}))),
        422,
        "unknown field `root`",
    ),
    (
        "a run without allowedGroups",
        Auth::Good,
        "POST",
        "/apply",
        || {
            bytes(run(
                "r-1",
                json!({"deadlineSeconds": 60, "systemUpgradeV1": {}}),
            ))
        },
        422,
        "spec.allowedGroups needs at least one group",
    ),
    (
        "a run with deadline 0",
        Auth::Good,
        "POST",
        "/apply",
        || {
            bytes(run(
                "r-1",
                json!({"allowedGroups": ["g"], "deadlineSeconds": 0, "systemUpgradeV1": {}}),
            ))
        },
        422,
        "spec.deadlineSeconds must be between",
    ),
    (
        "a run with matchExpressions",
        Auth::Good,
        "POST",
        "/apply",
        || {
            bytes(run(
                "r-1",
                json!({"allowedGroups": ["g"], "deadlineSeconds": 60, "systemUpgradeV1": {}, "targetSelector": {"matchExpressions": []}}),
            ))
        },
        422,
        "fails closed",
    ),
    (
        "packages smuggled into systemUpgradeV1 (A8)",
        Auth::Good,
        "POST",
        "/apply",
        || {
            bytes(run(
                "r-1",
                json!({"allowedGroups": ["g"], "deadlineSeconds": 60, "systemUpgradeV1": {"packages": ["evil"]}}),
            ))
        },
        422,
        "unknown field `packages`",
    ),
    (
        "a run without a workload",
        Auth::Good,
        "POST",
        "/apply",
        || {
            bytes(run(
                "r-1",
                json!({"allowedGroups": ["g"], "deadlineSeconds": 60}),
            ))
        },
        422,
        "spec needs a workload",
    ),
    (
        "a run name with capitals",
        Auth::Good,
        "POST",
        "/apply",
        || {
            bytes(run(
                "Run",
                json!({"allowedGroups": ["g"], "deadlineSeconds": 60, "systemUpgradeV1": {}}),
            ))
        },
        422,
        "metadata.name",
    ),
    (
        "an allowed group with a control character",
        Auth::Good,
        "POST",
        "/apply",
        || {
            bytes(run(
                "r-1",
                json!({"allowedGroups": ["g\u{7}"], "deadlineSeconds": 60, "systemUpgradeV1": {}}),
            ))
        },
        422,
        "spec.allowedGroups: group",
    ),
    (
        "a schedule with a time zone",
        Auth::Good,
        "POST",
        "/apply",
        || {
            bytes(
                json!({"apiVersion": API_VERSION, "kind": "TaskSchedule", "metadata": {"name": "s-1"},
                "spec": {"schedule": {"daily": "03:00"}, "timeZone": "Europe/Sofia",
                         "template": {"spec": {"allowedGroups": ["g"], "deadlineSeconds": 60, "systemUpgradeV1": {}}}}}),
            )
        },
        422,
        "schedules are always UTC",
    ),
    (
        "a six-field cron schedule",
        Auth::Good,
        "POST",
        "/apply",
        || {
            bytes(
                json!({"apiVersion": API_VERSION, "kind": "TaskSchedule", "metadata": {"name": "s-1"},
                "spec": {"schedule": {"cron": "0 0 3 * * *"},
                         "template": {"spec": {"allowedGroups": ["g"], "deadlineSeconds": 60, "systemUpgradeV1": {}}}}}),
            )
        },
        422,
        "exactly five fields",
    ),
    (
        "a schedule whose template smuggles packages",
        Auth::Good,
        "POST",
        "/apply",
        || {
            bytes(
                json!({"apiVersion": API_VERSION, "kind": "TaskSchedule", "metadata": {"name": "s-1"},
                "spec": {"schedule": {"daily": "03:00"},
                         "template": {"spec": {"allowedGroups": ["g"], "deadlineSeconds": 60, "systemUpgradeV1": {"packages": ["x"]}}}}}),
            )
        },
        422,
        "unknown field `packages`",
    ),
    (
        "a run that does not exist",
        Auth::Good,
        "GET",
        "/taskruns/nope",
        Vec::new,
        404,
        "TaskRun nope not found",
    ),
    (
        "a device id that is not one",
        Auth::Good,
        "GET",
        "/devices/Bad%20Id",
        Vec::new,
        400,
        "device id must be",
    ),
    (
        "a package upload without a token",
        Auth::None,
        "POST",
        "/packages",
        || b"!<arch>\n".to_vec(),
        401,
        "missing or bad operator token",
    ),
    (
        "an empty package upload",
        Auth::Good,
        "POST",
        "/packages",
        Vec::new,
        400,
        "the upload is empty",
    ),
    (
        "a package upload that is not a .deb",
        Auth::Good,
        "POST",
        "/packages",
        || b"#!/bin/sh\nrm -rf /\n".to_vec(),
        400,
        "not a Debian package",
    ),
    (
        "a package whose control field holds a NUL byte",
        Auth::Good,
        "POST",
        "/packages",
        || {
            handmade_deb(&[(
                "./control",
                b"Package: handmade\0-evil\nVersion: 1.0\nArchitecture: all\nDescription: d\n",
            )])
        },
        400,
        "holds a NUL byte",
    ),
    (
        "a package whose control archive is a compression bomb",
        Auth::Good,
        "POST",
        "/packages",
        || {
            handmade_deb(&[
                ("./bomb", &vec![0u8; 64 << 20]),
                ("./control", GOOD_CONTROL),
            ])
        },
        400,
        "more than 4194304 bytes before its control file",
    ),
    (
        "an upload beyond the package store's quota",
        Auth::Good,
        "POST",
        "/packages",
        || vec![0u8; 2 << 20],
        507,
        "the package store is full",
    ),
    (
        "a Secret whose key is a path",
        Auth::Good,
        "POST",
        "/apply",
        || secret("s", "../../etc/shadow"),
        422,
        "it is a file name on the device",
    ),
    (
        "a Secret named like a path",
        Auth::Good,
        "POST",
        "/apply",
        || secret("../s", "k"),
        422,
        "metadata.name",
    ),
    (
        "the secrets list without a token",
        Auth::Wrong,
        "GET",
        "/secrets",
        Vec::new,
        401,
        "missing or bad operator token",
    ),
    (
        "the inventory of a device never inventoried",
        Auth::Good,
        "GET",
        "/devices/nobody/inventory",
        Vec::new,
        404,
        "inventoryRefreshV1",
    ),
    // Roles (issue 35): no escalation, and revoked is revoked everywhere.
    (
        "a viewer cannot apply",
        Auth::Viewer,
        "POST",
        "/apply",
        || bytes(device("x-1", json!({}), json!({}))),
        403,
        "apply needs the operator role; operator vera has the viewer role",
    ),
    (
        "a viewer cannot upload a package",
        Auth::Viewer,
        "POST",
        "/packages",
        || b"!<arch>\n".to_vec(),
        403,
        "upload needs the operator role",
    ),
    (
        "an operator cannot make an admin",
        Auth::Operator,
        "POST",
        "/operators",
        || bytes(json!({"name": "otto2", "role": "admin"})),
        403,
        "add needs the admin role; operator otto has the operator role",
    ),
    (
        "an operator cannot take the admin's token by rotating it",
        Auth::Operator,
        "POST",
        "/operators/admin/rotate",
        Vec::new,
        403,
        "rotate needs the admin role",
    ),
    (
        "an operator cannot delete",
        Auth::Operator,
        "DELETE",
        "/taskruns/anything",
        Vec::new,
        403,
        "delete needs the admin role",
    ),
    (
        "a revoked operator's token",
        Auth::Revoked,
        "GET",
        "/devices",
        Vec::new,
        401,
        "a token naming operator gone that is not its current one",
    ),
    (
        "a revoked operator's dashboard session reads nothing",
        Auth::RevokedSession,
        "GET",
        "/devices",
        Vec::new,
        401,
        "missing or bad operator token",
    ),
    (
        "a revoked operator's dashboard session changes nothing, CSRF token and all",
        Auth::RevokedSession,
        "POST",
        "/apply",
        || bytes(device("x-1", json!({}), json!({}))),
        401,
        "missing or bad operator token",
    ),
    (
        "a viewer's session renamed to admin",
        Auth::ForgedSession,
        "GET",
        "/operators",
        Vec::new,
        401,
        "missing or bad operator token",
    ),
    (
        "a made-up token in admin's name",
        Auth::ClaimsAdmin,
        "POST",
        "/operators",
        || bytes(json!({"name": "mallory", "role": "admin"})),
        401,
        "a token naming operator admin that is not its current one",
    ),
    (
        "an operator named like a path",
        Auth::Good,
        "POST",
        "/operators",
        || bytes(json!({"name": "../admin", "role": "admin"})),
        422,
        "is not an operator name",
    ),
    (
        "a role that does not exist",
        Auth::Good,
        "POST",
        "/operators",
        || bytes(json!({"name": "root", "role": "root"})),
        422,
        "is not a role: viewer, operator or admin",
    ),
];

async fn api_call(
    cp: &ControlPlane,
    auth: Auth,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> (u16, String) {
    let client = drover_tests::http_client();
    let url = format!("{}/api/v1{path}", cp.api);
    let mut request = match method {
        "POST" => client.post(&url).body(body),
        "DELETE" => client.delete(&url),
        _ => client.get(&url),
    };
    request = match auth {
        Auth::Good => request.bearer_auth(&cp.token),
        Auth::None => request,
        Auth::Empty => request.header("authorization", "Bearer "),
        Auth::Wrong => request.bearer_auth("not-the-token"),
        Auth::Viewer => request.bearer_auth(&cast().viewer),
        Auth::Operator => request.bearer_auth(&cast().operator),
        Auth::Revoked => request.bearer_auth(&cast().revoked),
        Auth::RevokedSession => request
            .header("cookie", &cast().revoked_session.0)
            .header("x-drover-csrf", &cast().revoked_session.1),
        Auth::ForgedSession => request.header(
            "cookie",
            cast().viewer_session.replacen(".vera.", ".admin.", 1),
        ),
        Auth::ClaimsAdmin => request.bearer_auth(format!("drover-op.admin.{}", "ab".repeat(32))),
    };
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_api_table() {
    let mut ran_rows = Ran::new("operator API");
    // A small package store, so that one row can pass its quota.
    let cp = ControlPlane::start(&["--package-quota", "1MiB"]);
    make_cast(&cp).await;
    for (what, auth, method, path, body, status, fragment) in API_CASES {
        ran_rows.row();
        let (got, text) = api_call(&cp, *auth, method, path, body()).await;
        assert_eq!(got, *status, "{what}: {text}");
        assert!(
            text.contains(fragment),
            "{what}: expected {fragment:?} in {text}"
        );
    }
    // Nothing of it was applied, and the API still works.
    let devices = cp.get("/devices").await;
    assert_eq!(devices, json!([]), "no hostile manifest left anything");
    cp.apply_device("good-1", &["g"], json!({"site": "sofia"}))
        .await;
    let immutable = cp
        .apply(run(
            "same",
            json!({"allowedGroups": ["g"], "deadlineSeconds": 60, "systemUpgradeV1": {}}),
        ))
        .await;
    assert_eq!(immutable["result"], "created");
    let (status, text) = api_call(
        &cp,
        Auth::Good,
        "POST",
        "/apply",
        bytes(run(
            "same",
            json!({"allowedGroups": ["g"], "deadlineSeconds": 61, "systemUpgradeV1": {}}),
        )),
    )
    .await;
    assert_eq!(status, 409, "a changed spec is refused: {text}");
    // The same hand-made package without the hostile part is accepted, under
    // the quota: the rows above were refused for what they hold.
    let (status, text) = api_call(
        &cp,
        Auth::Good,
        "POST",
        "/packages",
        handmade_deb(&[("./control", GOOD_CONTROL)]),
    )
    .await;
    assert_eq!(status, 201, "a clean package is stored: {text}");
    assert!(text.contains("handmade_1.0_all"), "{text}");
    ran_rows.record();
}

// ------------------------------------------- the control plane's agent port ---

type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

async fn connect_as(cp: &ControlPlane, device: &str, token: &str) -> Result<Ws, String> {
    drover_tests::agent_ws(cp, device, token).await
}

fn hello(device: &str) -> Message {
    hello_from_boot(device, "b-1")
}

fn hello_from_boot(device: &str, boot: &str) -> Message {
    Message::text(
        json!({"type": "hello", "deviceId": device, "agentVersion": "hand", "bootId": boot,
               "capabilities": ["systemUpgradeV1"], "jobs": []})
        .to_string(),
    )
}

async fn next_json(ws: &mut Ws, wait: Duration) -> Option<Value> {
    loop {
        let frame = tokio::time::timeout(wait, ws.next()).await.ok()??.ok()?;
        match frame {
            Message::Text(text) => return serde_json::from_str(text.as_str()).ok(),
            Message::Close(_) => return None,
            _ => continue,
        }
    }
}

/// Whether the server ended the session (a close frame, or the stream's end).
async fn closed(ws: &mut Ws) -> bool {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
            Ok(None | Some(Err(_)) | Some(Ok(Message::Close(_)))) => return true,
            Ok(Some(Ok(_))) => continue,
            Err(_) => return false,
        }
    }
}

fn status_json(job: &str, device: &str, error: &str) -> Value {
    json!({"jobId": job, "deviceId": device, "attempt": 1, "kind": "systemUpgradeV1",
           "state": "Failed", "steps": [], "error": error, "output": null,
           "acceptedAt": "2026-11-30T00:00:00Z", "startedAt": null, "finishedAt": null,
           "bootId": "b-1", "completionHeartbeatAt": null, "seq": 9})
}

fn heartbeat_json(device: &str, version: &str, capabilities: Value) -> Value {
    json!({"type": "heartbeat", "heartbeat": {"deviceId": device, "bootId": "b-1", "seq": 1,
           "agentVersion": version, "capabilities": capabilities, "uptimeSeconds": 1,
           "osRelease": "Debian", "architecture": "amd64", "inventoryDigest": "x",
           "sentAt": "2026-11-30T00:00:00Z"}})
}

/// (what, the frame, a fragment of the `error` reply; "" for none).
fn endpoint_cases() -> Vec<(&'static str, Message, &'static str)> {
    let unknown = "00000000-0000-4000-8000-0000000000e1";
    vec![
        ("not JSON", Message::text("{{{"), "not valid JSON"),
        ("an unknown message type", Message::text(json!({"type": "launch"}).to_string()), "unknown message type \"launch\""),
        ("no type", Message::text(json!({"no": "type"}).to_string()), "no string field \"type\""),
        ("a binary frame", Message::Binary(vec![0u8; 8].into()), "binary frames are not part of the protocol"),
        ("a 200 KB message", Message::text(json!({"type": "error", "message": "x".repeat(200 * 1024)}).to_string()), "over the protocol limit"),
        ("a second hello", hello("ep-1"), "hello is only valid as the first message"),
        ("an ack with a number for an id", Message::text(json!({"type": "ack", "jobId": 7}).to_string()), "malformed ack message"),
        ("a result without its fields", Message::text(json!({"type": "result", "outboxId": 1}).to_string()), "malformed result message"),
        ("a status for an unknown job", Message::text(json!({"type": "result", "outboxId": 2, "status": status_json(unknown, "ep-1", "x")}).to_string()), "unknown job"),
        ("a status for another device", Message::text(json!({"type": "result", "outboxId": 3, "status": status_json(unknown, "ep-2", "x")}).to_string()), "refused on the connection of ep-1"),
        ("a heartbeat for another device", Message::text(heartbeat_json("ep-2", "1", json!([])).to_string()), "heartbeat for device ep-2 refused"),
        ("an escape sequence in the reported version", Message::text(heartbeat_json("ep-1", "\u{1b}]0;pwned\u{7}", json!([])).to_string()), "control or bidirectional-override characters"),
        ("a right-to-left override in a capability", Message::text(heartbeat_json("ep-1", "1", json!(["system\u{202E}Upgrade"])).to_string()), "control or bidirectional-override characters"),
        ("100 capabilities", Message::text(heartbeat_json("ep-1", "1", json!(vec!["c"; 100])).to_string()), "100 capabilities reported"),
        ("a 10 KB version", Message::text(heartbeat_json("ep-1", &"v".repeat(10_000), json!([])).to_string()), "over the limit of 256"),
        ("an error message from the agent", Message::text(json!({"type": "error", "message": "x"}).to_string()), ""),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_agent_endpoint_table() {
    let mut ran_rows = Ran::new("agent endpoint");
    let cp = ControlPlane::start(&["--ack-timeout-seconds", "600"]);
    cp.apply_device("ep-1", &["ep"], json!({})).await;
    let token = cp.device_token("ep-1");
    let mut ws = connect_as(&cp, "ep-1", &token).await.expect("connect");
    ws.send(hello("ep-1")).await.expect("hello");
    cp.wait_for_agents(&["ep-1"]).await;
    for (what, frame, fragment) in endpoint_cases() {
        ran_rows.row();
        ws.send(frame).await.expect("send");
        let reply = next_json(&mut ws, Duration::from_secs(3)).await;
        if fragment.is_empty() {
            assert!(reply.is_none(), "{what}: unexpected reply {reply:?}");
            continue;
        }
        let reply = reply.unwrap_or_else(|| panic!("{what}: no reply\n{}", cp.log()));
        assert_eq!(reply["type"], "error", "{what}: {reply}");
        let message = reply["message"].as_str().unwrap_or("");
        assert!(
            message.contains(fragment),
            "{what}: expected {fragment:?} in {message:?}"
        );
        // A refused status is still confirmed: the decision is made.
        if what.starts_with("a status for") {
            let received = next_json(&mut ws, Duration::from_secs(3))
                .await
                .expect("received");
            assert_eq!(received["type"], "received", "{what}: {received}");
        }
    }
    // A result with a 100 KB error is stored bounded to 1 KiB, its escape
    // sequences, carriage return and bidirectional override replaced (the
    // newline kept).
    cp.apply_upgrade_run("ep-run", "ep", 600).await;
    let job = next_json(&mut ws, Duration::from_secs(15))
        .await
        .expect("a job");
    let job_id = job["intent"]["jobId"].as_str().expect("job id").to_owned();
    assert!(
        job["intent"]["signature"].is_string(),
        "the intent is signed: {job}"
    );
    let hostile = format!(
        "\u{1b}[2J\u{202e}gnissim\r\nfirst line{}",
        "e".repeat(100_000)
    );
    let mut status = status_json(&job_id, "ep-1", &hostile);
    status["seq"] = json!(2);
    ws.send(Message::text(
        json!({"type": "result", "outboxId": 10, "status": status}).to_string(),
    ))
    .await
    .expect("send");
    let received = next_json(&mut ws, Duration::from_secs(5))
        .await
        .expect("received");
    assert_eq!(received["type"], "received", "{received}");
    let targets = cp.targets("ep-run").await;
    let stored = targets[0]["status"]["error"].as_str().expect("error");
    assert!(
        stored.len() <= 1024,
        "the stored error is {} bytes",
        stored.len()
    );
    assert!(
        stored.starts_with("\u{fffd}[2J\u{fffd}gnissim\u{fffd}\nfirst line"),
        "stored as {:?}",
        stored.chars().take(40).collect::<String>()
    );
    // The session survived all of it.
    ws.send(Message::text(
        heartbeat_json("ep-1", "1", json!(["systemUpgradeV1"])).to_string(),
    ))
    .await
    .expect("heartbeat");
    assert!(next_json(&mut ws, Duration::from_secs(2)).await.is_none());
    ran_rows.record();
}

/// Sessions that must not open or must end: (what, device in the path, whose token, first frame, error fragment or "" for a refused handshake).
/// The sessions table: (what, the device in the path, the token, the first
/// message, the error fragment); no first message means the handshake
/// itself must be refused.
type SessionCase = (
    &'static str,
    &'static str,
    String,
    Option<Message>,
    &'static str,
);

fn session_cases(own: &str, other: &str, gone: &str) -> Vec<SessionCase> {
    let (own, other, gone) = (own.to_owned(), other.to_owned(), gone.to_owned());
    vec![
        ("no token", "se-1", String::new(), None, ""),
        ("another device's token", "se-1", other.clone(), None, ""),
        ("a made-up token", "se-1", "ab".repeat(32), None, ""),
        ("a path without a device", "", own.clone(), None, ""),
        (
            "a device id that is not one",
            "Se%201",
            own.clone(),
            None,
            "",
        ),
        (
            "a first message that is not hello",
            "se-1",
            own.clone(),
            Some(Message::text(
                json!({"type": "ack", "jobId": "00000000-0000-4000-8000-000000000001"}).to_string(),
            )),
            "the first message must be hello",
        ),
        (
            "a hello naming another device",
            "se-1",
            own.clone(),
            Some(hello("se-2")),
            "hello names device se-2",
        ),
        (
            "a first frame that is not JSON",
            "se-1",
            own.clone(),
            Some(Message::text("nope")),
            "not valid JSON",
        ),
        (
            "a decommissioned device",
            "se-gone",
            gone.clone(),
            Some(hello("se-gone")),
            "is decommissioned",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_sessions_table() {
    let mut ran_rows = Ran::new("sessions");
    let cp = ControlPlane::start(&[]);
    cp.apply_device("se-1", &["se"], json!({})).await;
    cp.apply(device(
        "se-gone",
        json!({}),
        json!({"decommissioned": true}),
    ))
    .await;
    let own = cp.device_token("se-1");
    let other = cp.device_token("se-2");
    let gone = cp.device_token("se-gone");
    let cases = session_cases(&own, &other, &gone);
    let declared = cases.len();
    let mut ran = 0;
    for (what, path, token, first, fragment) in cases {
        ran_rows.row();
        ran += 1;
        let connected = connect_as(&cp, path, &token).await;
        let Some(first) = first else {
            let err = connected
                .err()
                .unwrap_or_else(|| panic!("{what}: the handshake passed"));
            assert!(
                err.contains("40"),
                "{what}: refused with an HTTP error, got {err}"
            );
            continue;
        };
        let mut ws = connected.unwrap_or_else(|e| panic!("{what}: {e}"));
        ws.send(first).await.expect("send");
        let reply = next_json(&mut ws, Duration::from_secs(5))
            .await
            .unwrap_or_default();
        let message = reply["message"].as_str().unwrap_or("");
        assert!(
            message.contains(fragment),
            "{what}: expected {fragment:?} in {reply}"
        );
        assert!(closed(&mut ws).await, "{what}: the session ends");
    }
    assert_eq!(ran, declared, "every row of the sessions table ran");
    // A row of its own: one session per device.
    ran_rows.row();
    // One session per device: each new one replaces the one before. Each
    // is opened once the one before it is registered (its hello, with a boot
    // id of its own, is stored): two sessions whose handshakes end at the
    // same moment are ordered by the server, not by the client.
    let registered = |boot: String| {
        let cp = &cp;
        async move {
            eventually(Duration::from_secs(10), "the session's hello", || {
                let boot = boot.clone();
                async move {
                    let device = cp.get("/devices/se-1").await;
                    (device["bootId"] == boot.as_str()).then_some(())
                }
            })
            .await
        }
    };
    let mut newest = connect_as(&cp, "se-1", &own).await.expect("connect");
    newest
        .send(hello_from_boot("se-1", "s-0"))
        .await
        .expect("hello");
    registered("s-0".into()).await;
    for i in 0..20 {
        let mut next = connect_as(&cp, "se-1", &own).await.expect("connect");
        let boot = format!("s-{}", i + 1);
        next.send(hello_from_boot("se-1", &boot))
            .await
            .expect("hello");
        registered(boot).await;
        assert!(
            closed(&mut newest).await,
            "session {i} was closed by the next"
        );
        newest = next;
    }
    cp.apply_upgrade_run("se-run", "se", 600).await;
    let job = next_json(&mut newest, Duration::from_secs(15))
        .await
        .expect("the newest gets the job");
    assert_eq!(job["type"], "job");
    ran_rows.record();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed_after_the_handshake_timeout() {
    let cp = ControlPlane::start(&[]);
    let addr = cp.agent_url.trim_start_matches("ws://").to_owned();
    let mut idle = tokio::net::TcpStream::connect(addr).await.expect("connect");
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(20), idle.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "closed within 20 s: {read:?}"
    );
    Ran::one("an_idle_connection_is_closed_after_the_handshake_timeout");
}

/// Issue 56, item 3: a device that answers a log request badly (a chunk
/// out of order, one over its bound, a chunk for a request it was never
/// sent, or no answer at all) is named by `drover logs`, and a refusal
/// comes in the device's words; the positive control is a good answer
/// printed whole. Each row is a hand-driven agent's answer to the request
/// the control plane sent it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_answers_a_log_request_badly_is_named() {
    let mut ran_rows = Ran::new("log answers");
    let cp = ControlPlane::start(&[]);
    cp.apply_device("lg-1", &["lg"], json!({})).await;
    let mut ws = connect_as(&cp, "lg-1", &cp.device_token("lg-1"))
        .await
        .expect("connect");
    ws.send(hello("lg-1")).await.expect("hello");
    cp.wait_for_agents(&["lg-1"]).await;
    type Answer = fn(&Value) -> Vec<Value>;
    let cases: Vec<(&str, Answer, bool, &str)> = vec![
        (
            "a good answer in two chunks (the positive control)",
            |r| {
                vec![
                    json!({"type": "logChunk", "request": r, "seq": 0, "text": "first\n"}),
                    json!({"type": "logChunk", "request": r, "seq": 1, "text": "last\n", "done": true}),
                ]
            },
            true,
            "first\nlast\n",
        ),
        (
            "a chunk out of order",
            |r| {
                vec![json!({"type": "logChunk", "request": r, "seq": 1, "text": "x", "done": true})]
            },
            false,
            "chunk 1 came where 0 was due",
        ),
        (
            "a chunk over its bound",
            |r| {
                vec![json!({"type": "logChunk", "request": r, "seq": 0,
                            "text": "x".repeat(40_000), "done": true})]
            },
            false,
            "over 32768",
        ),
        (
            "a chunk for a request never sent, then nothing",
            |r| {
                let other = r.as_u64().unwrap_or(0).wrapping_add(1);
                vec![
                    json!({"type": "logChunk", "request": other, "seq": 0, "text": "x", "done": true}),
                ]
            },
            false,
            "no answer from the device within 2 s",
        ),
        (
            "a refusal, in the device's words (escapes dropped)",
            |r| {
                vec![
                    json!({"type": "logChunk", "request": r, "seq": 0, "done": true,
                            "refused": "noSuchJob", "message": "nothing kept \u{1b}[31mhere"}),
                ]
            },
            false,
            "404 Not Found: device lg-1: nothing kept here",
        ),
        (
            "a second answer after done is dropped (the next request is answered)",
            |r| {
                vec![
                    json!({"type": "logChunk", "request": r, "seq": 0, "text": "whole\n", "done": true}),
                    json!({"type": "logChunk", "request": r, "seq": 1, "text": "more\n", "done": true}),
                ]
            },
            true,
            "whole\n",
        ),
    ];
    for (what, answer, succeeds, expected) in cases {
        ran_rows.row();
        let (api, token) = (cp.api.clone(), cp.token.clone());
        let asked = std::thread::spawn(move || {
            Command::new(drover_tests::bin("drover"))
                .args(["--server", &api, "logs", "lg-1", "--wait", "2"])
                .env("DROVER_TOKEN", &token)
                .output()
                .expect("drover logs")
        });
        let request = loop {
            let frame = next_json(&mut ws, Duration::from_secs(10))
                .await
                .unwrap_or_else(|| panic!("{what}: no log request came"));
            if frame["type"] == "logs" {
                break frame["request"].clone();
            }
        };
        for message in answer(&request) {
            ws.send(Message::text(message.to_string()))
                .await
                .expect("answer");
        }
        let out = asked.join().expect("the CLI's thread");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.success(), succeeds, "{what}: {stdout}{stderr}");
        if succeeds {
            assert_eq!(stdout, expected, "{what}");
        } else {
            assert!(stderr.contains(expected), "{what}: {stderr}");
        }
    }
    ran_rows.record();
}

// --------------------------------------------------- the agent's own link ---

fn other_key() -> String {
    // A key the agent does not trust, made fresh.
    let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new())
        .expect("key");
    drover_model::signing::hex(pkcs8.as_ref())
}

/// (what, the intent (built from a fresh job id), how the agent answers:
/// Ok(state of its result) or Err(fragment of its `error` reply)).
type AgentCase = (
    &'static str,
    fn(&str) -> Value,
    Result<&'static str, &'static str>,
    &'static str,
);

fn job_for(job: &str, device: &str, kind: Value) -> Value {
    intent(job, device, kind, 600)
}

const AGENT_CASES: &[AgentCase] = &[
    (
        "a signed inventory job runs",
        |j| sign_intent(job_for(j, "ag-1", json!({"inventoryRefreshV1": {}}))),
        Ok("Succeeded"),
        "",
    ),
    (
        "an unsigned job",
        |j| job_for(j, "ag-1", json!({"inventoryRefreshV1": {}})),
        Ok("Rejected"),
        "is not signed",
    ),
    (
        "a job signed by another key",
        |j| {
            let mut v = job_for(j, "ag-1", json!({"inventoryRefreshV1": {}}));
            sign_intent_with(&mut v, &other_key());
            v
        },
        Ok("Rejected"),
        "does not match any control-plane key",
    ),
    (
        "a job changed after signing",
        |j| {
            let mut v = sign_intent(job_for(j, "ag-1", json!({"inventoryRefreshV1": {}})));
            v["expiresAt"] =
                json!((jiff::Timestamp::now() + jiff::SignedDuration::from_hours(900)).to_string());
            v
        },
        Ok("Rejected"),
        "does not match any control-plane key",
    ),
    (
        "a signature that is not hex",
        |j| {
            let mut v = job_for(j, "ag-1", json!({"inventoryRefreshV1": {}}));
            v["signature"] = json!("zz");
            v
        },
        Ok("Rejected"),
        "signature is malformed",
    ),
    (
        "a signature that is a number",
        |j| {
            let mut v = job_for(j, "ag-1", json!({"inventoryRefreshV1": {}}));
            v["signature"] = json!(7);
            v
        },
        Ok("Rejected"),
        "signature is malformed",
    ),
    (
        "an unknown kind, signed",
        |j| sign_intent(job_for(j, "ag-1", json!({"containerV1": {"image": "x"}}))),
        Ok("Rejected"),
        "unknown job kind \"containerV1\"",
    ),
    (
        "packages smuggled into systemUpgradeV1, signed (A8)",
        |j| {
            sign_intent(job_for(
                j,
                "ag-1",
                json!({"systemUpgradeV1": {"packages": ["evil"]}}),
            ))
        },
        Ok("Rejected"),
        "invalid parameters for job kind systemUpgradeV1",
    ),
    (
        "a kind that is a string, signed",
        |j| sign_intent(job_for(j, "ag-1", json!("systemUpgradeV1"))),
        Ok("Rejected"),
        "exactly one key",
    ),
    (
        "an extra field, signed",
        |j| {
            let mut v = job_for(j, "ag-1", json!({"inventoryRefreshV1": {}}));
            v["command"] = json!("rm -rf /");
            sign_intent(v)
        },
        Ok("Rejected"),
        "unknown field `command`",
    ),
    (
        "expired on arrival, signed",
        |j| sign_intent(intent(j, "ag-1", json!({"inventoryRefreshV1": {}}), -5)),
        Ok("Expired"),
        "expired",
    ),
    (
        "another device's job, signed correctly",
        |j| sign_intent(job_for(j, "ag-2", json!({"inventoryRefreshV1": {}}))),
        Err("is for device ag-2"),
        "",
    ),
    (
        "an intent over 16 KiB",
        |j| {
            let mut v = job_for(j, "ag-1", json!({"inventoryRefreshV1": {}}));
            v["padding"] = json!("x".repeat(20_000));
            v
        },
        Err("over the limit of 16384"),
        "",
    ),
    (
        "an intent that is not an object",
        |_| json!([1, 2, 3]),
        Err("job refused"),
        "",
    ),
    (
        "an intent without a job id",
        |_| sign_intent(json!({"deviceId": "ag-1"})),
        Err("job refused"),
        "",
    ),
];

/// Server messages the agent cannot use: (what, the frame, the fragment of
/// the agent's error answer).
fn unusable_frames() -> Vec<(&'static str, Message, &'static str)> {
    vec![
        (
            "an unknown server message",
            Message::text(json!({"type": "reboot", "now": true}).to_string()),
            "unknown message type \"reboot\"",
        ),
        (
            "a binary frame",
            Message::Binary(vec![1u8; 4].into()),
            "binary frames",
        ),
        (
            "a cancel with a bad id",
            Message::text(json!({"type": "cancel", "jobId": 42}).to_string()),
            "malformed cancel message",
        ),
        (
            "a 200 KB frame",
            Message::text(json!({"type": "error", "message": "x".repeat(200 * 1024)}).to_string()),
            "over the protocol limit",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_link_table() {
    let mut ran_rows = Ran::new("agent link");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("ws://{}", listener.local_addr().expect("addr"));
    let dir = tempfile::tempdir().expect("tempdir");
    let mut agent = AgentProcess::start(&dir.path().join("agent"), "ag-1", &url, "t", "");
    let mut server = Script::accept(&listener, "ag-1").await;
    for (what, make, expected, fragment) in AGENT_CASES {
        ran_rows.row();
        let job = new_job();
        server.send_raw_job(make(&job)).await;
        match expected {
            Ok(state) => {
                let result = server.result_of(&job).await;
                assert_eq!(result["status"]["state"], *state, "{what}: {result}");
                let error = result["status"]["error"].as_str().unwrap_or("");
                assert!(
                    error.contains(fragment),
                    "{what}: expected {fragment:?} in {error:?}"
                );
            }
            Err(reply) => {
                let error = server.next_of("error").await;
                let message = error["message"].as_str().unwrap_or("");
                assert!(
                    message.contains(reply),
                    "{what}: expected {reply:?} in {message:?}"
                );
                let jobs = agent.jobs();
                assert!(
                    jobs.as_array()
                        .is_some_and(|j| j.iter().all(|j| j["jobId"] != job.as_str())),
                    "{what}: nothing recorded"
                );
            }
        }
    }
    // Server messages the agent cannot use: answered, nothing breaks.
    let frames = unusable_frames();
    let declared = frames.len();
    let mut ran = 0;
    for (what, frame, fragment) in frames {
        ran_rows.row();
        ran += 1;
        server.ws.send(frame).await.expect("send");
        let error = server.next_of("error").await;
        let message = error["message"].as_str().unwrap_or("");
        assert!(
            message.contains(fragment),
            "{what}: expected {fragment:?} in {message:?}"
        );
    }
    assert_eq!(ran, declared, "every unusable server message was sent");
    // Refusals of unsigned jobs are recorded as such on the device.
    let jobs = agent.jobs();
    let unverified = jobs
        .as_array()
        .expect("jobs")
        .iter()
        .filter(|j| {
            j["kind"] == "unverified"
                && j["state"] == "Rejected"
                && j["failure"] == "signatureRefused"
        })
        .count();
    assert_eq!(unverified, 5, "{jobs}");
    // A valid job still runs, and the agent is alive.
    let job = new_job();
    server
        .send_job(intent(&job, "ag-1", json!({"inventoryRefreshV1": {}}), 600))
        .await;
    assert_eq!(server.result_of(&job).await["status"]["state"], "Succeeded");
    assert!(agent.is_running(), "{}", agent.log());
    ran_rows.record();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_jobs_is_bounded_by_the_queue() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("ws://{}", listener.local_addr().expect("addr"));
    let dir = tempfile::tempdir().expect("tempdir");
    let hold = dir.path().join("hold");
    let reached = dir.path().join("reached");
    std::fs::write(&hold, "").expect("hold");
    let agent = AgentProcess::start(
        &dir.path().join("agent"),
        "fl-1",
        &url,
        "t",
        &drover_tests::hold_config(&hold, &reached),
    );
    let mut server = Script::accept(&listener, "fl-1").await;
    let first = new_job();
    server
        .send_job(intent(&first, "fl-1", json!({"systemUpgradeV1": {}}), 600))
        .await;
    eventually(Duration::from_secs(20), "the first job to hold", || async {
        reached.exists().then_some(())
    })
    .await;
    let mut jobs = Vec::new();
    for _ in 0..200 {
        let job = new_job();
        server
            .send_job(intent(&job, "fl-1", json!({"inventoryRefreshV1": {}}), 600))
            .await;
        jobs.push(job);
    }
    let last = server.result_of(jobs.last().expect("last")).await;
    assert_eq!(last["status"]["state"], "Rejected", "{last}");
    assert!(
        last["status"]["error"]
            .as_str()
            .unwrap_or("")
            .contains("queue is full"),
        "{last}"
    );
    let status = agent.status();
    assert_eq!(
        status["queuedJobs"], 63,
        "the queue stays bounded: {status}"
    );
    std::fs::remove_file(&hold).expect("release");
    Ran::one("a_flood_of_jobs_is_bounded_by_the_queue");
}

// -------------------------------------------------------------------- files ---

fn run_drover(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(bin("drover"))
        .arg("--data")
        .arg(dir)
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
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
}

fn serve_once(dir: &Path, extra: &[&str]) -> (bool, String) {
    let ready = dir.with_extension("ready.json");
    let _ = std::fs::remove_file(&ready);
    let mut args = vec![
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--agent-listen",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    let mut child = Command::new(bin("drover"))
        .arg("--data")
        .arg(dir)
        .args(&args)
        .arg("--ready-file")
        .arg(&ready)
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("drover serve");
    // A serve that starts is stopped once it is ready; one that refuses exits.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if ready.exists() {
            let _ = child.kill();
            let _ = child.wait();
            return (true, String::new());
        }
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "serve neither started nor stopped"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn garbage(path: &Path) {
    use std::io::{Seek, Write};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open");
    file.seek(std::io::SeekFrom::Start(4096)).expect("seek");
    file.write_all(&vec![0xA5u8; 32 * 1024]).expect("write");
}

/// How a data directory or store file is damaged.
type Damage = fn(&Path);

/// The control plane's files table: (what, how the data directory is
/// damaged, extra serve args, error fragment).
fn control_plane_damages() -> Vec<(&'static str, Damage, Vec<&'static str>, &'static str)> {
    vec![
        (
            "an empty drover.redb",
            |d| std::fs::write(d.join("drover.redb"), b"").expect("truncate"),
            vec![],
            "is empty (0 bytes)",
        ),
        (
            "32 KiB of garbage in drover.redb",
            |d| garbage(&d.join("drover.redb")),
            vec![],
            "is damaged",
        ),
        (
            "not a database at all",
            |d| std::fs::write(d.join("drover.redb"), b"hello").expect("write"),
            vec![],
            "is damaged",
        ),
        (
            "an empty operator.token",
            |d| std::fs::write(d.join("operator.token"), b"").expect("truncate"),
            vec![],
            "operator.token is empty",
        ),
        (
            "an empty secret.key",
            |d| std::fs::write(d.join("secret.key"), b"\n").expect("truncate"),
            vec![],
            "secret.key is empty",
        ),
        (
            "an empty intent.key",
            |d| std::fs::write(d.join("intent.key"), b"").expect("truncate"),
            vec![],
            "intent.key is empty",
        ),
        (
            "an intent.key that is not a key",
            |d| std::fs::write(d.join("intent.key"), b"abcd").expect("write"),
            vec![],
            "is not an Ed25519 key",
        ),
        (
            "an API certificate that is not there",
            |_| {},
            vec![
                "--api-tls-cert",
                "/nonexistent/api.pem",
                "--api-tls-key",
                "/nonexistent/api.key",
            ],
            "cannot read certificates from /nonexistent/api.pem",
        ),
        (
            "--token \"\"",
            |_| {},
            vec!["--token", ""],
            "is empty; an empty token is never accepted",
        ),
    ]
}

/// A database another process holds is named as held, by whom, not as
/// damaged; reset-store refuses it while it is held, and otherwise asks
/// (refusing without a terminal unless --yes). On both sides: a second
/// `serve` on a live data directory, and `drover-agent reset-store` under a
/// running agent (whose database holds the records that stop a job from
/// running twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_database_is_named_as_held_and_reset_store_leaves_it_alone() {
    // The control plane.
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let (mut serve, _) = drover_tests::serve_until_ready(&data, &["--agent-listen", "127.0.0.1:0"]);
    let holder = format!("in use by another drover (pid {})", serve.id());
    let (ok, output) = serve_once(&data, &[]);
    assert!(!ok, "a second serve started on live data");
    assert!(output.contains(&holder), "{output}");
    assert!(!output.contains("is damaged"), "{output}");
    let (ok, output) = run_drover(&data, &["reset-store", "--yes"]);
    assert!(!ok && output.contains(&holder), "{output}");
    assert!(
        data.join("drover.redb").exists(),
        "the live database stayed"
    );
    let _ = serve.kill();
    let _ = serve.wait();
    let (ok, output) = run_drover(&data, &["reset-store"]);
    assert!(!ok && output.contains("--yes"), "{output}");
    assert!(data.join("drover.redb").exists(), "nothing moved unasked");
    let (ok, output) = run_drover(&data, &["reset-store", "--yes"]);
    assert!(ok && output.contains("moved"), "{output}");
    assert!(!data.join("drover.redb").exists());

    // The agent.
    let cp = ControlPlane::start(&[]);
    cp.apply_device("held-1", &[], json!({})).await;
    let agent = AgentProcess::start(
        &cp.dir.path().join("held-1"),
        "held-1",
        &cp.agent_url,
        &cp.device_token("held-1"),
        "",
    );
    cp.wait_for_agents(&["held-1"]).await;
    let out = Command::new(bin("drover-agent"))
        .arg("--config")
        .arg(&agent.config)
        .args(["reset-store", "--yes"])
        .stdin(Stdio::null())
        .output()
        .expect("reset-store");
    let (ok, stderr) = (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(!ok, "reset-store moved a running agent's database");
    assert!(
        stderr.contains(&format!(
            "in use by another drover-agent (pid {})",
            agent.pid().expect("running")
        )),
        "{stderr}"
    );
    assert_eq!(
        agent.status()["deviceId"],
        "held-1",
        "the agent is untouched"
    );
}

/// Replacing a CA cannot be undone (every agent and operator must be
/// given the new one): without a terminal `init --renew-tls` refuses
/// unless --yes, and leaves the old CA in place.
#[test]
fn init_renew_tls_refuses_without_a_terminal_unless_yes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let (ok, output) = run_drover(&data, &["init", "--tls-name", "localhost"]);
    assert!(ok, "{output}");
    let ca = || std::fs::read(data.join("tls/ca.pem")).expect("ca");
    let first = ca();
    let (ok, output) = run_drover(&data, &["init", "--tls-name", "localhost", "--renew-tls"]);
    assert!(!ok && output.contains("--yes"), "{output}");
    assert_eq!(ca(), first, "the CA stayed");
    let (ok, output) = run_drover(
        &data,
        &["init", "--tls-name", "localhost", "--renew-tls", "--yes"],
    );
    assert!(ok, "{output}");
    assert_ne!(ca(), first, "a new CA");
}

/// The control plane's files table's rows written as code.
const CONTROL_PLANE_FILE_ROWS: &[&str] = &[
    "reset-store moves a damaged database aside",
    "an empty operator token is refused",
];

/// Rows of a table written as code rather than data: each is named in a
/// list, ticked as it runs, and the table ends by checking every named row
/// ran, so the lists the count test adds up are what runs.
struct Rows {
    names: &'static [&'static str],
    ran: Vec<&'static str>,
}

impl Rows {
    fn new(names: &'static [&'static str]) -> Self {
        Self {
            names,
            ran: Vec::new(),
        }
    }

    fn ran(&mut self, name: &'static str) {
        assert!(self.names.contains(&name), "{name:?} is not a declared row");
        self.ran.push(name);
    }

    fn all_ran(self) {
        let mut ran = self.ran.clone();
        ran.sort_unstable();
        let mut names = self.names.to_vec();
        names.sort_unstable();
        assert_eq!(ran, names, "every declared row ran once");
    }
}

#[test]
fn control_plane_files_table() {
    let mut ran_rows = Ran::new("control-plane files");
    let cases = control_plane_damages();
    let declared = cases.len();
    let mut ran = 0;
    for (what, damage, extra, fragment) in cases {
        ran_rows.row();
        ran += 1;
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        let (ok, output) = serve_once(&data, &[]);
        assert!(ok, "{what}: a fresh data directory serves: {output}");
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(&data), 0o700, "the data directory is private");
        assert_eq!(
            mode(&data.join("drover.redb")),
            0o600,
            "the database is private"
        );
        damage(&data);
        let (ok, output) = serve_once(&data, &extra);
        assert!(!ok, "{what}: serve started anyway");
        assert!(
            output.contains(fragment),
            "{what}: expected {fragment:?} in {output}"
        );
        assert!(!output.contains("panicked"), "{what}: {output}");
    }
    assert_eq!(ran, declared, "every damage was tried");
    let mut rows = Rows::new(CONTROL_PLANE_FILE_ROWS);
    // Moving a damaged database aside is the operator's explicit command.
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    assert!(serve_once(&data, &[]).0);
    garbage(&data.join("drover.redb"));
    let (ok, output) = run_drover(&data, &["reset-store", "--yes"]);
    assert!(ok && output.contains("moved"), "{output}");
    assert!(serve_once(&data, &[]).0, "serves again with a new store");
    rows.ran("reset-store moves a damaged database aside");
    ran_rows.row();
    // The CLI refuses an empty token too.
    let out = Command::new(bin("drover"))
        .args(["get", "devices"])
        .env("DROVER_TOKEN", "")
        .output()
        .expect("drover get");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("operator token given (--token or DROVER_TOKEN) is empty")
    );
    rows.ran("an empty operator token is refused");
    ran_rows.row();
    rows.all_ran();
    ran_rows.record();
}

/// The agent's files table: (what, how its store file is damaged, error
/// fragment).
fn agent_damages() -> Vec<(&'static str, Damage, &'static str)> {
    vec![
        (
            "an empty agent.redb",
            |p| std::fs::write(p, b"").expect("truncate"),
            "is empty (0 bytes)",
        ),
        (
            "32 KiB of garbage in agent.redb",
            |p| garbage(p),
            "is damaged",
        ),
        (
            "not a database at all",
            |p| std::fs::write(p, b"hello").expect("write"),
            "is damaged",
        ),
    ]
}

#[test]
fn agent_files_table() {
    let mut ran_rows = Ran::new("agent files");
    let cases = agent_damages();
    let declared = cases.len();
    let mut ran = 0;
    for (what, damage, fragment) in cases {
        ran_rows.row();
        ran += 1;
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        let config = dir.path().join("agent.toml");
        std::fs::write(
            &config,
            GOOD_CONFIG.replacen(
                "device_id = \"cfg-1\"",
                &format!(
                    "device_id = \"cfg-1\"\nstate_dir = {}\nstatus_socket = {}",
                    toml_string(&state.display().to_string()),
                    toml_string(&dir.path().join("s.sock").display().to_string())
                ),
                1,
            ),
        )
        .expect("config");
        // A first run makes the store (mode 0700 directory, 0600 file).
        let mut agent = Command::new(bin("drover-agent"))
            .arg("--config")
            .arg(&config)
            .arg("run")
            .stderr(Stdio::null())
            .spawn()
            .expect("agent");
        let store = state.join("agent.redb");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !store.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(300));
        let _ = agent.kill();
        let _ = agent.wait();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&state)
                .expect("state")
                .permissions()
                .mode()
                & 0o777,
            0o700
        );
        assert_eq!(
            std::fs::metadata(&store)
                .expect("store")
                .permissions()
                .mode()
                & 0o777,
            0o600
        );
        damage(&store);
        for command in ["check", "run"] {
            let out = Command::new(bin("drover-agent"))
                .arg("--config")
                .arg(&config)
                .arg(command)
                .env("RUST_BACKTRACE", "0")
                .output()
                .expect("agent");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{what}: {command} passed");
            assert!(
                stderr.contains(fragment) && stderr.contains("agent.redb"),
                "{what}: {command}: {stderr}"
            );
            assert!(
                stderr.contains("drover-agent reset-store"),
                "{what}: says what to do: {stderr}"
            );
        }
        let out = Command::new(bin("drover-agent"))
            .arg("--config")
            .arg(&config)
            .args(["reset-store", "--yes"])
            .output()
            .expect("reset");
        assert!(out.status.success(), "{what}: reset-store");
        let out = Command::new(bin("drover-agent"))
            .arg("--config")
            .arg(&config)
            .arg("check")
            .output()
            .expect("check");
        assert!(
            out.status.success(),
            "{what}: check after reset: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The mode as the config writes it, not a Rust name.
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            said.contains("updater mode simulate") || said.contains("updater mode upgrade"),
            "{said}"
        );
    }
    assert_eq!(ran, declared, "every damage was tried");
    ran_rows.record();
}

/// Where the tables and the one-row tests record how many rows they ran
/// (a file `NAME.rows` each, written once the test has passed every row),
/// for `the_tables_hold_at_least_80_rows`; scripts/run-tests.sh empties it
/// before this binary runs.
fn rows_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("hostile-rows")
}

/// The rows one table ran, recorded once its test got through them all.
struct Ran {
    name: &'static str,
    rows: usize,
}

impl Ran {
    fn new(name: &'static str) -> Self {
        Self { name, rows: 0 }
    }

    fn row(&mut self) {
        self.rows += 1;
    }

    /// A one-row test that passed.
    fn one(name: &'static str) {
        let mut ran = Self::new(name);
        ran.row();
        ran.record();
    }

    fn record(self) {
        let dir = rows_dir();
        std::fs::create_dir_all(&dir).expect("the rows' directory");
        std::fs::write(
            dir.join(format!("{}.rows", self.name)),
            self.rows.to_string(),
        )
        .expect("record the rows");
    }
}

/// The tables, by the names they record their rows under.
const TABLES: &[&str] = &[
    "agent config",
    "operator API",
    "agent endpoint",
    "sessions",
    "agent link",
    "control-plane files",
    "agent files",
    "operators' misuse",
    "enrollment doors",
    "enrollment floods",
    "enrollment over MQTT",
    "enrollment over NATS",
];

/// The rows that ran, as each table and one-row test recorded them when
/// it passed, add up to at least 80; every one-row test named exists in
/// this binary. Run by scripts/run-tests.sh after the rest of this binary
/// (a record missing means its test did not run or did not pass).
#[test]
#[ignore = "scripts/run-tests.sh runs it after the rest of this binary, whose rows it counts"]
fn the_tables_hold_at_least_80_rows() {
    let listed = Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--list", "--format", "terse"])
        .output()
        .expect("list this binary's tests");
    let tests: std::collections::BTreeSet<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test").map(str::to_owned))
        .collect();
    for name in SINGLE_ROW_TESTS {
        assert!(
            tests.contains(*name),
            "{name} is named as a one-row test, but this binary has no such test: {tests:?}"
        );
    }
    let mut counted = Vec::new();
    for name in TABLES.iter().chain(SINGLE_ROW_TESTS) {
        let path = rows_dir().join(format!("{name}.rows"));
        let rows: usize = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| {
                panic!(
                    "{name} recorded no rows ({}: {e}): did it run and pass?",
                    path.display()
                )
            })
            .trim()
            .parse()
            .expect("a count");
        assert!(rows > 0, "{name} ran no rows");
        counted.push((*name, rows));
    }
    let rows: usize = counted.iter().map(|(_, n)| n).sum();
    eprintln!("hostile rows that ran: {counted:?} = {rows}");
    assert!(rows >= 80, "{rows} rows ran: {counted:?}");
    let _ = TEST_INTENT_PUBLIC_KEY;
}

/// The hostile cases that are a test of their own each; each records its
/// row when it passes.
const SINGLE_ROW_TESTS: &[&str] = &[
    "an_oversize_mqtt_message_from_one_device_stops_nobody",
    "the_broker_refuses_an_oversize_mqtt_message_first",
    "a_device_cannot_take_another_clients_mqtt_id",
    "a_device_can_neither_fill_nor_roll_up_the_status_bucket",
    "a_broker_password_opens_only_the_broker",
    "half_sent_requests_from_one_address_lock_out_no_one",
    "idle_sockets_on_the_agents_port_keep_no_device_out",
    "a_flood_of_jobs_is_bounded_by_the_queue",
    "an_idle_connection_is_closed_after_the_handshake_timeout",
];

// --------------------------------------------------------------- brokers ---

/// A mosquitto for `devices` as `drover mqtt-config` sets it up, minus the
/// lines `drop` names (an operator who left them out), and a control plane
/// serving over it.
fn mqtt_fleet_without(devices: &[&str], drop: &[&str]) -> (drover_tests::Mosquitto, ControlPlane) {
    let dir = ControlPlane::prepare();
    let broker_dir = drover_tests::Mosquitto::prepare();
    let out = broker_dir.path().join("auth").display().to_string();
    // A second control-plane user for the tests' own mosquitto_sub (see
    // `WATCH_BROKER_USER`).
    let mut args = vec![
        "mqtt-config",
        "--control-plane-password",
        "cp-secret",
        "--control-plane-user",
        drover_tests::CP_BROKER_USER,
        "--control-plane-user",
        drover_tests::WATCH_BROKER_USER,
        "--out",
        &out,
    ];
    for device in devices {
        args.extend(["--device", device]);
    }
    let auth = ControlPlane::drover_in(dir.path(), &args);
    assert!(
        auth.contains("max_packet_size"),
        "mqtt-config sets the broker's limit: {auth}"
    );
    let auth: String = auth
        .lines()
        .filter(|line| !drop.iter().any(|d| line.starts_with(d)))
        .map(|line| format!("{line}\n"))
        .collect();
    let broker = drover_tests::Mosquitto::start_in(broker_dir, &auth, "");
    let url = broker.url();
    let cp = ControlPlane::start_in(dir, &["--mqtt-url", &url, "--mqtt-password", "cp-secret"]);
    (broker, cp)
}

/// [`mqtt_fleet_without`] for devices `<name>-a` (the attacker, registered
/// on the broker only) and `<name>-b` (in group `<name>`, its agent running
/// and connected).
async fn mqtt_pair_without(
    name: &str,
    drop: &[&str],
) -> (drover_tests::Mosquitto, ControlPlane, AgentProcess) {
    let (a, b) = (format!("{name}-a"), format!("{name}-b"));
    let (broker, cp) = mqtt_fleet_without(&[&a, &b], drop);
    cp.apply_device(&b, &[name], json!({})).await;
    let agent = AgentProcess::start_mqtt(
        &cp.dir.path().join(&b),
        &b,
        &broker.url(),
        &cp.device_token(&b),
        "",
    );
    cp.wait_for_agents(&[&b]).await;
    (broker, cp, agent)
}

/// Device A, with its own credentials, publishes a message bigger than any
/// Drover sends on its own status topic (retained) and as its hello. The
/// control plane's link drops them, says so, clears the retained copy, and
/// keeps serving: B's run completes before and after (the positive control
/// is the run before), and the link never reconnects. On a broker without
/// the limit `mqtt-config` prints, so that the control plane sees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_mqtt_message_from_one_device_stops_nobody() {
    let (broker, cp, b) = mqtt_pair_without("big", &["max_packet_size"]).await;
    // The positive control: a run completes.
    cp.apply_upgrade_run("big-before", "big", 600).await;
    let run = cp
        .wait_run_finished("big-before", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}");

    let mut options = rumqttc::MqttOptions::new("big-a", "127.0.0.1", broker.port);
    options.set_credentials("big-a", cp.broker_password("big-a"));
    options.set_max_packet_size(1 << 20, 1 << 20);
    // A session the broker keeps: rumqttc drops the publishes it holds
    // when it reconnects into a new session (session_present false), so
    // with a clean session a connection lost mid-publish lost them.
    options.set_clean_session(false);
    let (a, mut a_loop) = rumqttc::AsyncClient::new(options, 8);
    // A connection that fails (a connect that times out on a loaded
    // machine) is made again on the next poll: the publishes below wait
    // for it rather than being lost with a driver that stopped.
    let driver = tokio::spawn(async move {
        loop {
            if a_loop.poll().await.is_err() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
    let big = vec![b'x'; 300 * 1024];
    let topic = "drover/v1/devices/big-a/status/00000000-0000-4000-8000-00000000b1e5";
    // The broker's retained copy of the topic, as a subscriber asking for
    // one retained message sees it: mosquitto_sub's exit status (0: it got
    // one; 27: its 10 s ran out with none) and what it printed.
    let port = broker.port.to_string();
    let retained = || {
        let out = Command::new("mosquitto_sub")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-u",
                drover_tests::WATCH_BROKER_USER,
                "-P",
                "cp-secret",
            ])
            .args([
                "-i",
                "big-watch",
                "-t",
                topic,
                "--retained-only",
                "-C",
                "1",
                // Connecting and taking 300 KiB can take seconds on a
                // machine running two test binaries at once.
                "-W",
                "10",
            ])
            .output()
            .expect("mosquitto_sub (the test command installs mosquitto-clients)");
        (out.status.code(), out.stdout.len())
    };
    // With the control plane paused the broker keeps A's status retained:
    // the copy the link must clear is there to see first.
    cp.pause();
    a.publish(topic, rumqttc::QoS::AtLeastOnce, true, big.clone())
        .await
        .expect("publish");
    a.publish(
        "drover/v1/devices/big-a/hello",
        rumqttc::QoS::AtLeastOnce,
        false,
        big,
    )
    .await
    .expect("publish");
    let seen = within(Duration::from_secs(60), || {
        let (code, printed) = retained();
        async move { (code == Some(0) && printed > 300 * 1024).then_some(()) }
    })
    .await;
    cp.resume();
    let log = broker.log();
    let tail: Vec<&str> = log.lines().rev().take(30).collect();
    assert!(
        seen.is_some(),
        "A's status retained at the broker before the link saw it: {:?}\nthe broker's last lines, newest first:\n{}",
        retained(),
        tail.join("\n")
    );
    eventually(Duration::from_secs(20), "the link to drop both", || async {
        (cp.log()
            .matches("message over the size limit dropped")
            .count()
            >= 2)
            .then_some(())
    })
    .await;
    driver.abort();
    // The retained copy is cleared: the subscriber runs out its wait
    // (exit 27) having printed nothing.
    eventually(
        Duration::from_secs(40),
        "the retained status cleared",
        || {
            let (code, printed) = retained();
            async move { (code == Some(27) && printed == 0).then_some(()) }
        },
    )
    .await;
    // Everyone else goes on, on the same connection.
    cp.apply_upgrade_run("big-after", "big", 600).await;
    let run = cp
        .wait_run_finished("big-after", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}\n{}", cp.log());
    assert_eq!(cp.healthz().await.0, 200);
    assert!(
        !cp.log().contains("MQTT connection failed"),
        "the link reconnected: {}",
        cp.log()
    );
    b.assert_jobs_run_once(2);
    Ran::one("an_oversize_mqtt_message_from_one_device_stops_nobody");
}

/// With the broker set up as `drover mqtt-config` prints, the broker
/// refuses the oversize message first: device A is disconnected, the
/// control plane never sees it, and B's run completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_refuses_an_oversize_mqtt_message_first() {
    let (broker, cp, b) = mqtt_pair_without("bigb", &[]).await;
    let mut options = rumqttc::MqttOptions::new("bigb-a", "127.0.0.1", broker.port);
    options.set_credentials("bigb-a", cp.broker_password("bigb-a"));
    options.set_max_packet_size(1 << 20, 1 << 20);
    let (a, mut a_loop) = rumqttc::AsyncClient::new(options, 8);
    // The positive control: a message of a normal size is taken (PUBACK).
    a.publish(
        "drover/v1/devices/bigb-a/heartbeat",
        rumqttc::QoS::AtLeastOnce,
        false,
        "small",
    )
    .await
    .expect("publish");
    let acked = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match a_loop.poll().await {
                Ok(rumqttc::Event::Incoming(rumqttc::Incoming::PubAck(_))) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    })
    .await;
    assert_eq!(acked.ok(), Some(true), "the small message was taken");
    a.publish(
        "drover/v1/devices/bigb-a/status/00000000-0000-4000-8000-00000000b1e5",
        rumqttc::QoS::AtLeastOnce,
        true,
        vec![b'x'; 300 * 1024],
    )
    .await
    .expect("publish");
    let dropped = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if a_loop.poll().await.is_err() {
                return true;
            }
        }
    })
    .await;
    assert_eq!(dropped.ok(), Some(true), "the broker disconnected A");
    cp.apply_upgrade_run("bigb-run", "bigb", 600).await;
    let run = cp
        .wait_run_finished("bigb-run", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}");
    assert!(
        !cp.log().contains("message over the size limit dropped"),
        "the broker, not the control plane, refused it"
    );
    b.assert_one_job_run_once();
    Ran::one("the_broker_refuses_an_oversize_mqtt_message_first");
}

/// Device A connects, with its own credentials, under `client_id` and
/// waits for the broker's CONNACK; false when the broker refuses it.
async fn connect_mqtt_as(port: u16, user: &str, password: &str, client_id: &str) -> bool {
    let mut options = rumqttc::MqttOptions::new(client_id, "127.0.0.1", port);
    options.set_credentials(user, password);
    let (client, mut events) = rumqttc::AsyncClient::new(options, 8);
    let connected = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match events.poll().await {
                Ok(rumqttc::Event::Incoming(rumqttc::Incoming::ConnAck(_))) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    })
    .await
    .unwrap_or(false);
    // Disconnect without reconnecting: the attack is the connection itself.
    drop(client);
    drop(events);
    connected
}

/// Device A, with its own credentials, connects under device B's client id
/// and under the control plane's. On a broker without the listener line
/// `drover mqtt-config` prints (an operator who left it out), that pushes B
/// off: the test sees what it guards against. On a broker set up as printed,
/// the broker makes a client's id its user name, so A is only ever `kid-a`:
/// neither B nor the control plane is pushed off, B's run completes, and
/// neither link reconnected. And `drover-agent check --connect` beside B's
/// running agent asks it instead of connecting as B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_cannot_take_another_clients_mqtt_id() {
    // Without the line: B is pushed off.
    {
        let (broker, cp, _b) = mqtt_pair_without("kid", &["use_username_as_clientid"]).await;
        assert!(connect_mqtt_as(broker.port, "kid-a", &cp.broker_password("kid-a"), "kid-b").await);
        assert!(
            broker
                .log()
                .contains("Client kid-b already connected, closing old connection"),
            "without the line, A took B's id:\n{}",
            broker.log()
        );
    }
    // As mqtt-config prints it.
    let (broker, cp, b) = mqtt_pair_without("kid", &[]).await;
    let replica =
        std::fs::read_to_string(cp.dir.path().join("data/replica.id")).expect("replica id");
    let token = cp.broker_password("kid-a");
    let cp_id = format!("drover-cp-{}", replica.trim());
    for id in ["kid-b", cp_id.as_str(), "drover-control-plane"] {
        assert!(
            connect_mqtt_as(broker.port, "kid-a", &token, id).await,
            "A is let in under its own name"
        );
    }
    let log = broker.log();
    assert!(
        log.contains(" as kid-a "),
        "the broker named A by its user:\n{log}"
    );
    for pushed in ["kid-b", "drover-cp-", "drover-control-plane"] {
        assert!(
            !log.contains(&format!("Client {pushed}")),
            "{pushed} was pushed off:\n{log}"
        );
    }
    // check --connect beside the running agent: asked, not connected as B.
    let out = Command::new(bin("drover-agent"))
        .arg("--config")
        .arg(&b.config)
        .args(["check", "--connect"])
        .output()
        .expect("drover-agent check");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("the running agent is connected over mqtt"),
        "{said}"
    );
    cp.apply_upgrade_run("kid-run", "kid", 600).await;
    let run = cp
        .wait_run_finished("kid-run", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}");
    assert!(
        !cp.log().contains("MQTT connection failed"),
        "the control plane's link reconnected: {}",
        cp.log()
    );
    assert_eq!(
        b.log().matches("connected to MQTT").count(),
        1,
        "B kept its one connection:\n{}",
        b.log()
    );
    assert!(
        !broker.log().contains("Client kid-b already connected"),
        "{}",
        broker.log()
    );
    b.assert_one_job_run_once();
    Ran::one("a_device_cannot_take_another_clients_mqtt_id");
}

/// Device A, with its own credentials and a connection of its own beside
/// its agent, tries to fill the status bucket and to empty it: puts on its
/// own status key (plainly, and with `Nats-Rollup: all`, which would purge
/// every device's statuses), and status requests for jobs it was never given
/// or larger than any status. Nothing of it is stored: only the control
/// plane writes the bucket, and it takes a device's status only for a job
/// that device was given. The positive control: the run that A's and B's
/// agents take completes, their statuses stored through the same requests,
/// and B's Succeeded, acknowledged before the control plane is killed, is
/// read after it returns (issue 28, items 2 and 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_can_neither_fill_nor_roll_up_the_status_bucket() {
    let devices = ["fill-a", "fill-b"];
    let (nats, mut cp) = drover_tests::nats_fleet(&devices, "cp-secret");
    let mut agents = Vec::new();
    let mut holds = Vec::new();
    for device in devices {
        cp.apply_device(device, &["fill"], json!({})).await;
        let dir = cp.dir.path().join(device);
        std::fs::create_dir_all(&dir).expect("dir");
        let (hold, reached) = (dir.join("hold"), dir.join("reached"));
        std::fs::write(&hold, "").expect("hold");
        agents.push(AgentProcess::start_nats(
            &dir,
            device,
            &nats.url(),
            &cp.device_token(device),
            None,
            &drover_tests::hold_config(&hold, &reached),
        ));
        holds.push((hold, reached));
    }
    cp.wait_for_agents(&devices).await;
    cp.apply_upgrade_run("fill-run", "fill", 600).await;
    for (_, reached) in &holds {
        eventually(Duration::from_secs(30), "both mid-job", || async {
            reached.exists().then_some(())
        })
        .await;
    }

    let attacker = async_nats::ConnectOptions::with_user_and_password(
        "fill-a".into(),
        cp.broker_password("fill-a"),
    )
    .custom_inbox_prefix("_INBOX_fill-a")
    .connect(nats.url())
    .await
    .expect("A connects");
    let js = async_nats::jetstream::new(attacker.clone());
    let unknown_job = |n: u32| format!("00000000-0000-4000-8000-{n:012x}");
    // Direct puts, plain and rolling up, are not the device's to make.
    let key = format!("$KV.system-upgrade-status.fill-a.{}", unknown_job(1));
    let mut rollup = async_nats::HeaderMap::new();
    rollup.insert("Nats-Rollup", "all");
    for headers in [async_nats::HeaderMap::new(), rollup] {
        let put = js
            .publish_with_headers(key.clone(), headers, "{}".into())
            .await;
        let acked = match put {
            Ok(ack) => tokio::time::timeout(Duration::from_secs(3), ack)
                .await
                .is_ok_and(|a| a.is_ok()),
            Err(_) => false,
        };
        assert!(!acked, "a device put into the status bucket itself");
    }
    // Requests for jobs A was never given, each near the largest value, and
    // one larger than any status: all refused.
    let filler = "x".repeat(200 * 1024);
    let mut requests: Vec<(Value, &str)> = (2..42)
        .map(|n| {
            (
                status_json(&unknown_job(n), "fill-a", &filler),
                "unknown job",
            )
        })
        .collect();
    let mut larger = status_json(&unknown_job(50), "fill-a", "");
    larger["padding"] = json!("y".repeat(300 * 1024));
    requests.push((larger, "larger than the 262144 bytes allowed"));
    for (status, why) in requests {
        let reply = attacker
            .request("drover.status.fill-a", status.to_string().into())
            .await
            .unwrap_or_else(|e| panic!("{why}: no answer: {e}"));
        let reply: Value = serde_json::from_slice(&reply.payload).expect("json answer");
        let reason = reply["refused"].as_str().unwrap_or_default();
        assert!(reason.contains(why), "{why}: {reply}");
    }

    // B finishes while A's agent still holds; the control plane stores B's
    // statuses and answers (B's outbox empties), then dies and returns.
    std::fs::remove_file(&holds[1].0).expect("release B");
    agents[1]
        .wait_idle_and_flushed(Duration::from_secs(60))
        .await;
    cp.kill9();
    cp.restart();
    std::fs::remove_file(&holds[0].0).expect("release A");
    let run = cp
        .wait_run_finished("fill-run", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}");
    assert_eq!(run["status"]["succeeded"], 2, "{run}");

    // The bucket holds the two jobs' statuses, and nothing of A's attempts.
    let admin = async_nats::ConnectOptions::with_user_and_password(
        drover_tests::CP_BROKER_USER.into(),
        "cp-secret".into(),
    )
    .connect(nats.url())
    .await
    .expect("connect");
    let mut stream = async_nats::jetstream::new(admin)
        .get_stream("KV_system-upgrade-status")
        .await
        .expect("stream");
    let state = stream.info().await.expect("info").state.clone();
    assert!(state.bytes < 64 * 1024, "{state:?}");
    assert_eq!(state.subjects_count, 2, "{state:?}");
    for agent in &agents {
        agent.assert_one_job_run_once();
    }
    Ran::one("a_device_can_neither_fill_nor_roll_up_the_status_bucket");
}

/// One secret, one job (issue 28, item 6): the broker password a device's
/// agent derives from its token logs in to NATS and MQTT and to nothing
/// else, and the token itself no longer logs in to a broker set up by this
/// version, whose files hold neither. The positive controls: the derived
/// password is let in by both brokers, the token over WebSocket, and the
/// token opens the device's sealed secrets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_password_opens_only_the_broker() {
    let (nats, cp) = drover_tests::nats_fleet(&["pw-a"], "cp-secret");
    cp.apply_device("pw-a", &["pw"], json!({})).await;
    let token = cp.device_token("pw-a");
    let password = cp.broker_password("pw-a");
    assert_ne!(password, token);
    let nats_login = |secret: String| {
        async_nats::ConnectOptions::with_user_and_password("pw-a".into(), secret)
            .custom_inbox_prefix("_INBOX_pw-a")
            .connect(nats.url())
    };
    assert!(
        nats_login(password.clone()).await.is_ok(),
        "the password is let in"
    );
    let refused = nats_login(token.clone()).await;
    assert!(refused.is_err(), "the token logged in to NATS");

    // What nats-config writes holds neither, only hashes.
    let auth = drover_tests::nats_auth(cp.dir.path(), &["pw-a"], "cp-secret");
    assert!(
        !auth.contains(&token) && !auth.contains(&password) && !auth.contains("cp-secret"),
        "{auth}"
    );
    assert!(auth.contains("$2a$04$"), "{auth}");

    // The same over MQTT, whose password file is hashed anyway.
    let (broker, mqtt_cp) = drover_tests::mqtt_fleet(&["pw-m"], "cp-secret");
    let (m_token, m_password) = (
        mqtt_cp.device_token("pw-m"),
        mqtt_cp.broker_password("pw-m"),
    );
    assert!(connect_mqtt_as(broker.port, "pw-m", &m_password, "pw-m").await);
    assert!(!connect_mqtt_as(broker.port, "pw-m", &m_token, "pw-m").await);
    let passwd = std::fs::read_to_string(broker.dir.path().join("auth/drover.passwd"))
        .expect("password file");
    assert!(
        !passwd.contains(&m_token) && !passwd.contains(&m_password),
        "{passwd}"
    );

    // Over WebSocket the token is let in and the password is not.
    assert!(connect_as(&cp, "pw-a", &token).await.is_ok());
    assert!(connect_as(&cp, "pw-a", &password).await.is_err());

    // A box sealed to the device opens with its token and not with the
    // password.
    let device = drover_model::DeviceId::new("pw-a").expect("id");
    let job = drover_model::JobId::random();
    let files = [drover_model::sealed::SecretFile {
        secret: "wifi".into(),
        key: "psk".into(),
        value: "hunter2".into(),
    }];
    let sealed = drover_model::sealed::seal(&token, &device, job, &files).expect("seal");
    assert!(drover_model::sealed::open(&token, &device, job, &sealed).is_ok());
    assert!(drover_model::sealed::open(&password, &device, job, &sealed).is_err());
    Ran::one("a_broker_password_opens_only_the_broker");
}

// ---------------------------------------------------------- idle sockets ---

/// Keeps `count` connections open to `to` from `from` (a loopback address
/// of its own, so the real clients at 127.0.0.1 are another peer), each
/// sending `send` and then nothing, opening a new one whenever the server
/// closes one, until dropped: a stranger who keeps the pressure on.
struct Pressure {
    task: tokio::task::JoinHandle<()>,
    /// Connections the server took so far (each counted once).
    opened: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Pressure {
    fn start(
        from: &'static str,
        to: std::net::SocketAddr,
        count: usize,
        send: &'static [u8],
    ) -> Self {
        let opened = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = opened.clone();
        let task = tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut held = tokio::task::JoinSet::new();
            loop {
                while held.len() < count {
                    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
                    socket
                        .bind(format!("{from}:0").parse().expect("address"))
                        .expect("bind");
                    let Ok(mut stream) = socket.connect(to).await else {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if !send.is_empty() {
                        let _ = stream.write_all(send).await;
                    }
                    // Held until the server closes it.
                    held.spawn(async move {
                        let mut buf = [0u8; 256];
                        while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
                    });
                }
                let _ = held.join_next().await;
            }
        });
        Self { task, opened }
    }

    /// Waits until `n` connections were opened: the pressure is on.
    async fn opened_at_least(&self, n: usize) {
        eventually(Duration::from_secs(30), "the pressure's sockets", || {
            let opened = self.opened.load(std::sync::atomic::Ordering::Relaxed);
            async move { (opened >= n).then_some(()) }
        })
        .await;
    }
}

impl Drop for Pressure {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Opens `count` connections to `to` from `from`, each sending `send`.
async fn open_sockets(
    from: &str,
    to: std::net::SocketAddr,
    count: usize,
    send: &[u8],
) -> Vec<tokio::net::TcpStream> {
    use tokio::io::AsyncWriteExt;
    let mut held = Vec::new();
    for _ in 0..count {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(format!("{from}:0").parse().expect("address"))
            .expect("bind");
        let mut stream = socket.connect(to).await.expect("connect");
        if !send.is_empty() {
            let _ = stream.write_all(send).await;
        }
        held.push(stream);
    }
    held
}

/// Whether the server closed every one of `held` (end of file or reset).
async fn all_closed(held: &mut [tokio::net::TcpStream], within: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let deadline = tokio::time::Instant::now() + within;
    for stream in held.iter_mut() {
        let mut buf = [0u8; 256];
        loop {
            match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
                Ok(Ok(0) | Err(_)) => break,
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
    }
    true
}

/// A stranger keeps 600 half-sent requests open from one address against a
/// control plane whose open-file limit is 512 (as a small machine has it):
/// every real client at another address still gets its answers, the API's
/// and the agents'. Half-sent requests the server took are closed once
/// their headers are late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_requests_from_one_address_lock_out_no_one() {
    const HALF: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: drover\r\n";
    let cp = ControlPlane::start_limited(ControlPlane::prepare(), &[], Some(512));
    cp.apply_device("half-1", &["half"], json!({})).await;
    let api: std::net::SocketAddr = cp.api.trim_start_matches("http://").parse().expect("api");
    let pressure = Pressure::start("127.0.0.2", api, 600, HALF);
    pressure.opened_at_least(600).await;
    // Real clients, at 127.0.0.1, while the pressure is on.
    for _ in 0..20 {
        assert_eq!(cp.healthz().await, (200, "ok\n".to_owned()));
    }
    let agent = AgentProcess::start(
        &cp.dir.path().join("half-1"),
        "half-1",
        &cp.agent_url,
        &cp.device_token("half-1"),
        "",
    );
    cp.wait_for_agents(&["half-1"]).await;
    cp.apply_upgrade_run("half-run", "half", 600).await;
    let run = cp
        .wait_run_finished("half-run", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}");
    agent.assert_one_job_run_once();
    drop(pressure);
    let log = std::fs::read_to_string(cp.dir.path().join("drover.log")).expect("log");
    assert!(
        log.contains("open_files=512"),
        "serve sizes its caps from its open-file limit"
    );
    // Half-sent requests the server took are closed once their headers are late.
    let mut held = open_sockets("127.0.0.5", api, 4, HALF).await;
    assert!(
        all_closed(&mut held, Duration::from_secs(30)).await,
        "a half-sent request was held open past the header timeout"
    );
    Ran::one("half_sent_requests_from_one_address_lock_out_no_one");
}

/// A stranger keeps 600 idle sockets open from one address on the agents'
/// port (no TLS, no upgrade, nothing), against a control plane whose
/// open-file limit is 512: a real device at another address connects and
/// runs its job. Idle sockets are closed when their handshake time is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sockets_on_the_agents_port_keep_no_device_out() {
    let cp = ControlPlane::start_limited(ControlPlane::prepare(), &[], Some(512));
    cp.apply_device("idle-1", &["idle"], json!({})).await;
    let agents: std::net::SocketAddr = cp
        .agent_url
        .trim_start_matches("ws://")
        .parse()
        .expect("agents");
    let pressure = Pressure::start("127.0.0.3", agents, 600, b"");
    pressure.opened_at_least(600).await;
    let agent = AgentProcess::start(
        &cp.dir.path().join("idle-1"),
        "idle-1",
        &cp.agent_url,
        &cp.device_token("idle-1"),
        "",
    );
    cp.wait_for_agents(&["idle-1"]).await;
    cp.apply_upgrade_run("idle-run", "idle", 600).await;
    let run = cp
        .wait_run_finished("idle-run", Duration::from_secs(60))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}");
    agent.assert_one_job_run_once();
    assert_eq!(cp.healthz().await.0, 200);
    drop(pressure);
    let mut held = open_sockets("127.0.0.5", agents, 4, b"").await;
    assert!(
        all_closed(&mut held, Duration::from_secs(30)).await,
        "an idle socket was held open past the handshake timeout"
    );
    Ran::one("idle_sockets_on_the_agents_port_keep_no_device_out");
}

// --------------------------------------------------------------- uploads ---

/// An upload that stops sending is cut off with a 408 after the stall
/// timeout and leaves no temporary file; a whole upload then goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upload_is_cut_off_and_leaves_nothing_behind() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let cp = ControlPlane::start(&["--upload-stall-seconds", "2"]);
    let address = cp.api.trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(&address)
        .await
        .expect("connect");
    let head = format!(
        "POST /api/v1/packages HTTP/1.1\r\nhost: {address}\r\nauthorization: Bearer {}\r\n\
         content-length: 100000\r\n\r\n",
        cp.token
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    stream.write_all(&[0u8; 1000]).await.expect("some body");
    // Then nothing: the server answers on its own, well before its 60 s
    // idle timeout would close the socket.
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    answer.extend_from_slice(&buf[..n]);
                    if String::from_utf8_lossy(&answer).contains("send it again") {
                        break;
                    }
                }
            }
        }
    })
    .await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        read.is_ok(),
        "no answer to a stalled upload within 20 s: {answer}"
    );
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("the upload stalled"), "{answer}");
    let packages = cp.dir.path().join("data").join("packages");
    let left: Vec<_> = std::fs::read_dir(&packages)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "the stalled upload left {left:?}");
    // The positive control: the same listener takes a whole upload.
    let (status, text) = api_call(
        &cp,
        Auth::Good,
        "POST",
        "/packages",
        handmade_deb(&[("./control", GOOD_CONTROL)]),
    )
    .await;
    assert_eq!(status, 201, "{text}");
}

/// Strangers who open TLS connections to the API and never say hello hold
/// only the handshake slots of their own address, each for at most the
/// handshake timeout: a real operator's client still gets through, and the
/// silent sockets are closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_tls_handshakes_lock_out_no_one_from_the_api() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The process's own open-file limit: at 512 files an address gets one
    // handshake slot, and a loaded machine's real client lost it now and then.
    let (cp, cert) = ControlPlane::start_with_api_tls(dir.path());
    let port = cp.api_port().to_owned();
    let api: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("api");
    let pinned = ControlPlane::pinned_client(&cert, Duration::from_secs(10));
    let healthz = || async {
        pinned
            .get(format!("https://localhost:{port}/healthz"))
            .send()
            .await
            .map(|r| r.status().as_u16())
            .map_err(|e| e.to_string())
    };
    // The positive control: the TLS API answers.
    assert_eq!(healthz().await, Ok(200));
    // 600 silent sockets from one address: more than all the API's handshake
    // slots, which without the per-address share would lock everyone out.
    let pressure = Pressure::start("127.0.0.2", api, 600, b"");
    pressure.opened_at_least(600).await;
    for _ in 0..20 {
        assert_eq!(
            healthz().await,
            Ok(200),
            "a real client got through the pressure"
        );
    }
    drop(pressure);
    // Silent handshakes the server took are closed at the handshake timeout.
    let mut held = open_sockets("127.0.0.5", api, 4, b"").await;
    assert!(
        all_closed(&mut held, Duration::from_secs(30)).await,
        "a silent TLS handshake was held open past the handshake timeout"
    );
}
