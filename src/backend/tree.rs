//! The directory tree of the database backends (sqlite, postgres), written once: nodes and
//! their attributes, path walks, and the bodies of the transactions that change names (create,
//! link, unlink, rmdir, rename), attributes (setattr) and extended attributes.
//!
//! A backend supplies the rows through [`Tree`], implemented on whatever runs its statements
//! inside one transaction; the checks, their order (the kernel's, so the errnos match a plain
//! directory) and the link-count and time bookkeeping live here. Content chunking is in
//! [`chunks`](super::chunks).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::backend::{
    split_parent, Attr, Caller, FileKind, SetAttr, TimeSet, RENAME_EXCHANGE, RENAME_NOREPLACE,
};
use crate::error::{Errno, FsError, FsResult};

pub const BLKSIZE: u32 = 4096;
pub const NAME_MAX: usize = 255;
pub const XATTR_CREATE: i32 = 1;
pub const XATTR_REPLACE: i32 = 2;
const XATTR_NAME_MAX: usize = 255;
const XATTR_SIZE_MAX: usize = 65536;

fn err(errno: Errno) -> FsError {
    FsError::errno(errno)
}

pub fn now_ns() -> i64 {
    time_to_ns(SystemTime::now())
}

pub fn time_to_ns(t: SystemTime) -> i64 {
    let clamp = |d: Duration| d.as_nanos().min(i64::MAX as u128) as i64;
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => clamp(d),
        Err(e) => -clamp(e.duration()),
    }
}

pub fn ns_to_time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

/// One `inodes` row (without the symlink target, which only readlink needs).
#[derive(Clone, Debug)]
pub struct Node {
    pub ino: u64,
    pub kind: FileKind,
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub size: u64,
    pub nlink: u32,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    pub crtime: i64,
}

impl Node {
    pub fn is_dir(&self) -> bool {
        self.kind == FileKind::Dir
    }

    pub fn attr(&self) -> Attr {
        Attr {
            ino: self.ino,
            kind: self.kind,
            perm: (self.perm & 0o7777) as u16,
            size: self.size,
            blocks: self.size.div_ceil(512),
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: self.rdev,
            blksize: BLKSIZE,
            atime: ns_to_time(self.atime),
            mtime: ns_to_time(self.mtime),
            ctime: ns_to_time(self.ctime),
            crtime: ns_to_time(self.crtime),
        }
    }
}

/// The fields of a node about to be created.
pub struct NewNode<'a> {
    pub ns: i64,
    pub kind: FileKind,
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub nlink: u32,
    pub target: Option<&'a [u8]>,
    pub now: i64,
}

impl NewNode<'static> {
    /// The root directory of a new namespace of `ns`, the daemon's user's.
    pub fn root(ns: i64) -> NewNode<'static> {
        let owner = Caller::daemon();
        NewNode {
            ns,
            kind: FileKind::Dir,
            perm: 0o755,
            uid: owner.uid,
            gid: owner.gid,
            rdev: 0,
            nlink: 2,
            target: None,
            now: now_ns(),
        }
    }
}

impl NewNode<'_> {
    /// The node as it is once inserted as `ino`.
    pub fn node(&self, ino: u64) -> Node {
        Node {
            ino,
            kind: self.kind,
            perm: self.perm,
            uid: self.uid,
            gid: self.gid,
            rdev: self.rdev,
            size: self.target.map_or(0, |t| t.len() as u64),
            nlink: self.nlink,
            atime: self.now,
            mtime: self.now,
            ctime: self.now,
            crtime: self.now,
        }
    }
}

pub fn check_name(name: &str) -> FsResult<()> {
    if name.len() > NAME_MAX {
        return Err(err(Errno::ENAMETOOLONG));
    }
    Ok(())
}

