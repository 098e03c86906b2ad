//! `drover init`: a control plane's data directory made before its first
//! start: the device-token key, the operator token, the intent-signing key,
//! and (with `--tls-name`) a private CA with a server certificate for the
//! names given, so that `wss://`, `https://` and the agents' `ca_file` work
//! without an openssl recipe. Nothing that exists is replaced: a second run
//! keeps every key and says so.
//!
//! The server certificate is an end-entity certificate (CA:FALSE, serverAuth)
//! signed by the CA; agents trust the CA. A self-signed certificate made as a
//! CA and served as the server's own is what rustls refuses with
//! `CaUsedAsEndEntity`.

use anyhow::{Context, Result, bail};
use drover_server::auth::{IntentSigner, Secrets, write_file, write_secret};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// How long the server certificate is valid (the CA/Browser Forum's old
/// ceiling; renew with `drover init --renew-tls`).
pub const SERVER_CERT_DAYS: i64 = 825;
/// How long the CA is valid.
pub const CA_DAYS: i64 = 3650;

/// The TLS files `init` makes under DATA/tls.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
}

impl TlsFiles {
    pub fn under(data_dir: &Path) -> Self {
        let dir = data_dir.join("tls");
        Self {
            ca_cert: dir.join("ca.pem"),
            ca_key: dir.join("ca.key"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
        }
    }
}

/// What `init` did.
#[derive(Debug)]
pub struct Initialised {
    /// The secrets were made now (false: they were there already).
    pub made_secrets: bool,
    pub intent_public_key: String,
    /// The TLS files, and whether they were made now.
    pub tls: Option<(TlsFiles, bool)>,
}

/// Whether `data_dir` holds a server certificate already.
pub fn has_tls(data_dir: &Path) -> bool {
    TlsFiles::under(data_dir).server_cert.exists()
}

/// Makes what is missing in `data_dir`; with `tls_names`, the CA and server
/// certificate too (refused if they exist, unless `renew_tls`).
pub fn init(data_dir: &Path, tls_names: &[String], renew_tls: bool) -> Result<Initialised> {
    let made_secrets = !data_dir.join("secret.key").exists();
    Secrets::load_or_create(data_dir, None)?;
    let intent_public_key = IntentSigner::load_or_create(data_dir)?.public_key();
    let files = TlsFiles::under(data_dir);
    let tls = if tls_names.is_empty() {
        files.server_cert.exists().then_some((files, false))
    } else {
        let names = with_this_host(tls_names);
        if files.server_cert.exists() && !renew_tls {
            // The same names again: nothing to do.
            let lacking = crate::listen::certificate_lacks(&files.server_cert, &names)?;
            if !lacking.is_empty() {
                bail!(
                    "{} exists already and does not name {}; to make a new CA and server \
                     certificate (every agent then needs the new {}), pass --renew-tls",
                    files.server_cert.display(),
                    lacking.join(", "),
                    files.ca_cert.display()
                );
            }
            Some((files, false))
        } else {
            make_tls(&files, &names, jiff::Timestamp::now())?;
            Some((files, true))
        }
    };
    Ok(Initialised {
        made_secrets,
        intent_public_key,
        tls,
    })
}

/// The names given, then localhost and 127.0.0.1 (once each): the CLI on
/// the control plane's own host reaches the API by those.
pub fn with_this_host(names: &[String]) -> Vec<String> {
    let mut all: Vec<String> = Vec::new();
    for name in names
        .iter()
        .map(String::as_str)
        .chain(["localhost", "127.0.0.1"])
    {
        if !all.iter().any(|n| n == name) {
            all.push(name.to_owned());
        }
    }
    all
}

/// (year, month, day) in UTC, as rcgen takes a date.
fn ymd(at: jiff::Timestamp) -> Result<(i32, u8, u8)> {
    let d = jiff::tz::Offset::UTC.to_datetime(at).date();
    Ok((
        d.year().into(),
        d.month().try_into().context("month")?,
        d.day().try_into().context("day")?,
    ))
}

fn validity(params: &mut CertificateParams, now: jiff::Timestamp, days: i64) -> Result<()> {
    // A day's slack before now for clocks a little behind.
    let (y, m, d) = ymd(now - jiff::SignedDuration::from_hours(24))?;
    params.not_before = rcgen::date_time_ymd(y, m, d);
    let (y, m, d) = ymd(now + jiff::SignedDuration::from_hours(24 * days))?;
    params.not_after = rcgen::date_time_ymd(y, m, d);
    Ok(())
}

/// A CA and a server certificate for `names` (DNS names or IP addresses).
pub fn make_tls(files: &TlsFiles, names: &[String], now: jiff::Timestamp) -> Result<()> {
    for name in names {
        if name.trim().is_empty() || name.contains(char::is_whitespace) {
            bail!("--tls-name {name:?} is not a host name or an IP address");
        }
    }
    let dir = files.ca_cert.parent().context("no tls directory")?;
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let mut ca_params = CertificateParams::default();
    let mut ca_name = DistinguishedName::new();
    ca_name.push(DnType::CommonName, "Drover fleet CA");
    ca_params.distinguished_name = ca_name;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    validity(&mut ca_params, now, CA_DAYS)?;
    let ca_key = KeyPair::generate().context("cannot make the CA's key")?;
    let ca_key_pem = ca_key.serialize_pem();
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key).context("cannot make the CA")?;

