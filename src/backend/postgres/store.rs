//! Statements on one connection: [`Sql`] prepares each statement once per connection, walks a
//! whole path in one query, and implements the shared tree logic's [`Tree`] on the rows.

use std::cell::RefCell;
use std::collections::HashMap;

use postgres::types::ToSql;
use postgres::{Client, Row, Statement};

use super::PgSettings;
use crate::backend::tree::{self, NewNode, Node, Tree};
use crate::backend::{chunks, DirEntry, FileKind};
use crate::error::{Errno, FsError, FsResult};

/// The walk from the route's root along `$2` (the path's components), one row per depth:
/// the start of every query that resolves a path in one round trip.
macro_rules! walk_cte {
    () => {
        // Each step reads the entry and then the node by their keys, in subqueries of the
        // step: joined, the planner may scan the whole inode table to hash a handful of rows,
        // or (its statistics taken while a table was nearly empty) scan a whole index once
        // per step, which an untar or a `git add` after a large deletion pays at every call.
        "WITH RECURSIVE w(depth, ino, kind, perm, uid, gid, rdev, size, nlink, atime, mtime, ctime, crtime) AS (
             SELECT 0, i.ino, i.kind, i.perm, i.uid, i.gid, i.rdev, i.size, i.nlink, i.atime, i.mtime,
                 i.ctime, i.crtime
             FROM inodes i WHERE i.ino = $1::bigint
           UNION ALL
             SELECT w.depth + 1, i.ino, i.kind, i.perm, i.uid, i.gid, i.rdev, i.size, i.nlink, i.atime,
                 i.mtime, i.ctime, i.crtime
             FROM w CROSS JOIN LATERAL (SELECT * FROM inodes i WHERE i.ino = (SELECT d.child
                 FROM dentries d WHERE d.parent = w.ino AND d.name = ($2::text[])[w.depth + 1]) OFFSET 0) i
             WHERE w.depth < cardinality($2::text[]))
         "
    };
}
pub(super) use walk_cte;

/// Stored chunks: index and content.
pub(super) type Chunks = Vec<(u64, Vec<u8>)>;

/// Statements on one connection, inside a transaction or not.
pub(super) struct Sql<'a> {
    client: RefCell<&'a mut Client>,
    stmts: RefCell<&'a mut HashMap<&'static str, Statement>>,
    settings: &'a PgSettings,
    /// Nodes read by the last walk, so that looking at them again costs no query; forgotten
    /// at every change.
    walked: RefCell<HashMap<u64, Node>>,
    /// Notifications to send at commit, as `SELECT pg_notify(..)` (or `notice`) statements: sent in the
    /// same round trip as the COMMIT rather than one each.
    notifications: RefCell<Vec<String>>,
}

/// `text` as an SQL string literal whatever `standard_conforming_strings` says: the escape
/// form, in which a quote and a backslash are each doubled.
pub(super) fn literal(text: &str) -> String {
    format!("E'{}'", text.replace('\\', "\\\\").replace('\'', "''"))
}

fn row_to_node(r: &Row) -> FsResult<Node> {
    node_at(r, 0)
}

/// The node in the twelve columns of `r` from `at` on (`ino, kind, perm, uid, gid, rdev, size,
/// nlink, atime, mtime, ctime, crtime`).
pub(super) fn node_at(r: &Row, at: usize) -> FsResult<Node> {
    let kind: i32 = r.get(at + 1);
    let kind = FileKind::from_mode(kind as u32)
        .ok_or_else(|| FsError::new(Errno::EIO, format!("postgres: inode of unknown kind {kind}")))?;
    Ok(Node {
        ino: r.get::<_, i64>(at) as u64,
        kind,
        perm: r.get::<_, i32>(at + 2) as u32,
        uid: r.get::<_, i64>(at + 3) as u32,
        gid: r.get::<_, i64>(at + 4) as u32,
        rdev: r.get::<_, i64>(at + 5) as u32,
        size: r.get::<_, i64>(at + 6) as u64,
        nlink: r.get::<_, i32>(at + 7) as u32,
        atime: r.get(at + 8),
        mtime: r.get(at + 9),
        ctime: r.get(at + 10),
        crtime: r.get(at + 11),
    })
}

