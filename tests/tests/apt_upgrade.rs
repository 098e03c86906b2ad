//! The real system upgrade against real apt and dpkg inside disposable Debian
//! roots (debootstrap, cached per machine, copied per test) fed by a local
//! repository the test builds. A real drover-agent process runs the job; a
//! scripted control plane sends it. The host's packages are never touched.

use drover_tests::debroot::{Pkg, Sandbox};
use drover_tests::script::{Script, intent, new_job};
use drover_tests::{AgentProcess, ControlPlane, bin, eventually, toml_string};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tokio::net::TcpListener;

const DEVICE: &str = "apt-1";
const APT_TIMEOUT: Duration = Duration::from_secs(180);

/// A sandbox, an agent in upgrade mode pointed at it, and a scripted server.
struct Rig {
    /// Filesystems mounted inside the sandbox: unmounted first (fields
    /// drop in order), before the sandbox's directory is removed.
    _mounts: Vec<Mounted>,
    sandbox: Sandbox,
    listener: TcpListener,
    agent: AgentProcess,
    boot_id: PathBuf,
    server: Script,
}

impl Rig {
    async fn start(installed: &[Pkg], min_free_mib: u64) -> Self {
        Self::start_with(installed, min_free_mib, "").await
    }

    /// `testing` is appended to the agent's config (a `[testing]` table).
    async fn start_with(installed: &[Pkg], min_free_mib: u64, testing: &str) -> Self {
        let updater = format!("min_free_mib = {min_free_mib}");
        Self::start_in(Sandbox::new(), Vec::new(), installed, "", &updater, testing).await
    }

    /// The same in a sandbox the test prepared (with `mounts` inside it);
    /// `top` and `updater` add keys to the agent's config.
    async fn start_in(
        sandbox: Sandbox,
        mounts: Vec<Mounted>,
        installed: &[Pkg],
        top: &str,
        updater: &str,
        testing: &str,
    ) -> Self {
        sandbox.publish(installed);
        let names: Vec<&str> = installed.iter().map(|p| p.name.as_str()).collect();
        sandbox.install(&names);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("ws://{}", listener.local_addr().expect("addr"));
        let boot_id = sandbox.dir.path().join("boot_id");
        std::fs::write(&boot_id, "boot-1\n").expect("boot id");
        let agent = AgentProcess::start_with(
            &sandbox.dir.path().join("agent"),
            DEVICE,
            &url,
            "token",
            &format!(
                "boot_id_path = {}\n{top}",
                toml_string(&boot_id.display().to_string())
            ),
            &format!(
                "mode = \"upgrade\"\nroot = {}\n{updater}",
                toml_string(&sandbox.root.display().to_string())
            ),
            testing,
        );
        let server = Script::accept(&listener, DEVICE).await;
        Self {
            _mounts: mounts,
            sandbox,
            listener,
            agent,
            boot_id,
            server,
        }
    }

    /// Sends a system upgrade and returns its job id.
    async fn upgrade(&mut self, expires_in: i64) -> String {
        let job = new_job();
        self.server
            .send_job(intent(
                &job,
                DEVICE,
                json!({"systemUpgradeV1": {}}),
                expires_in,
            ))
            .await;
        job
    }

    async fn result(&mut self, job: &str) -> Value {
        let result = self.server.result_within(job, APT_TIMEOUT).await;
        result["status"].clone()
    }

    /// Kills the agent (SIGKILL) and starts it again; the old connection is dropped.
    async fn restart_agent(&mut self) {
        self.agent.kill9();
        self.agent.restart();
        self.server = Script::accept(&self.listener, DEVICE).await;
    }

    /// The job's status says Succeeded; else the status and the agent's log.
    fn assert_succeeded(&self, status: &Value) {
        assert_eq!(
            status["state"],
            "Succeeded",
            "{status:#}\n{}",
            self.agent.log()
        );
    }

    fn version(&self, name: &str) -> String {
        self.sandbox.package(name).unwrap_or_default()
    }

    fn touch(&self, inside: &str) {
        std::fs::write(self.sandbox.path(inside), "").expect("touch");
    }

    fn remove(&self, inside: &str) {
        let _ = std::fs::remove_file(self.sandbox.path(inside));
    }

    async fn wait_for_file(&self, inside: &str) {
        let path = self.sandbox.path(inside);
        eventually(
            Duration::from_secs(60),
            &format!("{} to appear", path.display()),
            || {
                let found = path.exists();
                async move { found.then_some(()) }
            },
        )
        .await;
    }

