//! The path operations of [`Backend`] for [`PostgresBackend`]: lookups are single queries
//! outside a transaction, every change one transaction that also announces what it changed.

use std::sync::Arc;

use super::dircache::{Change, Known};
use super::drafts::Slot;
use super::file::PgFile;
use super::functions::{self, Taking};
use super::notify::Quiet;
use super::store::Sql;
use super::{handles, Inner, Lock, PostgresBackend};
use crate::backend::tree::{self, NewNode, Spec, Tree};
use crate::backend::{Attr, Backend, Caller, DirEntry, FileKind, OpenFile, RemoteChange, SetAttr, StatFs};
use crate::error::{Errno, FsError, FsResult};

/// Reported as total and free blocks and inodes: the server's space is not ours to measure.
const STATFS_PLENTY: u64 = 1 << 32;
/// The longest notification payload the server takes (bytes, less the header).
const PAYLOAD_MAX: usize = 7900;

fn err(errno: Errno) -> FsError {
    FsError::errno(errno)
}

/// Adds the path to an error, for messages; the errno is unchanged.
pub(super) fn at(path: &str) -> impl FnOnce(FsError) -> FsError + '_ {
    move |e| e.with_context(path.to_string())
}

/// What a change notification says changed.
#[derive(Clone, Copy)]
pub(super) enum Changed {
    /// A name came, went or leads elsewhere now.
    Name,
    /// The content or attributes of the node a name leads to.
    Content,
    /// The content or attributes of the file with this inode, opened by the name given
    /// (which may lead elsewhere by the time the change commits).
    FileContent(u64),
}

impl Inner {
    /// Tells the other daemons on the namespace, at this transaction's commit, that `path`
    /// changed.
    pub(super) fn announce(&self, sql: &Sql<'_>, what: Changed, path: &str) -> FsResult<()> {
        sql.notice(&self.channel, &self.payload(what, path))
    }

    /// What the notification of a change to `path` says.
    pub(super) fn payload(&self, what: Changed, path: &str) -> String {
        match (what, path.len() <= PAYLOAD_MAX) {
            (Changed::Name, true) => format!("{}\tn\t{path}", self.instance),
            (Changed::Content, true) => format!("{}\tc\t{path}", self.instance),
            (Changed::FileContent(ino), true) => format!("{}\ti\t{ino}\t{path}", self.instance),
            (_, false) => format!("{}\t*\t", self.instance),
        }
    }

    /// Creates a node at `path`, in one call of the server's `create_at`. A file about to be
    /// opened (`open`) is registered as open before the commit, so no unlink can delete its
    /// rows before its handle exists.
    /// A file to open may be made a draft instead (see `drafts`): its slot comes with it.
    fn make_node(
        &self,
        path: &str,
        spec: Spec<'_>,
        caller: &Caller,
        open: bool,
    ) -> FsResult<(tree::Node, Option<Arc<Slot>>)> {
        let (dir, leaf) = functions::split_new(path).map_err(at(path))?;
        let ino = self.alloc_ino()?;
        if open {
            // A deletion under way was told of the handles it must keep before this one.
            self.handles.opened_for_create(ino);
            if spec.kind == FileKind::File {
                if let Some((node, slot)) = self.make_draft(path, ino, spec.perm, caller) {
                    return Ok((node, Some(slot)));
                }
            }
        }
        let is_dir = spec.kind == FileKind::Dir;
        if is_dir {
            if let Some(node) = self.journal_mkdir(path, ino, spec.perm, caller) {
                return Ok((node, None));
            }
        }
        let mut new = NewNode {
            ns: self.ns,
            kind: spec.kind,
            perm: spec.perm,
            uid: caller.uid,
            gid: caller.gid,
            rdev: spec.rdev,
            nlink: if is_dir { 2 } else { 1 },
            target: spec.target,
            now: tree::now_ns(),
        };
        let payload = self.payload(Changed::Name, path);
        let call = self.call_args(&payload);
        let ticket = self.dirs.changing();
        match self.call(|sql| sql.create_at(&call, (&dir, leaf), ino, &new)) {
            Ok((gid, perm)) => {
                (new.gid, new.perm) = (gid, perm);
                let node = new.node(ino);
                self.dirs.changed(ticket, Change::Made { path, attr: &node.attr(), now: new.now }, true);
                Ok((node, None))
            }
            Err(e) => {
                self.dirs.failed(ticket, path);
                if open {
                    self.closed(ino);
                }
                Err(e).map_err(at(path))
            }
        }
    }

