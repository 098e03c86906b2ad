//! Drover's reference control plane: the embedded store, the device
//! registry, TaskRuns with frozen plans and canary-first release, the agents'
//! WebSocket endpoint and the operators' API. `main.rs` is its CLI.

pub mod agents;
pub mod api;
pub mod auth;
pub mod client;
pub mod demo;
pub mod engine;
pub mod hub;
pub mod intake;
pub mod manifest;
pub mod nats_agents;
pub mod placement;
pub mod records;
pub mod rollout;
pub mod serve;
pub mod store;
pub mod store_nats;
pub mod stored;
pub mod watch;
