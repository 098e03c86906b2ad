//! Byte fixtures of the agent's stored records, like the control plane's:
//! the bytes in `fixtures/` were written by each layout (V1 until statuses
//! carried their failure, V2 until they carried their reason lines, V3
//! since). Each must decode to the record it was
//! made from after any change, and today's code must still write the bytes
//! of the newest: a field added, removed or reordered without a new layout
//! version fails here. When a layout changes, add the next variant and a
//! fixture for it, and keep the old ones decoding: never rewrite a fixture
//! of a layout that has shipped. `DROVER_BLESS=1` writes a fixture only
//! where none exists yet.

use crate::store::{
    JobRecord, Origin, decode_job, decode_status, decode_summary, encode_job, encode_status,
    encode_summary,
};
use drover_model::failure::{Failure, RESUME_LOOP_TEXT};
use drover_model::ids::{DeviceId, JobId};
use drover_model::model::{
    DiskUsage, DownloadLink, Empty, InstalledPackage, Intent, Inventory, JobKind, JobOutput,
    JobState, JobStatus, PackageChange, PackageInstall, SoftwareInventory, StepRecord, StepState,
    UpgradeOutput,
};
use drover_model::sealed::SealedBox;
use jiff::Timestamp;
use std::path::PathBuf;

fn at(text: &str) -> Timestamp {
    text.parse().expect("a fixed time")
}

fn job_id(text: &str) -> JobId {
    text.parse().expect("a fixed job id")
}

fn step(name: &str, state: StepState, started: Option<&str>, seconds: Option<f64>) -> StepRecord {
    StepRecord {
        name: name.into(),
        state,
        started_at: started.map(at),
        seconds,
        tries: 1,
        error: None,
    }
}

fn status(job: JobId, kind: &str, state: JobState, output: Option<JobOutput>) -> JobStatus {
    JobStatus {
        job_id: job,
        device_id: DeviceId::new("pi-kitchen").expect("id"),
        attempt: 2,
        kind: kind.into(),
        state,
        steps: vec![
            step(
                "preflight",
                StepState::Done,
                Some("2026-11-30T12:00:01Z"),
                Some(0.5),
            ),
            step(
                "full-upgrade",
                StepState::Done,
                Some("2026-11-30T12:00:05Z"),
                Some(42.25),
            ),
            step("reboot", StepState::Pending, None, None),
        ],
        error: Some("a warning kept from a retried step".into()),
        output,
        accepted_at: at("2026-11-30T12:00:00Z"),
        started_at: Some(at("2026-11-30T12:00:01Z")),
        finished_at: Some(at("2026-11-30T12:01:00Z")),
        boot_id: "5f0c7a4e-boot".into(),
        completion_heartbeat_at: Some(at("2026-11-30T12:01:30Z")),
        seq: 7,
        failure: None,
        reason: Vec::new(),
    }
}

/// A finished upgrade that rebooted once and was resumed once.
fn upgrade_record() -> JobRecord {
    let job = job_id("6f1c3b1e-3f7e-4a55-9a3c-2f1f0e9f8a01");
    JobRecord {
        intent: Some(Intent {
            job_id: job,
            device_id: DeviceId::new("pi-kitchen").expect("id"),
            kind: JobKind::SystemUpgradeV1(Empty {}),
            attempt: 2,
            created_at: at("2026-11-30T11:59:59Z"),
            expires_at: at("2026-11-30T13:00:00Z"),
            timeout_seconds: 1500,
        }),
        status: status(
            job,
            "systemUpgradeV1",
            JobState::Succeeded,
            Some(JobOutput::Upgrade(UpgradeOutput {
                simulated: false,
                upgraded: vec![PackageChange {
                    name: "openssl".into(),
                    from: Some("3.0.15-1~deb12u1".into()),
                    to: "3.0.17-1~deb12u2".into(),
                }],
                installed: vec![PackageChange {
                    name: "linux-image-6.1.0-40-arm64".into(),
                    from: None,
                    to: "6.1.153-1".into(),
                }],
                removed: vec!["old-tool".into()],
                kept_back: vec!["held-pkg".into()],
                omitted: 0,
                reboot_required: true,
            })),
        ),
        origin: Origin::Fleet,
        arrival: 3,
        resumes: 1,
        reboot_from_boot: Some("4e1b-previous-boot".into()),
    }
}

