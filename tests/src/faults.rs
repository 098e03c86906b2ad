//! Faults on demand: a small disk that fills, and intents put into a
//! broker by hand.

use serde_json::Value;

/// A small tmpfs (a full disk on demand), unmounted on drop. None when
/// not root (mount needs it).
pub struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    /// Mounts `size` (tmpfs's `size=`, e.g. `1m`) at `at`.
    pub fn mount(at: &std::path::Path, size: &str) -> Option<Self> {
        let uid = std::process::Command::new("id")
            .arg("-u")
            .output()
            .expect("run id");
        if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
            return None;
        }
        std::fs::create_dir_all(at).expect("mount point");
        let options = format!("size={size},mode=0700");
        let out = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &options,
                "drover-test",
                &at.display().to_string(),
            ])
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mount a tmpfs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(Self(at.to_owned()))
    }

    /// Writes a filler file until the file system refuses with ENOSPC.
    pub fn fill(&self) -> std::path::PathBuf {
        use std::io::Write;
        let path = self.0.join("filler");
        let mut file = std::fs::File::create(&path).expect("filler");
        let chunk = vec![0u8; 4096];
        loop {
            match file.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
                Err(e) => panic!("filling the disk: {e}"),
            }
        }
        // Any partial chunk too, so that not one byte is free.
        let _ = file.write(&[0u8; 1]);
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// One put: the key (`<device>.<job>`) and the payload.
type Put = (String, Vec<u8>);

/// Every put on the intent bucket's subjects that one NATS connection saw
/// from the moment it subscribed, in order: what the control plane released,
/// counted at the broker across kills and restarts, each put the control
/// plane sent whether or not the stream stored it (a delete, a withdrawn
/// intent, carries no payload and is not kept). Not counted on the stream
/// itself: it keeps one message per key (the withdrawal replaces the put),
/// so a consumer recreated after a node was killed never sees the puts
/// replaced meanwhile.
pub struct IntentPuts {
    seen: std::sync::Arc<std::sync::Mutex<Vec<Put>>>,
    task: tokio::task::JoinHandle<()>,
}

impl IntentPuts {
    /// Subscribes on `url` (one node) as `user`; returns once subscribed.
    pub async fn record(url: &str, user: &str, password: &str) -> Self {
        use futures_util::StreamExt;
        let client =
            async_nats::ConnectOptions::with_user_and_password(user.into(), password.into())
                .connect(url)
                .await
                .expect("connect the intent recorder");
        let mut subscription = client
            .subscribe("$KV.system-upgrade-intent.>")
            .await
            .expect("subscribe to the intent bucket's subjects");
        client.flush().await.expect("flush the subscription");
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = seen.clone();
        let task = tokio::spawn(async move {
            let _client = client;
            while let Some(message) = subscription.next().await {
                let operation = message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("KV-Operation"))
                    .map(|v| v.as_str().to_owned());
                if operation.is_none() && !message.payload.is_empty() {
                    let key = message
                        .subject
                        .as_str()
                        .trim_start_matches("$KV.system-upgrade-intent.")
                        .to_owned();
                    kept.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((key, message.payload.to_vec()));
                }
            }
        });
        Self { seen, task }
    }

    /// Key (`<device>.<job>`) → every payload put there, in order.
    pub fn per_key(&self) -> std::collections::BTreeMap<String, Vec<Vec<u8>>> {
        let mut keys: std::collections::BTreeMap<String, Vec<Vec<u8>>> = Default::default();
        for (key, payload) in self.seen.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            keys.entry(key.clone()).or_default().push(payload.clone());
        }
        keys
    }

    /// Checks one release per device: each device has exactly one key, and
    /// exactly one put was sent under it (a put sent twice fails, the same
    /// intent or not). Returns each device's key and its intent.
    pub fn assert_put_once_each(&self, devices: &[&str]) -> Vec<(String, Value)> {
        let keys = self.per_key();
        assert_eq!(
            keys.len(),
            devices.len(),
            "one key per device: {:?}",
            keys.keys().collect::<Vec<_>>()
        );
        devices
            .iter()
            .map(|device| {
                let (key, payloads) = keys
                    .iter()
                    .find(|(k, _)| k.starts_with(&format!("{device}.")))
                    .unwrap_or_else(|| panic!("no intent for {device}: {:?}", keys.keys()));
                assert_eq!(
                    payloads.len(),
                    1,
                    "{key} was put {} times: {:?}",
                    payloads.len(),
                    texts(payloads)
                );
                let intent: Value =
                    serde_json::from_slice(payloads[0].as_slice()).expect("an intent");
                (key.clone(), intent)
            })
            .collect()
    }

    /// Checks one release per device for `job`: each device's key
    /// (`<device>.<job>`) was put exactly once, with an intent for this job,
    /// and no other key was put.
    pub fn assert_one_release_each(&self, devices: &[&str], job: &str) {
        for (key, intent) in self.assert_put_once_each(devices) {
            assert!(
                key.ends_with(&format!(".{job}")),
                "{key} is not job {job}'s"
            );
            assert_eq!(intent["jobId"], job, "{intent}");
        }
    }

    /// Checks one release per device for `job` where a broker node was
    /// killed mid-run: each device's key was put with one and the same
    /// signed intent for this job and no other key was put, but a put may
    /// have been sent again (its acknowledgement lost with the node: seen
    /// here, the same intent twice). Returns how many puts each key saw.
    pub fn assert_one_intent_each(&self, devices: &[&str], job: &str) -> Vec<(String, usize)> {
        let keys = self.per_key();
        let expected: std::collections::BTreeSet<String> =
            devices.iter().map(|d| format!("{d}.{job}")).collect();
        let got: std::collections::BTreeSet<String> = keys.keys().cloned().collect();
        assert_eq!(got, expected, "the keys the intent bucket was put under");
        let mut counts = Vec::new();
        for (key, payloads) in &keys {
            let distinct: std::collections::BTreeSet<&Vec<u8>> = payloads.iter().collect();
            assert_eq!(
                distinct.len(),
                1,
                "{key} was released {} different ways: {:?}",
                distinct.len(),
                texts(distinct.iter().copied())
            );
            counts.push((key.clone(), payloads.len()));
        }
        counts
    }
}

/// Payloads as text, for a failure message.
fn texts<'a>(payloads: impl IntoIterator<Item = &'a Vec<u8>>) -> Vec<String> {
    payloads
        .into_iter()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect()
}

impl Drop for IntentPuts {
    fn drop(&mut self) {
        self.task.abort();
    }
}
