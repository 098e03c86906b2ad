//! Why a selection matched no device (issue 56): which of its parts (a
//! group, a label's key or value) no device has, with the nearest name that
//! exists, so that `groups: [prodution]` is answered with "did you mean
//! production?" before a run fails at once with NoTargets.

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
