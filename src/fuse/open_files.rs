//! The FUSE door's open files: each handle by its number, and the handles of each inode, for
//! the requests that name an inode but no handle (a `fchmod` of a file its caller holds open,
//! an `fstat` of a file whose names are gone).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;
use smallvec::SmallVec;

use crate::engine::OpenHandle;

/// An open file, the inode it was opened through, and the process that opened it.
pub struct DoorFile {
    pub ino: u64,
    pub pid: u32,
    pub handle: OpenHandle,
    /// The kernel reads and writes this handle's data itself (it holds one of the inode's
    /// passthrough references, returned at release).
    pub passthrough: bool,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::test_file::TestFile;
    use crate::vpath::VPath;

    fn file(ino: u64, pid: u32, writable: bool) -> DoorFile {
        let handle = OpenHandle {
            path: VPath::parse("/f").unwrap(),
            file: Box::new(TestFile(tempfile::tempfile().unwrap())),
            writable,
        };
        DoorFile { ino, pid, handle, passthrough: false }
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
