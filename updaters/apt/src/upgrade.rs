//! `SystemUpgradeV1` as a chain of idempotent steps: preflight, update-lists,
//! full-upgrade, reboot, confirm. In simulate mode the chain keeps its shape
//! but changes nothing: update-lists is skipped, full-upgrade runs
//! `apt-get -s`, and the reboot step only reports whether one would be needed.
//! In upgrade mode every apt and dpkg call is a detached [`Calls`] call (A9).

use crate::call::{Bound, CallError, CallOutcome, Calls};
use crate::command::run_bounded;
use crate::parse::{parse_simulation, parse_upgrade_run};
use crate::{AptSettings, Mode, apt_available, dpkg, kernel};
use agent_core::chain::{BoxFuture, Chain, StepContext, StepOutcome};
use drover_model::model::{JobOutput, PackageChange, UpgradeOutput};
use jiff::Timestamp;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tracing::{info, warn};

/// Each child call's bound: the package job has 1500 s, so lock waits leave
/// time for package work.
pub const CHILD_CALL_LIMIT: Duration = Duration::from_secs(1440);
/// How long `update-lists` keeps retrying while another process holds the
/// lists lock: apt does not apply `DPkg::Lock::Timeout` to that lock.
pub const LISTS_LOCK_WAIT: Duration = Duration::from_secs(300);
/// Options of every apt-get call that changes packages: no questions, apt's
/// own wait for the dpkg frontend lock, and locally edited conffiles kept.
pub(crate) const APT_CHANGE_OPTIONS: &[&str] = &[
    "-y",
    "-q",
    "-o",
    "DPkg::Lock::Timeout=600",
    "-o",
    "Dpkg::Options::=--force-confdef",
    "-o",
    "Dpkg::Options::=--force-confold",
    "-o",
    "APT::Color=0",
];

/// The steps of `systemUpgradeV1`, in order; they never change (a job
/// resumed by a newer agent finds its place).
pub const STEPS: &[&str] = &[
    "preflight",
    "update-lists",
    "full-upgrade",
    "reboot",
    "confirm",
];

pub struct SystemUpgrade {
    pub(crate) settings: AptSettings,
    pub(crate) calls: Calls,
}

/// How often a step runs again after one of its calls was lost (a power
/// cut, or its processes killed) before the job fails. A power cut that
/// repeats at every boot is stopped earlier by the resume breaker (A10).
pub const MAX_LOST_RETRIES: u32 = 3;

/// Seconds since the step's durable start.
pub(crate) fn elapsed(ctx: &StepContext<'_>) -> Duration {
    let seconds = agent_core::clock::now().as_second() - ctx.started_at.as_second();
    Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
}

/// A detached call's id: stable for this job, step, try and purpose.
pub(crate) fn call_id(ctx: &StepContext<'_>, purpose: &str) -> String {
    format!("{}-{}-{}-{purpose}", ctx.job_id, ctx.step, ctx.tries)
}

/// The end of the whole job's budget, counted from its durable start.
fn budget_end(ctx: &StepContext<'_>) -> Timestamp {
    let budget = jiff::SignedDuration::try_from(ctx.budget).unwrap_or(jiff::SignedDuration::MAX);
    ctx.job_started_at
        .checked_add(budget)
        .unwrap_or(Timestamp::MAX)
}

/// What a failed call means for its step: a lost call (no exit status: the
/// machine lost power, or the call's processes were killed) runs the step
/// again, which repairs dpkg first; anything else fails the job.
pub(crate) fn call_failed(ctx: &StepContext<'_>, what: &str, error: CallError) -> StepOutcome {
    match error {
        CallError::Lost { .. } if ctx.tries < MAX_LOST_RETRIES => {
            warn!(%what, error = %error, tries = ctx.tries, "a call was lost; running the step again");
            StepOutcome::RetryAfter {
                after: Duration::from_secs(1),
                reason: format!(
                    "{what} was interrupted ({error}); repairing dpkg and running it again"
                ),
            }
        }
        CallError::Lost { .. } => StepOutcome::Fail(format!(
            "{what} was interrupted {} times in a row ({error}): a crash or reboot loop; \
             giving up instead of looping",
            ctx.tries + 1
        )),
        error => StepOutcome::Fail(format!("{what}: {error}")),
    }
}

