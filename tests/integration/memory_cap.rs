//! A memory route's `max_bytes` counts allocated bytes (whole pages written or reserved, not
//! holes) on both stores alike, and space freed is free again at once.

use std::fs;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use crate::harness::Fixture;

const CAP: u64 = 10 << 20;
const PAGE: u64 = 4096;
const GIB: u64 = 1 << 30;
/// Just under the cap: what the test writes, twice.
const DATA: u64 = CAP - 4 * PAGE;

/// The same cap on each store.
fn routes() -> String {
    [("/captmpfs", "tmpfs"), ("/capdaemon", "daemon")]
        .map(|(path, store)| {
            format!("[[routes]]\npath = \"{path}\"\nbackend = \"memory\"\nmax_bytes = {CAP}\nstore = \"{store}\"\n")
        })
        .join("\n")
}

/// What `df` says: (size, used, available) in bytes.
fn df(dir: &Path) -> (u64, u64, u64) {
    let st = nix::sys::statvfs::statvfs(dir).unwrap();
    let unit = st.fragment_size() as u64;
    let (blocks, free) = (st.blocks() as u64, st.blocks_free() as u64);
    (blocks * unit, (blocks - free) * unit, st.blocks_available() as u64 * unit)
}

/// Bytes allocated to a file, as `du` counts them.
fn allocated(path: &Path) -> u64 {
    fs::metadata(path).unwrap().blocks() * 512
}

fn fallocate(f: &fs::File, mode: i32, offset: u64, len: u64) -> std::io::Result<()> {
    match unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as i64, len as i64) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

fn enospc(r: std::io::Result<()>, what: &str) {
    let e = r.expect_err(what);
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{what}: {e}");
}

/// Writes `len` bytes of `byte` at the start of `f`, as a program would: a MiB at a time.
fn fill(f: &mut fs::File, len: u64, byte: u8) {
    let chunk = vec![byte; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n]).unwrap();
        left -= n as u64;
    }
}

/// One run of the scenario on `route`; returns what `df` and `du` said at each step, which
/// must be the same on both stores.
fn scenario(fx: &Fixture, route: &str) -> Vec<(&'static str, (u64, u64, u64), u64)> {
    let (dir, sparse, again) =
        (fx.p(route), fx.p(&format!("{route}/sparse")), fx.p(&format!("{route}/again")));
    let mut seen = Vec::new();
    let mut step = |what: &'static str, file: &Path| seen.push((what, df(&dir), allocated(file)));
    let (size, used, avail) = df(&dir);
    assert_eq!((size, used, avail), (CAP, 0, CAP), "{route}: df of an empty route");

    // A size far past the cap is a hole: it allocates nothing.
    let mut f = fs::OpenOptions::new().read(true).write(true).create_new(true).open(&sparse).unwrap();
    f.set_len(GIB).unwrap_or_else(|e| panic!("{route}: ftruncate to 1 GiB: {e}"));
    assert_eq!(fs::metadata(&sparse).unwrap().len(), GIB, "{route}");
    assert_eq!(allocated(&sparse), 0, "{route}: st_blocks of a sparse file");
    assert!(df(&dir).1 < 64 << 10, "{route}: df after the truncate: {:?}", df(&dir));
    step("truncated", &sparse);

    // Data up to just under the cap: what was written is what is allocated.
    fill(&mut f, DATA, 1);
    assert_eq!(allocated(&sparse), DATA, "{route}: st_blocks after writing");
    assert_eq!(df(&dir).1, DATA, "{route}: df used after writing");
    step("written", &sparse);

    // A reservation past what is left fails whole; one that fits counts.
    enospc(fallocate(&f, 0, GIB / 2, 5 * PAGE), &format!("{route}: fallocate of 5 pages with 4 left"));
    assert_eq!(
        (allocated(&sparse), df(&dir).1),
        (DATA, DATA),
        "{route}: a failed fallocate allocates nothing"
    );
    fallocate(&f, 0, GIB / 2, 2 * PAGE).unwrap_or_else(|e| panic!("{route}: fallocate of 2 pages: {e}"));
    assert_eq!(allocated(&sparse), DATA + 2 * PAGE, "{route}: st_blocks after fallocate");
    step("reserved", &sparse);

    // A write crossing the cap fails with ENOSPC at that write; what fitted is stored.
    enospc(f.write_all_at(&[2; 3 * PAGE as usize], GIB / 4), &format!("{route}: a write crossing the cap"));
    assert_eq!(df(&dir), (CAP, CAP, 0), "{route}: df when full");
    let mut stored = vec![0; 3 * PAGE as usize];
    f.read_exact_at(&mut stored, GIB / 4).unwrap();
    assert!(
        stored[..2 * PAGE as usize].iter().all(|&b| b == 2)
            && stored[2 * PAGE as usize..].iter().all(|&b| b == 0)
    );
    enospc(f.write_all_at(b"x", GIB - 1), &format!("{route}: a write into a hole when full"));
    f.write_all_at(b"overwrite", 0).unwrap_or_else(|e| panic!("{route}: an overwrite when full: {e}"));
    f.sync_all().unwrap();
    step("full", &sparse);
    drop(f);

    // Read back through a descriptor of its own (on the tmpfs store the kernel then kept the
    // file registered for passthrough, and so its space, until it forgot the inode).
    let mut head = [0; 16];
    fs::File::open(&sparse).unwrap().read_exact(&mut head).unwrap();
    assert_eq!(&head, b"overwrite\x01\x01\x01\x01\x01\x01\x01", "{route}");

    // Unlinked, the file's space is free when unlink returns: the same amount fits again.
    fs::remove_file(&sparse).unwrap();
    assert_eq!(df(&dir).1, 0, "{route}: df used right after the unlink");
    let mut g = fs::OpenOptions::new().read(true).write(true).create_new(true).open(&again).unwrap();
    fill(&mut g, DATA, 3);
    assert_eq!(allocated(&again), DATA, "{route}");
    step("written again", &again);

    // Truncating and punching holes free space at once too.
    g.set_len(PAGE + 1).unwrap();
    assert_eq!((allocated(&again), df(&dir).1), (2 * PAGE, 2 * PAGE), "{route}: after truncating down");
    g.write_all_at(&vec![4; (CAP - 2 * PAGE) as usize], 2 * PAGE).unwrap();
    assert_eq!(df(&dir).1, CAP, "{route}");
    fallocate(&g, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, PAGE, CAP)
        .unwrap_or_else(|e| panic!("{route}: punching a hole: {e}"));
    assert_eq!((allocated(&again), df(&dir).1), (PAGE, PAGE), "{route}: after punching");
    assert_eq!(fs::metadata(&again).unwrap().len(), CAP, "{route}: punching keeps the size");
    g.write_all_at(&vec![5; (CAP - PAGE) as usize], PAGE).unwrap();
    step("refilled", &again);
    drop(g);
    fs::remove_file(&again).unwrap();
    step("emptied", &dir);
    seen
}

