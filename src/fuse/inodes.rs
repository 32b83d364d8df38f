//! The FUSE door's inode table: kernel inode numbers ↔ the virtual paths they are known by.
//!
//! A directory has one path. A file reached through several hard links is one inode with
//! several paths (so `st_ino` and the page cache are shared, as POSIX tools expect), keyed by
//! the backend's own identity of the node; the engine judges an inode-level operation on every
//! path the inode is known by. A number is reused only for the backend node it stood for
//! (see [`Tables::retired`]), so the generation is always 0.
//! Renames move the paths of a node and of everything the kernel knows beneath it; unlink
//! removes one path, and a node without paths lives on only for its open handles.

type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;
type HashSet<K> = std::collections::HashSet<K, ahash::RandomState>;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use parking_lot::RwLock;
use smallvec::SmallVec;

use crate::error::{Errno, FsError, FsResult};
use crate::fuse::absent::AbsentNames;
use crate::vpath::VPath;

pub const ROOT_INO: u64 = 1;

/// Which backend node a non-directory inode stands for: (route index, backend inode).
pub type Identity = (u32, u64);

/// Kept small: the kernel may hold millions of inodes (a `find` over a big tree), and each
/// costs this entry, one in each map, and its path.
struct Node {
    /// Live names, the first one preferred; empty once every name was removed. One name,
    /// the usual case, needs no allocation of its own.
    paths: SmallVec<[VPath; 1]>,
    /// The identity, unpacked so the node stays at 40 bytes (`Option<(u32, u64)>` takes 24).
    /// For a directory, its backend inode number (0 when unknown): no identity, since the
    /// kernel has one inode per directory, but a directory that another program put in place
    /// of this one under the same name is another inode.
    backend_ino: u64,
    /// `NO_ROUTE` for directories, which have no identity.
    route: u32,
    /// Lookups the kernel holds on this inode (it sends `forget` to drop them). 32 bits: a
    /// count that reaches the maximum stays there, and the node is then kept for good rather
    /// than dropped while the kernel may still hold it.
    lookups: AtomicU32,
}

const NO_ROUTE: u32 = u32::MAX;

impl Node {
    fn new(path: VPath, identity: Option<Identity>, dir_ino: u64) -> Node {
        let (route, backend_ino) = identity.unwrap_or((NO_ROUTE, dir_ino));
        Node { paths: smallvec::smallvec![path], backend_ino, route, lookups: AtomicU32::new(1) }
    }

    fn add_lookup(&self) {
        let _ = self.lookups.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_add(1));
    }

    /// Drops `count` lookups and returns how many are left (a saturated count never drops).
    fn drop_lookups(&self, count: u64) -> u32 {
        let held = self.lookups.load(Ordering::Relaxed);
        let left = if held == u32::MAX { held } else { (held as u64).saturating_sub(count) as u32 };
        self.lookups.store(left, Ordering::Relaxed);
        left
    }

    fn identity(&self) -> Option<Identity> {
        (self.route != NO_ROUTE).then_some((self.route, self.backend_ino))
    }

    /// Whether a lookup that found `identity` (or, for a directory, backend inode `dir_ino`,
    /// 0 when unknown) found this node.
    fn is(&self, identity: Option<Identity>, dir_ino: u64) -> bool {
        self.identity() == identity
            && (identity.is_some() || dir_ino == 0 || self.backend_ino == 0 || self.backend_ino == dir_ino)
    }
}

#[derive(Default)]
struct Tables {
    by_ino: HashMap<u64, Node>,
    by_path: HashMap<VPath, u64>,
    by_identity: HashMap<Identity, u64>,
    /// Inodes that lost a name behind the kernel's back (found stale by the door), until the
    /// kernel forgets them: the kernel may still hold that name. Rare, so kept apart.
    went_stale: HashSet<u64>,
    /// Inodes whose last name an unlink through the mount removed (not a rename's
    /// replacement), until the kernel forgets them.
    deleted: HashSet<u64>,
    /// The numbers of forgotten non-directories, by identity: a node the kernel looks up
    /// again gets its old number back, so `st_ino` stays what programs saw (git compares it
    /// with its index and rereads every file whose number changed, after the kernel dropped
    /// its inodes under memory pressure). Only that node ever gets the number again, so it
    /// never names two things; once [`RETIRED_MOST`] are kept, the map starts over.
    retired: HashMap<Identity, u64>,
    /// Inodes made for a file while an older inode of it lives on, nameless and held open
    /// (another program moved the file while a descriptor through the mount held it): two
    /// inodes for one file, whose attributes the kernel would cache apart, so it keeps none of
    /// this one's. Until the kernel forgets it.
    twins: HashSet<u64>,
}

