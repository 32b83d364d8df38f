//! How file data and attributes reach the kernel: FUSE passthrough of host files, programs
//! run from the host route, and the `[fuse] xattrs` switch.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::process::Command;
use std::time::Duration;

use crate::harness::{sh, sh_ok, Fixture};

/// With passthrough the kernel reads the host file itself: a change made on the host is seen
/// at once, even by a descriptor opened before it and with the page cache warm. (Served
/// through the daemon with the page cache kept, the old bytes would be read until the
/// attribute cache expired.)
#[test]
fn host_file_data_comes_straight_from_the_host_file() {
    let fx = Fixture::new("");
    let through_mount = fx.p("/host/data.txt");
    fs::write(&through_mount, b"aaaa-aaaa").unwrap();
    let mut open = fs::File::open(&through_mount).unwrap();
    let mut first = String::new();
    open.read_to_string(&mut first).unwrap();
    assert_eq!(first, "aaaa-aaaa");
    assert_eq!(fs::read_to_string(&through_mount).unwrap(), "aaaa-aaaa");

    // Same size, written in place on the host (not through the mount).
    fs::OpenOptions::new()
        .write(true)
        .open(fx.host_root.join("data.txt"))
        .unwrap()
        .write_at(b"bbbb", 0)
        .unwrap();
    assert_eq!(fs::read_to_string(&through_mount).unwrap(), "bbbb-aaaa");
    open.seek(SeekFrom::Start(0)).unwrap();
    let mut again = String::new();
    open.read_to_string(&mut again).unwrap();
    assert_eq!(again, "bbbb-aaaa");

    // Writes through the mount land in the host file, and sizes follow.
    let big: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let mut w = fs::OpenOptions::new().write(true).truncate(true).open(&through_mount).unwrap();
    w.write_all(&big).unwrap();
    w.sync_all().unwrap();
    drop(w);
    assert_eq!(fs::metadata(&through_mount).unwrap().len(), big.len() as u64);
    assert!(fs::read(fx.host_root.join("data.txt")).unwrap() == big, "host file differs");
    let mut a = fs::OpenOptions::new().append(true).open(&through_mount).unwrap();
    a.write_all(b"tail").unwrap();
    drop(a);
    let all = fs::read(&through_mount).unwrap();
    assert_eq!(all.len(), big.len() + 4);
    assert_eq!(&all[big.len()..], b"tail");
}

/// A writer opening a file that readers hold open shares their read-only backing and writes
/// through the daemon: everyone sees the same bytes, on the host too.
#[test]
fn a_writer_joining_open_readers_sees_and_is_seen() {
    let fx = Fixture::new("");
    let path = fx.p("/host/shared.txt");
    fs::write(&path, b"one\n").unwrap();
    let mut reader = fs::File::open(&path).unwrap();
    let mut text = String::new();
    reader.read_to_string(&mut text).unwrap();
    assert_eq!(text, "one\n");

    let mut writer = fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    writer.seek(SeekFrom::End(0)).unwrap();
    writer.write_all(b"two\n").unwrap();
    writer.seek(SeekFrom::Start(0)).unwrap();
    let mut seen_by_writer = String::new();
    writer.read_to_string(&mut seen_by_writer).unwrap();
    assert_eq!(seen_by_writer, "one\ntwo\n");

    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "two\n", "the reader sees the writer's bytes");
    assert_eq!(fs::read_to_string(fx.host_root.join("shared.txt")).unwrap(), "one\ntwo\n");
    drop((reader, writer));
    // All closed: the next writer gets a backing of its own again.
    fs::write(&path, b"three\n").unwrap();
    assert_eq!(fs::read_to_string(fx.host_root.join("shared.txt")).unwrap(), "three\n");
}

/// Running a program from the host route must not hold its host file open for writing
/// (the host's own `execve` of it would fail with ETXTBSY), and writing to it through the
/// mount while it runs is refused as on any filesystem.
#[test]
fn a_program_running_from_the_mount_leaves_its_host_file_executable() {
    let fx = Fixture::new("");
    let program = fx.p("/host/snooze");
    // Copied by another process, so that no child a parallel test forks inherits it open for
    // writing (its exec would fail with ETXTBSY).
    sh_ok(&fx.mount.dir, "cp /usr/bin/sleep host/snooze");
    fs::set_permissions(&program, fs::Permissions::from_mode(0o755)).unwrap();
    let mut running = Command::new(&program).arg("5").spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));

    let on_host = Command::new(fx.host_root.join("snooze")).arg("0").status().unwrap();
    assert!(on_host.success(), "the host could not run its own file: {on_host:?}");
    let (code, _, err) = sh(&fx.mount.dir, "echo x > host/snooze");
    assert_ne!(code, 0);
    assert!(err.contains("Text file busy"), "{err}");
    // Reading it meanwhile shares the running program's backing file.
    assert_eq!(fs::read(&program).unwrap(), fs::read("/usr/bin/sleep").unwrap());

    running.kill().unwrap();
    running.wait().unwrap();
    // Once it has stopped, the file is writable again.
    sh_ok(&fx.mount.dir, "echo x > host/snooze");
    assert_eq!(fs::read_to_string(fx.host_root.join("snooze")).unwrap(), "x\n");
}

