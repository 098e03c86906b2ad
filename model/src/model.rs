//! The job model of DESIGN.md, shared by the agent and the control plane.
//! These types are also the JSON payloads on every transport (camelCase), so a
//! field added here must be optional for older peers.

use crate::ids::{DeviceId, JobId};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// What a job asks the device to do. `SystemUpgradeV1` has no parameters, ever
/// (invariant A8): apt, dpkg, repository and reboot policy are compiled in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum JobKind {
    SystemUpgradeV1(Empty),
    InventoryRefreshV1(Empty),
    PackageInstallV1(Box<PackageInstall>),
    /// `PatchAssessmentV1`: what a full upgrade would change now, read
    /// only: the lists refreshed as an upgrade refreshes them, then apt's
    /// simulation; nothing is installed (issue 31). It takes no parameters.
    /// (Appended: stored intents of the others decode unchanged.)
    PatchAssessmentV1(Empty),
}

/// `PackageInstallV1`: one `.deb` from the control plane's package store.
/// Every field but the link is fixed when the job is made; the signature
/// over the intent covers them all, so the checksum the agent verifies is
/// the control plane's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PackageInstall {
    /// The package store's id: `NAME_VERSION_ARCH`.
    pub package: String,
    pub name: String,
    pub version: String,
    pub architecture: String,
    /// Hex SHA-256 of the file.
    pub sha256: String,
    pub size: u64,
    /// Made fresh at every delivery and never stored by the control plane.
    /// (Always written, `null` when absent: the stores encode with postcard,
    /// which cannot skip a field.)
    #[serde(default)]
    pub download: Option<DownloadLink>,
    /// Secrets (by name) whose files the device writes under
    /// `/etc/drover/secrets/<secret>/<key>` (mode 0600) before installing.
    #[serde(default)]
    pub secrets: Vec<String>,
    /// Those files, sealed to this device and job at delivery; never stored
    /// by the control plane.
    #[serde(default)]
    pub sealed: Option<crate::sealed::SealedBox>,
}

/// Most secrets one package job may name.
pub const MAX_JOB_SECRETS: usize = 8;

/// A signed, expiring link to a package's file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DownloadLink {
    pub url: String,
    pub expires_at: Timestamp,
}

/// Largest package a `PackageInstallV1` job may carry.
pub const MAX_PACKAGE_BYTES: u64 = 2 << 30;

impl PackageInstall {
    /// Whether the fields are what a package store can hold: Debian's
    /// name and version syntax, a hex digest, a bounded size, an http(s) link.
    pub fn check(&self) -> Result<(), String> {
        if !is_package_name(&self.name) {
            return Err(format!("{:?} is not a Debian package name", self.name));
        }
        if !is_version(&self.version) {
            return Err(format!("{:?} is not a Debian version", self.version));
        }
        if self.architecture.is_empty()
            || self.architecture.len() > 32
            || !self
                .architecture
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        {
            return Err(format!(
                "{:?} is not a Debian architecture",
                self.architecture
            ));
        }
        if self.package != package_id(&self.name, &self.version, &self.architecture) {
            return Err(format!(
                "package id {:?} does not match its name, version and architecture",
                self.package
            ));
        }
        if self.sha256.len() != 64
            || !self
                .sha256
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
        {
            return Err("sha256 must be 64 lower-case hex digits".into());
        }
        if self.size == 0 || self.size > MAX_PACKAGE_BYTES {
            return Err(format!(
                "a package of {} bytes is outside 1..={MAX_PACKAGE_BYTES}",
                self.size
            ));
        }
        if self.secrets.len() > MAX_JOB_SECRETS
            || !self
                .secrets
                .iter()
                .all(|s| crate::sealed::is_secret_name(s))
        {
            return Err(format!(
                "secrets must be at most {MAX_JOB_SECRETS} names of [A-Za-z0-9._-]"
            ));
        }
        if let Some(link) = &self.download
            && (link.url.len() > 2048
                || !(link.url.starts_with("https://") || link.url.starts_with("http://"))
                || link
                    .url
                    .chars()
                    .any(|c| c.is_control() || c.is_whitespace()))
        {
            return Err("the download link is not an http(s) URL".into());
        }
        Ok(())
    }
}

/// Debian's package name syntax: lower-case letters, digits, `+ - .`,
/// starting with a letter or digit, at least two characters (bounded here).
pub fn is_package_name(name: &str) -> bool {
    (2..=128).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c))
}

