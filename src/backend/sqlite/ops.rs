//! The path operations of [`Backend`] for [`SqliteBackend`]: lookups run on a reader
//! connection, every change is one write transaction committed before the call returns.

use std::sync::Arc;

use parking_lot::Mutex;
use rusqlite::{params, OptionalExtension, TransactionBehavior};

use super::file::{InodeState, SqliteFile};
use super::store::{self, Ctx, NewNode, Node};
use super::{Db, SqliteBackend, StateRef};
use crate::backend::{
    split_parent, Attr, Backend, Caller, DirEntry, FileKind, OpenFile, SetAttr, StatFs, RENAME_EXCHANGE,
    RENAME_NOREPLACE,
};
use crate::error::{Errno, FsError, FsResult};

const XATTR_CREATE: i32 = 1;
const XATTR_REPLACE: i32 = 2;
const XATTR_NAME_MAX: usize = 255;
const XATTR_SIZE_MAX: usize = 65536;
/// Reported as both total and free inodes: the database has no inode table to run out of.
const STATFS_FILES: u64 = 1 << 32;

fn err(errno: Errno) -> FsError {
    FsError::errno(errno)
}

/// Adds the path to an error, for messages; the errno is unchanged.
fn at(path: &str) -> impl FnOnce(FsError) -> FsError + '_ {
    move |e| e.with_context(path.to_string())
}

/// Group and permission bits of a new node under `parent`: a set-group-ID parent passes on
/// its group, and to new directories the set-group-ID bit itself.
fn ownership(parent: &Node, caller: &Caller, perm: u32, kind: FileKind) -> (u32, u32) {
    if parent.perm & libc::S_ISGID != 0 {
        let perm = if kind == FileKind::Dir { perm | libc::S_ISGID } else { perm };
        (parent.gid, perm)
    } else {
        (caller.gid, perm)
    }
}

/// What kind of node `make_node` creates.
struct Spec<'a> {
    kind: FileKind,
    perm: u32,
    rdev: u32,
    target: Option<&'a [u8]>,
}

impl Spec<'_> {
    fn new(kind: FileKind, mode: u32) -> Spec<'static> {
        Spec { kind, perm: mode & 0o7777, rdev: 0, target: None }
    }
}

impl SqliteBackend {
    /// Resolves `path` in a read transaction (`resolve`), then runs `then` on what it found
    /// outside it. When the node went in between (`then` says ENOENT for it: a rename replaced
    /// the name, which never stopped existing, or an unlink removed it), the name is looked up
    /// again, instead of answering ENOENT for a name that may lead to another node now.
    fn resolved_again<N, T>(
        &self,
        path: &str,
        resolve: impl Fn(&Ctx<'_>) -> FsResult<N>,
        ino_of: impl Fn(&N) -> u64,
        mut then: impl FnMut(N) -> FsResult<T>,
    ) -> FsResult<T> {
        let mut vanished = None;
        for _ in 0..100 {
            let found = self.inner.read_tx(&resolve).map_err(at(path))?;
            let ino = ino_of(&found);
            match then(found) {
                Err(e) if e.is(Errno::ENOENT) && vanished != Some(ino) => vanished = Some(ino),
                result => return result.map_err(at(path)),
            }
        }
        Err(FsError::new(Errno::EAGAIN, format!("{path}: replaced faster than it could be reached")))
    }

    /// Creates a node at `path`. When `register` is given (a file being created and opened),
    /// its state is put in the registry before the commit, so no unlink can delete the rows
    /// between the commit and the handle's existence.
    fn make_node(
        &self,
        path: &str,
        spec: Spec<'_>,
        caller: &Caller,
        register: Option<&StateRef>,
    ) -> FsResult<Node> {
        let Spec { kind, perm, rdev, target } = spec;
        if path.is_empty() {
            return Err(err(Errno::EEXIST));
        }
        let (parent_path, name) = split_parent(path);
        store::check_name(name)?;
        let inner = &self.inner;
        let now = store::now_ns();
        let mut db = inner.conn.lock();
        let Db { conn, dentries } = &mut *db;
        let ino = inner.alloc_ino(conn)?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let c = Ctx { conn: &tx, dentries: Some(dentries) };
        let parent = store::resolve_dir(&c, inner.root, parent_path)?;
        if store::lookup(&c, parent.ino, name)?.is_some() {
            return Err(err(Errno::EEXIST));
        }
        let (gid, perm) = ownership(&parent, caller, perm, kind);
        let is_dir = kind == FileKind::Dir;
        let new = NewNode {
            ns: inner.ns,
            kind,
            perm,
            uid: caller.uid,
            gid,
            rdev,
            nlink: if is_dir { 2 } else { 1 },
            target,
            now,
        };
        store::insert_node(&tx, ino, &new)?;
        store::insert_dentry(&tx, parent.ino, name, ino)?;
        store::touch_dir(&tx, parent.ino, i64::from(is_dir), now)?;
        let node = Node {
            ino,
            kind,
            perm,
            uid: caller.uid,
            gid,
            rdev,
            size: target.map_or(0, |t| t.len() as u64),
            nlink: new.nlink,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
        };
        if let Some(state) = register {
            inner.registry.lock().states.insert(ino, state.clone());
        }
        if let Err(e) = tx.commit() {
            if register.is_some() {
                inner.registry.lock().states.remove(&ino);
            }
            return Err(e.into());
        }
        inner.committed();
        Ok(node)
    }
}

impl Backend for SqliteBackend {
    fn describe(&self) -> String {
        format!("sqlite {} (namespace {})", self.inner.path.display(), self.inner.namespace)
    }

