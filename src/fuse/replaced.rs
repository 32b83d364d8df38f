//! Files that a rename replaced (through the mount, or a tool's write), held until the kernel
//! forgets the inodes it knew them by.
//!
//! An `open` races a rename over its name: the kernel may have found the old file's inode just
//! before the rename and send its `open` just after. On a local filesystem that open gets the
//! old file. The daemon, which finds files by name, would find the name taken and answer
//! ESTALE; the kernel then looks the name up again, once, and a program replacing the file in
//! a loop can win that race again, so that an `open` of a name that never stopped existing
//! failed. Holding the replaced file (`O_PATH` on host routes: no I/O, no side effects) lets
//! such an open get it, as on a local filesystem. The kernel drops a replaced inode as soon as
//! nothing uses it, and the held file goes with it.
//!
//! A lookup that started before a tool's rename may give the kernel an inode for the old file
//! only after the rename (the kernel revalidates cached names without the directory's lock).
//! So a replaced file that no inode stands for yet waits a moment, unclaimed, for such a lookup
//! to claim it: at most [`UNCLAIMED`] of them, each for [`CLAIM_WITHIN`].

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::inodes::{Identity, Inodes};
use super::FuseDoor;
use crate::engine::OpenHandle;
use crate::error::FsResult;
use crate::vpath::VPath;

/// Replaced files held at most: past this, a replacement is not held (its racing opens get
/// ESTALE and look the name up again).
const MOST: usize = 4096;

/// Replaced files no inode stood for yet, kept at most.
const UNCLAIMED: usize = 64;

/// How long a replaced file waits to be claimed by a lookup under way during its rename.
const CLAIM_WITHIN: Duration = Duration::from_millis(100);

/// The held files, by the kernel's inode number of each.
#[derive(Default)]
pub struct ReplacedFiles {
    held: Mutex<HashMap<u64, Arc<OpenHandle>>>,
    /// Replaced files no inode stood for yet, oldest first, with when they were replaced.
    unclaimed: Mutex<VecDeque<(Identity, Instant, Arc<OpenHandle>)>>,
    /// Whether `unclaimed` may hold anything: lookups check this alone.
    any_unclaimed: AtomicBool,
}

impl ReplacedFiles {
    /// Keeps `file`, whose backend identity is `identity`, for the inode the kernel knows it
    /// by, if any (and if there is room). Returns that inode.
    pub fn keep(&self, inodes: &Inodes, identity: Identity, file: Arc<OpenHandle>) -> Option<u64> {
        let Some(ino) = inodes.ino_by_identity(identity) else {
            self.wait_for_claim(identity, file);
            return None;
        };
        let mut held = self.held.lock();
        if held.len() >= MOST && !held.contains_key(&ino) {
            return None;
        }
        let before = held.insert(ino, file);
        drop(held);
        drop(before);
        Some(ino)
    }

    fn wait_for_claim(&self, identity: Identity, file: Arc<OpenHandle>) {
        let mut unclaimed = self.unclaimed.lock();
        let now = Instant::now();
        // An older replacement of the same file goes: this one is the file as it is now.
        let (older, mut gone) = take_unclaimed(&mut unclaimed, identity, now);
        gone.extend(older);
        if unclaimed.len() >= UNCLAIMED {
            gone.extend(unclaimed.pop_front().map(|(_, _, file)| file));
        }
        unclaimed.push_back((identity, now, file));
        self.any_unclaimed.store(true, Ordering::Release);
        drop(unclaimed);
        drop(gone);
    }

    /// A lookup gave the kernel inode `ino` for the backend node `identity`: a replaced file
    /// of that identity waiting to be claimed is held for it.
    pub fn claim(&self, ino: u64, identity: Identity) {
        if !self.any_unclaimed.load(Ordering::Acquire) {
            return;
        }
        let mut unclaimed = self.unclaimed.lock();
        let (claimed, gone) = take_unclaimed(&mut unclaimed, identity, Instant::now());
        self.any_unclaimed.store(!unclaimed.is_empty(), Ordering::Release);
        drop(unclaimed);
        drop(gone);
        if let Some(file) = claimed {
            let before = self.held.lock().insert(ino, file);
            drop(before);
        }
    }

    pub fn get(&self, ino: u64) -> Option<Arc<OpenHandle>> {
        self.held.lock().get(&ino).cloned()
    }

