//! The two doors agree: the same operation on the same path, through the mount (syscalls)
//! and through the tool API (the socket), gets the same decision and the same outcome, and
//! what one door changes the other sees at once.

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

use agentvfs::control::client::Client;
use serde_json::{json, Value};

use crate::harness::{call_tool, sh, Fixture};

const RULES: &str = r#"
[[rules]]
operations = ["read"]
paths = ["/host/pub/**"]
mode = "allow"

[[rules]]
operations = ["read", "write"]
paths = ["/host/secret/**", "/**/.env"]
mode = "deny"

[[rules]]
operations = ["write"]
paths = ["/host/ro/**"]
mode = "deny"

[[rules]]
operations = ["read"]
paths = ["/host/closed/**"]
mode = "deny"
hide = false
"#;

struct Doors {
    fx: Fixture,
    client: Client,
}

impl Doors {
    fn new() -> Doors {
        let fx = Fixture::new(RULES);
        for dir in ["secret", "pub", "ro", "closed", "open"] {
            fs::create_dir_all(fx.host_root.join(dir)).unwrap();
        }
        for (file, body) in [
            ("secret/key", "KEY\n"),
            (".env", "TOKEN=1\n"),
            ("open/.env", "TOKEN=2\n"),
            ("pub/a.txt", "public needle\n"),
            ("ro/file.txt", "read only needle\n"),
            ("closed/c.txt", "closed needle\n"),
            ("open/b.txt", "open needle\n"),
        ] {
            fs::write(fx.host_root.join(file), body).unwrap();
        }
        let client = Client::connect(&fx.scratch.path().join("agentvfs.sock")).unwrap();
        Doors { fx, client }
    }

    fn tool(&mut self, name: &str, arguments: Value) -> (bool, String) {
        call_tool(&mut self.client, name, arguments)
    }

    /// Through the mount: Ok(content) or Err(errno).
    fn mount_read(&self, path: &str) -> Result<String, i32> {
        fs::read_to_string(self.fx.p(path)).map_err(|e| e.raw_os_error().unwrap_or(-1))
    }

    fn mount_write(&self, path: &str, body: &str) -> Result<(), i32> {
        fs::write(self.fx.p(path), body).map_err(|e| e.raw_os_error().unwrap_or(-1))
    }
}

#[test]
fn reads_are_decided_alike() {
    let mut d = Doors::new();
    for (path, allowed) in [
        ("/host/pub/a.txt", true),
        ("/host/open/b.txt", true),
        ("/host/ro/file.txt", true),
        ("/host/secret/key", false),
        ("/host/.env", false),
        ("/host/open/.env", false),
        ("/host/closed/c.txt", false),
    ] {
        let mount = d.mount_read(path);
        let (ok, text) = d.tool("read_file", json!({"file_path": path}));
        assert_eq!(mount.is_ok(), allowed, "mount {path}: {mount:?}");
        assert_eq!(ok, allowed, "tool {path}: {text}");
        if allowed {
            let body = mount.unwrap();
            assert!(text.ends_with(body.trim_end()), "{path}: {text:?} vs {body:?}");
        } else {
            assert_eq!(text, format!("Error: permission denied for read on {path}"));
        }
    }
}

#[test]
fn writes_are_decided_alike_and_each_door_sees_the_other() {
    let mut d = Doors::new();
    for (path, allowed) in [
        ("/host/open/new1.txt", true),
        ("/host/ro/new1.txt", false),
        ("/host/secret/new1.txt", false),
        ("/host/open/.env", false),
        ("/db/new1.txt", true),
        ("/mem/new1.txt", true),
    ] {
        let mount = d.mount_write(path, "from the mount\n");
        let tool_path = path.replace("new1", "new2");
        let (ok, text) = d.tool("write_file", json!({"file_path": tool_path, "content": "from the tool\n"}));
        assert_eq!(mount.is_ok(), allowed, "mount {path}: {mount:?}");
        assert_eq!(ok, allowed, "tool {tool_path}: {text}");
        if allowed {
            assert_eq!(text, format!("Updated file {tool_path}"));
            assert_eq!(d.mount_read(&tool_path).unwrap(), "from the tool\n");
            let (_, read_back) = d.tool("read_file", json!({"file_path": path}));
            assert_eq!(read_back, "@@ lines 1-1 of 1 @@\nfrom the mount");
        } else {
            assert_eq!(text, format!("Error: permission denied for write on {tool_path}"));
            assert!(!d.fx.p(&tool_path).exists() || tool_path.ends_with(".env"));
        }
    }
    assert_eq!(d.mount_read("/host/ro/file.txt").unwrap(), "read only needle\n");
}

