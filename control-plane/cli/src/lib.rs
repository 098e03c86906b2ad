//! Drover's CLI, `drover`: the commands' definitions (`cli`), the API
//! client, listings and `-w` (`get`, `watch`), `init`, the demo behind
//! its default-off feature, and the composition root: `serve` wires the
//! server (control-plane/server) to the store, the transports' agent links
//! and the HTTP listeners (`listen`). `main.rs` runs them. The layers below
//! are re-exported under their old paths (`drover::records`, …).

pub mod cli;
pub mod client;
pub mod context;
#[cfg(feature = "demo")]
pub mod demo;
pub mod devices;
pub mod get;
pub mod init;
pub mod listen;
pub mod serve;
pub mod table;
pub mod upload;
pub mod watch;

pub use drover_rules::{delivery, deployment, placement, records, rollout, schedule, strict_json};
pub use drover_server::api::ui;
pub use drover_server::{
    alerts, api, auth, debcontrol, dispatch, engine, http, manifest, metrics, packages, secrets,
};
pub use drover_store::{db, store, stored};
