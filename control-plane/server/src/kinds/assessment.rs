//! `patchAssessmentV1`: what a full upgrade would change on the device now
//! (issue 31). A Deployment may ask every target for one; the report (what
//! is pending, security first, whether a reboot is) stays with the job and
//! reads as one line (`drover_rules::outcome::assessment_line`).

use super::Kind;
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
}
