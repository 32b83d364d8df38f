//! Tests of the sqlite backend, and the helpers they share: `ops` covers data paths and POSIX
//! bookkeeping of single operations, `durability` persistence, crashes, namespaces, schema
//! versions and concurrency.

mod durability;
mod ops;

use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, UNIX_EPOCH};

use rusqlite::Connection;
use tempfile::TempDir;

use super::file::CHUNK_SIZE;
use super::SqliteBackend;
use crate::backend::{
    Backend, Caller, FileKind, OpenFile, SetAttr, TimeSet, RENAME_EXCHANGE, RENAME_NOREPLACE,
};
use crate::error::{Errno, FsResult};

const ME: Caller = Caller { uid: 1000, gid: 1000, pid: 1 };

impl SqliteBackend {
    /// Rows inserted, updated or deleted by the write connection so far.
    fn total_changes(&self) -> u64 {
        self.inner.conn.lock().conn.total_changes()
    }
}

fn setup() -> (TempDir, PathBuf, SqliteBackend) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fs.db");
    let b = SqliteBackend::open(&db, "main").unwrap();
    (dir, db, b)
}

fn errno<T>(r: FsResult<T>) -> Errno {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.errno,
    }
}

/// Creates `path` holding `data`, flushed and closed.
fn put(b: &SqliteBackend, path: &str, data: &[u8]) {
    let (_, f) = b.create(path, 0o644, 0, &ME).unwrap();
    if !data.is_empty() {
        assert_eq!(f.write(0, data).unwrap(), data.len() as u32);
    }
    f.flush().unwrap();
}

fn get(b: &SqliteBackend, path: &str) -> Vec<u8> {
    let f = b.open(path, libc::O_RDONLY).unwrap();
    read_all(&*f)
}

fn read_all(f: &dyn OpenFile) -> Vec<u8> {
    let size = f.getattr().unwrap().size;
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        let got = f.read(out.len() as u64, 100_000).unwrap();
        assert!(!got.is_empty());
        out.extend_from_slice(&got);
    }
    out
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 ^ seed).collect()
}

fn raw(db: &Path) -> Connection {
    Connection::open(db).unwrap()
}

fn count(db: &Path, sql: &str) -> i64 {
    raw(db).query_row(sql, [], |r| r.get(0)).unwrap()
}

fn names(b: &SqliteBackend, path: &str) -> Vec<String> {
    let mut v: Vec<String> = b.readdir(path).unwrap().into_iter().map(|e| e.name).collect();
    v.sort();
    v
}

fn tick() {
    thread::sleep(Duration::from_millis(5));
}
