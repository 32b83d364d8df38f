//! Unit tests of the in-memory backend: bookkeeping, error numbers, cap, concurrency.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::MemoryBackend;
use crate::backend::{
    Backend, Caller, DirEntry, FileKind, SetAttr, TimeSet, RENAME_EXCHANGE, RENAME_NOREPLACE,
};
use crate::error::{Errno, FsResult};

const ALICE: Caller = Caller { uid: 1000, gid: 100, pid: 1 };
const BOB: Caller = Caller { uid: 2000, gid: 200, pid: 2 };

fn errno<T>(r: FsResult<T>) -> Errno {
    match r {
        Ok(_) => panic!("operation should fail"),
        Err(e) => e.errno,
    }
}

fn file(b: &MemoryBackend, path: &str, data: &[u8]) {
    let (_, f) = b.create(path, 0o644, libc::O_RDWR, &ALICE).unwrap();
    assert_eq!(f.write(0, data).unwrap(), data.len() as u32);
}

fn content(b: &MemoryBackend, path: &str) -> Vec<u8> {
    b.open(path, libc::O_RDONLY).unwrap().read(0, 1 << 20).unwrap()
}

fn names(b: &MemoryBackend, path: &str) -> Vec<String> {
    let mut v: Vec<String> = b.readdir(path).unwrap().into_iter().map(|e| e.name).collect();
    v.sort();
    v
}

fn nlink(b: &MemoryBackend, path: &str) -> u32 {
    b.getattr(path).unwrap().nlink
}

/// Sets all times of `path` to a fixed past instant so later changes are visible.
fn age(b: &MemoryBackend, path: &str) -> SystemTime {
    let old = UNIX_EPOCH + Duration::from_secs(1_000_000);
    let changes =
        SetAttr { atime: Some(TimeSet::At(old)), mtime: Some(TimeSet::At(old)), ..SetAttr::default() };
    b.setattr(path, &changes).unwrap();
    old
}

#[test]
fn root_is_daemon_owned_dir() {
    let b = MemoryBackend::new(None);
    let a = b.getattr("").unwrap();
    let me = Caller::daemon();
    assert_eq!(a.kind, FileKind::Dir);
    assert_eq!(a.perm, 0o755);
    assert_eq!((a.uid, a.gid), (me.uid, me.gid));
    assert_eq!(a.nlink, 2);
    assert_eq!(a.blksize, 4096);
    assert!(b.readdir("").unwrap().is_empty());
    assert_eq!(b.describe(), "memory");
    assert_eq!(MemoryBackend::new(Some(10)).describe(), "memory (cap 10 bytes)");
}

#[test]
fn create_write_read_truncate() {
    let b = MemoryBackend::new(None);
    let (a, f) = b.create("f", 0o640, libc::O_RDWR, &ALICE).unwrap();
    assert_eq!((a.kind, a.perm, a.size, a.nlink, a.uid, a.gid), (FileKind::File, 0o640, 0, 1, 1000, 100));
    assert_eq!(errno(b.create("f", 0o644, libc::O_RDWR, &ALICE)), Errno::EEXIST);
    assert_eq!(f.write(0, b"hello").unwrap(), 5);
    assert_eq!(f.read(0, 100).unwrap(), b"hello");
    assert_eq!(f.read(1, 3).unwrap(), b"ell");
    assert_eq!(f.read(5, 10).unwrap(), b"");
    assert_eq!(f.read(99, 10).unwrap(), b"");
    // A write past EOF zero-fills the gap.
    assert_eq!(f.write(600, b"x").unwrap(), 1);
    let a = f.getattr().unwrap();
    assert_eq!((a.size, a.blocks), (601, 8), "one page, charged whole");
    let data = f.read(0, 1000).unwrap();
    assert_eq!(data.len(), 601);
    assert_eq!(&data[..5], b"hello");
    assert!(data[5..600].iter().all(|&c| c == 0));
    assert_eq!(data[600], b'x');
    assert_eq!(f.write(600, b"").unwrap(), 0);
    // Truncate through the path and through the handle.
    let a = b.setattr("f", &SetAttr { size: Some(3), ..SetAttr::default() }).unwrap();
    assert_eq!((a.size, a.blocks), (3, 8));
    assert_eq!(content(&b, "f"), b"hel");
    let a = f.setattr(&SetAttr { size: Some(6), ..SetAttr::default() }).unwrap();
    assert_eq!(a.size, 6);
    assert_eq!(content(&b, "f"), b"hel\0\0\0");
    let a = b.setattr("f", &SetAttr { size: Some(0), ..SetAttr::default() }).unwrap();
    assert_eq!((a.size, a.blocks), (0, 0));
    assert_eq!(b.readdir("").unwrap(), vec![DirEntry { name: "f".into(), kind: FileKind::File }]);
}

#[test]
fn access_modes_and_append() {
    let b = MemoryBackend::new(None);
    file(&b, "f", b"abc");
    let ro = b.open("f", libc::O_RDONLY).unwrap();
    assert_eq!(errno(ro.write(0, b"x")), Errno::EBADF);
    assert_eq!(errno(ro.fallocate(0, 10, 0)), Errno::EBADF);
    let wo = b.open("f", libc::O_WRONLY | libc::O_APPEND).unwrap();
    assert_eq!(errno(wo.read(0, 1)), Errno::EBADF);
    assert_eq!(wo.write(0, b"de").unwrap(), 2);
    assert_eq!(ro.read(0, 10).unwrap(), b"abcde");
    // The kernel's write-back of cached pages (mmap) lands where the pages belong.
    assert_eq!(wo.write_back(1, b"B").unwrap(), 1);
    assert_eq!(ro.read(0, 10).unwrap(), b"aBcde");
    b.mkdir("d", 0o755, &ALICE).unwrap();
    assert_eq!(errno(b.open("d", libc::O_WRONLY)), Errno::EISDIR);
    assert_eq!(errno(b.open("d", libc::O_RDWR)), Errno::EISDIR);
    let d = b.open("d", libc::O_RDONLY).unwrap();
    assert_eq!(errno(d.read(0, 1)), Errno::EISDIR);
    assert_eq!(d.getattr().unwrap().kind, FileKind::Dir);
    b.symlink("l", b"f", &ALICE).unwrap();
    assert_eq!(errno(b.open("l", libc::O_RDONLY)), Errno::ELOOP);
}

