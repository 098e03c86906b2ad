//! `PackageInstallV1`: one `.deb` from the control plane's package store.
//! `download` fetches it through its signed link (resuming a partial file,
//! refreshing an expired link) and checks its size and SHA-256 against the
//! signed intent; `install` installs it with apt-get as a detached call
//! under dpkg's lock, like the system upgrade, and checks dpkg's record.
//! A file whose checksum does not match is deleted and nothing is installed.

use crate::fetch::{FetchError, Fetcher, sha256_file};
use crate::upgrade::{APT_CHANGE_OPTIONS, call_failed, call_id, elapsed, lock_message};
use crate::{AptSettings, Mode, SystemUpgrade, run_bounded};
use agent_core::chain::{BoxFuture, Chain, StepContext, StepOutcome};
use drover_model::model::{JobKind, JobOutput, PackageChange, PackageInstall, UpgradeOutput};
use std::path::PathBuf;
use std::time::Duration;
use tracing::{info, warn};

/// The steps of `packageInstallV1`, in order; they never change.
pub const STEPS: &[&str] = &["download", "install"];
/// Where packages are kept between download and install, inside the root.
const PACKAGES_DIR: &str = "var/cache/drover-agent/packages";
/// Where a job's secret files go, inside the root.
const SECRETS_DIR: &str = "etc/drover/secrets";
/// How long a download keeps trying through network errors.
const DOWNLOAD_PATIENCE: Duration = Duration::from_secs(600);

pub struct PackageInstaller {
    apt: SystemUpgrade,
    fetcher: Option<Fetcher>,
}

fn params<'a>(ctx: &StepContext<'a>) -> Result<&'a PackageInstall, StepOutcome> {
    match ctx.kind {
        Some(JobKind::PackageInstallV1(p)) => Ok(p),
        _ => Err(StepOutcome::Fail(
            "a packageInstallV1 job without its parameters".into(),
        )),
    }
}

impl PackageInstaller {
    /// Without a fetcher the agent cannot download, and says so per job.
    pub fn new(settings: AptSettings, fetcher: Option<Fetcher>) -> Self {
        Self {
            apt: SystemUpgrade::new(settings),
            fetcher,
        }
    }

    fn settings(&self) -> &AptSettings {
        &self.apt.settings
    }

    fn file(&self, package: &PackageInstall, suffix: &str) -> PathBuf {
        self.settings()
            .system_root()
            .join(PACKAGES_DIR)
            .join(format!("{}.{suffix}", package.sha256))
    }

    /// Whether `path` holds exactly the package; a wrong file is deleted.
    async fn verify(&self, package: &PackageInstall, path: &PathBuf) -> Result<(), String> {
        let (size, sha256) = sha256_file(path)
            .await
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if size == package.size && sha256 == package.sha256 {
            return Ok(());
        }
        let _ = tokio::fs::remove_file(path).await;
        Err(format!(
            "the downloaded {} does not match the package store's record \
             ({size} bytes, sha256 {sha256}; expected {} bytes, sha256 {}); \
             it was deleted and nothing was installed",
            package.package, package.size, package.sha256
        ))
    }