    /// Takes the name `path` (unlink or rmdir) in one call of the server.
    fn take_name(&self, what: Taking, path: &str) -> FsResult<()> {
        if path.is_empty() {
            return Err(err(match what {
                Taking::File => Errno::EISDIR,
                Taking::Dir => Errno::EBUSY,
            }));
        }
        let (dir, leaf) = functions::split(path).map_err(at(path))?;
        if self.journal_take(path, matches!(what, Taking::Dir)) {
            return Ok(());
        }
        let payload = self.payload(Changed::Name, path);
        let call = self.call_args(&payload);
        // The server deletes a node left without a name unless this daemon has a handle on it;
        // opens racing the call learn of it (see `handles`).
        let (kept, deletion) = self.handles.deleting();
        let ticket = self.dirs.changing();
        let taken =
            self.call(|sql| sql.take_name(what, &call, (&dir, leaf), (self.ns, self.instance), &kept));
        match taken {
            Ok(_) => {
                let dir = matches!(what, Taking::Dir);
                self.dirs.changed(ticket, Change::Taken { path, dir, now: call.now }, true);
            }
            Err(_) => self.dirs.failed(ticket, path),
        }
        let (ino, left) = taken.map_err(at(path))?;
        self.keep_orphan((left == 0 && kept.contains(&(ino as i64))).then_some(ino), &deletion);
        Ok(())
    }

    /// After a change of names that kept the nameless `orphan` for a handle: its last close
    /// deletes it, or, if that close came meanwhile, this does.
    pub(super) fn keep_orphan(&self, orphan: Option<u64>, deletion: &handles::Deletion<'_>) {
        if let Some(ino) = orphan.filter(|&ino| !deletion.kept(ino)) {
            self.delete_orphan(ino);
        }
    }
}

impl PostgresBackend {
    fn file(&self, ino: u64, kind: FileKind, path: &str, flags: i32) -> PgFile {
        PgFile::new(self.inner.clone(), ino, kind, path, flags)
    }

    /// `setattr`, on the server.
    fn set_attrs(&self, path: &str, changes: &SetAttr) -> FsResult<Attr> {
        let inner = &self.inner;
        if changes.size.is_none() && !changes.is_empty() {
            let payload = inner.payload(Changed::Content, path);
            return inner
                .read(|sql| sql.set_attrs_at(inner.root, path, changes, (&inner.channel, &payload)))
                .map(|n| n.attr())
                .map_err(at(path));
        }
        inner
            .write(Lock::Rows, |sql| {
                let ino = tree::resolve(sql, inner.root, path)?;
                let node = sql.lock_node(ino)?.ok_or_else(|| err(Errno::ENOENT))?;
                let node = tree::setattr_in(sql, node, changes, super::file::MAX_FILE_SIZE)?;
                inner.announce(sql, Changed::Content, path)?;
                Ok(node.attr())
            })
            .map_err(at(path))
    }
}

impl Backend for PostgresBackend {
    fn describe(&self) -> String {
        let inner = &self.inner;
        format!(
            "postgres {} (schema {}, namespace {})",
            inner.settings.server(),
            inner.settings.schema,
            inner.namespace
        )
    }

    fn getattr(&self, path: &str) -> FsResult<Attr> {
        let inner = &self.inner;
        match inner.dirs.known(path) {
            Known::Dir(attr) => return Ok(attr),
            Known::Absent => return Err(err(Errno::ENOENT)).map_err(at(path)),
            Known::Unknown => {}
        }
        match inner.dirs.file_attr(path) {
            Some(attr) => Ok(attr),
            None => self.getattr_stored(path),
        }
    }

    fn getattr_stored(&self, path: &str) -> FsResult<Attr> {
        let inner = &self.inner;
        let ticket = inner.dirs.reading();
        let attr =
            inner.read(|sql| Ok(tree::resolve_node(sql, inner.root, path)?.attr())).map_err(at(path))?;
        inner.dirs.read_attr(ticket, path, &attr);
        Ok(attr)
    }

    fn kind_and_ino(&self, path: &str) -> FsResult<(FileKind, u64)> {
        match self.inner.dirs.node(path) {
            Some(node) => Ok((node.kind, node.ino)),
            None => self.getattr(path).map(|a| (a.kind, a.ino)),
        }
    }

