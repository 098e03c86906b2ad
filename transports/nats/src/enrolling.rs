//! Joining over NATS (issue 55), the agent's end: a device with its own
//! key and no user JWT yet asks to join on `drover.enroll.<id>` as the
//! enrollment user (a bearer JWT every device of the fleet has in its
//! config: it may publish there and read its answers, nothing else). An
//! accepted device is answered with its user JWT, which it keeps in its
//! state directory and logs in with, signing the server's nonce with its
//! key; a pending one asks again after its backoff. A JWT the servers
//! refuse (revoked, or a new account) is forgotten and asked for again.

use crate::{
    EnrollReply, EnrollRequest, KeyLogin, NatsError, NatsSettings, connect_options,
    enroll_inbox_prefix, enroll_subject,
};
use drover_model::DeviceId;
use drover_model::enroll::{Inventory, Signer, key_broker_password};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// What a device with its own key needs to ask to join.
#[derive(Clone)]
pub struct Joining {
    pub signer: Arc<dyn Signer>,
    /// The enrollment token it was given (`drover enrollment-tokens create`).
    pub token: String,
    /// The enrollment user's bearer JWT (`drover nats-config --authority`).
    pub enroll_jwt: String,
    /// Where its own user JWT is kept once it has one.
    pub jwt_file: PathBuf,
}

impl std::fmt::Debug for Joining {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Joining")
            .field("public_key", &self.signer.public_key())
            .field("jwt_file", &self.jwt_file)
            .finish_non_exhaustive()
    }
}

/// How long one request may take, connection included.
const ASK_TIMEOUT: Duration = Duration::from_secs(10);

/// What asking to join came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    /// The device's user JWT, now kept.
    Accepted(String),
    /// Pending or refused, in the control plane's words.
    NotYet(String),
}

impl Joining {
    /// The device's login: its kept JWT and its key.
    pub fn login(&self, jwt: String) -> KeyLogin {
        KeyLogin {
            jwt,
            signer: self.signer.clone(),
        }
    }

    /// The JWT kept from an earlier acceptance, if any.
    pub fn kept(&self) -> Option<String> {
        std::fs::read_to_string(&self.jwt_file)
            .ok()
            .map(|jwt| jwt.trim().to_owned())
            .filter(|jwt| !jwt.is_empty())
    }

    /// Forgets a JWT the servers refused.
    pub fn forget(&self) {
        let _ = std::fs::remove_file(&self.jwt_file);
    }

    /// Keeps `jwt` (written whole, synced, then renamed into place).
    fn keep(&self, jwt: &str) -> std::io::Result<()> {
        use std::io::Write;
        let tmp = self.jwt_file.with_extension("tmp");
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(jwt.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&tmp, &self.jwt_file)?;
        if let Some(dir) = self.jwt_file.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }

    /// Asks to join once, as the enrollment user.
    pub async fn ask(
        &self,
        nats: &NatsSettings,
        device: &DeviceId,
        inventory: Inventory,
    ) -> Result<Asked, NatsError> {
        let fail = |reason: String| NatsError::Connect {
            url: nats.url.clone(),
            reason,
        };
        let settings = NatsSettings {
            user: None,
            password: None,
            key_login: Some(self.login(self.enroll_jwt.clone())),
            ..nats.clone()
        };
        let client = connect_options(&settings)
            .custom_inbox_prefix(enroll_inbox_prefix(device))
            .name(format!("drover-agent {device} (joining)"))
            .connect(settings.addresses()?)
            .await
            .map_err(|e| fail(format!("as the enrollment user: {e}")))?;
        let request = EnrollRequest {
            public_key: self.signer.public_key(),
            token: self.token.clone(),
            inventory,
            signature: key_broker_password(self.signer.as_ref(), device),
        };
        let payload = serde_json::to_vec(&request).map_err(|e| fail(e.to_string()))?;
        let answer = tokio::time::timeout(
            ASK_TIMEOUT,
            client.request(enroll_subject(device), payload.into()),
        )
        .await
        .map_err(|_| fail("no control plane answered the request to join".into()))?
        .map_err(|e| fail(format!("asking to join: {e}")))?;
        let _ = client.drain().await;
        match serde_json::from_slice::<EnrollReply>(&answer.payload) {
            Ok(EnrollReply::Accepted { jwt }) => {
                self.keep(&jwt).map_err(|e| {
                    fail(format!(
                        "cannot keep the JWT in {}: {e}",
                        self.jwt_file.display()
                    ))
                })?;
                Ok(Asked::Accepted(jwt))
            }
            Ok(EnrollReply::Pending { message } | EnrollReply::Refused { message }) => {
                Ok(Asked::NotYet(message))
            }
            Err(e) => Err(fail(format!(
                "an unreadable answer to the request to join: {e}"
            ))),
        }
    }
}
