//! `InventoryRefreshV1`: one step that reports OS release, architecture,
//! kernel, uptime, memory, disks and the installed package count.

use crate::AptSettings;
use crate::command::run_bounded;
use agent_core::chain::{BoxFuture, Chain, StepContext, StepOutcome};
use agent_core::facts::{FactSources, debian_architecture};
use agent_core::model::{DiskUsage, Inventory, JobOutput};
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
            installed_packages: self.installed_packages().await?,
        })
    }

    async fn installed_packages(&self) -> Result<u32, String> {
        let argv = self
            .settings
            .argv("dpkg-query", &["-W", "-f", "${db:Status-Abbrev}\\n"]);
        let out = run_bounded(&argv, Duration::from_secs(120))
            .await
            .map_err(|e| e.to_string())?;
        if !out.success() {
            return Err(format!("dpkg-query failed: {}", out.tail()));
        }
        let count = out.stdout.lines().filter(|l| l.starts_with("ii")).count();
        Ok(u32::try_from(count).unwrap_or(u32::MAX))
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
            match self.collect().await {
                Ok(inventory) => {
                    *ctx.output = Some(JobOutput::Inventory(inventory));
                    StepOutcome::Done
                }
                Err(e) => StepOutcome::Fail(e),
            }
        })
    }
}
