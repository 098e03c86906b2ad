//! A daemon's database file, made and opened so that nothing is lost
//! silently. A new file is made under a temporary name and renamed into
//! place once initialised, so a crash never leaves an empty database behind;
//! an existing empty file is refused by name rather than taken as a new,
//! empty store (which would forget every job); an existing file is checked
//! (every page's checksum) in a child process before the daemon opens it,
//! because redb may panic on some damage, and a panic must not become a
//! restart loop. Moving a bad file aside is the operator's explicit command.
//!
//! A process that opens the database first holds `<file>.lock` (an
//! exclusive `flock`, which the kernel drops when the process ends however
//! it ends) and writes its name and pid into it, so a second daemon on the
//! same data, or `reset-store` under a running one, is told who holds the
//! file instead of being told it is damaged.

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
    #[error(
        "the database {path} is in use by {holder}; it is not damaged: stop that process first"
    )]
    Held { path: String, holder: String },
}

/// A process's hold on a database file: the lock on `<file>.lock`, kept as
/// long as this value lives.
#[derive(Debug)]
pub struct Hold {
    _file: std::fs::File,
}

/// The lock file beside a database.
pub fn lock_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// This process as a holder names it: its program and pid.
fn this_process() -> String {
    let program = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "a process".into());
    format!("{program} (pid {})", std::process::id())
}

/// Takes the database's lock for this process, or says who holds it.
pub fn hold(path: &Path) -> Result<Hold, DbFileError> {
    use std::io::{Read, Seek, Write};
    let lock = lock_path(path);
    let shown = path.display().to_string();
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock)
        .map_err(|e| DbFileError::Create {
            path: shown.clone(),
            reason: format!("cannot open its lock file {}: {e}", lock.display()),
        })?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            return Err(DbFileError::Held {
                path: shown,
                holder: if holder.is_empty() {
                    "another process".into()
                } else {
                    format!("another {holder}")
                },
            });
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(DbFileError::Create {
                path: shown,
                reason: format!("cannot lock {}: {e}", lock.display()),
            });
        }
    }
    // Who holds it, for whoever finds it held. Not needed for safety (the
    // lock is), so a failure to write it is not one.
    let _ = file
        .set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| writeln!(file, "{}", this_process()));
    Ok(Hold { _file: file })
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

/// Opens `path`, or creates it (initialised by `init`) if it does not exist,
/// holding its lock first: the database is this process's until the
/// returned [`Hold`] is dropped.
pub fn open_or_create(
    path: &Path,
    checker: &Checker,
    init: impl FnOnce(&Database) -> Result<(), String>,
) -> Result<(Database, Hold), DbFileError> {
    let hold = hold(path)?;
    open_held(path, checker, init).map(|db| (db, hold))
}

fn open_held(
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
            let db = Database::create(path).map_err(|e| match e {
                // A process that does not take the lock file (an older
                // version) has the file open.
                redb::DatabaseError::DatabaseAlreadyOpen => DbFileError::Held {
                    path: shown.clone(),
                    holder: "another process".into(),
                },
                e => DbFileError::Corrupt {
                    path: shown.clone(),
                    reason: e.to_string(),
                    reset: checker.reset_command.clone(),
                },
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

/// What `verify` says when another process has the file open.
const ALREADY_OPEN: &str = "is open in another process";

/// Checks every page of an existing file. Run in a child process: redb may
/// panic on damage.
pub fn verify(path: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if meta.len() == 0 {
        return Err("the file is empty (0 bytes)".into());
    }
    let mut db = Database::open(path).map_err(|e| match e {
        redb::DatabaseError::DatabaseAlreadyOpen => format!("the file {ALREADY_OPEN}"),
        e => e.to_string(),
    })?;
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
    if stderr.contains(ALREADY_OPEN) {
        return Err(DbFileError::Held {
            path: path.display().to_string(),
            holder: "another process".into(),
        });
    }
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
/// then starts with a new, empty one. Returns the new name. Refuses while
/// another process holds the file (see [`hold`]).
pub fn move_aside(path: &Path) -> Result<PathBuf, DbFileError> {
    let _hold = hold(path)?;
    move_aside_held(path).map_err(|e| DbFileError::Create {
        path: path.display().to_string(),
        reason: format!("cannot move it aside: {e}"),
    })
}

fn move_aside_held(path: &Path) -> std::io::Result<PathBuf> {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let aside = path.with_extension(format!("redb.bad-{seconds}"));
    std::fs::rename(path, &aside)?;
    Ok(aside)
}
