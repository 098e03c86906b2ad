//! The agent's link to the control plane: which transport the config
//! chooses, with its settings, the task that runs it, and `check`'s probe
//! of it.

use crate::config::{Config, Credentials, Transport};
use agent_core::executor::Agent;
use anyhow::{Result, bail};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How the agent reaches the control plane, from its config.
pub(crate) enum Link {
    Websocket(transport_websocket::client::ClientSettings),
    Nats(transport_nats::agent::AgentSettings),
    Mqtt(transport_mqtt::agent::AgentSettings),
}

pub(crate) fn link_settings(
    config: &Config,
    device_id: &drover_model::DeviceId,
    credentials: Credentials,
    key: Arc<agent_core::identity::DeviceKey>,
) -> Result<Link> {
    match (&config.transport, credentials) {
        (
            Transport::Websocket {
                server_url,
                ca_file,
                heartbeat_seconds,
                backoff_max_seconds,
                enroll_key,
                ..
            },
            credentials,
        ) => {
            use transport_websocket::client::Credential;
            let credential = match credentials {
                // A device moving to its key enrolls it with its own token.
                Credentials::Token(token) if *enroll_key => Credential::Key {
                    signer: key,
                    enrollment_token: Some(token),
                },
                Credentials::Token(token) => Credential::Token(token),
                Credentials::Enrollment(token) => Credential::Key {
                    signer: key,
                    enrollment_token: Some(token),
                },
            };
            Ok(Link::Websocket(
                transport_websocket::client::ClientSettings {
                    server_url: server_url.clone(),
                    credential,
                    ca_file: ca_file
                        .clone()
                        .unwrap_or_else(crate::config::default_ca_file),
                    heartbeat_interval: Duration::from_secs(*heartbeat_seconds),
                    backoff_initial: Duration::from_millis(500),
                    backoff_max: Duration::from_secs((*backoff_max_seconds).max(1)),
                    connect_timeout: Duration::from_secs(10),
                },
            ))
        }
        (Transport::Mqtt { .. }, Credentials::Enrollment(enrollment)) => {
            // The device's own key: its password at the broker, and how it
            // asks to join until the broker lets it in.
            let password = drover_model::enroll::key_broker_password(key.as_ref(), device_id);
            mqtt_link(
                config,
                device_id,
                drover_model::credentials::BrokerPasswords::own(password),
                Some(transport_mqtt::enrolling::Joining {
                    signer: key,
                    token: enrollment,
                }),
            )
        }
        (
            Transport::Nats {
                enrollment_jwt: None,
                ..
            },
            Credentials::Enrollment(_),
        ) => bail!(
            "over nats an enrollment token needs the enrollment user's JWT as well: \
             enrollment_jwt = \"…\", which `drover nats-config --authority` prints"
        ),
        (
            Transport::Nats {
                enrollment_jwt: Some(enroll_jwt),
                ..
            },
            Credentials::Enrollment(enrollment),
        ) => {
            // The device's own key signs the servers' nonce for the user
            // JWT it is given when it joins.
            let joining = transport_nats::enrolling::Joining {
                signer: key,
                token: enrollment,
                enroll_jwt: enroll_jwt.clone(),
                jwt_file: config.state_dir.join("nats.jwt"),
            };
            nats_link(config, device_id, None, Some(joining))
        }
        (Transport::Nats { .. }, Credentials::Token(token)) => {
            nats_link(config, device_id, Some(&token), None)
        }
        (Transport::Mqtt { .. }, Credentials::Token(token)) => mqtt_link(
            config,
            device_id,
            drover_model::credentials::BrokerPasswords::new(&token, device_id),
            None,
        ),
    }
}

/// The NATS link: by the device's token (its derived password), or by its
/// own key once it has joined.
fn nats_link(
    config: &Config,
    device_id: &drover_model::DeviceId,
    token: Option<&str>,
    joining: Option<transport_nats::enrolling::Joining>,
) -> Result<Link> {
    let Transport::Nats {
        url,
        ca_file,
        heartbeat_seconds,
        backoff_max_seconds,
        ..
    } = &config.transport
    else {
        bail!("not a NATS transport");
    };
    Ok(Link::Nats(transport_nats::agent::AgentSettings {
        nats: transport_nats::NatsSettings {
            url: url.clone(),
            user: Some(device_id.to_string()),
            password: None,
            ca_file: ca_file.clone(),
            connect_timeout: transport_nats::agent::CONNECT_TIMEOUT,
            replicas: 1,
            key_login: None,
        },
        passwords: drover_model::credentials::BrokerPasswords::new(token.unwrap_or(""), device_id),
        joining,
        heartbeat_interval: Duration::from_secs(*heartbeat_seconds),
        backoff_max: Duration::from_secs((*backoff_max_seconds).max(1)),
    }))
}

