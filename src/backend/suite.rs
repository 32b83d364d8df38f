//! The backend test suite every database backend (sqlite, postgres) runs: single operations
//! through the [`Backend`] interface only (data paths, directories, every rename case, links,
//! symlinks, ownership, times, xattrs), so a new backend gets them with one line:
//! `crate::backend::suite::backend_suite!(make)`, where `make` builds `(guard, backend)`.
//! Tests of a backend's own storage (rows, plans, durability) stay beside it. The memory
//! backend keeps its own tests: it checks access modes itself and sizes directories as ext4
//! does, where the database backends leave the first to the kernel and report size 0.

use std::thread;
use std::time::{Duration, UNIX_EPOCH};

use crate::backend::{
    Backend, Caller, FileKind, OpenFile, SetAttr, TimeSet, RENAME_EXCHANGE, RENAME_NOREPLACE,
};
use crate::error::{Errno, FsResult};

pub const ME: Caller = Caller { uid: 1000, gid: 1000, pid: 1 };

/// Instantiates every test of the suite, each on a backend from `$make` (an expression giving
/// `(guard, backend)`; the guard lives as long as the test).
macro_rules! backend_suite {
    ($make:expr) => {
        $crate::backend::suite::backend_suite!(@each $make; create_write_read_and_attributes, mkdir_rmdir_and_link_counts, names_longer_than_255_bytes, rename_directories, rename_noreplace_exchange_and_hard_link_noop, hard_links, symlinks_and_special_nodes, setgid_directories_pass_on_their_group, times_follow_posix, xattrs, explicit_mtime_wins_over_buffered_writes, writes_keep_the_bytes_around_them, random_writes_truncations_and_commits_match_a_plain_buffer, truncate_by_path_is_seen_by_open_handles, data_operations_on_a_directory_handle, lookups_follow_renames_and_replacements, fallocate_sets_the_times);
    };
    (@each $make:expr; $($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                let (_keep, b) = $make;
                $crate::backend::suite::$name(&b);
            }
        )*
    };
}
pub(crate) use backend_suite;

pub fn errno<T>(r: FsResult<T>) -> Errno {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.errno,
    }
}

/// Creates `path` holding `data`, flushed and closed.
pub fn put(b: &dyn Backend, path: &str, data: &[u8]) {
    let (_, f) = b.create(path, 0o644, 0, &ME).unwrap();
    if !data.is_empty() {
        assert_eq!(f.write(0, data).unwrap(), data.len() as u32);
    }
    f.flush().unwrap();
}

pub fn get(b: &dyn Backend, path: &str) -> Vec<u8> {
    let f = b.open(path, libc::O_RDONLY).unwrap();
    read_all(&*f)
}

pub fn read_all(f: &dyn OpenFile) -> Vec<u8> {
    let size = f.getattr().unwrap().size;
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        let got = f.read(out.len() as u64, 100_000).unwrap();
        assert!(!got.is_empty());
        out.extend_from_slice(&got);
    }
    out
}

/// Panics unless `got` is `want`, naming the first byte that differs rather than printing
/// both (they may be megabytes).
pub fn same_bytes(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
        panic!("{what}: {} bytes read, {} expected, first difference at {at}", got.len(), want.len());
    }
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 ^ seed).collect()
}

pub fn names(b: &dyn Backend, path: &str) -> Vec<String> {
    let mut v: Vec<String> = b.readdir(path).unwrap().into_iter().map(|e| e.name).collect();
    v.sort();
    v
}

/// Long enough for a clock to move on.
pub fn tick() {
    thread::sleep(Duration::from_millis(5));
}

