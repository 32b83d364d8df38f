//! Changes made on the host, behind the daemon's back, show through the mount at once even
//! though the kernel may cache host-route names, attributes and listings for an hour.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

// `soon` waits 3 s at most, far below the hour the kernel may cache.
use crate::harness::{open_files, soon, Fixture};

/// A fresh directory under the host route's root: its host path and its path through the
/// mount.
fn work_dir(fx: &Fixture) -> (PathBuf, PathBuf) {
    let host = fx.host_root.join("dir");
    fs::create_dir(&host).unwrap();
    (host, fx.p("/host/dir"))
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

#[test]
fn host_side_changes_reach_cached_names_attributes_and_listings() {
    // The host route caches for an hour here, whatever the default is.
    let fx = Fixture::with_config("", |text| {
        assert!(text.contains("backend = \"host\"\n"));
        text.replacen("backend = \"host\"\n", "backend = \"host\"\ncache_ttl_seconds = 3600\n", 1)
    });

    let (host, mnt) = work_dir(&fx);
    fs::write(host.join("a.txt"), "one").unwrap();
    fs::write(host.join("gone.txt"), "x").unwrap();
    // Cache everything: the listing, the names, the attributes.
    for _ in 0..2 {
        assert_eq!(names(&mnt), ["a.txt", "gone.txt"]);
        assert_eq!(fs::metadata(mnt.join("a.txt")).unwrap().len(), 3);
    }

    fs::write(host.join("a.txt"), "one, two").unwrap();
    soon("a new size", || fs::metadata(mnt.join("a.txt")).unwrap().len() == 8);
    fs::set_permissions(host.join("a.txt"), fs::Permissions::from_mode(0o600)).unwrap();
    soon("a new mode", || fs::metadata(mnt.join("a.txt")).unwrap().permissions().mode() & 0o777 == 0o600);
    // A directory's own attributes (fanotify names the directory itself, with the name ".").
    assert_eq!(fs::metadata(&mnt).unwrap().permissions().mode() & 0o777, 0o755);
    fs::set_permissions(&host, fs::Permissions::from_mode(0o750)).unwrap();
    soon("a directory's new mode", || fs::metadata(&mnt).unwrap().permissions().mode() & 0o777 == 0o750);
    // A name the kernel was told is absent.
    assert!(!mnt.join("new.txt").exists() && !mnt.join("new.txt").exists());
    fs::write(host.join("new.txt"), "n").unwrap();
    soon("a new file", || mnt.join("new.txt").exists());
    soon("a new file in the listing", || names(&mnt).contains(&"new.txt".to_string()));
    fs::remove_file(host.join("gone.txt")).unwrap();
    soon("a removed file gone", || {
        !mnt.join("gone.txt").exists() && !names(&mnt).contains(&"gone.txt".into())
    });
    fs::rename(host.join("new.txt"), host.join("renamed.txt")).unwrap();
    soon("a rename", || names(&mnt) == ["a.txt", "renamed.txt"]);
    fs::rename(&host, fx.host_root.join("moved")).unwrap();
    soon("a moved directory", || !mnt.exists() && names(&fx.p("/host/moved")) == ["a.txt", "renamed.txt"]);
}

/// Two host routes on one filesystem: events under the second root reach its own route.
#[test]
fn a_second_host_route_on_the_same_filesystem_is_watched_too() {
    let fx = Fixture::with_config("", |text| {
        let root = text.split("root = \"").nth(1).unwrap().split('"').next().unwrap().to_string();
        let second = format!("{root}-second");
        fs::create_dir_all(&second).unwrap();
        format!("{text}\n[[routes]]\npath = \"/second\"\nbackend = \"host\"\nroot = \"{second}\"\ncache_ttl_seconds = 3600\n")
    });
    let host = fx.host_root.with_file_name("host-root-second");
    let mnt = fx.p("/second");
    fs::write(host.join("a.txt"), "one").unwrap();
    for _ in 0..2 {
        assert_eq!(names(&mnt), ["a.txt"]);
    }
    fs::write(host.join("b.txt"), "two").unwrap();
    soon("a new file under the second root", || names(&mnt) == ["a.txt", "b.txt"]);
}

/// Nested roots: one host file seen through two routes. A change through either view of the
/// mount, or on the host, reaches the other view's cached listing.
#[test]
fn nested_host_roots_see_each_others_changes() {
    let fx = Fixture::with_config("", |text| {
        let root = text.split("root = \"").nth(1).unwrap().split('"').next().unwrap().to_string();
        fs::create_dir_all(format!("{root}/sub")).unwrap();
        let text = text.replacen("backend = \"host\"\n", "backend = \"host\"\ncache_ttl_seconds = 3600\n", 1);
        format!("{text}\n[[routes]]\npath = \"/inner\"\nbackend = \"host\"\nroot = \"{root}/sub\"\ncache_ttl_seconds = 3600\n")
    });
    let (outer, inner) = (fx.p("/host/sub"), fx.p("/inner"));
    fs::write(fx.host_root.join("sub/a.txt"), "a").unwrap();
    for _ in 0..2 {
        assert_eq!(names(&outer), ["a.txt"]);
        assert_eq!(names(&inner), ["a.txt"]);
    }
    assert!(!inner.join("b.txt").exists() && !inner.join("b.txt").exists());
    fs::write(outer.join("b.txt"), "through the outer route").unwrap();
    soon("a file made through the outer route, in the inner one", || inner.join("b.txt").exists());
    soon("... and in its listing", || names(&inner) == ["a.txt", "b.txt"]);
    assert_eq!(fs::read_to_string(inner.join("b.txt")).unwrap(), "through the outer route");
    fs::remove_file(inner.join("a.txt")).unwrap();
    soon("a file removed through the inner route, in the outer one", || names(&outer) == ["b.txt"]);
    fs::write(fx.host_root.join("sub/c.txt"), "host").unwrap();
    soon("a host-made file, in both", || {
        names(&outer) == ["b.txt", "c.txt"] && names(&inner) == ["b.txt", "c.txt"]
    });
}

/// One of the counters `status` shows: `fuse_lookups` (names the kernel asked the daemon
/// for) or `fuse_listings` (listings the daemon took for the kernel), since the start.
fn counter(fx: &Fixture, name: &str) -> u64 {
    crate::harness::status(fx)["counters"][name].as_u64().unwrap()
}

/// A fixture whose host route caches names for an hour (as the kernel may then keep
/// listings too).
fn long_lived_host() -> Fixture {
    Fixture::with_config("", |text| {
        text.replacen("backend = \"host\"\n", "backend = \"host\"\ncache_ttl_seconds = 3600\n", 1)
    })
}

/// What the caches save, counted: a missing name is asked for once, and a file written through
/// the mount keeps its cached name although the watcher hears of the write.
#[test]
fn cached_names_stay_cached() {
    let fx = long_lived_host();
    fs::create_dir(fx.p("/host/d")).unwrap();
    for dir in ["/host/d", "/mem"] {
        let missing = fx.p(&format!("{dir}/missing"));
        let before = counter(&fx, "fuse_lookups");
        for _ in 0..3 {
            assert!(!missing.exists());
        }
        assert_eq!(counter(&fx, "fuse_lookups") - before, 1, "{dir}: one lookup for three probes");
    }
    let written = fx.p("/host/d/written");
    fs::write(&written, "through the mount").unwrap();
    // Let the watcher see the write (it reads events every 5 ms).
    std::thread::sleep(Duration::from_millis(200));
    let before = counter(&fx, "fuse_lookups");
    assert_eq!(fs::metadata(&written).unwrap().len(), 17);
    assert_eq!(counter(&fx, "fuse_lookups") - before, 0, "the written file's name was invalidated");
}

/// Reads through passthrough (files larger than `[fuse] cached_reads_max_kb`) make the kernel
/// distrust the files' attributes, so a directory most of whose files were read is listed
/// afresh once (one request refreshes every entry); that listing is cached again, so the
/// listing after it asks the daemon for nothing. One file read in five is left to its own
/// `stat`.
#[test]
fn a_directory_listed_afresh_after_reads_is_cached_again() {
    let fx = long_lived_host();
    let dir = fx.p("/host/listed");
    fs::create_dir(&dir).unwrap();
    // Larger than the page cache's files, so read through backing files.
    let write = |i: usize| {
        let mut f = fs::File::create(dir.join(format!("f{i}"))).unwrap();
        f.write_all(format!("file {i}").as_bytes()).unwrap();
        f.set_len(2 << 20).unwrap();
    };
    let read_one = |i: usize| {
        let mut head = [0u8; 6];
        fs::File::open(dir.join(format!("f{i}"))).unwrap().read_exact_at(&mut head, 0).unwrap();
        assert_eq!(head, format!("file {i}").as_bytes());
    };
    (0..5).for_each(write);
    let names = || {
        let mut names: Vec<String> =
            fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names
    };
    let expected: Vec<String> = (0..5).map(|i| format!("f{i}")).collect();
    assert_eq!(names(), expected);
    let before = counter(&fx, "fuse_listings");
    assert_eq!(names(), expected);
    assert_eq!(counter(&fx, "fuse_listings") - before, 0, "a listing the kernel keeps");
    (0..5).for_each(read_one);
    // The kernel releases the files shortly after their close.
    soon("the files read are released", || open_files(&fx) == 0);
    let before = counter(&fx, "fuse_listings");
    assert_eq!(names(), expected);
    assert_eq!(counter(&fx, "fuse_listings") - before, 1, "listed afresh after its files were read");
    assert_eq!(fs::metadata(dir.join("f3")).unwrap().len(), 2 << 20);
    assert_eq!(names(), expected);
    assert_eq!(counter(&fx, "fuse_listings") - before, 1, "the fresh listing was kept");
    let read = |files: &[usize]| {
        files.iter().copied().for_each(read_one);
        soon("the files read are released", || open_files(&fx) == 0);
    };
    // Written, so that the read moves its atime (relatime).
    write(0);
    std::thread::sleep(Duration::from_millis(20));
    read(&[0]);
    let before = counter(&fx, "fuse_listings");
    assert_eq!(names(), expected);
    assert_eq!(counter(&fx, "fuse_listings") - before, 0, "one file read in five: no listing");
    let on_host = fs::metadata(fx.host_root.join("listed/f0")).unwrap();
    let through_mount = fs::metadata(dir.join("f0")).unwrap();
    assert_eq!(
        (through_mount.atime(), through_mount.atime_nsec()),
        (on_host.atime(), on_host.atime_nsec()),
        "the read file's own attributes are asked for"
    );
    read(&[1, 2, 3]);
    assert_eq!(names(), expected);
    assert_eq!(counter(&fx, "fuse_listings") - before, 1, "three in five: listed afresh");
}

fn host_change_events(fx: &Fixture) -> u64 {
    crate::harness::status(fx)["counters"]["host_change_events"].as_u64().expect("host routes are watched")
}

/// The inode numbers (hex, as fdinfo shows them) that the daemon's fanotify group has ignore
/// marks on.
fn ignore_marked_inodes(pid: u64) -> Vec<String> {
    for fd in fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        let fd = fd.unwrap();
        if !fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy() == "anon_inode:[fanotify]") {
            continue;
        }
        let info =
            fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", fd.file_name().to_string_lossy())).unwrap();
        let field = |line: &str, key: &str| {
            line.split_whitespace().find_map(|f| f.strip_prefix(key)).map(str::to_string)
        };
        return info
            .lines()
            .filter(|l| field(l, "ignored_mask:").is_some_and(|m| m != "0"))
            .filter_map(|l| field(l, "ino:"))
            .collect();
    }
    panic!("the daemon has no fanotify group")
}

