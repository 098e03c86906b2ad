//! The CLI's contexts, as kubeconfig or `mender-cli login` keep them: a
//! named control plane (its API's address, the CA to trust, the file that
//! holds the operator token) chosen once with `drover config use-context`,
//! so a remote operator does not export three variables, token included,
//! in every shell. The config keeps the token file's path, never the token.
//!
//! Where a setting comes from, first match wins: the flag or its
//! environment variable; then the context (`--context`/`DROVER_CONTEXT`,
//! else the current one, unless `--server`/`DROVER_SERVER` names another
//! server); then the defaults (http://127.0.0.1:7180, DATA/operator.token).

use anyhow::{Context as _, Result, bail};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The API's address when nothing names one.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:7180";

/// `~/.config/drover/config.toml`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct CliConfig {
    #[serde(default)]
    pub current_context: Option<String>,
    #[serde(default)]
    pub contexts: BTreeMap<String, Context>,
}

/// One control plane as an operator reaches it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Context {
    pub server: String,
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    #[serde(default)]
    pub token_file: Option<PathBuf>,
}

/// Where the config lives: `DROVER_CONFIG`, else
/// `$XDG_CONFIG_HOME/drover/config.toml`, else `~/.config/drover/config.toml`.
pub fn config_path() -> PathBuf {
    if let Some(path) = std::env::var_os("DROVER_CONFIG").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("drover/config.toml")
}

impl CliConfig {
    /// The config at `path`; an absent file is an empty config.
    pub fn load(path: &Path) -> Result<Self> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        toml::from_str(&text).map_err(|e| {
            let first = e.to_string();
            let first = first.lines().next().unwrap_or("").trim();
            anyhow::anyhow!("{} is not a drover CLI config: {first}", path.display())
        })
    }

    /// Writes the config (mode 0600, its directory 0700), replacing the
    /// file in one rename.
    pub fn save(&self, path: &Path) -> Result<()> {
        use std::io::Write;
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let text = self.to_toml();
        let tmp = path.with_extension("toml.new");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
    }

    /// The config as TOML. Written by hand: its shape is fixed, and JSON's
    /// string escapes are TOML's basic strings, so the agent's TOML parser
    /// needs no writer linked in beside it (the two are built together).
    fn to_toml(&self) -> String {
        let quoted = |text: &str| serde_json::Value::from(text).to_string();
        let mut text = String::new();
        if let Some(current) = &self.current_context {
            text.push_str(&format!("current-context = {}\n", quoted(current)));
        }
        for (name, context) in &self.contexts {
            text.push_str(&format!("\n[contexts.{}]\n", quoted(name)));
            text.push_str(&format!("server = {}\n", quoted(&context.server)));
            for (key, path) in [
                ("ca-file", &context.ca_file),
                ("token-file", &context.token_file),
            ] {
                if let Some(path) = path {
                    text.push_str(&format!(
                        "{key} = {}\n",
                        quoted(&path.display().to_string())
                    ));
                }
            }
        }
        text
    }

    /// The context `name`, or a sentence saying there is none.
    pub fn context(&self, name: &str, path: &Path) -> Result<&Context> {
        self.contexts.get(name).with_context(|| {
            format!(
                "no context {name:?} in {}; `drover config get-contexts` lists them",
                path.display()
            )
        })
    }
}

/// The settings a command reaches the API with, once resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub server: String,
    pub ca_file: Option<PathBuf>,
    /// A token given on the command line or in the environment.
    pub token: Option<String>,
    pub token_file: Option<PathBuf>,
    /// The context used, if any.
    pub context: Option<String>,
}

/// Resolves the flags (and their environment variables) against `config`.
pub fn resolve(
    config: &CliConfig,
    path: &Path,
    server: Option<&str>,
    ca_file: Option<&Path>,
    token: Option<&str>,
    context: Option<&str>,
) -> Result<Target> {
    let chosen = match (context, server) {
        (Some(name), _) => Some(name.to_owned()),
        // A server named on its own is reached without the current context.
        (None, Some(_)) => None,
        (None, None) => config.current_context.clone(),
    };
    let found = match &chosen {
        Some(name) => Some(config.context(name, path)?.clone()),
        None => None,
    };
    Ok(Target {
        server: server
            .map(str::to_owned)
            .or_else(|| found.as_ref().map(|c| c.server.clone()))
            .unwrap_or_else(|| DEFAULT_SERVER.to_owned()),
        ca_file: ca_file
            .map(Path::to_path_buf)
            .or_else(|| found.as_ref().and_then(|c| c.ca_file.clone())),
        token: token.map(str::to_owned),
        token_file: found.as_ref().and_then(|c| c.token_file.clone()),
        context: chosen,
    })
}