    /// How many full-upgrade runs apt recorded in its history.
    fn full_upgrade_runs(&self) -> usize {
        std::fs::read_to_string(self.sandbox.path("/var/log/apt/history.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("Commandline:") && l.contains("full-upgrade"))
            .count()
    }
}

/// An agent in upgrade mode in `sandbox`, connected to `cp` as DEVICE.
fn agent_of(cp: &ControlPlane, sandbox: &Sandbox) -> AgentProcess {
    AgentProcess::start_with(
        &sandbox.dir.path().join("agent"),
        DEVICE,
        &cp.agent_url,
        &cp.device_token(DEVICE),
        "",
        &format!(
            "mode = \"upgrade\"\nroot = {}\nmin_free_mib = 10",
            toml_string(&sandbox.root.display().to_string())
        ),
        "",
    )
}

fn steps(status: &Value) -> Vec<(String, String, u64)> {
    status["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or("").to_owned(),
                s["state"].as_str().unwrap_or("").to_owned(),
                s["tries"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

fn step<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["steps"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == name))
        .expect("step")
}

fn all_done_once(status: &Value) -> bool {
    steps(status)
        .iter()
        .all(|(_, state, tries)| state == "Done" && *tries == 1)
}

fn base(version: &str) -> Pkg {
    Pkg::new("drover-fake-base", version)
}

fn conf(version: &str) -> Pkg {
    Pkg::new("drover-fake-conf", version).conffile(
        "/etc/drover-fake/fake.conf",
        &format!("setting = {version}\n"),
    )
}

/// Its 2.0 maintainer scripts mark that they run and wait while a hold file exists.
fn slow(version: &str) -> Pkg {
    let pkg = Pkg::new("drover-fake-slow", version);
    if version == "1.0" {
        return pkg;
    }
    pkg.preinst("touch /tmp/IN_PREINST\nwhile [ -e /tmp/HOLD_PREINST ]; do sleep 0.1; done")
        .postinst("touch /tmp/IN_POSTINST\nwhile [ -e /tmp/HOLD_POSTINST ]; do sleep 0.1; done")
}

fn reboot_pkg(version: &str) -> Pkg {
    let pkg = Pkg::new("drover-fake-reboot", version);
    if version == "1.0" {
        return pkg;
    }
    pkg.postinst("touch /run/reboot-required\necho drover-fake-reboot >> /run/reboot-required.pkgs")
}

/// Stands for the agent's own package: its upgrade is when a naive package
/// would restart the agent.
fn agent_pkg(version: &str) -> Pkg {
    let pkg = Pkg::new("drover-agent", version);
    if version == "1.0" {
        return pkg;
    }
    pkg.preinst(
        "touch /tmp/AGENT_PKG_PREINST\nwhile [ -e /tmp/HOLD_AGENT_PKG ]; do sleep 0.1; done",
    )
}

/// Holds a POSIX (fcntl) lock as apt takes it; flock would not block apt.
struct LockHolder(Child);

impl LockHolder {
    fn hold(path: &Path, seconds: u32) -> Self {
        let script = "import fcntl, sys, time\nf = open(sys.argv[1], 'a')\nfcntl.lockf(f, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(float(sys.argv[2]))\n";
        let mut child = Command::new("python3")
            .args(["-c", script])
            .arg(path)
            .arg(seconds.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 holds the lock");
        let mut line = String::new();
        use std::io::BufRead;
        std::io::BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read");
        assert_eq!(line.trim(), "locked");
        Self(child)
    }
}

impl Drop for LockHolder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Kills the dpkg process running inside this sandbox.
fn kill_dpkg_in(root: &Path) -> bool {
    let root = root.canonicalize().expect("root");
    let mut killed = false;
    for entry in std::fs::read_dir("/proc").expect("proc").flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        let in_root = std::fs::read_link(entry.path().join("root")).is_ok_and(|r| r == root);
        if comm.trim() == "dpkg" && in_root {
            killed |= Command::new("kill")
                .args(["-KILL", &pid])
                .status()
                .is_ok_and(|s| s.success());
        }
    }
    killed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_upgrade_keeps_local_conffiles() {
    let mut rig = Rig::start(&[base("1.0"), conf("1.0")], 10).await;
    std::fs::write(
        rig.sandbox.path("/etc/drover-fake/fake.conf"),
        "setting = local edit\n",
    )
    .expect("edit");
    rig.sandbox.publish(&[base("2.0"), conf("2.0")]);
    let job = rig.upgrade(3600).await;
    let status = rig.result(&job).await;
    rig.assert_succeeded(&status);
    assert!(all_done_once(&status), "{:?}", steps(&status));
    assert_eq!(rig.version("drover-fake-base"), "2.0 ii");
    assert_eq!(rig.version("drover-fake-conf"), "2.0 ii");
    let conf_text =
        std::fs::read_to_string(rig.sandbox.path("/etc/drover-fake/fake.conf")).expect("conf");
    assert_eq!(
        conf_text, "setting = local edit\n",
        "the local edit is kept (--force-confold)"
    );
    assert!(
        rig.sandbox
            .path("/etc/drover-fake/fake.conf.dpkg-dist")
            .exists(),
        "the new default is beside it"
    );
    let report = &status["output"]["upgrade"];
    assert_eq!(report["simulated"], false);
    let upgraded: Vec<&str> = report["upgraded"]
        .as_array()
        .expect("upgraded")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(
        upgraded,
        vec!["drover-fake-base", "drover-fake-conf"],
        "{report}"
    );
    assert_eq!(report["rebootRequired"], false);
    assert_eq!(rig.full_upgrade_runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lists_lock_is_waited_for() {
    let mut rig = Rig::start(&[base("1.0")], 10).await;
    rig.sandbox.publish(&[base("2.0")]);
    let _lock = LockHolder::hold(&rig.sandbox.path("/var/lib/apt/lists/lock"), 20);
    let job = rig.upgrade(3600).await;
    let status = rig.result(&job).await;
    rig.assert_succeeded(&status);
    let update = step(&status, "update-lists");
    assert!(
        update["tries"].as_u64().unwrap_or(0) >= 2,
        "retried while locked: {update}"
    );
    assert!(
        update["seconds"].as_f64().unwrap_or(0.0) >= 15.0,
        "waited for the lock: {update}"
    );
    assert_eq!(rig.version("drover-fake-base"), "2.0 ii");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_dpkg_frontend_lock_is_waited_for() {
    let mut rig = Rig::start(&[base("1.0")], 10).await;
    rig.sandbox.publish(&[base("2.0")]);
    let _lock = LockHolder::hold(&rig.sandbox.path("/var/lib/dpkg/lock-frontend"), 8);
    let job = rig.upgrade(3600).await;
    let status = rig.result(&job).await;
    rig.assert_succeeded(&status);
    let upgrade = step(&status, "full-upgrade");
    assert!(
        upgrade["seconds"].as_f64().unwrap_or(0.0) >= 5.0,
        "apt waited for the lock: {upgrade}"
    );
    assert_eq!(rig.version("drover-fake-base"), "2.0 ii");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apt_survives_an_agent_killed_mid_upgrade_and_nothing_runs_twice() {
    let mut rig = Rig::start(&[slow("1.0")], 10).await;
    rig.sandbox.publish(&[slow("2.0")]);
    rig.touch("/tmp/HOLD_PREINST");
    let job = rig.upgrade(3600).await;
    rig.wait_for_file("/tmp/IN_PREINST").await;
    rig.agent.kill9();
    rig.remove("/tmp/HOLD_PREINST");
    // apt goes on without the agent, and its wrapper records the outcome
    // (a moment after dpkg's database says 2.0: apt still runs its hooks).
    let calls = rig.agent.dir.join("state/calls");
    eventually(
        Duration::from_secs(60),
        "apt to finish without the agent",
        || {
            let upgraded = rig.version("drover-fake-slow") == "2.0 ii";
            let recorded = std::fs::read_dir(&calls).is_ok_and(|entries| {
                entries.flatten().any(|e| {
                    e.path()
                        .to_string_lossy()
                        .ends_with("-full-upgrade-0-full-upgrade")
                        && e.path().join("exit").exists()
                })
            });
            async move { (upgraded && recorded).then_some(()) }
        },
    )
    .await;
    rig.agent.restart();
    rig.server = Script::accept(&rig.listener, DEVICE).await;
    let status = rig.result(&job).await;
    rig.assert_succeeded(&status);
    assert!(all_done_once(&status), "{:?}", steps(&status));
    assert_eq!(rig.full_upgrade_runs(), 1, "apt's full-upgrade ran once");
    assert!(
        rig.agent
            .log()
            .contains("reading the outcome of a call an earlier agent started")
    );
}

async fn dpkg_killed_during(phase: &str, broken_state: &str) {
    let mut rig = Rig::start(&[slow("1.0")], 10).await;
    rig.sandbox.publish(&[slow("2.0")]);
    let hold = format!("/tmp/HOLD_{phase}");
    rig.touch(&hold);
    let first = rig.upgrade(3600).await;
    rig.wait_for_file(&format!("/tmp/IN_{phase}")).await;
    assert!(kill_dpkg_in(&rig.sandbox.root), "found dpkg to kill");
    rig.remove(&hold);
    let status = rig.result(&first).await;
    assert_eq!(status["state"], "Failed", "{status:#}");
    assert_eq!(step(&status, "full-upgrade")["state"], "Failed");
    assert!(
        rig.version("drover-fake-slow").starts_with(broken_state),
        "{}",
        rig.version("drover-fake-slow")
    );

    let second = rig.upgrade(3600).await;
    let status = rig.result(&second).await;
    rig.assert_succeeded(&status);
    assert_eq!(
        rig.version("drover-fake-slow"),
        "2.0 ii",
        "the next run repaired dpkg"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dpkg_killed_in_postinst_is_repaired_by_the_next_run() {
    // Half-configured: dpkg --configure -a finishes it.
    dpkg_killed_during("POSTINST", "2.0 iF").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dpkg_killed_in_preinst_is_repaired_by_the_next_run() {
    // Half-installed, reinst-required: only a reinstall fixes it.
    dpkg_killed_during("PREINST", "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reboot_is_confirmed_only_under_a_new_boot_id() {
    let mut rig = Rig::start(&[reboot_pkg("1.0")], 10).await;
    rig.sandbox.publish(&[reboot_pkg("2.0")]);
    let job = rig.upgrade(3600).await;
    let waiting = rig
        .server
        .state_of(&job, "AwaitingReboot", APT_TIMEOUT)
        .await;
    assert_eq!(step(&waiting["status"], "reboot")["state"], "Running");
    rig.wait_for_file("/run/drover-reboot-requested").await;
    // The same boot: a restarted agent asks for the reboot again, and waits.
    rig.restart_agent().await;
    rig.server.pump(Duration::from_secs(2)).await;
    let jobs = rig.agent.jobs();
    assert_eq!(
        jobs[0]["state"], "AwaitingReboot",
        "no success without a new boot: {jobs}"
    );
    // The device comes back: a new boot id, and /run is empty again.
    std::fs::write(&rig.boot_id, "boot-2\n").expect("boot id");
    rig.remove("/run/reboot-required");
    rig.remove("/run/reboot-required.pkgs");
    rig.remove("/run/drover-reboot-requested");
    rig.restart_agent().await;
    let status = rig.result(&job).await;
    rig.assert_succeeded(&status);
    assert_eq!(status["bootId"], "boot-2");
    assert_eq!(step(&status, "reboot")["state"], "Done");
    assert_eq!(step(&status, "confirm")["state"], "Done");
    assert_eq!(status["output"]["upgrade"]["rebootRequired"], true);
    assert!(status["completionHeartbeatAt"].is_string());
    assert_eq!(rig.version("drover-fake-reboot"), "2.0 ii");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_own_package_upgrade_does_not_kill_dpkg() {
    let mut rig = Rig::start(&[agent_pkg("1.0"), base("1.0")], 10).await;
    rig.sandbox.publish(&[agent_pkg("2.0"), base("2.0")]);
    rig.touch("/tmp/HOLD_AGENT_PKG");
    let job = rig.upgrade(3600).await;
    rig.wait_for_file("/tmp/AGENT_PKG_PREINST").await;
    // What a naive package would do: restart the agent in the middle of its own upgrade.
    rig.restart_agent().await;
    eventually(
        Duration::from_secs(20),
        "the new agent to re-attach",
        || {
            let attached = rig
                .agent
                .log()
                .contains("re-attaching to a call still running");
            async move { attached.then_some(()) }
        },
    )
    .await;
    rig.remove("/tmp/HOLD_AGENT_PKG");
    let status = rig.result(&job).await;
    rig.assert_succeeded(&status);
    assert!(all_done_once(&status), "{:?}", steps(&status));
    assert_eq!(rig.version("drover-agent"), "2.0 ii");
    assert_eq!(rig.version("drover-fake-base"), "2.0 ii");
    assert_eq!(rig.full_upgrade_runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_enough_disk_space_fails_before_apt_runs() {
    let mut rig = Rig::start(&[base("1.0")], 1_000_000).await;
    rig.sandbox.publish(&[base("2.0")]);
    let job = rig.upgrade(3600).await;
    let status = rig.result(&job).await;
    assert_eq!(status["state"], "Failed");
    let error = status["error"].as_str().unwrap_or("");
    assert!(
        error.contains("step preflight failed: not enough free space on"),
        "{error}"
    );
    assert!(error.contains("MiB required"), "{error}");
    assert_eq!(rig.version("drover-fake-base"), "1.0 ii");
    assert_eq!(rig.full_upgrade_runs(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intent_that_expired_while_queued_never_starts() {
    let mut rig = Rig::start(&[slow("1.0")], 10).await;
    rig.sandbox.publish(&[slow("2.0")]);
    rig.touch("/tmp/HOLD_PREINST");
    let first = rig.upgrade(3600).await;
    rig.wait_for_file("/tmp/IN_PREINST").await;
    let second = rig.upgrade(3).await;
    let waiting = rig
        .server
        .state_of(&second, "Waiting", Duration::from_secs(10))
        .await;
    assert_eq!(waiting["type"], "progress");
    rig.server.pump(Duration::from_secs(4)).await;
    rig.remove("/tmp/HOLD_PREINST");
    assert_eq!(rig.result(&first).await["state"], "Succeeded");
    let status = rig.result(&second).await;
    assert_eq!(status["state"], "Expired", "{status:#}");
    assert!(
        status["error"]
            .as_str()
            .unwrap_or("")
            .contains("while it waited in the queue"),
        "{status}"
    );
    assert!(
        steps(&status)
            .iter()
            .all(|(_, state, tries)| state == "Pending" && *tries == 0)
    );
    assert_eq!(rig.full_upgrade_runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_upgrade_prints_its_steps_and_resumes_from_its_failed_step() {
    let fail = |version: &str| {
        let pkg = Pkg::new("drover-fake-fail", version);
        if version == "1.0" {
            return pkg;
        }
        pkg.postinst("if [ -e /tmp/FAIL ]; then echo 'configured to fail' >&2; exit 1; fi")
    };
    let rig = Rig::start(&[base("1.0"), fail("1.0")], 10).await;
    rig.sandbox.publish(&[base("2.0"), fail("2.0")]);
    rig.touch("/tmp/FAIL");
    let socket = rig.agent.socket.clone();
    let run = |args: Vec<String>| {
        let out = Command::new(bin("drover-agent"))
            .args(args)
            .output()
            .expect("drover-agent upgrade");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let socket_arg = socket.display().to_string();
    let (code, stdout) = run(vec![
        "upgrade".into(),
        "--socket".into(),
        socket_arg.clone(),
    ]);
    assert_eq!(code, Some(1), "{stdout}\n{}", rig.agent.log());
    assert!(
        stdout.contains("preflight") && stdout.contains("Done"),
        "{stdout}"
    );
    assert!(
        stdout.contains("full-upgrade") && stdout.contains("Failed"),
        "{stdout}"
    );
    let job_id = stdout
        .lines()
        .find_map(|l| l.strip_prefix("job ").and_then(|r| r.split(':').next()))
        .expect("job id")
        .to_owned();
    assert!(
        stdout.contains(&format!("drover-agent upgrade --resume {job_id}")),
        "{stdout}"
    );

    rig.remove("/tmp/FAIL");
    let (code, stdout) = run(vec![
        "upgrade".into(),
        "--resume".into(),
        job_id.clone(),
        "--socket".into(),
        socket_arg.clone(),
    ]);
    assert_eq!(code, Some(0), "{stdout}\n{}", rig.agent.log());
    assert!(
        stdout.contains(&format!("job {job_id}: Succeeded")),
        "{stdout}"
    );
    assert_eq!(rig.version("drover-fake-fail"), "2.0 ii");
    assert_eq!(rig.version("drover-fake-base"), "2.0 ii");
    let jobs = rig.agent.jobs();
    let steps = steps(&jobs[0]);
    assert_eq!(
        steps[0],
        ("preflight".to_owned(), "Done".to_owned(), 1),
        "preflight did not run again"
    );
    assert_eq!(steps[2].0, "full-upgrade");
    assert_eq!(steps[2].2, 2, "full-upgrade ran again after the resume");

    // A fleet job or a finished job cannot be resumed.
    let (code, _) = run(vec![
        "upgrade".into(),
        "--resume".into(),
        job_id,
        "--socket".into(),
        socket_arg,
    ]);
    assert_eq!(code, Some(1));
}

/// The session id of a process (field 6 of /proc/PID/stat).
fn session_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(3)?.parse().ok()
}

/// What a power cut does to processes: the agent and every process of the
/// detached call's session (the wrapper, apt-get, dpkg, the maintainer
/// script) stop in one instant, before any of them can react or write.
fn power_cut(agent: &mut AgentProcess, call_dir: &Path) {
    let wrapper: u32 = std::fs::read_to_string(call_dir.join("pid"))
        .expect("the call's pid")
        .trim()
        .parse()
        .expect("pid");
    let session = session_of(wrapper).expect("the call's session");
    let mut pids: Vec<String> = std::fs::read_dir("/proc")
        .expect("proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| session_of(*pid) == Some(session))
        .map(|pid| pid.to_string())
        .collect();
    assert!(pids.len() >= 3, "wrapper, apt-get and dpkg: {pids:?}");
    pids.push(agent.pid().expect("agent runs").to_string());
    for signal in ["-STOP", "-KILL"] {
        Command::new("kill")
            .arg(signal)
            .args(&pids)
            .status()
            .expect("kill");
    }
    agent.kill9();
}

/// Issue 8, 2: the power fails while dpkg unpacks; after the "reboot" the
/// agent repairs dpkg and runs full-upgrade again instead of failing the
/// job. One job, Succeeded, every package installed, and the step's tries
/// show the resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_cut_while_dpkg_unpacks_resumes_the_upgrade() {
    let sandbox = Sandbox::new();
    sandbox.publish(&[slow("1.0"), base("1.0")]);
    sandbox.install(&["drover-fake-slow", "drover-fake-base"]);
    sandbox.publish(&[slow("2.0"), base("2.0")]);
    let cp = ControlPlane::start(&[]);
    cp.apply_device(DEVICE, &["fleet"], json!({})).await;
    let boot_id = sandbox.dir.path().join("boot_id");
    std::fs::write(&boot_id, "boot-1\n").expect("boot id");
    let agent_dir = sandbox.dir.path().join("agent");
    let mut agent = AgentProcess::start_with(
        &agent_dir,
        DEVICE,
        &cp.agent_url,
        &cp.device_token(DEVICE),
        &format!(
            "boot_id_path = {}",
            toml_string(&boot_id.display().to_string())
        ),
        &format!(
            "mode = \"upgrade\"\nroot = {}\nmin_free_mib = 10",
            toml_string(&sandbox.root.display().to_string())
        ),
        "",
    );
    cp.wait_for_agents(&[DEVICE]).await;
    std::fs::write(sandbox.path("/tmp/HOLD_PREINST"), "").expect("hold");
    cp.apply_upgrade_run("power-run", "fleet", 3600).await;
    let in_preinst = sandbox.path("/tmp/IN_PREINST");
    eventually(
        Duration::from_secs(120),
        "dpkg to unpack the slow package",
        || {
            let found = in_preinst.exists();
            async move { found.then_some(()) }
        },
    )
    .await;
    let calls = agent_dir.join("state/calls");
    let call_dir = std::fs::read_dir(&calls)
        .expect("calls")
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.to_string_lossy()
                .ends_with("-full-upgrade-0-full-upgrade")
        })
        .expect("the full-upgrade call");
    power_cut(&mut agent, &call_dir);
    // The device boots again: a new boot id; nothing holds dpkg any more.
    std::fs::write(&boot_id, "boot-2\n").expect("boot id");
    let _ = std::fs::remove_file(sandbox.path("/tmp/HOLD_PREINST"));
    let _ = std::fs::remove_file(&in_preinst);
    assert!(
        !sandbox
            .package("drover-fake-slow")
            .unwrap_or_default()
            .ends_with("ii"),
        "the power cut left dpkg mid-way"
    );
    agent.restart();
    let run = cp
        .wait_run_finished("power-run", Duration::from_secs(240))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}\n{}", agent.log());
    assert_eq!(run["status"]["succeeded"], 1);
    let targets = cp.targets("power-run").await;
    assert_eq!(targets.len(), 1, "one job on the control plane");
    let status = &targets[0]["status"];
    assert_eq!(status["state"], "Succeeded");
    let upgrade = step(status, "full-upgrade");
    assert_eq!(upgrade["state"], "Done");
    assert_eq!(
        upgrade["tries"], 2,
        "the lost call, then the resumed one: {upgrade}"
    );
    assert_eq!(step(status, "preflight")["tries"], 1, "preflight ran once");
    let jobs = agent.jobs();
    assert_eq!(jobs.as_array().map(Vec::len), Some(1), "{jobs}");
    let states = sandbox.chroot(&["dpkg-query", "-W", "-f", "${db:Status-Abbrev}${Package}\n"]);
    let states = String::from_utf8_lossy(&states.stdout);
    assert!(
        states.lines().all(|l| l.starts_with("ii ")),
        "every package installed: {states}"
    );
    assert_eq!(
        sandbox.package("drover-fake-slow").as_deref(),
        Some("2.0 ii")
    );
    assert_eq!(
        sandbox.package("drover-fake-base").as_deref(),
        Some("2.0 ii")
    );
    let log = agent.log();
    assert!(log.contains("resuming it at its current step"), "{log}");
    // The job's report names what the whole upgrade changed, from → to:
    // what dpkg's repair finished (the apt run that unpacked it ended with
    // the power; its old version from dpkg's log) and what the resumed run
    // did.
    let mut changed: Vec<(String, String, String)> = status["output"]["upgrade"]["upgraded"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let text = |v: &Value| v.as_str().unwrap_or("?").to_owned();
            (text(&c["name"]), text(&c["from"]), text(&c["to"]))
        })
        .collect();
    changed.sort();
    let expected = |name: &str| (name.to_owned(), "1.0".to_owned(), "2.0".to_owned());
    assert_eq!(
        changed,
        [expected("drover-fake-base"), expected("drover-fake-slow")],
        "{status}"
    );
    assert_eq!(
        targets[0]["resultText"],
        "upgraded 2 (drover-fake-base 1.0 → 2.0, drover-fake-slow 1.0 → 2.0)"
    );
}

/// Issue 8: the whole job's budget counts from the job's durable start,
/// across the agent's restart: a call re-attached after the budget ran out
/// is stopped and the job fails, naming the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jobs_budget_holds_across_calls_and_restarts() {
    let mut rig = Rig::start_with(&[slow("1.0")], 10, "[testing]\njob_budget_seconds = 10\n").await;
    rig.sandbox.publish(&[slow("2.0")]);
    rig.touch("/tmp/HOLD_PREINST");
    let job = rig.upgrade(3600).await;
    rig.wait_for_file("/tmp/IN_PREINST").await;
    let reached = jiff::Timestamp::now();
    rig.agent.kill9();
    // Past the budget while no agent runs (the job started before `reached`).
    eventually(Duration::from_secs(30), "the budget to run out", || async {
        (jiff::Timestamp::now() > reached + jiff::SignedDuration::from_secs(11)).then_some(())
    })
    .await;
    let restarted = jiff::Timestamp::now();
    rig.agent.restart();
    rig.server = Script::accept(&rig.listener, DEVICE).await;
    let status = rig.result(&job).await;
    let answered = jiff::Timestamp::now();
    assert_eq!(status["state"], "Failed", "{status:#}\n{}", rig.agent.log());
    let error = status["error"].as_str().unwrap_or("");
    assert!(error.contains("budget"), "{error}");
    assert_eq!(step(&status, "full-upgrade")["state"], "Failed");
    // Counted from the job's start, the budget ended before the restart; a
    // budget counted from the restart would end 10 s after it.
    let ran_out: jiff::Timestamp = error
        .split("ran out at ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|at| {
            at.trim_end_matches(|c: char| !c.is_ascii_digit() && c != 'Z')
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("the error names when the budget ran out: {error}"));
    assert!(
        ran_out < restarted,
        "the budget ran out at {ran_out}, after the restart at {restarted}: it was counted from the restart"
    );
    assert!(
        answered < restarted + jiff::SignedDuration::from_secs(8),
        "the job failed at {answered}, not at once after the restart at {restarted}"
    );
    assert!(
        rig.sandbox.path("/tmp/HOLD_PREINST").exists(),
        "the call was stopped, not released"
    );
}

/// What an upgrade did is the job's result everywhere it is shown (issue
/// 30): one line worded by the rules, the same in the API's run targets,
/// `describe taskrun` and `describe device`, which also lists the packages
/// from → to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_an_upgrade_did_reads_alike_in_describe_taskrun_and_describe_device() {
    let sandbox = Sandbox::new();
    sandbox.publish(&[base("1.0")]);
    sandbox.install(&["drover-fake-base"]);
    sandbox.publish(&[base("2.0")]);
    let cp = ControlPlane::start(&[]);
    cp.apply_device(DEVICE, &["fleet"], json!({})).await;
    let agent = agent_of(&cp, &sandbox);
    cp.wait_for_agents(&[DEVICE]).await;
    cp.apply_upgrade_run("result-run", "fleet", 3600).await;
    let run = cp
        .wait_run_finished("result-run", Duration::from_secs(240))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}\n{}", agent.log());
    let targets = cp.targets("result-run").await;
    let result = targets[0]["resultText"]
        .as_str()
        .expect("a result line")
        .to_owned();
    assert_eq!(result, "upgraded 1 (drover-fake-base 1.0 → 2.0)");
    let text = |out: std::process::Output| String::from_utf8_lossy(&out.stdout).into_owned();
    let run_text = text(cp.cli(&["describe", "taskrun", "result-run"]));
    assert!(
        run_text.contains("RESULT") && run_text.contains(&result),
        "{run_text}"
    );
    let device_text = text(cp.cli(&["describe", "device", DEVICE]));
    assert!(device_text.contains(&result), "{device_text}");
    // The last upgrade that succeeded, with when it ended and its job.
    assert!(
        device_text
            .lines()
            .any(|l| l.starts_with("last upgrade: ") && l.ends_with(&format!(": {result}"))),
        "{device_text}"
    );
    assert!(
        device_text.contains("upgraded  drover-fake-base 1.0 → 2.0"),
        "{device_text}"
    );
}

/// Issue 56: an upgrade whose package's maintainer script fails ends
/// Failed with the script's, dpkg's and apt's own words on why in
/// `describe taskrun` (and the job's status), not one cut-down line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_upgrade_says_dpkgs_own_reason_in_describe_taskrun() {
    let sandbox = Sandbox::new();
    sandbox.publish(&[base("1.0")]);
    sandbox.install(&["drover-fake-base"]);
    sandbox.publish(&[
        base("2.0").postinst("echo 'site check failed: no /etc/site.conf' >&2\nexit 1")
    ]);
    let cp = ControlPlane::start(&[]);
    cp.apply_device(DEVICE, &["fleet"], json!({})).await;
    let agent = agent_of(&cp, &sandbox);
    cp.wait_for_agents(&[DEVICE]).await;
    cp.apply_upgrade_run("broken-run", "fleet", 3600).await;
    let run = cp
        .wait_run_finished("broken-run", Duration::from_secs(240))
        .await;
    assert_eq!(run["status"]["phase"], "Failed", "{run}\n{}", agent.log());
    let targets = cp.targets("broken-run").await;
    let reason: Vec<&str> = targets[0]["status"]["reason"]
        .as_array()
        .map(|lines| lines.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for said in [
        // The maintainer script's own words, then dpkg's and apt's.
        "site check failed: no /etc/site.conf",
        "dpkg: error processing package drover-fake-base (--configure):",
        "E: Sub-process /usr/bin/dpkg returned an error code (1)",
    ] {
        assert!(
            reason.contains(&said),
            "{said:?} is not in the reason: {reason:#?}"
        );
    }
    let described = String::from_utf8_lossy(&cp.cli(&["describe", "taskrun", "broken-run"]).stdout)
        .into_owned();
    let block: Vec<&str> = described
        .lines()
        .skip_while(|l| *l != format!("why {DEVICE} failed:"))
        .collect();
    assert!(
        block
            .iter()
            .any(|l| l.trim() == "dpkg: error processing package drover-fake-base (--configure):"),
        "{described}"
    );

    // Issue 56, item 1: the device keeps the job's whole output, and
    // `drover-agent logs` prints it: the failing call's command and exit
    // status, apt's progress lines (which are in no reason) and the
    // script's own words, on the device, with no control plane asked.
    let job = targets[0]["status"]["jobId"].as_str().expect("job id");
    let (ok, logs) = agent.cli(&["logs", &job[..8]]);
    assert!(ok, "{logs}");
    let header = logs
        .lines()
        .find(|l| {
            l.starts_with(&format!(
                "== job {job}, step full-upgrade (try 1), full-upgrade: "
            ))
        })
        .unwrap_or_else(|| panic!("no header of the full upgrade's call:\n{logs}"));
    assert!(
        header.contains("apt-get") && header.ends_with("; exit 100]"),
        "{header}"
    );
    for said in [
        "Preparing to unpack",
        "Setting up drover-fake-base (2.0) ...",
        "site check failed: no /etc/site.conf",
        "E: Sub-process /usr/bin/dpkg returned an error code (1)",
    ] {
        assert!(
            logs.lines().any(|l| l.contains(said)),
            "{said:?} not in:\n{logs}"
        );
    }
    // The latest job's when none is named; its end with --tail.
    let (ok, latest) = agent.cli(&["logs"]);
    assert!(ok && latest == logs, "{latest}");
    let (ok, tail) = agent.cli(&["logs", "--tail", "2"]);
    assert!(ok, "{tail}");
    let last_two: Vec<&str> = logs
        .lines()
        .rev()
        .take(2)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    assert_eq!(tail.lines().collect::<Vec<_>>(), last_two);
    // A job the device has no output of: refused, saying what is kept.
    let (ok, none) = agent.cli(&["logs", "00000000-0000-4000-8000-000000000000"]);
    assert!(!ok && none.contains("no output of job"), "{none}");
    // Item 3: the same words through the control plane, fetched from the
    // device over its transport, with no shell on it.
    let fetched = cp.cli(&["logs", DEVICE, &job[..8]]);
    assert!(
        fetched.status.success(),
        "{}",
        String::from_utf8_lossy(&fetched.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&fetched.stdout), logs);
}

/// A small ext4 filesystem loop-mounted at a directory (a Raspberry Pi's
/// /boot/firmware partition, say); unmounted when dropped.
struct Mounted(PathBuf);

impl Mounted {
    fn new(image: &Path, at: &Path, mib: u32) -> Self {
        let make = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0"])
            .arg(image)
            .arg(format!("{mib}M"))
            .output()
            .expect("mkfs.ext4");
        assert!(make.status.success(), "mkfs.ext4: {make:?}");
        std::fs::create_dir_all(at).expect("mount point");
        let mount = Command::new("mount")
            .args(["-o", "loop"])
            .arg(image)
            .arg(at)
            .output()
            .expect("mount");
        assert!(mount.status.success(), "mount -o loop: {mount:?}");
        Self(at.to_owned())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A Raspberry Pi OS kernel: `linux-image-RELEASE` ships its modules and
/// `/boot/vmlinuz-RELEASE`, and its postinst copies the image to the
/// firmware partition under the name the Pi's firmware boots (what
/// raspi-firmware's kernel hook does); `linux-image-rpi-FLAVOUR` (epoch 1,
/// as the archive's) depends on it.
fn pi_kernel(flavour: &str, upstream: &str, image: &str) -> [Pkg; 2] {
    let release = format!("{upstream}+rpt-rpi-{flavour}");
    let kernel = Pkg::new(
        &format!("linux-image-{release}"),
        &format!("1:{upstream}-1+rpt1"),
    )
    .file(&format!("/lib/modules/{release}/modules.dep"), "")
    .file(&format!("/boot/vmlinuz-{release}"), &"k".repeat(256 * 1024))
    .postinst(&format!(
        "cp /boot/vmlinuz-{release} /boot/firmware/{image}.new\nmv /boot/firmware/{image}.new /boot/firmware/{image}"
    ));
    let meta = Pkg::new(
        &format!("linux-image-rpi-{flavour}"),
        &format!("1:{upstream}-1+rpt1"),
    )
    .depends(&format!("linux-image-{release}"));
    [kernel, meta]
}

/// Issue 32, 3: Raspberry Pi OS's kernels under real apt and dpkg, with
/// /boot/firmware a filesystem of its own. A Pi 4 (64-bit image, running
/// rpi-v8; the Pi 5's rpi-2712 installed beside it): a full firmware
/// partition stops the upgrade before apt runs; a new rpi-2712 kernel does
/// not reboot it; a new rpi-v8 kernel does, with no reboot-required file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raspberry_pi_kernels_reboot_for_the_running_flavour_and_a_full_firmware_partition_stops_first()
 {
    let sandbox = Sandbox::new();
    let firmware = Mounted::new(
        &sandbox.dir.path().join("firmware.img"),
        &sandbox.path("/boot/firmware"),
        24,
    );
    let release = sandbox.dir.path().join("osrelease");
    std::fs::write(&release, "6.6.51+rpt-rpi-v8\n").expect("osrelease");
    let [v8, v8_meta] = pi_kernel("v8", "6.6.51", "kernel8.img");
    let [pi5, pi5_meta] = pi_kernel("2712", "6.6.51", "kernel_2712.img");
    let mut rig = Rig::start_in(
        sandbox,
        vec![firmware],
        &[v8, v8_meta, pi5, pi5_meta],
        &format!(
            "kernel_release_path = {}",
            toml_string(&release.display().to_string())
        ),
        "min_free_mib = 10\nmin_free_boot_mib = 64",
        "",
    )
    .await;
    assert!(
        rig.sandbox.path("/boot/firmware/kernel8.img").exists(),
        "the kernels' images are on the firmware partition"
    );

    // 1. A firmware partition of 24 MiB, 64 MiB asked for: preflight says so.
    rig.sandbox
        .publish(&pi_kernel("2712", "6.6.62", "kernel_2712.img"));
    let job = rig.upgrade(3600).await;
    let status = rig.result(&job).await;
    assert_eq!(status["state"], "Failed", "{status:#}");
    let error = status["error"].as_str().unwrap_or("");
    assert!(
        error.contains("not enough free space on")
            && error.contains("/boot/firmware")
            && error.contains("min_free_boot_mib"),
        "{error}"
    );
    assert_eq!(rig.full_upgrade_runs(), 0);

    // 2. Room enough: the Pi 5's kernel is upgraded; this Pi 4 does not reboot.
    let config = std::fs::read_to_string(&rig.agent.config).expect("config");
    std::fs::write(
        &rig.agent.config,
        config.replace("min_free_boot_mib = 64", "min_free_boot_mib = 4"),
    )
    .expect("config");
    rig.restart_agent().await;
    let job = rig.upgrade(3600).await;
    let status = rig.result(&job).await;
    rig.assert_succeeded(&status);
    assert_eq!(
        status["output"]["upgrade"]["rebootRequired"], false,
        "{status:#}"
    );
    assert!(
        rig.sandbox
            .path("/lib/modules/6.6.62+rpt-rpi-2712/modules.dep")
            .exists()
    );
    assert!(!rig.sandbox.path("/run/drover-reboot-requested").exists());
    assert_eq!(
        std::fs::read(rig.sandbox.path("/boot/firmware/kernel_2712.img")).ok(),
        std::fs::read(rig.sandbox.path("/boot/vmlinuz-6.6.62+rpt-rpi-2712")).ok(),
        "the new kernel is on the firmware partition"
    );

    // 3. A new kernel of the running flavour, and no /run/reboot-required
    // (Raspberry Pi OS often writes none): the agent reboots.
    rig.sandbox
        .publish(&pi_kernel("v8", "6.6.62", "kernel8.img"));
    let job = rig.upgrade(3600).await;
    rig.server
        .state_of(&job, "AwaitingReboot", APT_TIMEOUT)
        .await;
    rig.wait_for_file("/run/drover-reboot-requested").await;
    assert!(!rig.sandbox.path("/run/reboot-required").exists());
    assert!(
        rig.agent
            .log()
            .contains("kernel 6.6.62+rpt-rpi-v8 is installed, 6.6.51+rpt-rpi-v8 is running"),
        "{}",
        rig.agent.log()
    );
}
