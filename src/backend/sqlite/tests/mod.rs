//! Tests of the sqlite backend, and the helpers they share: `ops` covers data paths and POSIX
//! bookkeeping of single operations, `durability` persistence, crashes, namespaces, schema
//! versions and concurrency, `held` the changes held back while alone, `crash` what a
//! `kill -9` in the middle of random work leaves.

mod crash;
mod durability;
mod held;
mod ops;

use std::path::{Path, PathBuf};
use std::thread;
use std::time::UNIX_EPOCH;

use rusqlite::Connection;
use tempfile::TempDir;

use super::file::{patch_cost, CHUNK_SIZE};
use super::SqliteBackend;
use crate::backend::{Backend, OpenFile, SetAttr, TimeSet, RENAME_EXCHANGE, RENAME_NOREPLACE};
use crate::error::{Errno, FsResult};

pub(crate) use crate::backend::suite::{errno, get, names, pattern, put, read_all, same_bytes, ME};

crate::backend::suite::backend_suite!({
    let (d, _db, b) = setup();
    (d, b)
});

impl SqliteBackend {
    /// Rows inserted, updated or deleted by the write connection so far.
    fn total_changes(&self) -> u64 {
        self.inner.conn.lock().conn.total_changes()
    }

    /// Commits of the write connection so far.
    fn commits(&self) -> u64 {
        self.inner.checkpointer.as_ref().expect("a store this backend writes").commits()
    }

    /// Holds the write connection for `pause`, on another thread; returns once it is held.
    fn busy_writer_for(&self, pause: std::time::Duration) -> thread::JoinHandle<()> {
        let inner = self.inner.clone();
        let (held, wait) = std::sync::mpsc::channel();
        let busy = thread::spawn(move || {
            let _db = inner.conn.lock();
            held.send(()).unwrap();
            thread::sleep(pause);
        });
        wait.recv().unwrap();
        busy
    }

    /// Whether the write connection's node cache holds `ino`.
    fn caches_node(&self, ino: u64) -> bool {
        self.inner.conn.lock().nodes.borrow().holds(ino)
    }

    /// Bytes written and waiting in the buffers of all files.
    fn buffered_bytes(&self) -> usize {
        self.inner.dirty_total.load(std::sync::atomic::Ordering::Relaxed)
    }
}

fn setup() -> (TempDir, PathBuf, SqliteBackend) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fs.db");
    let b = SqliteBackend::open(&db, "main").unwrap();
    (dir, db, b)
}

fn raw(db: &Path) -> Connection {
    Connection::open(db).unwrap()
}

fn count(db: &Path, sql: &str) -> i64 {
    raw(db).query_row(sql, [], |r| r.get(0)).unwrap()
}