/// Debian's version syntax (`[epoch:]upstream[-revision]`), bounded.
pub fn is_version(version: &str) -> bool {
    (1..=128).contains(&version.len())
        && version.starts_with(|c: char| c.is_ascii_digit())
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".+-~:".contains(c))
}

/// The package store's id of a package: `NAME_VERSION_ARCH`, the epoch's
/// colon written `%3a` as in Debian's file names.
pub fn package_id(name: &str, version: &str, architecture: &str) -> String {
    format!("{name}_{}_{architecture}", version.replace(':', "%3a"))
}

/// The parameters of a kind that takes none. Unknown fields are refused, so a
/// peer cannot smuggle options into a parameterless kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

impl JobKind {
    /// Every kind's wire name, in the model's order: a new kind adds its
    /// variant, its name here and in [`JobKind::name`] (a test checks
    /// they agree), its chain on the agent and its handler in the control
    /// plane's `kinds`.
    pub const NAMES: [&'static str; 4] = [
        "systemUpgradeV1",
        "inventoryRefreshV1",
        "packageInstallV1",
        "patchAssessmentV1",
    ];

    /// The kind's wire name, which is also the capability an agent advertises.
    pub fn name(&self) -> &'static str {
        match self {
            JobKind::SystemUpgradeV1(_) => "systemUpgradeV1",
            JobKind::InventoryRefreshV1(_) => "inventoryRefreshV1",
            JobKind::PackageInstallV1(_) => "packageInstallV1",
            JobKind::PatchAssessmentV1(_) => "patchAssessmentV1",
        }
    }

    pub fn patch_assessment() -> Self {
        JobKind::PatchAssessmentV1(Empty {})
    }

    pub fn system_upgrade() -> Self {
        JobKind::SystemUpgradeV1(Empty {})
    }

    pub fn inventory_refresh() -> Self {
        JobKind::InventoryRefreshV1(Empty {})
    }
}

/// One job for one device, as the control plane sends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Intent {
    pub job_id: JobId,
    pub device_id: DeviceId,
    pub kind: JobKind,
    pub attempt: u32,
    pub created_at: Timestamp,
    /// An intent past this instant never starts (A3).
    pub expires_at: Timestamp,
    /// The job's budget once started, in seconds. Informational for the
    /// updater, which bounds each child call itself; expiry never interrupts apt.
    pub timeout_seconds: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum JobState {
    Accepted,
    Waiting,
    Running,
    AwaitingReboot,
    Succeeded,
    Failed,
    Expired,
    Rejected,
    Canceled,
}

impl JobState {
    pub fn is_terminal(self) -> bool {
        match self {
            JobState::Succeeded
            | JobState::Failed
            | JobState::Expired
            | JobState::Rejected
            | JobState::Canceled => true,
            JobState::Accepted
            | JobState::Waiting
            | JobState::Running
            | JobState::AwaitingReboot => false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepState {
    Pending,
    Running,
    Done,
    Failed,
}

/// Where a job is in its chain: one record per step, durable, so the record,
/// not a log search, says where a job stopped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepRecord {
    pub name: String,
    pub state: StepState,
    pub started_at: Option<Timestamp>,
    /// Seconds from the step's durable start to its end.
    pub seconds: Option<f64>,
    pub tries: u32,
    /// Bounded to [`crate::MAX_ERROR_BYTES`].
    pub error: Option<String>,
}

impl StepRecord {
    pub fn pending(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            state: StepState::Pending,
            started_at: None,
            seconds: None,
            tries: 0,
            error: None,
        }
    }
}

/// A job's reported status. `seq` grows with every change so a receiver can
/// drop stale or duplicate copies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobStatus {
    pub job_id: JobId,
    pub device_id: DeviceId,
    pub attempt: u32,
    /// The kind's wire name, or the unknown name of a rejected kind.
    pub kind: String,
    pub state: JobState,
    pub steps: Vec<StepRecord>,
    /// The latest error, bounded to [`crate::MAX_ERROR_BYTES`].
    pub error: Option<String>,
    pub output: Option<JobOutput>,
    pub accepted_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub boot_id: String,
    /// The first heartbeat after the updater completed (A6).
    pub completion_heartbeat_at: Option<Timestamp>,
    pub seq: u64,
    /// Why a Failed or Rejected job ended so, as a fact to act on (the
    /// error says it to a person). Absent from an agent older than the
    /// field: [`JobStatus::failure`] reads its older signals. (Always
    /// written, null when none: the stores' postcard has no missing fields.)
    #[serde(default)]
    pub failure: Option<crate::failure::Failure>,
    /// A Failed job's reason in the failing program's own words (apt's
    /// `E:` lines and what it says of unmet dependencies, dpkg's error for
    /// a package, else the failing step's last lines): at most
    /// [`crate::reason::MAX_REASON_LINES`], cleaned. Empty from an agent
    /// older than the field, and for every other state.
    #[serde(default)]
    pub reason: Vec<String>,
}