#[test]
fn max_bytes_counts_allocated_bytes_on_both_stores() {
    let fx = Fixture::new(&routes());
    let tmpfs = scenario(&fx, "/captmpfs");
    let daemon = scenario(&fx, "/capdaemon");
    assert_eq!(tmpfs, daemon, "df and du, step by step: tmpfs store, then daemon store");
}

/// What a capped route's names and extended attributes take is bounded too, alike on both
/// stores (tmpfs's inode budget: one inode per 2 KiB of the cap, at least 4,096, shared with
/// the attributes): creating past it, or setting one more attribute, answers ENOSPC, and what
/// is removed is free again.
#[test]
fn max_bytes_bounds_names_and_extended_attributes_on_both_stores() {
    let fx = Fixture::new(&format!("{}\n[fuse]\nxattrs = true\n", routes()));
    let mut seen = Vec::new();
    for route in ["/captmpfs", "/capdaemon"] {
        let dir = fx.p(route);
        let inodes = |dir: &Path| {
            let st = nix::sys::statvfs::statvfs(dir).unwrap();
            (st.files() as u64, st.files_free() as u64)
        };
        let at_start = inodes(&dir);
        let mut made = 0;
        let refusal = loop {
            match fs::File::create(dir.join(format!("f{made}"))) {
                Ok(_) => made += 1,
                Err(e) => break e,
            }
            assert!(made <= 10_000, "{route}: no limit");
        };
        assert_eq!(refusal.raw_os_error(), Some(libc::ENOSPC), "{route}: {refusal}");
        let full = inodes(&dir);
        fs::remove_file(dir.join("f0")).unwrap();
        fs::File::create(dir.join("again")).unwrap();
        // Each further hard link takes one too (five freed here, five links fit), and gives it
        // back when removed.
        for n in 1..6 {
            fs::remove_file(dir.join(format!("f{n}"))).unwrap();
        }
        let mut linked = 0;
        let refusal = loop {
            match fs::hard_link(dir.join("again"), dir.join(format!("l{linked}"))) {
                Ok(()) => linked += 1,
                Err(e) => break e,
            }
            assert!(linked <= 10, "{route}: no limit on links");
        };
        assert_eq!((linked, refusal.raw_os_error()), (5, Some(libc::ENOSPC)), "{route}: {refusal}");
        for n in 0..linked {
            fs::remove_file(dir.join(format!("l{n}"))).unwrap();
        }
        for n in 6..made {
            fs::remove_file(dir.join(format!("f{n}"))).unwrap();
        }
        // Attributes share the budget.
        let file = dir.join("again");
        let value = vec![b'x'; 60_000];
        let mut set = 0;
        let refusal = loop {
            let name = format!("user.a{set}");
            match xattr_set(&file, &name, &value) {
                Ok(()) => set += 1,
                Err(e) => break e,
            }
            assert!(set <= 1_000, "{route}: no limit on attributes");
        };
        assert_eq!(refusal.raw_os_error(), Some(libc::ENOSPC), "{route}: {refusal}");
        fs::remove_file(&file).unwrap();
        assert_eq!(inodes(&dir), at_start, "{route}: all given back");
        seen.push((at_start, made, full, linked, set));
    }
    assert_eq!(seen[0], seen[1], "tmpfs store, then daemon store");
    assert_eq!(seen[0].0 .0, 5120, "{seen:?}");
}

fn xattr_set(path: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let name = std::ffi::CString::new(name).unwrap();
    let ret = unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if ret == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
