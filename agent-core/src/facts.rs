//! Cheap facts about the device for every heartbeat: OS release, Debian
//! architecture name, uptime, and a digest that changes with the package set.
//! Paths are relative to a root so tests and sandboxes can point elsewhere.

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

#[derive(Debug, Clone)]
pub struct FactSources {
    /// Root of the system whose OS release and dpkg status are read ("/" on a device).
    pub root: PathBuf,
}

impl Default for FactSources {
    fn default() -> Self {
        Self {
            root: PathBuf::from("/"),
        }
    }
}

impl FactSources {
    /// `PRETTY_NAME` from os-release, or "unknown".
    pub fn os_release(&self) -> String {
        let text = std::fs::read_to_string(self.root.join("etc/os-release"))
            .or_else(|_| std::fs::read_to_string(self.root.join("usr/lib/os-release")))
            .unwrap_or_default();
        text.lines()
            .find_map(|line| line.strip_prefix("PRETTY_NAME="))
            .map(|v| v.trim_matches('"').to_owned())
            .unwrap_or_else(|| "unknown".into())
    }

    /// A digest of the dpkg status file's size and modification time: it
    /// changes whenever packages change, and costs one stat.
    pub fn inventory_digest(&self) -> String {
        let path = self.root.join("var/lib/dpkg/status");
        match std::fs::metadata(path) {
            Ok(meta) => {
                let mtime = meta
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                    .map(|d| d.as_nanos())
                    .unwrap_or(0);
                format!("dpkg:{}:{mtime}", meta.len())
            }
            Err(_) => "none".into(),
        }
    }
}

/// The Debian architecture name of this build.
pub fn debian_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "armhf",
        "x86" => "i386",
        other => other,
    }
}

/// Seconds since boot, from /proc/uptime.
pub fn uptime_seconds() -> u64 {
    read_uptime(Path::new("/proc/uptime")).unwrap_or(0)
}

fn read_uptime(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let first = text.split_whitespace().next()?;
    first.parse::<f64>().ok().map(|s| s as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_os_release_and_digest_from_a_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let facts = FactSources {
            root: dir.path().to_owned(),
        };
        assert_eq!(facts.os_release(), "unknown");
        assert_eq!(facts.inventory_digest(), "none");
        std::fs::create_dir_all(dir.path().join("etc")).expect("mkdir");
        std::fs::write(
            dir.path().join("etc/os-release"),
            "NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n",
        )
        .expect("write");
        assert_eq!(facts.os_release(), "Debian GNU/Linux 12 (bookworm)");
        std::fs::create_dir_all(dir.path().join("var/lib/dpkg")).expect("mkdir");
        std::fs::write(dir.path().join("var/lib/dpkg/status"), "Package: x\n").expect("write");
        assert!(facts.inventory_digest().starts_with("dpkg:11:"));
    }
}