impl<'a> Sql<'a> {
    pub fn new(
        client: &'a mut Client,
        stmts: &'a mut HashMap<&'static str, Statement>,
        settings: &'a PgSettings,
    ) -> Sql<'a> {
        Sql {
            client: RefCell::new(client),
            stmts: RefCell::new(stmts),
            settings,
            walked: RefCell::new(HashMap::new()),
            notifications: RefCell::new(Vec::new()),
        }
    }

    fn stmt(&self, sql: &'static str) -> FsResult<Statement> {
        if let Some(s) = self.stmts.borrow().get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.borrow_mut().prepare(sql).map_err(|e| self.settings.error(e))?;
        self.stmts.borrow_mut().insert(sql, s.clone());
        Ok(s)
    }

    pub fn rows(&self, sql: &'static str, params: &[&(dyn ToSql + Sync)]) -> FsResult<Vec<Row>> {
        let stmt = self.stmt(sql)?;
        self.client.borrow_mut().query(&stmt, params).map_err(|e| self.settings.error(e))
    }

    pub fn row(&self, sql: &'static str, params: &[&(dyn ToSql + Sync)]) -> FsResult<Option<Row>> {
        Ok(self.rows(sql, params)?.into_iter().next())
    }

    /// Runs a statement that changes rows; returns how many.
    pub fn exec(&self, sql: &'static str, params: &[&(dyn ToSql + Sync)]) -> FsResult<u64> {
        self.walked.borrow_mut().clear();
        let stmt = self.stmt(sql)?;
        self.client.borrow_mut().execute(&stmt, params).map_err(|e| self.settings.error(e))
    }

    pub fn reserve_inos(&self) -> FsResult<u64> {
        let row = self.row("SELECT nextval('inode_seq')", &[])?.expect("nextval returns a row");
        Ok(row.get::<_, i64>(0) as u64)
    }

    pub fn find_namespace(&self, name: &str) -> FsResult<Option<(i64, u64)>> {
        Ok(self
            .row("SELECT id, root FROM namespaces WHERE name = $1", &[&name])?
            .map(|r| (i64::from(r.get::<_, i32>(0)), r.get::<_, i64>(1) as u64)))
    }

    pub fn insert_namespace(&self, name: &str) -> FsResult<i64> {
        self.walked.borrow_mut().clear();
        let row = self.row("INSERT INTO namespaces (name, root) VALUES ($1, 0) RETURNING id", &[&name])?;
        Ok(i64::from(row.expect("RETURNING gives a row").get::<_, i32>(0)))
    }

    pub fn set_namespace_root(&self, ns: i64, root: u64) -> FsResult<()> {
        self.exec("UPDATE namespaces SET root = $2 WHERE id = $1", &[&(ns as i32), &(root as i64)])?;
        Ok(())
    }

    /// The node `ino`, its row locked until the transaction ends (for changes of its data or
    /// attributes).
    pub fn lock_node(&self, ino: u64) -> FsResult<Option<Node>> {
        self.walked.borrow_mut().clear();
        let row = self.row(
            "SELECT ino, kind, perm, uid, gid, rdev, size, nlink, atime, mtime, ctime, crtime
             FROM inodes WHERE ino = $1 FOR UPDATE",
            &[&(ino as i64)],
        )?;
        row.as_ref().map(row_to_node).transpose()
    }

    pub fn list_dir(&self, ino: u64) -> FsResult<Vec<DirEntry>> {
        // Each entry's node by its key (see `list_path`).
        let rows = self.rows(
            "SELECT d.name, (SELECT i.kind FROM inodes i WHERE i.ino = d.child) FROM dentries d
             WHERE d.parent = $1",
            &[&(ino as i64)],
        )?;
        rows.iter()
            .filter_map(|r| Some((r.get::<_, String>(0), r.get::<_, Option<i32>>(1)?)))
            .map(|(name, kind)| {
                let kind = FileKind::from_mode(kind as u32).ok_or_else(|| FsError::errno(Errno::EIO))?;
                Ok(DirEntry { name, kind })
            })
            .collect()
    }

    /// The entries of the directory at `path` below `root`, walked and listed in one query
    /// (a listing is most of what `git status` asks, one per directory). A path that does
    /// not lead to a directory is walked again by [`Tree::walk`], for its errno.
    pub fn list_path(&self, root: u64, path: &str) -> FsResult<Vec<DirEntry>> {
        let comps = components(path)?;
        let rows = self.rows(
            concat!(
                walk_cte!(),
                // The listing is a subquery of the walked directory (`OFFSET 0` keeps the
                // planner from flattening it) that reads each entry's node by its key:
                // joined plainly, the planner hashes the whole inode table for a few dozen
                // rows (it prices an index probe at four page reads).
                "SELECT l.name, l.kind FROM w
             LEFT JOIN LATERAL (SELECT d.name, (SELECT c.kind FROM inodes c WHERE c.ino = d.child) AS kind
                 FROM dentries d WHERE d.parent = w.ino OFFSET 0) l ON true
             WHERE w.depth = cardinality($2::text[]) AND w.kind = $3"
            ),
            &[&(root as i64), &comps, &(FileKind::Dir.mode_bits() as i32)],
        )?;
        if rows.is_empty() {
            // The errno of the walk, or (made meanwhile) the listing.
            let dir = tree::resolve_dir(self, root, path)?;
            return self.list_dir(dir.ino);
        }
        rows.iter()
            .filter_map(|r| Some((r.get::<_, Option<String>>(0)?, r.get::<_, Option<i32>>(1)?)))
            .map(|(name, kind)| {
                let kind = FileKind::from_mode(kind as u32).ok_or_else(|| FsError::errno(Errno::EIO))?;
                Ok(DirEntry { name, kind })
            })
            .collect()
    }

    /// The nodes of the named entries of directory `dir` (one query for a readdirplus batch).
    pub fn entries(&self, dir: u64, names: &[&str]) -> FsResult<HashMap<String, Node>> {
        let rows = self.rows(
            "SELECT d.name, i.ino, i.kind, i.perm, i.uid, i.gid, i.rdev, i.size, i.nlink, i.atime, i.mtime,
                    i.ctime, i.crtime
             FROM dentries d CROSS JOIN LATERAL (SELECT * FROM inodes i WHERE i.ino = d.child OFFSET 0) i
             WHERE d.parent = $1 AND d.name = ANY($2)",
            &[&(dir as i64), &names],
        )?;
        let mut out = HashMap::new();
        for r in &rows {
            out.insert(r.get::<_, String>(0), node_at(r, 1)?);
        }
        Ok(out)
    }

    pub fn symlink_target(&self, ino: u64) -> FsResult<Vec<u8>> {
        let row = self.row("SELECT target FROM inodes WHERE ino = $1", &[&(ino as i64)])?;
        Ok(row.and_then(|r| r.get::<_, Option<Vec<u8>>>(0)).unwrap_or_default())
    }

    /// The stored chunks of `ino` from `first` to `last`, and the file's size (`None` when the
    /// inode is gone).
    pub fn read_chunks(&self, ino: u64, first: u64, last: u64) -> FsResult<Option<(u64, Chunks)>> {
        let rows = self.rows(
            "SELECT i.size, c.idx, c.data FROM inodes i
             LEFT JOIN chunks c ON c.ino = i.ino AND c.idx BETWEEN $2 AND $3 WHERE i.ino = $1",
            &[&(ino as i64), &(first as i64), &(last as i64)],
        )?;
        let Some(first_row) = rows.first() else {
            return Ok(None);
        };
        let size = first_row.get::<_, i64>(0) as u64;
        let found = rows
            .iter()
            .filter_map(|r| Some((r.get::<_, Option<i64>>(1)? as u64, r.get::<_, Option<Vec<u8>>>(2)?)))
            .collect();
        Ok(Some((size, found)))
    }

    /// A data write's size and times: the size becomes `size`, mtime and ctime `now`.
    pub fn set_data_attrs(&self, ino: u64, size: u64, now: i64) -> FsResult<()> {
        self.exec(
            "UPDATE inodes SET size = $2, mtime = $3, ctime = greatest(ctime, $3) WHERE ino = $1",
            &[&(ino as i64), &(size as i64), &now],
        )?;
        Ok(())
    }

    /// Queues a notification on `channel` (a plain SQL name of ours) for [`Sql::commit_batch`].
    pub fn notify(&self, channel: &str, payload: &str) -> FsResult<()> {
        self.queue_notification("pg_notify", channel, payload)
    }

    /// Like [`Sql::notify`], through the server's `notice`: not sent while the instance that
    /// `payload` names is alone on the namespace (see `quiet`).
    pub fn notice(&self, channel: &str, payload: &str) -> FsResult<()> {
        self.queue_notification("notice", channel, payload)
    }

    fn queue_notification(&self, function: &str, channel: &str, payload: &str) -> FsResult<()> {
        self.notifications
            .borrow_mut()
            .push(format!("SELECT {function}('{channel}', {});", literal(payload)));
        Ok(())
    }

    /// The statements that end this transaction: the queued notifications, then COMMIT, for
    /// one simple-query round trip (the server delivers the notifications at the commit).
    pub fn commit_batch(&self) -> String {
        let mut batch: String = self.notifications.borrow_mut().drain(..).collect();
        batch.push_str("COMMIT");
        batch
    }
}

