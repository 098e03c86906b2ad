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
}
