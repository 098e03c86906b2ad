//! `inventoryRefreshV1`: the device's facts and installed packages. A
//! successful report's package list goes to the device's inventory record
//! (what deployments' software conditions read), written in the status's
//! commit; the job keeps the rest of the output.

use super::{Kind, Report, ReportWrite};
use drover_rules::deployment::{DeploymentJob, DeviceInventory};

pub struct InventoryRefresh;

impl Kind for InventoryRefresh {
    fn name(&self) -> &'static str {
        "inventoryRefreshV1"
    }

    fn deployment_job(
        &self,
        section: serde_json::Value,
        problems: &mut Vec<String>,
    ) -> DeploymentJob {
        super::empty_section(self.name(), section, problems);
        DeploymentJob::InventoryRefreshV1
    }

    fn on_report(&self, report: &mut Report<'_>) -> Vec<ReportWrite> {
        let Some(drover_model::JobOutput::Software(software)) = &mut report.status.output else {
            return Vec::new();
        };
        if report.status.state != drover_model::JobState::Succeeded {
            return Vec::new();
        }
        let packages = std::mem::take(&mut software.packages);
        vec![ReportWrite::Inventory(DeviceInventory {
            device: report.device.clone(),
            collected_at: report.at,
            packages: packages.into_iter().map(|p| (p.name, p.version)).collect(),
            truncated: software.omitted > 0,
        })]
    }
}