pub fn create_write_read_and_attributes(b: &dyn Backend) {
    let (attr, f) = b.create("hello.txt", 0o640, 0, &ME).unwrap();
    assert_eq!(attr.kind, FileKind::File);
    assert_eq!((attr.perm, attr.uid, attr.gid, attr.nlink, attr.size), (0o640, 1000, 1000, 1, 0));
    assert_eq!(f.write(0, b"hello world").unwrap(), 11);
    assert_eq!(f.read(0, 100).unwrap(), b"hello world");
    assert_eq!(f.read(6, 3).unwrap(), b"wor");
    assert_eq!(f.read(11, 10).unwrap(), b"");
    assert_eq!(f.read(50, 10).unwrap(), b"");
    let a = b.getattr("hello.txt").unwrap();
    assert_eq!((a.size, a.blocks, a.blksize), (11, 1, 4096));
    f.flush().unwrap();
    drop(f);
    assert_eq!(get(b, "hello.txt"), b"hello world");
    assert_eq!(errno(b.create("hello.txt", 0o644, 0, &ME)), Errno::EEXIST);
    assert_eq!(errno(b.open("nope", 0)), Errno::ENOENT);
    assert_eq!(errno(b.open("hello.txt/x", 0)), Errno::ENOTDIR);
    let a = b.getattr("").unwrap();
    assert_eq!((a.kind, a.nlink), (FileKind::Dir, 2));
}

pub fn mkdir_rmdir_and_link_counts(b: &dyn Backend) {
    let a = b.mkdir("a", 0o755, &ME).unwrap();
    assert_eq!((a.kind, a.nlink, a.perm, a.size), (FileKind::Dir, 2, 0o755, 0));
    assert_eq!(b.getattr("").unwrap().nlink, 3);
    b.mkdir("a/b", 0o700, &ME).unwrap();
    put(b, "a/f", b"x");
    assert_eq!(b.getattr("a").unwrap().nlink, 3);
    assert_eq!(names(b, "a"), ["b", "f"]);
    let kinds: Vec<FileKind> = {
        let mut v = b.readdir("a").unwrap();
        v.sort_by(|x, y| x.name.cmp(&y.name));
        v.into_iter().map(|e| e.kind).collect()
    };
    assert_eq!(kinds, [FileKind::Dir, FileKind::File]);
    assert_eq!(errno(b.mkdir("a", 0o755, &ME)), Errno::EEXIST);
    assert_eq!(errno(b.mkdir("x/y", 0o755, &ME)), Errno::ENOENT);
    assert_eq!(errno(b.mkdir("a/f/y", 0o755, &ME)), Errno::ENOTDIR);
    assert_eq!(errno(b.rmdir("a")), Errno::ENOTEMPTY);
    assert_eq!(errno(b.rmdir("a/f")), Errno::ENOTDIR);
    assert_eq!(errno(b.unlink("a/b")), Errno::EISDIR);
    assert_eq!(errno(b.rmdir("a/zz")), Errno::ENOENT);
    assert_eq!(errno(b.readdir("a/f")), Errno::ENOTDIR);
    assert_eq!(errno(b.rmdir("")), Errno::EBUSY);
    b.rmdir("a/b").unwrap();
    assert_eq!(b.getattr("a").unwrap().nlink, 2);
    b.unlink("a/f").unwrap();
    b.rmdir("a").unwrap();
    assert_eq!(b.getattr("").unwrap().nlink, 2);
    assert!(b.readdir("").unwrap().is_empty());
}

pub fn names_longer_than_255_bytes(b: &dyn Backend) {
    let long = "n".repeat(256);
    let ok = "n".repeat(255);
    assert_eq!(errno(b.create(&long, 0o644, 0, &ME)), Errno::ENAMETOOLONG);
    assert_eq!(errno(b.mkdir(&long, 0o755, &ME)), Errno::ENAMETOOLONG);
    assert_eq!(errno(b.getattr(&long)), Errno::ENAMETOOLONG);
    b.mkdir(&ok, 0o755, &ME).unwrap();
    assert_eq!(errno(b.rename(&ok, &long, 0)), Errno::ENAMETOOLONG);
}

