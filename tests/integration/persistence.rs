//! The sqlite route keeps its tree across remounts and across `kill -9` once data was
//! acknowledged (fsync or close returned), with the attribute changes made through the file,
//! and name changes once something made them durable or their hold ended.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::time::{Duration, UNIX_EPOCH};

use agentvfs::control::client::Client;
use serde_json::json;

use crate::harness::{call_tool, unmounted, Mount, Unmounted};

#[test]
fn sqlite_tree_survives_remount() {
    let Unmounted { scratch: s, config: cfg, .. } = unmounted("");
    let mnt = s.path().join("mnt");
    {
        let m = Mount::start(&cfg, &mnt);
        fs::create_dir_all(m.path("/db/notes/deep")).unwrap();
        fs::write(m.path("/db/notes/a.md"), "alpha").unwrap();
        fs::write(m.path("/db/notes/deep/b.bin"), vec![7u8; 200_000]).unwrap();
        symlink("a.md", m.path("/db/notes/link")).unwrap();
        fs::hard_link(m.path("/db/notes/a.md"), m.path("/db/notes/hard")).unwrap();
        fs::set_permissions(m.path("/db/notes/a.md"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::create_dir(m.path("/mem")).unwrap();
        fs::write(m.path("/mem/scratch"), "gone after restart").unwrap();
        m.stop();
    }
    let m = Mount::start(&cfg, &mnt);
    assert_eq!(fs::read_to_string(m.path("/db/notes/a.md")).unwrap(), "alpha");
    assert_eq!(fs::read(m.path("/db/notes/deep/b.bin")).unwrap(), vec![7u8; 200_000]);
    assert_eq!(fs::read_link(m.path("/db/notes/link")).unwrap().to_str(), Some("a.md"));
    let md = fs::metadata(m.path("/db/notes/a.md")).unwrap();
    assert_eq!((md.nlink(), md.mode() & 0o777), (2, 0o600));
    assert!(!m.path("/mem").exists(), "the memory route starts empty");
    m.stop();
}

#[test]
fn acknowledged_data_survives_kill_9() {
    let Unmounted { scratch: s, config: cfg, .. } = unmounted("");
    let mnt = s.path().join("mnt");
    {
        let mut m = Mount::start(&cfg, &mnt);
        let mut open_files = Vec::new();
        let mut f = fs::File::create(m.path("/db/synced")).unwrap();
        f.write_all(b"fsynced data").unwrap();
        f.sync_all().unwrap();
        fs::write(m.path("/db/closed"), "closed data").unwrap();
        // What an untar does: write, then fix times, owner and mode through the open file.
        // They are committed with the data when it closes, or when it is fsynced (the closed
        // file's data was fsynced before, so that its close has only those changes to commit).
        for (name, close) in [("untarred", true), ("untarred-synced", false)] {
            let f = fs::File::create(m.path(&format!("/db/{name}"))).unwrap();
            (&f).write_all(b"unpacked").unwrap();
            if close {
                f.sync_all().unwrap();
            }
            f.set_modified(UNIX_EPOCH + Duration::from_secs(1_234_567_890)).unwrap();
            std::os::unix::fs::fchown(&f, Some(4321), Some(8765)).unwrap();
            f.set_permissions(fs::Permissions::from_mode(0o4751)).unwrap();
            if close {
                drop(f);
            } else {
                f.sync_all().unwrap();
                open_files.push(f);
            }
        }
        // Name changes may be held for up to 0.2 s; each of these is followed by what makes it
        // durable at once: an fsync of its directory, the close of a file written after it,
        // a tool's report.
        fs::create_dir(m.path("/db/made")).unwrap();
        fs::rename(m.path("/db/closed"), m.path("/db/made/renamed")).unwrap();
        fs::File::open(m.path("/db/made")).unwrap().sync_all().unwrap();
        fs::create_dir(m.path("/db/later")).unwrap();
        fs::write(m.path("/db/later/written"), "written after").unwrap();
        fs::write(m.path("/db/by-tool"), "deleted by a tool").unwrap();
        // A change nothing follows is committed within the hold.
        fs::rename(m.path("/db/later/written"), m.path("/db/later/moved")).unwrap();
        std::thread::sleep(Duration::from_millis(400));
        let mut tools = Client::connect(&s.path().join("agentvfs.sock")).unwrap();
        let (ok, text) = call_tool(&mut tools, "delete", json!({"file_path": "/db/by-tool"}));
        assert!(ok, "{text}");
        // `f` stays open: the daemon dies with a handle outstanding.
        let status = m.stop_with(libc::SIGKILL);
        assert!(!status.success());
        drop((f, open_files));
        // The mount is dead now (ENOTCONN); the guard of the next start recovers it.
    }
    let m = Mount::start(&cfg, &mnt);
    assert_eq!(fs::read_to_string(m.path("/db/synced")).unwrap(), "fsynced data");
    assert_eq!(fs::read_to_string(m.path("/db/made/renamed")).unwrap(), "closed data");
    assert_eq!(fs::read_to_string(m.path("/db/later/moved")).unwrap(), "written after");
    assert!(!m.path("/db/by-tool").exists(), "the tool's delete was lost");
    assert!(!m.path("/db/closed").exists() && !m.path("/db/later/written").exists());
    for name in ["untarred", "untarred-synced"] {
        let md = fs::metadata(m.path(&format!("/db/{name}"))).unwrap();
        let got = (md.mode() & 0o7777, md.uid(), md.gid(), md.mtime(), md.len());
        assert_eq!(got, (0o4751, 4321, 8765, 1_234_567_890, 8), "{name}");
    }
    m.stop();
}

#[test]
fn the_daemon_keeps_its_hold_on_the_database_after_syncing_it() {
    let Unmounted { scratch: s, config: cfg, .. } = unmounted("");
    let m = Mount::start(&cfg, &s.path().join("mnt"));
    let db = s.path().join("store.db");
    let pid = m.child.as_ref().unwrap().id();
    // SQLite's locks on the database file, as /proc/locks shows the daemon's.
    let held = || {
        let ino = fs::metadata(&db).unwrap().ino();
        let locks = fs::read_to_string("/proc/locks").unwrap();
        locks
            .lines()
            .filter(|l| {
                l.contains(&format!(" {pid} "))
                    && l.split_whitespace().any(|f| f.ends_with(&format!(":{ino}")))
            })
            .count()
    };
    assert!(held() > 0, "SQLite holds its shared lock from the start");
    // The first fsync makes the database's file and directory entry durable.
    let mut f = fs::File::create(m.path("/db/synced")).unwrap();
    f.write_all(b"fsynced").unwrap();
    f.sync_all().unwrap();
    fs::File::open(m.path("/db")).unwrap().sync_all().unwrap();
    assert!(held() > 0, "the daemon's SQLite lock is still held after the sync");
    // Another process that reads the store and closes (an admin's `sqlite3`) must not take
    // the WAL the daemon writes for its own and delete it.
    let script = format!("import sqlite3; c = sqlite3.connect({:?}); c.execute('select count(*) from inodes').fetchall(); c.close()", db.display().to_string());
    let out = std::process::Command::new("python3").args(["-c", &script]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(s.path().join("store.db-wal").exists(), "the WAL was deleted under the daemon");
    fs::write(m.path("/db/after"), "after").unwrap();
    assert_eq!(fs::read_to_string(m.path("/db/synced")).unwrap(), "fsynced");
    drop(f);
    m.stop();
    let m = Mount::start(&cfg, &s.path().join("mnt"));
    assert_eq!(fs::read_to_string(m.path("/db/after")).unwrap(), "after");
    let out = std::process::Command::new("python3")
        .args(["-c", &format!("import sqlite3; print(sqlite3.connect({:?}).execute('pragma integrity_check').fetchone()[0])", db.display().to_string())])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
}
