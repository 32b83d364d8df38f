//! The FUSE door's open files: each handle by its number, and the handles of each inode, for
//! the requests that name an inode but no handle (a `fchmod` of a file its caller holds open,
//! an `fstat` of a file whose names are gone); and how the door admits a handle the engine
//! opened.

use std::collections::HashMap;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use fuser::{BackingId, FileHandle, FopenFlags, INodeNo};
use parking_lot::RwLock;
use smallvec::SmallVec;

use super::page_cache::{self, Fill};
use super::passthrough::{Served, Way};
use super::FuseDoor;
use crate::engine::OpenHandle;
use crate::error::{Errno, FsError, FsResult};

/// An open file, the inode it was opened through, and the process that opened it.
pub struct DoorFile {
    pub ino: u64,
    pub pid: u32,
    pub handle: OpenHandle,
    /// How the kernel serves this handle's data, when the door counted it on the inode (to
    /// be returned at release): through a backing file or from its page cache.
    pub served: Option<Way>,
    /// The daemon served a read of this handle (the kernel distrusts the file's atime since).
    pub atime_stale: AtomicBool,
}

#[derive(Default)]
struct Tables {
    by_handle: HashMap<u64, Arc<DoorFile>>,
    /// The handles of each inode that has any; usually one.
    by_ino: HashMap<u64, SmallVec<[u64; 2]>>,
}

#[derive(Default)]
pub struct OpenFiles {
    tables: RwLock<Tables>,
}

impl OpenFiles {
    pub fn get(&self, fh: u64) -> Option<Arc<DoorFile>> {
        self.tables.read().by_handle.get(&fh).cloned()
    }

    pub fn insert(&self, fh: u64, file: DoorFile) {
        let mut tables = self.tables.write();
        tables.by_ino.entry(file.ino).or_default().push(fh);
        tables.by_handle.insert(fh, Arc::new(file));
    }

    pub fn remove(&self, fh: u64) -> Option<Arc<DoorFile>> {
        let mut tables = self.tables.write();
        let file = tables.by_handle.remove(&fh)?;
        if let Some(handles) = tables.by_ino.get_mut(&file.ino) {
            handles.retain(|h| *h != fh);
            if handles.is_empty() {
                tables.by_ino.remove(&file.ino);
            }
        }
        Some(file)
    }

    /// A handle of `ino` that `pid` opened for writing.
    pub fn writable_of(&self, ino: u64, pid: u32) -> Option<Arc<DoorFile>> {
        self.of(ino, |f| f.pid == pid && f.handle.writable)
    }

    /// Any handle of `ino`.
    pub fn any_of(&self, ino: u64) -> Option<Arc<DoorFile>> {
        self.of(ino, |_| true)
    }

    fn of(&self, ino: u64, wanted: impl Fn(&DoorFile) -> bool) -> Option<Arc<DoorFile>> {
        let tables = self.tables.read();
        let handles = tables.by_ino.get(&ino)?;
        handles.iter().map(|fh| &tables.by_handle[fh]).find(|f| wanted(f)).cloned()
    }
}

impl FuseDoor {
    pub(super) fn file(&self, fh: FileHandle) -> FsResult<Arc<DoorFile>> {
        self.files.get(fh.0).ok_or_else(|| FsError::errno(Errno::EBADF))
    }

