//! File data: the per-inode write buffer shared by all handles of an inode, chunked reads and
//! writes, truncation, and the [`OpenFile`] implementation.
//!
//! Content is stored in rows of up to `CHUNK_SIZE` bytes, `chunks(id = ino << CHUNK_BITS | idx,
//! data)`. A chunk may be shorter than `CHUNK_SIZE` or missing altogether: bytes below the file
//! size that no chunk holds read as zeros (sparse files). Invariant: no chunk holds bytes at or
//! past the file size, so growing a file never exposes old data.
//!
//! A small write below the file size is kept as a patch and written into the stored chunk in
//! place at commit (SQLite's incremental blob I/O), so an overwrite of a few bytes of a large
//! file neither reads nor rewrites the rest of its chunk; other writes buffer the chunk whole.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rusqlite::{params, Connection, DatabaseName, OptionalExtension};

use super::held::Commit;
use super::schema::{CHUNK_BITS, PAGE_SIZE};
use super::store::{self, chunk_key, Ctx, Node};
use super::{Inner, StateRef};
use crate::backend::chunks;
use crate::backend::tree::{self, Tree};
use crate::backend::{Attr, FileKind, OpenFile, SetAttr, TimeSet};
use crate::error::{Errno, FsError, FsResult};

pub(super) use crate::backend::chunks::CHUNK_SIZE;
/// Buffered bytes of one inode past which the next write commits them first.
const INODE_FLUSH_BYTES: usize = 8 << 20;
/// Buffered bytes of all inodes past which a write commits its own inode's buffer first.
const TOTAL_FLUSH_BYTES: usize = 256 << 20;
/// What the patches of one chunk may cost (see [`patch_cost`]) before the chunk is buffered
/// whole instead: then reading it once costs less than writing that much into it piece by
/// piece, and the buffer never holds more for a chunk than the chunk itself.
const PATCH_LIMIT: usize = CHUNK_SIZE as usize / 2;

/// What a patch of `len` bytes costs the buffer: its bytes and its bookkeeping, so that many
/// tiny writes count for the memory they take.
pub(super) const fn patch_cost(len: usize) -> usize {
    len + 64
}

use crate::backend::chunks::MAX_FILE_SIZE;

/// What is known and buffered about one inode while it is open or in use. Guarded by a mutex;
/// every change of a file's size or content happens under it.
#[derive(Default)]
pub(super) struct InodeState {
    /// Open handles ([`SqliteFile`]s) of the inode.
    pub handles: usize,
    /// The logical size, once loaded. While the state exists it is authoritative: every size
    /// change goes through the state.
    size: Option<u64>,
    /// Chunks written since the last commit.
    dirty: BTreeMap<u64, DirtyChunk>,
    dirty_bytes: usize,
    /// Size and data times (and any `dirty` chunk) wait to be committed.
    pending: bool,
    /// mtime (and ctime) of the buffered writes.
    data_time: i64,
    /// Attribute changes made while the file is open, committed with its data.
    attrs: Option<PendingAttrs>,
    /// The last chunk read from the database, for runs of small reads.
    cache: Option<(u64, Vec<u8>)>,
}

impl InodeState {
    /// The state of a file just created and opened.
    pub fn new_open() -> InodeState {
        InodeState { handles: 1, size: Some(0), ..InodeState::default() }
    }

    pub fn is_idle(&self) -> bool {
        self.handles == 0 && !self.has_pending()
    }

    /// Something waits to be committed: buffered data, or attribute changes.
    pub(super) fn has_pending(&self) -> bool {
        self.pending || self.attrs.is_some()
    }

    /// When a change made with this file's state must be committed: with anything pending
    /// (which goes in with it), before it returns, storing the buffered bytes; otherwise soon.
    pub(super) fn commit(&self) -> Commit {
        if self.has_pending() {
            Commit::Now { content: self.dirty_bytes as u64 }
        } else {
            Commit::Soon
        }
    }

    fn clear_pending(&mut self, total: &AtomicUsize) {
        total.fetch_sub(self.dirty_bytes, Ordering::Relaxed);
        self.dirty.clear();
        self.dirty_bytes = 0;
        self.pending = false;
        self.attrs = None;
    }