/// The sqlite route's database shares a filesystem with the host route here, as it does by
/// default (both under the user's home): its writes must not flood the watcher's queue with
/// events the daemon would only skip as its own. The kernel drops them for files with an
/// ignore mark. (Counting events would not tell: every test in parallel writes on this
/// filesystem.)
#[test]
fn the_sqlite_routes_own_files_raise_no_host_change_events() {
    let fx = Fixture::new("");
    let before = host_change_events(&fx);
    for i in 0..50 {
        fs::write(fx.p(&format!("/db/note{i}")), "x").unwrap();
    }
    let marked = ignore_marked_inodes(crate::harness::status(&fx)["pid"].as_u64().unwrap());
    for file in ["store.db", "store.db-wal", "store.db-shm"] {
        let ino = fs::metadata(fx.scratch.path().join(file)).unwrap().ino();
        assert!(marked.contains(&format!("{ino:x}")), "{file} (inode {ino:x}) not in {marked:?}");
    }
    // The daemon's own host-route writes are read (and skipped as its own).
    for i in 0..300 {
        fs::write(fx.p(&format!("/host/note{i}")), "x").unwrap();
    }
    soon("the host route's own events", || host_change_events(&fx) - before >= 300);
}

/// A database kept inside a host root (here under `state/`, with the audit log) is left out
/// of that route: read raw it would show every namespace, around the rules of the sqlite
/// route, and written it would be corrupted under SQLite's feet.
#[test]
fn the_daemons_own_databases_inside_a_host_root_are_left_out() {
    let fx = Fixture::with_config("", |text| {
        text.replacen("store.db\"", "host-root/state/store.db\"", 1).replacen(
            "audit.db\"",
            "host-root/state/audit.db\"",
            1,
        )
    });
    let state = fx.host_root.join("state");
    fs::write(fx.p("/db/note"), "kept").unwrap();
    fs::write(state.join("mine.txt"), "visible").unwrap();
    assert!(state.join("store.db").exists() && state.join("audit.db").exists());
    let log = fx.mount.log_text();
    assert!(log.contains("the database of /db (") && log.contains("the audit log ("), "{log}");

    let shown = fx.p("/host/state");
    assert_eq!(names(&shown), ["mine.txt"]);
    for file in ["store.db", "store.db-wal", "store.db-shm", "store.db-lock", "audit.db"] {
        let err = |r: std::io::Result<()>| r.map_err(|e| e.raw_os_error());
        assert_eq!(err(fs::metadata(shown.join(file)).map(|_| ())), Err(Some(libc::ENOENT)), "{file}");
        assert_eq!(err(fs::read(shown.join(file)).map(|_| ())), Err(Some(libc::ENOENT)), "{file}");
        assert_eq!(err(fs::remove_file(shown.join(file))), Err(Some(libc::ENOENT)), "{file}");
        assert_eq!(err(fs::write(shown.join(file), "x")), Err(Some(libc::EACCES)), "{file}");
    }
    // Moving or removing the directory would take the databases along.
    let moved = fs::rename(&shown, fx.p("/host/moved")).map_err(|e| e.raw_os_error());
    assert_eq!(moved, Err(Some(libc::EBUSY)));
    assert!(std::process::Command::new("rm").arg("-rf").arg(&shown).status().unwrap().code() != Some(0));
    assert!(state.join("store.db").exists() && !state.join("mine.txt").exists());
    assert_eq!(fs::read_to_string(fx.p("/db/note")).unwrap(), "kept");

    // The standard layout keeps them outside, and gets no warning.
    let fx = Fixture::new("");
    assert!(!fx.mount.log_text().contains("lies inside the host root"));
}

