//! Free space on the store's filesystem: a buffered write is refused (ENOSPC) when what the
//! store would then hold uncommitted could not be committed, so a full disk is reported at
//! the `write` a program sees, not at a `close` it may ignore.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::error::{Errno, FsError, FsResult};

/// Room kept free beyond what the buffered data needs (SQLite's own pages, the WAL's index).
const HEADROOM: u64 = 1 << 20;

/// `read_at` before the first reading.
const NEVER: u64 = u64::MAX;

/// How long a reading of the free space is trusted while the need stays well below it.
const FRESH_MS: u64 = 100;

pub(super) struct Space {
    /// The directory holding the database (and its WAL).
    dir: PathBuf,
    started: Instant,
    /// The WAL, whose content is copied into the database at the next checkpoint (which may
    /// grow the database by as much).
    wal: PathBuf,
    /// The last reading: available bytes (the WAL's length taken off), and when
    /// (milliseconds since `started`).
    free: AtomicU64,
    read_at: AtomicU64,
    /// What writes admitted since the last reading will take (twice their bytes), which
    /// the reading does not show yet: a fast writer can fill a small disk well within
    /// [`FRESH_MS`].
    spent: AtomicU64,
}

impl Space {
    pub fn new(database: &Path) -> Space {
        let dir = database.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let mut wal = database.as_os_str().to_owned();
        wal.push("-wal");
        Space {
            dir: dir.to_path_buf(),
            wal: PathBuf::from(wal),
            started: Instant::now(),
            free: AtomicU64::new(0),
            read_at: AtomicU64::new(NEVER),
            spent: AtomicU64::new(0),
        }
    }

    /// Ok when `buffered` bytes (all that the store would hold uncommitted, this write's
    /// `adding` bytes included) can still be committed: written to the WAL and copied into
    /// the database later (twice their size), after what the WAL already holds for its next
    /// checkpoint, with headroom. `reusable` tells how many bytes of free pages the database
    /// holds (deleted content, which later commits reuse first); `empty_wal` checkpoints the
    /// WAL into the database and empties it, and is asked for when room is short. The disk is
    /// read again unless a recent reading, less what was admitted since, leaves twice the need.
    pub fn admit(
        &self,
        buffered: u64,
        adding: u64,
        reusable: impl Fn() -> u64,
        empty_wal: impl FnOnce() -> bool,
    ) -> FsResult<()> {
        let needed = buffered.saturating_mul(2).saturating_add(HEADROOM);
        let now = self.started.elapsed().as_millis() as u64;
        let fresh = now.saturating_sub(self.read_at.load(Ordering::Relaxed)) < FRESH_MS;
        let spent = self.spent.fetch_add(adding.saturating_mul(2), Ordering::Relaxed);
        let left = self.free.load(Ordering::Relaxed).saturating_sub(spent);
        if fresh && needed.saturating_mul(2) <= left {
            return Ok(());
        }
        let mut free = self.read(&reusable);
        if needed > free && empty_wal() {
            free = self.read(&reusable);
        }
        self.free.store(free, Ordering::Relaxed);
        self.spent.store(0, Ordering::Relaxed);
        self.read_at.store(now, Ordering::Relaxed);
        if needed > free {
            return Err(FsError::new(
                Errno::ENOSPC,
                format!("the store has room for {free} bytes, {needed} are needed to commit what is written"),
            ));
        }
        Ok(())
    }

    /// Whether the disk shows at least `bytes` of room for new commits, beyond what writes
    /// admitted since the last reading will take. Reads the disk again when that reading is
    /// older than [`FRESH_MS`].
    pub fn has_room(&self, bytes: u64) -> bool {
        let now = self.started.elapsed().as_millis() as u64;
        let read_at = self.read_at.load(Ordering::Relaxed);
        if read_at == NEVER || now.saturating_sub(read_at) >= FRESH_MS {
            // The database's free pages are left out: this asks only whether room is plenty.
            self.free.store(self.read(&|| 0), Ordering::Relaxed);
            self.spent.store(0, Ordering::Relaxed);
            self.read_at.store(now, Ordering::Relaxed);
        }
        let spent = self.spent.load(Ordering::Relaxed);
        self.free.load(Ordering::Relaxed).saturating_sub(spent) >= bytes
    }

    /// The room for new commits: the disk's available bytes and the database's free pages,
    /// less what the WAL holds (a checkpoint puts it in the database before its space returns).
    fn read(&self, reusable: &impl Fn() -> u64) -> u64 {
        let wal = std::fs::metadata(&self.wal).map_or(0, |m| m.len());
        match nix::sys::statvfs::statvfs(&self.dir) {
            Ok(s) => (s.blocks_available() * s.fragment_size() + reusable()).saturating_sub(wal),
            Err(_) => u64::MAX, // cannot tell: the commit will say
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn what_was_admitted_since_a_reading_counts_against_it() {
        let dir = tempfile::tempdir().unwrap();
        let space = Space::new(&dir.path().join("store.db"));
        let reads = Cell::new(0);
        let reusable = || {
            reads.set(reads.get() + 1);
            0
        };
        space.admit(1, 1, reusable, || false).unwrap();
        assert_eq!(reads.get(), 1, "the first write reads the disk");
        let free = space.free.load(Ordering::Relaxed);
        space.admit(1, 1, reusable, || false).unwrap();
        assert_eq!(reads.get(), 1, "a small write trusts a fresh reading");
        // A write that will take what the reading showed makes the next one look again,
        // though that one alone is small against the reading.
        space.admit(1, free / 2, reusable, || false).unwrap();
        assert_eq!(reads.get(), 1);
        let _ = space.admit(1, 1, reusable, || false);
        assert_eq!(reads.get(), 2, "the disk was read again");
    }
}
