//! Drafts: files this daemon created while alone on its namespace (while it holds its alone
//! lease, see `quiet`), kept in the daemon, content and attributes, until their first close,
//! `fsync`, or anything else that needs the server to know them. Then each goes to the server
//! in one call of `create_file_at` (migration 7): an extracted file's create, write, owner,
//! mode and times become one round trip instead of five, a `printf > f` one instead of two.
//!
//! Why nobody can tell:
//! - **Other daemons.** None can see the namespace while this one is alone: one that joins
//!   waits until the lease is given up, and this daemon stores every draft before it gives the
//!   lease up ([`Inner::lease`]). A daemon whose listening connection was ended (it kept its
//!   lease too long, see `quiet`) stores its drafts as soon as it notices; a name another
//!   daemon took meanwhile makes that draft's close fail.
//! - **This daemon.** Every operation that asks the server first stores every draft and holds
//!   the gate shared until it is done ([`Inner::settled`]); a draft is made only with the gate
//!   held exclusively, so never while such an operation is under way (which might miss it):
//!   the file is then created on the server at once, as when not alone. The draft's own
//!   handle reads, writes and changes attributes in the daemon.
//! - **The answers.** A draft is made only where the daemon's cache knows that the name is
//!   free and what the directory is, so the create answers as the server would.
//! - **Durability.** A close (the FUSE flush) and `fsync` store the draft before they return;
//!   a draft that was never closed was never acknowledged. One that cannot be stored at its
//!   last close is dropped, and the log says so.
//!
//! A draft holds at most [`DRAFT_MAX`] bytes, and all drafts together at most [`DRAFTS_MAX`]:
//! a write past either stores the file first and goes on as on any stored file.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::dircache::{Change, Known};
use super::functions::{self, walk_to_dir, walk_vars, Name};
use super::journal::Entry;
use super::ops::Changed;
use super::store::{literal, Sql};
use super::Inner;
use crate::backend::chunks::CHUNK_SIZE;
use crate::backend::tree::{self, NewNode, Node};
use crate::backend::{split_parent, Caller, FileKind};
use crate::error::{Errno, FsError, FsResult};

/// The most bytes a draft holds.
pub(super) const DRAFT_MAX: u64 = 16 << 20;
/// The most bytes all drafts hold together.
const DRAFTS_MAX: usize = 64 << 20;

/// Migration 7: `create_file_at(…)`, a file made with its attributes and content in one call.
///
/// What `create_at` does for a file (the name lock, the walk, EEXIST for a taken name, the
/// directory touched at `made_ns`, the notification), in one statement that also stores the
/// attributes the file had in the daemon and its chunks (`idxs[k]` holds `datas[k]`; a
/// missing one reads as zeros). Written out rather than calling `create_at`: a nested call
/// cost the server more than the statement itself (97 µs of 131 µs per file).
pub(super) const MIGRATION: &str = concat!(
    "
CREATE FUNCTION create_file_at(
    lock_key integer, ns_id integer, root_ino bigint, dir text[], leaf text, new_ino bigint,
    new_perm integer, new_uid bigint, new_gid bigint, new_size bigint, new_atime bigint,
    new_mtime bigint, new_ctime bigint, made_ns bigint, idxs bigint[], datas bytea[],
    channel text, payload text, OUT out_errno integer)
LANGUAGE plpgsql AS $$",
    walk_vars!(),
    "    made integer;
BEGIN
    PERFORM pg_advisory_xact_lock(lock_key, ns_id);",
    walk_to_dir!(dir),
    "
    WITH e AS (INSERT INTO dentries (parent, name, child) VALUES (dir_ino, leaf, new_ino)
            ON CONFLICT (parent, name) DO NOTHING RETURNING child),
        n AS (INSERT INTO inodes (ino, ns, kind, perm, uid, gid, rdev, size, nlink, atime, mtime,
                ctime, crtime)
            SELECT new_ino, ns_id, 32768, new_perm, new_uid, new_gid, 0, new_size, 1, new_atime,
                new_mtime, new_ctime, made_ns FROM e),
        c AS (INSERT INTO chunks (ino, idx, data)
            SELECT new_ino, t.i, t.d FROM unnest(idxs, datas) AS t(i, d) WHERE EXISTS (SELECT 1 FROM e)),
        p AS (UPDATE inodes SET mtime = made_ns, ctime = made_ns
            WHERE ino = dir_ino AND EXISTS (SELECT 1 FROM e))
    SELECT count(*) INTO made FROM e;
    IF made = 0 THEN
        out_errno := 17;
        RETURN;
    END IF;
    PERFORM notice(channel, payload);
    out_errno := 0;
END $$;
"
);

