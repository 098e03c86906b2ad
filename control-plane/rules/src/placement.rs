//! Placement: allowed group membership AND the label selector, over devices
//! that have an agent, are not decommissioned, and advertise the capability.
//! Pure, so the rule is read from its table tests.

use crate::records::{DeviceRecord, PlanTarget, TaskRunSpec};

pub const SYSTEM_UPGRADE_CAPABILITY: &str = "systemUpgradeV1";

/// Whether the device is still in one of the allowed groups (checked at
/// planning and again before each intent is released).
pub fn authorized(spec: &TaskRunSpec, device: &DeviceRecord) -> bool {
    !device.decommissioned
        && spec
            .allowed_groups
            .iter()
            .any(|g| device.groups.contains(g))
}

/// Why a device is not one of a run's targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Left {
    /// Outside the allowed groups, or its labels do not match: not a
    /// candidate at all.
    NotSelected,
    /// Selected, but decommissioned.
    Decommissioned,
    /// Selected, but no agent has connected yet.
    NoAgentYet,
    /// Selected, but its agent does not advertise the kind.
    AgentLacksTheKind,
}

impl Left {
    /// The machine name a dry run reports.
    pub fn name(self) -> &'static str {
        match self {
            Left::NotSelected => "notSelected",
            Left::Decommissioned => "decommissioned",
            Left::NoAgentYet => "noAgentYet",
            Left::AgentLacksTheKind => "agentLacksTheKind",
        }
    }
}

/// Whether `device` is a target of a run of `spec`, and if not, why.
pub fn placed(spec: &TaskRunSpec, device: &DeviceRecord) -> Result<(), Left> {
    let labels = device.effective_labels();
    let in_groups = spec
        .allowed_groups
        .iter()
        .any(|g| device.groups.contains(g));
    let selected = spec
        .target_selector
        .match_labels
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v));
    if !in_groups || !selected {
        Err(Left::NotSelected)
    } else if device.decommissioned {
        Err(Left::Decommissioned)
    } else if !device.agent_present {
        Err(Left::NoAgentYet)
    } else if !device
        .capabilities
        .iter()
        .any(|c| c == SYSTEM_UPGRADE_CAPABILITY)
    {
        Err(Left::AgentLacksTheKind)
    } else {
        Ok(())
    }
}

pub fn matches(spec: &TaskRunSpec, device: &DeviceRecord) -> bool {
    placed(spec, device).is_ok()
}

/// The frozen target plan: matching devices in id order, canaries marked.
pub fn plan(spec: &TaskRunSpec, devices: &[DeviceRecord]) -> Vec<PlanTarget> {
    let mut targets: Vec<PlanTarget> = devices
        .iter()
        .filter(|d| matches(spec, d))
        .map(|d| PlanTarget {
            device: d.id.clone(),
            canary: d.labels.get("canary").map(String::as_str) == Some("true"),
        })
        .collect();
    targets.sort_by(|a, b| a.device.cmp(&b.device));
    targets
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::TargetSelector;
    use drover_model::DeviceId;
    use drover_model::model::Empty;

    fn device(id: &str, groups: &[&str], labels: &[(&str, &str)]) -> DeviceRecord {
        let mut d = DeviceRecord::new(DeviceId::new(id).expect("valid"));
        d.groups = groups.iter().map(|g| (*g).to_owned()).collect();
        d.labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        d.agent_present = true;
        d.capabilities = vec![SYSTEM_UPGRADE_CAPABILITY.into()];
        d
    }

    fn spec(groups: &[&str], labels: &[(&str, &str)]) -> TaskRunSpec {
        TaskRunSpec {
            allowed_groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            target_selector: TargetSelector {
                match_labels: labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            },
            deadline_seconds: 3600,
            system_upgrade_v1: Empty {},
        }
    }

    #[test]
    fn placement_table() {
        let mut no_agent = device("no-agent", &["prod"], &[]);
        no_agent.agent_present = false;
        let mut retired = device("retired", &["prod"], &[]);
        retired.decommissioned = true;
        let mut no_cap = device("no-cap", &["prod"], &[]);
        no_cap.capabilities.clear();
        let fleet = vec![
            device("a", &["prod"], &[("site", "sofia")]),
            device(
                "b",
                &["prod", "lab"],
                &[("site", "berlin"), ("canary", "true")],
            ),
            device("c", &["lab"], &[("site", "sofia")]),
            no_agent,
            retired,
            no_cap,
        ];
        let cases: Vec<(TaskRunSpec, Vec<&str>)> = vec![
            (spec(&["prod"], &[]), vec!["a", "b"]),
            (spec(&["prod"], &[("site", "sofia")]), vec!["a"]),
            (spec(&["lab"], &[("site", "sofia")]), vec!["c"]),
            (spec(&["prod", "lab"], &[]), vec!["a", "b", "c"]),
            (spec(&["prod"], &[("device-id", "b")]), vec!["b"]),
            (
                spec(&["prod"], &[("site", "sofia"), ("canary", "true")]),
                vec![],
            ),
            (spec(&["nobody"], &[]), vec![]),
        ];
        for (spec, expected) in cases {
            let got: Vec<String> = plan(&spec, &fleet)
                .iter()
                .map(|t| t.device.to_string())
                .collect();
            assert_eq!(got, expected, "{spec:?}");
        }
        let targets = plan(&spec(&["prod"], &[]), &fleet);
        assert_eq!(targets.iter().filter(|t| t.canary).count(), 1);
    }
}
