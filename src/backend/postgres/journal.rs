//! The journal: changes of names (and of files' attributes) this daemon made while alone on
//! its namespace whose outcome it knew without asking (see `drafts` for why nobody can tell), kept in order and sent to the
//! server together, in one transaction and one round trip, the next time anything asks the
//! server (or before the lease is given up). An `rm -rf` then costs a round trip per
//! directory (its listing, and its `rmdir`, flush what came before) instead of one per name.
//!
//! What is journaled, and why its answer is certain:
//! - `unlink` of a name the daemon's cache knows to lead to a node other than a directory,
//!   which this daemon has no handle on and which is not a draft: it succeeds;
//! - `rmdir` of a directory whose whole listing the cache knows to be empty: it succeeds;
//! - `rename` (without flags, or with `RENAME_NOREPLACE`) of such a file to a name the cache
//!   knows to be free, in a directory it knows: it moves the file and replaces nothing;
//! - `link` of such a file whose attributes the cache knows, to such a free name: it adds
//!   the name, and the answer is the file's attributes with one more link;
//! - `mkdir` in a directory the cache knows, of a name it knows to be free: it succeeds, and
//!   the daemon derives the new directory's group and bits from the parent as the server does;
//! - a `setattr` without a size of a file (not a draft) whose attributes the cache knows:
//!   the kernel checked the caller's permission, and the change is a plain update of the
//!   inode's row, answered with the known attributes so changed;
//! - a small write to a stored file whose attributes the cache knows (see `held_writes`).
//!
//! Each entry is one call of a server function, with the time of the change: `unlink_at`,
//! `rmdir_at`, `link_at` and `create_at` (a `mkdir`), as the immediate change makes them; a
//! run of unlinks in one directory `unlink_names`; a rename, and a link followed by the
//! unlink of its first name, `move_file`; a change of attributes `set_attrs_of`, merged with
//! the one before it if that was of the same file. The last two find what they change by the
//! inodes the cache knew, not by walking paths. The nodes this daemon has handles on
//! at the flush keep their rows, as when the change is immediate (a handle opened after the
//! unlink, by another name of the file, makes it an orphan). An entry the server refuses all
//! the same (possible only if another daemon changed the namespace while this one believed
//! itself alone, see `quiet`) is logged; a server that cannot be reached keeps the journal for
//! the next flush, and the operation that needed the flush answers EIO.

use std::sync::atomic::Ordering;

use super::dircache::{Change, Known};
use super::functions::{walk_to_dir, walk_vars};
use super::held_writes::HeldWrites;
use super::store::literal;
use super::Inner;
use crate::backend::tree::{self, Node};
use crate::backend::{split_parent, Attr, Caller, FileKind, SetAttr, TimeSet};
use crate::error::FsResult;

/// Entries kept at most; a change past it flushes the journal and is made at once.
const JOURNAL_MAX: usize = 512;

/// Migration 8: `unlink_names(…)`, the unlinks of several names of one directory in one
/// call, as `unlink_at` makes each (see `functions`): the names go, each node loses a link per
/// name, a node left without one loses its rows unless it is one of `kept` (it is marked
/// `instance`'s orphan, and listed in `out_orphans`), and the directory is touched.
/// `out_errno` is 2 if a name was missing (the others are gone all the same). The names are
/// the journal's, known to lead to nodes other than directories. The inodes' rows are locked
/// before their chunks are deleted, as in `unlink_at`.
pub(super) const MIGRATION: &str = concat!(
    "
CREATE FUNCTION unlink_names(
    lock_key integer, ns_id integer, root_ino bigint, dir text[], leaves text[], now_ns bigint,
    instance integer, kept bigint[], channel text, payload text,
    OUT out_errno integer, OUT out_orphans bigint[])
LANGUAGE plpgsql AS $$",
    walk_vars!(),
    "    taken integer;
    gone bigint[];
BEGIN
    PERFORM pg_advisory_xact_lock(lock_key, ns_id);",
    walk_to_dir!(dir),
    "
    WITH d AS (DELETE FROM dentries WHERE parent = dir_ino AND name = ANY(leaves) RETURNING child),
        c AS (SELECT child, count(*)::integer AS n FROM d GROUP BY child),
        u AS (UPDATE inodes i SET nlink = greatest(i.nlink - c.n, 0), ctime = now_ns,
                orphan_of = CASE WHEN i.nlink <= c.n THEN instance ELSE i.orphan_of END
            FROM c WHERE i.ino = c.child RETURNING i.ino, i.nlink),
        p AS (UPDATE inodes SET mtime = now_ns, ctime = now_ns WHERE ino = dir_ino)
    SELECT (SELECT count(*) FROM d), coalesce(array_agg(u.ino) FILTER (WHERE u.nlink = 0), '{}')
        INTO taken, gone FROM u;
    out_orphans := ARRAY(SELECT g FROM unnest(gone) AS g WHERE g = ANY(kept));
    gone := ARRAY(SELECT g FROM unnest(gone) AS g WHERE NOT g = ANY(kept));
    DELETE FROM inodes WHERE ino = ANY(gone);
    DELETE FROM chunks WHERE ino = ANY(gone);
    DELETE FROM xattrs WHERE ino = ANY(gone);
    PERFORM notice(channel, payload);
    out_errno := CASE WHEN taken = cardinality(leaves) THEN 0 ELSE 2 END;
END $$;
"
);

