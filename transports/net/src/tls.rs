//! TLS with rustls and the ring provider for both ends. The agent trusts the
//! CA bundle it is given (Debian's system bundle by default); plain `ws://`
//! is allowed only to a loopback host.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;

/// Debian's bundle of system-trusted CAs.
pub const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read certificates from {path}: {reason}")]
    Certs { path: String, reason: String },
    #[error("cannot read the private key from {path}: {reason}")]
    Key { path: String, reason: String },
    #[error("TLS configuration rejected: {0}")]
    Config(#[from] rustls::Error),
}

/// Makes ring this process's default rustls provider, for libraries that
/// look one up (reqwest built without aws-lc). Calling it again is harmless.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let err = |reason: String| TlsError::Certs {
        path: path.display().to_string(),
        reason,
    };
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| err(e.to_string()))?;
    if certs.is_empty() {
        return Err(err("no PEM certificate found".into()));
    }
    Ok(certs)
}

/// A client configuration trusting the CAs in `ca_file`.
pub fn client_config(ca_file: &Path) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in read_certs(ca_file)? {
        // A bundle may hold certificates this rustls cannot use; skip those.
        let _ = roots.add(cert);
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// A server configuration from a PEM certificate chain and key.
pub fn server_config(
    cert_file: &Path,
    key_file: &Path,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certs = read_certs(cert_file)?;
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| TlsError::Key {
        path: key_file.display().to_string(),
        reason: e.to_string(),
    })?;
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    Ok(Arc::new(config))
}

/// Whether `host` names this machine, where plain `ws://` is allowed.
pub fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .map(|ip| ip.is_loopback())
            .unwrap_or(false)
}

/// The TLS acceptor of the control plane's agent listener.
#[cfg(feature = "server")]
pub type Acceptor = tokio_rustls::TlsAcceptor;

/// Builds the agent listener's TLS acceptor from PEM files.
#[cfg(feature = "server")]
pub fn acceptor(cert_file: &Path, key_file: &Path) -> Result<Acceptor, TlsError> {
    Ok(tokio_rustls::TlsAcceptor::from(server_config(
        cert_file, key_file,
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for (host, expected) in [
            ("127.0.0.1", true),
            ("127.3.2.1", true),
            ("[::1]", true),
            ("localhost", true),
            ("10.0.0.1", false),
            ("example.org", false),
        ] {
            assert_eq!(is_loopback(host), expected, "{host}");
        }
    }

    #[test]
    fn missing_or_empty_files_are_clear_errors() {
        let dir = std::env::temp_dir().join(format!("drover-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "").expect("write");
        let err = client_config(&empty).unwrap_err().to_string();
        assert!(err.contains("no PEM certificate"), "{err}");
        let err = client_config(&dir.join("missing.pem"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot read certificates"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
