//! Writes as one call on the server: `write_spans` splices the bytes of a write into the
//! chunks it touches where they are stored (migration 6), so a 4 KiB write into a large file
//! costs one round trip that carries 4 KiB, where reading the chunk, splicing it here and
//! storing it back took a transaction of four round trips carrying the whole chunk twice. A
//! new file's chunks and whole chunks take the same call. An `O_APPEND` write is one call of
//! `append_data`, which finds the end where it writes.

use super::store::{node_at, Sql};
use crate::backend::chunks::{Span, CHUNK_SIZE, MAX_FILE_SIZE};
use crate::backend::tree::Node;
use crate::error::FsResult;

/// Migration 6: `write_spans(node, idxs, withins, datas, new_end, now_ns, channel, payload)`.
///
/// Locks the inode's row first (as a truncation does, so the two cannot deadlock), grows its
/// size to `new_end` and sets its times; then writes `datas[k]` at offset `withins[k]` of
/// chunk `idxs[k]`: a missing chunk is made (zeros before the bytes), an existing one keeps
/// every byte the write does not cover, and one shorter than the offset is padded with zeros
/// (no chunk holds bytes past the file's size, so those bytes read as zeros already). Each
/// chunk is changed on its locked row, so concurrent writers of one chunk never lose each
/// other's bytes. Answers the node as the write left it, or no row when the inode is gone.
pub(super) const MIGRATION: &str = "
CREATE FUNCTION write_spans(
    node bigint, idxs bigint[], withins integer[], datas bytea[], new_end bigint, now_ns bigint,
    channel text, payload text,
    OUT ino bigint, OUT kind integer, OUT perm integer, OUT uid bigint, OUT gid bigint,
    OUT rdev bigint, OUT size bigint, OUT nlink integer, OUT atime bigint, OUT mtime bigint,
    OUT ctime bigint, OUT crtime bigint)
RETURNS SETOF record LANGUAGE plpgsql AS $$
DECLARE
    k integer;
    w integer;
    d bytea;
BEGIN
    UPDATE inodes i SET size = greatest(i.size, new_end), mtime = now_ns,
            ctime = greatest(i.ctime, now_ns)
        WHERE i.ino = node
        RETURNING i.ino, i.kind, i.perm, i.uid, i.gid, i.rdev, i.size, i.nlink, i.atime, i.mtime,
            i.ctime, i.crtime
        INTO ino, kind, perm, uid, gid, rdev, size, nlink, atime, mtime, ctime, crtime;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    FOR k IN 1 .. cardinality(idxs) LOOP
        w := withins[k];
        d := datas[k];
        INSERT INTO chunks AS c (ino, idx, data)
            VALUES (node, idxs[k], decode(repeat('00', w), 'hex') || d)
            ON CONFLICT ON CONSTRAINT chunks_pkey DO UPDATE SET data = overlay(
                c.data || decode(repeat('00', greatest(w - length(c.data), 0)), 'hex')
                PLACING d FROM w + 1);
    END LOOP;
    PERFORM notice(channel, payload);
    RETURN NEXT;
END $$;
";

/// Migration 11: `append_data(node, data, chunk_size, max_size, now_ns, channel, payload)`, an
/// `O_APPEND` write.
///
/// Locks the inode's row and grows its size by the data's length in one `UPDATE` (which,
/// waiting for another writer's lock, reads the size that writer left), sets its times, and
/// writes the data at the old size as `write_spans` writes its spans: so the data lands at the
/// end as stored, and two daemons' appends, each computing its offset from its own kernel's
/// cached size, never overwrite each other. Answers the node as the write left it and the
/// offset it wrote at; the node unchanged and offset -1 when the file would grow past
/// `max_size` (EFBIG); no row when the inode is gone.
pub(super) const APPEND_MIGRATION: &str = "
CREATE FUNCTION append_data(
    node bigint, bytes bytea, chunk_size bigint, max_size bigint, now_ns bigint, channel text,
    payload text,
    OUT ino bigint, OUT kind integer, OUT perm integer, OUT uid bigint, OUT gid bigint,
    OUT rdev bigint, OUT size bigint, OUT nlink integer, OUT atime bigint, OUT mtime bigint,
    OUT ctime bigint, OUT crtime bigint, OUT at_offset bigint)
