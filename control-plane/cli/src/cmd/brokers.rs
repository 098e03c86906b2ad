//! `drover mqtt-config` and `drover nats-config`: the brokers' files for
//! the control plane and its devices.

use agent_core::out;
use anyhow::{Context, Result, bail};
use drover::cli::{Cli, MqttConfigArgs, NatsConfigArgs};

/// Devices' token generations (those rotated), from the control plane: a
/// broker's password derives from the device's current token. With
/// `offline`, or when nothing listens at the control plane's address (a
/// first set-up before `serve`), every token is taken as never rotated,
/// and said so.
pub async fn generations(
    api: Result<drover::client::ApiClient>,
    offline: bool,
) -> Result<std::collections::HashMap<String, u64>> {
    let never = |why: String| {
        eprintln!(
            "{why}: every device's token is taken as never rotated; if one was \
             (`drover token --rotate`), run this again with the control plane up"
        );
        Ok(std::collections::HashMap::new())
    };
    if offline {
        return never("--offline".into());
    }
    let api = api?;
    match api
        .get_if_up::<drover_api::devices::TokenGenerations>("/devices/token-generations")
        .await
        .context("cannot read the devices' token generations (pass --offline before the control plane first runs)")?
    {
        Some(generations) => Ok(generations.into_iter().collect()),
        None => never(format!("nothing answers at {}", api.base())),
    }
}

/// `drover mqtt-config`.
pub fn mqtt_config(
    cli: &Cli,
    args: &MqttConfigArgs,
    generations: &std::collections::HashMap<String, u64>,
) -> Result<i32> {
    let MqttConfigArgs {
        devices,
        dynamic_security,
        control_plane_users,
        control_plane_password,
        prefix,
        out,
        group,
        offline: _,
    } = args;
    if control_plane_password.is_empty() {
        bail!("the control plane's MQTT password is empty");
    }
    let secrets = drover_server::auth::Secrets::load_existing(&cli.data, cli.token.clone())?;
    let devices = broker_passwords(&secrets, devices, generations)?;
    let (passwords, acl) = transport_mqtt::mosquitto::mosquitto_files(
        &transport_mqtt::Topics::new(prefix),
        &control_plane_users
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        control_plane_password,
        &devices,
    );
    let gid = broker_group(group)?;
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    for (name, text) in [("drover.passwd", &passwords), ("drover.acl", &acl)] {
        write_for_broker(&out.join(name), text, gid, group, "mqtt-config")?;
    }
    match gid {
        Some(_) => out!(
            "# drover.passwd and drover.acl: mode 0640, group {group} (the broker reads them as its user)"
        ),
        None => out!(
            "# drover.passwd and drover.acl: mode 0640, group unchanged; the broker's user must be able to read them"
        ),
    }
    out!(
        "per_listener_settings false\nallow_anonymous false\npassword_file {}\nacl_file {}\n\
         # a large fleet's statuses must never be dropped from the control plane's queue,\n\
         # nor wait for a delayed ACK; and no client may send more than Drover ever does\n{}",
        out.join("drover.passwd").display(),
        out.join("drover.acl").display(),
        transport_mqtt::Topics::broker_settings()
    );
    out!(
        "# under each listener the devices use (a listener option: it applies to the\n\
         # `listener` line above it): a client's id is its user name, so no device can\n\
         # take another's id or a control-plane replica's; one user per replica\n{}",
        transport_mqtt::Topics::listener_settings()
    );
    if let Some(file) = dynamic_security {
        dynamic_security_file(file, prefix)?;
        out!(
            "# devices that join by themselves: their logins come and go in the dynamic\n\
             # security plugin's file, which the broker keeps\nplugin {}\nplugin_opt_config_file {}",
            transport_mqtt::dynsec::plugin_path(),
            file.display()
        );
    }
    Ok(0)
}

/// Writes the dynamic security plugin's first file, owned as its directory
/// is (the broker's user writes it from then on); an existing one is left
/// as it is: it holds the broker's logins.
fn dynamic_security_file(file: &std::path::Path, prefix: &str) -> Result<()> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let text = transport_mqtt::dynsec::initial_config(&transport_mqtt::Topics::new(prefix));
    let dir = file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let owner = std::fs::metadata(dir).with_context(|| {
        format!(
            "cannot read {} (the plugin file's directory)",
            dir.display()
        )
    })?;
    let mut opened = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(file)
    {
        Ok(opened) => opened,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            eprintln!(
                "{} exists: left as it is (it holds the broker's logins)",
                file.display()
            );
            return Ok(());
        }
        Err(e) => return Err(e).with_context(|| format!("cannot write {}", file.display())),
    };
    std::io::Write::write_all(&mut opened, text.as_bytes())?;
    opened.sync_all()?;
    std::os::unix::fs::fchown(&opened, Some(owner.uid()), Some(owner.gid())).with_context(
        || {
            format!(
                "cannot give {} to the owner of {} (the broker's user writes it)",
                file.display(),
                dir.display()
            )
        },
    )?;
    Ok(())
}

