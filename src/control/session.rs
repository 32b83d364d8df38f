//! One control connection's memory: what it has read (for read-before-write) and settings.

use std::collections::HashMap;
use std::time::SystemTime;

use parking_lot::Mutex;

use crate::backend::Attr;
use crate::vpath::VPath;

/// What identifies one state of a file's content, as far as the session can tell: any write
/// through either door changes the mtime or the size (or the node, for atomic replaces), and
/// the ctime, which no program can set back (`touch -r` or `rsync -t` restore an mtime after
/// changing the content; a change of mode or owner makes a read needed too, which is safe).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Version {
    pub ino: u64,
    pub size: u64,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
}

impl Version {
    pub fn of(attr: &Attr) -> Version {
        Version { ino: attr.ino, size: attr.size, mtime: attr.mtime, ctime: attr.ctime }
    }
}

/// Whether `edit_file`/`write_file` require a prior read of the current version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observation {
    Strict,
    Off,
}

pub struct Session {
    pub observation: Observation,
    observed: Mutex<HashMap<VPath, Version>>,
}

impl Session {
    pub fn new(observation: Observation) -> Session {
        Session { observation, observed: Mutex::new(HashMap::new()) }
    }

    /// Records that this session has seen `path` at `version` (a read, or its own write).
    pub fn observe(&self, path: &VPath, version: Version) {
        self.observed.lock().insert(path.clone(), version);
    }

    pub fn observed(&self, path: &VPath) -> Option<Version> {
        self.observed.lock().get(path).copied()
    }

    pub fn forget(&self, path: &VPath) {
        self.observed.lock().remove(path);
    }
}
