//! Open files of the postgres route. Every write is one statement, committed before it
//! returns (but see the end of this doc for a daemon alone on its namespace): it locks the
//! inode's row, stores the chunks it touches (spliced into the stored ones on the server where
//! it keeps some of their bytes) and the new size, and announces the change. Nothing is
//! buffered, so every daemon on the namespace reads what was acknowledged; `fsync` waits
//! until the server has it on disk, and so does the `close` of a descriptor that changed the
//! file with the route's `sync_on_close` (without it, a close has nothing to do and the kernel
//! does not ask, unless the descriptor was opened while alone).
//!
//! A file created while this daemon is alone may be a draft instead (see `drafts`): its
//! handle reads, writes and changes attributes in the daemon, and stores it at the first
//! close after a write or an attribute change (else at its last close), at `fsync`, or when
//! it outgrows a draft. A small write to a stored file made while alone may wait in the
//! journal instead (see `held_writes`) until the descriptor's close or `fsync`, or anything
//! else that asks the server.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::dircache::{Change, Node};
use super::drafts::{Slot, State, DRAFT_MAX};
use super::ops::{at, Changed};
use super::store::Sql;
use super::{Inner, Lock};
use crate::backend::chunks;
use crate::backend::tree::{self, Tree};
use crate::backend::{Attr, FileKind, OpenFile, SetAttr};
use crate::error::{Errno, FsError, FsResult};

pub(super) use crate::backend::chunks::MAX_FILE_SIZE;

/// A handle on an inode, valid after rename or unlink (this daemon keeps an unlinked inode's
/// rows until its last handle closes). An inode deleted by another daemon answers ESTALE.
pub(super) struct PgFile {
    inner: Arc<Inner>,
    ino: u64,
    kind: FileKind,
    /// The name it was opened by, for messages and (beside the inode) the change
    /// notifications of its writes.
    path: String,
    /// Changed through this handle since the server last synced its disk for it.
    changed: AtomicBool,
    /// The draft this handle made, while the file is one (or was).
    draft: Option<Arc<Slot>>,
    /// Opened while this daemon was alone: its closes are reported (see
    /// [`OpenFile::needs_flush`]), so its small writes may be held back (`held_writes`).
    may_hold: bool,
    /// Writes through this handle are held back in the journal; its close sends them.
    held: AtomicBool,
    /// Opened with `O_APPEND`: every write lands at the file's end as stored when it is
    /// made (the end the kernel computed is its cached size, which another daemon's appends
    /// may have passed); not the kernel's write-back of cached pages ([`OpenFile::write_back`]).
    append: bool,
}

fn stale() -> FsError {
    FsError::new(Errno::ESTALE, "the file was deleted by another daemon")
}

impl PgFile {
    /// A handle on `ino`, already registered with [`Inner::opened`], opened with `flags`.
    pub fn new(inner: Arc<Inner>, ino: u64, kind: FileKind, path: &str, flags: i32) -> PgFile {
        let may_hold = inner.drafts.allowed();
        let (changed, held) = (AtomicBool::new(false), AtomicBool::new(false));
        let append = flags & libc::O_APPEND != 0;
        PgFile { inner, ino, kind, path: path.to_string(), changed, draft: None, may_hold, held, append }
    }

    /// This handle, on the draft in `slot`.
    pub fn drafted(mut self, slot: Arc<Slot>) -> PgFile {
        self.draft = Some(slot);
        self
    }

    /// Stores the draft this handle made, if it is one still (with `only_changed`, if it
    /// was also written or changed); the error of one that was lost.
    fn store_draft(&self, only_changed: bool) -> FsResult<()> {
        let Some(slot) = &self.draft else {
            return Ok(());
        };
        let mut state = slot.lock();
        match &*state {
            State::Draft(d) if only_changed && !d.changed => Ok(()),
            _ => self.stored(&mut state),
        }
    }

    /// Stores the draft in the locked `state`, if it is one still.
    fn stored(&self, state: &mut State) -> FsResult<()> {
        if let State::Draft(_) = state {
            self.inner.store_draft(state)?;
            self.changed.store(true, Ordering::Release);
        }
        match state {
            State::Lost(e) => Err(e.clone()),
            _ => Ok(()),
        }
    }

