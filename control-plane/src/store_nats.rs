//! The control plane's store on NATS JetStream KV, for several replicas over
//! one fleet. Every write is a compare-and-set on the key's revision (the
//! stream sequence), exactly the contract of [`KvStore`]; no replica keeps
//! state in memory that another needs. Keys map `/` to `.` so that a prefix
//! listing is a subject filter (`jobs/dev-1/` → `jobs.dev-1.>`).
//!
//! The trait is synchronous (the embedded redb store is), so calls block in
//! place on the runtime; the control plane runs a multi-threaded runtime.

use crate::store::{Entry, KvError, KvStore};
use async_nats::jetstream::{self, consumer, kv, stream};
use futures_util::StreamExt;
use std::future::Future;
use std::time::Duration;

pub const BUCKET: &str = "drover-control-plane";

pub struct NatsKv {
    js: jetstream::Context,
    kv: kv::Store,
    handle: tokio::runtime::Handle,
}

fn db_error(e: impl std::fmt::Display) -> KvError {
    KvError::Db(format!("NATS KV: {e}"))
}

fn to_nats(key: &str) -> String {
    key.replace('/', ".")
}

fn from_nats(key: &str) -> String {
    key.replace('.', "/")
}

impl NatsKv {
    /// Opens the bucket, creating its stream if needed (directly: async-nats
    /// 0.51 cannot create a bucket on nats-server 2.9).
    pub async fn open(client: async_nats::Client) -> Result<Self, KvError> {
        let js = jetstream::new(client);
        let config = stream::Config {
            name: format!("KV_{BUCKET}"),
            subjects: vec![format!("$KV.{BUCKET}.>")],
            max_messages_per_subject: 1,
            storage: stream::StorageType::File,
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            discard: stream::DiscardPolicy::New,
            duplicate_window: Duration::from_secs(120),
            max_message_size: -1,
            num_replicas: 1,
            ..Default::default()
        };
        js.get_or_create_stream(config).await.map_err(db_error)?;
        let kv = js.get_key_value(BUCKET).await.map_err(db_error)?;
        Ok(Self {
            js,
            kv,
            handle: tokio::runtime::Handle::current(),
        })
    }

    fn block<F: Future>(&self, future: F) -> F::Output {
        tokio::task::block_in_place(|| self.handle.block_on(future))
    }

    async fn list_async(&self, prefix: &str) -> Result<Vec<(String, Entry)>, KvError> {
        let filter = match prefix.strip_suffix('/') {
            Some(stem) if !stem.is_empty() => format!("$KV.{BUCKET}.{}.>", to_nats(stem)),
            _ => format!("$KV.{BUCKET}.>"),
        };
        let config = consumer::pull::Config {
            filter_subject: filter,
            deliver_policy: consumer::DeliverPolicy::LastPerSubject,
            ack_policy: consumer::AckPolicy::None,
            inactive_threshold: Duration::from_secs(30),
            memory_storage: true,
            ..Default::default()
        };
        let stream = format!("KV_{BUCKET}");
        let consumer: consumer::PullConsumer = self
            .js
            .create_consumer_on_stream(config, &stream)
            .await
            .map_err(db_error)?;
        let mut pending = consumer.cached_info().num_pending as usize;
        let name = consumer.cached_info().name.clone();
        let mut out = Vec::with_capacity(pending);
        while pending > 0 {
            let mut batch = consumer
                .fetch()
                .max_messages(pending.min(1000))
                .expires(Duration::from_secs(5))
                .messages()
                .await
                .map_err(db_error)?;
            let mut got = 0usize;
            while let Some(message) = batch.next().await {
                let message = message.map_err(db_error)?;
                got += 1;
                let deleted = message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("KV-Operation"))
                    .is_some();
                let info = message.info().map_err(db_error)?;
                let revision = info.stream_sequence;
                let key = message
                    .subject
                    .as_str()
                    .strip_prefix(&format!("$KV.{BUCKET}."))
                    .map(from_nats)
                    .unwrap_or_default();
                if !deleted && key.starts_with(prefix) {
                    out.push((
                        key,
                        Entry {
                            revision,
                            value: message.payload.to_vec(),
                        },
                    ));
                }
            }
            if got == 0 {
                break;
            }
            pending = pending.saturating_sub(got);
        }
        let _ = self.js.delete_consumer_from_stream(&name, &stream).await;
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

impl KvStore for NatsKv {
    fn get(&self, key: &str) -> Result<Option<Entry>, KvError> {
        let entry = self.block(self.kv.entry(to_nats(key))).map_err(db_error)?;
        Ok(entry
            .filter(|e| e.operation == kv::Operation::Put)
            .map(|e| Entry {
                revision: e.revision,
                value: e.value.to_vec(),
            }))
    }

    fn put(&self, key: &str, value: &[u8], expected: u64) -> Result<u64, KvError> {
        let nats_key = to_nats(key);
        let bytes = value.to_vec().into();
        if expected == 0 {
            match self.block(self.kv.create(&nats_key, bytes)) {
                Ok(revision) => Ok(revision),
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                    Err(KvError::Conflict {
                        key: key.to_owned(),
                        expected,
                        found: self.get(key)?.map(|e| e.revision).unwrap_or(0),
                    })
                }
                Err(e) => Err(db_error(e)),
            }
        } else {
            match self.block(self.kv.update(&nats_key, bytes, expected)) {
                Ok(revision) => Ok(revision),
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    Err(KvError::Conflict {
                        key: key.to_owned(),
                        expected,
                        found: self.get(key)?.map(|e| e.revision).unwrap_or(0),
                    })
                }
                Err(e) => Err(db_error(e)),
            }
        }
    }

    fn delete(&self, key: &str, expected: u64) -> Result<(), KvError> {
        self.block(self.kv.delete_expect_revision(to_nats(key), Some(expected)))
            .map_err(|e| KvError::Conflict {
                key: format!("{key} ({e})"),
                expected,
                found: 0,
            })
    }

    fn list(&self, prefix: &str) -> Result<Vec<(String, Entry)>, KvError> {
        self.block(self.list_async(prefix))
    }
}
