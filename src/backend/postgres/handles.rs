//! This daemon's open handles on the postgres route: how many each inode has, which of them
//! lost their last name (their rows go at the last close), and what an open needs to know to
//! be sure that no unlink of this daemon deleted its inode behind its back.
//!
//! An open walks its path, then registers its handle. An unlink, rmdir or rename of this
//! daemon that takes an inode's last name deletes its rows unless the inode had a handle when
//! it started ([`Handles::deleting`] hands it those inodes), so a registration that comes
//! while it runs is too late. The open can tell without asking the server: a deletion under
//! way is counted in `deleting`, and every one that ends moves `ended`. If neither happened
//! since the walk started, the walk's inode outlives the handle; otherwise the open waits for
//! the deletions under way to end, and then asks the server whether its rows are still there.
//!
//! Other daemons know nothing of this daemon's handles: their unlinks delete at once, and
//! such a handle answers ESTALE (see `file`).

use std::collections::{HashMap, HashSet};

use parking_lot::{Condvar, Mutex};

#[derive(Default)]
struct State {
    /// Open handles per inode.
    count: HashMap<u64, usize>,
    /// Open inodes without a name: deleted at their last close.
    orphans: HashSet<u64>,
    /// Deletions under way ([`Handles::deleting`]).
    deleting: usize,
    /// How many deletions have ended.
    ended: u64,
}

#[derive(Default)]
pub(super) struct Handles {
    state: Mutex<State>,
    /// Signalled when a deletion ends.
    deletions_ended: Condvar,
}

/// Where an open stands before its walk; see [`Handles::register_after`].
#[derive(Clone, Copy)]
pub(super) struct Before(u64);

/// A change of names under way that may delete a node's rows; ends when dropped (after its
/// commit or rollback).
pub(super) struct Deletion<'a>(&'a Handles);

impl Drop for Deletion<'_> {
    fn drop(&mut self) {
        let mut s = self.0.state.lock();
        s.deleting -= 1;
        s.ended += 1;
        drop(s);
        self.0.deletions_ended.notify_all();
    }
}

impl Deletion<'_> {
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
    /// Starts a change of names that may delete a node's rows: the inodes that have handles
    /// now (whose rows it must keep when it takes their last name), and the guard that ends
    /// it. Until then, opens check with the server.
    pub fn deleting(&self) -> (Vec<i64>, Deletion<'_>) {
        let mut s = self.state.lock();
        s.deleting += 1;
        let open = s.count.keys().map(|&ino| ino as i64).collect();
        (open, Deletion(self))
    }

    /// Whether this daemon has a handle on `ino`.
    pub fn is_open(&self, ino: u64) -> bool {
        self.state.lock().count.contains_key(&ino)
    }

    /// Registers a handle on `ino`.
    pub fn opened(&self, ino: u64) {
        *self.state.lock().count.entry(ino).or_insert(0) += 1;
    }

    /// A handle on `ino` closed. The last one of a nameless inode starts the deletion of its
    /// rows, which the caller makes while it holds the guard returned: an open racing it (one
    /// that found the inode by a walk from before its name went) checks with the server once
    /// the rows are gone, rather than while they are going.
    pub fn closed(&self, ino: u64) -> Option<Deletion<'_>> {
        let mut s = self.state.lock();
        let count = s.count.get_mut(&ino).expect("a registered handle");
        *count -= 1;
        if *count > 0 {
            return None;
        }
        s.count.remove(&ino);
        if !s.orphans.remove(&ino) {
            return None;
        }
        s.deleting += 1;
        Some(Deletion(self))
    }

    /// Registers a handle on `ino`, which is about to be created, once no deletion is under
    /// way: every deletion that starts after this keeps its rows.
    pub fn opened_for_create(&self, ino: u64) {
        let mut s = self.state.lock();
        while s.deleting > 0 {
            self.deletions_ended.wait(&mut s);
        }
        *s.count.entry(ino).or_insert(0) += 1;
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
        s.ended == before.0 && s.deleting == 0
    }

    /// Waits until no deletion of this daemon is under way: after that, the server shows
    /// whether any deleted a given inode.
    pub fn wait_for_deletions(&self) {
        let mut s = self.state.lock();
        while s.deleting > 0 {
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
        assert!(h.closed(7).is_none());

        // A deletion under way when the open registers.
        let before = h.before_walk();
        let (open, deletion) = h.deleting();
        assert!(open.is_empty());
        assert!(!h.register_after(7, before), "under way");
        drop(deletion);
        assert!(h.closed(7).is_none());

        // A deletion that ended between the walk and the registration.
        let before = h.before_walk();
        drop(h.deleting());
        assert!(!h.register_after(7, before), "one ended since the walk");

        // A deletion that started with a handle keeps the inode as an orphan.
        let (open, deletion) = h.deleting();
        assert_eq!(open, vec![7]);
        assert!(deletion.kept(7), "a handle holds it");
        drop(deletion);
        let before = h.before_walk();
        let deleting = h.closed(7).expect("the last close of an orphan deletes it");
        assert!(!h.register_after(7, before), "an open racing that deletion is not sure");
        drop(deleting);
        assert!(h.closed(7).is_none(), "the racing open's handle is no orphan");
        assert!(!h.register_after(8, before), "one ended since the walk");
        assert!(h.closed(8).is_none());

        // The handle closed before the deletion could keep it: the caller deletes.
        let (_, deletion) = h.deleting();
        assert!(!deletion.kept(9));
    }
}
