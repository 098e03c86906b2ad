//! Does the machine need a reboot? When apt's hooks wrote
//! `/run/reboot-required`, or when a newer kernel of the running kernel's own
//! flavour is installed (Raspberry Pi OS often writes no reboot-required
//! file). Raspberry Pi OS installs several flavours side by side
//! (`+rpt-rpi-v8` and `+rpt-rpi-2712` on 64-bit images; `-v6`, `-v7`, `-v7l`
//! on 32-bit ones), so comparing across flavours would reboot every Pi 5 and
//! 32-bit Pi after every upgrade: kernels are compared within a flavour.

use std::cmp::Ordering;
use std::path::Path;

/// The flavour of a kernel release: what tells apart kernels built for
/// different hardware that are installed side by side. `6.1.0-28-arm64` →
/// `arm64`, `6.6.62+rpt-rpi-2712` → `rpi-2712`, `6.1.0-rpi7-rpi-v8` →
/// `rpi-v8`, `6.10.11+bpo-amd64` → `amd64`; the older Raspberry Pi kernels
/// keep their suffix whole: `5.15.84-v7l+` → `-v7l+`, `5.15.84+` → `+`.
pub fn flavour(release: &str) -> String {
    let rest = release.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
    if rest.ends_with('+') && !rest.contains("+rpt") && !rest.contains("+bpo") {
        return rest.to_owned();
    }
    let tokens: Vec<&str> = rest.split(['-', '+']).filter(|t| !t.is_empty()).collect();
    // Leading tokens that carry the version or ABI, not the flavour.
    let is_version = |t: &str| {
        t.starts_with(|c: char| c.is_ascii_digit())
            || t == "rpt"
            || t == "bpo"
            || t.strip_prefix("rpi")
                .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
    };
    let start = tokens
        .iter()
        .position(|t| !is_version(t))
        .unwrap_or(tokens.len());
    tokens[start..].join("-")
}

