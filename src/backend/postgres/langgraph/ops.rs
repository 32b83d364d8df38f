//! The path operations of [`Backend`] for [`LangGraphBackend`]. Lookups are single queries;
//! every change is one transaction under the prefix's lock, in which the checks are made in
//! the kernel's order (so the errnos match a plain directory).
//!
//! What the store cannot hold is refused: hard links, symlinks and special files (EPERM, as
//! link(2), symlink(2) and mknod(2) answer on a filesystem without them), `RENAME_EXCHANGE`
//! (EINVAL, as on a filesystem without it), extended attributes (ENOTSUP).

use super::file::{self, LgFile};
use super::{rows, Inner, LangGraphBackend};
use crate::backend::tree::{self, Node};
use crate::backend::{
    split_parent, Attr, Backend, Caller, DirEntry, FileKind, OpenFile, RemoteChange, SetAttr, StatFs,
    TimeSet, RENAME_NOREPLACE,
};
use crate::error::{Errno, FsError, FsResult};

/// Reported as total and free blocks and inodes: the server's space is not ours to measure.
const STATFS_PLENTY: u64 = 1 << 32;

fn err(errno: Errno) -> FsError {
    FsError::errno(errno)
}

fn at(path: &str) -> impl FnOnce(FsError) -> FsError + '_ {
    move |e| e.with_context(path.to_string())
}

impl Inner {
    /// What `path` is, with this daemon's uncommitted writes of it.
    fn getattr(&self, path: &str) -> FsResult<Node> {
        let n = self.read(|sql| rows::must_stat(sql, &self.prefix, path))?;
        match (n.kind, self.open_at(path)) {
            (FileKind::File, Some(shared)) => Ok(file::overlay(&shared.state.lock(), n)),
            _ => Ok(n),
        }
    }

    /// Creates a file (with an empty value) or a directory (in the side table) at `path`.
    fn make(&self, path: &str, kind: FileKind, mode: u32, caller: &Caller) -> FsResult<Node> {
        if path.is_empty() {
            return Err(err(Errno::EEXIST));
        }
        let (parent_path, name) = split_parent(path);
        tree::check_name(name)?;
        self.write(|sql| {
            let parent = rows::stat(sql, &self.prefix, parent_path)?.ok_or_else(|| err(Errno::ENOENT))?;
            if parent.kind != FileKind::Dir {
                return Err(err(Errno::ENOTDIR));
            }
            if rows::stat(sql, &self.prefix, path)?.is_some() {
                return Err(err(Errno::EEXIST));
            }
            let now = tree::now_ns();
            let (gid, perm) = tree::ownership((parent.perm, parent.gid), caller, mode & 0o7777, kind);
            let mut n = Node {
                ino: 0,
                kind,
                perm,
                uid: caller.uid,
                gid,
                rdev: 0,
                size: 0,
                nlink: 1,
                atime: now,
                mtime: now,
                ctime: now,
                crtime: now,
            };
            rows::put_meta(sql, &self.prefix, path, &n)?;
            rows::touch_dir(sql, &self.prefix, parent_path, now)?;
            match kind {
                // The trigger announces the new key.
                FileKind::File => rows::put(sql, &self.prefix, path, b"", now)?,
                _ => self.announce(sql, 'n', path)?,
            }
            n = rows::must_stat(sql, &self.prefix, path)?;
            Ok(n)
        })
    }
}

/// `setattr` of the file or directory at `path` (also of an open file, by its name).
pub(super) fn setattr_path(inner: &Inner, path: &str, changes: &SetAttr) -> FsResult<Attr> {
    if changes.is_empty() {
        return Ok(inner.getattr(path)?.attr());
    }
    if let Some(size) = changes.size {
        let n = inner.read(|sql| rows::must_stat(sql, &inner.prefix, path))?;
        match n.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(err(Errno::EISDIR)),
            _ => return Err(err(Errno::EINVAL)),
        }
        // Through the buffer of an open file, so that its writes and the truncation agree.
        let _names = inner.names.read();
        match inner.open_at(path) {
            Some(shared) => file::resize(inner, &mut shared.state.lock(), size)?,
            None => {
                let mut state = file::Shared::new(path).state.into_inner();
                file::resize(inner, &mut state, size)?;
            }
        }
    }
    let rest = SetAttr { size: None, ..changes.clone() };
    if !rest.is_empty() {
        inner.write(|sql| {
            let mut n = rows::must_stat(sql, &inner.prefix, path)?;
            let now = tree::now_ns();
            let resolve = |ts: TimeSet| match ts {
                TimeSet::Now => now,
                TimeSet::At(t) => tree::time_to_ns(t),
            };
            if let Some(mode) = rest.mode {
                n.perm = mode & 0o7777;
            }
            n.uid = rest.uid.unwrap_or(n.uid);
            n.gid = rest.gid.unwrap_or(n.gid);
            if let Some(ts) = rest.atime {
                n.atime = resolve(ts);
            }
            if let Some(ts) = rest.mtime {
                n.mtime = resolve(ts);
                if n.kind == FileKind::File {
                    rows::set_modified(sql, &inner.prefix, path, n.mtime)?;
                }
            }
            n.ctime = now;
            rows::put_meta(sql, &inner.prefix, path, &n)?;
            inner.announce(sql, 'c', path)
        })?;
    }
    Ok(inner.getattr(path)?.attr())
}

