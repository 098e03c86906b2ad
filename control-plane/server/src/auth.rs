//! Credentials. Each device's bearer token is an HMAC-SHA256 of its id under
//! the control plane's secret key (ring), so tokens need no table and a leaked
//! token opens one device only. The bootstrap operator token and the key live in
//! the data directory, created on first start with mode 0600. Named
//! operators' tokens are stored as their HMAC (`operators.rs`).

use anyhow::{Context, Result};
use drover_model::DeviceId;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

pub struct Secrets {
    key: hmac::Key,
    operator_token: String,
}

/// A dashboard session cookie taken apart, not yet checked.
#[derive(Debug, Clone, Copy)]
pub struct UiSession<'a> {
    pub expires: i64,
    pub nonce: &'a str,
    /// The operator it claims to be.
    pub name: &'a str,
    pub generation: u64,
    tag: &'a str,
}

use drover_model::signing::{hex, unhex};

pub(crate) fn random_hex(bytes: usize) -> Result<String> {
    let mut buf = vec![0u8; bytes];
    SystemRandom::new()
        .fill(&mut buf)
        .map_err(|_| anyhow::anyhow!("the system random source failed"))?;
    Ok(hex(&buf))
}

/// Creates the data directory, mode 0700 (secrets and state are the
/// control plane's alone), if it does not exist.
pub fn ensure_data_dir(data_dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if data_dir.exists() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(data_dir)
        .with_context(|| format!("cannot create the data directory {}", data_dir.display()))
}

/// Refuses a data directory that holds no control-plane state.
pub fn require_state(data_dir: &Path) -> Result<()> {
    if data_dir.join("secret.key").exists() {
        return Ok(());
    }
    anyhow::bail!(
        "{} holds no control-plane state (no secret.key): run this on the control plane's \
         host with the --data that `drover serve` uses, or make the state first with \
         `drover --data {} init`",
        data_dir.display(),
        data_dir.display()
    )
}

/// Writes a secret file atomically: a temporary name (mode 0600), fsync,
/// rename, fsync of the directory. A crash leaves the old file or the new
/// one, never an empty one.
pub fn write_secret(path: &Path, value: &str) -> Result<()> {
    write_file(path, value, 0o600)
}

/// A file only its owner reads (mode 0600), written atomically.
pub fn write_private(path: &Path, value: &str) -> Result<()> {
    write_file(path, value, 0o600)
}