    async fn download(&self, ctx: &StepContext<'_>) -> StepOutcome {
        let package = match params(ctx) {
            Ok(p) => p,
            Err(outcome) => return outcome,
        };
        let done = self.file(package, "deb");
        if done.exists() {
            return match self.verify(package, &done).await {
                Ok(()) => StepOutcome::Done,
                Err(e) => StepOutcome::Fail(e),
            };
        }
        let Some(fetcher) = &self.fetcher else {
            return StepOutcome::Fail("this agent has no way to download packages".into());
        };
        let Some(link) = &package.download else {
            return StepOutcome::Fail(
                "the job carries no download link; the control plane serves no downloads".into(),
            );
        };
        if let Some(dir) = done.parent()
            && let Err(e) = tokio::fs::create_dir_all(dir).await
        {
            return StepOutcome::Fail(format!("cannot create {}: {e}", dir.display()));
        }
        let part = self.file(package, "part");
        let mut url = link.url.clone();
        if link.expires_at <= agent_core::clock::now() {
            info!(expired_at = %link.expires_at, "the download link expired; asking for a fresh one");
            url = match fetcher.refresh(&link.url, &package.package).await {
                Ok(fresh) => fresh.url,
                Err(e) => return self.again(ctx, e.to_string()),
            };
        }
        let mut result = fetcher.download(&url, &part, package.size).await;
        if let Err(FetchError::Refused(status)) = &result {
            info!(%status, "the download link was refused; asking for a fresh one");
            result = match fetcher.refresh(&url, &package.package).await {
                Ok(fresh) => fetcher.download(&fresh.url, &part, package.size).await,
                Err(e) => Err(e),
            };
        }
        if let Err(e) = result {
            return self.again(ctx, e.to_string());
        }
        if let Err(e) = self.verify(package, &part).await {
            return StepOutcome::Fail(e);
        }
        if let Err(e) = tokio::fs::rename(&part, &done).await {
            return StepOutcome::Fail(format!("cannot keep {}: {e}", done.display()));
        }
        info!(package = %package.package, bytes = package.size, "package downloaded and verified");
        StepOutcome::Done
    }

    /// Opens the job's sealed secrets and writes each file, mode 0600, as
    /// `/etc/drover/secrets/<secret>/<key>` in the root, before the install
    /// (a package's maintainer scripts may read them).
    fn write_secrets(&self, ctx: &StepContext<'_>, package: &PackageInstall) -> Result<(), String> {
        use drover_model::sealed::{is_secret_name, open};
        if package.secrets.is_empty() {
            return Ok(());
        }
        let Some(sealed) = &package.sealed else {
            return Err(format!(
                "the job names secrets ({}) but carries none: the control plane could not attach them (see its log)",
                package.secrets.join(", ")
            ));
        };
        let fetcher = self
            .fetcher
            .as_ref()
            .ok_or("this agent has no device token to open secrets with")?;
        let token = fetcher
            .token
            .as_deref()
            .ok_or("this agent has no device token to open secrets with")?;
        let device =
            drover_model::DeviceId::new(fetcher.device_id.clone()).map_err(|e| e.to_string())?;
        let files = open(token, &device, ctx.job_id, sealed)?;
        let base = self.settings().system_root().join(SECRETS_DIR);
        for file in &files {
            if !package.secrets.contains(&file.secret)
                || !is_secret_name(&file.secret)
                || !is_secret_name(&file.key)
            {
                return Err(format!(
                    "the sealed secrets hold {}/{}, which the job does not name",
                    file.secret, file.key
                ));
            }
            let dir = base.join(&file.secret);
            write_private(&dir, &file.key, file.value.as_bytes()).map_err(|e| {
                format!(
                    "cannot write secret file {}/{}: {e}",
                    dir.display(),
                    file.key
                )
            })?;
        }
        info!(secrets = ?package.secrets, files = files.len(), "secret files written");
        Ok(())
    }

    /// A download that broke off is tried again (it resumes) for a while.
    fn again(&self, ctx: &StepContext<'_>, error: String) -> StepOutcome {
        if elapsed(ctx) < DOWNLOAD_PATIENCE {
            warn!(%error, tries = ctx.tries, "download failed; trying again");
            StepOutcome::RetryAfter {
                after: Duration::from_secs(5),
                reason: format!("download failed, trying again: {error}"),
            }
        } else {
            StepOutcome::Fail(format!("download failed: {error}"))
        }
    }