/// The largest draft sent as SQL text, in the journal's round trip (as hexadecimal digits,
/// twice its size).
const TEXT_MAX: usize = 256 << 10;

/// `data` as an SQL `bytea` literal (hexadecimal, in an escape string, so that it reads the
/// same whatever `standard_conforming_strings` says).
fn bytea_text(data: &[u8]) -> String {
    let mut text = String::with_capacity(data.len() * 2 + 16);
    push_bytea_text(&mut text, data);
    text
}

/// Appends [`bytea_text`] of `data` to `text`.
pub(super) fn push_bytea_text(text: &mut String, data: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    text.push_str("E'\\\\x");
    for &b in data {
        text.push(HEX[usize::from(b >> 4)] as char);
        text.push(HEX[usize::from(b & 15)] as char);
    }
    text.push_str("'::bytea");
}

/// What the close and `fsync` of the draft at `path` answer once it is lost for `why` (see
/// [`Inner::drop_draft`]).
fn lost(path: &str, why: FsError) -> FsError {
    let errno = if why.is(Errno::ENOSPC) { Errno::ENOSPC } else { Errno::EIO };
    FsError::new(errno, format!("{path}: not stored: {why}"))
}

/// A file not yet on the server.
pub(super) struct Draft {
    /// Its node as it will be stored: attributes and size.
    pub node: Node,
    /// Its content, `node.size` bytes.
    pub data: Vec<u8>,
    /// Its route-relative path (every rename or unlink stores the drafts first).
    path: String,
    /// Written or changed since it was made.
    pub changed: bool,
}

/// Where a draft stands, shared by its handles and the registry.
pub(super) enum State {
    Draft(Draft),
    /// On the server: the handle works as any other.
    Stored,
    /// The server refused it (its name was taken meanwhile, or its directory went): the
    /// handle's close answers this error.
    Lost(FsError),
}

pub(super) type Slot = Mutex<State>;

/// What this daemon holds back from the server while alone: drafts, and the journal of name
/// changes (`journal`).
#[derive(Default)]
pub(super) struct Drafts {
    /// Shared by every operation that asks the server; exclusive to make a draft or a
    /// journal entry, and to store them all.
    gate: RwLock<()>,
    /// Whether this daemon holds its alone lease.
    alone: AtomicBool,
    slots: Mutex<HashMap<u64, Arc<Slot>>>,
    /// Files with writes in the journal (`held_writes`): how many of its entries, until they
    /// are committed.
    writes: Mutex<HashMap<u64, usize>>,
    /// Name changes not sent yet, in order.
    pub journal: Mutex<Vec<Entry>>,
    /// Held while the journal is sent, so that its entries reach the server in order.
    pub sending: Mutex<()>,
    /// The listener's polls leave the journal alone (for tests that look at it).
    pub ticks_wait: AtomicBool,
    /// Drafts and journal entries not yet committed, read without the locks.
    pending: AtomicUsize,
    /// Bytes all drafts hold.
    bytes: AtomicUsize,
    /// Bytes of writes held in the journal (`held_writes`).
    pub held_bytes: AtomicUsize,
}

/// Held while an operation asks the server: no draft is made meanwhile.
pub(super) type Settled<'a> = RwLockReadGuard<'a, ()>;

impl Drafts {
    /// Whether this daemon makes drafts now (it holds its alone lease).
    pub fn allowed(&self) -> bool {
        self.alone.load(Ordering::Acquire)
    }

