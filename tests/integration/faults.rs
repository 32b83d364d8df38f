//! Faults told truthfully: a store the daemon cannot write, a full disk under the sqlite
//! route. What a program was told is stored is there after a restart; everything else failed
//! where the program could see it.

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::{scratch, sh, status_at, HostMount, Mount};

/// A config with `/` memory and `/db` → sqlite at `database` (`extra` lines in its route).
fn sqlite_config(dir: &Path, database: &Path, extra: &str) -> PathBuf {
    let text = format!(
        "socket = \"{}\"\n[default]\nbackend = \"memory\"\n[[routes]]\npath = \"/db\"\nbackend = \"sqlite\"\ndatabase = \"{}\"\n{extra}\n[audit]\ndatabase = \"{}\"\n",
        dir.join("agentvfs.sock").display(),
        database.display(),
        dir.join("audit.db").display()
    );
    let cfg = dir.join("agentvfs.toml");
    fs::write(&cfg, text).unwrap();
    cfg
}

/// Makes a file immutable (`chattr +i`) for as long as it lives, even when a test panics.
struct Immutable(PathBuf);

impl Immutable {
    fn new(path: &Path) -> Immutable {
        assert!(Command::new("chattr").arg("+i").arg(path).status().unwrap().success());
        Immutable(path.to_path_buf())
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
    }
}

/// A new store where none can be made, or a database path that is a directory, is refused
/// at start saying what is wrong, not SQLite's bare "unable to open database file".
#[test]
fn a_store_that_cannot_be_created_is_refused_saying_why() {
    let work = scratch();
    let locked = work.path().join("locked");
    fs::create_dir(&locked).unwrap();
    let _immutable = Immutable::new(&locked);
    let database = locked.join("store.db");
    let cfg = sqlite_config(work.path(), &database, "");
    let refused = Mount::try_start(&cfg, &work.path().join("mnt")).err().expect("refused at start");
    assert!(
        refused.contains(&format!(
            "sqlite database {}: cannot be created (Operation not permitted",
            database.display()
        )) && refused.contains("make its directory writable"),
        "{refused}"
    );
    let cfg = sqlite_config(work.path(), work.path(), "");
    let refused = Mount::try_start(&cfg, &work.path().join("mnt")).err().expect("refused at start");
    assert!(refused.contains("is not a regular file; set database to a file's path"), "{refused}");
}

#[test]
fn a_store_the_daemon_cannot_write_is_refused_at_start_or_served_read_only_on_purpose() {
    let work = scratch();
    let database = work.path().join("store.db");
    let cfg = sqlite_config(work.path(), &database, "");
    let mount = Mount::start(&cfg, &work.path().join("mnt"));
    fs::write(mount.path("/db/kept"), "stored\n").unwrap();
    mount.stop();
    let _immutable = Immutable::new(&database);
    let refused = Mount::try_start(&cfg, &work.path().join("mnt")).err().expect("refused at start");
    assert!(
        refused.contains(&format!(
            "sqlite database {}: cannot be written (Operation not permitted",
            database.display()
        )) && refused.contains("set read_only = true on its route"),
        "{refused}"
    );
    // Asked for on purpose, the same store is served read-only: changes answer EROFS at once.
    let cfg = sqlite_config(work.path(), &database, "read_only = true");
    let mount = Mount::start(&cfg, &work.path().join("mnt"));
    // The route lines follow the "mounted at" line the harness waits for.
    crate::harness::soon("the start says the route is read-only", || {
        mount.log_text().contains("(read-only: every change answers EROFS)")
    });
    assert_eq!(fs::read_to_string(mount.path("/db/kept")).unwrap(), "stored\n");
    for (what, result) in [
        ("append", fs::OpenOptions::new().append(true).open(mount.path("/db/kept")).map(|_| ())),
        ("create", fs::write(mount.path("/db/new"), "x")),
        ("mkdir", fs::create_dir(mount.path("/db/d"))),
        ("unlink", fs::remove_file(mount.path("/db/kept"))),
        (
            "chmod",
            fs::set_permissions(mount.path("/db/kept"), std::os::unix::fs::PermissionsExt::from_mode(0o600)),
        ),
    ] {
        assert_eq!(result.unwrap_err().raw_os_error(), Some(libc::EROFS), "{what}");
    }
    let (code, _, err) = sh(&mount.dir, "echo more >> db/kept");
    assert_ne!(code, 0, "the shell sees the refusal");
    assert!(err.contains("Read-only file system"), "{err}");
    assert_eq!(fs::read_to_string(mount.path("/db/kept")).unwrap(), "stored\n");
    let status = status_at(&work.path().join("agentvfs.sock"));
    let route = status["routes"].as_array().unwrap().iter().find(|r| r["path"] == "/db").unwrap().clone();
    assert_eq!(route["read_only"], true, "{status}");
    mount.stop();
}

