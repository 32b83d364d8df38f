//! The journal: name changes this daemon made while alone on its namespace whose outcome it
//! knew without asking (see `drafts` for why nobody can tell), kept in order and sent to the
//! server together, in one transaction and one round trip, the next time anything asks the
//! server (or before the lease is given up). An `rm -rf` then costs a round trip per
//! directory (its listing, and its `rmdir`, flush what came before) instead of one per name.
//!
//! What is journaled, and why its answer is certain:
//! - `unlink` of a name the daemon's cache knows to lead to a node other than a directory,
//!   which this daemon has no handle on and which is not a draft: it succeeds;
//! - `rmdir` of a directory whose whole listing the cache knows to be empty: it succeeds;
//! - `rename` without flags of such a file to a name the cache knows to be free, in a
//!   directory it knows: it moves the file and replaces nothing.
//!
//! Each entry is the call of the server function the immediate change makes (`unlink_at`,
//! `rmdir_at`, `rename_at`), with the time of the change. The nodes this daemon has handles on
//! at the flush keep their rows, as when the change is immediate (a handle opened after the
//! unlink, by another name of the file, makes it an orphan). An entry the server refuses all
//! the same (possible only if another daemon changed the namespace while this one believed
//! itself alone, see `quiet`) is logged; a server that cannot be reached keeps the journal for
//! the next flush, and the operation that needed the flush answers EIO.

use super::dircache::{Change, Known};
use super::store::literal;
use super::Inner;
use crate::backend::{split_parent, FileKind};
use crate::error::FsResult;

/// Entries kept at most; a change past it flushes the journal and is made at once.
const JOURNAL_MAX: usize = 512;

/// A name change the server has not seen yet.
pub(super) enum Entry {
    Unlink { path: String, now: i64 },
    Rmdir { path: String, now: i64 },
    Rename { from: String, to: String, now: i64 },
}

impl Inner {
    /// Journals the unlink (`dir`: rmdir) of `path` if its outcome is certain (see above);
    /// false when it must be made at once.
    pub(super) fn journal_take(&self, path: &str, dir: bool) -> bool {
        if !self.drafts.allowed() || path.is_empty() {
            return false;
        }
        let Some(_exclusive) = self.drafts.gate.try_write() else {
            return false;
        };
        if !self.drafts.allowed() || self.drafts.journal.lock().len() >= JOURNAL_MAX {
            return false;
        }
        let known = match dir {
            true => self.dirs.empty_dir(path),
            false => self.dirs.node(path).is_some_and(|n| {
                n.kind != FileKind::Dir && !self.handles.is_open(n.ino) && !self.drafts.holds(n.ino)
            }),
        };
        if !known || !matches!(self.dirs.known(split_parent(path).0), Known::Dir(_)) {
            return false;
        }
        let now = crate::backend::tree::now_ns();
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
        if flags != 0 || !self.drafts.allowed() || from.is_empty() || to.is_empty() {
            return false;
        }
        let Some(_exclusive) = self.drafts.gate.try_write() else {
            return false;
        };
        if !self.drafts.allowed() || self.drafts.journal.lock().len() >= JOURNAL_MAX {
            return false;
        }
        let file = self.dirs.node(from).filter(|n| n.kind != FileKind::Dir && !self.drafts.holds(n.ino));
        let known_dirs =
            [from, to].iter().all(|p| matches!(self.dirs.known(split_parent(p).0), Known::Dir(_)));
        if file.is_none() || !known_dirs || self.dirs.known(to) != Known::Absent {
            return false;
        }
        let now = crate::backend::tree::now_ns();
        let ticket = self.dirs.changing();
        self.dirs.changed(ticket, Change::Moved { from, to, now, exchange: false }, true);
        self.drafts.journal(Entry::Rename { from: from.to_string(), to: to.to_string(), now });
        true
    }

