//! A daemon's database file, made and opened so that nothing is lost
//! silently. A new file is made under a temporary name and renamed into
//! place once initialised, so a crash never leaves an empty database behind;
//! an existing empty file is refused by name rather than taken as a new,
//! empty store (which would forget every job); an existing file is checked
//! (every page's checksum) in a child process before the daemon opens it,
//! because redb may panic on some damage, and a panic must not become a
//! restart loop. Moving a bad file aside is the operator's explicit command.

use redb::Database;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum DbFileError {
    #[error(
        "the database {path} is empty (0 bytes): refusing to take it as a new, empty store; \
         restore it, or move it aside with `{reset}`"
    )]
    Empty { path: String, reset: String },
    #[error(
        "the database {path} is damaged: {reason}; restore it, or move it aside with `{reset}`"
    )]
    Corrupt {
        path: String,
        reason: String,
        reset: String,
    },
    #[error("cannot create the database {path}: {reason}")]
    Create { path: String, reason: String },
}

/// How the daemon checks and resets a database file: its own binary with a
/// subcommand that checks one file (`verify-store PATH`), and the command an
/// operator runs to move a bad file aside.
pub struct Checker {
    /// None: check in this process (tests and tools, where a panic is no
    /// restart loop).
    pub program: Option<PathBuf>,
    pub verify_args: Vec<String>,
    pub reset_command: String,
}

impl Checker {
    /// Checks in this process.
    pub fn in_process(reset_command: &str) -> Self {
        Self {
            program: None,
            verify_args: Vec::new(),
            reset_command: reset_command.to_owned(),
        }
    }

    /// Checks with this very binary's `verify-store` subcommand.
    pub fn this_binary(reset_command: &str) -> Self {
        Self {
            program: std::env::current_exe().ok(),
            verify_args: vec!["verify-store".into()],
            reset_command: reset_command.to_owned(),
        }
    }
}

/// Opens `path`, or creates it (initialised by `init`) if it does not exist.
pub fn open_or_create(
    path: &Path,
    checker: &Checker,
    init: impl FnOnce(&Database) -> Result<(), String>,
) -> Result<Database, DbFileError> {
    let shown = path.display().to_string();
    match std::fs::metadata(path) {
        Ok(meta) if meta.len() == 0 => Err(DbFileError::Empty {
            path: shown,
            reset: checker.reset_command.clone(),
        }),
        Ok(_) => {
            verify_in_child(path, checker)?;
            let db = Database::create(path).map_err(|e| DbFileError::Corrupt {
                path: shown.clone(),
                reason: e.to_string(),
                reset: checker.reset_command.clone(),
            })?;
            // Tables added by a newer version are created on first open.
            init(&db).map_err(|reason| DbFileError::Corrupt {
                path: shown,
                reason,
                reset: checker.reset_command.clone(),
            })?;
            Ok(db)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create(path, init),
        Err(e) => Err(DbFileError::Create {
            path: shown,
            reason: e.to_string(),
        }),
    }
}

fn create(
    path: &Path,
    init: impl FnOnce(&Database) -> Result<(), String>,
) -> Result<Database, DbFileError> {
    let shown = path.display().to_string();
    let fail = |reason: String| DbFileError::Create {
        path: shown.clone(),
        reason,
    };
    let fresh = path.with_extension("redb.new");
    let _ = std::fs::remove_file(&fresh);
    {
        let db = Database::create(&fresh).map_err(|e| fail(e.to_string()))?;
        init(&db).map_err(&fail)?;
    }
    restrict(&fresh).map_err(|e| fail(e.to_string()))?;
    std::fs::rename(&fresh, path).map_err(|e| fail(e.to_string()))?;
    if let Some(dir) = path.parent()
        && let Ok(dir) = std::fs::File::open(dir)
    {
        let _ = dir.sync_all();
    }
    Database::create(path).map_err(|e| fail(e.to_string()))
}

/// Mode 0600: the database is the daemon's alone.
fn restrict(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

/// Checks every page of an existing file. Run in a child process: redb may
/// panic on damage.
pub fn verify(path: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if meta.len() == 0 {
        return Err("the file is empty (0 bytes)".into());
    }
    let mut db = Database::open(path).map_err(|e| e.to_string())?;
    db.check_integrity().map_err(|e| e.to_string())?;
    Ok(())
}

fn verify_in_child(path: &Path, checker: &Checker) -> Result<(), DbFileError> {
    let Some(program) = &checker.program else {
        return verify(path).map_err(|reason| DbFileError::Corrupt {
            path: path.display().to_string(),
            reason,
            reset: checker.reset_command.clone(),
        });
    };
    let output = Command::new(program)
        .args(&checker.verify_args)
        .arg(path)
        .env("RUST_BACKTRACE", "0")
        .output()
        .map_err(|e| DbFileError::Create {
            path: path.display().to_string(),
            reason: format!("cannot run {} to check it: {e}", program.display()),
        })?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    // A panic's message is the line after "panicked at …:".
    let reason = stderr
        .lines()
        .skip_while(|l| !l.contains("panicked at"))
        .nth(1)
        .or_else(|| stderr.lines().rev().find(|l| !l.trim().is_empty()))
        .unwrap_or("the check failed")
        .trim()
        .trim_start_matches("Error: ")
        .to_owned();
    Err(DbFileError::Corrupt {
        path: path.display().to_string(),
        reason,
        reset: checker.reset_command.clone(),
    })
}

/// Moves a bad database file aside (`<name>.bad-<unix seconds>`); the daemon
/// then starts with a new, empty one. Returns the new name.
pub fn move_aside(path: &Path) -> std::io::Result<PathBuf> {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let aside = path.with_extension(format!("redb.bad-{seconds}"));
    std::fs::rename(path, &aside)?;
    Ok(aside)
}
