//! Directory listings: the snapshot of a directory's visible entries that an open directory
//! takes (at the first `readdir`, or at `opendir` when listing may ask a human), and the
//! entries `readdir` and `readdirplus` hand out of it by offset. Where the kernel keeps
//! listings (`FOPEN_CACHE_DIR`), it often asks no `readdir` at all after an `opendir`, and
//! then the directory is never listed.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use parking_lot::Mutex;

use fuser::{Errno as FuseErrno, FileHandle, FileType, INodeNo, ReplyDirectory, ReplyDirectoryPlus, Request};

use super::convert::{ctx, errno, file_type, fuse_attr};
use super::{FuseDoor, GEN};
use crate::backend::{Attr, DirEntry};
use crate::error::Errno;
use crate::vpath::VPath;

/// An open directory: a snapshot of its visible entries, served by offset.
pub(super) struct DirHandle {
    pub(super) path: VPath,
    entries: OnceLock<Vec<DirEntry>>,
}

impl DirHandle {
    /// An open directory whose listing is taken when first asked for.
    pub(super) fn new(path: VPath) -> DirHandle {
        DirHandle { path, entries: OnceLock::new() }
    }

    /// An open directory with the listing `entries`.
    pub(super) fn listed(path: VPath, entries: Vec<DirEntry>) -> DirHandle {
        DirHandle { path, entries: OnceLock::from(entries) }
    }
}

/// Files read through passthrough since the door last listed their directory, per directory
/// inode. Such reads make the kernel distrust each file's attributes (its atime), and the next
/// `stat` of each then costs a GETATTR; listing the directory afresh (readdirplus, not the
/// kernel's cached listing) refreshes every entry in one request instead. A listing costs
/// about 7.5 µs per entry and a GETATTR 15–20 µs, so a directory is listed afresh only when at
/// least half its entries were read: `grep -r` and a checkout's `git status` read them all,
/// `git add` reads the few files that changed.
#[derive(Default)]
pub(super) struct ReadsSinceListed(Mutex<HashMap<u64, Reads>>);

#[derive(Default)]
struct Reads {
    /// Entries in the door's last listing of the directory (unknown: never listed, or forgotten).
    listed: Option<usize>,
    read: usize,
}

/// Directories tracked at most; past it the map starts over (only an optimisation).
const READS_TRACKED: usize = 65_536;

impl ReadsSinceListed {
    fn with_map(&self, dir: u64, change: impl FnOnce(&mut Reads)) {
        let mut map = self.0.lock();
        if map.len() >= READS_TRACKED && !map.contains_key(&dir) {
            map.clear();
        }
        change(map.entry(dir).or_default());
    }

    /// The door listed `dir` for the kernel: `entries` entries, none read since.
    fn listed(&self, dir: u64, entries: usize) {
        self.with_map(dir, |r| *r = Reads { listed: Some(entries), read: 0 });
    }

    /// A file of `dir` was read through passthrough (its handle was released).
    pub(super) fn read(&self, dir: u64) {
        self.with_map(dir, |r| r.read += 1);
    }

    /// Whether `dir`, being opened, should be listed afresh; the reads counted so far are
    /// judged now (the `stat`s that follow refresh what is not relisted).
    pub(super) fn take_refresh(&self, dir: u64) -> bool {
        let mut map = self.0.lock();
        let Some(reads) = map.get_mut(&dir) else { return false };
        let refresh = reads.read > 0 && reads.listed.is_none_or(|entries| reads.read * 2 >= entries);
        reads.read = 0;
        refresh
    }
}