/// Migration 9: `move_file(…)` and `set_attrs_of(…)`, the journal's own calls, by the inodes
/// the daemon's cache knew (its batch holds the name lock): a file's name moves to a free one
/// (ENOENT if the old name no longer leads to the file, EEXIST if the new one is taken), and
/// a node's permission bits, owner and times change (ENOENT if it is gone). Functions rather
/// than statements, so that the server plans them once per connection (a statement sent as
/// text is planned anew each time, which cost more than the move itself).
pub(super) const MOVES_MIGRATION: &str = "
CREATE FUNCTION move_file(
    from_dir bigint, from_leaf text, to_dir bigint, to_leaf text, file bigint, now_ns bigint,
    channel text, from_payload text, to_payload text, OUT out_errno integer)
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM dentries WHERE parent = to_dir AND name = to_leaf) THEN
        out_errno := 17;
        RETURN;
    END IF;
    UPDATE dentries SET parent = to_dir, name = to_leaf
        WHERE parent = from_dir AND name = from_leaf AND child = file;
    IF NOT FOUND THEN
        out_errno := 2;
        RETURN;
    END IF;
    UPDATE inodes SET ctime = now_ns WHERE ino = file;
    UPDATE inodes SET mtime = now_ns, ctime = now_ns WHERE ino IN (from_dir, to_dir);
    PERFORM notice(channel, from_payload);
    PERFORM notice(channel, to_payload);
    out_errno := 0;
END $$;

CREATE FUNCTION set_attrs_of(
    node bigint, new_perm integer, new_uid bigint, new_gid bigint, new_atime bigint,
    new_mtime bigint, now_ns bigint, channel text, payload text, OUT out_errno integer)
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE inodes SET perm = coalesce(new_perm, perm), uid = coalesce(new_uid, uid),
        gid = coalesce(new_gid, gid), atime = coalesce(new_atime, atime),
        mtime = coalesce(new_mtime, mtime), ctime = now_ns
        WHERE ino = node;
    IF NOT FOUND THEN
        out_errno := 2;
        RETURN;
    END IF;
    PERFORM notice(channel, payload);
    out_errno := 0;
END $$;
";

/// A name change the server has not seen yet.
pub(super) enum Entry {
    Unlink {
        path: String,
        now: i64,
    },
    Rmdir {
        path: String,
        now: i64,
    },
    Rename {
        from: String,
        to: String,
        now: i64,
        inos: Inos,
    },
    Link {
        from: String,
        to: String,
        now: i64,
        inos: Inos,
    },
    Attrs(AttrsSet),
    /// Writes to a stored file (`held_writes`).
    Write(HeldWrites),
    /// A directory made with the caller's `perm`, `uid` and `gid` (`create_at` derives the
    /// same group and bits from its parent as the daemon answered).
    Mkdir {
        path: String,
        ino: u64,
        perm: u32,
        uid: u32,
        gid: u32,
        now: i64,
    },
}

