//! The control plane's rules: its records and every decision made on them
//! that needs no I/O. Placement, rollout, deployments (targeting, windows,
//! the decide step), schedules, the delivery step and the cleaning of what
//! devices report are pure functions of their inputs and of the time they
//! are given; the caller reads the clock, the store and the network.
//! This crate's Cargo.toml has no tokio, store or HTTP dependency, and
//! clippy's `disallowed-methods` (its clippy.toml) keeps the wall clock out.

pub mod clean;
pub mod delivery;
pub mod deployment;
pub mod enrollment;
pub mod history;
pub mod outcome;
pub mod patch;
pub mod placement;
pub mod reasons;
pub mod records;
pub mod rollout;
pub mod schedule;
pub mod state;
pub mod strict_json;
pub mod unmatched;
