//! What must outlive a handle, a backend or a process: persistence, kill -9, orphans, schema
//! versions, background checkpoints, namespaces sharing a file, a full disk, and concurrency.

use std::time::Duration;

use super::*;

#[test]
fn namespaces_are_isolated() {
    let (_d, db, a) = setup();
    let b = SqliteBackend::open(&db, "other").unwrap();
    put(&a, "x", b"from a");
    a.mkdir("only-a", 0o755, &ME).unwrap();
    assert_eq!(errno(b.getattr("x")), Errno::ENOENT);
    assert!(b.readdir("").unwrap().is_empty());
    put(&b, "x", b"from b");
    assert_eq!(get(&a, "x"), b"from a");
    assert_eq!(get(&b, "x"), b"from b");
    b.unlink("x").unwrap();
    assert_eq!(get(&a, "x"), b"from a");
    assert_eq!(names(&a, ""), ["only-a", "x"]);
    assert_ne!(a.getattr("").unwrap().ino, b.getattr("").unwrap().ino);
    assert_eq!(count(&db, "SELECT count(*) FROM namespaces"), 2);
    assert!(a.describe().contains("main") && b.describe().contains("other"));
}

#[test]
fn namespaces_write_concurrently() {
    let (_d, db, a) = setup();
    let others: Vec<SqliteBackend> =
        (0..3).map(|i| SqliteBackend::open(&db, &format!("ns{i}")).unwrap()).collect();
    thread::scope(|s| {
        for (i, b) in std::iter::once(&a).chain(&others).enumerate() {
            s.spawn(move || {
                for j in 0..50 {
                    put(b, &format!("f{j}"), format!("{i}/{j}").as_bytes());
                    b.setattr(&format!("f{j}"), &SetAttr { mode: Some(0o600), ..Default::default() })
                        .unwrap();
                }
            });
        }
    });
    for (i, b) in std::iter::once(&a).chain(&others).enumerate() {
        assert_eq!(b.readdir("").unwrap().len(), 50);
        assert_eq!(get(b, "f49"), format!("{i}/49").as_bytes());
    }
}

#[test]
fn checkpoints_run_in_the_background() {
    let (_d, db, b) = setup();
    let before = std::fs::metadata(&db).unwrap().len();
    for i in 0..20 {
        put(&b, &format!("f{i}"), &[1u8; 10_000]);
    }
    // Nothing reaches the database file at commit; the checkpoint thread copies it soon after.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::fs::metadata(&db).unwrap().len() <= before + 20 * 8192 {
        assert!(std::time::Instant::now() < deadline, "no checkpoint ran");
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(get(&b, "f19"), [1u8; 10_000]);
}

#[test]
fn persistence_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("p.db");
    let big = pattern(3 * CHUNK_SIZE as usize + 17, 1);
    let mtime = UNIX_EPOCH + Duration::new(1_500_000_000, 42);
    let (file_attr, ino) = {
        let b = SqliteBackend::open(&db, "ns").unwrap();
        b.mkdir("dir", 0o750, &ME).unwrap();
        b.mkdir("dir/sub", 0o755, &ME).unwrap();
        let (_, f) = b.create("dir/sub/big", 0o600, 0, &ME).unwrap();
        f.write(0, &big).unwrap();
        f.flush().unwrap();
        // The handle is leaked on purpose: flush alone must have made the data durable.
        std::mem::forget(f);
        b.symlink("link", b"dir/sub/big", &ME).unwrap();
        b.link("dir/sub/big", "hard").unwrap();
        b.setxattr("dir", "user.k", b"v", 0).unwrap();
        let a = b.setattr("hard", &SetAttr { mtime: Some(TimeSet::At(mtime)), ..Default::default() });
        let a = a.unwrap();
        (a.clone(), a.ino)
    };
    let b = SqliteBackend::open(&db, "ns").unwrap();
    assert_eq!(names(&b, ""), ["dir", "hard", "link"]);
    assert_eq!(get(&b, "dir/sub/big"), big);
    let a = b.getattr("hard").unwrap();
    assert_eq!(a, file_attr);
    assert_eq!((a.ino, a.nlink, a.perm, a.mtime, a.size), (ino, 2, 0o600, mtime, big.len() as u64));
    assert_eq!(b.getattr("dir").unwrap().perm, 0o750);
    assert_eq!(b.getattr("dir").unwrap().nlink, 3);
    assert_eq!(b.readlink("link").unwrap(), b"dir/sub/big");
    assert_eq!(b.getxattr("dir", "user.k").unwrap(), b"v");
}

