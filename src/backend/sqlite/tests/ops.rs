//! Single operations: data paths, truncation, directories, every rename case, links, symlinks,
//! ownership, times, xattrs, fallocate and statfs.

use std::time::{Duration, UNIX_EPOCH};

use super::*;

#[test]
fn create_write_read_and_attributes() {
    let (_d, _db, b) = setup();
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
    assert_eq!(get(&b, "hello.txt"), b"hello world");
    assert_eq!(errno(b.create("hello.txt", 0o644, 0, &ME)), Errno::EEXIST);
    assert_eq!(errno(b.open("nope", 0)), Errno::ENOENT);
    assert_eq!(errno(b.open("hello.txt/x", 0)), Errno::ENOTDIR);
    let a = b.getattr("").unwrap();
    assert_eq!((a.kind, a.nlink), (FileKind::Dir, 2));
}

#[test]
fn partial_overwrite_rewrites_only_touched_chunks() {
    let (_d, db, b) = setup();
    let cs = CHUNK_SIZE as usize;
    let mut expect = pattern(16 * cs, 7);
    put(&b, "big", &expect);
    assert_eq!(count(&db, "SELECT count(*) FROM chunks"), 16);

    // Reopen so nothing is buffered or cached.
    let f = b.open("big", libc::O_RDWR).unwrap();
    let before = b.total_changes();
    let patch = vec![0xAB; 4096];
    f.write(4 * cs as u64 + 1000, &patch).unwrap();
    f.flush().unwrap();
    // One chunk row and the inode row, nothing else.
    assert_eq!(b.total_changes() - before, 2);
    expect[4 * cs + 1000..4 * cs + 1000 + 4096].copy_from_slice(&patch);

    // A write straddling a chunk boundary touches exactly two chunks.
    let before = b.total_changes();
    f.write(6 * cs as u64 - 2048, &patch).unwrap();
    f.flush().unwrap();
    assert_eq!(b.total_changes() - before, 3);
    expect[6 * cs - 2048..6 * cs + 2048].copy_from_slice(&patch);

    assert_eq!(read_all(&*f), expect);
    drop(f);
    assert_eq!(get(&b, "big"), expect);
    assert_eq!(count(&db, "SELECT count(*) FROM chunks"), 16);
    assert_eq!(count(&db, "SELECT max(length(data)) FROM chunks"), cs as i64);
}

#[test]
fn write_past_eof_is_sparse_and_zero_filled() {
    let (_d, db, b) = setup();
    let (_, f) = b.create("sparse", 0o644, 0, &ME).unwrap();
    f.write(0, b"head").unwrap();
    let far = 3 * CHUNK_SIZE + 100;
    f.write(far, b"tail").unwrap();
    f.flush().unwrap();
    assert_eq!(f.getattr().unwrap().size, far + 4);
    let data = read_all(&*f);
    assert_eq!(&data[..4], b"head");
    assert!(data[4..far as usize].iter().all(|&x| x == 0));
    assert_eq!(&data[far as usize..], b"tail");
    // Only chunks 0 and 3 exist.
    let idx: String = raw(&db)
        .query_row("SELECT group_concat(idx) FROM (SELECT idx FROM chunks ORDER BY idx)", [], |r| r.get(0))
        .unwrap();
    assert_eq!(idx, "0,3");
}

#[test]
fn truncate_down_and_up() {
    let (_d, db, b) = setup();
    let cs = CHUNK_SIZE as usize;
    let data = pattern(2 * cs + 5000, 3);
    put(&b, "t", &data);
    assert_eq!(count(&db, "SELECT count(*) FROM chunks"), 3);

    let a = b.setattr("t", &SetAttr { size: Some(cs as u64 + 100), ..Default::default() }).unwrap();
    assert_eq!((a.size, a.blocks), (cs as u64 + 100, (cs as u64 + 100).div_ceil(512)));
    assert_eq!(count(&db, "SELECT count(*) FROM chunks"), 2);
    assert_eq!(count(&db, "SELECT length(data) FROM chunks WHERE idx = 1"), 100);
    assert_eq!(get(&b, "t"), &data[..cs + 100]);

    let a = b.setattr("t", &SetAttr { size: Some(3 * cs as u64), ..Default::default() }).unwrap();
    assert_eq!(a.size, 3 * cs as u64);
    let got = get(&b, "t");
    assert_eq!(&got[..cs + 100], &data[..cs + 100]);
    assert!(got[cs + 100..].iter().all(|&x| x == 0), "old bytes must not reappear");

    // Truncation of buffered (uncommitted) data through a handle.
    let f = b.open("t", libc::O_RDWR).unwrap();
    f.write(0, &[9u8; 10]).unwrap();
    let a = f.setattr(&SetAttr { size: Some(4), ..Default::default() }).unwrap();
    assert_eq!(a.size, 4);
    assert_eq!(f.read(0, 100).unwrap(), vec![9u8; 4]);
    f.write(8, b"z").unwrap();
    assert_eq!(f.read(0, 100).unwrap(), [9, 9, 9, 9, 0, 0, 0, 0, b'z']);
    drop(f);
    assert_eq!(get(&b, "t"), [9, 9, 9, 9, 0, 0, 0, 0, b'z']);
    assert_eq!(count(&db, "SELECT count(*) FROM chunks"), 1);

    assert_eq!(errno(b.setattr("", &SetAttr { size: Some(0), ..Default::default() })), Errno::EISDIR);
}

