//! A device's Ed25519 public key as NATS writes keys (issue 55): an nkey is
//! a prefix byte naming the key's role, the 32 key bytes and a CRC-16
//! (XMODEM, little-endian) over both, in base32 without padding, so a user's
//! key reads `U…`. The control plane names a device's key so in the user
//! JWT it signs and in a revocation; the agent needs nothing of it but its
//! own key, which signs the server's nonce.

use crate::signing::unhex;

/// The prefix byte of a user's public key ('U' once in base32).
const USER: u8 = 20 << 3;

/// Base32 (RFC 4648's alphabet) without padding.
pub fn base32(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::with_capacity(bytes.len().div_ceil(5) * 8);
    let (mut buffer, mut bits) = (0u32, 0u32);
    for byte in bytes {
        buffer = (buffer << 8) | u32::from(*byte);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(ALPHABET[((buffer >> bits) & 31) as usize]));
        }
        buffer &= 0xff;
    }
    if bits > 0 {
        out.push(char::from(ALPHABET[((buffer << (5 - bits)) & 31) as usize]));
    }
    out
}

/// CRC-16/XMODEM: polynomial 0x1021, initial value 0, no reflection.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc = 0u16;
    for byte in bytes {
        crc ^= u16::from(*byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The user nkey of a device's public key (64 hex digits); None for
/// anything else.
pub fn user_nkey(public_key: &str) -> Option<String> {
    let key = unhex(public_key).filter(|k| k.len() == 32)?;
    let mut raw = Vec::with_capacity(35);
    raw.push(USER);
    raw.extend_from_slice(&key);
    let crc = crc16(&raw);
    raw.extend_from_slice(&crc.to_le_bytes());
    Some(base32(&raw))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base32_and_crc_are_the_standard_ones() {
        assert_eq!(base32(b""), "");
        assert_eq!(base32(b"f"), "MY");
        assert_eq!(base32(b"fooba"), "MZXW6YTB");
        assert_eq!(base32(b"foobar"), "MZXW6YTBOI");
        // CRC-16/XMODEM's check value.
        assert_eq!(crc16(b"123456789"), 0x31c3);
    }

    #[test]
    fn a_user_nkey_reads_u_and_only_keys_are_encoded() {
        let nkey = user_nkey(&"ab".repeat(32)).expect("a key");
        assert!(nkey.starts_with('U'), "{nkey}");
        assert_eq!(nkey.len(), 56);
        assert_eq!(user_nkey("abcd"), None);
        assert_eq!(user_nkey(&"zz".repeat(32)), None);
    }
}
