//! Drover's apt updaters as step chains: `SystemUpgradeV1` (AptFullUpgradeV1),
//! `PackageInstallV1` and `InventoryRefreshV1`. Every command, option and reboot policy is
//! compiled in here (A8); the local config may only choose the mode and point
//! the updater at a sandbox root.

pub mod assess;
pub mod call;
mod command;
pub mod dpkg;
pub mod fetch;
mod inventory;
pub mod kernel;
pub mod output;
mod package;
mod parse;
mod upgrade;
pub mod why;

pub use assess::PatchAssessor;
pub use call::{Bound, CallError, CallOutcome, Calls, Launcher};
pub use command::{CommandError, CommandOutput, run_bounded};
pub use fetch::Fetcher;
pub use inventory::InventoryRefresh;
pub use package::{PackageInstaller, STEPS as PACKAGE_INSTALL_STEPS};
pub use parse::{parse_simulation, parse_upgrade_run};
pub use upgrade::{STEPS as SYSTEM_UPGRADE_STEPS, SystemUpgrade};

use std::path::PathBuf;

/// How `SystemUpgradeV1` treats the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `apt-get -s full-upgrade`: reports what would change, changes nothing,
    /// works as non-root. The demo's mode.
    Simulate,
    /// The real thing: repair dpkg, update lists, full-upgrade, reboot if needed.
    Upgrade,
}

#[derive(Debug, Clone)]
pub struct AptSettings {
    pub mode: Mode,
    /// A sandbox root (a chroot directory) instead of the real system; for
    /// tests and demos only. In a sandbox the reboot is only recorded, in
    /// `ROOT/run/drover-reboot-requested`.
    pub root: Option<PathBuf>,
    /// Free bytes required on / and /var before an upgrade starts.
    pub min_free_bytes: u64,
    /// Free bytes required on /boot and /boot/firmware, each where it is a
    /// filesystem of its own (Raspberry Pi OS's FAT firmware partition, a
    /// separate /boot on Debian), before an upgrade starts: a kernel
    /// package writes its kernel and initramfs there.
    pub min_free_boot_bytes: u64,
    /// Where the running kernel's release is read
    /// (`/proc/sys/kernel/osrelease`; a test points it at a file).
    pub kernel_release_path: PathBuf,
    /// Where detached apt and dpkg calls keep their state.
    pub calls_dir: PathBuf,
    pub launcher: Launcher,
}

impl AptSettings {
    /// The directory the updater looks at: the sandbox root or "/".
    pub fn system_root(&self) -> PathBuf {
        self.root.clone().unwrap_or_else(|| PathBuf::from("/"))
    }

    /// Builds the argv for a command inside the updater's root.
    pub(crate) fn argv(&self, program: &str, args: &[&str]) -> Vec<String> {
        let mut argv = Vec::new();
        if let Some(root) = &self.root {
            argv.push("chroot".to_owned());
            argv.push(root.display().to_string());
        }
        argv.push(program.to_owned());
        argv.extend(args.iter().map(|a| (*a).to_owned()));
        argv
    }
}

/// Whether this machine can run the updater at all (apt-get on PATH or in the root).
pub fn apt_available(settings: &AptSettings) -> bool {
    let root = settings.system_root();
    ["usr/bin/apt-get", "bin/apt-get"]
        .iter()
        .any(|p| root.join(p).exists())
}