#[test]
fn lookup_errors() {
    let b = MemoryBackend::new(None);
    file(&b, "f", b"");
    assert_eq!(errno(b.getattr("nope")), Errno::ENOENT);
    assert_eq!(errno(b.getattr("nope/x")), Errno::ENOENT);
    assert_eq!(errno(b.getattr("f/x")), Errno::ENOTDIR);
    assert_eq!(errno(b.create("f/x", 0o644, 0, &ALICE)), Errno::ENOTDIR);
    assert_eq!(errno(b.mkdir("nope/x", 0o755, &ALICE)), Errno::ENOENT);
    assert_eq!(errno(b.readdir("f")), Errno::ENOTDIR);
    let long = "n".repeat(256);
    assert_eq!(errno(b.create(&long, 0o644, 0, &ALICE)), Errno::ENAMETOOLONG);
    assert_eq!(errno(b.getattr(&long)), Errno::ENAMETOOLONG);
    assert_eq!(errno(b.mkdir(&format!("{long}/x"), 0o755, &ALICE)), Errno::ENAMETOOLONG);
    b.create(&"n".repeat(255), 0o644, 0, &ALICE).unwrap();
    assert_eq!(errno(b.readlink("f")), Errno::EINVAL);
    assert_eq!(errno(b.mkdir("", 0o755, &ALICE)), Errno::EEXIST);
    assert_eq!(errno(b.unlink("")), Errno::EISDIR);
    assert_eq!(errno(b.rmdir("")), Errno::EBUSY);
    assert_eq!(errno(b.rename("", "x", 0)), Errno::EBUSY);
    assert_eq!(errno(b.rename("f", "", 0)), Errno::EBUSY);
    assert_eq!(errno(b.rename("f", "", RENAME_NOREPLACE)), Errno::EEXIST);
}

#[test]
fn mkdir_rmdir_and_dir_nlink() {
    let b = MemoryBackend::new(None);
    let a = b.mkdir("d", 0o6777, &ALICE).unwrap();
    // mkdir ignores set-ID bits in its mode; the sticky bit stays.
    assert_eq!((a.kind, a.perm, a.nlink, a.size, a.blocks), (FileKind::Dir, 0o777, 2, 4096, 0));
    assert_eq!(nlink(&b, ""), 3);
    b.mkdir("d/e", 0o1755, &ALICE).unwrap();
    assert_eq!(b.getattr("d/e").unwrap().perm, 0o1755);
    file(&b, "d/f", b"");
    assert_eq!(nlink(&b, "d"), 3);
    assert_eq!(errno(b.mkdir("d", 0o755, &ALICE)), Errno::EEXIST);
    assert_eq!(errno(b.rmdir("d")), Errno::ENOTEMPTY);
    assert_eq!(errno(b.rmdir("d/f")), Errno::ENOTDIR);
    assert_eq!(errno(b.rmdir("d/zz")), Errno::ENOENT);
    assert_eq!(errno(b.unlink("d")), Errno::EISDIR);
    b.rmdir("d/e").unwrap();
    assert_eq!(nlink(&b, "d"), 2);
    b.unlink("d/f").unwrap();
    assert_eq!(errno(b.unlink("d/f")), Errno::ENOENT);
    b.rmdir("d").unwrap();
    assert_eq!(nlink(&b, ""), 2);
    assert!(b.readdir("").unwrap().is_empty());
}

#[test]
fn mknod_kinds() {
    let b = MemoryBackend::new(None);
    let a = b.mknod("fifo", libc::S_IFIFO | 0o600, 7, &ALICE).unwrap();
    assert_eq!((a.kind, a.perm, a.rdev, a.size), (FileKind::Fifo, 0o600, 0, 0));
    let a = b.mknod("chr", libc::S_IFCHR | 0o660, 0x0103, &ALICE).unwrap();
    assert_eq!((a.kind, a.rdev), (FileKind::CharDevice, 0x0103));
    let a = b.mknod("blk", libc::S_IFBLK | 0o660, 0x0801, &ALICE).unwrap();
    assert_eq!((a.kind, a.rdev), (FileKind::BlockDevice, 0x0801));
    assert_eq!(b.mknod("sock", libc::S_IFSOCK | 0o644, 0, &ALICE).unwrap().kind, FileKind::Socket);
    assert_eq!(b.mknod("reg", 0o644, 0, &ALICE).unwrap().kind, FileKind::File);
    assert_eq!(b.mknod("reg2", libc::S_IFREG | 0o644, 0, &ALICE).unwrap().kind, FileKind::File);
    assert_eq!(errno(b.mknod("dir", libc::S_IFDIR | 0o755, 0, &ALICE)), Errno::EPERM);
    assert_eq!(errno(b.mknod("lnk", libc::S_IFLNK | 0o777, 0, &ALICE)), Errno::EINVAL);
    assert_eq!(errno(b.mknod("fifo", libc::S_IFIFO | 0o600, 0, &ALICE)), Errno::EEXIST);
    let mut kinds: Vec<_> = b.readdir("").unwrap().into_iter().map(|e| (e.name, e.kind)).collect();
    kinds.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(kinds[0], ("blk".to_string(), FileKind::BlockDevice));
    assert_eq!(kinds[1], ("chr".to_string(), FileKind::CharDevice));
}

