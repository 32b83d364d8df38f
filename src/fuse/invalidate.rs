//! Keeping the kernel's caches of the mount honest when something changes behind its back
//! (a tool call, a rule reload): the affected names and inodes are invalidated through
//! fuser's `Notifier`, and the files a tool's write replaces go to the door
//! ([`crate::fuse::replaced`]).

use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use fuser::{INodeNo, Notifier};

use crate::engine::{ChangeObserver, OpenHandle};
use crate::fuse::inodes::Inodes;
use crate::fuse::replaced::ReplacedFiles;
use crate::vpath::VPath;

pub struct KernelInvalidator {
    pub inodes: Arc<Inodes>,
    pub notifier: Notifier,
    /// Set by the door's `init` when the kernel can expire names (see
    /// [`crate::fuse::FuseDoor::expire_only`]).
    pub expire_only: Arc<AtomicBool>,
    /// Shared with the door ([`crate::fuse::FuseDoor::replaced_files`]).
    pub replaced: Arc<ReplacedFiles>,
}

impl ChangeObserver for KernelInvalidator {
    fn changed(&self, path: &VPath) {
        // The name (it may now point elsewhere, or nowhere) and the node's data and
        // attributes. Errors only mean the kernel had nothing cached.
        if let Some(parent) = self.inodes.ino_of(&path.parent()) {
            if !path.is_root() {
                let _ = self.notifier.inval_entry(INodeNo(parent), OsStr::new(path.name()));
                // The parent's cached listing (FOPEN_CACHE_DIR) and its times.
                let _ = self.notifier.inval_inode(INodeNo(parent), 0, -1);
            }
        }
        self.content_changed(path);
    }

    fn content_changed(&self, path: &VPath) {
        if let Some(ino) = self.inodes.ino_of(path) {
            let _ = self.notifier.inval_inode(INodeNo(ino), 0, -1);
        }
    }

    fn file_changed(&self, identity: (u32, u64), path: &VPath) {
        // The kernel knows every file it caches by its identity; the name is a fallback for
        // a node it has not met under one.
        match self.inodes.ino_by_identity(identity) {
            Some(ino) => {
                let _ = self.notifier.inval_inode(INodeNo(ino), 0, -1);
            }
            None => self.content_changed(path),
        }
    }

    fn replacing(&self, identity: (u32, u64), file: &Arc<OpenHandle>) {
        self.replaced.keep(&self.inodes, identity, file.clone());
    }
}

impl KernelInvalidator {
    /// Makes the kernel forget every name it cached (absent ones too), and every listing: after
    /// a rule change, or when changes may have been missed. Where the kernel offers it, names
    /// are expired rather than dropped: the kernel asks again on their next use and drops only
    /// those whose answer changed. A dropped name would turn the path of every open descriptor
    /// below it into "... (deleted)" even where nothing changed: a shell's working directory,
    /// and the descriptors `execute` hands bubblewrap, which resolves their paths.
    pub fn forget_everything(&self) {
        let expire_only = self.expire_only.load(Ordering::Relaxed);
        let entries = self.inodes.known_entries();
        for (parent, name) in entries.iter().chain(&self.inodes.absent.take_all()) {
            let _ = if expire_only {
                self.notifier.expire_entry(INodeNo(*parent), OsStr::new(name))
            } else {
                self.notifier.inval_entry(INodeNo(*parent), OsStr::new(name))
            };
        }
        // Listings the kernel keeps (FOPEN_CACHE_DIR) live in the directory's page cache.
        let dirs: std::collections::BTreeSet<u64> = entries.iter().map(|(parent, _)| *parent).collect();
        for dir in dirs {
            let _ = self.notifier.inval_inode(INodeNo(dir), 0, -1);
        }
    }
}