    /// After a committed `setattr_in`: the buffer is in the database, the size is the node's.
    pub fn setattr_done(&mut self, total: &AtomicUsize, node: &Node, changes: &SetAttr) {
        self.clear_pending(total);
        if changes.size.is_some() {
            self.cache = None;
        }
        self.size = Some(node.size);
    }

    /// Forgets everything: the inode's rows are gone.
    pub fn discard(&mut self, total: &AtomicUsize) {
        self.clear_pending(total);
        self.size = None;
        self.cache = None;
    }

    /// `n` with the buffered size, times and attribute changes applied.
    fn overlay(&self, mut n: Node) -> Attr {
        if self.pending {
            n.size = self.size.unwrap_or(n.size);
            n.mtime = self.data_time;
            n.ctime = n.ctime.max(self.data_time);
        }
        if let Some(a) = &self.attrs {
            a.apply(&mut n);
        }
        n.attr()
    }
}

/// A chunk written since the last commit.
enum DirtyChunk {
    /// Its whole current content.
    Whole(Vec<u8>),
    /// Writes below the file size into bytes the stored chunk holds (or that read as zeros), in
    /// the order they came, with `bytes` their total [`patch_cost`]: read over the stored
    /// chunk, and written into it at commit.
    Patches { writes: Vec<(usize, Vec<u8>)>, bytes: usize },
}

impl DirtyChunk {
    /// Applies the patches in order onto the file range `out` starts at `offset` of; the chunk
    /// is `idx`.
    fn apply_patches(&self, idx: u64, offset: u64, out: &mut [u8]) {
        if let DirtyChunk::Patches { writes, .. } = self {
            for (within, bytes) in writes {
                chunks::copy_at(idx * CHUNK_SIZE + *within as u64, bytes, offset, out);
            }
        }
    }
}

/// Changes of mode, owner and times made through an open file's inode, not yet committed.
/// Applied after the buffered data (whose mtime an explicit one overrides; a later write
/// drops the explicit mtime again, as it would set the file's).
#[derive(Clone, Copy, Debug, Default)]
struct PendingAttrs {
    perm: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    atime: Option<i64>,
    mtime: Option<i64>,
    ctime: i64,
}

impl PendingAttrs {
    fn merge(&mut self, changes: &SetAttr, now: i64) {
        let resolve = |t: TimeSet| match t {
            TimeSet::Now => now,
            TimeSet::At(t) => store::time_to_ns(t),
        };
        self.perm = changes.mode.map(|m| m & 0o7777).or(self.perm);
        self.uid = changes.uid.or(self.uid);
        self.gid = changes.gid.or(self.gid);
        self.atime = changes.atime.map(resolve).or(self.atime);
        self.mtime = changes.mtime.map(resolve).or(self.mtime);
        self.ctime = self.ctime.max(now);
    }

    fn apply(&self, n: &mut Node) {
        n.perm = self.perm.unwrap_or(n.perm);
        n.uid = self.uid.unwrap_or(n.uid);
        n.gid = self.gid.unwrap_or(n.gid);
        n.atime = self.atime.unwrap_or(n.atime);
        n.mtime = self.mtime.unwrap_or(n.mtime);
        n.ctime = n.ctime.max(self.ctime);
    }
}

impl Inner {
    fn size_locked(&self, ino: u64, st: &mut InodeState) -> FsResult<u64> {
        if let Some(size) = st.size {
            return Ok(size);
        }
        let size = self.with_reader(|c| c.must_node(ino))?.size;
        st.size = Some(size);
        Ok(size)
    }

    /// Calls `f` with each stored chunk of `ino` from `first` to `last`, borrowing the data
    /// from SQLite rather than copying it out.
    fn visit_chunks(&self, ino: u64, first: u64, last: u64, mut f: impl FnMut(u64, &[u8])) -> FsResult<()> {
        self.with_reader(|c| {
            let mut stmt = c.prepare_cached("SELECT id, data FROM chunks WHERE id BETWEEN ?1 AND ?2")?;
            let mut rows = stmt.query([chunk_key(ino, first), chunk_key(ino, last)])?;
            let index_mask = (1u64 << CHUNK_BITS) - 1;
            while let Some(row) = rows.next()? {
                let idx = row.get::<_, i64>(0)? as u64 & index_mask;
                f(idx, row.get_ref(1)?.as_blob().map_err(rusqlite::Error::from)?);
            }
            Ok(())
        })
    }

