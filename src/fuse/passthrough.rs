//! Kernel FUSE passthrough: the kernel reads and writes a host file directly, without a round
//! trip through the daemon, once an `open` (which the gate has judged) names a backing file.
//!
//! The kernel allows one backing file per inode while the inode has passthrough handles, and
//! refuses to mix passthrough and cached handles on one inode. So every open of a host-route
//! regular file shares the inode's backing:
//!
//! - a reader registers its own read-only descriptor, and that backing stays registered after
//!   the last close (up to [`IDLE_BACKINGS`] of them), so opening the file again costs the
//!   daemon no extra system call;
//! - a writer registers a read-write backing, unregistered at the last close: a daemon holding
//!   a host file open for writing would make the host's own `execve` of it fail (ETXTBSY);
//! - a writer arriving while readers hold a read-only backing shares it for `mmap` only, and
//!   its reads and writes go through the daemon (`FOPEN_DIRECT_IO`), on the same host file.
//!
//! Programs being executed (`execve`) always get a read-only backing.
//!
//! Small files opened only for reading are not passed through but served from the kernel's
//! page cache ([`page_cache`]). The kernel refuses to mix the two ways on one inode, so while
//! handles of one way are open, every other open of the inode is served the same way. Files
//! a backend stores itself, with no backing file, are served from the page cache too
//! ([`Passthrough::acquire`] counts their every handle there).

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use fuser::BackingId;
use parking_lot::{Condvar, Mutex, MutexGuard};

use super::page_cache::{self, Fill, PageCache, Stamp};
use crate::backend::host::reopen;
use crate::backend::{Attr, BackingFile, FileKind, OpenFile};

/// The kernel's flag on opens made by `execve` (`__FMODE_EXEC`).
const FMODE_EXEC: i32 = 0x20;

/// Read-only backings kept registered after their last close, for files opened again. A tree
/// read over and over (`grep -r`, a build) must fit, or every open misses: with 4,096, a warm
/// `grep -r` over 7,600 files registered and unregistered a backing per file. Each costs the
/// kernel one open file (well under 1 KiB) and lives no longer than the kernel's inode
/// (`forget` drops it), so the kernel's own inode cache bounds them too.
pub const IDLE_BACKINGS: usize = 65536;

/// How the kernel should serve one open handle of a host regular file.
pub enum Served<Id = BackingId> {
    /// Through a backing file (passthrough).
    Backing(Shared<Id>),
    /// Through the kernel's page cache (see [`page_cache`]), after what the door must do
    /// to it first.
    PageCache(Fill),
}

impl<Id> Served<Id> {
    /// Which of the two, for [`Passthrough::release`].
    pub fn way(&self) -> Way {
        match self {
            Served::Backing(_) => Way::Backing,
            Served::PageCache(_) => Way::PageCache,
        }
    }
}

/// How a handle [`Passthrough::acquire`] counted is served, without its backing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    Backing,
    PageCache,
}

/// A handle served through a backing file.
pub struct Shared<Id = BackingId> {
    pub backing: Arc<Id>,
    /// Reads and writes of this handle go through the daemon; the backing serves `mmap`.
    pub direct_io: bool,
}

struct Backing<Id> {
    id: Arc<Id>,
    /// The host file behind it (st_dev, st_ino): a name may since lead to another file.
    identity: (u64, u64),
    writable: bool,
    /// The file lost its last name: the backing goes with its last handle, as a writer's does.
    unlinked: bool,
    handles: usize,
    last_used: u64,
}

/// Generic over the registration handle so the bookkeeping is testable without a kernel.
pub struct Passthrough<Id = BackingId> {
    /// Set in `init` once the kernel agreed to passthrough and the config asks for it.
    enabled: AtomicBool,
    /// Files up to this size opened only for reading are served from the page cache.
    cached_reads_max: AtomicU64,
    /// Logged once: registering a backing failed, so opens fall back to the daemon.
    warned: AtomicBool,
    clock: AtomicU64,
    inodes: Mutex<Inodes<Id>>,
    /// Signalled when the door is done storing a file in the page cache.
    filled: Condvar,
}