/// Group and permission bits of a new node under a parent of these permission bits and group:
/// a set-group-ID parent passes on its group, and to new directories the set-group-ID bit
/// itself.
pub fn ownership(
    (parent_perm, parent_gid): (u32, u32),
    caller: &Caller,
    perm: u32,
    kind: FileKind,
) -> (u32, u32) {
    if parent_perm & libc::S_ISGID != 0 {
        let perm = if kind == FileKind::Dir { perm | libc::S_ISGID } else { perm };
        (parent_gid, perm)
    } else {
        (caller.gid, perm)
    }
}

/// What kind of node [`create_in`] makes.
pub struct Spec<'a> {
    pub kind: FileKind,
    pub perm: u32,
    pub rdev: u32,
    pub target: Option<&'a [u8]>,
}

impl Spec<'_> {
    pub fn new(kind: FileKind, mode: u32) -> Spec<'static> {
        Spec { kind, perm: mode & 0o7777, rdev: 0, target: None }
    }
}

/// The rows of one store, as seen inside one transaction (or by one reader).
pub trait Tree {
    fn lookup(&self, parent: u64, name: &str) -> FsResult<Option<u64>>;
    fn node(&self, ino: u64) -> FsResult<Option<Node>>;
    fn insert_node(&self, ino: u64, node: &NewNode<'_>) -> FsResult<()>;
    fn insert_dentry(&self, parent: u64, name: &str, child: u64) -> FsResult<()>;
    fn remove_dentry(&self, parent: u64, name: &str) -> FsResult<()>;
    fn set_dentry_child(&self, parent: u64, name: &str, child: u64) -> FsResult<()>;
    /// An entry of directory `ino` changed: its mtime and ctime become `now`, and its link
    /// count moves by `nlink_delta` (a subdirectory's `..` came or went).
    fn touch_dir(&self, ino: u64, nlink_delta: i64, now: i64) -> FsResult<()>;
    /// A name of `ino` came or went: its link count moves by `delta` (never below 0) and its
    /// ctime becomes `now`. Returns the new link count.
    fn add_nlink(&self, ino: u64, delta: i64, now: i64) -> FsResult<u32>;
    fn set_ctime(&self, ino: u64, now: i64) -> FsResult<()>;
    fn has_children(&self, ino: u64) -> FsResult<bool>;
    /// Writes back the attribute columns of `n` (not nlink, which moves by deltas).
    fn update_attrs(&self, n: &Node) -> FsResult<()>;
    /// Drops the content at and past `size`.
    fn truncate_chunks(&self, ino: u64, size: u64) -> FsResult<()>;
    fn get_xattr(&self, ino: u64, name: &str) -> FsResult<Option<Vec<u8>>>;
    /// The names of the node's extended attributes, in order.
    fn xattr_names(&self, ino: u64) -> FsResult<Vec<String>>;
    fn xattr_exists(&self, ino: u64, name: &str) -> FsResult<bool> {
        Ok(self.get_xattr(ino, name)?.is_some())
    }
    fn put_xattr(&self, ino: u64, name: &str, value: &[u8]) -> FsResult<()>;
    /// Whether there was one to delete.
    fn delete_xattr(&self, ino: u64, name: &str) -> FsResult<bool>;

    /// A new node `ino` named `name` in directory `parent`, which [`Tree::touch_dir`]s by
    /// `nlink_delta`; false (and nothing changed) if `parent` has the name already.
    fn insert_named(
        &self,
        ino: u64,
        n: &NewNode<'_>,
        (parent, name): (u64, &str),
        nlink_delta: i64,
    ) -> FsResult<bool> {
        if self.lookup(parent, name)?.is_some() {
            return Ok(false);
        }
        self.insert_node(ino, n)?;
        self.insert_dentry(parent, name, ino)?;
        self.touch_dir(parent, nlink_delta, n.now)?;
        Ok(true)
    }

    /// Takes the name `name` of non-directory `ino` from directory `parent`: the entry goes,
    /// `ino`'s link count drops by one and the directory is touched. Returns the link count
    /// left.
    fn unlink_named(&self, (parent, name): (u64, &str), ino: u64, now: i64) -> FsResult<u32> {
        self.remove_dentry(parent, name)?;
        let left = self.add_nlink(ino, -1, now)?;
        self.touch_dir(parent, 0, now)?;
        Ok(left)
    }

    fn must_node(&self, ino: u64) -> FsResult<Node> {
        self.node(ino)?.ok_or_else(|| err(Errno::ENOENT))
    }

    /// Walks `path` from `root` and returns every inode passed through, the root first and
    /// the final node last. A missing component is ENOENT, one under a non-directory ENOTDIR.
    /// A store that can walk a whole path in one query overrides it.
    fn walk(&self, root: u64, path: &str) -> FsResult<Vec<u64>> {
        let mut chain = vec![root];
        if path.is_empty() {
            return Ok(chain);
        }
        let mut cur = root;
        for comp in path.split('/') {
            check_name(comp)?;
            match self.lookup(cur, comp)? {
                Some(child) => cur = child,
                None => return Err(missing_under(self.must_node(cur)?.kind)),
            }
            chain.push(cur);
        }
        Ok(chain)
    }
}

/// The error of a walk that found no entry in a node of `kind`: a non-directory never has any.
pub fn missing_under(kind: FileKind) -> FsError {
    err(if kind == FileKind::Dir { Errno::ENOENT } else { Errno::ENOTDIR })
}

pub fn resolve<T: Tree + ?Sized>(t: &T, root: u64, path: &str) -> FsResult<u64> {
    Ok(*t.walk(root, path)?.last().expect("a walk holds the root"))
}

pub fn resolve_node<T: Tree + ?Sized>(t: &T, root: u64, path: &str) -> FsResult<Node> {
    t.must_node(resolve(t, root, path)?)
}

/// Resolves a directory (ENOTDIR if it is something else).
pub fn resolve_dir<T: Tree + ?Sized>(t: &T, root: u64, path: &str) -> FsResult<Node> {
    Ok(resolve_dir_chain(t, root, path)?.0)
}

/// Like [`resolve_dir`], also returning every directory from the root down to it, for the
/// "moved beneath itself" checks of rename (directories have exactly one path).
pub fn resolve_dir_chain<T: Tree + ?Sized>(t: &T, root: u64, path: &str) -> FsResult<(Node, Vec<u64>)> {
    let chain = t.walk(root, path)?;
    let n = t.must_node(*chain.last().expect("a walk holds the root"))?;
    if !n.is_dir() {
        return Err(err(Errno::ENOTDIR));
    }
    Ok((n, chain))
}

/// Creates a node at `path` as inode `ino` of namespace `ns`; returns it.
pub fn create_in<T: Tree + ?Sized>(
    t: &T,
    root: u64,
    path: &str,
    (ino, ns): (u64, i64),
    spec: &Spec<'_>,
    caller: &Caller,
) -> FsResult<Node> {
    if path.is_empty() {
        return Err(err(Errno::EEXIST));
    }
    let (parent_path, name) = split_parent(path);
    check_name(name)?;
    let now = now_ns();
    let parent = resolve_dir(t, root, parent_path)?;
    let (gid, perm) = ownership((parent.perm, parent.gid), caller, spec.perm, spec.kind);
    let is_dir = spec.kind == FileKind::Dir;
    let new = NewNode {
        ns,
        kind: spec.kind,
        perm,
        uid: caller.uid,
        gid,
        rdev: spec.rdev,
        nlink: if is_dir { 2 } else { 1 },
        target: spec.target,
        now,
    };
    if !t.insert_named(ino, &new, (parent.ino, name), i64::from(is_dir))? {
        return Err(err(Errno::EEXIST));
    }
    Ok(new.node(ino))
}

/// Makes `new_path` another name of the node at `existing`; returns its inode.
pub fn link_in<T: Tree + ?Sized>(t: &T, root: u64, existing: &str, new_path: &str) -> FsResult<u64> {
    if new_path.is_empty() {
        return Err(err(Errno::EEXIST));
    }
    let (parent_path, name) = split_parent(new_path);
    check_name(name)?;
    let src = resolve_node(t, root, existing)?;
    let parent = resolve_dir(t, root, parent_path)?;
    if t.lookup(parent.ino, name)?.is_some() {
        return Err(err(Errno::EEXIST));
    }
    if src.is_dir() {
        return Err(err(Errno::EPERM));
    }
    let now = now_ns();
    t.insert_dentry(parent.ino, name, src.ino)?;
    t.add_nlink(src.ino, 1, now)?;
    t.touch_dir(parent.ino, 0, now)?;
    Ok(src.ino)
}

/// Removes the name `path` of a non-directory. `last_name_gone` is called with the inode when
/// its last name went, and says whether deleting its rows must wait (it is open); the inode is
/// returned then.
pub fn unlink_in<T: Tree + ?Sized>(
    t: &T,
    root: u64,
    path: &str,
    mut last_name_gone: impl FnMut(&T, u64) -> FsResult<bool>,
) -> FsResult<Option<u64>> {
    if path.is_empty() {
        return Err(err(Errno::EISDIR));
    }
    let (parent, name, n) = walk_to_name(t, root, path)?;
    if n.is_dir() {
        return Err(err(Errno::EISDIR));
    }
    let ino = n.ino;
    let left = t.unlink_named((parent, name), ino, now_ns())?;
    Ok((left == 0 && last_name_gone(t, ino)?).then_some(ino))
}

/// Removes the empty directory `path`; `last_name_gone` as for [`unlink_in`].
pub fn rmdir_in<T: Tree + ?Sized>(
    t: &T,
    root: u64,
    path: &str,
    mut last_name_gone: impl FnMut(&T, u64) -> FsResult<bool>,
) -> FsResult<Option<u64>> {
    if path.is_empty() {
        return Err(err(Errno::EBUSY));
    }
    let (parent, name, n) = walk_to_name(t, root, path)?;
    if !n.is_dir() {
        return Err(err(Errno::ENOTDIR));
    }
    let ino = n.ino;
    if t.has_children(ino)? {
        return Err(err(Errno::ENOTEMPTY));
    }
    let now = now_ns();
    t.remove_dentry(parent, name)?;
    t.touch_dir(parent, -1, now)?;
    t.add_nlink(ino, -i64::from(n.nlink), now)?;
    Ok(last_name_gone(t, ino)?.then_some(ino))
}

/// The directory holding the last name of the non-empty `path`, that name, and the node it
/// names, in one walk: ENOENT if the name or a directory above is missing, ENOTDIR if
/// something above is not a directory.
fn walk_to_name<'p, T: Tree + ?Sized>(t: &T, root: u64, path: &'p str) -> FsResult<(u64, &'p str, Node)> {
    let chain = t.walk(root, path)?;
    let (parent, ino) = (chain[chain.len() - 2], chain[chain.len() - 1]);
    Ok((parent, split_parent(path).1, t.must_node(ino)?))
}

