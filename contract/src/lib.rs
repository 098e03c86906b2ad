//! The contracts between Drover's control plane and what plugs into it. An
//! agent link ([`link::AgentLinks`]) is one transport's server side: it
//! delivers and withdraws intents and turns whatever its wire carries into
//! one closed enum of inbound events. A store backend ([`kv::KvStore`]) keeps
//! the control plane's records under revision checks and reports every
//! change. The control plane knows these traits, never a wire library.

pub mod gate;
pub mod kv;
pub mod link;
pub mod logs;

use std::future::Future;
use std::pin::Pin;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