#[test]
fn hard_links_and_nlink() {
    let b = MemoryBackend::new(None);
    file(&b, "a", b"data");
    b.mkdir("d", 0o755, &ALICE).unwrap();
    let ino = b.getattr("a").unwrap().ino;
    let a = b.link("a", "d/b").unwrap();
    assert_eq!((a.ino, a.nlink), (ino, 2));
    assert_eq!(nlink(&b, "a"), 2);
    // Linking does not count as a subdirectory.
    assert_eq!(nlink(&b, "d"), 2);
    assert_eq!(content(&b, "d/b"), b"data");
    assert_eq!(errno(b.link("a", "d/b")), Errno::EEXIST);
    assert_eq!(errno(b.link("d", "d2")), Errno::EPERM);
    assert_eq!(errno(b.link("d", "a")), Errno::EEXIST);
    assert_eq!(errno(b.link("zz", "x")), Errno::ENOENT);
    assert_eq!(errno(b.link("a", "zz/x")), Errno::ENOENT);
    b.unlink("a").unwrap();
    assert_eq!(nlink(&b, "d/b"), 1);
    assert_eq!(content(&b, "d/b"), b"data");
    let a = b.link("d/b", "c").unwrap();
    assert_eq!((a.ino, a.nlink), (ino, 2));
}

#[test]
fn unlink_while_open_keeps_node_until_last_close() {
    let b = MemoryBackend::new(Some(8192));
    file(&b, "f", &[1u8; 5000]);
    let free_before = b.statfs("").unwrap().bfree;
    assert_eq!(free_before, 2 - 2);
    let f1 = b.open("f", libc::O_RDWR).unwrap();
    let f2 = b.open("f", libc::O_RDONLY).unwrap();
    b.unlink("f").unwrap();
    assert_eq!(errno(b.getattr("f")), Errno::ENOENT);
    assert_eq!(f1.getattr().unwrap().nlink, 0);
    assert_eq!(f1.write(0, b"xy").unwrap(), 2);
    assert_eq!(&f2.read(0, 3).unwrap(), &[b'x', b'y', 1]);
    // The name is free again, but the orphan still holds its bytes.
    file(&b, "f", b"");
    assert_eq!(b.statfs("").unwrap().bfree, 0);
    drop(f1);
    assert_eq!(f2.read(0, 10000).unwrap().len(), 5000);
    assert_eq!(b.statfs("").unwrap().bfree, 0);
    drop(f2);
    assert_eq!(b.statfs("").unwrap().bfree, 2);
    // An rmdir'ed directory that is open stays usable too.
    b.mkdir("d", 0o755, &ALICE).unwrap();
    let d = b.open("d", libc::O_RDONLY).unwrap();
    b.rmdir("d").unwrap();
    assert_eq!(d.getattr().unwrap().nlink, 0);
}

#[test]
fn ownership_and_setgid_inheritance() {
    let b = MemoryBackend::new(None);
    b.mkdir("plain", 0o755, &ALICE).unwrap();
    let a = b.create("plain/f", 0o644, 0, &BOB).unwrap().0;
    assert_eq!((a.uid, a.gid), (2000, 200));
    b.mkdir("shared", 0o775, &ALICE).unwrap();
    b.setattr("shared", &SetAttr { mode: Some(0o2775), gid: Some(500), ..SetAttr::default() }).unwrap();
    let a = b.create("shared/f", 0o644, 0, &BOB).unwrap().0;
    assert_eq!((a.uid, a.gid, a.perm), (2000, 500, 0o644));
    let a = b.mkdir("shared/sub", 0o755, &BOB).unwrap();
    assert_eq!((a.uid, a.gid, a.perm), (2000, 500, 0o2755));
    // The inherited bit propagates further down.
    let a = b.mkdir("shared/sub/deeper", 0o700, &ALICE).unwrap();
    assert_eq!((a.uid, a.gid, a.perm), (1000, 500, 0o2700));
    let a = b.symlink("shared/l", b"f", &BOB).unwrap();
    assert_eq!((a.uid, a.gid, a.perm), (2000, 500, 0o777));
    let a = b.mknod("shared/p", libc::S_IFIFO | 0o600, 0, &BOB).unwrap();
    assert_eq!((a.uid, a.gid), (2000, 500));
    let a = b.setattr("shared/f", &SetAttr { uid: Some(7), gid: Some(8), ..SetAttr::default() });
    assert_eq!(a.map(|a| (a.uid, a.gid)).unwrap(), (7, 8));
}

