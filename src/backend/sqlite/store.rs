//! Row-level helpers: nodes, directory entries, path resolution and time conversion. They take
//! any `&Connection`, so they work on a reader as well as inside a write transaction.

use rusqlite::{params, Connection, OptionalExtension, Row};
use std::cell::RefCell;
use std::collections::HashMap;

use super::schema::CHUNK_BITS;
use crate::backend::{DirEntry, FileKind};
use crate::error::{Errno, FsError, FsResult};

pub(super) use crate::backend::tree::{now_ns, time_to_ns, NewNode, Node, Tree, NAME_MAX};

/// The key of chunk `idx` of `ino` (see `schema::CHUNK_BITS`).
pub(super) fn chunk_key(ino: u64, idx: u64) -> i64 {
    (ino << CHUNK_BITS | idx) as i64
}

/// The first and last possible chunk keys of `ino`.
pub(super) fn chunk_key_range(ino: u64) -> (i64, i64) {
    (chunk_key(ino, 0), chunk_key(ino, (1 << CHUNK_BITS) - 1))
}

fn row_to_node(r: &Row<'_>) -> rusqlite::Result<Node> {
    let kind: i64 = r.get(1)?;
    let kind = FileKind::from_mode(kind as u32).ok_or(rusqlite::Error::IntegralValueOutOfRange(1, kind))?;
    Ok(Node {
        ino: r.get::<_, i64>(0)? as u64,
        kind,
        perm: r.get(2)?,
        uid: r.get(3)?,
        gid: r.get(4)?,
        rdev: r.get(5)?,
        size: r.get::<_, i64>(6)? as u64,
        nlink: r.get(7)?,
        atime: r.get(8)?,
        mtime: r.get(9)?,
        ctime: r.get(10)?,
        crtime: r.get(11)?,
    })
}

pub(super) fn node(conn: &Connection, ino: u64) -> FsResult<Option<Node>> {
    Ok(conn
        .prepare_cached(
            "SELECT ino, kind, perm, uid, gid, rdev, size, nlink, atime, mtime, ctime, crtime
             FROM inodes WHERE ino = ?1",
        )?
        .query_row([ino as i64], row_to_node)
        .optional()?)
}

pub(super) fn must_node(conn: &Connection, ino: u64) -> FsResult<Node> {
    node(conn, ino)?.ok_or_else(|| FsError::errno(Errno::ENOENT))
}

/// Writes back the attribute columns of `n` (not nlink, which moves by deltas).
pub(super) fn update_attrs(conn: &Connection, n: &Node) -> FsResult<()> {
    conn.prepare_cached(
        "UPDATE inodes SET perm = ?2, uid = ?3, gid = ?4, size = ?5, atime = ?6, mtime = ?7,
         ctime = ?8 WHERE ino = ?1",
    )?
    .execute(params![n.ino as i64, n.perm, n.uid, n.gid, n.size as i64, n.atime, n.mtime, n.ctime])?;
    Ok(())
}

/// Directory entries looked up before, `(parent, name) → child`, so a path walk costs memory
/// lookups instead of one query per component. Used only with the write connection, whose view
/// is the namespace as it is (committed, or held in its open transaction): a change that
/// changes or removes an entry forgets it, and held changes that are lost forget everything.
/// Entries are never added from a pool reader, whose snapshot may be older.
#[derive(Default)]
pub(super) struct Dentries {
    map: HashMap<(u64, String), u64>,
}

impl Dentries {
    /// Forgets every entry.
    pub fn clear(&mut self) {
        self.map.clear();
    }
}

/// Bound on remembered entries; past it the cache starts over.
const DENTRIES_MAX: usize = 1 << 17;

/// Nodes read through the write connection outside a change, all read since the last
/// change: every change to the namespace is made through that connection and counted while it
/// is held (see `Inner::changes`), so while the count is the one the cache was filled at, the
/// nodes are what the store holds. A grep's `open` then costs no query for the directories it
/// walks. Used only by a backend that claimed its namespace (no other process changes it).
#[derive(Default)]
pub(super) struct Nodes {
    map: HashMap<u64, Node>,
    changes: u64,
}

