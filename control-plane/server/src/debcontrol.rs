//! What an uploaded .deb says it is: Package, Version and Architecture from
//! its control file, read the way dpkg would read them and refused where the
//! two could differ.
//!
//! `dpkg-deb --ctrl-tarfile` streams the control archive, decompressed, to a
//! pipe; nothing is unpacked to disk (a compression bomb costs no temporary
//! space) and at most [`CONTROL_ARCHIVE_LIMIT`] bytes of it are read.

use crate::http::ApiError;
use axum::http::StatusCode;
use std::path::Path;

fn bad(message: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, message.into())
}

/// How much of a .deb's control archive (decompressed) is read looking for
/// its `control` file; dpkg-deb writes `./control` near the start, before
/// md5sums and the scripts.
const CONTROL_ARCHIVE_LIMIT: u64 = 4 << 20;
/// Largest `control` file read.
const CONTROL_FILE_LIMIT: u64 = 256 << 10;

/// Package, Version and Architecture of the .deb at `path`.
pub async fn fields(path: &Path) -> Result<(String, String, String), ApiError> {
    let path = path.to_owned();
    let control = tokio::task::spawn_blocking(move || read_control(&path))
        .await
        .map_err(|e| {
            ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("reading the upload's control file failed: {e}"),
            )
        })??;
    control_fields(&control)
}

fn read_control(path: &Path) -> Result<Vec<u8>, ApiError> {
    use std::io::Read;
    let mut child = std::process::Command::new("dpkg-deb")
        .arg("--ctrl-tarfile")
        .arg(path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| {
            ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot run dpkg-deb (the dpkg package) to read the upload: {e}"),
            )
        })?;
    let Some(stdout) = child.stdout.take() else {
        return Err(bad("dpkg-deb gave no output"));
    };
    let mut limited = stdout.take(CONTROL_ARCHIVE_LIMIT);
    let found = find_control(&mut limited);
    let exhausted = limited.limit() == 0;
    drop(limited);
    // dpkg-deb may still be writing the rest of the archive: not needed.
    let _ = child.kill();
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.by_ref().take(64 << 10).read_to_string(&mut stderr);
    }
    let _ = child.wait();
    let stderr = stderr.trim();
    match found {
        Ok(Some(control)) => Ok(control),
        Err(ControlError::Refused(why)) => Err(bad(format!("the package is refused: {why}"))),
        _ if exhausted => Err(bad(format!(
            "the package's control archive holds more than {CONTROL_ARCHIVE_LIMIT} bytes before its \
             control file; a real package's control file comes first"
        ))),
        _ if !stderr.is_empty() => Err(bad(format!(
            "the upload is not a Debian package: {}",
            stderr.chars().take(300).collect::<String>()
        ))),
        Ok(None) => Err(bad("the package has no control file")),
        Err(ControlError::Io(e)) => Err(bad(format!(
            "the package's control archive cannot be read: {e}"
        ))),
    }
}

enum ControlError {
    /// The archive is readable and what it holds is refused.
    Refused(String),
    Io(std::io::Error),
}

impl From<std::io::Error> for ControlError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

/// The `control` file of a control archive read from `reader`, or None when
/// the archive ends without one.
fn find_control(reader: &mut impl std::io::Read) -> Result<Option<Vec<u8>>, ControlError> {
    use std::io::Read;
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let is_control = {
            let path = entry.path()?;
            let path = path.strip_prefix("./").unwrap_or(&path);
            path == Path::new("control")
        };
        if !is_control {
            continue;
        }
        if entry.header().entry_type() != tar::EntryType::Regular {
            return Err(ControlError::Refused(
                "its control entry is not a regular file".to_owned(),
            ));
        }
        if entry.size() > CONTROL_FILE_LIMIT {
            return Err(ControlError::Refused(format!(
                "its control file is larger than {CONTROL_FILE_LIMIT} bytes"
            )));
        }
        let mut control = Vec::new();
        entry.read_to_end(&mut control)?;
        return Ok(Some(control));
    }
    Ok(None)
}

/// Package, Version and Architecture from a control file's first paragraph.
/// A NUL or another control character is refused: dpkg reads a field only up
/// to a NUL, so what was checked here would not be what dpkg installs.
fn control_fields(control: &[u8]) -> Result<(String, String, String), ApiError> {
    if let Some(at) = control
        .iter()
        .position(|&b| (b < 0x20 && b != b'\n' && b != b'\t') || b == 0x7f)
    {
        let what = if control[at] == 0 {
            "a NUL byte".to_owned()
        } else {
            format!("the control character 0x{:02x}", control[at])
        };
        return Err(bad(format!(
            "the package's control file holds {what} at byte {at}; dpkg would read its fields \
             otherwise than they are checked here, so it is refused"
        )));
    }
    let text = std::str::from_utf8(control)
        .map_err(|_| bad("the package's control file is not UTF-8 text"))?;
    let mut found: [Option<String>; 3] = [None, None, None];
    const NAMES: [&str; 3] = ["Package", "Version", "Architecture"];
    for line in text.lines() {
        if line.trim().is_empty() {
            break; // the first paragraph only
        }
        if line.starts_with([' ', '\t']) {
            continue; // a continuation line
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(bad(format!(
                "the package's control file has a line that is not a field: {:?}",
                line.chars().take(80).collect::<String>()
            )));
        };
        if let Some(slot) = NAMES.iter().position(|n| n.eq_ignore_ascii_case(name)) {
            if found[slot].is_some() {
                return Err(bad(format!(
                    "the package's control file has its {} field twice",
                    NAMES[slot]
                )));
            }
            found[slot] = Some(value.trim().to_owned());
        }
    }
    let [package, version, architecture] = found;
    let field = |value: Option<String>, name: &str| {
        value
            .filter(|v| !v.is_empty())
            .ok_or_else(|| bad(format!("the package has no {name} field")))
    };
    Ok((
        field(package, "Package")?,
        field(version, "Version")?,
        field(architecture, "Architecture")?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_fields_are_read_once_and_whole() {
        let good = b"Package: hello\nversion: 1.0-1\nArchitecture: arm64\nDescription: x\n more\n\nPackage: second\n";
        let Ok((name, version, arch)) = control_fields(good) else {
            panic!("a good control file was refused");
        };
        assert_eq!(
            (name.as_str(), version.as_str(), arch.as_str()),
            ("hello", "1.0-1", "arm64")
        );
        let refused = |control: &[u8]| match control_fields(control) {
            Err(ApiError(_, message)) => message,
            Ok(fields) => panic!("accepted: {fields:?}"),
        };
        assert!(refused(b"Package: a\0b\nVersion: 1\nArchitecture: all\n").contains("NUL byte"));
        assert!(refused(b"Package: a\rb\nVersion: 1\nArchitecture: all\n").contains("0x0d"));
        assert!(
            refused(b"Package: a\nPackage: b\nVersion: 1\nArchitecture: all\n").contains("twice")
        );
        assert!(refused(b"Package: a\nArchitecture: all\n").contains("no Version field"));
        assert!(
            refused(b"Package: a\nVersion: 1\nArchitecture: all\nbroken\n").contains("not a field")
        );
    }
}
