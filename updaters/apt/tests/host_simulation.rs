//! The chains against this machine's real apt and dpkg, in modes that change
//! nothing: `apt-get -s full-upgrade` and the inventory.

use agent_core::chain::{Chain, StepContext, StepOutcome};
use drover_model::JobId;
use drover_model::model::JobOutput;
use std::path::Path;
use updater_apt::{AptSettings, InventoryRefresh, Mode, SystemUpgrade};

/// As `drover_tests::cannot_run_here` (this crate's tests cannot depend on
/// that crate, which depends on this one): a failure under CI, elsewhere a
/// line in `target/test-artefacts/skipped.txt` that `scripts/test.sh` counts.
fn cannot_run_here(test: &str, reason: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test} cannot run here ({reason}), and CI runs every test");
    }
    eprintln!("SKIPPED {test}: {reason}");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-artefacts");
    let _ = std::fs::create_dir_all(&dir);
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("skipped.txt"))
    {
        use std::io::Write;
        let _ = writeln!(file, "{test}: {reason}");
    }
}

fn settings() -> AptSettings {
    AptSettings {
        mode: Mode::Simulate,
        root: None,
        min_free_bytes: 1,
        min_free_boot_bytes: 1,
        kernel_release_path: updater_apt::kernel::RELEASE_PATH.into(),
        calls_dir: std::env::temp_dir().join("drover-test-calls"),
        launcher: updater_apt::Launcher::Setsid,
    }
}

async fn run_chain(chain: &dyn Chain) -> (Vec<StepOutcome>, Option<JobOutput>) {
    let mut output = None;
    let mut outcomes = Vec::new();
    for step in chain.steps() {
        let ctx = StepContext {
            job_id: JobId::random(),
            step,
            kind: None,
            started_at: jiff::Timestamp::now(),
            job_started_at: jiff::Timestamp::now(),
            budget: std::time::Duration::from_secs(1500),
            tries: 0,
            output: &mut output,
        };
        outcomes.push(chain.run_step(ctx).await);
    }
    (outcomes, output)
}

#[tokio::test]
async fn simulated_upgrade_runs_real_apt_and_changes_nothing() {
    if !Path::new("/usr/bin/apt-get").exists() {
        cannot_run_here(
            "simulated_upgrade_runs_real_apt_and_changes_nothing",
            "no apt-get on this machine",
        );
        return;
    }
    let status_before = std::fs::read("/var/lib/dpkg/status").expect("dpkg status");
    let (outcomes, output) = run_chain(&SystemUpgrade::new(settings())).await;
    assert!(
        outcomes.iter().all(|o| *o == StepOutcome::Done),
        "{outcomes:?}"
    );
    match output {
        Some(JobOutput::Upgrade(report)) => assert!(report.simulated),
        other => panic!("expected an upgrade report, got {other:?}"),
    }
    assert_eq!(
        std::fs::read("/var/lib/dpkg/status").expect("dpkg status"),
        status_before
    );
}

#[tokio::test]
async fn a_free_space_threshold_above_the_disk_fails_preflight_clearly() {
    let chain = SystemUpgrade::new(AptSettings {
        min_free_bytes: u64::MAX,
        ..settings()
    });
    let (outcomes, _) = run_chain(&chain).await;
    match &outcomes[0] {
        StepOutcome::Fail(e) => assert!(
            e.contains("not enough free space") || e.contains("apt-get not found"),
            "{e}"
        ),
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[tokio::test]
async fn inventory_reports_the_machine() {
    if !Path::new("/usr/bin/dpkg-query").exists() {
        cannot_run_here(
            "inventory_reports_the_machine",
            "no dpkg-query on this machine",
        );
        return;
    }
    let (outcomes, output) = run_chain(&InventoryRefresh::new(settings())).await;
    assert_eq!(outcomes, vec![StepOutcome::Done]);
    let Some(JobOutput::Software(software)) = output else {
        panic!("no inventory")
    };
    let inv = &software.inventory;
    assert!(inv.installed_packages > 10, "{inv:?}");
    assert_eq!(
        inv.installed_packages as usize,
        software.packages.len() + software.omitted as usize
    );
    assert!(
        software.packages.iter().any(|p| p.name == "dpkg"),
        "dpkg itself is installed"
    );
    assert!(inv.memory_total_bytes > 0);
    assert!(!inv.disks.is_empty());
}
