//! Several daemons on one namespace of the postgres route: each sees the others' changes
//! (names, listings, attributes, content, tool writes) within 100 ms by notification, with
//! the kernel's long cache lifetimes; concurrent writers and renames keep the tree whole; a
//! tool edit of a file changed elsewhere is stale; acknowledged writes survive `kill -9`.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agentvfs::control::client::Client;
use serde_json::json;

use crate::harness::{call_tool, config, scratch, within, Mount};

/// A daemon of its own (its scratch directory kept alive beside it), mounting `/pg` on
/// `namespace` of the test server.
pub struct Daemon {
    pub mount: Mount,
    pub scratch: tempfile::TempDir,
}

impl Daemon {
    pub fn start(namespace: &str) -> Daemon {
        Self::start_with(namespace, &crate::harness::pg().url())
    }

    /// Like [`Daemon::start`], on the server at `url`.
    pub fn start_with(namespace: &str, url: &str) -> Daemon {
        Self::start_configured(namespace, url, "")
    }

    /// Like [`Daemon::start_with`], with `keys` (TOML lines) added to the `/pg` route.
    pub fn start_configured(namespace: &str, url: &str, keys: &str) -> Daemon {
        let scratch = scratch();
        let host_root = scratch.path().join("host-root");
        fs::create_dir_all(&host_root).unwrap();
        let cfg = config(scratch.path(), &host_root, "");
        let own = scratch.path().file_name().unwrap().to_string_lossy().to_string();
        let text = fs::read_to_string(&cfg)
            .unwrap()
            .replace(&format!("namespace = \"{own}\""), &format!("namespace = \"{namespace}\"\n{keys}"))
            .replace(&crate::harness::pg().url(), url);
        fs::write(&cfg, text).unwrap();
        let mount = Mount::start(&cfg, &scratch.path().join("mnt"));
        Daemon { mount, scratch }
    }

    pub fn p(&self, rel: &str) -> PathBuf {
        self.mount.path(&format!("/pg/{}", rel.trim_start_matches('/')))
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.scratch.path().join("agentvfs.sock")).unwrap()
    }
}

/// A namespace no other test uses.
pub fn namespace(test: &str) -> String {
    format!("{test}-{}", std::process::id())
}

/// How long `check` took to hold (it must within 100 ms).
fn seen_within_100ms(what: &str, check: impl Fn() -> bool) -> Duration {
    let started = Instant::now();
    within(what, Duration::from_millis(100), check);
    started.elapsed()
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| format!("<{e}>"))
}

