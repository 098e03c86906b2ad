//! Reading dpkg's own state, never its exit codes: `dpkg --audit` exits 0
//! even when it lists problems, and a package left half-installed by a kill
//! during preinst survives `dpkg --configure -a` (it needs a reinstall).

use std::path::Path;

/// Whether dpkg was interrupted: its journal directory holds pending entries.
pub fn interrupted(root: &Path) -> bool {
    std::fs::read_dir(root.join("var/lib/dpkg/updates"))
        .map(|entries| {
            entries.flatten().any(|e| {
                e.file_name()
                    .to_string_lossy()
                    .chars()
                    .all(|c| c.is_ascii_digit())
            })
        })
        .unwrap_or(false)
}

/// The packages a dpkg or apt run set up, with their versions, from its
/// "Setting up NAME (VERSION) ..." lines (the architecture qualifier
/// dropped): what a repair after a power cut finished.
pub fn set_up(stdout: &str) -> Vec<(String, String)> {
    stdout
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("Setting up ")?;
            let mut words = rest.split_whitespace();
            let name = words.next()?.split(':').next()?.to_owned();
            let version = words
                .next()?
                .strip_prefix('(')?
                .strip_suffix(')')?
                .to_owned();
            Some((name, version))
        })
        .collect()
}

/// The version `name` was upgraded from to `to`, from dpkg's own log in
/// `root` ("DATE TIME upgrade NAME:ARCH OLD NEW", written as dpkg unpacks):
/// the one record of the old version once a power cut ended the apt run
/// that knew it. The newest matching line wins; only the log's last 4 MiB
/// are read.
pub fn upgraded_from(root: &Path, name: &str, to: &str) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    const TAIL: u64 = 4 * 1024 * 1024;
    let mut file = std::fs::File::open(root.join("var/log/dpkg.log")).ok()?;
    let length = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(length.saturating_sub(TAIL)))
        .ok()?;
    let mut bytes = Vec::new();
    file.take(TAIL).read_to_end(&mut bytes).ok()?;
    String::from_utf8_lossy(&bytes)
        .lines()
        .rev()
        .find_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                [_, _, "upgrade", package, old, new]
                    if package.split(':').next() == Some(name) && *new == to =>
                {
                    Some((*old).to_owned())
                }
                _ => None,
            }
        })
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokenPackage {
    pub name: String,
    pub status: char,
    pub reinstall_required: bool,
}

impl BrokenPackage {
    /// Half-installed or marked reinst-required: only a reinstall fixes it.
    pub fn needs_reinstall(&self) -> bool {
        self.status == 'H' || self.reinstall_required
    }

    pub fn describe(&self) -> String {
        let state = match self.status {
            'H' => "half-installed",
            'U' => "unpacked",
            'F' => "half-configured",
            'W' => "triggers-awaited",
            't' => "triggers-pending",
            _ => "broken",
        };
        if self.reinstall_required {
            format!("{} ({state}, reinstall required)", self.name)
        } else {
            format!("{} ({state})", self.name)
        }
    }
}

/// Parses `dpkg-query -W -f '${Package}\t${db:Status-Abbrev}\n'` into the
/// packages that are not cleanly installed, removed, or config-files only.
pub fn broken_packages(query_output: &str) -> Vec<BrokenPackage> {
    query_output
        .lines()
        .filter_map(|line| {
            let (name, abbrev) = line.split_once('\t')?;
            let mut chars = abbrev.chars();
            let _want = chars.next()?;
            let status = chars.next()?;
            let error = chars.next().unwrap_or(' ');
            let clean = matches!(status, 'i' | 'n' | 'c');
            let reinstall_required = error == 'R';
            (!clean || reinstall_required).then(|| BrokenPackage {
                name: name.to_owned(),
                status,
                reinstall_required,
            })
        })
        .collect()
}

pub const QUERY_FORMAT: &str = "${Package}\t${db:Status-Abbrev}\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_package_states() {
        let output = "apt\tii \nfake-slow\tiHR\nfake-conf\tiF \nold\trc \ngone\tun \nhalf\tiU \n";
        let broken = broken_packages(output);
        let names: Vec<(&str, bool)> = broken
            .iter()
            .map(|b| (b.name.as_str(), b.needs_reinstall()))
            .collect();
        assert_eq!(
            names,
            vec![("fake-slow", true), ("fake-conf", false), ("half", false)]
        );
        assert_eq!(
            broken[0].describe(),
            "fake-slow (half-installed, reinstall required)"
        );
    }

    #[test]
    fn an_interrupted_dpkg_leaves_journal_entries() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(!interrupted(dir.path()));
        let updates = dir.path().join("var/lib/dpkg/updates");
        std::fs::create_dir_all(&updates).expect("mkdir");
        std::fs::write(updates.join("tmp.i"), "").expect("write");
        assert!(
            !interrupted(dir.path()),
            "a temporary file is not a journal entry"
        );
        std::fs::write(updates.join("0000"), "Package: x\n").expect("write");
        assert!(interrupted(dir.path()));
    }

    #[test]
    fn a_repair_names_what_it_set_up_and_the_log_what_it_was() {
        let out = "Setting up drover-fake-slow (2.0) ...\nSetting up libssl3:arm64 (3.0.17-1~deb12u1) ...\n\
                   Processing triggers for man-db (2.11.2-2) ...\nSetting up broken line\n";
        assert_eq!(
            set_up(out),
            [
                ("drover-fake-slow".to_owned(), "2.0".to_owned()),
                ("libssl3".to_owned(), "3.0.17-1~deb12u1".to_owned())
            ]
        );
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("var/log")).expect("log dir");
        std::fs::write(
            root.path().join("var/log/dpkg.log"),
            "2026-11-01 10:00:00 upgrade libssl3:arm64 3.0.15-1 3.0.16-1\n\
             2026-12-03 06:30:00 startup packages configure\n\
             2026-12-03 06:30:01 upgrade libssl3:arm64 3.0.16-1 3.0.17-1~deb12u1\n\
             2026-12-03 06:30:02 status half-installed libssl3:arm64 3.0.17-1~deb12u1\n",
        )
        .expect("log");
        assert_eq!(
            upgraded_from(root.path(), "libssl3", "3.0.17-1~deb12u1").as_deref(),
            Some("3.0.16-1")
        );
        assert_eq!(upgraded_from(root.path(), "libssl3", "9.9"), None);
        assert_eq!(upgraded_from(root.path(), "other", "3.0.16-1"), None);
        assert_eq!(
            upgraded_from(&root.path().join("none"), "libssl3", "3.0.16-1"),
            None
        );
    }
}