pub fn rename_directories(b: &dyn Backend) {
    b.mkdir("src", 0o755, &ME).unwrap();
    b.mkdir("src/sub", 0o755, &ME).unwrap();
    put(b, "src/sub/f", b"f");
    b.mkdir("dst", 0o755, &ME).unwrap();
    b.mkdir("empty", 0o755, &ME).unwrap();
    b.mkdir("full", 0o755, &ME).unwrap();
    put(b, "full/x", b"");
    put(b, "file", b"");

    // Moving a dir fixes both parents' link counts.
    b.rename("src/sub", "dst/sub", 0).unwrap();
    assert_eq!(b.getattr("src").unwrap().nlink, 2);
    assert_eq!(b.getattr("dst").unwrap().nlink, 3);
    assert_eq!(get(b, "dst/sub/f"), b"f");

    // Replacing an empty directory.
    assert_eq!(b.getattr("").unwrap().nlink, 6);
    let empty_ino = b.getattr("empty").unwrap().ino;
    b.rename("src", "empty", 0).unwrap();
    assert_eq!(b.getattr("").unwrap().nlink, 5);
    assert_ne!(b.getattr("empty").unwrap().ino, empty_ino);
    assert_eq!(names(b, ""), ["dst", "empty", "file", "full"]);

    assert_eq!(errno(b.rename("empty", "file", 0)), Errno::ENOTDIR);
    assert_eq!(errno(b.rename("file", "empty", 0)), Errno::EISDIR);
    assert_eq!(errno(b.rename("empty", "full", 0)), Errno::ENOTEMPTY);
    // Beneath itself, and onto its own ancestor.
    assert_eq!(errno(b.rename("dst", "dst/sub/inner", 0)), Errno::EINVAL);
    assert_eq!(errno(b.rename("dst", "dst/sub", 0)), Errno::EINVAL);
    assert_eq!(errno(b.rename("dst/sub", "dst", 0)), Errno::ENOTEMPTY);
    assert_eq!(errno(b.rename("dst/sub", "dst", RENAME_EXCHANGE)), Errno::EINVAL);
    // Same name: a no-op.
    b.rename("dst", "dst", 0).unwrap();
    assert_eq!(get(b, "dst/sub/f"), b"f");
}

pub fn rename_noreplace_exchange_and_hard_link_noop(b: &dyn Backend) {
    put(b, "a", b"A");
    put(b, "c", b"C");
    b.mkdir("d", 0o755, &ME).unwrap();
    b.mkdir("d/sub", 0o755, &ME).unwrap();

    assert_eq!(errno(b.rename("a", "c", RENAME_NOREPLACE)), Errno::EEXIST);
    b.rename("a", "a2", RENAME_NOREPLACE).unwrap();
    assert_eq!(errno(b.rename("a2", "none", RENAME_EXCHANGE)), Errno::ENOENT);

    b.rename("a2", "c", RENAME_EXCHANGE).unwrap();
    assert_eq!(get(b, "a2"), b"C");
    assert_eq!(get(b, "c"), b"A");

    // Exchanging a file and a directory in different parents moves the `..` link.
    b.rename("c", "d/sub", RENAME_EXCHANGE).unwrap();
    assert_eq!(b.getattr("c").unwrap().kind, FileKind::Dir);
    assert_eq!(get(b, "d/sub"), b"A");
    assert_eq!(b.getattr("d").unwrap().nlink, 2);
    assert_eq!(b.getattr("").unwrap().nlink, 4);

    // Renaming onto another name of the same node changes nothing.
    b.link("a2", "a3").unwrap();
    b.rename("a2", "a3", 0).unwrap();
    assert_eq!(names(b, ""), ["a2", "a3", "c", "d"]);
    assert_eq!(b.getattr("a2").unwrap().nlink, 2);
}