#[test]
fn changes_on_one_daemon_are_seen_on_another_within_100ms() {
    let ns = namespace("visible");
    let (a, b) = (Daemon::start(&ns), Daemon::start(&ns));
    // A looks first, so its kernel caches the answers (for an hour: the route's default).
    assert!(!a.p("f").exists());
    fs::create_dir(a.p("d")).unwrap();
    assert!(fs::read_dir(a.p("d")).unwrap().next().is_none());

    // A new name, and its content.
    fs::write(b.p("f"), "one").unwrap();
    let mut worst = seen_within_100ms("a new file", || read(&a.p("f")) == "one");
    // Content A has in its page cache changes.
    fs::write(b.p("f"), "two!").unwrap();
    worst = worst.max(seen_within_100ms("new content", || read(&a.p("f")) == "two!"));
    // A listing A has read.
    fs::write(b.p("d/x"), "").unwrap();
    worst = worst.max(seen_within_100ms("a listing", || {
        fs::read_dir(a.p("d")).unwrap().flatten().any(|e| e.file_name() == "x")
    }));
    // A name in a directory A made (so A knows every name in it without asking), and that
    // directory's link count and times, which A knows too and its kernel has cached.
    let before = fs::metadata(a.p("d")).unwrap();
    fs::create_dir(b.p("d/sub")).unwrap();
    worst = worst.max(seen_within_100ms("a new name in a known directory", || a.p("d/sub").is_dir()));
    worst = worst.max(seen_within_100ms("a directory's link count", || {
        fs::metadata(a.p("d"))
            .is_ok_and(|m| m.nlink() == before.nlink() + 1 && m.modified().ok() != before.modified().ok())
    }));
    // An attribute.
    fs::set_permissions(b.p("f"), fs::Permissions::from_mode(0o600)).unwrap();
    worst = worst.max(seen_within_100ms("a mode", || {
        fs::metadata(a.p("f")).is_ok_and(|m| m.permissions().mode() & 0o777 == 0o600)
    }));
    // A rename and a deletion.
    fs::rename(b.p("f"), b.p("d/g")).unwrap();
    worst = worst.max(seen_within_100ms("a rename", || !a.p("f").exists() && read(&a.p("d/g")) == "two!"));
    // A file A has just read (so A knows the inode its name leads to), replaced on B by a
    // rename over it: A's next open reads the new file.
    fs::write(b.p("d/g.new"), "three").unwrap();
    fs::rename(b.p("d/g.new"), b.p("d/g")).unwrap();
    worst = worst.max(seen_within_100ms("a file replaced", || read(&a.p("d/g")) == "three"));
    // A change of the new file's mode on A, which A's door judges by the node its name leads to
    // now (not the one it led to before), reaches B.
    fs::set_permissions(a.p("d/g"), fs::Permissions::from_mode(0o640)).unwrap();
    worst = worst.max(seen_within_100ms("a mode set on the replacement", || {
        fs::metadata(b.p("d/g")).is_ok_and(|m| m.permissions().mode() & 0o777 == 0o640)
    }));
    // A write through a descriptor opened before its file was renamed (on the writing
    // daemon): B, which read the file by its new name, sees the write.
    let mut writer = fs::OpenOptions::new().write(true).create(true).truncate(true).open(a.p("d/h")).unwrap();
    writer.write_all(b"old").unwrap();
    fs::rename(a.p("d/h"), a.p("d/moved")).unwrap();
    within("the renamed file on B", Duration::from_secs(5), || {
        read(&b.p("d/moved")) == "old" && fs::metadata(b.p("d/moved")).is_ok_and(|m| m.len() == 3)
    });
    writer.write_all(b" and new").unwrap();
    worst = worst.max(seen_within_100ms("a write after a rename", || {
        fs::metadata(b.p("d/moved")).is_ok_and(|m| m.len() == 11) && read(&b.p("d/moved")) == "old and new"
    }));
    drop(writer);
    fs::remove_file(b.p("d/x")).unwrap();
    worst = worst.max(seen_within_100ms("a deletion", || !a.p("d/x").exists()));
    // A tool write on B (the other door).
    let mut client = b.client();
    let (ok, text) =
        call_tool(&mut client, "write_file", json!({"file_path": "/pg/tool.txt", "content": "by tool"}));
    assert!(ok, "{text}");
    worst = worst.max(seen_within_100ms("a tool write", || read(&a.p("tool.txt")) == "by tool"));
    // And the other way round.
    fs::write(a.p("back"), "from a").unwrap();
    worst = worst.max(seen_within_100ms("a change from A on B", || read(&b.p("back")) == "from a"));
    eprintln!("slowest change seen on the other daemon after {worst:?}");
}

#[test]
fn a_tool_edit_of_a_file_changed_on_another_daemon_is_stale() {
    let ns = namespace("stale");
    let (a, b) = (Daemon::start(&ns), Daemon::start(&ns));
    fs::write(a.p("notes.md"), "alpha\n").unwrap();
    let mut client = a.client();
    let (ok, text) = call_tool(&mut client, "read_file", json!({"file_path": "/pg/notes.md"}));
    assert!(ok && text.contains("alpha"), "{text}");
    std::thread::sleep(Duration::from_millis(5));
    fs::write(b.p("notes.md"), "alpha beta\n").unwrap();
    let params = json!({"name": "edit_file", "arguments":
        {"file_path": "/pg/notes.md", "old_string": "alpha", "new_string": "gamma"}});
    let result = client.call("tools/call", Some(params)).unwrap();
    assert_eq!(result["structuredContent"]["error_code"], "FS_STALE_VERSION", "{result}");
    assert_eq!(read(&b.p("notes.md")), "alpha beta\n");
}

