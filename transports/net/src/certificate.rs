//! What was wrong with the certificate a TLS server presented, read from
//! rustls's typed error wherever it sits in an error's chain (a WebSocket
//! handshake's I/O error, or reqwest's error around hyper's around it), so
//! that both ends can say what to do about it.

use std::error::Error;

/// A server certificate this end would not trust, by what to do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertificateProblem {
    /// The server presents a CA certificate as its own.
    CaAsServer,
    /// No CA this end trusts signed it (or its signature does not hold).
    UnknownIssuer,
    /// It does not name the host this end connected to.
    WrongName,
    /// It has expired or is not valid yet: or this machine's clock is wrong.
    OutsideValidity,
}

/// The certificate problem behind `error`, if rustls found one.
pub fn certificate_problem(error: &(dyn Error + 'static)) -> Option<CertificateProblem> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(problem) = rustls_error(error).and_then(classify) {
            return Some(problem);
        }
        next = error.source();
    }
    None
}

/// rustls's error, itself or inside I/O errors (whose `source` skips the
/// error they wrap; hyper-rustls wraps tokio-rustls's I/O error in another).
fn rustls_error<'a>(mut error: &'a (dyn Error + 'static)) -> Option<&'a rustls::Error> {
    loop {
        if let Some(rustls) = error.downcast_ref::<rustls::Error>() {
            return Some(rustls);
        }
        error = error.downcast_ref::<std::io::Error>()?.get_ref()?;
    }
}

fn classify(error: &rustls::Error) -> Option<CertificateProblem> {
    use rustls::CertificateError as C;
    let rustls::Error::InvalidCertificate(certificate) = error else {
        return None;
    };
    Some(match certificate {
        C::UnknownIssuer | C::BadSignature => CertificateProblem::UnknownIssuer,
        C::NotValidForName | C::NotValidForNameContext { .. } => CertificateProblem::WrongName,
        C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. } => {
            CertificateProblem::OutsideValidity
        }
        // rustls passes the path builder's own errors on as they are.
        C::Other(other) => match other.0.downcast_ref::<webpki::Error>() {
            Some(webpki::Error::CaUsedAsEndEntity) => CertificateProblem::CaAsServer,
            _ => return None,
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    use std::path::Path;
    use std::sync::Arc;

    struct Made {
        cert_pem: String,
        key_pem: String,
    }

    fn make_ca() -> (CertificateParams, KeyPair, Made) {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("CA");
        let made = Made {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        };
        (params, key, made)
    }

    fn leaf(name: &str, ca: &(CertificateParams, KeyPair, Made), expired: bool) -> Made {
        let mut params = CertificateParams::new(vec![name.to_owned()]).expect("params");
        if expired {
            params.not_before = rcgen::date_time_ymd(2001, 1, 1);
            params.not_after = rcgen::date_time_ymd(2002, 1, 1);
        }
        let key = KeyPair::generate().expect("key");
        let issuer = Issuer::from_params(&ca.0, &ca.1);
        let cert = params.signed_by(&key, &issuer).expect("leaf");
        Made {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        path
    }

    /// A real handshake over an in-memory pipe: the client, trusting
    /// `trusted`, connects to `host` served `served`; its error, if any.
    async fn handshake(trusted: &Made, served: &Made, host: &str) -> Option<std::io::Error> {
        crate::tls::install_default_provider();
        let dir = tempfile::tempdir().expect("tempdir");
        let client = crate::tls::client_config(&write(dir.path(), "ca.pem", &trusted.cert_pem))
            .expect("client config");
        let server = crate::tls::server_config(
            &write(dir.path(), "cert.pem", &served.cert_pem),
            &write(dir.path(), "key.pem", &served.key_pem),
        )
        .expect("server config");
        let (near, far) = tokio::io::duplex(64 * 1024);
        let accept = tokio::spawn(async move {
            let _ = tokio_rustls::TlsAcceptor::from(server).accept(far).await;
        });
        let name = rustls::pki_types::ServerName::try_from(host.to_owned()).expect("name");
        let result = tokio_rustls::TlsConnector::from(Arc::clone(&client))
            .connect(name, near)
            .await;
        accept.abort();
        result.err()
    }

    /// Each problem as a real handshake meets it, beside the handshake that
    /// succeeds (the positive control), and wrapped as callers see it.
    #[tokio::test]
    async fn each_certificate_problem_is_named_from_a_real_handshake() {
        let ca = make_ca();
        let other_ca = make_ca();
        let good = leaf("localhost", &ca, false);
        assert!(handshake(&ca.2, &good, "localhost").await.is_none());
        let cases = [
            (
                &other_ca.2,
                &good,
                "localhost",
                CertificateProblem::UnknownIssuer,
            ),
            (
                &ca.2,
                &good,
                "elsewhere.test",
                CertificateProblem::WrongName,
            ),
            (
                &ca.2,
                &leaf("localhost", &ca, true),
                "localhost",
                CertificateProblem::OutsideValidity,
            ),
            (&ca.2, &ca.2, "localhost", CertificateProblem::CaAsServer),
        ];
        for (trusted, served, host, expected) in cases {
            let error = handshake(trusted, served, host)
                .await
                .unwrap_or_else(|| panic!("{expected:?}: the handshake succeeded"));
            assert_eq!(certificate_problem(&error), Some(expected), "{error}");
            // Deeper in a chain, as reqwest's error holds it: hyper-rustls
            // wraps the handshake's I/O error in another, behind hyper's.
            #[derive(Debug, thiserror::Error)]
            #[error("request failed")]
            struct Outer(#[source] std::io::Error);
            let wrapped = Outer(std::io::Error::other(error));
            assert_eq!(certificate_problem(&wrapped), Some(expected));
        }
        let plain = std::io::Error::other("connection refused");
        assert_eq!(certificate_problem(&plain), None);
    }
}
