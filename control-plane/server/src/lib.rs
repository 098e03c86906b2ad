//! Drover's control-plane server: the engine that plans runs and passes
//! deployments and schedules (`engine`), the delivery core under every
//! transport's agent link (`dispatch`), the operators' API (`api`), the
//! dashboard (`ui`), metrics, credentials and keys (`auth`), packages and
//! secrets. No wire library is used here: the transports' server sides
//! plug in through `drover-contract`, and the wiring of transports,
//! listeners and the store (`drover::serve`) lives in the binary's crate.
//! It may not know the CLI.

pub mod alerts;
pub mod api;
pub mod audit;
pub mod auth;
pub mod debcontrol;
pub mod device_tokens;
pub mod dispatch;
pub mod engine;
pub mod enroll_limits;
pub mod enrollment;
pub mod history;
pub mod http;
pub mod kinds;
pub mod manifest;
pub mod metrics;
pub mod packages;
pub mod patch_index;
pub mod patch_labels;
pub mod secrets;
