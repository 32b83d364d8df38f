//! Open files of the memory backend: reads and writes on a node of the tree, by inode number.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::RwLock;

use super::{Body, Tree, FALLOC_FL_KEEP_SIZE};
use crate::backend::{Attr, OpenFile, SetAttr};
use crate::error::{Errno, FsResult};

/// An open node. Holds its inode by number; the node's open count keeps it in the table.
pub(super) struct MemFile {
    tree: Arc<RwLock<Tree>>,
    ino: u64,
    readable: bool,
    writable: bool,
    /// O_APPEND: every write lands at the current end, whatever offset the caller sent
    /// (what pwrite does on Linux, so the host backend behaves the same).
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
        let len = content.len() as u64;
        let start = offset.min(len) as usize;
        let end = offset.saturating_add(u64::from(size)).min(len) as usize;
        Ok(content[start..end].to_vec())
    }

    fn write(&self, offset: u64, data: &[u8]) -> FsResult<u32> {
        if !self.writable {
            return Err(Errno::EBADF.into());
        }
        let written = u32::try_from(data.len()).map_err(|_| Errno::EINVAL)?;
        let mut t = self.tree.write();
        let old = t.node(self.ino).file()?.len() as u64;
        if data.is_empty() {
            return Ok(0);
        }
        let offset = if self.append { old } else { offset };
        let end = offset.checked_add(data.len() as u64).ok_or(Errno::EFBIG)?;
        if end > old {
            t.set_len(self.ino, end)?;
        }
        let n = t.node_mut(self.ino);
        let Body::File(content) = &mut n.body else { unreachable!() };
        content[offset as usize..end as usize].copy_from_slice(data);
        n.touch_modified(SystemTime::now());
        Ok(written)
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

    fn fallocate(&self, offset: u64, length: u64, mode: i32) -> FsResult<()> {
        if !self.writable {
            return Err(Errno::EBADF.into());
        }
        if mode & !FALLOC_FL_KEEP_SIZE != 0 {
            return Err(Errno::EOPNOTSUPP.into());
        }
        if length == 0 {
            return Err(Errno::EINVAL.into());
        }
        let end = offset.checked_add(length).ok_or(Errno::EFBIG)?;
        let mut t = self.tree.write();
        let size = t.node(self.ino).file()?.len() as u64;
        // Contents are not preallocated in memory, so KEEP_SIZE has nothing to do.
        if mode & FALLOC_FL_KEEP_SIZE != 0 || end <= size {
            return Ok(());
        }
        let changes = SetAttr { size: Some(end), ..SetAttr::default() };
        t.setattr(self.ino, &changes, SystemTime::now()).map(|_| ())
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
