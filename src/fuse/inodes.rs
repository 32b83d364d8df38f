//! The FUSE door's inode table: kernel inode numbers ↔ virtual paths.
//!
//! An inode here stands for a *name* (a path), not for a backend node: two hard links are two
//! inodes, each judged by the gate under its own path. Numbers are never reused, so the
//! generation is always 0. Renames move the paths of a node and of everything the kernel
//! knows beneath it; unlink detaches a node from its path while open handles keep it usable.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use crate::error::{Errno, FsError, FsResult};
use crate::vpath::VPath;

pub const ROOT_INO: u64 = 1;

struct Node {
    path: VPath,
    /// Lookups the kernel holds on this inode (it sends `forget` to drop them).
    lookups: AtomicU64,
    /// The name was removed or replaced; the node lives on only for open handles.
    detached: bool,
}

#[derive(Default)]
struct Tables {
    by_ino: HashMap<u64, Node>,
    by_path: HashMap<VPath, u64>,
}

pub struct Inodes {
    tables: RwLock<Tables>,
    next: AtomicU64,
}

impl Default for Inodes {
    fn default() -> Self {
        Self::new()
    }
}

impl Inodes {
    pub fn new() -> Inodes {
        let mut tables = Tables::default();
        let root = Node { path: VPath::root(), lookups: AtomicU64::new(1), detached: false };
        tables.by_ino.insert(ROOT_INO, root);
        tables.by_path.insert(VPath::root(), ROOT_INO);
        Inodes { tables: RwLock::new(tables), next: AtomicU64::new(ROOT_INO + 1) }
    }

    /// The path an inode stands for. A detached inode has none (ENOENT), except through an
    /// open handle.
    pub fn path(&self, ino: u64) -> FsResult<VPath> {
        let tables = self.tables.read();
        match tables.by_ino.get(&ino) {
            Some(node) if !node.detached => Ok(node.path.clone()),
            Some(_) => Err(FsError::new(Errno::ENOENT, "the name was removed")),
            None => Err(FsError::new(Errno::ESTALE, format!("unknown inode {ino}"))),
        }
    }

    /// Records one kernel lookup of `path` and returns its inode number.
    pub fn remember(&self, path: &VPath) -> u64 {
        {
            let tables = self.tables.read();
            if let Some(&ino) = tables.by_path.get(path) {
                tables.by_ino[&ino].lookups.fetch_add(1, Ordering::Relaxed);
                return ino;
            }
        }
        let mut tables = self.tables.write();
        if let Some(&ino) = tables.by_path.get(path) {
            tables.by_ino[&ino].lookups.fetch_add(1, Ordering::Relaxed);
            return ino;
        }
        let ino = self.next.fetch_add(1, Ordering::Relaxed);
        let node = Node { path: path.clone(), lookups: AtomicU64::new(1), detached: false };
        tables.by_ino.insert(ino, node);
        tables.by_path.insert(path.clone(), ino);
        ino
    }

    /// The kernel dropped `count` lookups; the inode goes when none are left.
    pub fn forget(&self, ino: u64, count: u64) {
        if ino == ROOT_INO {
            return;
        }
        let mut tables = self.tables.write();
        let Some(node) = tables.by_ino.get(&ino) else { return };
        let left = node.lookups.load(Ordering::Relaxed).saturating_sub(count);
        node.lookups.store(left, Ordering::Relaxed);
        if left == 0 {
            let node = tables.by_ino.remove(&ino).expect("present");
            if !node.detached && tables.by_path.get(&node.path) == Some(&ino) {
                tables.by_path.remove(&node.path);
            }
        }
    }

    /// The name at `path` is gone (unlink, rmdir, or replaced by a rename).
    pub fn removed(&self, path: &VPath) {
        let mut tables = self.tables.write();
        Self::detach(&mut tables, path);
    }

    fn detach(tables: &mut Tables, path: &VPath) {
        if let Some(ino) = tables.by_path.remove(path) {
            if let Some(node) = tables.by_ino.get_mut(&ino) {
                node.detached = true;
            }
        }
    }

