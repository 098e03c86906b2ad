//! The arguments of `drover operators` and `drover audit` (issue 35).

use super::Output;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum OperatorsCommand {
    /// Every operator, its role and whether it is revoked.
    List {
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Add an operator and print its token (shown once, stored as a digest).
    Add {
        name: String,
        /// viewer: reads; operator: also applies, cancels, uploads; admin:
        /// also deletes and manages operators and devices' tokens.
        #[arg(long)]
        role: String,
    },
    /// Give an operator a new token; the old one and its dashboard
    /// sessions stop working at once.
    Rotate { name: String },
    /// Revoke an operator: its token and dashboard sessions are refused on
    /// every replica.
    Revoke { name: String },
}

#[derive(clap::Args)]
pub struct AuditArgs {
    /// Only entries since this time (RFC 3339) or age (30m, 24h, 7d).
    #[arg(long)]
    pub since: Option<String>,
    /// Only this operator's entries.
    #[arg(long)]
    pub operator: Option<String>,
    /// Only entries about this kind (TaskRun, Deployment, Device, Operator, …).
    #[arg(long)]
    pub kind: Option<String>,
    /// One JSON object per line (for a SIEM).
    #[arg(long, conflicts_with = "output")]
    pub jsonl: bool,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}
