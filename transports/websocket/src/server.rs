//! The control plane's end of the handshake: an agent connects to
//! `/agent/v1/ws/<device-id>` with `Authorization: Bearer <token>` or
//! `Authorization: Drover-Key` (it proves its key next, [`crate::door`]),
//! or asks to join at `/agent/v1/enroll/<device-id>`; the control plane's
//! [`DeviceGate`] decides. What happens after it is [`crate::links`].

use crate::{AGENT_PATH_PREFIX, ENROLL_PATH_PREFIX, KEY_AUTHORIZATION, PROBE_HEADER, ws_config};
use drover_contract::gate::DeviceGate;
use drover_model::DeviceId;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{StatusCode, header};

pub use crate::client::Io;

#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    #[error("WebSocket handshake failed: {0}")]
    Handshake(#[from] tokio_tungstenite::tungstenite::Error),
    #[error("handshake refused: {0}")]
    Refused(String),
}

/// Which door a connection came in by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Door {
    /// Its bearer token was good.
    Token,
    /// It will prove this key (hex) before its session starts.
    Key(String),
    /// It asks to join.
    Enroll,
}

pub struct AcceptedAgent<S> {
    pub device_id: DeviceId,
    pub ws: WebSocketStream<S>,
    pub door: Door,
    /// A connection check ([`PROBE_HEADER`]): let in, then closed; it
    /// never becomes the device's session.
    pub probe: bool,
}

#[allow(clippy::result_large_err)]
fn refuse(status: StatusCode, reason: &str) -> ErrorResponse {
    let mut response = ErrorResponse::new(Some(reason.to_owned()));
    *response.status_mut() = status;
    response
}

/// Completes the WebSocket handshake of one agent connection, checking the
/// path and the device's credential with `gate`.
pub async fn accept<S>(
    stream: S,
    gate: &dyn DeviceGate,
    config: Option<tokio_tungstenite::tungstenite::protocol::WebSocketConfig>,
) -> Result<AcceptedAgent<S>, AcceptError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut accepted: Option<(DeviceId, Door)> = None;
    let mut refusal: Option<String> = None;
    let mut probe = false;
    // The callback's signature is tungstenite's; its error response is large by design.
    #[allow(clippy::result_large_err)]
    let callback = |request: &Request, response: Response| -> Result<Response, ErrorResponse> {
        let path = request.uri().path();
        if let Some(device) = path.strip_prefix(ENROLL_PATH_PREFIX) {
            let device = match DeviceId::new(device) {
                Ok(device) => device,
                Err(e) => {
                    refusal = Some(e.to_string());
                    return Err(refuse(StatusCode::BAD_REQUEST, &e.to_string()));
                }
            };
            accepted = Some((device, Door::Enroll));
            return Ok(response);
        }
        let Some(device) = path.strip_prefix(AGENT_PATH_PREFIX) else {
            refusal = Some(format!("unknown path {path}"));
            return Err(refuse(
                StatusCode::NOT_FOUND,
                "agents connect to /agent/v1/ws/<device-id>",
            ));
        };
        let device = match DeviceId::new(device) {
            Ok(device) => device,
            Err(e) => {
                refusal = Some(e.to_string());
                return Err(refuse(StatusCode::BAD_REQUEST, &e.to_string()));
            }
        };
        let authorization = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let claimed = authorization
            .strip_prefix(KEY_AUTHORIZATION)
            .and_then(|rest| rest.strip_prefix(' '));
        let door = if let Some(claimed) = claimed {
            match gate.key_of(&device) {
                Some(key) if key == claimed => Door::Key(key),
                _ => {
                    refusal = Some(format!(
                        "device {device} has no accepted key {claimed:.16}…"
                    ));
                    return Err(refuse(
                        StatusCode::UNAUTHORIZED,
                        "this key is not accepted for this device: it enrolls first",
                    ));
                }
            }
        } else {
            let token = authorization.strip_prefix("Bearer ").unwrap_or("");
            if !gate.token_opens(&device, token) {
                refusal = Some(format!("bad or missing token for device {device}"));
                return Err(refuse(
                    StatusCode::UNAUTHORIZED,
                    "bad or missing device token",
                ));
            }
            Door::Token
        };
        accepted = Some((device, door));
        probe = request.headers().contains_key(PROBE_HEADER);
        Ok(response)
    };
    let result = tokio_tungstenite::accept_hdr_async_with_config(
        stream,
        callback,
        config.or_else(|| Some(ws_config())),
    )
    .await;
    match (result, accepted) {
        (Ok(ws), Some((device_id, door))) => Ok(AcceptedAgent {
            device_id,
            ws,
            door,
            probe,
        }),
        (Ok(_), None) => Err(AcceptError::Refused(
            "handshake finished without a device".into(),
        )),
        (Err(e), _) => match refusal {
            Some(reason) => Err(AcceptError::Refused(reason)),
            None => Err(AcceptError::Handshake(e)),
        },
    }
}
