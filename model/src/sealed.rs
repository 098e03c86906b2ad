//! Secrets sealed to one device for one job. A job that needs secrets
//! (`PackageInstallV1` with `secrets`) names them; the control plane's
//! enricher seals their files at delivery with AES-256-GCM under a key both
//! ends derive from the device's token (HKDF-SHA256), bound to the device
//! and the job as associated data. A broker that keeps the intent, or
//! another device, sees only ciphertext; the control plane's store keeps
//! only the names.

use crate::ids::{DeviceId, JobId};
use crate::signing::{hex, unhex};
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use serde::{Deserialize, Serialize};

/// AES-256-GCM ciphertext (with its tag) and nonce, in hex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SealedBox {
    pub nonce: String,
    pub ciphertext: String,
}

/// One file of one secret, as the device writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretFile {
    pub secret: String,
    pub key: String,
    pub value: String,
}

/// Upper bound of a sealed box's ciphertext, in bytes.
pub const MAX_SEALED_BYTES: usize = 6 * 1024;

fn key(token: &str, device: &DeviceId) -> Result<LessSafeKey, String> {
    let bytes = crate::credentials::derive32(b"drover-sealed-to-device:v1", token, device);
    let unbound = UnboundKey::new(&AES_256_GCM, &bytes)
        .map_err(|_| "cannot make the device's sealing key".to_owned())?;
    Ok(LessSafeKey::new(unbound))
}

fn aad(device: &DeviceId, job: JobId) -> String {
    format!("drover-secrets:v1:{device}:{job}")
}

/// AES-256-GCM under `key` with a fresh random nonce: the nonce, and the
/// ciphertext with its tag. Shared by the sealed boxes here and by the
/// control plane's secrets at rest.
/// `what` names the sealed thing in the error.
pub fn seal_with(
    key: &LessSafeKey,
    aad: &[u8],
    mut data: Vec<u8>,
    what: &str,
) -> Result<([u8; NONCE_LEN], Vec<u8>), String> {
    use ring::rand::SecureRandom;
    let mut nonce = [0u8; NONCE_LEN];
    ring::rand::SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| "no randomness for a nonce".to_owned())?;
    key.seal_in_place_append_tag(
        Nonce::assume_unique_for_key(nonce),
        Aad::from(aad),
        &mut data,
    )
    .map_err(|_| format!("cannot seal {what}"))?;
    Ok((nonce, data))
}

/// A nonce as [`seal_with`] made it, from hex.
pub fn parse_nonce(text: &str) -> Option<[u8; NONCE_LEN]> {
    unhex(text).and_then(|n| n.try_into().ok())
}

/// Opens what [`seal_with`] made; None when the key, the associated data or
/// the ciphertext do not match (the tag does not verify).
pub fn open_with(
    key: &LessSafeKey,
    aad: &[u8],
    nonce: [u8; NONCE_LEN],
    mut data: Vec<u8>,
) -> Option<Vec<u8>> {
    let len = key
        .open_in_place(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad),
            &mut data,
        )
        .ok()?
        .len();
    data.truncate(len);
    Some(data)
}

/// Seals `files` for `device`'s job `job` with a fresh random nonce.
pub fn seal(
    token: &str,
    device: &DeviceId,
    job: JobId,
    files: &[SecretFile],
) -> Result<SealedBox, String> {
    let data = serde_json::to_vec(files).map_err(|e| e.to_string())?;
    let (nonce, data) = seal_with(
        &key(token, device)?,
        aad(device, job).as_bytes(),
        data,
        "the secrets",
    )?;
    if data.len() > MAX_SEALED_BYTES {
        return Err(format!(
            "the job's secrets take {} bytes sealed, over the limit of {MAX_SEALED_BYTES}",
            data.len()
        ));
    }
    Ok(SealedBox {
        nonce: hex(&nonce),
        ciphertext: hex(&data),
    })
}

/// Opens what [`seal`] made for this device and job.
pub fn open(
    token: &str,
    device: &DeviceId,
    job: JobId,
    sealed: &SealedBox,
) -> Result<Vec<SecretFile>, String> {
    let nonce = parse_nonce(&sealed.nonce)
        .ok_or_else(|| "the sealed secrets' nonce is malformed".to_owned())?;
    let data = unhex(&sealed.ciphertext)
        .filter(|c| c.len() <= MAX_SEALED_BYTES)
        .ok_or_else(|| "the sealed secrets are malformed or too large".to_owned())?;
    let plain = open_with(&key(token, device)?, aad(device, job).as_bytes(), nonce, data)
        .ok_or_else(|| {
            "the job's secrets do not open with this device's token (sealed for another device or job, or altered)"
                .to_owned()
        })?;
    serde_json::from_slice(&plain).map_err(|e| format!("the job's secrets are malformed: {e}"))
}

/// A secret's or a key's name: `[A-Za-z0-9._-]`, 1 to 64 characters, not
/// starting with a dot (it becomes a file name on the device).
pub fn is_secret_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_box_opens_only_for_its_device_and_job() {
        let a = DeviceId::new("device-a").expect("id");
        let b = DeviceId::new("device-b").expect("id");
        let job = JobId::random();
        let files = vec![SecretFile {
            secret: "kiosk".into(),
            key: "token".into(),
            value: "s3cret".into(),
        }];
        let sealed = seal("token-a", &a, job, &files).expect("seal");
        assert!(!sealed.ciphertext.contains(&hex(b"s3cret")));
        assert_eq!(open("token-a", &a, job, &sealed).expect("open"), files);
        assert!(open("token-b", &b, job, &sealed).is_err(), "another device");
        assert!(
            open("token-a", &b, job, &sealed).is_err(),
            "another device id"
        );
        assert!(
            open("token-a", &a, JobId::random(), &sealed).is_err(),
            "another job"
        );
        let mut altered = sealed.clone();
        altered.ciphertext.replace_range(0..2, "00");
        assert!(open("token-a", &a, job, &altered).is_err() || altered == sealed);
        let again = seal("token-a", &a, job, &files).expect("seal");
        assert_ne!(again.nonce, sealed.nonce, "a fresh nonce each time");
    }

    #[test]
    fn secret_names_are_plain_file_names() {
        for good in ["kiosk", "db.password", "A-1_b"] {
            assert!(is_secret_name(good), "{good}");
        }
        for bad in ["", ".hidden", "a/b", "..", "x y", &"a".repeat(65)] {
            assert!(!is_secret_name(bad), "{bad}");
        }
    }
}
