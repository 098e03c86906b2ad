//! One secret, one job (issue 28, item 6). A device's token is its
//! WebSocket bearer and the root of its sealing key; what it gives an MQTT
//! or NATS broker is a password derived from the token for that purpose
//! alone (HKDF-SHA256, its own salt, the device id as info). Whoever reads
//! a broker's password file, or sees the password on the broker's side,
//! can neither log in over WebSocket nor open the device's sealed secrets.

use crate::ids::DeviceId;
use crate::signing::hex;
use ring::hkdf::{HKDF_SHA256, KeyType, Salt};

struct Len32;

impl KeyType for Len32 {
    fn len(&self) -> usize {
        32
    }
}

/// 32 bytes for one purpose (`salt`) derived from a device's token, with
/// the device id as HKDF's info: the root of the device's broker password
/// and of its sealing key.
pub(crate) fn derive32(salt: &[u8], token: &str, device: &DeviceId) -> [u8; 32] {
    let prk = Salt::new(HKDF_SHA256, salt).extract(token.as_bytes());
    let info = [device.as_str().as_bytes()];
    let mut bytes = [0u8; 32];
    // A 32-byte output is within HKDF-SHA256's limit, so neither step fails.
    if let Ok(okm) = prk.expand(&info, Len32) {
        let _ = okm.fill(&mut bytes);
    }
    bytes
}

/// The password `device` gives its broker: 64 hex digits derived from
/// `token`. `drover mqtt-config` and `drover nats-config` write it (in the
/// broker's hashed form), and the agent derives the same from its token
/// file.
pub fn broker_password(token: &str, device: &DeviceId) -> String {
    hex(&derive32(b"drover-broker-password:v1", token, device))
}

/// Which password an agent gives its broker. The derived one first; when
/// the broker refuses it, the token itself, which brokers set up before
/// derived passwords still hold; when that is refused too, the derived one
/// again (the broker's files may have been written anew meanwhile).
#[derive(Debug, Clone)]
pub struct BrokerPasswords {
    derived: String,
    /// None: a device with its own key has no token to fall back on.
    token: Option<String>,
    using_token: bool,
}

impl BrokerPasswords {
    pub fn new(token: &str, device: &DeviceId) -> Self {
        Self {
            derived: broker_password(token, device),
            token: Some(token.to_owned()),
            using_token: false,
        }
    }

    /// A device's own password (its key's, `enroll::key_broker_password`),
    /// with nothing to fall back on.
    pub fn own(password: String) -> Self {
        Self {
            derived: password,
            token: None,
            using_token: false,
        }
    }

    /// The password to connect with now.
    pub fn current(&self) -> &str {
        match &self.token {
            Some(token) if self.using_token => token,
            _ => &self.derived,
        }
    }

    /// Whether the current one is the token (a broker set up before
    /// derived passwords).
    pub fn using_token(&self) -> bool {
        self.using_token
    }

    /// The broker refused the current password: the other is next.
    /// Returns whether to try it at once: the token right after the
    /// derived password was refused (a broker set up before derived
    /// passwords); the derived one again only after the usual wait, in
    /// case the broker's files were written anew meanwhile.
    pub fn refused(&mut self) -> bool {
        self.using_token = !self.using_token && self.token.is_some();
        self.using_token
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_broker_password_is_neither_the_token_nor_another_devices() {
        let a = DeviceId::new("pi-a").expect("id");
        let b = DeviceId::new("pi-b").expect("id");
        let password = broker_password("tok", &a);
        assert_eq!(password.len(), 64);
        assert_eq!(password, broker_password("tok", &a), "deterministic");
        assert_ne!(password, broker_password("tok", &b));
        assert_ne!(password, broker_password("tok2", &a));
        assert!(!password.contains("tok"));
    }

    #[test]
    fn a_refused_password_switches_to_the_other_and_back() {
        let a = DeviceId::new("pi-a").expect("id");
        let mut passwords = BrokerPasswords::new("tok", &a);
        assert_eq!(passwords.current(), broker_password("tok", &a));
        assert!(passwords.refused(), "the token is tried at once");
        assert!(passwords.using_token());
        assert_eq!(passwords.current(), "tok");
        assert!(!passwords.refused(), "the derived one after the usual wait");
        assert!(!passwords.using_token());
        // A device's own password has nothing to switch to.
        let mut own = BrokerPasswords::own("sig".into());
        assert!(!own.refused());
        assert_eq!(own.current(), "sig");
    }
}
