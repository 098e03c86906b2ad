//! Credentials. Each device's bearer token is an HMAC-SHA256 of its id under
//! the control plane's secret key (ring), so tokens need no table and a leaked
//! token opens one device only. Operators use one bearer token. Both live in
//! the data directory, created on first start with mode 0600.

use agent_core::DeviceId;
use anyhow::{Context, Result};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

pub struct Secrets {
    key: hmac::Key,
    operator_token: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

fn random_hex(bytes: usize) -> Result<String> {
    let mut buf = vec![0u8; bytes];
    SystemRandom::new()
        .fill(&mut buf)
        .map_err(|_| anyhow::anyhow!("the system random source failed"))?;
    Ok(hex(&buf))
}

/// Reads a secret file, or creates it (mode 0600) with a fresh random value.
fn read_or_create(path: &Path) -> Result<String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text.trim().to_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let value = random_hex(32)?;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            file.write_all(value.as_bytes())?;
            file.sync_all()?;
            Ok(value)
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

impl Secrets {
    /// Loads the secrets of a data directory, creating them on first use.
    pub fn load_or_create(data_dir: &Path, operator_token: Option<String>) -> Result<Self> {
        if !data_dir.exists() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(data_dir)
                .with_context(|| {
                    format!("cannot create the data directory {}", data_dir.display())
                })?;
        }
        let key_hex = read_or_create(&data_dir.join("secret.key"))?;
        let key_bytes = unhex(&key_hex).filter(|k| k.len() >= 32).with_context(|| {
            format!(
                "{} is not a 32-byte hex key",
                data_dir.join("secret.key").display()
            )
        })?;
        let operator_token = match operator_token {
            Some(token) => token,
            None => read_or_create(&data_dir.join("operator.token"))?,
        };
        Ok(Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, &key_bytes),
            operator_token,
        })
    }

    fn device_message(device: &DeviceId) -> Vec<u8> {
        format!("drover-device-token:v1:{device}").into_bytes()
    }

    pub fn device_token(&self, device: &DeviceId) -> String {
        hex(hmac::sign(&self.key, &Self::device_message(device)).as_ref())
    }

    /// Constant-time check of a device's token.
    pub fn verify_device(&self, device: &DeviceId, token: &str) -> bool {
        match unhex(token) {
            Some(tag) => hmac::verify(&self.key, &Self::device_message(device), &tag).is_ok(),
            None => false,
        }
    }

    /// Constant-time check of the operator token (compares MACs of both).
    pub fn verify_operator(&self, token: &str) -> bool {
        let expected = hmac::sign(&self.key, self.operator_token.as_bytes());
        hmac::verify(&self.key, token.as_bytes(), expected.as_ref()).is_ok()
    }

    pub fn operator_token(&self) -> &str {
        &self.operator_token
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_open_one_device_and_survive_restarts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = DeviceId::new("device-a").expect("valid");
        let b = DeviceId::new("device-b").expect("valid");
        let secrets = Secrets::load_or_create(dir.path(), None).expect("create");
        let token = secrets.device_token(&a);
        assert!(secrets.verify_device(&a, &token));
        assert!(
            !secrets.verify_device(&b, &token),
            "A's token must not open B"
        );
        assert!(!secrets.verify_device(&a, "zz"));
        assert!(!secrets.verify_device(&a, ""));
        let op = secrets.operator_token().to_owned();
        assert!(secrets.verify_operator(&op));
        assert!(!secrets.verify_operator("guess"));
        let again = Secrets::load_or_create(dir.path(), None).expect("reload");
        assert!(again.verify_device(&a, &token));
        assert!(again.verify_operator(&op));
        let mode = std::fs::metadata(dir.path().join("secret.key")).expect("meta");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(mode.permissions().mode() & 0o777, 0o600);
    }
}