    /// The stored content of one chunk, trimmed to `valid` bytes (what lies below the size).
    fn stored_chunk(&self, ino: u64, idx: u64, valid: usize, st: &InodeState) -> FsResult<Vec<u8>> {
        let mut data = match &st.cache {
            Some((i, d)) if *i == idx => d.clone(),
            _ => {
                let mut data = Vec::new();
                self.visit_chunks(ino, idx, idx, |_, d| data = d[..d.len().min(valid)].to_vec())?;
                data
            }
        };
        data.truncate(valid);
        Ok(data)
    }

    /// The whole current content of chunk `idx`: the stored chunk with `patches` applied.
    fn patched_chunk(
        &self,
        ino: u64,
        idx: u64,
        size: u64,
        st: &InodeState,
        patches: &[(usize, Vec<u8>)],
    ) -> FsResult<Vec<u8>> {
        let mut data = self.stored_chunk(ino, idx, chunks::valid_bytes(idx, size), st)?;
        for (within, bytes) in patches {
            chunks::splice(&mut data, *within, bytes);
        }
        Ok(data)
    }

    pub(super) fn attr_locked(&self, ino: u64, st: &InodeState) -> FsResult<Attr> {
        let n = self.with_reader(|c| c.must_node(ino))?;
        Ok(st.overlay(n))
    }

    /// The attributes of a node just read, with buffered writes applied if it has any.
    pub(super) fn attr_of(&self, n: Node) -> FsResult<Attr> {
        match self.state_get(n.ino) {
            // Re-read under the lock: a commit may have happened since `n` was read.
            Some(guard) => self.attr_locked(n.ino, &guard.lock()),
            None => Ok(n.attr()),
        }
    }

    fn read_locked(&self, ino: u64, st: &mut InodeState, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let file_size = self.size_locked(ino, st)?;
        if offset >= file_size || size == 0 {
            return Ok(Vec::new());
        }
        let end = file_size.min(offset.saturating_add(size as u64));
        let mut out = vec![0u8; (end - offset) as usize];
        let (first, last) = (offset / CHUNK_SIZE, (end - 1) / CHUNK_SIZE);
        let mut needed = Vec::new();
        for idx in first..=last {
            match (st.dirty.get(&idx), &st.cache) {
                (Some(DirtyChunk::Whole(d)), _) => chunks::copy_chunk(idx, d, offset, &mut out),
                // The stored chunk, then its patches (below).
                (Some(DirtyChunk::Patches { .. }), _) => needed.push(idx),
                (None, Some((i, d))) if *i == idx => chunks::copy_chunk(idx, d, offset, &mut out),
                _ => needed.push(idx),
            }
        }
        if let (Some(&a), Some(&b)) = (needed.first(), needed.last()) {
            // A read ending inside a chunk is likely followed by one starting there: keep it.
            let keep_last = end % CHUNK_SIZE != 0;
            let mut kept = None;
            self.visit_chunks(ino, a, b, |idx, data| {
                if needed.contains(&idx) {
                    chunks::copy_chunk(idx, data, offset, &mut out);
                    // Not a patched chunk: its stored content is about to change at commit.
                    if keep_last && idx == last && !st.dirty.contains_key(&idx) {
                        kept = Some((idx, data.to_vec()));
                    }
                }
            })?;
            for idx in needed {
                if let Some(chunk) = st.dirty.get(&idx) {
                    chunk.apply_patches(idx, offset, &mut out);
                }
            }
            if kept.is_some() {
                st.cache = kept;
            }
        }
        Ok(out)
    }

