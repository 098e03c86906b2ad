//! Why a selection matched no device (issue 56): which of its parts (a
//! group, a label's key or value) no device has, with the nearest name that
//! exists, so that `groups: [prodution]` is answered with "did you mean
//! production?" before a run fails at once with NoTargets.

use crate::deployment::{DeviceFilter, DeviceInventory, SoftwareCondition};
use crate::placement::{self, Left};
use crate::records::{DeviceRecord, TaskRunSpec};
use std::collections::{BTreeMap, BTreeSet};

/// What [`unmatched`] says when every part matches some device.
pub const NOT_TOGETHER: &str =
    "each part matches some device, but no device matches them all together";

/// A name this far from a wanted one, or nearer, is offered in its place:
/// a third of the wanted name's length, at least one edit and at most three.
fn near_enough(wanted: &str) -> usize {
    (wanted.chars().count() / 3).clamp(1, 3)
}

/// The existing name nearest to `wanted` (by edit distance, ties by
/// name), if one is near enough to be a typo of it.
pub fn nearest<'a>(wanted: &str, names: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    names
        .into_iter()
        .map(|name| (strsim::damerau_levenshtein(wanted, name), name))
        .filter(|(distance, _)| *distance <= near_enough(wanted))
        .min()
        .map(|(_, name)| name)
}

fn did_you_mean(nearest: Option<&str>) -> String {
    nearest
        .map(|name| format!(" (did you mean {name:?}?)"))
        .unwrap_or_default()
}

/// Each part of a selection that no device in `devices` has: a group in
/// `groups` no device is in, a label key no device has, a value of a key
/// no device has with that key. When every part matches some device but
/// no device matches them all, one sentence says so.
pub fn unmatched(
    groups: &[String],
    labels: &BTreeMap<String, String>,
    devices: &[DeviceRecord],
) -> Vec<String> {
    let all_groups: BTreeSet<&str> = devices
        .iter()
        .flat_map(|d| d.groups.iter().map(String::as_str))
        .collect();
    let device_labels: Vec<BTreeMap<String, String>> =
        devices.iter().map(DeviceRecord::effective_labels).collect();
    let mut said = Vec::new();
    for group in groups {
        if !all_groups.contains(group.as_str()) {
            said.push(format!(
                "no device is in the group {group:?}{}",
                did_you_mean(nearest(group, all_groups.iter().copied()))
            ));
        }
    }
    for (key, value) in labels {
        let values: BTreeSet<&str> = device_labels
            .iter()
            .filter_map(|l| l.get(key).map(String::as_str))
            .collect();
        if values.is_empty() {
            let keys: BTreeSet<&str> = device_labels
                .iter()
                .flat_map(|l| l.keys().map(String::as_str))
                .collect();
            said.push(format!(
                "no device has the label {key:?}{}",
                did_you_mean(nearest(key, keys.iter().copied()))
            ));
        } else if !values.contains(value.as_str()) {
            let hint = match nearest(value, values.iter().copied()) {
                Some(near) => format!(" (did you mean {key}={near}?)"),
                None => {
                    let some: Vec<&str> = values.iter().take(5).copied().collect();
                    format!(" (its values: {})", some.join(", "))
                }
            };
            said.push(format!("no device has {key}={value}{hint}"));
        }
    }
    if said.is_empty() && !(groups.is_empty() && labels.is_empty()) {
        said.push(NOT_TOGETHER.to_owned());
    }
    said
}

/// A run's selection parts that matched nothing, when no device at all is
/// selected by it (none when some device is, though left out: without an
/// agent, decommissioned, lacking the kind).
pub fn of_run(spec: &TaskRunSpec, devices: &[DeviceRecord]) -> Vec<String> {
    if devices
        .iter()
        .any(|d| placement::placed(spec, d) != Err(Left::NotSelected))
    {
        return Vec::new();
    }
    unmatched(
        &spec.allowed_groups,
        &spec.target_selector.match_labels,
        devices,
    )
}

/// Each of `groups` no device in `devices` is in, with the nearest name,
/// when another of them selects devices: groups add up, so a misspelt one
/// beside a good one selects nothing and says nothing. Empty when none
/// selects (then [`unmatched`] names what matched nothing) or all do.
pub fn empty_groups(groups: &[String], devices: &[DeviceRecord]) -> Vec<String> {
    let all_groups: BTreeSet<&str> = devices
        .iter()
        .flat_map(|d| d.groups.iter().map(String::as_str))
        .collect();
    let (full, empty): (Vec<&String>, Vec<&String>) =
        groups.iter().partition(|g| all_groups.contains(g.as_str()));
    if full.is_empty() {
        return Vec::new();
    }
    empty
        .into_iter()
        .map(|group| {
            format!(
                "no device is in the group {group:?}{}",
                did_you_mean(nearest(group, all_groups.iter().copied()))
            )
        })
        .collect()
}

