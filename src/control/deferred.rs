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

use std::collections::HashMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::Value;

use crate::policy::approvals::{ApprovalId, Outcome};

/// One deferred ticket: the call it is for, and its outcome once known.
struct Slot {
    name: String,
    arguments: Value,
    uid: u32,
    outcome: Option<(Outcome, Instant)>,
    /// A `ticket: N` call waiting for the outcome.
    waiter: Option<mpsc::Sender<Outcome>>,
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
pub struct Deferred {
    slots: Mutex<HashMap<ApprovalId, Slot>>,
}

impl Deferred {
    /// A pending deferred ticket of `uid` for exactly this call, if any.
    pub fn pending_for(&self, name: &str, arguments: &Value, uid: u32) -> Option<ApprovalId> {
        let slots = self.slots.lock();
        slots
            .iter()
            .filter(|(_, s)| {
                s.outcome.is_none() && s.uid == uid && s.name == name && s.arguments == *arguments
            })
            .map(|(id, _)| *id)
            .min()
    }

    /// Registers ticket `id` (just opened) for this call; forgets outcomes older than
    /// `keep` that nobody picked up.
    pub fn open(&self, id: ApprovalId, name: &str, arguments: &Value, uid: u32, keep: Duration) {
        let mut slots = self.slots.lock();
        slots.retain(|_, s| s.outcome.as_ref().is_none_or(|(_, at)| at.elapsed() < keep));
        // The outcome may have come first (the ticket was answered before this ran).
        let slot = slots.entry(id).or_insert_with(|| Slot {
            name: String::new(),
            arguments: Value::Null,
            uid,
            outcome: None,
            waiter: None,
        });
        slot.name = name.to_string();
        slot.arguments = arguments.clone();
        slot.uid = uid;
    }

    /// The ticket's waiter (what [`crate::policy::approvals::Approvals::submit`] calls).
    pub fn deliver(&self, id: ApprovalId, outcome: Outcome) {
        // Id 0 is no ticket: one refused at once (too many pending), which the caller answers.
        if id == 0 {
            return;
        }
        let mut slots = self.slots.lock();
        let slot = slots.entry(id).or_insert_with(|| Slot {
            name: String::new(),
            arguments: Value::Null,
            uid: u32::MAX,
            outcome: None,
            waiter: None,
        });
        match slot.waiter.take() {
            // Someone waits: the outcome is theirs, and the slot is done.
            Some(tx) if tx.send(outcome.clone()).is_ok() => {
                slots.remove(&id);
            }
            _ => slot.outcome = Some((outcome, Instant::now())),
        }
    }

    /// Waits (up to `timeout`) for the outcome of ticket `id` on behalf of the call
    /// `name(arguments)` of `uid`; the outcome is used up. `None` when the wait ran out.
    pub fn attach(
        &self,
        id: ApprovalId,
        name: &str,
        arguments: &Value,
        uid: u32,
        timeout: Duration,
    ) -> Result<Option<Outcome>, AttachError> {
        let rx = {
            let mut slots = self.slots.lock();
            let slot = slots.get_mut(&id).ok_or(AttachError::Unknown)?;
            if slot.name != name || slot.arguments != *arguments || slot.uid != uid {
                return Err(AttachError::OtherCall);
            }
            if let Some((outcome, _)) = slot.outcome.take() {
                slots.remove(&id);
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
                if let Some(slot) = self.slots.lock().get_mut(&id) {
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

    #[test]
    fn an_outcome_waits_for_its_call_and_is_used_once() {
        let d = Deferred::default();
        let args = json!({"file_path": "/a", "content": "x"});
        d.open(7, "write_file", &args, 1000, KEEP);
        assert_eq!(d.pending_for("write_file", &args, 1000), Some(7));
        assert_eq!(d.pending_for("write_file", &args, 1001), None, "another user's call");
        assert_eq!(d.pending_for("write_file", &json!({}), 1000), None, "other arguments");
        d.deliver(7, Outcome::Decided(Decision::Approve(Scope::Once)));
        assert_eq!(d.pending_for("write_file", &args, 1000), None, "answered");
        assert_eq!(d.attach(7, "edit_file", &args, 1000, KEEP), Err(AttachError::OtherCall));
        assert_eq!(
            d.attach(7, "write_file", &args, 1000, KEEP),
            Ok(Some(Outcome::Decided(Decision::Approve(Scope::Once))))
        );
        assert_eq!(d.attach(7, "write_file", &args, 1000, KEEP), Err(AttachError::Unknown));
    }

    #[test]
    fn a_waiting_call_gets_the_outcome_when_it_comes() {
        let d = std::sync::Arc::new(Deferred::default());
        d.open(3, "ls", &json!({"path": "/"}), 0, KEEP);
        let waiter = {
            let d = d.clone();
            std::thread::spawn(move || d.attach(3, "ls", &json!({"path": "/"}), 0, KEEP))
        };
        while d.slots.lock().get(&3).is_none_or(|s| s.waiter.is_none()) {
            std::thread::sleep(Duration::from_millis(5));
        }
        d.deliver(3, Outcome::TimedOut);
        assert_eq!(waiter.join().unwrap(), Ok(Some(Outcome::TimedOut)));
        assert!(d.slots.lock().is_empty());
    }

    #[test]
    fn an_outcome_delivered_before_the_slot_opened_is_kept() {
        let d = Deferred::default();
        d.deliver(5, Outcome::CallerGone);
        d.open(5, "ls", &json!({}), 0, KEEP);
        assert_eq!(d.attach(5, "ls", &json!({}), 0, KEEP), Ok(Some(Outcome::CallerGone)));
    }
}
