//! Drover's reference control plane: the embedded store, the device
//! registry, TaskRuns with frozen plans and canary-first release, one
//! delivery core under every transport's agent link, and the operators'
//! API. `main.rs` is its CLI. No wire library is used here: the transports'
//! server sides plug in through `drover-contract`.

pub mod alerts;
pub mod api;
pub mod auth;
pub mod cli;
pub mod client;
pub mod debcontrol;
#[cfg(feature = "demo")]
pub mod demo;
pub mod dispatch;
pub mod engine;
pub mod get;
pub mod init;
pub mod listen;
pub mod manifest;
pub mod metrics;
pub mod packages;
pub mod secrets;
pub mod serve;
pub mod ui;
pub mod watch;

// The rules live in their own crate (control-plane/rules); their modules
// keep their paths here.
pub use drover_rules::{delivery, deployment, placement, records, rollout, schedule, strict_json};
// So does the store (control-plane/store).
pub use drover_store::{db, store, stored};
