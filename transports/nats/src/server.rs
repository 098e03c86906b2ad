//! The control plane's end over NATS: creating or checking the two buckets,
//! and the nats-server authorization that lets each device read only its own
//! intents and write only its own statuses and heartbeat.

pub use crate::MAX_VALUE_BYTES;
use crate::{
    HEARTBEAT_PREFIX, HELD_PER_DEVICE, HELD_PREFIX, HELD_STREAM, INTENT_BUCKET,
    INTENT_REPUBLISH_PREFIX, NatsError, NatsSettings, STATUS_BUCKET, connect_options, held_subject,
    hello_subject, inbox_prefix, key_subject, status_subject, stream_name,
};
use async_nats::jetstream::{self, kv, stream};
use drover_model::DeviceId;
use std::time::Duration;

#[derive(Debug, Clone, Copy)]
pub struct BucketLimits {
    pub max_bytes: i64,
    pub max_age: Duration,
    /// Copies JetStream keeps of each bucket: 1 on one server, 3 on a
    /// cluster of three (a write is acknowledged once a majority has it).
    pub replicas: usize,
}

impl Default for BucketLimits {
    fn default() -> Self {
        Self {
            max_bytes: 1024 * 1024 * 1024,
            // Longer than the longest deadline (30 days), so no live intent ages out.
            max_age: Duration::from_secs(31 * 24 * 3600),
            replicas: 1,
        }
    }
}

pub struct Buckets {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub intents: kv::Store,
    pub statuses: kv::Store,
    /// Statuses agents published while no control plane answered.
    pub held: stream::Stream,
}

pub async fn connect(settings: &NatsSettings, name: &str) -> Result<async_nats::Client, NatsError> {
    connect_options(settings)
        .name(name)
        .retry_on_initial_connect()
        .connect(settings.addresses()?)
        .await
        .map_err(|e| NatsError::Connect {
            url: settings.url.clone(),
            reason: e.to_string(),
        })
}

/// Creates the buckets, or checks them if they exist. The streams are made
/// directly because async-nats 0.51 cannot create a bucket on nats-server 2.9
/// (the account info reply lacks fields it requires); the configuration is
/// the one it would build, plus a republish on the intent bucket.
pub async fn ensure_buckets(
    client: async_nats::Client,
    limits: BucketLimits,
) -> Result<Buckets, NatsError> {
    let js = jetstream::new(client.clone());
    for bucket in [INTENT_BUCKET, STATUS_BUCKET] {
        let republish = (bucket == INTENT_BUCKET).then(|| stream::Republish {
            source: format!("$KV.{bucket}.>"),
            destination: format!("{INTENT_REPUBLISH_PREFIX}.>"),
            headers_only: false,
        });
        let config = stream::Config {
            name: stream_name(bucket),
            subjects: vec![format!("$KV.{bucket}.>")],
            max_messages_per_subject: 1,
            max_bytes: limits.max_bytes,
            max_age: limits.max_age,
            storage: stream::StorageType::File,
            // No rollups: a message with `Nats-Rollup: all` on a device's
            // own status key would purge every device's statuses. Drover
            // never purges a key (a delete is a marker, not a rollup).
            allow_rollup: false,
            deny_delete: true,
            allow_direct: true,
            discard: stream::DiscardPolicy::New,
            duplicate_window: limits.max_age.min(Duration::from_secs(120)),
            // A value is at most Drover's largest message; a device cannot
            // put more under one key.
            max_message_size: MAX_VALUE_BYTES,
            num_replicas: limits.replicas,
            republish,
            ..Default::default()
        };
        let mut existing = js.get_or_create_stream(config.clone()).await.map_err(|e| {
            NatsError::JetStream(format!("cannot create or open the {bucket} bucket: {e}"))
        })?;
        // A bucket made by an older Drover takes today's limits.
        let current = existing
            .info()
            .await
            .map_err(|e| NatsError::JetStream(format!("cannot read the {bucket} bucket: {e}")))?
            .config
            .clone();
        if current.allow_rollup != config.allow_rollup
            || current.max_message_size != config.max_message_size
        {
            let updated = stream::Config {
                allow_rollup: config.allow_rollup,
                max_message_size: config.max_message_size,
                ..current
            };
            js.update_stream(updated).await.map_err(|e| {
                NatsError::JetStream(format!("cannot update the {bucket} bucket's limits: {e}"))
            })?;
            tracing::info!(
                bucket,
                "bucket updated: no rollups, values of at most {MAX_VALUE_BYTES} bytes"
            );
        }
    }
    let intents = js
        .get_key_value(INTENT_BUCKET)
        .await
        .map_err(|e| NatsError::JetStream(e.to_string()))?;
    let statuses = js
        .get_key_value(STATUS_BUCKET)
        .await
        .map_err(|e| NatsError::JetStream(e.to_string()))?;
    let held = js
        .get_or_create_stream(held_stream_config(limits))
        .await
        .map_err(|e| {
            NatsError::JetStream(format!("cannot create or open the held-status stream: {e}"))
        })?;
    Ok(Buckets {
        client,
        js,
        intents,
        statuses,
        held,
    })
}