impl Nodes {
    /// Forgets every node if a change came since they were read (`changes` is the count now).
    pub fn at_change(&mut self, changes: u64) {
        if self.changes != changes {
            self.map.clear();
            self.changes = changes;
        }
    }

    /// Forgets every node.
    pub fn clear(&mut self) {
        self.map.clear();
    }

    #[cfg(test)]
    pub fn holds(&self, ino: u64) -> bool {
        self.map.contains_key(&ino)
    }
}

/// A connection to query, with the dentry cache when it is the write connection, and the node
/// cache when that connection reads outside a write transaction.
#[derive(Clone, Copy)]
pub(super) struct Ctx<'a> {
    pub conn: &'a Connection,
    pub dentries: Option<&'a RefCell<Dentries>>,
    pub nodes: Option<&'a RefCell<Nodes>>,
}

impl<'a> Ctx<'a> {
    /// A connection without caches (a write transaction's, or a pool reader's).
    pub fn plain(conn: &'a Connection) -> Ctx<'a> {
        Ctx { conn, dentries: None, nodes: None }
    }
}

impl std::ops::Deref for Ctx<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

pub(super) fn lookup(c: &Ctx<'_>, parent: u64, name: &str) -> FsResult<Option<u64>> {
    let key = (parent, name.to_string());
    if let Some(child) = c.dentries.and_then(|d| d.borrow().map.get(&key).copied()) {
        return Ok(Some(child));
    }
    let found = c
        .prepare_cached("SELECT child FROM dentries WHERE parent = ?1 AND name = ?2")?
        .query_row(params![parent as i64, name], |r| r.get::<_, i64>(0))
        .optional()?
        .map(|i| i as u64);
    if let (Some(dentries), Some(child)) = (c.dentries, found) {
        let mut d = dentries.borrow_mut();
        if d.map.len() >= DENTRIES_MAX {
            d.map.clear();
        }
        d.map.insert(key, child);
    }
    Ok(found)
}

/// Forgets a cached entry that the current transaction changes.
fn forget(c: &Ctx<'_>, parent: u64, name: &str) {
    if let Some(d) = c.dentries {
        d.borrow_mut().map.remove(&(parent, name.to_string()));
    }
}

pub(super) fn insert_node(conn: &Connection, ino: u64, n: &NewNode<'_>) -> FsResult<()> {
    let size = n.target.map_or(0, |t| t.len() as i64);
    conn.prepare_cached(
        "INSERT INTO inodes (ino, ns, kind, perm, uid, gid, rdev, size, nlink, atime, mtime,
         ctime, crtime, target) VALUES (?11, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?9, ?9, ?10)",
    )?
    .execute(params![
        n.ns,
        n.kind.mode_bits(),
        n.perm,
        n.uid,
        n.gid,
        n.rdev,
        size,
        n.nlink,
        n.now,
        n.target,
        ino as i64
    ])?;
    Ok(())
}

pub(super) fn insert_dentry(conn: &Connection, parent: u64, name: &str, child: u64) -> FsResult<()> {
    conn.prepare_cached("INSERT INTO dentries (parent, name, child) VALUES (?1, ?2, ?3)")?
        .execute(params![parent as i64, name, child as i64])?;
    Ok(())
}

pub(super) fn remove_dentry(c: &Ctx<'_>, parent: u64, name: &str) -> FsResult<()> {
    forget(c, parent, name);
    c.prepare_cached("DELETE FROM dentries WHERE parent = ?1 AND name = ?2")?
        .execute(params![parent as i64, name])?;
    Ok(())
}

pub(super) fn set_dentry_child(c: &Ctx<'_>, parent: u64, name: &str, child: u64) -> FsResult<()> {
    forget(c, parent, name);
    c.prepare_cached("UPDATE dentries SET child = ?3 WHERE parent = ?1 AND name = ?2")?.execute(params![
        parent as i64,
        name,
        child as i64
    ])?;
    Ok(())
}