/// Every kernel release installed under `root`, from the module trees
/// (`lib/modules/<release>`, present on Debian and Raspberry Pi OS alike) and
/// `boot/vmlinuz-<release>`.
pub fn installed_kernels(root: &Path) -> Vec<String> {
    let mut releases: Vec<String> = Vec::new();
    for dir in ["lib/modules", "usr/lib/modules"] {
        if let Ok(entries) = std::fs::read_dir(root.join(dir)) {
            for entry in entries.flatten() {
                // A directory without modules is a leftover of a removed kernel.
                if entry.path().join("modules.dep").exists() || entry.path().join("kernel").is_dir()
                {
                    releases.push(entry.file_name().to_string_lossy().into_owned());
                }
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(root.join("boot")) {
        for entry in entries.flatten() {
            if let Some(release) = entry.file_name().to_string_lossy().strip_prefix("vmlinuz-") {
                releases.push(release.to_owned());
            }
        }
    }
    releases.sort();
    releases.dedup();
    releases
}

/// The newest installed kernel of the running kernel's flavour, if it is
/// newer than the running one. Releases order like Debian versions
/// (`6.1.0-28-arm64` > `6.1.0-9-arm64`).
pub fn newer_kernel(installed: &[String], running_release: &str) -> Option<String> {
    let running_flavour = flavour(running_release);
    installed
        .iter()
        .filter(|release| flavour(release) == running_flavour)
        .max_by(|a, b| deb_version::compare_versions(a, b))
        .filter(|newest| {
            deb_version::compare_versions(newest, running_release) == Ordering::Greater
        })
        .cloned()
}

/// Whether a reboot is needed, and why.
pub fn reboot_needed(root: &Path, running_release: &str) -> Option<String> {
    if root.join("run/reboot-required").exists() {
        let packages =
            std::fs::read_to_string(root.join("run/reboot-required.pkgs")).unwrap_or_default();
        let packages: Vec<&str> = packages.split_whitespace().collect();
        return Some(if packages.is_empty() {
            "/run/reboot-required exists".to_owned()
        } else {
            format!("/run/reboot-required exists ({})", packages.join(", "))
        });
    }
    let newer = newer_kernel(&installed_kernels(root), running_release)?;
    Some(format!(
        "kernel {newer} is installed, {running_release} is running"
    ))
}

/// Where Linux says the running kernel's release.
pub const RELEASE_PATH: &str = "/proc/sys/kernel/osrelease";

/// The running kernel's release, read from `path` (normally [`RELEASE_PATH`]).
pub fn running_release(path: &Path) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Installs a kernel package's module tree the way its package does:
    /// `linux-image-<release>` ships `/lib/modules/<release>/`.
    fn install(root: &Path, package: &str) {
        let release = package
            .strip_prefix("linux-image-")
            .expect("kernel package");
        let dir = root.join("lib/modules").join(release);
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("modules.dep"), "").expect("write");
    }

    #[test]
    fn flavours() {
        for (release, expected) in [
            ("6.1.0-28-amd64", "amd64"),
            ("6.1.0-28-arm64", "arm64"),
            ("6.1.0-28-cloud-amd64", "cloud-amd64"),
            ("6.1.0-28-armmp-lpae", "armmp-lpae"),
            ("6.1.0-0.deb11.17-amd64", "amd64"),
            ("6.10.11+bpo-amd64", "amd64"),
            ("6.6.62+rpt-rpi-v8", "rpi-v8"),
            ("6.6.62+rpt-rpi-2712", "rpi-2712"),
            ("6.6.62+rpt-rpi-v7l", "rpi-v7l"),
            ("6.6.62+rpt-rpi-v6", "rpi-v6"),
            ("6.1.0-rpi7-rpi-v8", "rpi-v8"),
            ("6.1.0-rpi8-rpi-2712", "rpi-2712"),
            ("5.15.84-v8+", "-v8+"),
            ("5.15.84-v7l+", "-v7l+"),
            ("5.15.84+", "+"),
        ] {
            assert_eq!(flavour(release), expected, "{release}");
        }
    }

    /// (machine, kernel packages installed, `uname -r`, reboot expected)
    type Case = (&'static str, &'static [&'static str], &'static str, bool);

    #[test]
    fn reboot_rule_table() {
        const PI64: &[&str] = &[
            "linux-image-6.6.51+rpt-rpi-v8",
            "linux-image-6.6.51+rpt-rpi-2712",
            "linux-image-6.6.62+rpt-rpi-v8",
            "linux-image-6.6.62+rpt-rpi-2712",
        ];
        const PI32: &[&str] = &[
            "linux-image-6.6.62+rpt-rpi-v6",
            "linux-image-6.6.62+rpt-rpi-v7",
            "linux-image-6.6.62+rpt-rpi-v7l",
        ];
        let cases: &[Case] = &[
            // Raspberry Pi OS bookworm, 64-bit image: both flavours installed.
            ("Pi 4, 64-bit, current", PI64, "6.6.62+rpt-rpi-v8", false),
            ("Pi 5, current", PI64, "6.6.62+rpt-rpi-2712", false),
            ("Pi 4, 64-bit, behind", PI64, "6.6.51+rpt-rpi-v8", true),
            ("Pi 5, behind", PI64, "6.6.51+rpt-rpi-2712", true),
            // 32-bit image: three flavours.
            ("Pi 3, 32-bit, current", PI32, "6.6.62+rpt-rpi-v7", false),
            ("Pi 4, 32-bit, current", PI32, "6.6.62+rpt-rpi-v7l", false),
            ("Pi Zero, current", PI32, "6.6.62+rpt-rpi-v6", false),
            (
                "Pi 3, 32-bit, behind",
                &[
                    "linux-image-6.6.62+rpt-rpi-v7",
                    "linux-image-6.6.74+rpt-rpi-v7",
                    "linux-image-6.6.74+rpt-rpi-v7l",
                ],
                "6.6.62+rpt-rpi-v7",
                true,
            ),
            // Debian.
            (
                "Debian amd64, current",
                &["linux-image-6.1.0-9-amd64", "linux-image-6.1.0-28-amd64"],
                "6.1.0-28-amd64",
                false,
            ),
            (
                "Debian amd64, behind (28 > 9, not string order)",
                &["linux-image-6.1.0-9-amd64", "linux-image-6.1.0-28-amd64"],
                "6.1.0-9-amd64",
                true,
            ),
            (
                "Debian arm64, behind",
                &["linux-image-6.1.0-27-arm64", "linux-image-6.1.0-28-arm64"],
                "6.1.0-27-arm64",
                true,
            ),
            (
                "Debian arm64, a cloud kernel beside does not count",
                &[
                    "linux-image-6.1.0-28-arm64",
                    "linux-image-6.1.0-30-cloud-arm64",
                ],
                "6.1.0-28-arm64",
                false,
            ),
            (
                "running kernel newer than any installed one",
                &["linux-image-6.1.0-27-arm64"],
                "6.1.0-28-arm64",
                false,
            ),
            ("no kernel installed", &[], "6.1.0-28-arm64", false),
        ];
        for (machine, packages, running, expected) in cases {
            let dir = tempfile::tempdir().expect("tempdir");
            for package in *packages {
                install(dir.path(), package);
            }
            let got = reboot_needed(dir.path(), running);
            assert_eq!(got.is_some(), *expected, "{machine}: {got:?}");
        }
    }

    #[test]
    fn reboot_required_file_and_leftovers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        install(root, "linux-image-6.6.62+rpt-rpi-v8");
        std::fs::create_dir_all(root.join("lib/modules/9.9.9+rpt-rpi-v8")).expect("mkdir");
        assert_eq!(
            reboot_needed(root, "6.6.62+rpt-rpi-v8"),
            None,
            "an empty module tree is a leftover of a removed kernel"
        );
        std::fs::create_dir_all(root.join("boot")).expect("mkdir");
        std::fs::write(root.join("boot/vmlinuz-6.6.74+rpt-rpi-v8"), "").expect("write");
        assert_eq!(
            reboot_needed(root, "6.6.62+rpt-rpi-v8").as_deref(),
            Some("kernel 6.6.74+rpt-rpi-v8 is installed, 6.6.62+rpt-rpi-v8 is running")
        );
        std::fs::create_dir_all(root.join("run")).expect("mkdir");
        std::fs::write(root.join("run/reboot-required"), "").expect("write");
        std::fs::write(root.join("run/reboot-required.pkgs"), "libc6\n").expect("write");
        assert_eq!(
            reboot_needed(root, "6.6.74+rpt-rpi-v8").as_deref(),
            Some("/run/reboot-required exists (libc6)")
        );
    }
}
