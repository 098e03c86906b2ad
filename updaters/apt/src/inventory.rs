//! `InventoryRefreshV1`: one step that reports OS release, architecture,
//! kernel, uptime, memory, disks and the installed package count.

use crate::AptSettings;
use crate::command::run_bounded;
use agent_core::chain::{BoxFuture, Chain, StepContext, StepOutcome};
use agent_core::facts::{FactSources, debian_architecture};
use drover_model::model::{
    DiskUsage, InstalledPackage, Inventory, JobOutput, MAX_INVENTORY_PACKAGE_BYTES,
    MAX_INVENTORY_PACKAGES, PACKAGE_JSON_OVERHEAD, SoftwareInventory,
};
use std::time::Duration;

/// Upper bound of disks an inventory lists.
const MAX_DISKS: usize = 32;

pub struct InventoryRefresh {
    settings: AptSettings,
}

impl InventoryRefresh {
    pub fn new(settings: AptSettings) -> Self {
        Self { settings }
    }

    async fn collect(&self) -> Result<Inventory, String> {
        let mut system =
            sysinfo::System::new().map_err(|e| format!("cannot read system information: {e}"))?;
        system.refresh_memory();
        let disks = sysinfo::Disks::new_with_refreshed_list()
            .map(|disks| {
                disks
                    .iter()
                    .take(MAX_DISKS)
                    .map(|d| DiskUsage {
                        mount_point: d.mount_point().display().to_string(),
                        total_bytes: d.total_space(),
                        available_bytes: d.available_space(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let facts = FactSources {
            root: self.settings.system_root(),
        };
        Ok(Inventory {
            os_release: facts.os_release(),
            architecture: debian_architecture().to_owned(),
            kernel: sysinfo::System::kernel_version().unwrap_or_else(|_| "unknown".into()),
            uptime_seconds: sysinfo::System::uptime().unwrap_or(0),
            memory_total_bytes: system.total_memory(),
            memory_available_bytes: system.available_memory(),
            disks,
            installed_packages: 0,
        })
    }

    /// dpkg's installed (`ii`) packages with their versions, bounded.
    async fn installed_packages(&self) -> Result<(Vec<InstalledPackage>, u32), String> {
        let argv = self.settings.argv(
            "dpkg-query",
            &[
                "-W",
                "-f",
                "${db:Status-Abbrev} ${binary:Package} ${Version}\\n",
            ],
        );
        let out = run_bounded(&argv, Duration::from_secs(120))
            .await
            .map_err(|e| e.to_string())?;
        if !out.success() {
            return Err(format!("dpkg-query failed: {}", out.tail()));
        }
        Ok(listed_packages(&out.stdout))
    }
}

impl Chain for InventoryRefresh {
    fn kind(&self) -> &'static str {
        "inventoryRefreshV1"
    }

    fn steps(&self) -> &'static [&'static str] {
        &["collect"]
    }

    fn run_step<'a>(&'a self, ctx: StepContext<'a>) -> BoxFuture<'a, StepOutcome> {
        Box::pin(async move {
            let collected = match self.collect().await {
                Ok(inventory) => inventory,
                Err(e) => return StepOutcome::Fail(e),
            };
            match self.installed_packages().await {
                Ok((packages, omitted)) => {
                    let mut inventory = collected;
                    inventory.installed_packages = u32::try_from(packages.len())
                        .unwrap_or(u32::MAX)
                        .saturating_add(omitted);
                    *ctx.output = Some(JobOutput::Software(SoftwareInventory {
                        inventory,
                        packages,
                        omitted,
                    }));
                    StepOutcome::Done
                }
                Err(e) => StepOutcome::Fail(e),
            }
        })
    }
}

/// The `ii` lines of `dpkg-query -W -f '${db:Status-Abbrev} ${binary:Package} ${Version}\n'`
/// (an architecture qualifier `:arm64` is dropped), within the bounds; the
/// count of those left out.
fn listed_packages(text: &str) -> (Vec<InstalledPackage>, u32) {
    let mut packages = Vec::new();
    let mut bytes = 0usize;
    let mut omitted = 0u32;
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let (Some("ii"), Some(name), Some(version)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let name = name.split(':').next().unwrap_or(name);
        bytes += name.len() + version.len() + PACKAGE_JSON_OVERHEAD;
        if packages.len() >= MAX_INVENTORY_PACKAGES || bytes > MAX_INVENTORY_PACKAGE_BYTES {
            omitted += 1;
            continue;
        }
        packages.push(InstalledPackage {
            name: name.to_owned(),
            version: version.to_owned(),
        });
    }
    (packages, omitted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dpkg_query_lines_become_bounded_packages() {
        let text = "ii  libc6:arm64 2.36-9+deb12u4\nrc  old-conf 1.0\niU  half 2.0\nii  openssl 3.0.11-1~deb12u2\n\nii broken\n";
        let (packages, omitted) = listed_packages(text);
        assert_eq!(omitted, 0);
        assert_eq!(
            packages,
            vec![
                InstalledPackage {
                    name: "libc6".into(),
                    version: "2.36-9+deb12u4".into()
                },
                InstalledPackage {
                    name: "openssl".into(),
                    version: "3.0.11-1~deb12u2".into()
                },
            ]
        );
        let many: String = (0..MAX_INVENTORY_PACKAGES + 10)
            .map(|i| format!("ii  p{i} 1.0\n"))
            .collect();
        let (packages, omitted) = listed_packages(&many);
        assert!(packages.len() <= MAX_INVENTORY_PACKAGES);
        assert_eq!(
            packages.len() + omitted as usize,
            MAX_INVENTORY_PACKAGES + 10
        );
        // Long names and versions: bounded by bytes, and the list as JSON
        // stays within its budget.
        let long: String = (0..5000)
            .map(|i| format!("ii  package-with-a-long-name-{i:05} 1:2.3.4-5+deb12u6~bpo11+1\n"))
            .collect();
        let (packages, omitted) = listed_packages(&long);
        assert!(omitted > 0 && !packages.is_empty());
        let json = serde_json::to_string(&packages).expect("json");
        assert!(json.len() <= MAX_INVENTORY_PACKAGE_BYTES, "{}", json.len());
    }
}
