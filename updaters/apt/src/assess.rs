//! Reading a patch assessment out of apt (issue 31): what a full upgrade
//! would change now, which of it comes from a security archive, and whether
//! the device has a security archive at all. Pure over apt's `LC_ALL=C`
//! output, so the rules are table-tested here; the assessment job that
//! runs apt read-only and reports them is built on these.
//!
//! apt names, for each candidate version in a simulation line, every
//! archive it is available from: `Inst libc6 [2.36-9+deb12u3] (2.36-9+deb12u4
//! Debian:12.5/stable, Debian-Security:12/stable-security [amd64])`. A
//! package counts as a security update when any of them is a security
//! archive: its label (Debian's `Debian-Security`) or its suite
//! (`bookworm-security`, Ubuntu's `jammy-security`) says so. 32-bit
//! Raspberry Pi OS (Raspbian and the Foundation's archive) has no security
//! suite at all (the 64-bit one takes Debian's); a device whose `apt-cache
//! policy` lists none says so rather than reporting zero security updates.

use crate::command::run_bounded;
use crate::upgrade::{CHILD_CALL_LIMIT, SystemUpgrade};
use crate::{AptSettings, kernel};
use agent_core::chain::{BoxFuture, Chain, StepContext, StepOutcome};
use drover_model::model::{JobOutput, MAX_LISTED_PACKAGES, PatchAssessment, PendingPackage};
use std::time::Duration;
use tracing::info;

/// The steps of `patchAssessmentV1`, in order; they never change.
pub const STEPS: &[&str] = &["preflight", "update-lists", "assess"];

/// `patchAssessmentV1`: the checks and the lists refresh of an upgrade
/// (the same lock rules and budget, its detached call in upgrade mode;
/// skipped in simulate mode), then apt's simulation and `apt-cache policy`
/// read, and the reboot rule applied. It never repairs dpkg and never
/// installs anything.
pub struct PatchAssessor {
    upgrade: SystemUpgrade,
}

impl PatchAssessor {
    pub fn new(settings: AptSettings) -> Self {
        Self {
            upgrade: SystemUpgrade::new(settings),
        }
    }

    async fn assess(&self, output: &mut Option<JobOutput>) -> StepOutcome {
        let settings = &self.upgrade.settings;
        let simulate = crate::upgrade::simulation_argv(settings);
        let simulated = match run_bounded(&simulate, CHILD_CALL_LIMIT).await {
            Ok(out) if out.success() => pending_upgrades(&out.stdout),
            Ok(out) => {
                return StepOutcome::FailWithReason {
                    error: format!(
                        "apt-get -s full-upgrade exited with {:?}: {}",
                        out.status,
                        out.tail()
                    ),
                    reason: out.reason(),
                };
            }
            Err(e) => return StepOutcome::Fail(e.to_string()),
        };
        let policy = settings.argv("apt-cache", &["policy"]);
        let security_archive = match run_bounded(&policy, Duration::from_secs(120)).await {
            Ok(out) if out.success() => has_security_archive(&out.stdout),
            Ok(out) => {
                return StepOutcome::FailWithReason {
                    error: format!(
                        "apt-cache policy exited with {:?}: {}",
                        out.status,
                        out.tail()
                    ),
                    reason: out.reason(),
                };
            }
            Err(e) => return StepOutcome::Fail(e.to_string()),
        };
        let root = settings.system_root();
        let running = kernel::running_release(&settings.kernel_release_path);
        let assessment = PatchAssessment {
            upgradable: simulated.upgradable,
            security: simulated.security,
            kept_back: simulated.kept_back,
            security_archive,
            reboot_pending: kernel::reboot_needed(&root, &running),
            newest_kernel: kernel::newer_kernel(&kernel::installed_kernels(&root), &running),
            running_kernel: running,
            pending: simulated
                .pending
                .into_iter()
                .map(|p| PendingPackage {
                    name: p.name,
                    from: p.from,
                    to: p.to,
                    security: p.security,
                })
                .collect(),
            omitted: simulated.omitted,
        };
        info!(
            upgradable = assessment.upgradable,
            security = assessment.security,
            kept_back = assessment.kept_back,
            security_archive = assessment.security_archive,
            reboot_pending = assessment.reboot_pending.is_some(),
            "patch assessment"
        );
        *output = Some(JobOutput::Assessment(assessment));
        StepOutcome::Done
    }
}

impl Chain for PatchAssessor {
    fn kind(&self) -> &'static str {
        "patchAssessmentV1"
    }

    fn steps(&self) -> &'static [&'static str] {
        STEPS
    }

    fn run_step<'a>(&'a self, ctx: StepContext<'a>) -> BoxFuture<'a, StepOutcome> {
        Box::pin(async move {
            let ctx = ctx;
            match ctx.step {
                "preflight" => match self.upgrade.ready() {
                    Ok(()) => StepOutcome::Done,
                    Err(problem) => StepOutcome::Fail(problem),
                },
                "update-lists" => self.upgrade.update_lists(&ctx).await,
                "assess" => {
                    let mut output = ctx.output.take();
                    let outcome = self.assess(&mut output).await;
                    *ctx.output = output;
                    outcome
                }
                other => StepOutcome::Fail(format!("unknown step {other} in patchAssessmentV1")),
            }
        })
    }
}

