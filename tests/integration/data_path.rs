//! How file data and attributes reach the kernel: FUSE passthrough of host files, the page
//! cache of small ones, programs run from the host route, and the `[fuse] xattrs` switch.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::process::Command;
use std::time::Duration;

use agentvfs::control::client::Client;

use crate::harness::{call_tool, open_files, sh, sh_ok, soon, Fixture, ROUTES};

/// Larger than `[fuse] cached_reads_max_kb` by default: read through a backing file.
const LARGE: usize = 2 << 20;

/// A file's content: `head`, then dots up to `size` bytes.
fn padded(head: &[u8], size: usize) -> Vec<u8> {
    let mut data = head.to_vec();
    data.resize(size, b'.');
    data
}

fn counter(fx: &Fixture, name: &str) -> u64 {
    crate::harness::status(fx)["counters"][name].as_u64().unwrap()
}

/// With passthrough the kernel reads a large host file itself: a change made on the host is
/// seen at once, even by a descriptor opened before it and with the page cache warm. (Served
/// through the daemon with the page cache kept, the old bytes would be read until the
/// attribute cache expired.)
#[test]
fn host_file_data_comes_straight_from_the_host_file() {
    let fx = Fixture::new("");
    let through_mount = fx.p("/host/data.txt");
    fs::write(&through_mount, padded(b"aaaa-aaaa", LARGE)).unwrap();
    let first = |file: &fs::File| {
        let mut head = [0u8; 9];
        file.read_exact_at(&mut head, 0).unwrap();
        String::from_utf8(head.to_vec()).unwrap()
    };
    let open = fs::File::open(&through_mount).unwrap();
    assert_eq!(first(&open), "aaaa-aaaa");
    assert_eq!(first(&fs::File::open(&through_mount).unwrap()), "aaaa-aaaa");

    // Same size, written in place on the host (not through the mount).
    fs::OpenOptions::new()
        .write(true)
        .open(fx.host_root.join("data.txt"))
        .unwrap()
        .write_at(b"bbbb", 0)
        .unwrap();
    assert_eq!(first(&open), "bbbb-aaaa", "the descriptor opened before the change");
    assert_eq!(first(&fs::File::open(&through_mount).unwrap()), "bbbb-aaaa");

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

/// A small file opened for reading is served from the kernel's page cache, which the daemon
/// fills at `open`: it is read again and again without a read request, its directory is not
/// listed afresh for the reads (they leave every atime alone, on the host too). (A file the
/// sqlite route stores: the next test.)
#[test]
fn small_files_are_read_from_a_page_cache_filled_at_open() {
    let fx = Fixture::new("");
    let host = fx.host_root.join("small");
    fs::create_dir(&host).unwrap();
    for i in 0..20 {
        fs::write(host.join(format!("f{i}")), format!("file {i}\n")).unwrap();
    }
    let dir = fx.p("/host/small");
    let listed = || fs::read_dir(&dir).unwrap().count();
    assert_eq!(listed(), 20);
    // The host watcher hears of those files in its own time, in batches, and drops the
    // listing each time: the listing must stay kept over a few of its 5 ms batches.
    soon("the kernel keeps the listing", || {
        let before = counter(&fx, "fuse_listings");
        listed();
        std::thread::sleep(Duration::from_millis(30));
        listed() == 20 && counter(&fx, "fuse_listings") == before
    });
    let atime = |path: &std::path::Path| {
        let md = fs::metadata(path).unwrap();
        (md.atime(), md.atime_nsec())
    };
    let on_host_before = atime(&host.join("f3"));
    read_thrice_from_the_page_cache(&fx, &dir, 20, |i| format!("file {i}\n"));
    assert_eq!(atime(&host.join("f3")), on_host_before, "the host's atime stays");
    assert_eq!(atime(&dir.join("f3")), on_host_before, "and the mount shows the host's");
}

/// Reads the files `f0`..`f{count - 1}` of `dir` (each holding `content(i)`) three times, and
/// asserts that none of those reads reached the daemon and that the kernel's listing of `dir`
/// still serves afterwards.
fn read_thrice_from_the_page_cache(
    fx: &Fixture,
    dir: &std::path::Path,
    count: usize,
    content: impl Fn(usize) -> String,
) {
    let (reads, listings) = (counter(fx, "fuse_reads"), counter(fx, "fuse_listings"));
    for _ in 0..3 {
        for i in 0..count {
            assert_eq!(fs::read_to_string(dir.join(format!("f{i}"))).unwrap(), content(i));
        }
    }
    soon("the files read are released", || open_files(fx) == 0);
    assert_eq!(counter(fx, "fuse_reads") - reads, 0, "{} reads, none asked of the daemon", 3 * count);
    assert_eq!(fs::read_dir(dir).unwrap().count(), count);
    assert_eq!(counter(fx, "fuse_listings") - listings, 0, "the kernel's listing still serves");
}

/// Small files of the sqlite route are stored in the kernel's page cache at their first open,
/// so no read reaches the daemon, no atime goes stale and the kernel's listing of their
/// directory is kept; every open compares the file with the store, so a change made through
/// the tool door, or through the mount, is read by the next open.
#[test]
fn sqlite_files_are_read_from_a_page_cache_filled_at_open() {
    let fx = Fixture::new("");
    let mut client = Client::connect(&fx.scratch.path().join("agentvfs.sock")).unwrap();
    for i in 0..6 {
        // Through the tool door: the kernel holds no page of them.
        let args = serde_json::json!({"file_path": format!("/db/read/f{i}"), "content": format!("row {i}")});
        assert!(call_tool(&mut client, "write_file", args).0);
    }
    let dir = fx.p("/db/read");
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 6);
    read_thrice_from_the_page_cache(&fx, &dir, 6, |i| format!("row {i}"));
    assert_eq!(fs::metadata(dir.join("f4")).unwrap().len(), 5);

    // Changed through the tool door, then through the mount: the next open reads each.
    let args = serde_json::json!({"file_path": "/db/read/f2", "content": "row two, longer"});
    assert!(call_tool(&mut client, "write_file", args).0);
    assert_eq!(fs::read_to_string(dir.join("f2")).unwrap(), "row two, longer");
    fs::OpenOptions::new().write(true).open(dir.join("f2")).unwrap().write_all_at(b"ROW", 0).unwrap();
    assert_eq!(fs::read_to_string(dir.join("f2")).unwrap(), "ROW two, longer");
    let args = serde_json::json!({"file_path": "/db/read/f2", "offset": 0, "limit": 1});
    let (ok, text) = call_tool(&mut client, "read_file", args);
    assert!(ok && text.contains("ROW two, longer"), "{text}");
}