pub(crate) fn lock_message(outcome: &CallOutcome, lock: &str) -> Option<String> {
    outcome
        .stderr
        .lines()
        .chain(outcome.stdout.lines())
        .find(|l| l.contains("Could not get lock") && l.contains(lock))
        .map(str::to_owned)
}

impl SystemUpgrade {
    pub fn new(settings: AptSettings) -> Self {
        let calls = Calls::new(settings.calls_dir.clone(), settings.launcher);
        Self { settings, calls }
    }

    /// A detached call whose id is stable for this job, step, try and purpose,
    /// so a restarted agent re-attaches to it instead of starting it again.
    pub(crate) async fn call(
        &self,
        ctx: &StepContext<'_>,
        purpose: &str,
        argv: Vec<String>,
    ) -> Result<CallOutcome, CallError> {
        let id = call_id(ctx, purpose);
        info!(call = %id, argv = ?argv, "apt call");
        let bound = Bound {
            limit: CHILD_CALL_LIMIT,
            not_after: budget_end(ctx),
        };
        self.calls.run(&id, &argv, bound).await
    }

    /// What every apt job checks first: apt is there, and the root and
    /// /var have the configured free space.
    pub(crate) fn ready(&self) -> Result<(), String> {
        if !apt_available(&self.settings) {
            return Err(format!(
                "apt-get not found under {}: this updater needs a Debian-based system",
                self.settings.system_root().display()
            ));
        }
        let root = self.settings.system_root();
        for dir in ["", "var"] {
            enough_space(
                &root.join(dir),
                self.settings.min_free_bytes,
                "updater.min_free_mib",
            )?;
        }
        Ok(())
    }

    /// Where a kernel package writes (/boot, and Raspberry Pi OS's
    /// /boot/firmware), each checked where it is a filesystem of its own:
    /// a full FAT firmware partition fails a kernel's postinst halfway,
    /// with dpkg left to repair, so it is refused before apt runs.
    fn boot_space(&self) -> Result<(), String> {
        let root = self.settings.system_root();
        let root_device = std::fs::metadata(&root).map(|m| m.dev()).ok();
        for dir in ["boot", "boot/firmware"] {
            let path = root.join(dir);
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if Some(meta.dev()) == root_device {
                continue; // the root's own free space was checked
            }
            enough_space(
                &path,
                self.settings.min_free_boot_bytes,
                "updater.min_free_boot_mib",
            )?;
        }
        Ok(())
    }

    async fn preflight(&self, ctx: &StepContext<'_>) -> StepOutcome {
        if let Err(problem) = self.ready().and_then(|()| self.boot_space()) {
            return StepOutcome::Fail(problem);
        }
        match self.settings.mode {
            Mode::Simulate => StepOutcome::Done,
            Mode::Upgrade => self.repair_dpkg(ctx, &mut Vec::new()).await,
        }
    }

