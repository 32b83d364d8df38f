//! One control connection's memory: what it has read (for read-before-write), settings, the
//! approvals its tool calls wait on (withdrawn when the client goes away), and the upload
//! pieces it has sent so far.

use std::collections::HashMap;
use std::time::SystemTime;

use parking_lot::{Condvar, Mutex};

use crate::backend::Attr;
use crate::policy::approvals::ApprovalId;
use crate::vpath::VPath;

/// What identifies one state of a file's content, as far as the session can tell: any write
/// through either door changes the mtime or the size (or the node, for atomic replaces), and
/// the ctime, which no program can set back (`touch -r` or `rsync -t` restore an mtime after
/// changing the content; a change of mode or owner makes a read needed too, which is safe).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Version {
    pub ino: u64,
    pub size: u64,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
}

impl Version {
    pub fn of(attr: &Attr) -> Version {
        Version { ino: attr.ino, size: attr.size, mtime: attr.mtime, ctime: attr.ctime }
    }
}

/// Whether `edit_file`/`write_file` require a prior read of the current version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observation {
    Strict,
    Off,
}

pub struct Session {
    pub observation: Observation,
    /// `vfs/upload` pieces received so far.
    pub staging: crate::control::transfer::Staging,
    /// Turns to build large results, shared with the connection's writer.
    pub replies: std::sync::Arc<crate::control::reply_budget::ReplyBudget>,
    observed: Mutex<HashMap<VPath, Version>>,
    waiting: Mutex<Waiting>,
    /// Signalled when a call's ticket is submitted and recorded.
    submitted: Condvar,
}

/// The tickets this connection's calls wait on, and whether its client is gone.
#[derive(Default)]
struct Waiting {
    closed: bool,
    tickets: Vec<ApprovalId>,
    /// Calls whose ticket is being submitted: listed already, perhaps, and not yet recorded.
    submitting: usize,
}

/// A call's ticket being submitted, until it is recorded with [`Session::wait_on`] (or was
/// not opened) and this is dropped.
pub struct Submitting<'a>(&'a Session);

impl Drop for Submitting<'_> {
    fn drop(&mut self) {
        self.0.waiting.lock().submitting -= 1;
        self.0.submitted.notify_all();
    }
}

impl Session {
    pub fn new(observation: Observation) -> Session {
        Session::for_uid(observation, 0)
    }

    /// The session of a connection whose peer is `uid` (its replies draw on that user's share
    /// of the daemon's budget).
    pub fn for_uid(observation: Observation, uid: u32) -> Session {
        Session {
            observation,
            staging: Default::default(),
            replies: std::sync::Arc::new(crate::control::reply_budget::ReplyBudget::for_uid(uid)),
            observed: Mutex::new(HashMap::new()),
            waiting: Mutex::default(),
            submitted: Condvar::new(),
        }
    }

    /// Taken before a call submits the ticket it will wait on: until it is dropped,
    /// [`Session::waits_on`] waits, since the ticket may be listed (and answered) before the
    /// call can record it.
    pub fn submitting(&self) -> Submitting<'_> {
        self.waiting.lock().submitting += 1;
        Submitting(self)
    }

    /// Records that a call of this connection waits on ticket `id`. False when the client is
    /// already gone: nobody will read the answer, so the caller withdraws the ticket itself.
    pub fn wait_on(&self, id: ApprovalId) -> bool {
        let mut waiting = self.waiting.lock();
        if !waiting.closed {
            waiting.tickets.push(id);
        }
        !waiting.closed
    }

    /// Whether a call of this connection waits on ticket `id` (once the tickets being
    /// submitted are recorded).
    pub fn waits_on(&self, id: ApprovalId) -> bool {
        let mut waiting = self.waiting.lock();
        while waiting.submitting > 0 {
            self.submitted.wait(&mut waiting);
        }
        waiting.tickets.contains(&id)
    }

    /// The call waiting on `id` has its answer.
    pub fn done_waiting(&self, id: ApprovalId) {
        self.waiting.lock().tickets.retain(|t| *t != id);
    }

    /// The client is gone: returns the tickets to withdraw (each once), and [`Session::wait_on`]
    /// refuses from now on.
    pub fn close(&self) -> Vec<ApprovalId> {
        let mut waiting = self.waiting.lock();
        waiting.closed = true;
        std::mem::take(&mut waiting.tickets)
    }

    /// Records that this session has seen `path` at `version` (a read, or its own write).
    pub fn observe(&self, path: &VPath, version: Version) {
        self.observed.lock().insert(path.clone(), version);
    }

    pub fn observed(&self, path: &VPath) -> Option<Version> {
        self.observed.lock().get(path).copied()
    }

    pub fn forget(&self, path: &VPath) {
        self.observed.lock().remove(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_being_submitted_counts_as_waited_on_once_recorded() {
        let session = Session::new(Observation::Strict);
        let submitting = session.submitting();
        std::thread::scope(|s| {
            let asked = s.spawn(|| session.waits_on(5));
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(!asked.is_finished(), "the answer waits for the submission");
            assert!(session.wait_on(5));
            drop(submitting);
            assert!(asked.join().unwrap(), "the ticket its call waits on");
        });
        assert!(!session.waits_on(6));
    }
}
