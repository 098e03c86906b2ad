//! What Drover's network ends share beside any wire protocol: TLS set-up
//! for both ends ([`tls`]: rustls with the ring provider, the agent's
//! trust of a CA bundle, plain connections only to loopback) and the
//! admission of a listener's connections ([`admission`]: a bounded number
//! of pending slots per address while in their handshakes, established
//! slots after; it and the TLS acceptor behind the `server` feature), and
//! what was wrong with a server's certificate ([`certificate`]). The
//! WebSocket transport, the control plane's HTTP listeners, the CLI's
//! client and the agent's package downloads use them.

#[cfg(feature = "server")]
pub mod admission;
pub mod certificate;
pub mod tls;
