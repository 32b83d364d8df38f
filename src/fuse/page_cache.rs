//! Small host files served from the kernel's page cache instead of through a backing file,
//! small files a backend stores itself (the sqlite route) filled into it at their first open,
//! and what the door knows of the pages the kernel holds of each.
//!
//! A read through a backing file makes the kernel distrust the file's atime whether or not
//! the host changed it, so the next `stat` of the file asks the daemon (or its directory is
//! listed afresh, see `listing::ReadsSinceListed`), and every such open costs the kernel a
//! backing file of its own. A read from the page cache costs neither: FUSE inodes take no
//! atime updates in the kernel. So a small file opened only for reading is served from the
//! page cache, kept across opens (`FOPEN_KEEP_CACHE`), and the door fills it at the open
//! with the file's whole content (`FUSE_NOTIFY_STORE`), which costs no request of its own:
//! the kernel then sends no READ, and has no reason to distrust the atime.
//!
//! The host file may change behind the kernel's back (another program, or a write through a
//! backing file, which bypasses these pages). The door records, for each inode whose pages
//! it filled, the host file's size, mtime and ctime at that moment, and compares them at
//! every open: a change drops the kernel's pages and attributes before the open is
//! answered, so an open always reads the file as it is (what passthrough gave). While a
//! descriptor stays open, a host change reaches its pages through the host watcher, within
//! milliseconds, as names and attributes do.
//!
//! Storing pages locks them in the kernel, and a read the kernel sent the daemon holds its
//! page locked until it is answered, possibly by the very ring thread that stores. So the
//! door stores only for an inode's first open handle (no read of it can be under way), makes
//! later opens wait until that store is done, and otherwise lets the kernel drop and reread
//! pages itself ([`Fill::Reload`]).
//!
//! A file the backend stores itself ([`OpenFile::opened_version`]) has no backing file, so
//! its writers' reads reach the daemon too (straight, and through these pages when a writer
//! maps the file): every handle of such a file is counted here, writers included, and only
//! the first handle, opened for reading, stores. Its version is the store's size, mtime and
//! ctime at the open.

use std::collections::HashMap;
use std::os::fd::AsRawFd;

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::stat::FileStat;

use crate::backend::{Attr, OpenFile};

/// Whether an open with no handle of its inode open yet is served from the page cache: files
/// up to `max` bytes (`[fuse] cached_reads_max_kb`; the door reads them whole) opened only for
/// reading. Larger ones keep passthrough, whose reads are the host file's own (large folios,
/// no copy through the daemon); so do writes (a new file may grow to any size) and `execve`
/// (a program's backing is read-only, see `passthrough`).
pub fn suits(size: u64, wants_write: bool, exec: bool, max: u64) -> bool {
    !wants_write && !exec && max > 0 && size <= max
}

/// The version of a file when the kernel's pages of it were filled: its size, mtime and ctime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    /// A host file's version.
    pub fn of(st: &FileStat) -> Stamp {
        Stamp {
            size: st.st_size as u64,
            mtime: (st.st_mtime, st.st_mtime_nsec),
            ctime: (st.st_ctime, st.st_ctime_nsec),
        }
    }

    /// The version of a file a backend stores itself ([`OpenFile::opened_version`]).
    pub fn of_attr(attr: &Attr) -> Stamp {
        let at = |t: std::time::SystemTime| match t.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => (d.as_secs() as i64, d.subsec_nanos() as i64),
            Err(e) => (-(e.duration().as_secs() as i64), -(e.duration().subsec_nanos() as i64)),
        };
        Stamp { size: attr.size, mtime: at(attr.mtime), ctime: at(attr.ctime) }
    }

    pub fn size(&self) -> u64 {
        self.size
    }
}

/// What the door does to the kernel's page cache of a file before answering its open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fill {
    /// Nothing: the kernel holds the file as it is (or will ask for what it lost).
    Nothing,
    /// Store the file's `size` bytes, after dropping what the kernel holds of an older
    /// version (`replace`). Only for the first open handle: with no handle open, no read of
    /// the kernel's holds a page the store must lock (that read could be waiting for the very
    /// thread that stores), and later opens wait until the store is done
    /// ([`PageCache::open`]); the door reports the outcome with [`PageCache::filled`].
    Store { size: u64, replace: bool },
    /// Others hold the file open, and it changed: the door drops the kernel's attributes, and
    /// the open is answered without `FOPEN_KEEP_CACHE`, so the kernel drops the pages itself
    /// (in the opener's own call) and reads the file anew.
    Reload,
}

