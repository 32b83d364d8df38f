//! The path operations of [`Backend`] for [`SqliteBackend`]: lookups run on a reader
//! connection, every change is one write transaction (held for a moment while the backend is
//! alone on its file, see `held`).

use std::sync::Arc;

use parking_lot::Mutex;

use super::file::{InodeState, SqliteFile};
use super::held::Commit;
use super::store::{self, Ctx, Node};
use super::{SqliteBackend, StateRef};
use crate::backend::tree::{self, Spec, Tree};
use crate::backend::{Attr, Backend, Caller, DirEntry, FileKind, OpenFile, SetAttr, StatFs};
use crate::error::{Errno, FsError, FsResult};

/// Reported as both total and free inodes: the database has no inode table to run out of.
const STATFS_FILES: u64 = 1 << 32;

fn err(errno: Errno) -> FsError {
    FsError::errno(errno)
}

/// Adds the path to an error, for messages; the errno is unchanged.
fn at(path: &str) -> impl FnOnce(FsError) -> FsError + '_ {
    move |e| e.with_context(path.to_string())
}

impl SqliteBackend {
    /// Resolves `path` in a read transaction (`resolve`), then runs `then` on what it found
    /// outside it. When the node went in between (`then` says ENOENT for it: a rename replaced
    /// the name, which never stopped existing, or an unlink removed it), the name is looked up
    /// again, instead of answering ENOENT for a name that may lead to another node now.
    ///
    /// `then` also gets the changes counted before the read ([`Inner::changes_seen`]).
    fn resolved_again<N, T>(
        &self,
        path: &str,
        resolve: impl Fn(&Ctx<'_>) -> FsResult<N>,
        ino_of: impl Fn(&N) -> u64,
        mut then: impl FnMut(N, u64) -> FsResult<T>,
    ) -> FsResult<T> {
        let mut vanished = None;
        for _ in 0..100 {
            let seen = self.inner.changes_seen();
            let found = self.inner.read_tx(&resolve).map_err(at(path))?;
            let ino = ino_of(&found);
            match then(found, seen) {
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
        let inner = &self.inner;
        let mut db = inner.conn.lock();
        let ino = inner.alloc_ino(&mut db)?;
        let made = inner.change_in(&mut db, Commit::Soon, |c| {
            let node = tree::create_in(c, inner.root, path, (ino, inner.ns), &spec, caller)?;
            if let Some(state) = register {
                inner.registry.lock().states.insert(ino, state.clone());
            }
            Ok(node)
        });
        if made.is_err() && register.is_some() {
            inner.registry.lock().states.remove(&ino);
        }
        made
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
            |c| tree::resolve_node(c, inner.root, path),
            |n| n.ino,
            |n, _| inner.attr_of(n),
        )
    }

    fn kind_and_ino(&self, path: &str) -> FsResult<(FileKind, u64)> {
        // Buffered writes change neither: the stored node answers, without `attr_of`'s
        // second read of an open one.
        let inner = &self.inner;
        let node = inner.read_tx(|c| tree::resolve_node(c, inner.root, path)).map_err(at(path))?;
        Ok((node.kind, node.ino))
    }

    fn readdir(&self, path: &str) -> FsResult<Vec<DirEntry>> {
        let inner = &self.inner;
        inner
            .read_tx(|c| {
                let dir = tree::resolve_dir(c, inner.root, path)?;
                store::list_dir(c, dir.ino)
            })
            .map_err(at(path))
    }

    fn open(&self, path: &str, _flags: i32) -> FsResult<Box<dyn OpenFile>> {
        let inner = &self.inner;
        let file = self.resolved_again(
            path,
            |c| tree::resolve_node(c, inner.root, path),
            |n| n.ino,
            |n, seen| inner.open_handle(n.ino, Some((n, seen))),
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
        let file = SqliteFile::new(self.inner.clone(), node.attr(), state);
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
        let inner = &self.inner;
        let ino =
            inner.write_tx(|tx| tree::link_in(tx, inner.root, existing, new_path)).map_err(at(new_path))?;
        let node = inner.with_reader(|c| c.must_node(ino))?;
        inner.attr_of(node)
    }

    fn readlink(&self, path: &str) -> FsResult<Vec<u8>> {
        let inner = &self.inner;
        inner
            .read_tx(|c| {
                let n = tree::resolve_node(c, inner.root, path)?;
                if n.kind != FileKind::Symlink {
                    return Err(err(Errno::EINVAL));
                }
                store::symlink_target(c, n.ino)
            })
            .map_err(at(path))
    }

    fn unlink(&self, path: &str) -> FsResult<()> {
        let inner = &self.inner;
        let deferred = inner
            .write_tx(|tx| tree::unlink_in(tx, inner.root, path, |tx, ino| inner.drop_or_defer(tx, ino)))
            .map_err(at(path))?;
        match deferred {
            Some(ino) => inner.reap(ino),
            None => Ok(()),
        }
    }

    fn rmdir(&self, path: &str) -> FsResult<()> {
        let inner = &self.inner;
        let deferred = inner
            .write_tx(|tx| tree::rmdir_in(tx, inner.root, path, |tx, ino| inner.drop_or_defer(tx, ino)))
            .map_err(at(path))?;
        match deferred {
            Some(ino) => inner.reap(ino),
            None => Ok(()),
        }
    }

    fn rename(&self, from: &str, to: &str, flags: u32) -> FsResult<()> {
        tree::check_rename(from, to, flags).map_err(at(to))?;
        let inner = &self.inner;
        let removed = inner
            .write_tx(|tx| {
                tree::rename_in(tx, inner.root, (from, to, flags), |tx, ino| inner.drop_or_defer(tx, ino))
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
            let ino = tree::resolve(
                &Ctx { conn: &db.conn, dentries: Some(&db.dentries), nodes: None },
                inner.root,
                path,
            )?;
            let state = inner.state_get(ino);
            let mut st = match &state {
                None => None,
                Some(state) => match state.try_lock() {
                    Some(st) => Some(st),
                    // Busy: waiting for it here would invert the lock order.
                    None => return Ok(Err(ino)),
                },
            };
            // Buffered data goes in with it, and is stored once this returns.
            let when = st.as_ref().map_or(Commit::Soon, |st| st.commit());
            let node =
                inner.change_in(&mut db, when, |c| inner.setattr_in(c, ino, st.as_deref(), changes))?;
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

    fn fsyncdir(&self, _path: &str) -> FsResult<()> {
        // Held name changes are committed to the WAL (surviving a kill -9); this syncs it to
        // disk.
        self.inner.commit_held()?;
        self.inner.sync_durable()
    }

    fn commit_pending(&self) -> FsResult<()> {
        self.inner.commit_held()
    }

    fn fsyncdirs(&self, _dirs: &[&str]) -> FsResult<()> {
        // One sync of the WAL holds every directory's names.
        self.fsyncdir("")
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
        inner.read_tx(|c| tree::getxattr_in(c, inner.root, path, name)).map_err(at(path))
    }

    fn listxattr(&self, path: &str) -> FsResult<Vec<u8>> {
        let inner = &self.inner;
        inner.read_tx(|c| tree::listxattr_in(c, inner.root, path)).map_err(at(path))
    }

    fn setxattr(&self, path: &str, name: &str, value: &[u8], flags: i32) -> FsResult<()> {
        tree::check_xattr(name, value, flags)?;
        let inner = &self.inner;
        inner
            .write_tx(|tx| tree::setxattr_in(tx, inner.root, path, (name, value, flags)))
            .map_err(at(path))?;
        Ok(())
    }

    fn removexattr(&self, path: &str, name: &str) -> FsResult<()> {
        let inner = &self.inner;
        inner.write_tx(|tx| tree::removexattr_in(tx, inner.root, path, name)).map_err(at(path))?;
        Ok(())
    }
}