/// What in a deployment's filter matched no device: its groups and
/// labels ([`unmatched`]); when those select devices together, which of
/// its software conditions ruled them all out, from each selected
/// device's inventory (`inventory` of a device; None when it has none).
pub fn of_filter<'a>(
    filter: &DeviceFilter,
    devices: &[DeviceRecord],
    inventory: impl Fn(&DeviceRecord) -> Option<&'a DeviceInventory>,
) -> Vec<String> {
    let selected: Vec<&DeviceRecord> = devices
        .iter()
        .filter(|d| filter.selects_by_name(d))
        .collect();
    if selected.is_empty() || !filter.needs_inventory() {
        return unmatched(&filter.groups, &filter.match_labels, devices);
    }
    let known: Vec<&DeviceInventory> = selected.iter().filter_map(|d| inventory(d)).collect();
    let of = format!(
        "of the {} devices the groups and labels select",
        selected.len()
    );
    let mut said = Vec::new();
    for condition in &filter.software_present {
        if known.iter().any(|i| condition.holds(i)) {
            continue;
        }
        let versions: BTreeSet<&str> = known
            .iter()
            .filter_map(|i| i.packages.get(&condition.name).map(String::as_str))
            .collect();
        let installed = if versions.is_empty() {
            "none has it installed".to_owned()
        } else {
            let some: Vec<&str> = versions.iter().take(5).copied().collect();
            format!("installed there: {}", some.join(", "))
        };
        said.push(format!(
            "softwarePresent {} holds on none {of} ({installed})",
            describe(condition)
        ));
    }
    for condition in &filter.software_absent {
        if !known.is_empty() && known.iter().all(|i| condition.holds(i)) {
            said.push(format!(
                "softwareAbsent {}: every one {of} has it",
                describe(condition)
            ));
        }
    }
    if said.is_empty() {
        said.push(format!(
            "each software condition holds on some {of}, but none holds them all together"
        ));
    }
    said
}

/// A software condition as a manifest writes it: `name`, or `name OP version`.
fn describe(condition: &SoftwareCondition) -> String {
    match &condition.version_cmp {
        None => condition.name.clone(),
        Some(cmp) => format!("{} {} {}", condition.name, cmp.op.as_str(), cmp.version),
    }
}

