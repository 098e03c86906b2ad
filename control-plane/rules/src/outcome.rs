//! What a finished job did, in one line an operator reads in a table:
//! the CLI's `describe`, the dashboard and the API's `resultText` all show
//! this line, so none of them words an upgrade's report on its own.

use drover_model::JobOutput;
use drover_model::model::{PackageChange, UpgradeOutput};

/// How many package changes the line names before "and N more".
const NAMED: usize = 3;

/// One line for a job's output; None when it has none.
pub fn result_line(output: Option<&JobOutput>) -> Option<String> {
    Some(match output? {
        JobOutput::Upgrade(upgrade) => upgrade_line(upgrade),
        JobOutput::Inventory(inventory) => format!(
            "inventory: {}, {} packages installed",
            inventory.os_release, inventory.installed_packages
        ),
        JobOutput::Software(software) => format!(
            "inventory: {}, {} packages installed",
            software.inventory.os_release, software.inventory.installed_packages
        ),
        JobOutput::Assessment(assessment) => assessment_line(assessment),
    })
}

/// A patch assessment in one line: "up to date", or what is pending
/// ("5 updates pending, 2 security, 1 kept back"), then a pending reboot.
pub fn assessment_line(a: &drover_model::model::PatchAssessment) -> String {
    let mut parts = Vec::new();
    if a.upgradable == 0 {
        parts.push("up to date".to_owned());
    } else {
        let mut pending = format!(
            "{} update{} pending",
            a.upgradable,
            if a.upgradable == 1 { "" } else { "s" }
        );
        if a.security_archive {
            pending.push_str(&format!(", {} security", a.security));
        } else {
            pending.push_str(" (no security archive among the sources)");
        }
        parts.push(pending);
    }
    if a.kept_back > 0 {
        parts.push(format!("{} kept back", a.kept_back));
    }
    if a.reboot_pending.is_some() {
        parts.push("reboot pending".to_owned());
    }
    parts.join(", ")
}

fn change(c: &PackageChange) -> String {
    match &c.from {
        Some(from) => format!("{} {from} → {}", c.name, c.to),
        None => format!("{} {}", c.name, c.to),
    }
}

fn upgrade_line(u: &UpgradeOutput) -> String {
    let changed = u.upgraded.len() + u.installed.len() + u.removed.len() + u.omitted as usize;
    let mut parts = Vec::new();
    if changed == 0 {
        parts.push(if u.simulated {
            "nothing to upgrade".to_owned()
        } else {
            "nothing upgraded: the system was up to date".to_owned()
        });
    } else {
        let verb = if u.simulated {
            "would upgrade"
        } else {
            "upgraded"
        };
        let mut named: Vec<String> = u.upgraded.iter().take(NAMED).map(change).collect();
        let more = u.upgraded.len().saturating_sub(NAMED) + u.omitted as usize;
        if more > 0 {
            named.push(format!("and {more} more"));
        }
        if !u.upgraded.is_empty() || u.omitted > 0 {
            parts.push(format!(
                "{verb} {} ({})",
                u.upgraded.len() + u.omitted as usize,
                named.join(", ")
            ));
        }
        if !u.installed.is_empty() {
            parts.push(format!("{} new", u.installed.len()));
        }
        if !u.removed.is_empty() {
            parts.push(format!("{} removed", u.removed.len()));
        }
    }
    if !u.kept_back.is_empty() {
        parts.push(format!("{} kept back", u.kept_back.len()));
    }
    if u.reboot_required {
        parts.push(if u.simulated {
            "would reboot".into()
        } else {
            "rebooted".into()
        });
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assessment_reads_as_what_is_pending() {
        use drover_model::model::PatchAssessment;
        let up_to_date = PatchAssessment {
            security_archive: true,
            ..PatchAssessment::default()
        };
        assert_eq!(assessment_line(&up_to_date), "up to date");
        let pending = PatchAssessment {
            upgradable: 5,
            security: 2,
            kept_back: 1,
            security_archive: true,
            reboot_pending: Some("/run/reboot-required exists".into()),
            ..PatchAssessment::default()
        };
        assert_eq!(
            assessment_line(&pending),
            "5 updates pending, 2 security, 1 kept back, reboot pending"
        );
        let raspbian = PatchAssessment {
            upgradable: 1,
            ..PatchAssessment::default()
        };
        assert_eq!(
            result_line(Some(&JobOutput::Assessment(raspbian))).as_deref(),
            Some("1 update pending (no security archive among the sources)")
        );
    }

    fn pkg(name: &str, from: Option<&str>, to: &str) -> PackageChange {
        PackageChange {
            name: name.into(),
            from: from.map(str::to_owned),
            to: to.into(),
        }
    }

    #[test]
    fn an_upgrade_reads_as_what_changed_and_whether_it_rebooted() {
        assert_eq!(result_line(None), None);
        let mut u = UpgradeOutput::default();
        let line = |u: &UpgradeOutput| result_line(Some(&JobOutput::Upgrade(u.clone())));
        assert_eq!(
            line(&u).as_deref(),
            Some("nothing upgraded: the system was up to date")
        );
        u.upgraded = vec![
            pkg("openssl", Some("3.0.16-1"), "3.0.17-1"),
            pkg("libssl3", Some("3.0.16-1"), "3.0.17-1"),
            pkg("tzdata", Some("2025a"), "2025b"),
            pkg("curl", Some("7.88"), "7.88.1"),
        ];
        u.omitted = 2;
        u.installed = vec![pkg("linux-image-6.1.0-30", None, "6.1.128-1")];
        u.kept_back = vec!["firefox-esr".into()];
        u.reboot_required = true;
        assert_eq!(
            line(&u).as_deref(),
            Some(
                "upgraded 6 (openssl 3.0.16-1 → 3.0.17-1, libssl3 3.0.16-1 → 3.0.17-1, \
                 tzdata 2025a → 2025b, and 3 more); 1 new; 1 kept back; rebooted"
            )
        );
        u.simulated = true;
        assert!(line(&u).expect("line").starts_with("would upgrade 6 ("));
        assert!(line(&u).expect("line").ends_with("would reboot"));
    }
}
