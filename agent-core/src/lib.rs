//! Drover's device-side core (the job model it runs is `drover-model`): the
//! durable job store, the sequential executor that runs step chains, boot
//! tracking and the local status socket. It does no network I/O: transports
//! turn bytes into calls on [`executor::Agent`].

pub mod assessments;
pub mod backoff;
pub mod boot;
pub mod chain;
pub mod clock;
pub mod confirm;
pub mod dbfile;
pub mod durable;
pub mod executor;
pub mod facts;
pub mod identity;
pub mod inventory;
pub mod job_logs;
pub mod journal;
pub mod lifecycle;
pub mod logging;
pub mod report;
pub mod shutdown;
pub mod status_socket;
pub mod store;
#[cfg(test)]
mod store_fixtures;
#[cfg(feature = "sled-store")]
pub mod store_sled;

/// `println!` for command-line tools: ends the process quietly when stdout
/// was closed (a pager, `head` or `grep -q` went away) instead of panicking
/// on the broken pipe.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout().lock(), $($arg)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
        }
    }};
}
