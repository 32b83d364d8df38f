//! Tree operations as functions on the server, each called in one round trip instead of a
//! transaction of four or more (`BEGIN` with the name lock, the walk, the change, the
//! notification with `COMMIT`): their SQL (a migration), and the calls. `create_at` makes a
//! node (create, mknod, mkdir, symlink), `unlink_at` takes a non-directory's name.
//!
//! A call is one statement outside any transaction, so it commits on its own. Inside a
//! function, each statement reads the data committed before it started, so a walk that follows
//! the name lock sees every name change that held the lock before. The checks and results are
//! those of the shared tree logic ([`tree::create_in`], [`tree::ownership`]); the backend suite
//! runs on this route and holds both to the same outcomes.

use super::store::Sql;
use crate::backend::tree::{self, NewNode};
use crate::error::{Errno, FsError, FsResult};

/// Migration 3: `walk_dir`, `create_at` and `unlink_at`.
///
/// `walk_dir` walks to the directory `dir` (components) from `root_ino`, and answers it with
/// its kind, permission bits and group, or the errno of the walk: ENOENT (2) for a missing
/// name, ENOTDIR (20) for a name under a non-directory or a non-directory at the end.
///
/// `create_at` walks to the directory, under the namespace's name lock; gives the new node the directory's group (and, to a
/// directory, its set-group-ID bit) when the directory is set-group-ID; inserts the node and
/// its name unless the name is taken; touches the directory; and queues the notification.
/// `out_errno` is 0, or ENOENT (2), ENOTDIR (20) or EEXIST (17) with nothing changed.
///
/// `unlink_at` takes the name `leaf` of a non-directory from the directory, under the name
/// lock; touches the directory; drops the node's link count and, when that reaches 0, marks
/// it as `instance`'s orphan (the caller deletes its rows or keeps them for an open handle, and
/// a daemon that died before either leaves them to the next one); and queues the
/// notification. `out_errno` is 0 (with the node and the links it has left), or ENOENT,
/// ENOTDIR or EISDIR (21) with nothing changed.
pub(super) const MIGRATION: &str = "
CREATE FUNCTION walk_dir(root_ino bigint, dir text[],
    OUT out_errno integer, OUT out_ino bigint, OUT out_perm integer, OUT out_gid bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    cur_kind integer;
BEGIN
    out_ino := root_ino;
    SELECT i.kind, i.perm, i.gid INTO cur_kind, out_perm, out_gid FROM inodes i WHERE i.ino = root_ino;
    IF NOT FOUND THEN
        out_errno := 2;
        RETURN;
    END IF;
    FOR step IN 1 .. coalesce(array_length(dir, 1), 0) LOOP
        IF cur_kind <> 16384 THEN
            out_errno := 20;
            RETURN;
        END IF;
        SELECT i.ino, i.kind, i.perm, i.gid INTO out_ino, cur_kind, out_perm, out_gid
            FROM dentries d JOIN inodes i ON i.ino = d.child
            WHERE d.parent = out_ino AND d.name = dir[step];
        IF NOT FOUND THEN
            out_errno := 2;
            RETURN;
        END IF;
    END LOOP;
    out_errno := CASE WHEN cur_kind = 16384 THEN 0 ELSE 20 END;
END $$;

CREATE FUNCTION create_at(
    lock_key integer, ns_id integer, root_ino bigint, dir text[], leaf text,
    new_ino bigint, new_kind integer, new_perm integer, new_uid bigint, caller_gid bigint,
    new_rdev bigint, new_size bigint, new_target bytea, now_ns bigint, channel text, payload text,
    OUT out_errno integer, OUT out_gid bigint, OUT out_perm integer)
LANGUAGE plpgsql AS $$
DECLARE
    cur bigint;
    cur_perm integer;
    cur_gid bigint;
    is_dir boolean := new_kind = 16384;
BEGIN
    PERFORM pg_advisory_xact_lock(lock_key, ns_id);
    SELECT w.out_errno, w.out_ino, w.out_perm, w.out_gid INTO out_errno, cur, cur_perm, cur_gid
        FROM walk_dir(root_ino, dir) w;
    IF out_errno <> 0 THEN
        RETURN;
    END IF;
    IF cur_perm & 1024 <> 0 THEN
        out_gid := cur_gid;
        out_perm := CASE WHEN is_dir THEN new_perm | 1024 ELSE new_perm END;
    ELSE
        out_gid := caller_gid;
        out_perm := new_perm;
    END IF;
    INSERT INTO dentries (parent, name, child) VALUES (cur, leaf, new_ino)
        ON CONFLICT (parent, name) DO NOTHING;
    IF NOT FOUND THEN
        out_errno := 17;
        RETURN;
    END IF;
    INSERT INTO inodes (ino, ns, kind, perm, uid, gid, rdev, size, nlink, atime, mtime, ctime,
            crtime, target)
        VALUES (new_ino, ns_id, new_kind, out_perm, new_uid, out_gid, new_rdev, new_size,
            CASE WHEN is_dir THEN 2 ELSE 1 END, now_ns, now_ns, now_ns, now_ns, new_target);
    UPDATE inodes SET nlink = nlink + is_dir::integer, mtime = now_ns, ctime = now_ns
        WHERE ino = cur;
    PERFORM pg_notify(channel, payload);
    out_errno := 0;
END $$;

CREATE FUNCTION unlink_at(
    lock_key integer, ns_id integer, root_ino bigint, dir text[], leaf text, now_ns bigint,
    instance integer, channel text, payload text,
    OUT out_errno integer, OUT out_ino bigint, OUT out_left integer)
LANGUAGE plpgsql AS $$
DECLARE
    dir_ino bigint;
    child_kind integer;
BEGIN
    PERFORM pg_advisory_xact_lock(lock_key, ns_id);
    SELECT w.out_errno, w.out_ino INTO out_errno, dir_ino FROM walk_dir(root_ino, dir) w;
    IF out_errno <> 0 THEN
        RETURN;
    END IF;
    SELECT i.ino, i.kind INTO out_ino, child_kind
        FROM dentries d JOIN inodes i ON i.ino = d.child
        WHERE d.parent = dir_ino AND d.name = leaf;
    IF NOT FOUND THEN
        out_errno := 2;
        RETURN;
    END IF;
    IF child_kind = 16384 THEN
        out_errno := 21;
        RETURN;
    END IF;
    DELETE FROM dentries WHERE parent = dir_ino AND name = leaf;
    UPDATE inodes SET mtime = now_ns, ctime = now_ns WHERE ino = dir_ino;
    UPDATE inodes SET nlink = greatest(nlink - 1, 0), ctime = now_ns,
            orphan_of = CASE WHEN nlink <= 1 THEN instance ELSE orphan_of END
        WHERE ino = out_ino RETURNING nlink INTO out_left;
    PERFORM pg_notify(channel, payload);
    out_errno := 0;
END $$;
";

/// What a call needs besides the node: the name lock's key, the route's root, and the
/// notification to send at commit.
pub(super) struct Call<'a> {
    pub lock_key: i32,
    pub root: u64,
    pub channel: &'a str,
    pub payload: &'a str,
}

