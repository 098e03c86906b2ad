//! `drover serve`: the control plane, until a signal or a store that
//! refuses writes.

use anyhow::Result;
use drover::cli::{Cli, ServeArgs, StoreKind};
use drover::serve::{self, ServeOptions};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::error;

/// The exit status after the embedded store refused a write on I/O
/// (EX_IOERR), as the agent's: a restart opens it again once there is space.
const EXIT_STORE_FAILED: i32 = 74;

/// Runs the control plane with `args` until a signal (0) or a store that
/// refused a write ([`EXIT_STORE_FAILED`]).
pub async fn serve(cli: &Cli, args: &ServeArgs) -> Result<i32> {
    let shutdown = CancellationToken::new();
    let started = serve::start(
        ServeOptions {
            data: cli.data.clone(),
            listen: args.listen,
            agent_listen: args.agent_listen,
            agent_tls: args.agent_tls_cert.clone().zip(args.agent_tls_key.clone()),
            api_tls: args.api_tls_cert.clone().zip(args.api_tls_key.clone()),
            api_allow_plaintext: args.api_allow_plaintext,
            ack_timeout: Duration::from_secs(args.ack_timeout_seconds),
            pass_interval: Duration::from_millis(args.pass_interval_ms),
            operator_token: cli.token.clone(),
            nats: args.nats.settings(),
            nats_authority: args.nats.nats_authority.clone(),
            nats_logins_per_second: args.nats.nats_logins_per_second,
            store_on_nats: args.store == StoreKind::Nats,
            max_agent_connections: args.max_agent_connections,
            mqtt: args.mqtt.settings(),
            mqtt_request_queue: args.mqtt.mqtt_request_queue,
            download_listen: args.download_listen,
            download_url: args.download_url.clone(),
            offline_alert: Duration::from_secs(args.offline_alert_minutes.saturating_mul(60)),
            patch_alerts: drover_rules::patch::AlertLimits {
                security_after: jiff::SignedDuration::from_hours(
                    i64::try_from(args.security_alert_days.saturating_mul(24))
                        .unwrap_or(i64::MAX / 3600),
                ),
                reboot_after: jiff::SignedDuration::from_hours(
                    i64::try_from(args.reboot_alert_hours).unwrap_or(i64::MAX / 3600),
                ),
            },
            uploads: drover_server::packages::UploadLimits {
                quota: args.package_quota,
                stall: Duration::from_secs(args.upload_stall_seconds),
            },
            audit_retention: Duration::from_secs(args.audit_retention_days.saturating_mul(86_400)),
            history: drover_rules::history::Retention {
                per_device: usize::try_from(args.history_jobs_per_device).unwrap_or(usize::MAX),
                max_age: jiff::SignedDuration::from_hours(i64::from(args.history_days) * 24),
            },
            enrollment_limits: (
                args.enrollments_per_address_per_minute,
                args.enrollments_per_token_per_minute,
            ),
        },
        shutdown.clone(),
    )
    .await?;
    if let Some(path) = &args.ready_file {
        let ready = serde_json::json!({"api": started.api_addr, "agents": started.agent_addr, "downloads": started.download_addr, "downloadUrl": started.download_url});
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, ready.to_string())?;
        std::fs::rename(&tmp, path)?;
    }
    let code = tokio::select! {
        () = agent_core::shutdown::wait_for_signal() => 0,
        () = started.store_failed.notified() => {
            error!(
                data = %cli.data.display(),
                "the data directory's file system refused a write (is it full?); \
                 exiting with EX_IOERR: the store takes no write until it is opened \
                 again, so free space there and start drover again (systemd does)"
            );
            EXIT_STORE_FAILED
        }
    };
    shutdown.cancel();
    for task in started.tasks {
        let _ = task.await;
    }
    Ok(code)
}
