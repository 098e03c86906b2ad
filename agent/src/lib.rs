//! drover-agent's command-line definitions (the daemon itself is the
//! binary): shared with the generator of its man page and completions.

pub mod cli;
