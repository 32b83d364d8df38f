//! Names the kernel caches as absent (negative entries), so they can be invalidated.
//!
//! A lookup that finds nothing is answered with an entry of inode 0 and the route's cache
//! lifetime: the kernel then answers later lookups of that name itself. (A name a rule hides is
//! not: each attempt on it reaches the gate and is audited.) Probing for files that
//! do not exist is common (git's `.gitignore` in every directory, compilers' include paths,
//! Python's and Node's module search), and each probe would otherwise cost a request.
//!
//! A cached absence must end when the name appears behind the kernel's back. Tool-door changes
//! and host changes invalidate by name, which reaches negative entries too. A missed host change
//! (or a rule reload) invalidates "everything", and the kernel cannot be asked to drop all its
//! negative entries (invalidating a directory's own entry prunes those beneath it, but the
//! root has no entry to invalidate), so this table records which ones it may hold. It is
//! bounded: past [`CAPACITY`] names, absences are answered uncached until the table empties.

use std::collections::{HashMap, HashSet};

use parking_lot::Mutex;

/// At most this many absent names are handed to the kernel for caching (a few MiB).
pub const CAPACITY: usize = 100_000;

#[derive(Default)]
pub struct AbsentNames {
    inner: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    by_parent: HashMap<u64, HashSet<String>>,
    count: usize,
}

impl AbsentNames {
    /// Records that the kernel may cache `name` in directory `parent` as absent. False when
    /// the table is full: the absence must then be answered uncached.
    pub fn remember(&self, parent: u64, name: &str) -> bool {
        let mut table = self.inner.lock();
        if table.by_parent.get(&parent).is_some_and(|names| names.contains(name)) {
            return true;
        }
        if table.count >= CAPACITY {
            return false;
        }
        table.by_parent.entry(parent).or_default().insert(name.to_string());
        table.count += 1;
        true
    }

    /// The kernel forgot directory `parent`, and with it every entry beneath it.
    pub fn forget_parent(&self, parent: u64) {
        let mut table = self.inner.lock();
        if let Some(names) = table.by_parent.remove(&parent) {
            table.count -= names.len();
        }
    }

    /// Every recorded absence, which the caller is about to invalidate; the table empties.
    pub fn take_all(&self) -> Vec<(u64, String)> {
        let table = std::mem::take(&mut *self.inner.lock());
        table
            .by_parent
            .into_iter()
            .flat_map(|(parent, names)| names.into_iter().map(move |n| (parent, n)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_until_taken_or_the_parent_is_forgotten() {
        let absent = AbsentNames::default();
        assert!(absent.remember(2, "a"));
        assert!(absent.remember(2, "a"));
        assert!(absent.remember(2, "b"));
        assert!(absent.remember(3, "c"));
        absent.forget_parent(2);
        assert_eq!(absent.take_all(), vec![(3, "c".to_string())]);
        assert!(absent.take_all().is_empty());
    }

    #[test]
    fn a_full_table_refuses_new_names_until_emptied() {
        let absent = AbsentNames::default();
        for i in 0..CAPACITY {
            assert!(absent.remember(7, &i.to_string()));
        }
        assert!(!absent.remember(7, "one more"));
        // A name already recorded is still fine to cache.
        assert!(absent.remember(7, "0"));
        absent.forget_parent(7);
        assert!(absent.remember(7, "one more"));
        assert_eq!(absent.take_all().len(), 1);
    }
}
