//! What an agent says of itself, on the delivery core's way in: its hello
//! and heartbeats, its device record, and whether its credentials still
//! open anything.

use super::*;
use drover_model::transport::Transport;

impl Dispatcher {
    /// A decommissioned device's credentials open nothing any more.
    pub(super) async fn revoked(
        &mut self,
        device: &DeviceId,
        work: &Work,
    ) -> Result<Option<Answer>, DbError> {
        let (_, record) = self.device_record(device, work).await?;
        Ok(record.decommissioned.then(|| {
            Answer::Refused(format!(
                "device {device} is decommissioned; its credentials are no longer accepted"
            ))
        }))
    }

    /// The stored device record (cached), or a new one.
    pub(super) async fn device_record(
        &mut self,
        device: &DeviceId,
        work: &Work,
    ) -> Result<(u64, DeviceRecord), DbError> {
        let key = device_key(device);
        if let Some(pending) = work.devices.get(&key) {
            return Ok(pending.clone());
        }
        if let Some(cached) = self.devices.get(device) {
            return Ok(cached.clone());
        }
        let found = self
            .db
            .get::<DeviceRecord>(&key)
            .await?
            .unwrap_or_else(|| (0, DeviceRecord::new(device.clone())));
        self.devices.insert(device.clone(), found.clone());
        Ok(found)
    }

    /// Writes the device record if `change` altered anything an operator or
    /// the planner reads, or its last-seen time is stale in the store.
    pub(super) async fn touch_device(
        &mut self,
        device: &DeviceId,
        work: &mut Work,
        change: impl FnOnce(&mut DeviceRecord),
    ) -> Result<Vec<String>, DbError> {
        let (expected, stored) = self.device_record(device, work).await?;
        let mut record = stored.clone();
        change(&mut record);
        let now = self.clock.now();
        // Every touch is the agent speaking: the first one is kept.
        record.first_connected.get_or_insert(now);
        let stale = record
            .last_seen
            .is_none_or(|seen| now.duration_since(seen) >= PRESENCE_PERSIST);
        if record == stored && !stale && expected != 0 {
            return Ok(Vec::new());
        }
        record.last_seen = Some(now);
        let key = device_key(device);
        work.devices.insert(key.clone(), (expected, record));
        Ok(vec![key])
    }

    pub(super) async fn hello(
        &mut self,
        transport: Transport,
        device: &DeviceId,
        hello: &AgentHello,
        work: &mut Work,
    ) -> Result<(Answer, Vec<String>, Vec<(String, Effect)>), DbError> {
        if let Some(refusal) = self.revoked(device, work).await? {
            return Ok((refusal, Vec::new(), Vec::new()));
        }
        if let Some(problem) =
            check_reported(&hello.agent_version, &hello.boot_id, &hello.capabilities)
        {
            return Ok((Answer::Refused(problem), Vec::new(), Vec::new()));
        }
        let now = self.clock.now();
        self.presence.update(device, |live| {
            Some(Live {
                transport,
                connected: true,
                last_seen: now,
                last_heartbeat: live.and_then(|l| l.last_heartbeat),
            })
        });
        let keys = self
            .touch_device(device, work, |record| {
                record.agent_present = true;
                record.agent_version = Some(hello.agent_version.clone());
                record.boot_id = Some(hello.boot_id.clone());
                record.capabilities = hello.capabilities.clone();
                record.transport = Some(transport.as_str().to_owned());
            })
            .await?;
        // Resync: jobs it holds are acknowledged; jobs sent but not held
        // were lost on the way and go out again.
        let held: HashSet<_> = hello.held.iter().map(|h| h.job_id).collect();
        let mut keys = keys;
        let mut effects = Vec::new();
        let open: Vec<String> = self
            .by_device
            .get(device)
            .map(|keys| keys.iter().cloned().collect())
            .unwrap_or_default();
        for key in open {
            let Some(job) = self.open.get_mut(&key) else {
                continue;
            };
            let holds = held.contains(&job.intent.job_id);
            let (delivery, these) =
                delivery::step(&job.facts(), &DeliveryEvent::Hello { holds, at: now });
            job.delivery = delivery;
            effects.extend(these.into_iter().map(|e| (key.clone(), e)));
            if holds {
                keys.extend(self.store_acked(&key, work).await?);
            }
        }
        self.presence.arrive(device);
        info!(device = %device, %transport, held = hello.held.len(), "agent connected");
        Ok((Answer::Stored, keys, effects))
    }

    pub(super) async fn heartbeat(
        &mut self,
        transport: Transport,
        device: &DeviceId,
        heartbeat: &Heartbeat,
        work: &mut Work,
    ) -> Result<(Answer, Vec<String>, Vec<(String, Effect)>), DbError> {
        if &heartbeat.device_id != device {
            return Ok((
                Answer::Refused(format!(
                    "heartbeat for device {} refused on the connection of {device}",
                    heartbeat.device_id
                )),
                Vec::new(),
                Vec::new(),
            ));
        }
        if let Some(refusal) = self.revoked(device, work).await? {
            return Ok((refusal, Vec::new(), Vec::new()));
        }
        let reported = [&heartbeat.os_release, &heartbeat.architecture];
        if let Some(problem) = check_reported(
            &heartbeat.agent_version,
            &heartbeat.boot_id,
            &heartbeat.capabilities,
        )
        .or_else(|| {
            reported
                .iter()
                .find_map(|text| check_text("a reported field", text, MAX_REPORTED))
        }) {
            return Ok((Answer::Refused(problem), Vec::new(), Vec::new()));
        }
        let now = self.clock.now();
        self.presence.update(device, |_| {
            Some(Live {
                transport,
                connected: true,
                last_seen: now,
                last_heartbeat: Some(now),
            })
        });
        let keys = self
            .touch_device(device, work, |record| {
                record.agent_present = true;
                record.boot_id = Some(heartbeat.boot_id.clone());
                record.capabilities = heartbeat.capabilities.clone();
                record.agent_version = Some(heartbeat.agent_version.clone());
                record.os_release = Some(heartbeat.os_release.clone());
                record.architecture = Some(heartbeat.architecture.clone());
                record.transport = Some(transport.as_str().to_owned());
                if record
                    .last_heartbeat
                    .is_none_or(|at| now.duration_since(at) >= PRESENCE_PERSIST)
                {
                    record.last_heartbeat = Some(now);
                }
            })
            .await?;
        Ok((Answer::Stored, keys, Vec::new()))
    }

    /// Writes last-seen times that went stale in the store, in one commit.
    pub(super) async fn flush_presence(&mut self) {
        let now = self.clock.now();
        let stale: Vec<DeviceId> = self
            .devices
            .iter()
            .filter(|(id, (_, record))| {
                self.presence.get(id).is_some_and(|live| {
                    live.connected
                        && record
                            .last_seen
                            .is_none_or(|seen| now.duration_since(seen) >= PRESENCE_PERSIST)
                })
            })
            .map(|(id, _)| id.clone())
            .collect();
        if stale.is_empty() {
            return;
        }
        let mut work = Work::default();
        for device in &stale {
            if let Err(e) = self.touch_device(device, &mut work, |_| {}).await {
                warn!(device = %device, error = %e, "cannot refresh a last-seen time");
            }
        }
        let _ = self.commit(work, true).await;
    }
}
