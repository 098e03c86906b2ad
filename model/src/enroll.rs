//! Enrollment and key sessions on the wire (issue 55). A device proves its
//! Ed25519 key by signing a fresh challenge from the control plane, so
//! nothing it sends can be replayed and no clock is needed (a Raspberry
//! Pi has no real-time clock before NTP). Each signed message names its
//! purpose, the device and the challenge, so a signature made for one
//! purpose is worth nothing for another.
//!
//! Over WebSocket: the agent opens `/agent/v1/enroll/DEVICE` or (with
//! `Authorization: Drover-Key PUBLIC-KEY`) `/agent/v1/ws/DEVICE`; the control plane's
//! first frame is a [`ServerFrame::Challenge`]; the agent answers with an
//! [`AgentFrame::Enroll`] or an [`AgentFrame::Proof`].

use crate::DeviceId;
use crate::signing::unhex;
use ring::signature::{ED25519, UnparsedPublicKey};
use serde::{Deserialize, Serialize};

/// A challenge's bytes (hex on the wire).
pub const CHALLENGE_BYTES: usize = 32;
/// The longest an enrollment frame may be: a few hundred bytes of keys and
/// a short inventory; anything longer is refused unread.
pub const MAX_ENROLL_FRAME: usize = 4096;

/// A fresh challenge (hex): 32 random bytes from the system's source.
pub fn new_challenge() -> Option<String> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; CHALLENGE_BYTES];
    ring::rand::SystemRandom::new().fill(&mut bytes).ok()?;
    Some(crate::signing::hex(&bytes))
}

/// Something that holds a device's private key and signs with it (the
/// agent's `identity::DeviceKey`); the transports see only this.
pub trait Signer: Send + Sync {
    /// The public key, hex.
    fn public_key(&self) -> String;
    fn sign(&self, message: &[u8]) -> Vec<u8>;
}

/// What the agent signs to enroll `public_key` as `device`.
pub fn enroll_message(device: &DeviceId, public_key: &str, challenge: &str) -> Vec<u8> {
    format!("drover-enroll:v1:{device}:{public_key}:{challenge}").into_bytes()
}

/// What the agent signs to open a session as `device`.
pub fn session_message(device: &DeviceId, challenge: &str) -> Vec<u8> {
    format!("drover-session:v1:{device}:{challenge}").into_bytes()
}

/// What the agent signs for its password at a broker (issue 55): over
/// MQTT the device logs in with its id and this signature (hex), which
/// the control plane checks against the key and hands to the broker, and
/// keeps nowhere. Ed25519 signs deterministically, so it is the same at
/// every start; only the device's key can make it.
pub fn broker_password_message(device: &DeviceId, public_key: &str) -> Vec<u8> {
    format!("drover-broker-password:v1:{device}:{public_key}").into_bytes()
}

/// The device's broker password: its key's signature over
/// [`broker_password_message`], hex.
pub fn key_broker_password(signer: &dyn Signer, device: &DeviceId) -> String {
    crate::signing::hex(&signer.sign(&broker_password_message(device, &signer.public_key())))
}

/// Whether `signature` (hex) is `public_key`'s (hex, 32 bytes) over
/// `message`. Malformed hex is a failed check, never a panic.
pub fn verify(public_key: &str, message: &[u8], signature: &str) -> bool {
    let (Some(key), Some(signature)) = (unhex(public_key), unhex(signature)) else {
        return false;
    };
    key.len() == 32
        && UnparsedPublicKey::new(&ED25519, key)
            .verify(message, &signature)
            .is_ok()
}

/// What a device says of itself when it asks to join.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    #[serde(default)]
    pub hostname: Option<String>,
    #[serde(default)]
    pub os_release: Option<String>,
    #[serde(default)]
    pub architecture: Option<String>,
    #[serde(default)]
    pub agent_version: Option<String>,
}

/// From the control plane to a device that enrolls or proves its key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum ServerFrame {
    /// Sign this (hex): the first frame.
    Challenge { challenge: String },
    /// The enrollment's answer: `accepted` (connect with the key now) or
    /// `pending` (an operator decides; ask again later).
    Enrollment { state: String, message: String },
    /// Refused, and why.
    Refused { message: String },
}

/// From a device that enrolls or proves its key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum AgentFrame {
    #[serde(rename_all = "camelCase")]
    Enroll {
        device_id: DeviceId,
        public_key: String,
        /// The enrollment token; empty when the key is already known.
        token: String,
        #[serde(default)]
        inventory: Inventory,
        /// Over [`enroll_message`].
        signature: String,
    },
    /// Over [`session_message`].
    Proof { signature: String },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signing::hex;
    use ring::signature::{Ed25519KeyPair, KeyPair};

    #[test]
    fn a_signature_holds_for_its_purpose_device_and_challenge_only() {
        let seed = [7u8; 32];
        let pair = Ed25519KeyPair::from_seed_unchecked(&seed).expect("key");
        let public = hex(pair.public_key().as_ref());
        let device = DeviceId::new("pi-1").expect("id");
        let other = DeviceId::new("pi-2").expect("id");
        let message = session_message(&device, "00ff");
        let signature = hex(pair.sign(&message).as_ref());
        assert!(verify(&public, &message, &signature));
        assert!(!verify(
            &public,
            &session_message(&other, "00ff"),
            &signature
        ));
        assert!(!verify(
            &public,
            &session_message(&device, "00fe"),
            &signature
        ));
        assert!(!verify(
            &public,
            &enroll_message(&device, &public, "00ff"),
            &signature
        ));
        assert!(!verify(&"ab".repeat(32), &message, &signature));
        assert!(!verify("zz", &message, &signature));
        assert!(!verify(&public, &message, "not hex"));
        assert!(!verify(&public[..62], &message, &signature));
    }

    #[test]
    fn frames_read_as_documented() {
        let frame: AgentFrame = serde_json::from_str(
            r#"{"type":"enroll","deviceId":"pi-1","publicKey":"ab","token":"t","signature":"cd"}"#,
        )
        .expect("enroll");
        assert!(
            matches!(frame, AgentFrame::Enroll { ref inventory, .. } if *inventory == Inventory::default())
        );
        let frame: ServerFrame =
            serde_json::from_str(r#"{"type":"challenge","challenge":"00"}"#).expect("challenge");
        assert_eq!(
            frame,
            ServerFrame::Challenge {
                challenge: "00".into()
            }
        );
        assert!(serde_json::from_str::<AgentFrame>(r#"{"type":"launch"}"#).is_err());
        assert!(
            serde_json::from_str::<AgentFrame>(r#"{"type":"enroll","deviceId":"../x"}"#).is_err()
        );
    }
}
