//! Devices joining over MQTT (issue 55), the control plane's end: a
//! request on `enroll/<id>` is judged by the control plane's gate, and an
//! accepted device's login is handed to mosquitto's dynamic security
//! plugin (`crate::dynsec`); a device whose key is removed or rejected
//! loses its login, and the broker closes its connection at once.
//!
//! Nothing is kept: the password travels from the request to the broker.
//! A device whose login is lost (a broker that lost its plugin's file)
//! finds its own login refused, asks again, and is let in again while its
//! key stays accepted. The other way round, a login that outlived its key
//! (a removal the broker never got: it was down, or the control plane
//! stopped first) is found when the control plane lists Drover's logins,
//! at its start and every few minutes, and removed.

use crate::server::MqttLinks;
use crate::{EnrollPublish, dynsec};
use drover_contract::gate::{EnrollAnswer, EnrollRequest, Proof};
use drover_contract::link::Inbound;
use drover_model::DeviceId;
use drover_model::enroll::MAX_ENROLL_FRAME;
use rumqttc::{Publish, QoS};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// How often the broker's logins are checked against the accepted keys.
const LIST_EVERY: Duration = Duration::from_secs(300);
/// The first check, once the link has subscribed to the plugin's answers.
const FIRST_LIST: Duration = Duration::from_secs(3);
/// How long a login handed to the broker is not handed again for the same
/// device asking again: the broker takes a while to make each (mosquitto
/// 2.0's plugin writes its whole file per command), and a device that
/// cannot log in yet asks again after its backoff; handing each such
/// request over again made more work for the broker the further behind it
/// fell, and 10,000 devices enrolling at once never got in
/// (`drover-sim enroll --transport mqtt`). A device whose login the broker
/// lost is let in again by its request after this.
const ADMIT_AGAIN_AFTER: Duration = Duration::from_secs(60);
/// Whether a login handed over at the times in `admitted` is to be handed
/// over for `device` at `now` (none within [`ADMIT_AGAIN_AFTER`]); notes
/// it. Old notes are dropped once many are held.
fn note_admission(
    admitted: &mut HashMap<DeviceId, Instant>,
    device: &DeviceId,
    now: Instant,
) -> bool {
    if admitted.len() >= 4096 {
        admitted.retain(|_, at| now.duration_since(*at) < ADMIT_AGAIN_AFTER);
    }
    match admitted.get(device) {
        Some(at) if now.duration_since(*at) < ADMIT_AGAIN_AFTER => false,
        _ => {
            admitted.insert(device.clone(), now);
            true
        }
    }
}

/// How long a login with no accepted key is given before it is removed: a
/// key accepted this moment reaches this replica's memory a little after
/// the broker has its login.
const GRACE: Duration = Duration::from_secs(2);

impl MqttLinks {
    /// A request to join: judged, answered at the broker when accepted, and
    /// acknowledged to the broker once decided (a control plane that stops
    /// first gets it again from its session).
    pub(crate) fn on_enroll(self: &Arc<Self>, device: DeviceId, publish: Publish) {
        if publish.payload.len() > MAX_ENROLL_FRAME {
            warn!(%device, bytes = publish.payload.len(), limit = MAX_ENROLL_FRAME,
                "enrollment request over the size limit dropped");
            self.ack_soon(publish);
            return;
        }
        let request = match serde_json::from_slice::<EnrollPublish>(&publish.payload) {
            Ok(request) => request,
            Err(e) => {
                warn!(%device, error = %e, "unreadable enrollment request dropped");
                self.ack_soon(publish);
                return;
            }
        };
        let links = self.clone();
        let mut gate = self.gate.subscribe();
        tokio::spawn(async move {
            let Ok(gate) = gate.wait_for(Option::is_some).await.map(|g| g.clone()) else {
                return;
            };
            let Some(gate) = gate else { return };
            let password = request.password.clone();
            let answer = gate
                .enroll(EnrollRequest {
                    device: device.clone(),
                    public_key: request.public_key,
                    token: request.token,
                    inventory: request.inventory,
                    proof: Proof::BrokerPassword(request.password),
                    peer: None,
                })
                .await;
            match answer {
                EnrollAnswer::Accepted => links.admit(&device, &password).await,
                EnrollAnswer::Pending => {
                    debug!(%device, "enrollment over MQTT waits for an operator")
                }
                EnrollAnswer::Refused(reason) => {
                    info!(%device, %reason, "enrollment over MQTT refused")
                }
            }
            links.ack(&publish).await;
        });
    }

    /// Hands `device`'s login to the broker, unless it was handed over
    /// within [`ADMIT_AGAIN_AFTER`].
    async fn admit(&self, device: &DeviceId, password: &str) {
        if !self.first_admission(device, Instant::now()) {
            debug!(%device, "device's login was handed to the MQTT broker lately; not again");
            return;
        }
        self.command(device, dynsec::admit(device, password), "handed to")
            .await;
    }

