//! The control plane's CA, inline in the config (`ca_pem`), so that one
//! file configures a device: it stands for the transport's `ca_file` and is
//! kept in the state directory, where the transports read it.

use super::{Config, Transport, default_ca_file};
use anyhow::{Context, Result, bail};

/// Where the agent keeps an inline `ca_pem`, in its state directory.
pub const CA_PEM_FILE: &str = "ca.pem";

impl Config {
    /// An inline `ca_pem` becomes the transport's `ca_file` (its copy in the
    /// state directory, which [`Config::keep_ca`] writes); without one, a
    /// WebSocket transport trusts the system's bundle.
    pub(super) fn resolve_ca(&mut self) -> Result<()> {
        let slot = match &mut self.transport {
            Transport::Websocket { ca_file, .. }
            | Transport::Nats { ca_file, .. }
            | Transport::Mqtt { ca_file, .. } => ca_file,
        };
        let Some(pem) = &self.ca_pem else {
            if let Transport::Websocket { ca_file, .. } = &mut self.transport {
                ca_file.get_or_insert_with(default_ca_file);
            }
            return Ok(());
        };
        use rustls::pki_types::{CertificateDer, pem::PemObject};
        let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow::anyhow!("ca_pem: {e}"))?;
        if certs.is_empty() {
            bail!("ca_pem holds no PEM certificate (-----BEGIN CERTIFICATE-----)");
        }
        if let Some(file) = slot {
            bail!(
                "ca_pem and transport.ca_file ({}) both name the CA: keep one",
                file.display()
            );
        }
        *slot = Some(self.state_dir.join(CA_PEM_FILE));
        Ok(())
    }

    /// Makes the state directory (mode 0700: the agent's state is its own).
    pub fn create_state_dir(&self) -> Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.state_dir)
            .with_context(|| {
                format!(
                    "cannot create the state directory {}",
                    self.state_dir.display()
                )
            })
    }

    /// Keeps an inline `ca_pem` in the state directory for the transport
    /// to read, writing it only when it changed.
    pub fn keep_ca(&self) -> Result<()> {
        let Some(pem) = &self.ca_pem else {
            return Ok(());
        };
        let path = self.state_dir.join(CA_PEM_FILE);
        if std::fs::read(&path).is_ok_and(|kept| kept == pem.as_bytes()) {
            return Ok(());
        }
        self.create_state_dir()?;
        agent_core::durable::replace(&path, pem.as_bytes(), 0o644)
            .with_context(|| format!("cannot keep ca_pem as {}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::GOOD;
    use super::*;

    /// A PEM block as `ca_pem` takes it (its DER is not read here).
    const PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIBAA==\n-----END CERTIFICATE-----\n";

    /// One file configures a device: an inline CA stands for the
    /// transport's ca_file, is kept in the state directory (made 0700)
    /// when it changed, and is refused beside a ca_file or without a
    /// certificate in it.
    #[test]
    fn an_inline_ca_is_kept_in_the_state_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        let text = format!(
            "state_dir = {:?}\nca_pem = {:?}\n{GOOD}",
            state.display().to_string(),
            PEM
        )
        .replace("ws://", "wss://");
        let config = Config::parse(&text).expect("parses");
        let kept = state.join(CA_PEM_FILE);
        assert!(
            matches!(&config.transport, Transport::Websocket { ca_file: Some(f), .. } if *f == kept),
            "{:?}",
            config.transport
        );
        assert_eq!(config.download_ca_file(), kept);
        assert!(!kept.exists(), "parsing writes nothing");
        config.keep_ca().expect("kept");
        assert_eq!(std::fs::read_to_string(&kept).expect("read"), PEM);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&state)
            .expect("state")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        // Unchanged: not written again.
        let before = std::fs::metadata(&kept)
            .expect("kept")
            .modified()
            .expect("mtime");
        config.keep_ca().expect("kept again");
        let after = std::fs::metadata(&kept)
            .expect("kept")
            .modified()
            .expect("mtime");
        assert_eq!(before, after);
        // Without ca_pem the WebSocket transport trusts the system's bundle.
        let plain = Config::parse(GOOD).expect("parses");
        assert_eq!(plain.download_ca_file(), default_ca_file());
        plain.keep_ca().expect("nothing to keep");

        for (bad, expected) in [
            (
                text.replace(
                    "kind = \"websocket\"",
                    "kind = \"websocket\"\nca_file = \"/etc/drover/ca.pem\"",
                ),
                "both name the CA",
            ),
            (
                text.replace(&format!("{PEM:?}"), "\"not a certificate\""),
                "holds no PEM certificate",
            ),
        ] {
            let err = format!("{:#}", Config::parse(&bad).unwrap_err());
            assert!(err.contains(expected), "{expected}: {err}");
        }
    }
}