    fn getattr_entries(&self, dir: &str, names: &[&str]) -> Vec<FsResult<Attr>> {
        let inner = &self.inner;
        let ticket = inner.dirs.reading();
        let found = inner.read(|sql| {
            let d = tree::resolve_dir(sql, inner.root, dir)?;
            sql.entries(d.ino, names)
        });
        match found {
            Ok(found) => names
                .iter()
                .map(|n| {
                    let attr = found.get(*n).map(|node| node.attr()).ok_or_else(|| err(Errno::ENOENT))?;
                    inner.dirs.read_entry_attr(ticket, (dir, n), &attr);
                    Ok(attr)
                })
                .collect(),
            Err(e) => names.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    fn readdir(&self, path: &str) -> FsResult<Vec<DirEntry>> {
        let inner = &self.inner;
        let ticket = inner.dirs.reading();
        let entries = inner.read(|sql| sql.list_path(inner.root, path)).map_err(at(path))?;
        inner.dirs.read_listing(ticket, path, &entries);
        Ok(entries)
    }

    fn open(&self, path: &str, flags: i32) -> FsResult<Box<dyn OpenFile>> {
        let inner = &self.inner;
        // A name whose node is known needs no walk. Before the lookup, as before a walk: a
        // deletion of this daemon that ended since has already made the cache forget the name.
        let before = inner.handles.before_walk();
        if let Some(node) = inner.dirs.node(path) {
            if inner.handles.register_after(node.ino, before) {
                return Ok(Box::new(self.file(node.ino, node.kind, path, flags)));
            }
            inner.closed(node.ino);
        }
        let mut vanished = None;
        for _ in 0..100 {
            let before = inner.handles.before_walk();
            let node = inner.read(|sql| tree::resolve_node(sql, inner.root, path)).map_err(at(path))?;
            if inner.handles.register_after(node.ino, before) {
                return Ok(Box::new(self.file(node.ino, node.kind, path, flags)));
            }
            // A deletion of this daemon that did not see the registration is under way or
            // ended since the walk: once it is over, the inode's rows are there for good (the
            // next deletion sees the handle) or gone.
            inner.handles.wait_for_deletions();
            match inner.read(|sql| Tree::node(sql, node.ino)) {
                Ok(Some(_)) => return Ok(Box::new(self.file(node.ino, node.kind, path, flags))),
                Ok(None) => {
                    inner.closed(node.ino);
                    // Replaced meanwhile (the name may lead to another node now): look again,
                    // unless it vanished twice.
                    if vanished == Some(node.ino) {
                        return Err(err(Errno::ENOENT)).map_err(at(path));
                    }
                    vanished = Some(node.ino);
                }
                Err(e) => {
                    inner.closed(node.ino);
                    return Err(e).map_err(at(path));
                }
            }
        }
        Err(FsError::new(Errno::EAGAIN, format!("{path}: replaced faster than it could be opened")))
    }

    fn create(
        &self,
        path: &str,
        mode: u32,
        flags: i32,
        caller: &Caller,
    ) -> FsResult<(Attr, Box<dyn OpenFile>)> {
        let (node, draft) = self.inner.make_node(path, Spec::new(FileKind::File, mode), caller, true)?;
        let file = self.file(node.ino, FileKind::File, path, flags);
        Ok((
            node.attr(),
            Box::new(match draft {
                Some(slot) => file.drafted(slot),
                None => file,
            }),
        ))
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
        Ok(self.inner.make_node(path, Spec { rdev, ..Spec::new(kind, mode) }, caller, false)?.0.attr())
    }

    fn mkdir(&self, path: &str, mode: u32, caller: &Caller) -> FsResult<Attr> {
        Ok(self.inner.make_node(path, Spec::new(FileKind::Dir, mode), caller, false)?.0.attr())
    }

    fn symlink(&self, path: &str, target: &[u8], caller: &Caller) -> FsResult<Attr> {
        let spec = Spec { target: Some(target), ..Spec::new(FileKind::Symlink, 0o777) };
        Ok(self.inner.make_node(path, spec, caller, false)?.0.attr())
    }

    fn link(&self, existing: &str, new_path: &str) -> FsResult<Attr> {
        let inner = &self.inner;
        let new = functions::split_new(new_path).map_err(at(new_path))?;
        if existing.is_empty() {
            // The route's root, a directory: the shared logic answers as for any directory.
            return inner
                .write(Lock::Tree, |sql| tree::link_in(sql, inner.root, existing, new_path).map(|_| ()))
                .and(Err(err(Errno::EPERM)))
                .map_err(at(new_path));
        }
        let src = functions::split(existing).map_err(at(existing))?;
        if let Some(attr) = inner.journal_link(existing, new_path) {
            return Ok(attr);
        }
        let payload = inner.payload(Changed::Name, new_path);
        let src_payload = inner.payload(Changed::Content, existing);
        let call = inner.call_args(&payload);
        let ticket = inner.dirs.changing();
        let linked =
            inner.call(|sql| sql.link_at(&call, (&src.0, src.1), (&new.0, new.1), (inner.ns, &src_payload)));
        match &linked {
            Ok(node) => inner.dirs.changed(
                ticket,
                Change::Made { path: new_path, attr: &node.attr(), now: call.now },
                true,
            ),
            Err(_) => inner.dirs.failed(ticket, new_path),
        }
        Ok(linked.map_err(at(new_path))?.attr())
    }

    fn readlink(&self, path: &str) -> FsResult<Vec<u8>> {
        let inner = &self.inner;
        inner
            .read(|sql| {
                let n = tree::resolve_node(sql, inner.root, path)?;
                if n.kind != FileKind::Symlink {
                    return Err(err(Errno::EINVAL));
                }
                sql.symlink_target(n.ino)
            })
            .map_err(at(path))
    }

    fn unlink(&self, path: &str) -> FsResult<()> {
        self.inner.take_name(Taking::File, path)
    }

    fn rmdir(&self, path: &str) -> FsResult<()> {
        self.inner.take_name(Taking::Dir, path)
    }

    fn rename(&self, from: &str, to: &str, flags: u32) -> FsResult<()> {
        tree::check_rename(from, to, flags).map_err(at(to))?;
        let inner = &self.inner;
        let (old, new) = (functions::split_existing(from), functions::split(to));
        let (old, new) = (old.map_err(at(from))?, new.map_err(at(to))?);
        if inner.journal_rename(from, to, flags) {
            return Ok(());
        }
        let (from_payload, to_payload) =
            (inner.payload(Changed::Name, from), inner.payload(Changed::Name, to));
        let call = inner.call_args(&from_payload);
        // As for an unlink: a replaced node this daemon has handles on keeps its rows.
        let (kept, deletion) = inner.handles.deleting();
        let ticket = inner.dirs.changing();
        let renamed = inner.call(|sql| {
            let names = ((&old.0[..], old.1), (&new.0[..], new.1));
            sql.rename_at(&call, names, flags, (inner.ns, inner.instance), (&kept, &to_payload))
        });
        let exchange = flags & crate::backend::RENAME_EXCHANGE != 0;
        let moved = renamed.as_ref().is_ok_and(|r| r.moved);
        inner.dirs.changed(ticket, Change::Moved { from, to, now: call.now, exchange }, moved);
        inner.keep_orphan(renamed.map_err(at(from))?.orphan, &deletion);
        Ok(())
    }

    fn setattr(&self, path: &str, changes: &SetAttr) -> FsResult<Attr> {
        let inner = &self.inner;
        if let Some(attr) = inner.journal_setattr(path, changes) {
            return Ok(attr);
        }
        let ticket = inner.dirs.changing();
        let done = self.set_attrs(path, changes);
        inner.dirs.changed(ticket, Change::Attrs { path, attr: done.as_ref().ok() }, true);
        done
    }

    fn commit_pending(&self) -> FsResult<()> {
        self.inner.settled().map(drop)
    }

    fn fsyncdir(&self, _path: &str) -> FsResult<()> {
        self.inner.sync_durable(self.inner.root)
    }

    fn fsyncdirs(&self, _dirs: &[&str]) -> FsResult<()> {
        // One synchronous commit waits for every commit before it.
        self.fsyncdir("")
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

    fn getxattr(&self, path: &str, name: &str) -> FsResult<Vec<u8>> {
        let inner = &self.inner;
        inner.read(|sql| tree::getxattr_in(sql, inner.root, path, name)).map_err(at(path))
    }

    fn listxattr(&self, path: &str) -> FsResult<Vec<u8>> {
        let inner = &self.inner;
        inner.read(|sql| tree::listxattr_in(sql, inner.root, path)).map_err(at(path))
    }

    fn setxattr(&self, path: &str, name: &str, value: &[u8], flags: i32) -> FsResult<()> {
        tree::check_xattr(name, value, flags)?;
        let inner = &self.inner;
        let ticket = inner.dirs.changing();
        let done = inner.write(Lock::Rows, |sql| {
            tree::setxattr_in(sql, inner.root, path, (name, value, flags))?;
            inner.announce(sql, Changed::Content, path)
        });
        inner.dirs.changed(ticket, Change::Attrs { path, attr: None }, true);
        done.map_err(at(path))
    }

    fn removexattr(&self, path: &str, name: &str) -> FsResult<()> {
        let inner = &self.inner;
        let ticket = inner.dirs.changing();
        let done = inner.write(Lock::Rows, |sql| {
            tree::removexattr_in(sql, inner.root, path, name)?;
            inner.announce(sql, Changed::Content, path)
        });
        inner.dirs.changed(ticket, Change::Attrs { path, attr: None }, true);
        done.map_err(at(path))
    }

    fn watch(&self, report: Box<dyn Fn(RemoteChange) + Send + Sync>) {
        // The cache forgets what another daemon changed before the kernel is told.
        let dirs = self.inner.dirs.clone();
        dirs.start();
        // Weak: the listener belongs to the backend.
        let inner = Arc::downgrade(&self.inner);
        self.inner.listener.start(
            Box::new(move |change| {
                dirs.remote(&change);
                report(change)
            }),
            Box::new(move |quiet| {
                if let Some(inner) = inner.upgrade() {
                    match quiet {
                        Quiet::Alone => inner.lease(true),
                        Quiet::NotAlone => inner.lease(false),
                        Quiet::Tick => inner.journal_tick(),
                    }
                }
            }),
        );
    }
}