#[test]
fn times_are_updated_on_the_right_nodes() {
    let b = MemoryBackend::new(None);
    b.mkdir("d", 0o755, &ALICE).unwrap();
    b.mkdir("e", 0o755, &ALICE).unwrap();
    file(&b, "d/f", b"abc");
    let old = age(&b, "d");
    age(&b, "e");
    age(&b, "");
    let fold = age(&b, "d/f");
    // setattr with explicit times sets them exactly and ctime to now.
    let a = b.getattr("d/f").unwrap();
    assert_eq!((a.atime, a.mtime), (fold, fold));
    assert!(a.ctime > old);
    let t0 = SystemTime::now();

    // An entry change touches the parent's mtime and ctime, not the grandparent's.
    b.create("d/g", 0o644, 0, &ALICE).unwrap();
    let d = b.getattr("d").unwrap();
    assert!(d.mtime >= t0 && d.ctime >= t0);
    assert_eq!(d.atime, old);
    assert_eq!(b.getattr("").unwrap().mtime, old);
    assert_eq!(b.getattr("d/f").unwrap().mtime, fold);

    // link: new parent's mtime, node's ctime (not mtime).
    age(&b, "d/f");
    let t1 = SystemTime::now();
    b.link("d/f", "e/h").unwrap();
    let f = b.getattr("d/f").unwrap();
    assert_eq!(f.mtime, fold);
    assert!(f.ctime >= t1);
    assert!(b.getattr("e").unwrap().mtime >= t1);

    // unlink: parent and the remaining name's node.
    age(&b, "d");
    age(&b, "d/f");
    let t2 = SystemTime::now();
    b.unlink("e/h").unwrap();
    assert!(b.getattr("e").unwrap().mtime >= t2);
    assert_eq!(b.getattr("d").unwrap().mtime, old);
    let f = b.getattr("d/f").unwrap();
    assert_eq!(f.mtime, fold);
    assert!(f.ctime >= t2);

    // rename: both parents' mtime/ctime and the moved node's ctime.
    age(&b, "d");
    age(&b, "e");
    age(&b, "d/f");
    let t3 = SystemTime::now();
    b.rename("d/f", "e/f", 0).unwrap();
    for dir in ["d", "e"] {
        let a = b.getattr(dir).unwrap();
        assert!(a.mtime >= t3 && a.ctime >= t3, "{dir}");
    }
    let f = b.getattr("e/f").unwrap();
    assert_eq!(f.mtime, fold);
    assert!(f.ctime >= t3);

    // write and truncate: the file's mtime and ctime, not the parent's.
    age(&b, "e");
    age(&b, "e/f");
    let t4 = SystemTime::now();
    let h = b.open("e/f", libc::O_RDWR).unwrap();
    h.write(1, b"z").unwrap();
    let f = h.getattr().unwrap();
    assert!(f.mtime >= t4 && f.ctime >= t4);
    assert_eq!(b.getattr("e").unwrap().mtime, old);
    age(&b, "e/f");
    let t5 = SystemTime::now();
    let f = b.setattr("e/f", &SetAttr { size: Some(1), ..SetAttr::default() }).unwrap();
    assert!(f.mtime >= t5 && f.ctime >= t5);

    // chmod and xattr changes touch only ctime.
    age(&b, "e/f");
    let t6 = SystemTime::now();
    let f = b.setattr("e/f", &SetAttr { mode: Some(0o600), ..SetAttr::default() }).unwrap();
    assert_eq!((f.perm, f.mtime), (0o600, fold));
    assert!(f.ctime >= t6);
    age(&b, "e/f");
    let t7 = SystemTime::now();
    b.setxattr("e/f", "user.k", b"v", 0).unwrap();
    let f = b.getattr("e/f").unwrap();
    assert_eq!(f.mtime, fold);
    assert!(f.ctime >= t7);

    // A read refreshes an atime that is not newer than mtime (relatime).
    age(&b, "e/f");
    let t8 = SystemTime::now();
    h.read(0, 1).unwrap();
    assert!(b.getattr("e/f").unwrap().atime >= t8);

    // rmdir: the parent.
    b.mkdir("e/sub", 0o755, &ALICE).unwrap();
    age(&b, "e");
    let t9 = SystemTime::now();
    b.rmdir("e/sub").unwrap();
    assert!(b.getattr("e").unwrap().mtime >= t9);

    // TimeSet::Now.
    let t10 = SystemTime::now();
    let f = b.setattr("e/f", &SetAttr { mtime: Some(TimeSet::Now), ..SetAttr::default() }).unwrap();
    assert!(f.mtime >= t10);
}

#[test]
fn rename_replaces_files_and_empty_dirs() {
    let b = MemoryBackend::new(None);
    file(&b, "a", b"A");
    file(&b, "b", b"B");
    let ino_a = b.getattr("a").unwrap().ino;
    b.rename("a", "b", 0).unwrap();
    assert_eq!(names(&b, ""), ["b"]);
    assert_eq!(content(&b, "b"), b"A");
    assert_eq!(b.getattr("b").unwrap().ino, ino_a);

    // A replaced file that is still open survives as an orphan.
    file(&b, "c", b"C");
    let h = b.open("b", libc::O_RDONLY).unwrap();
    b.rename("c", "b", 0).unwrap();
    assert_eq!(h.read(0, 9).unwrap(), b"A");
    assert_eq!(h.getattr().unwrap().nlink, 0);

    // Directory onto an empty directory, across parents.
    b.mkdir("p", 0o755, &ALICE).unwrap();
    b.mkdir("q", 0o755, &ALICE).unwrap();
    b.mkdir("p/x", 0o755, &ALICE).unwrap();
    b.mkdir("q/y", 0o755, &ALICE).unwrap();
    file(&b, "p/x/inner", b"i");
    b.rename("p/x", "q/y", 0).unwrap();
    assert_eq!(content(&b, "q/y/inner"), b"i");
    assert_eq!((nlink(&b, "p"), nlink(&b, "q")), (2, 3));
    assert_eq!(nlink(&b, ""), 4);

    // Moving a directory without replacing fixes both parents' link counts.
    b.rename("q/y", "p/z", 0).unwrap();
    assert_eq!((nlink(&b, "p"), nlink(&b, "q")), (3, 2));
    b.rename("p/z", "top", 0).unwrap();
    assert_eq!((nlink(&b, "p"), nlink(&b, "")), (2, 5));
    // Renaming within one directory leaves its count alone.
    b.rename("top", "top2", 0).unwrap();
    assert_eq!(nlink(&b, ""), 5);
    assert_eq!(content(&b, "top2/inner"), b"i");
}

