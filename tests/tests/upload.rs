//! The package store as an operator meets it (issue 30). `drover packages
//! upload` on a slow or broken link: a 200 MB package streams from disk with
//! the CLI's memory flat; an attempt the control plane stops taking bytes
//! from is cut off after --stall-seconds and sent again; an upload that
//! keeps breaking gives up with the reason after 3 attempts. And downloads
//! are on with the README's `serve` (agents on a wildcard address): links
//! name the host of the agents' certificate; with no name to give, apply
//! says which flag gives it. And every kind can be deleted, with what is
//! still in use refused and the command to run first named.

use drover_tests::{ControlPlane, big_deb, bin, peak_kib};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use tokio::net::TcpListener;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_mb_package_uploads_streamed_with_the_clis_memory_flat() {
    let cp = ControlPlane::start(&[]);
    let deb = big_deb(cp.dir.path(), "big-upload", "1.0", 200);
    let size = std::fs::metadata(&deb).expect("deb").len();
    let mut child = Command::new(bin("drover"))
        .args(["--server", &cp.api, "--token", &cp.token])
        .args(["packages", "upload"])
        .arg(&deb)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("drover packages upload");
    let pid = child.id();
    let mut peak = 0;
    while child.try_wait().expect("wait").is_none() {
        peak = peak.max(peak_kib(pid).unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let out = child.wait_with_output().expect("output");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&format!("({size} bytes,")),
        "the whole file: {text}"
    );
    println!("uploaded {size} bytes; the CLI's peak RSS {} KiB", peak);
    assert!(peak > 0, "the CLI's memory was read");
    assert!(
        peak < 64 * 1024,
        "the CLI's peak RSS was {peak} KiB for a {size}-byte upload"
    );
    let packages: Vec<Value> = serde_json::from_value(cp.get("/packages").await).expect("list");
    assert!(
        packages
            .iter()
            .any(|p| p["id"] == "big-upload_1.0_all" && p["size"] == size),
        "{packages:?}"
    );
}

