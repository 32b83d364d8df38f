//! The postgres route when its server goes away: operations fail with EIO within seconds
//! (never a hang), the log says why, the daemon stays up, and once the server is back the
//! mount works again by itself; a restart in the middle of a copy loses nothing acknowledged;
//! after a crash of the server, what an `fsync` or `fsyncdir` acknowledged is there, and what
//! a `close` acknowledged with `sync_on_close`.
//! Each test runs a server of its own, so stopping it disturbs no other test.

use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::os::fd::IntoRawFd;
use std::time::{Duration, Instant};

use agentvfs::backend::postgres::testing::TestServer;

use crate::harness::{status_at, within};
use crate::shared_store::{namespace, wait_until_unlinks_wait_on, Daemon};

#[test]
fn a_database_that_goes_away_answers_eio_and_comes_back_by_itself() {
    let server = TestServer::start().unwrap();
    let a = Daemon::start_with(&namespace("down"), &server.url());
    fs::write(a.p("before"), "kept").unwrap();
    server.stop().unwrap();

    let started = Instant::now();
    let e = fs::write(a.p("during"), "x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    // A name nobody looked up is not reported absent: the store cannot say.
    let e = fs::metadata(a.p("never-seen")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    let status = status_at(&a.scratch.path().join("agentvfs.sock"));
    assert!(status["routes"].is_array(), "{status}");
    // A tool says what the system said, not that the path cannot be resolved.
    let mut c =
        agentvfs::control::client::Client::connect(&a.scratch.path().join("agentvfs-agent.sock")).unwrap();
    let params =
        serde_json::json!({"name": "read_file", "arguments": {"file_path": "/pg/never-seen-either"}});
    let result = c.call("tools/call", Some(params)).unwrap();
    let text = result["content"][0]["text"].as_str().unwrap_or_default().to_string();
    assert!(text.contains("[Errno 5]") && !text.contains("cannot resolve"), "{result}");
    assert_eq!(result["structuredContent"]["error_code"], serde_json::json!("FS_IO"), "{result}");
    within("the log line", Duration::from_secs(5), || a.mount.log_text().contains("cannot reach"));

    server.start_again().unwrap();
    within("the mount works again", Duration::from_secs(15), || fs::write(a.p("after"), "back").is_ok());
    assert_eq!(fs::read_to_string(a.p("before")).unwrap(), "kept");
    assert_eq!(fs::read_to_string(a.p("after")).unwrap(), "back");
    assert!(!a.p("during").exists());
}

/// After the server restarts, no operation fails for a connection the old server closed: the
/// pool hands out none made before the server was found gone.
#[test]
fn after_a_server_restart_no_operation_fails_on_an_old_connection() {
    for layout in ["", "layout = \"langgraph\""] {
        after_a_restart(layout);
    }
}

fn after_a_restart(layout: &str) {
    let server = TestServer::start().unwrap();
    let a = Daemon::start_configured(&namespace("restart"), &server.url(), layout);
    // Several connections in the pool: writes from several threads at once.
    std::thread::scope(|scope| {
        for t in 0..8 {
            let a = &a;
            scope.spawn(move || {
                for i in 0..20 {
                    fs::write(a.p(&format!("t{t}-{i}")), "x").unwrap();
                }
            });
        }
    });
    server.stop().unwrap();
    server.start_again().unwrap();
    within("the listener back", Duration::from_secs(20), || a.mount.log_text().contains("listening again"));
    for i in 0..16 {
        fs::write(a.p(&format!("after-{i}")), "back").unwrap_or_else(|e| panic!("write {i}: {e}"));
        assert_eq!(fs::read_to_string(a.p(&format!("t{}-0", i % 8))).unwrap(), "x");
    }
}

#[test]
fn a_restart_in_the_middle_of_a_copy_loses_nothing_acknowledged() {
    const BLOCK: usize = 4096;
    const BLOCKS: usize = 400;
    let server = TestServer::start().unwrap();
    let ns = namespace("restart");
    let a = Daemon::start_with(&ns, &server.url());
    let block = |i: usize| -> Vec<u8> { (0..BLOCK).map(|j| ((i * 31 + j) % 251) as u8).collect() };
    let path = a.p("copy.bin");
    // The copy stops halfway until the server is down, so the restart always falls inside it.
    let server_down = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let halfway = std::sync::Arc::new(std::sync::Barrier::new(2));
    let (down, half) = (server_down.clone(), halfway.clone());
    let writer = std::thread::spawn(move || {
        let mut f = fs::File::create(&path).unwrap();
        let mut acknowledged = 0;
        let mut failures = 0;
        let deadline = Instant::now() + Duration::from_secs(60);
        while acknowledged < BLOCKS && Instant::now() < deadline {
            if acknowledged == BLOCKS / 2 && !down.load(std::sync::atomic::Ordering::Acquire) {
                half.wait();
                while !down.load(std::sync::atomic::Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            let written = f
                .seek(SeekFrom::Start((acknowledged * BLOCK) as u64))
                .and_then(|_| f.write_all(&block(acknowledged)))
                .and_then(|_| f.sync_data());
            match written {
                Ok(()) => acknowledged += 1,
                Err(_) => {
                    failures += 1;
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        if acknowledged < BLOCKS / 2 {
            half.wait(); // never got there: the main thread must not wait for it forever
        }
        (acknowledged, failures)
    });
    halfway.wait();
    server.stop().unwrap();
    server_down.store(true, std::sync::atomic::Ordering::Release);
    // Longer than an operation waits for a new connection (3 s), so that some write fails.
    std::thread::sleep(Duration::from_secs(4));
    server.start_again().unwrap();
    let (acknowledged, failures) = writer.join().unwrap();
    assert_eq!(acknowledged, BLOCKS, "the copy did not finish after the restart");
    assert!(failures > 0, "the restart came too late to interrupt the copy");
    // What a fresh daemon reads: every acknowledged block, exactly.
    let b = Daemon::start_with(&ns, &server.url());
    let data = fs::read(b.p("copy.bin")).unwrap();
    assert_eq!(data.len(), BLOCKS * BLOCK);
    for i in 0..BLOCKS {
        assert!(data[i * BLOCK..][..BLOCK] == block(i)[..], "block {i} differs");
    }
}

/// Commits do not wait for the server's disk, except where POSIX says data must be durable:
/// `fsync`, and `fsync` of a directory (for the names in it); with `sync_on_close`, also the
/// close of a descriptor that wrote. Each is followed by a crash of the server at once (its
/// WAL writer flushes only every 200 ms, so what no commit waited for is lost).
#[test]
fn what_fsync_fsyncdir_and_a_synced_close_acknowledged_survives_a_server_crash() {
    let server = TestServer::start().unwrap();
    let ns = namespace("crash");
    type Step<'a> = (&'a str, &'a dyn Fn(&Daemon));
    // On one connection, whose reads count for its edits.
    let tool = |a: &Daemon, calls: &[(&str, serde_json::Value)]| {
        let mut c = a.client();
        for (name, arguments) in calls {
            let (ok, text) = crate::harness::call_tool(&mut c, name, arguments.clone());
            assert!(ok, "{name}: {text}");
        }
    };
    let steps: [Step; 6] = [
        ("close", &|a| fs::write(a.p("closed.txt"), "written, then closed").unwrap()),
        ("fsync", &|a| {
            let mut f = fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .open(a.p("synced.txt"))
                .unwrap();
            f.write_all(b"written, then synced").unwrap();
            f.sync_all().unwrap();
            std::mem::forget(f); // not closed before the crash
        }),
        ("fsyncdir", &|a| {
            fs::create_dir(a.p("d")).unwrap();
            fs::File::create(a.p("d/first")).unwrap();
            fs::rename(a.p("d/first"), a.p("d/renamed")).unwrap();
            fs::File::open(a.p("d")).unwrap().sync_all().unwrap();
        }),
        // What a tool reports done is durable, with nothing after it.
        ("write_file", &|a| {
            tool(
                a,
                &[(
                    "write_file",
                    serde_json::json!({"file_path": "/pg/tools/new.txt", "content": "by a tool"}),
                )],
            )
        }),
        ("edit_file", &|a| {
            fs::create_dir_all(a.p("tools")).unwrap();
            fs::write(a.p("tools/status.txt"), "status: OLD").unwrap();
            fs::File::open(a.p("tools")).unwrap().sync_all().unwrap();
            let read = serde_json::json!({"file_path": "/pg/tools/status.txt"});
            let edit = serde_json::json!({"file_path": "/pg/tools/status.txt", "old_string": "OLD", "new_string": "NEW"});
            tool(a, &[("read_file", read), ("edit_file", edit)])
        }),
        ("delete", &|a| {
            fs::write(a.p("tools/gone.txt"), "deleted by a tool").unwrap();
            fs::File::open(a.p("tools")).unwrap().sync_all().unwrap();
            tool(a, &[("delete", serde_json::json!({"file_path": "/pg/tools/gone.txt"}))])
        }),
    ];
    for (what, step) in steps {
        let keys = if what == "close" { "sync_on_close = true" } else { "" };
        let a = Daemon::start_configured(&ns, &server.url(), keys);
        step(&a);
        server.crash().unwrap();
        drop(a);
        server.start_again().unwrap();
        let b = Daemon::start_with(&ns, &server.url());
        let temporaries: Vec<_> = fs::read_dir(b.p("tools"))
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.contains(".agentvfs-"))
            .collect();
        assert_eq!(temporaries, Vec::<String>::new(), "{what}");
        match what {
            "close" => assert_eq!(fs::read_to_string(b.p("closed.txt")).unwrap(), "written, then closed"),
            "fsync" => assert_eq!(fs::read_to_string(b.p("synced.txt")).unwrap(), "written, then synced"),
            "write_file" => assert_eq!(fs::read_to_string(b.p("tools/new.txt")).unwrap(), "by a tool"),
            "edit_file" => assert_eq!(fs::read_to_string(b.p("tools/status.txt")).unwrap(), "status: NEW"),
            "delete" => assert!(!b.p("tools/gone.txt").exists(), "the deleted file came back"),
            _ => {
                assert!(b.p("d/renamed").exists(), "{what}: the renamed name is lost");
                assert!(!b.p("d/first").exists(), "{what}: the old name came back");
            }
        }
    }
}

/// On a server whose disk is full (its data on a small tmpfs, filled to the last byte), a new
/// file that the lone daemon kept to itself until its `fsync` (a draft) cannot be stored:
/// its `fsync` and its close answer ENOSPC, the server's reason, not EIO; the file is gone.
#[test]
fn a_new_file_that_meets_the_servers_full_disk_answers_enospc_at_fsync_and_close() {
    let scratch = crate::harness::scratch();
    let disk_dir = scratch.path().join("pgdisk");
    let _disk = crate::harness::HostMount::small_disk(&disk_dir, 64);
    let server = TestServer::start_in(disk_dir.clone()).unwrap();
    let a = Daemon::start_with(&namespace("full"), &server.url());
    fs::create_dir(a.p("w")).unwrap();
    wait_until_unlinks_wait_on(&a.p("w"), &server.url());
    // Nothing waits in the daemon (the fsync of the directory sends its journal).
    fs::File::open(a.p("w")).unwrap().sync_all().unwrap();

    let mut filler = fs::File::create(disk_dir.join("filler")).unwrap();
    for block in [1 << 20, 4096, 1] {
        while filler.write_all(&vec![0u8; block]).is_ok() {}
    }
    // Bytes lz4 cannot shrink, so the server must find room for all of them.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..200_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let mut f = fs::File::create(a.p("w/new")).unwrap();
    f.write_all(&data).unwrap();
    let e = f.sync_all().unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "fsync: {e}");
    // SAFETY: closing the descriptor this test owns (taken out of `f`), once.
    let closed = unsafe { libc::close(f.into_raw_fd()) };
    let e = std::io::Error::last_os_error();
    assert_eq!((closed, e.raw_os_error()), (-1, Some(libc::ENOSPC)), "close: {e}");
    within("the log line", Duration::from_secs(5), || a.mount.log_text().contains("could not be stored"));
    assert!(!a.p("w/new").exists());

    drop(filler);
    fs::remove_file(disk_dir.join("filler")).unwrap();
    within("the mount works again", Duration::from_secs(10), || fs::write(a.p("w/after"), "room").is_ok());
    assert_eq!(fs::read_to_string(a.p("w/after")).unwrap(), "room");
    drop(a);
    drop(server);
}
