//! Drover's WebSocket job protocol (the jobs seed), both ends of its wire
//! contract in one place: the message shapes ([`protocol`]), the agent's
//! client loop ([`client`]) and, behind the `server` feature, the control
//! plane's handshake ([`server`]) and its agent link ([`links`]). TLS and
//! connection admission are `drover-net`'s. docs/protocol.md
//! describes the protocol for other implementations.

pub mod client;
#[cfg(feature = "server")]
pub mod door;
pub mod enrolling;
#[cfg(feature = "server")]
pub mod links;
pub mod protocol;
#[cfg(feature = "server")]
pub mod server;

/// The path agents connect to; the device id follows it.
pub const AGENT_PATH_PREFIX: &str = "/agent/v1/ws/";
/// Where a device with no credential asks to join (issue 55).
pub const ENROLL_PATH_PREFIX: &str = "/agent/v1/enroll/";
/// The `Authorization` scheme of a device that names its public key (hex)
/// and proves it after the upgrade (a challenge, then its signature),
/// instead of a bearer token: `Drover-Key <public key>`.
pub const KEY_AUTHORIZATION: &str = "Drover-Key";
/// Sent by `drover-agent check --connect`: the server checks the token and
/// closes, without taking the device's session from its running agent.
pub const PROBE_HEADER: &str = "x-drover-probe";
/// Upper bound of one protocol message. Larger messages are refused with an
/// `error` message and the connection goes on.
pub const MAX_MESSAGE_BYTES: usize = 128 * 1024;
/// The WebSocket layer's own limit: a frame above this closes the connection.
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;

/// The WebSocket configuration both ends use.
pub fn ws_config() -> tokio_tungstenite::tungstenite::protocol::WebSocketConfig {
    tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_FRAME_BYTES))
        .max_frame_size(Some(MAX_FRAME_BYTES))
}
