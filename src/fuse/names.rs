//! How the FUSE door finds the path of an inode it is asked about, and what it does when a
//! name the kernel still holds went behind its back (removed or replaced by a tool or another
//! program): such names are checked against the backend's identity of the node and dropped.

use super::FuseDoor;
use crate::backend::{Attr, FileKind};
use crate::engine::Ctx;
use crate::error::{Errno, FsError, FsResult};
use crate::policy::Op;
use crate::vpath::VPath;
use fuser::INodeNo;

impl FuseDoor {
    /// Records a lookup of `path` and returns the inode number the kernel will hold.
    pub(super) fn remember(&self, path: &VPath, attr: &Attr) -> u64 {
        let identity = self.engine.identity(path, attr);
        let mut held = false;
        if let Some((ino, others)) = identity.and_then(|id| self.inodes.other_names(path, id)) {
            // Before `path` joins a node as another name (a hard link), the node's other
            // names must still lead to it: a host inode number is reused once its file is
            // deleted, and a deletion by a tool or another program leaves its name here.
            // That none is left is no error: `path` then starts a node of its own. If the
            // old node is open, that is the same file (an open file keeps its inode number),
            // moved by another program; it cannot take `path` as its name, since the kernel
            // may still reach it by its stale one, which must keep failing.
            let _ = self.live_names(ino, others);
            held = self.any_file_of(ino).is_some();
        }
        let dir_ino = if attr.kind == FileKind::Dir { attr.ino } else { 0 };
        let (ino, displaced) = self.inodes.remember_displacing(path, identity, dir_ino, held);
        if let Some(id) = identity {
            self.replaced.claim(ino, id);
        }
        if let Some(old) = displaced {
            // The name was taken from another inode: its attributes are suspect as well.
            self.invalidate_attributes(old);
        }
        ino
    }

    /// The preferred path of an inode, after the gate allowed `op` under its other names
    /// (hard links) as well. The names of a hard-linked node are checked first: a tool or
    /// another program may have removed one behind the kernel's back while another still
    /// leads to the file.
    ///
    /// A file without a name is answered ESTALE: the kernel reached it by a name it still
    /// caches that went behind its back (the host watch has not told it yet), and looks that
    /// name up again. An open descriptor of the file may have answered the kernel's permission
    /// check before, so `open` cannot rely on `getattr` having said so.
    pub(super) fn node_path(&self, ctx: &Ctx, ino: INodeNo, operation: &str, op: Op) -> FsResult<VPath> {
        let paths = self.inodes.paths(ino.0).map_err(|e| match self.inodes.identity(ino.0) {
            Some(_) => went_stale(e),
            None => e,
        })?;
        let paths = if paths.len() > 1 { self.live_names(ino.0, paths)? } else { paths };
        self.judged_path(ctx, paths, operation, op)
    }

    /// Like [`FuseDoor::node_path`], for a change made by path: even a single name is checked
    /// to lead to the node still, so the change cannot land on whatever file has that name
    /// now (it was replaced behind the kernel's back).
    pub(super) fn live_path(&self, ctx: &Ctx, ino: INodeNo, operation: &str, op: Op) -> FsResult<VPath> {
        let paths = self.live_names(ino.0, self.inodes.paths(ino.0)?)?;
        self.judged_path(ctx, paths, operation, op)
    }

    /// The names among `paths` that still lead to inode `ino`; the others are dropped from the
    /// inode table. ESTALE when none does. Directories have no identity and keep their names.
    pub(super) fn live_names(&self, ino: u64, mut paths: Vec<VPath>) -> FsResult<Vec<VPath>> {
        let Some(id) = self.inodes.identity(ino) else { return Ok(paths) };
        paths.retain(|p| {
            let live = self.engine.identity_now(p) == Some(id);
            if !live {
                self.drop_stale_name(ino, p);
            }
            live
        });
        if paths.is_empty() {
            return Err(FsError::new(Errno::ESTALE, "every name of the file went behind the kernel's back"));
        }
        Ok(paths)
    }

    /// ESTALE when `path` leads to another file than inode `ino` (whose name it then stops
    /// being), as for [`went_stale`].
    pub(super) fn check_identity(
        &self,
        ino: u64,
        path: &VPath,
        node: impl FnOnce() -> FsResult<(FileKind, u64)>,
    ) -> FsResult<()> {
        match self.inodes.identity(ino) {
            Some(id) if self.engine.identity_of(path, node()?) != Some(id) => {
                self.drop_stale_name(ino, path);
                Err(FsError::new(Errno::ESTALE, "the name leads to another file now"))
            }
            _ => Ok(()),
        }
    }