#[test]
fn rename_errors() {
    let b = MemoryBackend::new(None);
    file(&b, "f", b"F");
    b.mkdir("d", 0o755, &ALICE).unwrap();
    b.mkdir("full", 0o755, &ALICE).unwrap();
    file(&b, "full/x", b"");
    b.mkdir("d/sub", 0o755, &ALICE).unwrap();
    assert_eq!(errno(b.rename("nope", "x", 0)), Errno::ENOENT);
    assert_eq!(errno(b.rename("f", "nope/x", 0)), Errno::ENOENT);
    assert_eq!(errno(b.rename("f", "f/x", 0)), Errno::ENOTDIR);
    assert_eq!(errno(b.rename("d", "f", 0)), Errno::ENOTDIR);
    assert_eq!(errno(b.rename("f", "d", 0)), Errno::EISDIR);
    assert_eq!(errno(b.rename("d", "full", 0)), Errno::ENOTEMPTY);
    assert_eq!(errno(b.rename("d", "d/sub/x", 0)), Errno::EINVAL);
    assert_eq!(errno(b.rename("d", "d/sub", 0)), Errno::EINVAL);
    // Onto an ancestor of the source: that target is necessarily non-empty.
    assert_eq!(errno(b.rename("d/sub", "d", 0)), Errno::ENOTEMPTY);
    assert_eq!(errno(b.rename("f", "g", 4)), Errno::EINVAL);
    assert_eq!(errno(b.rename("f", "g", RENAME_NOREPLACE | RENAME_EXCHANGE)), Errno::EINVAL);
    assert_eq!(errno(b.rename("f", &"n".repeat(256), 0)), Errno::ENAMETOOLONG);
    // Nothing moved.
    assert_eq!(names(&b, ""), ["d", "f", "full"]);
    assert_eq!(names(&b, "d"), ["sub"]);
    assert_eq!(nlink(&b, "d"), 3);
    // Same name onto itself succeeds.
    b.rename("f", "f", 0).unwrap();
    b.rename("d", "d", 0).unwrap();
    assert_eq!(names(&b, ""), ["d", "f", "full"]);
}

#[test]
fn rename_noreplace() {
    let b = MemoryBackend::new(None);
    file(&b, "a", b"A");
    file(&b, "b", b"B");
    assert_eq!(errno(b.rename("a", "b", RENAME_NOREPLACE)), Errno::EEXIST);
    assert_eq!(errno(b.rename("a", "a", RENAME_NOREPLACE)), Errno::EEXIST);
    assert_eq!(content(&b, "b"), b"B");
    b.rename("a", "c", RENAME_NOREPLACE).unwrap();
    assert_eq!(names(&b, ""), ["b", "c"]);
    assert_eq!(content(&b, "c"), b"A");
}

#[test]
fn rename_exchange() {
    let b = MemoryBackend::new(None);
    file(&b, "a", b"A");
    b.mkdir("p", 0o755, &ALICE).unwrap();
    file(&b, "p/b", b"B");
    assert_eq!(errno(b.rename("a", "p/none", RENAME_EXCHANGE)), Errno::ENOENT);
    assert_eq!(errno(b.rename("none", "a", RENAME_EXCHANGE)), Errno::ENOENT);
    let (ia, ib) = (b.getattr("a").unwrap().ino, b.getattr("p/b").unwrap().ino);
    b.rename("a", "p/b", RENAME_EXCHANGE).unwrap();
    assert_eq!((content(&b, "a"), content(&b, "p/b")), (b"B".to_vec(), b"A".to_vec()));
    assert_eq!((b.getattr("a").unwrap().ino, b.getattr("p/b").unwrap().ino), (ib, ia));

    // A directory and a file swap across parents: the `..` link moves with the directory.
    b.mkdir("p/dir", 0o755, &ALICE).unwrap();
    assert_eq!((nlink(&b, ""), nlink(&b, "p")), (3, 3));
    b.rename("a", "p/dir", RENAME_EXCHANGE).unwrap();
    assert_eq!(b.getattr("a").unwrap().kind, FileKind::Dir);
    assert_eq!(b.getattr("p/dir").unwrap().kind, FileKind::File);
    assert_eq!((nlink(&b, ""), nlink(&b, "p")), (4, 2));

    // Non-empty directories may be exchanged; a directory may not swap with its descendant.
    file(&b, "a/x", b"");
    b.mkdir("p/other", 0o755, &ALICE).unwrap();
    b.rename("a", "p/other", RENAME_EXCHANGE).unwrap();
    assert_eq!(names(&b, "p/other"), ["x"]);
    assert_eq!(errno(b.rename("p", "p/other", RENAME_EXCHANGE)), Errno::EINVAL);
    assert_eq!(errno(b.rename("p/other", "p", RENAME_EXCHANGE)), Errno::EINVAL);
}

#[test]
fn rename_onto_other_hard_link_is_a_noop() {
    let b = MemoryBackend::new(None);
    file(&b, "a", b"A");
    b.link("a", "b").unwrap();
    b.rename("a", "b", 0).unwrap();
    assert_eq!(names(&b, ""), ["a", "b"]);
    assert_eq!(nlink(&b, "a"), 2);
    b.rename("a", "b", RENAME_EXCHANGE).unwrap();
    assert_eq!(names(&b, ""), ["a", "b"]);
    assert_eq!(errno(b.rename("a", "b", RENAME_NOREPLACE)), Errno::EEXIST);
}

fn truncate(b: &MemoryBackend, path: &str, size: u64) -> FsResult<crate::backend::Attr> {
    b.setattr(path, &SetAttr { size: Some(size), ..SetAttr::default() })
}

/// Pages allocated, as statfs reports them.
fn used(b: &MemoryBackend) -> u64 {
    b.statfs("").map(|s| s.blocks - s.bfree).unwrap()
}

