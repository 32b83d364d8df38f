//! Changes held back while a backend is alone on its file: committed together, within
//! `MAX_HOLD`, at every point that needs them durable, and seen by every read at once.

use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::super::held::MAX_HOLD;
use super::*;

/// Polls `db` until `sql` counts `want`, for up to `limit`; the time it took.
fn counted_within(db: &Path, sql: &str, want: i64, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if count(db, sql) == want {
            return Some(start.elapsed());
        }
        thread::sleep(Duration::from_millis(5));
    }
    None
}

#[test]
fn a_run_of_changes_is_committed_together_within_the_hold() {
    let (_d, db, b) = setup();
    let before = b.commits();
    for i in 0..200 {
        b.mkdir(&format!("d{i}"), 0o755, &ME).unwrap();
    }
    for i in 0..100 {
        b.rmdir(&format!("d{i}")).unwrap();
    }
    let commits = b.commits() - before;
    // One commit per change before; now one per quiet spell or hold (a slow machine may
    // pause between two of them).
    assert!(commits <= 30, "{commits} commits for 300 changes");
    let sql = "SELECT count(*) FROM dentries WHERE name LIKE 'd%'";
    let took = counted_within(&db, sql, 100, Duration::from_secs(3));
    assert!(took.is_some(), "the held changes were never committed");
    assert_eq!(names(&b, "").len(), 100);
}

#[test]
fn every_read_sees_held_changes_at_once() {
    let (_d, _db, b) = setup();
    put(&b, "x", b"data");
    b.unlink("x").unwrap();
    b.mkdir("made", 0o700, &ME).unwrap();
    // With the write connection busy, a read waits for it: a pooled reader would see the
    // committed state, where `x` is still there and `made` is not.
    let busy = b.busy_writer_for(Duration::from_millis(100));
    assert_eq!(errno(b.getattr("x")), Errno::ENOENT);
    busy.join().unwrap();
    let busy = b.busy_writer_for(Duration::from_millis(100));
    assert_eq!(names(&b, ""), ["made"]);
    busy.join().unwrap();
    let busy = b.busy_writer_for(Duration::from_millis(100));
    assert_eq!(b.getattr("made").unwrap().perm, 0o700);
    busy.join().unwrap();
}

#[test]
fn closes_fsyncs_tools_and_the_backends_end_commit_what_is_held() {
    let (_d, db, b) = setup();
    let stored = |name: &str| count(&db, &format!("SELECT count(*) FROM dentries WHERE name = '{name}'"));
    // The close of a written file makes the changes before it durable with its data.
    b.mkdir("before-close", 0o755, &ME).unwrap();
    let (_, f) = b.create("written", 0o644, 0, &ME).unwrap();
    f.write(0, b"data").unwrap();
    f.flush().unwrap();
    assert_eq!((stored("before-close"), stored("written")), (1, 1));
    // So does an fsync of a file, even with nothing to write.
    b.mkdir("before-fsync", 0o755, &ME).unwrap();
    f.fsync(false).unwrap();
    assert_eq!(stored("before-fsync"), 1);
    drop(f);
    // An fsync of a directory.
    b.rename("before-fsync", "renamed", 0).unwrap();
    b.fsyncdir("").unwrap();
    assert_eq!((stored("before-fsync"), stored("renamed")), (0, 1));
    // A tool, before it reports success.
    b.unlink("written").unwrap();
    b.commit_pending().unwrap();
    assert_eq!(stored("written"), 0);
    // The end of the backend.
    b.mkdir("at-the-end", 0o755, &ME).unwrap();
    drop(b);
    assert_eq!(stored("at-the-end"), 1);
}

#[test]
fn a_small_file_is_one_commit_with_its_creation_and_a_big_one_commits_it_first() {
    let (_d, db, b) = setup();
    b.inner.stop_committer();
    let stored = |name: &str| count(&db, &format!("SELECT count(*) FROM dentries WHERE name = '{name}'"));
    let before = b.commits();
    put(&b, "small", &[1; 4096]);
    assert_eq!((b.commits() - before, stored("small")), (1, 1), "the creation went with the data");
    // More content than rides with held changes: they are committed on their own first, so
    // that a full disk meeting the content's commit cannot take them with it.
    let before = b.commits();
    b.mkdir("made-before", 0o755, &ME).unwrap();
    put(&b, "big", &pattern(1 << 20, 7));
    assert_eq!(b.commits() - before, 2);
    assert_eq!((stored("made-before"), stored("big")), (1, 1));
    assert_eq!(get(&b, "big"), pattern(1 << 20, 7));
}

