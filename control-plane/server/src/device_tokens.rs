//! Devices' token generations (issue 35): a device's token is the HMAC of
//! its id (generation 0, the token every device had before) or of its id and
//! generation, so an admin revokes it and issues a new one by raising the
//! generation (`device-tokens/ID`, a u64) without re-registering the device.
//! Every replica keeps the generations in memory from the store's change
//! feed, because the agents' WebSocket handshake checks a token without
//! waiting on the store; a raised generation also ends the device's open
//! session on every replica that holds one.
//!
//! Beside them, each device's accepted key (`device-keys/ID`, issue 55): a
//! device with one proves its key and its token no longer lets it in; a key
//! rejected or removed ends its session like a raised generation.

use drover_model::DeviceId;
use drover_rules::enrollment::{DeviceKeyRecord, KEY_PREFIX_KEY, KeyState, key_key};
use drover_store::db::{Db, DbError};
use std::collections::HashMap;
use std::sync::RwLock;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Where a device's token generation is kept (absent: 0).
pub const PREFIX: &str = "device-tokens/";

pub fn key(device: &DeviceId) -> String {
    format!("{PREFIX}{device}")
}

/// A device's token generation from the store (0 when never raised).
pub async fn generation(db: &Db, device: &DeviceId) -> Result<u64, DbError> {
    Ok(db.get::<u64>(&key(device)).await?.map_or(0, |(_, g)| g))
}

/// The generations in memory, as the store has them.
#[derive(Default)]
pub struct Generations {
    /// A std RwLock: held only to read or swap entries, never across an await.
    known: RwLock<HashMap<DeviceId, u64>>,
    /// Accepted public keys (hex).
    keys: RwLock<HashMap<DeviceId, String>>,
}

/// A device's accepted key from the store.
async fn accepted_key(db: &Db, device: &DeviceId) -> Result<Option<String>, DbError> {
    Ok(db
        .get::<DeviceKeyRecord>(&key_key(device))
        .await?
        .filter(|(_, k)| k.state == KeyState::Accepted)
        .map(|(_, k)| k.public_key))
}

impl Generations {
    /// A device's generation as this replica last heard it.
    pub fn get(&self, device: &DeviceId) -> u64 {
        self.known
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(device)
            .copied()
            .unwrap_or(0)
    }

    /// The device's accepted public key, as this replica last heard it.
    pub fn key_of(&self, device: &DeviceId) -> Option<String> {
        self.keys
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(device)
            .cloned()
    }

    /// Whether `token` lets `device` in: its token at its generation, and
    /// only while it has no accepted key (then only the key does).
    pub fn token_opens(
        &self,
        secrets: &crate::auth::Secrets,
        device: &DeviceId,
        token: &str,
    ) -> bool {
        self.key_of(device).is_none() && secrets.verify_device_at(device, self.get(device), token)
    }

    /// Reads every accepted key; returns the devices whose key changed, and
    /// of those the ones whose key known before is gone or replaced.
    async fn load_keys(
        &self,
        db: &Db,
    ) -> Result<(Vec<DeviceId>, Vec<(DeviceId, String)>), DbError> {
        let stored: HashMap<DeviceId, String> = db
            .list::<DeviceKeyRecord>(KEY_PREFIX_KEY)
            .await?
            .into_iter()
            .filter(|(_, _, k)| k.state == KeyState::Accepted)
            .map(|(_, _, k)| (k.device, k.public_key))
            .collect();
        let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
        let mut changed: Vec<DeviceId> = stored
            .iter()
            .filter(|(d, k)| keys.get(*d) != Some(*k))
            .map(|(d, _)| d.clone())
            .collect();
        changed.extend(keys.keys().filter(|d| !stored.contains_key(*d)).cloned());
        let gone = keys
            .iter()
            .filter(|(d, k)| stored.get(*d) != Some(*k))
            .map(|(d, k)| (d.clone(), k.clone()))
            .collect();
        *keys = stored;
        Ok((changed, gone))
    }

    /// Reads every generation and key; returns the devices whose
    /// generation or key changed, and those whose key is gone.
    async fn load(&self, db: &Db) -> Result<(Vec<DeviceId>, Vec<(DeviceId, String)>), DbError> {
        let (mut changed, gone) = self.load_keys(db).await?;
        changed.extend(self.load_generations(db).await?);
        Ok((changed, gone))
    }

    /// Reads every generation; returns the devices whose generation changed.
    async fn load_generations(&self, db: &Db) -> Result<Vec<DeviceId>, DbError> {
        let stored: HashMap<DeviceId, u64> = db
            .list::<u64>(PREFIX)
            .await?
            .into_iter()
            .filter_map(|(k, _, g)| Some((DeviceId::new(k[PREFIX.len()..].to_owned()).ok()?, g)))
            .collect();
        let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
        let changed = stored
            .iter()
            .filter(|(d, g)| known.get(*d) != Some(*g))
            .map(|(d, _)| d.clone())
            .collect();
        *known = stored;
        Ok(changed)
    }

    /// Loads the generations (then calls `loaded`), then follows the
    /// store's changes until `shutdown`, telling `raised` each device whose
    /// generation or key changed, and `key_gone` each whose accepted key was
    /// removed, rejected or replaced, with that key (its broker login goes
    /// too).
    pub async fn run(
        &self,
        db: Db,
        raised: impl Fn(&DeviceId),
        key_gone: impl Fn(&DeviceId, &str),
        mut loaded: impl FnMut(),
        shutdown: CancellationToken,
    ) {
        let mut feed = db.changes();
        let mut reload = true;
        loop {
            if reload {
                match self.load(&db).await {
                    Ok((changed, gone)) => {
                        changed.iter().for_each(&raised);
                        gone.iter().for_each(|(device, key)| key_gone(device, key));
                        reload = false;
                        loaded();
                    }
                    Err(e) => {
                        warn!(error = %e, "cannot read the devices' token generations; trying again");
                        tokio::select! {
                            _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => continue,
                            _ = shutdown.cancelled() => return,
                        }
                    }
                }
            }
            let change = tokio::select! {
                change = feed.recv() => change,
                _ = shutdown.cancelled() => return,
            };
            match change {
                Ok(change) => {
                    if let Some(id) = change.key.strip_prefix(KEY_PREFIX_KEY) {
                        let Ok(device) = DeviceId::new(id.to_owned()) else {
                            continue;
                        };
                        match accepted_key(&db, &device).await {
                            Ok(now) => {
                                let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
                                let before = match &now {
                                    Some(key) => keys.insert(device.clone(), key.clone()),
                                    None => keys.remove(&device),
                                };
                                drop(keys);
                                if before != now
                                    && let Some(before) = &before
                                {
                                    raised(&device);
                                    key_gone(&device, before);
                                }
                            }
                            Err(_) => reload = true,
                        }
                        continue;
                    }
                    let Some(id) = change.key.strip_prefix(PREFIX) else {
                        continue;
                    };
                    let Ok(device) = DeviceId::new(id.to_owned()) else {
                        continue;
                    };
                    match generation(&db, &device).await {
                        Ok(now) => {
                            let before = self
                                .known
                                .write()
                                .unwrap_or_else(|e| e.into_inner())
                                .insert(device.clone(), now);
                            if before.unwrap_or(0) != now {
                                raised(&device);
                            }
                        }
                        Err(_) => reload = true,
                    }
                }
                Err(RecvError::Lagged(_)) => reload = true,
                Err(RecvError::Closed) => return,
            }
        }
    }
}
