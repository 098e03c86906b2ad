//! Reading what apt says it did or would do. apt's simulation lines
//! (`Inst`, `Remv`) and its "kept back" list are stable under `LC_ALL=C`.

use drover_model::model::{MAX_LISTED_PACKAGES, PackageChange, UpgradeOutput};

/// A report being filled in, bounded to [`MAX_LISTED_PACKAGES`] names.
struct Report {
    output: UpgradeOutput,
    listed: usize,
}

impl Report {
    fn push<T>(list: &mut Vec<T>, item: T, listed: &mut usize, omitted: &mut u32) {
        if *listed < MAX_LISTED_PACKAGES {
            list.push(item);
            *listed += 1;
        } else {
            *omitted += 1;
        }
    }

    fn change(&mut self, change: PackageChange) {
        let out = &mut self.output;
        let list = if change.from.is_some() {
            &mut out.upgraded
        } else {
            &mut out.installed
        };
        Self::push(list, change, &mut self.listed, &mut out.omitted);
    }

    fn removed(&mut self, name: &str) {
        let out = &mut self.output;
        Self::push(
            &mut out.removed,
            name.to_owned(),
            &mut self.listed,
            &mut out.omitted,
        );
    }

    fn kept_back(&mut self, name: &str) {
        let out = &mut self.output;
        Self::push(
            &mut out.kept_back,
            name.to_owned(),
            &mut self.listed,
            &mut out.omitted,
        );
    }
}

/// Walks apt's output: the indented list under "have been kept back" is read
/// here; every other line goes to `line`.
fn parse(stdout: &str, simulated: bool, line: impl Fn(&mut Report, &str)) -> UpgradeOutput {
    let mut report = Report {
        output: UpgradeOutput {
            simulated,
            ..UpgradeOutput::default()
        },
        listed: 0,
    };
    let mut in_kept_back = false;
    for text in stdout.lines() {
        if in_kept_back && text.starts_with(' ') {
            text.split_whitespace()
                .for_each(|name| report.kept_back(name));
            continue;
        }
        in_kept_back = text.starts_with("The following packages have been kept back");
        if !in_kept_back {
            line(&mut report, text);
        }
    }
    report.output
}

fn first_word(text: &str) -> &str {
    text.split_whitespace().next().unwrap_or_default()
}

/// Parses `apt-get -s full-upgrade` output (`Inst`, `Remv` lines) into a bounded report.
pub fn parse_simulation(stdout: &str) -> UpgradeOutput {
    parse(stdout, true, |report, line| {
        if let Some(rest) = line.strip_prefix("Inst ") {
            let (name, from, to) = parse_inst(rest);
            report.change(PackageChange { name, from, to });
        } else if let Some(rest) = line.strip_prefix("Remv ") {
            report.removed(first_word(rest));
        }
    })
}

/// Parses the output of a real `apt-get full-upgrade`: dpkg's `Unpacking`
/// and `Removing` lines say what changed; apt's summary says what was kept back.
pub fn parse_upgrade_run(stdout: &str) -> UpgradeOutput {
    let strip = |word: &str| word.trim_matches(|c| c == '(' || c == ')').to_owned();
    parse(stdout, false, |report, line| {
        if let Some(rest) = line.strip_prefix("Unpacking ") {
            // "NAME (NEW) over (OLD) ..." or "NAME (NEW) ..."
            let mut words = rest.split_whitespace();
            let name = words.next().unwrap_or_default().to_owned();
            let to = strip(words.next().unwrap_or_default());
            let from = match (words.next(), words.next()) {
                (Some("over"), Some(old)) => Some(strip(old)),
                _ => None,
            };
            report.change(PackageChange { name, from, to });
        } else if let Some(rest) = line.strip_prefix("Removing ") {
            report.removed(first_word(rest));
        }
    })
}

/// `name [old] (new origin [arch])` or `name (new origin [arch])`.
fn parse_inst(rest: &str) -> (String, Option<String>, String) {
    let mut parts = rest.splitn(2, ' ');
    let name = parts.next().unwrap_or_default().to_owned();
    let tail = parts.next().unwrap_or_default();
    let from = tail
        .strip_prefix('[')
        .and_then(|t| t.split(']').next())
        .map(str::to_owned);
    let to = tail
        .split('(')
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .unwrap_or_default()
        .to_owned();
    (name, from, to)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "NOTE: This is only a simulation!
Reading package lists...
Calculating upgrade...
The following packages have been kept back:
  linux-image-amd64 raspi-firmware
The following packages will be upgraded:
  libfoo tzdata
2 upgraded, 1 newly installed, 1 to remove and 2 not upgraded.
Remv oldlib [0.9]
Inst libfoo [1.0-1] (2.0-1 Debian:12.8/stable [amd64])
Inst newdep (3.1 Debian:12.8/stable [amd64])
Inst tzdata [2024a-0+deb12u1] (2025b-0+deb12u1 Debian-Security:12/stable-security [all])
Conf libfoo (2.0-1 Debian:12.8/stable [amd64])
";

    #[test]
    fn reads_changes_and_kept_back_packages() {
        let out = parse_simulation(SAMPLE);
        assert!(out.simulated);
        assert_eq!(out.kept_back, vec!["linux-image-amd64", "raspi-firmware"]);
        assert_eq!(out.removed, vec!["oldlib"]);
        assert_eq!(
            out.upgraded,
            vec![
                PackageChange {
                    name: "libfoo".into(),
                    from: Some("1.0-1".into()),
                    to: "2.0-1".into()
                },
                PackageChange {
                    name: "tzdata".into(),
                    from: Some("2024a-0+deb12u1".into()),
                    to: "2025b-0+deb12u1".into()
                },
            ]
        );
        assert_eq!(
            out.installed,
            vec![PackageChange {
                name: "newdep".into(),
                from: None,
                to: "3.1".into()
            }]
        );
        assert_eq!(out.omitted, 0);
    }

    #[test]
    fn reads_what_a_real_upgrade_did() {
        let run = "Reading package lists...
The following packages have been kept back:
  linux-image-arm64
The following packages will be upgraded:
  drover-fake-base drover-fake-conf
Preparing to unpack .../drover-fake-base_2.0_all.deb ...
Unpacking drover-fake-base (2.0) over (1.0) ...
Preparing to unpack .../newdep_3.1_arm64.deb ...
Unpacking newdep:arm64 (3.1) ...
Removing oldlib (0.9) ...
Setting up drover-fake-base (2.0) ...
";
        let out = parse_upgrade_run(run);
        assert!(!out.simulated);
        assert_eq!(
            out.upgraded,
            vec![PackageChange {
                name: "drover-fake-base".into(),
                from: Some("1.0".into()),
                to: "2.0".into()
            }]
        );
        assert_eq!(
            out.installed,
            vec![PackageChange {
                name: "newdep:arm64".into(),
                from: None,
                to: "3.1".into()
            }]
        );
        assert_eq!(out.removed, vec!["oldlib"]);
        assert_eq!(out.kept_back, vec!["linux-image-arm64"]);
    }

    #[test]
    fn bounds_the_listed_packages() {
        let many: String = (0..MAX_LISTED_PACKAGES + 25)
            .map(|i| format!("Inst p{i} [1] (2 x [all])\n"))
            .collect();
        let out = parse_simulation(&many);
        assert_eq!(out.upgraded.len(), MAX_LISTED_PACKAGES);
        assert_eq!(out.omitted, 25);
        assert!(parse_simulation("").upgraded.is_empty());
    }
}