#[test]
fn concurrent_writers_on_two_daemons_keep_the_tree_whole() {
    let ns = namespace("concurrent");
    let (a, b) = (Daemon::start(&ns), Daemon::start(&ns));
    fs::create_dir(a.p("shared")).unwrap();
    fs::create_dir(a.p("x")).unwrap();
    fs::create_dir(a.p("y")).unwrap();
    let run = |d: &Daemon, tag: &'static str, other: (&'static str, &'static str)| {
        let root = d.p("");
        std::thread::spawn(move || {
            for i in 0..60 {
                let tmp = root.join(format!("{tag}{i}.tmp"));
                fs::write(&tmp, format!("{tag} {i}\n").repeat(100)).unwrap();
                fs::rename(&tmp, root.join(format!("shared/{tag}{i}"))).unwrap();
                // Crossed directory moves: at most one of each pair can succeed, never a cycle.
                let _ = fs::rename(root.join(other.0), root.join(other.1).join(other.0));
                let _ = fs::rename(root.join(other.1).join(other.0), root.join(other.0));
            }
        })
    };
    let ta = run(&a, "a", ("x", "y"));
    let tb = run(&b, "b", ("y", "x"));
    ta.join().unwrap();
    tb.join().unwrap();
    for d in [&a, &b] {
        let mut names: Vec<String> = fs::read_dir(d.p("shared"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names.len(), 120, "{names:?}");
        for name in &names {
            let (tag, i) = name.split_at(1);
            let want = format!("{tag} {i}\n").repeat(100);
            within("content seen", Duration::from_secs(1), || read(&d.p(&format!("shared/{name}"))) == want);
        }
        // x and y: both at the top, or one inside the other, never both inside each other.
        let top: Vec<bool> = ["x", "y"].iter().map(|n| d.p(n).is_dir()).collect();
        assert!(top.iter().any(|t| *t), "x and y both vanished from the top: a cycle");
        assert!(!(d.p("x/y").is_dir() && d.p("y/x").is_dir()));
    }
}

#[test]
fn kill_9_loses_nothing_acknowledged() {
    let ns = namespace("kill9");
    let mut a = Daemon::start(&ns);
    fs::write(a.p("closed.txt"), "closed before the kill").unwrap();
    let mut f = fs::File::create(a.p("open.txt")).unwrap();
    std::io::Write::write_all(&mut f, b"written, never closed").unwrap();
    f.sync_all().unwrap();
    // What the tools reported, in a directory the daemon knows (where, alone, it answers
    // name changes before they reach the server: a tool's success waits for them).
    fs::create_dir(a.p("k")).unwrap();
    fs::write(a.p("k/deleted.txt"), "deleted by a tool").unwrap();
    wait_until_unlinks_wait(&a, "k");
    let mut client = a.client();
    let (ok, text) =
        call_tool(&mut client, "write_file", json!({"file_path": "/pg/k/tool.txt", "content": "by a tool"}));
    assert!(ok, "{text}");
    let (ok, text) = call_tool(&mut client, "delete", json!({"file_path": "/pg/k/deleted.txt"}));
    assert!(ok, "{text}");
    a.mount.stop_with(libc::SIGKILL);
    let b = Daemon::start(&ns);
    assert_eq!(read(&b.p("closed.txt")), "closed before the kill");
    assert_eq!(read(&b.p("open.txt")), "written, never closed");
    assert_eq!(read(&b.p("k/tool.txt")), "by a tool");
    assert!(!b.p("k/deleted.txt").exists());
}

/// Waits until the daemon of `d`, alone on its namespace, keeps an unlink in `dir` from the
/// server for a moment (in its journal, sent within a poll of its listener).
fn wait_until_unlinks_wait(d: &Daemon, dir: &str) {
    wait_until_unlinks_wait_in(&d.p(dir));
}

/// [`wait_until_unlinks_wait`] in the directory `dir` of a postgres route's mount.
fn wait_until_unlinks_wait_in(dir: &Path) {
    wait_until_unlinks_wait_on(dir, &crate::harness::pg().url());
}

