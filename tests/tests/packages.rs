//! PackageInstallV1 end to end: `drover packages upload` a real .deb, a
//! Deployment installs it through real agents over WebSocket into
//! disposable Debian roots with real apt and dpkg; a file that does not
//! match the package store's checksum fails its job and installs nothing;
//! no download link is ever stored by the control plane.

use drover_sandbox::{Pkg, Sandbox};
use drover_tests::{AgentProcess, ControlPlane, eventually, toml_string};
use serde_json::{Value, json};
use std::process::Output;
use std::time::Duration;

const API_VERSION: &str = "fleet.nationtech.io/v1alpha1";

fn drover(cp: &ControlPlane, args: &[&str]) -> Output {
    cp.cli(args)
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// An agent in upgrade mode whose updater works inside `sandbox`.
fn agent_in(cp: &ControlPlane, device: &str, sandbox: &Sandbox) -> AgentProcess {
    AgentProcess::start_with(
        &cp.dir.path().join(device),
        device,
        &cp.agent_url,
        &cp.device_token(device),
        "",
        &format!(
            "mode = \"upgrade\"\nroot = {}\nmin_free_mib = 10",
            toml_string(&sandbox.root.display().to_string())
        ),
        "",
    )
}

async fn deploy(cp: &ControlPlane, name: &str, group: &str, package: &str) -> Value {
    cp.apply(drover_tests::install_deployment(name, group, package))
        .await;
    eventually(
        Duration::from_secs(120),
        &format!("deployment {name} to finish"),
        || async {
            let d = cp.get(&format!("/deployments/{name}")).await;
            matches!(d["status"]["phase"].as_str(), Some("Complete" | "Failed")).then_some(d)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_package_deployment_installs_the_verified_deb_and_a_tampered_one_installs_nothing() {
    let cp = ControlPlane::start(&[]);
    let build = tempfile::tempdir().expect("build dir");
    let good = Pkg::new("drover-hello", "1.2-1").build(build.path(), build.path());
    let bad = Pkg::new("drover-bad", "1.0").build(build.path(), build.path());

    // Upload: the id, size and checksum come from the file itself.
    let out = drover(&cp, &["packages", "upload", good.to_str().expect("path")]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("drover-hello_1.2-1_all"),
        "{}",
        text(&out)
    );
    // The same file again changes nothing.
    let again = drover(&cp, &["packages", "upload", good.to_str().expect("path")]);
    assert!(again.status.success(), "{}", text(&again));
    // The audit log names each upload, its package and checksum (issue 35).
    let audit = drover(&cp, &["audit", "--kind", "Package", "-o", "json"]);
    let audit: serde_json::Value = serde_json::from_slice(&audit.stdout).expect("audit json");
    let results: Vec<(&str, &str)> = audit
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| {
            assert_eq!(e["verb"], "upload", "{e}");
            assert_eq!(e["bodyDigest"].as_str().map(str::len), Some(64), "{e}");
            (
                e["objects"][0]["name"].as_str().unwrap_or(""),
                e["objects"][0]["result"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        results,
        vec![
            ("drover-hello_1.2-1_all", "created"),
            ("drover-hello_1.2-1_all", "unchanged")
        ]
    );
    // Another file under the same name, version and architecture is refused.
    let other = tempfile::tempdir().expect("other");
    let impostor = Pkg::new("drover-hello", "1.2-1")
        .postinst("echo impostor")
        .build(other.path(), other.path());
    let refused = drover(
        &cp,
        &["packages", "upload", impostor.to_str().expect("path")],
    );
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(
        text(&refused).contains("another file"),
        "{}",
        text(&refused)
    );
    // Not a package at all.
    let junk = build.path().join("junk.deb");
    std::fs::write(&junk, b"not a deb").expect("junk");
    let refused = drover(&cp, &["packages", "upload", junk.to_str().expect("path")]);
    assert!(
        !refused.status.success() && text(&refused).contains("not a Debian package"),
        "{}",
        text(&refused)
    );
    let out = drover(&cp, &["packages", "upload", bad.to_str().expect("path")]);
    assert!(out.status.success(), "{}", text(&out));
    let listed = drover(&cp, &["get", "packages"]);
    assert!(
        text(&listed).contains("drover-hello_1.2-1_all")
            && text(&listed).contains("drover-bad_1.0_all"),
        "{}",
        text(&listed)
    );

    // The stored copy of drover-bad is damaged after upload (same size,
    // one byte changed): the agent must notice.
    let packages: Vec<Value> = serde_json::from_value(cp.get("/packages").await).expect("packages");
    let bad_sha = packages
        .iter()
        .find(|p| p["id"] == "drover-bad_1.0_all")
        .and_then(|p| p["sha256"].as_str())
        .expect("bad package")
        .to_owned();
    let stored = cp
        .dir
        .path()
        .join("data/packages")
        .join(format!("{bad_sha}.deb"));
    let mut bytes = std::fs::read(&stored).expect("stored package");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&stored, bytes).expect("damage");

    // A package that is not in the store is refused at apply, by name.
    let missing = build.path().join("missing.json");
    let manifest = json!({
        "apiVersion": API_VERSION, "kind": "Deployment",
        "metadata": {"name": "missing"},
        "spec": {
            "targets": {"all": true},
            "packageInstallV1": {"package": "nothing_1_all"},
            "maxConcurrency": 1,
            "deadlineSeconds": 600
        }
    });
    std::fs::write(&missing, manifest.to_string()).expect("manifest");
    let refused = drover(&cp, &["apply", "-f", missing.to_str().expect("path")]);
    assert!(
        !refused.status.success() && text(&refused).contains("not in the package store"),
        "{}",
        text(&refused)
    );

    let roots = [Sandbox::new(), Sandbox::new(), Sandbox::new()];
    for (device, group) in [("p1", "hello"), ("p2", "hello"), ("p3", "bad")] {
        cp.apply_device(device, &[group], json!({})).await;
    }
    let _agents: Vec<AgentProcess> = [("p1", 0), ("p2", 1), ("p3", 2)]
        .iter()
        .map(|(device, i)| agent_in(&cp, device, &roots[*i]))
        .collect();
    cp.wait_for_agents(&["p1", "p2", "p3"]).await;

    let hello = deploy(&cp, "hello", "hello", "drover-hello_1.2-1_all").await;
    assert_eq!(hello["status"]["phase"], "Complete", "{hello}");
    assert_eq!(hello["status"]["succeeded"], 2, "{hello}");
    for root in &roots[..2] {
        assert_eq!(root.package("drover-hello").as_deref(), Some("1.2-1 ii"));
        assert_eq!(
            std::fs::read_to_string(root.path("/usr/share/doc/drover-hello/version"))
                .expect("installed file"),
            "1.2-1\n"
        );
        let cache = root.path("/var/cache/drover-agent/packages");
        let left: Vec<_> = std::fs::read_dir(&cache)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "the installed file stays behind: {left:?}");
    }

    let bad = deploy(&cp, "bad", "bad", "drover-bad_1.0_all").await;
    assert_eq!(bad["status"]["phase"], "Failed", "{bad}");
    assert_eq!(bad["status"]["failed"], 1, "{bad}");
    assert!(
        bad.to_string().contains("does not match the package store"),
        "{bad}"
    );
    assert_eq!(
        roots[2].package("drover-bad"),
        None,
        "a bad file was installed"
    );

    // Links are made at delivery and never stored by the control plane:
    // the signatures the agents were given (read from their own stores,
    // which keep the intent) appear in no file of the control plane's.
    let mut signatures = std::collections::BTreeSet::new();
    for device in ["p1", "p2"] {
        for file in drover_tests::files_under(&cp.dir.path().join(device)) {
            let bytes = std::fs::read(&file).unwrap_or_default();
            let mut rest = bytes.as_slice();
            while let Some(at) = rest.windows(4).position(|w| w == b"sig=") {
                let value: Vec<u8> = rest[at + 4..]
                    .iter()
                    .take_while(|b| b.is_ascii_alphanumeric() || **b == b'-' || **b == b'_')
                    .copied()
                    .collect();
                if value.len() >= 16 {
                    signatures.insert(value);
                }
                rest = &rest[at + 4..];
            }
        }
    }
    assert!(
        !signatures.is_empty(),
        "the agents' stores hold the links they were given"
    );
    for signature in &signatures {
        let holding = drover_tests::files_holding(&cp.dir.path().join("data"), signature);
        assert!(
            holding.is_empty(),
            "a download link ({}) was written to {holding:?}",
            String::from_utf8_lossy(signature)
        );
    }
}

/// A download that broke off resumes where it stopped (a Range request),
/// and a link that expired on the device's clock is replaced by a fresh one
/// asked for with the device's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_download_resumes_and_an_expired_link_is_refreshed() {
    let cp = ControlPlane::start(&[]);
    let build = tempfile::tempdir().expect("build dir");
    // Big enough that half of it is a real head start.
    let mut pkg = Pkg::new("drover-big", "3.0");
    let filler: String = (0..200_000u32).map(|i| format!("{i:08x}\n")).collect();
    pkg.files
        .push(("/usr/share/drover-big/data".into(), filler));
    let deb = pkg.build(build.path(), build.path());
    let out = drover(&cp, &["packages", "upload", deb.to_str().expect("path")]);
    assert!(out.status.success(), "{}", text(&out));
    let bytes = std::fs::read(&deb).expect("deb");
    let sha = {
        let digest = ring::digest::digest(&ring::digest::SHA256, &bytes);
        digest
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };

    // The first half already on the device, as a broken download leaves it.
    let root = Sandbox::new();
    let cache = root.path("/var/cache/drover-agent/packages");
    std::fs::create_dir_all(&cache).expect("cache");
    let half = bytes.len() / 2;
    std::fs::write(cache.join(format!("{sha}.part")), &bytes[..half]).expect("part");

    cp.apply_device("r1", &["big"], json!({})).await;
    // Two hours fast: every link it is given has expired on its clock.
    let agent = AgentProcess::start_with(
        &cp.dir.path().join("r1"),
        "r1",
        &cp.agent_url,
        &cp.device_token("r1"),
        "",
        &format!(
            "mode = \"upgrade\"\nroot = {}\nmin_free_mib = 10",
            toml_string(&root.root.display().to_string())
        ),
        "[testing]\nclock_offset_seconds = 7200\n",
    );
    cp.wait_for_agents(&["r1"]).await;
    let d = deploy(&cp, "big", "big", "drover-big_3.0_all").await;
    assert_eq!(d["status"]["phase"], "Complete", "{d}\n{}", agent.log());
    assert_eq!(root.package("drover-big").as_deref(), Some("3.0 ii"));
    let log = agent.log();
    assert!(
        log.contains("the download link expired; asking for a fresh one"),
        "{log}"
    );
    let resumed = log
        .lines()
        .find(|l| l.contains("download resumed"))
        .unwrap_or_else(|| panic!("no resumed download:\n{log}"));
    assert!(resumed.contains(&half.to_string()), "{resumed}");
    drop(agent);
    links_open_only_what_was_given_while_the_token_and_device_last(&cp).await;
}

/// Issue 53, findings 8 and 9, on the control plane of the test above,
/// where device r1 was given drover-big_3.0_all: r1 gets a link to it and
/// the link serves the file (the positive control); r2, registered and
/// given nothing, gets no link (403); a link r1 got before its token was
/// rotated is refused, as is one got before it was decommissioned.
async fn links_open_only_what_was_given_while_the_token_and_device_last(cp: &ControlPlane) {
    let ready: Value = serde_json::from_str(
        &std::fs::read_to_string(cp.dir.path().join("ready.json")).expect("ready file"),
    )
    .expect("ready json");
    let base = ready["downloadUrl"].as_str().expect("downloads are on");
    let http = drover_tests::http_client();
    let link = |device: &'static str, token: String| {
        let http = http.clone();
        let url =
            format!("{base}/api/agent/v1/packages/drover-big_3.0_all/download-url?device={device}");
        async move {
            let response = http
                .get(url)
                .bearer_auth(token)
                .send()
                .await
                .expect("refresh");
            let status = response.status().as_u16();
            (status, response.text().await.unwrap_or_default())
        }
    };
    let fetch = |url: String| {
        let http = http.clone();
        async move {
            http.get(url)
                .send()
                .await
                .expect("download")
                .status()
                .as_u16()
        }
    };
    let url_of = |text: &str| -> String {
        serde_json::from_str::<Value>(text).expect("a link")["url"]
            .as_str()
            .expect("url")
            .to_owned()
    };
    let (status, text) = link("r1", cp.device_token("r1")).await;
    assert_eq!(status, 200, "r1's own package: {text}");
    let before_rotation = url_of(&text);
    assert_eq!(
        fetch(before_rotation.clone()).await,
        200,
        "the link serves the file"
    );

    cp.apply_device("r2", &["other"], json!({})).await;
    let (status, text) = link("r2", cp.device_token("r2")).await;
    assert_eq!(status, 403, "a package never given to r2: {text}");
    assert!(text.contains("was not given to device r2"), "{text}");

    let rotated = std::process::Command::new(drover_tests::bin("drover"))
        .arg("--data")
        .arg(cp.dir.path().join("data"))
        .args(["--server", &cp.api, "--token", &cp.token])
        .args(["token", "r1", "--rotate"])
        .env_remove("DROVER_TOKEN")
        .output()
        .expect("drover token --rotate");
    assert!(
        rotated.status.success(),
        "{}",
        String::from_utf8_lossy(&rotated.stderr)
    );
    let token = String::from_utf8_lossy(&rotated.stdout).trim().to_owned();
    assert_eq!(
        fetch(before_rotation).await,
        403,
        "a link minted before the token's rotation"
    );
    let (status, text) = link("r1", token).await;
    assert_eq!(status, 200, "the rotated token gets a fresh link: {text}");
    let before_decommission = url_of(&text);
    assert_eq!(fetch(before_decommission.clone()).await, 200);
    cp.apply(
        json!({"apiVersion": drover_tests::API_VERSION, "kind": "Device",
        "metadata": {"name": "r1", "labels": {}},
        "spec": {"groups": ["big"], "decommissioned": true}}),
    )
    .await;
    assert_eq!(
        fetch(before_decommission).await,
        403,
        "a link minted before the device was decommissioned"
    );
}

/// `softwarePresent` / `softwareAbsent` with a Debian version comparison,
/// judged on the packages each device's inventory refresh reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_on_installed_software_follows_debian_version_order() {
    let cp = ControlPlane::start(&[]);
    let roots: Vec<Sandbox> = [Some("1.0-1"), Some("2.0~rc1"), None]
        .iter()
        .map(|version| {
            let root = Sandbox::new();
            if let Some(version) = version {
                root.publish(&[Pkg::new("drover-lib", version)]);
                root.install(&["drover-lib"]);
            }
            root
        })
        .collect();
    let mut agents = Vec::new();
    for (i, root) in roots.iter().enumerate() {
        let device = format!("s{}", i + 1);
        cp.apply_device(&device, &["fleet"], json!({})).await;
        agents.push(AgentProcess::start_with(
            &cp.dir.path().join(&device),
            &device,
            &cp.agent_url,
            &cp.device_token(&device),
            "",
            &format!(
                "mode = \"simulate\"\nroot = {}\nmin_free_mib = 10",
                toml_string(&root.root.display().to_string())
            ),
            "",
        ));
    }
    // In the group, connected, but never inventoried: its software is unknown.
    cp.apply_device("s4", &["fleet"], json!({})).await;
    agents.push(AgentProcess::start(
        &cp.dir.path().join("s4"),
        "s4",
        &cp.agent_url,
        &cp.device_token("s4"),
        "",
    ));
    cp.wait_for_agents(&["s1", "s2", "s3", "s4"]).await;

    let run = |name: &str, targets: Value| {
        json!({
            "apiVersion": API_VERSION, "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {
                "targets": targets,
                "inventoryRefreshV1": {},
                "maxConcurrency": 10,
                "deadlineSeconds": 600
            }
        })
    };
    let finished = |name: &str| {
        let name = name.to_owned();
        let cp = &cp;
        async move {
            eventually(
                Duration::from_secs(60),
                &format!("{name} to finish"),
                || async {
                    let d = cp.get(&format!("/deployments/{name}")).await;
                    matches!(d["status"]["phase"].as_str(), Some("Complete" | "Failed"))
                        .then_some(d)
                },
            )
            .await
        }
    };
    let targets_of = |name: &str| {
        let name = name.to_owned();
        let cp = &cp;
        async move {
            let page = cp.get(&format!("/deployments/{name}/targets")).await;
            let mut devices: Vec<String> = page["items"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|t| t["device"].as_str().unwrap_or("").to_owned())
                .collect();
            devices.sort();
            devices
        }
    };

    cp.apply(run("inventory", json!({"devices": ["s1", "s2", "s3"]})))
        .await;
    let d = finished("inventory").await;
    assert_eq!(d["status"]["phase"], "Complete", "{d}");

    // 2.0~rc1 sorts before 2.0: both installed versions are older.
    cp.apply(run(
        "old-lib",
        json!({"filter": {"groups": ["fleet"], "softwarePresent": [
            {"name": "drover-lib", "versionCmp": {"op": "<<", "version": "2.0"}}
        ]}}),
    ))
    .await;
    let d = finished("old-lib").await;
    assert_eq!(d["status"]["phase"], "Complete", "{d}");
    assert_eq!(targets_of("old-lib").await, ["s1", "s2"]);
    assert_eq!(d["status"]["excludedCount"], 1, "s4 has no inventory: {d}");

    cp.apply(run(
        "rc-only",
        json!({"filter": {"groups": ["fleet"], "softwarePresent": [
            {"name": "drover-lib", "versionCmp": {"op": ">=", "version": "2.0~"}}
        ]}}),
    ))
    .await;
    finished("rc-only").await;
    assert_eq!(targets_of("rc-only").await, ["s2"]);

    cp.apply(run(
        "no-lib",
        json!({"filter": {"groups": ["fleet"], "softwareAbsent": [{"name": "drover-lib"}]}}),
    ))
    .await;
    let d = finished("no-lib").await;
    assert_eq!(targets_of("no-lib").await, ["s3"]);
    assert_eq!(d["status"]["excludedCount"], 1, "{d}");

    // The package lists are kept once per device, not in every job record.
    let device = cp.get("/devices/s1/inventory").await;
    assert_eq!(device["packages"]["drover-lib"], "1.0-1", "{device}");

    // Issue 56: a software condition that rules out every device the
    // groups select is named, with the versions installed there: in the
    // dry run and in the NoTargets error. (s4, whose software is unknown,
    // goes first: a device that might match leaves nothing to name.)
    let out = cp.cli(&["delete", "device", "s4"]);
    assert!(out.status.success(), "{out:?}");
    let new_lib = run(
        "new-lib",
        json!({"filter": {"groups": ["fleet"], "softwarePresent": [
            {"name": "drover-lib", "versionCmp": {"op": ">=", "version": "3.0"}}
        ]}}),
    );
    let said = "softwarePresent drover-lib >= 3.0 holds on none of the 3 devices the groups \
                and labels select (installed there: 1.0-1, 2.0~rc1)";
    let manifest = cp.dir.path().join("new-lib.json");
    std::fs::write(&manifest, new_lib.to_string()).expect("manifest");
    let dry = cp.cli(&["apply", "-f", &manifest.display().to_string(), "--dry-run"]);
    let dry_text = String::from_utf8_lossy(&dry.stdout);
    assert!(
        !dry.status.success(),
        "nothing selected exits 1: {dry_text}"
    );
    assert!(
        dry_text.contains(&format!("matched nothing: {said}")),
        "{dry_text}"
    );
    cp.apply(new_lib).await;
    let d = finished("new-lib").await;
    assert_eq!(d["status"]["reason"], "NoTargets", "{d}");
    assert_eq!(
        d["status"]["latestError"],
        format!(
            "no device with an agent matches the targets (0 matching devices excluded): {said}"
        ),
        "{d}"
    );
}

