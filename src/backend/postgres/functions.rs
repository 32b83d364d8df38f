//! Tree operations as functions on the server, each called in one round trip instead of a
//! transaction of four or more (`BEGIN` with the name lock, the walk, the change, the
//! notification with `COMMIT`): their SQL (a migration), and the calls. `create_at` makes a
//! node (create, mknod, mkdir, symlink), `unlink_at` takes a non-directory's name, `rmdir_at`
//! an empty directory's, `link_at` adds a name, `rename_at` is renameat2, `drop_nameless`
//! deletes an orphan's rows, and [`Sql::set_attrs_at`] (one plain statement) changes
//! attributes other than the size.
//!
//! A call is one statement outside any transaction, so it commits on its own. Inside a
//! function, each statement reads the data committed before it started, so a walk that follows
//! the name lock sees every name change that held the lock before. The checks and results are
//! those of the shared tree logic ([`tree::create_in`], [`tree::ownership`],
//! [`tree::rename_in`]); the backend suite, pjdfstest and the model test run on this route and
//! hold both to the same outcomes.

use super::store::{components, node_at, walk_cte, Sql};
use crate::backend::tree::{self, NewNode, Node};
use crate::backend::{SetAttr, TimeSet};
use crate::error::{Errno, FsError, FsResult};