pub fn hard_links(b: &dyn Backend) {
    put(b, "f", b"data");
    b.mkdir("d", 0o755, &ME).unwrap();
    let before = b.getattr("f").unwrap();
    tick();
    let a = b.link("f", "d/g").unwrap();
    assert_eq!((a.ino, a.nlink), (before.ino, 2));
    assert!(a.ctime > before.ctime);
    assert_eq!(b.getattr("f").unwrap().nlink, 2);
    assert_eq!(errno(b.link("d", "d2")), Errno::EPERM);
    assert_eq!(errno(b.link("f", "d/g")), Errno::EEXIST);
    assert_eq!(errno(b.link("nope", "x")), Errno::ENOENT);
    b.unlink("f").unwrap();
    let g = b.getattr("d/g").unwrap();
    assert_eq!((g.nlink, g.size), (1, 4));
    assert_eq!(get(b, "d/g"), b"data");
    // Writes through one name are seen through the other.
    b.link("d/g", "h").unwrap();
    let f = b.open("h", libc::O_WRONLY).unwrap();
    f.write(4, b"!").unwrap();
    assert_eq!(b.getattr("d/g").unwrap().size, 5);
    drop(f);
    assert_eq!(get(b, "d/g"), b"data!");
}

pub fn symlinks_and_special_nodes(b: &dyn Backend) {
    let a = b.symlink("l", b"../some/where", &ME).unwrap();
    assert_eq!((a.kind, a.perm, a.size, a.nlink), (FileKind::Symlink, 0o777, 13, 1));
    assert_eq!(b.readlink("l").unwrap(), b"../some/where");
    put(b, "f", b"");
    assert_eq!(errno(b.readlink("f")), Errno::EINVAL);
    assert_eq!(errno(b.readlink("none")), Errno::ENOENT);
    assert_eq!(errno(b.symlink("l", b"x", &ME)), Errno::EEXIST);

    let fifo = b.mknod("p", libc::S_IFIFO | 0o600, 0, &ME).unwrap();
    assert_eq!((fifo.kind, fifo.perm), (FileKind::Fifo, 0o600));
    let chr = b.mknod("c", libc::S_IFCHR | 0o644, 0x0103, &ME).unwrap();
    assert_eq!((chr.kind, chr.rdev), (FileKind::CharDevice, 0x0103));
    let reg = b.mknod("r", 0o644, 0, &ME).unwrap();
    assert_eq!(reg.kind, FileKind::File);
    assert_eq!(errno(b.mknod("dd", libc::S_IFDIR | 0o755, 0, &ME)), Errno::EPERM);
}

pub fn setgid_directories_pass_on_their_group(b: &dyn Backend) {
    let other = Caller { uid: 1001, gid: 2000, pid: 2 };
    let d = b.mkdir("shared", 0o2775, &other).unwrap();
    assert_eq!((d.gid, d.perm), (2000, 0o2775));
    let (f, _) = b.create("shared/f", 0o644, 0, &ME).unwrap();
    assert_eq!((f.uid, f.gid, f.perm), (1000, 2000, 0o644));
    let sub = b.mkdir("shared/sub", 0o755, &ME).unwrap();
    assert_eq!((sub.uid, sub.gid, sub.perm), (1000, 2000, 0o2755));
    let n = b.mknod("shared/sub/p", libc::S_IFIFO | 0o600, 0, &ME).unwrap();
    assert_eq!(n.gid, 2000);
    let s = b.symlink("shared/l", b"t", &ME).unwrap();
    assert_eq!(s.gid, 2000);
    // A plain directory: the caller's group.
    b.mkdir("plain", 0o755, &other).unwrap();
    let (f, _) = b.create("plain/f", 0o644, 0, &ME).unwrap();
    assert_eq!(f.gid, 1000);
}