/// The held-status stream: one subject per device, each holding at most
/// [`HELD_PER_DEVICE`] statuses of at most [`MAX_VALUE_BYTES`] (past either
/// the broker refuses, and the agent keeps the status in its outbox), kept
/// until a replica acknowledges it.
fn held_stream_config(limits: BucketLimits) -> stream::Config {
    stream::Config {
        name: HELD_STREAM.into(),
        subjects: vec![format!("{HELD_PREFIX}.*")],
        retention: stream::RetentionPolicy::WorkQueue,
        max_messages_per_subject: HELD_PER_DEVICE,
        discard: stream::DiscardPolicy::New,
        discard_new_per_subject: true,
        max_bytes: limits.max_bytes,
        max_age: limits.max_age,
        max_message_size: MAX_VALUE_BYTES,
        storage: stream::StorageType::File,
        num_replicas: limits.replicas,
        allow_rollup: false,
        deny_delete: true,
        deny_purge: true,
        ..Default::default()
    }
}

/// Whether devices may still put into the status bucket themselves, as
/// agents did before statuses became requests: only while such agents remain (`drover
/// nats-config --allow-direct-status-puts`), since a device that may put
/// there can fill the bucket for everyone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirectStatusPuts {
    #[default]
    Denied,
    Allowed,
}

/// bcrypt's cost for a device's password: the lowest, about a millisecond
/// of the server's CPU per connect. The password is 256 random bits
/// derived from the device's token, so no cost would slow a guess; the hash
/// only keeps the server's file from holding a usable credential.
const DEVICE_BCRYPT_COST: u32 = 4;
/// bcrypt's cost for the control plane's own password, which an operator
/// chose and which may be guessable: nats-server's own default.
const CONTROL_PLANE_BCRYPT_COST: u32 = 11;

/// How long nats-server gives a client to authenticate.
pub(crate) const AUTH_TIMEOUT_SECONDS: u32 = 10;

/// `password` in the bcrypt form nats-server checks (`$2a$…`).
fn bcrypt_of(password: &str, cost: u32) -> Result<String, String> {
    // bcrypt reads at most 72 bytes; a longer password would be cut short
    // here and perhaps not by the server.
    if password.len() > 72 {
        return Err(format!(
            "a NATS password of {} bytes is longer than the 72 bytes bcrypt reads",
            password.len()
        ));
    }
    bcrypt::hash_with_result(password, cost)
        .map(|hash| hash.format_for_version(bcrypt::Version::TwoA))
        .map_err(|e| format!("cannot hash a NATS password: {e}"))
}

/// A nats-server `authorization` block: the control plane may do anything;
/// each device may read only its own intents (its republished subject) and
/// send only its own statuses (as requests, or held in the held-status
/// stream under its own subject), heartbeat and hello, all to the control
/// plane. A device may write no bucket and create no JetStream consumer:
/// nats-server checks a consumer's filter subject but not its deliver
/// subject, so that right would let a device push messages onto another
/// device's intent subject (A11), and a device that may put into the status
/// bucket can fill it for every device. `devices` pairs each device with
/// its broker password (derived from its token); every password is written
/// as its bcrypt hash.
pub fn authorization_config(
    control_plane: (&str, &str),
    devices: &[(DeviceId, String)],
    direct: DirectStatusPuts,
) -> Result<String, String> {
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into());
    let mut out = String::new();
    if direct == DirectStatusPuts::Allowed {
        out.push_str(
            "# Devices may still put statuses into the status bucket themselves, so one\n\
             # device can fill it for all: print this again without\n\
             # --allow-direct-status-puts once every agent sends statuses as requests.\n",
        );
    }
    // Checking a bcrypt password costs the server CPU, and after a broker
    // restart the whole fleet connects at once: nats-server's default of
    // 2 s for a client to authenticate then cut off hundreds of 10,000
    // devices here (they came back, but later).
    out.push_str(&format!(
        "authorization {{\n  timeout: {AUTH_TIMEOUT_SECONDS}\n  users = [\n"
    ));
    out.push_str(&format!(
        "    {{ user: {}, password: {}, permissions: {{ publish: {{ allow: [\">\"] }}, subscribe: {{ allow: [\">\"] }} }} }}\n",
        quote(control_plane.0),
        quote(&bcrypt_of(control_plane.1, CONTROL_PLANE_BCRYPT_COST)?)
    ));
    for (device, password) in devices {
        let (publish, subscribe) = device_permissions(device, direct);
        let list = |items: &[String]| {
            items
                .iter()
                .map(|s| quote(s))
                .collect::<Vec<_>>()
                .join(", ")
        };
        out.push_str(&format!(
            "    {{ user: {}, password: {}, permissions: {{ publish: {{ allow: [{}] }}, subscribe: {{ allow: [{}] }} }} }}\n",
            quote(device.as_str()),
            quote(&bcrypt_of(password, DEVICE_BCRYPT_COST)?),
            list(&publish),
            list(&subscribe)
        ));
    }
    out.push_str("  ]\n}\n");
    Ok(out)
}