    pub fn forget(&self, ino: u64) {
        let mut held = self.held.lock();
        if !held.is_empty() {
            let gone = held.remove(&ino);
            drop(held);
            drop(gone);
        }
    }
}

/// Takes out of `unclaimed` the file of `identity` (returned first) and the files whose wait
/// is over at `now`. The caller drops them after unlocking: the last drop of a file closes it,
/// which on some backends is a round trip to a server, and lookups wait for this lock.
fn take_unclaimed(
    unclaimed: &mut VecDeque<(Identity, Instant, Arc<OpenHandle>)>,
    identity: Identity,
    now: Instant,
) -> (Option<Arc<OpenHandle>>, Vec<Arc<OpenHandle>>) {
    let (mut claimed, mut gone) = (None, Vec::new());
    for (id, at, file) in std::mem::take(unclaimed) {
        if id == identity {
            claimed = Some(file);
        } else if now.duration_since(at) >= CLAIM_WITHIN {
            gone.push(file);
        } else {
            unclaimed.push_back((id, at, file));
        }
    }
    (claimed, gone)
}

impl FuseDoor {
    /// Where the files replaced by tool writes are kept, for the kernel invalidator (which the
    /// engine tells of them) to share with the door.
    pub fn replaced_files(&self) -> Arc<ReplacedFiles> {
        self.replaced.clone()
    }

    /// Holds the file at `to` before a rename through the mount replaces it, when the kernel
    /// knows it (only then can an open race the rename). Returns its inode.
    pub(super) fn hold_replaced(&self, to: &VPath) -> Option<u64> {
        self.inodes.ino_of(to)?;
        let (identity, held) = self.engine.hold(to)?;
        self.replaced.keep(&self.inodes, identity, held)
    }

    /// The rename did not happen: what [`FuseDoor::hold_replaced`] held goes.
    pub(super) fn release_replaced(&self, held: Option<u64>) {
        if let Some(ino) = held {
            self.replaced.forget(ino);
        }
    }

    /// Runs `use_it` on what the door still holds of inode `ino`'s file once no name leads to
    /// it: the file a rename replaced, or (with `open_handles`) a handle open on it. `None`
    /// when it holds nothing.
    pub(super) fn with_held_file<T>(
        &self,
        ino: u64,
        open_handles: bool,
        use_it: impl FnOnce(&OpenHandle) -> FsResult<T>,
    ) -> Option<FsResult<T>> {
        if let Some(replaced) = self.replaced.get(ino) {
            return Some(use_it(&replaced));
        }
        let open = self.any_file_of(ino).filter(|_| open_handles)?;
        Some(use_it(&open.handle))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::test_file::TestFile;
    use std::sync::Weak;

    /// A held file whose close asks the table again (as closing a file may take a while, or
    /// reach the daemon): every way a file leaves the table closes it after the table's locks
    /// are released, so the close neither deadlocks nor holds up lookups.
    #[test]
    fn held_files_are_closed_outside_the_tables_locks() {
        let files = Arc::new(ReplacedFiles::default());
        let (closed, closes) = std::sync::mpsc::channel();
        let file = |name: &'static str| {
            let (files, closed) = (Arc::downgrade(&files), closed.clone());
            let close = move || {
                let files: Arc<ReplacedFiles> = Weak::upgrade(&files).unwrap();
                let _ = (files.get(1), files.claim(2, (9, 9)));
                closed.send(name).unwrap();
            };
            Arc::new(OpenHandle {
                path: VPath::parse("/f").unwrap(),
                file: Box::new(TestFile::closing_with(tempfile::tempfile().unwrap(), close)),
                writable: false,
            })
        };
        let (a, b, c) = (file("a"), file("b"), file("c"));
        let steps = {
            let files = files.clone();
            std::thread::spawn(move || {
                files.wait_for_claim((1, 1), a);
                files.wait_for_claim((1, 1), b); // replaces a
                files.claim(7, (1, 1)); // b is held for inode 7
                files.held.lock().insert(8, c);
                files.forget(7); // b
                files.forget(8); // c
            })
        };
        let order: Vec<_> =
            (0..3).map(|_| closes.recv_timeout(Duration::from_secs(5)).expect("a close hung")).collect();
        steps.join().unwrap();
        assert_eq!(order, ["a", "b", "c"]);
    }
}