/// The inodes of a file that moves or gains a name, and of both directories, as the cache
/// knew them: a move goes to the server as an update of the name's row by them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Inos {
    file: u64,
    from_dir: u64,
    to_dir: u64,
}

/// A change of a file's permission bits, owner or times (the `setattr` of a path, as
/// `touch` and `git`'s freshening of an object make it), with the times resolved.
pub(super) struct AttrsSet {
    pub ino: u64,
    path: String,
    perm: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    atime: Option<i64>,
    mtime: Option<i64>,
    now: i64,
}

impl AttrsSet {
    /// `later` made after this one, on the same file: one change that ends as both do.
    pub fn merge(&mut self, later: &AttrsSet) {
        self.path.clone_from(&later.path);
        self.perm = later.perm.or(self.perm);
        self.uid = later.uid.or(self.uid);
        self.gid = later.gid.or(self.gid);
        self.atime = later.atime.or(self.atime);
        self.mtime = later.mtime.or(self.mtime);
        self.now = later.now;
    }
}

impl Inner {
    /// The gate held exclusively for a new entry, if there is room for one (see
    /// [`Drafts::holding_back`](super::drafts::Drafts::holding_back)).
    pub(super) fn journaling(&self) -> Option<parking_lot::RwLockWriteGuard<'_, ()>> {
        let exclusive = self.drafts.holding_back()?;
        (self.drafts.journal.lock().len() < JOURNAL_MAX).then_some(exclusive)
    }

    /// Journals the unlink (`dir`: rmdir) of `path` if its outcome is certain (see above);
    /// false when it must be made at once.
    pub(super) fn journal_take(&self, path: &str, dir: bool) -> bool {
        let Some(_exclusive) = self.journaling().filter(|_| !path.is_empty()) else {
            return false;
        };
        let known = match dir {
            true => self.dirs.empty_dir(path),
            false => self.dirs.node(path).is_some_and(|n| {
                n.kind != FileKind::Dir && !self.handles.is_open(n.ino) && !self.drafts.holds(n.ino)
            }),
        };
        if !known || !matches!(self.dirs.known(split_parent(path).0), Known::Dir(_)) {
            return false;
        }
        let now = tree::now_ns();
        let ticket = self.dirs.changing();
        self.dirs.changed(ticket, Change::Taken { path, dir, now }, true);
        let path = path.to_string();
        self.drafts.journal(match dir {
            true => Entry::Rmdir { path, now },
            false => Entry::Unlink { path, now },
        });
        true
    }

    /// Journals the rename of `from` to `to` if its outcome is certain (see above); false
    /// when it must be made at once.
    pub(super) fn journal_rename(&self, from: &str, to: &str, flags: u32) -> bool {
        // RENAME_NOREPLACE (what `mv` asks for) changes nothing when the name is free.
        if flags & !crate::backend::RENAME_NOREPLACE != 0 || from.is_empty() || to.is_empty() {
            return false;
        }
        let Some(_exclusive) = self.journaling() else {
            return false;
        };
        let file = self.dirs.node(from).filter(|n| n.kind != FileKind::Dir && !self.drafts.holds(n.ino));
        let inos = file.and_then(|file| self.inos(file.ino, from, to));
        let Some(inos) = inos.filter(|_| self.dirs.known(to) == Known::Absent) else {
            return false;
        };
        let now = tree::now_ns();
        let ticket = self.dirs.changing();
        self.dirs.changed(ticket, Change::Moved { from, to, now, exchange: false }, true);
        self.drafts.journal(Entry::Rename { from: from.to_string(), to: to.to_string(), now, inos });
        true
    }

    /// The [`Inos`] of file `file` going from `from` to `to`, if the cache knows both
    /// directories.
    fn inos(&self, file: u64, from: &str, to: &str) -> Option<Inos> {
        let dir = |path: &str| match self.dirs.known(split_parent(path).0) {
            Known::Dir(attr) => Some(attr.ino),
            _ => None,
        };
        Some(Inos { file, from_dir: dir(from)?, to_dir: dir(to)? })
    }

    /// Journals the link of the file at `existing` as `new` if its outcome is certain (see
    /// above): the file's attributes after it, or `None` when it must be made at once.
    pub(super) fn journal_link(&self, existing: &str, new: &str) -> Option<Attr> {
        if existing.is_empty() || new.is_empty() {
            return None;
        }
        let _exclusive = self.journaling()?;
        let file =
            self.dirs.node(existing).filter(|n| n.kind != FileKind::Dir && !self.drafts.holds(n.ino))?;
        let mut attr = self.dirs.file_attr(existing).filter(|a| a.ino == file.ino)?;
        let inos = self.inos(file.ino, existing, new)?;
        if self.dirs.known(new) != Known::Absent {
            return None;
        }
        let now = tree::now_ns();
        attr.nlink += 1;
        attr.ctime = tree::ns_to_time(now);
        let ticket = self.dirs.changing();
        self.dirs.changed(ticket, Change::Made { path: new, attr: &attr, now }, true);
        self.drafts.journal(Entry::Link { from: existing.to_string(), to: new.to_string(), now, inos });
        Some(attr)
    }

    /// Journals the `mkdir` of `path` as inode `ino` if its outcome is certain: the cache
    /// knows the parent and that the name is free. The new directory's node (known empty
    /// from now on), or `None` when it must be made at once.
    pub(super) fn journal_mkdir(&self, path: &str, ino: u64, perm: u32, caller: &Caller) -> Option<Node> {
        let _exclusive = self.journaling().filter(|_| !path.is_empty())?;
        let node = self.make_here(path, ino, (perm, FileKind::Dir), caller)?;
        let (uid, gid, now) = (caller.uid, caller.gid, node.crtime);
        self.drafts.journal(Entry::Mkdir { path: path.to_string(), ino, perm, uid, gid, now });
        Some(node)
    }

    /// Journals the `setattr` of `path` (no truncation) if its outcome is certain: the cache
    /// knows the attributes of the file it leads to, which is not a draft. The file's
    /// attributes after it, or `None` when it must be made at once. (The permission checks
    /// are the kernel's, made before the request; the server's change is a plain update.)
    pub(super) fn journal_setattr(&self, path: &str, changes: &SetAttr) -> Option<Attr> {
        if changes.size.is_some() || changes.is_empty() || path.is_empty() {
            return None;
        }
        let _exclusive = self.journaling()?;
        let mut attr = self.dirs.file_attr(path).filter(|a| !self.drafts.holds(a.ino))?;
        let now = tree::now_ns();
        let time = |t: Option<TimeSet>| {
            t.map(|t| match t {
                TimeSet::Now => now,
                TimeSet::At(at) => tree::time_to_ns(at),
            })
        };
        let (atime, mtime) = (time(changes.atime), time(changes.mtime));
        let perm = changes.mode.map(|m| m & 0o7777);
        let to_time = tree::ns_to_time;
        attr.perm = perm.map_or(attr.perm, |p| p as u16);
        attr.uid = changes.uid.unwrap_or(attr.uid);
        attr.gid = changes.gid.unwrap_or(attr.gid);
        attr.atime = atime.map_or(attr.atime, to_time);
        attr.mtime = mtime.map_or(attr.mtime, to_time);
        attr.ctime = to_time(now);
        let ticket = self.dirs.changing();
        self.dirs.changed(ticket, Change::Attrs { path, attr: Some(&attr) }, true);
        let (ino, path) = (attr.ino, path.to_string());
        let (uid, gid) = (changes.uid, changes.gid);
        self.drafts.journal(Entry::Attrs(AttrsSet { ino, path, perm, uid, gid, atime, mtime, now }));
        Some(attr)
    }

    /// A poll of the listener went by: the journal goes to the server, so that a name change
    /// waits there a poll at most (what a `kill -9` of the daemon can lose). A journal of
    /// held writes alone waits (a write is acknowledged by its descriptor's close or `fsync`
    /// only, which send it), so that more of them share each chunk's rewrite.
    pub(super) fn journal_tick(&self) {
        let writes_only = self.drafts.journal.lock().iter().all(|e| matches!(e, Entry::Write(_)));
        if writes_only || self.drafts.ticks_wait.load(Ordering::Relaxed) {
            return;
        }
        if let Err(e) = self.flush_journal() {
            tracing::warn!(
                "postgres: sending the name changes made while alone: {e}; they go with the next operation"
            );
        }
    }

    /// Sends the journal to the server, in one transaction; on a failure to reach it, keeps
    /// it for the next time.
    pub(super) fn flush_journal(&self) -> FsResult<()> {
        self.send_journal(None).map(drop)
    }

    /// [`Inner::flush_journal`], with the statement `then` last in the same transaction and
    /// round trip: the first field of its row, or `None` (and `then` not run) when the
    /// journal is empty.
    pub(super) fn send_journal(&self, then: Option<&str>) -> FsResult<Option<String>> {
        let _sending = self.drafts.sending.lock();
        let entries = self.drafts.take_journal();
        if entries.is_empty() {
            return Ok(None);
        }
        let (kept, deletion) = self.handles.deleting();
        let calls = calls(&entries);
        let batch = self.journal_batch(&calls, &kept, then);
        let answers = self.pooled().and_then(|mut conn| {
            conn.client.simple_query(&batch).map_err(|e| {
                let _ = conn.client.batch_execute("ROLLBACK");
                self.settings.error(e)
            })
        });
        let answers = match answers {
            Ok(answers) => answers,
            Err(e) => {
                self.drafts.restore_journal(entries);
                return Err(e);
            }
        };
        self.drafts.sent(&entries);
        let rows: Vec<_> = answers
            .iter()
            .filter_map(|m| match m {
                postgres::SimpleQueryMessage::Row(row) => Some(row),
                _ => None,
            })
            .collect();
        // (The first row is the name lock's.)
        let rows = rows.get(1..).unwrap_or_default();
        for (call, row) in calls.iter().zip(rows) {
            let field = |i: usize| row.get(i).unwrap_or("");
            if field(0) != "0" {
                tracing::error!(
                    "postgres: a change of {} answered already was refused by the server (errno {}): another daemon changed the namespace meanwhile",
                    crate::display::escape(call.path()),
                    field(0)
                );
                // (The unlinks of several names are made but for the missing one.)
                if !matches!(call, Call::Unlinks(paths) if paths.len() > 1) {
                    continue;
                }
            }
            let orphans: Vec<u64> = match call {
                Call::Unlinks(paths) if paths.len() == 1 => {
                    let ino: i64 = field(1).parse().unwrap_or(0);
                    (field(2) == "0" && kept.contains(&ino)).then_some(ino as u64).into_iter().collect()
                }
                Call::Unlinks(_) => {
                    field(1).trim_matches(['{', '}']).split(',').filter_map(|i| i.parse().ok()).collect()
                }
                // A move replaces nothing.
                Call::One(_) | Call::Moved { .. } => Vec::new(),
            };
            // Not `keep_orphan`: its deletion settles first, and this may run with the drafts'
            // gate held (see `delete_orphan_now`).
            for orphan in orphans.into_iter().filter(|&ino| !deletion.kept(ino)) {
                self.delete_orphan_now(orphan);
            }
        }
        let then_row = rows.get(calls.len()).and_then(|row| row.get(0));
        Ok(then.map(|_| then_row.unwrap_or_default().to_string()))
    }

    /// The simple-query batch of `calls` and `then`: one transaction, one row per call
    /// (`errno`, then the function's other answers).
    fn journal_batch(&self, calls: &[Call<'_>], kept: &[i64], then: Option<&str>) -> String {
        let kept =
            format!("'{{{}}}'::bigint[]", kept.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(","));
        let dir = |dir: &str| {
            let parts: Vec<String> = dir.split('/').filter(|c| !c.is_empty()).map(literal).collect();
            format!("ARRAY[{}]::text[]", parts.join(", "))
        };
        let name = |path: &str| {
            let (parent, leaf) = split_parent(path);
            format!("{}, {}", dir(parent), literal(leaf))
        };
        let payload = |path: &str| literal(&self.payload(super::ops::Changed::Name, path));
        let (lock, ns, root, instance) = (self.tree_key, self.ns, self.root, self.instance);
        let channel = literal(&self.channel);
        // The move of a file to a free name (what every journaled rename is).
        let moved = |from: &str, to: &str, now: i64, i: &Inos| {
            let (from_leaf, to_leaf) = (literal(split_parent(from).1), literal(split_parent(to).1));
            format!(
                "SELECT move_file({}, {from_leaf}, {}, {to_leaf}, {}, {now}, {channel}, {}, {})",
                i.from_dir,
                i.to_dir,
                i.file,
                payload(from),
                payload(to)
            )
        };
        // The name lock once, first: every statement after it sees what was committed before
        // (the server functions take it again, which costs nothing).
        let mut batch = format!("BEGIN;\nSELECT pg_advisory_xact_lock({lock}, {ns});\n");
        for call in calls {
            let sql = match call {
                Call::Unlinks(paths) if paths.len() == 1 => {
                    // One name: the plain function costs the server a third of the other.
                    let (path, now) = paths[0];
                    format!(
                        "SELECT out_errno, out_ino, out_left FROM unlink_at({lock}, {ns}, {root}, {}, {now}, {instance}, {kept}, {channel}, {})",
                        name(path),
                        payload(path)
                    )
                }
                Call::Unlinks(paths) => {
                    let (parent, _) = split_parent(paths[0].0);
                    let leaves: Vec<String> = paths.iter().map(|(p, _)| literal(split_parent(p).1)).collect();
                    let now = paths.iter().map(|(_, now)| *now).max().unwrap_or(0);
                    // Several names: the notification (sent only if another daemon listens
                    // after all) says that anything may have changed.
                    let everything = literal(&format!("{instance}\t*\t"));
                    format!(
                        "SELECT out_errno, out_orphans FROM unlink_names({lock}, {ns}, {root}, {}, ARRAY[{}]::text[], {now}, {instance}, {kept}, {channel}, {everything})",
                        dir(parent),
                        leaves.join(", ")
                    )
                }
                Call::One(Entry::Rmdir { path, now }) => format!(
                    "SELECT out_errno, out_ino, out_left FROM rmdir_at({lock}, {ns}, {root}, {}, {now}, {instance}, {kept}, {channel}, {})",
                    name(path),
                    payload(path)
                ),
                Call::One(Entry::Rename { from, to, now, inos }) => moved(from, to, *now, inos),
                Call::Moved { from, to, now, inos } => moved(from, to, *now, inos),
                Call::One(Entry::Link { from, to, now, .. }) => format!(
                    "SELECT out_errno FROM link_at({lock}, {ns}, {root}, {}, {}, {now}, {channel}, {}, {})",
                    name(from),
                    name(to),
                    payload(to),
                    literal(&self.payload(super::ops::Changed::Content, from))
                ),
                Call::One(Entry::Attrs(set)) => {
                    let value = |v: Option<i64>| v.map_or("NULL".to_string(), |v| v.to_string());
                    format!(
                        "SELECT set_attrs_of({}, {}::integer, {}::bigint, {}::bigint, {}::bigint, {}::bigint, {}, {channel}, {})",
                        set.ino,
                        value(set.perm.map(i64::from)),
                        value(set.uid.map(i64::from)),
                        value(set.gid.map(i64::from)),
                        value(set.atime),
                        value(set.mtime),
                        set.now,
                        literal(&self.payload(super::ops::Changed::FileContent(set.ino), &set.path))
                    )
                }
                Call::One(Entry::Mkdir { path, ino, perm, uid, gid, now }) => format!(
                    "SELECT out_errno FROM create_at({lock}, {ns}, {root}, {}, {ino}, 16384, {perm}, {uid}, {gid}, 0, 0, NULL::bytea, {now}, {channel}, {})",
                    name(path),
                    payload(path)
                ),
                Call::One(Entry::Write(run)) => {
                    self.push_held_writes_call(&mut batch, run);
                    batch.push_str(";\n");
                    continue;
                }
                Call::One(Entry::Unlink { .. }) => unreachable!("unlinks are grouped"),
            };
            batch.push_str(&sql);
            batch.push_str(";\n");
        }
        if let Some(then) = then {
            batch.push_str(then);
            batch.push_str(";\n");
        }
        batch.push_str("COMMIT");
        batch
    }
}