    let mut params = CertificateParams::new(names.to_vec())
        .with_context(|| format!("{names:?} are not host names or IP addresses"))?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, names[0].clone());
    params.distinguished_name = name;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    validity(&mut params, now, SERVER_CERT_DAYS)?;
    let key = KeyPair::generate().context("cannot make the server's key")?;
    let cert = params
        .signed_by(&key, &ca)
        .context("cannot sign the server certificate")?;

    // Keys first: a certificate never stands without its key.
    write_secret(&files.ca_key, &ca_key_pem)?;
    write_secret(&files.server_key, &key.serialize_pem())?;
    write_file(&files.ca_cert, &ca.pem(), 0o644)?;
    // The chain the server presents: its certificate, then the CA's.
    write_file(
        &files.server_cert,
        &format!("{}{}", cert.pem(), ca.pem()),
        0o644,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_init_keeps_every_key_and_refuses_to_replace_the_certificates() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        let first = init(&data, &["drover.example.org".into()], false).expect("init");
        assert!(first.made_secrets);
        let secret = std::fs::read(data.join("secret.key")).expect("secret");
        let (files, made) = first.tls.expect("tls");
        assert!(made);
        let ca = std::fs::read(&files.ca_cert).expect("ca");

        let again = init(&data, &[], false).expect("again");
        assert!(!again.made_secrets);
        assert_eq!(again.intent_public_key, first.intent_public_key);
        assert!(matches!(again.tls, Some((_, false))));
        assert_eq!(
            std::fs::read(data.join("secret.key")).expect("secret"),
            secret
        );

        // The same names again (and the host's own, always there): a no-op.
        let same = init(
            &data,
            &["drover.example.org".into(), "127.0.0.1".into()],
            false,
        )
        .expect("the same names again");
        assert!(matches!(same.tls, Some((_, false))));
        assert_eq!(std::fs::read(&files.ca_cert).expect("ca"), ca);
        let lacking = crate::listen::certificate_lacks(&files.server_cert, &with_this_host(&[]))
            .expect("names");
        assert!(lacking.is_empty(), "localhost and 127.0.0.1: {lacking:?}");

        // Another name: refused, naming it, unless renewing.
        let err = init(&data, &["fleet.example.org".into()], false).expect_err("refused");
        assert!(err.to_string().contains("--renew-tls"), "{err}");
        assert!(
            err.to_string().contains("does not name fleet.example.org"),
            "{err}"
        );
        assert_eq!(std::fs::read(&files.ca_cert).expect("ca"), ca);
        init(&data, &["fleet.example.org".into()], true).expect("renewed");
        assert_ne!(std::fs::read(&files.ca_cert).expect("ca"), ca);
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(&files.ca_key), 0o600);
        assert_eq!(mode(&files.server_key), 0o600);
        assert_eq!(mode(&files.ca_cert), 0o644);
    }

    #[test]
    fn rustls_accepts_the_server_certificate_under_the_ca() {
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject};
        let dir = tempfile::tempdir().expect("tempdir");
        let files = TlsFiles::under(dir.path());
        make_tls(
            &files,
            &["drover.example.org".into(), "10.0.0.5".into()],
            jiff::Timestamp::now(),
        )
        .expect("tls");
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(&files.ca_cert).expect("ca") {
            roots.add(cert.expect("ca cert")).expect("root");
        }
        let verifier = rustls::client::WebPkiServerVerifier::builder(roots.into())
            .build()
            .expect("verifier");
        let chain: Vec<CertificateDer> = CertificateDer::pem_file_iter(&files.server_cert)
            .expect("chain")
            .map(|c| c.expect("cert"))
            .collect();
        for name in ["drover.example.org", "10.0.0.5"] {
            verifier
                .verify_server_cert(
                    &chain[0],
                    &chain[1..],
                    &ServerName::try_from(name).expect("name"),
                    &[],
                    UnixTime::now(),
                )
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let other = verifier.verify_server_cert(
            &chain[0],
            &chain[1..],
            &ServerName::try_from("other.example.org").expect("name"),
            &[],
            UnixTime::now(),
        );
        assert!(other.is_err(), "a name not given is refused");
    }
}
