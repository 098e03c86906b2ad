//! `packageInstallV1`: one .deb from the package store. A manifest names
//! the package's id (and may pin its version and checksum) and the Secrets
//! whose files the device gets first; `apply` fills in the rest from the
//! store, so the deployment fixes the file's checksum; at every delivery
//! the job gets a fresh download link and its secrets sealed to the device
//! and job. Its report stays with the job.

use super::{Apply, Kind, Step};
use crate::http::ApiError;
use crate::secrets::Enricher;
use axum::http::StatusCode;
use drover_model::Intent;
use drover_model::model::{JobKind, MAX_JOB_SECRETS, PackageInstall as Install};
use drover_model::sealed::{is_secret_name, seal};
use drover_rules::deployment::DeploymentJob;
use drover_rules::records::PackageRecord;
use drover_rules::records::{SecretRecord, secret_key};
use jiff::Timestamp;
use serde::Deserialize;

pub struct PackageInstall;

/// `packageInstallV1: {package: ID}`; `version` and `sha256`, when given,
/// pin what the store must hold under that id.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Section {
    package: String,
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    sha256: Option<String>,
    /// Secrets whose files the device gets before the install.
    #[serde(default)]
    secrets: Vec<String>,
}

fn bad(message: String) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, message)
}

impl Kind for PackageInstall {
    fn name(&self) -> &'static str {
        "packageInstallV1"
    }

    fn example(&self) -> &'static str {
        "{package: ID}"
    }

    fn deployment_job(
        &self,
        section: serde_json::Value,
        problems: &mut Vec<String>,
    ) -> DeploymentJob {
        let section: Section = match serde_json::from_value(section) {
            Ok(section) => section,
            Err(e) => {
                problems.push(format!("spec.packageInstallV1: {e}"));
                // Never used: the manifest is refused for its problems.
                return DeploymentJob::SystemUpgradeV1;
            }
        };
        if section.package.is_empty() || section.package.len() > 300 {
            problems.push(
                "spec.packageInstallV1.package must name a package in the store (NAME_VERSION_ARCH, as `drover get packages` shows)"
                    .into(),
            );
        }
        if section.secrets.len() > MAX_JOB_SECRETS
            || !section.secrets.iter().all(|s| is_secret_name(s))
        {
            problems.push(format!(
                "spec.packageInstallV1.secrets: at most {MAX_JOB_SECRETS} Secret names"
            ));
        }
        // Filled in from the package store by apply.
        DeploymentJob::PackageInstallV1(Box::new(Install {
            secrets: section.secrets,
            sealed: None,
            package: section.package,
            name: String::new(),
            version: section.version.unwrap_or_default(),
            architecture: String::new(),
            sha256: section.sha256.unwrap_or_default(),
            size: 0,
            download: None,
        }))
    }

    fn render_deployment_job(&self, job: &DeploymentJob) -> serde_json::Value {
        let DeploymentJob::PackageInstallV1(package) = job else {
            return serde_json::json!({});
        };
        let mut rendered = serde_json::json!({
            "package": package.package, "version": package.version, "sha256": package.sha256
        });
        if !package.secrets.is_empty() {
            rendered["secrets"] = serde_json::json!(package.secrets);
        }
        rendered
    }

    fn resolve<'a>(
        &'a self,
        apply: Apply<'a>,
        job: &'a mut DeploymentJob,
    ) -> Step<'a, Result<(), ApiError>> {
        Box::pin(async move {
            let DeploymentJob::PackageInstallV1(wanted) = job else {
                return Ok(());
            };
            **wanted = resolve(apply, wanted).await?;
            Ok(())
        })
    }

    fn enrich<'a>(
        &'a self,
        enricher: &'a Enricher,
        intent: &'a mut Intent,
        now: Timestamp,
    ) -> Step<'a, Result<(), String>> {
        Box::pin(async move {
            let JobKind::PackageInstallV1(package) = &mut intent.kind else {
                return Ok(());
            };
            let generation = crate::device_tokens::generation(&enricher.db, &intent.device_id)
                .await
                .map_err(|e| e.to_string())?;
            if let Some(downloads) = &enricher.downloads {
                package.download =
                    Some(downloads.link(&package.package, &intent.device_id, generation, now));
            }
            if package.secrets.is_empty() {
                return Ok(());
            }
            let files = enricher
                .files(&package.secrets)
                .await
                .map_err(|e| e.to_string())?;
            let token = enricher
                .secrets
                .device_token_at(&intent.device_id, generation);
            package.sealed = Some(seal(&token, &intent.device_id, intent.job_id, &files)?);
            Ok(())
        })
    }
}

/// The package the store holds under the wanted id, checked against what
/// the manifest pins, with the manifest's secrets (which must exist).
async fn resolve(apply: Apply<'_>, wanted: &Install) -> Result<Install, ApiError> {
    if !apply.downloads {
        return Err(bad(
            "packageInstallV1: this control plane serves no package downloads: it listens for \
             them on a wildcard address and knows no name agents reach it by; start `drover \
             serve` with --download-url https://HOST:PORT (the download listener's port, 7182 \
             by default), or with an --agent-tls-cert that names the host"
                .into(),
        ));
    }
    let key = drover_rules::records::package_key(&wanted.package);
    let Some((_, stored)) = apply.db.get::<PackageRecord>(&key).await? else {
        return Err(bad(format!(
            "package {} is not in the package store; upload it with `drover packages upload FILE.deb`",
            wanted.package
        )));
    };
    for (field, pinned, held) in [
        ("version", &wanted.version, &stored.version),
        ("sha256", &wanted.sha256, &stored.sha256),
    ] {
        if !pinned.is_empty() && pinned != held {
            return Err(bad(format!(
                "packageInstallV1.{field} is {pinned}, but the store holds {} with {held}",
                stored.id
            )));
        }
    }
    for name in &wanted.secrets {
        if !apply.secrets_before.contains(name)
            && apply
                .db
                .get::<SecretRecord>(&secret_key(name))
                .await?
                .is_none()
        {
            return Err(bad(format!(
                "packageInstallV1.secrets: there is no Secret {name}; apply it first"
            )));
        }
    }
    Ok(Install {
        secrets: wanted.secrets.clone(),
        ..stored.job()
    })
}
