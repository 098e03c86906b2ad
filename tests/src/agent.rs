//! `drover-agent run` as a process with its own directory.

use crate::{TEST_INTENT_PUBLIC_KEY, bin, eventually, log_tail, stop, toml_string};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// `drover-agent run` as a process with its own directory.
pub struct AgentProcess {
    child: Option<Child>,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub socket: PathBuf,
}

/// The `[transport]` table of an agent speaking NATS (user = device id,
/// password = token), trusting `ca_file` for `tls://`.
pub fn nats_transport(url: &str, token: &str, ca_file: Option<&Path>) -> String {
    format!(
        "kind = \"nats\"\nurl = {}\ntoken = {}\n{}heartbeat_seconds = 1\nbackoff_max_seconds = 2\n",
        toml_string(url),
        toml_string(token),
        ca_line(ca_file)
    )
}

/// The `[transport]` table of an agent speaking MQTT (user = device id,
/// password = token), trusting `ca_file` for `mqtts://`.
pub fn mqtt_transport(url: &str, token: &str, ca_file: Option<&Path>) -> String {
    format!(
        "kind = \"mqtt\"\nurl = {}\ntoken = {}\n{}heartbeat_seconds = 1\nbackoff_max_seconds = 2\n",
        toml_string(url),
        toml_string(token),
        ca_line(ca_file)
    )
}

fn ca_line(ca_file: Option<&Path>) -> String {
    ca_file
        .map(|p| format!("ca_file = {}\n", toml_string(&p.display().to_string())))
        .unwrap_or_default()
}

impl AgentProcess {
    /// Writes a config (simulate mode, 1 s heartbeats) and starts the agent.
    /// `extra` is appended to the config as TOML.
    pub fn start(dir: &Path, device: &str, server_url: &str, token: &str, extra: &str) -> Self {
        Self::start_with(
            dir,
            device,
            server_url,
            token,
            "",
            "mode = \"simulate\"\nmin_free_mib = 10",
            extra,
        )
    }

    /// An agent in simulate mode speaking NATS (user = device id, password = token).
    pub fn start_nats(
        dir: &Path,
        device: &str,
        nats_url: &str,
        token: &str,
        ca_file: Option<&Path>,
        extra: &str,
    ) -> Self {
        Self::start_full(
            dir,
            device,
            &nats_transport(nats_url, token, ca_file),
            "",
            "mode = \"simulate\"\nmin_free_mib = 10",
            extra,
        )
    }

    /// An agent in simulate mode speaking MQTT (user = device id, password = token).
    pub fn start_mqtt(dir: &Path, device: &str, url: &str, token: &str, extra: &str) -> Self {
        Self::start_mqtt_with(dir, device, url, token, None, extra)
    }

    /// Like [`AgentProcess::start_mqtt`], trusting `ca_file` for `mqtts://`.
    pub fn start_mqtt_with(
        dir: &Path,
        device: &str,
        url: &str,
        token: &str,
        ca_file: Option<&Path>,
        extra: &str,
    ) -> Self {
        Self::start_full(
            dir,
            device,
            &mqtt_transport(url, token, ca_file),
            "",
            "mode = \"simulate\"\nmin_free_mib = 10",
            extra,
        )
    }

    /// Like [`AgentProcess::start`], with top-level keys (`top`) and the
    /// `[updater]` table given by the test.
    pub fn start_with(
        dir: &Path,
        device: &str,
        server_url: &str,
        token: &str,
        top: &str,
        updater: &str,
        extra: &str,
    ) -> Self {
        let transport = format!(
            "kind = \"websocket\"\nserver_url = {}\ntoken = {}\nheartbeat_seconds = 1\nbackoff_max_seconds = 2\n",
            toml_string(server_url),
            toml_string(token)
        );
        Self::start_full(dir, device, &transport, top, updater, extra)
    }

    /// An agent with the `[transport]` table given whole.
    pub fn start_full(
        dir: &Path,
        device: &str,
        transport: &str,
        top: &str,
        updater: &str,
        extra: &str,
    ) -> Self {
        std::fs::create_dir_all(dir).expect("agent dir");
        let config = dir.join("agent.toml");
        let socket = dir.join("status.sock");
        // The agent's own assessments are off unless a test asks for them:
        // a local job after every upgrade would change what most tests see.
        let assessment = if extra.contains("[assessment]") {
            ""
        } else {
            "[assessment]\nevery_minutes = 0\n"
        };
        let text = format!(
            "device_id = {}\nintent_public_keys = [{}]\nstate_dir = {}\nstatus_socket = {}\n{top}\n\n\
             [transport]\n{transport}\n[updater]\n{updater}\n\n{assessment}{extra}\n",
            toml_string(device),
            toml_string(TEST_INTENT_PUBLIC_KEY),
            toml_string(&dir.join("state").display().to_string()),
            toml_string(&socket.display().to_string()),
        );
        std::fs::write(&config, text).expect("config");
        Self::start_written(dir, &config)
    }