/// `error` with what matched nothing after it, if anything.
pub fn with_unmatched(error: &str, unmatched: &[String]) -> String {
    match unmatched {
        [] => error.to_owned(),
        parts => format!("{error}: {}", parts.join("; ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_model::DeviceId;

    fn device(name: &str, groups: &[&str], labels: &[(&str, &str)]) -> DeviceRecord {
        let mut d = DeviceRecord::new(DeviceId::new(name).expect("id"));
        d.groups = groups.iter().map(|g| g.to_string()).collect();
        d.labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        d
    }

    #[test]
    fn a_misspelt_group_or_label_is_named_with_the_nearest_that_exists() {
        let fleet = [
            device("pi-1", &["production"], &[("site", "sofia")]),
            device("pi-2", &["staging"], &[("site", "plovdiv")]),
        ];
        let groups = vec!["prodution".to_owned(), "staging".to_owned()];
        assert_eq!(
            unmatched(&groups, &BTreeMap::new(), &fleet),
            [r#"no device is in the group "prodution" (did you mean "production"?)"#]
        );
        let labels = BTreeMap::from([("sit".to_owned(), "sofia".to_owned())]);
        assert_eq!(
            unmatched(&[], &labels, &fleet),
            [r#"no device has the label "sit" (did you mean "site"?)"#]
        );
        let labels = BTreeMap::from([("site".to_owned(), "sofa".to_owned())]);
        assert_eq!(
            unmatched(&[], &labels, &fleet),
            [r#"no device has site=sofa (did you mean site=sofia?)"#]
        );
        let labels = BTreeMap::from([("site".to_owned(), "varna".to_owned())]);
        assert_eq!(
            unmatched(&[], &labels, &fleet),
            ["no device has site=varna (its values: plovdiv, sofia)"]
        );
        // Nothing near: no guess.
        assert_eq!(
            unmatched(&["kitchen".to_owned()], &BTreeMap::new(), &fleet),
            [r#"no device is in the group "kitchen""#]
        );
        // Each part alone matches; together they do not.
        let labels = BTreeMap::from([("site".to_owned(), "plovdiv".to_owned())]);
        assert_eq!(
            unmatched(&["production".to_owned()], &labels, &fleet),
            ["each part matches some device, but no device matches them all together"]
        );
    }

    #[test]
    fn a_software_condition_that_rules_out_every_selected_device_is_named() {
        use crate::deployment::{VersionCmp, VersionOp};
        let fleet = [
            device("pi-1", &["production"], &[]),
            device("pi-2", &["production"], &[]),
            device("lab-1", &["lab"], &[]),
        ];
        let inventory = |packages: &[(&str, &str)]| DeviceInventory {
            device: DeviceId::new("x").expect("id"),
            collected_at: jiff::Timestamp::UNIX_EPOCH,
            packages: packages
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            truncated: false,
        };
        let one = inventory(&[("openssl", "3.0.11-1"), ("kiosk", "1.0")]);
        let two = inventory(&[("openssl", "3.0.13-1")]);
        let lab = inventory(&[("kiosk", "2.0")]);
        let of = |d: &DeviceRecord| match d.id.as_str() {
            "pi-1" => Some(&one),
            "pi-2" => Some(&two),
            _ => Some(&lab),
        };
        let condition = |name: &str, cmp: Option<(VersionOp, &str)>| SoftwareCondition {
            name: name.into(),
            version_cmp: cmp.map(|(op, version)| VersionCmp {
                op,
                version: version.into(),
            }),
        };
        let filter =
            |present: Vec<SoftwareCondition>, absent: Vec<SoftwareCondition>| DeviceFilter {
                groups: vec!["production".into()],
                software_present: present,
                software_absent: absent,
                ..DeviceFilter::default()
            };
        // kiosk 2.0 is on lab-1 only, which the group leaves out.
        let wanted = filter(
            vec![condition("kiosk", Some((VersionOp::Ge, "2.0")))],
            vec![],
        );
        assert_eq!(
            of_filter(&wanted, &fleet, of),
            [
                "softwarePresent kiosk >= 2.0 holds on none of the 2 devices the groups and labels \
              select (installed there: 1.0)"
            ]
        );
        let missing = filter(vec![condition("chromium", None)], vec![]);
        assert_eq!(
            of_filter(&missing, &fleet, of),
            [
                "softwarePresent chromium holds on none of the 2 devices the groups and labels \
              select (none has it installed)"
            ]
        );
        let everywhere = filter(vec![], vec![condition("openssl", None)]);
        assert_eq!(
            of_filter(&everywhere, &fleet, of),
            [
                "softwareAbsent openssl: every one of the 2 devices the groups and labels select \
              has it"
            ]
        );
        // Each holds somewhere, never both on one device.
        let apart = filter(
            vec![condition("kiosk", None)],
            vec![condition("openssl", Some((VersionOp::Lt, "3.0.12")))],
        );
        assert_eq!(
            of_filter(&apart, &fleet, of),
            [
                "each software condition holds on some of the 2 devices the groups and labels \
              select, but none holds them all together"
            ]
        );
        // Groups and labels that select nothing are named as before.
        let typo = DeviceFilter {
            groups: vec!["prodution".into()],
            ..filter(vec![condition("kiosk", None)], vec![])
        };
        assert_eq!(
            of_filter(&typo, &fleet, of),
            [r#"no device is in the group "prodution" (did you mean "production"?)"#]
        );
    }

    #[test]
    fn an_empty_group_beside_one_that_selects_is_named() {
        let fleet = [
            device("pi-1", &["production"], &[]),
            device("pi-2", &["staging"], &[]),
        ];
        let groups = |names: &[&str]| names.iter().map(|g| g.to_string()).collect::<Vec<_>>();
        assert_eq!(
            empty_groups(&groups(&["production", "prodution"]), &fleet),
            [r#"no device is in the group "prodution" (did you mean "production"?)"#]
        );
        assert!(empty_groups(&groups(&["production", "staging"]), &fleet).is_empty());
        // None selects: `unmatched` says it, not this.
        assert!(empty_groups(&groups(&["prodution"]), &fleet).is_empty());
    }

    #[test]
    fn the_nearest_name_is_a_likely_typo_or_none() {
        let names = ["production", "staging", "lab"];
        assert_eq!(nearest("prodution", names), Some("production"));
        assert_eq!(
            nearest("stagign", names),
            Some("staging"),
            "a swap is one edit"
        );
        assert_eq!(nearest("lba", names), Some("lab"));
        assert_eq!(nearest("xyz", names), None);
        assert_eq!(nearest("prod", names), None, "a prefix is no typo");
    }
}