/// Forgotten numbers kept at most (about 40 bytes each).
const RETIRED_MOST: usize = 1 << 20;

pub struct Inodes {
    tables: RwLock<Tables>,
    next: AtomicU64,
    /// Names the kernel may cache as absent.
    pub absent: AbsentNames,
}

impl Default for Inodes {
    fn default() -> Self {
        Self::new()
    }
}

impl Inodes {
    pub fn new() -> Inodes {
        let mut tables = Tables::default();
        let root = Node::new(VPath::root(), None, 0);
        tables.by_ino.insert(ROOT_INO, root);
        tables.by_path.insert(VPath::root(), ROOT_INO);
        Inodes {
            tables: RwLock::new(tables),
            next: AtomicU64::new(ROOT_INO + 1),
            absent: AbsentNames::default(),
        }
    }

    /// The preferred path of an inode; ENOENT once all its names are gone.
    pub fn path(&self, ino: u64) -> FsResult<VPath> {
        let tables = self.tables.read();
        match tables.by_ino.get(&ino) {
            Some(node) => {
                node.paths.first().cloned().ok_or_else(|| FsError::new(Errno::ENOENT, "the name was removed"))
            }
            None => Err(FsError::new(Errno::ESTALE, format!("unknown inode {ino}"))),
        }
    }

    /// The backend identity of an inode (none for directories and unknown inodes).
    pub fn identity(&self, ino: u64) -> Option<Identity> {
        self.tables.read().by_ino.get(&ino).and_then(Node::identity)
    }

    /// `path` no longer leads to inode `ino` (found so by the door): it stops being its name.
    pub fn drop_stale_name(&self, ino: u64, path: &VPath) {
        let mut tables = self.tables.write();
        if tables.by_path.get(path) == Some(&ino) {
            Self::unlink_path(&mut tables, path);
            tables.went_stale.insert(ino);
        }
    }

    /// Whether every name of a file was removed or replaced by calls through the mount: the
    /// kernel dropped each of those names itself and holds none, so a call for the file came
    /// through a descriptor (an open of `/proc/PID/fd/N`), or raced the call that took the name,
    /// not through a stale name.
    pub fn lost_names_through_mount(&self, ino: u64) -> bool {
        let tables = self.tables.read();
        tables.by_ino.get(&ino).is_some_and(|node| node.paths.is_empty()) && !tables.went_stale.contains(&ino)
    }

    /// [`Inodes::lost_names_through_mount`], the last name by an unlink: the name is gone (a
    /// rename's replacement leaves the name there, leading to another file).
    pub fn deleted_through_mount(&self, ino: u64) -> bool {
        self.lost_names_through_mount(ino) && self.tables.read().deleted.contains(&ino)
    }

    /// Whether `ino` is a second inode of a file held open under an older one (see
    /// [`Tables::twins`]).
    pub fn is_twin(&self, ino: u64) -> bool {
        self.tables.read().twins.contains(&ino)
    }

    /// Whether an inode still has a name (unknown inodes have none).
    pub fn has_names(&self, ino: u64) -> bool {
        self.tables.read().by_ino.get(&ino).is_some_and(|node| !node.paths.is_empty())
    }

    /// Every live path of an inode (hard links), the preferred one first.
    pub fn paths(&self, ino: u64) -> FsResult<Vec<VPath>> {
        let tables = self.tables.read();
        match tables.by_ino.get(&ino) {
            Some(node) if !node.paths.is_empty() => Ok(node.paths.to_vec()),
            Some(_) => Err(FsError::new(Errno::ENOENT, "the name was removed")),
            None => Err(FsError::new(Errno::ESTALE, format!("unknown inode {ino}"))),
        }
    }

