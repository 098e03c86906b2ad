//! The protocol's messages. Every message is one JSON text frame with a
//! `type` field. The agent sends `hello`, `ack`, `progress`, `result`,
//! `heartbeat`, `error` and `logChunk`; the server sends `job`, `cancel`,
//! `received`, `error` and `logs`. `received` confirms a status so the agent can drop it from its
//! durable outbox (A4); until then the agent re-sends it on every connection.

use crate::MAX_MESSAGE_BYTES;
use drover_model::JobId;
use drover_model::logs::{LogChunk, LogRequest};
use drover_model::model::{Heartbeat, Hello, JobStatus};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "type",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum AgentMessage {
    /// First message on every connection: who the agent is and which jobs it
    /// still holds, so both sides resynchronise (the hello every transport
    /// sends, its fields beside `type`).
    Hello(Hello),
    /// The job is durably recorded on the device (accepted, duplicate or refused).
    Ack {
        job_id: JobId,
    },
    /// A non-terminal status from the outbox.
    Progress {
        outbox_id: u64,
        status: JobStatus,
    },
    /// A terminal status from the outbox.
    Result {
        outbox_id: u64,
        status: JobStatus,
    },
    Heartbeat {
        heartbeat: Heartbeat,
    },
    /// The agent could not use a message the server sent.
    Error {
        message: String,
    },
    /// A piece of the answer to a `logs` request.
    LogChunk(LogChunk),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "type",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum ServerMessage {
    /// An intent, kept as raw JSON so the agent can refuse an unknown kind
    /// with a reason instead of failing to parse the whole message.
    Job {
        intent: serde_json::Value,
        /// The server's clock when it sent the job: the agent judges expiry
        /// by the control plane's time, never by its own clock alone (A12).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        server_time: Option<jiff::Timestamp>,
    },
    /// The control plane's signed order to cancel a job (`CancelOrder`),
    /// kept as raw JSON like an intent: the agent checks its signature.
    Cancel { order: serde_json::Value },
    /// The status with this outbox id is stored by the server.
    Received { outbox_id: u64 },
    /// The server could not use a message the agent sent.
    Error { message: String },
    /// Asks for a job's output (`drover logs`); answered in `logChunk`s.
    Logs(LogRequest),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("message is {size} bytes, over the protocol limit of {MAX_MESSAGE_BYTES}")]
    TooLarge { size: usize },
    #[error("message is not valid JSON: {0}")]
    NotJson(String),
    #[error("message has no string field \"type\"")]
    NoType,
    #[error("unknown message type {0:?}")]
    UnknownType(String),
    #[error("malformed {kind} message: {reason}")]
    Malformed { kind: String, reason: String },
    #[error("binary frames are not part of the protocol; send JSON text")]
    Binary,
}

/// Parses a message once, straight into its type; only a message that
/// does not parse is read again, as generic JSON, to say what is wrong with
/// it (not JSON, no type, an unknown type, or a malformed known one).
fn decode<T: for<'de> Deserialize<'de>>(text: &str, known: &[&str]) -> Result<T, DecodeError> {
    if text.len() > MAX_MESSAGE_BYTES {
        return Err(DecodeError::TooLarge { size: text.len() });
    }
    serde_json::from_str(text).map_err(|typed| explain(text, known, &typed))
}

fn explain(text: &str, known: &[&str], typed: &serde_json::Error) -> DecodeError {
    let value: serde_json::Value = match serde_json::from_str(text) {
        Ok(value) => value,
        Err(e) => return DecodeError::NotJson(e.to_string()),
    };
    let Some(kind) = value.get("type").and_then(|t| t.as_str()) else {
        return DecodeError::NoType;
    };
    if !known.contains(&kind) {
        return DecodeError::UnknownType(kind.to_owned());
    }
    DecodeError::Malformed {
        kind: kind.to_owned(),
        reason: typed.to_string(),
    }
}

impl AgentMessage {
    pub fn decode(text: &str) -> Result<Self, DecodeError> {
        decode(
            text,
            &[
                "hello",
                "ack",
                "progress",
                "result",
                "heartbeat",
                "error",
                "logChunk",
            ],
        )
    }

    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| {
            serde_json::json!({"type": "error", "message": format!("cannot encode: {e}")})
                .to_string()
        })
    }
}

