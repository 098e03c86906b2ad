//! Devices joining over NATS (issue 55), the control plane's end. A request
//! on `drover.enroll.<id>` is judged by the control plane's gate; an
//! accepted device is answered with its user JWT, signed by the account's
//! signing key, bound to its key (its user nkey) and to its own subjects.
//! nats-server needs no change for it. A device whose key is removed,
//! rejected or replaced is revoked in the account's JWT, which is pushed to
//! the servers at once: they close its connection and refuse its JWT.
//!
//! The servers hold the truth of what is revoked (their resolver keeps the
//! account's newest JWT): a revocation reads the account's JWT from them,
//! adds the device, signs and pushes it, and reads it back to see that it
//! held (two replicas revoking at once may each push over the other).

use crate::authority::{ACCOUNT_NAME, CLAIMS_UPDATE};
use crate::links::{Joining, NatsLinks};
use crate::subjects::Messages;
use crate::{ENROLL_PREFIX, EnrollReply, EnrollRequest, HELLO_QUEUE, enroll_inbox_prefix};
use drover_contract::gate::{EnrollAnswer, Proof};
use drover_contract::link::Inbound;
use drover_model::DeviceId;
use drover_model::enroll::MAX_ENROLL_FRAME;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How long the servers get to answer a lookup or an update.
const SYSTEM_TIMEOUT: Duration = Duration::from_secs(5);

impl NatsLinks {
    /// Devices that ask to join are judged from now on, and the servers'
    /// revocations are checked against the revoked keys at once and every
    /// few minutes.
    pub fn judge_with(self: &Arc<Self>, joining: Joining) {
        self.joining.send_replace(Some(Arc::new(joining)));
        let links = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut wait = FIRST_CHECK;
            loop {
                tokio::time::sleep(wait).await;
                wait = CHECK_EVERY;
                let Some(joining) = links.upgrade().and_then(|l| l.joining.borrow().clone()) else {
                    return;
                };
                if let Err(e) = check_revocations(&joining).await {
                    warn!(error = %e, "cannot check the revocations on the NATS servers");
                }
            }
        });
    }

    /// Takes requests to join (one replica each, through a queue group),
    /// once [`NatsLinks::judge_with`] was called.
    pub(crate) async fn enrollments(self: Arc<Self>, shutdown: CancellationToken) {
        let mut ready = self.joining.subscribe();
        let joining = tokio::select! {
            joining = ready.wait_for(Option::is_some) => match joining.map(|j| j.clone()) {
                Ok(Some(joining)) => joining,
                _ => return,
            },
            _ = shutdown.cancelled() => return,
        };
        let client = self.buckets.client.clone();
        let subscription = client
            .queue_subscribe(format!("{ENROLL_PREFIX}.*"), HELLO_QUEUE.to_owned())
            .await;
        let Some(mut messages) = Messages::new(subscription, "enrollment requests", &shutdown)
        else {
            return;
        };
        while let Some((device, message)) = messages.next().await {
            let inbox = format!("{}.", enroll_inbox_prefix(&device));
            let Some(reply_to) = message
                .reply
                .clone()
                .filter(|r| r.as_str().starts_with(&inbox))
            else {
                warn!(%device, reply = ?message.reply, "enrollment request without the device's enrollment inbox ignored");
                continue;
            };
            let (client, joining) = (client.clone(), joining.clone());
            // Answered in its own task: requests do not wait on each other.
            tokio::spawn(async move {
                let reply = answer(&joining, &device, &message.payload).await;
                if let Ok(payload) = serde_json::to_vec(&reply)
                    && let Err(e) = client.publish(reply_to, payload.into()).await
                {
                    warn!(%device, error = %e, "cannot answer an enrollment request");
                }
            });
        }
    }

    /// Revokes `device`'s key (hex) in the account's JWT on every server,
    /// which close its connection; the device is gone from here too.
    pub fn revoke(self: &Arc<Self>, device: &DeviceId, public_key: &str) {
        let Some(joining) = self.joining.borrow().clone() else {
            return;
        };
        let Some(nkey) = drover_model::nkey::user_nkey(public_key) else {
            return;
        };
        let (links, device) = (self.clone(), device.clone());
        tokio::spawn(async move {
            match revoke(&joining, std::slice::from_ref(&nkey)).await {
                Ok(()) => {
                    info!(%device, "device's JWT revoked on the NATS servers");
                    // The servers closed its connection: gone from here too.
                    links.send(Inbound::Gone { device }).await;
                }
                Err(e) => {
                    warn!(%device, error = %e, "cannot revoke the device's JWT on the NATS servers")
                }
            }
        });
    }
}