impl JobStatus {
    /// Why the job failed or was refused: the field, or for a status from
    /// an agent older than it, the signals such an agent sent (the text of
    /// its error, the kind it named).
    pub fn failure(&self) -> Option<crate::failure::Failure> {
        if self.failure.is_some() {
            return self.failure;
        }
        match self.state {
            JobState::Rejected if self.kind == crate::failure::UNVERIFIED_KIND => {
                Some(crate::failure::Failure::SignatureRefused)
            }
            JobState::Failed
                if self
                    .error
                    .as_deref()
                    .is_some_and(|e| e.contains(crate::failure::RESUME_LOOP_TEXT)) =>
            {
                Some(crate::failure::Failure::ResumeLoop)
            }
            _ => None,
        }
    }
}

/// What a finished job found or did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum JobOutput {
    Upgrade(UpgradeOutput),
    Inventory(Inventory),
    /// What `inventoryRefreshV1` reports since deployments target by
    /// installed software. (Appended: stored records of the others decode
    /// unchanged.)
    Software(SoftwareInventory),
    /// What `patchAssessmentV1` found. (Appended.)
    Assessment(PatchAssessment),
}

/// A patch assessment: what a full upgrade would change on the device now
/// (apt's simulation after the lists were refreshed), which of it is a
/// security update, and whether a reboot is pending.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PatchAssessment {
    /// Installed packages a full upgrade would upgrade.
    pub upgradable: u32,
    /// Of those, the ones available from a security archive.
    pub security: u32,
    /// Packages apt keeps back.
    pub kept_back: u32,
    /// Whether the device's sources include a security archive at all
    /// (32-bit Raspberry Pi OS has none: its `security` is then always 0).
    pub security_archive: bool,
    /// Why a reboot is pending (`/run/reboot-required`, or a newer kernel
    /// of the running flavour installed), if one is.
    pub reboot_pending: Option<String>,
    /// The running kernel's release.
    pub running_kernel: String,
    /// The newest installed kernel of the running flavour, when it is
    /// newer than the running one.
    pub newest_kernel: Option<String>,
    /// The pending packages, security updates first, at most
    /// [`MAX_LISTED_PACKAGES`].
    pub pending: Vec<PendingPackage>,
    /// Pending packages left out of the list to keep it bounded.
    pub omitted: u32,
}

/// The longest kernel release an assessment may name, in bytes (Linux's
/// own `uname -r` is at most 64).
pub const MAX_KERNEL_RELEASE_BYTES: usize = 256;
/// The longest reason for a pending reboot, in bytes.
pub const MAX_REBOOT_REASON_BYTES: usize = 1024;
/// The longest package name or version in an assessment, in bytes.
pub const MAX_PENDING_FIELD_BYTES: usize = 256;

impl PatchAssessment {
    /// Whether the assessment keeps the protocol's bounds: at most
    /// [`MAX_LISTED_PACKAGES`] pending packages, each name and version at
    /// most [`MAX_PENDING_FIELD_BYTES`], kernels at most
    /// [`MAX_KERNEL_RELEASE_BYTES`], the reboot's reason at most
    /// [`MAX_REBOOT_REASON_BYTES`]. An agent's own never breaks them; the
    /// control plane keeps none that does.
    pub fn check(&self) -> Result<(), String> {
        if self.pending.len() > MAX_LISTED_PACKAGES {
            return Err(format!(
                "{} pending packages listed; at most {MAX_LISTED_PACKAGES}",
                self.pending.len()
            ));
        }
        for (what, text, max) in [
            (
                "runningKernel",
                Some(&self.running_kernel),
                MAX_KERNEL_RELEASE_BYTES,
            ),
            (
                "newestKernel",
                self.newest_kernel.as_ref(),
                MAX_KERNEL_RELEASE_BYTES,
            ),
            (
                "rebootPending",
                self.reboot_pending.as_ref(),
                MAX_REBOOT_REASON_BYTES,
            ),
        ] {
            if let Some(text) = text
                && text.len() > max
            {
                return Err(format!("{what} is {} bytes; at most {max}", text.len()));
            }
        }
        for package in &self.pending {
            let longest = [
                Some(&package.name),
                package.from.as_ref(),
                Some(&package.to),
            ]
            .into_iter()
            .flatten()
            .map(String::len)
            .max()
            .unwrap_or(0);
            if longest > MAX_PENDING_FIELD_BYTES {
                return Err(format!(
                    "a pending package's name or version is {longest} bytes; at most {MAX_PENDING_FIELD_BYTES}"
                ));
            }
        }
        Ok(())
    }
}