/// The flags renameat2(2) accepts here, checked before anything is looked up.
pub fn check_rename(from: &str, to: &str, flags: u32) -> FsResult<()> {
    if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0 || flags == RENAME_NOREPLACE | RENAME_EXCHANGE {
        return Err(err(Errno::EINVAL));
    }
    if from.is_empty() || to.is_empty() {
        return Err(err(Errno::EBUSY));
    }
    check_name(split_parent(to).1)
}

/// renameat2(2) within one tree (see [`crate::backend::Backend::rename`]); `last_name_gone`
/// as for [`unlink_in`], for a replaced target.
pub fn rename_in<T: Tree + ?Sized>(
    t: &T,
    root: u64,
    (from, to, flags): (&str, &str, u32),
    mut last_name_gone: impl FnMut(&T, u64) -> FsResult<bool>,
) -> FsResult<Option<u64>> {
    let exchange = flags & RENAME_EXCHANGE != 0;
    let (from_parent, from_name) = split_parent(from);
    let (to_parent, to_name) = split_parent(to);
    let (fdir, fchain) = resolve_dir_chain(t, root, from_parent)?;
    let src = t.lookup(fdir.ino, from_name)?.ok_or_else(|| err(Errno::ENOENT))?;
    let src = t.must_node(src)?;
    let (tdir, tchain) = resolve_dir_chain(t, root, to_parent)?;
    let dst = match t.lookup(tdir.ino, to_name)? {
        Some(ino) => Some(t.must_node(ino)?),
        None => None,
    };
    // The checks in the order the kernel makes them.
    if flags & RENAME_NOREPLACE != 0 && dst.is_some() {
        return Err(err(Errno::EEXIST));
    }
    if exchange && dst.is_none() {
        return Err(err(Errno::ENOENT));
    }
    if tchain.contains(&src.ino) {
        return Err(err(Errno::EINVAL)); // the source is an ancestor of the target
    }
    if dst.as_ref().is_some_and(|d| fchain.contains(&d.ino)) {
        // The target is an ancestor of the source, so not empty.
        return Err(err(if exchange { Errno::EINVAL } else { Errno::ENOTEMPTY }));
    }
    if dst.as_ref().is_some_and(|d| d.ino == src.ino) {
        return Ok(None); // two names of one node (or the same name): nothing to do
    }
    let now = now_ns();
    // A directory moving to the other parent takes its `..` link along.
    let moves = |n: &Node| n.is_dir() && fdir.ino != tdir.ino;
    let (mut fdelta, mut tdelta) = (0i64, 0i64);
    if moves(&src) {
        fdelta -= 1;
        tdelta += 1;
    }
    let mut removed = None;
    if exchange {
        let d = dst.as_ref().expect("checked above");
        if moves(d) {
            tdelta -= 1;
            fdelta += 1;
        }
        t.set_dentry_child(fdir.ino, from_name, d.ino)?;
        t.set_dentry_child(tdir.ino, to_name, src.ino)?;
        t.set_ctime(d.ino, now)?;
    } else {
        if let Some(d) = &dst {
            match (src.is_dir(), d.is_dir()) {
                (true, false) => return Err(err(Errno::ENOTDIR)),
                (false, true) => return Err(err(Errno::EISDIR)),
                (true, true) if t.has_children(d.ino)? => return Err(err(Errno::ENOTEMPTY)),
                _ => {}
            }
            t.remove_dentry(tdir.ino, to_name)?;
            let left = if d.is_dir() {
                tdelta -= 1;
                t.add_nlink(d.ino, -i64::from(d.nlink), now)?
            } else {
                t.add_nlink(d.ino, -1, now)?
            };
            if left == 0 && last_name_gone(t, d.ino)? {
                removed = Some(d.ino);
            }
        }
        t.remove_dentry(fdir.ino, from_name)?;
        t.insert_dentry(tdir.ino, to_name, src.ino)?;
    }
    t.set_ctime(src.ino, now)?;
    if fdir.ino == tdir.ino {
        t.touch_dir(fdir.ino, fdelta + tdelta, now)?;
    } else {
        t.touch_dir(fdir.ino, fdelta, now)?;
        t.touch_dir(tdir.ino, tdelta, now)?;
    }
    Ok(removed)
}

