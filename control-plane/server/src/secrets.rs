//! Secrets and the enrichers that attach what a job needs as it goes out.
//!
//! A `Secret` (`spec.data: {key: value}`) is stored as `secrets/<name>`,
//! sealed at rest with AES-256-GCM under `seal.key` (32 random bytes in the
//! data directory, shared by replicas like `secret.key`), its name as
//! associated data. The API never returns a value. A package job names its
//! secrets; at every delivery the enricher opens them and seals their files
//! to the device and job (`drover_model::sealed`), and adds a fresh download
//! link. Neither is ever written to the store.

use crate::auth::{Secrets, random_hex, read_or_create};
use crate::packages::Downloads;
use anyhow::Context;
use drover_model::sealed::{SecretFile, open_with, parse_nonce, seal_with};
use drover_model::signing::{hex, unhex};
use drover_rules::records::{SecretRecord, secret_key};
use drover_store::db::{Db, DbError};
use jiff::Timestamp;
use ring::aead::{AES_256_GCM, LessSafeKey, UnboundKey};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// The key secrets are sealed with at rest.
pub struct Vault {
    key: LessSafeKey,
}

impl Vault {
    pub fn load_or_create(data: &Path) -> anyhow::Result<Self> {
        crate::auth::ensure_data_dir(data)?;
        let path = data.join("seal.key");
        let text = read_or_create(&path, || random_hex(32))?;
        let bytes = unhex(&text)
            .filter(|k| k.len() == 32)
            .with_context(|| format!("{} is not a 32-byte hex key", path.display()))?;
        let key = UnboundKey::new(&AES_256_GCM, &bytes)
            .map_err(|_| anyhow::anyhow!("{} is not an AES-256 key", path.display()))?;
        Ok(Self {
            key: LessSafeKey::new(key),
        })
    }

    fn aad(name: &str) -> String {
        format!("drover-secret-at-rest:v1:{name}")
    }

    pub fn seal(
        &self,
        name: &str,
        data: &BTreeMap<String, String>,
    ) -> Result<SecretRecord, String> {
        let bytes = serde_json::to_vec(data).map_err(|e| e.to_string())?;
        let (nonce, bytes) = seal_with(&self.key, Self::aad(name).as_bytes(), bytes, "the secret")?;
        Ok(SecretRecord {
            name: name.to_owned(),
            keys: data.keys().cloned().collect(),
            nonce: hex(&nonce),
            ciphertext: hex(&bytes),
            updated_at: Timestamp::now(),
        })
    }

    pub fn open(&self, record: &SecretRecord) -> Result<BTreeMap<String, String>, String> {
        let nonce = parse_nonce(&record.nonce)
            .ok_or_else(|| format!("secret {}: malformed nonce", record.name))?;
        let bytes = unhex(&record.ciphertext)
            .ok_or_else(|| format!("secret {}: malformed ciphertext", record.name))?;
        let plain = open_with(&self.key, Self::aad(&record.name).as_bytes(), nonce, bytes)
            .ok_or_else(|| {
                format!(
                    "secret {} does not open with this control plane's seal.key",
                    record.name
                )
            })?;
        serde_json::from_slice(&plain).map_err(|e| format!("secret {}: {e}", record.name))
    }
}

/// What the delivery core attaches to a job as it goes out.
pub struct Enricher {
    pub db: Db,
    pub secrets: Arc<Secrets>,
    pub vault: Arc<Vault>,
    pub downloads: Option<Arc<Downloads>>,
}

impl Enricher {
    /// The files of the named Secrets, opened (a job's kind seals them to
    /// the device and job: the kinds module).
    pub(crate) async fn files(&self, names: &[String]) -> Result<Vec<SecretFile>, String> {
        let mut files = Vec::new();
        for name in names {
            let record = self
                .db
                .get::<SecretRecord>(&secret_key(name))
                .await
                .map_err(|e: DbError| e.to_string())?
                .map(|(_, record)| record)
                .ok_or_else(|| format!("secret {name} does not exist"))?;
            for (key, value) in self.vault.open(&record)? {
                files.push(SecretFile {
                    secret: name.clone(),
                    key,
                    value,
                });
            }
        }
        Ok(files)
    }
}