    fn getattr(&self, path: &str) -> FsResult<Attr> {
        let inner = &self.inner;
        // An open node is read again under its lock.
        self.resolved_again(
            path,
            |c| store::resolve_node(c, inner.root, path),
            |n| n.ino,
            |n| inner.attr_of(n),
        )
    }

    fn readdir(&self, path: &str) -> FsResult<Vec<DirEntry>> {
        let inner = &self.inner;
        inner
            .read_tx(|c| {
                let dir = store::resolve_dir(c, inner.root, path)?;
                store::list_dir(c, dir.ino)
            })
            .map_err(at(path))
    }

    fn open(&self, path: &str, _flags: i32) -> FsResult<Box<dyn OpenFile>> {
        let inner = &self.inner;
        let file = self.resolved_again(
            path,
            |c| store::resolve(c, inner.root, path),
            |&ino| ino,
            |ino| inner.open_handle(ino),
        )?;
        Ok(Box::new(file))
    }

    fn create(
        &self,
        path: &str,
        mode: u32,
        _flags: i32,
        caller: &Caller,
    ) -> FsResult<(Attr, Box<dyn OpenFile>)> {
        let state: StateRef = Arc::new(Mutex::new(InodeState::new_open()));
        let node =
            self.make_node(path, Spec::new(FileKind::File, mode), caller, Some(&state)).map_err(at(path))?;
        let file = SqliteFile::new(self.inner.clone(), node.ino, FileKind::File, state);
        Ok((node.attr(), Box::new(file)))
    }

    fn mknod(&self, path: &str, mode: u32, rdev: u32, caller: &Caller) -> FsResult<Attr> {
        // As mknod(2): no type means a regular file; directories are EPERM.
        let kind = match mode & libc::S_IFMT {
            0 => FileKind::File,
            _ => FileKind::from_mode(mode).ok_or_else(|| err(Errno::EINVAL))?,
        };
        match kind {
            FileKind::Dir => return Err(err(Errno::EPERM)),
            FileKind::Symlink => return Err(err(Errno::EINVAL)),
            _ => {}
        }
        let node =
            self.make_node(path, Spec { rdev, ..Spec::new(kind, mode) }, caller, None).map_err(at(path))?;
        Ok(node.attr())
    }

    fn mkdir(&self, path: &str, mode: u32, caller: &Caller) -> FsResult<Attr> {
        let node = self.make_node(path, Spec::new(FileKind::Dir, mode), caller, None).map_err(at(path))?;
        Ok(node.attr())
    }