/// Applies `changes` to node `n` (truncating its content when it shrinks); returns the node
/// as it now is. `max_size` is the largest file the store can hold.
pub fn setattr_in<T: Tree + ?Sized>(t: &T, n: Node, changes: &SetAttr, max_size: u64) -> FsResult<Node> {
    if changes.is_empty() {
        return Ok(n);
    }
    let old_size = n.size;
    let n = apply_setattr(n, changes, max_size)?;
    if n.size < old_size {
        t.truncate_chunks(n.ino, n.size)?;
    }
    t.update_attrs(&n)?;
    Ok(n)
}

/// The node `n` with `changes` applied, as [`setattr_in`] stores it (the content is the
/// caller's to cut when the size shrinks).
pub fn apply_setattr(mut n: Node, changes: &SetAttr, max_size: u64) -> FsResult<Node> {
    if changes.is_empty() {
        return Ok(n);
    }
    let now = now_ns();
    let resolve = |ts: TimeSet| match ts {
        TimeSet::Now => now,
        TimeSet::At(ts) => time_to_ns(ts),
    };
    if let Some(size) = changes.size {
        match n.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(err(Errno::EISDIR)),
            _ => return Err(err(Errno::EINVAL)),
        }
        if size > max_size {
            return Err(err(Errno::EFBIG));
        }
        n.size = size;
        n.mtime = now;
    }
    if let Some(mode) = changes.mode {
        n.perm = mode & 0o7777;
    }
    if let Some(uid) = changes.uid {
        n.uid = uid;
    }
    if let Some(gid) = changes.gid {
        n.gid = gid;
    }
    if let Some(ts) = changes.atime {
        n.atime = resolve(ts);
    }
    if let Some(ts) = changes.mtime {
        n.mtime = resolve(ts);
    }
    n.ctime = now;
    Ok(n)
}

