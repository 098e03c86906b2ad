//! Reading the per-device subjects on the control plane's side: each
//! message with the device its subject names, the device's own inbox to
//! answer into, the answer to a hello, and a status entry as an event.

use crate::{HelloReply, inbox_prefix, parse_key};
use drover_contract::link::{Inbound, Reply};
use drover_model::DeviceId;
use drover_model::model::JobStatus;
use futures_util::StreamExt;
use jiff::Timestamp;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// Messages on a per-device subject, with the device each names, until
/// shutdown.
pub(crate) struct Messages<'a> {
    subscription: async_nats::Subscriber,
    shutdown: &'a CancellationToken,
}

impl<'a> Messages<'a> {
    pub(crate) fn new(
        subscription: Result<async_nats::Subscriber, async_nats::SubscribeError>,
        what: &str,
        shutdown: &'a CancellationToken,
    ) -> Option<Self> {
        match subscription {
            Ok(subscription) => Some(Self {
                subscription,
                shutdown,
            }),
            Err(e) => {
                warn!(error = %e, "cannot subscribe to {what}");
                None
            }
        }
    }

    pub(crate) async fn next(&mut self) -> Option<(DeviceId, async_nats::Message)> {
        loop {
            let message = tokio::select! {
                message = self.subscription.next() => message?,
                _ = self.shutdown.cancelled() => return None,
            };
            if let Some(device) = device_of(message.subject.as_str()) {
                return Some((device, message));
            }
        }
    }
}

/// Where to answer a device's request: only into the device's own inbox,
/// since a reply subject is the sender's to choose and must not aim answers
/// at another device's subjects (A11). None (logged) for any other.
pub(crate) fn own_inbox(
    device: &DeviceId,
    message: &async_nats::Message,
    what: &str,
) -> Option<async_nats::Subject> {
    let prefix = format!("{}.", inbox_prefix(device));
    let reply = message
        .reply
        .as_ref()
        .filter(|r| r.as_str().starts_with(&prefix))
        .cloned();
    if reply.is_none() {
        warn!(device = %device, reply = ?message.reply, "{what} without the device's own inbox ignored");
    }
    reply
}

/// The device a plain subject ends in (`drover.hello.<device>`).
pub(crate) fn device_of(subject: &str) -> Option<DeviceId> {
    subject
        .rsplit('.')
        .next()
        .and_then(|d| DeviceId::new(d).ok())
}

/// Answers a hello: the time, and `error` or the reconnect window.
pub(crate) async fn reply_hello(
    client: &async_nats::Client,
    reply_to: async_nats::Subject,
    answer: Result<std::time::Duration, String>,
) {
    let (error, window) = match answer {
        Ok(window) => (None, Some(window)),
        Err(error) => (Some(error), None),
    };
    let reply = HelloReply {
        server_time: Timestamp::now(),
        error,
        reconnect_spread_ms: window.map(|w| u64::try_from(w.as_millis()).unwrap_or(u64::MAX)),
    };
    if let Ok(payload) = serde_json::to_vec(&reply)
        && let Err(e) = client.publish(reply_to, payload.into()).await
    {
        debug!(error = %e, "cannot answer a hello");
    }
}

/// A status entry as an inbound event, or None for what is not one;
/// `parsed` is the entry's value already read (by the replica that put
/// it), else it is read here.
pub(crate) fn status_event(
    entry: async_nats::jetstream::kv::Entry,
    parsed: Option<Box<JobStatus>>,
) -> Option<Inbound> {
    if entry.operation != async_nats::jetstream::kv::Operation::Put {
        return None;
    }
    let Some((device, job)) = parse_key(&entry.key) else {
        warn!(key = %entry.key, "status under a malformed key ignored");
        return None;
    };
    let status = match parsed {
        Some(status) => status,
        None => match serde_json::from_slice::<JobStatus>(&entry.value) {
            Ok(status) => Box::new(status),
            Err(e) => {
                warn!(key = %entry.key, error = %e, "unreadable status ignored");
                return None;
            }
        },
    };
    if status.job_id != job {
        warn!(key = %entry.key, "status names another job than its key; ignored");
        return None;
    }
    // When JetStream stored it: the broker's clock, which no device sets, so
    // a result put while no control plane ran counts from then (A12).
    let now = Timestamp::now();
    let received_at = Timestamp::from_nanosecond(entry.created.unix_timestamp_nanos())
        .map_or(now, |stored| stored.min(now));
    Some(Inbound::Status {
        device,
        status,
        received_at,
        position: Some(entry.revision),
        reply: Reply::none(),
    })
}