impl LangGraphBackend {
    fn open_file(&self, path: &str, kind: FileKind) -> Box<dyn OpenFile> {
        let shared = self.inner.opened(path);
        Box::new(LgFile::new(self.inner.clone(), shared, kind))
    }
}

impl Backend for LangGraphBackend {
    fn describe(&self) -> String {
        let inner = &self.inner;
        format!(
            "postgres {} (langgraph store, schema {} for metadata, prefix {})",
            inner.settings.server(),
            inner.settings.schema,
            inner.prefix
        )
    }

    fn getattr(&self, path: &str) -> FsResult<Attr> {
        Ok(self.inner.getattr(path).map_err(at(path))?.attr())
    }

    fn readdir(&self, path: &str) -> FsResult<Vec<DirEntry>> {
        let inner = &self.inner;
        inner
            .read(|sql| {
                if rows::must_stat(sql, &inner.prefix, path)?.kind != FileKind::Dir {
                    return Err(err(Errno::ENOTDIR));
                }
                rows::list(sql, &inner.prefix, path)
            })
            .map_err(at(path))
    }

    fn open(&self, path: &str, _flags: i32) -> FsResult<Box<dyn OpenFile>> {
        let n = self.inner.getattr(path).map_err(at(path))?;
        Ok(self.open_file(path, n.kind))
    }

    fn create(
        &self,
        path: &str,
        mode: u32,
        flags: i32,
        caller: &Caller,
    ) -> FsResult<(Attr, Box<dyn OpenFile>)> {
        let made = self.inner.make(path, FileKind::File, mode, caller);
        match made {
            Ok(n) => Ok((n.attr(), self.open_file(path, FileKind::File))),
            // Another writer of the store made it since the kernel looked: without O_EXCL,
            // open(2) opens (and with O_TRUNC empties) the file that is there now.
            Err(e) if e.is(Errno::EEXIST) && flags & libc::O_EXCL == 0 => {
                let n = self.inner.getattr(path).map_err(at(path))?;
                if n.kind != FileKind::File {
                    return Err(e).map_err(at(path));
                }
                let file = self.open_file(path, FileKind::File);
                let attr = match flags & libc::O_TRUNC != 0 {
                    true => file.setattr(&SetAttr { size: Some(0), ..SetAttr::default() })?,
                    false => n.attr(),
                };
                Ok((attr, file))
            }
            Err(e) => Err(e).map_err(at(path)),
        }
    }

    fn mknod(&self, path: &str, mode: u32, _rdev: u32, caller: &Caller) -> FsResult<Attr> {
        match mode & libc::S_IFMT {
            0 | libc::S_IFREG => {
                Ok(self.inner.make(path, FileKind::File, mode, caller).map_err(at(path))?.attr())
            }
            libc::S_IFDIR => Err(err(Errno::EPERM)),
            _ => Err(FsError::new(Errno::EPERM, "the langgraph layout stores regular files only")),
        }
    }

    fn mkdir(&self, path: &str, mode: u32, caller: &Caller) -> FsResult<Attr> {
        Ok(self.inner.make(path, FileKind::Dir, mode, caller).map_err(at(path))?.attr())
    }

    fn symlink(&self, _path: &str, _target: &[u8], _caller: &Caller) -> FsResult<Attr> {
        Err(FsError::new(Errno::EPERM, "the langgraph layout stores no symlinks"))
    }

    fn link(&self, _existing: &str, _new_path: &str) -> FsResult<Attr> {
        Err(FsError::new(Errno::EPERM, "the langgraph layout stores no hard links"))
    }

    fn readlink(&self, path: &str) -> FsResult<Vec<u8>> {
        self.inner.getattr(path).map_err(at(path))?;
        Err(err(Errno::EINVAL))
    }

    fn unlink(&self, path: &str) -> FsResult<()> {
        let inner = &self.inner;
        if path.is_empty() {
            return Err(err(Errno::EISDIR));
        }
        // An open file's state is held until the deletion committed and the file is marked
        // unlinked, so that no flush meanwhile brings the value back.
        let _names = inner.names.write();
        let shared = inner.open_at(path);
        let mut state = shared.as_ref().map(|s| s.state.lock());
        let need_content = state.as_ref().is_some_and(|s| s.data.is_none());
        let content = inner
            .write(|sql| {
                let (parent, _) = split_parent(path);
                if rows::must_stat(sql, &inner.prefix, parent)?.kind != FileKind::Dir {
                    return Err(err(Errno::ENOTDIR));
                }
                if rows::must_stat(sql, &inner.prefix, path)?.kind == FileKind::Dir {
                    return Err(err(Errno::EISDIR));
                }
                // What the handles read once the name is gone.
                let content = match need_content {
                    true => rows::content(sql, &inner.prefix, path)?,
                    false => None,
                };
                rows::delete_file(sql, &inner.prefix, path)?;
                rows::touch_dir(sql, &inner.prefix, parent, tree::now_ns())?;
                Ok(content)
            })
            .map_err(at(path))?;
        if let Some(state) = state.as_mut() {
            if state.data.is_none() {
                state.data = Some(content.unwrap_or_default());
            }
            state.unlinked = true;
        }
        drop(state);
        inner.unlinked(path);
        Ok(())
    }