/// One package a full upgrade would change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub name: String,
    /// The installed version; `None` for a package the upgrade would newly
    /// install (a new dependency).
    pub from: Option<String>,
    pub to: String,
    /// Available from a security archive.
    pub security: bool,
}

/// What `apt-get -s full-upgrade` says is pending, counted exactly and
/// listed up to [`MAX_LISTED_PACKAGES`] (security updates first).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PendingUpgrades {
    /// Installed packages a full upgrade would upgrade.
    pub upgradable: u32,
    /// Of those, the ones available from a security archive.
    pub security: u32,
    /// Packages apt keeps back (held, or needing a removal it will not do).
    pub kept_back: u32,
    pub pending: Vec<Pending>,
    /// Pending packages left out of the list to keep it bounded.
    pub omitted: u32,
}

/// Whether one archive as apt names it in a simulation line
/// (`Label:Version/Suite`) is a security archive.
pub fn is_security_release(release: &str) -> bool {
    let release = release.trim();
    let (label, suite) = match release.split_once('/') {
        Some((origin, suite)) => (origin.split(':').next().unwrap_or(origin), suite),
        None => (release.split(':').next().unwrap_or(release), ""),
    };
    label.to_ascii_lowercase().ends_with("-security") || suite.ends_with("-security")
}

/// Parses the `Inst` lines and the kept-back list of `apt-get -s
/// full-upgrade`.
pub fn pending_upgrades(stdout: &str) -> PendingUpgrades {
    let mut out = PendingUpgrades::default();
    let mut all = Vec::new();
    let mut in_kept_back = false;
    for line in stdout.lines() {
        if in_kept_back && line.starts_with(' ') {
            out.kept_back = out
                .kept_back
                .saturating_add(line.split_whitespace().count() as u32);
            continue;
        }
        in_kept_back = line.starts_with("The following packages have been kept back");
        let Some(rest) = line.strip_prefix("Inst ") else {
            continue;
        };
        let Some(pending) = inst_line(rest) else {
            continue;
        };
        if pending.from.is_some() {
            out.upgradable = out.upgradable.saturating_add(1);
            if pending.security {
                out.security = out.security.saturating_add(1);
            }
        }
        all.push(pending);
    }
    // Security updates first, then by name: the bounded list keeps what an
    // operator looks for.
    all.sort_by(|a, b| {
        b.security
            .cmp(&a.security)
            .then_with(|| a.name.cmp(&b.name))
    });
    let total = all.len();
    all.truncate(MAX_LISTED_PACKAGES);
    out.omitted = u32::try_from(total - all.len()).unwrap_or(u32::MAX);
    out.pending = all;
    out
}

/// `NAME [OLD] (NEW RELEASE[, RELEASE…] [ARCH])` or without `[OLD]`.
fn inst_line(rest: &str) -> Option<Pending> {
    let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
    let from = tail
        .strip_prefix('[')
        .and_then(|t| t.split(']').next())
        .map(str::to_owned);
    let inside = tail.split_once('(')?.1;
    let inside = inside.rsplit_once(')').map_or(inside, |(inner, _)| inner);
    // Drop the trailing ` [ARCH]`.
    let inside = inside.rsplit_once(" [").map_or(inside, |(inner, _)| inner);
    let (to, releases) = inside.split_once(' ').unwrap_or((inside, ""));
    if name.is_empty() || to.is_empty() {
        return None;
    }
    Some(Pending {
        name: name.to_owned(),
        from,
        to: to.to_owned(),
        security: releases.split(", ").any(is_security_release),
    })
}

