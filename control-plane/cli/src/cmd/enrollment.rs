//! `drover enrollment-tokens` and `drover devices` (issue 55): the tokens a
//! device image carries, and the keys devices enrolled with them.

use agent_core::out;
use anyhow::{Context, Result, bail};
use drover::agent_config::AgentConfigSpec;
use drover::cli::{DevicesCommand, EnrollmentTokensCommand};
use drover::client::ApiClient;
use drover::get::structured;
use drover::table::{age, print_table, table};
use drover::watch::printable;
use drover_api::enrollment::{
    AgentTrust, DeviceKey, EnrollmentToken, KeyState, NewEnrollmentToken, PreauthorizedKey,
};
use jiff::Timestamp;
use serde_json::json;
use std::collections::BTreeMap;

fn text(value: Option<&str>) -> String {
    value.map_or_else(|| "-".to_owned(), printable)
}

/// `--expires`: a time, or an age from `now` (30m, 24h, 7d).
pub fn expires_at(text: &str, now: Timestamp) -> Result<Timestamp> {
    if let Ok(at) = text.parse::<Timestamp>() {
        return Ok(at);
    }
    let bad = || {
        anyhow::anyhow!(
            "--expires {text}: give an age (30m, 24h, 7d) or a time (2026-12-31T00:00:00Z)"
        )
    };
    let age = drover_api::parse_age(text).ok_or_else(bad)?;
    now.checked_add(age).map_err(|_| bad())
}

fn labels(pairs: &[String]) -> Result<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    for pair in pairs {
        let Some((key, value)) = pair.split_once('=') else {
            bail!("--labels {pair:?}: give KEY=VALUE");
        };
        labels.insert(key.to_owned(), value.to_owned());
    }
    Ok(labels)
}

fn token_state(token: &EnrollmentToken, now: Timestamp) -> String {
    if let Some(at) = token.revoked_at {
        return format!("revoked {} ago", age(Some(at), now));
    }
    if token.expires_at.is_some_and(|at| at <= now) {
        return "expired".into();
    }
    if token.max_uses.is_some_and(|max| token.uses >= max) {
        return "used up".into();
    }
    "active".into()
}

pub async fn tokens(api: &ApiClient, command: &EnrollmentTokensCommand) -> Result<i32> {
    match command {
        EnrollmentTokensCommand::List { output } => {
            let tokens: Vec<EnrollmentToken> = api.get("/enrollment-tokens").await?;
            if structured(*output, &tokens)? {
                return Ok(0);
            }
            let now = Timestamp::now();
            let mut shown = table(&[
                "NAME", "GROUPS", "LABELS", "USES", "EXPIRES", "ACCEPT", "STATE",
            ]);
            for token in &tokens {
                let labels: Vec<String> = token
                    .labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                shown.add_row(vec![
                    printable(&token.name),
                    printable(&token.groups.join(",")),
                    printable(&labels.join(",")),
                    match token.max_uses {
                        Some(max) => format!("{}/{max}", token.uses),
                        None => token.uses.to_string(),
                    },
                    token
                        .expires_at
                        .map_or_else(|| "never".into(), |at| at.to_string()),
                    if token.auto_accept {
                        "auto"
                    } else {
                        "operator"
                    }
                    .into(),
                    token_state(token, now),
                ]);
            }
            print_table(&shown);
        }
        EnrollmentTokensCommand::Create {
            name,
            groups,
            labels: pairs,
            max_uses,
            expires,
            auto_accept,
            agent_config,
            device_id,
            agent_ca_file,
            mode,
        } => {
            let new = NewEnrollmentToken {
                name: name.clone(),
                groups: groups.clone(),
                labels: labels(pairs)?,
                max_uses: *max_uses,
                expires_at: expires
                    .as_deref()
                    .map(|e| expires_at(e, Timestamp::now()))
                    .transpose()?,
                auto_accept: *auto_accept,
            };
            // What the config needs is read first: a token is not made
            // for a file that cannot be written.
            let trust: Option<AgentTrust> = match agent_config {
                Some(_) => Some(api.get("/agent-trust").await?),
                None => None,
            };
            let ca_pem = match agent_ca_file.as_deref().or(api.ca_file()) {
                Some(file) if agent_config.is_some() => Some(
                    std::fs::read_to_string(file)
                        .with_context(|| format!("cannot read the CA {}", file.display()))?,
                ),
                _ => None,
            };
            let spec = |token| {
                agent_config
                    .as_deref()
                    .zip(trust.as_ref())
                    .map(|(url, trust)| {
                        drover::agent_config::render(&AgentConfigSpec {
                            token_name: name,
                            token,
                            agents_url: url,
                            device_id: device_id.as_deref().unwrap_or("{machine-id}"),
                            ca_pem: ca_pem.as_deref(),
                            mode: mode.as_deref().unwrap_or("upgrade"),
                            trust,
                        })
                    })
            };
            // A URL the config cannot be made for is refused before the token.
            spec("-").transpose()?;
            let answer: EnrollmentToken = api.post("/enrollment-tokens", &new).await?;
            match spec(answer.token.as_deref().unwrap_or_default()).transpose()? {
                Some(config) => out!("{config}"),
                None => out!("{}", text(answer.token.as_deref())),
            }
            let accepted = if *auto_accept {
                "are accepted at once"
            } else {
                "wait for `drover devices accept`"
            };
            if agent_config.is_some() {
                eprintln!(
                    "that is the agent config of enrollment token {name}, which is shown once \
                     and stored only as a digest. Install it on each device as \
                     /etc/drover/agent.toml (mode 0600); devices enrolled with it {accepted}"
                );
            } else {
                eprintln!(
                    "that is enrollment token {name}; it is shown once and stored only as a \
                     digest. Put it in the devices' enrollment file (enrollment_token_file in \
                     the agent's config); devices enrolled with it {accepted}"
                );
            }
        }
        EnrollmentTokensCommand::Revoke { name } => {
            api.post::<EnrollmentToken>(&format!("/enrollment-tokens/{name}/revoke"), &json!({}))
                .await?;
            out!(
                "enrollment-token/{name} revoked: devices that enrolled with it stay; no new one can"
            );
        }
    }
    Ok(0)
}