/// [`wait_until_unlinks_wait_in`] for a mount of the server at `url`.
pub fn wait_until_unlinks_wait_on(dir: &Path, url: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for k in 0.. {
        let name = format!("probe-{}-{k}", std::process::id());
        fs::write(dir.join(&name), "x").unwrap();
        fs::remove_file(dir.join(&name)).unwrap();
        if stored_names_on(url, &name) == 1 {
            return;
        }
        assert!(Instant::now() < deadline, "the lone daemon journals its unlinks");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How many names `name` the test server's store holds (in any namespace).
fn stored_names(name: &str) -> i64 {
    stored_names_on(&crate::harness::pg().url(), name)
}

/// [`stored_names`] on the server at `url`.
fn stored_names_on(url: &str, name: &str) -> i64 {
    let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
    c.query_one("SELECT count(*) FROM agentvfs.dentries WHERE name = $1", &[&name]).unwrap().get(0)
}

/// A daemon alone on its namespace keeps a new file in itself until its close (a draft): one
/// that mounts the namespace meanwhile still reads it whole, and what the first writes next
/// reaches it by notification. The file is held open by a process of its own: a close of an
/// inherited descriptor (this process spawning the second daemon) is a close of the file too.
#[test]
fn a_file_still_open_on_a_lone_daemon_is_seen_whole_by_one_that_joins() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let ns = namespace("draft-join");
    let a = Daemon::start(&ns);
    fs::create_dir(a.p("d")).unwrap();
    let name = format!("draft-{}", std::process::id());
    let path = a.p(&format!("d/{name}"));
    // Writes, says so, then writes again for every line it reads, and closes at the end.
    let holder = "import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
os.write(fd, b'written alone')
print('written', flush=True)
for line in sys.stdin:
    os.write(fd, line.rstrip('\\n').encode())
    print('written', flush=True)
";
    // The daemon goes quiet (and makes drafts) a moment after it starts: until a new file,
    // written and held open, is not on the server.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut child = loop {
        let mut child = Command::new("python3")
            .args(["-c", holder])
            .arg(&path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut said = String::new();
        BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut said).unwrap();
        assert_eq!(said, "written\n");
        if stored_names(&name) == 0 {
            break child;
        }
        drop(child.stdin.take());
        child.wait().unwrap();
        fs::remove_file(&path).unwrap();
        assert!(Instant::now() < deadline, "the lone daemon made a draft");
        std::thread::sleep(Duration::from_millis(100));
    };

    let b = Daemon::start(&ns);
    assert_eq!(stored_names(&name), 1, "the join stored it");
    assert_eq!(read(&b.p(&format!("d/{name}"))), "written alone");
    writeln!(child.stdin.as_mut().unwrap(), ", then not").unwrap();
    let mut said = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut said).unwrap();
    seen_within_100ms("the next write", || read(&b.p(&format!("d/{name}"))) == "written alone, then not");
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    assert_eq!(fs::metadata(b.p(&format!("d/{name}"))).unwrap().len(), 23);
}

/// A command of the `execute` tool that renames a file, on a daemon that journals its name
/// changes: the tool reports only once the rename is on the server, so a `kill -9` right
/// after it keeps it.
#[test]
fn a_rename_by_an_execute_command_survives_kill_9_once_the_tool_answered() {
    let mut f =
        crate::harness::Fixture::new("\n[exec]\nenabled = true\ncwd = \"/pg/k\"\ntimeout_seconds = 30\n");
    let ns = f.scratch.path().file_name().unwrap().to_string_lossy().to_string();
    let dir = f.mount.path("/pg/k");
    fs::create_dir(&dir).unwrap();
    // The sandbox runs as nobody; the kernel checks modes on the mount.
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    fs::write(dir.join("a.txt"), "renamed by a command").unwrap();
    wait_until_unlinks_wait_in(&dir);
    let mut client = Client::connect(&f.scratch.path().join("agentvfs.sock")).unwrap();
    let (ok, text) = call_tool(&mut client, "execute", json!({"command": "mv a.txt b.txt"}));
    assert!(ok, "{text}");
    f.mount.stop_with(libc::SIGKILL);
    let b = Daemon::start(&ns);
    assert_eq!(read(&b.p("k/b.txt")), "renamed by a command");
    assert!(!b.p("k/a.txt").exists());
}

/// Small writes into a file already stored, on a daemon alone on its namespace, wait in the
/// daemon until the descriptor's close (`held_writes`): meanwhile another process reads them
/// through the mount, and once the close returned a `kill -9` loses none of them. The writes
/// are random pieces, some overlapping, some across chunks and past the end.
#[test]
fn small_writes_into_a_stored_file_survive_kill_9_once_closed() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let ns = namespace("held-writes");
    let mut a = Daemon::start(&ns);
    fs::create_dir(a.p("w")).unwrap();
    wait_until_unlinks_wait(&a, "w");
    let name = format!("held-{}", std::process::id());
    let path = a.p(&format!("w/{name}"));
    fs::write(&path, vec![b'.'; 200_000]).unwrap();
    let model = a.scratch.path().join("model");
    // Writes 500 pieces, says so, writes 500 more when told, closes, and leaves what the
    // file must hold beside it.
    let writer = "import os, random, sys