    /// Finishes what an interrupted dpkg left: `dpkg --configure -a` for
    /// unconfigured packages, a reinstall for half-installed ones, then checks
    /// the package states again. Each package the repair set up is added to
    /// `finished` (name, version).
    pub(crate) async fn repair_dpkg(
        &self,
        ctx: &StepContext<'_>,
        finished: &mut Vec<(String, String)>,
    ) -> StepOutcome {
        let root = self.settings.system_root();
        let mut broken = match self.broken_packages().await {
            Ok(broken) => broken,
            Err(e) => return StepOutcome::Fail(e),
        };
        if dpkg::interrupted(&root) || broken.iter().any(|b| !b.needs_reinstall()) {
            warn!(broken = ?broken, "dpkg was interrupted; running dpkg --configure -a");
            let argv = self.settings.argv(
                "dpkg",
                &["--force-confdef", "--force-confold", "--configure", "-a"],
            );
            let called = self.call(ctx, "configure", argv).await;
            if let Ok(out) = &called {
                finished.extend(dpkg::set_up(&out.stdout));
            }
            match called {
                Ok(out) if out.success() => {}
                Ok(out) if out.stderr.contains("lock") && elapsed(ctx) < LISTS_LOCK_WAIT => {
                    return StepOutcome::RetryAfter {
                        after: Duration::from_secs(10),
                        reason: format!("dpkg is locked by another process: {}", out.tail()),
                    };
                }
                // Half-installed packages make --configure -a fail; the reinstall below handles them.
                Ok(out) => {
                    warn!(exit = out.exit_code, error = %out.tail(), "dpkg --configure -a did not finish cleanly")
                }
                Err(e) => return call_failed(ctx, "dpkg --configure -a", e),
            }
            broken = match self.broken_packages().await {
                Ok(broken) => broken,
                Err(e) => return StepOutcome::Fail(e),
            };
        }
        let reinstall: Vec<String> = broken
            .iter()
            .filter(|b| b.needs_reinstall())
            .map(|b| b.name.clone())
            .collect();
        if !reinstall.is_empty() {
            warn!(packages = ?reinstall, "reinstalling half-installed packages");
            let mut args = APT_CHANGE_OPTIONS.to_vec();
            args.extend(["install", "--reinstall"]);
            args.extend(reinstall.iter().map(String::as_str));
            let argv = self.settings.argv("apt-get", &args);
            let called = self.call(ctx, "reinstall", argv).await;
            if let Ok(out) = &called {
                finished.extend(dpkg::set_up(&out.stdout));
            }
            match called {
                Ok(out) if out.success() => {}
                Ok(out) => {
                    warn!(exit = out.exit_code, error = %out.tail(), "reinstall did not finish cleanly")
                }
                Err(e) => {
                    return call_failed(ctx, &format!("reinstall of {}", reinstall.join(", ")), e);
                }
            }
            broken = match self.broken_packages().await {
                Ok(broken) => broken,
                Err(e) => return StepOutcome::Fail(e),
            };
        }
        if broken.is_empty() {
            StepOutcome::Done
        } else {
            let list: Vec<String> = broken.iter().map(|b| b.describe()).collect();
            StepOutcome::Fail(format!(
                "dpkg still reports broken packages after repair: {}",
                list.join(", ")
            ))
        }
    }

    /// Reads package states (a read-only query, run attached).
    async fn broken_packages(&self) -> Result<Vec<dpkg::BrokenPackage>, String> {
        let argv = self
            .settings
            .argv("dpkg-query", &["-W", "-f", dpkg::QUERY_FORMAT]);
        let out = run_bounded(&argv, Duration::from_secs(120))
            .await
            .map_err(|e| e.to_string())?;
        if !out.success() {
            return Err(format!("dpkg-query failed: {}", out.tail()));
        }
        Ok(dpkg::broken_packages(&out.stdout))
    }

    pub(crate) async fn update_lists(&self, ctx: &StepContext<'_>) -> StepOutcome {
        if self.settings.mode == Mode::Simulate {
            // Refreshing lists changes the machine; a simulation must not.
            return StepOutcome::Done;
        }
        let argv = self
            .settings
            .argv("apt-get", &["-q", "-o", "APT::Color=0", "update"]);
        match self.call(ctx, "update", argv).await {
            Ok(out) if out.success() => StepOutcome::Done,
            Ok(out) => {
                if let Some(line) = lock_message(&out, "/var/lib/apt/lists/lock") {
                    if elapsed(ctx) < LISTS_LOCK_WAIT {
                        return StepOutcome::RetryAfter {
                            after: Duration::from_secs(5),
                            reason: format!("waiting for the apt lists lock: {line}"),
                        };
                    }
                    return StepOutcome::Fail(format!(
                        "the apt lists lock was held for more than {} s: {line}",
                        LISTS_LOCK_WAIT.as_secs()
                    ));
                }
                if ctx.tries < 2 {
                    return StepOutcome::RetryAfter {
                        after: Duration::from_secs(30),
                        reason: format!(
                            "apt-get update failed (exit {}): {}",
                            out.exit_code,
                            out.tail()
                        ),
                    };
                }
                StepOutcome::FailWithReason {
                    error: format!(
                        "apt-get update failed (exit {}): {}",
                        out.exit_code,
                        out.tail()
                    ),
                    reason: out.reason(),
                }
            }
            Err(e) => call_failed(ctx, "apt-get update", e),
        }
    }

