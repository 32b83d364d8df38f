//! Approvals a tool call did not wait for: a `tools/call` with `wait: false` that needs a
//! human opens its ticket and is answered at once ("interrupted, approval #N"); the ticket
//! stays pending, an approver resolves it on the control socket, and a later `tools/call`
//! with `ticket: N` (the same tool and arguments) picks the outcome up and finishes the call.
//!
//! This is how a harness with its own human-in-the-loop flow (LangGraph's `interrupt()`,
//! which re-runs the tool from its start on resume) pauses without holding a connection
//! open. The agent socket still cannot approve anything: only the control socket resolves.
//!
//! A deferred ticket belongs to no connection (the call that opened it has already been
//! answered), so a client going away does not withdraw it; it expires like any other. The
//! same call deferred again while its ticket is pending gets that ticket back rather than a
//! second one, so a re-run tool asks once. An outcome nobody picks up is forgotten after the
//! approval timeout.

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::policy::approvals::{ApprovalId, Outcome};

/// Which call a deferred ticket is for: the user, the tool and a SHA-256 of the arguments
/// (as compact JSON, whose object keys serde_json keeps sorted, so equal arguments give equal
/// digests). The arguments themselves are not kept: the call that finishes the ticket sends
/// them again, and a digest binds the approval to exactly them without holding a 300 KB copy
/// per ticket; a collision-resistant one, because the approval must not pass to other content.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CallKey {
    uid: u32,
    name: String,
    digest: [u8; 32],
}

