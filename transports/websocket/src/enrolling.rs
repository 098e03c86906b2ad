//! The agent's side of the key door and of enrollment (issue 55): a device
//! with its own key connects with `Authorization: Drover-Key` and signs the
//! control plane's challenge; while its key is not accepted it asks to
//! join at `/agent/v1/enroll/<device-id>` with its enrollment token, and
//! waits (pending) until an operator accepts it.

use drover_model::DeviceId;
use drover_model::enroll::{
    AgentFrame, Inventory, MAX_ENROLL_FRAME, ServerFrame, Signer, enroll_message, session_message,
};
use futures_util::{SinkExt, StreamExt};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

/// How this device is let in.
#[derive(Clone)]
pub enum Credential {
    /// A bearer token (`drover token DEVICE`), as devices registered by
    /// hand have.
    Token(String),
    /// The device's own key; with an enrollment token it asks to join while
    /// its key is not accepted.
    Key {
        signer: Arc<dyn Signer>,
        enrollment_token: Option<String>,
    },
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::Token(_) => f.write_str("Token(…)"),
            Credential::Key {
                signer,
                enrollment_token,
            } => f
                .debug_struct("Key")
                .field("public_key", &signer.public_key())
                .field("enrollment_token", &enrollment_token.as_ref().map(|_| "…"))
                .finish(),
        }
    }
}

/// Why the key's conversation failed.
#[derive(Debug, thiserror::Error)]
pub enum EnrollError {
    /// Refused by the control plane, or an answer this agent cannot use.
    #[error("{0}")]
    Refused(String),
    #[error("the control plane closed the connection")]
    Closed,
    #[error("WebSocket error: {0}")]
    Ws(#[from] tokio_tungstenite::tungstenite::Error),
}

/// What became of an enrollment request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enrolled {
    Accepted,
    Pending(String),
}

/// Reads the control plane's next frame of the enrollment or key
/// conversation (bounded; pings skipped).
async fn next_frame<S>(ws: &mut WebSocketStream<S>) -> Result<ServerFrame, EnrollError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        match ws.next().await {
            Some(Ok(Message::Text(text))) => {
                if text.len() > MAX_ENROLL_FRAME {
                    return Err(EnrollError::Refused(format!(
                        "the control plane sent a {}-byte frame where a challenge or an answer \
                         belongs",
                        text.len()
                    )));
                }
                return serde_json::from_str(text.as_str()).map_err(|e| {
                    EnrollError::Refused(format!("unusable frame from the control plane: {e}"))
                });
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(_)) | None => return Err(EnrollError::Closed),
            Some(Err(e)) => return Err(e.into()),
        }
    }
}

async fn challenge<S>(ws: &mut WebSocketStream<S>) -> Result<String, EnrollError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match next_frame(ws).await? {
        ServerFrame::Challenge { challenge } => Ok(challenge),
        ServerFrame::Refused { message } => Err(EnrollError::Refused(message)),
        other => Err(EnrollError::Refused(format!(
            "expected a challenge, got {other:?}"
        ))),
    }
}

/// Signs the session's challenge: after this the session goes on as any.
pub async fn prove<S>(
    ws: &mut WebSocketStream<S>,
    device: &DeviceId,
    signer: &dyn Signer,
) -> Result<(), EnrollError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let challenge = challenge(ws).await?;
    let signature = drover_model::signing::hex(&signer.sign(&session_message(device, &challenge)));
    let frame = AgentFrame::Proof { signature };
    ws.send(Message::text(
        serde_json::to_string(&frame).unwrap_or_default(),
    ))
    .await?;
    Ok(())
}

/// One enrollment request over an opened enrollment connection.
pub async fn enroll<S>(
    mut ws: WebSocketStream<S>,
    device: &DeviceId,
    signer: &dyn Signer,
    token: &str,
    inventory: Inventory,
) -> Result<Enrolled, EnrollError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let challenge = challenge(&mut ws).await?;
    let public_key = signer.public_key();
    let signature =
        drover_model::signing::hex(&signer.sign(&enroll_message(device, &public_key, &challenge)));
    let frame = AgentFrame::Enroll {
        device_id: device.clone(),
        public_key,
        token: token.to_owned(),
        inventory,
        signature,
    };
    ws.send(Message::text(
        serde_json::to_string(&frame).unwrap_or_default(),
    ))
    .await?;
    let answer = next_frame(&mut ws).await;
    let _ = ws.close(None).await;
    match answer? {
        ServerFrame::Enrollment { state, .. } if state == "accepted" => Ok(Enrolled::Accepted),
        ServerFrame::Enrollment { state, message } if state == "pending" => {
            Ok(Enrolled::Pending(message))
        }
        ServerFrame::Refused { message } => Err(EnrollError::Refused(message)),
        other => Err(EnrollError::Refused(format!(
            "unexpected answer to the enrollment: {other:?}"
        ))),
    }
}
