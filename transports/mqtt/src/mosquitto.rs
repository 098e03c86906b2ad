//! mosquitto's password and ACL files for the control plane and its
//! devices (`drover mqtt-config`): each device confined to its own topics.

use crate::Topics;
use base64::Engine;
use drover_model::DeviceId;

/// A mosquitto password-file line (`user:$7$…`, PBKDF2-SHA512 as
/// `mosquitto_passwd` writes it).
pub fn password_line(user: &str, password: &str) -> String {
    password_line_with_salt(user, password, &salt())
}

pub(crate) const PBKDF2_ITERATIONS: u32 = 101;
const PBKDF2_ROUNDS: std::num::NonZeroU32 =
    std::num::NonZeroU32::MIN.saturating_add(PBKDF2_ITERATIONS - 1);

/// A fresh 12-byte salt, as mosquitto makes them.
pub(crate) fn salt() -> [u8; 12] {
    use ring::rand::SecureRandom;
    let mut salt = [0u8; 12];
    let _ = ring::rand::SystemRandom::new().fill(&mut salt);
    salt
}

/// PBKDF2-SHA512 of `password` with `salt` at [`PBKDF2_ITERATIONS`]:
/// mosquitto's hash, in its password file and in its dynamic security
/// plugin's file alike.
pub(crate) fn hash(password: &str, salt: &[u8]) -> [u8; 64] {
    let mut hash = [0u8; 64];
    ring::pbkdf2::derive(
        ring::pbkdf2::PBKDF2_HMAC_SHA512,
        PBKDF2_ROUNDS,
        salt,
        password.as_bytes(),
        &mut hash,
    );
    hash
}

fn password_line_with_salt(user: &str, password: &str, salt: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    format!(
        "{user}:$7${PBKDF2_ITERATIONS}${}${}",
        b64.encode(salt),
        b64.encode(hash(password, salt))
    )
}

/// The two files mosquitto needs: a password file (each control-plane
/// user, one per replica, and each device, whose password is the one its
/// agent derives from its Drover token) and an ACL file (the control plane may use every topic under the
/// prefix; a device only its own).
pub fn mosquitto_files(
    topics: &Topics,
    control_plane_users: &[&str],
    control_plane_password: &str,
    devices: &[(DeviceId, String)],
) -> (String, String) {
    let mut passwords = String::new();
    for user in control_plane_users {
        passwords.push_str(&password_line(user, control_plane_password));
        passwords.push('\n');
    }
    for (device, token) in devices {
        passwords.push_str(&password_line(device.as_str(), token));
        passwords.push('\n');
    }
    let mut acl = format!(
        "# Drover: each device uses only its own topics under {prefix}/ (%u is its id);\n\
         # the control plane uses every topic there.\n",
        prefix = topics.prefix()
    );
    for line in topics.device_acl() {
        acl.push_str(&line);
        acl.push('\n');
    }
    // And each replica runs mosquitto's dynamic security plugin, when it
    // is loaded (`crate::dynsec`): devices' own logins come and go there.
    for user in control_plane_users {
        acl.push_str(&format!(
            "\nuser {user}\ntopic readwrite {prefix}/#\ntopic readwrite {control}/#\n",
            prefix = topics.prefix(),
            control = crate::DYNSEC_TOPIC,
        ));
    }
    (passwords, acl)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line `mosquitto_passwd -b` wrote for alice / secret.
    #[test]
    fn password_lines_match_mosquitto_passwd() {
        let written = "alice:$7$101$PuzFpRoTA1iiEgXb$jom039GI8t9bNssLaNrlht1LstvzZaQiBDe5vHrwbN/G9FQKQguhhb8RakEgk10FOZF1Y7pEEGeY2H8aJu+lwQ==";
        let salt = base64::engine::general_purpose::STANDARD
            .decode("PuzFpRoTA1iiEgXb")
            .expect("salt");
        assert_eq!(password_line_with_salt("alice", "secret", &salt), written);
        assert!(password_line("bob", "x").starts_with("bob:$7$101$"));
    }

    #[test]
    fn a_device_is_confined_to_its_own_topics() {
        let topics = Topics::new("drover/v1");
        let device = DeviceId::new("dev-a").expect("id");
        let (passwords, acl) =
            mosquitto_files(&topics, &["cp", "cp-2"], "pw", &[(device, "tok".into())]);
        assert!(passwords.lines().any(|l| l.starts_with("dev-a:$7$")));
        assert!(acl.contains("pattern read drover/v1/devices/%u/intents/+"));
        assert!(acl.contains("pattern write drover/v1/devices/%u/status/+"));
        assert!(!acl.contains("pattern readwrite"));
        assert!(acl.contains("\nuser cp\ntopic readwrite drover/v1/#\n"));
        assert!(acl.ends_with(
            "\nuser cp-2\ntopic readwrite drover/v1/#\ntopic readwrite $CONTROL/dynamic-security/v1/#\n"
        ));
        assert!(passwords.lines().any(|l| l.starts_with("cp-2:$7$")));
    }
}