impl CallKey {
    pub fn new(name: &str, arguments: &Value, uid: u32) -> CallKey {
        struct Hashing(Sha256);
        impl std::io::Write for Hashing {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.update(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        // Streamed into the hash: no second copy of the arguments' text.
        let mut hashing = Hashing(Sha256::new());
        let _ = serde_json::to_writer(&mut hashing, arguments);
        let mut digest = [0; 32];
        digest.copy_from_slice(&hashing.0.finalize());
        CallKey { uid, name: name.to_string(), digest }
    }
}

/// One deferred ticket: the call it is for (once registered), and its outcome once known.
struct Slot {
    call: Option<CallKey>,
    outcome: Option<(Outcome, Instant)>,
    /// A `ticket: N` call waiting for the outcome.
    waiter: Option<mpsc::Sender<Outcome>>,
}

impl Slot {
    fn empty() -> Slot {
        Slot { call: None, outcome: None, waiter: None }
    }
}

/// Why a call cannot pick up a ticket.
#[derive(Debug, PartialEq, Eq)]
pub enum AttachError {
    /// No deferred ticket has this number (never opened, or its outcome was already used or
    /// forgotten).
    Unknown,
    /// The ticket is for another call (or another user's).
    OtherCall,
    /// Another call is already waiting on it.
    Taken,
}

impl AttachError {
    pub fn message(&self, id: ApprovalId) -> String {
        match self {
            AttachError::Unknown => format!("approval #{id} is not a deferred approval (it was never opened with `wait: false`, or its outcome was already used or has expired)"),
            AttachError::OtherCall => format!("approval #{id} is for another tool call: `ticket` needs the same tool name and arguments as the call that opened it"),
            AttachError::Taken => format!("approval #{id} already has a call waiting on it"),
        }
    }
}

#[derive(Default)]
struct Slots {
    slots: HashMap<ApprovalId, Slot>,
    /// The pending (unanswered) ticket of each call, so a re-run finds its ticket in O(1)
    /// however many are pending.
    pending: HashMap<CallKey, ApprovalId>,
    /// Outcomes in the order they came, to forget those nobody picked up (oldest first).
    answered: VecDeque<(Instant, ApprovalId)>,
    /// Tickets whose outcome was forgotten, until [`Deferred::forgotten`] hands them on (an
    /// approved one still has a cover, which nothing will use).
    forgotten: Vec<ApprovalId>,
}

impl Slots {
    /// The slot no longer waits for an answer: its call leaves the index.
    fn unindex(&mut self, id: ApprovalId) {
        if let Some(call) = self.slots.get(&id).and_then(|s| s.call.as_ref()) {
            if self.pending.get(call) == Some(&id) {
                self.pending.remove(call);
            }
        }
    }
}

#[derive(Default)]
pub struct Deferred {
    slots: Mutex<Slots>,
    /// Held from the look for a call's pending ticket until the ticket opened for it is
    /// registered, so that identical calls racing open one ticket between them. Not `slots`
    /// itself: opening a ticket may deliver its outcome at once, which takes `slots`. One of
    /// several, by the call's hash: opening a ticket tells the subscribed approvers, which can
    /// take a slow one's write timeout, and unrelated calls should not queue behind that.
    opening: [Mutex<()>; 16],
}

impl Deferred {
    /// The pending ticket of exactly this call (user, tool, arguments) if there is one, else
    /// the one `submit` opens, registered for it: one step, so that identical calls sent at
    /// once get one ticket. `None` when `submit` opened none (it was refused). Outcomes older
    /// than `keep` that nobody picked up are forgotten.
    pub fn open_once(
        &self,
        call: CallKey,
        keep: Duration,
        submit: impl FnOnce() -> Option<ApprovalId>,
    ) -> Option<ApprovalId> {
        // Identical calls have one digest, so one stripe.
        let _opening = self.opening[usize::from(call.digest[0]) % self.opening.len()].lock();
        if let Some(&id) = self.slots.lock().pending.get(&call) {
            return Some(id);
        }
        let id = submit()?;
        self.open(id, call, keep);
        Some(id)
    }

    /// The tickets whose outcome nobody picked up in time, since the last look: their
    /// approvals' covers are ended (`Approvals::finish`) by the caller.
    pub fn forgotten(&self) -> Vec<ApprovalId> {
        std::mem::take(&mut self.slots.lock().forgotten)
    }

    #[cfg(test)]
    fn pending_for(&self, call: &CallKey) -> Option<ApprovalId> {
        self.slots.lock().pending.get(call).copied()
    }

    /// Registers ticket `id` (just opened) for `call`; forgets outcomes older than `keep`
    /// that nobody picked up.
    fn open(&self, id: ApprovalId, call: CallKey, keep: Duration) {
        let mut slots = self.slots.lock();
        while let Some(&(at, old)) = slots.answered.front() {
            if at.elapsed() < keep {
                break;
            }
            slots.answered.pop_front();
            if slots.slots.get(&old).is_some_and(|s| s.outcome.as_ref().is_some_and(|(_, t)| *t == at)) {
                slots.slots.remove(&old);
                slots.forgotten.push(old);
            }
        }
        // The outcome may have come first (the ticket was answered before this ran).
        let answered = slots.slots.get(&id).is_some_and(|s| s.outcome.is_some());
        if !answered {
            slots.pending.entry(call.clone()).or_insert(id);
        }
        slots.slots.entry(id).or_insert_with(Slot::empty).call = Some(call);
    }

    /// The ticket's waiter (what [`crate::policy::approvals::Approvals::submit`] calls).
    pub fn deliver(&self, id: ApprovalId, outcome: Outcome) {
        // Id 0 is no ticket: one refused at once (too many pending), which the caller answers.
        if id == 0 {
            return;
        }
        let mut slots = self.slots.lock();
        slots.unindex(id);
        let slot = slots.slots.entry(id).or_insert_with(Slot::empty);
        match slot.waiter.take() {
            // Someone waits: the outcome is theirs, and the slot is done.
            Some(tx) if tx.send(outcome.clone()).is_ok() => {
                slots.slots.remove(&id);
            }
            _ => {
                let now = Instant::now();
                slot.outcome = Some((outcome, now));
                slots.answered.push_back((now, id));
            }
        }
    }

    /// Waits (up to `timeout`) for the outcome of ticket `id` on behalf of `call`; the
    /// outcome is used up. `None` when the wait ran out.
    pub fn attach(
        &self,
        id: ApprovalId,
        call: &CallKey,
        timeout: Duration,
    ) -> Result<Option<Outcome>, AttachError> {
        let rx = {
            let mut slots = self.slots.lock();
            let slot = slots.slots.get_mut(&id).ok_or(AttachError::Unknown)?;
            if slot.call.as_ref() != Some(call) {
                return Err(AttachError::OtherCall);
            }
            if let Some((outcome, _)) = slot.outcome.take() {
                slots.slots.remove(&id);
                return Ok(Some(outcome));
            }
            // A waiter gives its place back when its wait ends, answered or not.
            if slot.waiter.is_some() {
                return Err(AttachError::Taken);
            }
            let (tx, rx) = mpsc::channel();
            slot.waiter = Some(tx);
            rx
        };
        match rx.recv_timeout(timeout) {
            Ok(outcome) => Ok(Some(outcome)),
            Err(_) => {
                // Give the slot back so that a later attach can still pick the outcome up.
                if let Some(slot) = self.slots.lock().slots.get_mut(&id) {
                    slot.waiter = None;
                }
                Ok(None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::policy::approvals::{Decision, Scope};

    const KEEP: Duration = Duration::from_secs(60);

    fn key(name: &str, arguments: Value, uid: u32) -> CallKey {
        CallKey::new(name, &arguments, uid)
    }

    #[test]
    fn an_outcome_waits_for_its_call_and_is_used_once() {
        let d = Deferred::default();
        let args = json!({"file_path": "/a", "content": "x"});
        let call = key("write_file", args.clone(), 1000);
        d.open(7, call.clone(), KEEP);
        assert_eq!(d.pending_for(&call), Some(7));
        assert_eq!(d.pending_for(&key("write_file", args.clone(), 1001)), None, "another user's call");
        assert_eq!(d.pending_for(&key("write_file", json!({}), 1000)), None, "other arguments");
        let reordered = json!({"content": "x", "file_path": "/a"});
        assert_eq!(d.pending_for(&key("write_file", reordered, 1000)), Some(7), "the same arguments");
        d.deliver(7, Outcome::Decided(Decision::Approve(Scope::Once)));
        assert_eq!(d.pending_for(&call), None, "answered");
        assert_eq!(d.attach(7, &key("edit_file", args.clone(), 1000), KEEP), Err(AttachError::OtherCall));
        let other_content = key("write_file", json!({"file_path": "/a", "content": "y"}), 1000);
        assert_eq!(d.attach(7, &other_content, KEEP), Err(AttachError::OtherCall));
        assert_eq!(d.attach(7, &call, KEEP), Ok(Some(Outcome::Decided(Decision::Approve(Scope::Once)))));
        assert_eq!(d.attach(7, &call, KEEP), Err(AttachError::Unknown));
    }

    #[test]
    fn identical_calls_racing_open_one_ticket() {
        let d = std::sync::Arc::new(Deferred::default());
        let opened = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
        let callers: Vec<_> = (0..8)
            .map(|_| {
                let (d, opened, barrier) = (d.clone(), opened.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    d.open_once(key("write_file", json!({"file_path": "/a"}), 1000), KEEP, || {
                        // Slow enough that every other caller looks while this one opens.
                        std::thread::sleep(Duration::from_millis(20));
                        Some(opened.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1)
                    })
                })
            })
            .collect();
        let ids: Vec<_> = callers.into_iter().map(|c| c.join().unwrap()).collect();
        assert_eq!(opened.load(std::sync::atomic::Ordering::SeqCst), 1, "one ticket opened");
        assert_eq!(ids, vec![Some(1); 8]);
        let refused = d.open_once(key("write_file", json!({"file_path": "/b"}), 1000), KEEP, || None);
        assert_eq!(refused, None);
    }

    #[test]
    fn a_waiting_call_gets_the_outcome_when_it_comes() {
        let d = std::sync::Arc::new(Deferred::default());
        let call = key("ls", json!({"path": "/"}), 0);
        d.open(3, call.clone(), KEEP);
        let waiter = {
            let d = d.clone();
            std::thread::spawn(move || d.attach(3, &call, KEEP))
        };
        while d.slots.lock().slots.get(&3).is_none_or(|s| s.waiter.is_none()) {
            std::thread::sleep(Duration::from_millis(5));
        }
        d.deliver(3, Outcome::TimedOut);
        assert_eq!(waiter.join().unwrap(), Ok(Some(Outcome::TimedOut)));
        let slots = d.slots.lock();
        assert!(slots.slots.is_empty() && slots.pending.is_empty());
    }

    #[test]
    fn an_outcome_delivered_before_the_slot_opened_is_kept() {
        let d = Deferred::default();
        d.deliver(5, Outcome::CallerGone);
        let call = key("ls", json!({}), 0);
        d.open(5, call.clone(), KEEP);
        assert_eq!(d.pending_for(&call), None, "already answered");
        assert_eq!(d.attach(5, &call, KEEP), Ok(Some(Outcome::CallerGone)));
    }

    #[test]
    fn outcomes_nobody_picks_up_are_forgotten_after_keep() {
        let d = Deferred::default();
        let call = key("ls", json!({}), 0);
        d.open(1, call.clone(), KEEP);
        d.deliver(1, Outcome::TimedOut);
        d.open(2, key("ls", json!({"path": "/x"}), 0), Duration::ZERO);
        assert_eq!(d.attach(1, &call, KEEP), Err(AttachError::Unknown));
        assert_eq!(d.slots.lock().slots.len(), 1, "only ticket 2");
    }
}