#[test]
fn holes_are_free() {
    let b = MemoryBackend::new(Some(10 << 20));
    let (_, f) = b.create("f", 0o644, libc::O_RDWR, &ALICE).unwrap();
    // Far past the cap: a size, not an allocation.
    let a = f.setattr(&SetAttr { size: Some(1 << 30), ..SetAttr::default() }).unwrap();
    assert_eq!((a.size, a.blocks, used(&b)), (1 << 30, 0, 0));
    assert_eq!(f.read((1 << 30) - 4, 100).unwrap(), [0; 4]);
    // Data in the middle of the hole allocates the pages it touches, no more.
    assert_eq!(f.write((512 << 20) + 4090, b"straddles two pages").unwrap(), 19);
    assert_eq!((f.getattr().unwrap().blocks, used(&b)), (16, 2));
    let want = [&[0; 10][..], b"straddles two pages", &[0; 11]].concat();
    assert_eq!(f.read((512 << 20) + 4080, 40).unwrap(), want);
    // Growing by a write past the end leaves a hole too.
    let g = b.create("g", 0o644, libc::O_RDWR, &ALICE).unwrap().1;
    g.write(1 << 40, b"x").unwrap();
    let a = g.getattr().unwrap();
    assert_eq!((a.size, a.blocks), ((1 << 40) + 1, 8));
    assert_eq!(used(&b), 3);
}

#[test]
fn writes_stop_at_the_page_that_crosses_the_cap() {
    // The cap rounds up to whole pages, as the private tmpfs rounds its size.
    let b = MemoryBackend::new(Some(4 * 4096 - 100));
    assert_eq!(b.statfs("").unwrap().blocks, 4);
    let (_, f) = b.create("f", 0o644, libc::O_RDWR, &ALICE).unwrap();
    f.write(0, b"a").unwrap();
    f.write(2 * 4096, b"c").unwrap();
    assert_eq!(used(&b), 2);
    // Pages 0 and 2 exist; 1 and 3 fit, 4 does not: the write stops where page 4 begins.
    assert_eq!(f.write(10, &[7; 5 * 4096]).unwrap(), 4 * 4096 - 10);
    assert_eq!((f.getattr().unwrap().size, used(&b)), (4 * 4096, 4));
    // The next write needs a page: ENOSPC, and nothing changes.
    let before = f.getattr().unwrap();
    assert_eq!(errno(f.write(4 * 4096, b"x")), Errno::ENOSPC);
    assert_eq!(errno(f.write(1 << 20, b"x")), Errno::ENOSPC);
    assert_eq!(errno(f.fallocate(4 * 4096, 1, 0)), Errno::ENOSPC);
    assert_eq!(errno(b.symlink("l", &[b'l'; 128], &ALICE)), Errno::ENOSPC);
    assert_eq!(errno(b.getattr("l")), Errno::ENOENT);
    assert_eq!(f.getattr().unwrap(), before);
    // What allocates nothing still works: overwrites, growth, empty files, short symlinks.
    f.write(0, &[1; 4096 * 4]).unwrap();
    truncate(&b, "f", 1 << 30).unwrap();
    file(&b, "empty", b"");
    b.symlink("short", &[b's'; 127], &ALICE).unwrap();
    assert_eq!(used(&b), 4);
}

#[test]
fn freed_pages_are_free_at_once() {
    let b = MemoryBackend::new(Some(4 * 4096));
    file(&b, "f", &[1; 4 * 4096]);
    assert_eq!(errno(b.create("g", 0o644, libc::O_RDWR, &ALICE).unwrap().1.write(0, b"x")), Errno::ENOSPC);
    // Truncating frees every page past the new end; the partial page stays.
    assert_eq!((truncate(&b, "f", 4096 + 1).unwrap().blocks, used(&b)), (16, 2));
    assert_eq!(content(&b, "f"), [&[1; 4097][..]].concat());
    // Growing again reads zeros where the data was cut off.
    assert_eq!((truncate(&b, "f", 3 * 4096).unwrap().blocks, used(&b)), (16, 2));
    assert_eq!(content(&b, "f")[4097..], [0; 2 * 4096 - 1]);
    // An unlink with no handle open frees the pages before it returns.
    b.unlink("f").unwrap();
    assert_eq!(used(&b), 0);
    let g = b.open("g", libc::O_RDWR).unwrap();
    assert_eq!(g.write(0, &[2; 4 * 4096]).unwrap(), 4 * 4096);
    // So does a rename over a file.
    file(&b, "h", b"");
    b.rename("h", "g", 0).unwrap();
    drop(g);
    assert_eq!(used(&b), 0);
    // A long symlink target takes a page until the symlink goes.
    b.symlink("l", &[b'l'; 128], &ALICE).unwrap();
    assert_eq!((b.getattr("l").unwrap().blocks, used(&b)), (8, 1));
    b.unlink("l").unwrap();
    assert_eq!(used(&b), 0);
}

#[test]
fn fallocate_reserves_all_or_nothing_and_punching_frees() {
    const KEEP_SIZE: i32 = 1;
    const PUNCH_HOLE: i32 = 2;
    let b = MemoryBackend::new(Some(8 * 4096));
    let (_, f) = b.create("f", 0o644, libc::O_RDWR, &ALICE).unwrap();
    f.write(0, b"data").unwrap();
    // Nine pages do not fit in eight, even though one of them exists.
    let before = f.getattr().unwrap();
    assert_eq!(errno(f.fallocate(0, 9 * 4096, 0)), Errno::ENOSPC);
    assert_eq!((f.getattr().unwrap(), used(&b)), (before, 1));
    // Four fit (three of them new), then four more past the end: the size follows the first
    // reservation, not the one with KEEP_SIZE.
    f.fallocate(0, 4 * 4096, 0).unwrap();
    assert_eq!((f.getattr().unwrap().size, f.getattr().unwrap().blocks, used(&b)), (4 * 4096, 32, 4));
    f.fallocate(4 * 4096, 4 * 4096, KEEP_SIZE).unwrap();
    assert_eq!((f.getattr().unwrap().size, f.getattr().unwrap().blocks, used(&b)), (4 * 4096, 64, 8));
    assert_eq!(f.read(0, 10).unwrap(), b"data\0\0\0\0\0\0");
    // Reserved pages take writes without another allocation.
    assert_eq!(f.write(6 * 4096, b"in reserve").unwrap(), 10);
    assert_eq!((f.getattr().unwrap().size, used(&b)), (6 * 4096 + 10, 8));
    // Punching frees the pages wholly inside the range and zeroes the rest; the size stays.
    assert_eq!(errno(f.fallocate(0, 4096, PUNCH_HOLE)), Errno::EOPNOTSUPP);
    f.fallocate(2, 3 * 4096, PUNCH_HOLE | KEEP_SIZE).unwrap();
    assert_eq!((f.getattr().unwrap().size, used(&b)), (6 * 4096 + 10, 6));
    assert_eq!(f.read(0, 4).unwrap(), b"da\0\0");
    // A truncation to the current size drops the reserved pages past the end, as on tmpfs.
    assert_eq!((truncate(&b, "f", 6 * 4096 + 10).unwrap().blocks, used(&b)), (40, 5));
    assert_eq!(f.read(6 * 4096, 100).unwrap(), b"in reserve");
}