pub fn times_follow_posix(b: &dyn Backend) {
    b.mkdir("d", 0o755, &ME).unwrap();
    let d0 = b.getattr("d").unwrap();
    tick();
    let (f0, f) = b.create("d/f", 0o644, 0, &ME).unwrap();
    assert_eq!((f0.atime, f0.mtime, f0.ctime), (f0.crtime, f0.crtime, f0.crtime));
    let d1 = b.getattr("d").unwrap();
    assert!(d1.mtime > d0.mtime && d1.ctime > d0.ctime);
    assert_eq!(d1.mtime, f0.crtime);

    tick();
    f.write(0, b"abc").unwrap();
    let f1 = b.getattr("d/f").unwrap(); // buffered write already visible
    assert!(f1.mtime > f0.mtime && f1.ctime > f0.ctime);
    assert_eq!(f1.crtime, f0.crtime);
    drop(f);
    assert_eq!(b.getattr("d/f").unwrap().mtime, f1.mtime);

    // chmod: ctime only.
    tick();
    let f2 = b.setattr("d/f", &SetAttr { mode: Some(0o600), ..Default::default() }).unwrap();
    assert_eq!((f2.perm, f2.mtime), (0o600, f1.mtime));
    assert!(f2.ctime > f1.ctime);

    // Explicit times, exactly.
    let at = UNIX_EPOCH + Duration::new(1_000_000_000, 123_456_789);
    let mt = UNIX_EPOCH + Duration::new(1_200_000_000, 987_654_321);
    let f3 = b
        .setattr(
            "d/f",
            &SetAttr { atime: Some(TimeSet::At(at)), mtime: Some(TimeSet::At(mt)), ..Default::default() },
        )
        .unwrap();
    assert_eq!((f3.atime, f3.mtime), (at, mt));
    assert!(f3.ctime >= f2.ctime);
    let before_epoch = UNIX_EPOCH - Duration::from_secs(86_400);
    let f4 =
        b.setattr("d/f", &SetAttr { mtime: Some(TimeSet::At(before_epoch)), ..Default::default() }).unwrap();
    assert_eq!(f4.mtime, before_epoch);
    assert_eq!(b.getattr("d/f").unwrap().mtime, before_epoch);

    // Truncate: mtime and ctime.
    tick();
    let f5 = b.setattr("d/f", &SetAttr { size: Some(1), ..Default::default() }).unwrap();
    assert!(f5.mtime > f4.mtime && f5.ctime > f4.ctime);

    // Rename: the node's ctime and both parents' mtime/ctime; unlink: the parent.
    b.mkdir("e", 0o755, &ME).unwrap();
    let e0 = b.getattr("e").unwrap();
    let d2 = b.getattr("d").unwrap();
    tick();
    b.rename("d/f", "e/f", 0).unwrap();
    let f6 = b.getattr("e/f").unwrap();
    assert!(f6.ctime > f5.ctime);
    assert_eq!(f6.mtime, f5.mtime);
    let (d3, e1) = (b.getattr("d").unwrap(), b.getattr("e").unwrap());
    assert!(d3.mtime > d2.mtime && e1.mtime > e0.mtime && e1.ctime > e0.ctime);
    tick();
    b.unlink("e/f").unwrap();
    assert!(b.getattr("e").unwrap().mtime > e1.mtime);

    // chown: ctime.
    tick();
    let e2 = b.getattr("e").unwrap();
    let e3 = b.setattr("e", &SetAttr { uid: Some(7), gid: Some(8), ..Default::default() }).unwrap();
    assert_eq!((e3.uid, e3.gid, e3.mtime), (7, 8, e2.mtime));
    assert!(e3.ctime > e2.ctime);
}

