//! Devices as `drover get devices` shows them: the API's listing read
//! (`drover_api::devices::Device`), its table (the patch columns in `-o
//! wide`), and each device as the Device manifest that registers it for
//! `-o json|yaml`.

use crate::table::{Listing, Row, age};
use crate::watch::printable;
use drover_api::devices::{Device, PatchSummary};
use serde_json::Value;

/// A device as the API lists it, turned into the Device manifest that
/// registers it (name, labels, groups, time zone, decommissioned), with
/// everything else the control plane knows of it under `status`, as
/// kubectl prints an object.
pub fn device_manifest(device: &Value) -> Value {
    let mut status = device.as_object().cloned().unwrap_or_default();
    let mut take = |key: &str| status.remove(key).unwrap_or(Value::Null);
    let id = take("id");
    let mut labels = take("labels");
    if let Some(labels) = labels.as_object_mut() {
        // Implicit: every device carries its own id (a manifest may not set it).
        labels.remove("device-id");
    }
    let groups = take("groups");
    let time_zone = take("timeZone");
    let decommissioned = take("decommissioned");
    let mut spec = serde_json::json!({ "groups": groups });
    if !time_zone.is_null() {
        spec["timeZone"] = time_zone;
    }
    if decommissioned == Value::Bool(true) {
        spec["decommissioned"] = Value::Bool(true);
    }
    serde_json::json!({
        "apiVersion": drover_rules::records::API_VERSION,
        "kind": "Device",
        "metadata": {"name": id, "labels": labels},
        "spec": spec,
        "status": status,
    })
}

pub(crate) fn device_rows(devices: &[Device], wide: bool) -> Listing {
    let now = jiff::Timestamp::now();
    let mut headers = vec![
        "DEVICE",
        "STATE",
        "LAST SEEN",
        "VERSION",
        "GROUPS",
        "LABELS",
        "CAPABILITIES",
    ];
    if wide {
        headers.extend([
            "OS",
            "ARCH",
            "TRANSPORT",
            "TIME ZONE",
            "BOOT ID",
            "UPDATES",
            "SECURITY",
            "OLDEST",
            "REBOOT",
        ]);
    }
    let mut rows = Vec::new();
    for d in devices {
        let groups: Vec<&str> = d.groups.iter().map(String::as_str).collect();
        let labels: Vec<String> = d
            .labels
            .iter()
            .chain(d.maintained_labels.iter().flatten())
            .map(|(k, v)| printable(&format!("{k}={v}")))
            .collect();
        let mut row = vec![
            printable(&d.id),
            printable(&d.state),
            age(d.last_seen.max(d.last_heartbeat), now),
            printable(d.agent_version.as_deref().unwrap_or("-")),
            printable(&groups.join(",")),
            labels.join(","),
            printable(&d.capabilities.join(",")),
        ];
        if wide {
            for extra in [
                &d.os_release,
                &d.architecture,
                &d.transport,
                &d.time_zone,
                &d.boot_id,
            ] {
                row.push(printable(extra.as_deref().unwrap_or("-")));
            }
            row.extend(patch_cells(d.patch.as_ref(), now));
        }
        rows.push(Row {
            key: d.id.clone(),
            cells: row,
        });
    }
    Listing {
        headers,
        rows,
        // LAST SEEN (and OLDEST, a wait) change with the clock alone.
        volatile: if wide { vec![2, 14] } else { vec![2] },
        note: None,
    }
}

/// A device's patch columns: pending updates, of them security ones ("n/a"
/// with no security archive among its sources), how long the oldest pending
/// security update has waited, and whether a reboot is pending; "-" before
/// its first assessment.
fn patch_cells(patch: Option<&PatchSummary>, now: jiff::Timestamp) -> [String; 4] {
    let Some(patch) = patch else {
        return ["-".into(), "-".into(), "-".into(), "-".into()];
    };
    let security = if patch.security_archive {
        patch.security.to_string()
    } else {
        "n/a".to_owned()
    };
    [
        patch.upgradable.to_string(),
        security,
        match patch.oldest_security_since {
            Some(oldest) => age(Some(oldest), now),
            None => "-".into(),
        },
        if patch.reboot_pending.is_some() {
            "yes"
        } else {
            "no"
        }
        .to_owned(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listed_device_prints_as_the_manifest_that_registers_it() {
        let listed = serde_json::json!({
            "id": "pi-1", "groups": ["production"], "labels": {"site": "sofia", "device-id": "pi-1"},
            "timeZone": "Europe/Sofia", "decommissioned": false, "agentPresent": true,
            "online": true, "agentVersion": "0.1.0",
        });
        assert_eq!(
            device_manifest(&listed),
            serde_json::json!({
                "apiVersion": "fleet.nationtech.io/v1alpha1",
                "kind": "Device",
                "metadata": {"name": "pi-1", "labels": {"site": "sofia"}},
                "spec": {"groups": ["production"], "timeZone": "Europe/Sofia"},
                "status": {"agentPresent": true, "online": true, "agentVersion": "0.1.0"},
            })
        );
    }
}
