//! Tests of the postgres backend on a private server: the shared backend suite, and what only
//! a shared store has (several daemons on one namespace, notifications, orphans, faults).

use std::sync::atomic::{AtomicUsize, Ordering};

use super::testing::TestServer;
use super::{PgSettings, PostgresBackend};

/// A backend on a namespace of its own of the shared test server, listening for other
/// daemons' changes as a mount's does (which lets it keep what it knows of directories).
pub fn backend(namespace: &str) -> PostgresBackend {
    use crate::backend::Backend;
    let server = TestServer::shared();
    let settings = PgSettings::new(&server.url(), "agentvfs").unwrap();
    let backend = PostgresBackend::open(settings, namespace).unwrap();
    backend.watch(Box::new(|_| {}));
    backend
}

/// [`backend`] on a namespace of its own, once it holds its alone lease: the files it
/// creates are drafts until their close (see `drafts`).
pub fn alone_backend() -> PostgresBackend {
    let b = backend(&fresh_namespace());
    wait_until_alone(&b);
    b
}

/// Waits until `b` holds its alone lease. Its listener takes it at its first look, which on a
/// loaded machine (the whole suite in parallel on two CPUs) took more than 5 s once.
pub fn wait_until_alone(b: &PostgresBackend) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !b.inner.drafts.allowed() {
        assert!(std::time::Instant::now() < deadline, "a daemon alone on its namespace took its lease");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// A namespace no other test of this process uses.
pub fn fresh_namespace() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("test-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

crate::backend::suite::backend_suite!(((), alone_backend()));

/// An open that races this daemon's unlinks of the same name gets a handle whose inode stays
/// until it closes, or no handle: never one whose rows the unlink deleted (ESTALE on read).
#[test]
fn an_open_racing_this_daemons_unlinks_never_holds_a_deleted_inode() {
    use crate::backend::{Backend, Caller};
    use std::sync::atomic::AtomicBool;
    use std::time::{Duration, Instant};

    let b = std::sync::Arc::new(backend(&fresh_namespace()));
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let churn = {
        let (b, stop) = (b.clone(), stop.clone());
        std::thread::spawn(move || {
            let caller = Caller::daemon();
            let mut rounds = 0;
            while !stop.load(Ordering::Relaxed) {
                let (_, f) = b.create("f", 0o644, libc::O_WRONLY, &caller).unwrap();
                f.write(0, b"x").unwrap();
                drop(f);
                b.unlink("f").unwrap();
                rounds += 1;
            }
            rounds
        })
    };
    let mut opened = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while opened < 300 && Instant::now() < deadline {
        if let Ok(f) = b.open("f", libc::O_RDONLY) {
            let read = f.read(0, 16);
            assert!(read.is_ok(), "an open handle's inode was deleted: {read:?}");
            opened += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = churn.join().unwrap();

    // A file created while another thread unlinks its name keeps its inode for its handle.
    stop.store(false, Ordering::Relaxed);
    let unlinker = {
        let (b, stop) = (b.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = b.unlink("g");
            }
        })
    };
    let mut created = 0;
    while created < 300 && Instant::now() < deadline + Duration::from_secs(20) {
        let f = match b.create("g", 0o644, libc::O_WRONLY, &Caller::daemon()) {
            Ok((_, f)) => f,
            Err(e) if e.is(crate::error::Errno::EEXIST) => continue, // not unlinked yet
            Err(e) => panic!("{e}"),
        };
        let wrote = f.write(0, b"x");
        assert!(wrote.is_ok(), "a created file's inode was deleted under its handle: {wrote:?}");
        created += 1;
    }
    stop.store(true, Ordering::Relaxed);
    unlinker.join().unwrap();
    assert!(opened >= 50 && rounds >= 50, "too little overlap to tell: {opened} opens, {rounds} rounds");
}

/// The rows of `namespace`'s nodes that have no name left.
fn nameless_rows(namespace: &str) -> i64 {
    let mut client = postgres::Client::connect(&TestServer::shared().url(), postgres::NoTls).unwrap();
    let row = client
        .query_one(
            "SELECT count(*) FROM agentvfs.inodes i JOIN agentvfs.namespaces n ON n.id = i.ns
             WHERE n.name = $1 AND i.nlink = 0",
            &[&namespace],
        )
        .unwrap();
    row.get(0)
}

/// A rename over a file this daemon holds open keeps the file's rows for the handle, which
/// reads the old content, and deletes them at its last close; a replaced file nobody holds
/// goes at once.
#[test]
fn a_file_renamed_over_while_open_keeps_its_rows_until_its_last_close() {
    use crate::backend::{Backend, Caller};
    let ns = fresh_namespace();
    let b = backend(&ns);
    let write = |path: &str, data: &[u8]| {
        let (_, f) = b.create(path, 0o644, libc::O_WRONLY, &Caller::daemon()).unwrap();
        f.write(0, data).unwrap();
    };
    write("a", b"old");
    let held = b.open("a", libc::O_RDONLY).unwrap();
    write("b", b"new");
    b.rename("b", "a", 0).unwrap();
    assert_eq!(held.read(0, 16).unwrap(), b"old");
    assert_eq!(b.open("a", libc::O_RDONLY).unwrap().read(0, 16).unwrap(), b"new");
    assert_eq!(nameless_rows(&ns), 1, "the held file is kept");
    drop(held);
    assert_eq!(nameless_rows(&ns), 0, "and goes at its last close");
    write("c", b"newer");
    b.rename("c", "a", 0).unwrap();
    assert_eq!(nameless_rows(&ns), 0, "a replaced file nobody holds goes with the rename");
    assert_eq!(b.open("a", libc::O_RDONLY).unwrap().read(0, 16).unwrap(), b"newer");
    assert_eq!(b.getattr("a").unwrap().size, 5, "the cache followed the renames");
}

/// A nameless file kept for the handle of a daemon that is gone (its instance lock is free)
/// is deleted, chunks and all, by the next daemon to open the namespace; one kept by a daemon
/// still running stays.
#[test]
fn the_next_daemon_deletes_the_orphans_of_one_that_died() {
    use crate::backend::{Backend, Caller};
    let ns = fresh_namespace();
    let alive = backend(&ns);
    let (_, f) = alive.create("kept", 0o644, libc::O_WRONLY, &Caller::daemon()).unwrap();
    f.write(0, b"still open").unwrap();
    alive.unlink("kept").unwrap();
    assert_eq!(nameless_rows(&ns), 1);
    // A dead daemon's orphan: an instance number no session holds the lock of.
    let mut client = postgres::Client::connect(&TestServer::shared().url(), postgres::NoTls).unwrap();
    let dead =
        client.query_one("SELECT nextval('agentvfs.instance_seq')::integer", &[]).unwrap().get::<_, i32>(0);
    client
        .batch_execute(&format!(
            "INSERT INTO agentvfs.inodes (ino, ns, kind, perm, uid, gid, rdev, size, nlink, atime, mtime,
                 ctime, crtime, orphan_of)
             SELECT 1000000000000 + id, id, 32768, 420, 0, 0, 0, 3, 0, 0, 0, 0, 0, {dead}
             FROM agentvfs.namespaces WHERE name = '{ns}';
             INSERT INTO agentvfs.chunks (ino, idx, data)
             SELECT 1000000000000 + id, 0, 'abc' FROM agentvfs.namespaces WHERE name = '{ns}';"
        ))
        .unwrap();
    assert_eq!(nameless_rows(&ns), 2);
    let _next = backend(&ns);
    assert_eq!(nameless_rows(&ns), 1, "the dead daemon's orphan went, the live one's stayed");
    let chunks: i64 = client
        .query_one("SELECT count(*) FROM agentvfs.chunks WHERE ino >= 1000000000000", &[])
        .unwrap()
        .get(0);
    assert_eq!(chunks, 0, "with its content");
    assert_eq!(f.read(0, 16).unwrap(), b"still open");
    drop(f);
    assert_eq!(nameless_rows(&ns), 0);
}
