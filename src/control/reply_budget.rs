//! How much of its replies the daemon may hold in memory. Requests on a connection run at
//! once, each on its own thread, and a reply waits in memory until the client reads it: a
//! client that sends many requests for large results and reads nothing would make the daemon
//! hold all of them. So a request builds a large result (a tool call, a download) only in its
//! turn: at most [`MAX_BUILDING`] at once per connection and [`DAEMON_BUILDING`] in the whole
//! daemon, and only while the replies waiting to be written stay under [`MAX_UNSENT`] bytes on
//! its connection and [`DAEMON_UNSENT`] in all. (Per connection alone, 8 connections reading
//! nothing made the daemon hold 1.7 GB; there may be 1024.) One user (uid), on however many
//! connections, builds at most a quarter of the daemon's results at once and holds at most a
//! quarter of its unsent bytes, so that its clients cannot keep everyone else's large results
//! waiting (a slow `grep`, a client that reads nothing). A call paused on an approval holds
//! no turn; a reply larger than the budget still goes out, alone. A call waiting for a turn
//! gets none once its connection is gone, and a reply nobody reads is dropped at its write
//! deadline, which gives its bytes back.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// Results built at once on one connection.
pub const MAX_BUILDING: usize = 4;
/// Bytes of replies waiting to be written on one connection past which no further result is
/// built there.
pub const MAX_UNSENT: usize = 64 << 20;
/// Results built at once in the daemon, all connections together.
pub const DAEMON_BUILDING: usize = 16;
/// Bytes of replies waiting to be written in the daemon past which no further result is built.
pub const DAEMON_UNSENT: usize = 128 << 20;

/// One user's share of a daemon-wide bound: a quarter.
fn share(bound: usize) -> usize {
    (bound / 4).max(1)
}

/// The daemon's budget, which every connection's draws on. Its lock also guards each
/// connection's own counts (taken after it), so that one condition variable wakes whoever
/// waits, for either bound.
pub struct Pool {
    totals: Mutex<Totals>,
    changed: Condvar,
    max_building: usize,
    max_unsent: usize,
}

impl Pool {
    pub fn new(max_building: usize, max_unsent: usize) -> Arc<Pool> {
        Arc::new(Pool { totals: Mutex::default(), changed: Condvar::new(), max_building, max_unsent })
    }

    /// The daemon's pool: one daemon runs per process.
    pub fn daemon() -> Arc<Pool> {
        static DAEMON: std::sync::OnceLock<Arc<Pool>> = std::sync::OnceLock::new();
        DAEMON.get_or_init(|| Pool::new(DAEMON_BUILDING, DAEMON_UNSENT)).clone()
    }

    /// Results being built and bytes waiting to be written, in all.
    pub fn held(&self) -> (usize, usize) {
        let totals = self.totals.lock();
        (totals.all.building, totals.all.unsent)
    }
}

#[derive(Clone, Copy, Default)]
struct Counts {
    building: usize,
    unsent: usize,
}

/// The pool's counts: in all, and by uid (uids holding nothing are absent).
#[derive(Default)]
struct Totals {
    all: Counts,
    by_uid: std::collections::HashMap<u32, Counts>,
}

impl Totals {
    /// Applies `change` to the counts in all and to `uid`'s.
    fn apply(&mut self, uid: u32, change: impl Fn(&mut Counts)) {
        change(&mut self.all);
        let user = self.by_uid.entry(uid).or_default();
        change(user);
        if user.building == 0 && user.unsent == 0 {
            self.by_uid.remove(&uid);
        }
    }
}

/// One connection's share of its [`Pool`], for its peer's uid.
pub struct ReplyBudget {
    pool: Arc<Pool>,
    uid: u32,
    /// Locked only under the pool's lock.
    mine: Mutex<State>,
}

#[derive(Default)]
struct State {
    counts: Counts,
    /// The connection is gone: nothing built now would be read.
    closed: bool,
}

/// A turn to build a result. Dropped, it lasts on its thread until that thread queues a reply
/// on the connection (the result, encoded) or takes its next turn: the result is no smaller
/// between the end of its building and its queueing, and a turn given meanwhile would let
/// every connection's finished results pile up uncounted.
pub struct Turn(Option<Held>);

/// A turn's share of the budgets, given back when dropped.
struct Held(Arc<ReplyBudget>);

thread_local! {
    /// Turns whose results this thread has not queued yet.
    static CARRIED: std::cell::RefCell<Vec<Held>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(held) = self.0.take() {
            CARRIED.with(|carried| carried.borrow_mut().push(held));
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let uid = self.0.uid;
        self.0.change(|totals, mine| {
            totals.apply(uid, |c| c.building -= 1);
            mine.counts.building -= 1;
        });
    }
}

/// Gives back the turns this thread still carries (its request is over).
pub fn end_of_request() {
    drop(CARRIED.with(|carried| std::mem::take(&mut *carried.borrow_mut())));
}

impl ReplyBudget {
    /// The budget of a connection of `uid` in the daemon's pool.
    pub fn for_uid(uid: u32) -> ReplyBudget {
        ReplyBudget::in_pool(Pool::daemon(), uid)
    }

