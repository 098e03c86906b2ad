//! Plain-text rendering of a job's status with its steps, shared by
//! `drover-agent jobs` and the control plane's CLI so both read the same.

use drover_model::model::{JobOutput, JobStatus};
use std::fmt::Write;

/// A job, its latest error, one line per step, and what it found.
pub fn format_job(job: &JobStatus) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}  {}  {}  {:?}  accepted {}",
        job.device_id, job.job_id, job.kind, job.state, job.accepted_at
    );
    if let Some(error) = &job.error {
        let _ = writeln!(out, "  error: {error}");
    }
    if !job.steps.is_empty() {
        let _ = writeln!(
            out,
            "  {:<14} {:<20} {:>8} {:>5}  error",
            "step", "start", "seconds", "tries"
        );
    }
    for step in &job.steps {
        let _ = writeln!(
            out,
            "  {:<14} {:<20} {:>8} {:>5}  {}",
            step.name,
            step.started_at
                .map(|t| t.strftime("%Y-%m-%d %H:%M:%S").to_string())
                .unwrap_or_else(|| "-".into()),
            step.seconds
                .map(|s| format!("{s:.1}"))
                .unwrap_or_else(|| "-".into()),
            step.tries,
            step.error.as_deref().unwrap_or("")
        );
    }
    match &job.output {
        Some(JobOutput::Upgrade(up)) => {
            let _ = writeln!(
                out,
                "  {}: {} upgraded, {} newly installed, {} removed, {} kept back{}{}",
                if up.simulated { "simulated" } else { "upgrade" },
                up.upgraded.len(),
                up.installed.len(),
                up.removed.len(),
                up.kept_back.len(),
                if up.omitted > 0 {
                    format!(" ({} more not listed)", up.omitted)
                } else {
                    String::new()
                },
                if up.reboot_required {
                    ", reboot required"
                } else {
                    ""
                }
            );
        }
        Some(JobOutput::Inventory(inv))
        | Some(JobOutput::Software(drover_model::model::SoftwareInventory {
            inventory: inv,
            ..
        })) => {
            let _ = writeln!(
                out,
                "  inventory: {} {} kernel {}, {} packages, {} MiB memory",
                inv.os_release,
                inv.architecture,
                inv.kernel,
                inv.installed_packages,
                inv.memory_total_bytes / (1024 * 1024)
            );
        }
        Some(JobOutput::Assessment(a)) => {
            let _ = writeln!(
                out,
                "  assessment: {} upgradable, {} security{}, {} kept back, kernel {}{}",
                a.upgradable,
                a.security,
                if a.security_archive {
                    ""
                } else {
                    " (no security archive among the sources)"
                },
                a.kept_back,
                a.running_kernel,
                match &a.reboot_pending {
                    Some(reason) => format!(", reboot pending: {reason}"),
                    None => String::new(),
                }
            );
            for p in &a.pending {
                let _ = writeln!(
                    out,
                    "    {:<32} {:>20} -> {:<20}{}",
                    p.name,
                    p.from.as_deref().unwrap_or("(new)"),
                    p.to,
                    if p.security { "  security" } else { "" }
                );
            }
            if a.omitted > 0 {
                let _ = writeln!(out, "    ({} more not listed)", a.omitted);
            }
        }
        None => {}
    }
    out
}
