//! The agent's command line, in a library of its own so that the man page
//! and shell completions are generated from the very definitions the binary
//! parses (tests/tests/docs.rs).

use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// Where the agent reads its config unless told otherwise.
pub const DEFAULT_CONFIG: &str = "/etc/drover/agent.toml";

#[derive(Parser, Debug)]
#[command(name = "drover-agent", version, about = "Drover's device agent")]
pub struct Cli {
    /// The agent's config file.
    #[arg(long, global = true, env = "DROVER_AGENT_CONFIG", default_value = DEFAULT_CONFIG)]
    pub config: PathBuf,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the agent daemon.
    Run,
    /// Check the config file and say what it sets up.
    Check {
        /// Also connect to the control plane (or broker) with this device's
        /// token, and say whether it lets the device in. A running agent's
        /// connection is left alone.
        #[arg(long)]
        connect: bool,
    },
    /// Show the running agent's state (from its status socket).
    Status {
        #[arg(long)]
        json: bool,
        /// The status socket, if not the one in the config.
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Run a system upgrade now, as a local job of the running agent, and
    /// print each step as it finishes.
    Upgrade {
        /// Continue this failed local upgrade from its failed step instead.
        #[arg(long, value_name = "JOB_ID")]
        resume: Option<String>,
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Assess now, as a local job of the running agent: refresh apt's lists
    /// as an upgrade does, then print what a full upgrade would change
    /// (security updates first) and whether a reboot is pending. Installs
    /// nothing.
    Assess {
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Move a damaged or empty agent database aside; the agent then starts
    /// with a new, empty one (its jobs and unsent statuses are gone).
    /// Refused while an agent holds the database; asks first unless --yes.
    ResetStore {
        /// Do not ask: the database is moved aside (for scripts).
        #[arg(long)]
        yes: bool,
    },
    /// Check one agent database file (the agent runs this before opening it).
    #[command(hide = true)]
    VerifyStore { path: PathBuf },
    /// Print a job's output as this device keeps it: each apt and dpkg
    /// call of each step, its command and exit status, its stdout and
    /// stderr. The latest job's when no job is named.
    Logs {
        /// The job's id, or the start of it (as `drover-agent jobs` and
        /// `drover describe` show it).
        job: Option<String>,
        /// Only the last N lines.
        #[arg(long, value_name = "N")]
        tail: Option<usize>,
    },
    /// List recent jobs with their steps and errors.
    Jobs {
        #[arg(long)]
        json: bool,
        #[arg(long, default_value_t = 20)]
        limit: usize,
        #[arg(long)]
        socket: Option<PathBuf>,
    },
}