/// `drover nats-config`.
pub fn nats_config(
    cli: &Cli,
    args: &NatsConfigArgs,
    generations: &std::collections::HashMap<String, u64>,
) -> Result<i32> {
    let NatsConfigArgs {
        devices,
        control_plane_user,
        control_plane_password,
        authority,
        resolver_dir,
        out,
        cluster,
        allow_direct_status_puts,
        group,
        offline: _,
    } = args;
    let config = match authority {
        Some(dir) => {
            let authority = transport_nats::authority::Authority::load_or_create(dir)?;
            format!(
                "{}# every device's [transport] (kind = \"nats\", with its enrollment_token_file):\n\
                 # enrollment_jwt = \"{}\"\n\
                 # the control plane: drover serve --nats-url … --nats-authority {}\n",
                authority.server_config(resolver_dir)?,
                authority.enroll_jwt()?,
                dir.display()
            )
        }
        None => {
            let secrets =
                drover_server::auth::Secrets::load_existing(&cli.data, cli.token.clone())?;
            let devices = broker_passwords(&secrets, devices, generations)?;
            use transport_nats::server::DirectStatusPuts;
            let direct = if *allow_direct_status_puts {
                DirectStatusPuts::Allowed
            } else {
                DirectStatusPuts::Denied
            };
            transport_nats::server::authorization_config(
                (
                    control_plane_user,
                    control_plane_password.as_deref().unwrap_or_default(),
                ),
                &devices,
                direct,
            )
            .map_err(anyhow::Error::msg)?
        }
    };
    match out {
        Some(path) => {
            let gid = broker_group(group)?;
            write_for_broker(
                path,
                &format!("{}\n", config.trim_end()),
                gid,
                group,
                "nats-config",
            )?;
            out!(
                "wrote {} (mode 0640, {}); {}",
                path.display(),
                match gid {
                    Some(_) => format!("group {group}: nats-server reads it as its user"),
                    None => "group unchanged: nats-server's user must be able to read it".into(),
                },
                include_hint(path)
            );
            out!(
                "# nats-server.conf also needs JetStream in a directory its user may write:\n\
                 #   jetstream {{ store_dir: /var/lib/nats/jetstream }}\n\
                 # (install -d -o nats -g nats /var/lib/nats, for Debian's nats-server)"
            );
        }
        None => out!("{}", config.trim_end()),
    }
    if *cluster {
        out!("{}", transport_nats::server::CLUSTER_NOTES.trim_end());
    }
    Ok(0)
}

/// Writes a file a broker reads (replaced whole, through a temporary file):
/// mode 0640, given to the broker's group so a broker that dropped to its
/// own user reads it; `command` names what wrote it in errors.
fn write_for_broker(
    path: &std::path::Path,
    text: &str,
    gid: Option<u32>,
    group: &str,
    command: &str,
) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o640)
            .open(&tmp)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::io::Write::write_all(&mut file, text.as_bytes())?;
        if let Some(gid) = gid {
            std::os::unix::fs::fchown(&file, None, Some(gid)).with_context(|| {
                format!(
                    "cannot give {} to group {group} (run {command} as root, \
                     or pass --group \"\" and make the file readable by the broker's user)",
                    tmp.display()
                )
            })?;
        }
        file.sync_all()?;
    }
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

/// How nats-server's main config includes `path`: nats-server joins an
/// include path to the including file's directory, an absolute one too (2.9
/// reads `include /etc/x.conf` from /etc as /etc/etc/x.conf).
fn include_hint(path: &std::path::Path) -> String {
    let from_etc = match path.strip_prefix("/etc") {
        Ok(relative) => Some(relative.display().to_string()),
        Err(_) if path.is_absolute() => Some(format!("..{}", path.display())),
        Err(_) => None,
    };
    match from_etc {
        Some(include) => format!(
            "put `include {include}` in /etc/nats-server.conf (Debian's main config; \
             nats-server reads an include path relative to the including file's directory, \
             an absolute one too) and reload nats-server"
        ),
        None => "include it from nats-server's main config by its path relative to that \
                 file's directory, and reload nats-server"
            .to_owned(),
    }
}

/// The id of the group `mqtt-config` and `nats-config` give their files,
/// None for `--group ""`.
/// Each device with the password it gives a broker: derived from its
/// token for that purpose alone, so a broker's files hold no token (which
/// would log in over WebSocket and open the device's sealed secrets).
fn broker_passwords(
    secrets: &drover_server::auth::Secrets,
    devices: &[String],
    generations: &std::collections::HashMap<String, u64>,
) -> Result<Vec<(drover_model::DeviceId, String)>> {
    devices
        .iter()
        .map(|d| {
            let id = drover_model::DeviceId::new(d.clone())?;
            let generation = generations.get(id.as_str()).copied().unwrap_or(0);
            let password = drover_model::credentials::broker_password(
                &secrets.device_token_at(&id, generation),
                &id,
            );
            Ok((id, password))
        })
        .collect()
}

fn broker_group(group: &str) -> Result<Option<u32>> {
    if group.is_empty() {
        return Ok(None);
    }
    match nix::unistd::Group::from_name(group) {
        Ok(Some(found)) => Ok(Some(found.gid.as_raw())),
        Ok(None) => bail!(
            "there is no group {group:?} here: install the broker first (Debian's mosquitto \
             package makes the group mosquitto), name its group with --group, or pass \
             --group \"\" and make the files readable by the broker's user yourself"
        ),
        Err(e) => bail!("cannot look up group {group:?}: {e}"),
    }
}