/// An entry of directory `ino` changed: its mtime and ctime become `now`, and its link count
/// moves by `nlink_delta` (a subdirectory's `..` came or went).
pub(super) fn touch_dir(conn: &Connection, ino: u64, nlink_delta: i64, now: i64) -> FsResult<()> {
    conn.prepare_cached("UPDATE inodes SET nlink = nlink + ?2, mtime = ?3, ctime = ?3 WHERE ino = ?1")?
        .execute(params![ino as i64, nlink_delta, now])?;
    Ok(())
}

/// A name of `ino` came or went: its link count moves by `delta` and its ctime becomes `now`.
/// Returns the new link count.
pub(super) fn add_nlink(conn: &Connection, ino: u64, delta: i64, now: i64) -> FsResult<u32> {
    Ok(conn
        .prepare_cached(
            "UPDATE inodes SET nlink = max(nlink + ?2, 0), ctime = ?3 WHERE ino = ?1
             RETURNING nlink",
        )?
        .query_row(params![ino as i64, delta, now], |r| r.get(0))?)
}

pub(super) fn set_ctime(conn: &Connection, ino: u64, now: i64) -> FsResult<()> {
    conn.prepare_cached("UPDATE inodes SET ctime = ?2 WHERE ino = ?1")?.execute(params![ino as i64, now])?;
    Ok(())
}

pub(super) fn has_children(conn: &Connection, ino: u64) -> FsResult<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM dentries WHERE parent = ?1 LIMIT 1")?
        .query_row([ino as i64], |_| Ok(()))
        .optional()?
        .is_some())
}