    /// Records one kernel lookup of `path` and returns its inode number. `identity` (for
    /// non-directories) joins hard links of one backend node into one inode.
    pub fn remember(&self, path: &VPath, identity: Option<Identity>) -> u64 {
        self.remember_displacing(path, identity, 0, false).0
    }

    /// [`Inodes::remember`], which also returns the inode `path` was taken from when the name
    /// led to another node until now (replaced behind the kernel's back). `dir_ino`: for a
    /// directory, its backend inode number (0 when unknown). `held`: the node that had
    /// `identity` until now is held open, so a new node for `path` is its twin (see
    /// [`Tables::twins`]).
    pub fn remember_displacing(
        &self,
        path: &VPath,
        identity: Option<Identity>,
        dir_ino: u64,
        held: bool,
    ) -> (u64, Option<u64>) {
        {
            let tables = self.tables.read();
            if let Some(&ino) = tables.by_path.get(path) {
                let node = &tables.by_ino[&ino];
                if node.is(identity, dir_ino) {
                    node.add_lookup();
                    return (ino, None);
                }
            }
        }
        let mut tables = self.tables.write();
        let mut displaced = None;
        if let Some(&ino) = tables.by_path.get(path) {
            if tables.by_ino[&ino].is(identity, dir_ino) {
                tables.by_ino[&ino].add_lookup();
                return (ino, None);
            }
            // The name now refers to another node (replaced behind our back).
            Self::unlink_path(&mut tables, path);
            tables.went_stale.insert(ino);
            displaced = Some(ino);
        }
        if let Some(id) = identity {
            if let Some(&ino) = tables.by_identity.get(&id) {
                let node = tables.by_ino.get_mut(&ino).expect("identity points to a node");
                // A node whose names were all removed is not revived by a recycled identity.
                if !node.paths.is_empty() {
                    node.paths.push(path.clone());
                    node.add_lookup();
                    tables.by_path.insert(path.clone(), ino);
                    return (ino, displaced);
                }
            }
        }
        let reused = identity.and_then(|id| tables.retired.remove(&id));
        let ino = reused.unwrap_or_else(|| self.next.fetch_add(1, Ordering::Relaxed));
        let node = Node::new(path.clone(), identity, dir_ino);
        tables.by_ino.insert(ino, node);
        tables.by_path.insert(path.clone(), ino);
        if let Some(id) = identity {
            match tables.by_identity.get(&id) {
                // The identity stays with the open inode, so that the name's next inode (the
                // kernel may forget this one at once, since it keeps nothing of it) is found
                // to be a twin too.
                Some(older) if held && tables.by_ino.contains_key(older) => {
                    tables.twins.insert(ino);
                }
                _ => {
                    tables.by_identity.insert(id, ino);
                }
            }
        }
        (ino, displaced)
    }

    /// The node `identity` stands for and its other names, when `path` is not yet one of them:
    /// what `path` would join as a hard link. A backend may recycle an identity (a host file
    /// deleted behind the kernel's back, another created with its inode number, while the
    /// kernel still holds the old inode), so the caller checks that these names still lead to
    /// the node and drops those that do not ([`Inodes::drop_stale_name`]) before remembering
    /// `path`.
    pub fn other_names(&self, path: &VPath, identity: Identity) -> Option<(u64, Vec<VPath>)> {
        let tables = self.tables.read();
        let &ino = tables.by_identity.get(&identity)?;
        if tables.by_path.get(path) == Some(&ino) {
            return None;
        }
        Some((ino, tables.by_ino[&ino].paths.iter().filter(|p| *p != path).cloned().collect()))
    }

    /// The kernel dropped `count` lookups; the inode goes when none are left.
    /// Returns whether the inode is gone (the kernel holds no more references).
    pub fn forget(&self, ino: u64, count: u64) -> bool {
        !self.forget_many([(ino, count)]).is_empty()
    }