    fn symlink(&self, path: &str, target: &[u8], caller: &Caller) -> FsResult<Attr> {
        let node = self
            .make_node(
                path,
                Spec { target: Some(target), ..Spec::new(FileKind::Symlink, 0o777) },
                caller,
                None,
            )
            .map_err(at(path))?;
        Ok(node.attr())
    }

    fn link(&self, existing: &str, new_path: &str) -> FsResult<Attr> {
        if new_path.is_empty() {
            return Err(err(Errno::EEXIST));
        }
        let (parent_path, name) = split_parent(new_path);
        store::check_name(name).map_err(at(new_path))?;
        let inner = &self.inner;
        let ino = inner
            .write_tx(|tx| {
                let src = store::resolve_node(tx, inner.root, existing)?;
                let parent = store::resolve_dir(tx, inner.root, parent_path)?;
                if store::lookup(tx, parent.ino, name)?.is_some() {
                    return Err(err(Errno::EEXIST));
                }
                if src.is_dir() {
                    return Err(err(Errno::EPERM));
                }
                let now = store::now_ns();
                store::insert_dentry(tx, parent.ino, name, src.ino)?;
                store::add_nlink(tx, src.ino, 1, now)?;
                store::touch_dir(tx, parent.ino, 0, now)?;
                Ok(src.ino)
            })
            .map_err(at(new_path))?;
        let node = inner.with_reader(|c| store::must_node(c, ino))?;
        inner.attr_of(node)
    }

    fn readlink(&self, path: &str) -> FsResult<Vec<u8>> {
        let inner = &self.inner;
        inner
            .read_tx(|c| {
                let n = store::resolve_node(c, inner.root, path)?;
                if n.kind != FileKind::Symlink {
                    return Err(err(Errno::EINVAL));
                }
                store::symlink_target(c, n.ino)
            })
            .map_err(at(path))
    }

    fn unlink(&self, path: &str) -> FsResult<()> {
        if path.is_empty() {
            return Err(err(Errno::EISDIR));
        }
        let (parent_path, name) = split_parent(path);
        let inner = &self.inner;
        let deferred = inner
            .write_tx(|tx| {
                let parent = store::resolve_dir(tx, inner.root, parent_path)?;
                store::check_name(name)?;
                let ino = store::lookup(tx, parent.ino, name)?.ok_or_else(|| err(Errno::ENOENT))?;
                if store::must_node(tx, ino)?.is_dir() {
                    return Err(err(Errno::EISDIR));
                }
                let now = store::now_ns();
                store::remove_dentry(tx, parent.ino, name)?;
                let left = store::add_nlink(tx, ino, -1, now)?;
                store::touch_dir(tx, parent.ino, 0, now)?;
                Ok((left == 0 && inner.drop_or_defer(tx, ino)?).then_some(ino))
            })
            .map_err(at(path))?;
        match deferred {
            Some(ino) => inner.reap(ino),
            None => Ok(()),
        }
    }

    fn rmdir(&self, path: &str) -> FsResult<()> {
        if path.is_empty() {
            return Err(err(Errno::EBUSY));
        }
        let (parent_path, name) = split_parent(path);
        let inner = &self.inner;
        let deferred = inner
            .write_tx(|tx| {
                let parent = store::resolve_dir(tx, inner.root, parent_path)?;
                store::check_name(name)?;
                let ino = store::lookup(tx, parent.ino, name)?.ok_or_else(|| err(Errno::ENOENT))?;
                let n = store::must_node(tx, ino)?;
                if !n.is_dir() {
                    return Err(err(Errno::ENOTDIR));
                }
                if store::has_children(tx, ino)? {
                    return Err(err(Errno::ENOTEMPTY));
                }
                let now = store::now_ns();
                store::remove_dentry(tx, parent.ino, name)?;
                store::touch_dir(tx, parent.ino, -1, now)?;
                store::add_nlink(tx, ino, -i64::from(n.nlink), now)?;
                Ok(inner.drop_or_defer(tx, ino)?.then_some(ino))
            })
            .map_err(at(path))?;
        match deferred {
            Some(ino) => inner.reap(ino),
            None => Ok(()),
        }
    }