    fn write_locked(&self, ino: u64, st: &mut InodeState, offset: u64, data: &[u8]) -> FsResult<u32> {
        if data.is_empty() {
            return Ok(0);
        }
        let end = chunks::end_of(offset, data.len() as u64)?;
        // A full buffer is committed before this write joins it, so that a failing commit
        // (ENOSPC) fails this write rather than one the caller was told had succeeded.
        if st.dirty_bytes >= INODE_FLUSH_BYTES
            || self.dirty_total.load(Ordering::Relaxed) >= TOTAL_FLUSH_BYTES
        {
            self.flush_locked(ino, st)?;
        }
        let size = self.size_locked(ino, st)?;
        // At most this much joins the buffer (whole chunks, when a partly written one must be
        // read in first).
        let touched = (end - 1) / CHUNK_SIZE - offset / CHUNK_SIZE + 1;
        let at_most = (data.len() as u64).max(touched * CHUNK_SIZE);
        let reusable = || {
            let pages = self.read_with(false, |ctx| {
                Ok(ctx.conn.pragma_query_value(None, "freelist_count", |r| r.get::<_, i64>(0))?)
            });
            pages.map_or(0, |p| p.max(0) as u64 * PAGE_SIZE as u64)
        };
        let buffered = self.dirty_total.load(Ordering::Relaxed) as u64 + at_most;
        self.space.admit(buffered, at_most, reusable, || self.make_room())?;
        let mut grown = 0usize;
        for span in chunks::spans(offset, data.len() as u64) {
            let src = &data[span.from..][..span.len];
            let end_within = span.within + span.len;
            if !st.dirty.contains_key(&span.idx) {
                // Bytes of this chunk below the current size must be kept unless all of them
                // are overwritten. A small write below the size becomes a patch; any other
                // write that keeps some of them reads the stored chunk.
                let valid = chunks::valid_bytes(span.idx, size);
                let first = match chunks::needs_base(&span, size) {
                    false => DirtyChunk::Whole(Vec::new()),
                    true if end_within <= valid && patch_cost(span.len) <= PATCH_LIMIT => {
                        DirtyChunk::Patches { writes: Vec::new(), bytes: 0 }
                    }
                    true => {
                        let base = self.stored_chunk(ino, span.idx, valid, st)?;
                        grown += base.len();
                        DirtyChunk::Whole(base)
                    }
                };
                st.dirty.insert(span.idx, first);
            }
            let chunk = st.dirty.get_mut(&span.idx).expect("inserted above");
            if let DirtyChunk::Patches { writes, bytes } = chunk {
                let cost = patch_cost(span.len);
                if end_within <= chunks::valid_bytes(span.idx, size) && *bytes + cost <= PATCH_LIMIT {
                    writes.push((span.within, src.to_vec()));
                    *bytes += cost;
                    grown += cost;
                    continue;
                }
                // Too many patches, or a write past the size: buffer the chunk whole.
                let (patches, patched) = (std::mem::take(writes), *bytes);
                let whole = self.patched_chunk(ino, span.idx, size, st, &patches)?;
                st.dirty_bytes -= patched;
                self.dirty_total.fetch_sub(patched, Ordering::Relaxed);
                grown += whole.len();
                st.dirty.insert(span.idx, DirtyChunk::Whole(whole));
            }
            let Some(DirtyChunk::Whole(buf)) = st.dirty.get_mut(&span.idx) else {
                unreachable!("a chunk is patched or whole, and patches were made whole above")
            };
            grown += chunks::splice(buf, span.within, src);
        }
        if st.cache.as_ref().is_some_and(|c| (offset / CHUNK_SIZE..=(end - 1) / CHUNK_SIZE).contains(&c.0)) {
            st.cache = None;
        }
        st.size = Some(size.max(end));
        st.pending = true;
        st.data_time = store::now_ns();
        if let Some(a) = st.attrs.as_mut() {
            a.mtime = None;
        }
        st.dirty_bytes += grown;
        self.dirty_total.fetch_add(grown, Ordering::Relaxed);
        Ok(data.len() as u32)
    }

    /// Puts the buffered chunks, size and data times of `ino`, then its pending attribute
    /// changes, into the transaction.
    fn write_pending(&self, tx: &Connection, ino: u64, st: &InodeState) -> FsResult<()> {
        if st.pending {
            self.write_data(tx, ino, st)?;
        }
        if let Some(a) = &st.attrs {
            let mut n = store::must_node(tx, ino)?;
            a.apply(&mut n);
            store::update_attrs(tx, &n)?;
        }
        Ok(())
    }

