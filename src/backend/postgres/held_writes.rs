//! Held writes: small writes to a stored file while this daemon is alone on its namespace,
//! kept in the journal (see `journal`) instead of one committed call of `write_spans` each.
//! A run of them on one file is one entry, sent as one call of `write_runs`
//! that rewrites each chunk it touches once, with the journal's other changes, in order: the
//! next time anything asks the server, or at the close or `fsync` of a descriptor that wrote
//! them (the listener's poll sends them only along with other changes). 65,536 random 4 KiB
//! writes into a 256 MiB file cost about twenty calls instead of 65,536.
//!
//! Why nobody can tell (the journal's reasons, and these):
//! - **Reads.** A read of the file's content by any handle asks the server after the
//!   journal is sent ([`Drafts::holds`](super::drafts::Drafts::holds) says so until its
//!   entries are committed); its attributes are the daemon's cache's, which learns each held
//!   write's size and times as the server will store them.
//! - **Durability.** Only a descriptor whose close the kernel reports (the daemon asks for
//!   every close of a descriptor opened while alone) holds writes back, and that close sends
//!   them before it returns, as `fsync` does. A write not followed by either was never
//!   acknowledged.
//! - **Memory.** A write of more than [`HOLD_MAX`] bytes goes at once (it is one call
//!   anyway), and held writes hold at most [`HELD_MAX`] bytes together: past it, a write goes
//!   at once, after the journal.

use std::sync::atomic::Ordering;

use super::drafts::push_bytea_text;
use super::journal::Entry;
use super::ops::Changed;
use super::store::literal;
use super::Inner;
use crate::backend::chunks;
use crate::backend::tree;
use crate::backend::Attr;

/// The largest write held back.
pub(super) const HOLD_MAX: usize = 64 << 10;
/// The most bytes all held writes hold together: the journal goes as SQL text, twice their
/// size (hexadecimal), of which the client library makes a copy, so this bounds what sending
/// it costs the daemon's memory.
const HELD_MAX: usize = 16 << 20;

/// Migration 10: `write_runs(node, idxs, withins, datas, new_end, now_ns, channel, payload)`,
/// a run of held writes in one call that rewrites each chunk it touches once.
///
/// What `write_spans` (see `splice`) does, for pieces sorted by chunk (`idxs` ascending; the
/// pieces of one chunk in the order they were written): it locks the inode's row first (so
/// no other writer or truncation of the file runs meanwhile), grows the size to `new_end` and
/// sets the times, then for each chunk reads it once, lays every piece of it over the bytes
/// in order (zeros before a piece past the chunk's end), and stores it once. A chunk is a
/// row of 64 KiB that the server rewrites whole for any change (about 0.45 ms on this
/// machine's test server), so 16 random writes that land in one chunk cost one rewrite
/// instead of 16. `out_errno` is 2 if the inode is gone.
///
/// Also: chunks are compressed with lz4 where the server has it (else as before, with
/// pglz). A rewrite compresses the chunk again, and pglz spent half of the server's time of
/// random writes into a sparse file (64 KiB mostly of zeros: 0.33 ms a rewrite with pglz,
/// 0.03 ms with lz4, in a loop of 1,000 on the test server).
pub(super) const MIGRATION: &str = "
DO $$ BEGIN
    EXECUTE 'ALTER TABLE chunks ALTER COLUMN data SET COMPRESSION lz4';
EXCEPTION WHEN OTHERS THEN
    NULL;
END $$;
CREATE FUNCTION write_runs(
    node bigint, idxs bigint[], withins integer[], datas bytea[], new_end bigint, now_ns bigint,
    channel text, payload text, OUT out_errno integer)
LANGUAGE plpgsql AS $$
DECLARE
    k integer := 1;
    n integer := cardinality(idxs);
    chunk bigint;
    buf bytea;
    w integer;
BEGIN
    UPDATE inodes SET size = greatest(size, new_end), mtime = now_ns,
            ctime = greatest(ctime, now_ns)
        WHERE ino = node;
    IF NOT FOUND THEN
        out_errno := 2;
        RETURN;
    END IF;
    WHILE k <= n LOOP
        chunk := idxs[k];
        SELECT data INTO buf FROM chunks WHERE ino = node AND idx = chunk;
        buf := coalesce(buf, ''::bytea);
        WHILE k <= n AND idxs[k] = chunk LOOP
            w := withins[k];
            IF length(buf) < w THEN
                buf := buf || decode(repeat('00', w - length(buf)), 'hex');
            END IF;
            buf := overlay(buf PLACING datas[k] FROM w + 1);
            k := k + 1;
        END LOOP;
        INSERT INTO chunks AS c (ino, idx, data) VALUES (node, chunk, buf)
            ON CONFLICT ON CONSTRAINT chunks_pkey DO UPDATE SET data = excluded.data;
    END LOOP;
    PERFORM notice(channel, payload);
    out_errno := 0;
END $$;
";

/// Writes to one stored file, in order, not sent yet.
pub(super) struct HeldWrites {
    pub ino: u64,
    /// The name the writes were made by, for messages and notifications.
    pub path: String,
    /// The pieces, each inside one chunk: chunk, offset in it, length (their bytes follow
    /// each other in `data`).
    spans: Vec<(u64, usize, usize)>,
    data: Vec<u8>,
    /// The size the writes grow the file to, at least.
    end: u64,
    /// The time of the last write (the file's modification time after them).
    now: i64,
}