    async fn full_upgrade(
        &self,
        ctx: &StepContext<'_>,
        output: &mut Option<JobOutput>,
    ) -> StepOutcome {
        if self.settings.mode == Mode::Simulate {
            let argv = simulation_argv(&self.settings);
            return match run_bounded(&argv, CHILD_CALL_LIMIT).await {
                Ok(out) if out.success() => {
                    let report = parse_simulation(&out.stdout);
                    info!(
                        upgraded = report.upgraded.len(),
                        kept_back = report.kept_back.len(),
                        "simulated full-upgrade"
                    );
                    *output = Some(JobOutput::Upgrade(report));
                    StepOutcome::Done
                }
                Ok(out) => StepOutcome::FailWithReason {
                    error: format!(
                        "apt-get -s full-upgrade exited with {:?}: {}",
                        out.status,
                        out.tail()
                    ),
                    reason: out.reason(),
                },
                Err(e) => StepOutcome::Fail(e.to_string()),
            };
        }
        // Before a new try (not a re-attach to a call that runs or ran):
        // after a power cut or a kill mid-run, dpkg must be repaired before
        // apt runs again; on a healthy system this only reads dpkg's state.
        let mut repaired = Vec::new();
        if !self.calls.started(&call_id(ctx, "full-upgrade")) {
            match self.repair_dpkg(ctx, &mut repaired).await {
                StepOutcome::Done => {}
                other => return other,
            }
        }
        let mut args = APT_CHANGE_OPTIONS.to_vec();
        args.push("full-upgrade");
        let argv = self.settings.argv("apt-get", &args);
        match self.call(ctx, "full-upgrade", argv).await {
            Ok(out) if out.success() => {
                let mut report = parse_upgrade_run(&out.stdout);
                // What the repair finished belongs to this upgrade too: the
                // apt run that unpacked it ended with the power.
                let root = self.settings.system_root();
                add_repaired(&mut report, repaired, |name, to| {
                    dpkg::upgraded_from(&root, name, to)
                });
                info!(
                    upgraded = report.upgraded.len(),
                    installed = report.installed.len(),
                    removed = report.removed.len(),
                    kept_back = report.kept_back.len(),
                    reattached = out.reattached,
                    "full-upgrade finished"
                );
                *output = Some(JobOutput::Upgrade(report));
                StepOutcome::Done
            }
            Ok(out) => {
                if let Some(line) = lock_message(&out, "/var/lib/dpkg/lock")
                    && elapsed(ctx) < CHILD_CALL_LIMIT
                {
                    return StepOutcome::RetryAfter {
                        after: Duration::from_secs(10),
                        reason: format!("waiting for the dpkg lock: {line}"),
                    };
                }
                StepOutcome::FailWithReason {
                    error: format!(
                        "apt-get full-upgrade failed (exit {}): {}",
                        out.exit_code,
                        out.tail()
                    ),
                    reason: out.reason(),
                }
            }
            Err(e) => call_failed(ctx, "apt-get full-upgrade", e),
        }
    }

    fn reboot_step(&self, output: &mut Option<JobOutput>) -> StepOutcome {
        let reason = kernel::reboot_needed(
            &self.settings.system_root(),
            &kernel::running_release(&self.settings.kernel_release_path),
        );
        let mut report = match output.take() {
            Some(JobOutput::Upgrade(report)) => report,
            _ => UpgradeOutput {
                simulated: self.settings.mode == Mode::Simulate,
                ..UpgradeOutput::default()
            },
        };
        report.reboot_required = reason.is_some();
        *output = Some(JobOutput::Upgrade(report));
        match (self.settings.mode, reason) {
            // Simulation never reboots; it reports whether a reboot is pending.
            (Mode::Simulate, _) | (Mode::Upgrade, None) => StepOutcome::Done,
            (Mode::Upgrade, Some(reason)) => {
                info!(%reason, "reboot needed");
                StepOutcome::Reboot
            }
        }
    }
}

/// Adds the packages a dpkg repair set up to an upgrade's report, each
/// once, with the version it came from when dpkg's log still says it
/// (`from` stays unknown otherwise, never guessed).
fn add_repaired(
    report: &mut UpgradeOutput,
    repaired: Vec<(String, String)>,
    from: impl Fn(&str, &str) -> Option<String>,
) {
    for (name, to) in repaired {
        let listed = report
            .upgraded
            .iter()
            .chain(&report.installed)
            .any(|c| c.name == name);
        if !listed {
            let from = from(&name, &to);
            report.upgraded.push(PackageChange { name, from, to });
        }
    }
}

/// apt's read-only simulation of a full upgrade (no lock taken, no colour):
/// what simulate mode runs, and what a patch assessment reads.
pub(crate) fn simulation_argv(settings: &AptSettings) -> Vec<String> {
    simulate(settings, &["full-upgrade"])
}