/// Right after a program on the host deletes a file, before the watcher has told the kernel,
/// the kernel still holds the old name. Creating the file again through that name works: the
/// daemon answers ESTALE for the stale name and the kernel looks the name up again.
#[test]
fn a_file_the_host_just_deleted_can_be_created_again_at_once() {
    let fx = Fixture::new("");
    let (host, mnt) = work_dir(&fx);
    for i in 0..30 {
        let name = format!("deleted{i}");
        fs::write(mnt.join(&name), "old").unwrap(); // a write makes the kernel ask for attributes
                                                    // Until the kernel releases the written file, the daemon answers the kernel's questions
                                                    // about it from that open file (a `stat` through the stale name would see it).
        soon("the written file released", || open_files(&fx) == 0);
        fs::remove_file(host.join(&name)).unwrap();
        let stat = fs::metadata(mnt.join(&name)).map_err(|e| e.raw_os_error());
        assert_eq!(stat.err(), Some(Some(libc::ENOENT)), "{name}");
        fs::OpenOptions::new().write(true).create(true).truncate(false).open(mnt.join(&name)).unwrap();
        assert_eq!(fs::metadata(host.join(&name)).unwrap().len(), 0, "{name}");
    }
}

/// A program on the host replaces a file by renaming a new one over it (what editors and
/// `git checkout` do) while the file is open through the mount, and the file is read again
/// right after, before the watcher's invalidation may have arrived. The new read gets the new
/// file, never an error, and the open descriptor keeps the old one, content and attributes:
/// the kernel's cached name still leads to the old inode, whose name the daemon finds stale.
#[test]
fn a_file_the_host_just_replaced_reads_anew_at_once() {
    use std::os::unix::fs::FileExt;
    let fx = Fixture::new("");
    let (host, mnt) = work_dir(&fx);
    // Each version has another size, which attributes cached for the old file would betray.
    let version = |i: usize| format!("version {i}{}", ".".repeat(i));
    fs::write(host.join("file"), version(0)).unwrap();
    for i in 1..30 {
        let held = fs::File::open(mnt.join("file")).unwrap();
        assert_eq!(fs::read_to_string(mnt.join("file")).unwrap(), version(i - 1), "round {i}");
        fs::write(host.join("tmp"), version(i)).unwrap();
        fs::rename(host.join("tmp"), host.join("file")).unwrap();
        let read = fs::read_to_string(mnt.join("file")).map_err(|e| e.raw_os_error());
        assert_eq!(read, Ok(version(i)), "round {i}");
        let size = fs::metadata(mnt.join("file")).map(|m| m.len()).map_err(|e| e.raw_os_error());
        assert_eq!(size, Ok(version(i).len() as u64), "round {i}");
        let mut old = vec![0; 200];
        let n = held.read_at(&mut old, 0).unwrap();
        assert_eq!(&old[..n], version(i - 1).as_bytes(), "round {i}");
        assert_eq!(held.metadata().unwrap().len(), version(i - 1).len() as u64, "round {i}");
        assert_eq!(held.metadata().unwrap().nlink(), 0, "round {i}");
    }
}

