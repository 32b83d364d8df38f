//! Background checkpointing: copies the WAL into the database file off the request path.
//!
//! SQLite's automatic checkpoint runs inside whichever commit crosses its threshold and fsyncs
//! the WAL and the database there, which more than doubled the cost of metadata-heavy work such
//! as an untar. So the write connection has automatic checkpoints off, and a thread with its own
//! connection runs PASSIVE checkpoints (which never block the writer) after every batch of
//! commits, or after a quiet interval. When the WAL has grown large anyway (a long write burst
//! leaves no moment to catch up), a RESTART checkpoint briefly holds writers off so the next
//! transaction starts the WAL from the beginning again.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use rusqlite::Connection;

use super::schema;
use crate::error::FsResult;

/// Commits after which the checkpointer is woken.
const COMMITS_PER_CHECKPOINT: u64 = 512;
/// Bytes of file content committed after which the checkpointer is woken: a copy of large
/// files makes few commits, and a WAL that holds everything needs as much room again before a
/// checkpoint can return its space (on a small disk, more than is left).
const BYTES_PER_CHECKPOINT: u64 = 4 << 20;
/// How long commits may wait for a checkpoint when fewer than a batch happened. (A wake-up
/// lost between the check and the wait costs at most this delay.) With no commit since the
/// last checkpoint the thread sleeps until the next one ([`Shared::idle`]).
const QUIET_INTERVAL: Duration = Duration::from_millis(500);
/// WAL length in frames (pages) past which a RESTART checkpoint follows the PASSIVE one.
const RESTART_FRAMES: i64 = 16 * 1024;

struct Shared {
    commits: AtomicU64,
    bytes: AtomicU64,
    stop: Mutex<bool>,
    wake: Condvar,
    /// The thread sleeps without a deadline (nothing to checkpoint): the next commit wakes it.
    idle: AtomicBool,
}

/// The checkpoint thread of one backend; dropping this stops and joins it.
pub(super) struct Checkpointer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    pub fn start(path: &Path) -> FsResult<Checkpointer> {
        let conn = schema::open_checkpointer(path)?;
        let shared = Arc::new(Shared {
            commits: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            stop: Mutex::new(false),
            wake: Condvar::new(),
            idle: AtomicBool::new(false),
        });
        let theirs = shared.clone();
        let thread =
            std::thread::Builder::new().name("sqlite-checkpoint".into()).spawn(move || run(conn, &theirs))?;
        Ok(Checkpointer { shared, thread: Some(thread) })
    }

    /// Counts a commit, waking the thread once a batch has accumulated.
    pub fn committed(&self) {
        let n = self.shared.commits.fetch_add(1, Ordering::SeqCst) + 1;
        // The first commit after a quiet spell wakes the thread, which then waits for the
        // batch or the quiet interval. (Under the lock: the thread checks and waits holding it.)
        if self.shared.idle.load(Ordering::SeqCst) && self.shared.idle.swap(false, Ordering::SeqCst) {
            let _stop = self.shared.stop.lock();
            self.shared.wake.notify_one();
        } else if n % COMMITS_PER_CHECKPOINT == 0 {
            self.shared.wake.notify_one();
        }
    }

    /// Commits counted so far.
    #[cfg(test)]
    pub fn commits(&self) -> u64 {
        self.shared.commits.load(Ordering::SeqCst)
    }

    /// Counts `bytes` of file content in a commit just counted, waking the thread once a
    /// batch of bytes has accumulated.
    pub fn committed_content(&self, bytes: u64) {
        let before = self.shared.bytes.fetch_add(bytes, Ordering::Relaxed);
        if before / BYTES_PER_CHECKPOINT != (before + bytes) / BYTES_PER_CHECKPOINT {
            self.shared.wake.notify_one();
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        *self.shared.stop.lock() = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(conn: Connection, shared: &Shared) {
    let (mut done, mut done_bytes) = (0, 0);
    loop {
        {
            let mut stop = shared.stop.lock();
            let pending = shared.commits.load(Ordering::Relaxed) - done;
            let pending_bytes = shared.bytes.load(Ordering::Relaxed) - done_bytes;
            if !*stop && pending == 0 {
                // Nothing to checkpoint: sleep until a commit (or the stop) wakes the thread.
                // Set before the commits are read again, so that a commit either sees it or
                // is seen.
                shared.idle.store(true, Ordering::SeqCst);
                if shared.commits.load(Ordering::SeqCst) == done {
                    shared.wake.wait(&mut stop);
                }
                shared.idle.store(false, Ordering::SeqCst);
                continue;
            }
            if !*stop && pending < COMMITS_PER_CHECKPOINT && pending_bytes < BYTES_PER_CHECKPOINT {
                shared.wake.wait_for(&mut stop, QUIET_INTERVAL);
            }
            if *stop {
                return;
            }
        }
        let commits = shared.commits.load(Ordering::Relaxed);
        if commits == done {
            continue;
        }
        done = commits;
        done_bytes = shared.bytes.load(Ordering::Relaxed);
        if let Err(e) = checkpoint(&conn) {
            tracing::warn!("sqlite: checkpoint failed: {e}");
        }
    }
}

fn checkpoint(conn: &Connection) -> rusqlite::Result<()> {
    // Columns: busy, frames in the WAL, frames checkpointed.
    let (_, log, _): (i64, i64, i64) =
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    if log >= RESTART_FRAMES {
        conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()))?;
    }
    Ok(())
}