/// A Secret reaches the device sealed to it and its job, is written as a
/// 0600 file before the package's maintainer scripts run, and is stored in
/// clear nowhere: not in the control plane's store, not in the agent's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_secret_reaches_the_device_sealed_and_rests_nowhere_in_clear() {
    let cp = ControlPlane::start(&[]);
    let value = format!("kiosk-token-{}", std::process::id());
    let manifest = |data: Value| {
        json!({
            "apiVersion": API_VERSION, "kind": "Secret",
            "metadata": {"name": "kiosk"},
            "spec": {"data": data}
        })
    };
    let applied = cp.apply(manifest(json!({"token": value}))).await;
    assert!(!applied.to_string().contains(&value), "{applied}");
    let listed = cp.get("/secrets").await;
    assert_eq!(listed[0]["keys"], json!(["token"]), "{listed}");
    assert!(!listed.to_string().contains(&value), "{listed}");

    let build = tempfile::tempdir().expect("build dir");
    let deb = Pkg::new("drover-kiosk", "1.0")
        .postinst("cp /etc/drover/secrets/kiosk/token /etc/kiosk-token")
        .build(build.path(), build.path());
    let out = drover(&cp, &["packages", "upload", deb.to_str().expect("path")]);
    assert!(out.status.success(), "{}", text(&out));

    // A deployment naming a Secret that does not exist is refused.
    let missing = build.path().join("missing.json");
    let spec = |secrets: Value| {
        json!({
            "apiVersion": API_VERSION, "kind": "Deployment",
            "metadata": {"name": "kiosk"},
            "spec": {
                "targets": {"devices": ["k1"]},
                "packageInstallV1": {"package": "drover-kiosk_1.0_all", "secrets": secrets},
                "maxConcurrency": 1,
                "retries": 0,
                "deadlineSeconds": 600
            }
        })
    };
    std::fs::write(&missing, spec(json!(["nope"])).to_string()).expect("manifest");
    let refused = drover(&cp, &["apply", "-f", missing.to_str().expect("path")]);
    assert!(
        !refused.status.success() && text(&refused).contains("no Secret nope"),
        "{}",
        text(&refused)
    );

    let root = Sandbox::new();
    cp.apply_device("k1", &["kiosks"], json!({})).await;
    let agent = agent_in(&cp, "k1", &root);
    cp.wait_for_agents(&["k1"]).await;
    cp.apply(spec(json!(["kiosk"]))).await;
    let d = eventually(Duration::from_secs(120), "the kiosk deployment", || async {
        let d = cp.get("/deployments/kiosk").await;
        matches!(d["status"]["phase"].as_str(), Some("Complete" | "Failed")).then_some(d)
    })
    .await;
    assert_eq!(d["status"]["phase"], "Complete", "{d}\n{}", agent.log());
    assert_eq!(
        std::fs::read_to_string(root.path("/etc/kiosk-token")).expect("copied by postinst"),
        value,
        "the secret was in place before the maintainer script ran"
    );
    let secret_file = root.path("/etc/drover/secrets/kiosk/token");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&secret_file)
        .expect("secret file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    // In clear nowhere else: no file the control plane or the agent wrote
    // (stores, logs, configs, anything under their directories) holds it.
    let files = drover_tests::files_under(cp.dir.path());
    assert!(
        files.iter().any(|f| f.ends_with("drover.redb"))
            && files.iter().any(|f| f.ends_with("agent.redb"))
            && files.iter().any(|f| f.ends_with("drover.log")),
        "the scan covers both stores and the logs: {files:?}"
    );
    let holding = drover_tests::files_holding(cp.dir.path(), value.as_bytes());
    assert!(holding.is_empty(), "the secret is in clear in {holding:?}");
}

