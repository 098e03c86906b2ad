//! The control plane's store: typed access with compare-and-set and the
//! change feed (`db`), the records' versioned on-disk layouts with their
//! byte fixtures (`stored`), and the embedded back ends (`store`: redb,
//! and memory for tests; the JetStream KV one lives with the NATS
//! transport). It knows the rules' records and nothing of the server.

pub mod db;
pub mod store;
pub mod stored;

// The records whose layouts this crate keeps, under the paths the moved
// modules use.
use drover_rules::{deployment, enrollment, history, patch, records, schedule};