/// Judges one request and says what the device is told.
async fn answer(joining: &Joining, device: &DeviceId, payload: &[u8]) -> EnrollReply {
    let refused = |message: String| EnrollReply::Refused { message };
    if payload.len() > MAX_ENROLL_FRAME {
        return refused(format!(
            "the request is {} bytes; at most {MAX_ENROLL_FRAME}",
            payload.len()
        ));
    }
    let request = match serde_json::from_slice::<EnrollRequest>(payload) {
        Ok(request) => request,
        Err(e) => return refused(format!("unreadable enrollment request: {e}")),
    };
    let public_key = request.public_key.clone();
    let answer = joining
        .gate
        .enroll(drover_contract::gate::EnrollRequest {
            device: device.clone(),
            public_key: request.public_key,
            token: request.token,
            inventory: request.inventory,
            proof: Proof::BrokerPassword(request.signature),
            peer: None,
        })
        .await;
    match answer {
        EnrollAnswer::Accepted => match joining.authority.device_jwt(device, &public_key) {
            Ok(jwt) => EnrollReply::Accepted { jwt },
            Err(e) => refused(format!(
                "the control plane cannot sign this device's JWT: {e}"
            )),
        },
        EnrollAnswer::Pending => EnrollReply::Pending {
            message: "this device waits for an operator to accept it".into(),
        },
        EnrollAnswer::Refused(message) => {
            info!(%device, reason = %message, "enrollment over NATS refused");
            refused(message)
        }
    }
}

/// The revocations in the account's JWT the servers hold now.
async fn revocations(joining: &Joining) -> Result<BTreeMap<String, i64>, String> {
    let subject = format!(
        "$SYS.REQ.ACCOUNT.{}.CLAIMS.LOOKUP",
        joining.authority.account()
    );
    let answer = tokio::time::timeout(SYSTEM_TIMEOUT, joining.system.request(subject, "".into()))
        .await
        .map_err(|_| "no server answered the account's lookup".to_owned())?
        .map_err(|e| e.to_string())?;
    let jwt = String::from_utf8_lossy(&answer.payload);
    let claims = crate::jwt::claims(&jwt)
        .ok_or_else(|| format!("the account's lookup answered {jwt:?}, not a JWT"))?;
    Ok(claims["nats"]["revocations"]
        .as_object()
        .map(|revoked| {
            revoked
                .iter()
                .filter_map(|(key, at)| Some((key.clone(), at.as_i64()?)))
                .collect()
        })
        .unwrap_or_default())
}

/// Adds `nkeys` to the account's revocations on the servers (as of now).
async fn revoke(joining: &Joining, nkeys: &[String]) -> Result<(), String> {
    let mut last = String::new();
    for _ in 0..3 {
        let mut revoked = revocations(joining).await?;
        let now = jiff::Timestamp::now().as_second();
        for nkey in nkeys {
            revoked.insert(nkey.clone(), now);
        }
        let jwt = joining
            .authority
            .account_jwt(&revoked)
            .map_err(|e| e.to_string())?;
        let answer = tokio::time::timeout(
            SYSTEM_TIMEOUT,
            joining.system.request(CLAIMS_UPDATE, jwt.into()),
        )
        .await
        .map_err(|_| format!("no server took the {ACCOUNT_NAME} account's new JWT"))?
        .map_err(|e| e.to_string())?;
        last = String::from_utf8_lossy(&answer.payload).into_owned();
        let held = revocations(joining).await?;
        if nkeys.iter().all(|nkey| held.contains_key(nkey)) {
            return Ok(());
        }
    }
    Err(format!("the revocation did not hold: {last}"))
}

/// Pushes again each revoked key the servers' revocations lack, or hold
/// from before its revocation (a removal they missed: no server was up,
/// or the control plane stopped first). Returns how many.
async fn check_revocations(joining: &Joining) -> Result<usize, String> {
    let owed: BTreeMap<String, (DeviceId, i64)> = joining
        .gate
        .revoked_keys()
        .await
        .into_iter()
        .filter_map(|(device, key, at)| Some((drover_model::nkey::user_nkey(&key)?, (device, at))))
        .collect();
    if owed.is_empty() {
        return Ok(0);
    }
    let held = revocations(joining).await?;
    let missing: Vec<String> = owed
        .iter()
        .filter(|(nkey, (_, at))| held.get(*nkey).is_none_or(|since| since < at))
        .map(|(nkey, _)| nkey.clone())
        .collect();
    if missing.is_empty() {
        return Ok(0);
    }
    for nkey in &missing {
        warn!(device = %owed[nkey].0, "a revoked key was missing from the NATS servers' revocations; pushing it again");
    }
    revoke(joining, &missing).await?;
    Ok(missing.len())
}

/// How often the servers' revocations are checked against the revoked keys.
const CHECK_EVERY: Duration = Duration::from_secs(300);
/// The first check, soon after the control plane starts.
const FIRST_CHECK: Duration = Duration::from_secs(3);
