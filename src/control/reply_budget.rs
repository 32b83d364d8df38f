//! How much of its replies one connection may hold in memory. Requests on a connection run
//! at once, each on its own thread, and a reply waits in memory until the client reads it:
//! a client that sends many requests for large results and reads nothing would make the
//! daemon hold all of them. So a request builds a large result (a tool call, a download) only
//! in its turn: at most [`MAX_BUILDING`] at once per connection, and only while the replies
//! waiting to be written stay under [`MAX_UNSENT`] bytes. A call paused on an approval holds
//! no turn; a reply larger than the budget still goes out, alone.

use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// Results built at once on one connection.
pub const MAX_BUILDING: usize = 4;
/// Bytes of replies waiting to be written past which no further result is built.
pub const MAX_UNSENT: usize = 64 << 20;

#[derive(Default)]
pub struct ReplyBudget {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    building: usize,
    unsent: usize,
    /// The connection is gone: nothing built now would be read.
    closed: bool,
}

/// A turn to build a result; the next one may start when it is dropped.
pub struct Turn<'a>(&'a ReplyBudget);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.state.lock().building -= 1;
        self.0.changed.notify_all();
    }
}

impl ReplyBudget {
    /// Waits for a turn to build a result. `None` once the connection is gone.
    pub fn turn(&self) -> Option<Turn<'_>> {
        let mut state = self.state.lock();
        loop {
            if state.closed {
                return None;
            }
            if state.building < MAX_BUILDING && state.unsent <= MAX_UNSENT {
                state.building += 1;
                return Some(Turn(self));
            }
            // Woken by a turn ending, a reply written or the connection closing; the timeout
            // only guards against a missed wake-up.
            self.changed.wait_for(&mut state, Duration::from_secs(1));
        }
    }

    /// A reply of `bytes` waits to be written.
    pub fn queued(&self, bytes: usize) {
        self.state.lock().unsent += bytes;
    }

    /// A reply of `bytes` was written (or dropped).
    pub fn sent(&self, bytes: usize) {
        self.state.lock().unsent -= bytes;
        self.changed.notify_all();
    }

    /// The connection is gone: whoever waits for a turn gets none.
    pub fn close(&self) {
        self.state.lock().closed = true;
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn turns_wait_for_building_and_unsent_replies_and_end_with_the_connection() {
        let budget = Arc::new(ReplyBudget::default());
        let turns: Vec<Turn> = (0..MAX_BUILDING).map(|_| budget.turn().unwrap()).collect();
        let waiter = {
            let budget = budget.clone();
            std::thread::spawn(move || budget.turn().is_some())
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "every turn is taken");
        // A turn ends, but the replies it left wait unread: still no turn.
        budget.queued(MAX_UNSENT + 1);
        drop(turns);
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
}
