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
        "FailureThresholdReached" => {
            "Enough targets failed to reach its failure threshold, so it stopped releasing."
        }
        "DeploymentFailed" => "A deployment failed.",
        "DeviceOffline" => "A device has not been heard from for too long.",
        "ResumeLoop" => "A job failed because the agent kept stopping while it ran.",
        _ => return None,
    })
}

/// A length of time as an operator reads it: its two largest units in
/// words ("1 hour 30 minutes", "10 minutes", "2 days"), not a count of
/// seconds. The dashboard's `duration()` (api/ui/app.js) says the same.
pub fn duration(seconds: u64) -> String {
    let units = [
        (86_400, "day"),
        (3_600, "hour"),
        (60, "minute"),
        (1, "second"),
    ];
    let mut left = seconds;
    let mut parts = Vec::new();
    for (size, name) in units {
        let count = left / size;
        left %= size;
        if count > 0 && parts.len() < 2 {
            let plural = if count == 1 { "" } else { "s" };
            parts.push(format!("{count} {name}{plural}"));
        } else if !parts.is_empty() {
            // Only adjacent units: "1 day 5 seconds" reads as noise.
            break;
        }
    }
    if parts.is_empty() {
        "0 seconds".into()
    } else {
        parts.join(" ")
    }
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
            "FailureThresholdReached",
            "DeploymentFailed",
            "DeviceOffline",
            "ResumeLoop",
        ] {
            let text = sentence(code).unwrap_or_else(|| panic!("{code} has no sentence"));
            assert!(text.ends_with('.') && text.len() > 10, "{code}: {text}");
        }
        assert_eq!(sentence("SomethingNew"), None);
    }

    #[test]
    fn durations_read_in_words_with_their_two_largest_units() {
        assert_eq!(super::duration(0), "0 seconds");
        assert_eq!(super::duration(1), "1 second");
        assert_eq!(super::duration(90), "1 minute 30 seconds");
        assert_eq!(super::duration(600), "10 minutes");
        assert_eq!(super::duration(3600), "1 hour");
        assert_eq!(super::duration(5400), "1 hour 30 minutes");
        assert_eq!(super::duration(86_400 + 5), "1 day");
        assert_eq!(super::duration(2 * 86_400 + 3 * 3600 + 7), "2 days 3 hours");
    }
}
