//! Boot identity. A new boot id after a reboot is what confirms a job that
//! rebooted the device (A6). The path is injectable so tests can fake a reboot.

use std::path::Path;

pub const DEFAULT_BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

#[derive(Debug, thiserror::Error)]
#[error("cannot read the boot id from {path}: {source}")]
pub struct BootIdError {
    pub path: String,
    #[source]
    pub source: std::io::Error,
}

/// Reads the kernel's boot id (a UUID that changes at every boot).
pub fn read_boot_id(path: &Path) -> Result<String, BootIdError> {
    let text = std::fs::read_to_string(path).map_err(|source| BootIdError {
        path: path.display().to_string(),
        source,
    })?;
    let id = text.trim();
    if id.is_empty() || id.len() > 64 {
        return Err(BootIdError {
            path: path.display().to_string(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, "not a boot id"),
        });
    }
    Ok(id.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_trims_or_fails_clearly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("boot_id");
        std::fs::write(&path, "1234-abcd\n").expect("write");
        assert_eq!(read_boot_id(&path).expect("read"), "1234-abcd");
        std::fs::write(&path, "\n").expect("write");
        assert!(read_boot_id(&path).is_err());
        let missing = read_boot_id(&dir.path().join("nope")).unwrap_err();
        assert!(missing.to_string().contains("cannot read the boot id"));
    }
}
