//! Who this device is: its id, made from a template so that one image
//! serves every device (`pi-{serial}`, `{machine-id}`, `{hostname}`), and
//! its own Ed25519 key pair, made at first start in the state directory
//! (mode 0600). The private key never leaves the device: what the control
//! plane learns is the public key.

use drover_model::DeviceId;
use ring::rand::SecureRandom;
use ring::signature::{Ed25519KeyPair, KeyPair};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The key's file in the state directory: the 32-byte Ed25519 seed, hex.
pub const KEY_FILE: &str = "device.key";

/// Where a template's facts are read on this machine.
#[derive(Debug, Clone)]
pub struct Sources {
    /// The device tree's serial number (a Raspberry Pi's); absent on most
    /// amd64 machines.
    pub serial: PathBuf,
    /// systemd's machine id, unique per installed system.
    pub machine_id: PathBuf,
    pub hostname: PathBuf,
}

impl Default for Sources {
    fn default() -> Self {
        Self::under(Path::new("/"))
    }
}

impl Sources {
    /// The sources under `root` (a test's stand-in for `/`).
    pub fn under(root: &Path) -> Self {
        Self {
            serial: root.join("proc/device-tree/serial-number"),
            machine_id: root.join("etc/machine-id"),
            hostname: root.join("proc/sys/kernel/hostname"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error(
        "device_id {template:?} names {{{name}}}, which is not one of {{serial}}, \
         {{machine-id}}, {{hostname}}"
    )]
    UnknownPlaceholder { template: String, name: String },
    #[error("device_id {0:?} has a {{ without its }}")]
    Unclosed(String),
    #[error("device_id {template:?} needs {{{name}}}, but {path} cannot be read: {reason}")]
    Unreadable {
        template: String,
        name: &'static str,
        path: String,
        reason: String,
    },
    #[error("device_id {template:?} needs {{{name}}}, but {path} is empty")]
    Empty {
        template: String,
        name: &'static str,
        path: String,
    },
    #[error("device_id {template:?} made {made:?}: {reason}")]
    Invalid {
        template: String,
        made: String,
        reason: drover_model::IdError,
    },
    #[error("the device key {path}: {reason}")]
    Key { path: String, reason: String },
}

/// The device id `template` makes on this machine. A template without
/// braces is the id itself.
pub fn device_id(template: &str, sources: &Sources) -> Result<DeviceId, IdentityError> {
    let mut made = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        made.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close = after
            .find('}')
            .ok_or_else(|| IdentityError::Unclosed(template.to_owned()))?;
        made.push_str(&fact(template, &after[..close], sources)?);
        rest = &after[close + 1..];
    }
    made.push_str(rest);
    DeviceId::new(made.clone()).map_err(|reason| IdentityError::Invalid {
        template: template.to_owned(),
        made,
        reason,
    })
}

/// One placeholder's value: read, the device tree's trailing NUL and any
/// white space cut, lowercased (ids are lowercase).
fn fact(template: &str, name: &str, sources: &Sources) -> Result<String, IdentityError> {
    let (name, path): (&'static str, &Path) = match name {
        "serial" => ("serial", &sources.serial),
        "machine-id" => ("machine-id", &sources.machine_id),
        "hostname" => ("hostname", &sources.hostname),
        other => {
            return Err(IdentityError::UnknownPlaceholder {
                template: template.to_owned(),
                name: other.to_owned(),
            });
        }
    };
    let bytes = std::fs::read(path).map_err(|e| IdentityError::Unreadable {
        template: template.to_owned(),
        name,
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    let value = String::from_utf8_lossy(&bytes)
        .trim_matches(|c: char| c == '\0' || c.is_whitespace())
        .to_ascii_lowercase();
    if value.is_empty() {
        return Err(IdentityError::Empty {
            template: template.to_owned(),
            name,
            path: path.display().to_string(),
        });
    }
    Ok(value)
}

/// The device's own key pair.
pub struct DeviceKey {
    pair: Ed25519KeyPair,
}

impl std::fmt::Debug for DeviceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceKey")
            .field("public_key", &self.public_key_hex())
            .finish_non_exhaustive()
    }
}

impl DeviceKey {
    /// The key in `state_dir`, made there (0600, written whole and synced
    /// before it is used) when there is none. A key file others can read is
    /// made 0600 again, with a warning.
    pub fn load_or_create(state_dir: &Path) -> Result<Self, IdentityError> {
        let path = state_dir.join(KEY_FILE);
        let fail = |reason: String| IdentityError::Key {
            path: path.display().to_string(),
            reason,
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let mode = std::fs::metadata(&path)
                    .map_err(|e| fail(e.to_string()))?
                    .permissions()
                    .mode();
                if mode & 0o077 != 0 {
                    tracing::warn!(path = %path.display(), mode = format!("{:o}", mode & 0o777), "the device key was readable by others; made 0600");
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                        .map_err(|e| fail(e.to_string()))?;
                }
                let seed = unhex(text.trim()).ok_or_else(|| {
                    fail("not a 64-digit hex seed (move it away to make a new key, which the control plane must then accept again)".into())
                })?;
                Self::from_seed(&seed).map_err(fail)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut seed = [0u8; 32];
                ring::rand::SystemRandom::new()
                    .fill(&mut seed)
                    .map_err(|_| fail("no randomness from the system".into()))?;
                crate::durable::replace(&path, format!("{}\n", hex(&seed)).as_bytes(), 0o600)
                    .map_err(|e| fail(e.to_string()))?;
                tracing::info!(path = %path.display(), "made this device's key");
                Self::from_seed(&seed).map_err(fail)
            }
            Err(e) => Err(fail(e.to_string())),
        }
    }