    /// [`Inodes::forget`] of many inodes (the kernel's batched forgets) under one lock: the
    /// forgets of a dropped cache come by the thousand. Returns the inodes that are gone.
    pub fn forget_many(&self, forgets: impl IntoIterator<Item = (u64, u64)>) -> Vec<u64> {
        let mut gone = Vec::new();
        let mut tables = self.tables.write();
        for (ino, count) in forgets {
            if Self::forget_locked(&mut tables, ino, count) {
                gone.push(ino);
            }
        }
        drop(tables);
        for &ino in &gone {
            self.absent.forget_parent(ino);
        }
        gone
    }

    fn forget_locked(tables: &mut Tables, ino: u64, count: u64) -> bool {
        if ino == ROOT_INO {
            return false;
        }
        let Some(node) = tables.by_ino.get(&ino) else { return false };
        let left = node.drop_lookups(count);
        if left == 0 {
            let node = tables.by_ino.remove(&ino).expect("present");
            for path in &node.paths {
                if tables.by_path.get(path) == Some(&ino) {
                    tables.by_path.remove(path);
                }
            }
            if let Some(id) = node.identity() {
                if tables.by_identity.get(&id) == Some(&ino) {
                    tables.by_identity.remove(&id);
                }
                if tables.retired.len() >= RETIRED_MOST {
                    tables.retired.clear();
                }
                tables.retired.insert(id, ino);
            }
            tables.went_stale.remove(&ino);
            tables.deleted.remove(&ino);
            tables.twins.remove(&ino);
        }
        left == 0
    }

    /// The name at `path` is gone (unlink, rmdir).
    pub fn removed(&self, path: &VPath) {
        let mut tables = self.tables.write();
        if let Some(ino) = Self::unlink_path(&mut tables, path) {
            if tables.by_ino.get(&ino).is_some_and(|node| node.paths.is_empty()) {
                tables.deleted.insert(ino);
            }
        }
    }

    /// Removes `path` from the tables; returns the inode it named.
    fn unlink_path(tables: &mut Tables, path: &VPath) -> Option<u64> {
        let ino = tables.by_path.remove(path)?;
        if let Some(node) = tables.by_ino.get_mut(&ino) {
            node.paths.retain(|p| p != path);
        }
        Some(ino)
    }

    fn entries_under(tables: &Tables, root: &VPath) -> Vec<(VPath, u64)> {
        tables.by_path.iter().filter(|(p, _)| p.starts_with(root)).map(|(p, &i)| (p.clone(), i)).collect()
    }

    fn set_path(tables: &mut Tables, ino: u64, old: &VPath, new: VPath) {
        tables.by_path.insert(new.clone(), ino);
        if let Some(node) = tables.by_ino.get_mut(&ino) {
            match node.paths.iter_mut().find(|p| *p == old) {
                Some(p) => *p = new,
                None => node.paths.push(new),
            }
        }
    }

    /// `from` now lives at `to`, with everything the kernel knows beneath it; whatever was at
    /// `to` is replaced.
    pub fn renamed(&self, from: &VPath, to: &VPath) {
        let mut tables = self.tables.write();
        // A file has nothing beneath it: only its own name moves, without a scan of every
        // path the kernel knows (in a directory of 10k known files, 20k path comparisons per
        // rename). Directories have no identity.
        let is_file = |t: &Tables, p: &VPath| {
            t.by_path.get(p).and_then(|ino| t.by_ino.get(ino)).is_some_and(|n| n.identity().is_some())
        };
        if is_file(&tables, from) && (is_file(&tables, to) || !tables.by_path.contains_key(to)) {
            Self::unlink_path(&mut tables, to);
            let ino = tables.by_path.remove(from).expect("a file's entry, found above");
            Self::set_path(&mut tables, ino, from, to.clone());
            return;
        }
        for (path, _) in Self::entries_under(&tables, to) {
            Self::unlink_path(&mut tables, &path);
        }
        let moved = Self::entries_under(&tables, from);
        for (old, _) in &moved {
            tables.by_path.remove(old);
        }
        for (old, ino) in moved {
            let new = to.join_rel(old.strip_prefix(from).expect("filtered by prefix"));
            Self::set_path(&mut tables, ino, &old, new);
        }
    }