#[test]
fn statfs_reports_cap_and_usage() {
    let b = MemoryBackend::new(Some(40960));
    let s = b.statfs("").unwrap();
    assert_eq!((s.bsize, s.frsize, s.namelen), (4096, 4096, 255));
    assert_eq!((s.blocks, s.bfree, s.bavail), (10, 10, 10));
    assert_eq!(s.files - s.ffree, 1);
    file(&b, "f", &[0u8; 4097]);
    let s = b.statfs("").unwrap();
    assert_eq!((s.blocks, s.bfree, s.bavail), (10, 8, 8));
    assert_eq!(s.files - s.ffree, 2);
    // Directories allocate nothing; a cap of 0 is one page, as on the private tmpfs.
    b.mkdir("d", 0o755, &ALICE).unwrap();
    assert_eq!(b.statfs("").unwrap().bfree, 8);
    assert_eq!(MemoryBackend::new(Some(0)).statfs("").unwrap().blocks, 1);
    assert_eq!(errno(b.statfs("nope")), Errno::ENOENT);
    let s = MemoryBackend::new(None).statfs("").unwrap();
    assert_eq!((s.blocks, s.bfree), (1 << 32, 1 << 32));
}

#[test]
fn fallocate_sets_the_times() {
    crate::backend::suite::fallocate_sets_the_times(&MemoryBackend::new(None));
}

#[test]
fn fallocate_modes() {
    let b = MemoryBackend::new(None);
    let (_, f) = b.create("f", 0o644, libc::O_RDWR, &ALICE).unwrap();
    f.write(0, b"ab").unwrap();
    f.fallocate(0, 1, 0).unwrap();
    assert_eq!(f.getattr().unwrap().size, 2);
    f.fallocate(1, 9, 0).unwrap();
    assert_eq!(f.read(0, 100).unwrap(), b"ab\0\0\0\0\0\0\0\0");
    f.fallocate(0, 100, 1).unwrap();
    assert_eq!(f.getattr().unwrap().size, 10);
    assert_eq!(errno(f.fallocate(0, 1, 2)), Errno::EOPNOTSUPP);
    assert_eq!(errno(f.fallocate(0, 1, 0x10)), Errno::EOPNOTSUPP);
    assert_eq!(errno(f.fallocate(0, 0, 0)), Errno::EINVAL);
    assert_eq!(errno(f.fallocate(u64::MAX, 2, 0)), Errno::EFBIG);
}

#[test]
fn setattr_errors() {
    let b = MemoryBackend::new(None);
    b.mkdir("d", 0o755, &ALICE).unwrap();
    b.symlink("l", b"d", &ALICE).unwrap();
    let trunc = SetAttr { size: Some(0), ..SetAttr::default() };
    assert_eq!(errno(b.setattr("d", &trunc)), Errno::EISDIR);
    assert_eq!(errno(b.setattr("l", &trunc)), Errno::EINVAL);
    assert_eq!(errno(b.setattr("nope", &trunc)), Errno::ENOENT);
    // An empty change set changes nothing, not even ctime.
    let before = b.getattr("d").unwrap();
    assert_eq!(b.setattr("d", &SetAttr::default()).unwrap(), before);
}

#[test]
fn symlinks() {
    let b = MemoryBackend::new(None);
    let a = b.symlink("l", b"../some/where", &ALICE).unwrap();
    assert_eq!((a.kind, a.size, a.perm, a.nlink), (FileKind::Symlink, 13, 0o777, 1));
    assert_eq!(b.readlink("l").unwrap(), b"../some/where");
    assert_eq!(errno(b.symlink("l", b"x", &ALICE)), Errno::EEXIST);
    assert_eq!(errno(b.symlink("e", b"", &ALICE)), Errno::ENOENT);
    assert_eq!(errno(b.symlink("e", &[b'a'; 4096], &ALICE)), Errno::ENAMETOOLONG);
    assert_eq!(errno(b.readlink("nope")), Errno::ENOENT);
    b.mkdir("d", 0o755, &ALICE).unwrap();
    assert_eq!(errno(b.readlink("d")), Errno::EINVAL);
    // A symlink is never followed, not even as a path component.
    b.symlink("ld", b"d", &ALICE).unwrap();
    assert_eq!(errno(b.getattr("ld/x")), Errno::ENOTDIR);
    // Symlinks can be hard-linked and renamed like files.
    b.link("l", "l2").unwrap();
    b.rename("l2", "l3", 0).unwrap();
    assert_eq!(b.readlink("l3").unwrap(), b"../some/where");
    assert_eq!(nlink(&b, "l"), 2);
}