    fn check_data(&self) -> FsResult<()> {
        match self.kind {
            FileKind::File => Ok(()),
            FileKind::Dir => Err(FsError::errno(Errno::EISDIR)),
            _ => Err(FsError::errno(Errno::EINVAL)),
        }
    }

    /// An fallocate: sets the size to `end` if that grows the file, and the mtime and ctime
    /// (as a local filesystem does even when the size stays).
    fn allocate(&self, end: Option<u64>) -> FsResult<()> {
        let inner = &self.inner;
        self.changed.store(true, Ordering::Release);
        inner.write(Lock::Rows, |sql| {
            let n = sql.lock_node(self.ino)?.ok_or_else(stale)?;
            sql.set_data_attrs(self.ino, end.map_or(n.size, |end| end.max(n.size)), tree::now_ns())?;
            inner.announce(sql, Changed::FileContent(self.ino), &self.path)
        })
    }
}

impl OpenFile for PgFile {
    fn read(&self, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        self.check_data()?;
        if size == 0 {
            return Ok(Vec::new());
        }
        if let Some(slot) = &self.draft {
            if let State::Draft(d) = &*slot.lock() {
                return Ok(d.read(offset, size));
            }
        }
        let end = offset.saturating_add(u64::from(size));
        let (first, last) = chunks::chunk_range(offset, end);
        // Only its own draft matters to a read by inode: the journal and other drafts wait.
        let read = |sql: &Sql<'_>| sql.read_chunks(self.ino, first, last);
        let found = match self.inner.drafts.holds(self.ino) {
            true => self.inner.read(read),
            false => self.inner.read_now(read),
        };
        let (file_size, found) = found?.ok_or_else(stale)?;
        if offset >= file_size {
            return Ok(Vec::new());
        }
        let mut out = vec![0u8; (end.min(file_size) - offset) as usize];
        for (idx, data) in &found {
            chunks::copy_chunk(*idx, data, offset, &mut out);
        }
        Ok(out)
    }

    fn write(&self, offset: u64, data: &[u8]) -> FsResult<u32> {
        self.write_to(offset, data, self.append)
    }

    /// At `offset` even through an `O_APPEND` handle: the pages are the file's at their place.
    fn write_back(&self, offset: u64, data: &[u8]) -> FsResult<u32> {
        self.write_to(offset, data, false)
    }

    fn flush(&self) -> FsResult<()> {
        // A close of a descriptor that wrote nothing may not be the last one (a shell's
        // `> f` opens, then duplicates onto its output and closes the first one): the file's
        // creation waits for the last close, or anything else that stores drafts.
        self.store_draft(true)?;
        if self.held.swap(false, Ordering::AcqRel) {
            self.inner.flush_journal().inspect_err(|_| self.held.store(true, Ordering::Release))?;
        }
        if !self.inner.settings.sync_on_close {
            return Ok(());
        }
        match self.changed.swap(false, Ordering::AcqRel) {
            true => {
                self.inner.sync_durable(self.ino).inspect_err(|_| self.changed.store(true, Ordering::Release))
            }
            false => Ok(()),
        }
    }

    fn release(&self) -> FsResult<()> {
        self.store_draft(false)?;
        self.flush()
    }

    fn needs_flush(&self) -> bool {
        self.draft.is_some() || self.may_hold || self.inner.settings.sync_on_close
    }

    fn fsync(&self, _datasync: bool) -> FsResult<()> {
        self.store_draft(false)?;
        // Also for a handle that wrote nothing: its file's creation may not be on disk yet.
        // (The sync sends the journal first, with any writes held.)
        self.changed.store(false, Ordering::Release);
        let held = self.held.swap(false, Ordering::AcqRel);
        self.inner.sync_durable(self.ino).inspect_err(|_| {
            self.changed.store(true, Ordering::Release);
            self.held.fetch_or(held, Ordering::AcqRel);
        })
    }

