//! Human-readable output of `status` and `jobs`.

use agent_core::executor::AgentInfo;
use agent_core::model::JobStatus;

pub fn print_status(info: &AgentInfo) {
    println!("device:        {}", info.device_id);
    println!("agent:         {}", info.agent_version);
    println!("boot id:       {}", info.boot_id);
    println!("capabilities:  {}", info.capabilities.join(", "));
    let link = &info.link;
    println!(
        "link:          {} {}{}",
        if link.transport.is_empty() {
            "-"
        } else {
            &link.transport
        },
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
        println!("link error:    {error}");
    }
    match &info.current_job {
        Some(job) => println!("current job:   {} {} {:?}", job.job_id, job.kind, job.state),
        None => println!("current job:   none"),
    }
    println!("queued jobs:   {}", info.queued_jobs);
    println!("unsent status: {}", info.outbox_pending);
}

pub fn print_jobs(jobs: &[JobStatus]) {
    if jobs.is_empty() {
        println!("no jobs");
        return;
    }
    for job in jobs {
        print_job(job);
        println!();
    }
}

pub fn print_job(job: &JobStatus) {
    print!("{}", agent_core::report::format_job(job));
}