fn errno_of(code: i32) -> FsResult<()> {
    match code {
        0 => Ok(()),
        2 => Err(FsError::errno(Errno::ENOENT)),
        17 => Err(FsError::errno(Errno::EEXIST)),
        20 => Err(FsError::errno(Errno::ENOTDIR)),
        21 => Err(FsError::errno(Errno::EISDIR)),
        other => Err(FsError::new(Errno::EIO, format!("postgres: a tree function answered {other}"))),
    }
}

impl Sql<'_> {
    /// Creates `n` as inode `ino` named `leaf` in the directory at `dir` (its components),
    /// with [`create_at`](MIGRATION); returns the group and permission bits it got.
    pub fn create_at(
        &self,
        call: &Call<'_>,
        (dir, leaf): (&[&str], &str),
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
    /// Takes the name `leaf` of a non-directory from the directory at `dir`, with
    /// [`unlink_at`](MIGRATION); returns the node and the links it has left.
    pub fn unlink_at(
        &self,
        call: &Call<'_>,
        (dir, leaf): (&[&str], &str),
        (ns, instance): (i64, i64),
    ) -> FsResult<(u64, u32)> {
        let row = self
            .row(
                "SELECT out_errno, out_ino, out_left FROM unlink_at($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                &[
                    &call.lock_key,
                    &(ns as i32),
                    &(call.root as i64),
                    &dir,
                    &leaf,
                    &tree::now_ns(),
                    &(instance as i32),
                    &call.channel,
                    &call.payload,
                ],
            )?
            .expect("a function call returns a row");
        errno_of(row.get(0))?;
        Ok((row.get::<_, i64>(1) as u64, row.get::<_, i32>(2) as u32))
    }
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
    let (parent, leaf) = crate::backend::split_parent(path);
    tree::check_name(leaf)?;
    Ok((super::store::components(parent)?, leaf))
}
