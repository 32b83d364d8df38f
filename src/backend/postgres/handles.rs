//! This daemon's open handles on the postgres route: how many each inode has, which of them
//! lost their last name (their rows go at the last close), and what an open needs to know to
//! be sure that no unlink of this daemon deleted its inode behind its back.
//!
//! An open walks its path, then registers its handle. An unlink, rmdir or rename of this
//! daemon that takes an inode's last name deletes its rows unless a handle is registered
//! (`Inner::drop_or_defer`), so a registration that comes after that decision is too late. The
//! open can tell without asking the server: a deletion decided and not yet ended is in
//! `dying`, and every deletion that ends moves `ended`. If neither happened since the walk
//! started, the walk's inode outlives the handle; otherwise the open waits for the deletions
//! of its inode under way to end, and then asks the server whether its rows are still there.
//! An unlink done in one call of the server ([`Handles::deleting_unknown`]) does not know its
//! inode before the call: it hands the server the inodes that have handles, and while it runs
//! every open counts as racing it.
//!
//! Other daemons know nothing of this daemon's handles: their unlinks delete at once, and
//! such a handle answers ESTALE (see `file`).

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use parking_lot::{Condvar, Mutex};

#[derive(Default)]
struct State {
    /// Open handles per inode.
    count: HashMap<u64, usize>,
    /// Open inodes without a name: deleted at their last close.
    orphans: HashSet<u64>,
    /// Inodes whose rows a transaction of this daemon is deleting, until it ends.
    dying: HashMap<u64, usize>,
    /// Deletions under way whose inode is not known yet ([`Handles::deleting_unknown`]).
    unknown: usize,
    /// How many transactions that deleted rows have ended.
    ended: u64,
}

#[derive(Default)]
pub(super) struct Handles {
    state: Mutex<State>,
    /// Signalled when a transaction that deleted rows ends.
    deletions_ended: Condvar,
}

thread_local! {
    /// The inodes the transaction running on this thread decided to delete.
    static DELETING: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Where an open stands before its walk; see [`Handles::register_after`].
#[derive(Clone, Copy)]
pub(super) struct Before(u64);

/// Ends, when dropped, the deletions that the transaction on this thread decided.
pub(super) struct TransactionEnd<'a>(&'a Handles);

impl Drop for TransactionEnd<'_> {
    fn drop(&mut self) {
        let decided = DELETING.with(|d| std::mem::take(&mut *d.borrow_mut()));
        if decided.is_empty() {
            return;
        }
        let mut s = self.0.state.lock();
        for ino in decided {
            if let Some(n) = s.dying.get_mut(&ino) {
                *n -= 1;
                if *n == 0 {
                    s.dying.remove(&ino);
                }
            }
        }
        s.ended += 1;
        drop(s);
        self.0.deletions_ended.notify_all();
    }
}

/// A deletion whose inode is not known before it is made; ends when dropped.
pub(super) struct UnknownDeletion<'a>(&'a Handles);

impl Drop for UnknownDeletion<'_> {
    fn drop(&mut self) {
        let mut s = self.0.state.lock();
        s.unknown -= 1;
        s.ended += 1;
        drop(s);
        self.0.deletions_ended.notify_all();
    }
}

impl UnknownDeletion<'_> {
    /// The deletion kept the nameless `ino` for a handle it was told of: it becomes an
    /// orphan, deleted at its last close. False if that handle closed meanwhile, and the
    /// caller deletes the rows.
    pub fn kept(&self, ino: u64) -> bool {
        let mut s = self.0.state.lock();
        if s.count.contains_key(&ino) {
            s.orphans.insert(ino);
            return true;
        }
        false
    }
}

impl Handles {
    /// Starts a deletion whose inode the server finds: the inodes that have handles now (the
    /// server keeps such an inode's rows when it takes its last name), and the guard that ends
    /// it. Until then, opens check with the server.
    pub fn deleting_unknown(&self) -> (Vec<i64>, UnknownDeletion<'_>) {
        let mut s = self.state.lock();
        s.unknown += 1;
        let open = s.count.keys().map(|&ino| ino as i64).collect();
        (open, UnknownDeletion(self))
    }