/// apt-get simulating `action` (`-s`, no lock taken, no colour): what
/// simulate mode runs for every apt job.
pub(crate) fn simulate(settings: &AptSettings, action: &[&str]) -> Vec<String> {
    let mut args = vec!["-s", "-o", "Debug::NoLocking=1", "-o", "APT::Color=0"];
    args.extend_from_slice(action);
    settings.argv("apt-get", &args)
}

/// Whether the filesystem holding `path` has `required` bytes free; the
/// error names the place, both figures and the `setting` that asks.
fn enough_space(path: &Path, required: u64, setting: &str) -> Result<(), String> {
    match free_bytes(path) {
        Some(free) if free < required => Err(format!(
            "not enough free space on {}: {} MiB free, {} MiB required ({setting})",
            path.display(),
            free / (1024 * 1024),
            required / (1024 * 1024)
        )),
        Some(_) => Ok(()),
        None => Err(format!("cannot read free space of {}", path.display())),
    }
}

/// Free bytes on the filesystem holding `path`, via the longest mount prefix.
fn free_bytes(path: &Path) -> Option<u64> {
    let path: PathBuf = path.canonicalize().ok()?;
    let disks = sysinfo::Disks::new_with_refreshed_list().ok()?;
    disks
        .iter()
        .filter(|d| path.starts_with(d.mount_point()))
        .max_by_key(|d| d.mount_point().as_os_str().len())
        .map(|d| d.available_space())
}

impl Chain for SystemUpgrade {
    fn kind(&self) -> &'static str {
        "systemUpgradeV1"
    }

    fn steps(&self) -> &'static [&'static str] {
        STEPS
    }

    fn run_step<'a>(&'a self, ctx: StepContext<'a>) -> BoxFuture<'a, StepOutcome> {
        Box::pin(async move {
            let ctx = ctx;
            match ctx.step {
                "preflight" => self.preflight(&ctx).await,
                "update-lists" => self.update_lists(&ctx).await,
                "full-upgrade" => {
                    let mut output = ctx.output.take();
                    let outcome = self.full_upgrade(&ctx, &mut output).await;
                    *ctx.output = output;
                    outcome
                }
                "reboot" => self.reboot_step(ctx.output),
                "confirm" => StepOutcome::Done,
                other => StepOutcome::Fail(format!("unknown step {other} in systemUpgradeV1")),
            }
        })
    }

    /// Reboots with the compiled-in command. In a sandbox root the host is
    /// never rebooted: the request is recorded in `ROOT/run/drover-reboot-requested`.
    fn reboot(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            if let Some(root) = &self.settings.root {
                let marker = root.join("run/drover-reboot-requested");
                std::fs::create_dir_all(root.join("run")).map_err(|e| e.to_string())?;
                std::fs::write(&marker, agent_core::clock::now().to_string())
                    .map_err(|e| e.to_string())?;
                return Ok(());
            }
            let argv: Vec<String> = if Path::new("/run/systemd/system").exists() {
                vec!["systemctl".into(), "reboot".into()]
            } else {
                vec!["/sbin/reboot".into()]
            };
            match run_bounded(&argv, Duration::from_secs(60)).await {
                Ok(out) if out.success() => Ok(()),
                Ok(out) => Err(format!(
                    "{} exited with {:?}: {}",
                    argv.join(" "),
                    out.status,
                    out.tail()
                )),
                Err(e) => Err(e.to_string()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_lost_again_and_again_fails_its_step_as_a_loop() {
        let mut output = None;
        let mut ctx = StepContext {
            job_id: drover_model::JobId::random(),
            step: "full-upgrade",
            kind: None,
            started_at: Timestamp::now(),
            job_started_at: Timestamp::now(),
            budget: Duration::from_secs(3600),
            tries: 0,
            output: &mut output,
        };
        let lost = || CallError::Lost {
            program: "dpkg".into(),
        };
        assert!(matches!(
            call_failed(&ctx, "dpkg --configure -a", lost()),
            StepOutcome::RetryAfter { .. }
        ));
        ctx.tries = MAX_LOST_RETRIES;
        match call_failed(&ctx, "dpkg --configure -a", lost()) {
            StepOutcome::Fail(reason) => {
                assert!(reason.contains("interrupted 4 times"), "{reason}");
                assert!(reason.contains("a crash or reboot loop"), "{reason}");
            }
            other => panic!("expected a failure, got {other:?}"),
        }
    }
}