/// A TCP front for the control plane's API whose first connection is
/// accepted and never read (a stalled link); later ones pass through.
async fn stalling_front(api: &str, stalled: usize) -> String {
    let target = api.trim_start_matches("http://").to_owned();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        let mut held = Vec::new();
        let mut accepted = 0;
        while let Ok((mut client, _)) = listener.accept().await {
            accepted += 1;
            if accepted <= stalled {
                held.push(client);
                continue;
            }
            let target = target.clone();
            tokio::spawn(async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(&target).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    format!("http://{address}")
}

fn upload_through(front: &str, token: &str, deb: &Path) -> (bool, String, String) {
    let out = Command::new(bin("drover"))
        .args(["--server", front, "--token", token])
        .args(["packages", "upload", "--stall-seconds", "2"])
        .arg(deb)
        .stdin(Stdio::null())
        .output()
        .expect("drover packages upload");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upload_is_cut_off_and_sent_again() {
    let cp = ControlPlane::start(&[]);
    // Larger than what the loopback's socket buffers take unread.
    let deb = big_deb(cp.dir.path(), "stalled-upload", "1.0", 48);

    // The first attempt stalls; the second gets through.
    let front = stalling_front(&cp.api, 1).await;
    let (ok, stdout, stderr) = upload_through(&front, &cp.token, &deb);
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stderr.contains("the upload stalled: the control plane took no bytes for 2 s"),
        "{stderr}"
    );
    assert!(stderr.contains("(attempt 2 of 3)"), "{stderr}");
    assert!(stdout.contains("stalled-upload_1.0_all"), "{stdout}");

    // Every attempt stalls: it gives up, saying why.
    let front = stalling_front(&cp.api, usize::MAX).await;
    let (ok, stdout, stderr) = upload_through(&front, &cp.token, &deb);
    assert!(!ok, "{stdout}{stderr}");
    assert!(stderr.contains("the upload failed 3 times"), "{stderr}");
    assert!(stderr.contains("the upload stalled"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_are_on_with_agents_on_a_wildcard_address() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let init = Command::new(bin("drover"))
        .arg("--data")
        .arg(&data)
        .args(["init", "--tls-name", "localhost", "--tls-name", "127.0.0.1"])
        .output()
        .expect("init");
    assert!(init.status.success(), "{init:?}");
    let tls = data.join("tls");
    let (cert, key) = (tls.join("server.pem"), tls.join("server.key"));
    let (mut child, ready) = drover_tests::serve_until_ready(
        &data,
        &[
            "--agent-listen",
            "0.0.0.0:0",
            "--agent-tls-cert",
            &cert.display().to_string(),
            "--agent-tls-key",
            &key.display().to_string(),
        ],
    );
    let _ = child.kill();
    let _ = child.wait();
    let port = ready["downloads"]
        .as_str()
        .and_then(|a| a.rsplit(':').next())
        .expect("downloads address")
        .to_owned();
    assert_eq!(
        ready["downloadUrl"],
        format!("https://localhost:{port}"),
        "{ready}"
    );

    // No certificate to take a name from: downloads are off, and apply says
    // how to turn them on.
    let (mut child, ready) =
        drover_tests::serve_until_ready(&data, &["--agent-listen", "0.0.0.0:0"]);
    assert!(ready["downloadUrl"].is_null(), "{ready}");
    let token = std::fs::read_to_string(data.join("operator.token")).expect("token");
    let answer = drover_tests::http_client()
        .post(format!(
            "http://{}/api/v1/apply",
            ready["api"].as_str().expect("api")
        ))
        .bearer_auth(token.trim())
        .json(&serde_json::json!({
            "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Deployment",
            "metadata": {"name": "no-downloads"},
            "spec": {"targets": {"all": true}, "maxConcurrency": 1, "deadlineSeconds": 600,
                     "packageInstallV1": {"package": "hello_1.0_all"}}
        }))
        .send()
        .await
        .expect("apply");
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(answer.status(), 400);
    let message = answer.text().await.expect("body");
    assert!(
        message.contains("--download-url https://HOST:PORT"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_is_deleted_once_nothing_unfinished_needs_it() {
    let cp = ControlPlane::start(&[]);
    let deb = big_deb(cp.dir.path(), "kiosk-app", "1.0", 1);
    let cli = |args: &[&str]| {
        let out = cp.cli(args);
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (ok, out) = cli(&["packages", "upload", deb.to_str().expect("utf-8")]);
    assert!(ok, "{out}");
    let package = "kiosk-app_1.0_all";
    let sha = cp.get("/packages").await[0]["sha256"]
        .as_str()
        .expect("sha")
        .to_owned();
    let blob = cp.dir.path().join(format!("data/packages/{sha}.deb"));
    assert!(blob.exists());
    cp.apply(serde_json::json!({
        "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Secret",
        "metadata": {"name": "kiosk"}, "spec": {"data": {"token": "t"}}
    }))
    .await;
    cp.apply_device("del-1", &["lab"], serde_json::json!({}))
        .await;
    let _agent = drover_tests::AgentProcess::start(
        &cp.dir.path().join("del-1"),
        "del-1",
        &cp.agent_url,
        &cp.device_token("del-1"),
        "",
    );
    cp.wait_for_agents(&["del-1"]).await;
    // Its window opens in two hours: the deployment stays unfinished, its
    // target pending.
    let hour = (jiff::Timestamp::now().as_second().rem_euclid(86_400) / 3600) as i8;
    let at = |h: i8| format!("{:02}:00", (h + 24) % 24);
    cp.apply(serde_json::json!({
        "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Deployment",
        "metadata": {"name": "kiosk"},
        "spec": {"targets": {"devices": ["del-1"]}, "maxConcurrency": 1, "deadlineSeconds": 600,
                 "maintenanceWindow": {"start": at(hour + 2), "end": at(hour + 3), "timeZone": "UTC"},
                 "packageInstallV1": {"package": package, "secrets": ["kiosk"]}}
    }))
    .await;
    drover_tests::eventually(
        Duration::from_secs(30),
        "the deployment to start",
        || async {
            let d = cp.get("/deployments/kiosk").await;
            (d["status"]["phase"] == "Running" && d["status"]["pending"] == 1).then_some(())
        },
    )
    .await;
    cp.apply(serde_json::json!({
        "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "TaskSchedule",
        "metadata": {"name": "nightly"},
        "spec": {"schedule": {"cron": "0 3 * * *"},
                 "template": {"spec": {"allowedGroups": ["lab"], "deadlineSeconds": 600,
                                       "systemUpgradeV1": {}}}}
    }))
    .await;

    // What get prints, apply takes back unchanged.
    for (kind, name) in [("deployment", "kiosk"), ("taskschedule", "nightly")] {
        let (ok, yaml) = cli(&["get", kind, name, "-o", "yaml"]);
        assert!(ok, "{yaml}");
        let file = cp.dir.path().join(format!("{kind}.yaml"));
        std::fs::write(&file, yaml).expect("write");
        let (ok, out) = cli(&["apply", "-f", file.to_str().expect("utf-8")]);
        assert!(
            ok && out.contains(&format!("{kind}/{name} unchanged")),
            "{kind}: {out}"
        );
    }

    for (kind, name, refusal) in [
        (
            "deployment",
            "kiosk",
            "cancel it first (drover cancel deployment kiosk)",
        ),
        ("secret", "kiosk", "needed by Deployment kiosk"),
        ("package", package, "installed by Deployment kiosk"),
    ] {
        let (ok, out) = cli(&["delete", kind, name]);
        assert!(!ok && out.contains(refusal), "{kind}: {out}");
    }
    assert!(blob.exists(), "a refused delete keeps the file");
    let (ok, out) = cli(&["cancel", "deployment", "kiosk"]);
    assert!(ok, "{out}");
    drover_tests::eventually(Duration::from_secs(30), "the deployment to end", || async {
        let phase = cp.get("/deployments/kiosk").await["status"]["phase"].clone();
        (phase == "Failed" || phase == "Complete").then_some(())
    })
    .await;
    for (kind, name, said) in [
        ("deployment", "kiosk", "deployment/kiosk deleted"),
        ("secret", "kiosk", "secret/kiosk deleted"),
        ("package", package, "bytes freed"),
        ("taskschedule", "nightly", "the runs it made stay"),
    ] {
        let (ok, out) = cli(&["delete", kind, name]);
        assert!(ok && out.contains(said), "{kind}: {out}");
        let (ok, out) = cli(&["delete", kind, name]);
        assert!(!ok && out.contains("not found"), "{kind} again: {out}");
    }
    assert!(!blob.exists(), "the package's file is gone");
    for path in ["/deployments", "/secrets", "/packages", "/taskschedules"] {
        assert_eq!(cp.get(path).await, serde_json::json!([]), "{path}");
    }
}
