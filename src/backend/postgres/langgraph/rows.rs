//! The statements of the `langgraph` layout: what a path is (a key of the store, a directory
//! of the side table, or a directory implied by the keys below it), listings, and the writes
//! of values and metadata. Every statement names `public.store` (LangGraph's table) and the
//! side table unqualified (the connection's search path is agentvfs's schema).

use postgres::Row;

use super::super::store::Sql;
use super::schema::{KIND_DIR, KIND_FILE};
use crate::backend::tree::{self, Node};
use crate::backend::{Caller, DirEntry, FileKind};
use crate::error::{Errno, FsError, FsResult};

/// The largest file the layout stores: a jsonb value holds at most 255 MiB, and base64 takes
/// a third more.
pub(super) const MAX_FILE_SIZE: u64 = 64 << 20;

/// The key of the file at `path` (route-relative).
pub(super) fn key(path: &str) -> String {
    format!("/{path}")
}

/// A stable inode number for `path` of `prefix` (FNV-1a): the same on every daemon, new after
/// a rename (the store has no identity of its own for a value).
fn ino(prefix: &str, path: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in prefix.bytes().chain([0]).chain(path.bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h | 2 // never 0 or 1 (the FUSE root)
}

/// The keys of the directories above `path`: a key there names a file, below which nothing is.
fn ancestor_keys(path: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = path[at..].find('/') {
        out.push(key(&path[..at + i]));
        at += i + 1;
    }
    out
}

fn bad(what: &str) -> FsError {
    FsError::new(Errno::EIO, format!("langgraph store: {what}"))
}

/// What `path` is: a file (a key), a directory (in the side table, or implied by keys below
/// it), or nothing; ENOTDIR when a key above it names a file.
pub(super) fn stat(sql: &Sql<'_>, prefix: &str, path: &str) -> FsResult<Option<Node>> {
    for comp in path.split('/').filter(|c| !c.is_empty()) {
        tree::check_name(comp)?;
    }
    let row = sql.row(
        "SELECT s.key IS NOT NULL, octet_length(lg_content(s.value))::bigint,
                coalesce(lg_ns(s.value->>'modified_at'), (extract(epoch FROM s.updated_at) * 1e9)::bigint, 0),
                coalesce(lg_ns(s.value->>'created_at'), (extract(epoch FROM s.created_at) * 1e9)::bigint, 0),
                (SELECT (extract(epoch FROM max(u.updated_at)) * 1e9)::bigint FROM public.store u
                 WHERE u.prefix = $1 AND starts_with(u.key, $2 || '/')),
                EXISTS (SELECT 1 FROM public.store a WHERE a.prefix = $1 AND a.key = ANY($4)),
                m.kind, m.perm, m.uid, m.gid, m.atime, m.mtime, m.ctime, m.crtime, r.uid, r.gid
         FROM (SELECT 1) one
         LEFT JOIN public.store s ON s.prefix = $1 AND s.key = $2 AND $3 <> ''
         LEFT JOIN lg_nodes m ON m.prefix = $1 AND m.path = $3
         LEFT JOIN lg_nodes r ON r.prefix = $1 AND r.path = ''",
        &[&prefix, &key(path), &path, &ancestor_keys(path)],
    )?;
    let r = row.ok_or_else(|| bad("no row"))?;
    if r.get::<_, bool>(5) {
        return Err(FsError::errno(Errno::ENOTDIR));
    }
    Ok(node(&r, prefix, path))
}

/// The node a [`stat`] row describes.
fn node(r: &Row, prefix: &str, path: &str) -> Option<Node> {
    let is_file: bool = r.get(0);
    let meta_kind: Option<i32> = r.get(6);
    let below: Option<i64> = r.get(4);
    let owner = Caller::daemon();
    let (uid, gid) = match (r.get::<_, Option<i64>>(14), r.get::<_, Option<i64>>(15)) {
        (Some(u), Some(g)) => (u as u32, g as u32),
        _ => (owner.uid, owner.gid),
    };
    let mut n = Node {
        ino: ino(prefix, path),
        kind: FileKind::Dir,
        perm: 0o755,
        uid,
        gid,
        rdev: 0,
        size: 0,
        // Directories: 1, "not counted" (as btrfs), so that no tool takes 2 for "no subdirectories".
        nlink: 1,
        atime: 0,
        mtime: 0,
        ctime: 0,
        crtime: 0,
    };
    let meta = |n: &mut Node| {
        n.perm = r.get::<_, i32>(7) as u32;
        n.uid = r.get::<_, i64>(8) as u32;
        n.gid = r.get::<_, i64>(9) as u32;
        n.atime = r.get(10);
        n.mtime = r.get(11);
        n.ctime = r.get(12);
        n.crtime = r.get(13);
    };
    if is_file {
        n.kind = FileKind::File;
        n.perm = 0o644;
        n.size = r.get::<_, i64>(1) as u64;
        let mtime: i64 = r.get(2);
        if meta_kind == Some(KIND_FILE) {
            meta(&mut n);
        }
        // The value's times are LangGraph's writers' too: they win over the side table's.
        n.mtime = mtime;
        n.crtime = r.get(3);
        n.ctime = n.ctime.max(mtime);
        if meta_kind != Some(KIND_FILE) {
            n.atime = mtime;
        }
        return Some(n);
    }
    match (meta_kind, below) {
        (Some(KIND_DIR), _) => meta(&mut n),
        (_, Some(t)) => (n.atime, n.mtime, n.ctime, n.crtime) = (t, t, t, t),
        _ if path.is_empty() => {}
        _ => return None,
    }
    Some(n)
}

/// Like [`stat`], ENOENT for nothing.
pub(super) fn must_stat(sql: &Sql<'_>, prefix: &str, path: &str) -> FsResult<Node> {
    stat(sql, prefix, path)?.ok_or_else(|| FsError::errno(Errno::ENOENT))
}

/// The entries of directory `path`: the first component below it of every key under it (a
/// name that is both a key and a directory is the file), and the side table's directories.
pub(super) fn list(sql: &Sql<'_>, prefix: &str, path: &str) -> FsResult<Vec<DirEntry>> {
    let base = if path.is_empty() { String::new() } else { format!("{path}/") };
    let rows = sql.rows(
        "SELECT name, bool_and(dir) FROM (
             SELECT split_part(substr(key, char_length($2) + 1), '/', 1) AS name,
                    strpos(substr(key, char_length($2) + 1), '/') > 0 AS dir
             FROM public.store WHERE prefix = $1 AND starts_with(key, $2)
           UNION ALL
             SELECT substr(path, char_length($3) + 1), true FROM lg_nodes
             WHERE prefix = $1 AND kind = $4 AND path <> '' AND starts_with(path, $3)
               AND strpos(substr(path, char_length($3) + 1), '/') = 0
         ) c GROUP BY name",
        &[&prefix, &key(&base), &base, &KIND_DIR],
    )?;
    Ok(rows
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, bool>(1)))
        // Names no directory entry can have are not shown (keys such as `/a//b` or `/a/`).
        .filter(|(name, _)| !name.is_empty() && name != "." && name != ".." && name.len() <= tree::NAME_MAX)
        .map(|(name, dir)| DirEntry { name, kind: if dir { FileKind::Dir } else { FileKind::File } })
        .collect())
}

