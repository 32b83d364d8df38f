//! Directories: opening them (or letting the kernel open them by itself), and their
//! listings. An open directory takes a snapshot of its visible entries (at the first
//! `readdir`, or at `opendir` when listing may ask a human) and `readdir`/`readdirplus` hand
//! them out by offset. Unless a rule judges listings at `opendir`, the first `opendir` is
//! answered ENOSYS and the kernel opens directories by itself from then on: each READDIR
//! then continues the snapshot its offset names, and the listing is judged at its first
//! READDIR. The kernel keeps listings (`FOPEN_CACHE_DIR`), so it often asks no `readdir` at
//! all, and the directory is never listed.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;

use std::sync::atomic::Ordering;

use fuser::{
    Errno as FuseErrno, FileHandle, FileType, FopenFlags, INodeNo, Notifier, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyOpen, Request,
};

use super::convert::{ctx, errno, file_type, fuse_attr};
use super::{FuseDoor, GEN, LONG_TTL};
use crate::backend::{Attr, DirEntry};
use crate::engine::Ctx;
use crate::error::{Errno, FsError, FsResult};
use crate::vpath::VPath;

/// An open directory: a snapshot of its visible entries, served by offset.
pub(super) struct DirHandle {
    pub(super) path: VPath,
    entries: OnceLock<Arc<Vec<DirEntry>>>,
}

impl DirHandle {
    /// An open directory whose listing is taken when first asked for.
    pub(super) fn new(path: VPath) -> DirHandle {
        DirHandle { path, entries: OnceLock::new() }
    }

    /// An open directory with the listing `entries`.
    pub(super) fn listed(path: VPath, entries: Vec<DirEntry>) -> DirHandle {
        DirHandle { path, entries: OnceLock::from(Arc::new(entries)) }
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

    /// A file of `dir` was read in a way that made the kernel distrust its atime (its handle
    /// was released). Returns whether the kernel's listing of `dir` should be dropped now:
    /// once half its entries were read, one listing refreshes them all, where each `stat`
    /// would cost a GETATTR. A directory the door has not listed since has nothing to drop.
    pub(super) fn read(&self, dir: u64) -> bool {
        let mut relist = false;
        self.with_map(dir, |r| {
            r.read += 1;
            if r.listed.is_some_and(|entries| r.read * 2 >= entries) {
                *r = Reads::default();
                relist = true;
            }
        });
        relist
    }
}

/// Drops the kernel's listings of directories, on a thread of its own: the invalidation locks
/// the listing's pages, and a ring thread must never wait for a page lock (its holder may be
/// waiting for a request queued on that very ring).
pub(super) struct Relister(Mutex<std::sync::mpsc::Sender<u64>>);

impl Relister {
    pub(super) fn start(notifier: Arc<OnceLock<Notifier>>) -> Relister {
        let (tx, rx) = std::sync::mpsc::channel::<u64>();
        let spawned = std::thread::Builder::new().name("fuse-relist".into()).spawn(move || {
            // Ends when the door (the sender) is gone.
            for dir in rx {
                if let Some(notifier) = notifier.get() {
                    // Offset 0: the listing (the directory's pages) goes, with its attributes.
                    let _ = notifier.inval_inode(INodeNo(dir), 0, -1);
                }
            }
        });
        if let Err(e) = spawned {
            tracing::warn!("cannot start the relisting thread ({e}); listings are not refreshed after reads");
        }
        Relister(Mutex::new(tx))
    }

    /// Has the kernel drop its listing of `dir` soon.
    pub(super) fn relist(&self, dir: u64) {
        let _ = self.0.lock().send(dir);
    }
}

/// Listings of directories the kernel did not open (it opens none once `opendir` answered
/// ENOSYS, see `FuseDoor::opendir`): each is a snapshot taken at offset 0 that the READDIRs
/// continuing it name by the high half of their offsets, so that two processes listing one
/// directory at once each continue their own.
#[derive(Default)]
pub(super) struct Snapshots(Mutex<SnapshotTable>);

#[derive(Default)]
struct SnapshotTable {
    next: u32,
    by_id: HashMap<u32, (u64, Arc<Vec<DirEntry>>)>,
    /// Oldest first: past [`SNAPSHOTS_KEPT`] the oldest go (a listing nobody read to its end).
    order: VecDeque<u32>,
}

/// Snapshots kept at most.
const SNAPSHOTS_KEPT: usize = 1024;

impl Snapshots {
    fn insert(&self, dir: u64, entries: Arc<Vec<DirEntry>>) -> u32 {
        let mut table = self.0.lock();
        // Never 0: the number of listings taken through an open directory's handle.
        table.next = table.next.wrapping_add(1).max(1);
        let id = table.next;
        table.by_id.insert(id, (dir, entries));
        table.order.push_back(id);
        while table.order.len() > SNAPSHOTS_KEPT {
            let old = table.order.pop_front().expect("not empty");
            table.by_id.remove(&old);
        }
        id
    }