/// Writes `content` to `path` in 64 KiB writes, then fsyncs and closes it. `Ok` only when
/// every step said so; the error otherwise, and at which step.
fn write_file(path: &Path, content: &[u8]) -> Result<(), (&'static str, std::io::Error)> {
    let mut file = fs::File::create(path).map_err(|e| ("open", e))?;
    for piece in content.chunks(64 << 10) {
        file.write_all(piece).map_err(|e| ("write", e))?;
    }
    file.sync_all().map_err(|e| ("fsync", e))?;
    let fd = std::os::fd::IntoRawFd::into_raw_fd(file);
    match unsafe { libc::close(fd) } {
        0 => Ok(()),
        _ => Err(("close", std::io::Error::last_os_error())),
    }
}

#[test]
fn a_full_disk_fails_the_write_that_fills_it_and_loses_nothing_acknowledged() {
    let work = scratch();
    let disk = HostMount::small_disk(&work.path().join("small"), 24);
    let database = disk.0.join("store.db");
    let cfg = sqlite_config(work.path(), &database, "");
    // Space an administrator can free later (a full disk is mended from outside the store:
    // the checkpoint that returns deleted content's space needs room of its own).
    let ballast = disk.0.join("ballast");
    fs::write(&ballast, vec![0u8; 6 << 20]).unwrap();
    let mut mount = Mount::start(&cfg, &work.path().join("mnt"));
    // A copy of many files into the route until the disk is full.
    let mut stored = Vec::new();
    let mut failures = Vec::new();
    for i in 0..40 {
        let content: Vec<u8> = (0..(1u32 << 20)).map(|b| (b.wrapping_mul(31) ^ i) as u8).collect();
        let path = mount.path(&format!("/db/f{i}"));
        match write_file(&path, &content) {
            Ok(()) => stored.push((path, content)),
            Err((step, e)) => failures.push((i, step, e.raw_os_error())),
        }
    }
    assert!(stored.len() >= 4, "some files fit: {failures:?}");
    assert!(!failures.is_empty(), "the disk filled up");
    // The program learns of the full disk with ENOSPC at a step it sees: a write, as a rule
    // (the daemon checks for room before it buffers), the creation of a file, or the fsync of a commit that met a disk
    // filled meanwhile; never only at close.
    for (i, step, errno) in &failures {
        assert!(
            matches!((*step, *errno), ("open" | "write" | "fsync", Some(libc::ENOSPC))),
            "file {i}: {step} {errno:?}"
        );
    }
    assert!(failures.iter().any(|(_, step, _)| *step == "write"), "{failures:?}");
    // A shell that ignores close's error: its write fails visibly, and the mount shows what
    // is stored, before and after a restart.
    let (code, _, err) = sh(&mount.dir, "head -c 8000000 /dev/zero > db/big");
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("No space left on device"), "{err}");
    let shown = fs::metadata(mount.path("/db/big")).map(|m| m.size()).ok();
    mount.stop_with(libc::SIGKILL);
    let mount = Mount::start(&cfg, &work.path().join("mnt"));
    assert_eq!(
        fs::metadata(mount.path("/db/big")).map(|m| m.size()).ok(),
        shown,
        "the view was what is stored"
    );
    for (path, content) in &stored {
        assert!(fs::read(path).unwrap() == *content, "{} lost after a restart", path.display());
    }
    // Once space is freed, deletions and writes succeed again.
    fs::remove_file(&ballast).unwrap();
    let _ = fs::remove_file(mount.path("/db/big"));
    for (path, _) in stored.iter().skip(2) {
        fs::remove_file(path).unwrap();
    }
    write_file(&mount.path("/db/after"), &[7u8; 1 << 20]).expect("room again");
    mount.stop();
}