    fn rename(&self, from: &str, to: &str, flags: u32) -> FsResult<()> {
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0 || flags == RENAME_NOREPLACE | RENAME_EXCHANGE {
            return Err(err(Errno::EINVAL));
        }
        if from.is_empty() || to.is_empty() {
            return Err(err(Errno::EBUSY));
        }
        let exchange = flags & RENAME_EXCHANGE != 0;
        let (from_parent, from_name) = split_parent(from);
        let (to_parent, to_name) = split_parent(to);
        store::check_name(to_name).map_err(at(to))?;
        let inner = &self.inner;
        let removed = inner
            .write_tx(|tx| {
                let (fdir, fchain) = store::resolve_dir_chain(tx, inner.root, from_parent)?;
                let src = store::lookup(tx, fdir.ino, from_name)?.ok_or_else(|| err(Errno::ENOENT))?;
                let src = store::must_node(tx, src)?;
                let (tdir, tchain) = store::resolve_dir_chain(tx, inner.root, to_parent)?;
                let dst = match store::lookup(tx, tdir.ino, to_name)? {
                    Some(ino) => Some(store::must_node(tx, ino)?),
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
                let now = store::now_ns();
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
                    store::set_dentry_child(tx, fdir.ino, from_name, d.ino)?;
                    store::set_dentry_child(tx, tdir.ino, to_name, src.ino)?;
                    store::set_ctime(tx, d.ino, now)?;
                } else {
                    if let Some(d) = &dst {
                        match (src.is_dir(), d.is_dir()) {
                            (true, false) => return Err(err(Errno::ENOTDIR)),
                            (false, true) => return Err(err(Errno::EISDIR)),
                            (true, true) if store::has_children(tx, d.ino)? => {
                                return Err(err(Errno::ENOTEMPTY))
                            }
                            _ => {}
                        }
                        store::remove_dentry(tx, tdir.ino, to_name)?;
                        let left = if d.is_dir() {
                            tdelta -= 1;
                            store::add_nlink(tx, d.ino, -i64::from(d.nlink), now)?
                        } else {
                            store::add_nlink(tx, d.ino, -1, now)?
                        };
                        if left == 0 && inner.drop_or_defer(tx, d.ino)? {
                            removed = Some(d.ino);
                        }
                    }
                    store::remove_dentry(tx, fdir.ino, from_name)?;
                    store::insert_dentry(tx, tdir.ino, to_name, src.ino)?;
                }
                store::set_ctime(tx, src.ino, now)?;
                if fdir.ino == tdir.ino {
                    store::touch_dir(tx, fdir.ino, fdelta + tdelta, now)?;
                } else {
                    store::touch_dir(tx, fdir.ino, fdelta, now)?;
                    store::touch_dir(tx, tdir.ino, tdelta, now)?;
                }
                Ok(removed)
            })
            .map_err(at(from))?;
        match removed {
            Some(ino) => inner.reap(ino),
            None => Ok(()),
        }
    }

    fn setattr(&self, path: &str, changes: &SetAttr) -> FsResult<Attr> {
        let inner = &self.inner;
        // One transaction resolves and changes the node, together with what its handles have
        // buffered. An `open` registering meanwhile reads the node only after this commits.
        let outcome = (|| -> FsResult<Result<Node, u64>> {
            let mut db = inner.conn.lock();
            let Db { conn, dentries } = &mut *db;
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let ino = store::resolve(&Ctx { conn: &tx, dentries: Some(dentries) }, inner.root, path)?;
            let state = inner.state_get(ino);
            let mut st = match &state {
                None => None,
                Some(state) => match state.try_lock() {
                    Some(st) => Some(st),
                    // Busy: waiting for it here would invert the lock order.
                    None => return Ok(Err(ino)),
                },
            };
            let node = inner.setattr_in(&tx, ino, st.as_deref(), changes)?;
            tx.commit()?;
            inner.committed();
            if let Some(st) = st.as_mut() {
                st.setattr_done(&inner.dirty_total, &node, changes);
            }
            Ok(Ok(node))
        })()
        .map_err(at(path))?;
        match outcome {
            Ok(node) => Ok(node.attr()),
            Err(ino) => {
                let guard = inner.state_get_or_create(ino);
                let attr = inner.setattr_locked(ino, &mut guard.lock(), changes).map_err(at(path));
                attr
            }
        }
    }