    fn get(&self, id: u32, dir: u64) -> Option<Arc<Vec<DirEntry>>> {
        self.0.lock().by_id.get(&id).filter(|(d, _)| *d == dir).map(|(_, entries)| entries.clone())
    }

    /// The listing `id` was read to its end; returns whether it was one of these snapshots.
    fn done(&self, id: u32) -> bool {
        let mut table = self.0.lock();
        let known = table.by_id.remove(&id).is_some();
        if known {
            table.order.retain(|&o| o != id);
        }
        known
    }
}

/// A READDIR offset: the listing's number (0 for an open directory's own) and the position in
/// it (1 and 2 are `.` and `..`, entry i is i + 3).
fn offset(listing: u32, position: u64) -> u64 {
    (u64::from(listing) << 32) | position
}

fn position(offset: u64) -> u64 {
    offset & 0xffff_ffff
}

/// The entries a READDIR hands out, the directory's path, and the number its offsets carry.
type Listing = (VPath, Arc<Vec<DirEntry>>, u32);

impl FuseDoor {
    /// The listing of `dir` (inode `ino`), taken now if this is the first time it is asked for.
    fn entries(&self, caller: &Ctx, ino: INodeNo, dir: &DirHandle) -> FsResult<Arc<Vec<DirEntry>>> {
        if let Some(entries) = dir.entries.get() {
            return Ok(entries.clone());
        }
        let listed = Arc::new(self.take_listing(caller, ino, &dir.path)?);
        // Two first readdirs at once: one listing wins, and both serve it.
        Ok(dir.entries.get_or_init(|| listed).clone())
    }

    /// Lists `path` (inode `ino`) for the kernel, counted (`status` shows how often the
    /// kernel had no listing of its own to serve).
    pub(super) fn take_listing(&self, caller: &Ctx, ino: INodeNo, path: &VPath) -> FsResult<Vec<DirEntry>> {
        let entries = self.engine.readdir(caller, path)?;
        self.engine.fuse_listings.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.reads_since_listed.listed(ino.0, entries.len());
        Ok(entries)
    }

    /// The listing a READDIR at `offset` reads: its open directory's (`fh`), or, for a
    /// directory the kernel did not open, the snapshot the offset names, taken now at offset
    /// 0. Such a listing is judged here rather than at `opendir`: one that would ask a human
    /// is refused until approved (the READDIR holds the directory's lock, so it cannot wait).
    fn listing(&self, caller: &Ctx, ino: INodeNo, fh: FileHandle, offset: u64) -> FsResult<Listing> {
        if fh.0 != 0 {
            let dir = self.dirs.read().get(&fh.0).cloned().ok_or_else(|| FsError::errno(Errno::EBADF))?;
            let entries = self.entries(caller, ino, &dir)?;
            return Ok((dir.path.clone(), entries, 0));
        }
        let path = self.inodes.path(ino.0)?;
        let id = (offset >> 32) as u32;
        if let Some(entries) = (offset != 0).then(|| self.snapshots.get(id, ino.0)).flatten() {
            return Ok((path, entries, id));
        }
        // From the start, or continuing a snapshot that is gone (by position, as in a directory
        // that changes while it is read).
        let taken = self.take_listing(caller, ino, &path);
        let entries = Arc::new(self.refused_until_approved(caller, taken)?);
        let id = self.snapshots.insert(ino.0, entries.clone());
        Ok((path, entries, id))
    }

    /// `opendir`: answered ENOSYS once when no rule judges listings at open (see the module
    /// doc), else the directory is judged (and listed, when a listing may ask) now.
    pub(super) fn open_dir(&self, req: &Request, ino: INodeNo, reply: ReplyOpen) {
        // Unless a listing must be judged when its directory is opened (a rule that may ask a
        // human about it, or refuse it without hiding it), the kernel opens directories by
        // itself: after this ENOSYS it sends no OPENDIR or RELEASEDIR again, keeps every
        // listing, and each READDIR names its listing by its offset (see `listing`).
        if !self.engine.listings_judged_at_open() {
            return reply.error(FuseErrno::ENOSYS);
        }
        self.engine.fuse_opendirs.fetch_add(1, Ordering::Relaxed);
        let work = move |d: &FuseDoor, c: &Ctx| {
            let p = d.inodes.path(ino.0)?;
            if d.engine.listing_may_ask() {
                return Ok(DirHandle::listed(p.clone(), d.take_listing(c, ino, &p)?));
            }
            d.engine.opendir(c, &p)?;
            Ok(DirHandle::new(p))
        };
        self.serve(ctx(req), reply, work, move |d, result, reply: ReplyOpen| match result {
            Ok(dir) => {
                let fh = d.next_handle.fetch_add(1, Ordering::Relaxed);
                // Where names are cached long (the daemon tells the kernel about every change),
                // the kernel may keep the listing too and answer the next `readdir` itself.
                // Local changes through the mount reset it; so does the relister
                // ([`listing::ReadsSinceListed`]).
                let flags = if d.engine.ttl(&dir.path) >= LONG_TTL {
                    FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE
                } else {
                    FopenFlags::empty()
                };
                d.dirs.write().insert(fh, Arc::new(dir));
                reply.opened(FileHandle(fh), flags)
            }
            Err(e) => reply.error(errno(&e)),
        })
    }

