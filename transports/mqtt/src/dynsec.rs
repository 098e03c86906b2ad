//! mosquitto's dynamic security plugin (issue 55): the broker is set up
//! once (`drover mqtt-config --dynamic-security`) and the control plane
//! adds and removes each enrolled device's login at run time over
//! `$CONTROL/dynamic-security/v1`, with no file written and no reload.
//!
//! What the plugin holds is a login only: user = device id, password = the
//! device's broker password (its key's signature), which the control plane
//! checks, hands over, and keeps nowhere; the broker keeps its salted
//! PBKDF2 hash. What each device may publish and read stays in the ACL
//! file's patterns (`%u` is the user, the device id), written once for
//! every device: the plugin of mosquitto 2.0 has no patterns, so rights
//! there would be a role per device, and the plugin writes its whole file
//! again at every change.

use base64::Engine;
use drover_model::DeviceId;
use serde_json::{Value, json};

/// Where the plugin takes commands; answers come on `…/response`.
pub const CONTROL_TOPIC: &str = crate::DYNSEC_TOPIC;

pub fn response_topic() -> String {
    format!("{CONTROL_TOPIC}/response")
}

fn commands(commands: Vec<Value>) -> Vec<u8> {
    serde_json::to_vec(&json!({ "commands": commands })).unwrap_or_default()
}

/// The name Drover gives the logins it makes: the only ones it lists and
/// removes when it checks the broker against the accepted keys.
pub const DEVICE_TEXTNAME: &str = "Drover device";

/// Marks the listing Drover asks for, to tell its answer apart.
pub const LISTING: &str = "drover-logins";

/// Asks for every login with its name (`listClients`, verbose).
pub fn list_logins() -> Vec<u8> {
    commands(vec![json!({
        "command": "listClients",
        "verbose": true,
        "count": -1,
        "correlationData": LISTING,
    })])
}

/// The logins in a response, when it answers Drover's listing
/// ([`list_logins`]); None for any other response.
fn listed(payload: &[u8]) -> Option<Vec<Value>> {
    let response = serde_json::from_slice::<Value>(payload).ok()?;
    let listing = response["responses"]
        .as_array()?
        .iter()
        .find(|r| r["command"] == "listClients" && r["correlationData"] == LISTING)?;
    listing["data"]["clients"].as_array().cloned()
}

/// In a response, the devices whose logins Drover made, when it answers
/// Drover's listing ([`list_logins`]); None for any other response.
pub fn listed_devices(payload: &[u8]) -> Option<Vec<DeviceId>> {
    Some(
        listed(payload)?
            .iter()
            .filter(|c| c["textname"] == DEVICE_TEXTNAME)
            .filter_map(|c| DeviceId::new(c["username"].as_str()?.to_owned()).ok())
            .collect(),
    )
}

/// In an answer to Drover's listing, the enrollment users
/// ([`crate::enroll_users`]) the broker lacks (one set up before there
/// were several); None for any other response.
pub fn missing_enroll_users(payload: &[u8]) -> Option<Vec<String>> {
    let there: std::collections::BTreeSet<String> = listed(payload)?
        .iter()
        .filter_map(|c| c["username"].as_str().map(str::to_owned))
        .collect();
    Some(
        crate::enroll_users()
            .into_iter()
            .filter(|user| !there.contains(user))
            .collect(),
    )
}

/// Makes the enrollment users `users`, each with the enrollment role.
pub fn create_enroll_users(users: &[String]) -> Vec<u8> {
    commands(
        users
            .iter()
            .map(|user| {
                json!({
                    "command": "createClient",
                    "username": user,
                    "password": crate::ENROLL_PASSWORD,
                    "textname": ENROLL_TEXTNAME,
                    "roles": [{ "rolename": crate::ENROLL_ROLE }],
                    "correlationData": user,
                })
            })
            .collect(),
    )
}

/// The name of the enrollment users' logins.
const ENROLL_TEXTNAME: &str = "Drover devices asking to join";

/// The plugin's command `command` about `device`'s login; its answer
/// carries the device id as its correlation data.
pub fn command(device: &DeviceId, command: &crate::admissions::Command) -> Vec<u8> {
    use crate::admissions::Command;
    let mut json = json!({
        "command": command.name(),
        "username": device.as_str(),
        "correlationData": device.as_str(),
    });
    match command {
        Command::Create(password) => {
            json["password"] = json!(password);
            json["textname"] = json!(DEVICE_TEXTNAME);
        }
        Command::SetPassword(password) => json["password"] = json!(password),
        Command::Delete => {}
    }
    commands(vec![json])
}

/// One answer of the plugin about a device's login.
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    pub command: String,
    pub device: DeviceId,
    pub error: Option<String>,
}