pub fn xattrs(b: &dyn Backend) {
    put(b, "f", b"");
    assert_eq!(errno(b.getxattr("f", "user.a")), Errno::ENODATA);
    assert_eq!(b.listxattr("f").unwrap(), b"");
    let c0 = b.getattr("f").unwrap().ctime;
    tick();
    b.setxattr("f", "user.a", b"1", 0).unwrap();
    assert!(b.getattr("f").unwrap().ctime > c0);
    b.setxattr("f", "user.b", b"", 0).unwrap();
    assert_eq!(errno(b.setxattr("f", "user.a", b"2", 1)), Errno::EEXIST);
    assert_eq!(errno(b.setxattr("f", "user.c", b"2", 2)), Errno::ENODATA);
    b.setxattr("f", "user.a", b"22", 2).unwrap();
    assert_eq!(b.getxattr("f", "user.a").unwrap(), b"22");
    assert_eq!(b.getxattr("f", "user.b").unwrap(), b"");
    assert_eq!(b.listxattr("f").unwrap(), b"user.a\0user.b\0");
    b.removexattr("f", "user.a").unwrap();
    assert_eq!(errno(b.removexattr("f", "user.a")), Errno::ENODATA);
    assert_eq!(b.listxattr("f").unwrap(), b"user.b\0");
    assert_eq!(errno(b.getxattr("none", "user.a")), Errno::ENOENT);
    // The namespaces tmpfs and ext4 keep, and no others.
    b.setxattr("f", "trusted.t", b"t", 0).unwrap();
    b.setxattr("f", "security.s", b"s", 0).unwrap();
    for name in ["bogus.x", "system.x", "x"] {
        assert_eq!(errno(b.setxattr("f", name, b"1", 0)), Errno::EOPNOTSUPP, "{name}");
        assert_eq!(errno(b.getxattr("f", name)), Errno::EOPNOTSUPP, "{name}");
        assert_eq!(errno(b.removexattr("f", name)), Errno::EOPNOTSUPP, "{name}");
    }
    assert_eq!(errno(b.setxattr("f", "user.", b"1", 0)), Errno::EINVAL);
    assert_eq!(b.listxattr("f").unwrap(), b"security.s\0trusted.t\0user.b\0");
    // Removing the file removes its attributes.
    b.unlink("f").unwrap();
    put(b, "f", b"");
    assert_eq!(b.listxattr("f").unwrap(), b"");
}

/// fallocate sets the mtime and ctime, as on tmpfs and ext4, even when the size stays.
pub fn fallocate_sets_the_times(b: &dyn Backend) {
    // Made read-write (not by `put`), so that the memory backend, which checks access modes
    // itself, runs it too.
    let (_, f) = b.create("f", 0o644, libc::O_RDWR, &ME).unwrap();
    f.write(0, &[b'x'; 100]).unwrap();
    f.flush().unwrap();
    for (mode, len, size) in [(0, 50, 100), (libc::FALLOC_FL_KEEP_SIZE, 8192, 100), (0, 8192, 8192)] {
        let before = b.getattr("f").unwrap();
        tick();
        f.fallocate(0, len, mode).unwrap();
        let after = b.getattr("f").unwrap();
        assert_eq!(after.size, size, "mode {mode} length {len}");
        assert!(after.mtime > before.mtime && after.ctime > before.ctime, "mode {mode} length {len}");
        assert_eq!(f.getattr().unwrap(), after, "the handle sees it too");
    }
    f.flush().unwrap();
    assert_eq!(get(b, "f"), [&[b'x'; 100][..], &[0; 8092]].concat());
}

pub fn explicit_mtime_wins_over_buffered_writes(b: &dyn Backend) {
    let (_, f) = b.create("f", 0o644, 0, &ME).unwrap();
    f.write(0, b"buffered").unwrap();
    let mt = UNIX_EPOCH + Duration::new(1_111_111_111, 5);
    let a = b.setattr("f", &SetAttr { mtime: Some(TimeSet::At(mt)), ..Default::default() });
    assert_eq!((a.unwrap().mtime, f.getattr().unwrap().size), (mt, 8));
    f.flush().unwrap();
    drop(f);
    let a = b.getattr("f").unwrap();
    assert_eq!((a.mtime, a.size), (mt, 8));
    assert_eq!(get(b, "f"), b"buffered");
}