    /// `fsyncdir`.
    pub(super) fn sync_dir(&self, ino: INodeNo, fh: FileHandle, reply: ReplyEmpty) {
        // A directory the kernel opened by itself has no handle here: its inode names it.
        let path = match self.dirs.read().get(&fh.0) {
            Some(dir) => Ok(dir.path.clone()),
            None if fh.0 == 0 => self.inodes.path(ino.0),
            None => Err(FsError::errno(Errno::EBADF)),
        };
        match path.and_then(|p| self.engine.fsyncdir(&p)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// A snapshot was read to its end. Rules loaded since the kernel stopped opening
    /// directories may judge listings at `opendir` (they ask a human, or refuse without
    /// hiding): the kernel must not keep such a listing, so that the next one is judged too.
    fn listed_to_the_end(&self, ino: INodeNo, id: u32) {
        if self.snapshots.done(id) && self.engine.listings_judged_at_open() {
            self.relister.relist(ino.0);
        }
    }

    /// `readdir`: the names of the listing from `offset` on.
    pub(super) fn list(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let (_, entries, id) = match self.listing(&ctx(req), ino, fh, offset) {
            Ok(listing) => listing,
            Err(e) => return reply.error(errno(&e)),
        };
        let mut next = position(offset);
        if next >= entries.len() as u64 + 2 {
            self.listed_to_the_end(ino, id);
        }
        if next == 0 {
            if reply.add(ino, self::offset(id, 1), FileType::Directory, ".") {
                return reply.ok();
            }
            next = 1;
        }
        if next == 1 {
            if reply.add(ino, self::offset(id, 2), FileType::Directory, "..") {
                return reply.ok();
            }
            next = 2;
        }
        for (i, entry) in entries.iter().enumerate().skip((next - 2) as usize) {
            // The kernel does not use these numbers for lookups; real ones come from lookup.
            let at = self::offset(id, i as u64 + 3);
            if reply.add(INodeNo(u64::MAX), at, file_type(entry.kind), &entry.name) {
                break;
            }
        }
        reply.ok()
    }

    /// `readdirplus`: the entries of the listing from `offset` on, each with its attributes
    /// and a lookup the kernel holds.
    pub(super) fn list_plus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let caller = ctx(req);
        let (path, entries, id) = match self.listing(&caller, ino, fh, offset) {
            Ok(listing) => listing,
            Err(e) => return reply.error(errno(&e)),
        };
        let ttl = self.engine.ttl(&path);
        let mut next = position(offset);
        if next >= entries.len() as u64 + 2 {
            self.listed_to_the_end(ino, id);
        }
        if next < 2 {
            let dot = match self.engine.getattr(&caller, &path) {
                Ok(a) => a,
                Err(e) => return reply.error(errno(&e)),
            };
            for (at, name) in [(1u64, "."), (2, "..")].into_iter().skip(next as usize) {
                if reply.add(ino, self::offset(id, at), name, &ttl, &fuse_attr(ino.0, &dot), GEN) {
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
                looked_up = self.engine.lookup_entries(&caller, &path, &window).into_iter();
            }
            let (path, found) = looked_up.next().expect("a window holds the entry");
            let (child, ttl, attr) = match found {
                Ok(attr) => {
                    let child = self.remember(&path, &attr);
                    (child, self.attr_ttl(child, &path), attr)
                }
                // Listed but not readable (a deny rule with `hide = false`): the name is shown
                // with placeholder attributes the kernel may not keep, so a stat asks again
                // and gets EACCES.
                Err(e) if e.is(Errno::EACCES) => {
                    let attr = Attr::placeholder(entry.kind);
                    (self.inodes.remember(&path, None), Duration::ZERO, attr)
                }
                // Vanished, or hidden, since the listing: skipped.
                Err(_) => continue,
            };
            let at = self::offset(id, i as u64 + 3);
            if reply.add(INodeNo(child), at, &entry.name, &ttl, &fuse_attr(child, &attr), GEN) {
                // Not sent: the kernel did not take this lookup.
                self.inodes.forget(child, 1);
                break;
            }
        }
        reply.ok()
    }
}