/// One package a full upgrade would change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingPackage {
    pub name: String,
    /// The installed version; `None` for a package newly installed.
    pub from: Option<String>,
    pub to: String,
    /// Available from a security archive.
    pub security: bool,
}

/// An inventory with the installed packages (dpkg's `ii` entries), bounded
/// to [`MAX_INVENTORY_PACKAGE_BYTES`]; `omitted` counts what did not fit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SoftwareInventory {
    pub inventory: Inventory,
    pub packages: Vec<InstalledPackage>,
    pub omitted: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstalledPackage {
    pub name: String,
    pub version: String,
}

/// Upper bound of the package list in one inventory as JSON (names,
/// versions and [`PACKAGE_JSON_OVERHEAD`] each), so that the whole status
/// fits the smallest transport's message limit (WebSocket, 128 KiB).
pub const MAX_INVENTORY_PACKAGE_BYTES: usize = 100 * 1024;
/// `{"name":"","version":""},` around each package in JSON.
pub const PACKAGE_JSON_OVERHEAD: usize = 26;
/// Upper bound of packages one inventory lists.
pub const MAX_INVENTORY_PACKAGES: usize = 4000;

/// Upper bound of package names an upgrade output lists.
pub const MAX_LISTED_PACKAGES: usize = 300;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeOutput {
    /// True when apt only simulated the upgrade (`apt-get -s`).
    pub simulated: bool,
    pub upgraded: Vec<PackageChange>,
    pub installed: Vec<PackageChange>,
    pub removed: Vec<String>,
    pub kept_back: Vec<String>,
    /// Package entries left out to keep the output bounded.
    pub omitted: u32,
    pub reboot_required: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackageChange {
    pub name: String,
    pub from: Option<String>,
    pub to: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    pub os_release: String,
    pub architecture: String,
    pub kernel: String,
    pub uptime_seconds: u64,
    pub memory_total_bytes: u64,
    pub memory_available_bytes: u64,
    pub disks: Vec<DiskUsage>,
    pub installed_packages: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskUsage {
    pub mount_point: String,
    pub total_bytes: u64,
    pub available_bytes: u64,
}

/// The agent's periodic sign of life. A heartbeat under a new boot id is what
/// confirms a job that rebooted the device (A6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Heartbeat {
    pub device_id: DeviceId,
    pub boot_id: String,
    pub seq: u64,
    pub agent_version: String,
    pub capabilities: Vec<String>,
    pub uptime_seconds: u64,
    pub os_release: String,
    pub architecture: String,
    /// Changes whenever the installed package set changes.
    pub inventory_digest: String,
    pub sent_at: Timestamp,
}

/// A job the agent still holds, as listed in its `hello`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldJob {
    pub job_id: JobId,
    pub state: JobState,
}

/// An agent's hello, the first thing it says on every connection, over
/// every transport: who it is, which kinds of job it runs and which jobs it
/// still holds, so both sides resynchronise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hello {
    pub device_id: DeviceId,
    pub agent_version: String,
    pub boot_id: String,
    pub capabilities: Vec<String>,
    pub jobs: Vec<HeldJob>,
}

#[cfg(test)]
mod tests {