    fn from_seed(seed: &[u8]) -> Result<Self, String> {
        Ed25519KeyPair::from_seed_unchecked(seed)
            .map(|pair| Self { pair })
            .map_err(|e| format!("not an Ed25519 seed: {e}"))
    }

    /// The public key, hex: the device's identity to the control plane.
    pub fn public_key_hex(&self) -> String {
        hex(self.pair.public_key().as_ref())
    }

    /// Signs `message` with the device's key.
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        self.pair.sign(message).as_ref().to_vec()
    }
}

impl drover_model::enroll::Signer for DeviceKey {
    fn public_key(&self) -> String {
        self.public_key_hex()
    }

    fn sign(&self, message: &[u8]) -> Vec<u8> {
        DeviceKey::sign(self, message)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources(dir: &Path, serial: Option<&[u8]>) -> Sources {
        let sources = Sources::under(dir);
        for path in [&sources.serial, &sources.machine_id, &sources.hostname] {
            std::fs::create_dir_all(path.parent().expect("parent")).expect("dirs");
        }
        if let Some(serial) = serial {
            std::fs::write(&sources.serial, serial).expect("serial");
        }
        std::fs::write(&sources.machine_id, "3f0c9e2a6b1d4e8f9a7c5b3d1e2f4a6b\n").expect("id");
        std::fs::write(&sources.hostname, "Kitchen-Pi\n").expect("hostname");
        sources
    }

    #[test]
    fn a_template_makes_the_id_from_this_machines_facts() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A Raspberry Pi's serial ends in a NUL.
        let pi = sources(dir.path(), Some(b"10000000ABCDEF01\0"));
        for (template, made) in [
            ("pi-{serial}", "pi-10000000abcdef01"),
            ("{machine-id}", "3f0c9e2a6b1d4e8f9a7c5b3d1e2f4a6b"),
            ("{hostname}", "kitchen-pi"),
            (
                "site-{hostname}-{serial}",
                "site-kitchen-pi-10000000abcdef01",
            ),
            ("device-1", "device-1"),
        ] {
            assert_eq!(
                device_id(template, &pi).expect(template).as_str(),
                made,
                "{template}"
            );
        }
    }

    #[test]
    fn a_template_that_cannot_be_made_says_why() {
        let dir = tempfile::tempdir().expect("tempdir");
        let amd64 = sources(dir.path(), None);
        for (template, says) in [
            ("pi-{serial}", "cannot be read"),
            ("{uuid}", "not one of {serial}"),
            ("pi-{serial", "without its }"),
            ("{hostname}.lan", "must be 1 to 64"),
        ] {
            let error = device_id(template, &amd64).expect_err(template).to_string();
            assert!(error.contains(says), "{template}: {error}");
        }
        std::fs::write(&amd64.serial, b"\0").expect("serial");
        let error = device_id("pi-{serial}", &amd64).expect_err("empty");
        assert!(error.to_string().contains("is empty"), "{error}");
    }

    #[test]
    fn the_key_is_made_once_private_and_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        let made = DeviceKey::load_or_create(&state).expect("made");
        let path = state.join(KEY_FILE);
        let mode = std::fs::metadata(&path).expect("key").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = DeviceKey::load_or_create(&state).expect("loaded");
        assert_eq!(again.public_key_hex(), made.public_key_hex(), "kept");
        assert_eq!(made.public_key_hex().len(), 64);
        // What it signs verifies under its public key, and only that.
        let signature = made.sign(b"challenge");
        let public = ring::signature::UnparsedPublicKey::new(
            &ring::signature::ED25519,
            made.pair.public_key().as_ref().to_vec(),
        );
        assert!(public.verify(b"challenge", &signature).is_ok());
        assert!(public.verify(b"another", &signature).is_err());
        // Another directory, another key.
        let other = DeviceKey::load_or_create(&dir.path().join("other")).expect("other");
        assert_ne!(other.public_key_hex(), made.public_key_hex());
        // A key others could read is made private again; a damaged one is
        // refused, never replaced (the control plane knows the old key).
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        DeviceKey::load_or_create(&state).expect("loaded");
        let mode = std::fs::metadata(&path).expect("key").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::write(&path, "not a key\n").expect("damage");
        let error = DeviceKey::load_or_create(&state).expect_err("damaged");
        assert!(error.to_string().contains("64-digit hex"), "{error}");
        assert_eq!(
            std::fs::read_to_string(&path).expect("key"),
            "not a key\n",
            "left as it was"
        );
    }
}
