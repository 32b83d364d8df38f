//! Open files of the `langgraph` layout. A value is one jsonb document, so a write cannot
//! change part of it in place: the writes of an open file go to a buffer in memory, shared
//! by this daemon's handles on the file, and `flush` (every `close`), `fsync` and `release`
//! commit the whole content as one value. Until then others read the committed value, and a
//! reader on this daemon reads the buffer. A truncation commits at once (with the buffer).
//!
//! Two writers on one file (two daemons, or LangGraph and a daemon) each commit whole values:
//! the last commit wins, and no value is ever a mix of both.

use std::sync::Arc;

use parking_lot::Mutex;

use super::{rows, Inner};
use crate::backend::chunks;
use crate::backend::tree::{self, Node};
use crate::backend::{Attr, FileKind, OpenFile, SetAttr};
use crate::error::{Errno, FsError, FsResult};

/// What this daemon's handles on one file share.
pub(super) struct Shared {
    pub state: Mutex<State>,
}

pub(super) struct State {
    /// The file's name now (renames through this daemon move it).
    pub path: String,
    /// The content written and not yet committed; `None` when the store has it all.
    pub data: Option<Vec<u8>>,
    pub handles: usize,
    /// Its name went (through this daemon): buffered writes are dropped, not committed.
    pub unlinked: bool,
}

impl Shared {
    pub fn new(path: &str) -> Shared {
        Shared {
            state: Mutex::new(State { path: path.to_string(), data: None, handles: 0, unlinked: false }),
        }
    }
}

fn stale() -> FsError {
    FsError::new(Errno::ESTALE, "the file was deleted by another writer")
}

pub(super) struct LgFile {
    inner: Arc<Inner>,
    shared: Arc<Shared>,
    kind: FileKind,
}

impl LgFile {
    /// A handle on `shared`, already counted by [`Inner::opened`].
    pub fn new(inner: Arc<Inner>, shared: Arc<Shared>, kind: FileKind) -> LgFile {
        LgFile { inner, shared, kind }
    }

    fn check_data(&self) -> FsResult<()> {
        match self.kind {
            FileKind::File => Ok(()),
            FileKind::Dir => Err(FsError::errno(Errno::EISDIR)),
            _ => Err(FsError::errno(Errno::EINVAL)),
        }
    }
}

/// The buffer of `state`, loaded from the store on first use.
fn buffer<'a>(inner: &Inner, state: &'a mut State) -> FsResult<&'a mut Vec<u8>> {
    if state.data.is_none() {
        let loaded = match state.unlinked {
            true => Vec::new(),
            false => inner.read(|sql| rows::content(sql, &inner.prefix, &state.path))?.ok_or_else(stale)?,
        };
        state.data = Some(loaded);
    }
    Ok(state.data.as_mut().expect("loaded above"))
}

/// Commits the buffer of `state` as the file's value, if it has one (and the file a name).
/// The caller holds [`Inner::names`] shared.
pub(super) fn commit(inner: &Inner, state: &mut State) -> FsResult<()> {
    if state.unlinked {
        return Ok(()); // nothing to commit to; the buffer stays readable for the handles
    }
    let Some(data) = &state.data else {
        return Ok(());
    };
    inner.write_durable(|sql| rows::put(sql, &inner.prefix, &state.path, data, tree::now_ns()))?;
    state.data = None;
    Ok(())
}

/// Sets the size of the file of `state` to `size` and commits it.
pub(super) fn resize(inner: &Inner, state: &mut State, size: u64) -> FsResult<()> {
    if size > rows::MAX_FILE_SIZE {
        return Err(FsError::errno(Errno::EFBIG));
    }
    buffer(inner, state)?.resize(size as usize, 0);
    commit(inner, state)
}

/// `n` as this daemon shows it while `state` holds uncommitted writes.
pub(super) fn overlay(state: &State, mut n: Node) -> Node {
    if let Some(data) = &state.data {
        n.size = data.len() as u64;
    }
    n
}

impl OpenFile for LgFile {
    fn read(&self, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        self.check_data()?;
        let state = self.shared.state.lock();
        if let Some(data) = &state.data {
            let start = (offset as usize).min(data.len());
            let end = start.saturating_add(size as usize).min(data.len());
            return Ok(data[start..end].to_vec());
        }
        if state.unlinked {
            return Ok(Vec::new());
        }
        let inner = &self.inner;
        let (data, _) = inner
            .read(|sql| rows::read_range(sql, &inner.prefix, &state.path, offset, size))?
            .ok_or_else(stale)?;
        Ok(data)
    }

    fn write(&self, offset: u64, data: &[u8]) -> FsResult<u32> {
        self.check_data()?;
        let end = chunks::end_of(offset, data.len() as u64)?;
        if end > rows::MAX_FILE_SIZE {
            return Err(FsError::errno(Errno::EFBIG));
        }
        let mut state = self.shared.state.lock();
        let buf = buffer(&self.inner, &mut state)?;
        if buf.len() < end as usize {
            buf.resize(end as usize, 0);
        }
        buf[offset as usize..end as usize].copy_from_slice(data);
        Ok(data.len() as u32)
    }

    fn flush(&self) -> FsResult<()> {
        let _names = self.inner.names.read();
        commit(&self.inner, &mut self.shared.state.lock())
    }

    fn fsync(&self, _datasync: bool) -> FsResult<()> {
        self.flush()
    }

    fn fallocate(&self, offset: u64, length: u64, mode: i32) -> FsResult<()> {
        self.check_data()?;
        let Some(end) = chunks::fallocate_end(offset, length, mode)? else {
            return Ok(());
        };
        let _names = self.inner.names.read();
        let mut state = self.shared.state.lock();
        let len = buffer(&self.inner, &mut state)?.len() as u64;
        match end > len {
            true => resize(&self.inner, &mut state, end),
            false => Ok(()),
        }
    }

    fn getattr(&self) -> FsResult<Attr> {
        let state = self.shared.state.lock();
        let inner = &self.inner;
        if state.unlinked {
            let mut n = unlinked_node();
            n.size = state.data.as_ref().map_or(0, |d| d.len() as u64);
            return Ok(n.attr());
        }
        let n = inner.read(|sql| rows::must_stat(sql, &inner.prefix, &state.path)).map_err(|_| stale())?;
        Ok(overlay(&state, n).attr())
    }

    fn setattr(&self, changes: &SetAttr) -> FsResult<Attr> {
        let (path, unlinked) = {
            let state = self.shared.state.lock();
            (state.path.clone(), state.unlinked)
        };
        if !unlinked {
            return super::ops::setattr_path(&self.inner, &path, changes);
        }
        // Only the buffer is left to change.
        if let Some(size) = changes.size {
            let _names = self.inner.names.read();
            resize(&self.inner, &mut self.shared.state.lock(), size)?;
        }
        self.getattr()
    }

    fn reopen(&self, _flags: i32) -> FsResult<Box<dyn OpenFile>> {
        self.shared.state.lock().handles += 1;
        Ok(Box::new(LgFile::new(self.inner.clone(), self.shared.clone(), self.kind)))
    }
}

/// The attributes of an open file whose name is gone: nothing of it is stored any more.
fn unlinked_node() -> Node {
    let now = tree::now_ns();
    Node {
        ino: 2,
        kind: FileKind::File,
        perm: 0o644,
        uid: 0,
        gid: 0,
        rdev: 0,
        size: 0,
        nlink: 0,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
    }
}

impl Drop for LgFile {
    fn drop(&mut self) {
        self.inner.closed(&self.shared);
    }
}