/// One call of a journal's batch: the unlinks of a run of names of one directory
/// (`unlink_names`), a link followed by the unlink of its first name (a rename), or another
/// entry.
enum Call<'a> {
    Unlinks(Vec<(&'a str, i64)>),
    Moved { from: &'a str, to: &'a str, now: i64, inos: &'a Inos },
    One(&'a Entry),
}

impl Call<'_> {
    /// The (first) path the call changes, for messages.
    fn path(&self) -> &str {
        match self {
            Call::Unlinks(paths) => paths[0].0,
            Call::One(Entry::Unlink { path, .. } | Entry::Rmdir { path, .. }) => path,
            Call::One(Entry::Rename { from, .. } | Entry::Link { from, .. }) => from,
            Call::One(Entry::Attrs(set)) => &set.path,
            Call::One(Entry::Write(run)) => &run.path,
            Call::One(Entry::Mkdir { path, .. }) => path,
            Call::Moved { from, .. } => from,
        }
    }
}

/// The calls that make `entries`, in order: each run of unlinks in one directory is one, and
/// so is a link followed by the unlink of the name it linked from (how `git` and many other
/// programs move a finished temporary file into place): the rename it amounts to costs the
/// server a call instead of two. Its time is the unlink's, so no time the daemon answered
/// moves backwards.
fn calls(entries: &[Entry]) -> Vec<Call<'_>> {
    let mut calls: Vec<Call<'_>> = Vec::new();
    for entry in entries {
        match (entry, calls.last_mut()) {
            (Entry::Unlink { path, now }, Some(last @ Call::One(Entry::Link { .. }))) if matches!(last, Call::One(Entry::Link { from, .. }) if from == path) =>
            {
                let Call::One(Entry::Link { from, to, inos, .. }) = *last else { unreachable!() };
                *last = Call::Moved { from, to, now: *now, inos };
            }
            (Entry::Unlink { path, now }, Some(Call::Unlinks(run)))
                if split_parent(run[0].0).0 == split_parent(path).0 =>
            {
                run.push((path, *now))
            }
            (Entry::Unlink { path, now }, _) => calls.push(Call::Unlinks(vec![(path, *now)])),
            (entry, _) => calls.push(Call::One(entry)),
        }
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::{calls, AttrsSet, Call, Entry, Inos};

    fn link(from: &str, to: &str) -> Entry {
        Entry::Link {
            from: from.into(),
            to: to.into(),
            now: 1,
            inos: Inos { file: 3, from_dir: 2, to_dir: 2 },
        }
    }
    fn unlink(path: &str) -> Entry {
        Entry::Unlink { path: path.into(), now: 2 }
    }

    #[test]
    fn a_change_of_attributes_merged_into_an_earlier_one_ends_as_both() {
        let set = |perm, mtime, now| AttrsSet {
            ino: 7,
            path: format!("d/f{now}"),
            perm,
            uid: None,
            gid: Some(5),
            atime: None,
            mtime,
            now,
        };
        let mut first = set(Some(0o600), Some(10), 1);
        first.merge(&set(None, Some(20), 2));
        assert_eq!((first.perm, first.gid, first.mtime, first.now), (Some(0o600), Some(5), Some(20), 2));
        assert_eq!((first.uid, first.atime, first.path.as_str()), (None, None, "d/f2"));
    }

    #[test]
    fn a_link_then_the_unlink_of_its_first_name_is_one_rename() {
        let entries = [link("d/tmp", "d/obj"), unlink("d/tmp"), unlink("d/x")];
        let made = calls(&entries);
        assert_eq!(made.len(), 2);
        assert!(matches!(
            made[0],
            Call::Moved { from: "d/tmp", to: "d/obj", now: 2, inos: Inos { file: 3, .. } }
        ));
        assert!(matches!(&made[1], Call::Unlinks(run) if run == &[("d/x", 2)]));
        // The unlink of another name, or of the new one, is not.
        for other in ["d/obj", "d/y"] {
            let entries = [link("d/tmp", "d/obj"), unlink(other)];
            let made = calls(&entries);
            assert!(matches!(made[..], [Call::One(Entry::Link { .. }), Call::Unlinks(_)]), "{other}");
        }
    }
}