/// The answers in one response about devices' logins (correlation data a
/// device id).
pub fn answers(payload: &[u8]) -> Vec<Answer> {
    let Ok(response) = serde_json::from_slice::<Value>(payload) else {
        return Vec::new();
    };
    let Some(answers) = response["responses"].as_array() else {
        return Vec::new();
    };
    answers
        .iter()
        .filter_map(|answer| {
            Some(Answer {
                command: answer["command"].as_str()?.to_owned(),
                device: DeviceId::new(answer["correlationData"].as_str()?.to_owned()).ok()?,
                error: answer["error"].as_str().map(str::to_owned),
            })
        })
        .collect()
}

/// The answers in one response that say something went wrong, as
/// `command (device): error`; the failures [`crate::admissions`] expects
/// (a login already there or already gone) are left out.
pub fn failures(payload: &[u8]) -> Vec<String> {
    let Ok(response) = serde_json::from_slice::<Value>(payload) else {
        return vec!["an unreadable answer from the dynamic security plugin".to_owned()];
    };
    let answers = response["responses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    answers
        .iter()
        .filter_map(|answer| {
            let command = answer["command"].as_str().unwrap_or("?");
            let error = answer["error"].as_str()?;
            let expected = matches!(
                (command, error),
                ("setClientPassword", "Client not found")
                    | ("createClient", "Client already exists")
                    | ("deleteClient", "Client not found")
            );
            (!expected).then(|| {
                format!(
                    "{command} ({}): {error}",
                    answer["correlationData"].as_str().unwrap_or("?")
                )
            })
        })
        .collect()
}

/// The plugin's file for a new broker: nothing allowed by default; the
/// enrollment users ([`crate::enroll_users`]) may publish on the enrollment
/// topics and nothing else. Devices' logins are added by the control plane.
pub fn initial_config(topics: &crate::Topics) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    let salt = crate::mosquitto::salt();
    let hash = crate::mosquitto::hash(crate::ENROLL_PASSWORD, &salt);
    let config = json!({
        "defaultACLAccess": {
            "publishClientSend": false,
            "publishClientReceive": false,
            "subscribe": false,
            "unsubscribe": true,
        },
        // One salt for all: they share a password that is no secret.
        "clients": crate::enroll_users().iter().map(|user| json!({
            "username": user,
            "textname": ENROLL_TEXTNAME,
            "password": b64.encode(hash),
            "salt": b64.encode(salt),
            "iterations": crate::mosquitto::PBKDF2_ITERATIONS,
            "roles": [{ "rolename": crate::ENROLL_ROLE }],
        })).collect::<Vec<_>>(),
        "groups": [],
        "roles": [{
            "rolename": crate::ENROLL_ROLE,
            "acls": [{
                "acltype": "publishClientSend",
                "topic": format!("{}/enroll/+", topics.prefix()),
                "allow": true,
            }],
        }],
    });
    serde_json::to_string_pretty(&config).unwrap_or_default()
}