#[test]
fn tool_edits_show_through_the_kernel_cache_at_once() {
    let mut d = Doors::new();
    // The memory and sqlite routes let the kernel cache entries and data for an hour: a
    // change made through the tools must be invalidated, not waited out.
    let listing = |d: &Doors, path: &str| -> Vec<String> {
        let dir = d.fx.p(path.rsplit_once('/').unwrap().0);
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names
    };
    for path in ["/mem/cached.txt", "/db/cached.txt", "/host/open/cached.txt"] {
        // A listing the kernel keeps (memory and sqlite) must learn about tool-made files.
        let before = listing(&d, path);
        assert_eq!(listing(&d, path), before);
        // The kernel may also keep the name's absence.
        let new = d.fx.p(&format!("{path}.new"));
        assert!(!new.exists() && !new.exists());
        let (ok, text) = d.tool("write_file", json!({"file_path": format!("{path}.new"), "content": "x"}));
        assert!(ok, "{text}");
        assert!(new.exists(), "{path}.new");
        assert!(listing(&d, path).contains(&"cached.txt.new".to_string()), "{path}");
        let (ok, text) = d.tool("delete", json!({"file_path": format!("{path}.new")}));
        assert!(ok, "{text}");
        assert_eq!(listing(&d, path), before, "{path}");

        d.mount_write(path, "version one\n").unwrap();
        assert_eq!(d.mount_read(path).unwrap_or_else(|e| panic!("{path}: errno {e}")), "version one\n");
        let (ok, text) = d.tool("read_file", json!({"file_path": path}));
        assert!(ok, "{text}");
        let (ok, text) =
            d.tool("edit_file", json!({"file_path": path, "old_string": "one", "new_string": "two, longer"}));
        assert!(ok, "{text}");
        assert_eq!(d.mount_read(path).unwrap(), "version two, longer\n", "{path}");
        let (ok, text) = d.tool("delete", json!({"file_path": path}));
        assert!(ok, "{text}");
        assert_eq!(d.mount_read(path), Err(libc::ENOENT), "{path}");
    }
    // The other way round: a change through the mount is what the next tool read sees, and a
    // session that read the old version is told to re-read.
    d.mount_write("/mem/shared.txt", "a\n").unwrap();
    let (ok, _) = d.tool("read_file", json!({"file_path": "/mem/shared.txt"}));
    assert!(ok);
    d.mount_write("/mem/shared.txt", "b, from a shell\n").unwrap();
    let (ok, text) =
        d.tool("edit_file", json!({"file_path": "/mem/shared.txt", "old_string": "b", "new_string": "c"}));
    assert!(!ok);
    assert_eq!(text, "Error: '/mem/shared.txt' changed since it was read; re-read the file, then retry");
}

#[test]
fn listings_and_searches_agree() {
    let mut d = Doors::new();
    for dir in ["/host", "/host/open", "/host/pub"] {
        let mut names: Vec<String> = fs::read_dir(d.fx.p(dir))
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let name = format!("{dir}/{}", e.file_name().into_string().unwrap());
                if e.file_type().unwrap().is_dir() {
                    name + "/"
                } else {
                    name
                }
            })
            .collect();
        names.sort();
        let (ok, text) = d.tool("ls", json!({"path": dir}));
        assert!(ok, "{text}");
        let expected = format!("[{}]", names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", "));
        assert_eq!(text, expected, "{dir}");
    }
    // grep through the tool finds what grep -rl through the mount finds.
    let (_, found, _) = sh(&d.fx.mount.dir, "grep -rl needle host 2>/dev/null | sort");
    let through_mount: Vec<String> = found.lines().map(|l| format!("/{l}")).collect();
    let (ok, text) = d.tool("grep", json!({"pattern": "needle", "path": "/host/open"}));
    assert!(ok, "{text}");
    assert_eq!(text, "/host/open/b.txt");
    assert!(through_mount.contains(&"/host/open/b.txt".to_string()), "{through_mount:?}");
    assert!(!through_mount.iter().any(|p| p.contains("secret") || p.contains(".env")), "{through_mount:?}");
    // Deleting through either door is refused alike under a write rule.
    let (ok, text) = d.tool("delete", json!({"file_path": "/host/ro/file.txt"}));
    assert!(!ok);
    assert_eq!(
        text,
        "Error: permission denied for write on /host/ro/file.txt (matches deny rule(s): /host/ro/**)"
    );
    assert_eq!(fs::remove_file(d.fx.p("/host/ro/file.txt")).unwrap_err().raw_os_error(), Some(libc::EACCES));
}