pub(super) fn list_dir(conn: &Connection, ino: u64) -> FsResult<Vec<DirEntry>> {
    let mut stmt = conn.prepare_cached(
        "SELECT d.name, i.kind FROM dentries d JOIN inodes i ON i.ino = d.child
         WHERE d.parent = ?1",
    )?;
    let rows = stmt.query_map([ino as i64], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
    let mut out = Vec::new();
    for row in rows {
        let (name, kind) = row?;
        let kind = FileKind::from_mode(kind as u32).ok_or_else(|| FsError::errno(Errno::EIO))?;
        out.push(DirEntry { name, kind });
    }
    Ok(out)
}

pub(super) fn symlink_target(conn: &Connection, ino: u64) -> FsResult<Vec<u8>> {
    Ok(conn
        .prepare_cached("SELECT target FROM inodes WHERE ino = ?1")?
        .query_row([ino as i64], |r| r.get::<_, Option<Vec<u8>>>(0))
        .optional()?
        .flatten()
        .unwrap_or_default())
}

/// Deletes every row of a node that has no name and no open handle left.
/// The statements that remove an inode's rows. Each reaches them through a key: a scan here
/// would be a pass over the whole database for every deleted file (a unit test checks the
/// plans). Chunks are found by their key range, not by the computed `ino` column.
pub(super) const DELETE_ROWS: [&str; 4] = [
    "DELETE FROM chunks WHERE id BETWEEN ?1 AND ?2",
    "DELETE FROM xattrs WHERE ino = ?1",
    "DELETE FROM dentries WHERE parent = ?1",
    "DELETE FROM inodes WHERE ino = ?1",
];

pub(super) fn delete_rows(conn: &Connection, ino: u64) -> FsResult<()> {
    let (first, last) = chunk_key_range(ino);
    conn.prepare_cached(DELETE_ROWS[0])?.execute([first, last])?;
    for sql in &DELETE_ROWS[1..] {
        conn.prepare_cached(sql)?.execute([ino as i64])?;
    }
    Ok(())
}

/// Drops the content at and past `size` (a truncation down to `size`).
pub(super) fn truncate_chunks(conn: &Connection, ino: u64, size: u64) -> FsResult<()> {
    let (_, last) = chunk_key_range(ino);
    let (first_gone, tail) = crate::backend::chunks::truncation(size);
    conn.prepare_cached("DELETE FROM chunks WHERE id BETWEEN ?1 AND ?2")?
        .execute([chunk_key(ino, first_gone), last])?;
    if tail != 0 {
        conn.prepare_cached(
            "UPDATE chunks SET data = substr(data, 1, ?2) WHERE id = ?1 AND length(data) > ?2",
        )?
        .execute([chunk_key(ino, size / crate::backend::chunks::CHUNK_SIZE), tail as i64])?;
    }
    Ok(())
}

/// The shared tree logic on this connection (with the dentry cache when it is the writer's).
impl Tree for Ctx<'_> {
    fn lookup(&self, parent: u64, name: &str) -> FsResult<Option<u64>> {
        lookup(self, parent, name)
    }
    fn node(&self, ino: u64) -> FsResult<Option<Node>> {
        let Some(nodes) = self.nodes else {
            return node(self, ino);
        };
        if let Some(n) = nodes.borrow().map.get(&ino) {
            return Ok(Some(n.clone()));
        }
        let found = node(self, ino)?;
        if let Some(n) = &found {
            let mut nodes = nodes.borrow_mut();
            if nodes.map.len() >= DENTRIES_MAX {
                nodes.map.clear();
            }
            nodes.map.insert(ino, n.clone());
        }
        Ok(found)
    }
    fn insert_node(&self, ino: u64, n: &NewNode<'_>) -> FsResult<()> {
        insert_node(self, ino, n)
    }
    fn insert_dentry(&self, parent: u64, name: &str, child: u64) -> FsResult<()> {
        insert_dentry(self, parent, name, child)
    }
    fn remove_dentry(&self, parent: u64, name: &str) -> FsResult<()> {
        remove_dentry(self, parent, name)
    }
    fn set_dentry_child(&self, parent: u64, name: &str, child: u64) -> FsResult<()> {
        set_dentry_child(self, parent, name, child)
    }
    fn touch_dir(&self, ino: u64, nlink_delta: i64, now: i64) -> FsResult<()> {
        touch_dir(self, ino, nlink_delta, now)
    }
    fn add_nlink(&self, ino: u64, delta: i64, now: i64) -> FsResult<u32> {
        add_nlink(self, ino, delta, now)
    }
    fn set_ctime(&self, ino: u64, now: i64) -> FsResult<()> {
        set_ctime(self, ino, now)
    }
    fn has_children(&self, ino: u64) -> FsResult<bool> {
        has_children(self, ino)
    }
    fn update_attrs(&self, n: &Node) -> FsResult<()> {
        update_attrs(self, n)
    }
    fn truncate_chunks(&self, ino: u64, size: u64) -> FsResult<()> {
        truncate_chunks(self, ino, size)
    }
    fn get_xattr(&self, ino: u64, name: &str) -> FsResult<Option<Vec<u8>>> {
        Ok(self
            .prepare_cached("SELECT value FROM xattrs WHERE ino = ?1 AND name = ?2")?
            .query_row(params![ino as i64, name], |r| r.get(0))
            .optional()?)
    }
    fn xattr_names(&self, ino: u64) -> FsResult<Vec<String>> {
        let mut stmt = self.prepare_cached("SELECT name FROM xattrs WHERE ino = ?1 ORDER BY name")?;
        let names = stmt.query_map([ino as i64], |r| r.get::<_, String>(0))?;
        Ok(names.collect::<rusqlite::Result<_>>()?)
    }
    fn put_xattr(&self, ino: u64, name: &str, value: &[u8]) -> FsResult<()> {
        self.prepare_cached(
            "INSERT INTO xattrs (ino, name, value) VALUES (?1, ?2, ?3)
             ON CONFLICT (ino, name) DO UPDATE SET value = excluded.value",
        )?
        .execute(params![ino as i64, name, value])?;
        Ok(())
    }
    fn delete_xattr(&self, ino: u64, name: &str) -> FsResult<bool> {
        let gone = self
            .prepare_cached("DELETE FROM xattrs WHERE ino = ?1 AND name = ?2")?
            .execute(params![ino as i64, name])?;
        Ok(gone != 0)
    }
}