    fn fallocate(&self, offset: u64, length: u64, mode: i32) -> FsResult<()> {
        match self.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(FsError::errno(Errno::EISDIR)),
            _ => return Err(FsError::errno(Errno::ENODEV)),
        }
        self.store_draft(false)?;
        // Space is not reserved (the server has no such request); the size and times are what
        // callers see.
        let end = chunks::fallocate_end(offset, length, mode)?;
        self.changing_attrs(|| self.allocate(end))
    }

    fn kind_and_ino(&self) -> FsResult<(FileKind, u64)> {
        Ok((self.kind, self.ino))
    }

    fn getattr(&self) -> FsResult<Attr> {
        if let Some(slot) = &self.draft {
            if let State::Draft(d) = &*slot.lock() {
                return Ok(d.node.attr());
            }
        }
        let dirs = &self.inner.dirs;
        if let Some(attr) = dirs.attr_of(self.ino) {
            return Ok(attr);
        }
        let ticket = dirs.reading();
        let attr = self.inner.read(|sql| sql.node(self.ino))?.ok_or_else(stale)?.attr();
        dirs.read_node_attr(ticket, &attr);
        Ok(attr)
    }

    fn setattr(&self, changes: &SetAttr) -> FsResult<Attr> {
        if let Some(slot) = &self.draft {
            let mut state = slot.lock();
            if let State::Draft(d) = &mut *state {
                let node = tree::apply_setattr(d.node.clone(), changes, MAX_FILE_SIZE)?;
                let drafts = &self.inner.drafts;
                if node.size <= DRAFT_MAX && drafts.reserve(d.growth(node.size)) {
                    drafts.release(d.data.len().saturating_sub(node.size as usize));
                    d.data.resize(node.size as usize, 0);
                    let attr = node.attr();
                    d.node = node;
                    return self.learning_attrs(|| Ok(attr));
                }
                self.stored(&mut state)?;
            }
        }
        self.learning_attrs(|| self.set_attrs(changes))
    }

    fn reopen(&self, flags: i32) -> FsResult<Box<dyn OpenFile>> {
        self.store_draft(false)?;
        self.inner.opened(self.ino);
        Ok(Box::new(PgFile::new(self.inner.clone(), self.ino, self.kind, &self.path, flags)))
    }
}

impl PgFile {
    /// Writes `data` at `offset`, or (`append`) at the file's end as it stands when the write
    /// is made: a draft's or a file with held writes in this daemon, where it knows the end
    /// (it is alone on the namespace), else on the server, in the statement that writes.
    fn write_to(&self, offset: u64, data: &[u8], append: bool) -> FsResult<u32> {
        self.check_data()?;
        if data.is_empty() {
            return Ok(0);
        }
        if !append {
            chunks::end_of(offset, data.len() as u64)?;
        }
        if let Some(slot) = &self.draft {
            let mut state = slot.lock();
            if let State::Draft(d) = &mut *state {
                let offset = if append { d.node.size } else { offset };
                let end = chunks::end_of(offset, data.len() as u64)?;
                let drafts = &self.inner.drafts;
                if end <= DRAFT_MAX && drafts.reserve(d.growth(end)) {
                    d.write(offset, data);
                    let attr = d.node.attr();
                    return self.learning_attrs(|| Ok(attr)).map(|_| data.len() as u32);
                }
                self.stored(&mut state)?;
            }
        }
        let at = if append { None } else { Some(offset) };
        if self.may_hold && self.inner.journal_write(self.ino, &self.path, at, data).is_some() {
            self.changed.store(true, Ordering::Release);
            self.held.store(true, Ordering::Release);
            return Ok(data.len() as u32);
        }
        let written = match at {
            Some(offset) => self.learning_attrs(|| self.write_at(offset, data)),
            None => self.learning_attrs(|| self.append_at_end(data)),
        };
        written.map(|_| data.len() as u32)
    }