/// The MQTT link with the passwords it logs in with.
fn mqtt_link(
    config: &Config,
    device_id: &drover_model::DeviceId,
    passwords: drover_model::credentials::BrokerPasswords,
    joining: Option<transport_mqtt::enrolling::Joining>,
) -> Result<Link> {
    let Transport::Mqtt {
        url,
        ca_file,
        prefix,
        heartbeat_seconds,
        backoff_max_seconds,
        ..
    } = &config.transport
    else {
        bail!("not an MQTT transport");
    };
    Ok(Link::Mqtt(transport_mqtt::agent::AgentSettings {
        mqtt: transport_mqtt::MqttSettings {
            url: url.clone(),
            user: device_id.to_string(),
            password: String::new(),
            ca_file: ca_file.clone(),
            prefix: prefix.clone(),
            keep_alive: Duration::from_secs((*heartbeat_seconds * 2).clamp(5, 600)),
        },
        passwords,
        joining,
        heartbeat_interval: Duration::from_secs(*heartbeat_seconds),
        backoff_max: Duration::from_secs((*backoff_max_seconds).max(1)),
    }))
}

/// `check --connect` while the agent runs: its own link, as it reports it;
/// an error when it is not connected.
pub(crate) fn running_link(link: &agent_core::executor::LinkState) -> Result<String> {
    let contact = link
        .last_contact
        .map(|t| format!(", last contact {}", t.strftime("%Y-%m-%d %H:%M:%S UTC")))
        .unwrap_or_default();
    if link.connected {
        Ok(format!(
            "the running agent is connected over {}{contact}",
            link.transport.map_or("no transport", |t| t.as_str())
        ))
    } else {
        bail!(
            "the running agent is not connected over {}{contact}: {}",
            link.transport.map_or("any transport", |t| t.as_str()),
            link.last_error
                .as_deref()
                .unwrap_or("no error reported yet")
        )
    }
}

/// What `check --connect` prints when let in; `warning` when the broker
/// took the token rather than the derived password.
fn let_in(url: &str, warning: Option<&str>) -> String {
    match warning {
        None => format!("connected to {url} and let in"),
        Some(warning) => format!("connected to {url} and let in, but {warning}"),
    }
}

/// `check --connect`: reaches the control plane (or broker) and is let in
/// with this device's token, or says why not.
pub(crate) async fn probe(config: &Config, device_id: &drover_model::DeviceId) -> Result<String> {
    let credentials = config.transport.read_credentials()?;
    let key = Arc::new(agent_core::identity::DeviceKey::load_or_create(
        &config.state_dir,
    )?);
    match link_settings(config, device_id, credentials, key)? {
        Link::Websocket(settings) => {
            transport_websocket::client::probe(&settings, device_id).await?;
            Ok(let_in(&settings.server_url, None))
        }
        Link::Nats(settings) => {
            let using_token = transport_nats::agent::probe(&settings).await?;
            Ok(let_in(
                &settings.nats.url,
                using_token.then_some(transport_nats::agent::USING_TOKEN),
            ))
        }
        Link::Mqtt(settings) => {
            let using_token = transport_mqtt::agent::probe(&settings, device_id.as_str())
                .await
                .map_err(|e| anyhow::anyhow!(e))?;
            Ok(let_in(
                &settings.mqtt.url,
                using_token.then_some(transport_mqtt::agent::USING_TOKEN),
            ))
        }
    }
}

/// Runs the agent's side of `link` until shutdown.
pub(crate) fn spawn(link: Link, agent: Arc<Agent>, shutdown: CancellationToken) -> JoinHandle<()> {
    match link {
        Link::Websocket(settings) => {
            tokio::spawn(transport_websocket::client::run(settings, agent, shutdown))
        }
        Link::Nats(settings) => tokio::spawn(transport_nats::agent::run(settings, agent, shutdown)),
        Link::Mqtt(settings) => tokio::spawn(transport_mqtt::agent::run(settings, agent, shutdown)),
    }
}
