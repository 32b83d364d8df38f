//! The daemon's own files (its audit log and SQLite stores) are made readable by their
//! owner alone: they hold what the rules hide, and whatever paths and commands were audited.

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Creates the empty file at `path` with mode 0600 if nothing is there yet, so that SQLite
/// (which gives its `-wal` and `-shm` files the database file's mode) opens a private file.
/// An existing file keeps its mode: its owner chose it.
pub fn create_private(path: &Path) -> std::io::Result<()> {
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}