impl FuseDoor {
    /// The listing of `dir` (inode `ino`), taken now if this is the first time it is asked for.
    fn entries<'d>(
        &self,
        caller: &crate::engine::Ctx,
        ino: INodeNo,
        dir: &'d DirHandle,
    ) -> crate::error::FsResult<&'d [DirEntry]> {
        if let Some(entries) = dir.entries.get() {
            return Ok(entries);
        }
        let listed = self.take_listing(caller, ino, &dir.path)?;
        // Two first readdirs at once: one listing wins, and both serve it.
        Ok(dir.entries.get_or_init(|| listed))
    }

    /// Lists `path` (inode `ino`) for the kernel, counted (`status` shows how often the
    /// kernel had no listing of its own to serve).
    pub(super) fn take_listing(
        &self,
        caller: &crate::engine::Ctx,
        ino: INodeNo,
        path: &VPath,
    ) -> crate::error::FsResult<Vec<DirEntry>> {
        let entries = self.engine.readdir(caller, path)?;
        self.engine.fuse_listings.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.reads_since_listed.listed(ino.0, entries.len());
        Ok(entries)
    }

    /// `readdir`: the names of the listing `fh` took, from `offset` on.
    pub(super) fn list(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let Some(dir) = self.dirs.read().get(&fh.0).cloned() else {
            return reply.error(FuseErrno::EBADF);
        };
        let entries = match self.entries(&ctx(req), ino, &dir) {
            Ok(entries) => entries,
            Err(e) => return reply.error(errno(&e)),
        };
        // Offsets: 1 and 2 are `.` and `..`; entry i has offset i + 3.
        let mut next = offset;
        if next == 0 {
            if reply.add(ino, 1, FileType::Directory, ".") {
                return reply.ok();
            }
            next = 1;
        }
        if next == 1 {
            if reply.add(ino, 2, FileType::Directory, "..") {
                return reply.ok();
            }
            next = 2;
        }
        for (i, entry) in entries.iter().enumerate().skip((next - 2) as usize) {
            // The kernel does not use these numbers for lookups; real ones come from lookup.
            if reply.add(INodeNo(u64::MAX), i as u64 + 3, file_type(entry.kind), &entry.name) {
                break;
            }
        }
        reply.ok()
    }

    /// `readdirplus`: the entries of the listing `fh` took, from `offset` on, each with its
    /// attributes and a lookup the kernel holds.
    pub(super) fn list_plus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let Some(dir) = self.dirs.read().get(&fh.0).cloned() else {
            return reply.error(FuseErrno::EBADF);
        };
        let ttl = self.engine.ttl(&dir.path);
        let caller = ctx(req);
        let entries = match self.entries(&caller, ino, &dir) {
            Ok(entries) => entries,
            Err(e) => return reply.error(errno(&e)),
        };
        let mut next = offset;
        if next < 2 {
            let dot = match self.engine.getattr(&caller, &dir.path) {
                Ok(a) => a,
                Err(e) => return reply.error(errno(&e)),
            };
            for (off, name) in [(1u64, "."), (2, "..")].into_iter().skip(next as usize) {
                if reply.add(ino, off, name, &ttl, &fuse_attr(ino.0, &dot), GEN) {
                    return reply.ok();
                }
            }
            next = 2;
        }
        // The kernel takes as many entries as fit in its buffer (often over a hundred); look
        // them up a window at a time, each window in one engine call (the host backend then
        // resolves the directory once per window, a database backend asks one query).
        const WINDOW: usize = 32;
        let start = (next - 2) as usize;
        let mut looked_up = Vec::new().into_iter();
        for (i, entry) in entries.iter().enumerate().skip(start) {
            if looked_up.len() == 0 {
                let window: Vec<&str> = entries[i..].iter().take(WINDOW).map(|e| e.name.as_str()).collect();
                looked_up = self.engine.lookup_entries(&caller, &dir.path, &window).into_iter();
            }
            let (path, found) = looked_up.next().expect("a window holds the entry");
            let (child, ttl, attr) = match found {
                Ok(attr) => (self.remember(&path, &attr), self.engine.ttl(&path), attr),
                // Listed but not readable (a deny rule with `hide = false`): the name is shown
                // with placeholder attributes the kernel may not keep, so a stat asks again
                // and gets EACCES.
                Err(e) if e.is(Errno::EACCES) => {
                    let attr = Attr::placeholder(entry.kind);
                    (self.inodes.remember(&path, None), Duration::ZERO, attr)
                }
                // Vanished, or hidden, since opendir: skipped.
                Err(_) => continue,
            };
            if reply.add(INodeNo(child), i as u64 + 3, &entry.name, &ttl, &fuse_attr(child, &attr), GEN) {
                // Not sent: the kernel did not take this lookup.
                self.inodes.forget(child, 1);
                break;
            }
        }
        reply.ok()
    }
}