    /// `setattr`, on the server.
    fn set_attrs(&self, changes: &SetAttr) -> FsResult<Attr> {
        let inner = &self.inner;
        self.changed.store(true, Ordering::Release);
        if changes.size.is_none() && !changes.is_empty() {
            let payload = inner.payload(Changed::FileContent(self.ino), &self.path);
            let node = inner.read(|sql| sql.set_attrs_at(self.ino, "", changes, (&inner.channel, &payload)));
            return match node {
                Err(e) if e.is(Errno::ENOENT) => Err(stale()),
                node => Ok(node?.attr()),
            };
        }
        inner.write(Lock::Rows, |sql| {
            let node = sql.lock_node(self.ino)?.ok_or_else(stale)?;
            let node = tree::setattr_in(sql, node, changes, MAX_FILE_SIZE)?;
            inner.announce(sql, Changed::FileContent(self.ino), &self.path)?;
            Ok(node.attr())
        })
    }

    /// [`OpenFile::write`] of `data` at `offset` on the server, in one call that splices the
    /// bytes where the chunks are stored (a new file's chunks, whole chunks and partly kept
    /// ones alike); the file's attributes after it.
    fn write_at(&self, offset: u64, data: &[u8]) -> FsResult<Attr> {
        let inner = &self.inner;
        let end = chunks::end_of(offset, data.len() as u64)?;
        let spans: Vec<chunks::Span> = chunks::spans(offset, data.len() as u64).collect();
        let payload = inner.payload(Changed::FileContent(self.ino), &self.path);
        let node = inner
            .call(|sql| {
                let done = sql.write_spans(
                    self.ino,
                    (&spans, data),
                    (end, tree::now_ns()),
                    (&inner.channel, &payload),
                );
                done?.ok_or_else(stale)
            })
            .map_err(at(&self.path))?;
        self.changed.store(true, Ordering::Release);
        Ok(node.attr())
    }

    /// An `O_APPEND` write of `data` on the server: one call that locks the inode's row,
    /// writes at the size it finds there and grows it (see `splice::APPEND_MIGRATION`), so
    /// that appends of several daemons never overwrite each other; the file's attributes
    /// after it.
    fn append_at_end(&self, data: &[u8]) -> FsResult<Attr> {
        let inner = &self.inner;
        let payload = inner.payload(Changed::FileContent(self.ino), &self.path);
        let node = inner
            .call(|sql| {
                let done = sql.append_data(self.ino, data, tree::now_ns(), (&inner.channel, &payload));
                done?.ok_or_else(stale)
            })
            .map_err(at(&self.path))?
            .ok_or_else(|| FsError::errno(Errno::EFBIG))?;
        self.changed.store(true, Ordering::Release);
        Ok(node.attr())
    }

    /// Runs `change` of the node's content or attributes, which answers the node's attributes
    /// after it: the daemon's cache learns them, or forgets what it knew if the change failed.
    fn learning_attrs(&self, change: impl FnOnce() -> FsResult<Attr>) -> FsResult<Attr> {
        let dirs = &self.inner.dirs;
        let ticket = dirs.changing();
        let done = change();
        let learned = match &done {
            Ok(attr) => Change::NodeAttrs { attr },
            Err(_) => Change::Node(self.node()),
        };
        dirs.changed(ticket, learned, true);
        done
    }

    /// Runs `change` of the node's content or attributes, and makes the daemon's cache forget
    /// the attributes it knew of the node.
    fn changing_attrs<T>(&self, change: impl FnOnce() -> FsResult<T>) -> FsResult<T> {
        let ticket = self.inner.dirs.changing();
        let done = change();
        self.inner.dirs.changed(ticket, Change::Node(self.node()), true);
        done
    }

    /// The node this handle is on, as the daemon's cache names it.
    fn node(&self) -> Node {
        Node { ino: self.ino, kind: self.kind }
    }
}

impl Drop for PgFile {
    fn drop(&mut self) {
        if let Some(slot) = &self.draft {
            // Stored at the last close unless that failed: a last try, then it is dropped.
            let mut state = slot.lock();
            if let Err(e) = self.inner.store_draft(&mut state) {
                self.inner.drop_draft(&mut state, e);
            }
        }
        // Held writes go with the last close too (they stay in the journal if it fails).
        if self.held.load(Ordering::Acquire) {
            if let Err(e) = self.inner.flush_journal() {
                tracing::warn!("postgres: sending the writes to {} held while alone: {e}; they go with the next operation", crate::display::escape(&self.path));
            }
        }
        self.inner.closed(self.ino);
    }
}
