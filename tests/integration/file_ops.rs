//! POSIX file semantics through the mount, on every route.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::time::{Duration, UNIX_EPOCH};

use crate::harness::{call_tool, sh_ok, Fixture, HostMount, ROUTES};

fn errno_of(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

#[test]
fn create_read_write_append_truncate() {
    let fx = Fixture::new("");
    for route in ROUTES {
        let f = fx.p(&format!("{route}/a.txt"));
        fs::write(&f, b"hello world").unwrap();
        assert_eq!(fs::read(&f).unwrap(), b"hello world", "{route}");
        let mut file = fs::OpenOptions::new().append(true).open(&f).unwrap();
        file.write_all(b"!\n").unwrap();
        drop(file);
        assert_eq!(fs::read_to_string(&f).unwrap(), "hello world!\n", "{route}");
        // Overwrite in the middle, then extend past the end with a hole.
        let mut file = fs::OpenOptions::new().write(true).open(&f).unwrap();
        file.seek(SeekFrom::Start(6)).unwrap();
        file.write_all(b"WORLD").unwrap();
        file.seek(SeekFrom::Start(20)).unwrap();
        file.write_all(b"end").unwrap();
        drop(file);
        let data = fs::read(&f).unwrap();
        assert_eq!(&data[..13], b"hello WORLD!\n", "{route}");
        assert_eq!(&data[13..20], &[0u8; 7], "{route}: the hole reads as zeros");
        assert_eq!(&data[20..], b"end", "{route}");
        assert_eq!(fs::metadata(&f).unwrap().len(), 23, "{route}");
        // Truncate down and up.
        fs::OpenOptions::new().write(true).open(&f).unwrap().set_len(5).unwrap();
        assert_eq!(fs::read(&f).unwrap(), b"hello", "{route}");
        fs::OpenOptions::new().write(true).open(&f).unwrap().set_len(8).unwrap();
        assert_eq!(fs::read(&f).unwrap(), b"hello\0\0\0", "{route}");
        // O_TRUNC and O_EXCL.
        fs::write(&f, b"x").unwrap();
        assert_eq!(fs::read(&f).unwrap(), b"x", "{route}");
        let err = fs::OpenOptions::new().write(true).create_new(true).open(&f).unwrap_err();
        assert_eq!(errno_of(err), libc::EEXIST, "{route}");
        // A large file, written and read back in pieces.
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let bf = fx.p(&format!("{route}/big.bin"));
        fs::write(&bf, &big).unwrap();
        let mut back = Vec::new();
        fs::File::open(&bf).unwrap().read_to_end(&mut back).unwrap();
        assert!(back == big, "{route}: large file round trip");
    }
}

#[test]
fn directories_and_errnos() {
    let fx = Fixture::new("");
    for route in ROUTES {
        let d = fx.p(&format!("{route}/d"));
        fs::create_dir(&d).unwrap();
        assert_eq!(errno_of(fs::create_dir(&d).unwrap_err()), libc::EEXIST, "{route}");
        fs::write(d.join("f"), b"1").unwrap();
        assert_eq!(errno_of(fs::remove_dir(&d).unwrap_err()), libc::ENOTEMPTY, "{route}");
        assert_eq!(errno_of(fs::remove_file(&d).unwrap_err()), libc::EISDIR, "{route}");
        assert_eq!(errno_of(fs::remove_dir(d.join("f")).unwrap_err()), libc::ENOTDIR, "{route}");
        assert_eq!(errno_of(fs::read(d.join("missing")).unwrap_err()), libc::ENOENT, "{route}");
        assert_eq!(errno_of(fs::write(d.join("f/x"), b"").unwrap_err()), libc::ENOTDIR, "{route}");
        fs::create_dir(d.join("sub")).unwrap();
        assert_eq!(fs::metadata(&d).unwrap().nlink(), 3, "{route}: 2 + one subdirectory");
        let mut names: Vec<String> =
            fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        assert_eq!(names, ["f", "sub"], "{route}");
        fs::remove_file(d.join("f")).unwrap();
        fs::remove_dir(d.join("sub")).unwrap();
        fs::remove_dir(&d).unwrap();
        assert!(!d.exists(), "{route}");
    }
}

fn renameat2(from: &std::path::Path, to: &std::path::Path, flags: u32) -> i32 {
    use std::os::unix::ffi::OsStrExt;
    let f = std::ffi::CString::new(from.as_os_str().as_bytes()).unwrap();
    let t = std::ffi::CString::new(to.as_os_str().as_bytes()).unwrap();
    let r = unsafe { libc::renameat2(libc::AT_FDCWD, f.as_ptr(), libc::AT_FDCWD, t.as_ptr(), flags) };
    if r == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap()
    }
}