/// Per inode, under one lock: how its open handles are served decides how the next is.
struct Inodes<Id> {
    backings: HashMap<u64, Backing<Id>>,
    cached: PageCache,
}

impl<Id> Default for Passthrough<Id> {
    fn default() -> Self {
        Passthrough {
            enabled: AtomicBool::new(false),
            cached_reads_max: AtomicU64::new(0),
            warned: AtomicBool::new(false),
            clock: AtomicU64::new(0),
            inodes: Mutex::new(Inodes { backings: HashMap::new(), cached: PageCache::default() }),
            filled: Condvar::new(),
        }
    }
}

impl<Id> Passthrough<Id> {
    /// Turns passthrough on, with files up to `cached_reads_max` bytes opened only for reading
    /// served from the page cache instead.
    pub fn enable(&self, cached_reads_max: u64) {
        self.cached_reads_max.store(cached_reads_max, Ordering::Relaxed);
        self.enabled.store(true, Ordering::Relaxed);
    }

    /// How to answer an open of `ino` with `flags` whose backend file is `file`, registering a
    /// backing through `register` when the inode needs one. `None`: serve the handle through
    /// the daemon (not a host regular file, or passthrough is off). Each `Some` must be paired
    /// with one [`Passthrough::release`] of its [`Served::way`].
    pub fn acquire(
        &self,
        ino: u64,
        file: &dyn OpenFile,
        flags: i32,
        register: impl FnOnce(BorrowedFd<'_>) -> std::io::Result<Id>,
    ) -> Option<Served<Id>> {
        if !self.enabled.load(Ordering::Relaxed) {
            return None;
        }
        let wants_write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let exec = flags & FMODE_EXEC != 0;
        let cached_reads_max = self.cached_reads_max.load(Ordering::Relaxed);
        let small_read = |size: u64| page_cache::suits(size, wants_write, exec, cached_reads_max);
        let Some(BackingFile { fd, flags: own, opened: st }) = file.backing() else {
            return self.acquire_stored(ino, file.opened_version()?, small_read);
        };
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return None;
        }
        let identity = (st.st_dev, st.st_ino);
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        let mut inodes = self.inodes.lock();
        let in_use = inodes.backings.get(&ino).is_some_and(|b| b.handles > 0);
        // The kernel refuses to mix the two ways on one inode: while handles of either are
        // open, the next one is served the same way.
        if !in_use && (inodes.cached.in_use(ino) || small_read(st.st_size as u64)) {
            return Some(self.open_cached(&mut inodes, ino, Stamp::of(st), true));
        }
        let Inodes { backings, cached } = &mut *inodes;
        // A backing file's open drops the kernel's pages of the inode.
        cached.dropped(ino);
        if let Some(b) = backings.get_mut(&ino) {
            let fits = b.identity == identity && (b.writable || !wants_write);
            if fits || b.handles > 0 {
                b.handles += 1;
                b.last_used = now;
                return Some(Served::Backing(Shared { backing: b.id.clone(), direct_io: !fits }));
            }
            // Idle and unfit (another host file now, or read-only for a writer): replace it.
            backings.remove(&ino);
        }
        // The descriptor's own flags (`own`), not the caller's: a host create opens
        // read-write whatever the caller asked, so that its descriptor can serve as the backing.
        // A descriptor whose own flags would change how every sharer's I/O is done (direct,
        // synchronous) is not shared as it is.
        let plain = own & (libc::O_DIRECT | libc::O_SYNC | libc::O_DSYNC) == 0;
        let (reopened, writable) = match own & libc::O_ACCMODE {
            libc::O_RDWR if plain && wants_write && !exec => (None, true),
            libc::O_RDONLY if plain || exec => (None, false),
            _ if wants_write && !exec => (Some(reopen(fd, libc::O_RDWR).ok()?), true),
            _ => (Some(reopen(fd, libc::O_RDONLY).ok()?), false),
        };
        let backing_fd = reopened.as_ref().map_or(fd, |f| f.as_fd());
        match register(backing_fd) {
            Ok(id) => {
                let id = Arc::new(id);
                if !writable {
                    evict_idle(backings);
                }
                let backing = Backing {
                    id: id.clone(),
                    identity,
                    writable,
                    unlinked: false,
                    handles: 1,
                    last_used: now,
                };
                backings.insert(ino, backing);
                Some(Served::Backing(Shared { backing: id, direct_io: false }))
            }
            Err(e) => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!("FUSE passthrough unavailable ({e}); file data goes through the daemon");
                }
                None
            }
        }
    }

    /// [`Passthrough::acquire`] for a file the backend stores itself (no backing file), at
    /// version `opened`: every handle of it is served from the page cache and counted there,
    /// writers too, so that the first reader's store never meets a read the kernel sent
    /// through another handle (see [`page_cache`]). `small_read`: whether a file of that size
    /// may be stored by this open.
    fn acquire_stored(
        &self,
        ino: u64,
        opened: &Attr,
        small_read: impl Fn(u64) -> bool,
    ) -> Option<Served<Id>> {
        if opened.kind != FileKind::File {
            return None;
        }
        let now = Stamp::of_attr(opened);
        Some(self.open_cached(&mut self.inodes.lock(), ino, now, small_read(now.size())))
    }

    /// One more handle of `ino` at version `now` served from the page cache (see
    /// [`PageCache::open`]), once no store of the file is under way.
    fn open_cached(
        &self,
        inodes: &mut MutexGuard<'_, Inodes<Id>>,
        ino: u64,
        now: Stamp,
        may_store: bool,
    ) -> Served<Id> {
        loop {
            match inodes.cached.open(ino, now, may_store) {
                Some(fill) => return Served::PageCache(fill),
                None => self.filled.wait(inodes),
            }
        }
    }

    /// One handle of `ino` that [`Passthrough::acquire`] served `way` closed. A read-write
    /// backing goes with its last handle; a read-only one stays for the next open.
    pub fn release(&self, ino: u64, way: Way) {
        let mut inodes = self.inodes.lock();
        if way == Way::PageCache {
            return inodes.cached.release(ino);
        }
        let backings = &mut inodes.backings;
        if let Some(b) = backings.get_mut(&ino) {
            b.handles = b.handles.saturating_sub(1);
            if b.handles == 0 && (b.writable || b.unlinked) {
                backings.remove(&ino);
            }
        }
    }

    /// The door is done with a [`Fill::Store`] of `ino`; `stored`: the kernel holds the whole
    /// file now.
    pub fn filled(&self, ino: u64, stored: bool) {
        self.inodes.lock().cached.filled(ino, stored);
        self.filled.notify_all();
    }

    /// The last name of `ino` was removed through the mount. A registered backing keeps the
    /// host file, and so its space (on a memory route, space under the cap), until the kernel
    /// forgets the inode, which the daemon learns only when it next reads its forgets, up to
    /// 50 ms later: an idle backing goes now, one in use with its last handle.
    pub fn unlinked(&self, ino: u64) {
        let backings = &mut self.inodes.lock().backings;
        match backings.get_mut(&ino) {
            Some(b) if b.handles == 0 => drop(backings.remove(&ino)),
            Some(b) => b.unlinked = true,
            None => {}
        }
    }

    /// The kernel forgot `ino`: nothing will open it again through this inode number.
    pub fn forget(&self, ino: u64) {
        let Inodes { backings, cached } = &mut *self.inodes.lock();
        cached.forget(ino);
        if backings.get(&ino).is_some_and(|b| b.handles == 0) {
            backings.remove(&ino);
        }
    }
}

