//! The rollout rules of a TaskRun as one pure function over the frozen plan,
//! each target's outcome and the clock: canaries first, every canary must
//! succeed before the rest are released, a revoked target fails the run and
//! is never replaced, the deadline bounds everything, a terminal run stays so.

use drover_model::DeviceId;
use jiff::Timestamp;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Not released yet.
    Unreleased,
    /// Released, no terminal status yet.
    Pending,
    Succeeded,
    Failed(String),
    /// Did not finish by the deadline although nothing failed: the device
    /// never took the job before its intent expired (or reported it
    /// expired), or its success reached the control plane after the
    /// deadline. Counted as failed; the run ends DeadlineExceeded, not
    /// TargetsFailed, unless a target really failed.
    Late(String),
}

impl Outcome {
    /// Whether the target has its final outcome.
    fn decided(&self) -> bool {
        matches!(
            self,
            Outcome::Succeeded | Outcome::Failed(_) | Outcome::Late(_)
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetView {
    pub device: DeviceId,
    pub canary: bool,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    Complete,
    Failed {
        reason: &'static str,
        message: String,
    },
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    pub targets: u32,
    pub canaries: u32,
    pub released: u32,
    pub succeeded: u32,
    pub failed: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub release: Vec<DeviceId>,
    pub finish: Option<Finish>,
    pub counts: Counts,
}

/// How many late devices a DeadlineExceeded message names.
const LATE_DEVICES_NAMED: usize = 5;

/// Decides a pass over a run an operator canceled: nothing more is
/// released, and the run ends, Failed with reason `Canceled`, once no
/// released target is undecided (a job that had started runs to its end,
/// A3; one that had not reports Canceled), or at the deadline.
pub fn decide_canceling(targets: &[TargetView], now: Timestamp, deadline: Timestamp) -> Decision {
    let counts = count(targets);
    let undecided = targets
        .iter()
        .filter(|t| t.outcome == Outcome::Pending)
        .count();
    let unreleased = counts.targets - counts.released;
    let finish = (undecided == 0 || now >= deadline).then(|| {
        let mut message = format!(
            "canceled by an operator: {} of {} targets succeeded, {} failed or were canceled, {unreleased} were never released",
            counts.succeeded, counts.targets, counts.failed
        );
        if undecided > 0 {
            message.push_str(&format!(
                ", {undecided} had not finished by the deadline {deadline}"
            ));
        }
        Finish::Failed {
            reason: "Canceled",
            message,
        }
    });
    Decision {
        release: Vec::new(),
        finish,
        counts,
    }
}

fn count(targets: &[TargetView]) -> Counts {
    let mut counts = Counts {
        targets: targets.len() as u32,
        ..Counts::default()
    };
    for t in targets {
        counts.canaries += u32::from(t.canary);
        match t.outcome {
            Outcome::Unreleased => {}
            Outcome::Pending => counts.released += 1,
            Outcome::Succeeded => {
                counts.released += 1;
                counts.succeeded += 1;
            }
            Outcome::Failed(_) | Outcome::Late(_) => {
                counts.released += 1;
                counts.failed += 1;
            }
        }
    }
    counts
}

/// A run's targets counted by outcome, kept as outcomes change, so that a
/// pass in which nothing can be released or end costs nothing per target
/// ([`decide_quiet`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    pub targets: u32,
    pub canaries: u32,
    pub unreleased_canaries: u32,
    pub unreleased_rest: u32,
    pub pending: u32,
    pub succeeded: u32,
    /// Failed or late.
    pub failed: u32,
    pub failed_canaries: u32,
    pub succeeded_canaries: u32,
}

impl Tally {
    /// Counts a target in (`add`) or out (`!add`) with its outcome.
    pub fn count(&mut self, canary: bool, outcome: &Outcome, add: bool) {
        let step = |n: &mut u32| {
            *n = if add {
                n.saturating_add(1)
            } else {
                n.saturating_sub(1)
            }
        };
        match outcome {
            Outcome::Unreleased if canary => step(&mut self.unreleased_canaries),
            Outcome::Unreleased => step(&mut self.unreleased_rest),
            Outcome::Pending => step(&mut self.pending),
            Outcome::Succeeded => {
                step(&mut self.succeeded);
                if canary {
                    step(&mut self.succeeded_canaries);
                }
            }
            Outcome::Failed(_) => {
                step(&mut self.failed);
                if canary {
                    step(&mut self.failed_canaries);
                }
            }
            Outcome::Late(_) => step(&mut self.failed),
        }
    }

    /// The tally of `targets`, counted afresh.
    pub fn of(targets: &[TargetView]) -> Self {
        let mut tally = Tally::default();
        for t in targets {
            tally.add_target(t.canary, &t.outcome);
        }
        tally
    }

    /// Counts a new target in.
    pub fn add_target(&mut self, canary: bool, outcome: &Outcome) {
        self.targets += 1;
        self.canaries += u32::from(canary);
        self.count(canary, outcome, true);
    }

    fn counts(&self) -> Counts {
        Counts {
            targets: self.targets,
            canaries: self.canaries,
            released: self.pending + self.succeeded + self.failed,
            succeeded: self.succeeded,
            failed: self.failed,
        }
    }
}

/// What [`decide`] says, from the tally alone, when the pass can release
/// nothing and the run cannot end: no canary failed, some released target
/// is undecided, the deadline is ahead, and no target is due for release
/// (canaries all out, and the rest waiting for a canary). `None` when the
/// targets must be looked at. A caller whose last look named the latest
/// failure passes over a new failure with [`decide`] too, to name it.
pub fn decide_quiet(tally: &Tally, now: Timestamp, deadline: Timestamp) -> Option<Decision> {
    let unreleased = tally.unreleased_canaries + tally.unreleased_rest;
    let all_decided = unreleased == 0 && tally.pending == 0;
    let canaries_pending = tally.succeeded_canaries < tally.canaries;
    let due = tally.unreleased_canaries > 0 || (tally.unreleased_rest > 0 && !canaries_pending);
    if tally.failed_canaries > 0 || all_decided || now >= deadline || due {
        return None;
    }
    Some(Decision {
        release: Vec::new(),
        finish: None,
        counts: tally.counts(),
    })
}

/// Decides one pass. `revoked` says whether a device lost its authorization.
pub fn decide(
    targets: &[TargetView],
    now: Timestamp,
    deadline: Timestamp,
    revoked: &dyn Fn(&DeviceId) -> bool,
) -> Decision {
    let counts = count(targets);
    let done = |finish| Decision {
        release: Vec::new(),
        finish: Some(finish),
        counts: counts.clone(),
    };
    let failed_canary = targets.iter().find_map(|t| match &t.outcome {
        Outcome::Failed(error) if t.canary => Some(format!("{}: {error}", t.device)),
        _ => None,
    });
    if let Some(message) = failed_canary {
        return done(Finish::Failed {
            reason: "CanaryFailed",
            message,
        });
    }
    let all_terminal = targets.iter().all(|t| t.outcome.decided());
    if all_terminal {
        if counts.failed == 0 {
            return done(Finish::Complete);
        }
        let failure = targets.iter().rev().find_map(|t| match &t.outcome {
            Outcome::Failed(e) => Some(format!("{}: {e}", t.device)),
            _ => None,
        });
        if let Some(message) = failure {
            return done(Finish::Failed {
                reason: "TargetsFailed",
                message,
            });
        }
    }
    if all_terminal || now >= deadline {
        // The operator's next question is which devices: name the first few.
        let late: Vec<&str> = targets
            .iter()
            .filter(|t| {
                matches!(
                    t.outcome,
                    Outcome::Unreleased | Outcome::Pending | Outcome::Late(_)
                )
            })
            .map(|t| t.device.as_str())
            .collect();
        let named = late.len().min(LATE_DEVICES_NAMED);
        let more = match late.len() - named {
            0 => String::new(),
            n => format!(" and {n} more"),
        };
        return done(Finish::Failed {
            reason: "DeadlineExceeded",
            message: format!(
                "{} of {} targets had not finished by the deadline {deadline}: {}{more}",
                late.len(),
                counts.targets,
                late[..named].join(", "),
            ),
        });
    }
    let canaries_pending = targets
        .iter()
        .any(|t| t.canary && t.outcome != Outcome::Succeeded);
    let release: Vec<&TargetView> = targets
        .iter()
        .filter(|t| t.outcome == Outcome::Unreleased && (t.canary || !canaries_pending))
        .collect();
    if let Some(t) = release.iter().find(|t| revoked(&t.device)) {
        return done(Finish::Failed {
            reason: "TargetRevoked",
            message: format!("{} is no longer in an allowed group", t.device),
        });
    }
    Decision {
        release: release.iter().map(|t| t.device.clone()).collect(),
        finish: None,
        counts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Outcome::*;

    fn t(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("time")
    }

    fn view(spec: &[(&str, bool, Outcome)]) -> Vec<TargetView> {
        spec.iter()
            .map(|(id, canary, outcome)| TargetView {
                device: DeviceId::new(*id).expect("valid"),
                canary: *canary,
                outcome: outcome.clone(),
            })
            .collect()
    }

    fn check(
        targets: &[(&str, bool, Outcome)],
        now: i64,
        revoked: &[&str],
        release: &[&str],
        finish: Option<&str>,
    ) {
        let decision = decide(&view(targets), t(now), t(100), &|d| {
            revoked.contains(&d.as_str())
        });
        let got: Vec<&str> = decision.release.iter().map(|d| d.as_str()).collect();
        assert_eq!(got, release, "{targets:?}");
        let reason = decision.finish.map(|f| match f {
            Finish::Complete => "Complete",
            Finish::Failed { reason, .. } => reason,
        });
        assert_eq!(reason, finish, "{targets:?}");
    }

    #[test]
    fn a_canceled_run_releases_nothing_and_ends_when_its_released_targets_are_decided() {
        let spec = |second: Outcome| {
            view(&[
                ("canary", true, Succeeded),
                ("second", false, second),
                ("third", false, Unreleased),
            ])
        };
        let waiting = decide_canceling(&spec(Pending), t(10), t(100));
        assert!(
            waiting.release.is_empty(),
            "a canceled run releases nothing"
        );
        assert_eq!(waiting.finish, None, "a started job runs to its end");
        let ended = decide_canceling(
            &spec(Failed("canceled before it started".into())),
            t(11),
            t(100),
        );
        assert!(ended.release.is_empty());
        match ended.finish {
            Some(Finish::Failed { reason, message }) => {
                assert_eq!(reason, "Canceled");
                assert!(
                    message.contains(
                        "1 of 3 targets succeeded, 1 failed or were canceled, 1 were never released"
                    ),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        // At the deadline it ends even with a job still out.
        let late = decide_canceling(&spec(Pending), t(100), t(100));
        match late.finish {
            Some(Finish::Failed { reason, message }) => {
                assert_eq!(reason, "Canceled");
                assert!(
                    message.contains("1 had not finished by the deadline"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_deadline_exceeded_names_the_late_devices() {
        let mut spec: Vec<(String, Outcome)> = vec![("done".into(), Outcome::Succeeded)];
        spec.extend((0..7).map(|n| (format!("late-{n}"), Outcome::Pending)));
        let spec: Vec<(&str, bool, Outcome)> = spec
            .iter()
            .map(|(d, o)| (d.as_str(), false, o.clone()))
            .collect();
        let decision = decide(&view(&spec), t(150), t(100), &|_| false);
        let Some(Finish::Failed { reason, message }) = decision.finish else {
            panic!("the run must fail");
        };
        assert_eq!(reason, "DeadlineExceeded");
        assert!(
            message.starts_with("7 of 8 targets had not finished")
                && message.ends_with(": late-0, late-1, late-2, late-3, late-4 and 2 more"),
            "{message}"
        );
    }

    #[test]
    fn canary_release_table() {
        let f = || Failed("apt failed".into());
        // No canary: everything at once.
        check(
            &[("a", false, Unreleased), ("b", false, Unreleased)],
            0,
            &[],
            &["a", "b"],
            None,
        );
        // Canaries first, the rest wait.
        check(
            &[("a", true, Unreleased), ("b", false, Unreleased)],
            0,
            &[],
            &["a"],
            None,
        );
        check(
            &[("a", true, Pending), ("b", false, Unreleased)],
            0,
            &[],
            &[],
            None,
        );
        // Every canary must succeed before the rest go.
        check(
            &[
                ("a", true, Succeeded),
                ("c", true, Pending),
                ("b", false, Unreleased),
            ],
            0,
            &[],
            &[],
            None,
        );
        check(
            &[("a", true, Succeeded), ("b", false, Unreleased)],
            0,
            &[],
            &["b"],
            None,
        );
        // A failed canary stops the rollout; the others never receive an intent.
        check(
            &[("a", true, f()), ("b", false, Unreleased)],
            0,
            &[],
            &[],
            Some("CanaryFailed"),
        );
        // Completion and failure.
        check(
            &[("a", true, Succeeded), ("b", false, Succeeded)],
            0,
            &[],
            &[],
            Some("Complete"),
        );
        check(
            &[("a", false, Succeeded), ("b", false, f())],
            0,
            &[],
            &[],
            Some("TargetsFailed"),
        );
        // Deadline: unfinished targets fail the run; finished ones decide it.
        check(
            &[("a", false, Pending)],
            100,
            &[],
            &[],
            Some("DeadlineExceeded"),
        );
        check(
            &[("a", true, Pending), ("b", false, Unreleased)],
            150,
            &[],
            &[],
            Some("DeadlineExceeded"),
        );
        check(&[("a", false, Succeeded)], 150, &[], &[], Some("Complete"));
        // A device that never took its job (its intent expired) or whose
        // success came after the deadline: DeadlineExceeded, even once every
        // target is decided (issue 33 item 5); a real failure still says
        // TargetsFailed.
        let late = || Late("the intent expired before the device took it".into());
        check(
            &[("a", false, Succeeded), ("b", false, late())],
            150,
            &[],
            &[],
            Some("DeadlineExceeded"),
        );
        check(
            &[("a", true, late()), ("b", false, Unreleased)],
            150,
            &[],
            &[],
            Some("DeadlineExceeded"),
        );
        check(
            &[("a", false, f()), ("b", false, late())],
            150,
            &[],
            &[],
            Some("TargetsFailed"),
        );
        // Revocation before release fails the run; nothing is substituted.
        check(
            &[("a", false, Unreleased), ("b", false, Unreleased)],
            0,
            &["b"],
            &[],
            Some("TargetRevoked"),
        );
        // Revocation of an already released device does not matter to release.
        check(
            &[("a", false, Pending), ("b", false, Unreleased)],
            0,
            &["a"],
            &["b"],
            None,
        );
        // A canary revoked while the rest wait fails the run at its release.
        check(
            &[("a", true, Unreleased), ("b", false, Unreleased)],
            0,
            &["a"],
            &[],
            Some("TargetRevoked"),
        );
    }

    #[test]
    fn counts_are_aggregates() {
        let d = decide(
            &view(&[
                ("a", true, Succeeded),
                ("b", false, Pending),
                ("c", false, Failed("x".into())),
                ("d", false, Unreleased),
            ]),
            t(0),
            t(100),
            &|_| false,
        );
        assert_eq!(
            d.counts,
            Counts {
                targets: 4,
                canaries: 1,
                released: 3,
                succeeded: 1,
                failed: 1
            }
        );
    }

    #[test]
    fn a_device_that_never_took_its_job_is_named_as_late() {
        let view = |name: &str, outcome| TargetView {
            device: DeviceId::new(name).expect("id"),
            canary: false,
            outcome,
        };
        let targets = [
            view("a", Succeeded),
            view(
                "b",
                Late("the intent expired before the device took it".into()),
            ),
        ];
        let decision = decide(&targets, t(150), t(100), &|_| false);
        assert_eq!(
            decision.finish,
            Some(Finish::Failed {
                reason: "DeadlineExceeded",
                message: format!(
                    "1 of 2 targets had not finished by the deadline {}: b",
                    t(100)
                ),
            })
        );
        assert_eq!((decision.counts.succeeded, decision.counts.failed), (1, 1));
    }

    /// `decide_quiet` answers only where `decide` releases nothing and does
    /// not finish, and then answers alike; a tally kept by counting targets
    /// out and in equals one counted afresh. Over many pseudo-random runs.
    #[test]
    fn a_quiet_decision_from_the_tally_is_the_full_decision() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let (mut quiet, mut full) = (0, 0);
        for _ in 0..20_000 {
            let len = next(9) as usize;
            let mut targets: Vec<TargetView> = (0..len)
                .map(|i| TargetView {
                    device: DeviceId::new(format!("d{i}")).expect("id"),
                    canary: next(3) == 0,
                    outcome: Unreleased,
                })
                .collect();
            let mut tally = Tally::of(&targets);
            // Outcomes change one at a time, as results arrive.
            for _ in 0..next(12) {
                if targets.is_empty() {
                    break;
                }
                let i = next(targets.len() as u64) as usize;
                let outcome = match next(5) {
                    0 => Unreleased,
                    1 => Pending,
                    2 => Succeeded,
                    3 => Failed("f".into()),
                    _ => Late("l".into()),
                };
                tally.count(targets[i].canary, &targets[i].outcome, false);
                tally.count(targets[i].canary, &outcome, true);
                targets[i].outcome = outcome;
            }
            assert_eq!(tally, Tally::of(&targets), "{targets:?}");
            let now = t(next(200) as i64);
            // Revoking every candidate makes any release show as a finish.
            match decide_quiet(&tally, now, t(100)) {
                Some(decision) => {
                    quiet += 1;
                    assert_eq!(
                        decision,
                        decide(&targets, now, t(100), &|_| true),
                        "{targets:?} at {now}"
                    );
                }
                None => full += 1,
            }
        }
        assert!(quiet > 1000 && full > 1000, "quiet {quiet}, full {full}");
    }
}