    /// `a` and `b` swapped places (RENAME_EXCHANGE).
    pub fn exchanged(&self, a: &VPath, b: &VPath) {
        let mut tables = self.tables.write();
        let (under_a, under_b) = (Self::entries_under(&tables, a), Self::entries_under(&tables, b));
        for (path, _) in under_a.iter().chain(under_b.iter()) {
            tables.by_path.remove(path);
        }
        let moves: Vec<(VPath, VPath, u64)> = under_a
            .into_iter()
            .map(|(p, i)| (b.join_rel(p.strip_prefix(a).unwrap_or("")), p, i))
            .chain(under_b.into_iter().map(|(p, i)| (a.join_rel(p.strip_prefix(b).unwrap_or("")), p, i)))
            .collect();
        for (new, old, ino) in moves {
            Self::set_path(&mut tables, ino, &old, new);
        }
    }

    /// The inode that stands for the backend node `identity`, if the kernel knows one.
    pub fn ino_by_identity(&self, identity: Identity) -> Option<u64> {
        self.tables.read().by_identity.get(&identity).copied()
    }

    /// The inode the kernel knows `path` by, if any.
    pub fn ino_of(&self, path: &VPath) -> Option<u64> {
        self.tables.read().by_path.get(path).copied()
    }

    /// Every (parent inode, name) the kernel may have cached, for invalidation after a rule
    /// change.
    pub fn known_entries(&self) -> Vec<(u64, String)> {
        let tables = self.tables.read();
        tables
            .by_path
            .keys()
            .filter(|p| !p.is_root())
            .filter_map(|p| Some((*tables.by_path.get(&p.parent())?, p.name().to_string())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn nodes_stay_small() {
        // Per inode the kernel holds: this, three map entries and a path. A `find` over 1M
        // files must leave the daemon under 300 MiB.
        assert!(std::mem::size_of::<super::Node>() <= 40, "{}", std::mem::size_of::<super::Node>());
    }

    use super::*;

    fn p(s: &str) -> VPath {
        VPath::parse(s).unwrap()
    }

    #[test]
    fn lookups_and_forget() {
        let t = Inodes::new();
        let a = t.remember(&p("/a"), Some((0, 7)));
        assert_eq!(t.remember(&p("/a"), Some((0, 7))), a);
        t.forget(a, 1);
        assert_eq!(t.path(a).unwrap(), p("/a"));
        t.forget(a, 1);
        assert!(t.path(a).is_err());
        assert_eq!(t.remember(&p("/a"), Some((0, 7))), a, "the same node gets its number back");
        t.forget(a, 1);
        let b = t.remember(&p("/b"), Some((0, 8)));
        assert_ne!(b, a, "another node never gets it");
        assert_eq!(t.remember(&p("/c"), Some((0, 7))), a, "nor does a new name lose it");
        // Directories have no identity: a forgotten one comes back with a new number.
        let d = t.remember(&p("/d"), None);
        t.forget(d, 1);
        assert_ne!(t.remember(&p("/d"), None), d);
    }

    #[test]
    fn a_lookup_count_at_its_maximum_keeps_the_inode() {
        let t = Inodes::new();
        let a = t.remember(&p("/a"), None);
        t.tables.read().by_ino[&a].lookups.store(u32::MAX - 1, Ordering::Relaxed);
        assert_eq!(t.remember(&p("/a"), None), a);
        assert_eq!(t.remember(&p("/a"), None), a);
        assert!(!t.forget(a, u64::from(u32::MAX) + 5));
        assert_eq!(t.path(a).unwrap(), p("/a"));
        // Below the maximum, a count is exact.
        let b = t.remember(&p("/b"), None);
        assert_eq!(t.remember(&p("/b"), None), b);
        assert!(!t.forget(b, 1));
        assert!(t.forget(b, 1));
    }

    #[test]
    fn a_batch_of_forgets_drops_the_inodes_it_empties() {
        let t = Inodes::new();
        let a = t.remember(&p("/a"), Some((0, 1)));
        let b = t.remember(&p("/b"), Some((0, 2)));
        t.remember(&p("/b"), Some((0, 2)));
        assert_eq!(t.forget_many([(a, 1), (b, 1), (ROOT_INO, 1), (999, 1)]), [a]);
        assert_eq!(t.ino_of(&p("/a")), None);
        assert_eq!(t.path(b).unwrap(), p("/b"), "one lookup left");
        assert_eq!(t.forget_many([(b, 1)]), [b]);
        // The numbers come back with their nodes (retired, not lost).
        assert_eq!(t.remember(&p("/a"), Some((0, 1))), a);
    }

    #[test]
    fn hard_links_share_an_inode_and_keep_all_names() {
        let t = Inodes::new();
        let a = t.remember(&p("/x/a"), Some((1, 9)));
        assert_eq!(t.remember(&p("/x/b"), Some((1, 9))), a);
        assert_eq!(t.paths(a).unwrap(), [p("/x/a"), p("/x/b")]);
        t.removed(&p("/x/a"));
        assert_eq!(t.path(a).unwrap(), p("/x/b"));
        assert!(!t.lost_names_through_mount(a));
        t.removed(&p("/x/b"));
        assert_eq!(t.path(a).unwrap_err().errno, Errno::ENOENT);
        assert!(t.lost_names_through_mount(a) && t.deleted_through_mount(a));
        // A recycled backend identity does not revive a node whose names are gone.
        assert_ne!(t.remember(&p("/x/c"), Some((1, 9))), a);
    }

    #[test]
    fn a_directory_put_in_place_of_another_is_another_inode() {
        let t = Inodes::new();
        let (d, _) = t.remember_displacing(&p("/d"), None, 7, false);
        let f = t.remember(&p("/d/f"), Some((0, 9)));
        assert_eq!(t.remember_displacing(&p("/d"), None, 7, false), (d, None), "the same directory");
        assert_eq!(t.remember_displacing(&p("/d"), None, 0, false), (d, None), "not known: kept");
        // Another program moved `/d` away and made a new `/d`.
        let (new, displaced) = t.remember_displacing(&p("/d"), None, 8, false);
        assert_ne!(new, d);
        assert_eq!(displaced, Some(d));
        assert_eq!(t.ino_of(&p("/d")), Some(new));
        assert_eq!(t.paths(f).unwrap(), vec![p("/d/f")], "checked when next asked for");
    }

    #[test]
    fn a_new_inode_of_a_file_held_open_under_an_older_one_is_a_twin() {
        let t = Inodes::new();
        let old = t.remember(&p("/d/a"), Some((0, 42)));
        // Another program moved the file to `/d/b` while a descriptor held it.
        t.drop_stale_name(old, &p("/d/a"));
        let (new, _) = t.remember_displacing(&p("/d/b"), Some((0, 42)), 0, true);
        assert_ne!(new, old, "the kernel may still reach the old inode by its stale name");
        assert!(t.is_twin(new) && !t.is_twin(old));
        // The kernel forgets the twin, and looks the name up again: the identity still leads
        // to the open inode, so the next one is a twin too.
        assert!(t.forget(new, 1));
        assert!(!t.is_twin(new));
        assert_eq!(t.other_names(&p("/d/b"), (0, 42)), Some((old, vec![])));
        let (again, _) = t.remember_displacing(&p("/d/b"), Some((0, 42)), 0, true);
        assert!(t.is_twin(again));
        // Not held open: the identity may have been reused by another file.
        t.drop_stale_name(again, &p("/d/b"));
        let (other, _) = t.remember_displacing(&p("/d/c"), Some((0, 42)), 0, false);
        assert!(!t.is_twin(other));
        assert_eq!(t.ino_by_identity((0, 42)), Some(other));
    }

    #[test]
    fn a_recycled_identity_does_not_join_a_stale_name() {
        let t = Inodes::new();
        let old = t.remember(&p("/d/old"), Some((0, 42)));
        // Hard links: a second name of the same node.
        assert_eq!(t.other_names(&p("/d/link"), (0, 42)), Some((old, vec![p("/d/old")])));
        assert_eq!(t.other_names(&p("/d/old"), (0, 42)), None, "already a name");
        assert_eq!(t.other_names(&p("/d/x"), (0, 7)), None, "an unknown identity");
        // `/d/old` was deleted behind the kernel's back and `/d/new` got its inode number.
        t.drop_stale_name(old, &p("/d/old"));
        let new = t.remember(&p("/d/new"), Some((0, 42)));
        assert_ne!(new, old);
        assert_eq!(t.paths(new).unwrap(), vec![p("/d/new")]);
        // The old inode lives on, nameless, until the kernel forgets it; the kernel may still
        // hold its old name.
        assert_eq!(t.paths(old).unwrap_err().errno, Errno::ENOENT);
        assert!(!t.lost_names_through_mount(old));
        assert!(t.forget(old, 1));
        assert!(t.tables.read().went_stale.is_empty());
        assert_eq!(t.paths(new).unwrap(), vec![p("/d/new")]);
    }

    #[test]
    fn a_file_that_lost_a_name_behind_the_kernels_back_is_never_taken_for_unlinked() {
        let t = Inodes::new();
        let a = t.remember(&p("/a"), Some((0, 5)));
        assert_eq!(t.remember(&p("/b"), Some((0, 5))), a);
        t.drop_stale_name(a, &p("/b"));
        t.removed(&p("/a"));
        assert!(!t.lost_names_through_mount(a), "the kernel may still hold /b");
        // Nor is one whose name a lookup found leading to another file.
        let c = t.remember(&p("/c"), Some((0, 6)));
        assert_ne!(t.remember(&p("/c"), Some((0, 7))), c);
        assert!(!t.lost_names_through_mount(c));
        // A rename through the mount over a file's only name unlinks it cleanly.
        let d = t.remember(&p("/d"), Some((0, 8)));
        t.remember(&p("/e"), Some((0, 9)));
        t.renamed(&p("/e"), &p("/d"));
        assert!(t.lost_names_through_mount(d) && !t.deleted_through_mount(d), "/d leads to the other file");
    }

    #[test]
    fn rename_moves_descendants_and_detaches_target() {
        let t = Inodes::new();
        let d = t.remember(&p("/d"), None);
        let f = t.remember(&p("/d/f"), Some((0, 1)));
        let old = t.remember(&p("/e"), None);
        t.renamed(&p("/d"), &p("/e"));
        assert_eq!(t.path(d).unwrap(), p("/e"));
        assert_eq!(t.path(f).unwrap(), p("/e/f"));
        assert_eq!(t.path(old).unwrap_err().errno, Errno::ENOENT);
        assert_eq!(t.remember(&p("/e/f"), Some((0, 1))), f);
    }

    #[test]
    fn a_renamed_file_moves_alone() {
        let t = Inodes::new();
        let f = t.remember(&p("/d/f"), Some((0, 1)));
        let g = t.remember(&p("/d/g"), Some((0, 2)));
        t.renamed(&p("/d/f"), &p("/d/h"));
        assert_eq!((t.path(f).unwrap(), t.ino_of(&p("/d/f"))), (p("/d/h"), None));
        // Another name of the same file moves on its own.
        assert_eq!(t.remember(&p("/d/l"), Some((0, 1))), f);
        t.renamed(&p("/d/l"), &p("/d/m"));
        assert_eq!(t.paths(f).unwrap(), vec![p("/d/h"), p("/d/m")]);
        // Over another file: that one loses its name.
        t.renamed(&p("/d/h"), &p("/d/g"));
        assert_eq!(t.paths(f).unwrap(), vec![p("/d/g"), p("/d/m")]);
        assert_eq!(t.path(g).unwrap_err().errno, Errno::ENOENT);
        assert_eq!(t.ino_of(&p("/d/g")), Some(f));
    }

    #[test]
    fn exchange_swaps() {
        let t = Inodes::new();
        let a = t.remember(&p("/a"), Some((0, 1)));
        let b = t.remember(&p("/b"), Some((0, 2)));
        t.exchanged(&p("/a"), &p("/b"));
        assert_eq!(t.path(a).unwrap(), p("/b"));
        assert_eq!(t.path(b).unwrap(), p("/a"));
    }
}
