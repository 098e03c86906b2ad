//! The simulated devices' own keys: device number N has the same Ed25519
//! key in every run and every simulator process, signing as the agent's
//! does (the enrollment request, the challenge, a NATS server's nonce).

use anyhow::{Context, Result};
use drover_model::DeviceId;
use drover_model::enroll::Signer;
use drover_model::signing::hex;
use ring::signature::{Ed25519KeyPair, KeyPair};
use std::sync::Arc;

/// A simulated device's key.
pub(crate) struct SimKey(Ed25519KeyPair);

impl Signer for SimKey {
    fn public_key(&self) -> String {
        hex(self.0.public_key().as_ref())
    }

    fn sign(&self, message: &[u8]) -> Vec<u8> {
        self.0.sign(message).as_ref().to_vec()
    }
}

/// Device number `index`'s key.
pub(crate) fn key(index: usize) -> Result<SimKey> {
    let mut seed = [0u8; 32];
    seed[..8].copy_from_slice(&(index as u64).to_le_bytes());
    seed[31] = 0xd5;
    Ed25519KeyPair::from_seed_unchecked(&seed)
        .map(SimKey)
        .map_err(|_| anyhow::anyhow!("a key from a seed"))
}

/// async-nats options that log in as `jwt`, signing the server's nonce
/// with `signer`, as the agent does.
pub(crate) fn jwt_options(jwt: &str, signer: Arc<dyn Signer>) -> async_nats::ConnectOptions {
    async_nats::ConnectOptions::new().jwt(jwt.to_owned(), move |nonce| {
        let signature = signer.sign(&nonce);
        async move { Ok(signature) }
    })
}

/// How device number `index` logs in to NATS once accepted: its key and
/// the user JWT the control plane grants an accepted device (signed by
/// `authority`, as `drover serve --nats-authority` signs it).
pub(crate) fn nats_login(
    authority: &transport_nats::authority::Authority,
    index: usize,
    device: &DeviceId,
) -> Result<transport_nats::KeyLogin> {
    let key = key(index)?;
    let jwt = authority
        .device_jwt(device, &key.public_key())
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("{device}'s user JWT"))?;
    Ok(transport_nats::KeyLogin {
        jwt,
        signer: Arc::new(key),
    })
}