    /// Puts the buffered chunks, size and data times of `ino` into the transaction.
    fn write_data(&self, tx: &Connection, ino: u64, st: &InodeState) -> FsResult<()> {
        // An upsert updates the row in place instead of deleting and reinserting it.
        let mut put = tx.prepare_cached(
            "INSERT INTO chunks (id, data) VALUES (?1, ?2)
             ON CONFLICT (id) DO UPDATE SET data = excluded.data",
        )?;
        let mut blob: Option<rusqlite::blob::Blob<'_>> = None;
        for (idx, chunk) in &st.dirty {
            let key = chunk_key(ino, *idx);
            let patches = match chunk {
                DirtyChunk::Whole(data) => {
                    put.execute(params![key, data])?;
                    continue;
                }
                DirtyChunk::Patches { writes, .. } => writes,
            };
            if !patch_in_place(tx, &mut blob, key, patches)? {
                // A chunk shorter than its patches (a hole, or a file grown since its last
                // commit) is written whole.
                let mut data: Vec<u8> = tx
                    .query_row("SELECT data FROM chunks WHERE id = ?1", [key], |r| r.get(0))
                    .optional()?
                    .unwrap_or_default();
                for (within, bytes) in patches {
                    chunks::splice(&mut data, *within, bytes);
                }
                put.execute(params![key, data])?;
            }
        }
        let size = st.size.unwrap_or(0);
        tx.prepare_cached("UPDATE inodes SET size = ?2, mtime = ?3, ctime = max(ctime, ?3) WHERE ino = ?1")?
            .execute(params![ino as i64, size as i64, st.data_time])?;
        Ok(())
    }

    /// Commits the buffer of `ino`, with every change held (a file's close or `fsync` makes
    /// its name durable too). On failure the buffer is kept, so a later flush retries.
    pub(super) fn flush_locked(&self, ino: u64, st: &mut InodeState) -> FsResult<()> {
        if !st.has_pending() {
            return self.commit_held();
        }
        self.change(st.commit(), |tx| self.write_pending(tx, ino, st))?;
        self.committed_content(st.dirty_bytes as u64);
        st.clear_pending(&self.dirty_total);
        Ok(())
    }

    /// Commits the buffer of `ino` when its last handle goes. If that fails, nothing is left
    /// to retry it later (a daemon holding data no program waits for would show it in the
    /// mount until a restart loses it), so the buffer is dropped and the error says how much.
    pub(super) fn flush_or_drop(&self, ino: u64, st: &mut InodeState) -> FsResult<()> {
        match self.flush_locked(ino, st) {
            Err(e) if st.handles <= 1 => {
                let lost = st.dirty_bytes;
                st.discard(&self.dirty_total);
                Err(FsError::new(
                    e.errno,
                    format!(
                        "{lost} bytes written and not stored are dropped, the file is as last stored: {e}"
                    ),
                ))
            }
            other => other,
        }
    }

    /// Applies `changes` in `tx`, after the buffered writes of `st` if there are any: so a
    /// buffered write cannot later overwrite an explicit mtime, and a truncation applies to the
    /// buffered content. The caller holds the state lock until after the commit, then calls
    /// [`InodeState::setattr_done`].
    pub(super) fn setattr_in(
        &self,
        tx: &Connection,
        ino: u64,
        st: Option<&InodeState>,
        changes: &SetAttr,
    ) -> FsResult<Node> {
        if let Some(st) = st.filter(|st| st.has_pending()) {
            store::must_node(tx, ino)?; // exists, before buffered rows go in
            self.write_pending(tx, ino, st)?;
        }
        tree::setattr_in(&Ctx::plain(tx), store::must_node(tx, ino)?, changes, MAX_FILE_SIZE)
    }

    /// Applies `changes` and commits them together with the buffer.
    pub(super) fn setattr_locked(&self, ino: u64, st: &mut InodeState, changes: &SetAttr) -> FsResult<Attr> {
        let apply = |tx: &Ctx<'_>| self.setattr_in(tx, ino, Some(st), changes);
        // Buffered data goes in with it, and is stored once this returns.
        let node = self.change(st.commit(), apply)?;
        st.setattr_done(&self.dirty_total, &node, changes);
        Ok(node.attr())
    }