/// The walk from `root_ino` to the directory whose components are the array `$dir`, in the
/// functions below, into `dir_ino`, `dir_kind`, `dir_perm` and `dir_gid`; a missing name
/// returns ENOENT (2), a name under a non-directory or a non-directory at the end ENOTDIR (20).
/// (Written out in each function: a nested call of a function costs the server more than the
/// walk.) Each step reads the node by the key its name gives, in a subquery: as a join, the
/// planner's generic plan of a table it believes small scans the whole `inodes` index per step
/// (190 µs against 20 µs in a namespace of 2,000 live and 29,000 dead rows).
/// With a second name, `walk_to_dir!(dir, chain)` also collects the inodes walked, from the
/// root to the directory, into the array `chain`.
macro_rules! walk_to_dir {
    ($dir:ident) => {
        walk_to_dir!(@ $dir, "")
    };
    ($dir:ident, $chain:ident) => {
        walk_to_dir!(@ $dir, concat!("
        ", stringify!($chain), " := ", stringify!($chain), " || dir_ino;"))
    };
    (@ $dir:ident, $step:expr) => {
        concat!(
            "
    dir_ino := root_ino;
    SELECT i.kind, i.perm, i.gid INTO dir_kind, dir_perm, dir_gid FROM inodes i WHERE i.ino = root_ino;
    IF NOT FOUND THEN
        out_errno := 2;
        RETURN;
    END IF;",
            $step,
            "
    FOR step IN 1 .. coalesce(array_length(",
            stringify!($dir),
            ", 1), 0) LOOP
        IF dir_kind <> 16384 THEN
            out_errno := 20;
            RETURN;
        END IF;
        SELECT i.ino, i.kind, i.perm, i.gid INTO dir_ino, dir_kind, dir_perm, dir_gid
            FROM inodes i WHERE i.ino = (SELECT d.child FROM dentries d
                WHERE d.parent = dir_ino AND d.name = ",
            stringify!($dir),
            "[step]);
        IF NOT FOUND THEN
            out_errno := 2;
            RETURN;
        END IF;",
            $step,
            "
    END LOOP;
    IF dir_kind <> 16384 THEN
        out_errno := 20;
        RETURN;
    END IF;
"
        )
    };
}

/// The variables [`walk_to_dir`] fills, declared first in each function that walks.
macro_rules! walk_vars {
    () => {
        "
DECLARE
    dir_ino bigint;
    dir_kind integer;
    dir_perm integer;
    dir_gid bigint;
"
    };
}

pub(super) use {walk_to_dir, walk_vars};

/// After [`walk_to_dir`]: the node named `$name` in the directory, into `$ino` and `$kind`;
/// ENOENT if there is none.
macro_rules! find_leaf {
    ($ino:ident, $kind:ident, $name:ident) => {
        concat!(
            "
    SELECT i.ino, i.kind INTO ",
            stringify!($ino),
            ", ",
            stringify!($kind),
            "
        FROM inodes i WHERE i.ino = (SELECT d.child FROM dentries d
            WHERE d.parent = dir_ino AND d.name = ",
            stringify!($name),
            ");
    IF NOT FOUND THEN
        out_errno := 2;
        RETURN;
    END IF;
"
        )
    };
}

/// The parameters and the start of `unlink_at` and `rmdir_at`: the name lock, the walk to the
/// directory, and the node named `leaf`.
macro_rules! taking_a_name {
    () => {
        concat!(
            "(
    lock_key integer, ns_id integer, root_ino bigint, dir text[], leaf text, now_ns bigint,
    instance integer, kept bigint[], channel text, payload text,
    OUT out_errno integer, OUT out_ino bigint, OUT out_left integer)
LANGUAGE plpgsql AS $$",
            walk_vars!(),
            "    child_kind integer;
BEGIN
    PERFORM pg_advisory_xact_lock(lock_key, ns_id);",
            walk_to_dir!(dir),
            find_leaf!(out_ino, child_kind, leaf)
        )
    };
}

/// The end of `unlink_at` and `rmdir_at`: a node left with no link (`out_left`) loses every
/// row, unless it is one of `kept`; the notification is queued.
macro_rules! name_taken {
    () => {
        "
    IF out_left = 0 AND NOT out_ino = ANY(kept) THEN
        DELETE FROM inodes WHERE ino = out_ino;
        WITH c AS (DELETE FROM chunks WHERE ino = out_ino), x AS (DELETE FROM xattrs WHERE ino = out_ino)
        DELETE FROM dentries WHERE parent = out_ino;
    END IF;
    PERFORM pg_notify(channel, payload);
    out_errno := 0;
END $$;
"
    };
}

/// Migration 3: `create_at`, `unlink_at`, `rmdir_at` and `link_at`.
///
/// `create_at` walks to the directory, under the namespace's name lock; gives the new node the
/// directory's group (and, to a directory, its set-group-ID bit) when the directory is
/// set-group-ID; inserts the node and its name unless the name is taken; touches the
/// directory; and queues the notification. `out_errno` is 0, or ENOENT (2), ENOTDIR (20) or
/// EEXIST (17) with nothing changed.
///
/// `unlink_at` takes the name `leaf` of a non-directory from the directory, under the name
/// lock; touches the directory; drops the node's link count and, when that reaches 0, deletes
/// every row of the node, unless it is one of `kept` (the nodes this daemon has handles on),
/// which is marked as `instance`'s orphan instead (deleted at its last close, or by the next
/// daemon if this one dies first); and queues the notification. The inode's row goes first,
/// which waits for a write that holds it, so that the next statement sees (and deletes) the
/// chunks it committed. `out_errno` is 0 (with the node and the links it has left), or
/// ENOENT, ENOTDIR or EISDIR (21) with nothing changed.
///
/// `rmdir_at` removes the empty directory `leaf` the same way (the parent loses the link of
/// its `..`); `out_errno` is 0, or ENOENT, ENOTDIR or ENOTEMPTY (39) with nothing changed.
///
/// `link_at` gives the non-directory at `src_dir`/`src_leaf` the new name `leaf` in the
/// directory `dir`, under the name lock, and answers the node as it is then; `out_errno` is 0,
/// or ENOENT, ENOTDIR, EEXIST or EPERM (1, for a directory) with nothing changed.
pub(super) const MIGRATION: &str = concat!(
    "
CREATE FUNCTION create_at(
    lock_key integer, ns_id integer, root_ino bigint, dir text[], leaf text,
    new_ino bigint, new_kind integer, new_perm integer, new_uid bigint, caller_gid bigint,
    new_rdev bigint, new_size bigint, new_target bytea, now_ns bigint, channel text, payload text,
    OUT out_errno integer, OUT out_gid bigint, OUT out_perm integer)
LANGUAGE plpgsql AS $$",
    walk_vars!(),
    "    is_dir boolean := new_kind = 16384;
    made integer;
BEGIN
    PERFORM pg_advisory_xact_lock(lock_key, ns_id);",
    walk_to_dir!(dir),
    "
    IF dir_perm & 1024 <> 0 THEN
        out_gid := dir_gid;
        out_perm := CASE WHEN is_dir THEN new_perm | 1024 ELSE new_perm END;
    ELSE
        out_gid := caller_gid;
        out_perm := new_perm;
    END IF;
    WITH e AS (INSERT INTO dentries (parent, name, child) VALUES (dir_ino, leaf, new_ino)
            ON CONFLICT (parent, name) DO NOTHING RETURNING child),
        n AS (INSERT INTO inodes (ino, ns, kind, perm, uid, gid, rdev, size, nlink, atime, mtime,
                ctime, crtime, target)
            SELECT new_ino, ns_id, new_kind, out_perm, new_uid, out_gid, new_rdev, new_size,
                CASE WHEN is_dir THEN 2 ELSE 1 END, now_ns, now_ns, now_ns, now_ns, new_target FROM e),
        p AS (UPDATE inodes SET nlink = nlink + is_dir::integer, mtime = now_ns, ctime = now_ns
            WHERE ino = dir_ino AND EXISTS (SELECT 1 FROM e))
    SELECT count(*) INTO made FROM e;
    IF made = 0 THEN
        out_errno := 17;
        RETURN;
    END IF;
    PERFORM pg_notify(channel, payload);
    out_errno := 0;
END $$;

CREATE FUNCTION unlink_at",
    taking_a_name!(),
    "    IF child_kind = 16384 THEN
        out_errno := 21;
        RETURN;
    END IF;
    WITH d AS (DELETE FROM dentries WHERE parent = dir_ino AND name = leaf),
        p AS (UPDATE inodes SET mtime = now_ns, ctime = now_ns WHERE ino = dir_ino)
    UPDATE inodes SET nlink = greatest(nlink - 1, 0), ctime = now_ns,
            orphan_of = CASE WHEN nlink <= 1 THEN instance ELSE orphan_of END
        WHERE ino = out_ino RETURNING nlink INTO out_left;
",
    name_taken!(),
    "
CREATE FUNCTION rmdir_at",
    taking_a_name!(),
    "    IF child_kind <> 16384 THEN
        out_errno := 20;
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM dentries WHERE parent = out_ino) THEN
        out_errno := 39;
        RETURN;
    END IF;
    WITH d AS (DELETE FROM dentries WHERE parent = dir_ino AND name = leaf),
        p AS (UPDATE inodes SET nlink = greatest(nlink - 1, 0), mtime = now_ns, ctime = now_ns
            WHERE ino = dir_ino)
    UPDATE inodes SET nlink = 0, ctime = now_ns, orphan_of = instance WHERE ino = out_ino;
    out_left := 0;",
    name_taken!(),
    "
CREATE FUNCTION link_at(
    lock_key integer, ns_id integer, root_ino bigint, src_dir text[], src_leaf text, dir text[],
    leaf text, now_ns bigint, channel text, payload text, src_payload text,
    OUT out_errno integer, OUT ino bigint, OUT kind integer, OUT perm integer, OUT uid bigint,
    OUT gid bigint, OUT rdev bigint, OUT size bigint, OUT nlink integer, OUT atime bigint,
    OUT mtime bigint, OUT ctime bigint, OUT crtime bigint)
LANGUAGE plpgsql AS $$",
    walk_vars!(),
    "    src bigint;
    src_kind integer;
BEGIN
    PERFORM pg_advisory_xact_lock(lock_key, ns_id);",
    walk_to_dir!(src_dir),
    find_leaf!(src, src_kind, src_leaf),
    walk_to_dir!(dir),
    "
    IF EXISTS (SELECT 1 FROM dentries d WHERE d.parent = dir_ino AND d.name = leaf) THEN
        out_errno := 17;
        RETURN;
    END IF;
    IF src_kind = 16384 THEN
        out_errno := 1;
        RETURN;
    END IF;
    WITH e AS (INSERT INTO dentries (parent, name, child) VALUES (dir_ino, leaf, src)),
        p AS (UPDATE inodes SET mtime = now_ns, ctime = now_ns WHERE inodes.ino = dir_ino)
    UPDATE inodes i SET nlink = i.nlink + 1, ctime = now_ns WHERE i.ino = src
        RETURNING i.ino, i.kind, i.perm, i.uid, i.gid, i.rdev, i.size, i.nlink, i.atime, i.mtime,
            i.ctime, i.crtime
        INTO ino, kind, perm, uid, gid, rdev, size, nlink, atime, mtime, ctime, crtime;
    PERFORM pg_notify(channel, payload);
    PERFORM pg_notify(channel, src_payload);
    out_errno := 0;
END $$;
"
);

/// Migration 4: `rename_at`, renameat2(2) as [`tree::rename_in`] does it, in one call.
///
/// Under the name lock it walks to both directories (collecting the inodes on the way, for
/// the checks against moving a directory into itself), finds the source and any target, and
/// makes the shared logic's checks in its order: RENAME_NOREPLACE (1) over a target EEXIST,
/// RENAME_EXCHANGE (2) without one ENOENT, the source an ancestor of the target's directory
/// EINVAL, the target an ancestor of the source's directory ENOTEMPTY (EINVAL for an
/// exchange), two names of one node nothing at all; then, replacing, a directory over a
/// non-directory ENOTDIR, the reverse EISDIR, a directory over one with entries ENOTEMPTY.
/// A replaced node left without a link loses every row, unless it is one of `kept` (then it
/// is marked as `instance`'s orphan and answered as `out_orphan`). Directories' link counts
/// follow a directory that changes parent; both names' notifications are queued. `out_moved`
/// is false when nothing changed (two names of one node).
///
/// `drop_nameless` deletes every row of a node without a name (the orphan of a handle that
/// closed), the inode's row first, as `unlink_at` does.
pub(super) const RENAME_MIGRATION: &str = concat!(
    "
CREATE FUNCTION rename_at(
    lock_key integer, ns_id integer, root_ino bigint, from_dir text[], from_leaf text,
    to_dir text[], to_leaf text, flags integer, now_ns bigint, instance integer, kept bigint[],
    channel text, from_payload text, to_payload text,
    OUT out_errno integer, OUT out_moved boolean, OUT out_orphan bigint)
LANGUAGE plpgsql AS $$",
    walk_vars!(),
    "    chain bigint[] := ARRAY[root_ino];
    from_chain bigint[];
    from_ino bigint;
    src bigint;
    src_kind integer;
    dst bigint;
    dst_kind integer;
    exchange boolean := flags & 2 <> 0;
    moves boolean;
    from_delta integer := 0;
    to_delta integer := 0;
    left_links integer;
BEGIN
    PERFORM pg_advisory_xact_lock(lock_key, ns_id);",
    walk_to_dir!(from_dir, chain),
    "
    from_ino := dir_ino;
    from_chain := chain;
    chain := ARRAY[root_ino];",
    find_leaf!(src, src_kind, from_leaf),
    walk_to_dir!(to_dir, chain),
    "
    SELECT i.ino, i.kind INTO dst, dst_kind
        FROM inodes i WHERE i.ino = (SELECT d.child FROM dentries d
            WHERE d.parent = dir_ino AND d.name = to_leaf);
    IF flags & 1 <> 0 AND dst IS NOT NULL THEN
        out_errno := 17;
        RETURN;
    END IF;
    IF exchange AND dst IS NULL THEN
        out_errno := 2;
        RETURN;
    END IF;
    IF src = ANY(chain) THEN
        out_errno := 22;
        RETURN;
    END IF;
    IF dst = ANY(from_chain) THEN
        out_errno := CASE WHEN exchange THEN 22 ELSE 39 END;
        RETURN;
    END IF;
    out_errno := 0;
    out_moved := dst IS DISTINCT FROM src;
    IF NOT out_moved THEN
        RETURN;
    END IF;
    moves := from_ino <> dir_ino;
    IF moves AND src_kind = 16384 THEN
        from_delta := -1;
        to_delta := 1;
    END IF;
    IF exchange THEN
        IF moves AND dst_kind = 16384 THEN
            from_delta := from_delta + 1;
            to_delta := to_delta - 1;
        END IF;
        UPDATE dentries SET child = dst WHERE parent = from_ino AND name = from_leaf;
        UPDATE dentries SET child = src WHERE parent = dir_ino AND name = to_leaf;
        UPDATE inodes SET ctime = now_ns WHERE ino = dst;
    ELSE
        IF dst IS NOT NULL THEN
            IF src_kind = 16384 AND dst_kind <> 16384 THEN
                out_errno := 20;
                RETURN;
            END IF;
            IF src_kind <> 16384 AND dst_kind = 16384 THEN
                out_errno := 21;
                RETURN;
            END IF;
            IF dst_kind = 16384 THEN
                IF EXISTS (SELECT 1 FROM dentries WHERE parent = dst) THEN
                    out_errno := 39;
                    RETURN;
                END IF;
                to_delta := to_delta - 1;
            END IF;
            DELETE FROM dentries WHERE parent = dir_ino AND name = to_leaf;
            UPDATE inodes SET nlink = CASE WHEN kind = 16384 THEN 0 ELSE greatest(nlink - 1, 0) END,
                    ctime = now_ns
                WHERE ino = dst RETURNING nlink INTO left_links;
            IF left_links = 0 THEN
                IF dst = ANY(kept) THEN
                    UPDATE inodes SET orphan_of = instance WHERE ino = dst;
                    out_orphan := dst;
                ELSE
                    DELETE FROM inodes WHERE ino = dst;
                    WITH c AS (DELETE FROM chunks WHERE ino = dst), x AS (DELETE FROM xattrs WHERE ino = dst)
                    DELETE FROM dentries WHERE parent = dst;
                END IF;
            END IF;
        END IF;
        UPDATE dentries SET parent = dir_ino, name = to_leaf WHERE parent = from_ino AND name = from_leaf;
    END IF;
    UPDATE inodes SET ctime = now_ns WHERE ino = src;
    IF moves THEN
        UPDATE inodes SET nlink = nlink + from_delta, mtime = now_ns, ctime = now_ns WHERE ino = from_ino;
        UPDATE inodes SET nlink = nlink + to_delta, mtime = now_ns, ctime = now_ns WHERE ino = dir_ino;
    ELSE
        UPDATE inodes SET nlink = nlink + from_delta + to_delta, mtime = now_ns, ctime = now_ns
            WHERE ino = from_ino;
    END IF;
    PERFORM pg_notify(channel, from_payload);
    PERFORM pg_notify(channel, to_payload);
END $$;

CREATE FUNCTION drop_nameless(node bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM inodes WHERE ino = node AND nlink = 0;
    IF FOUND THEN
        WITH c AS (DELETE FROM chunks WHERE ino = node), x AS (DELETE FROM xattrs WHERE ino = node)
        DELETE FROM dentries WHERE parent = node;
    END IF;
END $$;
"
);

/// Whose name [`Sql::take_name`] takes: a non-directory's (unlink) or an empty directory's.
#[derive(Clone, Copy)]
pub(super) enum Taking {
    File,
    Dir,
}

/// What a call needs besides the node: the name lock's key, the route's root, the
/// notification to send at commit, and the time of the change (ns; `create_at` takes the new
/// node's).
pub(super) struct Call<'a> {
    pub lock_key: i32,
    pub root: u64,
    pub channel: &'a str,
    pub payload: &'a str,
    pub now: i64,
}

pub(super) fn errno_of(code: i32) -> FsResult<()> {
    match code {
        0 => Ok(()),
        2 => Err(FsError::errno(Errno::ENOENT)),
        17 => Err(FsError::errno(Errno::EEXIST)),
        1 => Err(FsError::errno(Errno::EPERM)),
        20 => Err(FsError::errno(Errno::ENOTDIR)),
        21 => Err(FsError::errno(Errno::EISDIR)),
        22 => Err(FsError::errno(Errno::EINVAL)),
        39 => Err(FsError::errno(Errno::ENOTEMPTY)),
        other => Err(FsError::new(Errno::EIO, format!("postgres: a tree function answered {other}"))),
    }
}

impl Sql<'_> {
    /// Creates `n` as inode `ino` named `leaf` in the directory at `dir` (its components),
    /// with [`create_at`](MIGRATION); returns the group and permission bits it got.
    pub fn create_at(
        &self,
        call: &Call<'_>,
        (dir, leaf): Name<'_>,
        ino: u64,
        n: &NewNode<'_>,
    ) -> FsResult<(u32, u32)> {
        let size = n.target.map_or(0, |t| t.len() as i64);
        let row = self
            .row(
                "SELECT out_errno, out_gid, out_perm FROM create_at($1, $2, $3, $4, $5, $6, $7, $8, $9,
                     $10, $11, $12, $13, $14, $15, $16)",
                &[
                    &call.lock_key,
                    &(n.ns as i32),
                    &(call.root as i64),
                    &dir,
                    &leaf,
                    &(ino as i64),
                    &(n.kind.mode_bits() as i32),
                    &(n.perm as i32),
                    &i64::from(n.uid),
                    &i64::from(n.gid),
                    &i64::from(n.rdev),
                    &size,
                    &n.target,
                    &n.now,
                    &call.channel,
                    &call.payload,
                ],
            )?
            .expect("a function call returns a row");
        errno_of(row.get(0))?;
        Ok((row.get::<_, i64>(1) as u32, row.get::<_, i32>(2) as u32))
    }
}

impl Sql<'_> {
    /// Takes the name `leaf` from the directory at `dir`, with [`unlink_at`](MIGRATION) or
    /// [`rmdir_at`](MIGRATION), which keep the rows of a node of `kept` that loses its last
    /// name; returns the node and the links it has left.
    pub fn take_name(
        &self,
        what: Taking,
        call: &Call<'_>,
        (dir, leaf): Name<'_>,
        (ns, instance): (i64, i64),
        kept: &[i64],
    ) -> FsResult<(u64, u32)> {
        let row = self
            .row(
                match what {
                    Taking::File => {
                        "SELECT out_errno, out_ino, out_left FROM unlink_at($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
                    }
                    Taking::Dir => "SELECT out_errno, out_ino, out_left FROM rmdir_at($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                },
                &[
                    &call.lock_key,
                    &(ns as i32),
                    &(call.root as i64),
                    &dir,
                    &leaf,
                    &call.now,
                    &(instance as i32),
                    &kept,
                    &call.channel,
                    &call.payload,
                ],
            )?
            .expect("a function call returns a row");
        errno_of(row.get(0))?;
        Ok((row.get::<_, i64>(1) as u64, row.get::<_, i32>(2) as u32))
    }
}

/// The attribute columns that [`tree::setattr_in`] changes other than the size, as the
/// parameters `$3`–`$8` of the statements below: perm, uid, gid, atime, mtime (each NULL to
/// keep it) and the new ctime.
struct AttrChanges {
    perm: Option<i32>,
    uid: Option<i64>,
    gid: Option<i64>,
    atime: Option<i64>,
    mtime: Option<i64>,
    ctime: i64,
}

impl AttrChanges {
    fn new(changes: &SetAttr) -> AttrChanges {
        debug_assert!(changes.size.is_none());
        let now = tree::now_ns();
        let time = |t: Option<TimeSet>| {
            t.map(|t| match t {
                TimeSet::Now => now,
                TimeSet::At(at) => tree::time_to_ns(at),
            })
        };
        AttrChanges {
            perm: changes.mode.map(|m| (m & 0o7777) as i32),
            uid: changes.uid.map(i64::from),
            gid: changes.gid.map(i64::from),
            atime: time(changes.atime),
            mtime: time(changes.mtime),
            ctime: now,
        }
    }
}

/// The update of those columns of the inode `(SELECT ino FROM t)`, with its notification.
macro_rules! update_attrs {
    () => {
        "u AS (UPDATE inodes SET perm = coalesce($3, perm), uid = coalesce($4, uid),
                 gid = coalesce($5, gid), atime = coalesce($6, atime), mtime = coalesce($7, mtime),
                 ctime = $8
             WHERE ino = (SELECT ino FROM t)
             RETURNING ino, kind, perm, uid, gid, rdev, size, nlink, atime, mtime, ctime, crtime),
         n AS (SELECT notice($9, $10) FROM u)"
    };
}

impl Sql<'_> {
    /// Applies `changes`, which leave the size alone, to the node at `path` below `root` (the
    /// node `root` itself for an empty path) in one statement that walks to it, commits on its
    /// own and queues the notification: what [`tree::setattr_in`] does to a locked node, on
    /// the row itself.
    pub fn set_attrs_at(
        &self,
        root: u64,
        path: &str,
        changes: &SetAttr,
        (channel, payload): (&str, &str),
    ) -> FsResult<Node> {
        let comps = components(path)?;
        let c = AttrChanges::new(changes);
        let row = self
            .row(
                concat!(
                    walk_cte!(),
                    ", t AS (SELECT ino FROM w WHERE depth = cardinality($2::text[])), ",
                    update_attrs!(),
                    " SELECT (SELECT count(*) FROM n), (SELECT count(*) FROM w),
                         (SELECT kind FROM w ORDER BY depth DESC LIMIT 1), u.*
                     FROM (SELECT 1) AS one LEFT JOIN u ON true"
                ),
                &[
                    &(root as i64),
                    &comps,
                    &c.perm,
                    &c.uid,
                    &c.gid,
                    &c.atime,
                    &c.mtime,
                    &c.ctime,
                    &channel,
                    &payload,
                ],
            )?
            .expect("one row");
        if row.get::<_, i64>(0) == 1 {
            return node_at(&row, 3);
        }
        let walked = row.get::<_, i64>(1) as usize;
        match row.get::<_, Option<i32>>(2) {
            // The walk reached the end, and the node went before the update got it.
            Some(_) if walked == comps.len() + 1 => Err(FsError::errno(Errno::ENOENT)),
            Some(kind) => Err(tree::missing_under(
                crate::backend::FileKind::from_mode(kind as u32).unwrap_or(crate::backend::FileKind::File),
            )),
            None => Err(FsError::errno(Errno::ENOENT)),
        }
    }
}