fn state_name(state: KeyState) -> &'static str {
    match state {
        KeyState::Pending => "pending",
        KeyState::Accepted => "accepted",
        KeyState::Rejected => "rejected",
    }
}

fn print_keys(keys: &[DeviceKey]) {
    let now = Timestamp::now();
    let mut shown = table(&[
        "DEVICE", "STATE", "KEY", "TOKEN", "HOSTNAME", "ARCH", "FROM", "ASKED", "NOTE",
    ]);
    for key in keys {
        let mut note = Vec::new();
        if key.existing_device {
            note.push("a device of this id existed".to_owned());
        }
        if let Some(conflict) = &key.conflict {
            note.push(format!(
                "another key ({}…) asked {} ago",
                &conflict.public_key[..conflict.public_key.len().min(12)],
                age(Some(conflict.at), now)
            ));
        }
        shown.add_row(vec![
            printable(&key.device),
            state_name(key.state).into(),
            format!("{}…", &key.public_key[..key.public_key.len().min(12)]),
            text(key.token.as_deref()),
            text(key.hostname.as_deref()),
            text(key.architecture.as_deref()),
            text(key.peer.as_deref()),
            age(Some(key.requested_at), now),
            if note.is_empty() {
                "-".into()
            } else {
                printable(&note.join("; "))
            },
        ]);
    }
    print_table(&shown);
}

pub async fn devices(api: &ApiClient, command: &DevicesCommand) -> Result<i32> {
    match command {
        DevicesCommand::Pending { output } | DevicesCommand::Keys { output } => {
            let path = if matches!(command, DevicesCommand::Pending { .. }) {
                "/device-keys?state=pending"
            } else {
                "/device-keys"
            };
            let keys: Vec<DeviceKey> = api.get(path).await?;
            if structured(*output, &keys)? {
                return Ok(0);
            }
            if keys.is_empty() && matches!(command, DevicesCommand::Pending { .. }) {
                eprintln!("no device waits for an operator");
                return Ok(0);
            }
            print_keys(&keys);
        }
        DevicesCommand::Accept { id } => {
            api.post::<DeviceKey>(&format!("/devices/{id}/accept"), &json!({}))
                .await?;
            out!(
                "device/{id} accepted: its key opens its sessions; it joins with its token's groups and labels"
            );
        }
        DevicesCommand::Preauthorize {
            id,
            public_key,
            groups,
            labels: pairs,
        } => {
            let key = PreauthorizedKey {
                device: id.clone(),
                public_key: public_key.clone(),
                groups: groups.clone(),
                labels: labels(pairs)?,
            };
            api.post::<DeviceKey>("/device-keys", &key).await?;
            out!("device/{id} pre-authorized: its agent is let in by this key, without enrolling");
        }
        DevicesCommand::Reject { id } => {
            api.post::<DeviceKey>(&format!("/devices/{id}/reject"), &json!({}))
                .await?;
            out!("device/{id} rejected: its key opens nothing, and asking again is refused");
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expires_takes_an_age_or_a_time() {
        let now: Timestamp = "2026-12-06T12:00:00Z".parse().expect("time");
        assert_eq!(
            expires_at("7d", now).expect("7d").to_string(),
            "2026-12-13T12:00:00Z"
        );
        assert_eq!(
            expires_at("30m", now).expect("30m").to_string(),
            "2026-12-06T12:30:00Z"
        );
        assert_eq!(
            expires_at("2026-12-31T00:00:00Z", now)
                .expect("time")
                .to_string(),
            "2026-12-31T00:00:00Z"
        );
        for bad in ["7", "7w", "d", "soon", ""] {
            assert!(expires_at(bad, now).is_err(), "{bad}");
        }
    }
}
