//! The control plane's side of the held-status stream: statuses agents
//! published while no control plane answered their requests. Every replica
//! pulls from one durable consumer, so each held status goes to one of
//! them; it is checked as a status request is (size, device, a job the
//! device was given), handed to the delivery core with the broker's time
//! as its receive time (A12: a clock no device sets), and acknowledged —
//! which removes it from the stream — only once the core stored or refused
//! it. A replica that dies before that leaves it to another after the
//! acknowledgement wait.

use crate::links::NatsLinks;
use crate::subjects::device_of;
use crate::{HELD_CONSUMER, StatusReply};
use async_nats::jetstream::{AckKind, consumer::pull};
use drover_contract::link::{Answer, Inbound, Reply};
use futures_util::StreamExt;
use jiff::Timestamp;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Held statuses taken at once.
const BATCH: usize = 64;
/// How long a taken status may wait for the delivery core before the
/// broker offers it again.
const ACK_WAIT: Duration = Duration::from_secs(30);
/// How often an idle replica looks for held statuses.
const IDLE: Duration = Duration::from_secs(1);
/// How long one look may take. Without it a look whose request the broker
/// lost (sent as the connection dropped, or to a consumer whose leader a
/// cluster was still electing) waits for ever, async-nats setting no timeout
/// of its own on a fetch: held statuses then pile up unread while their
/// devices count them as delivered (seen on a three-node cluster under
/// 50,000 agents: 455,794 held, none taken). async-nats gives up 5 s past it.
const FETCH_EXPIRES: Duration = Duration::from_secs(5);

impl NatsLinks {
    /// Takes held statuses until `shutdown`; says the held backlog is read
    /// (one part of the link's "caught up") after the first look that
    /// finds none left.
    pub(crate) async fn held_statuses(self: Arc<Self>, shutdown: CancellationToken) {
        let mut drained = false;
        loop {
            let config = pull::Config {
                durable_name: Some(HELD_CONSUMER.into()),
                ack_wait: ACK_WAIT,
                max_ack_pending: BATCH as i64 * 4,
                ..Default::default()
            };
            let consumer = match self
                .buckets
                .held
                .get_or_create_consumer(HELD_CONSUMER, config)
                .await
            {
                Ok(consumer) => consumer,
                Err(e) => {
                    warn!(error = %e, "cannot open the held-status consumer; trying again");
                    tokio::select! {
                        _ = tokio::time::sleep(IDLE) => continue,
                        _ = shutdown.cancelled() => return,
                    }
                }
            };
            loop {
                let batch = match consumer
                    .fetch()
                    .max_messages(BATCH)
                    .expires(FETCH_EXPIRES)
                    .messages()
                    .await
                {
                    Ok(batch) => batch,
                    Err(e) => {
                        warn!(error = %e, "cannot take held statuses; trying again");
                        break;
                    }
                };
                let messages: Vec<_> = batch.collect().await;
                let taken = messages.len();
                // Handed over in the stream's order, then answered
                // together: the delivery core stores them in shared
                // commits, where one at a time held each to a commit of
                // its own (about 180 a second on a busy cluster).
                let mut handed = Vec::with_capacity(taken);
                for message in messages {
                    match message {
                        Ok(message) => match self.hand_over(message).await {
                            Handed::Waiting(waiting) => handed.push(waiting),
                            Handed::Done => {}
                            Handed::Stopping => return,
                        },
                        Err(e) => debug!(error = %e, "a held status could not be read"),
                    }
                }
                futures_util::future::join_all(handed.into_iter().map(|w| w.settle())).await;
                if taken > 0 {
                    continue;
                }
                if !drained {
                    drained = self.part_caught_up(crate::links::Part::Held).await;
                }
                tokio::select! {
                    _ = tokio::time::sleep(IDLE) => {}
                    _ = shutdown.cancelled() => return,
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(IDLE) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }

    /// One held status: checked and handed to the delivery core with the
    /// broker's time; acknowledged by [`Waiting::settle`] once the core
    /// answered (refused ones too: sending them again cannot help).
    async fn hand_over(&self, message: async_nats::jetstream::Message) -> Handed {
        let Some(device) = device_of(message.subject.as_str()) else {
            warn!(subject = %message.subject, "a held status under a malformed subject; dropped");
            let _ = message.ack().await;
            return Handed::Done;
        };
        let now = Timestamp::now();
        let received_at = message
            .info()
            .ok()
            .and_then(|info| Timestamp::from_nanosecond(info.published.unix_timestamp_nanos()).ok())
            .map_or(now, |held| held.min(now));
        // Given or not, a held status goes to the delivery core, which
        // decides (a job it never gave is kept only as a local report).
        let status = match self.check_status(&device, &message.payload).await {
            Ok(crate::links::Checked::Given(status) | crate::links::Checked::NotGiven(status)) => {
                status
            }
            Err(StatusReply::Failed(reason)) => {
                debug!(device = %device, %reason, "a held status not taken now");
                let _ = message.ack_with(AckKind::Nak(Some(IDLE))).await;
                return Handed::Done;
            }
            Err(refused) => {
                warn!(device = %device, answer = ?refused, "held status refused");
                let _ = message.ack().await;
                return Handed::Done;
            }
        };
        let (reply, answer) = Reply::channel();
        let job_id = status.job_id;
        if !self
            .send(Inbound::Status {
                device: device.clone(),
                status: Box::new(status),
                received_at,
                position: None,
                reply,
            })
            .await
        {
            return Handed::Stopping;
        }
        Handed::Waiting(Box::new(Waiting {
            message,
            device,
            job_id,
            received_at,
            answer,
        }))
    }
}

/// What became of a held status taken from the stream.
enum Handed {
    /// With the delivery core, its answer awaited.
    Waiting(Box<Waiting>),
    /// Acknowledged or offered again already.
    Done,
    /// The delivery core is gone.
    Stopping,
}

/// A held status the delivery core has, and its answer to come.
struct Waiting {
    message: async_nats::jetstream::Message,
    device: drover_model::DeviceId,
    job_id: drover_model::JobId,
    received_at: Timestamp,
    answer: tokio::sync::oneshot::Receiver<Answer>,
}

impl Waiting {
    /// Acknowledges the status once the core stored or refused it; offers it
    /// again when the core failed to store it now; leaves it to the broker
    /// (offered again after the acknowledgement wait) when no answer came.
    async fn settle(self) {
        let Self {
            message,
            device,
            job_id,
            received_at,
            answer,
        } = self;
        match tokio::time::timeout(ACK_WAIT, answer).await {
            Ok(Ok(Answer::Stored)) => {
                info!(device = %device, %job_id, %received_at, "a status the broker held is stored");
                let _ = message.ack().await;
            }
            Ok(Ok(Answer::Refused(reason))) => {
                warn!(device = %device, %job_id, %reason, "held status refused");
                let _ = message.ack().await;
            }
            Ok(Ok(Answer::Failed(reason))) => {
                debug!(device = %device, %job_id, %reason, "a held status not stored now");
                let _ = message.ack_with(AckKind::Nak(Some(IDLE))).await;
            }
            // The core is going away or slow: the broker offers it again.
            Ok(Err(_)) | Err(_) => {}
        }
    }
}