    fn statfs(&self, _path: &str) -> FsResult<StatFs> {
        let dir = match self.inner.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => std::path::Path::new("."),
        };
        let s = nix::sys::statvfs::statvfs(dir)?;
        Ok(StatFs {
            blocks: s.blocks(),
            bfree: s.blocks_free(),
            bavail: s.blocks_available(),
            files: STATFS_FILES,
            ffree: STATFS_FILES,
            bsize: s.block_size() as u32,
            namelen: store::NAME_MAX as u32,
            frsize: s.fragment_size() as u32,
        })
    }

    fn getxattr(&self, path: &str, name: &str) -> FsResult<Vec<u8>> {
        let inner = &self.inner;
        inner
            .read_tx(|c| {
                let ino = store::resolve(c, inner.root, path)?;
                c.prepare_cached("SELECT value FROM xattrs WHERE ino = ?1 AND name = ?2")?
                    .query_row(params![ino as i64, name], |r| r.get(0))
                    .optional()?
                    .ok_or_else(|| err(Errno::ENODATA))
            })
            .map_err(at(path))
    }

    fn listxattr(&self, path: &str) -> FsResult<Vec<u8>> {
        let inner = &self.inner;
        inner
            .read_tx(|c| {
                let ino = store::resolve(c, inner.root, path)?;
                let mut stmt = c.prepare_cached("SELECT name FROM xattrs WHERE ino = ?1 ORDER BY name")?;
                let mut out = Vec::new();
                for name in stmt.query_map([ino as i64], |r| r.get::<_, String>(0))? {
                    out.extend_from_slice(name?.as_bytes());
                    out.push(0);
                }
                Ok(out)
            })
            .map_err(at(path))
    }

    fn setxattr(&self, path: &str, name: &str, value: &[u8], flags: i32) -> FsResult<()> {
        if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 {
            return Err(err(Errno::EINVAL));
        }
        if name.is_empty() || name.len() > XATTR_NAME_MAX {
            return Err(err(Errno::ERANGE));
        }
        if value.len() > XATTR_SIZE_MAX {
            return Err(err(Errno::E2BIG));
        }
        let inner = &self.inner;
        inner
            .write_tx(|tx| {
                let ino = store::resolve(tx, inner.root, path)?;
                let exists = tx
                    .prepare_cached("SELECT 1 FROM xattrs WHERE ino = ?1 AND name = ?2")?
                    .query_row(params![ino as i64, name], |_| Ok(()))
                    .optional()?
                    .is_some();
                if exists && flags & XATTR_CREATE != 0 {
                    return Err(err(Errno::EEXIST));
                }
                if !exists && flags & XATTR_REPLACE != 0 {
                    return Err(err(Errno::ENODATA));
                }
                tx.prepare_cached(
                    "INSERT INTO xattrs (ino, name, value) VALUES (?1, ?2, ?3)
                     ON CONFLICT (ino, name) DO UPDATE SET value = excluded.value",
                )?
                .execute(params![ino as i64, name, value])?;
                store::set_ctime(tx, ino, store::now_ns())
            })
            .map_err(at(path))
    }

    fn removexattr(&self, path: &str, name: &str) -> FsResult<()> {
        let inner = &self.inner;
        inner
            .write_tx(|tx| {
                let ino = store::resolve(tx, inner.root, path)?;
                let gone = tx
                    .prepare_cached("DELETE FROM xattrs WHERE ino = ?1 AND name = ?2")?
                    .execute(params![ino as i64, name])?;
                if gone == 0 {
                    return Err(err(Errno::ENODATA));
                }
                store::set_ctime(tx, ino, store::now_ns())
            })
            .map_err(at(path))
    }
}