/// Extended attributes are off unless `[fuse] xattrs = true`: off, the kernel learns once
/// that the mount has none and stops asking (ls -l would otherwise cost two requests a file).
#[test]
fn xattrs_are_served_only_when_configured() {
    let fx = Fixture::new("");
    fs::write(fx.p("/host/x"), b"x").unwrap();
    let (code, _, err) = sh(&fx.mount.dir, "setfattr -n user.agent -v hello host/x");
    assert_ne!(code, 0);
    assert!(err.contains("Operation not supported"), "{err}");
    let (code, _, err) = sh(&fx.mount.dir, "getfattr -n user.agent host/x");
    assert_ne!(code, 0);
    assert!(err.contains("Operation not supported"), "{err}");
    drop(fx);

    let fx = Fixture::new("[fuse]\nxattrs = true\n");
    for route in ["host", "mem", "db"] {
        fs::write(fx.p(&format!("/{route}/x")), b"x").unwrap();
        sh_ok(&fx.mount.dir, &format!("setfattr -n user.agent -v hello-{route} {route}/x"));
        let value = sh_ok(&fx.mount.dir, &format!("getfattr --only-values -n user.agent {route}/x"));
        assert_eq!(value, format!("hello-{route}"));
    }
    assert_eq!(sh_ok(&fx.host_root, "getfattr --only-values -n user.agent x"), "hello-host");
}

/// The mount's readahead window is the configured one (the kernel's own is 128 KiB), and data
/// the daemon serves reads back whole through it.
#[test]
fn the_readahead_window_is_configured() {
    use std::os::unix::fs::MetadataExt;
    let window = |fx: &Fixture| {
        let dev = fs::metadata(&fx.mount.dir).unwrap().dev();
        let path = format!("/sys/class/bdi/{}:{}/read_ahead_kb", libc::major(dev), libc::minor(dev));
        fs::read_to_string(path).unwrap().trim().to_string()
    };
    let fx = Fixture::new("");
    assert_eq!(window(&fx), "1024");
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
    fs::write(fx.p("/db/big"), &data).unwrap();
    sh_ok(&fx.mount.dir, "sync; echo 1 > /proc/sys/vm/drop_caches");
    assert!(fs::read(fx.p("/db/big")).unwrap() == data);
    drop(fx);
    let fx = Fixture::new("[fuse]\nread_ahead_kb = 4096\n");
    assert_eq!(window(&fx), "4096");
}

/// A memory route's `max_bytes` holds on either store: past it, writes fail with ENOSPC, and
/// freeing space makes room again. `statfs` reports the cap.
#[test]
fn memory_route_caps_hold_on_both_stores() {
    let routes = "[[routes]]\npath = \"/small\"\nbackend = \"memory\"\nmax_bytes = 1048576\n\n\
                  [[routes]]\npath = \"/smalld\"\nbackend = \"memory\"\nmax_bytes = 1048576\nstore = \"daemon\"\n";
    let fx = Fixture::new(routes);
    for route in ["/small", "/smalld"] {
        let path = fx.p(&format!("{route}/big"));
        let mut f = fs::File::create(&path).unwrap();
        let err = f.write_all(&vec![7u8; 3 << 20]).and_then(|()| f.sync_all()).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{route}: {err}");
        drop(f);
        assert!(fs::metadata(&path).unwrap().len() <= 1 << 20, "{route}");
        let st = nix::sys::statvfs::statvfs(&fx.p(route)).unwrap();
        assert_eq!(st.blocks() as u64 * st.fragment_size() as u64, 1 << 20, "{route}: statfs size");
        fs::remove_file(&path).unwrap();
        fs::write(&path, vec![1u8; 512 << 10]).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().len(), 512 << 10, "{route}");
    }
}