/// Whether anything is below directory `path` (a key or a side-table entry).
pub(super) fn has_children(sql: &Sql<'_>, prefix: &str, path: &str) -> FsResult<bool> {
    let base = if path.is_empty() { String::new() } else { format!("{path}/") };
    let row = sql.row(
        "SELECT EXISTS (SELECT 1 FROM public.store WHERE prefix = $1 AND starts_with(key, $2))
             OR EXISTS (SELECT 1 FROM lg_nodes WHERE prefix = $1 AND path <> '' AND starts_with(path, $3))",
        &[&prefix, &key(&base), &base],
    )?;
    Ok(row.is_some_and(|r| r.get(0)))
}

/// The whole content of the file at `path` (`None`: no such key).
pub(super) fn content(sql: &Sql<'_>, prefix: &str, path: &str) -> FsResult<Option<Vec<u8>>> {
    let row = sql.row(
        "SELECT lg_content(value) FROM public.store WHERE prefix = $1 AND key = $2",
        &[&prefix, &key(path)],
    )?;
    Ok(row.map(|r| r.get(0)))
}

/// `size` bytes of the file at `path` from `offset`, and its size (`None`: no such key).
pub(super) fn read_range(
    sql: &Sql<'_>,
    prefix: &str,
    path: &str,
    offset: u64,
    size: u32,
) -> FsResult<Option<(Vec<u8>, u64)>> {
    let row = sql.row(
        "SELECT substring(c FROM $3 FOR $4), octet_length(c)::bigint
         FROM (SELECT lg_content(value) AS c FROM public.store WHERE prefix = $1 AND key = $2) v",
        &[
            &prefix,
            &key(path),
            &(offset.min(i32::MAX as u64) as i32 + 1),
            &(size.min(i32::MAX as u32) as i32),
        ],
    )?;
    Ok(row.map(|r| (r.get(0), r.get::<_, i64>(1) as u64)))
}

/// Stores `data` as the whole value of the file at `path`, as StoreBackend writes a value:
/// text when it is UTF-8 (without NUL, which jsonb cannot hold), else base64; `modified_at`
/// is `now`, `created_at` kept. The store's trigger announces it.
pub(super) fn put(sql: &Sql<'_>, prefix: &str, path: &str, data: &[u8], now: i64) -> FsResult<()> {
    if data.len() as u64 > MAX_FILE_SIZE {
        return Err(FsError::errno(Errno::EFBIG));
    }
    let utf8 = std::str::from_utf8(data).is_ok() && !data.contains(&0);
    sql.exec(
        "INSERT INTO public.store AS s (prefix, key, value, created_at, updated_at)
         VALUES ($1, $2, lg_value($3, $4, lg_iso($5), lg_iso($5)), now(), now())
         ON CONFLICT (prefix, key) DO UPDATE
         SET value = lg_value($3, $4, coalesce(s.value->>'created_at', lg_iso($5)), lg_iso($5)), updated_at = now()",
        &[&prefix, &key(path), &data, &utf8, &now],
    )?;
    Ok(())
}

