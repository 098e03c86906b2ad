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

use crate::admissions::Command;
use crate::server::MqttLinks;
use crate::{EnrollPublish, dynsec};
use drover_contract::gate::{EnrollAnswer, EnrollRequest, Proof};
use drover_contract::link::Inbound;
use drover_model::DeviceId;
use drover_model::enroll::MAX_ENROLL_FRAME;
use rumqttc::{Publish, QoS};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// How often the broker's logins are checked against the accepted keys.
const LIST_EVERY: Duration = Duration::from_secs(300);
/// The first check, once the link has subscribed to the plugin's answers.
const FIRST_LIST: Duration = Duration::from_secs(3);
/// How often the commands waiting are looked at with nothing else to wake
/// them (for those whose answers are overdue).
const LOOK_EVERY: Duration = Duration::from_secs(1);

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
                EnrollAnswer::Accepted => links.admit(&device, &password),
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

    /// `device`'s login is to be handed to the broker (unless it is on its
    /// way, or was made lately).
    fn admit(&self, device: &DeviceId, password: &str) {
        if self.logins.state().admit(device, password, Instant::now()) {
            self.logins.wake.notify_one();
        } else {
            debug!(%device, "device's login is on its way to the MQTT broker or was made lately");
        }
    }

    /// Removes `device`'s login at the broker, which closes its connection
    /// (without its last will): its key was removed or rejected. The device
    /// is gone from here as if its will had come.
    pub fn revoke(self: &Arc<Self>, device: &DeviceId) {
        self.logins.state().remove(device);
        self.logins.wake.notify_one();
        let (links, device) = (self.clone(), device.clone());
        tokio::spawn(async move { links.send(Inbound::Gone { device }).await });
    }

    /// Sends the plugin what is waiting, as the window lets it, while these
    /// links live (from [`MqttLinks::judge_with`]). A login is made only
    /// for a device whose key is accepted still.
    pub(crate) fn send_logins(self: &Arc<Self>) {
        let links = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(links) = links.upgrade() else { return };
                loop {
                    let next = links.logins.state().next(Instant::now());
                    let Some((device, command)) = next else { break };
                    let accepted = links
                        .gate
                        .borrow()
                        .as_ref()
                        .is_some_and(|gate| gate.key_of(&device).is_some());
                    if command != Command::Delete && !accepted {
                        links.logins.state().dropped(&device);
                        debug!(%device, "device's key is no longer accepted; its login is not made");
                        continue;
                    }
                    let payload = dynsec::command(&device, &command);
                    if let Err(e) = links
                        .client
                        .publish(dynsec::CONTROL_TOPIC, QoS::AtLeastOnce, false, payload)
                        .await
                    {
                        warn!(%device, error = %e, command = command.name(),
                            "cannot send the MQTT broker a command about a device's login");
                    }
                }
                let wake = links.logins.wake.notified();
                tokio::select! {
                    _ = wake => {}
                    _ = tokio::time::sleep(LOOK_EVERY) => {}
                }
            }
        });
    }

    /// The plugin's answers: what went wrong is logged; a listing of
    /// Drover's logins is checked against the accepted keys.
    pub(crate) fn on_dynsec_response(self: &Arc<Self>, publish: Publish) {
        for failure in dynsec::failures(&publish.payload) {
            warn!(%failure, "mosquitto's dynamic security plugin refused a command");
        }
        let answers = dynsec::answers(&publish.payload);
        if !answers.is_empty() {
            let now = Instant::now();
            let mut logins = self.logins.state();
            for answer in answers {
                let error = answer.error.as_deref();
                if logins.answered(&answer.device, &answer.command, error, now) && error.is_none() {
                    let device = &answer.device;
                    match answer.command.as_str() {
                        "deleteClient" => {
                            info!(%device, "device's login removed at the MQTT broker")
                        }
                        _ => info!(%device, "device's login made at the MQTT broker"),
                    }
                }
            }
            drop(logins);
            self.logins.wake.notify_one();
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
