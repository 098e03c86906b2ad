//! `drover describe`, `alerts` and `patch-status`: what the API says,
//! read through the API's types and printed by `describe.rs`.

use super::client;
use anyhow::Result;
use drover::cli::{Cli, Output};
use drover::get::structured;

/// `drover describe taskrun NAME`: the run and every target.
pub async fn taskrun(cli: &Cli, name: &str, output: &Output) -> Result<i32> {
    let api = client(cli)?;
    let run: drover_api::runs::TaskRun = api.get(&format!("/taskruns/{name}")).await?;
    let mut targets = Vec::new();
    loop {
        let page: drover_api::runs::RunTargets = api
            .get(&format!(
                "/taskruns/{name}/targets?offset={}&limit=1000",
                targets.len()
            ))
            .await?;
        let empty = page.items.is_empty();
        targets.extend(page.items);
        if empty || targets.len() as u64 >= page.total {
            break;
        }
    }
    if !structured(
        *output,
        &serde_json::json!({"taskRun": run, "targets": targets}),
    )? {
        super::describe::run(&run, &targets);
    }
    Ok(0)
}

/// `drover describe device ID`: the device, its jobs and its assessment.
pub async fn device(cli: &Cli, name: &str, output: &Output) -> Result<i32> {
    let api = client(cli)?;
    let device: drover_api::devices::Device = api.get(&format!("/devices/{name}")).await?;
    let jobs: drover_api::devices::DeviceJobs = api.get(&format!("/devices/{name}/jobs")).await?;
    let assessment: Option<drover_api::devices::Assessment> = api
        .get_optional(&format!("/devices/{name}/assessment"))
        .await?;
    if !structured(
        *output,
        &serde_json::json!({"device": device, "jobs": jobs, "assessment": assessment}),
    )? {
        super::describe::device(&device, &jobs, assessment.as_ref());
    }
    Ok(0)
}

/// `drover describe deployment NAME`.
pub async fn deployment(cli: &Cli, name: &str, output: &Output) -> Result<i32> {
    let described: drover_api::deployments::DeploymentDescription = client(cli)?
        .get(&format!("/deployments/{name}/describe"))
        .await?;
    if !structured(*output, &described)? {
        super::describe::deployment(&described);
    }
    Ok(0)
}

/// `drover logs DEVICE [JOB]`: the device's answer, printed as it comes.
pub async fn logs(
    cli: &Cli,
    device: &str,
    job: Option<&str>,
    tail: Option<u32>,
    wait: u64,
) -> Result<i32> {
    use std::io::Write;
    let mut query = vec![format!("wait={wait}")];
    if let Some(job) = job {
        query.push(format!("job={job}"));
    }
    if let Some(tail) = tail {
        query.push(format!("tail={tail}"));
    }
    let path = format!("/devices/{device}/logs?{}", query.join("&"));
    let mut response = client(cli)?.get_streamed(&path).await?;
    let mut stdout = std::io::stdout().lock();
    loop {
        match response.chunk().await {
            Ok(Some(bytes)) => stdout.write_all(&bytes)?,
            Ok(None) => break,
            Err(e) => {
                stdout.flush()?;
                anyhow::bail!("device {device}'s answer broke off: {e}");
            }
        }
    }
    stdout.flush()?;
    Ok(0)
}

/// `drover alerts`.
pub async fn alerts(cli: &Cli, output: &Output) -> Result<i32> {
    let alerts: drover_api::fleet::Alerts = client(cli)?.get("/alerts").await?;
    if !structured(*output, &alerts)? {
        super::describe::alerts(&alerts);
    }
    Ok(0)
}

/// `drover patch-status`.
pub async fn patch_status(cli: &Cli, output: &Output) -> Result<i32> {
    let fleet: drover_api::devices::PatchStatus = client(cli)?.get("/patch-status").await?;
    if !structured(*output, &fleet)? {
        super::describe::patch_status(&fleet);
    }
    Ok(0)
}