/// A file open through the mount that a host program renames: the kernel's name for it goes
/// stale, and once the new name is looked up the open file is reached only through its
/// descriptor. Its attributes must still follow the host file (a write by the host under the
/// new name, then its deletion), not stay as the kernel cached them an hour long.
#[test]
fn an_open_file_the_host_renames_keeps_fresh_attributes() {
    let fx = Fixture::new("");
    let (host, mnt) = work_dir(&fx);
    let held = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(mnt.join("a"))
        .unwrap();
    assert_eq!(held.metadata().unwrap().len(), 0);
    fs::rename(host.join("a"), host.join("e")).unwrap();
    soon("the new name", || mnt.join("e").exists() && !mnt.join("a").exists());
    assert_eq!(held.metadata().unwrap().len(), 0);
    fs::write(host.join("e"), "xyz").unwrap();
    soon("the host's write, through the open descriptor", || held.metadata().unwrap().len() == 3);
    fs::remove_file(host.join("e")).unwrap();
    soon("the host's deletion, through the open descriptor", || held.metadata().unwrap().nlink() == 0);
}

/// A file open through the mount that a host program renames: a write through the open
/// descriptor shows at once in `stat` of the new name, and a write through the new name in
/// `fstat` of the descriptor. The kernel knows the file by two inodes then (it may still reach
/// the old one by its stale name, which must fail), and kept the new one's attributes, showing
/// the old size until the host watch caught up.
#[test]
fn a_file_the_host_renames_while_open_shows_its_writes_under_its_new_name() {
    let fx = Fixture::new("");
    let (host, mnt) = work_dir(&fx);
    for i in 0..20 {
        let (old, new) = (format!("old{i}"), format!("new{i}"));
        fs::write(mnt.join(&old), vec![b'x'; 8928]).unwrap();
        let held = fs::OpenOptions::new().read(true).write(true).open(mnt.join(&old)).unwrap();
        let mut some = [0u8; 100];
        held.read_at(&mut some, 6000).unwrap();
        fs::rename(host.join(&old), host.join(&new)).unwrap();
        soon("the new name", || mnt.join(&new).exists() && !mnt.join(&old).exists());
        held.write_at(&[b'c'; 845], 11188).unwrap();
        assert_eq!(fs::metadata(mnt.join(&new)).unwrap().len(), 12033, "{new}");
        let other = fs::OpenOptions::new().write(true).open(mnt.join(&new)).unwrap();
        other.write_at(b"tail", 12033).unwrap();
        assert_eq!(held.metadata().unwrap().len(), 12037, "{new}");
        assert_eq!(fs::read(mnt.join(&new)).unwrap().len(), 12037, "{new}");
    }
}

