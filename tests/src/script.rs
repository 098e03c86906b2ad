//! A scripted control plane: accepts one agent connection on a loopback
//! listener and lets a test send jobs and read what the agent answers,
//! confirming every status as a real server does.

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

pub type Ws = WebSocketStream<tokio::net::TcpStream>;

pub struct Script {
    pub ws: Ws,
    /// Every message the agent sent, in order.
    pub seen: Vec<Value>,
}

impl Script {
    /// Accepts the next connection and reads its hello.
    pub async fn accept(listener: &TcpListener, device: &str) -> Self {
        let (tcp, _) = tokio::time::timeout(Duration::from_secs(30), listener.accept())
            .await
            .expect("agent connects")
            .expect("accept");
        let ws = tokio_tungstenite::accept_async(tcp)
            .await
            .expect("handshake");
        let mut script = Self {
            ws,
            seen: Vec::new(),
        };
        let hello = script.next_of("hello").await;
        assert_eq!(hello["deviceId"], device);
        script
    }

    pub async fn send_text(&mut self, text: String) {
        self.ws.send(Message::text(text)).await.expect("send");
    }

    /// Sends a job signed with the test key, as the control plane would.
    pub async fn send_job(&mut self, intent: Value) {
        let intent = crate::sign_intent(intent);
        self.send_text(json!({"type": "job", "intent": intent}).to_string())
            .await;
    }

    /// Sends a job exactly as given (for unsigned or badly signed jobs).
    pub async fn send_raw_job(&mut self, intent: Value) {
        self.send_text(json!({"type": "job", "intent": intent}).to_string())
            .await;
    }

    /// Reads until a message matching `pred` arrives (within `timeout`);
    /// confirms every status.
    pub async fn until_within(
        &mut self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let frame = tokio::time::timeout_at(deadline, self.ws.next())
                .await
                .unwrap_or_else(|_| panic!("timed out waiting for {what}; saw {:#?}", self.seen))
                .expect("stream open")
                .expect("frame");
            let Message::Text(text) = frame else { continue };
            let message: Value = serde_json::from_str(text.as_str()).expect("agent sends JSON");
            if let Some(id) = message.get("outboxId").and_then(Value::as_u64) {
                self.send_text(json!({"type": "received", "outboxId": id}).to_string())
                    .await;
            }
            self.seen.push(message.clone());
            if pred(&message) {
                return message;
            }
        }
    }

    /// Keeps reading (and answering pings, confirming statuses) for `duration`,
    /// as a live server does.
    pub async fn pump(&mut self, duration: Duration) {
        let deadline = tokio::time::Instant::now() + duration;
        while let Ok(frame) = tokio::time::timeout_at(deadline, self.ws.next()).await {
            let Some(Ok(Message::Text(text))) = frame else {
                continue;
            };
            let Ok(message) = serde_json::from_str::<Value>(text.as_str()) else {
                continue;
            };
            if let Some(id) = message.get("outboxId").and_then(Value::as_u64) {
                self.send_text(json!({"type": "received", "outboxId": id}).to_string())
                    .await;
            }
            self.seen.push(message);
        }
    }

    pub async fn until(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        self.until_within(Duration::from_secs(30), what, pred).await
    }

    pub async fn next_of(&mut self, kind: &str) -> Value {
        self.until(kind, |m| m["type"] == kind).await
    }

    /// The terminal result of `job`, waiting up to `timeout`.
    pub async fn result_within(&mut self, job: &str, timeout: Duration) -> Value {
        self.until_within(timeout, &format!("result of {job}"), |m| {
            m["type"] == "result" && m["status"]["jobId"] == job
        })
        .await
    }

    pub async fn result_of(&mut self, job: &str) -> Value {
        self.result_within(job, Duration::from_secs(30)).await
    }

    /// The first status of `job` in `state`.
    pub async fn state_of(&mut self, job: &str, state: &str, timeout: Duration) -> Value {
        self.until_within(timeout, &format!("{job} in {state}"), |m| {
            m["status"]["jobId"] == job && m["status"]["state"] == state
        })
        .await
    }
}

/// An intent as a control plane sends it.
pub fn intent(job: &str, device: &str, kind: Value, expires_in: i64) -> Value {
    let now = jiff::Timestamp::now();
    json!({
        "jobId": job, "deviceId": device, "kind": kind, "attempt": 1,
        "createdAt": now.to_string(),
        "expiresAt": (now + jiff::SignedDuration::from_secs(expires_in)).to_string(),
        "timeoutSeconds": 1500
    })
}

pub fn new_job() -> String {
    uuid::Uuid::new_v4().to_string()
}
