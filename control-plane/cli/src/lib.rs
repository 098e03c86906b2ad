//! Drover's CLI, `drover`: the commands' definitions (`cli`), the API
//! client, listings and `-w` (`get`, `watch`), `init`, the demo behind
//! its default-off feature, and the composition root: `serve` wires the
//! server (control-plane/server) to the store, the transports' agent links
//! and the HTTP listeners (`listen`). `main.rs` runs them. Code of the
//! layers below is named by its own crate (`drover_rules::records`, …).

pub mod agent_config;
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
