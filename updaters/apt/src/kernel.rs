//! Does the machine need a reboot? When apt's hooks wrote
//! `/run/reboot-required`, or when the newest installed kernel is not the
//! running one (Raspberry Pi OS often writes no reboot-required file).

use std::path::Path;

/// The newest kernel release installed under `root`, from the module trees
/// (`lib/modules/<release>`, present on Debian and Raspberry Pi OS alike) and
/// `boot/vmlinuz-<release>`.
pub fn newest_installed_kernel(root: &Path) -> Option<String> {
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
    // Kernel releases order like Debian versions ("6.1.0-28-arm64" > "6.1.0-9-arm64").
    releases
        .into_iter()
        .max_by(|a, b| deb_version::compare_versions(a, b))
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
    let newest = newest_installed_kernel(root)?;
    (newest != running_release)
        .then(|| format!("kernel {newest} is installed, {running_release} is running"))
}

/// The running kernel's release.
pub fn running_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(root: &Path, release: &str) {
        let dir = root.join("lib/modules").join(release);
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("modules.dep"), "").expect("write");
    }

    #[test]
    fn reboot_rules() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        assert_eq!(
            reboot_needed(root, "6.1.0-28-arm64"),
            None,
            "no kernel installed: nothing to compare"
        );
        kernel(root, "6.1.0-9-arm64");
        kernel(root, "6.1.0-28-arm64");
        assert_eq!(
            newest_installed_kernel(root).as_deref(),
            Some("6.1.0-28-arm64"),
            "28 > 9, not string order"
        );
        assert_eq!(reboot_needed(root, "6.1.0-28-arm64"), None);
        assert!(
            reboot_needed(root, "6.1.0-9-arm64")
                .expect("needed")
                .contains("6.1.0-28-arm64 is installed")
        );
        kernel(root, "6.6.62+rpt-rpi-v8");
        assert_eq!(
            newest_installed_kernel(root).as_deref(),
            Some("6.6.62+rpt-rpi-v8")
        );
        std::fs::create_dir_all(root.join("lib/modules/9.9.9-leftover")).expect("mkdir");
        assert_eq!(
            newest_installed_kernel(root).as_deref(),
            Some("6.6.62+rpt-rpi-v8"),
            "empty trees are ignored"
        );
        std::fs::create_dir_all(root.join("run")).expect("mkdir");
        std::fs::write(root.join("run/reboot-required"), "").expect("write");
        std::fs::write(root.join("run/reboot-required.pkgs"), "libc6\n").expect("write");
        assert_eq!(
            reboot_needed(root, "6.6.62+rpt-rpi-v8").as_deref(),
            Some("/run/reboot-required exists (libc6)")
        );
    }
}