/// Where Debian's mosquitto keeps the plugin on this machine's
/// architecture (the first that exists, else the usual path).
pub fn plugin_path() -> String {
    let candidates = [
        "/usr/lib/x86_64-linux-gnu/mosquitto_dynamic_security.so",
        "/usr/lib/aarch64-linux-gnu/mosquitto_dynamic_security.so",
        "/usr/lib/arm-linux-gnueabihf/mosquitto_dynamic_security.so",
        "/usr/lib/mosquitto_dynamic_security.so",
    ];
    candidates
        .iter()
        .find(|path| std::path::Path::new(path).exists())
        .unwrap_or(&candidates[0])
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_name_the_device_and_its_answers_are_read_back() {
        use crate::admissions::Command;
        let device = DeviceId::new("pi-1").expect("id");
        let made: Value =
            serde_json::from_slice(&command(&device, &Command::Create("pw".into()))).expect("json");
        assert_eq!(made["commands"][0]["command"], "createClient");
        assert_eq!(made["commands"][0]["username"], "pi-1");
        assert_eq!(made["commands"][0]["password"], "pw");
        assert_eq!(made["commands"][0]["textname"], DEVICE_TEXTNAME);
        assert_eq!(made["commands"][0]["correlationData"], "pi-1");
        let gone: Value =
            serde_json::from_slice(&command(&device, &Command::Delete)).expect("json");
        assert_eq!(gone["commands"][0]["command"], "deleteClient");
        assert!(gone["commands"][0].get("password").is_none());
        let answered = br#"{"responses":[{"command":"createClient","error":"Client already exists","correlationData":"pi-1"},{"command":"deleteClient","correlationData":"pi-2"},{"command":"listClients","correlationData":"drover-logins"},{"command":"createClient","correlationData":"drover.enroll.001"}]}"#;
        let answers = answers(answered);
        assert_eq!(answers.len(), 3, "{answers:?}");
        assert_eq!(answers[0].device, device);
        assert_eq!(answers[0].error.as_deref(), Some("Client already exists"));
        assert_eq!(answers[1].command, "deleteClient");
        assert_eq!(answers[1].error, None);
        assert!(super::answers(b"junk").is_empty());
        let quiet = br#"{"responses":[{"command":"setClientPassword","error":"Client not found","correlationData":"pi-1"},{"command":"createClient"}]}"#;
        assert!(failures(quiet).is_empty());
        let loud = br#"{"responses":[{"command":"createClient","error":"Role not found","correlationData":"pi-1"}]}"#;
        assert_eq!(failures(loud), ["createClient (pi-1): Role not found"]);
        assert_eq!(failures(b"not json").len(), 1);
    }

    /// Only Drover's logins in Drover's own listing count: another
    /// answer, another program's listing, a login by another name or with
    /// a name that is no device id are left alone.
    #[test]
    fn a_listing_names_only_the_logins_drover_made() {
        let listing = br#"{"responses":[{"command":"listClients","correlationData":"drover-logins","data":{"totalCount":4,"clients":[
            {"username":"pi-1","textname":"Drover device","roles":[]},
            {"username":"grafana","textname":"dashboards","roles":[]},
            {"username":"drover.enroll","textname":"Drover device","roles":[]},
            {"username":"pi-2","textname":"Drover device"}]}}]}"#;
        let names: Vec<String> = listed_devices(listing)
            .expect("Drover's listing")
            .iter()
            .map(|d| d.as_str().to_owned())
            .collect();
        assert_eq!(names, ["pi-1", "pi-2"]);
        let theirs = br#"{"responses":[{"command":"listClients","correlationData":"x","data":{"clients":[{"username":"pi-1","textname":"Drover device"}]}}]}"#;
        assert_eq!(listed_devices(theirs), None);
        assert_eq!(
            listed_devices(br#"{"responses":[{"command":"createClient"}]}"#),
            None
        );
        assert_eq!(listed_devices(b"junk"), None);
        let asked: Value = serde_json::from_slice(&list_logins()).expect("json");
        assert_eq!(asked["commands"][0]["command"], "listClients");
        assert_eq!(asked["commands"][0]["verbose"], true);
    }

    #[test]
    fn the_enrollment_users_a_broker_lacks_are_found_and_made() {
        let listing = |users: &[&str]| {
            let clients: Vec<Value> = users
                .iter()
                .map(|u| json!({"username": u, "textname": "x"}))
                .collect();
            serde_json::to_vec(&json!({"responses": [{"command": "listClients",
                "correlationData": LISTING, "data": {"clients": clients}}]}))
            .expect("json")
        };
        // A broker set up with the one user before there were several.
        let missing = missing_enroll_users(&listing(&["drover.enroll", "pi-1"])).expect("ours");
        assert_eq!(missing.len(), crate::ENROLL_LOGINS);
        assert_eq!(missing[0], "drover.enroll.000");
        // One that has them all lacks none.
        let all = crate::enroll_users();
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        assert_eq!(missing_enroll_users(&listing(&all)), Some(Vec::new()));
        assert_eq!(missing_enroll_users(b"junk"), None);
        let made: Value =
            serde_json::from_slice(&create_enroll_users(&missing[..2])).expect("json");
        let commands = made["commands"].as_array().expect("commands");
        assert_eq!(commands.len(), 2);
        assert_eq!(commands[1]["command"], "createClient");
        assert_eq!(commands[1]["username"], "drover.enroll.001");
        assert_eq!(commands[1]["password"], crate::ENROLL_PASSWORD);
        assert_eq!(commands[1]["roles"][0]["rolename"], crate::ENROLL_ROLE);
    }

    #[test]
    fn a_new_brokers_file_lets_the_enrollment_user_publish_on_enrollment_topics_only() {
        let config: Value =
            serde_json::from_str(&initial_config(&crate::Topics::new("drover/v1"))).expect("json");
        assert_eq!(config["clients"][0]["username"], crate::ENROLL_USER);
        let users: Vec<&str> = config["clients"]
            .as_array()
            .expect("clients")
            .iter()
            .map(|c| c["username"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(users.len(), 1 + crate::ENROLL_LOGINS);
        assert_eq!(users[1], "drover.enroll.000");
        assert_eq!(users[crate::ENROLL_LOGINS], "drover.enroll.255");
        for client in config["clients"].as_array().expect("clients") {
            assert_eq!(client["roles"][0]["rolename"], crate::ENROLL_ROLE);
        }
        assert!(
            DeviceId::new("drover.enroll.000").is_err(),
            "no device's id"
        );
        assert_eq!(config["defaultACLAccess"]["publishClientSend"], false);
        let acls = config["roles"][0]["acls"].as_array().expect("acls");
        assert_eq!(acls.len(), 1);
        assert_eq!(acls[0]["topic"], "drover/v1/enroll/+");
        assert!(DeviceId::new(crate::ENROLL_USER).is_err(), "no device's id");
    }
}