/// The subjects `device` may publish to and subscribe to (see
/// [`authorization_config`]).
pub fn device_permissions(
    device: &DeviceId,
    direct: DirectStatusPuts,
) -> (Vec<String>, Vec<String>) {
    let mut publish = vec![
        status_subject(device),
        held_subject(device),
        format!("{HEARTBEAT_PREFIX}.{device}"),
        hello_subject(device),
        crate::logs::answer_subject(device),
    ];
    if direct == DirectStatusPuts::Allowed {
        publish.push(key_subject(STATUS_BUCKET, &format!("{device}.*")));
    }
    let subscribe = vec![
        format!("{INTENT_REPUBLISH_PREFIX}.{device}.>"),
        format!("{}.>", inbox_prefix(device)),
    ];
    (publish, subscribe)
}

/// What a node of a cluster needs besides the authorization block (the
/// same block on every node), as comments `drover nats-config --cluster`
/// prints after it.
pub const CLUSTER_NOTES: &str = "\
# A JetStream cluster of three: this same block on every node, and on each
#   server_name: n1                       # unique per node
#   jetstream { store_dir: /var/lib/nats/jetstream }
#   cluster {
#     name: drover
#     listen: 0.0.0.0:6222
#     routes: [nats-route://n1.example.org:6222, nats-route://n2.example.org:6222, nats-route://n3.example.org:6222]
#   }
#   (all three routes on every node, its own included: nats-server skips a
#   route to itself and sizes a new JetStream meta group by its routes)
# Every control-plane replica (they share secret.key and operator.token):
#   drover serve --store nats --nats-replicas 3 \\
#     --nats-url nats://n1.example.org:4222,nats://n2.example.org:4222,nats://n3.example.org:4222
# Every agent, in [transport]:
#   url = \"nats://n1.example.org:4222,nats://n2.example.org:4222,nats://n3.example.org:4222\"
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_is_scoped_to_its_own_subjects() {
        let a = DeviceId::new("dev-a").expect("valid");
        let config = authorization_config(
            ("cp", "secret"),
            &[(a.clone(), "tok".into())],
            DirectStatusPuts::Denied,
        )
        .expect("config");
        assert!(
            !config.contains("\"tok\"") && !config.contains("secret"),
            "{config}"
        );
        assert!(config.contains("password: \"$2a$04$"), "{config}");
        assert!(config.contains("\"drover.status.dev-a\""), "{config}");
        assert!(config.contains("\"drover.held.dev-a\""), "{config}");
        assert!(
            !config.contains("$KV.system-upgrade-status"),
            "no bucket is a device's to write: {config}"
        );
        assert!(config.contains("\"drover.rp.intent.dev-a.>\""), "{config}");
        assert!(config.contains("\"drover.hello.dev-a\""), "{config}");
        assert!(!config.contains("$JS.API"), "no consumer rights: {config}");
        assert!(config.contains("\"_INBOX_dev-a.>\""));
        assert!(!config.contains("dev-b"));
        let long = "x".repeat(73);
        let refused = authorization_config(("cp", &long), &[], DirectStatusPuts::Denied);
        assert!(refused.is_err_and(|e| e.contains("72 bytes")));
        let transition = authorization_config(
            ("cp", "secret"),
            &[(a, "tok".into())],
            DirectStatusPuts::Allowed,
        )
        .expect("config");
        assert!(
            transition.contains("\"$KV.system-upgrade-status.dev-a.*\""),
            "{transition}"
        );
    }
}