    fn rmdir(&self, path: &str) -> FsResult<()> {
        let inner = &self.inner;
        if path.is_empty() {
            return Err(err(Errno::EBUSY));
        }
        inner
            .write(|sql| {
                if rows::must_stat(sql, &inner.prefix, path)?.kind != FileKind::Dir {
                    return Err(err(Errno::ENOTDIR));
                }
                if rows::has_children(sql, &inner.prefix, path)? {
                    return Err(err(Errno::ENOTEMPTY));
                }
                rows::delete_meta(sql, &inner.prefix, path)?;
                rows::touch_dir(sql, &inner.prefix, split_parent(path).0, tree::now_ns())?;
                inner.announce(sql, 'n', path)
            })
            .map_err(at(path))
    }

    fn rename(&self, from: &str, to: &str, flags: u32) -> FsResult<()> {
        if flags & !RENAME_NOREPLACE != 0 {
            return Err(FsError::new(Errno::EINVAL, "the langgraph layout cannot exchange names"));
        }
        tree::check_rename(from, to, flags).map_err(at(to))?;
        let inner = &self.inner;
        let prefix = &inner.prefix;
        let _names = inner.names.write();
        let moved = inner
            .write(|sql| {
                let src = rows::must_stat(sql, prefix, from)?;
                let parent = rows::must_stat(sql, prefix, split_parent(to).0)?;
                if parent.kind != FileKind::Dir {
                    return Err(err(Errno::ENOTDIR));
                }
                let dst = rows::stat(sql, prefix, to)?;
                if flags & RENAME_NOREPLACE != 0 && dst.is_some() {
                    return Err(err(Errno::EEXIST));
                }
                let is_dir = src.kind == FileKind::Dir;
                if is_dir && to.starts_with(&format!("{from}/")) {
                    return Err(err(Errno::EINVAL));
                }
                if let Some(d) = &dst {
                    if from == to {
                        return Ok(false);
                    }
                    match (is_dir, d.kind == FileKind::Dir) {
                        (true, false) => return Err(err(Errno::ENOTDIR)),
                        (false, true) => return Err(err(Errno::EISDIR)),
                        (true, true) if rows::has_children(sql, prefix, to)? => {
                            return Err(err(Errno::ENOTEMPTY))
                        }
                        (true, true) => rows::delete_meta(sql, prefix, to)?,
                        (false, false) => rows::delete_file(sql, prefix, to)?,
                    }
                }
                match is_dir {
                    true => rows::move_dir(sql, prefix, from, to)?,
                    false => rows::move_file(sql, prefix, from, to)?,
                }
                let now = tree::now_ns();
                rows::touch_dir(sql, prefix, split_parent(from).0, now)?;
                rows::touch_dir(sql, prefix, split_parent(to).0, now)?;
                // The trigger announces moved keys; an empty directory has none.
                inner.announce(sql, 'n', from)?;
                inner.announce(sql, 'n', to)?;
                Ok(true)
            })
            .map_err(at(from))?;
        if moved {
            inner.moved(from, to);
        }
        Ok(())
    }

    fn setattr(&self, path: &str, changes: &SetAttr) -> FsResult<Attr> {
        setattr_path(&self.inner, path, changes).map_err(at(path))
    }

    fn statfs(&self, _path: &str) -> FsResult<StatFs> {
        Ok(StatFs {
            blocks: STATFS_PLENTY,
            bfree: STATFS_PLENTY,
            bavail: STATFS_PLENTY,
            files: STATFS_PLENTY,
            ffree: STATFS_PLENTY,
            bsize: tree::BLKSIZE,
            namelen: tree::NAME_MAX as u32,
            frsize: tree::BLKSIZE,
        })
    }

    fn watch(&self, report: Box<dyn Fn(RemoteChange) + Send + Sync>) {
        self.inner.listener.start(report, Box::new(|_| {}));
    }
}

impl Inner {
    /// The name `path` went through this daemon: an open file of it (marked unlinked, with
    /// its content in its buffer) is no longer found by that name.
    fn unlinked(&self, path: &str) {
        let mut open = self.open.lock();
        if open.get(path).is_some_and(|s| s.state.lock().unlinked) {
            open.remove(path);
        }
    }
}
