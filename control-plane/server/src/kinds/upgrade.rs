//! `systemUpgradeV1`: the full apt upgrade. Its report (packages from and
//! to, whether it rebooted) stays with the job.

use super::Kind;
use drover_rules::deployment::DeploymentJob;

pub struct SystemUpgrade;

impl Kind for SystemUpgrade {
    fn name(&self) -> &'static str {
        "systemUpgradeV1"
    }

    fn deployment_job(
        &self,
        section: serde_json::Value,
        problems: &mut Vec<String>,
    ) -> DeploymentJob {
        super::empty_section(self.name(), section, problems);
        DeploymentJob::SystemUpgradeV1
    }
}
