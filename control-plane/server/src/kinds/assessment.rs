//! `patchAssessmentV1`: what a full upgrade would change on the device now
//! (issue 31). A Deployment may ask every target for one; the agent also
//! runs one on its own. The report (what is pending, security first,
//! whether a reboot is) stays with the job, reads as one line
//! (`drover_rules::outcome::assessment_line`), and becomes the device's
//! latest assessment (`drover_rules::patch`).

use super::{Kind, Report, ReportWrite};
use drover_rules::deployment::DeploymentJob;

pub struct PatchAssessment;

impl Kind for PatchAssessment {
    fn name(&self) -> &'static str {
        "patchAssessmentV1"
    }

    fn deployment_job(
        &self,
        section: serde_json::Value,
        problems: &mut Vec<String>,
    ) -> DeploymentJob {
        super::empty_section(self.name(), section, problems);
        DeploymentJob::PatchAssessmentV1
    }

    fn keeps_local_reports(&self) -> bool {
        // The agent assesses on its own schedule too.
        true
    }

    fn on_report(&self, report: &mut Report<'_>) -> Vec<ReportWrite> {
        // A report beyond the protocol's bounds keeps none of its findings,
        // with the job nor as the device's assessment, and says why.
        if let Some(drover_model::JobOutput::Assessment(assessment)) = &report.status.output
            && let Err(why) = assessment.check()
        {
            report.status.output = None;
            report.status.error = Some(format!(
                "the assessment was beyond the protocol's bounds and was not kept: {why}"
            ));
            return Vec::new();
        }
        // The delivery core keeps a succeeded report's findings as the
        // device's latest assessment (as for one the agent ran on its own).
        vec![ReportWrite::Assessment]
    }
}
