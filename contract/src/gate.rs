//! Who may come in at a transport's door (issue 55): a device's bearer
//! token (until it has a key), its accepted Ed25519 key, or an enrollment
//! request from a device that has neither. The transport issues the
//! challenge and carries the frames; the control plane judges.

use crate::BoxFuture;
use drover_model::DeviceId;
use drover_model::enroll::Inventory;

/// An enrollment request as a transport received it, with the challenge
/// the transport issued for it.
#[derive(Debug, Clone)]
pub struct EnrollRequest {
    pub device: DeviceId,
    pub public_key: String,
    pub token: String,
    pub inventory: Inventory,
    pub proof: Proof,
    pub peer: Option<std::net::IpAddr>,
}

/// How the request shows that the device holds the key it names.
#[derive(Debug, Clone)]
pub enum Proof {
    /// Its signature over `drover_model::enroll::enroll_message(device,
    /// public_key, challenge)`, the challenge the transport issued (WebSocket).
    Challenge {
        challenge: String,
        signature: String,
    },
    /// Its broker password, a signature over
    /// `drover_model::enroll::broker_password_message` (MQTT: no round trip
    /// before the request; a replay asks for exactly what the device asked).
    BrokerPassword(String),
}

/// What the device is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnrollAnswer {
    /// Its key opens its sessions now.
    Accepted,
    /// An operator decides; ask again later.
    Pending,
    Refused(String),
}

impl EnrollAnswer {
    /// The frame the device reads.
    pub fn frame(&self) -> drover_model::enroll::ServerFrame {
        use drover_model::enroll::ServerFrame;
        match self {
            EnrollAnswer::Accepted => ServerFrame::Enrollment {
                state: "accepted".into(),
                message: "this device's key is accepted".into(),
            },
            EnrollAnswer::Pending => ServerFrame::Enrollment {
                state: "pending".into(),
                message: "this device waits for an operator to accept it".into(),
            },
            EnrollAnswer::Refused(message) => ServerFrame::Refused {
                message: message.clone(),
            },
        }
    }
}

/// The control plane's judgement at a transport's door.
pub trait DeviceGate: Send + Sync + 'static {
    /// Whether `token` is `device`'s bearer token now (never once the
    /// device has an accepted key).
    fn token_opens(&self, device: &DeviceId, token: &str) -> bool;
    /// `device`'s accepted public key (hex), if it has one.
    fn key_of(&self, device: &DeviceId) -> Option<String>;
    /// The keys that were accepted and no longer are, with when (device,
    /// hex key, Unix seconds): what every broker must refuse, including
    /// one that missed the removal.
    fn revoked_keys(&self) -> BoxFuture<'static, Vec<(DeviceId, String, i64)>>;
    /// Decides an enrollment request and records what was decided.
    fn enroll(&self, request: EnrollRequest) -> BoxFuture<'static, EnrollAnswer>;
}
