//! What a device says of itself when it asks to join (issue 55), the
//! same over every transport.

use crate::executor::Agent;
use drover_model::enroll::Inventory;

/// What the device says of itself when it asks to join.
pub fn inventory(agent: &Agent) -> Inventory {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned());
    let beat = agent.heartbeat().ok();
    Inventory {
        hostname,
        os_release: beat.as_ref().map(|b| b.os_release.clone()),
        architecture: beat.as_ref().map(|b| b.architecture.clone()),
        agent_version: Some(agent.agent_version().to_owned()),
    }
}