#[test]
fn unlinked_while_open_stays_usable() {
    let (_d, db, b) = setup();
    let (attr, f) = b.create("gone", 0o644, 0, &ME).unwrap();
    f.write(0, &pattern(100_000, 5)).unwrap();
    f.flush().unwrap();
    let g = b.open("gone", libc::O_RDONLY).unwrap();
    b.unlink("gone").unwrap();
    assert_eq!(errno(b.getattr("gone")), Errno::ENOENT);
    assert!(b.readdir("").unwrap().is_empty());
    assert_eq!(f.getattr().unwrap().nlink, 0);
    f.write(100_000, b"more").unwrap();
    let mut expect = pattern(100_000, 5);
    expect.extend_from_slice(b"more");
    assert_eq!(read_all(&*g), expect);
    let q = format!("SELECT count(*) FROM inodes WHERE ino = {}", attr.ino);
    drop(f);
    b.commit_pending().unwrap();
    assert_eq!(count(&db, &q), 1, "still open through g");
    assert_eq!(read_all(&*g), expect);
    drop(g);
    b.commit_pending().unwrap();
    assert_eq!(count(&db, &q), 0);
    assert_eq!(count(&db, "SELECT count(*) FROM chunks"), 0);

    // The same through rename replacing an open file.
    put(&b, "victim", b"old");
    put(&b, "new", b"new");
    let v = b.open("victim", libc::O_RDONLY).unwrap();
    b.rename("new", "victim", 0).unwrap();
    assert_eq!(read_all(&*v), b"old");
    assert_eq!(get(&b, "victim"), b"new");
    drop(v);
    b.commit_pending().unwrap();
    assert_eq!(count(&db, "SELECT count(*) FROM inodes"), 2); // root and the new file
}

const CRASH_DB: &str = "AGENTVFS_SQLITE_CRASH_DB";

/// The daemon side of `flushed_data_survives_kill_9`: run in a child process and killed there.
#[test]
#[ignore = "run by flushed_data_survives_kill_9 in a child process"]
fn crash_child() {
    let Some(db) = std::env::var_os(CRASH_DB) else { return };
    let b = SqliteBackend::open(Path::new(&db), "ns").unwrap();
    put(&b, "closed", b"closed data");
    b.mkdir("dir", 0o700, &ME).unwrap();
    b.rename("closed", "dir/moved", 0).unwrap();
    let (_, flushed) = b.create("flushed", 0o644, 0, &ME).unwrap();
    flushed.write(0, &pattern(200_000, 8)).unwrap();
    flushed.flush().unwrap();
    let (_, gone) = b.create("gone", 0o644, 0, &ME).unwrap();
    gone.write(0, &pattern(100_000, 9)).unwrap();
    gone.flush().unwrap();
    b.unlink("gone").unwrap();
    let (_, unflushed) = b.create("unflushed", 0o644, 0, &ME).unwrap();
    unflushed.write(0, b"lost").unwrap();
    // The unlink and the last create were held: they are committed within MAX_HOLD.
    thread::sleep(super::super::held::MAX_HOLD + Duration::from_millis(100));
    println!("ready");
    thread::sleep(Duration::from_secs(60));
    drop((flushed, gone, unflushed));
}

#[test]
fn flushed_data_survives_kill_9() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("crash.db");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "backend::sqlite::tests::durability::crash_child", "--ignored", "--nocapture"])
        .env(CRASH_DB, &db)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let ready = stdout.lines().map_while(Result::ok).any(|l| l.contains("ready"));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(ready, "the child did not get ready");

    assert_eq!(count(&db, "SELECT count(*) FROM inodes WHERE nlink = 0"), 1, "the unlinked open file");
    let b = SqliteBackend::open(&db, "ns").unwrap();
    assert_eq!(count(&db, "SELECT count(*) FROM inodes WHERE nlink = 0"), 0, "orphan removed");
    assert_eq!(names(&b, ""), ["dir", "flushed", "unflushed"]);
    assert_eq!(get(&b, "dir/moved"), b"closed data");
    assert_eq!(b.getattr("dir").unwrap().perm, 0o700);
    assert_eq!(get(&b, "flushed"), pattern(200_000, 8));
    // Created (a committed metadata operation), but its data was never flushed.
    assert_eq!(b.getattr("unflushed").unwrap().size, 0);
    check_consistency(&db);
}