/// The checks of setxattr(2) that need no lookup.
pub fn check_xattr(name: &str, value: &[u8], flags: i32) -> FsResult<()> {
    if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 {
        return Err(err(Errno::EINVAL));
    }
    if name.is_empty() || name.len() > XATTR_NAME_MAX {
        return Err(err(Errno::ERANGE));
    }
    super::check_xattr_namespace(name)?;
    if value.len() > XATTR_SIZE_MAX {
        return Err(err(Errno::E2BIG));
    }
    Ok(())
}

/// Extended attribute `name` of the node at `path` (ENODATA if it has none).
pub fn getxattr_in<T: Tree + ?Sized>(t: &T, root: u64, path: &str, name: &str) -> FsResult<Vec<u8>> {
    super::check_xattr_namespace(name)?;
    t.get_xattr(resolve(t, root, path)?, name)?.ok_or_else(|| err(Errno::ENODATA))
}

/// The extended attribute names of the node at `path`, each followed by a NUL byte.
pub fn listxattr_in<T: Tree + ?Sized>(t: &T, root: u64, path: &str) -> FsResult<Vec<u8>> {
    let mut out = Vec::new();
    for name in t.xattr_names(resolve(t, root, path)?)? {
        out.extend_from_slice(name.as_bytes());
        out.push(0);
    }
    Ok(out)
}

/// Sets extended attribute `name` of the node at `path`; returns its inode.
pub fn setxattr_in<T: Tree + ?Sized>(
    t: &T,
    root: u64,
    path: &str,
    (name, value, flags): (&str, &[u8], i32),
) -> FsResult<u64> {
    let ino = resolve(t, root, path)?;
    let exists = t.xattr_exists(ino, name)?;
    if exists && flags & XATTR_CREATE != 0 {
        return Err(err(Errno::EEXIST));
    }
    if !exists && flags & XATTR_REPLACE != 0 {
        return Err(err(Errno::ENODATA));
    }
    t.put_xattr(ino, name, value)?;
    t.set_ctime(ino, now_ns())?;
    Ok(ino)
}

/// Removes extended attribute `name` of the node at `path`; returns its inode.
pub fn removexattr_in<T: Tree + ?Sized>(t: &T, root: u64, path: &str, name: &str) -> FsResult<u64> {
    super::check_xattr_namespace(name)?;
    let ino = resolve(t, root, path)?;
    if !t.delete_xattr(ino, name)? {
        return Err(err(Errno::ENODATA));
    }
    t.set_ctime(ino, now_ns())?;
    Ok(ino)
}
