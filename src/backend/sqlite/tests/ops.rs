//! Single operations: data paths, truncation, directories, every rename case, links, symlinks,
//! ownership, times, xattrs, fallocate and statfs.

use std::time::{Duration, UNIX_EPOCH};

use super::*;

#[test]
fn nodes_read_while_nothing_commits_are_kept_and_every_commit_drops_them() {
    let (_d, _db, b) = setup();
    put(&b, "f", b"one");
    b.mkdir("d", 0o755, &ME).unwrap();
    let ino = b.getattr("f").unwrap().ino;
    assert!(b.caches_node(ino), "a read through the idle write connection keeps the node");
    assert_eq!(b.getattr("f").unwrap().perm, 0o644);

    // Each change is seen by the next read, whatever made it.
    b.setattr("f", &SetAttr { mode: Some(0o600), ..Default::default() }).unwrap();
    assert_eq!(b.getattr("f").unwrap().perm, 0o600);
    let h = b.open("f", libc::O_RDWR).unwrap();
    h.write(0, b"longer").unwrap();
    h.flush().unwrap();
    drop(h);
    assert_eq!(b.getattr("f").unwrap().size, 6);
    let dir_links = b.getattr("d").unwrap().nlink;
    b.mkdir("d/sub", 0o755, &ME).unwrap();
    assert_eq!(b.getattr("d").unwrap().nlink, dir_links + 1);
    b.rename("f", "d/g", 0).unwrap();
    assert_eq!(errno(b.getattr("f")), Errno::ENOENT);
    assert_eq!(b.getattr("d/g").unwrap().ino, ino);
    b.unlink("d/g").unwrap();
    assert_eq!(errno(b.getattr("d/g")), Errno::ENOENT);
}

#[test]
fn overwrites_inside_stored_chunks_are_written_in_place() {
    let (_d, db, b) = setup();
    let cs = CHUNK_SIZE as usize;
    let mut expect = pattern(16 * cs + 100, 7);
    put(&b, "big", &expect);
    assert_eq!(count(&db, "SELECT count(*) FROM chunks"), 17);
    fn write(f: &dyn OpenFile, expect: &mut [u8], at: usize, data: &[u8]) {
        assert_eq!(f.write(at as u64, data).unwrap(), data.len() as u32);
        expect[at..at + data.len()].copy_from_slice(data);
    }

    // Reopen so nothing is buffered or cached.
    let f = b.open("big", libc::O_RDWR).unwrap();
    let patch = vec![0xAB; 4096];
    // Inside one stored chunk: only the written bytes are buffered, and the commit writes them
    // into the chunk, changing no row but the inode's.
    let before = b.total_changes();
    write(&*f, &mut expect, 4 * cs + 1000, &patch);
    assert_eq!(b.buffered_bytes(), patch_cost(4096));
    f.flush().unwrap();
    assert_eq!(b.total_changes() - before, 1);
    // Across a chunk boundary: two patches.
    let before = b.total_changes();
    write(&*f, &mut expect, 6 * cs - 2048, &patch);
    assert_eq!(b.buffered_bytes(), 2 * patch_cost(2048));
    f.flush().unwrap();
    assert_eq!(b.total_changes() - before, 1);

    // Past half a chunk of patches, the chunk is buffered whole, and rewritten as a row.
    let before = b.total_changes();
    for i in 0..7 {
        write(&*f, &mut expect, 8 * cs + i * 5000, &patch);
    }
    assert_eq!(b.buffered_bytes(), 7 * patch_cost(4096));
    write(&*f, &mut expect, 8 * cs + 40_000, &patch);
    assert_eq!(b.buffered_bytes(), cs);
    same_bytes(&read_all(&*f), &expect, "patched, then whole, before the commit");
    f.flush().unwrap();
    assert_eq!(b.total_changes() - before, 2);

    // Many tiny writes count for their bookkeeping too: the buffer never holds more for a
    // chunk than the chunk.
    for i in 0..1000 {
        write(&*f, &mut expect, 2 * cs + i * 7, b"x");
    }
    assert_eq!(b.buffered_bytes(), cs);
    f.flush().unwrap();

    // A write reaching past the stored bytes of the last chunk buffers it whole: a blob cannot
    // grow in place.
    let before = b.total_changes();
    write(&*f, &mut expect, 16 * cs + 10, b"inside");
    assert_eq!(b.buffered_bytes(), patch_cost(6));
    expect.resize(16 * cs + 120, 0);
    write(&*f, &mut expect, 16 * cs + 90, &[b'g'; 30]);
    assert_eq!(b.buffered_bytes(), 120);
    same_bytes(&read_all(&*f), &expect, "read back");
    f.flush().unwrap();
    assert_eq!(b.total_changes() - before, 2);

    same_bytes(&read_all(&*f), &expect, "read back");
    drop(f);
    same_bytes(&get(&b, "big"), &expect, "stored");
    assert_eq!(count(&db, "SELECT count(*) FROM chunks"), 17);
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
    b.commit_pending().unwrap();
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
    b.commit_pending().unwrap();
    assert_eq!(count(&db, "SELECT count(*) FROM chunks"), 3);
    b.unlink("g").unwrap();
    b.commit_pending().unwrap();
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
    b.commit_pending().unwrap(); // the create, held
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

    // By path, or with a truncation, a change is made at once, buffered ones with it (which
    // are committed then).
    f.setattr(&SetAttr { mode: Some(0o700), ..Default::default() }).unwrap();
    b.setattr("kept", &SetAttr { uid: Some(5), ..Default::default() }).unwrap();
    assert_eq!((stored().0, stored().1), (0o700, 5));
    f.setattr(&SetAttr { mode: Some(0o604), size: Some(2), ..Default::default() }).unwrap();
    b.commit_pending().unwrap();
    assert_eq!((stored().0, stored().4), (0o604, 2));
}

#[test]
fn statfs_reports_the_host_filesystem() {
    let (_d, _db, b) = setup();
    let s = b.statfs("").unwrap();
    assert_eq!(s.namelen, 255);
    assert!(s.bsize > 0 && s.frsize > 0 && s.blocks > 0 && s.bfree <= s.blocks);
    assert!(s.files >= 1 << 32 && s.ffree >= 1 << 32);
}
