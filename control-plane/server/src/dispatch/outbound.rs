//! The delivery core's way out: running the delivery rules' effects on a
//! device's link, starting queued deliveries, the sweeper that sends again
//! and expires.

use super::*;
use drover_model::transport::Transport;

impl Dispatcher {
    pub(super) fn link_for_key(&self, key: &str) -> Option<Arc<dyn AgentLinks>> {
        let device = &self.open.get(key)?.intent.device_id;
        self.link_for(device)
    }

    /// The link a device is reached through: the one it is connected over
    /// here, else the one it last spoke over.
    pub(super) fn link_for(&self, device: &DeviceId) -> Option<Arc<dyn AgentLinks>> {
        let transport = match self.presence.get(device) {
            Some(live) if live.connected => Some(live.transport),
            // The record keeps the transport's name.
            _ => self
                .devices
                .get(device)
                .and_then(|(_, d)| d.transport.as_deref()?.parse().ok()),
        }?;
        self.links.get(&transport).cloned()
    }

    pub(super) fn effect(&mut self, key: String, effect: Effect) {
        match effect {
            Effect::Send => {
                if self.queued_keys.insert(key.clone()) {
                    self.queued.push_back(key);
                }
            }
            Effect::Withdraw => {
                let Some((device, job)) = parse_job_key(&key) else {
                    return;
                };
                let Some(link) = self.link_for(&device) else {
                    return;
                };
                self.in_flight.spawn(async move {
                    let result = link.withdraw(&device, job).await.map(|()| Delivered::Sent);
                    (Flight::Withdrawal, link.transport(), result)
                });
            }
            Effect::SendCancel => {
                let Some(job) = self.open.get_mut(&key) else {
                    return;
                };
                job.last_attempt = Some(self.clock.now());
                let device = job.intent.device_id.clone();
                let order = serde_json::json!({
                    drover_model::wire::CANCEL_FIELD: job.intent.job_id,
                    "deviceId": device,
                    "attempt": job.intent.attempt,
                });
                let job_id = job.intent.job_id;
                let Some(link) = self.link_for(&device) else {
                    debug!(
                        key,
                        "no link reaches the device yet; the cancel order waits for it"
                    );
                    return;
                };
                let signed = self.signer.sign_value(order);
                self.in_flight.spawn(async move {
                    let result = link.cancel(&device, job_id, &signed).await;
                    (Flight::Cancel(key), link.transport(), result)
                });
            }
        }
    }

    /// Starts queued deliveries while fewer than [`MAX_IN_FLIGHT`] run.
    pub(super) fn start_queued(&mut self) {
        let now = self.clock.now();
        while self.in_flight.len() < MAX_IN_FLIGHT {
            let Some(key) = self.queued.pop_front() else {
                return;
            };
            self.queued_keys.remove(&key);
            let Some(job) = self.open.get_mut(&key) else {
                continue;
            };
            // A job being canceled never goes out again.
            if job.delivery != Delivery::Created || job.cancel != Cancel::NotRequested {
                continue;
            }
            job.last_attempt = Some(now);
            let mut intent = job.intent.clone();
            let Some(link) = self.link_for(&intent.device_id) else {
                debug!(key, "no link reaches the device yet; delivery waits for it");
                continue;
            };
            // Sent as it goes out, so that nothing sends it twice meanwhile;
            // a delivery that does not happen returns it to created.
            if let Some(job) = self.open.get_mut(&key) {
                let (delivery, _) =
                    delivery::step(&job.facts(), &DeliveryEvent::Delivered { at: now });
                job.delivery = delivery;
            }
            let (signer, enricher) = (self.signer.clone(), self.enricher.clone());
            let clock = self.clock.clone();
            self.in_flight.spawn(async move {
                // Enrichers: what a job needs is attached here, as it goes
                // out, and never stored; then the whole intent is signed.
                if let Some(enricher) = enricher
                    && let Err(e) = crate::kinds::enrich(&enricher, &mut intent, now).await
                {
                    warn!(key, error = %e, "cannot attach what the job needs; the device will fail it");
                }
                let signed = signer.sign(&intent);
                let result = link.deliver(&intent, &signed, clock.now()).await;
                (Flight::Intent(key), link.transport(), result)
            });
        }
    }