    /// Buffers a change of mode, owner or times made through an open regular file, to be
    /// committed with its data at the next close (`flush`) or `fsync` of any of its handles,
    /// which is when the file's data becomes durable too. A truncation is committed at once.
    fn setattr_buffered(&self, ino: u64, st: &mut InodeState, changes: &SetAttr) -> FsResult<Attr> {
        if changes.size.is_some() {
            return self.setattr_locked(ino, st, changes);
        }
        let node = self.with_reader(|c| c.must_node(ino))?;
        if !changes.is_empty() {
            st.attrs.get_or_insert_with(PendingAttrs::default).merge(changes, store::now_ns());
        }
        Ok(st.overlay(node))
    }

    fn fallocate_locked(
        &self,
        ino: u64,
        st: &mut InodeState,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> FsResult<()> {
        let end = chunks::fallocate_end(offset, length, mode)?;
        // Space is not reserved (SQLite cannot); what callers observe is the size it may
        // extend, and the mtime and ctime, which a local filesystem sets even when the size
        // stays.
        let size = self.size_locked(ino, st)?;
        st.size = Some(end.map_or(size, |end| end.max(size)));
        st.pending = true;
        st.data_time = store::now_ns();
        self.flush_locked(ino, st)
    }

    /// Opens a handle on `ino`. After the state is registered, the write connection is taken:
    /// an unlink that deleted the rows without seeing the registration is done by then (held
    /// or committed). So the node is read again there, and a vanished node is reported
    /// instead of handed out.
    ///
    /// `known` is the node as read by the caller, with the changes counted before that read
    /// ([`Inner::changes_seen`]). If no change came since, the node is still what the store
    /// holds, and reading it again is skipped: a removal or a change of size in between would
    /// have counted a change (counted with the connection held, so one still under way is
    /// waited for here), and one that begins later sees the registration.
    pub(super) fn open_handle(
        self: &Arc<Self>,
        ino: u64,
        known: Option<(Node, u64)>,
    ) -> FsResult<SqliteFile> {
        let guard = self.state_get_or_create(ino);
        let mut st = guard.lock();
        let node = {
            let db = self.conn.lock();
            match known {
                Some((node, seen)) if node.ino == ino && self.changes_seen() == seen => node,
                _ => store::node(&db.conn, ino)?.ok_or_else(|| FsError::errno(Errno::ENOENT))?,
            }
        };
        st.handles += 1;
        if st.size.is_none() {
            st.size = Some(node.size);
        }
        let opened = st.overlay(node);
        drop(st);
        Ok(SqliteFile::new(self.clone(), opened, guard.arc()))
    }
}

/// Writes `patches` into the stored chunk `key` in place, through `blob` (opened on the first
/// chunk, moved to the next one for each after it). False, with nothing written, when the
/// chunk is missing or shorter than the patches.
fn patch_in_place<'c>(
    tx: &'c Connection,
    blob: &mut Option<rusqlite::blob::Blob<'c>>,
    key: i64,
    patches: &[(usize, Vec<u8>)],
) -> FsResult<bool> {
    let moved = match blob.as_mut() {
        Some(open) => open.reopen(key),
        None => tx.blob_open(DatabaseName::Main, "chunks", "data", key, false).map(|b| *blob = Some(b)),
    };
    if moved.is_err() {
        // A handle that failed to move is spent; a missing row is answered below, and any
        // other failure shows again on the caller's own read of the row.
        *blob = None;
        return Ok(false);
    }
    let open = blob.as_mut().expect("opened above");
    let end = patches.iter().map(|(within, bytes)| within + bytes.len()).max().unwrap_or(0);
    if open.len() < end {
        // The caller rewrites this row, which would expire the handle anyway.
        *blob = None;
        return Ok(false);
    }
    for (within, bytes) in patches {
        open.write_at(bytes, *within)?;
    }
    Ok(true)
}

/// An open file: a handle on an inode, valid after rename or unlink. The inode's rows are
/// deleted when the last handle of a nameless inode is dropped.
pub(super) struct SqliteFile {
    inner: Arc<Inner>,
    /// The node's attributes (buffered writes included) when this handle was opened: its
    /// inode number and kind, which never change, and the version the door compares.
    opened: Attr,
    /// `None` only while dropping.
    state: Option<StateRef>,
}

