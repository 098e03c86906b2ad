//! The keys behind NATS decentralized authentication (issue 55), kept in a
//! directory of their own, outside the control plane's data directory: an
//! operator key (signs the accounts), the account Drover's devices and
//! control plane live in with a signing key apart from its identity (signs
//! each user), and the system account (the servers' own, from which an
//! account's new JWT, with its revocations, is pushed to every server).
//!
//! nats-server is configured once (`server_config`) with the operator, and
//! needs no change per device: it checks each user's JWT against the
//! account's signing keys, and takes the account's newer JWTs at run time
//! (`$SYS.REQ.CLAIMS.UPDATE`), closing the connections of users revoked.

use crate::jwt::{self, JwtError, Permissions};
use crate::server::{AUTH_TIMEOUT_SECONDS, DirectStatusPuts, device_permissions};
use drover_model::DeviceId;
use nkeys::KeyPair;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The subject nats-server takes an account's new JWT on (from a user of
/// the system account), answering whether it was taken.
pub const CLAIMS_UPDATE: &str = "$SYS.REQ.CLAIMS.UPDATE";

/// The account's name in its JWT.
pub const ACCOUNT_NAME: &str = "drover";

#[derive(Debug, thiserror::Error)]
pub enum AuthorityError {
    #[error("{path}: {reason}")]
    Key { path: PathBuf, reason: String },
    #[error(transparent)]
    Jwt(#[from] JwtError),
}

/// The keys, loaded from (or made in) their directory.
pub struct Authority {
    operator: KeyPair,
    account: KeyPair,
    account_signing: KeyPair,
    system: KeyPair,
}

/// Reads the seed in `path`, or makes a key with `make` and writes its seed
/// there (mode 0600, synced) when there is none.
fn key(path: &Path, make: fn() -> KeyPair) -> Result<KeyPair, AuthorityError> {
    let fail = |reason: String| AuthorityError::Key {
        path: path.to_owned(),
        reason,
    };
    match std::fs::read_to_string(path) {
        Ok(seed) => KeyPair::from_seed(seed.trim()).map_err(|e| fail(e.to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let pair = make();
            let seed = pair.seed().map_err(|e| fail(e.to_string()))?;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| fail(e.to_string()))?;
            file.write_all(seed.as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(|e| fail(e.to_string()))?;
            Ok(pair)
        }
        Err(e) => Err(fail(e.to_string())),
    }
}

fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

impl Authority {
    /// The keys in `dir`, each made at first use.
    pub fn load_or_create(dir: &Path) -> Result<Self, AuthorityError> {
        std::fs::create_dir_all(dir).map_err(|e| AuthorityError::Key {
            path: dir.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(Self {
            operator: key(&dir.join("operator.nk"), KeyPair::new_operator)?,
            account: key(&dir.join("account.nk"), KeyPair::new_account)?,
            account_signing: key(&dir.join("account-signing.nk"), KeyPair::new_account)?,
            system: key(&dir.join("system.nk"), KeyPair::new_account)?,
        })
    }

    /// The account's public key (its identity).
    pub fn account(&self) -> String {
        self.account.public_key()
    }

    pub fn operator_jwt(&self) -> Result<String, AuthorityError> {
        let operator = self.operator.public_key();
        Ok(jwt::encode(
            &self.operator,
            &operator,
            "drover",
            jwt::operator_claims(&self.system.public_key()),
            now(),
        )?)
    }

    pub fn system_account_jwt(&self) -> Result<String, AuthorityError> {
        Ok(jwt::encode(
            &self.operator,
            &self.system.public_key(),
            "SYS",
            jwt::account_claims(&[], &BTreeMap::new(), false),
            now(),
        )?)
    }

    /// The account's JWT, with JetStream, its signing key and `revocations`
    /// (user public key → Unix seconds before which its JWTs are void).
    pub fn account_jwt(
        &self,
        revocations: &BTreeMap<String, i64>,
    ) -> Result<String, AuthorityError> {
        Ok(jwt::encode(
            &self.operator,
            &self.account.public_key(),
            ACCOUNT_NAME,
            jwt::account_claims(&[self.account_signing.public_key()], revocations, true),
            now(),
        )?)
    }

    /// A user of the account, as `user` (its public nkey) with
    /// `permissions` (None: everything), signed by the account's signing key.
    pub fn user_jwt(
        &self,
        user: &str,
        name: &str,
        permissions: Option<&Permissions>,
    ) -> Result<String, AuthorityError> {
        Ok(jwt::encode(
            &self.account_signing,
            user,
            name,
            jwt::user_claims(&self.account.public_key(), permissions, false),
            now(),
        )?)
    }

    /// An accepted device's user JWT: bound to its key (`public_key`, the
    /// agent's Ed25519 key in hex, as its user nkey) and to its own subjects.
    pub fn device_jwt(&self, device: &DeviceId, public_key: &str) -> Result<String, String> {
        let nkey = drover_model::nkey::user_nkey(public_key).ok_or("not an Ed25519 key")?;
        let (publish, subscribe) = device_permissions(device, DirectStatusPuts::Denied);
        self.user_jwt(
            &nkey,
            device.as_str(),
            Some(&Permissions { publish, subscribe }),
        )
        .map_err(|e| e.to_string())
    }

    /// The enrollment user's JWT (issue 55): a bearer JWT, the same in every
    /// device's config and no secret, that may publish only requests to
    /// join and read only their answers.
    pub fn enroll_jwt(&self) -> Result<String, AuthorityError> {
        let user = KeyPair::new_user();
        let permissions = Permissions {
            publish: vec![format!("{}.*", crate::ENROLL_PREFIX)],
            subscribe: vec![format!("{}.>", crate::ENROLL_INBOX)],
        };
        Ok(jwt::encode(
            &self.account_signing,
            &user.public_key(),
            "drover-enroll",
            jwt::user_claims(&self.account.public_key(), Some(&permissions), true),
            now(),
        )?)
    }

    /// A login for the control plane: a new user key (kept in memory only)
    /// and its JWT, which may do anything in the account.
    pub fn control_plane_login(&self, name: &str) -> Result<crate::KeyLogin, AuthorityError> {
        let user = KeyPair::new_user();
        let jwt = self.user_jwt(&user.public_key(), name, None)?;
        Ok(crate::KeyLogin {
            jwt,
            signer: std::sync::Arc::new(NkeySigner(user)),
        })
    }

    /// A new user of the system account, which may push an account's new
    /// JWT to the servers: its JWT and its key.
    fn system_user(&self) -> Result<(String, KeyPair), AuthorityError> {
        let user = KeyPair::new_user();
        let jwt = jwt::encode(
            &self.system,
            &user.public_key(),
            "drover-system",
            jwt::user_claims(&self.system.public_key(), None, false),
            now(),
        )?;
        Ok((jwt, user))
    }

    /// [`Authority::system_user`] as a credentials file.
    pub fn system_user_creds(&self) -> Result<String, AuthorityError> {
        let (jwt, user) = self.system_user()?;
        let seed = user.seed().map_err(|e| AuthorityError::Key {
            path: PathBuf::from("(a new system user)"),
            reason: e.to_string(),
        })?;
        Ok(jwt::creds(&jwt, &seed))
    }

    /// [`Authority::system_user`] as a login.
    pub fn system_login(&self) -> Result<crate::KeyLogin, AuthorityError> {
        let (jwt, user) = self.system_user()?;
        Ok(crate::KeyLogin {
            jwt,
            signer: std::sync::Arc::new(NkeySigner(user)),
        })
    }

    /// The lines of nats-server's configuration that trust this operator:
    /// the operator's JWT, the system account, a full resolver keeping the
    /// accounts' JWTs in `resolver_dir` (newer ones pushed at run time win
    /// over the preloaded ones, at every start too).
    pub fn server_config(&self, resolver_dir: &Path) -> Result<String, AuthorityError> {
        let system = self.system.public_key();
        // As with passwords (server.rs): after a server's restart the
        // whole fleet logs in at once, and a login the server has not got
        // to in its default 2 s is cut off and made again, costing it more.
        Ok(format!(
            "operator: {operator}\nsystem_account: {system}\n\
             authorization: {{ timeout: {AUTH_TIMEOUT_SECONDS} }}\n\
             resolver: {{ type: full, dir: {dir}, allow_delete: false, interval: \"2m\" }}\n\
             resolver_preload: {{\n  {system}: {system_jwt}\n  {account}: {account_jwt}\n}}\n",
            operator = self.operator_jwt()?,
            dir = serde_json::to_string(&resolver_dir.display().to_string()).unwrap_or_default(),
            system_jwt = self.system_account_jwt()?,
            account = self.account.public_key(),
            account_jwt = self.account_jwt(&BTreeMap::new())?,
        ))
    }
}

/// An nkey that signs a server's nonce.
struct NkeySigner(KeyPair);

impl drover_model::enroll::Signer for NkeySigner {
    fn public_key(&self) -> String {
        self.0.public_key()
    }

    fn sign(&self, message: &[u8]) -> Vec<u8> {
        self.0.sign(message).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_made_once_and_read_back() {
        let dir = tempfile::tempdir().expect("tmp");
        let first = Authority::load_or_create(dir.path()).expect("made");
        let again = Authority::load_or_create(dir.path()).expect("read");
        assert_eq!(first.account(), again.account());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("account-signing.nk"))
            .expect("seed")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let user = KeyPair::new_user();
        let jwt = first
            .user_jwt(&user.public_key(), "pi-1", None)
            .expect("user");
        let claims = jwt::claims(&jwt).expect("claims");
        assert_eq!(claims["nats"]["issuer_account"], first.account());
        assert_ne!(claims["iss"], first.account(), "signed by the signing key");
    }

    /// A fleet logging in at once after a server's restart is not cut off
    /// by nats-server's default 2 s to authenticate (nats_jwt.rs shows
    /// the server takes the block beside an operator).
    #[test]
    fn the_servers_lines_give_a_login_the_same_time_as_a_password_login() {
        let dir = tempfile::tempdir().expect("tmp");
        let authority = Authority::load_or_create(dir.path()).expect("made");
        let config = authority.server_config(dir.path()).expect("config");
        assert!(
            config.contains(&format!(
                "authorization: {{ timeout: {AUTH_TIMEOUT_SECONDS} }}"
            )),
            "{config}"
        );
        let passwords =
            crate::server::authorization_config(("cp", "secret"), &[], DirectStatusPuts::Denied)
                .expect("passwords");
        assert!(passwords.contains(&format!("timeout: {AUTH_TIMEOUT_SECONDS}")));
    }
}