/// Issue 56: a package whose dependency no archive has fails with apt's
/// own words on why (the unmet dependency, apt's `E:` line) in the job's
/// status, through the API and in `describe device`, with no shell on the
/// device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_package_with_an_unmet_dependency_fails_with_apts_own_reason() {
    let cp = ControlPlane::start(&[]);
    drover_tests::upload_needy_package(&cp);
    let root = Sandbox::new();
    cp.apply_device("n1", &["needy"], json!({})).await;
    let agent = agent_in(&cp, "n1", &root);
    cp.wait_for_agents(&["n1"]).await;

    let deployment = deploy(&cp, "needy", "needy", drover_tests::NEEDY_PACKAGE).await;
    assert_eq!(deployment["status"]["phase"], "Failed", "{deployment}");
    assert_eq!(root.package("drover-needy"), None, "installed anyway");

    let jobs = cp.get("/devices/n1/jobs").await;
    let job = &jobs["items"][0];
    assert_eq!(job["state"], "failed", "{jobs}\n{}", agent.log());
    let reason = drover_tests::reason_lines(job);
    assert!(
        reason.iter().any(|l| l.contains(drover_tests::NEEDY_UNMET)),
        "apt's unmet dependency is not in the reason: {reason:#?}\n{job:#}"
    );
    assert!(
        reason.iter().any(|l| l.starts_with("E: ")),
        "apt's error line is not in the reason: {reason:#?}"
    );
    // The one-line error stays one line; the reason is beside it.
    assert!(
        !job["error"].as_str().unwrap_or_default().contains('\n'),
        "{job:#}"
    );

    let described = text(&drover(&cp, &["describe", "device", "n1"]));
    let block = drover_tests::block_from(&described, "why job ");
    assert!(
        block.iter().any(|l| l.contains(drover_tests::NEEDY_UNMET)),
        "{described}"
    );
    // And under the deployment's errors, for the attempt that failed.
    let described = text(&drover(&cp, &["describe", "deployment", "needy"]));
    let block = drover_tests::block_from(&described, "why n1 (attempt 1) failed:");
    assert!(
        block.iter().any(|l| l.contains(drover_tests::NEEDY_UNMET)),
        "{described}"
    );
}