    #[test]
    fn an_assessment_keeps_the_protocols_bounds_or_says_which() {
        let package = |name: &str| PendingPackage {
            name: name.into(),
            from: Some("1.0".into()),
            to: "1.1".into(),
            security: false,
        };
        let mut assessment = PatchAssessment {
            running_kernel: "6.1.0-28-amd64".into(),
            pending: vec![package("bash"); MAX_LISTED_PACKAGES],
            ..Default::default()
        };
        assert_eq!(assessment.check(), Ok(()));
        assessment.pending.push(package("one-more"));
        assert!(
            assessment
                .check()
                .unwrap_err()
                .contains("301 pending packages")
        );
        assessment.pending.truncate(1);
        assessment.running_kernel = "k".repeat(MAX_KERNEL_RELEASE_BYTES + 1);
        assert!(
            assessment
                .check()
                .unwrap_err()
                .contains("runningKernel is 257 bytes")
        );
        assessment.running_kernel = "6.1".into();
        assessment.pending = vec![package(&"p".repeat(MAX_PENDING_FIELD_BYTES + 1))];
        assert!(assessment.check().unwrap_err().contains("name or version"));
    }
    use super::*;

    #[test]
    fn every_kind_is_named_once_in_names_and_reads_back_by_it() {
        let kinds = [
            JobKind::system_upgrade(),
            JobKind::inventory_refresh(),
            JobKind::PackageInstallV1(Box::new(PackageInstall {
                package: "p_1_all".into(),
                name: "p".into(),
                version: "1".into(),
                architecture: "all".into(),
                sha256: "00".repeat(32),
                size: 1,
                download: None,
                secrets: Vec::new(),
                sealed: None,
            })),
            JobKind::patch_assessment(),
        ];
        let names: Vec<&str> = kinds.iter().map(JobKind::name).collect();
        assert_eq!(names, JobKind::NAMES);
        for kind in &kinds {
            let wire = serde_json::to_value(kind).expect("json");
            assert!(wire.get(kind.name()).is_some(), "{wire}");
        }
    }

    fn good() -> PackageInstall {
        PackageInstall {
            package: "hello_2:1.0-1+b1_arm64".replace(':', "%3a"),
            name: "hello".into(),
            version: "2:1.0-1+b1".into(),
            architecture: "arm64".into(),
            sha256: "a".repeat(64),
            size: 1234,
            download: Some(DownloadLink {
                url: "https://cp.example:7182/api/agent/v1/packages/x/file?sig=1".into(),
                expires_at: Timestamp::UNIX_EPOCH,
            }),
            secrets: vec!["kiosk".into()],
            sealed: None,
        }
    }

    #[test]
    fn package_parameters_are_checked() {
        assert_eq!(good().check(), Ok(()));
        type Case = (&'static str, fn(&mut PackageInstall), &'static str);
        let cases: &[Case] = &[
            (
                "upper-case name",
                |p| p.name = "Hello".into(),
                "package name",
            ),
            (
                "name with a slash",
                |p| p.name = "../etc".into(),
                "package name",
            ),
            ("one-letter name", |p| p.name = "h".into(), "package name"),
            ("empty version", |p| p.version = String::new(), "version"),
            (
                "version with a space",
                |p| p.version = "1.0 x".into(),
                "version",
            ),
            (
                "architecture with a slash",
                |p| p.architecture = "a/b".into(),
                "architecture",
            ),
            (
                "id of another package",
                |p| p.package = "other_1_all".into(),
                "does not match",
            ),
            ("short digest", |p| p.sha256 = "ab".into(), "sha256"),
            ("upper-case digest", |p| p.sha256 = "A".repeat(64), "sha256"),
            ("empty file", |p| p.size = 0, "outside"),
            (
                "secret with a slash",
                |p| p.secrets = vec!["../x".into()],
                "secrets",
            ),
            (
                "too many secrets",
                |p| p.secrets = vec!["s".into(); 9],
                "secrets",
            ),
            ("huge file", |p| p.size = MAX_PACKAGE_BYTES + 1, "outside"),
            (
                "file link",
                |p| p.download.as_mut().expect("link").url = "file:///etc/shadow".into(),
                "http(s)",
            ),
            (
                "link with a newline",
                |p| p.download.as_mut().expect("link").url = "https://a\n/b".into(),
                "http(s)",
            ),
        ];
        for (what, change, expected) in cases {
            let mut package = good();
            change(&mut package);
            if !what.starts_with("id of") {
                package.package =
                    package_id(&package.name, &package.version, &package.architecture);
            }
            let error = package.check().expect_err(what);
            assert!(error.contains(expected), "{what}: {error}");
        }
    }
}