/// Many readers open a small file again and again while a writer rewrites it through the
/// mount, on every route: no open hangs (a store of the pages waits until no handle of the file
/// is open, writers included, so no read of the kernel's holds a page it must lock), every read
/// is a whole version, and no reader reads an older version after a newer one. The writer
/// reopens the file every 20 writes, so that it opens while readers hold the file (a host-route
/// writer then shares their page cache instead of a backing file). With every CPU kept busy
/// meanwhile, the build that wrote into the pages first failed this in 6 runs of 6; idle, in
/// none.
#[test]
fn files_read_by_many_while_one_writes_them_through_the_mount() {
    let fx = Fixture::new("");
    let dev = fs::metadata(fx.p("/")).unwrap().dev();
    // Busy CPUs delay the daemon's answers, which is when a reader could overtake a write.
    let _busy = crate::harness::BusyCpus::start();
    for route in ROUTES {
        let mnt = fx.p(&format!("{route}/busy.txt"));
        let version = |v: u32| format!("{v:063}\n");
        fs::write(&mnt, version(0)).unwrap();
        let writer = {
            let mnt = mnt.clone();
            std::thread::spawn(move || {
                for round in 0..30 {
                    let f = fs::OpenOptions::new().write(true).open(&mnt).unwrap();
                    for v in round * 20 + 1..=(round + 1) * 20 {
                        f.write_at(version(v).as_bytes(), 0).unwrap();
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            })
        };
        read_by_many_while_written(&mnt, dev, writer, true);
        assert_eq!(fs::read_to_string(&mnt).unwrap(), version(600), "{route}");
    }
}

/// The page cache of a small file is checked against the host file at every `open`: a change
/// made on the host (here one that keeps the size and puts the mtime back, so only the ctime
/// tells) is read by the very next open, before the host watcher could have said anything;
/// a descriptor already open sees it within moments (through the watcher).
#[test]
fn small_files_are_fresh_at_every_open() {
    let fx = Fixture::new("");
    let (host, mnt) = (fx.host_root.join("v.txt"), fx.p("/host/v.txt"));
    fs::write(&host, "v00").unwrap();
    let mtime = fs::metadata(&host).unwrap().modified().unwrap();
    let open = fs::File::open(&mnt).unwrap();
    let read_open = || {
        let mut text = [0u8; 3];
        open.read_exact_at(&mut text, 0).unwrap();
        String::from_utf8(text.to_vec()).unwrap()
    };
    assert_eq!(read_open(), "v00");
    for i in 1..=20 {
        let f = fs::OpenOptions::new().write(true).open(&host).unwrap();
        f.write_at(format!("v{i:02}").as_bytes(), 0).unwrap();
        f.set_modified(mtime).unwrap();
        drop(f);
        assert_eq!(fs::read_to_string(&mnt).unwrap(), format!("v{i:02}"), "the open after change {i}");
    }
    assert_eq!(read_open(), "v20");
    fs::write(&host, "v21").unwrap();
    soon("the open descriptor sees the host's change", || read_open() == "v21");
}

/// Many readers open a small file again and again while a host program rewrites it: no open
/// hangs (the daemon stores a file's pages only for its first open handle, so no read of the
/// kernel's can hold a page it must lock), every read is a whole version, and no reader ever
/// reads an older version than it read before.
#[test]
fn small_files_read_by_many_while_the_host_rewrites_them() {
    let fx = Fixture::new("");
    let (host, mnt) = (fx.host_root.join("busy.txt"), fx.p("/host/busy.txt"));
    let version = |v: u32| format!("{v:063}\n");
    fs::write(&host, version(0)).unwrap();
    let writer = std::thread::spawn(move || {
        let f = fs::OpenOptions::new().write(true).open(&host).unwrap();
        for v in 1..=600 {
            f.write_at(version(v).as_bytes(), 0).unwrap();
            std::thread::sleep(Duration::from_micros(200));
        }
    });
    let dev = fs::metadata(fx.p("/")).unwrap().dev();
    read_by_many_while_written(&mnt, dev, writer, true);
    assert_eq!(fs::read_to_string(&mnt).unwrap(), version(600));
}

/// Four readers read `mnt` 600 times each while `writer` writes ever higher version numbers
/// into it: every read must be a whole version, and (`monotonic`) never older than the
/// reader's last. If the readers hang, the connection of the mount (device `dev`, taken
/// before: once the mount hangs even a `stat` of it may) is ended, so that its stuck callers
/// return and the fixture can unmount, and the test fails.
fn read_by_many_while_written(
    mnt: &std::path::Path,
    dev: u64,
    writer: std::thread::JoinHandle<()>,
    monotonic: bool,
) {
    let (done, finished) = std::sync::mpsc::channel();
    for _ in 0..4 {
        let (mnt, done) = (mnt.to_path_buf(), done.clone());
        std::thread::spawn(move || {
            let mut last = 0;
            let read = (0..600).try_for_each(|_| {
                let text = fs::read_to_string(&mnt).map_err(|e| e.to_string())?;
                let v: u32 = text.trim_end().parse().map_err(|_| format!("a torn read: {text:?}"))?;
                if monotonic && v < last {
                    return Err(format!("read version {v} after {last}"));
                }
                last = last.max(v);
                Ok(())
            });
            let _ = done.send(read);
        });
    }
    for _ in 0..4 {
        match finished.recv_timeout(Duration::from_secs(60)) {
            Ok(read) => read.unwrap_or_else(|e| panic!("{e}")),
            Err(_) => {
                abort_connection(dev);
                panic!("readers hung: the mount stopped answering");
            }
        }
    }
    writer.join().unwrap();
}

/// Aborts the FUSE connection of the mount whose device is `dev` (through the kernel's
/// fusectl, mounted here if it is not).
fn abort_connection(dev: u64) {
    let control = std::path::Path::new("/sys/fs/fuse/connections");
    if fs::read_dir(control).map_or(true, |mut d| d.next().is_none()) {
        let _ = Command::new("mount").args(["-t", "fusectl", "none"]).arg(control).status();
    }
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let _ = fs::write(control.join(minor.to_string()).join("abort"), "1");
}

/// Readers and writers of one file share it in whatever way the first opener got (the kernel
/// refuses to mix a backing file with the page cache on one inode): a small file that readers
/// hold (page cache) takes a writer through the daemon; a large one (a backing file) shares
/// the readers' read-only backing and writes through the daemon; a reader arriving while a
/// writer holds a backing shares it. Everyone sees the same bytes, on the host too.
#[test]
fn readers_and_writers_of_a_file_see_each_other() {
    let fx = Fixture::new("");
    for (name, size) in [("small", 4), ("large", LARGE)] {
        let path = fx.p(&format!("/host/{name}"));
        fs::write(&path, padded(b"one\n", size)).unwrap();
        let reader = fs::File::open(&path).unwrap();
        let mut head = [0u8; 4];
        reader.read_exact_at(&mut head, 0).unwrap();
        assert_eq!(&head, b"one\n", "{name}");

        let writer = fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        writer.write_all_at(b"two\n", size as u64).unwrap();
        writer.read_exact_at(&mut head, size as u64).unwrap();
        assert_eq!(&head, b"two\n", "{name}: the writer reads its own bytes");
        reader.read_exact_at(&mut head, size as u64).unwrap();
        assert_eq!(&head, b"two\n", "{name}: the reader sees the writer's bytes");
        assert_eq!(
            fs::read(fx.host_root.join(name)).unwrap(),
            padded(b"one\n", size).into_iter().chain(*b"two\n").collect::<Vec<_>>()
        );
        drop((reader, writer));
        soon("the files are released", || open_files(&fx) == 0);

        // A writer alone (a backing file of its own), then a reader beside it.
        let writer = fs::OpenOptions::new().write(true).open(&path).unwrap();
        writer.write_all_at(b"3", 0).unwrap();
        let reader = fs::File::open(&path).unwrap();
        reader.read_exact_at(&mut head, 0).unwrap();
        assert_eq!(&head, b"3ne\n", "{name}: a reader beside a writer");
        writer.write_all_at(b"4", 1).unwrap();
        reader.read_exact_at(&mut head, 0).unwrap();
        assert_eq!(&head, b"34e\n", "{name}");
        drop((reader, writer));
        assert_eq!(&fs::read(&path).unwrap()[..4], b"34e\n", "{name}: the next open");
    }
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
