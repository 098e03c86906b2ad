//! `SystemUpgradeV1` as a chain of idempotent steps: preflight, update-lists,
//! full-upgrade, reboot, confirm. In simulate mode the chain keeps its shape
//! but changes nothing: update-lists is skipped, full-upgrade runs
//! `apt-get -s`, and the reboot step only reports whether one would be needed.

use crate::command::run_bounded;
use crate::parse::parse_simulation;
use crate::{AptSettings, Mode, apt_available};
use agent_core::chain::{BoxFuture, Chain, StepContext, StepOutcome};
use agent_core::model::{JobOutput, UpgradeOutput};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tracing::info;

/// Each child call's bound: the package job has 1500 s, so lock waits leave
/// time for package work.
pub const CHILD_CALL_LIMIT: Duration = Duration::from_secs(1440);

const STEPS: &[&str] = &[
    "preflight",
    "update-lists",
    "full-upgrade",
    "reboot",
    "confirm",
];

pub struct SystemUpgrade {
    settings: AptSettings,
}

impl SystemUpgrade {
    pub fn new(settings: AptSettings) -> Self {
        Self { settings }
    }

    async fn preflight(&self) -> StepOutcome {
        if !apt_available(&self.settings) {
            return StepOutcome::Fail(format!(
                "apt-get not found under {}: this updater needs a Debian-based system",
                self.settings.system_root().display()
            ));
        }
        let root = self.settings.system_root();
        for dir in ["", "var"] {
            let path = root.join(dir);
            match free_bytes(&path) {
                Some(free) if free < self.settings.min_free_bytes => {
                    return StepOutcome::Fail(format!(
                        "not enough free space on {}: {} MiB free, {} MiB required",
                        path.display(),
                        free / (1024 * 1024),
                        self.settings.min_free_bytes / (1024 * 1024)
                    ));
                }
                Some(_) => {}
                None => {
                    return StepOutcome::Fail(format!(
                        "cannot read free space of {}",
                        path.display()
                    ));
                }
            }
        }
        StepOutcome::Done
    }

    async fn full_upgrade(&self, output: &mut Option<JobOutput>) -> StepOutcome {
        match self.settings.mode {
            Mode::Simulate => {
                let argv = self.settings.argv(
                    "apt-get",
                    &[
                        "-s",
                        "-o",
                        "Debug::NoLocking=1",
                        "-o",
                        "APT::Color=0",
                        "full-upgrade",
                    ],
                );
                match run_bounded(&argv, CHILD_CALL_LIMIT).await {
                    Ok(out) if out.success() => {
                        let report = parse_simulation(&out.stdout);
                        info!(
                            upgraded = report.upgraded.len(),
                            installed = report.installed.len(),
                            removed = report.removed.len(),
                            kept_back = report.kept_back.len(),
                            "simulated full-upgrade"
                        );
                        *output = Some(JobOutput::Upgrade(report));
                        StepOutcome::Done
                    }
                    Ok(out) => StepOutcome::Fail(format!(
                        "apt-get -s full-upgrade exited with {:?}: {}",
                        out.status,
                        out.tail()
                    )),
                    Err(e) => StepOutcome::Fail(e.to_string()),
                }
            }
        }
    }

    fn reboot_step(&self, output: &mut Option<JobOutput>) -> StepOutcome {
        let needed = reboot_required(&self.settings.system_root());
        let report = match output {
            Some(JobOutput::Upgrade(report)) => report,
            other => {
                *other = Some(JobOutput::Upgrade(UpgradeOutput {
                    simulated: self.settings.mode == Mode::Simulate,
                    ..UpgradeOutput::default()
                }));
                match other {
                    Some(JobOutput::Upgrade(report)) => report,
                    _ => return StepOutcome::Fail("invariant: upgrade output just set".into()),
                }
            }
        };
        report.reboot_required = needed;
        match self.settings.mode {
            // Simulation never reboots; it reports whether a reboot is pending.
            Mode::Simulate => StepOutcome::Done,
        }
    }
}

/// A reboot is needed when apt's hooks asked for one. The path is read under
/// the root: from the host, `ROOT/var/run` would resolve to the host's /run.
fn reboot_required(root: &Path) -> bool {
    root.join("run/reboot-required").exists()
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
            match ctx.step {
                "preflight" => self.preflight().await,
                "update-lists" => match self.settings.mode {
                    // Refreshing lists changes the machine; a simulation must not.
                    Mode::Simulate => StepOutcome::Done,
                },
                "full-upgrade" => self.full_upgrade(ctx.output).await,
                "reboot" => self.reboot_step(ctx.output),
                "confirm" => StepOutcome::Done,
                other => StepOutcome::Fail(format!("unknown step {other} in systemUpgradeV1")),
            }
        })
    }
}