    pub fn in_pool(pool: Arc<Pool>, uid: u32) -> ReplyBudget {
        ReplyBudget { pool, uid, mine: Mutex::default() }
    }

    /// Waits for a turn to build a result. `None` once the connection is gone.
    pub fn turn(self: &Arc<Self>) -> Option<Turn> {
        // A thread runs one request at a time: what it carries is from one that ended.
        end_of_request();
        let pool = &*self.pool;
        let mut totals = pool.totals.lock();
        loop {
            {
                let mut mine = self.mine.lock();
                if mine.closed {
                    return None;
                }
                let user = totals.by_uid.get(&self.uid).copied().unwrap_or_default();
                if mine.counts.building < MAX_BUILDING
                    && mine.counts.unsent <= MAX_UNSENT
                    && user.building < share(pool.max_building)
                    && user.unsent <= share(pool.max_unsent)
                    && totals.all.building < pool.max_building
                    && totals.all.unsent <= pool.max_unsent
                {
                    mine.counts.building += 1;
                    totals.apply(self.uid, |c| c.building += 1);
                    return Some(Turn(Some(Held(self.clone()))));
                }
            }
            // Woken by a turn ending, a reply written or a connection closing, anywhere in
            // the daemon; the timeout only guards against a missed wake-up.
            pool.changed.wait_for(&mut totals, Duration::from_secs(1));
        }
    }

    /// A reply of `bytes` waits to be written: it now counts instead of the turns this thread
    /// carries for the connection.
    pub fn queued(&self, bytes: usize) {
        let mut totals = self.pool.totals.lock();
        totals.apply(self.uid, |c| c.unsent += bytes);
        self.mine.lock().counts.unsent += bytes;
        drop(totals);
        let mine = |held: &Held| std::ptr::eq(&*held.0, self);
        let done: Vec<Held> = CARRIED.with(|carried| {
            let mut carried = carried.borrow_mut();
            let (done, kept) = std::mem::take(&mut *carried).into_iter().partition(mine);
            *carried = kept;
            done
        });
        drop(done);
    }

    /// A reply of `bytes` was written (or dropped).
    pub fn sent(&self, bytes: usize) {
        let uid = self.uid;
        self.change(|totals, mine| {
            totals.apply(uid, |c| c.unsent -= bytes);
            mine.counts.unsent -= bytes;
        });
    }

    /// Whether the connection is gone ([`ReplyBudget::close`]): nobody reads what a call on it
    /// would answer.
    pub fn is_closed(&self) -> bool {
        let _totals = self.pool.totals.lock();
        self.mine.lock().closed
    }

    /// The connection is gone: whoever waits for a turn gets none.
    pub fn close(&self) {
        self.change(|_, mine| mine.closed = true);
    }

    fn change(&self, change: impl FnOnce(&mut Totals, &mut State)) {
        let mut totals = self.pool.totals.lock();
        change(&mut totals, &mut self.mine.lock());
        drop(totals);
        self.pool.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_wait_for_building_and_unsent_replies_and_end_with_the_connection() {
        let budget = Arc::new(ReplyBudget::in_pool(Pool::new(usize::MAX, usize::MAX), 1000));
        let turns: Vec<Turn> = (0..MAX_BUILDING).map(|_| budget.turn().unwrap()).collect();
        let waiter = {
            let budget = budget.clone();
            std::thread::spawn(move || budget.turn().is_some())
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "every turn is taken");
        // The turns' results are queued (which ends them), but wait unread: still no turn.
        drop(turns);
        budget.queued(MAX_UNSENT + 1);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "too much waits to be written");
        budget.sent(MAX_UNSENT + 1);
        assert!(waiter.join().unwrap(), "written: a turn");
        budget.queued(MAX_UNSENT + 1);
        let late = {
            let budget = budget.clone();
            std::thread::spawn(move || budget.turn().is_some())
        };
        std::thread::sleep(Duration::from_millis(50));
        budget.close();
        assert!(!late.join().unwrap(), "the connection went: no turn");
    }

    /// One user's connections together build at most a quarter of the pool's results at
    /// once; another user's still get turns.
    #[test]
    fn one_user_builds_at_most_its_share_of_the_pool() {
        let pool = Pool::new(8, usize::MAX);
        let connection = || Arc::new(ReplyBudget::in_pool(pool.clone(), 1000));
        let (a, b) = (connection(), connection());
        let turns = [a.turn().unwrap(), b.turn().unwrap()];
        let waiter = {
            let c = connection();
            std::thread::spawn(move || c.turn().is_some())
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "uid 1000 builds its share, 2 of 8, on two connections");
        let other = Arc::new(ReplyBudget::in_pool(pool.clone(), 1001));
        let theirs = other.turn().unwrap();
        assert_eq!(pool.held().0, 3);
        drop(turns);
        end_of_request();
        assert!(waiter.join().unwrap(), "a turn of uid 1000's came back");
        drop(theirs);
        end_of_request();
        assert!(pool.totals.lock().by_uid.is_empty(), "no uid is left with nothing held");
    }
}
