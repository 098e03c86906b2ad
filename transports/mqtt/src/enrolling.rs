//! Joining over MQTT (issue 55), the agent's end: a device with its own
//! key and no login at the broker yet asks to join on `enroll/<id>`, as
//! one of the enrollment users picked at random ([`enroll_user`]), in one
//! short connection (connect, publish, the broker's PUBACK, disconnect).
//! It learns the answer by logging in with its own password: refused means
//! not accepted yet, and it asks again after the usual backoff. A client's
//! id is its user name, so two devices that picked the same user at once
//! push each other off; each asks again until its request is through. A
//! broker that lacks the numbered users (set up before there were several,
//! and not yet given them by the control plane) refuses them: then the
//! device asks as [`ENROLL_USER`].

use crate::{
    ENROLL_LOGINS, ENROLL_PASSWORD, ENROLL_USER, EnrollPublish, MqttSettings, Topics, enroll_user,
    options,
};
use drover_model::DeviceId;
use drover_model::enroll::{Inventory, Signer, key_broker_password};
use rumqttc::{Event, Incoming, QoS};
use std::sync::Arc;
use std::time::Duration;

/// What a device with its own key needs to ask to join.
#[derive(Clone)]
pub struct Joining {
    pub signer: Arc<dyn Signer>,
    /// The enrollment token it was given (`drover enrollment-tokens create`).
    pub token: String,
}

impl std::fmt::Debug for Joining {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Joining")
            .field("public_key", &self.signer.public_key())
            .finish_non_exhaustive()
    }
}

/// How long one request may take, connection included.
const ASK_TIMEOUT: Duration = Duration::from_secs(10);

/// Publishes one request to join and waits for the broker's PUBACK.
pub async fn ask(
    mqtt: &MqttSettings,
    joining: &Joining,
    device: &DeviceId,
    inventory: Inventory,
) -> Result<(), String> {
    let user = enroll_user(fastrand::usize(..ENROLL_LOGINS));
    match ask_as(mqtt, &user, joining, device, inventory.clone()).await {
        Err(Asking::NotAUser) => {
            tracing::debug!(%user, "the broker has no numbered enrollment users; asking as {ENROLL_USER}");
            ask_as(mqtt, ENROLL_USER, joining, device, inventory)
                .await
                .map_err(|e| e.to_string())
        }
        other => other.map_err(|e| e.to_string()),
    }
}

/// Why a request did not get through.
enum Asking {
    /// The broker refused the enrollment user's login.
    NotAUser,
    Failed(String),
}

impl std::fmt::Display for Asking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Asking::NotAUser => write!(f, "the broker refused the enrollment user's login"),
            Asking::Failed(e) => f.write_str(e),
        }
    }
}

/// [`ask`] as the enrollment user `user`.
async fn ask_as(
    mqtt: &MqttSettings,
    user: &str,
    joining: &Joining,
    device: &DeviceId,
    inventory: Inventory,
) -> Result<(), Asking> {
    let settings = MqttSettings {
        user: user.to_owned(),
        password: ENROLL_PASSWORD.to_owned(),
        ..mqtt.clone()
    };
    let failed = |e: String| Asking::Failed(e);
    let mut options = options(&settings, user).map_err(|e| failed(e.to_string()))?;
    options.set_clean_session(true);
    let request = EnrollPublish {
        public_key: joining.signer.public_key(),
        token: joining.token.clone(),
        inventory,
        password: key_broker_password(joining.signer.as_ref(), device),
    };
    let payload = serde_json::to_vec(&request).map_err(|e| failed(e.to_string()))?;
    let (client, mut events) = crate::client(options, 4);
    client
        .publish(
            Topics::new(&settings.prefix).enroll(device),
            QoS::AtLeastOnce,
            false,
            payload,
        )
        .await
        .map_err(|e| failed(e.to_string()))?;
    let deadline = tokio::time::Instant::now() + ASK_TIMEOUT;
    loop {
        match tokio::time::timeout_at(deadline, events.poll()).await {
            Ok(Ok(Event::Incoming(Incoming::PubAck(_)))) => {
                let _ = client.disconnect().await;
                // Lets the disconnect go out; nothing waits on it.
                let _ = tokio::time::timeout(Duration::from_millis(200), events.poll()).await;
                return Ok(());
            }
            Ok(Ok(_)) => {}
            Ok(Err(rumqttc::ConnectionError::ConnectionRefused(
                rumqttc::ConnectReturnCode::NotAuthorized
                | rumqttc::ConnectReturnCode::BadUserNamePassword,
            ))) if user != ENROLL_USER => return Err(Asking::NotAUser),
            Ok(Err(e)) => return Err(failed(format!("asking to join as {user}: {e}"))),
            Err(_) => {
                return Err(failed(format!(
                    "asking to join: no answer from {} within {} s",
                    settings.url,
                    ASK_TIMEOUT.as_secs()
                )));
            }
        }
    }
}