    /// Sends the journal to the server, in one transaction; on a failure to reach it, keeps
    /// it for the next time.
    pub(super) fn flush_journal(&self) -> FsResult<()> {
        let _sending = self.drafts.sending.lock();
        let entries = self.drafts.take_journal();
        if entries.is_empty() {
            return Ok(());
        }
        let (kept, deletion) = self.handles.deleting();
        let batch = self.journal_batch(&entries, &kept);
        let mut conn = self.pooled()?;
        let answers = match conn.client.simple_query(&batch) {
            Ok(answers) => answers,
            Err(e) => {
                let _ = conn.client.batch_execute("ROLLBACK");
                self.drafts.restore_journal(entries);
                return Err(self.settings.error(e));
            }
        };
        let rows = answers.iter().filter_map(|m| match m {
            postgres::SimpleQueryMessage::Row(row) => Some(row),
            _ => None,
        });
        for (entry, row) in entries.iter().zip(rows) {
            let field = |i: usize| row.get(i).unwrap_or("");
            if field(0) != "0" {
                let path = match entry {
                    Entry::Unlink { path, .. } | Entry::Rmdir { path, .. } => path,
                    Entry::Rename { from, .. } => from,
                };
                tracing::error!(
                    "postgres: a change of {} answered already was refused by the server (errno {}): another daemon changed the namespace meanwhile",
                    crate::display::escape(path),
                    field(0)
                );
                continue;
            }
            let orphan = match entry {
                Entry::Unlink { .. } | Entry::Rmdir { .. } => {
                    let ino: i64 = field(1).parse().unwrap_or(0);
                    (field(2) == "0" && kept.contains(&ino)).then_some(ino as u64)
                }
                Entry::Rename { .. } => field(2).parse::<u64>().ok(),
            };
            self.keep_orphan(orphan, &deletion);
        }
        Ok(())
    }

    /// The simple-query batch of `entries`: one transaction, one row per entry (`errno`,
    /// then the function's other answers).
    fn journal_batch(&self, entries: &[Entry], kept: &[i64]) -> String {
        let kept =
            format!("'{{{}}}'::bigint[]", kept.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(","));
        let name = |path: &str| {
            let (dir, leaf) = split_parent(path);
            let parts: Vec<String> = dir.split('/').filter(|c| !c.is_empty()).map(literal).collect();
            format!("ARRAY[{}]::text[], {}", parts.join(", "), literal(leaf))
        };
        let head = |function: &str, path: &str| {
            format!(
                "SELECT {} FROM {function}({}, {}, {}, {}",
                match function {
                    "rename_at" => "out_errno, out_moved, out_orphan",
                    _ => "out_errno, out_ino, out_left",
                },
                self.tree_key,
                self.ns,
                self.root,
                name(path)
            )
        };
        let channel = literal(&self.channel);
        let mut batch = String::from("BEGIN;\n");
        for entry in entries {
            let call = match entry {
                Entry::Unlink { path, now } | Entry::Rmdir { path, now } => {
                    let function =
                        if matches!(entry, Entry::Unlink { .. }) { "unlink_at" } else { "rmdir_at" };
                    let payload = literal(&self.payload(super::ops::Changed::Name, path));
                    format!(
                        "{}, {now}, {}, {kept}, {channel}, {payload})",
                        head(function, path),
                        self.instance
                    )
                }
                Entry::Rename { from, to, now } => {
                    let (from_payload, to_payload) = (
                        literal(&self.payload(super::ops::Changed::Name, from)),
                        literal(&self.payload(super::ops::Changed::Name, to)),
                    );
                    format!(
                        "{}, {}, 0, {now}, {}, {kept}, {channel}, {from_payload}, {to_payload})",
                        head("rename_at", from),
                        name(to),
                        self.instance
                    )
                }
            };
            batch.push_str(&call);
            batch.push_str(";\n");
        }
        batch.push_str("COMMIT");
        batch
    }
}
