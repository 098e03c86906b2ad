//! The control plane's side of the two conversations that come before a
//! session (issue 55): a device that comes in by its key proves it (a
//! fresh challenge, its signature), and a device with no credential asks
//! to join (a challenge, its signed request, the control plane's answer,
//! closed). Each is one frame each way, bounded, within the handshake's
//! time limit.

use crate::server::Io;
use drover_contract::gate::{DeviceGate, EnrollAnswer, EnrollRequest, Proof};
use drover_model::DeviceId;
use drover_model::enroll::{
    AgentFrame, MAX_ENROLL_FRAME, ServerFrame, new_challenge, session_message, verify,
};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

type Ws = WebSocketStream<Box<dyn Io>>;

fn frame(frame: &ServerFrame) -> Message {
    // A frame of strings always serializes.
    Message::text(serde_json::to_string(frame).unwrap_or_default())
}

async fn refuse(ws: &mut Ws, message: &str) {
    let _ = ws
        .send(frame(&ServerFrame::Refused {
            message: message.to_owned(),
        }))
        .await;
    let _ = ws.close(None).await;
}

/// Sends a challenge and reads the one frame that answers it.
async fn challenged(ws: &mut Ws) -> Result<(String, AgentFrame), String> {
    let challenge = new_challenge().ok_or("the system random source failed")?;
    ws.send(frame(&ServerFrame::Challenge {
        challenge: challenge.clone(),
    }))
    .await
    .map_err(|e| e.to_string())?;
    let answer = loop {
        match ws.next().await {
            Some(Ok(Message::Text(text))) => break text,
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(_)) => return Err("the answer to the challenge is not a text frame".into()),
            Some(Err(e)) => return Err(e.to_string()),
            None => return Err("closed before answering the challenge".into()),
        }
    };
    if answer.len() > MAX_ENROLL_FRAME {
        return Err(format!(
            "the answer to the challenge is {} bytes; at most {MAX_ENROLL_FRAME}",
            answer.len()
        ));
    }
    let parsed = serde_json::from_str::<AgentFrame>(answer.as_str())
        .map_err(|e| format!("the answer to the challenge is not a proof or enroll frame: {e}"))?;
    Ok((challenge, parsed))
}

/// Has the device prove `public_key`: Ok when its signature over a fresh
/// challenge holds; otherwise it is told why and closed.
pub async fn prove(ws: &mut Ws, device: &DeviceId, public_key: &str) -> Result<(), String> {
    let outcome = match challenged(ws).await {
        Ok((challenge, AgentFrame::Proof { signature })) => {
            if verify(public_key, &session_message(device, &challenge), &signature) {
                return Ok(());
            }
            "the signature is not this device's key's over the challenge".to_owned()
        }
        Ok((_, AgentFrame::Enroll { .. })) => {
            "an enroll frame at the session's door: enroll at /agent/v1/enroll/<device-id>".into()
        }
        Err(e) => e,
    };
    refuse(ws, &outcome).await;
    Err(outcome)
}

/// One enrollment request: answered, then closed. Returns what the device
/// was told, for the log.
pub async fn enroll(
    mut ws: Ws,
    device: &DeviceId,
    peer: std::net::IpAddr,
    gate: &dyn DeviceGate,
) -> EnrollAnswer {
    let answer = match challenged(&mut ws).await {
        Ok((
            challenge,
            AgentFrame::Enroll {
                device_id,
                public_key,
                token,
                inventory,
                signature,
            },
        )) => {
            if device_id != *device {
                EnrollAnswer::Refused(format!(
                    "the request names device {device_id}, but came in at {device}'s door"
                ))
            } else {
                gate.enroll(EnrollRequest {
                    device: device.clone(),
                    public_key,
                    token,
                    inventory,
                    proof: Proof::Challenge {
                        challenge,
                        signature,
                    },
                    peer: Some(peer),
                })
                .await
            }
        }
        Ok((_, AgentFrame::Proof { .. })) => {
            EnrollAnswer::Refused("a proof at the enrollment door: send an enroll frame".into())
        }
        Err(e) => EnrollAnswer::Refused(e),
    };
    let _ = ws.send(frame(&answer.frame())).await;
    let _ = ws.close(None).await;
    answer
}