impl SqliteFile {
    /// A handle on the node whose attributes are `opened` now.
    pub(super) fn new(inner: Arc<Inner>, opened: Attr, state: StateRef) -> SqliteFile {
        SqliteFile { inner, opened, state: Some(state) }
    }

    fn state(&self) -> &Mutex<InodeState> {
        self.state.as_ref().expect("state present until drop")
    }

    fn check_data(&self) -> FsResult<()> {
        match self.opened.kind {
            FileKind::File => Ok(()),
            FileKind::Dir => Err(FsError::errno(Errno::EISDIR)),
            _ => Err(FsError::errno(Errno::EINVAL)),
        }
    }
}

impl OpenFile for SqliteFile {
    fn read(&self, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        self.check_data()?;
        self.inner.read_locked(self.opened.ino, &mut self.state().lock(), offset, size)
    }

    fn write(&self, offset: u64, data: &[u8]) -> FsResult<u32> {
        self.check_data()?;
        self.inner.write_locked(self.opened.ino, &mut self.state().lock(), offset, data)
    }

    fn flush(&self) -> FsResult<()> {
        self.inner.flush_locked(self.opened.ino, &mut self.state().lock())
    }

    fn fsync(&self, _datasync: bool) -> FsResult<()> {
        self.inner.flush_locked(self.opened.ino, &mut self.state().lock())?;
        self.inner.sync_durable()
    }

    fn release(&self) -> FsResult<()> {
        let st = &mut self.state().lock();
        self.inner.flush_or_drop(self.opened.ino, st)
    }

    fn fallocate(&self, offset: u64, length: u64, mode: i32) -> FsResult<()> {
        match self.opened.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(FsError::errno(Errno::EISDIR)),
            _ => return Err(FsError::errno(Errno::ENODEV)),
        }
        self.inner.fallocate_locked(self.opened.ino, &mut self.state().lock(), offset, length, mode)
    }

    fn getattr(&self) -> FsResult<Attr> {
        self.inner.attr_locked(self.opened.ino, &self.state().lock())
    }

    fn kind_and_ino(&self) -> FsResult<(FileKind, u64)> {
        Ok((self.opened.kind, self.opened.ino))
    }

    fn opened_version(&self) -> Option<&Attr> {
        // Read from the store at this open, so the door compares each open with the store
        // as it is; while a descriptor stays open, the daemon's own changes reach the kernel
        // through it or as invalidations (tool door), and no other process writes a
        // namespace this backend has claimed.
        Some(&self.opened)
    }

    fn setattr(&self, changes: &SetAttr) -> FsResult<Attr> {
        let st = &mut self.state().lock();
        match self.opened.kind {
            FileKind::File => self.inner.setattr_buffered(self.opened.ino, st, changes),
            _ => self.inner.setattr_locked(self.opened.ino, st, changes),
        }
    }

    fn reopen(&self, _flags: i32) -> FsResult<Box<dyn OpenFile>> {
        // This handle keeps an unlinked node's rows until it closes.
        Ok(Box::new(self.inner.open_handle(self.opened.ino, None)?))
    }
}

impl Drop for SqliteFile {
    fn drop(&mut self) {
        let Some(state) = self.state.take() else {
            return;
        };
        {
            let mut st = state.lock();
            if let Err(e) = self.inner.flush_or_drop(self.opened.ino, &mut st) {
                static DROPPED: crate::log_limit::RateLimited = crate::log_limit::RateLimited::new();
                if let Some(held) = DROPPED.admit() {
                    tracing::error!(ino = self.opened.ino, "sqlite: {e}{held}");
                }
            }
            st.handles -= 1;
            // An unlink marks the inode before it commits and reaps it after, waiting for this
            // lock: whichever of the two sees no handle left deletes the rows.
            if st.handles == 0 && self.inner.is_nameless(self.opened.ino) {
                if let Err(e) = self.inner.reap_locked(self.opened.ino, &mut st) {
                    tracing::warn!(ino = self.opened.ino, "sqlite: deleting unlinked file failed: {e}");
                }
            }
        }
        self.inner.state_release(self.opened.ino, state);
    }
}