    pub(super) fn delivered(
        &mut self,
        flight: Flight,
        transport: Transport,
        result: Result<Delivered, LinkError>,
    ) {
        let key = match flight {
            Flight::Intent(key) => key,
            Flight::Withdrawal => {
                if let Err(e) = result {
                    debug!(error = %e, "cannot withdraw an intent");
                }
                return;
            }
            Flight::Cancel(key) => {
                let (out, failed) = match result {
                    Ok(Delivered::Sent) => (true, false),
                    Ok(Delivered::NotConnected) => (false, false),
                    Err(e) => {
                        warn!(key, error = %e, "cannot deliver a cancel order; trying again at the next sweep");
                        (false, true)
                    }
                };
                if let Some(job) = self.open.get_mut(&key) {
                    job.cancel = if out {
                        Cancel::OrderOut
                    } else {
                        Cancel::Requested
                    };
                    if failed {
                        job.last_attempt = None;
                    }
                }
                return;
            }
        };
        let key = key.as_str();
        let (undo, failed) = match result {
            Ok(Delivered::Sent) => {
                debug!(key, %transport, "intent delivered");
                (false, false)
            }
            Ok(Delivered::NotConnected) => {
                debug!(key, %transport, "device not connected here");
                (true, false)
            }
            Err(e) => {
                warn!(key, error = %e, "cannot deliver an intent; trying again at the next sweep");
                (true, true)
            }
        };
        if undo
            && let Some(job) = self.open.get_mut(key)
            && matches!(job.delivery, Delivery::Sent { .. })
        {
            job.delivery = Delivery::Created;
            // A link that failed (a broker electing a leader, say) is tried
            // again at the next sweep, not a whole ack timeout later.
            if failed {
                job.last_attempt = None;
            }
        }
    }

    /// The sweeper: sends again what was not acknowledged in time, tries
    /// again what never got out, and expires what was never taken.
    pub(super) async fn sweep(&mut self) {
        let now = self.clock.now();
        let timeout = self.ack_timeout();
        let mut expired = Vec::new();
        let keys: Vec<String> = self.open.keys().cloned().collect();
        for key in keys {
            let Some(job) = self.open.get_mut(&key) else {
                continue;
            };
            let due = job
                .last_attempt
                .is_none_or(|at| now.duration_since(at) >= timeout);
            // A cancel order that did not get out is tried again as often as
            // an intent would be.
            if job.cancel == Cancel::Requested && !due {
                continue;
            }
            let retry_created =
                job.delivery == Delivery::Created && job.cancel == Cancel::NotRequested && due;
            if retry_created {
                self.ensure_device(&key).await;
            }
            let Some(job) = self.open.get_mut(&key) else {
                continue;
            };
            let event = if retry_created {
                DeliveryEvent::Consider { now }
            } else {
                DeliveryEvent::Tick {
                    now,
                    ack_timeout: timeout,
                }
            };
            let (delivery, effects) = delivery::step(&job.facts(), &event);
            if matches!(delivery, Delivery::Expired { .. }) {
                expired.push((key, delivery));
                continue;
            }
            if delivery == Delivery::Created && matches!(job.delivery, Delivery::Sent { .. }) {
                info!(job_id = %job.intent.job_id, device = %job.intent.device_id, "no ack in time; sending the job again");
            }
            job.delivery = delivery;
            for effect in effects {
                self.effect(key.clone(), effect);
            }
        }
        for (key, delivery) in expired {
            self.expire(&key, delivery).await;
        }
        self.start_queued();
        let gauge = &crate::metrics::metrics().jobs_undecided;
        gauge.clear();
        for ((state, kind), count) in undecided_counts(self.open.values()) {
            gauge
                .get_or_create(&vec![("state", state.into()), ("kind", kind.into())])
                .set(count);
        }
    }

    /// Moves the brokers' status cursors forward (never back).
    pub(super) async fn commit_cursors(&self, cursors: &HashMap<Transport, u64>) {
        let mut ops = Vec::new();
        for (transport, position) in cursors {
            let key = cursor_key(*transport);
            match self.db.get::<u64>(&key).await {
                Ok(current) => {
                    let (expected, stored) = current.unwrap_or((0, 0));
                    if *position > stored
                        && let Ok(value) = Db::encode(position)
                    {
                        ops.push(Op::Put {
                            key,
                            value,
                            expected,
                        });
                    }
                }
                Err(e) => warn!(error = %e, "cannot read a status cursor"),
            }
        }
        if !ops.is_empty()
            && let Err(e) = self.db.commit(ops).await
        {
            warn!(error = %e, "cannot move a status cursor; a restart reads a little more again");
        }
    }

    pub(super) async fn expire(&mut self, key: &str, delivery: Delivery) {
        let result = self
            .db
            .update::<JobDelivery, _>(key, |current| {
                let mut job = current?;
                if job.status.is_some() || matches!(job.delivery, Delivery::Expired { .. }) {
                    return None;
                }
                job.delivery = delivery.clone();
                Some(job)
            })
            .await;
        match result {
            Ok(Some(job)) if matches!(job.delivery, Delivery::Expired { .. }) => {
                info!(job_id = %job.intent.job_id, device = %job.intent.device_id, "intent expired before the device took it");
                // Decided here, not by a status.
                count_decided(&job);
                self.forget(key);
                self.effect(key.to_owned(), Effect::Withdraw);
            }
            Ok(_) => {}
            Err(e) => warn!(key, error = %e, "cannot expire a job"),
        }
    }
}