    async fn install(&self, ctx: &StepContext<'_>, output: &mut Option<JobOutput>) -> StepOutcome {
        let package = match params(ctx) {
            Ok(p) => p,
            Err(outcome) => return outcome,
        };
        let file = self.file(package, "deb");
        let inside = format!("/{PACKAGES_DIR}/{}.deb", package.sha256);
        let id = call_id(ctx, "install");
        if !self.apt.calls.started(&id) {
            if let Err(e) = self.verify(package, &file).await {
                return StepOutcome::Fail(e);
            }
            if self.settings().mode == Mode::Upgrade {
                // Simulate mode changes nothing, secrets included.
                if let Err(e) = self.write_secrets(ctx, package) {
                    return StepOutcome::Fail(e);
                }
                match self.apt.repair_dpkg(ctx, &mut Vec::new()).await {
                    StepOutcome::Done => {}
                    other => return other,
                }
            }
        }
        if self.settings().mode == Mode::Simulate {
            let argv = crate::upgrade::simulate(self.settings(), &["install", &inside]);
            return match run_bounded(&argv, Duration::from_secs(600)).await {
                Ok(out) if out.success() => {
                    *output = Some(JobOutput::Upgrade(UpgradeOutput {
                        simulated: true,
                        installed: vec![change(package)],
                        ..UpgradeOutput::default()
                    }));
                    StepOutcome::Done
                }
                Ok(out) => StepOutcome::FailWithReason {
                    error: format!("apt-get -s install failed: {}", out.tail()),
                    reason: out.reason(),
                },
                Err(e) => StepOutcome::Fail(e.to_string()),
            };
        }
        let mut args = APT_CHANGE_OPTIONS.to_vec();
        args.extend(["install", inside.as_str()]);
        let argv = self.settings().argv("apt-get", &args);
        match self.apt.call(ctx, "install", argv).await {
            Ok(out) if out.success() => {}
            Ok(out) => {
                if let Some(line) = lock_message(&out, "/var/lib/dpkg/lock")
                    && elapsed(ctx) < crate::upgrade::CHILD_CALL_LIMIT
                {
                    return StepOutcome::RetryAfter {
                        after: Duration::from_secs(10),
                        reason: format!("waiting for the dpkg lock: {line}"),
                    };
                }
                return StepOutcome::FailWithReason {
                    error: format!(
                        "apt-get install {} failed (exit {}): {}",
                        package.package,
                        out.exit_code,
                        out.tail()
                    ),
                    reason: out.reason(),
                };
            }
            Err(e) => return call_failed(ctx, "apt-get install", e),
        }
        // dpkg's own record decides, not apt's exit status alone.
        let query = self.settings().argv(
            "dpkg-query",
            &["-W", "-f", "${db:Status-Abbrev} ${Version}", &package.name],
        );
        match run_bounded(&query, Duration::from_secs(60)).await {
            Ok(out) if out.success() && out.stdout.trim() == format!("ii  {}", package.version) => {
                info!(package = %package.package, "package installed");
                let _ = tokio::fs::remove_file(&file).await;
                *output = Some(JobOutput::Upgrade(UpgradeOutput {
                    installed: vec![change(package)],
                    ..UpgradeOutput::default()
                }));
                StepOutcome::Done
            }
            Ok(out) => StepOutcome::Fail(format!(
                "after apt-get install, dpkg reports {} as {:?}, not installed at {}",
                package.name,
                out.stdout.trim(),
                package.version
            )),
            Err(e) => StepOutcome::Fail(e.to_string()),
        }
    }
}

/// Writes `dir/name` (dir 0700, file 0600) atomically: a temporary name,
/// fsync, rename, fsync of the directory.
fn write_private(dir: &std::path::Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let tmp = dir.join(format!(".{name}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}

fn change(package: &PackageInstall) -> PackageChange {
    PackageChange {
        name: package.name.clone(),
        from: None,
        to: package.version.clone(),
    }
}

impl Chain for PackageInstaller {
    fn kind(&self) -> &'static str {
        "packageInstallV1"
    }

    fn steps(&self) -> &'static [&'static str] {
        STEPS
    }

    fn run_step<'a>(&'a self, ctx: StepContext<'a>) -> BoxFuture<'a, StepOutcome> {
        Box::pin(async move {
            match ctx.step {
                "download" => self.download(&ctx).await,
                "install" => {
                    let mut output = ctx.output.take();
                    let outcome = self.install(&ctx, &mut output).await;
                    *ctx.output = output;
                    outcome
                }
                other => StepOutcome::Fail(format!("packageInstallV1 has no step {other:?}")),
            }
        })
    }
}
