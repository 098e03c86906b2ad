//! The .deb packages, built by cross/package-deb.sh from this build's
//! binaries: lintian reports no errors or warnings; each depends on the
//! glibc its binary needs; in a disposable Debian root the agent
//! installs with dpkg, runs, answers on its status socket; remove keeps the
//! config and the state directory, purge leaves nothing behind.

use drover_tests::debroot::Sandbox;
use drover_tests::{bin, eventually};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .to_owned()
}

/// Builds both packages for amd64 from the binaries next to the test.
fn build_packages(out: &Path) -> (PathBuf, PathBuf) {
    let bin_dir = bin("drover-agent").parent().expect("bin dir").to_owned();
    let status = Command::new("bash")
        .arg(workspace().join("cross/package-deb.sh"))
        .arg("amd64")
        .arg(&bin_dir)
        .arg(out)
        .stdout(Stdio::null())
        .status()
        .expect("run package-deb.sh");
    assert!(status.success(), "package-deb.sh failed");
    let find = |name: &str| {
        std::fs::read_dir(out)
            .expect("out dir")
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|f| f.to_string_lossy().starts_with(&format!("{name}_")))
            })
            .expect("package built")
    };
    (find("drover-agent"), find("drover"))
}

/// /proc mounted inside the sandbox while the agent runs there; unmounted
/// when dropped, also when the test fails.
struct ProcMount(PathBuf);

impl ProcMount {
    fn new(target: &Path) -> Self {
        let status = Command::new("mount")
            .args(["-t", "proc", "proc"])
            .arg(target)
            .status()
            .expect("mount");
        assert!(status.success(), "cannot mount /proc in the sandbox");
        Self(target.to_owned())
    }
}