#[test]
fn renames() {
    let fx = Fixture::new("");
    for route in ROUTES {
        let base = fx.p(route);
        fs::write(base.join("a"), b"A").unwrap();
        fs::write(base.join("b"), b"B").unwrap();
        // Over an existing file.
        fs::rename(base.join("a"), base.join("b")).unwrap();
        assert_eq!(fs::read(base.join("b")).unwrap(), b"A", "{route}");
        assert!(!base.join("a").exists(), "{route}");
        // RENAME_NOREPLACE.
        fs::write(base.join("c"), b"C").unwrap();
        assert_eq!(
            renameat2(&base.join("c"), &base.join("b"), libc::RENAME_NOREPLACE),
            libc::EEXIST,
            "{route}"
        );
        assert_eq!(renameat2(&base.join("c"), &base.join("e"), libc::RENAME_NOREPLACE), 0, "{route}");
        // RENAME_EXCHANGE.
        assert_eq!(renameat2(&base.join("b"), &base.join("e"), libc::RENAME_EXCHANGE), 0, "{route}");
        assert_eq!(fs::read(base.join("b")).unwrap(), b"C", "{route}");
        assert_eq!(fs::read(base.join("e")).unwrap(), b"A", "{route}");
        // Directories, with content, and the errnos of bad moves.
        fs::create_dir_all(base.join("dir/inner")).unwrap();
        fs::write(base.join("dir/inner/f"), b"deep").unwrap();
        fs::rename(base.join("dir"), base.join("moved")).unwrap();
        assert_eq!(fs::read(base.join("moved/inner/f")).unwrap(), b"deep", "{route}");
        assert_eq!(renameat2(&base.join("moved"), &base.join("moved/inner/x"), 0), libc::EINVAL, "{route}");
        fs::create_dir(base.join("empty")).unwrap();
        assert_eq!(renameat2(&base.join("b"), &base.join("empty"), 0), libc::EISDIR, "{route}");
        assert_eq!(renameat2(&base.join("empty"), &base.join("b"), 0), libc::ENOTDIR, "{route}");
        assert_eq!(renameat2(&base.join("empty"), &base.join("moved"), 0), libc::ENOTEMPTY, "{route}");
        fs::rename(base.join("moved/inner"), base.join("empty")).unwrap();
        assert_eq!(fs::read(base.join("empty/f")).unwrap(), b"deep", "{route}");
    }
    // Across routes: EXDEV (so mv falls back to copy + unlink).
    fs::write(fx.p("/host/x"), b"x").unwrap();
    assert_eq!(renameat2(&fx.p("/host/x"), &fx.p("/db/x"), 0), libc::EXDEV);
    let err = fs::hard_link(fx.p("/host/x"), fx.p("/db/x")).unwrap_err();
    assert_eq!(errno_of(err), libc::EXDEV);
    sh_ok(&fx.mount.dir, "mv host/x db/x && test ! -e host/x && test \"$(cat db/x)\" = x");
}