/// A package job as it arrived (link and sealed secrets included), queued.
fn package_record() -> JobRecord {
    let job = job_id("0b7d8f2a-1c3e-4d5f-8a9b-0c1d2e3f4a5b");
    JobRecord {
        intent: Some(Intent {
            job_id: job,
            device_id: DeviceId::new("pi-kitchen").expect("id"),
            kind: JobKind::PackageInstallV1(Box::new(PackageInstall {
                package: "site-tool_1.2.0_arm64".into(),
                name: "site-tool".into(),
                version: "1.2.0".into(),
                architecture: "arm64".into(),
                sha256: "ab".repeat(32),
                size: 123_456,
                download: Some(DownloadLink {
                    url: "https://cp.example:8444/packages/site-tool_1.2.0_arm64?sig=00".into(),
                    expires_at: at("2026-11-30T13:00:00Z"),
                }),
                secrets: vec!["site-api".into()],
                sealed: Some(SealedBox {
                    nonce: "00112233445566778899aabb".into(),
                    ciphertext: "c0ffee".into(),
                }),
            })),
            attempt: 1,
            created_at: at("2026-11-30T11:59:59Z"),
            expires_at: at("2026-11-30T13:00:00Z"),
            timeout_seconds: 1500,
        }),
        status: status(job, "packageInstallV1", JobState::Waiting, None),
        origin: Origin::Local,
        arrival: 4,
        resumes: 0,
        reboot_from_boot: None,
    }
}

/// An inventory's status, as it waits in the outbox.
fn inventory_status() -> JobStatus {
    status(
        job_id("9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"),
        "inventoryRefreshV1",
        JobState::Succeeded,
        Some(JobOutput::Software(SoftwareInventory {
            inventory: Inventory {
                os_release: "Debian GNU/Linux 12 (bookworm)".into(),
                architecture: "arm64".into(),
                kernel: "6.1.0-40-arm64".into(),
                uptime_seconds: 86_400,
                memory_total_bytes: 4 << 30,
                memory_available_bytes: 3 << 30,
                disks: vec![DiskUsage {
                    mount_point: "/".into(),
                    total_bytes: 32 << 30,
                    available_bytes: 20 << 30,
                }],
                installed_packages: 2,
            },
            packages: vec![
                InstalledPackage {
                    name: "openssl".into(),
                    version: "3.0.17-1~deb12u2".into(),
                },
                InstalledPackage {
                    name: "site-tool".into(),
                    version: "1.2.0".into(),
                },
            ],
            omitted: 0,
        })),
    )
}

fn fixture(name: &str, written_now: &[u8]) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("src/fixtures")
        .join(format!("{name}.hex"));
    if !path.exists() && std::env::var_os("DROVER_BLESS").is_some() {
        let hex: String = written_now.iter().map(|b| format!("{b:02x}")).collect();
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("fixtures dir");
        std::fs::write(&path, hex + "\n").expect("write fixture");
    }
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (DROVER_BLESS=1 writes it)", path.display()));
    let text = text.trim();
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

/// An upgrade given up on after a reboot loop: its failure is a fact in V2
/// and, in V1, only the text of its error.
fn looping_record() -> JobRecord {
    let mut record = upgrade_record();
    record.status.state = JobState::Failed;
    record.status.output = None;
    record.status.error = Some(format!(
        "job was picked up again 4 times after the agent stopped while it ran \
         ({RESUME_LOOP_TEXT}); giving up instead of looping"
    ));
    record.status.failure = Some(Failure::ResumeLoop);
    record.resumes = 4;
    record
}