/// A new inode's column values as the server takes them, for the parameters `$1`–`$11` of
/// the statement that inserts one.
struct InodeRow {
    ino: i64,
    ns: i32,
    kind: i32,
    perm: i32,
    uid: i64,
    gid: i64,
    rdev: i64,
    size: i64,
    nlink: i32,
}

impl InodeRow {
    fn new(ino: u64, n: &NewNode<'_>) -> InodeRow {
        InodeRow {
            ino: ino as i64,
            ns: n.ns as i32,
            kind: n.kind.mode_bits() as i32,
            perm: n.perm as i32,
            uid: i64::from(n.uid),
            gid: i64::from(n.gid),
            rdev: i64::from(n.rdev),
            size: n.target.map_or(0, |t| t.len() as i64),
            nlink: n.nlink as i32,
        }
    }

    /// `ino, ns, kind, perm, uid, gid, rdev, size, nlink, now, target`.
    fn params<'a>(&'a self, n: &'a NewNode<'_>) -> [&'a (dyn ToSql + Sync); 11] {
        [
            &self.ino,
            &self.ns,
            &self.kind,
            &self.perm,
            &self.uid,
            &self.gid,
            &self.rdev,
            &self.size,
            &self.nlink,
            &n.now,
            &n.target,
        ]
    }
}