    /// An agent with the config file given whole (its socket is
    /// `status.sock` in `dir`: the config should say so).
    pub fn start_written(dir: &Path, config: &Path) -> Self {
        let socket = dir.join("status.sock");
        let config = config.to_owned();
        let mut agent = Self {
            child: None,
            dir: dir.to_owned(),
            config,
            socket,
        };
        agent.restart();
        agent
    }

    pub fn restart(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("agent.log"))
            .expect("log");
        let child = Command::new(bin("drover-agent"))
            .arg("--config")
            .arg(&self.config)
            .arg("run")
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start drover-agent");
        self.child = Some(child);
    }

    /// SIGKILL: no shutdown path runs.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits for the agent to exit on its own; its exit code, or `None` on
    /// a signal. Panics after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let child = self.child.as_mut().expect("the agent was started");
            if let Some(status) = child.try_wait().expect("wait for the agent") {
                self.child = None;
                return status.code();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the agent did not exit within {timeout:?}\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    pub fn log(&self) -> String {
        log_tail(&self.dir.join("agent.log"))
    }

    /// `drover-agent assess` against this running agent (a local
    /// assessment through its queue); what it printed.
    pub fn assess(&self) -> String {
        let out = Command::new(bin("drover-agent"))
            .args(["assess", "--socket"])
            .arg(&self.socket)
            .output()
            .expect("drover-agent assess");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    }

    /// Whether any line of the agent's whole log contains `text`.
    pub fn logged(&self, text: &str) -> bool {
        std::fs::read_to_string(self.dir.join("agent.log"))
            .unwrap_or_default()
            .contains(text)
    }

    /// The agent's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Restarts the agent demanding more free space than any disk has, so
    /// every upgrade fails its preflight (a failing canary).
    pub fn fail_preflight(&mut self) {
        let config = std::fs::read_to_string(&self.config).expect("config");
        std::fs::write(
            &self.config,
            config.replace("min_free_mib = 10", "min_free_mib = 1000000"),
        )
        .expect("write config");
        self.kill9();
        self.restart();
    }

    /// Writes a finished apt call of `job` where this agent keeps its
    /// calls, as the agent leaves one (`updater_apt::output`): for agents
    /// that simulate, whose simulations keep no output.
    pub fn stage_call(&self, job: &str, exit: i32, stdout: &str, stderr: &str) {
        let call = self
            .dir
            .join("state/calls")
            .join(format!("{job}-full-upgrade-0-full-upgrade"));
        std::fs::create_dir_all(&call).expect("call dir");
        for (file, text) in [
            ("argv", "apt-get\n-y\nfull-upgrade\n".to_owned()),
            ("started", "1800000000".to_owned()),
            ("exit", exit.to_string()),
            ("out", stdout.to_owned()),
            ("err", stderr.to_owned()),
        ] {
            std::fs::write(call.join(file), text).expect("a call's file");
        }
    }

    /// `drover-agent ARGS --config` this agent's config: its exit status
    /// and what it printed (stdout, then stderr).
    pub fn cli(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(bin("drover-agent"))
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .output()
            .expect("drover-agent");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    /// `drover-agent status --json` against this agent's socket.
    pub fn status(&self) -> Value {
        let out = Command::new(bin("drover-agent"))
            .args(["status", "--json", "--socket"])
            .arg(&self.socket)
            .output()
            .expect("drover-agent status");
        assert!(
            out.status.success(),
            "status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("status json")
    }

    /// Waits until the agent holds no running or queued job and its outbox is
    /// empty: every status it has is confirmed by the transport.
    pub async fn wait_idle_and_flushed(&self, timeout: Duration) {
        eventually(
            timeout,
            "the agent to finish and flush its outbox",
            || async {
                let status = self.status();
                (status["currentJob"].is_null()
                    && status["queuedJobs"] == 0
                    && status["outboxPending"] == 0)
                    .then_some(())
            },
        )
        .await
    }

    /// Asserts the agent holds one job whose every step ran once: nothing
    /// ran twice.
    pub fn assert_one_job_run_once(&self) {
        self.assert_jobs_run_once(1);
    }

    /// Asserts the agent holds `count` jobs, each an upgrade whose every
    /// step ran once.
    pub fn assert_jobs_run_once(&self, count: usize) {
        let jobs = self.jobs();
        assert_eq!(jobs.as_array().map(Vec::len), Some(count), "{jobs}");
        for job in jobs.as_array().into_iter().flatten() {
            let tries: Vec<u64> = job["steps"]
                .as_array()
                .expect("steps")
                .iter()
                .map(|s| s["tries"].as_u64().unwrap_or(9))
                .collect();
            assert_eq!(tries, vec![1, 1, 1, 1, 1], "nothing ran twice: {jobs}");
        }
    }

    /// `drover-agent jobs --json` against this agent's socket.
    pub fn jobs(&self) -> Value {
        let out = Command::new(bin("drover-agent"))
            .args(["jobs", "--json", "--socket"])
            .arg(&self.socket)
            .output()
            .expect("drover-agent jobs");
        assert!(
            out.status.success(),
            "jobs failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("jobs json")
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop(&mut child);
        }
    }
}
