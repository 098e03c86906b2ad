//! The store's change feed, as the delivery core follows it: what other
//! writers (another replica, the API) did to the jobs and devices it keeps
//! open.

use super::*;

impl Dispatcher {
    /// Other writers changed these keys (another replica, the API, or this
    /// process: those are skipped by revision).
    pub(super) async fn changed(&mut self, changes: Vec<Change>) {
        let now = self.clock.now();
        let mut consider = Vec::new();
        let mut cancels = Vec::new();
        for change in changes {
            if change.key.starts_with("devices/") {
                if let Some(id) = change
                    .key
                    .strip_prefix("devices/")
                    .and_then(|id| DeviceId::new(id).ok())
                    && self
                        .devices
                        .get(&id)
                        .is_some_and(|(rev, _)| change.deleted || *rev < change.revision)
                {
                    self.devices.remove(&id);
                }
                continue;
            }
            if !change.key.starts_with("jobs/") {
                continue;
            }
            if change.deleted {
                // A deleted job that was undecided (its run ended at the
                // deadline while the device still had it): a broker forgets
                // its intent too.
                if self.open.contains_key(&change.key) {
                    self.effect(change.key.clone(), Effect::Withdraw);
                }
                self.forget(&change.key);
                continue;
            }
            if self
                .open
                .get(&change.key)
                .is_some_and(|o| o.revision >= change.revision)
            {
                continue;
            }
            let known = self.open.contains_key(&change.key);
            let canceling = self
                .open
                .get(&change.key)
                .is_some_and(|o| o.cancel != Cancel::NotRequested);
            match self.db.get::<JobDelivery>(&change.key).await {
                Ok(Some((revision, job))) => {
                    if self.track(&change.key, revision, &job) {
                        if !known {
                            consider.push(change.key);
                        } else if !canceling && job.cancel_requested_at.is_some() {
                            cancels.push(change.key);
                        }
                    }
                }
                Ok(None) => self.forget(&change.key),
                Err(e) => warn!(key = %change.key, error = %e, "cannot read a changed job"),
            }
        }
        // A job whose cancel was just requested: its order goes out now (from
        // every replica that tracks it; a second order changes nothing).
        for key in cancels {
            self.ensure_device(&key).await;
            if let Some(job) = self.open.get_mut(&key) {
                let (delivery, effects) = delivery::step(&job.facts(), &DeliveryEvent::Cancel);
                job.delivery = delivery;
                info!(job_id = %job.intent.job_id, device = %job.intent.device_id, "canceling the job");
                for effect in effects {
                    self.effect(key.clone(), effect);
                }
            }
        }
        // A job another writer released: a link that reaches the device
        // only from here (a WebSocket connection) delivers it now; a broker
        // link leaves it to its releaser, and takes over after the ack
        // timeout (the sweeper).
        for key in consider {
            self.ensure_device(&key).await;
            let brokered = self.link_for_key(&key).is_none_or(|link| link.brokered());
            if brokered {
                if let Some(job) = self.open.get_mut(&key) {
                    job.last_attempt.get_or_insert(now);
                }
            } else {
                self.consider(&key, now);
            }
        }
        self.start_queued();
    }
}
