//! What a change answers: the object it touched and what became of it.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The kinds of object the API changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum Kind {
    TaskRun,
    Deployment,
    Device,
    TaskSchedule,
    Secret,
    Package,
    Operator,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::TaskRun => "TaskRun",
            Kind::Deployment => "Deployment",
            Kind::Device => "Device",
            Kind::TaskSchedule => "TaskSchedule",
            Kind::Secret => "Secret",
            Kind::Package => "Package",
            Kind::Operator => "Operator",
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What became of the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum Outcome {
    #[serde(rename = "created")]
    Created,
    #[serde(rename = "configured")]
    Configured,
    #[serde(rename = "unchanged")]
    Unchanged,
    #[serde(rename = "deleted")]
    Deleted,
    #[serde(rename = "cancel requested")]
    CancelRequested,
    #[serde(rename = "already canceling")]
    AlreadyCanceling,
    #[serde(rename = "add-new-devices requested")]
    AddNewDevicesRequested,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Created => "created",
            Outcome::Configured => "configured",
            Outcome::Unchanged => "unchanged",
            Outcome::Deleted => "deleted",
            Outcome::CancelRequested => "cancel requested",
            Outcome::AlreadyCanceling => "already canceling",
            Outcome::AddNewDevicesRequested => "add-new-devices requested",
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The answer to a change: which object, and what became of it, with what
/// the change adds to say (the jobs a delete removed, the bytes it freed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Changed {
    pub kind: Kind,
    pub name: String,
    pub result: Outcome,
    /// The object's uid, when it has one (runs and deployments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The phase a cancel left it in (`Canceling`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Job records a delete removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jobs: Option<u64>,
    /// Job records a device's delete kept, for the runs that still show them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_for_runs: Option<u64>,
    /// Whether a deleted device's agent was online (it will be refused from now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub online: Option<bool>,
    /// Bytes a package's delete freed on disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freed_bytes: Option<u64>,
    /// A Secret's keys (never their values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<Vec<String>>,
    /// The add-new-devices request's number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<u64>,
}

impl Changed {
    /// `kind` `name` became `result`, with nothing more to say.
    pub fn new(kind: Kind, name: impl Into<String>, result: Outcome) -> Self {
        Self {
            kind,
            name: name.into(),
            result,
            uid: None,
            phase: None,
            jobs: None,
            kept_for_runs: None,
            online: None,
            freed_bytes: None,
            keys: None,
            request: None,
        }
    }
}

/// `POST /apply`: what became of the one object sent, or of each object
/// of a List (in the order sent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Applied {
    List(AppliedList),
    One(Changed),
}

impl Applied {
    /// Each object's answer, in the order sent.
    pub fn into_items(self) -> Vec<Changed> {
        match self {
            Applied::List(list) => list.items,
            Applied::One(one) => vec![one],
        }
    }

    pub fn items(&self) -> Vec<&Changed> {
        match self {
            Applied::List(list) => list.items.iter().collect(),
            Applied::One(one) => vec![one],
        }
    }
}

/// The answers to a List, one per item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AppliedList {
    pub kind: ListKind,
    pub items: Vec<Changed>,
}

/// `List`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum ListKind {
    List,
}

/// What `POST /apply` answers: what became of the objects, or with
/// `dryRun=server` the preview.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum ApplyAnswer {
    Preview(Preview),
    Applied(Applied),
}

/// `POST /apply?dryRun=server`: what applying would do, nothing stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Preview {
    /// `server`.
    pub dry_run: String,
    pub items: Vec<PreviewItem>,
}

/// What applying one manifest would do; for a TaskRun and a Deployment,
/// the targets it would get now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PreviewItem {
    pub kind: Kind,
    pub name: String,
    /// What applying it would do.
    pub result: PreviewResult,
    /// Why it would be refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// How many devices it would target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canaries: Option<u64>,
    /// The first ten targets' names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first: Option<Vec<String>>,
    /// Devices left out, by why (decommissioned, noAgentYet,
    /// agentLacksTheKind, noInventoryYet, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub excluded: Option<std::collections::BTreeMap<String, u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// When it would select no device: each part of its selection that
    /// no device has, with the nearest existing name; when it would, each
    /// of its groups no device is in (a misspelt one beside good ones).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unmatched: Vec<String>,
    /// A Deployment with a maintenance window: each zone its targets are
    /// in, and when the window opens there (none: open now).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<crate::deployments::WindowNow>,
}