/// Like [`write_secret`], with the file's mode given (0644 for a public
/// certificate).
pub fn write_file(path: &Path, value: &str, mode: u32) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("cannot create {}", tmp.display()))?;
    file.write_all(value.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot create {}", path.display()))?;
    if let Some(dir) = path.parent()
        && let Ok(dir) = std::fs::File::open(dir)
    {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// Reads a secret file, or creates it with `fresh()`. An existing empty file
/// is an error naming it, never a secret.
pub(crate) fn read_or_create(
    path: &Path,
    fresh: impl FnOnce() -> Result<String>,
) -> Result<String> {
    match std::fs::read_to_string(path) {
        Ok(text) if text.trim().is_empty() => anyhow::bail!(
            "{} is empty; restore it from a backup or another replica, or remove it to make a new one \
             (every device token or signature made with the old one stops working)",
            path.display()
        ),
        Ok(text) => Ok(text.trim().to_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let value = fresh()?;
            write_secret(path, &value)?;
            Ok(value)
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// The control plane's intent-signing key (Ed25519, `intent.key` in the data
/// directory, shared by replicas like `secret.key`). Agents pin its public
/// key and run only intents it signed (A11).
pub struct IntentSigner {
    key: ring::signature::Ed25519KeyPair,
}

impl IntentSigner {
    pub fn load_or_create(data_dir: &Path) -> Result<Self> {
        ensure_data_dir(data_dir)?;
        let path = data_dir.join("intent.key");
        let pkcs8 = read_or_create(&path, || {
            let document = ring::signature::Ed25519KeyPair::generate_pkcs8(&SystemRandom::new())
                .map_err(|_| anyhow::anyhow!("cannot generate an Ed25519 key"))?;
            Ok(hex(document.as_ref()))
        })?;
        let key = unhex(&pkcs8)
            .and_then(|bytes| ring::signature::Ed25519KeyPair::from_pkcs8(&bytes).ok())
            .with_context(|| format!("{} is not an Ed25519 key (PKCS#8 in hex)", path.display()))?;
        Ok(Self { key })
    }

    /// The public key agents pin (`intent_public_keys`), in hex.
    pub fn public_key(&self) -> String {
        use ring::signature::KeyPair;
        hex(self.key.public_key().as_ref())
    }

    /// The intent as JSON with its signature.
    pub fn sign(&self, intent: &drover_model::Intent) -> serde_json::Value {
        self.sign_value(serde_json::to_value(intent).unwrap_or(serde_json::Value::Null))
    }

    /// A JSON object (an intent, a cancel order) with its signature.
    pub fn sign_value(&self, mut value: serde_json::Value) -> serde_json::Value {
        if let Some(message) = drover_model::signing::canonical(&value) {
            let signature = self.key.sign(&message);
            value[drover_model::signing::SIGNATURE_FIELD] =
                serde_json::Value::String(hex(signature.as_ref()));
        }
        value
    }
}

impl Secrets {
    /// Loads the secrets of a data directory that `drover serve` or `drover
    /// init` made, refusing a directory without them: a command run with the
    /// wrong --data must not make a new key and print tokens no server
    /// accepts.
    pub fn load_existing(data_dir: &Path, operator_token: Option<String>) -> Result<Self> {
        require_state(data_dir)?;
        Self::load_or_create(data_dir, operator_token)
    }

    /// Loads the secrets of a data directory, creating them on first use.
    pub fn load_or_create(data_dir: &Path, operator_token: Option<String>) -> Result<Self> {
        ensure_data_dir(data_dir)?;
        let key_hex = read_or_create(&data_dir.join("secret.key"), || random_hex(32))?;
        let key_bytes = unhex(&key_hex).filter(|k| k.len() >= 32).with_context(|| {
            format!(
                "{} is not a 32-byte hex key",
                data_dir.join("secret.key").display()
            )
        })?;
        let operator_token = match operator_token {
            Some(token) if token.trim().is_empty() => anyhow::bail!(
                "the operator token given (--token or DROVER_TOKEN) is empty; an empty token is never accepted"
            ),
            Some(token) => token,
            None => read_or_create(&data_dir.join("operator.token"), || random_hex(32))?,
        };
        Ok(Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, &key_bytes),
            operator_token,
        })
    }

    /// Generation 0 is the token every device had before tokens could be
    /// rotated; each later one adds its number.
    fn device_message(device: &DeviceId, generation: u64) -> Vec<u8> {
        match generation {
            0 => format!("drover-device-token:v1:{device}").into_bytes(),
            n => format!("drover-device-token:v1:{device}:{n}").into_bytes(),
        }
    }

    /// A device's token at generation 0 (never rotated).
    pub fn device_token(&self, device: &DeviceId) -> String {
        self.device_token_at(device, 0)
    }

    /// A device's token at `generation` (`device_tokens`).
    pub fn device_token_at(&self, device: &DeviceId, generation: u64) -> String {
        hex(hmac::sign(&self.key, &Self::device_message(device, generation)).as_ref())
    }

    /// Constant-time check of a never-rotated device's token.
    pub fn verify_device(&self, device: &DeviceId, token: &str) -> bool {
        self.verify_device_at(device, 0, token)
    }

    /// Constant-time check of a device's token at `generation`.
    pub fn verify_device_at(&self, device: &DeviceId, generation: u64, token: &str) -> bool {
        match unhex(token) {
            Some(tag) => {
                hmac::verify(&self.key, &Self::device_message(device, generation), &tag).is_ok()
            }
            None => false,
        }
    }

    fn link_message(package: &str, device: &DeviceId, generation: u64, expires: i64) -> Vec<u8> {
        format!("drover-download-link:v2:{package}:{device}:{generation}:{expires}").into_bytes()
    }

    /// The signature of a download link: one package, one device at one
    /// token generation, until `expires` (Unix seconds). Replicas share the
    /// key, so any one verifies.
    pub fn sign_link(
        &self,
        package: &str,
        device: &DeviceId,
        generation: u64,
        expires: i64,
    ) -> String {
        hex(hmac::sign(
            &self.key,
            &Self::link_message(package, device, generation, expires),
        )
        .as_ref())
    }

    /// Constant-time check of a download link's signature.
    pub fn verify_link(
        &self,
        package: &str,
        device: &DeviceId,
        generation: u64,
        expires: i64,
        sig: &str,
    ) -> bool {
        match unhex(sig) {
            Some(tag) => hmac::verify(
                &self.key,
                &Self::link_message(package, device, generation, expires),
                &tag,
            )
            .is_ok(),
            None => false,
        }
    }

    /// Constant-time check of the operator token (compares MACs of both).
    /// An empty token never passes.
    pub fn verify_operator(&self, token: &str) -> bool {
        if token.is_empty() {
            return false;
        }
        let expected = hmac::sign(&self.key, self.operator_token.as_bytes());
        hmac::verify(&self.key, token.as_bytes(), expected.as_ref()).is_ok()
    }

    pub fn operator_token(&self) -> &str {
        &self.operator_token
    }

    /// The digest an operator's token is stored as: its HMAC under the
    /// control plane's key, in hex (a copy of the store opens nothing).
    pub fn operator_digest(&self, token: &str) -> String {
        hex(hmac::sign(&self.key, &Self::operator_message(token)).as_ref())
    }

    fn operator_message(token: &str) -> Vec<u8> {
        format!("drover-operator-token:v1:{token}").into_bytes()
    }

    /// Constant-time check of a named operator's token against its digest.
    pub fn verify_operator_digest(&self, token: &str, digest: &str) -> bool {
        match unhex(digest) {
            Some(tag) if !token.is_empty() => {
                hmac::verify(&self.key, &Self::operator_message(token), &tag).is_ok()
            }
            _ => false,
        }
    }

    /// What a session of the bootstrap operator is bound to while its token
    /// is `DATA/operator.token`: replacing the file ends its sessions.
    pub fn bootstrap_credential(&self) -> String {
        hex(hmac::sign(&self.key, self.operator_token.as_bytes()).as_ref())
    }

    fn session_message(
        &self,
        expires: i64,
        nonce: &str,
        name: &str,
        generation: u64,
        credential: &str,
    ) -> Vec<u8> {
        format!("drover-ui-session:v3:{expires}:{nonce}:{name}:{generation}:{credential}")
            .into_bytes()
    }

    /// A dashboard session of operator `name` until `expires` (Unix
    /// seconds): `EXPIRES.NONCE.NAME.GENERATION.MAC`, bound to the
    /// operator's token (`credential`: its digest) and generation, so a
    /// revoke or rotate ends it. The nonce makes each login its own
    /// session, so a logout (a record under [`Secrets::ui_session_id`])
    /// ends that one only. Replicas share the key, so any one verifies it.
    pub fn ui_session(
        &self,
        expires: i64,
        name: &str,
        generation: u64,
        credential: &str,
    ) -> Result<String> {
        let nonce = random_hex(16)?;
        let tag = hmac::sign(
            &self.key,
            &self.session_message(expires, &nonce, name, generation, credential),
        );
        Ok(format!(
            "{expires}.{nonce}.{name}.{generation}.{}",
            hex(tag.as_ref())
        ))
    }

    /// The parts of a session cookie, unchecked: whose it claims to be.
    pub fn parse_ui_session(session: &str) -> Option<UiSession<'_>> {
        let mut parts = session.split('.');
        let (Some(expires), Some(nonce), Some(name), Some(generation), Some(tag), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return None;
        };
        let valid_nonce = nonce.len() == 32 && nonce.bytes().all(|b| b.is_ascii_hexdigit());
        if !valid_nonce || name.is_empty() {
            return None;
        }
        Some(UiSession {
            expires: expires.parse().ok()?,
            nonce,
            name,
            generation: generation.parse().ok()?,
            tag,
        })
    }

    /// Whether `session` is one of ours for an operator now at
    /// `generation` with `credential`, and not expired at `now`.
    pub fn verify_ui_session(
        &self,
        session: &UiSession<'_>,
        generation: u64,
        credential: &str,
        now: i64,
    ) -> bool {
        let Some(tag) = unhex(session.tag) else {
            return false;
        };
        session.generation == generation
            && session.expires > now
            && hmac::verify(
                &self.key,
                &self.session_message(
                    session.expires,
                    session.nonce,
                    session.name,
                    generation,
                    credential,
                ),
                &tag,
            )
            .is_ok()
    }

    /// The name a session's logout is stored under: its expiry and nonce
    /// (key-safe characters only).
    pub fn ui_session_id(session: &UiSession<'_>) -> String {
        format!("{}-{}", session.expires, session.nonce)
    }

    fn csrf_message(session: &str) -> Vec<u8> {
        format!("drover-ui-csrf:v1:{session}").into_bytes()
    }

    /// The CSRF token of a session: the dashboard sends it in
    /// `X-Drover-CSRF` with every request that changes something.
    pub fn ui_csrf(&self, session: &str) -> String {
        hex(hmac::sign(&self.key, &Self::csrf_message(session)).as_ref())
    }

    /// Constant-time check of a session's CSRF token.
    pub fn verify_ui_csrf(&self, session: &str, token: &str) -> bool {
        match unhex(token) {
            Some(tag) => hmac::verify(&self.key, &Self::csrf_message(session), &tag).is_ok(),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dashboard_sessions_expire_and_carry_their_own_csrf_token() {
        let dir = tempfile::tempdir().expect("tempdir");
        let secrets = Secrets::load_or_create(dir.path(), None).expect("create");
        let credential = secrets.bootstrap_credential();
        let session = secrets
            .ui_session(2_000, "admin", 0, &credential)
            .expect("session");
        let parsed = Secrets::parse_ui_session(&session).expect("parses");
        assert_eq!(parsed.name, "admin");
        assert!(secrets.verify_ui_session(&parsed, 0, &credential, 1_999));
        assert!(
            !secrets.verify_ui_session(&parsed, 0, &credential, 2_000),
            "expired"
        );
        assert!(
            !secrets.verify_ui_session(&parsed, 1, &credential, 1_000),
            "a later generation (revoked, rotated) ends it"
        );
        assert!(
            !secrets.verify_ui_session(&parsed, 0, &secrets.operator_digest("x"), 1_000),
            "another token ends it"
        );
        assert_ne!(
            session,
            secrets
                .ui_session(2_000, "admin", 0, &credential)
                .expect("session"),
            "each login is its own session"
        );
        let forged = session.replacen("2000", "9000", 1);
        let forged = Secrets::parse_ui_session(&forged).expect("parses");
        assert!(
            !secrets.verify_ui_session(&forged, 0, &credential, 1_000),
            "a later expiry is not ours"
        );
        let other_name = session.replacen(".admin.", ".alice.", 1);
        let other_name = Secrets::parse_ui_session(&other_name).expect("parses");
        assert!(
            !secrets.verify_ui_session(&other_name, 0, &credential, 1_000),
            "another operator's name is not ours"
        );
        assert!(Secrets::parse_ui_session("").is_none());
        let csrf = secrets.ui_csrf(&session);
        assert!(secrets.verify_ui_csrf(&session, &csrf));
        let another = secrets
            .ui_session(3_000, "admin", 0, &credential)
            .expect("session");
        assert!(!secrets.verify_ui_csrf(&another, &csrf));
        // Another operator token (another data directory) ends the session.
        let other = tempfile::tempdir().expect("tempdir");
        let others = Secrets::load_or_create(other.path(), None).expect("create");
        assert!(!others.verify_ui_session(&parsed, 0, &others.bootstrap_credential(), 1_000));
    }

    #[test]
    fn a_named_operators_token_matches_its_digest_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let secrets = Secrets::load_or_create(dir.path(), None).expect("create");
        let digest = secrets.operator_digest("drover-op.alice.abc");
        assert!(secrets.verify_operator_digest("drover-op.alice.abc", &digest));
        assert!(!secrets.verify_operator_digest("drover-op.alice.abd", &digest));
        assert!(!secrets.verify_operator_digest("", &digest));
        assert!(!secrets.verify_operator_digest("drover-op.alice.abc", "zz"));
    }

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
        // A rotated token is another, and the one before it no longer opens.
        let rotated = secrets.device_token_at(&a, 1);
        assert_eq!(
            secrets.device_token_at(&a, 0),
            token,
            "generation 0 is today's"
        );
        assert_ne!(rotated, token);
        assert!(secrets.verify_device_at(&a, 1, &rotated));
        assert!(!secrets.verify_device_at(&a, 1, &token));
        assert!(!secrets.verify_device_at(&a, 2, &rotated));
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
