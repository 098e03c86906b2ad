//! Drover's CLI, `drover`: the commands' definitions (`cli`), the API
//! client, listings and `-w` (`get`, `watch`), `init`, and the demo behind
//! its default-off feature. `main.rs` runs them; `drover serve` runs the
//! server (control-plane/server). The layers below are re-exported under
//! their old paths (`drover::records`, `drover::serve`, …).

pub mod cli;
pub mod client;
pub mod context;
#[cfg(feature = "demo")]
pub mod demo;
pub mod devices;
pub mod get;
pub mod init;
pub mod table;
pub mod upload;
pub mod watch;

pub use drover_rules::{delivery, deployment, placement, records, rollout, schedule, strict_json};
pub use drover_server::api::ui;
pub use drover_server::{
    alerts, api, auth, debcontrol, dispatch, engine, http, listen, manifest, metrics, packages,
    secrets, serve,
};
pub use drover_store::{db, store, stored};