    /// Registers a handle on `ino`.
    pub fn opened(&self, ino: u64) {
        *self.state.lock().count.entry(ino).or_insert(0) += 1;
    }

    /// A handle on `ino` closed; true if it was the last one of a nameless inode, whose rows
    /// the caller deletes.
    pub fn closed(&self, ino: u64) -> bool {
        let mut s = self.state.lock();
        let count = s.count.get_mut(&ino).expect("a registered handle");
        *count -= 1;
        if *count > 0 {
            return false;
        }
        s.count.remove(&ino);
        s.orphans.remove(&ino)
    }

    /// Taken before a transaction that may delete rows; its end is when the guard drops,
    /// after the commit or the rollback.
    pub fn transaction(&self) -> TransactionEnd<'_> {
        TransactionEnd(self)
    }

    /// Inside such a transaction, which takes the last name of `ino`: true if a handle holds
    /// it (it becomes an orphan, deleted at its last close), false if the caller deletes its
    /// rows now.
    pub fn keep_or_delete(&self, ino: u64) -> bool {
        let mut s = self.state.lock();
        if s.count.contains_key(&ino) {
            s.orphans.insert(ino);
            return true;
        }
        *s.dying.entry(ino).or_insert(0) += 1;
        DELETING.with(|d| d.borrow_mut().push(ino));
        false
    }

    /// Read before the walk of an open.
    pub fn before_walk(&self) -> Before {
        Before(self.state.lock().ended)
    }

    /// Registers a handle on `ino`, found by a walk that started at `before`; true if no
    /// deletion of this daemon can have taken the inode since (false: registered all the
    /// same, and the caller checks with the server).
    pub fn register_after(&self, ino: u64, before: Before) -> bool {
        let mut s = self.state.lock();
        *s.count.entry(ino).or_insert(0) += 1;
        s.ended == before.0 && s.unknown == 0 && !s.dying.contains_key(&ino)
    }

    /// Waits until no transaction of this daemon is deleting the rows of `ino`: after that,
    /// the server shows whether any deleted them.
    pub fn wait_for_deletions_of(&self, ino: u64) {
        let mut s = self.state.lock();
        while s.unknown > 0 || s.dying.contains_key(&ino) {
            self.deletions_ended.wait(&mut s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_is_sure_only_when_no_deletion_ended_or_is_under_way() {
        let h = Handles::default();
        let before = h.before_walk();
        assert!(h.register_after(7, before), "nothing happened meanwhile");
        assert!(!h.closed(7));

        // A deletion under way when the open registers.
        let before = h.before_walk();
        let end = h.transaction();
        assert!(!h.keep_or_delete(7), "no handle: its rows go");
        assert!(!h.register_after(7, before), "under way");
        drop(end);
        assert!(!h.closed(7));

        // A deletion that ended between the walk and the registration.
        let before = h.before_walk();
        {
            let _end = h.transaction();
            assert!(!h.keep_or_delete(8));
        }
        assert!(!h.register_after(7, before), "one ended since the walk");
        assert!(!h.closed(7));

        // A deletion decided after the registration sees the handle.
        let before = h.before_walk();
        assert!(h.register_after(9, before));
        {
            let _end = h.transaction();
            assert!(h.keep_or_delete(9), "a handle holds it");
        }
        assert!(h.closed(9), "the last close of an orphan deletes it");

        // A deletion whose inode is not known: every open racing it checks.
        let before = h.before_walk();
        let (open, deletion) = h.deleting_unknown();
        assert!(open.is_empty());
        assert!(!h.register_after(10, before), "an unknown deletion is under way");
        drop(deletion);
        let before = h.before_walk();
        let (open, deletion) = h.deleting_unknown();
        assert_eq!(open, vec![10]);
        assert!(deletion.kept(10), "a handle holds it");
        drop(deletion);
        assert!(h.closed(10), "kept as an orphan");
        assert!(!h.register_after(11, before), "one ended since the walk");
    }
}