/// Writes that start or end inside a chunk, beyond the end, across chunk boundaries, after a
/// truncation and through two handles keep every byte around them: the file always reads as
/// a plain buffer given the same writes.
pub fn writes_keep_the_bytes_around_them(b: &dyn Backend) {
    const C: u64 = crate::backend::chunks::CHUNK_SIZE;
    let (_, f) = b.create("w", 0o644, 0, &ME).unwrap();
    let g = b.open("w", libc::O_RDWR).unwrap();
    let mut model: Vec<u8> = Vec::new();
    let steps: [(u64, usize, u8); 9] = [
        (0, (C + 100) as usize, 1), // a new file: one whole chunk and a part
        (C + 50, 10, 2),            // inside the stored part of chunk 1
        (3 * C + 7, 20, 3),         // past the end, a hole before it
        (C - 5, 10, 4),             // across the boundary of chunks 0 and 1
        (2 * C, C as usize, 5),     // a whole chunk inside the hole
        (3 * C, 3, 6),              // the start of a chunk that holds bytes after it
        (0, 1, 7),
        (5 * C, 1, 8), // past the end again
        (4 * C, C as usize, 9),
    ];
    for (i, (offset, len, seed)) in steps.into_iter().enumerate() {
        let data = pattern(len, seed);
        let handle = if i % 2 == 0 { &f } else { &g };
        assert_eq!(handle.write(offset, &data).unwrap(), len as u32);
        let end = offset as usize + len;
        if model.len() < end {
            model.resize(end, 0);
        }
        model[offset as usize..end].copy_from_slice(&data);
        if i == 5 {
            // A truncation into chunk 3 drops what was written there past it.
            f.setattr(&SetAttr { size: Some(3 * C + 10), ..Default::default() }).unwrap();
            model.truncate((3 * C + 10) as usize);
        }
        assert_eq!(read_all(&*g), model, "after step {i}");
    }
    f.flush().unwrap();
    g.flush().unwrap();
    drop((f, g));
    assert_eq!(get(b, "w"), model);
}

/// A seeded run of writes of every size into a stored file (inside stored chunks, across
/// them, past the end), truncations and commits through two handles: every read, before and
/// after each commit, and the file as finally stored, match a plain buffer given the same
/// operations.
pub fn random_writes_truncations_and_commits_match_a_plain_buffer(b: &dyn Backend) {
    const C: usize = crate::backend::chunks::CHUNK_SIZE as usize;
    let mut model = pattern(5 * C + 1234, 1);
    put(b, "r", &model);
    let handles = [b.open("r", libc::O_RDWR).unwrap(), b.open("r", libc::O_RDWR).unwrap()];
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |below: usize| {
        // xorshift64: the same run every time, no crate needed.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % below as u64) as usize
    };
    for step in 0..600 {
        let h = &*handles[next(2)];
        match next(100) {
            0..=64 => {
                let longest = if next(10) == 0 { 2 * C } else { 8192 };
                let len = 1 + next(longest);
                let at = next(model.len() + C / 4);
                let data = pattern(len, step as u8);
                assert_eq!(h.write(at as u64, &data).unwrap(), len as u32, "step {step}");
                if model.len() < at + len {
                    model.resize(at + len, 0);
                }
                model[at..at + len].copy_from_slice(&data);
            }
            65..=74 => h.flush().unwrap(),
            75..=77 => {
                let size = next(model.len() + C);
                h.setattr(&SetAttr { size: Some(size as u64), ..Default::default() }).unwrap();
                model.resize(size, 0);
            }
            _ => {
                let at = next(model.len() + 1);
                let len = 1 + next(3 * C);
                let end = model.len().min(at + len);
                same_bytes(&h.read(at as u64, len as u32).unwrap(), &model[at..end], &format!("step {step}"));
            }
        }
        if step % 50 == 49 {
            same_bytes(&read_all(h), &model, &format!("after step {step}"));
        }
    }
    drop(handles);
    same_bytes(&get(b, "r"), &model, "stored");
}