/// Space taken by someone else between a program's writes and its close: the close fails,
/// the data is dropped with an error-level line naming the file, and the mount shows the file
/// as stored, not as written.
#[test]
fn data_that_cannot_be_stored_at_close_is_dropped_loudly_and_the_view_follows() {
    let work = scratch();
    let disk = HostMount::small_disk(&work.path().join("small"), 24);
    let database = disk.0.join("store.db");
    let cfg = sqlite_config(work.path(), &database, "");
    let mount = Mount::start(&cfg, &work.path().join("mnt"));
    fs::write(mount.path("/db/held"), "old\n").unwrap();
    // A program writes, another one fills the disk, then the first closes. All in one child
    // process that starts no other: a descriptor of the file inherited by any process (as the
    // processes other tests of this one start would inherit it from here) is closed at its
    // exec, which would commit the buffer first.
    let filler = disk.0.join("filler");
    let script = "import errno, os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC)
os.write(fd, b'n' * (4 << 20))
fill = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT, 0o644)
try:
    while os.write(fill, bytes(1 << 16)):
        pass
except OSError:
    pass
os.close(fill)
try:
    os.close(fd)
    print('closed')
except OSError as e:
    print(errno.errorcode[e.errno])
";
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(mount.path("/db/held"))
        .arg(&filler)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ENOSPC\n", "{}", String::from_utf8_lossy(&out.stderr));
    crate::harness::soon("the error is logged with the file's name", || {
        mount
            .log_text()
            .lines()
            .any(|l| l.contains("ERROR") && l.contains("/db/held") && l.contains("dropped"))
    });
    // The view is what is stored (the open's truncation was committed; the data was not),
    // before and after a restart.
    assert_eq!(fs::read_to_string(mount.path("/db/held")).unwrap(), "");
    fs::remove_file(&filler).unwrap();
    mount.stop();
    let mount = Mount::start(&cfg, &work.path().join("mnt"));
    assert_eq!(fs::read_to_string(mount.path("/db/held")).unwrap(), "");
    mount.stop();
}

/// A postgres server that cannot be reached at start stops the start with one clear error,
/// not a line promising EIO "until it is back" from a mount that never comes.
#[test]
fn a_postgres_server_unreachable_at_start_stops_the_start_clearly() {
    let work = scratch();
    let text = format!(
        "socket = \"{}\"\n[default]\nbackend = \"memory\"\n[[routes]]\npath = \"/pg\"\nbackend = \"postgres\"\nurl = \"host=127.0.0.1 port=1 user=nobody dbname=x\"\n[audit]\ndatabase = \"{}\"\n",
        work.path().join("agentvfs.sock").display(),
        work.path().join("audit.db").display()
    );
    let cfg = work.path().join("agentvfs.toml");
    fs::write(&cfg, text).unwrap();
    let refused = Mount::try_start(&cfg, &work.path().join("mnt")).err().expect("refused at start");
    assert!(
        refused.contains("cannot open postgres store nobody@127.0.0.1:1/x")
            && refused.contains("cannot reach nobody@127.0.0.1:1/x")
            && refused.contains("is the server running, and the url right?"),
        "{refused}"
    );
    assert!(!refused.contains("until it is back"), "{refused}");
}
