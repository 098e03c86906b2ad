//! Heartbeats, the control plane's side: every replica reads each
//! device's heartbeat subject (a plain subscription, not a queue group)
//! and hands each heartbeat that names its own device to the delivery core.

use crate::HEARTBEAT_PREFIX;
use crate::links::NatsLinks;
use crate::subjects::Messages;
use drover_contract::link::{Inbound, Reply};
use drover_model::model::Heartbeat;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

impl NatsLinks {
    pub(crate) async fn heartbeats(self: Arc<Self>, shutdown: CancellationToken) {
        let subscription = self
            .buckets
            .client
            .subscribe(format!("{HEARTBEAT_PREFIX}.*"))
            .await;
        let Some(mut messages) = Messages::new(subscription, "heartbeats", &shutdown) else {
            return;
        };
        while let Some((device, message)) = messages.next().await {
            let heartbeat: Heartbeat = match serde_json::from_slice(&message.payload) {
                Ok(heartbeat) => heartbeat,
                Err(e) => {
                    debug!(device = %device, error = %e, "unreadable heartbeat ignored");
                    continue;
                }
            };
            if heartbeat.device_id != device {
                warn!(device = %device, "heartbeat naming another device ignored");
                continue;
            }
            self.fleet.heard(&device);
            let heartbeat = Box::new(heartbeat);
            let reply = Reply::none();
            if !self
                .send(Inbound::Heartbeat {
                    device,
                    heartbeat,
                    reply,
                })
                .await
            {
                return;
            }
        }
    }
}
