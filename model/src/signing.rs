//! Intents signed by the control plane (A11). The control plane signs the
//! canonical form of each intent with its Ed25519 key and puts the
//! signature in the intent's `signature` field; the agent, which pins one or
//! two public keys in its config (two while a key is rolled over), checks it
//! before recording anything. A broker, a relay or a stolen device
//! credential can then not start a job on any device.
//!
//! The canonical form is the intent's JSON object without `signature`, keys
//! sorted, no white space: what both sides get from `serde_json` with its
//! default (sorted) maps, whatever fields a newer control plane adds.

use ring::signature::{ED25519, UnparsedPublicKey};
use serde_json::Value;

/// The intent field that carries the signature (hex of 64 bytes).
pub const SIGNATURE_FIELD: &str = "signature";

/// Why an intent's signature does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the intent is not signed; this agent runs only intents signed by its control plane")]
    Missing,
    #[error("the intent's signature is malformed: {0}")]
    Malformed(String),
    #[error("the intent's signature does not match any control-plane key this agent trusts")]
    Invalid,
    #[error(
        "this agent trusts no control-plane key (intent_public_keys in its config); it refuses every intent"
    )]
    NoKeys,
}

/// The canonical bytes of an intent: the object without its signature,
/// sorted keys, compact.
pub fn canonical(intent: &Value) -> Option<Vec<u8>> {
    let mut object = intent.as_object()?.clone();
    object.remove(SIGNATURE_FIELD);
    serde_json::to_vec(&Value::Object(object)).ok()
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The control-plane keys an agent trusts.
#[derive(Debug, Clone, Default)]
pub struct TrustedKeys {
    keys: Vec<Vec<u8>>,
}

impl TrustedKeys {
    /// Parses hex Ed25519 public keys (32 bytes each).
    pub fn from_hex(keys: &[String]) -> Result<Self, String> {
        let mut parsed = Vec::with_capacity(keys.len());
        for key in keys {
            match unhex(key.trim()) {
                Some(bytes) if bytes.len() == 32 => parsed.push(bytes),
                _ => {
                    return Err(format!(
                        "{key:?} is not an Ed25519 public key (64 hex digits); `drover intent-key` prints it"
                    ));
                }
            }
        }
        Ok(Self { keys: parsed })
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Checks an intent's signature against every trusted key.
    pub fn verify(&self, intent: &Value) -> Result<(), SignatureError> {
        if self.keys.is_empty() {
            return Err(SignatureError::NoKeys);
        }
        let signature = match intent.get(SIGNATURE_FIELD) {
            None | Some(Value::Null) => return Err(SignatureError::Missing),
            Some(Value::String(text)) => unhex(text)
                .filter(|s| s.len() == 64)
                .ok_or_else(|| SignatureError::Malformed("expected 128 hex digits".into()))?,
            Some(_) => return Err(SignatureError::Malformed("expected a string".into())),
        };
        let message = canonical(intent)
            .ok_or_else(|| SignatureError::Malformed("the intent is not an object".into()))?;
        let good = self.keys.iter().any(|key| {
            UnparsedPublicKey::new(&ED25519, key)
                .verify(&message, &signature)
                .is_ok()
        });
        if good {
            Ok(())
        } else {
            Err(SignatureError::Invalid)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::rand::SystemRandom;
    use ring::signature::{Ed25519KeyPair, KeyPair};

    fn keypair() -> Ed25519KeyPair {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).expect("generate");
        Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("parse")
    }

    fn signed(key: &Ed25519KeyPair, mut intent: Value) -> Value {
        let signature = key.sign(&canonical(&intent).expect("canonical"));
        intent[SIGNATURE_FIELD] = Value::String(hex(signature.as_ref()));
        intent
    }

    #[test]
    fn signatures_table() {
        let ours = keypair();
        let next = keypair();
        let theirs = keypair();
        let trusted = TrustedKeys::from_hex(&[
            hex(ours.public_key().as_ref()),
            hex(next.public_key().as_ref()),
        ])
        .expect("keys");
        let intent = serde_json::json!({"jobId": "j", "deviceId": "d", "attempt": 1});
        let mut tampered = signed(&ours, intent.clone());
        tampered["attempt"] = 2.into();
        let mut reordered = serde_json::Map::new();
        for (k, v) in signed(&ours, intent.clone())
            .as_object()
            .expect("object")
            .iter()
            .rev()
        {
            reordered.insert(k.clone(), v.clone());
        }
        let cases: Vec<(&str, Value, Result<(), SignatureError>)> = vec![
            (
                "signed by the current key",
                signed(&ours, intent.clone()),
                Ok(()),
            ),
            (
                "signed by the next key (rollover)",
                signed(&next, intent.clone()),
                Ok(()),
            ),
            ("keys in another order", Value::Object(reordered), Ok(())),
            (
                "signed by another key",
                signed(&theirs, intent.clone()),
                Err(SignatureError::Invalid),
            ),
            (
                "changed after signing",
                tampered,
                Err(SignatureError::Invalid),
            ),
            ("unsigned", intent.clone(), Err(SignatureError::Missing)),
            (
                "not hex",
                {
                    let mut v = intent.clone();
                    v[SIGNATURE_FIELD] = "zz".into();
                    v
                },
                Err(SignatureError::Malformed("expected 128 hex digits".into())),
            ),
        ];
        for (name, intent, expected) in cases {
            assert_eq!(trusted.verify(&intent), expected, "{name}");
        }
        assert_eq!(
            TrustedKeys::default().verify(&signed(&ours, intent)),
            Err(SignatureError::NoKeys)
        );
        assert!(TrustedKeys::from_hex(&["abc".into()]).is_err());
    }
}
