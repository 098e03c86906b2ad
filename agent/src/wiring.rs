//! What the daemon runs, made from its config: the store (redb, or sled
//! in a build with it), the updaters' chains and the executor's settings.

use crate::config::{Config, StoreKind, UpdaterMode};
use agent_core::executor::{Agent, Settings};
use agent_core::facts::FactSources;
use agent_core::lifecycle::Limits;
use agent_core::store::RedbStore;
use anyhow::Result;
use std::path::Path;
use std::sync::Arc;
use updater_apt::{
    AptSettings, Fetcher, InventoryRefresh, Launcher, Mode, PackageInstaller, PatchAssessor,
    SystemUpgrade,
};

/// The agent the config describes, over its store, with every job kind's
/// chain.
pub(crate) fn agent(
    config: &Config,
    device_id: &drover_model::DeviceId,
    boot_id: &str,
    device_key: Arc<agent_core::identity::DeviceKey>,
) -> Result<Arc<Agent>> {
    let checker = agent_core::dbfile::Checker::this_binary("drover-agent reset-store");
    let store: Arc<dyn agent_core::store::Store> = match config.store {
        StoreKind::Redb => Arc::new(RedbStore::open_checked(
            &config.state_dir.join("agent.redb"),
            &checker,
        )?),
        #[cfg(feature = "sled-store")]
        StoreKind::Sled => Arc::new(agent_core::store_sled::SledStore::open(
            &config.state_dir.join("agent.sled"),
        )?),
        #[cfg(not(feature = "sled-store"))]
        StoreKind::Sled => anyhow::bail!(
            "the config asks for store = \"sled\", but this drover-agent was built without \
             the sled store (cargo feature sled-store); remove the key to use redb"
        ),
    };
    let apt = AptSettings {
        mode: match config.updater.mode {
            UpdaterMode::Simulate => Mode::Simulate,
            UpdaterMode::Upgrade => Mode::Upgrade,
        },
        root: config.updater.root.clone(),
        min_free_bytes: config.updater.min_free_mib * 1024 * 1024,
        min_free_boot_bytes: config.updater.min_free_boot_mib * 1024 * 1024,
        #[cfg(feature = "testing")]
        kernel_release_path: config.kernel_release_path.clone(),
        #[cfg(not(feature = "testing"))]
        kernel_release_path: std::path::PathBuf::from(updater_apt::kernel::RELEASE_PATH),
        calls_dir: config.calls_dir(),
        launcher: Launcher::detect(),
    };
    let ca_file = config.download_ca_file();
    let fetcher = Fetcher {
        // Without a readable CA file only http:// links to loopback work;
        // an https:// job then fails saying so.
        tls: drover_net::tls::client_config(&ca_file).ok(),
        device_id: device_id.to_string(),
        token: config.transport.read_token().ok(),
    };
    let chains: Vec<Arc<dyn agent_core::chain::Chain>> = vec![
        Arc::new(SystemUpgrade::new(apt.clone())),
        Arc::new(PackageInstaller::new(apt.clone(), Some(fetcher))),
        Arc::new(InventoryRefresh::new(apt.clone())),
        Arc::new(PatchAssessor::new(apt.clone())),
    ];
    let settings = Settings {
        device_id: device_id.clone(),
        boot_id: boot_id.to_owned(),
        agent_version: crate::agent_version(Path::new(crate::PACKAGE_VERSION_FILE)),
        limits: Limits {
            max_resumes: config.limits.max_resumes,
        },
        keep_jobs: config.limits.keep_jobs,
        facts: FactSources {
            root: apt.system_root(),
        },
        test_hold: None,
        test_job_budget: None,
        trusted_keys: drover_model::signing::TrustedKeys::from_hex(&config.intent_public_keys)
            .map_err(|e| anyhow::anyhow!(e))?,
        device_key: Some(device_key),
        logs: agent_core::job_logs::Answering::new(Arc::new(crate::logs::CallsOutput {
            calls: config.calls_dir(),
        })),
    };
    #[cfg(feature = "testing")]
    let settings = test_hooks(settings, config.testing.as_ref());
    let agent = Agent::new(settings, store, chains);
    Ok(agent)
}

/// Applies the config's `[testing]` table (only in a build with test hooks).
#[cfg(feature = "testing")]
fn test_hooks(mut settings: Settings, testing: Option<&crate::config::Testing>) -> Settings {
    let Some(testing) = testing else {
        return settings;
    };
    if let (Some(step), Some(hold), Some(reached)) = (
        &testing.hold_before_step,
        &testing.hold_file,
        &testing.reached_file,
    ) {
        settings.test_hold = Some(agent_core::executor::TestHold {
            step: step.clone(),
            hold: hold.clone(),
            reached: reached.clone(),
        });
    }
    if testing.clock_offset_seconds != 0 {
        tracing::warn!(
            seconds = testing.clock_offset_seconds,
            "test hook: the device's clock is skewed"
        );
        agent_core::clock::set_test_offset(jiff::SignedDuration::from_secs(
            testing.clock_offset_seconds,
        ));
    }
    settings.test_job_budget = testing
        .job_budget_seconds
        .map(std::time::Duration::from_secs);
    settings
}