#[derive(Default)]
struct Cached {
    /// Open handles served from the page cache.
    handles: usize,
    /// The host file as it was when the kernel's pages of it were made; none when the door
    /// does not know what the kernel holds.
    stored: Option<Stamp>,
    /// The door is storing the file for the first handle.
    filling: bool,
}

/// Per inode served from the page cache (or filled once), until the kernel forgets it.
#[derive(Default)]
pub struct PageCache(HashMap<u64, Cached>);

impl PageCache {
    /// Whether handles of `ino` served from the page cache are open.
    pub fn in_use(&self, ino: u64) -> bool {
        self.0.get(&ino).is_some_and(|c| c.handles > 0)
    }

    /// One more handle of `ino`, whose file is at version `now`, served from the page cache;
    /// paired with one [`PageCache::release`]. `None` while the door stores the file for
    /// another open: the caller waits for [`PageCache::filled`] and asks again.
    ///
    /// `may_store`: the handle may fill the pages (a small file opened only for reading, see
    /// [`suits`]). A handle that may not (a writer of a stored file, or a large one) still
    /// counts, so that no store begins while it is open; it drops pages of another version,
    /// and leaves pages of a version the door does not know as the kernel holds them.
    pub fn open(&mut self, ino: u64, now: Stamp, may_store: bool) -> Option<Fill> {
        let cached = self.0.entry(ino).or_default();
        if cached.filling {
            return None;
        }
        let first = cached.handles == 0;
        cached.handles += 1;
        let fill = match cached.stored {
            Some(stored) if stored == now => Fill::Nothing,
            stored if first && may_store => Fill::Store { size: now.size, replace: stored.is_some() },
            None if !may_store => return Some(Fill::Nothing),
            _ => Fill::Reload,
        };
        cached.stored = Some(now);
        cached.filling = matches!(fill, Fill::Store { .. });
        Some(fill)
    }

    /// The door is done storing `ino` (see [`Fill::Store`]); `stored`: the kernel holds the
    /// whole file.
    pub fn filled(&mut self, ino: u64, stored: bool) {
        if let Some(cached) = self.0.get_mut(&ino) {
            cached.filling = false;
            if !stored {
                cached.stored = None;
            }
        }
    }

    pub fn release(&mut self, ino: u64) {
        if let Some(cached) = self.0.get_mut(&ino) {
            cached.handles = cached.handles.saturating_sub(1);
            if cached.handles == 0 && cached.stored.is_none() {
                self.0.remove(&ino);
            }
        }
    }

    /// The kernel holds no pages of `ino` now: a backing file's open dropped them (which only
    /// happens with no handle of the page cache open).
    pub fn dropped(&mut self, ino: u64) {
        if let Some(cached) = self.0.get_mut(&ino) {
            cached.stored = None;
            if cached.handles == 0 {
                self.0.remove(&ino);
            }
        }
    }

    /// The kernel forgot `ino`, and its pages with it.
    pub fn forget(&mut self, ino: u64) {
        self.dropped(ino)
    }
}