pub fn truncate_by_path_is_seen_by_open_handles(b: &dyn Backend) {
    let data = pattern(200_000, 4);
    put(b, "f", &data);
    let h = b.open("f", libc::O_RDWR).unwrap();
    assert_eq!(h.read(100, 50).unwrap(), &data[100..150]); // caches chunk 0
    b.setattr("f", &SetAttr { size: Some(10), ..Default::default() }).unwrap();
    assert_eq!(h.read(0, 4096).unwrap(), &data[..10]);
    assert_eq!(h.getattr().unwrap().size, 10);
    b.setattr("f", &SetAttr { size: Some(300), ..Default::default() }).unwrap();
    let mut expect = data[..10].to_vec();
    expect.resize(300, 0);
    assert_eq!(h.read(0, 4096).unwrap(), expect);
    h.write(299, b"!").unwrap();
    expect[299] = b'!';
    drop(h);
    assert_eq!(get(b, "f"), expect);
}

pub fn data_operations_on_a_directory_handle(b: &dyn Backend) {
    let h = b.open("", libc::O_RDONLY).unwrap();
    assert_eq!(errno(h.read(0, 10)), Errno::EISDIR);
    assert_eq!(errno(h.write(0, b"x")), Errno::EISDIR);
    assert_eq!(errno(h.fallocate(0, 10, 0)), Errno::EISDIR);
    assert_eq!(h.getattr().unwrap().kind, FileKind::Dir);
}

pub fn lookups_follow_renames_and_replacements(b: &dyn Backend) {
    // What a name leads to, asked first the quick way (from what the backend may have kept),
    // then by `getattr`: the two must agree at every step.
    let node = |path: &str| {
        let quick = b.kind_and_ino(path).map_err(|e| e.errno);
        assert_eq!(quick, b.getattr(path).map(|a| (a.kind, a.ino)).map_err(|e| e.errno), "{path}");
        quick
    };
    b.mkdir("a", 0o755, &ME).unwrap();
    b.mkdir("a/b", 0o755, &ME).unwrap();
    put(b, "a/b/f", b"one");
    let f1 = b.getattr("a/b/f").unwrap().ino; // the walk is cached now
    assert_eq!(node("a/b/f"), Ok((FileKind::File, f1)));
    b.rename("a", "x", 0).unwrap();
    assert_eq!(errno(b.getattr("a/b/f")), Errno::ENOENT);
    assert_eq!(node("a/b/f"), Err(Errno::ENOENT));
    assert_eq!(b.getattr("x/b/f").unwrap().ino, f1);
    assert_eq!(node("x/b/f"), Ok((FileKind::File, f1)));
    put(b, "a", b"a file now");
    assert_eq!(errno(b.getattr("a/b")), Errno::ENOTDIR);
    assert_eq!(node("a").map(|n| n.0), Ok(FileKind::File));
    b.unlink("x/b/f").unwrap();
    assert_eq!(node("x/b/f"), Err(Errno::ENOENT));
    assert_eq!(errno(b.getattr("x/b/f")), Errno::ENOENT);
    put(b, "x/b/f", b"two");
    let f2 = node("x/b/f").unwrap().1;
    assert_ne!(b.getattr("x/b/f").unwrap().ino, f1);
    assert_eq!(get(b, "x/b/f"), b"two");
    b.mkdir("y", 0o755, &ME).unwrap();
    b.rename("x", "y", RENAME_EXCHANGE).unwrap();
    assert_eq!(get(b, "y/b/f"), b"two");
    assert_eq!(node("y/b/f"), Ok((FileKind::File, f2)));
    assert_eq!(errno(b.getattr("x/b")), Errno::ENOENT);
    assert_eq!(node("x/b"), Err(Errno::ENOENT));
    // A failed rename changes nothing, cached or not.
    assert_eq!(errno(b.rename("y/b", "a/b", 0)), Errno::ENOTDIR);
    assert_eq!(get(b, "y/b/f"), b"two");
    b.unlink("y/b/f").unwrap();
    b.rmdir("y/b").unwrap();
    assert_eq!(node("y/b"), Err(Errno::ENOENT));
    b.mkdir("y/b", 0o700, &ME).unwrap();
    assert_eq!(b.getattr("y/b").unwrap().perm, 0o700);
    assert_eq!(node("y/b").map(|n| n.0), Ok(FileKind::Dir));
}