#[test]
fn links_and_symlinks() {
    let fx = Fixture::new("");
    for route in ROUTES {
        let base = fx.p(route);
        fs::write(base.join("t"), b"target").unwrap();
        symlink("t", base.join("l")).unwrap();
        assert_eq!(fs::read_link(base.join("l")).unwrap().to_str(), Some("t"), "{route}");
        assert_eq!(fs::read(base.join("l")).unwrap(), b"target", "{route}");
        assert!(fs::symlink_metadata(base.join("l")).unwrap().file_type().is_symlink(), "{route}");
        fs::hard_link(base.join("t"), base.join("h")).unwrap();
        assert_eq!(fs::metadata(base.join("t")).unwrap().nlink(), 2, "{route}");
        fs::write(base.join("h"), b"through the link").unwrap();
        assert_eq!(fs::read(base.join("t")).unwrap(), b"through the link", "{route}");
        fs::remove_file(base.join("t")).unwrap();
        assert_eq!(fs::metadata(base.join("h")).unwrap().nlink(), 1, "{route}");
        assert_eq!(errno_of(fs::read(base.join("l")).unwrap_err()), libc::ENOENT, "{route}: dangling");
        fs::create_dir(base.join("dd")).unwrap();
        assert_eq!(
            errno_of(fs::hard_link(base.join("dd"), base.join("dd2")).unwrap_err()),
            libc::EPERM,
            "{route}"
        );
    }
}

#[test]
fn attributes_and_times() {
    let fx = Fixture::new("");
    for route in ROUTES {
        let f = fx.p(&format!("{route}/m"));
        fs::write(&f, b"m").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o640, "{route}");
        std::os::unix::fs::chown(&f, Some(65534), Some(65534)).unwrap();
        let md = fs::metadata(&f).unwrap();
        assert_eq!((md.uid(), md.gid()), (65534, 65534), "{route}");
        let when = UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let file = fs::File::options().write(true).open(&f).unwrap();
        file.set_times(fs::FileTimes::new().set_modified(when).set_accessed(when)).unwrap();
        drop(file);
        let md = fs::metadata(&f).unwrap();
        assert_eq!((md.mtime(), md.atime()), (1_000_000_000, 1_000_000_000), "{route}");
    }
    // statfs answers for each route.
    for route in ROUTES {
        let out = sh_ok(&fx.p(route), "stat -f -c '%b %S' .");
        let fields: Vec<u64> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
        assert!(fields[0] > 0 && fields[1] > 0, "{route}: {out}");
    }
}

#[test]
fn ownership_and_permission_bits_for_other_users() {
    let fx = Fixture::new("");
    for route in ROUTES {
        let base = fx.p(route);
        let shared = base.join("shared");
        fs::create_dir(&shared).unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).unwrap();
        let private = base.join("private");
        fs::create_dir(&private).unwrap();
        fs::set_permissions(&private, fs::Permissions::from_mode(0o700)).unwrap();
        let script = format!(
            "setpriv --reuid=65534 --regid=65534 --clear-groups sh -c 'echo hi > {s}/mine && mkdir {s}/subdir && stat -c \"%u:%g\" {s}/mine {s}/subdir; (echo nope > {p}/x) 2>/dev/null || echo refused'",
            s = shared.display(),
            p = private.display()
        );
        let out = sh_ok(&fx.mount.dir, &script);
        assert_eq!(out, "65534:65534\n65534:65534\nrefused\n", "{route}");
        assert!(!private.join("x").exists(), "{route}");
    }
}

/// A write, a truncation or a change of owner clears the set-user-ID and set-group-ID bits of
/// a file, as on a local filesystem, though host-route writes go through kernel passthrough and
/// never reach the daemon; root (`CAP_FSETID`) keeps them on a write.
#[test]
fn writes_truncations_and_chown_clear_set_id_bits() {
    let fx = Fixture::new("");
    for route in ROUTES {
        let dir = fx.p(route).join("setid");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let script = r#"
            echo hi > prog && chown 65534:65534 prog
            as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups sh -c "$1"; }
            chmod 6755 prog && echo more >> prog && stat -c %a prog
            chmod 6755 prog && as_nobody 'echo more >> prog' && stat -c %a prog
            as_nobody 'chmod 6755 prog && truncate -s 1 prog' && stat -c %a prog
            chmod 6755 prog && chown 0 prog && stat -c %a prog
            cat prog
        "#;
        let out = sh_ok(&dir, script);
        assert_eq!(out, "6755\n755\n755\n755\nh", "{route}");
    }
}

