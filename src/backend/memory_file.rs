//! Open files of the memory backend: reads and writes on a node of the tree, by inode number.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::RwLock;

use super::{Tree, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, MAX_FILE_SIZE};
use crate::backend::{Attr, OpenFile, SetAttr};
use crate::error::{Errno, FsResult};

/// An open node. Holds its inode by number; the node's open count keeps it in the table.
pub(super) struct MemFile {
    tree: Arc<RwLock<Tree>>,
    ino: u64,
    readable: bool,
    writable: bool,
    /// O_APPEND: every write lands at the current end, whatever offset the caller sent
    /// (what pwrite does on Linux, so the host backend behaves the same); not the kernel's
    /// write-back of cached pages ([`OpenFile::write_back`]).
    append: bool,
}

impl MemFile {
    /// A handle on node `ino`, whose open count the caller has already raised.
    pub(super) fn boxed(tree: &Arc<RwLock<Tree>>, ino: u64, flags: i32) -> Box<dyn OpenFile> {
        let mode = flags & libc::O_ACCMODE;
        Box::new(MemFile {
            tree: Arc::clone(tree),
            ino,
            readable: mode != libc::O_WRONLY,
            writable: mode == libc::O_WRONLY || mode == libc::O_RDWR,
            append: flags & libc::O_APPEND != 0,
        })
    }

    /// Writes `data` at `offset`, or at the current end when `append`.
    fn write_at(&self, offset: u64, data: &[u8], append: bool) -> FsResult<u32> {
        if !self.writable {
            return Err(Errno::EBADF.into());
        }
        if u32::try_from(data.len()).is_err() {
            return Err(Errno::EINVAL.into());
        }
        let mut t = self.tree.write();
        let len = t.node(self.ino).file()?.len();
        if data.is_empty() {
            return Ok(0);
        }
        let offset = if append { len } else { offset };
        // Short when the cap is reached midway, as on tmpfs: the caller's next write gets ENOSPC.
        Ok(t.write(self.ino, offset, data)? as u32)
    }
}

impl Drop for MemFile {
    fn drop(&mut self) {
        let mut t = self.tree.write();
        t.node(self.ino).open.fetch_sub(1, Ordering::AcqRel);
        t.maybe_free(self.ino);
    }
}

impl OpenFile for MemFile {
    fn read(&self, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        if !self.readable {
            return Err(Errno::EBADF.into());
        }
        let t = self.tree.read();
        let n = t.node(self.ino);
        let content = n.file()?;
        if size > 0 {
            n.touch_atime(SystemTime::now());
        }
        Ok(content.read(offset, size))
    }

    fn write(&self, offset: u64, data: &[u8]) -> FsResult<u32> {
        self.write_at(offset, data, self.append)
    }

    /// At `offset` even through an `O_APPEND` handle: the pages are the file's at their place.
    fn write_back(&self, offset: u64, data: &[u8]) -> FsResult<u32> {
        self.write_at(offset, data, false)
    }

    fn flush(&self) -> FsResult<()> {
        Ok(())
    }

    fn needs_flush(&self) -> bool {
        false
    }

    fn fsync(&self, _datasync: bool) -> FsResult<()> {
        Ok(())
    }

    /// Reserves pages (`mode` 0 or `FALLOC_FL_KEEP_SIZE`), all of them or, past the cap,
    /// none (ENOSPC); or deallocates a range (`FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`).
    fn fallocate(&self, offset: u64, length: u64, mode: i32) -> FsResult<()> {
        if !self.writable {
            return Err(Errno::EBADF.into());
        }
        let punch = mode & FALLOC_FL_PUNCH_HOLE != 0;
        if mode & !(FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE) != 0
            || (punch && mode & FALLOC_FL_KEEP_SIZE == 0)
        {
            return Err(Errno::EOPNOTSUPP.into());
        }
        if length == 0 {
            return Err(Errno::EINVAL.into());
        }
        let end = offset.checked_add(length).filter(|&end| end <= MAX_FILE_SIZE).ok_or(Errno::EFBIG)?;
        let mut t = self.tree.write();
        let pages = t.node(self.ino).file()?;
        let now = SystemTime::now();
        if punch {
            let n = t.node_mut(self.ino);
            let freed = n.pages_mut().punch(offset, end);
            n.touch_modified(now);
            t.used -= freed;
            return Ok(());
        }
        t.check_cap(pages.missing(offset, end))?;
        let n = t.node_mut(self.ino);
        let allocated = n.pages_mut().reserve(offset, end, mode & FALLOC_FL_KEEP_SIZE != 0);
        // As on tmpfs, even when the size stays.
        n.touch_modified(now);
        t.used += allocated;
        Ok(())
    }

    fn getattr(&self) -> FsResult<Attr> {
        Ok(self.tree.read().attr(self.ino))
    }

    fn setattr(&self, changes: &SetAttr) -> FsResult<Attr> {
        self.tree.write().setattr(self.ino, changes, SystemTime::now())
    }

    fn reopen(&self, flags: i32) -> FsResult<Box<dyn OpenFile>> {
        // This handle keeps the node in the table, so it can be counted once more.
        self.tree.read().node(self.ino).open.fetch_add(1, Ordering::AcqRel);
        Ok(MemFile::boxed(&self.tree, self.ino, flags))
    }
}