    /// `from` now lives at `to`, with everything the kernel knows beneath it; whatever was at
    /// `to` is replaced.
    pub fn renamed(&self, from: &VPath, to: &VPath) {
        let mut tables = self.tables.write();
        Self::detach(&mut tables, to);
        let moved: Vec<(VPath, u64)> = tables
            .by_path
            .iter()
            .filter(|(p, _)| p.starts_with(from))
            .map(|(p, &i)| (p.clone(), i))
            .collect();
        for (old, ino) in moved {
            let rel = old.strip_prefix(from).expect("filtered by prefix");
            let new = to.join_rel(rel);
            tables.by_path.remove(&old);
            // A stale entry under the destination (from an earlier, now replaced tree).
            Self::detach(&mut tables, &new);
            tables.by_path.insert(new.clone(), ino);
            if let Some(node) = tables.by_ino.get_mut(&ino) {
                node.path = new;
            }
        }
    }

    /// `a` and `b` swapped places (RENAME_EXCHANGE).
    pub fn exchanged(&self, a: &VPath, b: &VPath) {
        let mut tables = self.tables.write();
        let under = |t: &Tables, root: &VPath| -> Vec<(VPath, u64)> {
            t.by_path.iter().filter(|(p, _)| p.starts_with(root)).map(|(p, &i)| (p.clone(), i)).collect()
        };
        let (under_a, under_b) = (under(&tables, a), under(&tables, b));
        for (path, _) in under_a.iter().chain(under_b.iter()) {
            tables.by_path.remove(path);
        }
        let moves = under_a
            .into_iter()
            .map(|(p, i)| (b.join_rel(p.strip_prefix(a).unwrap_or("")), i))
            .chain(under_b.into_iter().map(|(p, i)| (a.join_rel(p.strip_prefix(b).unwrap_or("")), i)))
            .collect::<Vec<_>>();
        for (new, ino) in moves {
            tables.by_path.insert(new.clone(), ino);
            if let Some(node) = tables.by_ino.get_mut(&ino) {
                node.path = new;
            }
        }
    }

    pub fn len(&self) -> usize {
        self.tables.read().by_ino.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every (parent inode, name) the kernel may have cached, for invalidation after a rule
    /// change.
    pub fn known_entries(&self) -> Vec<(u64, String)> {
        let tables = self.tables.read();
        tables
            .by_path
            .iter()
            .filter(|(p, _)| !p.is_root())
            .filter_map(|(p, _)| {
                let parent = tables.by_path.get(&p.parent())?;
                Some((*parent, p.name().to_string()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> VPath {
        VPath::parse(s).unwrap()
    }

    #[test]
    fn lookups_and_forget() {
        let t = Inodes::new();
        let a = t.remember(&p("/a"));
        assert_eq!(t.remember(&p("/a")), a);
        t.forget(a, 1);
        assert_eq!(t.path(a).unwrap(), p("/a"));
        t.forget(a, 1);
        assert!(t.path(a).is_err());
        assert_ne!(t.remember(&p("/a")), a, "numbers are not reused");
    }

    #[test]
    fn rename_moves_descendants_and_detaches_target() {
        let t = Inodes::new();
        let d = t.remember(&p("/d"));
        let f = t.remember(&p("/d/f"));
        let old = t.remember(&p("/e"));
        t.renamed(&p("/d"), &p("/e"));
        assert_eq!(t.path(d).unwrap(), p("/e"));
        assert_eq!(t.path(f).unwrap(), p("/e/f"));
        assert_eq!(t.path(old).unwrap_err().errno, Errno::ENOENT);
        assert_eq!(t.remember(&p("/e/f")), f);
    }

    #[test]
    fn exchange_swaps() {
        let t = Inodes::new();
        let a = t.remember(&p("/a"));
        let b = t.remember(&p("/b"));
        t.exchanged(&p("/a"), &p("/b"));
        assert_eq!(t.path(a).unwrap(), p("/b"));
        assert_eq!(t.path(b).unwrap(), p("/a"));
    }
}