/// Keeps the idle backings under [`IDLE_BACKINGS`]: past it, the oldest eighth of them go at
/// once, so the scan is paid once per many registrations.
fn evict_idle<Id>(backings: &mut HashMap<u64, Backing<Id>>) {
    if backings.len() < IDLE_BACKINGS {
        return;
    }
    let mut idle: Vec<(u64, u64)> =
        backings.iter().filter(|(_, b)| b.handles == 0).map(|(&ino, b)| (b.last_used, ino)).collect();
    if idle.len() < IDLE_BACKINGS {
        return;
    }
    let drop = IDLE_BACKINGS / 8;
    idle.select_nth_unstable(drop);
    for &(_, ino) in &idle[..drop] {
        backings.remove(&ino);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::test_file::TestFile as TempOpen;
    use std::cell::Cell;
    use std::fs::File;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    /// A file too large for the page cache's small files: its reads get backings.
    fn temp_file(dir: &tempfile::TempDir, name: &str) -> std::path::PathBuf {
        let path = dir.path().join(name);
        let mut f = File::create(&path).unwrap();
        f.write_all(b"data").unwrap();
        f.set_len(CACHED_READS_MAX + 1).unwrap();
        path
    }

    fn backed(served: Option<Served<u32>>) -> Shared<u32> {
        match served {
            Some(Served::Backing(shared)) => shared,
            Some(Served::PageCache(_)) => panic!("served from the page cache"),
            None => panic!("served by the daemon"),
        }
    }

    fn open(path: &std::path::Path, write: bool) -> TempOpen {
        TempOpen::new(std::fs::OpenOptions::new().read(true).write(write).open(path).unwrap())
    }

    /// Registers with ids 1, 2, 3, ... and counts registrations; records the access mode and
    /// number of the descriptor each registration was given.
    struct Kernel {
        next: Cell<u32>,
        modes: std::cell::RefCell<Vec<i32>>,
        fds: std::cell::RefCell<Vec<i32>>,
    }

    impl Kernel {
        fn new() -> Kernel {
            Kernel { next: Cell::new(1), modes: Default::default(), fds: Default::default() }
        }
        fn register(&self) -> impl FnOnce(BorrowedFd<'_>) -> std::io::Result<u32> + '_ {
            move |fd| {
                let flags = nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::F_GETFL).unwrap();
                self.modes.borrow_mut().push(flags & libc::O_ACCMODE);
                self.fds.borrow_mut().push(fd.as_raw_fd());
                let id = self.next.get();
                self.next.set(id + 1);
                Ok(id)
            }
        }
        fn registrations(&self) -> usize {
            self.modes.borrow().len()
        }
    }

    fn enabled() -> Passthrough<u32> {
        let p = Passthrough::default();
        p.enable(CACHED_READS_MAX);
        p
    }

    /// Files up to this size opened for reading are served from the page cache in these tests.
    const CACHED_READS_MAX: u64 = 1 << 20;

    #[test]
    fn off_or_not_a_regular_file_means_no_backing() {
        let dir = tempfile::tempdir().unwrap();
        let f = open(&temp_file(&dir, "a"), false);
        let k = Kernel::new();
        assert!(Passthrough::<u32>::default().acquire(1, &f, libc::O_RDONLY, k.register()).is_none());
        let d = TempOpen::new(File::open(dir.path()).unwrap());
        assert!(enabled().acquire(1, &d, libc::O_RDONLY, k.register()).is_none());
        assert_eq!(k.registrations(), 0);
    }

    #[test]
    fn readers_share_one_read_only_backing_that_outlives_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = temp_file(&dir, "a");
        let (p, k) = (enabled(), Kernel::new());
        let a = backed(p.acquire(7, &open(&path, false), libc::O_RDONLY, k.register()));
        let b = backed(p.acquire(7, &open(&path, false), libc::O_RDONLY, k.register()));
        assert_eq!((*a.backing, *b.backing, a.direct_io, b.direct_io), (1, 1, false, false));
        p.release(7, Way::Backing);
        p.release(7, Way::Backing);
        // Opened again after every handle closed: still no new registration.
        let c = backed(p.acquire(7, &open(&path, false), libc::O_RDONLY, k.register()));
        assert_eq!(*c.backing, 1);
        assert_eq!(*k.modes.borrow(), vec![libc::O_RDONLY]);
    }

    #[test]
    fn writers_get_a_read_write_backing_released_with_the_last_handle() {
        let dir = tempfile::tempdir().unwrap();
        let path = temp_file(&dir, "a");
        let (p, k) = (enabled(), Kernel::new());
        let r = backed(p.acquire(7, &open(&path, false), libc::O_RDONLY, k.register()));
        p.release(7, Way::Backing);
        // The idle read-only backing is replaced by a read-write one.
        let w = backed(p.acquire(7, &open(&path, true), libc::O_WRONLY, k.register()));
        assert_eq!((*r.backing, *w.backing, w.direct_io), (1, 2, false));
        let r2 = backed(p.acquire(7, &open(&path, false), libc::O_RDONLY, k.register()));
        assert_eq!(*r2.backing, 2, "a reader shares the writer's backing");
        p.release(7, Way::Backing);
        p.release(7, Way::Backing);
        let r3 = backed(p.acquire(7, &open(&path, false), libc::O_RDONLY, k.register()));
        assert_eq!(*r3.backing, 3, "the read-write backing went with its last handle");
        assert_eq!(*k.modes.borrow(), vec![libc::O_RDONLY, libc::O_RDWR, libc::O_RDONLY]);
    }

    #[test]
    fn a_read_write_descriptor_serves_as_it_is_and_a_write_only_one_is_reopened() {
        let dir = tempfile::tempdir().unwrap();
        let path = temp_file(&dir, "a");
        let (p, k) = (enabled(), Kernel::new());
        // What a host create hands over for a write-only caller: a read-write descriptor.
        let created = open(&path, true);
        backed(p.acquire(7, &created, libc::O_WRONLY, k.register()));
        let write_only = TempOpen::new(std::fs::OpenOptions::new().write(true).open(&path).unwrap());
        backed(p.acquire(8, &write_only, libc::O_WRONLY, k.register()));
        assert_eq!(*k.modes.borrow(), vec![libc::O_RDWR, libc::O_RDWR]);
        let fds = k.fds.borrow();
        assert_eq!(
            fds[0],
            created.backing().unwrap().fd.as_raw_fd(),
            "no second descriptor for the created file"
        );
        assert_ne!(
            fds[1],
            write_only.backing().unwrap().fd.as_raw_fd(),
            "a write-only descriptor cannot back reads"
        );
    }

    #[test]
    fn a_writer_among_readers_goes_through_the_daemon() {
        let dir = tempfile::tempdir().unwrap();
        let path = temp_file(&dir, "a");
        let (p, k) = (enabled(), Kernel::new());
        let _r = backed(p.acquire(7, &open(&path, false), libc::O_RDONLY, k.register()));
        let w = backed(p.acquire(7, &open(&path, true), libc::O_RDWR, k.register()));
        assert_eq!((*w.backing, w.direct_io), (1, true));
        assert_eq!(k.registrations(), 1);
    }

    #[test]
    fn programs_get_read_only_backings() {
        let dir = tempfile::tempdir().unwrap();
        let path = temp_file(&dir, "a");
        let (p, k) = (enabled(), Kernel::new());
        backed(p.acquire(7, &open(&path, false), libc::O_RDONLY | FMODE_EXEC, k.register()));
        assert_eq!(*k.modes.borrow(), vec![libc::O_RDONLY]);
    }

    #[test]
    fn another_host_file_behind_the_inode_replaces_an_idle_backing() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (temp_file(&dir, "a"), temp_file(&dir, "b"));
        let (p, k) = (enabled(), Kernel::new());
        backed(p.acquire(7, &open(&a, false), libc::O_RDONLY, k.register()));
        // While in use, a handle on another file is served by the daemon.
        let other = backed(p.acquire(7, &open(&b, false), libc::O_RDONLY, k.register()));
        assert_eq!((*other.backing, other.direct_io), (1, true));
        p.release(7, Way::Backing);
        p.release(7, Way::Backing);
        let fresh = backed(p.acquire(7, &open(&b, false), libc::O_RDONLY, k.register()));
        assert_eq!((*fresh.backing, fresh.direct_io), (2, false));
    }

    #[test]
    fn an_unlinked_file_keeps_its_backing_only_while_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = temp_file(&dir, "a");
        let (p, k) = (enabled(), Kernel::new());
        backed(p.acquire(7, &open(&path, false), libc::O_RDONLY, k.register()));
        p.release(7, Way::Backing);
        p.unlinked(7);
        assert!(p.inodes.lock().backings.is_empty(), "idle: dropped at once");
        backed(p.acquire(7, &open(&path, false), libc::O_RDONLY, k.register()));
        p.unlinked(7);
        assert_eq!(p.inodes.lock().backings.len(), 1, "in use: kept");
        p.release(7, Way::Backing);
        assert!(p.inodes.lock().backings.is_empty(), "gone with its last handle");
    }

    #[test]
    fn forgotten_and_surplus_idle_backings_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = temp_file(&dir, "a");
        let (p, k) = (enabled(), Kernel::new());
        backed(p.acquire(7, &open(&path, false), libc::O_RDONLY, k.register()));
        p.forget(7);
        assert_eq!(p.inodes.lock().backings.len(), 1, "in use: kept");
        p.release(7, Way::Backing);
        p.forget(7);
        assert!(p.inodes.lock().backings.is_empty());

        let f = open(&path, false);
        for ino in 0..(IDLE_BACKINGS as u64 + 10) {
            backed(p.acquire(ino, &f, libc::O_RDONLY, k.register()));
            p.release(ino, Way::Backing);
        }
        let inodes = p.inodes.lock();
        let left = &inodes.backings;
        assert!(left.len() <= IDLE_BACKINGS, "{}", left.len());
        assert!(left.contains_key(&(IDLE_BACKINGS as u64 + 9)), "the newest stays");
        assert!(!left.contains_key(&0), "the oldest went");
    }

    fn small_file(dir: &tempfile::TempDir, name: &str) -> std::path::PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, b"small").unwrap();
        path
    }

    #[test]
    fn small_files_read_alone_are_served_from_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let path = small_file(&dir, "a");
        let (p, k) = (enabled(), Kernel::new());
        let first = p.acquire(7, &open(&path, false), libc::O_RDONLY, k.register());
        assert!(matches!(first, Some(Served::PageCache(Fill::Store { size: 5, replace: false }))));
        p.filled(7, true);
        let second = p.acquire(7, &open(&path, false), libc::O_RDONLY, k.register());
        assert!(matches!(second, Some(Served::PageCache(Fill::Nothing))), "stored already");
        // A writer among them is served the same way (the kernel refuses to mix).
        let writer = p.acquire(7, &open(&path, true), libc::O_RDWR, k.register());
        assert!(matches!(writer, Some(Served::PageCache(Fill::Nothing))));
        for _ in 0..3 {
            p.release(7, Way::PageCache);
        }
        assert_eq!(k.registrations(), 0);
        // Alone, a writer gets a backing file; its open drops the kernel's pages.
        backed(p.acquire(7, &open(&path, true), libc::O_WRONLY, k.register()));
        let reader = p.acquire(7, &open(&path, false), libc::O_RDONLY, k.register());
        assert!(matches!(reader, Some(Served::Backing(_))), "a reader beside a writer shares its backing");
        p.release(7, Way::Backing);
        p.release(7, Way::Backing);
        let later = p.acquire(7, &open(&path, false), libc::O_RDONLY, k.register());
        assert!(
            matches!(later, Some(Served::PageCache(Fill::Store { size: 5, replace: false }))),
            "stored anew"
        );
        p.filled(7, true);
        // Programs, and every file when the page cache is off, get backings.
        let exec = p.acquire(8, &open(&path, false), libc::O_RDONLY | FMODE_EXEC, k.register());
        assert!(matches!(exec, Some(Served::Backing(_))));
        let off = Passthrough::<u32>::default();
        off.enable(0);
        backed(off.acquire(9, &open(&path, false), libc::O_RDONLY, k.register()));
    }

    #[test]
    fn an_open_waits_while_the_first_one_stores_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = small_file(&dir, "a");
        let p = Arc::new(enabled());
        let first = p.acquire(7, &open(&path, false), libc::O_RDONLY, Kernel::new().register());
        assert!(matches!(first, Some(Served::PageCache(Fill::Store { .. }))));
        let (p2, path2) = (p.clone(), path.clone());
        let second = std::thread::spawn(move || {
            let served = p2.acquire(7, &open(&path2, false), libc::O_RDONLY, Kernel::new().register());
            matches!(served, Some(Served::PageCache(Fill::Nothing)))
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!second.is_finished(), "answered while the file was being stored");
        p.filled(7, true);
        assert!(second.join().unwrap(), "the second open finds the file stored");
    }
}
