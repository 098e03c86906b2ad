//! The `drover` binary's commands that are more than a call of the library.

pub mod brokers;
pub mod changes;
pub mod config;
pub mod describe;
pub mod enrollment;
pub mod operators;
pub mod preview;
pub mod serve;
pub mod setup;
pub mod show;

use anyhow::{Context, Result, bail};
use drover::cli::Cli;
use drover::client::ApiClient;

/// The API client for `cli`'s control plane: the server, CA and token from
/// the flags, the environment and the context, in that order.
pub fn client(cli: &Cli) -> Result<ApiClient> {
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