/// A write the daemon does for the kernel (here: a writer of a large file that a reader holds
/// through a read-only backing file writes through the daemon) clears the set-ID bits when the
/// writer may not keep them, as one through the kernel does: the daemon itself may keep them,
/// so it clears them (`FUSE_WRITE_KILL_SUIDGID`), and `stat` shows it at once.
#[test]
fn writes_through_the_daemon_clear_set_id_bits() {
    let fx = Fixture::new("");
    for route in ["/host", "/mem"] {
        let big = fx.p(route).join("big-setid");
        fs::write(&big, vec![b'a'; 2 << 20]).unwrap();
        fs::set_permissions(&big, fs::Permissions::from_mode(0o6777)).unwrap();
        let reader = fs::File::open(&big).unwrap();
        let script = format!(
            "setpriv --reuid=65534 --regid=65534 --clear-groups sh -c 'echo x >> {0}' && stat -c %a {0}",
            big.display()
        );
        assert_eq!(sh_ok(&fx.mount.dir, &script), "777\n", "{route}");
        drop(reader);
    }
}

#[test]
fn mmap_and_fsync() {
    let fx = Fixture::new("");
    for route in ROUTES {
        let f = fx.p(&format!("{route}/mm"));
        fs::write(&f, vec![b'a'; 8192]).unwrap();
        let file = fs::OpenOptions::new().read(true).write(true).open(&f).unwrap();
        unsafe {
            use std::os::fd::AsRawFd;
            let p = libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            );
            assert_ne!(p, libc::MAP_FAILED, "{route}: mmap");
            let bytes = std::slice::from_raw_parts_mut(p as *mut u8, 8192);
            assert_eq!(bytes[100], b'a', "{route}: mmap read");
            bytes[4096..4101].copy_from_slice(b"MMAP!");
            assert_eq!(libc::msync(p, 8192, libc::MS_SYNC), 0, "{route}");
            libc::munmap(p, 8192);
        }
        file.sync_all().unwrap();
        drop(file);
        let data = fs::read(&f).unwrap();
        assert_eq!(&data[4096..4101], b"MMAP!", "{route}: mmap write visible to read");
    }
}

/// A file open through the mount whose every name was deleted opens again through its
/// descriptor's `/proc/self/fd/N` link, for reading and for writing, as on a local filesystem.
/// That is how `cat /dev/stdin` reads a shell's here-document: bash writes it to a file in
/// `$TMPDIR`, opens it, deletes it, and hands the descriptor on as stdin.
#[test]
fn a_deleted_file_opens_again_through_its_descriptor() {
    use std::os::fd::AsRawFd;
    let fx = Fixture::new("");
    for route in ROUTES {
        let f = fx.p(&format!("{route}/gone.txt"));
        let link = fx.p(&format!("{route}/gone-link.txt"));
        fs::write(&f, "kept").unwrap();
        fs::hard_link(&f, &link).unwrap();
        let mut held = fs::File::open(&f).unwrap();
        let magic = format!("/proc/self/fd/{}", held.as_raw_fd());
        fs::remove_file(&f).unwrap();
        assert_eq!(fs::read_to_string(&magic).unwrap(), "kept", "{route}: by its other name");
        fs::remove_file(&link).unwrap();
        assert_eq!(fs::read_to_string(&magic).unwrap(), "kept", "{route}: with no name left");
        fs::OpenOptions::new().append(true).open(&magic).unwrap().write_all(b", and more").unwrap();
        let mut seen = String::new();
        held.read_to_string(&mut seen).unwrap();
        assert_eq!(seen, "kept, and more", "{route}");
        assert_eq!(held.metadata().unwrap().nlink(), 0, "{route}");
        assert!(!f.exists() && !link.exists(), "{route}");
        // `fexecve` of a deleted program. Written by another process: a parallel test's child,
        // forked while this process held the file open for writing, would hold it open too
        // until its own exec, and the exec here would fail with ETXTBSY.
        let program = fx.p(&format!("{route}/program"));
        sh_ok(&fx.p(route), "cp /bin/true program");
        let held_program = fs::File::open(&program).unwrap();
        fs::remove_file(&program).unwrap();
        let run = std::process::Command::new(format!("/proc/self/fd/{}", held_program.as_raw_fd())).status();
        assert!(run.unwrap().success(), "{route}");

        let dir = fx.p(route);
        let script =
            "big=$(head -c 100000 /dev/zero | tr '\\0' x)\ncat /dev/stdin <<EOF | wc -c\n$big\nEOF\n";
        let out = sh_ok(&dir, &format!("TMPDIR=\"$PWD\" bash -c '{}'", script.replace('\'', "'\\''")));
        assert_eq!(out.trim(), "100001", "{route}: a here-document read through /dev/stdin");
    }
}

