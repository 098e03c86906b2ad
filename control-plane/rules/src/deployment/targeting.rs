//! Which devices a deployment targets: labels and groups, and software
//! present or absent at a version, read from each device's inventory.

use super::Targeting;
use drover_model::DeviceId;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Devices carrying every one of `match_labels`, when `groups` is not
/// empty in at least one of `groups`, with every `software_present`
/// condition holding and no `software_absent` one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceFilter {
    pub match_labels: BTreeMap<String, String>,
    pub groups: Vec<String>,
    pub software_present: Vec<SoftwareCondition>,
    pub software_absent: Vec<SoftwareCondition>,
}

impl DeviceFilter {
    /// Whether `device` has every label and is in one of the groups (or
    /// no group is named): the filter before its software conditions.
    pub fn selects_by_name(&self, device: &crate::records::DeviceRecord) -> bool {
        let labels = device.effective_labels();
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && (self.groups.is_empty() || self.groups.iter().any(|g| device.groups.contains(g)))
    }

    pub fn needs_inventory(&self) -> bool {
        !self.software_present.is_empty() || !self.software_absent.is_empty()
    }

    /// Whether the software conditions hold on a device with `inventory`;
    /// None when that cannot be known (no inventory, or a truncated one
    /// that cannot prove a package absent).
    pub fn software_matches(&self, inventory: Option<&DeviceInventory>) -> Option<bool> {
        if !self.needs_inventory() {
            return Some(true);
        }
        let inventory = inventory?;
        for condition in &self.software_present {
            if !condition.holds(inventory) {
                // A truncated list may hold it among the packages left out.
                return (!inventory.truncated).then_some(false);
            }
        }
        for condition in &self.software_absent {
            if condition.holds(inventory) {
                return Some(false);
            }
        }
        (!inventory.truncated || self.software_absent.is_empty()).then_some(true)
    }
}

/// A package installed (`ii`), optionally at a version that compares with
/// `version_cmp` in Debian's ordering (epochs, `~`, revisions).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SoftwareCondition {
    pub name: String,
    pub version_cmp: Option<VersionCmp>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionCmp {
    pub op: VersionOp,
    pub version: String,
}

/// dpkg's relations: `<<`, `<=`, `=`, `>=`, `>>` (also written `<` and `>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum VersionOp {
    #[serde(rename = "<<")]
    Lt,
    #[serde(rename = "<=")]
    Le,
    #[serde(rename = "=")]
    Eq,
    #[serde(rename = ">=")]
    Ge,
    #[serde(rename = ">>")]
    Gt,
}

impl VersionOp {
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "<<" | "<" => VersionOp::Lt,
            "<=" => VersionOp::Le,
            "=" | "==" => VersionOp::Eq,
            ">=" => VersionOp::Ge,
            ">>" | ">" => VersionOp::Gt,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            VersionOp::Lt => "<<",
            VersionOp::Le => "<=",
            VersionOp::Eq => "=",
            VersionOp::Ge => ">=",
            VersionOp::Gt => ">>",
        }
    }

    /// Whether `installed OP wanted` holds in Debian's version ordering.
    pub fn holds(self, installed: &str, wanted: &str) -> bool {
        use std::cmp::Ordering::*;
        let order = deb_version::compare_versions(installed, wanted);
        match self {
            VersionOp::Lt => order == Less,
            VersionOp::Le => order != Greater,
            VersionOp::Eq => order == Equal,
            VersionOp::Ge => order != Less,
            VersionOp::Gt => order == Greater,
        }
    }
}

impl SoftwareCondition {
    pub fn holds(&self, inventory: &DeviceInventory) -> bool {
        match (inventory.packages.get(&self.name), &self.version_cmp) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(installed), Some(cmp)) => cmp.op.holds(installed, &cmp.version),
        }
    }
}

/// A device's installed packages as its latest inventory refresh reported
/// them (`inventory/<device>`, written with that job's result).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceInventory {
    pub device: DeviceId,
    pub collected_at: Timestamp,
    /// Name to version.
    pub packages: BTreeMap<String, String>,
    /// The device left packages out (its list hit the bounds).
    pub truncated: bool,
}

pub fn inventory_key(device: &DeviceId) -> String {
    format!("inventory/{device}")
}

/// Why a device is or is not one of a deployment's targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    Target,
    /// It matches, but has no agent yet or is decommissioned, its agent
    /// does not run the job's kind, or whether its software matches
    /// cannot be known (no inventory yet).
    Excluded,
    NotSelected,
}

/// Whether `device`'s agent said it runs the kind `job` is (a task run
/// leaves such a device out the same way: `placement::Left::AgentLacksTheKind`).
pub fn runs_kind(job: &super::DeploymentJob, device: &crate::records::DeviceRecord) -> bool {
    device.capabilities.iter().any(|c| c == job.name())
}

/// Whether `device` is a target of `targeting` running `job`.
pub fn select(
    targeting: &Targeting,
    job: &super::DeploymentJob,
    device: &crate::records::DeviceRecord,
    inventory: Option<&DeviceInventory>,
) -> Selection {
    let matches = match targeting {
        Targeting::All => Some(true),
        Targeting::Devices(list) => Some(list.contains(&device.id)),
        Targeting::Filter(filter) => {
            if filter.selects_by_name(device) {
                filter.software_matches(inventory)
            } else {
                Some(false)
            }
        }
    };
    if matches == Some(false) {
        Selection::NotSelected
    } else if matches.is_none()
        || device.decommissioned
        || !device.agent_present
        || !runs_kind(job, device)
    {
        Selection::Excluded
    } else {
        Selection::Target
    }
}
