//! The tool door's permission checks. Through the mount the kernel checks a caller's mode
//! bits (`default_permissions`) before the daemon sees the request; a tool call reaches the
//! engine with the daemon's own credentials (root), so the engine checks the peer's here, as
//! the kernel would: search on every directory above the path, read to read, write to change
//! a file, write and search on the directory whose names change, and the sticky bit.

use super::{Engine, Principal};
use crate::backend::Attr;
use crate::error::{Errno, FsError, FsResult};
use crate::policy::Op;
use crate::vpath::VPath;

/// A peer's supplementary groups, kept inline (a `Ctx` is copied per request). Past
/// [`Groups::MAX`] groups the rest are not counted, which can only refuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Groups {
    ids: [u32; Groups::MAX],
    len: u8,
}

impl Groups {
    pub const MAX: usize = 32;

    pub fn new(ids: &[u32]) -> Groups {
        let len = ids.len().min(Self::MAX);
        let mut kept = [0; Self::MAX];
        kept[..len].copy_from_slice(&ids[..len]);
        Groups { ids: kept, len: len as u8 }
    }

    fn contains(&self, gid: u32) -> bool {
        self.ids[..self.len as usize].contains(&gid)
    }
}

const READ: u16 = 4;
const WRITE: u16 = 2;
const SEARCH: u16 = 1;

impl Principal {
    /// Whether the mode bits of `attr` grant every bit of `want` (`READ`, `WRITE`, `SEARCH`)
    /// to this peer: the owner's bits if it owns the node, else the group's if it is in the
    /// node's group, else the others'. Root is granted everything, as `CAP_DAC_OVERRIDE` is.
    fn granted(&self, attr: &Attr, want: u16) -> bool {
        if self.uid == 0 {
            return true;
        }
        let bits = if attr.uid == self.uid {
            attr.perm >> 6
        } else if attr.gid == self.gid || self.groups.contains(attr.gid) {
            attr.perm >> 3
        } else {
            attr.perm
        } & 7;
        bits & want == want
    }
}

impl Engine {
    /// Refuses `operation` (of class `op`) on `path` when the peer's mode bits would not
    /// allow it through the mount. Only the tool door asks, once the rules have allowed (so a
    /// hidden name is never told apart from a missing one by this answer). A node that does
    /// not exist is left to the operation, which fails as it would anyway.
    pub(super) fn check_access(
        &self,
        who: &Principal,
        operation: &str,
        op: Op,
        path: &VPath,
    ) -> FsResult<()> {
        if who.uid == 0 {
            return Ok(());
        }
        let stat = |p: &VPath| self.router.getattr(&self.gate.probe(p)).ok();
        let refuse = |p: &VPath, what: &str| {
            Err(FsError::new(Errno::EACCES, format!("permission denied: uid {} may not {what} {p}", who.uid)))
        };
        for dir in path.ancestors() {
            match stat(&dir) {
                Some(attr) if !who.granted(&attr, SEARCH) => return refuse(&dir, "search"),
                Some(_) => {}
                None => return Ok(()),
            }
        }
        let node = stat(path);
        let changes_names = matches!(
            operation,
            "create" | "mkdir" | "mknod" | "symlink" | "link" | "unlink" | "rmdir" | "rename"
        );
        match op {
            Op::Read if matches!(operation, "lookup" | "getattr" | "readlink") => Ok(()),
            Op::Read => match node {
                Some(attr) if !who.granted(&attr, READ) => refuse(path, "read"),
                _ => Ok(()),
            },
            // A whole-file write of an existing file is a write of it (as `echo > f`); of a
            // new one, a new name in its directory.
            Op::Write if !changes_names && node.is_some() => match node {
                Some(attr) if !who.granted(&attr, WRITE) => refuse(path, "write"),
                _ => Ok(()),
            },
            Op::Write => {
                let parent = path.parent();
                let Some(dir) = stat(&parent) else { return Ok(()) };
                if !who.granted(&dir, WRITE | SEARCH) {
                    return refuse(&parent, "change names in");
                }
                // In a sticky directory only the owner of an entry (or of the directory)
                // removes or replaces it.
                let sticky = dir.perm & 0o1000 != 0;
                match node {
                    Some(attr) if sticky && attr.uid != who.uid && dir.uid != who.uid => {
                        refuse(path, "remove or replace (sticky directory)")
                    }
                    _ => Ok(()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::FileKind;
    use crate::engine::Socket;

    fn node(uid: u32, gid: u32, perm: u16) -> Attr {
        Attr { uid, gid, perm, ..Attr::placeholder(FileKind::File) }
    }

    #[test]
    fn the_owners_bits_then_the_groups_then_the_others() {
        let who =
            Principal { uid: 10, gid: 20, groups: Groups::new(&[30, 40]), pid: 1, socket: Socket::Agent };
        // The owner's bits count for the owner even when the others' would grant more.
        assert!(!who.granted(&node(10, 0, 0o077), READ));
        assert!(who.granted(&node(10, 0, 0o600), READ | WRITE));
        // The primary group, then a supplementary one.
        assert!(who.granted(&node(1, 20, 0o040), READ));
        assert!(who.granted(&node(1, 40, 0o020), WRITE));
        assert!(!who.granted(&node(1, 40, 0o404), READ), "in the group: the group's bits, not the others'");
        assert!(who.granted(&node(1, 50, 0o001), SEARCH));
        assert!(!who.granted(&node(1, 50, 0o770), SEARCH));
        let root = Principal { uid: 0, ..who };
        assert!(root.granted(&node(1, 50, 0o000), READ | WRITE | SEARCH));
        // Past the kept number of groups the rest do not count (which can only refuse).
        let many: Vec<u32> = (100..100 + Groups::MAX as u32 + 5).collect();
        let crowded = Principal { groups: Groups::new(&many), ..who };
        assert!(crowded.granted(&node(1, 100, 0o040), READ));
        assert!(!crowded.granted(&node(1, 100 + Groups::MAX as u32, 0o040), READ));
    }
}