fd = os.open(sys.argv[1], os.O_RDWR)
model = bytearray(os.pread(fd, 1 << 20, 0))
rnd = random.Random(19)
def writes(n):
    for _ in range(n):
        off, data = rnd.randrange(0, 300_000), rnd.randbytes(rnd.randrange(1, 5000))
        os.pwrite(fd, data, off)
        model.extend(bytes(max(0, off + len(data) - len(model))))
        model[off:off + len(data)] = data
writes(500)
open(sys.argv[2], 'wb').write(model)
print('half', flush=True)
sys.stdin.readline()
writes(500)
os.close(fd)
open(sys.argv[2], 'wb').write(model)
print('closed', flush=True)
";
    let mut child = Command::new("python3")
        .args(["-c", writer])
        .arg(&path)
        .arg(&model)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut said = String::new();
    out.read_line(&mut said).unwrap();
    assert_eq!(said, "half\n");
    assert_eq!(stored_size(&name), 200_000, "the writes wait in the daemon");
    let half = fs::read(&model).unwrap();
    assert!(half.len() > 200_000);
    assert_eq!(fs::metadata(&path).unwrap().len(), half.len() as u64);
    assert!(fs::read(&path).unwrap() == half, "another process reads what was written");
    writeln!(child.stdin.as_mut().unwrap()).unwrap();
    said.clear();
    out.read_line(&mut said).unwrap();
    assert_eq!(said, "closed\n");
    assert!(child.wait().unwrap().success());
    a.mount.stop_with(libc::SIGKILL);
    let b = Daemon::start(&ns);
    assert!(fs::read(b.p(&format!("w/{name}"))).unwrap() == fs::read(&model).unwrap(), "all that was closed");
}

/// The size the test server's store holds for the file named `name` (in any namespace).
fn stored_size(name: &str) -> i64 {
    let mut c = postgres::Client::connect(&crate::harness::pg().url(), postgres::NoTls).unwrap();
    let row = c.query_one(
        "SELECT i.size FROM agentvfs.dentries d JOIN agentvfs.inodes i ON i.ino = d.child WHERE d.name = $1",
        &[&name],
    );
    row.unwrap().get(0)
}

/// Two daemons appending to one file at once through `O_APPEND` descriptors (a log both
/// write to): each kernel puts an append at the end it has cached, which the other daemon's
/// appends have passed, and the daemon writes at the end as stored instead, so every line
/// lands once, whole, and both mounts then show the file's whole size. On each daemon one
/// writer opens the file for every line, another keeps one descriptor for all of its lines.
#[test]
fn appends_through_two_daemons_at_once_lose_no_line() {
    let ns = namespace("appends");
    let (a, b) = (Daemon::start(&ns), Daemon::start(&ns));
    fs::write(a.p("log"), "").unwrap();
    within("the file, on the other daemon", Duration::from_secs(1), || b.p("log").exists());
    const LINES: usize = 150;
    let line = |tag: &str, i: usize| format!("{tag} {i:05} {}\n", ".".repeat(45 - tag.len()));
    let writer = |path: PathBuf, tag: &'static str, reopen: bool| {
        std::thread::spawn(move || {
            let open = || fs::OpenOptions::new().append(true).open(&path).unwrap();
            let mut kept = open();
            for i in 0..LINES {
                if reopen {
                    kept = open();
                }
                kept.write_all(line(tag, i).as_bytes()).unwrap();
            }
        })
    };
    let writers = [
        writer(a.p("log"), "A", true),
        writer(a.p("log"), "AK", false),
        writer(b.p("log"), "B", true),
        writer(b.p("log"), "BK", false),
    ];
    for w in writers {
        w.join().unwrap();
    }
    let mut want: Vec<String> =
        ["A", "AK", "B", "BK"].iter().flat_map(|t| (0..LINES).map(move |i| line(t, i))).collect();
    want.sort();
    let size: u64 = want.iter().map(|l| l.len() as u64).sum();
    for (d, name) in [(&a, "A"), (&b, "B")] {
        // The other daemon's last appends arrive by notification, within milliseconds.
        let deadline = Instant::now() + Duration::from_secs(1);
        while fs::metadata(d.p("log")).unwrap().len() != size && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let text = read(&d.p("log"));
        let mut got: Vec<String> = text.split_inclusive('\n').map(str::to_string).collect();
        got.sort();
        let missing = want.iter().filter(|l| got.binary_search(l).is_err()).count();
        assert!(got == want, "through {name}: {} lines of {}, {missing} missing", got.len(), want.len());
        assert_eq!(fs::metadata(d.p("log")).unwrap().len(), size, "the size through {name}");
    }
}