#[test]
fn mkdir_rmdir_and_link_counts() {
    let (_d, _db, b) = setup();
    let a = b.mkdir("a", 0o755, &ME).unwrap();
    assert_eq!((a.kind, a.nlink, a.perm, a.size), (FileKind::Dir, 2, 0o755, 0));
    assert_eq!(b.getattr("").unwrap().nlink, 3);
    b.mkdir("a/b", 0o700, &ME).unwrap();
    put(&b, "a/f", b"x");
    assert_eq!(b.getattr("a").unwrap().nlink, 3);
    assert_eq!(names(&b, "a"), ["b", "f"]);
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

#[test]
fn names_longer_than_255_bytes() {
    let (_d, _db, b) = setup();
    let long = "n".repeat(256);
    let ok = "n".repeat(255);
    assert_eq!(errno(b.create(&long, 0o644, 0, &ME)), Errno::ENAMETOOLONG);
    assert_eq!(errno(b.mkdir(&long, 0o755, &ME)), Errno::ENAMETOOLONG);
    assert_eq!(errno(b.getattr(&long)), Errno::ENAMETOOLONG);
    b.mkdir(&ok, 0o755, &ME).unwrap();
    assert_eq!(errno(b.rename(&ok, &long, 0)), Errno::ENAMETOOLONG);
}

#[test]
fn rename_simple_and_replace_file() {
    let (_d, db, b) = setup();
    put(&b, "a", b"AAA");
    put(&b, "b", b"BBBB");
    b.mkdir("d", 0o755, &ME).unwrap();
    b.rename("a", "d/a2", 0).unwrap();
    assert_eq!(errno(b.getattr("a")), Errno::ENOENT);
    assert_eq!(get(&b, "d/a2"), b"AAA");
    let b_ino = b.getattr("b").unwrap().ino;
    b.rename("d/a2", "b", 0).unwrap();
    assert_eq!(get(&b, "b"), b"AAA");
    assert_eq!(names(&b, ""), ["b", "d"]);
    // The replaced node's rows are gone.
    let q = format!("SELECT count(*) FROM inodes WHERE ino = {b_ino}");
    assert_eq!(count(&db, &q), 0);
    assert_eq!(count(&db, &format!("SELECT count(*) FROM chunks WHERE ino = {b_ino}")), 0);
    assert_eq!(errno(b.rename("missing", "x", 0)), Errno::ENOENT);
    assert_eq!(errno(b.rename("b", "nodir/x", 0)), Errno::ENOENT);
    assert_eq!(errno(b.rename("b", "x", 4)), Errno::EINVAL);
    assert_eq!(errno(b.rename("b", "x", RENAME_NOREPLACE | RENAME_EXCHANGE)), Errno::EINVAL);
}

#[test]
fn rename_directories() {
    let (_d, _db, b) = setup();
    b.mkdir("src", 0o755, &ME).unwrap();
    b.mkdir("src/sub", 0o755, &ME).unwrap();
    put(&b, "src/sub/f", b"f");
    b.mkdir("dst", 0o755, &ME).unwrap();
    b.mkdir("empty", 0o755, &ME).unwrap();
    b.mkdir("full", 0o755, &ME).unwrap();
    put(&b, "full/x", b"");
    put(&b, "file", b"");

    // Moving a dir fixes both parents' link counts.
    b.rename("src/sub", "dst/sub", 0).unwrap();
    assert_eq!(b.getattr("src").unwrap().nlink, 2);
    assert_eq!(b.getattr("dst").unwrap().nlink, 3);
    assert_eq!(get(&b, "dst/sub/f"), b"f");

    // Replacing an empty directory.
    assert_eq!(b.getattr("").unwrap().nlink, 6);
    let empty_ino = b.getattr("empty").unwrap().ino;
    b.rename("src", "empty", 0).unwrap();
    assert_eq!(b.getattr("").unwrap().nlink, 5);
    assert_ne!(b.getattr("empty").unwrap().ino, empty_ino);
    assert_eq!(names(&b, ""), ["dst", "empty", "file", "full"]);

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
    assert_eq!(get(&b, "dst/sub/f"), b"f");
}

#[test]
fn rename_noreplace_exchange_and_hard_link_noop() {
    let (_d, _db, b) = setup();
    put(&b, "a", b"A");
    put(&b, "c", b"C");
    b.mkdir("d", 0o755, &ME).unwrap();
    b.mkdir("d/sub", 0o755, &ME).unwrap();

    assert_eq!(errno(b.rename("a", "c", RENAME_NOREPLACE)), Errno::EEXIST);
    b.rename("a", "a2", RENAME_NOREPLACE).unwrap();
    assert_eq!(errno(b.rename("a2", "none", RENAME_EXCHANGE)), Errno::ENOENT);

    b.rename("a2", "c", RENAME_EXCHANGE).unwrap();
    assert_eq!(get(&b, "a2"), b"C");
    assert_eq!(get(&b, "c"), b"A");

    // Exchanging a file and a directory in different parents moves the `..` link.
    b.rename("c", "d/sub", RENAME_EXCHANGE).unwrap();
    assert_eq!(b.getattr("c").unwrap().kind, FileKind::Dir);
    assert_eq!(get(&b, "d/sub"), b"A");
    assert_eq!(b.getattr("d").unwrap().nlink, 2);
    assert_eq!(b.getattr("").unwrap().nlink, 4);

    // Renaming onto another name of the same node changes nothing.
    b.link("a2", "a3").unwrap();
    b.rename("a2", "a3", 0).unwrap();
    assert_eq!(names(&b, ""), ["a2", "a3", "c", "d"]);
    assert_eq!(b.getattr("a2").unwrap().nlink, 2);
}

#[test]
fn hard_links() {
    let (_d, _db, b) = setup();
    put(&b, "f", b"data");
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
    assert_eq!(get(&b, "d/g"), b"data");
    // Writes through one name are seen through the other.
    b.link("d/g", "h").unwrap();
    let f = b.open("h", libc::O_WRONLY).unwrap();
    f.write(4, b"!").unwrap();
    assert_eq!(b.getattr("d/g").unwrap().size, 5);
    drop(f);
    assert_eq!(get(&b, "d/g"), b"data!");
}

#[test]
fn symlinks_and_special_nodes() {
    let (_d, _db, b) = setup();
    let a = b.symlink("l", b"../some/where", &ME).unwrap();
    assert_eq!((a.kind, a.perm, a.size, a.nlink), (FileKind::Symlink, 0o777, 13, 1));
    assert_eq!(b.readlink("l").unwrap(), b"../some/where");
    put(&b, "f", b"");
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

#[test]
fn setgid_directories_pass_on_their_group() {
    let (_d, _db, b) = setup();
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

#[test]
fn times_follow_posix() {
    let (_d, _db, b) = setup();
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

#[test]
fn handles_share_one_buffer() {
    let (_d, db, b) = setup();
    put(&b, "s", b"0123456789");
    let w = b.open("s", libc::O_WRONLY).unwrap();
    let r = b.open("s", libc::O_RDONLY).unwrap();
    w.write(5, b"abcdefghij").unwrap();
    // Not committed yet, but visible through the other handle and the path.
    assert_eq!(count(&db, "SELECT size FROM inodes WHERE ino != 1 ORDER BY ino DESC LIMIT 1"), 10);
    assert_eq!(r.read(0, 100).unwrap(), b"01234abcdefghij");
    assert_eq!(b.getattr("s").unwrap().size, 15);
    assert_eq!(r.getattr().unwrap().size, 15);
    w.flush().unwrap();
    assert_eq!(count(&db, "SELECT size FROM inodes WHERE ino != 1 ORDER BY ino DESC LIMIT 1"), 15);
}

#[test]
fn large_buffers_are_committed_early() {
    let (_d, db, b) = setup();
    let (_, f) = b.create("huge", 0o644, 0, &ME).unwrap();
    let block = pattern(1 << 20, 9);
    for i in 0..9u64 {
        f.write(i << 20, &block).unwrap();
    }
    // Past the 8 MiB threshold, without any flush.
    assert!(count(&db, "SELECT count(*) FROM chunks") >= 128);
    f.flush().unwrap();
    assert_eq!(count(&db, "SELECT count(*) FROM chunks"), 9 * 16);
    assert_eq!(f.getattr().unwrap().size, 9 << 20);
    assert_eq!(f.read(5 << 20, 1 << 20).unwrap(), block);
}

#[test]
fn fsync_and_fallocate() {
    let (_d, db, b) = setup();
    let (_, f) = b.create("f", 0o644, 0, &ME).unwrap();
    f.write(0, b"durable").unwrap();
    f.fsync(false).unwrap();
    assert_eq!(count(&db, "SELECT count(*) FROM chunks"), 1);
    f.fallocate(0, 1000, 0).unwrap();
    assert_eq!(f.getattr().unwrap().size, 1000);
    f.fallocate(0, 10, 0).unwrap();
    assert_eq!(f.getattr().unwrap().size, 1000);
    f.fallocate(0, 5000, 1).unwrap();
    assert_eq!(f.getattr().unwrap().size, 1000);
    assert_eq!(errno(f.fallocate(0, 10, 3)), Errno::EOPNOTSUPP);
    assert_eq!(errno(f.fallocate(0, 0, 0)), Errno::EINVAL);
    let data = f.read(0, 2000).unwrap();
    assert_eq!(data.len(), 1000);
    assert_eq!(&data[..7], b"durable");
    assert!(data[7..].iter().all(|&x| x == 0));
}

#[test]
fn xattrs() {
    let (_d, _db, b) = setup();
    put(&b, "f", b"");
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
    // Removing the file removes its attributes.
    b.unlink("f").unwrap();
    put(&b, "f", b"");
    assert_eq!(b.listxattr("f").unwrap(), b"");
}

#[test]
fn statfs_reports_the_host_filesystem() {
    let (_d, _db, b) = setup();
    let s = b.statfs("").unwrap();
    assert_eq!(s.namelen, 255);
    assert!(s.bsize > 0 && s.frsize > 0 && s.blocks > 0 && s.bfree <= s.blocks);
    assert!(s.files >= 1 << 32 && s.ffree >= 1 << 32);
}

#[test]
fn explicit_mtime_wins_over_buffered_writes() {
    let (_d, _db, b) = setup();
    let (_, f) = b.create("f", 0o644, 0, &ME).unwrap();
    f.write(0, b"buffered").unwrap();
    let mt = UNIX_EPOCH + Duration::new(1_111_111_111, 5);
    let a = b.setattr("f", &SetAttr { mtime: Some(TimeSet::At(mt)), ..Default::default() });
    assert_eq!((a.unwrap().mtime, f.getattr().unwrap().size), (mt, 8));
    f.flush().unwrap();
    drop(f);
    let a = b.getattr("f").unwrap();
    assert_eq!((a.mtime, a.size), (mt, 8));
    assert_eq!(get(&b, "f"), b"buffered");
}

#[test]
fn truncate_by_path_is_seen_by_open_handles() {
    let (_d, _db, b) = setup();
    let data = pattern(200_000, 4);
    put(&b, "f", &data);
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
    assert_eq!(get(&b, "f"), expect);
}

#[test]
fn data_operations_on_a_directory_handle() {
    let (_d, _db, b) = setup();
    let h = b.open("", libc::O_RDONLY).unwrap();
    assert_eq!(errno(h.read(0, 10)), Errno::EISDIR);
    assert_eq!(errno(h.write(0, b"x")), Errno::EISDIR);
    assert_eq!(errno(h.fallocate(0, 10, 0)), Errno::EISDIR);
    assert_eq!(h.getattr().unwrap().kind, FileKind::Dir);
}

#[test]
fn lookups_follow_renames_and_replacements() {
    let (_d, _db, b) = setup();
    b.mkdir("a", 0o755, &ME).unwrap();
    b.mkdir("a/b", 0o755, &ME).unwrap();
    put(&b, "a/b/f", b"one");
    let f1 = b.getattr("a/b/f").unwrap().ino; // the walk is cached now
    b.rename("a", "x", 0).unwrap();
    assert_eq!(errno(b.getattr("a/b/f")), Errno::ENOENT);
    assert_eq!(b.getattr("x/b/f").unwrap().ino, f1);
    put(&b, "a", b"a file now");
    assert_eq!(errno(b.getattr("a/b")), Errno::ENOTDIR);
    b.unlink("x/b/f").unwrap();
    assert_eq!(errno(b.getattr("x/b/f")), Errno::ENOENT);
    put(&b, "x/b/f", b"two");
    assert_ne!(b.getattr("x/b/f").unwrap().ino, f1);
    assert_eq!(get(&b, "x/b/f"), b"two");
    b.mkdir("y", 0o755, &ME).unwrap();
    b.rename("x", "y", RENAME_EXCHANGE).unwrap();
    assert_eq!(get(&b, "y/b/f"), b"two");
    assert_eq!(errno(b.getattr("x/b")), Errno::ENOENT);
    // A failed rename changes nothing, cached or not.
    assert_eq!(errno(b.rename("y/b", "a/b", 0)), Errno::ENOTDIR);
    assert_eq!(get(&b, "y/b/f"), b"two");
    b.unlink("y/b/f").unwrap();
    b.rmdir("y/b").unwrap();
    b.mkdir("y/b", 0o700, &ME).unwrap();
    assert_eq!(b.getattr("y/b").unwrap().perm, 0o700);
}

#[test]
fn deleting_a_node_reaches_its_rows_by_key() {
    let (_d, db, b) = setup();
    put(&b, "f", b"x");
    let conn = Connection::open(&db).unwrap();
    for sql in super::super::store::DELETE_ROWS {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let params: &[i64] = if stmt.parameter_count() == 2 { &[1, 2] } else { &[1] };
        let rows = stmt.query_map(rusqlite::params_from_iter(params), |r| r.get::<_, String>(3)).unwrap();
        let plan: Vec<String> = rows.map(Result::unwrap).collect();
        assert!(plan.iter().all(|step| step.starts_with("SEARCH ")), "{sql}: {plan:?}");
    }
    // And they delete every row of the node, and only those.
    put(&b, "g", &vec![7u8; 3 * CHUNK_SIZE as usize]);
    b.unlink("f").unwrap();
    assert_eq!(count(&db, "SELECT count(*) FROM chunks"), 3);
    b.unlink("g").unwrap();
    assert_eq!(count(&db, "SELECT count(*) FROM chunks"), 0);
}

/// Mode, owner and time changes made through an open file wait in its buffer and are
/// committed with its data at the next flush: what an untar does to every file costs one
/// commit, not four. Changes by path are committed at once, with the buffer.
#[test]
fn attribute_changes_through_a_handle_are_committed_with_its_data() {
    let (_d, db, b) = setup();
    let (_, f) = b.create("kept", 0o600, 0, &ME).unwrap();
    f.write(0, b"data").unwrap();
    let at = |secs| TimeSet::At(UNIX_EPOCH + Duration::from_secs(secs));
    let stored = || -> (u32, u32, u32, i64, i64) {
        let sql = "SELECT perm, uid, gid, mtime, size FROM inodes
                   WHERE ino = (SELECT child FROM dentries WHERE name = 'kept')";
        raw(&db).query_row(sql, [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))).unwrap()
    };
    let commits = b.total_changes();
    f.setattr(&SetAttr { mtime: Some(at(1_000_000)), ..Default::default() }).unwrap();
    f.setattr(&SetAttr { uid: Some(77), gid: Some(88), ..Default::default() }).unwrap();
    let a = f.setattr(&SetAttr { mode: Some(0o751), ..Default::default() }).unwrap();
    assert_eq!(b.total_changes(), commits, "nothing is written before the flush");
    assert_eq!(stored().0, 0o600);
    // Every view sees the changes at once.
    let mtime = UNIX_EPOCH + Duration::from_secs(1_000_000);
    for a in [a, b.getattr("kept").unwrap(), f.getattr().unwrap()] {
        assert_eq!((a.perm, a.uid, a.gid, a.size, a.mtime), (0o751, 77, 88, 4, mtime));
    }
    f.flush().unwrap();
    // The explicit mtime, set after the write, wins over the write's own.
    assert_eq!(stored(), (0o751, 77, 88, 1_000_000_000_000_000, 4));

    // A write after an explicit mtime sets the file's mtime again, as on any filesystem.
    f.setattr(&SetAttr { mtime: Some(at(2_000_000)), ..Default::default() }).unwrap();
    f.write(4, b"more").unwrap();
    f.flush().unwrap();
    let (_, _, _, mtime, size) = stored();
    assert!(mtime > 2_000_000_000_000_000, "mtime {mtime}");
    assert_eq!(size, 8);

    // By path, or with a truncation, a change is committed at once, buffered ones with it.
    f.setattr(&SetAttr { mode: Some(0o700), ..Default::default() }).unwrap();
    b.setattr("kept", &SetAttr { uid: Some(5), ..Default::default() }).unwrap();
    assert_eq!((stored().0, stored().1), (0o700, 5));
    f.setattr(&SetAttr { mode: Some(0o604), size: Some(2), ..Default::default() }).unwrap();
    assert_eq!((stored().0, stored().4), (0o604, 2));
}