#[test]
fn orphans_are_removed_on_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("o.db");
    {
        let b = SqliteBackend::open(&db, "ns").unwrap();
        let other = SqliteBackend::open(&db, "other").unwrap();
        for (be, name) in [(&b, "orphan"), (&other, "theirs")] {
            let (_, f) = be.create(name, 0o644, 0, &ME).unwrap();
            f.write(0, b"soon gone").unwrap();
            f.flush().unwrap();
            be.unlink(name).unwrap();
            // A crash: the handle is never closed.
            std::mem::forget(f);
        }
        put(&b, "kept", b"k");
    }
    assert_eq!(count(&db, "SELECT count(*) FROM inodes WHERE nlink = 0"), 2);
    let b = SqliteBackend::open(&db, "ns").unwrap();
    // Only this namespace's orphan is removed.
    assert_eq!(count(&db, "SELECT count(*) FROM inodes WHERE nlink = 0"), 1);
    assert_eq!(count(&db, "SELECT count(*) FROM chunks"), 2);
    assert_eq!(get(&b, "kept"), b"k");
}

#[test]
fn schema_version_and_foreign_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v.db");
    drop(SqliteBackend::open(&db, "ns").unwrap());
    assert_eq!(count(&db, "PRAGMA user_version"), 1);
    raw(&db).pragma_update(None, "user_version", 99).unwrap();
    let e = SqliteBackend::open(&db, "ns").err().expect("newer schema refused");
    assert_eq!(e.errno, Errno::EINVAL);
    assert!(e.context.contains("99") && e.context.contains("v.db"), "{e}");

    assert_eq!(count(&db, "PRAGMA user_version"), 99, "left as it was");
    raw(&db).pragma_update(None, "user_version", 1).unwrap();
    drop(SqliteBackend::open(&db, "ns").unwrap());
    assert_eq!(count(&db, "PRAGMA user_version"), 1);

    let foreign = dir.path().join("foreign.db");
    raw(&foreign).execute_batch("CREATE TABLE t (x)").unwrap();
    let e = SqliteBackend::open(&foreign, "ns").err().expect("foreign database refused");
    assert!(e.context.contains("not an agentvfs database"), "{e}");
    let mode: String = raw(&foreign).query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
    assert_eq!(mode, "delete", "a foreign file is not altered");

    let missing = dir.path().join("no/such/dir/x.db");
    let e = SqliteBackend::open(&missing, "ns").err().expect("missing parent");
    assert!(e.context.contains("no/such/dir/x.db"), "{e}");
}

#[test]
fn full_disk_is_enospc_and_keeps_the_buffer() {
    let (_d, _db, b) = setup();
    // The creation of `big` stays held until its data is committed (a full disk then makes
    // SQLite end the whole transaction: the creation must not be in it).
    b.inner.stop_committer();
    put(&b, "small", b"x");
    let (_, f) = b.create("big", 0o644, 0, &ME).unwrap();
    assert!(b.inner.holding.load(std::sync::atomic::Ordering::Acquire), "the creation is held");
    // SQLite's page limit stands in for a full disk (both are SQLITE_FULL).
    let limit = |extra: i64| {
        let db = b.inner.conn.lock();
        let conn = &db.conn;
        let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap();
        let max = if extra < 0 { 1 << 30 } else { pages + extra };
        conn.query_row(&format!("PRAGMA max_page_count = {max}"), [], |_| Ok(())).unwrap();
    };
    limit(4);
    let data = pattern(1 << 20, 2);
    f.write(0, &data).unwrap();
    assert_eq!(errno(f.flush()), Errno::ENOSPC);
    assert_eq!(errno(f.fsync(false)), Errno::ENOSPC);
    // Still readable from the buffer, and committed once there is room.
    assert_eq!(f.read(1000, 10).unwrap(), &data[1000..1010]);
    limit(-1);
    f.flush().unwrap();
    drop(f);
    assert_eq!(get(&b, "big"), data);
    assert_eq!(get(&b, "small"), b"x");
}