/// `fsync` of a directory reaches every backend's own sync (host: the host directory's
/// `fsync`; sqlite and postgres: their logs, see pg_faults for the postgres crash test) and
/// succeeds, for a directory whose names just changed and for the route's root.
#[test]
fn fsync_of_a_directory_succeeds_on_every_route() {
    let fx = Fixture::new("");
    for route in ROUTES {
        let dir = fx.p(route).join("synced");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("a"), "a").unwrap();
        fs::rename(dir.join("a"), dir.join("b")).unwrap();
        for d in [&dir, &fx.p(route)] {
            fs::File::open(d).unwrap().sync_all().unwrap_or_else(|e| panic!("{route}: fsync of {d:?}: {e}"));
        }
        assert_eq!(fs::read_to_string(dir.join("b")).unwrap(), "a", "{route}");
    }
}

/// A host root may hold mounts of other filesystems, whose inode numbers repeat its own: files
/// with one inode number on two filesystems are two files through the mount, never two names
/// of one (which showed one's content under the other's name, and sent writes to the other).
#[test]
fn files_with_one_inode_number_on_two_filesystems_in_a_host_root_stay_apart() {
    let fx = Fixture::new("");
    let disks = (
        HostMount::small_disk(&fx.host_root.join("a"), 4),
        HostMount::small_disk(&fx.host_root.join("b"), 4),
    );
    fs::write(fx.host_root.join("a/f"), "on a").unwrap();
    fs::write(fx.host_root.join("b/f"), "on b").unwrap();
    let host_ino = |p: &str| fs::metadata(fx.host_root.join(p)).unwrap().ino();
    assert_eq!(host_ino("a/f"), host_ino("b/f"), "two fresh tmpfs number their first files alike");
    assert_eq!(fs::read_to_string(fx.p("/host/a/f")).unwrap(), "on a");
    assert_eq!(fs::read_to_string(fx.p("/host/b/f")).unwrap(), "on b");
    let ino = |p: &str| fs::metadata(fx.p(p)).unwrap().ino();
    assert_ne!(ino("/host/a/f"), ino("/host/b/f"));
    fs::write(fx.p("/host/b/f"), "written through b").unwrap();
    assert_eq!(fs::read_to_string(fx.host_root.join("a/f")).unwrap(), "on a");
    assert_eq!(fs::read_to_string(fx.host_root.join("b/f")).unwrap(), "written through b");
    drop(disks);
}

/// `fstat` of a file held open whose directory a tool deleted and whose directory's name now
/// leads to a symlink answers the file (deleted: a link count of 0), as on a local filesystem,
/// on every route. The kernel asks without the descriptor, and the daemon's walk of the old
/// path met the symlink (ELOOP, since it never follows one), which it answered instead.
#[test]
fn fstat_of_a_file_whose_directory_became_a_symlink_answers_the_file() {
    let fx = Fixture::new("");
    let mut client =
        agentvfs::control::client::Client::connect(&fx.scratch.path().join("agentvfs.sock")).unwrap();
    for route in ROUTES {
        let dir = fx.p(&format!("{route}/went"));
        fs::create_dir(&dir).unwrap();
        let held = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join("a"))
            .unwrap();
        let (ok, text) =
            call_tool(&mut client, "delete", serde_json::json!({"file_path": format!("{route}/went")}));
        assert!(ok, "{route}: {text}");
        symlink("a", &dir).unwrap();
        let st = held.metadata().map_err(errno_of);
        assert_eq!(st.map(|m| (m.len(), m.nlink())), Ok((0, 0)), "{route}");
    }
}