#[test]
fn the_agents_job_records_written_by_layout_v1_still_decode() {
    for (name, record) in [
        ("job_upgrade_v1", upgrade_record()),
        ("job_package_v1", package_record()),
    ] {
        let old = fixture(name, &[]);
        assert_eq!(old[0], 0, "{name}: the version byte of V1");
        assert_eq!(decode_job(&old).expect("V1 decodes"), record, "{name}");
        let summary = encode_summary(&record).expect("encode");
        let old = fixture(&format!("{name}_summary"), &summary);
        assert_eq!(
            decode_summary(&old).expect("V1 decodes"),
            record.summary(),
            "{name}"
        );
        assert_eq!(summary, old, "{name}: the summary's layout changed");
    }
}

#[test]
fn the_agents_job_records_written_by_layout_v2_still_decode() {
    for (name, record) in [
        ("job_upgrade_v2", upgrade_record()),
        ("job_package_v2", package_record()),
        ("job_looping_v2", looping_record()),
    ] {
        let old = fixture(name, &[]);
        assert_eq!(old[0], 1, "{name}: the version byte of V2");
        assert_eq!(decode_job(&old).expect("V2 decodes"), record, "{name}");
    }
}

/// A failed upgrade with apt's own words on why: its reason lines are V3's.
fn unmet_record() -> JobRecord {
    let mut record = upgrade_record();
    record.status.state = JobState::Failed;
    record.status.output = None;
    record.status.error =
        Some("step full-upgrade failed: apt-get full-upgrade failed (exit 100)".into());
    record.status.failure = Some(Failure::StepFailed);
    record.status.reason = vec![
        "The following packages have unmet dependencies:".into(),
        " site-tool : Depends: libsite2 (>= 2.0) but it is not installable".into(),
        "E: Unable to correct problems, you have held broken packages.".into(),
    ];
    record
}

#[test]
fn the_agents_job_records_written_by_layout_v3_still_decode_and_are_still_written_alike() {
    for (name, record) in [
        ("job_upgrade_v3", upgrade_record()),
        ("job_package_v3", package_record()),
        ("job_unmet_v3", unmet_record()),
    ] {
        let now = encode_job(&record).expect("encode");
        let old = fixture(name, &now);
        assert_eq!(old[0], 2, "{name}: the version byte of V3");
        assert_eq!(decode_job(&old).expect("V3 decodes"), record, "{name}");
        assert_eq!(
            now, old,
            "{name}: the job record's layout changed without a new version"
        );
    }
}

#[test]
fn an_outbox_status_written_by_layout_v1_still_decodes() {
    let old = fixture("outbox_status_v1", &[]);
    assert_eq!(old[0], 0, "the version byte of V1");
    assert_eq!(decode_status(&old).expect("V1 decodes"), inventory_status());
}

#[test]
fn an_outbox_status_written_by_layout_v2_still_decodes() {
    for (name, status) in [
        ("outbox_status_v2", inventory_status()),
        ("outbox_looping_v2", looping_record().status),
    ] {
        let old = fixture(name, &[]);
        assert_eq!(old[0], 1, "{name}: the version byte of V2");
        assert_eq!(decode_status(&old).expect("V2 decodes"), status, "{name}");
    }
}

#[test]
fn an_outbox_status_written_by_layout_v3_still_decodes_and_is_still_written_alike() {
    for (name, status) in [
        ("outbox_status_v3", inventory_status()),
        ("outbox_unmet_v3", unmet_record().status),
    ] {
        let now = encode_status(&status).expect("encode");
        let old = fixture(name, &now);
        assert_eq!(old[0], 2, "{name}: the version byte of V3");
        assert_eq!(decode_status(&old).expect("V3 decodes"), status, "{name}");
        assert_eq!(
            now, old,
            "{name}: the outbox status's layout changed without a new version"
        );
    }
}
