//! `systemUpgradeV1`: the full apt upgrade. Its report (packages from and
//! to, whether it rebooted) stays with the job.

use super::Kind;

pub struct SystemUpgrade;

impl Kind for SystemUpgrade {
    fn name(&self) -> &'static str {
        "systemUpgradeV1"
    }
}