impl Sql<'_> {
    /// Gives the node at `src` (its parent's components and its name) the name `leaf` in the
    /// directory at `dir` with [`link_at`](MIGRATION); `src_payload` is the notification of
    /// the node's own change. Returns the node.
    pub fn link_at(
        &self,
        call: &Call<'_>,
        (src_dir, src_leaf): Name<'_>,
        (dir, leaf): Name<'_>,
        (ns, src_payload): (i64, &str),
    ) -> FsResult<Node> {
        let row = self
            .row(
                "SELECT * FROM link_at($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                &[
                    &call.lock_key,
                    &(ns as i32),
                    &(call.root as i64),
                    &src_dir,
                    &src_leaf,
                    &dir,
                    &leaf,
                    &call.now,
                    &call.channel,
                    &call.payload,
                    &src_payload,
                ],
            )?
            .expect("a function call returns a row");
        errno_of(row.get(0))?;
        node_at(&row, 1)
    }
}

impl Sql<'_> {
    /// Renames `from` (its parent's components and its name) to `to` with `flags` (those of
    /// renameat2), with [`rename_at`](RENAME_MIGRATION), which keeps the rows of a replaced
    /// node of `kept` that loses its last name; `to_payload` is the
    /// notification of the new name, `call`'s that of the old one.
    pub fn rename_at(
        &self,
        call: &Call<'_>,
        (from, to): (Name<'_>, Name<'_>),
        flags: u32,
        (ns, instance): (i64, i64),
        (kept, to_payload): (&[i64], &str),
    ) -> FsResult<Renamed> {
        let row = self
            .row(
                "SELECT out_errno, out_moved, out_orphan FROM rename_at($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,
                     $12, $13, $14)",
                &[
                    &call.lock_key,
                    &(ns as i32),
                    &(call.root as i64),
                    &from.0,
                    &from.1,
                    &to.0,
                    &to.1,
                    &(flags as i32),
                    &call.now,
                    &(instance as i32),
                    &kept,
                    &call.channel,
                    &call.payload,
                    &to_payload,
                ],
            )?
            .expect("a function call returns a row");
        errno_of(row.get(0))?;
        Ok(Renamed { moved: row.get(1), orphan: row.get::<_, Option<i64>>(2).map(|ino| ino as u64) })
    }

    /// Deletes the rows of `ino` if it has no name, with [`drop_nameless`](RENAME_MIGRATION).
    pub fn drop_nameless(&self, ino: u64) -> FsResult<()> {
        self.row("SELECT drop_nameless($1)", &[&(ino as i64)])?;
        Ok(())
    }
}

/// A name as the functions take it: its directory's components and its leaf.
pub(super) type Name<'a> = (&'a [&'a str], &'a str);

/// What [`Sql::rename_at`] did.
pub(super) struct Renamed {
    /// A node moved (false for two names of one node: nothing changed).
    pub moved: bool,
    /// The replaced node kept for a handle of this daemon.
    pub orphan: Option<u64>,
}

/// The checks of [`tree::create_in`] made before the call: the path's parent components and
/// leaf name.
pub(super) fn split_new(path: &str) -> FsResult<(Vec<&str>, &str)> {
    if path.is_empty() {
        return Err(FsError::errno(Errno::EEXIST));
    }
    split(path)
}

/// A non-empty path's parent components and leaf name.
pub(super) fn split(path: &str) -> FsResult<(Vec<&str>, &str)> {
    tree::check_name(crate::backend::split_parent(path).1)?;
    split_existing(path)
}

/// An existing node's parent components and leaf name (as [`tree::rename_in`] looks it up:
/// a name that cannot exist is not found, rather than refused).
pub(super) fn split_existing(path: &str) -> FsResult<(Vec<&str>, &str)> {
    let (parent, leaf) = crate::backend::split_parent(path);
    Ok((super::store::components(parent)?, leaf))
}
