//! Why a run or a deployment ended, and what an alert is about, as a
//! sentence: the API serves it beside the code (`reason` stays the
//! machine-readable code), so the CLI and the dashboard show words with
//! the code beside them and never derive either.

/// The sentence for a reason or alert code; None for a code this version
/// does not know (shown as the code alone).
pub fn sentence(code: &str) -> Option<&'static str> {
    Some(match code {
        "AllTargetsSucceeded" => "Every target succeeded.",
        "TargetsFailed" => "At least one target failed.",
        "Expired" => "Some targets expired before they ran; none failed.",
        "CanaryFailed" => "A canary failed, so nothing more was released.",
        "DeadlineExceeded" => "The deadline passed before every target finished.",
        "NoTargets" => "No device matched, so there was nothing to run.",
        "TooManyTargets" => "More devices matched than one deployment may target.",
        "TargetRevoked" => "A device still to be released left the allowed groups.",
        "Canceled" => "An operator canceled it.",
        "DeploymentFailed" => "A deployment failed.",
        "DeviceOffline" => "A device has not been heard from for too long.",
        "ResumeLoop" => "A job failed because the agent kept stopping while it ran.",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_the_control_plane_writes_has_a_sentence() {
        for code in [
            "AllTargetsSucceeded",
            "TargetsFailed",
            "Expired",
            "CanaryFailed",
            "DeadlineExceeded",
            "NoTargets",
            "TooManyTargets",
            "TargetRevoked",
            "Canceled",
            "DeploymentFailed",
            "DeviceOffline",
            "ResumeLoop",
        ] {
            let text = sentence(code).unwrap_or_else(|| panic!("{code} has no sentence"));
            assert!(text.ends_with('.') && text.len() > 10, "{code}: {text}");
        }
        assert_eq!(sentence("SomethingNew"), None);
    }
}
