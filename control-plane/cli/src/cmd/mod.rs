//! The `drover` binary's commands that are more than a call of the library.

pub mod brokers;
pub mod config;
pub mod describe;
pub mod operators;
pub mod preview;