    /// Registers a handle the engine opened (or created) and decides how the kernel serves
    /// it: the file handle, the open flags, and the backing file to name when the kernel does
    /// the I/O itself (passthrough). Otherwise the page cache is kept across opens; the kernel
    /// drops it when it sees the file change size or mtime (FUSE_AUTO_INVAL_DATA). `noflush`:
    /// the handle has nothing to flush, so its close costs no request.
    pub(super) fn admit_file(
        &self,
        ino: u64,
        pid: u32,
        handle: OpenHandle,
        flags: i32,
        noflush: bool,
        register: impl FnOnce(BorrowedFd<'_>) -> std::io::Result<BackingId>,
    ) -> (FileHandle, FopenFlags, Option<Arc<BackingId>>) {
        let served = self.passthrough.acquire(ino, handle.file.as_ref(), flags, register);
        if let Some(Served::PageCache(fill)) = &served {
            self.fill_page_cache(ino, &handle, *fill);
        }
        let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let way = served.as_ref().map(Served::way);
        let door_file = DoorFile { ino, pid, handle, served: way, atime_stale: AtomicBool::new(false) };
        self.files.insert(fh, door_file);
        self.engine.fuse_open_files.fetch_add(1, Ordering::Relaxed);
        let noflush = if noflush { FopenFlags::FOPEN_NOFLUSH } else { FopenFlags::empty() };
        let writes = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let kept = match served {
            // The kernel takes only these flags with a backing file (the page cache is the
            // host file's own).
            Some(Served::Backing(shared)) if shared.direct_io => {
                return (FileHandle(fh), noflush | FopenFlags::FOPEN_DIRECT_IO, Some(shared.backing));
            }
            Some(Served::Backing(shared)) => return (FileHandle(fh), noflush, Some(shared.backing)),
            // Without KEEP_CACHE the kernel drops the inode's pages as the open completes.
            Some(Served::PageCache(Fill::Reload)) => noflush,
            Some(Served::PageCache(_)) | None => noflush | FopenFlags::FOPEN_KEEP_CACHE,
        };
        // A writer with no backing file writes through the daemon, never into the pages
        // first: the kernel would show readers bytes the daemon has not got yet, and a drop of
        // the pages before the write is answered (a changed mtime seen by a `stat`, a reload)
        // would then have them read an older version after the newer one. The write drops the
        // kernel's attributes, so the next read through any handle asks for them, sees the new
        // mtime and drops the pages (FUSE_AUTO_INVAL_DATA).
        (FileHandle(fh), if writes { kept | FopenFlags::FOPEN_DIRECT_IO } else { kept }, None)
    }

    /// Takes handle `fh` out of the door's tables at its release, returns what the kernel was
    /// told of it, and drops the kernel's listing of its directory when reads made most of
    /// that listing's attributes stale. The caller closes the file.
    pub(super) fn release_handle(&self, fh: FileHandle) -> Option<Arc<DoorFile>> {
        let f = self.files.remove(fh.0)?;
        self.engine.fuse_open_files.fetch_sub(1, Ordering::Relaxed);
        let Some(way) = f.served else {
            // Served by the daemon with nothing counted (postgres, a daemon-kept memory
            // route): its reads also make the kernel distrust the atime, but the directory is
            // not listed afresh for them, since a listing refreshes the attributes only for
            // programs that list before they `stat` (performance.md, "Measured and not landed").
            return Some(f);
        };
        self.passthrough.release(f.ino, way);
        // A read through a backing file, or one the daemon served into the page cache (a
        // reload, or a store that failed; sqlite-route files included), made the kernel
        // distrust the file's atime.
        let read = way == Way::Backing || f.atime_stale.load(Ordering::Relaxed);
        if read && !f.handle.writable {
            if let Some(dir) = self.inodes.ino_of(&f.handle.path.parent()) {
                if self.reads_since_listed.read(dir) {
                    self.relister.relist(dir);
                }
            }
        }
        Some(f)
    }

    /// Does `fill` to the kernel's pages of `ino` before its open is answered (see
    /// [`super::page_cache`]).
    fn fill_page_cache(&self, ino: u64, handle: &OpenHandle, fill: Fill) {
        let Some(notifier) = self.notifier.get() else {
            if matches!(fill, Fill::Store { .. }) {
                self.passthrough.filled(ino, false);
            }
            return;
        };
        match fill {
            Fill::Nothing => {}
            // Attributes only (a page would have to be locked): the open, answered without
            // FOPEN_KEEP_CACHE, drops the pages, and the kernel reads them anew through this
            // handle (leaving the atime alone, as a store does).
            Fill::Reload => {
                let _ = notifier.inval_inode(INodeNo(ino), -1, 0);
                let _ = page_cache::without_atime(handle.file.as_ref());
            }
            Fill::Store { size, replace } => {
                if replace {
                    // Offset 0: the pages go with the attributes (a new size among them).
                    let _ = notifier.inval_inode(INodeNo(ino), 0, -1);
                }
                // Read without moving the host file's atime: the kernel's copy of the
                // attributes would no longer match it, and nothing tells the kernel of reads
                // it serves itself.
                let data = page_cache::without_atime(handle.file.as_ref())
                    .and_then(|()| self.engine.read(handle, 0, size as u32).map_err(std::io::Error::other));
                // Changed while being read (the next open sees it), or unreadable: the kernel
                // asks for what it needs.
                let stored = data.is_ok_and(|data| {
                    data.len() as u64 == size && (size == 0 || notifier.store(INodeNo(ino), 0, &data).is_ok())
                });
                self.passthrough.filled(ino, stored);
            }
        }
    }

    /// A handle `pid` opened for writing on `ino`. The kernel truncates for `open(O_TRUNC)`
    /// with a separate setattr that names no handle; that truncate belongs to the open the
    /// gate (or a human) just allowed, so it is served through the opener's handle. Other
    /// setattrs of the opener are served through it too.
    pub(super) fn writable_file_of(&self, ino: u64, pid: u32) -> Option<Arc<DoorFile>> {
        self.files.writable_of(ino, pid)
    }

    /// Any open handle of an inode (for `fstat` of a file whose names were all removed).
    pub(super) fn any_file_of(&self, ino: u64) -> Option<Arc<DoorFile>> {
        self.files.any_of(ino)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::test_file::TestFile;
    use crate::vpath::VPath;

    fn file(ino: u64, pid: u32, writable: bool) -> DoorFile {
        let handle = OpenHandle {
            path: VPath::parse("/f").unwrap(),
            file: Box::new(TestFile::new(tempfile::tempfile().unwrap())),
            writable,
        };
        DoorFile { ino, pid, handle, served: None, atime_stale: AtomicBool::new(false) }
    }

    #[test]
    fn handles_are_found_by_number_and_by_inode() {
        let files = OpenFiles::default();
        files.insert(1, file(7, 100, false));
        files.insert(2, file(7, 200, true));
        files.insert(3, file(8, 100, true));
        assert_eq!(files.get(2).map(|f| f.pid), Some(200));
        assert!(files.writable_of(7, 100).is_none(), "pid 100 only reads inode 7");
        assert_eq!(files.writable_of(7, 200).map(|f| f.ino), Some(7));
        assert_eq!(files.writable_of(8, 100).map(|f| f.ino), Some(8));
        assert_eq!(files.remove(2).map(|f| f.pid), Some(200));
        assert!(files.writable_of(7, 200).is_none() && files.get(2).is_none());
        assert_eq!(files.any_of(7).map(|f| f.pid), Some(100));
        files.remove(1);
        assert!(files.any_of(7).is_none() && files.remove(1).is_none());
        assert_eq!(files.tables.read().by_ino.len(), 1, "inode 7 left the index");
    }
}