#[test]
fn concurrent_writers() {
    let (_d, _db, b) = setup();
    put(&b, "shared", b"");
    b.mkdir("dirs", 0o755, &ME).unwrap();
    let b = &b;
    thread::scope(|s| {
        for t in 0..8u8 {
            s.spawn(move || {
                let name = format!("own{t}");
                let (_, f) = b.create(&name, 0o644, 0, &ME).unwrap();
                let shared = b.open("shared", libc::O_WRONLY).unwrap();
                for i in 0..64u64 {
                    f.write(i * 4096, &[t; 4096]).unwrap();
                    // Each thread owns every 8th 4 KiB block of the shared file.
                    shared.write((i * 8 + t as u64) * 4096, &[t + 1; 4096]).unwrap();
                    if i % 16 == 0 {
                        shared.flush().unwrap();
                        let _ = b.getattr("shared").unwrap();
                    }
                }
                b.mkdir(&format!("dirs/d{t}"), 0o755, &ME).unwrap();
                b.rename(&format!("dirs/d{t}"), &format!("dirs/e{t}"), 0).unwrap();
                let _ = b.readdir("dirs").unwrap();
            });
        }
    });
    for t in 0..8u8 {
        assert_eq!(get(b, &format!("own{t}")), vec![t; 64 * 4096]);
    }
    let shared = get(b, "shared");
    assert_eq!(shared.len(), 64 * 8 * 4096);
    for (block, data) in shared.chunks(4096).enumerate() {
        assert_eq!(data, &[(block % 8) as u8 + 1; 4096][..], "block {block}");
    }
    assert_eq!(b.getattr("dirs").unwrap().nlink, 10);
    assert_eq!(names(b, "dirs"), (0..8).map(|t| format!("e{t}")).collect::<Vec<_>>());
}

#[test]
fn inode_numbers_are_never_reused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("i.db");
    let mut seen = std::collections::HashSet::new();
    for _ in 0..2 {
        let b = SqliteBackend::open(&db, "ns").unwrap();
        for _ in 0..3 {
            put(&b, "f", b"");
            assert!(seen.insert(b.getattr("f").unwrap().ino));
            b.unlink("f").unwrap();
        }
    }
    assert!(!seen.contains(&1) && seen.len() == 6);
}

/// A small deterministic generator, so a failing interleaving can be replayed by seed.
pub(super) struct XorShift(pub(super) u64);