impl Drop for ProcMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn chroot_ok(sandbox: &Sandbox, args: &[&str]) -> String {
    let out = sandbox.chroot(args);
    assert!(
        out.status.success(),
        "{args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_package_installs_runs_and_leaves_nothing_after_purge() {
    let out = tempfile::tempdir().expect("tempdir");
    let (agent_deb, drover_deb) = build_packages(out.path());

    let lintian = Command::new("lintian")
        .args(["--fail-on", "warning", "--tag-display-limit", "0"])
        .arg(&agent_deb)
        .arg(&drover_deb)
        .output()
        .expect("lintian is installed (the README's test command installs it)");
    let report = String::from_utf8_lossy(&lintian.stdout);
    assert!(
        lintian.status.success()
            && !report
                .lines()
                .any(|l| l.starts_with("E:") || l.starts_with("W:")),
        "lintian errors or warnings:\n{report}"
    );
    each_package_depends_on_the_glibc_its_binary_needs(out.path(), &agent_deb, &drover_deb);

    let sandbox = Sandbox::new();
    for deb in [&agent_deb, &drover_deb] {
        std::fs::copy(
            deb,
            sandbox.path("/tmp").join(deb.file_name().expect("name")),
        )
        .expect("copy deb");
    }
    let inside = |deb: &Path| format!("/tmp/{}", deb.file_name().expect("name").to_string_lossy());
    chroot_ok(
        &sandbox,
        &["dpkg", "-i", &inside(&agent_deb), &inside(&drover_deb)],
    );
    assert!(chroot_ok(&sandbox, &["drover-agent", "--version"]).starts_with("drover-agent 0.1.0"));
    assert!(chroot_ok(&sandbox, &["drover", "--version"]).starts_with("drover 0.1.0"));
    let groups = std::fs::read_to_string(sandbox.path("/etc/group")).expect("group file");
    assert!(
        groups.lines().any(|l| l.starts_with("drover:")),
        "the status group exists"
    );
    assert!(
        sandbox
            .path("/lib/systemd/system/drover-agent.service")
            .exists()
    );
    let shipped =
        std::fs::read_to_string(sandbox.path("/etc/drover/agent.toml")).expect("conffile");
    assert!(shipped.contains("#device_id"), "commented defaults");

    // Configure the device and run the agent from the package. It reads the
    // boot id from /proc, as on a device.
    let _proc = ProcMount::new(&sandbox.path("/proc"));
    let config = concat!(
        "device_id = \"pkg-1\"\nintent_public_keys = [\"4131ea6931676e90420f76f3c1b8042b04b929b48156310c02c9a7b80adfe065\"]\n\n[transport]\nkind = \"websocket\"\n",
        "server_url = \"ws://127.0.0.1:9\"\ntoken = \"t\"\n\n[updater]\nmode = \"simulate\"\n"
    );
    std::fs::write(sandbox.path("/etc/drover/agent.toml"), config).expect("config");
    assert!(
        chroot_ok(
            &sandbox,
            &[
                "drover-agent",
                "--config",
                "/etc/drover/agent.toml",
                "check"
            ]
        )
        .contains("device pkg-1")
    );
    let mut agent = Command::new("chroot")
        .arg(&sandbox.root)
        .args(["drover-agent", "--config", "/etc/drover/agent.toml", "run"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the packaged agent");
    let socket = sandbox.path("/run/drover-agent/status.sock");
    eventually(Duration::from_secs(20), "the status socket", || {
        let ready = socket.exists();
        async move { ready.then_some(()) }
    })
    .await;
    let status = chroot_ok(
        &sandbox,
        &[
            "drover-agent",
            "--config",
            "/etc/drover/agent.toml",
            "status",
            "--json",
        ],
    );
    let status: serde_json::Value = serde_json::from_str(&status).expect("status json");
    assert_eq!(status["deviceId"], "pkg-1");
    let host_boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").expect("boot id");
    assert_eq!(status["bootId"], host_boot_id.trim());
    use std::os::unix::fs::MetadataExt;
    let gid = std::fs::metadata(&socket).expect("socket").gid();
    let drover_gid: u32 = groups
        .lines()
        .find(|l| l.starts_with("drover:"))
        .and_then(|l| l.split(':').nth(2))
        .and_then(|g| g.parse().ok())
        .expect("gid");
    assert_eq!(gid, drover_gid, "the socket belongs to the status group");
    let _ = Command::new("kill")
        .args(["-TERM", &agent.id().to_string()])
        .status();
    let _ = agent.wait();
    let _ = std::fs::remove_dir_all(sandbox.path("/run/drover-agent"));

    // Remove: binaries and unit go, config and state stay.
    chroot_ok(&sandbox, &["dpkg", "-r", "drover-agent"]);
    assert!(!sandbox.path("/usr/bin/drover-agent").exists());
    assert!(
        !sandbox
            .path("/lib/systemd/system/drover-agent.service")
            .exists()
    );
    assert!(
        sandbox.path("/etc/drover/agent.toml").exists(),
        "remove keeps the conffile"
    );
    assert!(
        sandbox.path("/var/lib/drover-agent").exists(),
        "remove keeps the state directory"
    );
    // Purge: nothing of the agent is left.
    chroot_ok(&sandbox, &["dpkg", "-P", "drover-agent"]);
    for path in [
        "/etc/drover",
        "/var/lib/drover-agent",
        "/usr/share/doc/drover-agent",
        "/usr/bin/drover-agent",
    ] {
        assert!(!sandbox.path(path).exists(), "{path} is left after purge");
    }
    chroot_ok(&sandbox, &["dpkg", "-P", "drover"]);
    assert!(!sandbox.path("/usr/bin/drover").exists());
    let leftovers = chroot_ok(
        &sandbox,
        &["dpkg-query", "-W", "-f", "${Package} ${db:Status-Abbrev}\n"],
    );
    assert!(!leftovers.contains("drover"), "{leftovers}");
}

/// The highest glibc version a binary asks the loader for: its `GLIBC_2.N`
/// version needs, and `GLIBC_ABI_DT_RELR` (packed relative relocations),
/// which glibc has from 2.36.
fn glibc_needed(binary: &Path) -> (u32, u32) {
    let out = Command::new("objdump")
        .arg("-p")
        .arg(binary)
        .output()
        .expect("objdump (binutils) is installed");
    assert!(out.status.success(), "objdump -p {}", binary.display());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|word| match word {
            "GLIBC_ABI_DT_RELR" => Some((2, 36)),
            _ => {
                let (major, minor) = word.strip_prefix("GLIBC_")?.split_once('.')?;
                let minor = minor.split('.').next()?;
                Some((major.parse().ok()?, minor.parse().ok()?))
            }
        })
        .max()
        .expect("a glibc version need")
}

/// The `libc6 (>= 2.N)` floor of a package's Depends.
fn libc_floor(deb: &Path) -> (u32, u32) {
    let out = Command::new("dpkg-deb")
        .args(["-f"])
        .arg(deb)
        .arg("Depends")
        .output()
        .expect("dpkg-deb");
    let depends = String::from_utf8_lossy(&out.stdout).into_owned();
    let version = depends
        .split(',')
        .find_map(|d| d.trim().strip_prefix("libc6 (>= "))
        .and_then(|v| v.strip_suffix(')'))
        .unwrap_or_else(|| panic!("no libc6 floor in Depends: {depends}"));
    let (major, minor) = version.split_once('.').expect("2.N");
    (major.parse().expect("major"), minor.parse().expect("minor"))
}

/// Each package depends on the glibc its binary needs: a device whose libc
/// is older is refused by apt instead of left with an agent that cannot start.
fn each_package_depends_on_the_glibc_its_binary_needs(
    out: &Path,
    agent_deb: &Path,
    drover_deb: &Path,
) {
    for (deb, name) in [(agent_deb, "drover-agent"), (drover_deb, "drover")] {
        let root = out.join(format!("{name}-root"));
        let status = Command::new("dpkg-deb")
            .arg("-x")
            .arg(deb)
            .arg(&root)
            .status()
            .expect("dpkg-deb -x");
        assert!(status.success());
        let needed = glibc_needed(&root.join("usr/bin").join(name));
        let floor = libc_floor(deb);
        assert!(
            floor >= needed,
            "{name} needs glibc {needed:?} but its package depends on libc6 (>= {floor:?})"
        );
    }
    // The agent is linked with packed relative relocations (agent/build.rs).
    let root = out.join("drover-agent-root");
    assert_eq!(glibc_needed(&root.join("usr/bin/drover-agent")), (2, 36));
}