/// A directory that a host program moves away while a file in it is open through the mount,
/// and replaces with a new one: the new directory is another inode to the kernel, so the old
/// one's names (kept by the open file) do not come back under it. They did, for as long as the
/// kernel caches names: the new directory took the old one's inode.
#[test]
fn a_directory_the_host_replaces_while_a_file_in_it_is_open_shows_only_its_own_names() {
    let fx = Fixture::new("");
    let (host, mnt) = work_dir(&fx);
    for i in 0..10 {
        let (d, e) = (format!("d{i}"), format!("e{i}"));
        fs::create_dir(host.join(&d)).unwrap();
        fs::write(host.join(&d).join("f"), "held").unwrap();
        soon("the first directory's file", || mnt.join(&d).join("f").exists());
        let held = fs::File::open(mnt.join(&d).join("f")).unwrap();
        fs::rename(host.join(&d), host.join(&e)).unwrap();
        fs::create_dir(host.join(&d)).unwrap();
        fs::write(host.join(&d).join("g"), "new").unwrap();
        soon("each name where the host put it", || {
            !mnt.join(&d).join("f").exists()
                && mnt.join(&d).join("g").exists()
                && mnt.join(&e).join("f").exists()
        });
        assert_eq!(std::io::read_to_string(&held).unwrap(), "held", "{d}");
    }
}

