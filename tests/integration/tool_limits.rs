//! What an agent cannot make the tool door hold without end, through a real daemon and socket:
//! a FIFO's reader that never comes (`vfs/download`), a file too large to take whole (a
//! sparse file costs no disk), a directory tree too deep for a recursive walk, and a delete
//! nobody waits for.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use agentvfs::control::client::Client;
use serde_json::json;

use crate::harness::{call_tool, Fixture};

fn agent(f: &Fixture) -> Client {
    Client::connect(&f.scratch.path().join("agentvfs-agent.sock")).unwrap()
}

/// A FIFO is not a file to send: the download is refused at once (the call and its thread
/// are not held until a writer comes), on every route that can hold one.
#[test]
fn a_fifo_is_not_downloaded_and_holds_nothing() {
    let f = Fixture::new("");
    let socket = f.scratch.path().join("agentvfs-agent.sock");
    for route in ["/host", "/mem", "/db"] {
        let fifo = f.p(&format!("{route}/fifo"));
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let path = format!("{route}/fifo");
        let started = Instant::now();
        // On a thread of its own: a call that hangs fails the test instead of holding it.
        let (done, answer) = std::sync::mpsc::channel();
        let (socket, asked) = (socket.clone(), path.clone());
        std::thread::spawn(move || {
            let mut c = Client::connect(&socket).unwrap();
            let _ = done.send(c.call("vfs/download", Some(json!({"path": asked}))).unwrap());
        });
        let down =
            answer.recv_timeout(Duration::from_secs(10)).unwrap_or_else(|_| panic!("{route}: no answer"));
        assert_eq!(
            down,
            json!({"path": path, "error_code": "FS_INVALID_ARGUMENT", "message": format!("Error: '{path}' is not a regular file")})
        );
        assert!(started.elapsed() < Duration::from_secs(5), "{route}");
    }
}

/// `read_file` and `edit_file` take a text file whole (they need all its lines): one over
/// the limit is refused with what to do instead, before it is read.
#[test]
fn a_file_too_large_to_take_whole_is_refused_before_it_is_read() {
    let f = Fixture::new("");
    let mut c = agent(&f);
    for route in ["/host", "/mem", "/db"] {
        let path = format!("{route}/huge.log");
        let file = std::fs::File::create(f.p(&path)).unwrap();
        // On the host route, 40 GB of nothing on no disk (sparse); the other stores write
        // their holes out, so just past the limit there.
        let size: u64 = if route == "/host" { 40 << 30 } else { (32 << 20) + 1 };
        file.set_len(size).unwrap();
        drop(file);
        let started = Instant::now();
        let (ok, text) = call_tool(&mut c, "read_file", json!({"file_path": path, "limit": 1}));
        assert!(!ok);
        assert_eq!(
            text,
            format!("Error: File '{path}' is too large to read whole ({size} bytes; the limit is 33554432 bytes). Take part of it from a shell (head, tail, sed -n '100,200p', grep -n PATTERN FILE): the grep tool skips files over 10 MiB")
        );
        let (ok, text) =
            call_tool(&mut c, "edit_file", json!({"file_path": path, "old_string": "a", "new_string": "b"}));
        assert!(!ok);
        assert!(
            text.starts_with(&format!("Error: File '{path}' is too large to edit whole ({size} bytes")),
            "{text}"
        );
        assert!(started.elapsed() < Duration::from_secs(10), "{route}: {:?}", started.elapsed());
    }
}

/// A tree deeper than a thread's stack would take by recursion (thousands of levels, which
/// the sqlite store, as the daemon-held memory and postgres stores, does not bound) is walked
/// by `glob` and `grep` and removed by `delete`.
#[test]
fn a_tree_thousands_of_levels_deep_is_walked_and_deleted() {
    let f = Fixture::new("");
    let mut c = agent(&f);
    const DEPTH: usize = 2500;
    // Made one level at a time relative to the last (the whole path is far past PATH_MAX).
    let top = std::fs::File::open(f.p("/db")).unwrap();
    let mut dir = OwnedFd::from(top);
    nix::sys::stat::mkdirat(Some(dir.as_raw_fd()), "deep", nix::sys::stat::Mode::from_bits_truncate(0o755))
        .unwrap();
    let open = |at: &OwnedFd, name: &str| {
        let flags = nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_RDONLY;
        let fd =
            nix::fcntl::openat(Some(at.as_raw_fd()), name, flags, nix::sys::stat::Mode::empty()).unwrap();
        unsafe { OwnedFd::from_raw_fd(fd) }
    };
    dir = open(&dir, "deep");
    for _ in 0..DEPTH {
        nix::sys::stat::mkdirat(Some(dir.as_raw_fd()), "d", nix::sys::stat::Mode::from_bits_truncate(0o755))
            .unwrap();
        dir = open(&dir, "d");
    }
    let file = nix::fcntl::openat(
        Some(dir.as_raw_fd()),
        "bottom.txt",
        nix::fcntl::OFlag::O_CREAT | nix::fcntl::OFlag::O_WRONLY,
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let mut file = unsafe { std::fs::File::from_raw_fd(file) };
    std::io::Write::write_all(&mut file, b"needle\n").unwrap();
    drop((file, dir));

    // A path-keyed store walks each path from the root, so this glob costs the square of the
    // depth: a debug daemon on a busy machine may meet glob's five-second budget on the way
    // down, which answers the paths found so far with a note. Either way the walk survives.
    let (ok, text) = call_tool(&mut c, "glob", json!({"pattern": "**/bottom.txt", "path": "/db/deep"}));
    let whole = text.ends_with("/d/bottom.txt']");
    let cut = text.starts_with("No files found")
        && text.contains("the search stopped early because it hit its time");
    assert!(ok && (whole || cut), "{}", &text[text.len().saturating_sub(300)..]);
    let (ok, text) = call_tool(&mut c, "grep", json!({"pattern": "needle", "path": "/db/deep"}));
    assert!(ok && text.ends_with("/d/bottom.txt"), "{}", &text[text.len().saturating_sub(200)..]);
    let (ok, text) = call_tool(&mut c, "delete", json!({"file_path": "/db/deep"}));
    assert!(ok, "{text}");
    assert!(!f.p("/db/deep").exists());
}

/// A `delete` whose client went away stops where it is: the rest of the tree stays, rather
/// than the daemon removing it to the end for nobody.
#[test]
fn a_delete_whose_client_went_away_stops() {
    let f = Fixture::new("");
    let tree = f.host_root.join("many");
    for d in 0..100 {
        let dir = tree.join(format!("d{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..400 {
            std::fs::File::create(dir.join(format!("f{i}"))).unwrap();
        }
    }
    let count = || walkdir_count(&tree);
    let mut c =
        std::os::unix::net::UnixStream::connect(f.scratch.path().join("agentvfs-agent.sock")).unwrap();
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "delete", "arguments": {"file_path": "/host/many"}}});
    std::io::Write::write_all(&mut c, format!("{call}\n").as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    drop(c);
    std::thread::sleep(Duration::from_secs(1));
    let left = count();
    std::thread::sleep(Duration::from_secs(2));
    assert!(left > 0, "the whole tree went");
    assert_eq!(count(), left, "the delete went on after its client left");
}

/// Entries beneath `dir` (0 once it is gone).
fn walkdir_count(dir: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries.flatten().map(|e| 1 + if e.path().is_dir() { walkdir_count(&e.path()) } else { 0 }).sum()
}