#[test]
fn xattrs() {
    let b = MemoryBackend::new(None);
    file(&b, "f", b"");
    assert_eq!(b.listxattr("f").unwrap(), b"");
    assert_eq!(errno(b.getxattr("f", "user.a")), Errno::ENODATA);
    b.setxattr("f", "user.b", b"2", 0).unwrap();
    b.setxattr("f", "user.a", b"1", 1).unwrap();
    assert_eq!(errno(b.setxattr("f", "user.a", b"x", 1)), Errno::EEXIST);
    assert_eq!(errno(b.setxattr("f", "user.c", b"x", 2)), Errno::ENODATA);
    assert_eq!(errno(b.setxattr("f", "user.c", b"x", 4)), Errno::EINVAL);
    assert_eq!(errno(b.setxattr("f", "", b"x", 0)), Errno::ERANGE);
    assert_eq!(errno(b.setxattr("f", "bogus.x", b"x", 0)), Errno::EOPNOTSUPP);
    assert_eq!(errno(b.getxattr("f", "system.x")), Errno::EOPNOTSUPP);
    assert_eq!(errno(b.setxattr("f", "user.big", &vec![0; 65537], 0)), Errno::E2BIG);
    b.setxattr("f", "user.a", b"one", 2).unwrap();
    assert_eq!(b.getxattr("f", "user.a").unwrap(), b"one");
    b.setxattr("f", "user.empty", b"", 0).unwrap();
    assert_eq!(b.getxattr("f", "user.empty").unwrap(), b"");
    assert_eq!(b.listxattr("f").unwrap(), b"user.a\0user.b\0user.empty\0");
    b.removexattr("f", "user.b").unwrap();
    assert_eq!(errno(b.removexattr("f", "user.b")), Errno::ENODATA);
    assert_eq!(b.listxattr("f").unwrap(), b"user.a\0user.empty\0");
    assert_eq!(errno(b.getxattr("nope", "user.a")), Errno::ENOENT);
    assert_eq!(errno(b.setxattr("nope", "user.a", b"", 0)), Errno::ENOENT);
    // Attributes belong to the node, so every hard link sees them.
    b.link("f", "g").unwrap();
    assert_eq!(b.getxattr("g", "user.a").unwrap(), b"one");
    b.mkdir("d", 0o755, &ALICE).unwrap();
    b.setxattr("d", "user.dir", b"yes", 0).unwrap();
    assert_eq!(b.getxattr("d", "user.dir").unwrap(), b"yes");
}

#[test]
fn concurrent_writers_and_tree_changes() {
    use std::sync::Arc;
    const THREADS: usize = 8;
    const CHUNK: usize = 1000;
    const ROUNDS: usize = 50;
    let b = Arc::new(MemoryBackend::new(Some(10 << 20)));
    file(&b, "shared", b"");
    let handles: Vec<_> = (0..THREADS)
        .map(|i| {
            let b = Arc::clone(&b);
            std::thread::spawn(move || {
                let shared = b.open("shared", libc::O_RDWR).unwrap();
                let own = format!("own{i}");
                b.create(&own, 0o644, libc::O_RDWR, &ALICE).unwrap();
                for r in 0..ROUNDS {
                    // Disjoint ranges of one file, interleaved with other threads.
                    let off = ((r * THREADS + i) * CHUNK) as u64;
                    assert_eq!(shared.write(off, &[i as u8 + 1; CHUNK]).unwrap(), CHUNK as u32);
                    let mine = b.open(&own, libc::O_WRONLY | libc::O_APPEND).unwrap();
                    mine.write(0, &[r as u8]).unwrap();
                    drop(mine);
                    let dir = format!("dir{i}");
                    b.mkdir(&dir, 0o755, &ALICE).unwrap();
                    b.rename(&dir, &format!("{dir}x"), 0).unwrap();
                    b.rmdir(&format!("{dir}x")).unwrap();
                    b.readdir("").unwrap();
                    b.getattr("shared").unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let data = content(&b, "shared");
    assert_eq!(data.len(), THREADS * CHUNK * ROUNDS);
    for (n, chunk) in data.chunks(CHUNK).enumerate() {
        assert!(chunk.iter().all(|&c| c == (n % THREADS) as u8 + 1), "chunk {n}");
    }
    for i in 0..THREADS {
        let expect: Vec<u8> = (0..ROUNDS as u8).collect();
        assert_eq!(content(&b, &format!("own{i}")), expect);
    }
    assert_eq!(nlink(&b, ""), 2);
    assert_eq!(b.readdir("").unwrap().len(), THREADS + 1);
    // The shared file's pages, and one for each small file.
    let pages = ((THREADS * CHUNK * ROUNDS) as u64).div_ceil(4096) + THREADS as u64;
    assert_eq!(used(&b), pages);
}

#[test]
fn concurrent_unlink_while_open_frees_everything() {
    use std::sync::Arc;
    let b = Arc::new(MemoryBackend::new(Some(1 << 20)));
    b.mkdir("x", 0o755, &ALICE).unwrap();
    b.mkdir("y", 0o755, &ALICE).unwrap();
    let handles: Vec<_> = (0..6)
        .map(|i| {
            let b = Arc::clone(&b);
            std::thread::spawn(move || {
                for r in 0..100u32 {
                    let name = format!("t{i}");
                    let (_, f) = b.create(&name, 0o644, libc::O_RDWR, &ALICE).unwrap();
                    let g = b.open(&name, libc::O_RDONLY).unwrap();
                    b.unlink(&name).unwrap();
                    f.write(0, &r.to_le_bytes()).unwrap();
                    drop(f);
                    assert_eq!(g.read(0, 4).unwrap(), r.to_le_bytes());
                    drop(g);
                    // Two threads swap shared directories while others walk them.
                    if i < 2 {
                        b.rename("x", "y", RENAME_EXCHANGE).unwrap();
                    } else {
                        b.readdir("x").unwrap();
                        b.statfs("").unwrap();
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let s = b.statfs("").unwrap();
    assert_eq!((s.blocks, s.bfree), (256, 256));
    assert_eq!(s.files - s.ffree, 3);
    assert_eq!(names(&b, ""), ["x", "y"]);
}