/// Whether `apt-cache policy` (no arguments) lists a security archive among
/// the device's sources: a `release` line whose archive (`a=`) or codename
/// (`n=`) ends in `-security`, or whose label (`l=`) does.
pub fn has_security_archive(policy: &str) -> bool {
    policy.lines().any(|line| {
        let Some(fields) = line.trim_start().strip_prefix("release ") else {
            return false;
        };
        fields.split(',').any(|field| match field.split_once('=') {
            Some(("a" | "n", value)) => value.ends_with("-security"),
            Some(("l", value)) => value.to_ascii_lowercase().ends_with("-security"),
            _ => false,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn security_archives_by_label_or_suite() {
        for (release, security) in [
            ("Debian-Security:12/stable-security", true),
            ("Debian:12.5/stable", false),
            ("Debian:12/bookworm-updates", false),
            ("Ubuntu:22.04/jammy-security", true),
            ("Ubuntu:22.04/jammy-updates", false),
            ("Raspberry Pi Foundation:stable/stable", false),
            ("Raspbian:12/stable", false),
            // A local archive whose Release names a -security suite.
            ("localhost/bookworm-security", true),
            ("Drover tests:1.0/drover-security", true),
            ("", false),
        ] {
            assert_eq!(is_security_release(release), security, "{release:?}");
        }
    }

    /// Lines as apt 2.6 prints them (Debian 12); the libgcrypt20-dev line
    /// is copied from this build machine, trailing `[]` included.
    const SIMULATION: &str = "NOTE: This is only a simulation!
Reading package lists...
Building dependency tree...
Calculating upgrade...
The following packages have been kept back:
  linux-image-amd64 raspi-firmware
  held-one
The following packages will be upgraded:
  libc6 libfoo tzdata
3 upgraded, 1 newly installed, 0 to remove and 3 not upgraded.
Inst libfoo [1.0-1] (2.0-1 Debian:12.8/stable [amd64])
Inst libc6 [2.36-9+deb12u3] (2.36-9+deb12u4 Debian:12.5/stable, Debian-Security:12/stable-security [amd64])
Inst newdep (3.1 Debian:12.8/stable [amd64])
Inst tzdata [2024a-0+deb12u1] (2025b-0+deb12u1 Debian-Security:12/stable-security [all])
Inst libgcrypt20-dev [1.10.1-3] (1.10.1-3+deb12u1 Debian:12.15/oldstable, Debian-Security:12/oldstable-security [amd64]) []
Conf libfoo (2.0-1 Debian:12.8/stable [amd64])
";

    #[test]
    fn counts_upgrades_security_first_and_kept_back() {
        let out = pending_upgrades(SIMULATION);
        assert_eq!(out.upgradable, 4, "a new dependency is not an upgrade");
        assert_eq!(
            out.security, 3,
            "libc6 and libgcrypt20-dev (also in stable) and tzdata"
        );
        assert_eq!(out.kept_back, 3);
        assert_eq!(out.omitted, 0);
        let listed: Vec<(&str, bool)> = out
            .pending
            .iter()
            .map(|p| (p.name.as_str(), p.security))
            .collect();
        assert_eq!(
            listed,
            [
                ("libc6", true),
                ("libgcrypt20-dev", true),
                ("tzdata", true),
                ("libfoo", false),
                ("newdep", false)
            ]
        );
        assert_eq!(out.pending[0].from.as_deref(), Some("2.36-9+deb12u3"));
        assert_eq!(out.pending[0].to, "2.36-9+deb12u4");
        assert_eq!(
            out.pending[1].to, "1.10.1-3+deb12u1",
            "apt's trailing [] dropped"
        );
        assert_eq!(out.pending[4].from, None);
    }

    #[test]
    fn an_up_to_date_system_has_nothing_pending() {
        let out = pending_upgrades(
            "Reading package lists...\nCalculating upgrade...\n0 upgraded, 0 newly installed, 0 to remove and 0 not upgraded.\n",
        );
        assert_eq!(out, PendingUpgrades::default());
    }

    #[test]
    fn the_list_is_bounded_and_counts_stay_exact() {
        let mut text = String::new();
        for i in 0..(MAX_LISTED_PACKAGES + 50) {
            let release = if i % 10 == 0 {
                "Debian-Security:12/stable-security"
            } else {
                "Debian:12/stable"
            };
            text.push_str(&format!("Inst p{i:04} [1] (2 {release} [all])\n"));
        }
        let out = pending_upgrades(&text);
        assert_eq!(out.upgradable as usize, MAX_LISTED_PACKAGES + 50);
        assert_eq!(
            out.security as usize,
            (MAX_LISTED_PACKAGES + 50).div_ceil(10)
        );
        assert_eq!(out.pending.len(), MAX_LISTED_PACKAGES);
        assert_eq!(out.omitted, 50);
        assert!(
            out.pending[..out.security as usize]
                .iter()
                .all(|p| p.security),
            "every security update is listed first"
        );
    }

    #[test]
    fn odd_lines_are_skipped_not_misread() {
        let out = pending_upgrades("Inst \nInst lonely\nInst x [1] (\nInst y [1] (2 [all])\n");
        assert_eq!(out.upgradable, 1, "{out:?}");
        assert_eq!(out.pending[0].name, "y");
        assert!(!out.pending[0].security);
    }

    #[test]
    fn a_security_archive_among_the_sources() {
        let debian =
            " 500 http://deb.debian.org/debian-security bookworm-security/main amd64 Packages
     release v=12,o=Debian,a=stable-security,n=bookworm-security,l=Debian-Security,c=main,b=amd64
     origin deb.debian.org
 500 http://deb.debian.org/debian bookworm/main amd64 Packages
     release v=12.8,o=Debian,a=stable,n=bookworm,l=Debian,c=main,b=amd64
";
        assert!(has_security_archive(debian));
        // 32-bit Raspberry Pi OS: Raspbian's archive and the Foundation's,
        // neither with a security suite.
        let raspbian = " 500 http://archive.raspberrypi.com/debian bookworm/main armhf Packages
     release o=Raspberry Pi Foundation,a=stable,n=bookworm,l=Raspberry Pi Foundation,c=main,b=armhf
 500 http://raspbian.raspberrypi.com/raspbian bookworm/main armhf Packages
     release v=12,o=Raspbian,a=stable,n=bookworm,l=Raspbian,c=main,b=armhf
";
        assert!(!has_security_archive(raspbian));
        assert!(!has_security_archive(""));
    }
}