/// A file a tool deletes while a shell holds it open can still be `fstat`ed.
#[test]
fn a_file_deleted_by_a_tool_while_open_can_be_fstated() {
    let mut d = Doors::new();
    d.mount_write("/host/open/held", "held\n").unwrap();
    let held = fs::File::open(d.fx.p("/host/open/held")).unwrap();
    let (ok, text) = d.tool("delete", json!({"file_path": "/host/open/held"}));
    assert!(ok, "{text}");
    assert_eq!(d.mount_read("/host/open/held"), Err(libc::ENOENT));
    assert_eq!(held.metadata().map(|m| m.len()).map_err(|e| e.raw_os_error()), Ok(5));
}

/// A tool replaces a file whole (a new file renamed over the name) while the mount holds
/// the old one open: `fstat` and `fchmod` of the old descriptor reach the old file, not the
/// one that has the name now. On every route.
#[test]
fn a_file_a_tool_replaced_while_open_keeps_its_own_attributes() {
    use std::os::unix::fs::PermissionsExt;
    let mut d = Doors::new();
    for dir in ["/host/open", "/db", "/mem"] {
        let path = format!("{dir}/replaced");
        d.mount_write(&path, "old file\n").unwrap();
        let held = fs::File::open(d.fx.p(&path)).unwrap();
        let (ok, text) = d.tool("write_file", json!({"file_path": path, "content": "the new one\n"}));
        assert!(ok, "{text}");
        // fchmod first: before anything else made the door look at the name again.
        held.set_permissions(fs::Permissions::from_mode(0o600)).unwrap();
        let old = held.metadata().unwrap();
        assert_eq!((old.len(), old.mode() & 0o777), (9, 0o600), "{path}: fstat of the old file");
        let now = fs::metadata(d.fx.p(&path)).unwrap();
        assert_eq!((now.len(), now.mode() & 0o777), (12, 0o644), "{path}: the new file is untouched");
        assert_eq!(d.mount_read(&path).unwrap(), "the new one\n");
    }
}

/// A tool deletes one name of a hard-linked file (the name the mount learned first): the
/// name the mount made elsewhere still opens the file.
#[test]
fn a_hard_link_outlives_the_name_a_tool_deleted() {
    let mut d = Doors::new();
    for dir in ["/host/open", "/db", "/mem"] {
        let (ok, text) =
            d.tool("write_file", json!({"file_path": format!("{dir}/sub/first"), "content": "one\n"}));
        assert!(ok, "{text}");
        fs::hard_link(d.fx.p(&format!("{dir}/sub/first")), d.fx.p(&format!("{dir}/second"))).unwrap();
        let (ok, text) = d.tool("delete", json!({"file_path": format!("{dir}/sub/first")}));
        assert!(ok, "{text}");
        let second = format!("{dir}/second");
        assert_eq!(d.mount_read(&second), Ok("one\n".to_string()), "{second}");
        d.mount_write(&second, "two\n").unwrap();
        assert_eq!(fs::metadata(d.fx.p(&second)).unwrap().nlink(), 1, "{second}");
        let (ok, text) = d.tool("read_file", json!({"file_path": second}));
        assert!(ok && text.ends_with("two"), "{text}");
    }
}

