//! The commands that change objects through the API: `apply`, `cancel`,
//! `delete`, acknowledging an alert, uploading a package, adding new
//! devices to a deployment.

use super::client;
use agent_core::out;
use anyhow::{Context, Result};
use drover::cli::{Cancelable, Cli, Deletable};
use drover_api::changes::Changed;
use serde_json::Value;
use std::path::Path;

/// `drover apply -f FILE [--dry-run]`.
pub async fn apply(cli: &Cli, file: &Path, dry_run: bool) -> Result<i32> {
    let text = if file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("cannot read the manifests from standard input")?;
        text
    } else {
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?
    };
    if dry_run {
        let previews = client(cli)?.preview_text(&text).await?;
        let refused = super::preview::print(&previews);
        return Ok(if refused { 1 } else { 0 });
    }
    for result in client(cli)?.apply_text(&text).await? {
        out!(
            "{}/{} {}",
            result.kind.name().to_lowercase(),
            drover::watch::printable(&result.name),
            result.result
        );
    }
    Ok(0)
}

/// `drover cancel taskrun|deployment NAME`.
pub async fn cancel(cli: &Cli, resource: &Cancelable, name: &str) -> Result<i32> {
    let path = match resource {
        Cancelable::Taskrun => format!("/taskruns/{name}/cancel"),
        Cancelable::Deployment => format!("/deployments/{name}/cancel"),
    };
    let answer: Changed = client(cli)?.post(&path, &Value::Null).await?;
    let kind = match resource {
        Cancelable::Taskrun => "taskrun",
        Cancelable::Deployment => "deployment",
    };
    out!(
        "{kind}/{name} {}: jobs not started are canceled on their devices, started ones run to their end",
        answer.result
    );
    Ok(0)
}

/// `drover delete KIND NAME`.
pub async fn delete(cli: &Cli, resource: &Deletable, name: &str) -> Result<i32> {
    let api = client(cli)?;
    match resource {
        Deletable::Taskrun => {
            let answer: Changed = api.delete(&format!("/taskruns/{name}")).await?;
            out!(
                "taskrun/{name} deleted with {} job record(s)",
                answer.jobs.unwrap_or(0)
            );
        }
        Deletable::Deployment => {
            let answer: Changed = api.delete(&format!("/deployments/{name}")).await?;
            out!(
                "deployment/{name} deleted with {} job record(s)",
                answer.jobs.unwrap_or(0)
            );
        }
        Deletable::Taskschedule => {
            api.delete::<Changed>(&format!("/taskschedules/{name}"))
                .await?;
            out!("taskschedule/{name} deleted (the runs it made stay)");
        }
        Deletable::Secret => {
            api.delete::<Changed>(&format!("/secrets/{name}")).await?;
            out!("secret/{name} deleted");
        }
        Deletable::Package => {
            let answer: Changed = api.delete(&format!("/packages/{name}")).await?;
            out!(
                "package/{name} deleted ({} bytes freed)",
                answer.freed_bytes.unwrap_or(0)
            );
        }
        Deletable::Device => {
            let answer: Changed = api.delete(&format!("/devices/{name}")).await?;
            out!(
                "device/{name} deleted with {} job record(s)",
                answer.jobs.unwrap_or(0)
            );
            if let Some(kept) = answer.kept_for_runs.filter(|&n| n > 0) {
                out!(
                    "{kept} job record(s) stay with their runs' history until those runs are deleted"
                );
            }
            if answer.online == Some(true) {
                out!(
                    "its agent is connected and will register it again; to keep it out, set `decommissioned: true` in its Device manifest instead"
                );
            }
        }
    }
    Ok(0)
}

/// `drover alerts ack KIND RESOURCE`.
pub async fn acknowledge(cli: &Cli, kind: &str, resource: &str) -> Result<i32> {
    let request = drover_api::fleet::AckRequest {
        kind: kind.to_owned(),
        resource: resource.to_owned(),
    };
    client(cli)?
        .post::<drover_api::fleet::AckAnswer>("/alerts/ack", &request)
        .await?;
    out!(
        "{} about {} acknowledged",
        drover::watch::printable(kind),
        drover::watch::printable(resource)
    );
    Ok(0)
}

/// `drover packages upload FILE`.
pub async fn upload(cli: &Cli, file: &Path, stall_seconds: u64) -> Result<i32> {
    let stall = drover::upload::stall(stall_seconds)?;
    let answer = drover::upload::upload(&client(cli)?, file, stall).await?;
    out!(
        "package {} ({} bytes, sha256 {}) is in the store",
        drover::watch::printable(&answer.id),
        answer.size,
        drover::watch::printable(&answer.sha256)
    );
    Ok(0)
}

/// `drover deployments add-new-devices NAME`.
pub async fn add_new_devices(cli: &Cli, name: &str) -> Result<i32> {
    let answer: Changed = client(cli)?
        .post(
            &format!("/deployments/{name}/add-new-devices"),
            &Value::Null,
        )
        .await?;
    out!("deployment/{name} {}", answer.result);
    Ok(0)
}