/// Sets the `modified_at` of the file at `path` (utimens).
pub(super) fn set_modified(sql: &Sql<'_>, prefix: &str, path: &str, ns: i64) -> FsResult<()> {
    sql.exec(
        "UPDATE public.store SET value = jsonb_set(value, '{modified_at}', to_jsonb(lg_iso($3))), updated_at = now()
         WHERE prefix = $1 AND key = $2",
        &[&prefix, &key(path), &ns],
    )?;
    Ok(())
}

/// Writes the side table's row of `n` at `path`.
pub(super) fn put_meta(sql: &Sql<'_>, prefix: &str, path: &str, n: &Node) -> FsResult<()> {
    let kind = if n.kind == FileKind::Dir { KIND_DIR } else { KIND_FILE };
    sql.exec(
        "INSERT INTO lg_nodes (prefix, path, kind, perm, uid, gid, atime, mtime, ctime, crtime)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
         ON CONFLICT (prefix, path) DO UPDATE SET kind = $3, perm = $4, uid = $5, gid = $6, atime = $7,
             mtime = $8, ctime = $9, crtime = $10",
        &[
            &prefix,
            &path,
            &kind,
            &(n.perm as i32),
            &i64::from(n.uid),
            &i64::from(n.gid),
            &n.atime,
            &n.mtime,
            &n.ctime,
            &n.crtime,
        ],
    )?;
    Ok(())
}

/// The root directory's side-table row (its owner is the default owner of every file that
/// has none), made once, the daemon's user's.
pub(super) fn ensure_root(sql: &Sql<'_>, prefix: &str) -> FsResult<()> {
    let owner = Caller::daemon();
    let now = tree::now_ns();
    sql.exec(
        "INSERT INTO lg_nodes (prefix, path, kind, perm, uid, gid, atime, mtime, ctime, crtime)
         VALUES ($1, '', $2, 493, $3, $4, $5, $5, $5, $5) ON CONFLICT DO NOTHING",
        &[&prefix, &KIND_DIR, &i64::from(owner.uid), &i64::from(owner.gid), &now],
    )?;
    Ok(())
}

/// An entry of directory `path` came or went: its mtime and ctime become `now` (when it has a
/// side-table row; an implied directory's times are its newest key's).
pub(super) fn touch_dir(sql: &Sql<'_>, prefix: &str, path: &str, now: i64) -> FsResult<()> {
    sql.exec(
        "UPDATE lg_nodes SET mtime = $3, ctime = $3 WHERE prefix = $1 AND path = $2 AND kind = $4",
        &[&prefix, &path, &now, &KIND_DIR],
    )?;
    Ok(())
}

/// Deletes the file at `path`: its key and its side-table row.
pub(super) fn delete_file(sql: &Sql<'_>, prefix: &str, path: &str) -> FsResult<()> {
    sql.exec("DELETE FROM public.store WHERE prefix = $1 AND key = $2", &[&prefix, &key(path)])?;
    sql.exec("DELETE FROM lg_nodes WHERE prefix = $1 AND path = $2", &[&prefix, &path])?;
    Ok(())
}

/// Deletes the side-table row of `path` (an empty directory).
pub(super) fn delete_meta(sql: &Sql<'_>, prefix: &str, path: &str) -> FsResult<()> {
    sql.exec("DELETE FROM lg_nodes WHERE prefix = $1 AND path = $2", &[&prefix, &path])?;
    Ok(())
}

/// Moves the file at `from` to `to` (which is free): its key and its side-table row.
pub(super) fn move_file(sql: &Sql<'_>, prefix: &str, from: &str, to: &str) -> FsResult<()> {
    sql.exec(
        "UPDATE public.store SET key = $3, updated_at = now() WHERE prefix = $1 AND key = $2",
        &[&prefix, &key(from), &key(to)],
    )?;
    sql.exec("UPDATE lg_nodes SET path = $3 WHERE prefix = $1 AND path = $2", &[&prefix, &from, &to])?;
    Ok(())
}

/// Moves directory `from` and everything below it to `to` (which is free).
pub(super) fn move_dir(sql: &Sql<'_>, prefix: &str, from: &str, to: &str) -> FsResult<()> {
    sql.exec(
        "UPDATE public.store SET key = $3 || substr(key, char_length($2) + 1), updated_at = now()
         WHERE prefix = $1 AND starts_with(key, $2)",
        &[&prefix, &key(&format!("{from}/")), &key(&format!("{to}/"))],
    )?;
    sql.exec(
        "UPDATE lg_nodes SET path = $3 || substr(path, char_length($2) + 1)
         WHERE prefix = $1 AND (path = $2 OR starts_with(path, $2 || '/'))",
        &[&prefix, &from, &to],
    )?;
    Ok(())
}
