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
//! bounded: names whose lifetime in the kernel has run out are dropped when room is needed, and
//! past [`CAPACITY`] live names, absences are answered uncached.

use std::collections::HashMap;
use std::time::Instant;

use parking_lot::Mutex;

/// At most this many absent names are handed to the kernel for caching (a few MiB).
pub const CAPACITY: usize = 100_000;

/// A full table of live names is swept for expired ones at most this often.
const SWEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

#[derive(Default)]
pub struct AbsentNames {
    inner: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    /// Per directory, each name and when the kernel stops trusting its absence.
    by_parent: HashMap<u64, HashMap<String, Instant>>,
    count: usize,
    /// When a full table was last swept: a sweep walks every name, so a table full of live
    /// names is swept at most once a second, not on every lookup.
    swept: Option<Instant>,
}

impl Table {
    /// Drops the names the kernel no longer trusts anyway.
    fn drop_expired(&mut self, now: Instant) {
        let mut count = 0;
        self.by_parent.retain(|_, names| {
            names.retain(|_, until| *until > now);
            count += names.len();
            !names.is_empty()
        });
        self.count = count;
    }
}

impl AbsentNames {
    /// Records that the kernel may cache `name` in directory `parent` as absent until `until`.
    /// False when the table is full: the absence must then be answered uncached.
    pub fn remember(&self, parent: u64, name: &str, until: Instant) -> bool {
        let mut table = self.inner.lock();
        if let Some(known) = table.by_parent.get_mut(&parent).and_then(|names| names.get_mut(name)) {
            *known = until.max(*known);
            return true;
        }
        if table.count >= CAPACITY {
            let now = Instant::now();
            if table.swept.is_some_and(|at| now.duration_since(at) < SWEEP_INTERVAL) {
                return false;
            }
            table.swept = Some(now);
            table.drop_expired(now);
            if table.count >= CAPACITY {
                return false;
            }
        }
        table.by_parent.entry(parent).or_default().insert(name.to_string(), until);
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
            .flat_map(|(parent, names)| names.into_keys().map(move |n| (parent, n)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn remembers_until_taken_or_the_parent_is_forgotten() {
        let absent = AbsentNames::default();
        let later = Instant::now() + Duration::from_secs(60);
        assert!(absent.remember(2, "a", later));
        assert!(absent.remember(2, "a", later));
        assert!(absent.remember(2, "b", later));
        assert!(absent.remember(3, "c", later));
        absent.forget_parent(2);
        assert_eq!(absent.take_all(), vec![(3, "c".to_string())]);
        assert!(absent.take_all().is_empty());
    }

    #[test]
    fn a_full_table_makes_room_only_from_expired_names() {
        let absent = AbsentNames::default();
        let now = Instant::now();
        let (past, later) = (now - Duration::from_millis(1), now + Duration::from_secs(60));
        for i in 0..CAPACITY {
            // Every other name has already expired in the kernel.
            assert!(absent.remember(7, &i.to_string(), if i % 2 == 0 { past } else { later }));
        }
        // Full: the expired half goes, and there is room again.
        assert!(absent.remember(7, "one more", later));
        assert_eq!(absent.take_all().len(), CAPACITY / 2 + 1);
        for i in 0..CAPACITY {
            assert!(absent.remember(8, &i.to_string(), later));
        }
        assert!(!absent.remember(8, "one more", later));
        // A name already recorded is still fine to cache.
        assert!(absent.remember(8, "0", later));
        absent.forget_parent(8);
        assert!(absent.remember(8, "one more", later));
    }
}