/// Reads a token file: it must hold a token and be readable by its owner
/// alone (like ssh's keys: a token others can read is a leaked one).
pub fn read_token_file(path: &Path) -> Result<String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path)
        .with_context(|| format!("cannot read the token file {}", path.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        bail!(
            "the token file {} is readable by others (mode {mode:o}); chmod 600 it",
            path.display()
        );
    }
    let token = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the token file {}", path.display()))?;
    let token = token.trim();
    if token.is_empty() {
        bail!("the token file {} is empty", path.display());
    }
    Ok(token.to_owned())
}

/// An absolute form of a path given on the command line, so a context
/// works from any directory.
pub fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("cannot resolve {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> CliConfig {
        let mut config = CliConfig {
            current_context: Some("prod".into()),
            ..Default::default()
        };
        config.contexts.insert(
            "prod".into(),
            Context {
                server: "https://prod.example.org:7180".into(),
                ca_file: Some("/etc/drover/prod-ca.pem".into()),
                token_file: Some("/home/op/.config/drover/prod.token".into()),
            },
        );
        config.contexts.insert(
            "lab".into(),
            Context {
                server: "https://lab.example.org:7180".into(),
                ca_file: None,
                token_file: None,
            },
        );
        config
    }

    #[test]
    fn flags_then_the_context_then_the_defaults() {
        let path = Path::new("config.toml");
        let current = resolve(&config(), path, None, None, None, None).expect("current");
        assert_eq!(current.server, "https://prod.example.org:7180");
        assert_eq!(
            current.ca_file.as_deref(),
            Some(Path::new("/etc/drover/prod-ca.pem"))
        );
        assert_eq!(current.context.as_deref(), Some("prod"));
        let named = resolve(&config(), path, None, None, None, Some("lab")).expect("lab");
        assert_eq!(named.server, "https://lab.example.org:7180");
        assert_eq!(named.token_file, None);
        // A server named on its own leaves the current context out.
        let other = resolve(&config(), path, Some("https://x:1"), None, None, None).expect("x");
        assert_eq!(
            (other.ca_file, other.token_file, other.context),
            (None, None, None)
        );
        // With --context too, the flag wins where it is given.
        let both = resolve(
            &config(),
            path,
            Some("https://x:1"),
            None,
            Some("t"),
            Some("prod"),
        )
        .expect("both");
        assert_eq!(both.server, "https://x:1");
        assert_eq!(both.token.as_deref(), Some("t"));
        assert!(both.token_file.is_some());
        let none = resolve(&CliConfig::default(), path, None, None, None, None).expect("none");
        assert_eq!(none.server, DEFAULT_SERVER);
        let err = resolve(&config(), path, None, None, None, Some("nope")).expect_err("unknown");
        assert!(err.to_string().contains("no context \"nope\""), "{err}");
    }

    #[test]
    fn the_config_round_trips_and_a_bad_one_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("drover/config.toml");
        config().save(&path).expect("save");
        let read = CliConfig::load(&path).expect("load");
        assert_eq!(read.current_context.as_deref(), Some("prod"));
        assert_eq!(read.contexts, config().contexts);
        // Names and paths that need quoting survive the round trip.
        let mut odd = config();
        odd.contexts.insert(
            "a \"quoted\" \\ name".into(),
            Context {
                server: "https://x:1".into(),
                ca_file: Some("/tmp/with \"quotes\"/ca.pem".into()),
                token_file: None,
            },
        );
        odd.save(&path).expect("save");
        assert_eq!(CliConfig::load(&path).expect("load").contexts, odd.contexts);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        std::fs::write(&path, "current-context = 3\n").expect("write");
        let err = CliConfig::load(&path).expect_err("bad");
        assert!(
            err.to_string().contains("is not a drover CLI config"),
            "{err}"
        );
        assert_eq!(err.to_string().lines().count(), 1, "{err}");
    }
}
