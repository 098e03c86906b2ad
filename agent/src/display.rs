//! Human-readable output of `status` and `jobs`.

use agent_core::executor::AgentInfo;
use agent_core::out;
use drover_model::model::JobStatus;

pub fn print_status(info: &AgentInfo) {
    out!("device:        {}", info.device_id);
    out!("agent:         {}", info.agent_version);
    out!("boot id:       {}", info.boot_id);
    out!("capabilities:  {}", info.capabilities.join(", "));
    if let Some(key) = &info.public_key {
        out!("device key:    {key}");
    }
    let link = &info.link;
    out!(
        "link:          {} {}{}",
        link.transport.map_or("-", |t| t.as_str()),
        if link.connected {
            "connected"
        } else {
            "disconnected"
        },
        link.last_contact
            .map(|t| format!(", last contact {t}"))
            .unwrap_or_default()
    );
    if let Some(error) = &link.last_error {
        out!("link error:    {error}");
    }
    if let Some(ms) = link.reconnect_spread_ms.filter(|ms| *ms > 0) {
        out!(
            "reconnect:     within {:.1} s of a lost connection (the control plane's window)",
            ms as f64 / 1000.0
        );
    }
    match &info.current_job {
        Some(job) => out!("current job:   {} {} {:?}", job.job_id, job.kind, job.state),
        None => out!("current job:   none"),
    }
    out!("queued jobs:   {}", info.queued_jobs);
    out!("unsent status: {}", info.outbox_pending);
}

pub fn print_jobs(jobs: &[JobStatus]) {
    if jobs.is_empty() {
        out!("no jobs");
        return;
    }
    for job in jobs {
        print_job(job);
        out!();
    }
}

pub fn print_job(job: &JobStatus) {
    out!(
        "{}",
        agent_core::report::format_job(job).trim_end_matches('\n')
    );
}
