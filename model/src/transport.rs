//! The three ways an agent and the control plane talk, by the names
//! devices, configs, metrics and the API know them by.

use serde::{Deserialize, Serialize};

/// A transport between agents and the control plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// The control plane's own agents' port (`wss://`).
    #[serde(rename = "websocket")]
    WebSocket,
    /// Through an MQTT broker (mosquitto).
    Mqtt,
    /// Through NATS JetStream.
    Nats,
}

impl Transport {
    pub const ALL: [Transport; 3] = [Transport::WebSocket, Transport::Mqtt, Transport::Nats];

    /// Its name: `websocket`, `mqtt` or `nats`.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::WebSocket => "websocket",
            Transport::Mqtt => "mqtt",
            Transport::Nats => "nats",
        }
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is no transport's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown transport {0:?}: one of websocket, mqtt, nats")]
pub struct UnknownTransport(pub String);

impl std::str::FromStr for Transport {
    type Err = UnknownTransport;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Transport::ALL
            .into_iter()
            .find(|t| t.as_str() == name)
            .ok_or_else(|| UnknownTransport(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_transport_reads_back_by_its_name_in_text_and_json() {
        for transport in Transport::ALL {
            assert_eq!(transport.as_str().parse(), Ok(transport));
            assert_eq!(
                serde_json::to_value(transport).expect("json"),
                serde_json::json!(transport.as_str())
            );
        }
        assert_eq!(
            "WebSocket".parse::<Transport>(),
            Err(UnknownTransport("WebSocket".into()))
        );
    }
}