/// A file open through the mount that a host program replaces by renaming another file over
/// it: when the name is looked up again (before the host watch reports the rename; `O_EXCL`
/// makes the kernel ask at once), the open file loses it, and its descriptor reports what ext4
/// reports, a link count of 0.
#[test]
fn an_open_file_the_host_replaces_reports_no_links() {
    let fx = Fixture::new("");
    let (host, mnt) = work_dir(&fx);
    for i in 0..20 {
        let name = format!("f{i}");
        let held =
            fs::OpenOptions::new().write(true).create(true).truncate(false).open(mnt.join(&name)).unwrap();
        fs::write(host.join("tmp"), "new").unwrap();
        fs::rename(host.join("tmp"), host.join(&name)).unwrap();
        let exclusive = fs::OpenOptions::new().write(true).create_new(true).open(mnt.join(&name));
        assert_eq!(exclusive.map_err(|e| e.raw_os_error()).err(), Some(Some(libc::EEXIST)), "{name}");
        assert_eq!(held.metadata().unwrap().nlink(), 0, "{name}");
        assert_eq!(fs::metadata(mnt.join(&name)).unwrap().len(), 3, "{name}");
    }
}

/// Right after a host program renames a file away, every call on the old name through the
/// mount agrees on what it leads to now, even before the host watch has told the kernel: the
/// new name's lookup takes the file from the kernel's old name, and the daemon then answers
/// ESTALE for that name, which the kernel looks up again. With nothing there, `stat` and
/// `link` say ENOENT (not EEXIST, which `link` said when the kernel still held the name); with
/// a new file the host put there, `open` reaches it.
#[test]
fn a_name_the_host_renamed_away_leads_where_the_host_says() {
    let fx = Fixture::new("");
    let (host, mnt) = work_dir(&fx);
    for i in 0..40 {
        let (old, new) = (format!("old{i}"), format!("new{i}"));
        fs::write(mnt.join(&old), "first").unwrap();
        soon("the written file released", || open_files(&fx) == 0);
        assert!(mnt.join(&old).exists());
        fs::rename(host.join(&old), host.join(&new)).unwrap();
        let anew = i % 2 == 1;
        if anew {
            fs::write(host.join(&old), "second").unwrap();
        }
        assert!(fs::symlink_metadata(mnt.join(&new)).is_ok(), "{new}");
        if anew {
            let read = fs::read_to_string(mnt.join(&old)).map_err(|e| e.raw_os_error());
            assert_eq!(read, Ok("second".to_string()), "{old}");
        } else {
            let stat = fs::symlink_metadata(mnt.join(&old)).map_err(|e| e.raw_os_error());
            assert_eq!(stat.err(), Some(Some(libc::ENOENT)), "{old}");
            // `link` looks the old name up before the new one, which exists.
            let link = fs::hard_link(mnt.join(&old), mnt.join(&new)).map_err(|e| e.raw_os_error());
            assert_eq!(link.err(), Some(Some(libc::ENOENT)), "{old}");
        }
    }
}