impl Tree for Sql<'_> {
    fn lookup(&self, parent: u64, name: &str) -> FsResult<Option<u64>> {
        let row = self
            .row("SELECT child FROM dentries WHERE parent = $1 AND name = $2", &[&(parent as i64), &name])?;
        Ok(row.map(|r| r.get::<_, i64>(0) as u64))
    }

    fn node(&self, ino: u64) -> FsResult<Option<Node>> {
        if let Some(n) = self.walked.borrow().get(&ino) {
            return Ok(Some(n.clone()));
        }
        let row = self.row(
            "SELECT ino, kind, perm, uid, gid, rdev, size, nlink, atime, mtime, ctime, crtime
             FROM inodes WHERE ino = $1",
            &[&(ino as i64)],
        )?;
        row.as_ref().map(row_to_node).transpose()
    }

    /// The whole path in one recursive query, which also reads every node on the way.
    fn walk(&self, root: u64, path: &str) -> FsResult<Vec<u64>> {
        let comps = components(path)?;
        let rows = self.rows(
            concat!(
                walk_cte!(),
                "SELECT ino, kind, perm, uid, gid, rdev, size, nlink, atime, mtime, ctime, crtime
             FROM w ORDER BY depth"
            ),
            &[&(root as i64), &comps],
        )?;
        let nodes = rows.iter().map(row_to_node).collect::<FsResult<Vec<Node>>>()?;
        let Some(last) = nodes.last() else {
            return Err(FsError::errno(Errno::ENOENT)); // the root itself is gone
        };
        if nodes.len() < comps.len() + 1 {
            return Err(tree::missing_under(last.kind));
        }
        let chain = nodes.iter().map(|n| n.ino).collect();
        let mut walked = self.walked.borrow_mut();
        walked.clear();
        walked.extend(nodes.into_iter().map(|n| (n.ino, n)));
        Ok(chain)
    }

    fn insert_node(&self, ino: u64, n: &NewNode<'_>) -> FsResult<()> {
        let row = InodeRow::new(ino, n);
        self.exec(
            "INSERT INTO inodes (ino, ns, kind, perm, uid, gid, rdev, size, nlink, atime, mtime, ctime, crtime,
             target) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10, $10, $10, $11)",
            &row.params(n),
        )?;
        Ok(())
    }

    fn insert_dentry(&self, parent: u64, name: &str, child: u64) -> FsResult<()> {
        self.exec(
            "INSERT INTO dentries (parent, name, child) VALUES ($1, $2, $3)",
            &[&(parent as i64), &name, &(child as i64)],
        )?;
        Ok(())
    }

    fn remove_dentry(&self, parent: u64, name: &str) -> FsResult<()> {
        self.exec("DELETE FROM dentries WHERE parent = $1 AND name = $2", &[&(parent as i64), &name])?;
        Ok(())
    }

    fn set_dentry_child(&self, parent: u64, name: &str, child: u64) -> FsResult<()> {
        self.exec(
            "UPDATE dentries SET child = $3 WHERE parent = $1 AND name = $2",
            &[&(parent as i64), &name, &(child as i64)],
        )?;
        Ok(())
    }

    fn touch_dir(&self, ino: u64, nlink_delta: i64, now: i64) -> FsResult<()> {
        self.exec(
            "UPDATE inodes SET nlink = nlink + $2, mtime = $3, ctime = $3 WHERE ino = $1",
            &[&(ino as i64), &(nlink_delta as i32), &now],
        )?;
        Ok(())
    }

    fn add_nlink(&self, ino: u64, delta: i64, now: i64) -> FsResult<u32> {
        self.walked.borrow_mut().clear();
        let row = self.row(
            "UPDATE inodes SET nlink = greatest(nlink + $2, 0), ctime = $3 WHERE ino = $1 RETURNING nlink",
            &[&(ino as i64), &(delta as i32), &now],
        )?;
        Ok(row.ok_or_else(|| FsError::errno(Errno::ENOENT))?.get::<_, i32>(0) as u32)
    }

    fn set_ctime(&self, ino: u64, now: i64) -> FsResult<()> {
        self.exec("UPDATE inodes SET ctime = $2 WHERE ino = $1", &[&(ino as i64), &now])?;
        Ok(())
    }

    fn has_children(&self, ino: u64) -> FsResult<bool> {
        Ok(self.row("SELECT 1 FROM dentries WHERE parent = $1 LIMIT 1", &[&(ino as i64)])?.is_some())
    }

    fn update_attrs(&self, n: &Node) -> FsResult<()> {
        self.exec(
            "UPDATE inodes SET perm = $2, uid = $3, gid = $4, size = $5, atime = $6, mtime = $7, ctime = $8
             WHERE ino = $1",
            &[
                &(n.ino as i64),
                &(n.perm as i32),
                &i64::from(n.uid),
                &i64::from(n.gid),
                &(n.size as i64),
                &n.atime,
                &n.mtime,
                &n.ctime,
            ],
        )?;
        Ok(())
    }

    fn truncate_chunks(&self, ino: u64, size: u64) -> FsResult<()> {
        let (first_gone, tail) = chunks::truncation(size);
        self.exec("DELETE FROM chunks WHERE ino = $1 AND idx >= $2", &[&(ino as i64), &(first_gone as i64)])?;
        if tail != 0 {
            self.exec(
                "UPDATE chunks SET data = substring(data FROM 1 FOR $3) WHERE ino = $1 AND idx = $2
                 AND length(data) > $3",
                &[&(ino as i64), &((size / chunks::CHUNK_SIZE) as i64), &(tail as i32)],
            )?;
        }
        Ok(())
    }

    fn get_xattr(&self, ino: u64, name: &str) -> FsResult<Option<Vec<u8>>> {
        let row =
            self.row("SELECT value FROM xattrs WHERE ino = $1 AND name = $2", &[&(ino as i64), &name])?;
        Ok(row.map(|r| r.get(0)))
    }

    fn xattr_names(&self, ino: u64) -> FsResult<Vec<String>> {
        let rows = self.rows("SELECT name FROM xattrs WHERE ino = $1 ORDER BY name", &[&(ino as i64)])?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    fn put_xattr(&self, ino: u64, name: &str, value: &[u8]) -> FsResult<()> {
        self.exec(
            "INSERT INTO xattrs (ino, name, value) VALUES ($1, $2, $3)
             ON CONFLICT (ino, name) DO UPDATE SET value = excluded.value",
            &[&(ino as i64), &name, &value],
        )?;
        Ok(())
    }

    fn delete_xattr(&self, ino: u64, name: &str) -> FsResult<bool> {
        Ok(self.exec("DELETE FROM xattrs WHERE ino = $1 AND name = $2", &[&(ino as i64), &name])? != 0)
    }
}

/// The components of a path below the route's root, each checked as a name.
pub(super) fn components(path: &str) -> FsResult<Vec<&str>> {
    let comps: Vec<&str> = if path.is_empty() { Vec::new() } else { path.split('/').collect() };
    for comp in &comps {
        tree::check_name(comp)?;
    }
    Ok(comps)
}

#[cfg(test)]
mod literal_tests {
    #[test]
    fn quotes_and_backslashes_are_escaped() {
        assert_eq!(super::literal(r"a'b\c"), r"E'a''b\\c'");
        assert_eq!(super::literal("plain/path"), "E'plain/path'");
    }
}