    /// Whether `device`'s login is to be handed over at `now`; notes it.
    fn first_admission(&self, device: &DeviceId, now: Instant) -> bool {
        let mut admitted = self.admitted.lock().unwrap_or_else(|e| e.into_inner());
        note_admission(&mut admitted, device, now)
    }

    /// Forgets that `device`'s login was handed over (it is removed).
    fn forget_admission(&self, device: &DeviceId) {
        self.admitted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(device);
    }

    /// Removes `device`'s login at the broker, which closes its connection
    /// (without its last will): its key was removed or rejected. The device
    /// is gone from here as if its will had come.
    pub fn revoke(self: &Arc<Self>, device: &DeviceId) {
        self.forget_admission(device);
        let (links, device) = (self.clone(), device.clone());
        tokio::spawn(async move {
            links
                .command(&device, dynsec::revoke(&device), "removed at")
                .await;
            links.send(Inbound::Gone { device }).await;
        });
    }

    /// Sends the plugin a command about `device`'s login; its answer comes
    /// on the response topic.
    async fn command(&self, device: &DeviceId, payload: Vec<u8>, what: &str) {
        match self
            .client
            .publish(dynsec::CONTROL_TOPIC, QoS::AtLeastOnce, false, payload)
            .await
        {
            Ok(()) => info!(%device, "device's login {what} the MQTT broker"),
            Err(e) => warn!(%device, error = %e, "device's login not {what} the MQTT broker"),
        }
    }

    /// The plugin's answers: what went wrong is logged; a listing of
    /// Drover's logins is checked against the accepted keys.
    pub(crate) fn on_dynsec_response(self: &Arc<Self>, publish: Publish) {
        for failure in dynsec::failures(&publish.payload) {
            warn!(%failure, "mosquitto's dynamic security plugin refused a command");
        }
        if let Some(devices) = dynsec::listed_devices(&publish.payload) {
            self.on_listing(devices);
        }
        if let Some(missing) = dynsec::missing_enroll_users(&publish.payload)
            && !missing.is_empty()
        {
            let links = self.clone();
            tokio::spawn(async move {
                let payload = dynsec::create_enroll_users(&missing);
                match links
                    .client
                    .publish(dynsec::CONTROL_TOPIC, QoS::AtLeastOnce, false, payload)
                    .await
                {
                    Ok(()) => info!(
                        users = missing.len(),
                        "the MQTT broker lacked enrollment users; made them"
                    ),
                    Err(e) => {
                        warn!(error = %e, "cannot make the enrollment users at the MQTT broker")
                    }
                }
            });
        }
        self.ack_soon(publish);
    }

    /// Checks the broker's logins now and every [`LIST_EVERY`] while these
    /// links live (from [`MqttLinks::judge_with`]).
    pub(crate) fn list_logins_periodically(self: &Arc<Self>) {
        let links = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut wait = FIRST_LIST;
            loop {
                tokio::time::sleep(wait).await;
                let Some(links) = links.upgrade() else { return };
                if let Err(e) = links
                    .client
                    .publish(
                        dynsec::CONTROL_TOPIC,
                        QoS::AtLeastOnce,
                        false,
                        dynsec::list_logins(),
                    )
                    .await
                {
                    warn!(error = %e, "cannot list the devices' logins at the MQTT broker");
                }
                wait = LIST_EVERY;
            }
        });
    }

    /// Removes each listed login whose device has no accepted key (after
    /// [`GRACE`], asking again).
    fn on_listing(self: &Arc<Self>, devices: Vec<DeviceId>) {
        let Some(gate) = self.gate.borrow().clone() else {
            return;
        };
        let stale: Vec<DeviceId> = devices
            .into_iter()
            .filter(|device| gate.key_of(device).is_none())
            .collect();
        if stale.is_empty() {
            return;
        }
        let links = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(GRACE).await;
            for device in stale {
                if gate.key_of(&device).is_none() {
                    warn!(%device, "a login at the MQTT broker outlived its device's key; removing it");
                    links.revoke(&device);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_login_is_handed_over_once_a_minute_per_device() {
        let mut admitted = HashMap::new();
        let (pi, other) = (
            DeviceId::new("pi-1").unwrap(),
            DeviceId::new("pi-2").unwrap(),
        );
        let start = Instant::now();
        assert!(note_admission(&mut admitted, &pi, start));
        assert!(!note_admission(
            &mut admitted,
            &pi,
            start + Duration::from_secs(59)
        ));
        assert!(note_admission(
            &mut admitted,
            &other,
            start + Duration::from_secs(1)
        ));
        assert!(note_admission(
            &mut admitted,
            &pi,
            start + ADMIT_AGAIN_AFTER
        ));
        // Many notes: the old ones go, the recent stay.
        let later = start + ADMIT_AGAIN_AFTER * 3;
        for i in 0..4096 {
            let device = DeviceId::new(format!("d-{i}")).unwrap();
            note_admission(&mut admitted, &device, start);
        }
        assert!(note_admission(
            &mut admitted,
            &DeviceId::new("new").unwrap(),
            later
        ));
        assert!(admitted.len() < 10, "{}", admitted.len());
    }
}