    /// The gate held exclusively, to make a draft or a journal entry: `None` while this
    /// daemon is not alone, or while an operation asks the server (which might miss it).
    pub fn holding_back(&self) -> Option<RwLockWriteGuard<'_, ()>> {
        if !self.allowed() {
            return None;
        }
        let exclusive = self.gate.try_write()?;
        // (Giving the lease up takes the gate first.)
        self.allowed().then_some(exclusive)
    }

    /// Takes `more` bytes for a draft that grows; false if all drafts would hold too many.
    pub fn reserve(&self, more: usize) -> bool {
        let taken = self.bytes.fetch_add(more, Ordering::AcqRel) + more;
        if taken > DRAFTS_MAX {
            self.bytes.fetch_sub(more, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// Gives back bytes a draft no longer holds.
    pub fn release(&self, fewer: usize) {
        self.bytes.fetch_sub(fewer, Ordering::AcqRel);
    }

    /// A draft is stored or dropped: it leaves the registry.
    fn settle(&self, draft: &Draft) {
        self.release(draft.data.len());
        if self.slots.lock().remove(&draft.node.ino).is_some() {
            self.pending.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Whether inode `ino` is a draft.
    pub fn is_draft(&self, ino: u64) -> bool {
        self.slots.lock().contains_key(&ino)
    }

    /// Whether this daemon holds back something of inode `ino`'s content: it is a draft, or
    /// has writes in the journal. (A read of it then asks the server after the journal.)
    pub fn holds(&self, ino: u64) -> bool {
        self.is_draft(ino) || self.writes.lock().contains_key(&ino)
    }

    /// Adds a name change to the journal (with the gate held exclusively).
    pub fn journal(&self, entry: Entry) {
        let mut journal = self.journal.lock();
        // A change of attributes, or a held write, right after one of the same file's is
        // merged into it.
        match (&entry, journal.last_mut()) {
            (Entry::Attrs(new), Some(Entry::Attrs(last))) if last.ino == new.ino => return last.merge(new),
            (Entry::Write(new), Some(Entry::Write(last))) if last.ino == new.ino => return last.append(new),
            (Entry::Write(new), _) => *self.writes.lock().entry(new.ino).or_default() += 1,
            _ => {}
        }
        journal.push(entry);
        self.pending.fetch_add(1, Ordering::AcqRel);
    }

    /// The journal, emptied, to send: its entries stay pending until [`Drafts::sent`] (an
    /// operation that asks the server meanwhile waits for them to be committed).
    pub fn take_journal(&self) -> Vec<Entry> {
        std::mem::take(&mut *self.journal.lock())
    }

    /// `entries` taken from the journal are committed.
    pub fn sent(&self, entries: &[Entry]) {
        let mut writes = self.writes.lock();
        for entry in entries {
            if let Entry::Write(run) = entry {
                self.held_bytes.fetch_sub(run.bytes(), Ordering::AcqRel);
                if let Some(count) = writes.get_mut(&run.ino) {
                    *count -= 1;
                    if *count == 0 {
                        writes.remove(&run.ino);
                    }
                }
            }
        }
        self.pending.fetch_sub(entries.len(), Ordering::AcqRel);
    }

    /// Puts back entries that could not be sent, before any journaled since.
    pub fn restore_journal(&self, mut entries: Vec<Entry>) {
        let mut journal = self.journal.lock();
        entries.append(&mut journal);
        *journal = entries;
    }
}

#[cfg(test)]
impl Inner {
    /// How many drafts this daemon holds.
    pub(super) fn drafts_held(&self) -> usize {
        self.drafts.slots.lock().len()
    }
}

impl Draft {
    /// `size` bytes at `offset`, as far as the file goes.
    pub fn read(&self, offset: u64, size: u32) -> Vec<u8> {
        let len = self.data.len() as u64;
        let start = offset.min(len) as usize;
        let end = offset.saturating_add(u64::from(size)).min(len) as usize;
        self.data[start..end].to_vec()
    }

    /// The bytes the file grows by with a write that ends at `end` (to take with
    /// [`Drafts::reserve`] first).
    pub fn growth(&self, end: u64) -> usize {
        end.saturating_sub(self.node.size) as usize
    }

    /// Writes `data` at `offset`, past the end too.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        let end = offset as usize + data.len();
        if end > self.data.len() {
            self.data.resize(end, 0);
        }
        self.data[offset as usize..end].copy_from_slice(data);
        self.changed = true;
        let now = tree::now_ns();
        (self.node.size, self.node.mtime, self.node.ctime) = (self.data.len() as u64, now, now);
    }

    /// The chunks to store: every one that holds a byte other than zero.
    fn chunks(&self) -> (Vec<i64>, Vec<&[u8]>) {
        let chunks = self.data.chunks(CHUNK_SIZE as usize).enumerate();
        chunks.filter(|(_, c)| c.iter().any(|&b| b != 0)).map(|(i, c)| (i as i64, c)).unzip()
    }
}

impl Inner {
    /// The node of kind `kind` and bits `perm` made at `path` as inode `ino` in the daemon, if
    /// the cache knows the parent and that the name is free: its group and bits derived from
    /// the parent as the server derives them. The cache learns it. (For a draft or a journaled
    /// `mkdir`: the caller holds the gate exclusively.)
    pub(super) fn make_here(
        &self,
        path: &str,
        ino: u64,
        (perm, kind): (u32, FileKind),
        caller: &Caller,
    ) -> Option<Node> {
        let Known::Dir(dir) = self.dirs.known(split_parent(path).0) else {
            return None;
        };
        if self.dirs.known(path) != Known::Absent {
            return None;
        }
        let now = tree::now_ns();
        let (gid, perm) = tree::ownership((u32::from(dir.perm), dir.gid), caller, perm, kind);
        let nlink = if kind == FileKind::Dir { 2 } else { 1 };
        let new =
            NewNode { ns: self.ns, kind, perm, uid: caller.uid, gid, rdev: 0, nlink, target: None, now };
        let node = new.node(ino);
        let ticket = self.dirs.changing();
        self.dirs.changed(ticket, Change::Made { path, attr: &node.attr(), now }, true);
        Some(node)
    }

    /// Sends the journal and stores every draft, then answers the guard to hold while asking
    /// the server.
    pub(super) fn settled(&self) -> FsResult<Settled<'_>> {
        let drafts = &self.drafts;
        loop {
            let shared = drafts.gate.read_recursive();
            // No draft is made while the gate is held shared, so none appears until it is dropped.
            if drafts.pending.load(Ordering::Acquire) == 0 {
                return Ok(shared);
            }
            drop(shared);
            let _exclusive = drafts.gate.write();
            self.store_drafts()?;
        }
    }

    /// Sends the journal and stores every draft, with the gate held exclusively; stops at the
    /// first failure to reach the server. The journal goes first: a draft may take a name
    /// that a journaled change freed (a journaled change never involves a draft).
    fn store_drafts(&self) -> FsResult<()> {
        self.flush_journal()?;
        let slots: Vec<Arc<Slot>> = self.drafts.slots.lock().values().cloned().collect();
        slots.iter().try_for_each(|slot| self.store_draft(&mut slot.lock()))
    }

    /// This daemon took its alone lease (`true`), or is about to give it up or lost it: then
    /// every draft is stored first (one that cannot be, at its close).
    pub(super) fn lease(&self, alone: bool) {
        if alone {
            self.drafts.alone.store(true, Ordering::Release);
            return;
        }
        let _exclusive = self.drafts.gate.write();
        self.drafts.alone.store(false, Ordering::Release);
        if let Err(e) = self.store_drafts() {
            tracing::warn!("postgres: storing the files created while alone on the namespace: {e}; each is stored at its close");
        }
    }

    /// A draft of a file `path` with permission bits `perm`, as inode `ino`, if this daemon
    /// is alone, no operation is asking the server, and the cache knows the name to be free.
    pub(super) fn make_draft(
        &self,
        path: &str,
        ino: u64,
        perm: u32,
        caller: &Caller,
    ) -> Option<(Node, Arc<Slot>)> {
        let _exclusive = self.drafts.holding_back()?;
        let node = self.make_here(path, ino, (perm, FileKind::File), caller)?;
        let draft = Draft { node: node.clone(), data: Vec::new(), path: path.to_string(), changed: false };
        let slot = Arc::new(Mutex::new(State::Draft(draft)));
        self.drafts.slots.lock().insert(ino, slot.clone());
        self.drafts.pending.fetch_add(1, Ordering::AcqRel);
        Some((node, slot))
    }

    /// Stores the draft in `state`, if it is one still. The server's refusal loses it (the
    /// state says why); a server that cannot be reached leaves it a draft, and answers EIO.
    pub(super) fn store_draft(&self, state: &mut State) -> FsResult<()> {
        let State::Draft(draft) = state else {
            return Ok(());
        };
        // A journaled change may have freed the draft's name, so the journal goes first: in
        // the same round trip, if the draft is small enough to be sent as text.
        let sent = match self.create_file_text(draft) {
            Some(call) => self.send_journal(Some(&call))?,
            None => {
                self.flush_journal()?;
                None
            }
        };
        let stored = match sent {
            Some(errno) => errno.parse().map_err(|_| FsError::new(Errno::EIO, "create_file_at: no answer")),
            None => self.put_draft(draft).map(|()| 0),
        };
        match stored.and_then(functions::errno_of) {
            Ok(()) => {
                self.drafts.settle(draft);
                *state = State::Stored;
                Ok(())
            }
            Err(e) if e.is(Errno::EIO) => Err(e),
            Err(e) => {
                self.drop_draft(state, e);
                Ok(())
            }
        }
    }

    /// Gives the draft in `state` up: its close and `fsync` answer `why`'s errno if it is the
    /// server's full disk (ENOSPC), else EIO (a name taken meanwhile, a directory gone: no
    /// answer of `close` or `fsync` says those). The name goes.
    pub(super) fn drop_draft(&self, state: &mut State, why: FsError) {
        let State::Draft(draft) = state else {
            return;
        };
        tracing::error!(
            "postgres: {} could not be stored and is lost ({} bytes): {why}",
            crate::display::escape(&draft.path),
            draft.data.len()
        );
        self.drafts.settle(draft);
        let ticket = self.dirs.changing();
        self.dirs.failed(ticket, &draft.path);
        *state = State::Lost(lost(&draft.path, why));
    }

    /// The call of `create_file_at` for `draft` as SQL text (for the journal's batch), if
    /// its content is at most [`TEXT_MAX`] bytes and its name is one.
    fn create_file_text(&self, draft: &Draft) -> Option<String> {
        if draft.data.len() > TEXT_MAX {
            return None;
        }
        let (dir, leaf) = functions::split(&draft.path).ok()?;
        let n = &draft.node;
        let (idxs, datas) = draft.chunks();
        let dir: Vec<String> = dir.iter().map(|c| literal(c)).collect();
        let idxs: Vec<String> = idxs.iter().map(i64::to_string).collect();
        let datas: Vec<String> = datas.iter().map(|d| bytea_text(d)).collect();
        Some(format!(
            "SELECT create_file_at({lock}, {ns}, {root}, ARRAY[{dir}]::text[], {leaf}, {ino}, {perm}, {uid}, {gid}, {size}, {atime}, {mtime}, {ctime}, {made}, ARRAY[{idxs}]::bigint[], ARRAY[{datas}]::bytea[], {channel}, {payload})",
            lock = self.tree_key,
            ns = self.ns,
            root = self.root,
            dir = dir.join(", "),
            leaf = literal(leaf),
            ino = n.ino,
            perm = n.perm,
            uid = n.uid,
            gid = n.gid,
            size = n.size,
            atime = n.atime,
            mtime = n.mtime,
            ctime = n.ctime,
            made = n.crtime,
            idxs = idxs.join(", "),
            datas = datas.join(", "),
            channel = literal(&self.channel),
            payload = literal(&self.payload(Changed::Name, &draft.path)),
        ))
    }

    /// `create_file_at` of `draft`.
    fn put_draft(&self, draft: &Draft) -> FsResult<()> {
        let (dir, leaf) = functions::split(&draft.path)?;
        let payload = self.payload(Changed::Name, &draft.path);
        let call = functions::Call { now: draft.node.crtime, ..self.call_args(&payload) };
        self.call_now(|sql| sql.create_file_at(&call, (&dir, leaf), self.ns, draft))
    }
}

impl Sql<'_> {
    /// Makes the file `draft` named `leaf` in the directory at `dir`, with
    /// [`create_file_at`](MIGRATION).
    fn create_file_at(
        &self,
        call: &functions::Call<'_>,
        (dir, leaf): Name<'_>,
        ns: i64,
        draft: &Draft,
    ) -> FsResult<()> {
        let n = &draft.node;
        let (idxs, datas) = draft.chunks();
        let row = self
            .row(
                "SELECT create_file_at($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14,
                     $15, $16, $17, $18)",
                &[
                    &call.lock_key,
                    &(ns as i32),
                    &(call.root as i64),
                    &dir,
                    &leaf,
                    &(n.ino as i64),
                    &(n.perm as i32),
                    &i64::from(n.uid),
                    &i64::from(n.gid),
                    &(n.size as i64),
                    &n.atime,
                    &n.mtime,
                    &n.ctime,
                    &call.now,
                    &idxs,
                    &datas,
                    &call.channel,
                    &call.payload,
                ],
            )?
            .expect("a function call returns a row");
        functions::errno_of(row.get(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_draft_keeps_a_full_disk_and_answers_eio_for_the_rest() {
        let full = FsError::new(Errno::ENOSPC, "postgres: db error: No space left on device");
        let lost_full = lost("d/f", full);
        assert!(lost_full.is(Errno::ENOSPC), "{lost_full}");
        assert!(lost_full.context.contains("d/f: not stored") && lost_full.context.contains("No space"));
        for other in [Errno::EEXIST, Errno::ENOENT, Errno::ENOTDIR, Errno::EIO] {
            assert!(lost("d/f", FsError::errno(other)).is(Errno::EIO), "{other}");
        }
    }
}
