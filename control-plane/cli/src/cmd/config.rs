//! `drover config`: the CLI's contexts (see `drover::context`).

use agent_core::out;
use anyhow::{Result, bail};
use drover::cli::{Cli, ConfigCommand};
use drover::context::{CliConfig, Context, absolute, config_path, read_token_file};
use drover::watch::printable;

pub fn config(cli: &Cli, command: &ConfigCommand) -> Result<i32> {
    let path = config_path();
    let mut config = CliConfig::load(&path)?;
    match command {
        ConfigCommand::SetContext {
            name,
            token_file,
            use_it,
        } => {
            let Some(server) = &cli.server else {
                bail!("set-context needs the API's address: --server https://HOST:7180");
            };
            let ca_file = &cli.ca_file;
            if name.is_empty() || name.chars().any(|c| c.is_control() || c.is_whitespace()) {
                bail!("a context's name is one word of printable characters, not {name:?}");
            }
            reqwest::Url::parse(server)
                .map_err(|e| anyhow::anyhow!("--server {server:?} is not a URL: {e}"))?;
            let ca_file = ca_file.as_deref().map(absolute).transpose()?;
            if let Some(ca) = &ca_file {
                std::fs::metadata(ca).map_err(|e| {
                    anyhow::anyhow!("cannot read the CA file {}: {e}", ca.display())
                })?;
            }
            let token_file = token_file.as_deref().map(absolute).transpose()?;
            if let Some(file) = &token_file {
                read_token_file(file)?;
            }
            let existed = config
                .contexts
                .insert(
                    name.clone(),
                    Context {
                        server: server.clone(),
                        ca_file,
                        token_file,
                    },
                )
                .is_some();
            if *use_it || config.current_context.is_none() {
                config.current_context = Some(name.clone());
            }
            config.save(&path)?;
            out!(
                "context {} {} in {}{}",
                printable(name),
                if existed { "changed" } else { "made" },
                path.display(),
                if config.current_context.as_deref() == Some(name) {
                    " (current)"
                } else {
                    ""
                }
            );
        }
        ConfigCommand::UseContext { name } => {
            config.context(name, &path)?;
            config.current_context = Some(name.clone());
            config.save(&path)?;
            out!("the current context is {}", printable(name));
        }
        ConfigCommand::GetContexts => {
            let mut rows =
                drover::get::table(&["CURRENT", "NAME", "SERVER", "CA FILE", "TOKEN FILE"]);
            for (name, context) in &config.contexts {
                let shown = |p: &Option<std::path::PathBuf>| {
                    p.as_ref()
                        .map(|p| printable(&p.display().to_string()))
                        .unwrap_or_else(|| "-".into())
                };
                rows.add_row(vec![
                    if config.current_context.as_deref() == Some(name) {
                        "*".to_owned()
                    } else {
                        String::new()
                    },
                    printable(name),
                    printable(&context.server),
                    shown(&context.ca_file),
                    shown(&context.token_file),
                ]);
            }
            drover::get::print_table(&rows);
        }
        ConfigCommand::CurrentContext => match &config.current_context {
            Some(name) => out!("{}", printable(name)),
            None => bail!(
                "no current context in {}; `drover config set-context NAME --server URL` makes one",
                path.display()
            ),
        },
        ConfigCommand::DeleteContext { name } => {
            if config.contexts.remove(name).is_none() {
                config.context(name, &path)?;
            }
            if config.current_context.as_deref() == Some(name) {
                config.current_context = None;
            }
            config.save(&path)?;
            out!("context {} deleted", printable(name));
        }
    }
    Ok(0)
}
