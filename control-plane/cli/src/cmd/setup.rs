//! The commands that set up a control plane's directory: `init`,
//! `reset-store` and `token`.

use super::client;
use agent_core::out;
use anyhow::{Result, bail};
use drover::cli::Cli;

/// `drover init [--tls-name HOST …] [--renew-tls]`.
pub fn init(cli: &Cli, tls_names: &[String], renew_tls: &bool, yes: &bool) -> Result<i32> {
    if *renew_tls && drover::init::has_tls(&cli.data) {
        agent_core::confirm::confirm(
            &format!(
                "Replace the CA and server certificate in {}? Every agent and \
                 operator that trusts the old CA refuses the new certificate until \
                 it is given the new tls/ca.pem.",
                cli.data.display()
            ),
            *yes,
        )
        .map_err(|e| anyhow::anyhow!(e))?;
    }
    let done = drover::init::init(&cli.data, tls_names, *renew_tls)?;
    let data = cli.data.display();
    out!(
        "{data}: secret.key, operator.token and intent.key {}",
        if done.made_secrets {
            "made (mode 0600)"
        } else {
            "kept as they were"
        }
    );
    out!(
        "intent key (each agent's intent_public_keys): {}",
        done.intent_public_key
    );
    match &done.tls {
        Some((files, made)) => {
            out!(
                "TLS {}: serve with --agent-tls-cert {} --agent-tls-key {} \
                 (and --api-tls-cert/--api-tls-key the same for https)",
                if *made { "made" } else { "kept" },
                files.server_cert.display(),
                files.server_key.display()
            );
            out!(
                "each agent: copy {} to /etc/drover/ca.pem (its ca_file); operators: DROVER_CA_FILE={}",
                files.ca_cert.display(),
                files.ca_cert.display()
            );
        }
        None => {
            out!("no TLS files: pass --tls-name HOST to make a CA and a server certificate")
        }
    }
    Ok(0)
}

/// `drover reset-store`: moves the embedded store aside, after asking.
pub fn reset_store(cli: &Cli, yes: &bool) -> Result<i32> {
    let path = cli.data.join("drover.redb");
    // Refused at once while a serve holds it, before asking.
    drop(agent_core::dbfile::hold(&path)?);
    agent_core::confirm::confirm(
        &format!(
            "Move {} aside? The next `drover serve` starts with an empty store: every \
             device, run, deployment, schedule and job record in it is gone.",
            path.display()
        ),
        *yes,
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    let aside = agent_core::dbfile::move_aside(&path)?;
    out!("moved {} to {}", path.display(), aside.display());
    Ok(0)
}

/// `drover token ID [--rotate | --unregistered]`: a device's token.
pub async fn token(cli: &Cli, device: &str, unregistered: &bool, rotate: &bool) -> Result<i32> {
    let device = drover_model::DeviceId::new(device.to_owned())?;
    let secrets = drover_server::auth::Secrets::load_existing(&cli.data, cli.token.clone())?;
    let mut generation = 0;
    if *rotate {
        let answer: drover_api::devices::TokenRotated = client(cli)?
            .post(
                &format!("/devices/{device}/rotate-token"),
                &serde_json::json!({}),
            )
            .await?;
        generation = answer.token_generation;
        eprintln!(
            "device {device}'s token rotated (generation {generation}): the one before is \
             refused from now on; put this one in its agent's config (over MQTT or NATS, \
             also make the broker's files again with mqtt-config or nats-config)"
        );
    } else if !unregistered {
        let api = client(cli)?;
        match api
            .get_optional::<drover_api::devices::Device>(&format!("/devices/{device}"))
            .await
        {
            Ok(Some(record)) => {
                generation = record.token_generation.unwrap_or(0);
            }
            Ok(None) => bail!(
                "device {device} is not registered: apply its Device manifest first \
                 (`drover apply -f`), or pass --unregistered"
            ),
            Err(e) => bail!(
                "cannot check that device {device} is registered: {e:#}; pass \
                 --unregistered to print its token anyway"
            ),
        }
    }
    out!("{}", secrets.device_token_at(&device, generation));
    Ok(0)
}