impl XorShift {
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Checks link counts, reachability and the chunk invariant with plain SQL.
pub(super) fn check_consistency(db: &Path) {
    let c = raw(db);
    let q = |sql: &str| -> i64 { c.query_row(sql, [], |r| r.get(0)).unwrap() };
    let dir = libc::S_IFDIR;
    assert_eq!(q("SELECT count(*) FROM dentries WHERE child NOT IN (SELECT ino FROM inodes)"), 0);
    assert_eq!(q("SELECT count(*) FROM dentries WHERE parent NOT IN (SELECT ino FROM inodes)"), 0);
    let files = format!(
        "SELECT count(*) FROM inodes i WHERE kind != {dir} AND nlink !=
         (SELECT count(*) FROM dentries d WHERE d.child = i.ino)"
    );
    assert_eq!(q(&files), 0, "file link counts");
    let dirs = format!(
        "SELECT count(*) FROM inodes i WHERE kind = {dir} AND nlink != 2 +
         (SELECT count(*) FROM dentries d JOIN inodes c ON c.ino = d.child
          WHERE d.parent = i.ino AND c.kind = {dir})"
    );
    assert_eq!(q(&dirs), 0, "directory link counts");
    assert_eq!(q("SELECT count(*) FROM inodes WHERE nlink = 0"), 0, "orphans");
    assert_eq!(q("SELECT count(*) FROM chunks WHERE ino NOT IN (SELECT ino FROM inodes)"), 0);
    let beyond = format!(
        "SELECT count(*) FROM chunks c JOIN inodes i ON i.ino = c.ino
         WHERE c.idx * {CHUNK_SIZE} + length(c.data) > i.size"
    );
    assert_eq!(q(&beyond), 0, "chunk data past the size");
}

#[test]
fn mixed_concurrent_operations_keep_invariants() {
    let (_d, db, b) = setup();
    let b = std::sync::Arc::new(b);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let threads: Vec<_> = (0..6u64)
        .map(|t| {
            let b = b.clone();
            let done = done_tx.clone();
            thread::spawn(move || {
                let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ (t + 1));
                let names = ["a", "b", "d1/a", "d1/b", "d2/a", "d1", "d2", "d1/d3"];
                let mut held: Vec<Box<dyn OpenFile>> = Vec::new();
                for _ in 0..400 {
                    let p = names[rng.below(names.len() as u64) as usize];
                    let q = names[rng.below(names.len() as u64) as usize];
                    let r: FsResult<()> = match rng.below(12) {
                        0 => b.create(p, 0o644, 0, &ME).map(|(_, f)| held.push(f)),
                        1 => b.open(p, 0).map(|f| held.push(f)),
                        2 => b.unlink(p),
                        3 => b.rmdir(p),
                        4 => b.mkdir(p, 0o755, &ME).map(|_| ()),
                        5 => b.rename(p, q, [0, RENAME_NOREPLACE, RENAME_EXCHANGE][rng.below(3) as usize]),
                        6 => b.link(p, q).map(|_| ()),
                        7 => {
                            let size = Some(rng.below(3 * CHUNK_SIZE));
                            b.setattr(p, &SetAttr { size, ..Default::default() }).map(|_| ())
                        }
                        8 | 9 => match held.len() {
                            0 => Ok(()),
                            n => {
                                let f = &held[rng.below(n as u64) as usize];
                                let off = rng.below(2 * CHUNK_SIZE);
                                let w = f.write(off, &[t as u8; 5000]).map(|_| ());
                                w.and_then(|_| f.read(off, 9000).map(|_| ()))
                            }
                        },
                        10 => {
                            if !held.is_empty() {
                                held.swap_remove(rng.below(held.len() as u64) as usize);
                            }
                            Ok(())
                        }
                        _ => b.getattr(p).map(|_| ()).and(b.readdir("").map(|_| ())),
                    };
                    if let Err(e) = r {
                        assert_ne!(e.errno, Errno::EIO, "{e}");
                    }
                }
                drop(held);
                done.send(()).unwrap();
            })
        })
        .collect();
    for _ in 0..threads.len() {
        done_rx.recv_timeout(Duration::from_secs(120)).expect("no deadlock");
    }
    for t in threads {
        t.join().unwrap();
    }
    b.commit_pending().unwrap();
    check_consistency(&db);
    // Every name resolves (through the dentry cache, warm from the run) to what the table holds.
    let root = b.getattr("").unwrap().ino as i64;
    let rows: Vec<(String, i64)> = raw(&db)
        .prepare(
            "WITH RECURSIVE p(path, ino) AS (
                 SELECT name, child FROM dentries WHERE parent = ?1
                 UNION ALL
                 SELECT p.path || '/' || d.name, d.child FROM p JOIN dentries d ON d.parent = p.ino)
             SELECT path, ino FROM p",
        )
        .unwrap()
        .query_map([root], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for (path, ino) in &rows {
        assert_eq!(b.getattr(path).unwrap().ino, *ino as u64, "{path}");
    }
    for path in ["a", "b", "d1/a", "d1/b", "d2/a", "d1", "d2", "d1/d3"] {
        if !rows.iter().any(|(p, _)| p == path) {
            assert!(b.getattr(path).is_err(), "{path} resolves but has no entry");
        }
    }
    // The same state after a reopen.
    drop(b);
    drop(SqliteBackend::open(&db, "main").unwrap());
    check_consistency(&db);
}

/// An `open` racing the unlink (or replacing rename) of its name either fails or holds a file
/// that stays readable and writable until it closes: the open skips reading the node again
/// when no commit came since it resolved the name, so this pins that a removal in between is
/// always noticed.
#[test]
fn opens_racing_removals_hold_a_live_file_or_fail() {
    let (_d, db, b) = setup();
    let b = std::sync::Arc::new(b);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let remover = {
        let (b, stop) = (b.clone(), stop.clone());
        thread::spawn(move || {
            for i in 0..600u32 {
                put(&*b, "f", format!("version {i}").as_bytes());
                match i % 2 {
                    0 => b.unlink("f").unwrap(),
                    _ => {
                        put(&*b, "g", b"replacement");
                        b.rename("g", "f", 0).unwrap();
                        b.unlink("f").unwrap();
                    }
                }
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        })
    };
    let openers: Vec<_> = (0..3u8)
        .map(|t| {
            let (b, stop) = (b.clone(), stop.clone());
            thread::spawn(move || {
                let mut opened = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let Ok(f) = b.open("f", 0) else { continue };
                    opened += 1;
                    // Other openers may hold the same file and write it too.
                    f.write(0, &[b'0' + t; 3]).unwrap();
                    f.flush().unwrap();
                    assert!(f.getattr().unwrap().size >= 3);
                    assert!(f.read(0, 64).unwrap().len() >= 3);
                }
                opened
            })
        })
        .collect();
    remover.join().unwrap();
    let opened: u32 = openers.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(opened > 0, "no open ever won the race");
    b.commit_pending().unwrap();
    check_consistency(&db);
}