    /// `path` went behind the kernel's back and stops being a name of inode `ino`. The
    /// kernel's attributes of the inode are suspect too (the change that moved the name may
    /// have changed the file, and the host watch reports changes by name, so it can no longer
    /// reach this inode through `path`): they are invalidated, the attributes only (no page
    /// locks are taken, so this is safe inside a request).
    fn drop_stale_name(&self, ino: u64, path: &VPath) {
        self.inodes.drop_stale_name(ino, path);
        self.invalidate_attributes(ino);
    }

    /// Makes the kernel ask again for the attributes of `ino` (and only them: no page locks
    /// are taken, so this is safe inside a request).
    pub(super) fn invalidate_attributes(&self, ino: u64) {
        if let Some(notifier) = self.notifier.get() {
            let _ = notifier.inval_inode(INodeNo(ino), -1, 0);
        }
    }

    /// The attributes of an inode the kernel asks about without naming a handle (`stat`,
    /// `fstat`), and the path they were found by. When every name was removed but the file is
    /// still open (`fstat` after unlink; the name may also have gone behind the kernel's back,
    /// by a tool or another program), an open handle answers.
    pub(super) fn attr_by_name(&self, ctx: &Ctx, ino: INodeNo) -> FsResult<(Attr, VPath)> {
        self.node_path(ctx, ino, "getattr", Op::Read)
            .and_then(|p| self.engine.getattr(ctx, &p).map_err(went_stale).map(|a| (a, p)))
            .and_then(|(a, p)| {
                // The name now leads to another file (replaced behind the kernel's back): its
                // attributes are not this inode's.
                self.check_identity(ino.0, &p, || Ok((a.kind, a.ino)))?;
                Ok((a, p))
            })
            .or_else(|e| {
                if !e.is(Errno::ENOENT) && !e.is(Errno::ESTALE) {
                    return Err(e);
                }
                // A handle open on the file (`fstat` after its name went), or the file a rename
                // through the mount replaced just now.
                self.with_held_file(ino.0, true, |h| h.file.getattr().map(|a| (a, h.path.clone())))
                    .unwrap_or_else(|| self.gone(ino.0, e))
            })
    }

    /// The answer for a file no name leads to that the door holds nothing of. Deleted by an
    /// unlink through the mount, which the kernel saw: the caller found the name before it
    /// went, and the name is gone (ENOENT, what an `open` or `stat` racing an `unlink` may get
    /// on any filesystem). Otherwise the name leads elsewhere now (replaced by a rename, or
    /// changed behind the kernel's back), and `e` (ESTALE) has the kernel look it up again.
    /// (ESTALE for a deleted name would be retried once too, but a program deleting and
    /// recreating the name in a loop can make the retry meet a deleted file again.)
    pub(super) fn gone<T>(&self, ino: u64, e: FsError) -> FsResult<T> {
        if self.inodes.deleted_through_mount(ino) {
            Err(FsError::new(Errno::ENOENT, "the file was deleted"))
        } else {
            Err(e)
        }
    }

    /// How long the kernel may keep attributes of inode `ino` it reached by `path`. An inode
    /// without a name (removed, or found stale) is reached only through open descriptors, and
    /// nothing reports changes to its file any more: the kernel asks again each time. So it
    /// does for a twin (a second inode of a file held open under the first): a write through
    /// either inode changes the file under the other's cached attributes.
    pub(super) fn attr_ttl(&self, ino: u64, path: &VPath) -> std::time::Duration {
        if self.inodes.has_names(ino) && !self.inodes.is_twin(ino) {
            self.engine.ttl(path)
        } else {
            std::time::Duration::ZERO
        }
    }

    pub(super) fn judged_path(
        &self,
        ctx: &Ctx,
        mut paths: Vec<VPath>,
        operation: &str,
        op: Op,
    ) -> FsResult<VPath> {
        if paths.len() > 1 {
            self.engine.check_aliases(ctx, operation, op, &paths[1..])?;
        }
        Ok(paths.swap_remove(0))
    }
}

/// A name the kernel holds for an inode that no longer leads to it (removed or replaced behind
/// the kernel's back, by a tool or another program) is answered ESTALE: the kernel then looks
/// the path up afresh and retries `open`, `stat`, `chmod` and the like once, which gives the
/// caller what the name leads to now instead of a stale ENOENT. A rule's refusal stays as it is.
pub(super) fn went_stale(e: FsError) -> FsError {
    // A directory on the way removed (ENOENT), or put back as a file (ENOTDIR) or a symlink,
    // which a path walk of the daemon never follows (ELOOP).
    if (e.is(Errno::ENOENT) || e.is(Errno::ENOTDIR) || e.is(Errno::ELOOP)) && e.denied_by.is_none() {
        FsError::new(Errno::ESTALE, format!("the name no longer leads to this inode: {}", e.context))
    } else {
        e
    }
}
