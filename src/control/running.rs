//! The control door's requests running daemon-wide, counted by the peer's uid: each runs on a
//! thread of its own, so besides each connection's bound their number is bounded for the
//! whole daemon, and one user (who may open many connections) gets a share of that bound.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

/// The most requests running at once on the daemon.
pub const MAX_RUNNING: usize = 4096;

/// The most one uid runs at once: a quarter, so that one user's clients can never take every
/// thread the daemon will start.
pub const MAX_RUNNING_PER_UID: usize = MAX_RUNNING / 4;

/// Requests running, in all and by uid.
#[derive(Default)]
pub struct Running {
    counts: Mutex<(usize, HashMap<u32, usize>)>,
}

/// One running request's place, given back when dropped.
pub struct Place {
    running: Arc<Running>,
    uid: u32,
}

impl Running {
    /// A place for a request of `uid`, or why there is none (for the caller's error).
    pub fn enter(self: &Arc<Self>, uid: u32) -> Result<Place, String> {
        self.enter_within(uid, MAX_RUNNING, MAX_RUNNING_PER_UID)
    }

    fn enter_within(self: &Arc<Self>, uid: u32, all: usize, per_uid: usize) -> Result<Place, String> {
        let mut counts = self.counts.lock();
        let (total, by_uid) = &mut *counts;
        let mine = by_uid.entry(uid).or_default();
        if *mine >= per_uid {
            return Err(format!(
                "too many requests running for uid {uid} (limit {per_uid}, across its connections)"
            ));
        }
        if *total >= all {
            return Err(format!("too many requests running on the daemon (limit {all})"));
        }
        *mine += 1;
        *total += 1;
        Ok(Place { running: self.clone(), uid })
    }

    /// (in all, of `uid`).
    pub fn counts(&self, uid: u32) -> (usize, usize) {
        let counts = self.counts.lock();
        (counts.0, counts.1.get(&uid).copied().unwrap_or(0))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut counts = self.running.counts.lock();
        let (total, by_uid) = &mut *counts;
        *total -= 1;
        if let Some(mine) = by_uid.get_mut(&self.uid) {
            *mine -= 1;
            if *mine == 0 {
                by_uid.remove(&self.uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_uid_gets_its_share_and_places_come_back() {
        let running = Arc::new(Running::default());
        let mine: Vec<Place> = (0..3).map(|_| running.enter_within(1000, 5, 3).unwrap()).collect();
        assert_eq!(
            running.enter_within(1000, 5, 3).err().unwrap(),
            "too many requests running for uid 1000 (limit 3, across its connections)"
        );
        let theirs: Vec<Place> = (0..2).map(|_| running.enter_within(1001, 5, 3).unwrap()).collect();
        assert_eq!(
            running.enter_within(1002, 5, 3).err().unwrap(),
            "too many requests running on the daemon (limit 5)"
        );
        assert_eq!(running.counts(1000), (5, 3));
        drop(mine);
        assert_eq!(running.counts(1000), (2, 0));
        assert!(running.enter_within(1002, 5, 3).is_ok());
        drop(theirs);
        assert_eq!(running.counts(1001), (0, 0));
        assert!(running.counts.lock().1.is_empty(), "no uid is left with a count of 0");
    }
}