/// A tmpfs of `mib` MiB mounted on a temporary directory (as root), detached when dropped.
struct SmallDisk(TempDir);

impl SmallDisk {
    fn new(mib: u64) -> SmallDisk {
        use nix::mount::{mount, MsFlags};
        let dir = tempfile::tempdir().unwrap();
        let size = format!("size={mib}m");
        mount(Some("tmpfs"), dir.path(), Some("tmpfs"), MsFlags::empty(), Some(size.as_str()))
            .expect("mounting a tmpfs (the tests run as root)");
        SmallDisk(dir)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.0.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

#[test]
fn a_change_once_room_ran_short_commits_the_held_ones_first() {
    let disk = SmallDisk::new(100);
    let db = disk.0.path().join("fs.db");
    let b = SqliteBackend::open(&db, "main").unwrap();
    b.inner.stop_committer();
    b.mkdir("held", 0o755, &ME).unwrap();
    assert!(b.inner.holding.load(std::sync::atomic::Ordering::Acquire), "held with 100 MiB free");
    // Another program leaves less room than a hold needs; the daemon's reading of the free
    // space is trusted for 100 ms.
    std::fs::write(disk.0.path().join("ballast"), vec![1u8; 50 << 20]).unwrap();
    thread::sleep(Duration::from_millis(150));
    // A change that could meet a full disk now must not be made in the held transaction (a
    // full disk makes SQLite end it, held changes included): they are committed first.
    let before = b.commits();
    b.mkdir("after", 0o755, &ME).unwrap();
    assert_eq!(b.commits() - before, 2);
    let stored = |name: &str| count(&db, &format!("SELECT count(*) FROM dentries WHERE name = '{name}'"));
    assert_eq!((stored("held"), stored("after")), (1, 1));
}

#[test]
fn a_file_shared_with_another_namespace_commits_each_change_at_once() {
    let (_d, db, a) = setup();
    let _other = SqliteBackend::open(&db, "other").unwrap();
    let before = a.commits();
    a.mkdir("x", 0o755, &ME).unwrap();
    // Committed before the call returned: another daemon waiting for SQLite's write lock
    // must not wait for a hold.
    assert_eq!(a.commits() - before, 1);
    assert_eq!(count(&db, "SELECT count(*) FROM dentries WHERE name = 'x'"), 1);
}

#[test]
fn a_hold_ends_within_its_limit_even_while_changes_keep_coming() {
    let (_d, db, b) = setup();
    let start = Instant::now();
    let mut first_commit = None;
    let mut i = 0;
    // Changes closer together than the quiet interval: only the limit ends the hold.
    while start.elapsed() < MAX_HOLD * 3 {
        b.mkdir(&format!("d{i}"), 0o755, &ME).unwrap();
        i += 1;
        if first_commit.is_none() && count(&db, "SELECT count(*) FROM dentries WHERE name = 'd0'") == 1 {
            first_commit = Some(start.elapsed());
        }
        thread::sleep(Duration::from_millis(2));
    }
    let first = first_commit.expect("nothing was committed in three holds");
    assert!(first <= MAX_HOLD + Duration::from_millis(150), "first commit after {first:?}");
}

const OTHER_STORE: &str = "AGENTVFS_SQLITE_OTHER_STORE";

/// Another daemon: claims namespace "other" of the store and waits to be killed.
#[test]
#[ignore = "run by another_process_on_the_file_makes_each_change_commit_at_once"]
fn other_daemon() {
    let Some(db) = std::env::var_os(OTHER_STORE) else { return };
    let _b = SqliteBackend::open(Path::new(&db), "other").unwrap();
    println!("claimed");
    thread::sleep(Duration::from_secs(60));
}

#[test]
fn another_process_on_the_file_makes_each_change_commit_at_once() {
    use std::io::BufRead;
    let (_d, db, b) = setup();
    let mut other = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "backend::sqlite::tests::held::other_daemon", "--ignored", "--nocapture"])
        .env(OTHER_STORE, &db)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let out = std::io::BufReader::new(other.stdout.take().unwrap());
    assert!(
        out.lines().map_while(Result::ok).any(|l| l.contains("claimed")),
        "the other daemon did not start"
    );
    let commits_for = |first: usize| {
        let before = b.commits();
        for i in first..first + 20 {
            b.mkdir(&format!("d{i}"), 0o755, &ME).unwrap();
        }
        b.commits() - before
    };
    assert_eq!(commits_for(0), 20, "held while another process writes the file");
    other.kill().unwrap();
    other.wait().unwrap();
    // Its claim went with it: changes are held again.
    assert!(commits_for(20) < 15, "changes are not held again");
}