/// As above while a process holds the old file open through the mount: the daemon can then
/// answer the kernel's permission check for the old inode from that descriptor, and it is the
/// `open` itself that must send the kernel back to look the name up again.
#[test]
fn a_name_the_host_replaced_opens_the_new_file_while_the_old_one_is_held_open() {
    let fx = Fixture::new("");
    let (host, mnt) = work_dir(&fx);
    for i in 0..20 {
        let (old, new) = (format!("old{i}"), format!("new{i}"));
        fs::write(mnt.join(&old), "first").unwrap();
        let held = fs::File::open(mnt.join(&old)).unwrap();
        fs::rename(host.join(&old), host.join(&new)).unwrap();
        fs::write(host.join(&old), "second").unwrap();
        assert!(fs::symlink_metadata(mnt.join(&new)).is_ok(), "{new}");
        let read = fs::read_to_string(mnt.join(&old)).map_err(|e| e.raw_os_error());
        assert_eq!(read, Ok("second".to_string()), "{old}");
        assert_eq!(std::io::read_to_string(&held).unwrap(), "first", "{old}");
    }
}

/// A file a host program moved into a denied directory while it was open read-only through the
/// mount: its descriptor may not change the file's mode, owner or times there (the change was
/// judged under the name it no longer has). A file with no name left anywhere may be changed
/// through any descriptor.
#[test]
fn a_read_only_descriptor_cannot_change_a_file_the_host_moved_under_a_deny_rule() {
    let fx = Fixture::new(
        "[[rules]]\noperations = [\"read\", \"write\"]\npaths = [\"/host/secret\", \"/host/secret/**\"]\nmode = \"deny\"\n",
    );
    let (host, mnt) = work_dir(&fx);
    fs::create_dir(fx.host_root.join("secret")).unwrap();
    fs::write(host.join("doc"), "d").unwrap();
    fs::set_permissions(host.join("doc"), fs::Permissions::from_mode(0o644)).unwrap();
    let held = fs::File::open(mnt.join("doc")).unwrap();
    let moved = fx.host_root.join("secret/doc");
    fs::rename(host.join("doc"), &moved).unwrap();
    soon("the host's move", || !mnt.join("doc").exists());
    let fd = std::os::fd::AsRawFd::as_raw_fd(&held);
    let chmod = nix::sys::stat::fchmod(fd, nix::sys::stat::Mode::from_bits_truncate(0o666));
    assert_eq!(chmod, Err(nix::errno::Errno::ESTALE));
    let magic = format!("/proc/self/fd/{fd}");
    let chmod = fs::set_permissions(&magic, fs::Permissions::from_mode(0o600)).unwrap_err();
    assert_eq!(chmod.raw_os_error(), Some(libc::ESTALE), "{chmod}");
    let chown = nix::unistd::fchown(fd, Some(nix::unistd::Uid::from_raw(1000)), None);
    assert_eq!(chown, Err(nix::errno::Errno::ESTALE));
    let times = nix::sys::stat::futimens(
        fd,
        &nix::sys::time::TimeSpec::new(0, 0),
        &nix::sys::time::TimeSpec::new(0, 0),
    );
    assert_eq!(times, Err(nix::errno::Errno::ESTALE));
    let meta = fs::metadata(&moved).unwrap();
    assert_eq!((meta.mode() & 0o7777, meta.uid(), meta.mtime() != 0), (0o644, 0, true));
    drop(held);

    // Deleted on the host while held: no name is left, and any descriptor reaches it.
    fs::write(host.join("gone"), "g").unwrap();
    let held = fs::File::open(mnt.join("gone")).unwrap();
    fs::remove_file(host.join("gone")).unwrap();
    soon("the host's deletion", || !mnt.join("gone").exists());
    let fd = std::os::fd::AsRawFd::as_raw_fd(&held);
    nix::sys::stat::fchmod(fd, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    assert_eq!(held.metadata().unwrap().mode() & 0o7777, 0o600);
}

/// Unmounts its mounts when dropped, even when the test panics (lazily if busy).
struct Mounted(Vec<PathBuf>);

impl Mounted {
    fn tmpfs(&mut self, at: &Path) {
        fs::create_dir_all(at).unwrap();
        let status =
            std::process::Command::new("mount").args(["-t", "tmpfs", "nested"]).arg(at).status().unwrap();
        assert!(status.success());
        self.0.push(at.to_path_buf());
    }

    /// Unmounts the top mount at `at` (mounts may be stacked there).
    fn unmount(&mut self, at: &Path) {
        assert!(std::process::Command::new("umount").arg(at).status().unwrap().success());
        let top = self.0.iter().rposition(|p| p == at).expect("mounted here");
        self.0.remove(top);
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        for at in self.0.iter().rev() {
            let _ = std::process::Command::new("umount").arg("-l").arg(at).status();
        }
    }
}

/// A filesystem mounted beneath the host root, before the daemon starts or while it runs, is
/// watched too: changes made there on the host show through the mount at once, although the
/// kernel may cache the route's names and attributes for an hour.
#[test]
fn changes_in_a_filesystem_mounted_beneath_the_host_root_show_at_once() {
    let crate::harness::Unmounted { scratch, host_root, config } = crate::harness::unmounted("");
    // Declared after the scratch directory, so dropped (and unmounted) before it is removed.
    let mut mounted = Mounted(Vec::new());
    let text = fs::read_to_string(&config).unwrap();
    fs::write(
        &config,
        text.replacen("backend = \"host\"\n", "backend = \"host\"\ncache_ttl_seconds = 3600\n", 1),
    )
    .unwrap();
    mounted.tmpfs(&host_root.join("early"));
    let mount = crate::harness::Mount::start(&config, &scratch.path().join("mnt"));
    mounted.tmpfs(&host_root.join("late"));
    let late_seen = || names(&mount.path("/host/late")).is_empty();
    fs::write(host_root.join("late/probe"), "").unwrap();
    soon("the filesystem mounted while the daemon runs", || !late_seen());
    for dir in ["early", "late"] {
        let host = host_root.join(dir);
        let mnt = mount.path(&format!("/host/{dir}"));
        fs::write(host.join("a.txt"), "one").unwrap();
        fs::write(host.join("gone.txt"), "x").unwrap();
        soon("the new files", || names(&mnt).contains(&"gone.txt".to_string()));
        // Cache everything: the listing, the names, the attributes, the content.
        for _ in 0..2 {
            assert_eq!(fs::metadata(mnt.join("a.txt")).unwrap().len(), 3);
            assert_eq!(fs::read_to_string(mnt.join("a.txt")).unwrap(), "one");
            assert!(!mnt.join("new.txt").exists());
        }
        fs::write(host.join("a.txt"), "one, two").unwrap();
        soon("a new size", || fs::metadata(mnt.join("a.txt")).unwrap().len() == 8);
        assert_eq!(fs::read_to_string(mnt.join("a.txt")).unwrap(), "one, two", "{dir}");
        fs::write(host.join("new.txt"), "n").unwrap();
        soon("a new file", || mnt.join("new.txt").exists());
        fs::remove_file(host.join("gone.txt")).unwrap();
        soon("a removed file gone", || {
            !mnt.join("gone.txt").exists() && !names(&mnt).contains(&"gone.txt".into())
        });
    }
    // Another filesystem mounted on top of a watched one: it is watched in its place, and
    // unmounted, the one beneath shows again.
    let early = mount.path("/host/early");
    assert!(!early.join("b.txt").exists());
    mounted.tmpfs(&host_root.join("early"));
    soon("the filesystem on top", || names(&early).is_empty());
    fs::write(host_root.join("early/b.txt"), "b").unwrap();
    soon("a new file on top", || early.join("b.txt").exists());
    mounted.unmount(&host_root.join("early"));
    soon("the filesystem beneath again", || names(&early) == ["a.txt", "new.txt"]);
    // Unmounted while the daemon runs: the directory beneath shows again.
    mounted.unmount(&host_root.join("late"));
    soon("the directory under the unmounted filesystem", || names(&mount.path("/host/late")).is_empty());
    assert!(!mount.log_text().contains("cannot be watched"), "{}", mount.log_text());
    mount.stop();
}