impl HeldWrites {
    /// A run that starts with `data` written at `offset` at `now`.
    pub fn new(ino: u64, path: &str, offset: u64, data: &[u8], now: i64) -> HeldWrites {
        let mut run =
            HeldWrites { ino, path: path.to_string(), spans: Vec::new(), data: Vec::new(), end: 0, now };
        run.push(offset, data, now);
        run
    }

    /// Adds the writes of `later`, made after these to the same file.
    pub fn append(&mut self, later: &HeldWrites) {
        let mut from = 0;
        for &(idx, within, len) in &later.spans {
            self.push_piece((idx, within, len), &later.data[from..][..len]);
            from += len;
        }
        self.end = self.end.max(later.end);
        self.now = self.now.max(later.now);
    }

    fn push(&mut self, offset: u64, data: &[u8], now: i64) {
        for span in chunks::spans(offset, data.len() as u64) {
            self.push_piece((span.idx, span.within, span.len), &data[span.from..][..span.len]);
        }
        self.end = self.end.max(offset + data.len() as u64);
        self.now = self.now.max(now);
    }

    /// Adds `bytes`, the piece (chunk, offset in it, length) of a later write.
    fn push_piece(&mut self, (idx, within, len): (u64, usize, usize), bytes: &[u8]) {
        // A piece that goes on where the last one ended, in the same chunk, extends it: a
        // sequential run rewrites each chunk once.
        match self.spans.last_mut() {
            Some((last_idx, last_within, last_len))
                if *last_idx == idx && *last_within + *last_len == within =>
            {
                *last_len += len
            }
            _ => self.spans.push((idx, within, len)),
        }
        self.data.extend_from_slice(bytes);
    }

    /// The bytes the entry holds (counted against [`HELD_MAX`]).
    pub fn bytes(&self) -> usize {
        self.data.len()
    }
}

impl Inner {
    /// Holds back the write of `data` at `offset` (`None`: at the end, for `O_APPEND`) to the
    /// stored file `ino` (opened as `path`) if this daemon is alone, the write is small, there
    /// is room, and the cache knows the file's attributes: those attributes after it, or
    /// `None` when it must be made at once. (Alone, this daemon knows where the file ends: the
    /// size its cache holds, with the writes held before this one.)
    pub(super) fn journal_write(
        &self,
        ino: u64,
        path: &str,
        offset: Option<u64>,
        data: &[u8],
    ) -> Option<Attr> {
        if data.len() > HOLD_MAX {
            return None;
        }
        let _exclusive = self.journaling()?;
        let drafts = &self.drafts;
        if drafts.is_draft(ino) {
            return None;
        }
        let mut attr = self.dirs.attr_of(ino)?;
        let offset = offset.unwrap_or(attr.size);
        // Past the largest file: made at once, which answers EFBIG.
        chunks::end_of(offset, data.len() as u64).ok()?;
        if drafts.held_bytes.fetch_add(data.len(), Ordering::AcqRel) + data.len() > HELD_MAX {
            drafts.held_bytes.fetch_sub(data.len(), Ordering::AcqRel);
            return None;
        }
        let now = tree::now_ns();
        let end = offset + data.len() as u64;
        if end > attr.size {
            (attr.size, attr.blocks) = (end, end.div_ceil(512));
        }
        attr.mtime = tree::ns_to_time(now);
        attr.ctime = attr.ctime.max(attr.mtime);
        let ticket = self.dirs.changing();
        self.dirs.changed(ticket, super::dircache::Change::NodeAttrs { attr: &attr }, true);
        drafts.journal(Entry::Write(HeldWrites::new(ino, path, offset, data, now)));
        Some(attr)
    }

    /// Appends the journal's call for `run` to `batch`: [`write_runs`](MIGRATION), its pieces
    /// sorted by chunk (those of one chunk stay in order: they may overlap). Written in place:
    /// the text is twice the size of the data.
    pub(super) fn push_held_writes_call(&self, batch: &mut String, run: &HeldWrites) {
        use std::fmt::Write;
        batch.reserve_exact(run.data.len() * 2 + run.spans.len() * 40 + 200);
        let mut pieces = Vec::with_capacity(run.spans.len());
        let mut from = 0;
        for &(idx, within, len) in &run.spans {
            pieces.push((idx, within, &run.data[from..][..len]));
            from += len;
        }
        pieces.sort_by_key(|&(idx, _, _)| idx);
        let _ = write!(batch, "SELECT write_runs({}, ARRAY[", run.ino);
        push_list(batch, &pieces, |b, p| {
            let _ = write!(b, "{}", p.0);
        });
        batch.push_str("]::bigint[], ARRAY[");
        push_list(batch, &pieces, |b, p| {
            let _ = write!(b, "{}", p.1);
        });
        batch.push_str("]::integer[], ARRAY[");
        push_list(batch, &pieces, |b, p| push_bytea_text(b, p.2));
        let payload = literal(&self.payload(Changed::FileContent(run.ino), &run.path));
        let _ = write!(batch, "]::bytea[], {}, {}, {}, {payload})", run.end, run.now, literal(&self.channel));
    }
}

/// Appends `item` of each of `items` to `batch`, separated by commas.
fn push_list<T>(batch: &mut String, items: &[T], mut item: impl FnMut(&mut String, &T)) {
    for (k, x) in items.iter().enumerate() {
        if k > 0 {
            batch.push(',');
        }
        item(batch, x);
    }
}