/// What applying a manifest would do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PreviewResult {
    Created,
    Configured,
    Unchanged,
    /// Refused; the item's reason says why.
    Refused,
}

impl PreviewResult {
    pub fn name(self) -> &'static str {
        match self {
            PreviewResult::Created => "created",
            PreviewResult::Configured => "configured",
            PreviewResult::Unchanged => "unchanged",
            PreviewResult::Refused => "refused",
        }
    }
}

impl PreviewItem {
    pub fn new(kind: Kind, name: impl Into<String>, result: PreviewResult) -> Self {
        Self {
            kind,
            name: name.into(),
            result,
            reason: None,
            targets: None,
            canaries: None,
            first: None,
            excluded: None,
            warning: None,
            unmatched: Vec::new(),
            windows: Vec::new(),
        }
    }

    /// A preview that would be refused, and why.
    pub fn refusal(kind: Kind, name: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            reason: Some(reason.into()),
            ..Self::new(kind, name, PreviewResult::Refused)
        }
    }

    /// A preview that would be refused.
    pub fn refused(&self) -> bool {
        self.result == PreviewResult::Refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refusal's reason travels beside its result, not inside it.
    #[test]
    fn a_refused_preview_says_why_beside_its_result() {
        let refused = PreviewItem::refusal(Kind::Deployment, "d", "names pi-kichen");
        let json = serde_json::to_value(&refused).expect("json");
        assert_eq!(json["result"], "refused");
        assert_eq!(json["reason"], "names pi-kichen");
        assert!(refused.refused());
        let created = PreviewItem::new(Kind::TaskRun, "r", PreviewResult::Created);
        let json = serde_json::to_value(&created).expect("json");
        assert_eq!(json["result"], "created");
        assert!(json.get("reason").is_none());
        assert!(!created.refused());
        for result in [
            PreviewResult::Created,
            PreviewResult::Configured,
            PreviewResult::Unchanged,
            PreviewResult::Refused,
        ] {
            assert_eq!(serde_json::to_value(result).expect("json"), result.name());
        }
    }

    #[test]
    fn outcomes_read_as_the_words_they_are_sent_as() {
        for outcome in [
            Outcome::Created,
            Outcome::Configured,
            Outcome::Unchanged,
            Outcome::Deleted,
            Outcome::CancelRequested,
            Outcome::AlreadyCanceling,
            Outcome::AddNewDevicesRequested,
        ] {
            let sent = serde_json::to_value(outcome).expect("serialize");
            assert_eq!(sent, serde_json::json!(outcome.name()));
            let read: Outcome = serde_json::from_value(sent).expect("deserialize");
            assert_eq!(read, outcome);
        }
    }

    #[test]
    fn an_answer_to_a_list_reads_back_as_a_list_and_one_as_one() {
        let one = Changed::new(Kind::Device, "pi-1", Outcome::Created);
        let list = Applied::List(AppliedList {
            kind: ListKind::List,
            items: vec![
                one.clone(),
                Changed::new(Kind::Secret, "s", Outcome::Unchanged),
            ],
        });
        for applied in [list, Applied::One(one)] {
            let sent = serde_json::to_string(&applied).expect("serialize");
            let read: Applied = serde_json::from_str(&sent).expect("deserialize");
            assert_eq!(read, applied, "{sent}");
        }
    }

    #[test]
    fn a_change_sends_only_what_it_has() {
        let mut changed = Changed::new(Kind::Package, "p1", Outcome::Deleted);
        changed.freed_bytes = Some(4096);
        let sent = serde_json::to_value(&changed).expect("serialize");
        assert_eq!(
            sent,
            serde_json::json!({"kind": "Package", "name": "p1", "result": "deleted", "freedBytes": 4096})
        );
    }
}
