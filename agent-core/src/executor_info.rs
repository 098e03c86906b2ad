//! What the agent tells about itself: the link's state a transport
//! reports, and the answers to `drover-agent status` and `jobs`.

use super::*;

/// What a transport tells the agent about its link, for `status`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkState {
    /// None until a link starts.
    pub transport: Option<drover_model::transport::Transport>,
    pub connected: bool,
    pub last_contact: Option<Timestamp>,
    pub last_error: Option<String>,
    /// The window the control plane named, over which this agent spreads
    /// its first reconnect after a loss (NATS; decision 0020).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconnect_spread_ms: Option<u64>,
}

/// The answer to `drover-agent status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentInfo {
    pub device_id: DeviceId,
    pub agent_version: String,
    pub boot_id: String,
    pub capabilities: Vec<String>,
    pub link: LinkState,
    pub current_job: Option<JobStatus>,
    pub queued_jobs: usize,
    pub outbox_pending: usize,
    /// The device's own public key (hex), its identity to the control plane.
    #[serde(default)]
    pub public_key: Option<String>,
}

impl Agent {
    pub fn update_link(&self, update: impl FnOnce(&mut LinkState)) {
        let mut link = self.link.lock().unwrap_or_else(|p| p.into_inner());
        update(&mut link);
    }

    pub fn info(&self) -> Result<AgentInfo, StoreError> {
        let jobs = self.store.summaries()?;
        let current_job = match jobs
            .iter()
            .find(|j| matches!(j.state, JobState::Running | JobState::AwaitingReboot))
        {
            Some(current) => self.store.job(current.job_id)?.map(|r| r.status),
            None => None,
        };
        let queued_jobs = jobs
            .iter()
            .filter(|j| matches!(j.state, JobState::Accepted | JobState::Waiting))
            .count();
        Ok(AgentInfo {
            device_id: self.settings.device_id.clone(),
            agent_version: self.settings.agent_version.clone(),
            boot_id: self.settings.boot_id.clone(),
            capabilities: self.capabilities(),
            link: self.link.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            current_job,
            queued_jobs,
            outbox_pending: self.store.outbox(usize::MAX)?.len(),
            public_key: self
                .settings
                .device_key
                .as_ref()
                .map(|k| k.public_key_hex()),
        })
    }

    /// The newest `limit` jobs, newest first.
    pub fn recent_jobs(&self, limit: usize) -> Result<Vec<JobStatus>, StoreError> {
        let mut recent = Vec::new();
        for summary in self.store.summaries()?.iter().rev().take(limit) {
            if let Some(record) = self.store.job(summary.job_id)? {
                recent.push(record.status);
            }
        }
        Ok(recent)
    }
}