RETURNS SETOF record LANGUAGE plpgsql AS $$
DECLARE
    len bigint := length(bytes);
    pos bigint;
    done bigint := 0;
    chunk bigint;
    w integer;
    n integer;
    piece bytea;
BEGIN
    UPDATE inodes i SET size = i.size + len, mtime = now_ns, ctime = greatest(i.ctime, now_ns)
        WHERE i.ino = node AND i.size + len <= max_size
        RETURNING i.ino, i.kind, i.perm, i.uid, i.gid, i.rdev, i.size, i.nlink, i.atime, i.mtime,
            i.ctime, i.crtime, i.size - len
        INTO ino, kind, perm, uid, gid, rdev, size, nlink, atime, mtime, ctime, crtime, at_offset;
    IF NOT FOUND THEN
        SELECT i.ino, i.kind, i.perm, i.uid, i.gid, i.rdev, i.size, i.nlink, i.atime, i.mtime,
                i.ctime, i.crtime, -1
            INTO ino, kind, perm, uid, gid, rdev, size, nlink, atime, mtime, ctime, crtime, at_offset
            FROM inodes i WHERE i.ino = node;
        IF FOUND THEN
            RETURN NEXT;
        END IF;
        RETURN;
    END IF;
    pos := at_offset;
    WHILE done < len LOOP
        chunk := pos / chunk_size;
        w := (pos - chunk * chunk_size)::integer;
        n := least(chunk_size - w, len - done)::integer;
        piece := substring(bytes FROM (done + 1)::integer FOR n);
        INSERT INTO chunks AS c (ino, idx, data)
            VALUES (node, chunk, decode(repeat('00', w), 'hex') || piece)
            ON CONFLICT ON CONSTRAINT chunks_pkey DO UPDATE SET data = overlay(
                c.data || decode(repeat('00', greatest(w - length(c.data), 0)), 'hex')
                PLACING piece FROM w + 1);
        pos := pos + n;
        done := done + n;
    END LOOP;
    PERFORM notice(channel, payload);
    RETURN NEXT;
END $$;
";

impl Sql<'_> {
    /// Writes `data` at the end of `ino` as stored, with [`append_data`](APPEND_MIGRATION);
    /// the node after it, `Some(None)` when the file would grow past [`MAX_FILE_SIZE`], or
    /// `None` when the inode is gone.
    pub fn append_data(
        &self,
        ino: u64,
        data: &[u8],
        now: i64,
        (channel, payload): (&str, &str),
    ) -> FsResult<Option<Option<Node>>> {
        let row = self.row(
            "SELECT * FROM append_data($1, $2, $3, $4, $5, $6, $7)",
            &[&(ino as i64), &data, &(CHUNK_SIZE as i64), &(MAX_FILE_SIZE as i64), &now, &channel, &payload],
        )?;
        let Some(row) = row else { return Ok(None) };
        let at: i64 = row.get(12);
        Ok(Some(if at < 0 { None } else { Some(node_at(&row, 0)?) }))
    }

    /// Writes `data` (the bytes of `spans`, in order) into the chunks of `ino` with
    /// [`write_spans`](MIGRATION), growing the size to `end`; the node after it, or `None` when
    /// the inode is gone.
    pub fn write_spans(
        &self,
        ino: u64,
        (spans, data): (&[Span], &[u8]),
        (end, now): (u64, i64),
        (channel, payload): (&str, &str),
    ) -> FsResult<Option<Node>> {
        let idxs: Vec<i64> = spans.iter().map(|s| s.idx as i64).collect();
        let withins: Vec<i32> = spans.iter().map(|s| s.within as i32).collect();
        let datas: Vec<&[u8]> = spans.iter().map(|s| &data[s.from..][..s.len]).collect();
        let row = self.row(
            "SELECT * FROM write_spans($1, $2, $3, $4, $5, $6, $7, $8)",
            &[&(ino as i64), &idxs, &withins, &datas, &(end as i64), &now, &channel, &payload],
        )?;
        row.map(|r| node_at(&r, 0)).transpose()
    }
}
