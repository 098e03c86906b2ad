//! The one file a device needs to join (issue 55): `drover enrollment-tokens
//! create NAME --agent-config URL` writes an agent config holding the
//! device id (or its template), the enrollment token, the control plane's
//! CA and the keys its intents are signed with, for the transport the URL
//! names. Installed as `/etc/drover/agent.toml`, it is all a device from
//! the image needs: no token of its own, no CA file beside it.

use anyhow::{Result, bail};
use drover_api::enrollment::AgentTrust;

/// What the file is made from.
pub struct AgentConfigSpec<'a> {
    /// The enrollment token's name, for the file's first comment.
    pub token_name: &'a str,
    /// The enrollment token itself.
    pub token: &'a str,
    /// Where agents connect: `wss://` (the agents' port), `mqtts://` (the
    /// broker) or `tls://`/`nats://` (the NATS servers).
    pub agents_url: &'a str,
    /// The device id or a template of it (`pi-{serial}`).
    pub device_id: &'a str,
    /// The CA the agents trust (PEM), inline; none: the system's bundle.
    pub ca_pem: Option<&'a str>,
    /// `upgrade` or `simulate`.
    pub mode: &'a str,
    pub trust: &'a AgentTrust,
}

/// A TOML basic string (a JSON string literal is one).
fn quoted(value: &str) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "\"\"".into())
}

/// The agent config, as TOML.
pub fn render(spec: &AgentConfigSpec) -> Result<String> {
    let scheme = spec
        .agents_url
        .split_once("://")
        .map(|(scheme, _)| scheme)
        .unwrap_or("");
    let transport = match scheme {
        "ws" | "wss" => format!(
            "kind = \"websocket\"\nserver_url = {}\nenrollment_token = {}\n",
            quoted(spec.agents_url),
            quoted(spec.token)
        ),
        "mqtt" | "mqtts" => format!(
            "kind = \"mqtt\"\nurl = {}\nenrollment_token = {}\n",
            quoted(spec.agents_url),
            quoted(spec.token)
        ),
        "nats" | "tls" => {
            let Some(jwt) = &spec.trust.nats_enrollment_jwt else {
                bail!(
                    "--agent-config {}: devices enroll over NATS only with a control plane \
                     serving with --nats-authority (this one does not)",
                    spec.agents_url
                );
            };
            format!(
                "kind = \"nats\"\nurl = {}\nenrollment_token = {}\nenrollment_jwt = {}\n",
                quoted(spec.agents_url),
                quoted(spec.token),
                quoted(jwt)
            )
        }
        _ => bail!(
            "--agent-config {:?}: give the address agents connect to: wss://HOST:7181 (the \
             agents' port), mqtts://HOST:8883 (the MQTT broker) or tls://HOST:4222 (NATS)",
            spec.agents_url
        ),
    };
    if !matches!(spec.mode, "upgrade" | "simulate") {
        bail!("--mode {:?}: upgrade or simulate", spec.mode);
    }
    let ca = match spec.ca_pem {
        // A literal multi-line string: PEM holds no `'''`.
        Some(pem) if !pem.contains("'''") => format!("ca_pem = '''\n{}\n'''\n", pem.trim_end()),
        Some(_) => bail!("the CA file is not PEM"),
        None => String::new(),
    };
    let keys: Vec<String> = spec
        .trust
        .intent_public_keys
        .iter()
        .map(|k| quoted(k))
        .collect();
    Ok(format!(
        "# drover-agent configuration for the devices of enrollment token {name}.\n\
         # Install it as /etc/drover/agent.toml, mode 0600 (it holds the token),\n\
         # then: systemctl restart drover-agent. Each device makes its own key at\n\
         # its first start and asks to join with the token.\n\
         device_id = {device}\n\
         # The keys the control plane signs intents with: the agent runs no other.\n\
         intent_public_keys = [{keys}]\n\
         {ca}\n\
         [transport]\n{transport}\n\
         [updater]\n\
         # \"upgrade\": the real apt full-upgrade; \"simulate\": apt-get -s, changes nothing.\n\
         mode = {mode}\n",
        name = spec.token_name,
        device = quoted(spec.device_id),
        keys = keys.join(", "),
        mode = quoted(spec.mode),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec<'a>(url: &'a str, trust: &'a AgentTrust) -> AgentConfigSpec<'a> {
        AgentConfigSpec {
            token_name: "line-3",
            token: "drover-enroll.a.b",
            agents_url: url,
            device_id: "pi-{serial}",
            ca_pem: Some("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"),
            mode: "upgrade",
            trust,
        }
    }

    /// Each transport's table from the URL's scheme; the TOML parses; the
    /// CA, the token and the keys are in it.
    #[test]
    fn the_file_names_the_transport_the_url_names() {
        let trust = AgentTrust {
            intent_public_keys: vec!["ab".repeat(32)],
            nats_enrollment_jwt: Some("eyJ.jwt".into()),
        };
        for (url, kind, key) in [
            ("wss://cp.example.org:7181", "websocket", "server_url"),
            ("mqtts://broker:8883", "mqtt", "url"),
            ("tls://nats:4222", "nats", "url"),
        ] {
            let text = render(&spec(url, &trust)).expect("rendered");
            let table: toml::Table = toml::from_str(&text).expect("TOML");
            let transport = table["transport"].as_table().expect("transport");
            assert_eq!(transport["kind"].as_str(), Some(kind), "{text}");
            assert_eq!(transport[key].as_str(), Some(url), "{text}");
            assert_eq!(
                transport["enrollment_token"].as_str(),
                Some("drover-enroll.a.b")
            );
            assert_eq!(
                transport.get("enrollment_jwt").and_then(|j| j.as_str()),
                (kind == "nats").then_some("eyJ.jwt")
            );
            assert_eq!(table["device_id"].as_str(), Some("pi-{serial}"));
            assert_eq!(
                table["ca_pem"].as_str(),
                Some("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
            );
            assert_eq!(
                table["intent_public_keys"].as_array().map(Vec::len),
                Some(1)
            );
        }
    }

    #[test]
    fn what_cannot_make_a_config_is_named() {
        let plain = AgentTrust {
            intent_public_keys: vec!["ab".repeat(32)],
            nats_enrollment_jwt: None,
        };
        for (url, expected) in [
            ("tls://nats:4222", "--nats-authority"),
            ("https://cp:7180", "wss://HOST:7181"),
            ("cp:7181", "wss://HOST:7181"),
        ] {
            let error = render(&spec(url, &plain)).unwrap_err().to_string();
            assert!(error.contains(expected), "{url}: {error}");
        }
        let mut bad = spec("wss://cp:7181", &plain);
        bad.mode = "yolo";
        assert!(render(&bad).is_err());
    }
}
