//! drover: the control plane (`serve`) and the operators' CLI.

use agent_core::out;
use anyhow::{Context, Result, bail};
use drover::cli::{
    AlertsCommand, Cancelable, Cli, Command, Deletable, DeploymentsCommand, Described,
    PackagesCommand, RunsCommand, StoreKind,
};
use drover::client::ApiClient;
use drover::get::structured;
use drover::serve::{self, ServeOptions};
use drover_api::changes::Changed;
use serde_json::Value;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::error;

mod cmd;
mod secret_flags;

/// An ordinary error is one line with its whole cause chain, never a
/// backtrace or a `Caused by:` list.
fn main() {
    match run() {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("drover: {e:#}");
            std::process::exit(1);
        }
    }
}

/// The exit status after the embedded store refused a write on I/O
/// (EX_IOERR), as the agent's: a restart opens it again once there is space.
const EXIT_STORE_FAILED: i32 = 74;

fn run() -> Result<i32> {
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let cli =
        <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    for warning in secret_flags::secrets_on_command_line(&matches) {
        eprintln!("drover: warning: {warning}");
    }
    // A command prints what it did; only `serve` logs as it goes.
    agent_core::logging::init(if matches!(cli.command, Command::Serve { .. }) {
        "info"
    } else {
        "warn"
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(dispatch(cli))
}

fn client(cli: &Cli) -> Result<ApiClient> {
    let path = drover::context::config_path();
    let config = drover::context::CliConfig::load(&path)?;
    let target = drover::context::resolve(
        &config,
        &path,
        cli.server.as_deref(),
        cli.ca_file.as_deref(),
        cli.token.as_deref(),
        cli.context.as_deref(),
    )?;
    let token = match (&target.token, &target.token_file) {
        (Some(token), _) if token.trim().is_empty() => {
            bail!("the operator token given (--token or DROVER_TOKEN) is empty")
        }
        (Some(token), _) => token.clone(),
        (None, Some(file)) => drover::context::read_token_file(file)?,
        (None, None) => std::fs::read_to_string(cli.data.join("operator.token"))
            .map(|t| t.trim().to_owned())
            .with_context(|| {
                format!(
                    "no operator token: pass --token, set DROVER_TOKEN, use a context with a \
                     token file (`drover config set-context`), or point --data at the control \
                     plane's directory ({} was not readable)",
                    cli.data.join("operator.token").display()
                )
            })?,
    };
    ApiClient::new(&target.server, &token, target.ca_file.as_deref())
}

async fn dispatch(cli: Cli) -> Result<i32> {
    match &cli.command {
        Command::Serve {
            offline_alert_minutes,
            security_alert_days,
            reboot_alert_hours,
            package_quota,
            upload_stall_seconds,
            audit_retention_days,
            listen,
            agent_listen,
            agent_tls_cert,
            agent_tls_key,
            api_tls_cert,
            api_tls_key,
            api_allow_plaintext,
            ack_timeout_seconds,
            pass_interval_ms,
            max_agent_connections,
            download_listen,
            download_url,
            ready_file,
            nats,
            mqtt,
            store,
        } => {
            let shutdown = CancellationToken::new();
            let started = serve::start(
                ServeOptions {
                    data: cli.data.clone(),
                    listen: *listen,
                    agent_listen: *agent_listen,
                    agent_tls: agent_tls_cert.clone().zip(agent_tls_key.clone()),
                    api_tls: api_tls_cert.clone().zip(api_tls_key.clone()),
                    api_allow_plaintext: *api_allow_plaintext,
                    ack_timeout: Duration::from_secs(*ack_timeout_seconds),
                    pass_interval: Duration::from_millis(*pass_interval_ms),
                    operator_token: cli.token.clone(),
                    nats: nats.settings(),
                    store_on_nats: *store == StoreKind::Nats,
                    max_agent_connections: *max_agent_connections,
                    mqtt: mqtt.settings(),
                    mqtt_request_queue: mqtt.mqtt_request_queue,
                    download_listen: *download_listen,
                    download_url: download_url.clone(),
                    offline_alert: Duration::from_secs(offline_alert_minutes.saturating_mul(60)),
                    patch_alerts: drover_rules::patch::AlertLimits {
                        security_after: jiff::SignedDuration::from_hours(
                            i64::try_from(security_alert_days.saturating_mul(24))
                                .unwrap_or(i64::MAX / 3600),
                        ),
                        reboot_after: jiff::SignedDuration::from_hours(
                            i64::try_from(*reboot_alert_hours).unwrap_or(i64::MAX / 3600),
                        ),
                    },
                    uploads: drover_server::packages::UploadLimits {
                        quota: *package_quota,
                        stall: Duration::from_secs(*upload_stall_seconds),
                    },
                    audit_retention: Duration::from_secs(
                        audit_retention_days.saturating_mul(86_400),
                    ),
                },
                shutdown.clone(),
            )
            .await?;
            if let Some(path) = ready_file {
                let ready = serde_json::json!({"api": started.api_addr, "agents": started.agent_addr, "downloads": started.download_addr, "downloadUrl": started.download_url});
                let tmp = path.with_extension("tmp");
                std::fs::write(&tmp, ready.to_string())?;
                std::fs::rename(&tmp, path)?;
            }
            let code = tokio::select! {
                () = agent_core::shutdown::wait_for_signal() => 0,
                () = started.store_failed.notified() => {
                    error!(
                        data = %cli.data.display(),
                        "the data directory's file system refused a write (is it full?); \
                         exiting with EX_IOERR: the store takes no write until it is opened \
                         again, so free space there and start drover again (systemd does)"
                    );
                    EXIT_STORE_FAILED
                }
            };
            shutdown.cancel();
            for task in started.tasks {
                let _ = task.await;
            }
            Ok(code)
        }
        Command::Apply { file, dry_run } => {
            let text = if file.as_os_str() == "-" {
                let mut text = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                    .context("cannot read the manifests from standard input")?;
                text
            } else {
                std::fs::read_to_string(file)
                    .with_context(|| format!("cannot read {}", file.display()))?
            };
            if dry_run.is_some() {
                let previews = client(&cli)?.preview_text(&text).await?;
                let refused = cmd::preview::print(&previews);
                return Ok(if refused { 1 } else { 0 });
            }
            for result in client(&cli)?.apply_text(&text).await? {
                out!(
                    "{}/{} {}",
                    result.kind.name().to_lowercase(),
                    drover::watch::printable(&result.name),
                    result.result
                );
            }
            Ok(0)
        }
        Command::Get {
            resource,
            name,
            output,
            watch,
        } => {
            drover::get::get(&client(&cli)?, *resource, name.as_deref(), *output, *watch).await?;
            Ok(0)
        }
        Command::VerifyStore { path } => {
            agent_core::dbfile::verify(path).map_err(|e| anyhow::anyhow!(e))?;
            Ok(0)
        }
        Command::ResetStore { yes } => {
            let path = cli.data.join("drover.redb");
            // Refused at once while a serve holds it, before asking.
            drop(agent_core::dbfile::hold(&path)?);
            agent_core::confirm::confirm(
                &format!(
                    "Move {} aside? The next `drover serve` starts with an empty store: every \
                     device, run, deployment, schedule and job record in it is gone.",
                    path.display()
                ),
                *yes,
            )
            .map_err(|e| anyhow::anyhow!(e))?;
            let aside = agent_core::dbfile::move_aside(&path)?;
            out!("moved {} to {}", path.display(), aside.display());
            Ok(0)
        }
        Command::MqttConfig(args) => {
            // A wrong --data is named before anything is asked.
            drover_server::auth::require_state(&cli.data)?;
            let generations = cmd::brokers::generations(client(&cli), args.offline).await?;
            cmd::brokers::mqtt_config(&cli, args, &generations)
        }
        Command::IntentKey => {
            drover_server::auth::require_state(&cli.data)?;
            let signer = drover_server::auth::IntentSigner::load_or_create(&cli.data)?;
            out!("{}", signer.public_key());
            Ok(0)
        }
        Command::Init {
            tls_names,
            renew_tls,
            yes,
        } => {
            if *renew_tls && drover::init::has_tls(&cli.data) {
                agent_core::confirm::confirm(
                    &format!(
                        "Replace the CA and server certificate in {}? Every agent and \
                         operator that trusts the old CA refuses the new certificate until \
                         it is given the new tls/ca.pem.",
                        cli.data.display()
                    ),
                    *yes,
                )
                .map_err(|e| anyhow::anyhow!(e))?;
            }
            let done = drover::init::init(&cli.data, tls_names, *renew_tls)?;
            let data = cli.data.display();
            out!(
                "{data}: secret.key, operator.token and intent.key {}",
                if done.made_secrets {
                    "made (mode 0600)"
                } else {
                    "kept as they were"
                }
            );
            out!(
                "intent key (each agent's intent_public_keys): {}",
                done.intent_public_key
            );
            match &done.tls {
                Some((files, made)) => {
                    out!(
                        "TLS {}: serve with --agent-tls-cert {} --agent-tls-key {} \
                         (and --api-tls-cert/--api-tls-key the same for https)",
                        if *made { "made" } else { "kept" },
                        files.server_cert.display(),
                        files.server_key.display()
                    );
                    out!(
                        "each agent: copy {} to /etc/drover/ca.pem (its ca_file); operators: DROVER_CA_FILE={}",
                        files.ca_cert.display(),
                        files.ca_cert.display()
                    );
                }
                None => {
                    out!("no TLS files: pass --tls-name HOST to make a CA and a server certificate")
                }
            }
            Ok(0)
        }
        Command::Describe {
            resource: Described::Taskrun,
            name,
            output,
        } => {
            let api = client(&cli)?;
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
                cmd::describe::run(&run, &targets);
            }
            Ok(0)
        }
        Command::Alerts {
            command: Some(AlertsCommand::Ack { kind, resource }),
            ..
        } => {
            let request = drover_api::fleet::AckRequest {
                kind: kind.clone(),
                resource: resource.clone(),
            };
            client(&cli)?
                .post::<drover_api::fleet::AckAnswer>("/alerts/ack", &request)
                .await?;
            out!(
                "{} about {} acknowledged",
                drover::watch::printable(kind),
                drover::watch::printable(resource)
            );
            Ok(0)
        }
        Command::Alerts {
            command: None,
            output,
        } => {
            let alerts: drover_api::fleet::Alerts = client(&cli)?.get("/alerts").await?;
            if !structured(*output, &alerts)? {
                cmd::describe::alerts(&alerts);
            }
            Ok(0)
        }
        Command::Operators { command } => cmd::operators::operators(&client(&cli)?, command).await,
        Command::Audit(args) => cmd::operators::audit(&client(&cli)?, args).await,
        Command::PatchStatus { output } => {
            let fleet: drover_api::devices::PatchStatus =
                client(&cli)?.get("/patch-status").await?;
            if !structured(*output, &fleet)? {
                cmd::describe::patch_status(&fleet);
            }
            Ok(0)
        }
        Command::Describe {
            resource: Described::Device,
            name,
            output,
        } => {
            let api = client(&cli)?;
            let device: drover_api::devices::Device = api.get(&format!("/devices/{name}")).await?;
            let jobs: drover_api::devices::DeviceJobs =
                api.get(&format!("/devices/{name}/jobs")).await?;
            let assessment: Option<drover_api::devices::Assessment> = api
                .get_optional(&format!("/devices/{name}/assessment"))
                .await?;
            if !structured(
                *output,
                &serde_json::json!({"device": device, "jobs": jobs, "assessment": assessment}),
            )? {
                cmd::describe::device(&device, &jobs, assessment.as_ref());
            }
            Ok(0)
        }
        Command::Describe {
            resource: Described::Deployment,
            name,
            output,
        } => {
            let described: drover_api::deployments::DeploymentDescription = client(&cli)?
                .get(&format!("/deployments/{name}/describe"))
                .await?;
            if !structured(*output, &described)? {
                cmd::describe::deployment(&described);
            }
            Ok(0)
        }
        Command::Packages {
            command:
                PackagesCommand::Upload {
                    file,
                    stall_seconds,
                },
        } => {
            let stall = drover::upload::stall(*stall_seconds)?;
            let answer = drover::upload::upload(&client(&cli)?, file, stall).await?;
            out!(
                "package {} ({} bytes, sha256 {}) is in the store",
                drover::watch::printable(&answer.id),
                answer.size,
                drover::watch::printable(&answer.sha256)
            );
            Ok(0)
        }
        Command::Deployments {
            command: DeploymentsCommand::AddNewDevices { name },
        } => {
            let answer: Changed = client(&cli)?
                .post(
                    &format!("/deployments/{name}/add-new-devices"),
                    &Value::Null,
                )
                .await?;
            out!("deployment/{name} {}", answer.result);
            Ok(0)
        }
        Command::Cancel { resource, name } => {
            let path = match resource {
                Cancelable::Taskrun => format!("/taskruns/{name}/cancel"),
                Cancelable::Deployment => format!("/deployments/{name}/cancel"),
            };
            let answer: Changed = client(&cli)?.post(&path, &Value::Null).await?;
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
        Command::Delete { resource, name } => {
            let api = client(&cli)?;
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
        Command::Runs {
            command: RunsCommand::Watch { name },
        } => {
            let complete = drover::watch::watch(&client(&cli)?, name).await?;
            Ok(if complete { 0 } else { 1 })
        }
        Command::NatsConfig(args) => {
            // A wrong --data is named before anything is asked.
            drover_server::auth::require_state(&cli.data)?;
            let generations = cmd::brokers::generations(client(&cli), args.offline).await?;
            cmd::brokers::nats_config(&cli, args, &generations)
        }
        Command::Config { command } => cmd::config::config(&cli, command),
        Command::Token {
            device,
            unregistered,
            rotate,
        } => {
            let device = drover_model::DeviceId::new(device.clone())?;
            let secrets =
                drover_server::auth::Secrets::load_existing(&cli.data, cli.token.clone())?;
            let mut generation = 0;
            if *rotate {
                let answer: drover_api::devices::TokenRotated = client(&cli)?
                    .post(
                        &format!("/devices/{device}/rotate-token"),
                        &serde_json::json!({}),
                    )
                    .await?;
                generation = answer.token_generation;
                eprintln!(
                    "device {device}'s token rotated (generation {generation}): the one before is \
                     refused from now on; put this one in its agent's config (over MQTT or NATS, \
                     also make the broker's files again with mqtt-config or nats-config)"
                );
            } else if !unregistered {
                let api = client(&cli)?;
                match api
                    .get_optional::<drover_api::devices::Device>(&format!("/devices/{device}"))
                    .await
                {
                    Ok(Some(record)) => {
                        generation = record.token_generation.unwrap_or(0);
                    }
                    Ok(None) => bail!(
                        "device {device} is not registered: apply its Device manifest first \
                         (`drover apply -f`), or pass --unregistered"
                    ),
                    Err(e) => bail!(
                        "cannot check that device {device} is registered: {e:#}; pass \
                         --unregistered to print its token anyway"
                    ),
                }
            }
            out!("{}", secrets.device_token_at(&device, generation));
            Ok(0)
        }
        #[cfg(feature = "demo")]
        Command::Demo {
            agents,
            keep,
            agent_bin,
            upgrade,
        } => {
            let complete = drover::demo::run(drover::demo::DemoOptions {
                agents: *agents,
                keep: *keep,
                agent_bin: agent_bin.clone(),
                upgrade: *upgrade,
            })
            .await?;
            Ok(if complete { 0 } else { 1 })
        }
        #[cfg(not(feature = "demo"))]
        Command::Demo { .. } => bail!(
            "this drover was built without the demo (the packaged one carries no test roots); \
             run it from a source checkout with `bash scripts/demo.sh`, which builds \
             drover with `--features demo`"
        ),
    }
}
