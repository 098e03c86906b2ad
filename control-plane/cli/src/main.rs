//! drover: the control plane (`serve`) and the operators' CLI.

use agent_core::out;
use anyhow::{Context, Result};
use cmd::client;
use drover::cli::{
    AlertsCommand, Cli, Command, DeploymentsCommand, Described, PackagesCommand, RunsCommand,
};

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

fn run() -> Result<i32> {
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let cli =
        <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    for warning in secret_flags::secrets_on_command_line(&matches) {
        eprintln!("drover: warning: {warning}");
    }
    // A command prints what it did; only `serve` logs as it goes.
    agent_core::logging::init(if matches!(cli.command, Command::Serve(_)) {
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

async fn dispatch(cli: Cli) -> Result<i32> {
    match &cli.command {
        Command::Serve(args) => cmd::serve::serve(&cli, args).await,
        Command::Apply { file, dry_run } => {
            cmd::changes::apply(&cli, file, dry_run.is_some()).await
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
        Command::ResetStore { yes } => cmd::setup::reset_store(&cli, yes),
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
        } => cmd::setup::init(&cli, tls_names, renew_tls, yes),
        Command::Describe {
            resource: Described::Taskrun,
            name,
            output,
        } => cmd::show::taskrun(&cli, name, output).await,
        Command::Alerts {
            command: Some(AlertsCommand::Ack { kind, resource }),
            ..
        } => cmd::changes::acknowledge(&cli, kind, resource).await,
        Command::Alerts {
            command: None,
            output,
        } => cmd::show::alerts(&cli, output).await,
        Command::Operators { command } => cmd::operators::operators(&client(&cli)?, command).await,
        Command::EnrollmentTokens { command } => {
            cmd::enrollment::tokens(&client(&cli)?, command).await
        }
        Command::Devices { command } => cmd::enrollment::devices(&client(&cli)?, command).await,
        Command::Audit(args) => cmd::operators::audit(&client(&cli)?, args).await,
        Command::Logs {
            device,
            job,
            tail,
            wait,
        } => cmd::show::logs(&cli, device, job.as_deref(), *tail, *wait).await,
        Command::PatchStatus { output } => cmd::show::patch_status(&cli, output).await,
        Command::Describe {
            resource: Described::Device,
            name,
            output,
        } => cmd::show::device(&cli, name, output).await,
        Command::Describe {
            resource: Described::Deployment,
            name,
            output,
        } => cmd::show::deployment(&cli, name, output).await,
        Command::Packages {
            command:
                PackagesCommand::Upload {
                    file,
                    stall_seconds,
                },
        } => cmd::changes::upload(&cli, file, *stall_seconds).await,
        Command::Deployments {
            command: DeploymentsCommand::AddNewDevices { name },
        } => cmd::changes::add_new_devices(&cli, name).await,
        Command::Cancel { resource, name } => cmd::changes::cancel(&cli, resource, name).await,
        Command::Delete { resource, name } => cmd::changes::delete(&cli, resource, name).await,
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
        } => cmd::setup::token(&cli, device, unregistered, rotate).await,
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
        Command::Demo { .. } => anyhow::bail!(
            "this drover was built without the demo (the packaged one carries no test roots); \
             run it from a source checkout with `bash scripts/demo.sh`, which builds \
             drover with `--features demo`"
        ),
    }
}