/// Makes reads of `file` leave its host atime alone (`O_NOATIME`, which the daemon may set as
/// root). Reads the kernel serves from its page cache never reach the host, so a host atime
/// moved by the read that filled the cache would be the one place where the mount and the host
/// disagree; this way neither moves, as on a `noatime` mount.
pub fn without_atime(file: &dyn OpenFile) -> std::io::Result<()> {
    // A file the backend stores itself has no host atime to keep.
    let Some(backing) = file.backing() else { return Ok(()) };
    let fd = backing.fd;
    let flags = OFlag::from_bits_retain(fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL)?);
    if !flags.contains(OFlag::O_NOATIME) {
        fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(flags | OFlag::O_NOATIME))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(size: i64, mtime: i64, ctime: i64) -> FileStat {
        // SAFETY: FileStat is a plain C struct, for which all zeroes is a valid value.
        let mut st: FileStat = unsafe { std::mem::zeroed() };
        st.st_mode = libc::S_IFREG | 0o644;
        (st.st_size, st.st_mtime, st.st_ctime) = (size, mtime, ctime);
        st
    }

    #[test]
    fn small_reads_suit_the_page_cache_and_writes_and_programs_do_not() {
        assert!(suits(100, false, false, 1024));
        assert!(suits(1024, false, false, 1024));
        assert!(!suits(1025, false, false, 1024));
        assert!(!suits(0, false, false, 0), "0: none");
        assert!(!suits(100, true, false, 1024));
        assert!(!suits(100, false, true, 1024));
    }

    #[test]
    fn the_first_handle_stores_the_file_and_later_ones_wait_for_it() {
        let mut pc = PageCache::default();
        let st = stat(10, 1, 1);
        assert_eq!(pc.open(5, Stamp::of(&st), true), Some(Fill::Store { size: 10, replace: false }));
        assert_eq!(pc.open(5, Stamp::of(&st), true), None, "a second open waits while the file is stored");
        pc.filled(5, true);
        assert_eq!(pc.open(5, Stamp::of(&st), true), Some(Fill::Nothing), "then finds it stored");
        pc.release(5);
        pc.release(5);
        assert!(!pc.in_use(5));
        assert_eq!(pc.open(5, Stamp::of(&st), true), Some(Fill::Nothing), "the pages outlive the handles");
        pc.release(5);
        // Rewritten in place with the same size and mtime restored: only the ctime tells.
        assert_eq!(
            pc.open(5, Stamp::of(&stat(10, 1, 2)), true),
            Some(Fill::Store { size: 10, replace: true })
        );
        pc.filled(5, true);
        // Changed again while that handle is open: the next open drops and rereads.
        assert_eq!(pc.open(5, Stamp::of(&stat(12, 3, 3)), true), Some(Fill::Reload));
        assert_eq!(pc.open(5, Stamp::of(&stat(12, 3, 3)), true), Some(Fill::Nothing));
    }

    #[test]
    fn unstored_dropped_or_forgotten_pages_are_stored_again() {
        let mut pc = PageCache::default();
        let st = stat(10, 1, 1);
        assert_eq!(pc.open(5, Stamp::of(&st), true), Some(Fill::Store { size: 10, replace: false }));
        pc.filled(5, false);
        assert_eq!(pc.open(5, Stamp::of(&st), true), Some(Fill::Reload), "not stored, and a handle is open");
        pc.release(5);
        pc.release(5);
        assert_eq!(pc.open(5, Stamp::of(&st), true), Some(Fill::Nothing));
        pc.release(5);
        pc.dropped(5);
        assert_eq!(pc.open(5, Stamp::of(&st), true), Some(Fill::Store { size: 10, replace: false }));
        pc.filled(5, true);
        pc.release(5);
        pc.forget(5);
        assert!(pc.0.is_empty());
        assert_eq!(pc.open(5, Stamp::of(&st), true), Some(Fill::Store { size: 10, replace: false }));
    }

    #[test]
    fn handles_that_may_not_store_count_and_drop_only_another_version() {
        let mut pc = PageCache::default();
        let (v1, v2) = (Stamp::of(&stat(10, 1, 1)), Stamp::of(&stat(12, 2, 2)));
        // A writer first, on a version the door does not know: the kernel's pages stay.
        assert_eq!(pc.open(5, v1, false), Some(Fill::Nothing));
        // A reader beside it stores nothing (a page the writer mapped may be under a read):
        // the kernel drops what it holds and reads the version it finds.
        assert_eq!(pc.open(5, v1, true), Some(Fill::Reload));
        pc.release(5);
        pc.release(5);
        assert_eq!(pc.open(5, v1, true), Some(Fill::Nothing), "read since, so known");
        pc.release(5);
        assert_eq!(pc.open(5, v2, false), Some(Fill::Reload), "another version is dropped");
        assert_eq!(pc.open(5, v2, true), Some(Fill::Nothing), "and then known");
        // The first reader alone stores; a writer then waits for the store like any open.
        assert_eq!(pc.open(6, v1, true), Some(Fill::Store { size: 10, replace: false }));
        assert_eq!(pc.open(6, v1, false), None);
        pc.filled(6, true);
        assert_eq!(pc.open(6, v1, false), Some(Fill::Nothing));
    }
}