/// Host filesystems reuse a deleted file's inode number. A file a host program deletes while
/// the kernel still holds its inode (here through an inotify watch, which keeps no host file
/// open) must not lend its name to a later file that gets its number: the new file is an inode
/// of its own, reached by its own name. A file a tool deletes is held by the daemon for as
/// long as the kernel keeps its inode (so its number is not reused meanwhile); every other
/// round deletes through the tools, and the new file must be itself there too.
#[test]
fn a_deleted_file_lends_nothing_to_its_successor() {
    let mut d = Doors::new();
    let watches = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
    assert!(watches >= 0);
    let watches = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(watches) };
    let mut reused = 0;
    for i in 0..40 {
        let old = format!("/host/open/old{i}");
        d.mount_write(&old, "old\n").unwrap();
        let old_host_ino = fs::metadata(d.fx.host_root.join(format!("open/old{i}"))).unwrap().ino();
        let c = std::ffi::CString::new(d.fx.p(&old).into_os_string().into_encoded_bytes()).unwrap();
        let watch = unsafe { libc::inotify_add_watch(watches.as_raw_fd(), c.as_ptr(), libc::IN_ATTRIB) };
        assert!(watch >= 0, "{}", std::io::Error::last_os_error());
        if i % 2 == 0 {
            fs::remove_file(d.fx.host_root.join(format!("open/old{i}"))).unwrap();
        } else {
            let (ok, text) = d.tool("delete", json!({"file_path": old}));
            assert!(ok, "{text}");
        }
        let new = format!("/host/open/new-{i}");
        d.mount_write(&new, "new\n").unwrap();
        if fs::metadata(d.fx.host_root.join(format!("open/new-{i}"))).unwrap().ino() == old_host_ino {
            reused += 1;
        }
        assert_eq!(d.mount_read(&new), Ok("new\n".to_string()), "{new}");
        let (ok, text) = d.tool("read_file", json!({"file_path": new}));
        assert!(ok && text.ends_with("new"), "{text}");
        assert_eq!(d.mount_read(&old), Err(libc::ENOENT), "{old}");
    }
    assert!(reused > 0, "the host filesystem never reused an inode number: nothing was tested");
}

/// A tool write is judged as a write of its path alone, as a shell's `>` is (its temporary
/// file is the daemon's own), and it leaves ownership as the file's owner would: a replaced
/// file keeps its owner, and new files and directories get their directory's owner.
#[test]
fn a_tool_write_is_a_write_of_its_path_that_keeps_owners() {
    use std::os::unix::fs::chown;
    let fx = Fixture::new(
        r#"
[[rules]]
operations = ["write"]
paths = ["/host/only/notes.md"]
mode = "allow"

[[rules]]
operations = ["write"]
paths = ["/host/only/**"]
mode = "deny"
"#,
    );
    let (only, mine) = (fx.host_root.join("only"), fx.host_root.join("mine"));
    fs::create_dir(&only).unwrap();
    fs::create_dir(&mine).unwrap();
    fs::write(only.join("notes.md"), "one\n").unwrap();
    chown(only.join("notes.md"), Some(1001), Some(1002)).unwrap();
    chown(&mine, Some(1000), Some(1003)).unwrap();
    let mut client = Client::connect(&fx.scratch.path().join("agentvfs.sock")).unwrap();

    // The shell's door and the tools' agree on what may be written.
    fs::write(fx.p("/host/only/notes.md"), "two\n").unwrap();
    let refused = fs::write(fx.p("/host/only/other.md"), "x").map_err(|e| e.raw_os_error());
    assert_eq!(refused, Err(Some(libc::EACCES)));
    assert!(call_tool(&mut client, "read_file", json!({"file_path": "/host/only/notes.md"})).0);
    let edit = json!({"file_path": "/host/only/notes.md", "old_string": "two", "new_string": "three"});
    let (ok, text) = call_tool(&mut client, "edit_file", edit);
    assert!(ok, "{text}");
    let other = json!({"file_path": "/host/only/other.md", "content": "x"});
    let (ok, text) = call_tool(&mut client, "write_file", other);
    assert_eq!((ok, text.as_str()), (false, "Error: permission denied for write on /host/only/other.md"));

    let notes = fs::metadata(only.join("notes.md")).unwrap();
    assert_eq!(fs::read_to_string(only.join("notes.md")).unwrap(), "three\n");
    assert_eq!((notes.uid(), notes.gid()), (1001, 1002), "the edited file keeps its owner");
    let new = json!({"file_path": "/host/mine/sub/new.txt", "content": "n"});
    assert!(call_tool(&mut client, "write_file", new).0);
    for made in [mine.join("sub"), mine.join("sub/new.txt")] {
        let meta = fs::metadata(&made).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (1000, 1003), "{}", made.display());
    }
    let names: Vec<_> = fs::read_dir(&only).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["notes.md"], "no temporary file is left");
}