impl ServerMessage {
    pub fn decode(text: &str) -> Result<Self, DecodeError> {
        decode(text, &["job", "cancel", "received", "error", "logs"])
    }

    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| {
            serde_json::json!({"type": "error", "message": format!("cannot encode: {e}")})
                .to_string()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_bad_input_is_named() {
        let msg = AgentMessage::Ack {
            job_id: JobId::random(),
        };
        assert_eq!(AgentMessage::decode(&msg.encode()), Ok(msg));
        let msg = ServerMessage::Received { outbox_id: 7 };
        assert_eq!(msg.encode(), r#"{"type":"received","outboxId":7}"#);
        assert_eq!(ServerMessage::decode(&msg.encode()), Ok(msg));

        let cases: &[(&str, &str)] = &[
            ("nope", "not valid JSON"),
            ("{}", "no string field"),
            (r#"{"type":"reboot"}"#, "unknown message type \"reboot\""),
            (
                r#"{"type":"cancel","jobId":"x"}"#,
                "malformed cancel message",
            ),
        ];
        for (input, expected) in cases {
            let err = ServerMessage::decode(input).unwrap_err().to_string();
            assert!(err.contains(expected), "{input}: {err}");
        }
        let big = format!(
            r#"{{"type":"error","message":"{}"}}"#,
            "x".repeat(MAX_MESSAGE_BYTES)
        );
        assert!(matches!(
            ServerMessage::decode(&big),
            Err(DecodeError::TooLarge { .. })
        ));
    }

    /// Every example in docs/protocol.md is what the code sends and reads:
    /// each JSON block under "Agent to server" decodes as an
    /// [`AgentMessage`], each under "Server to agent" as a
    /// [`ServerMessage`] (a job's intent and a cancel's order as the agent
    /// reads them), each re-encodes to the same JSON, and every message
    /// type has its example.
    #[test]
    fn every_example_in_the_protocol_document_is_what_the_code_sends_and_reads() {
        let doc = include_str!("../../../docs/protocol.md");
        let (mut section, mut heading) = (String::new(), String::new());
        let mut block: Option<String> = None;
        let mut seen = Vec::new();
        for line in doc.lines() {
            if let Some(text) = block.as_mut() {
                if line == "```" {
                    let text = block.take().unwrap_or_default();
                    let same = |encoded: String| {
                        let ours: serde_json::Value = serde_json::from_str(&encoded).expect("ours");
                        let theirs: serde_json::Value = serde_json::from_str(&text)
                            .unwrap_or_else(|e| panic!("{heading}: not JSON: {e}\n{text}"));
                        assert_eq!(ours, theirs, "{heading}: re-encoded differently");
                    };
                    match section.as_str() {
                        "Agent to server" => {
                            let message = AgentMessage::decode(&text)
                                .unwrap_or_else(|e| panic!("{heading}: {e}\n{text}"));
                            same(message.encode());
                        }
                        "Server to agent" => {
                            let message = ServerMessage::decode(&text)
                                .unwrap_or_else(|e| panic!("{heading}: {e}\n{text}"));
                            match &message {
                                ServerMessage::Job { intent, .. } => {
                                    drover_model::wire::parse_intent_value(intent.clone())
                                        .unwrap_or_else(|e| panic!("{heading}: {e}"));
                                }
                                ServerMessage::Cancel { order } => {
                                    drover_model::wire::parse_cancel_order(order.clone())
                                        .unwrap_or_else(|e| panic!("{heading}: {e}"));
                                }
                                _ => {}
                            }
                            same(message.encode());
                        }
                        "Enrollment and keys" => {
                            use drover_model::enroll::{AgentFrame, ServerFrame};
                            let encoded = match serde_json::from_str::<AgentFrame>(&text) {
                                Ok(frame) => serde_json::to_string(&frame),
                                Err(_) => serde_json::from_str::<ServerFrame>(&text)
                                    .map(|frame| serde_json::to_string(&frame))
                                    .unwrap_or_else(|e| panic!("{heading}: {e}\n{text}")),
                            };
                            same(encoded.expect("encode"));
                        }
                        // transport-mqtt and transport-nats read their own sections.
                        "Enrollment over MQTT" | "Enrollment over NATS" => {}
                        other => panic!("a JSON example under {other:?}"),
                    }
                    seen.push(format!("{section}/{heading}"));
                } else {
                    text.push_str(line);
                    text.push('\n');
                }
            } else if let Some(title) = line.strip_prefix("## ") {
                section = title.to_owned();
            } else if let Some(title) = line.strip_prefix("### ") {
                heading = title.to_owned();
            } else if line == "```json" {
                block = Some(String::new());
            }
        }
        for kind in [
            "hello",
            "ack",
            "progress",
            "result",
            "heartbeat",
            "error",
            "logChunk",
        ] {
            assert!(
                seen.contains(&format!("Agent to server/{kind}")),
                "{kind}: {seen:?}"
            );
        }
        for kind in ["challenge", "enroll", "proof", "enrollment", "refused"] {
            assert!(
                seen.contains(&format!("Enrollment and keys/{kind}")),
                "{kind}: {seen:?}"
            );
        }
        for kind in ["job", "cancel", "received", "error", "logs"] {
            assert!(
                seen.contains(&format!("Server to agent/{kind}")),
                "{kind}: {seen:?}"
            );
        }
    }
}
