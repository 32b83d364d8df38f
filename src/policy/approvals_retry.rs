//! Refuse now, let the retry through: how an interrupt rule meets a change of names at the
//! mount without freezing the directory for everyone else.
//!
//! For a creation, removal, link or rename the kernel holds the parent directory's lock
//! (exclusively) for the whole FUSE request. A request that waited for a human would hold
//! every lookup, listing and change in that directory behind it for minutes. So such a
//! request is answered at once (EACCES) and its ticket stays open without a waiting caller.
//! Approving the ticket leaves a *retry grant*: the next attempt by the same user at the same
//! change (the same operation and path, and the other path of a rename once that is approved
//! too) passes the interrupt rules, once, within the approval timeout. The operation is part
//! of it: an approved `unlink` must not let an `open` for writing, or a rename onto the path,
//! through in its place. A session approval also
//! grants the directory, as for any ticket. A rejection leaves nothing behind.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{ApprovalId, Approvals, Inner, Request, Ticket};
use crate::policy::Op;
use crate::vpath::VPath;

/// An approved refusal waiting for its caller's next attempt.
pub(super) struct RetryGrant {
    uid: u32,
    pairs: Vec<(Op, VPath)>,
    pub(super) deadline: Instant,
    /// The FUSE request that is using it (spent when that request ends).
    pub(super) claimed_by: Option<u64>,
    /// What was approved, for the audit line when it is used.
    request: Request,
}

/// Who may use a retry grant: a FUSE request (its id) of a user, and for a rename or link the
/// two paths it joins ([`names_key`]).
#[derive(Clone, Copy, Debug)]
pub struct Retry {
    pub request: u64,
    pub uid: u32,
    pub names: Option<u64>,
}

/// The two paths of a rename or link, as one key: a grant for `mv secrets/k pub/k.bak` must
/// not let `mv secrets/k anywhere-else` through. Keyed with this process's random key, so
/// that nobody can choose paths that share another pair's key.
pub fn names_key(from: &VPath, to: &VPath) -> u64 {
    use std::hash::BuildHasher;
    static KEY: std::sync::OnceLock<std::hash::RandomState> = std::sync::OnceLock::new();
    KEY.get_or_init(std::hash::RandomState::new).hash_one((from.as_str(), to.as_str()))
}

impl RetryGrant {
    fn lets(&self, operation: &str, op: Op, path: &VPath, names: Option<u64>) -> bool {
        self.request.operation == operation
            && self.request.names == names
            && self.pairs.iter().any(|(o, p)| *o == op && p == path)
    }
}

impl Approvals {
    /// Opens a ticket for a change of names refused at once, unless the same user's same
    /// change already has one pending (a caller that retries before anyone answered). Returns
    /// the ticket, or `None` when too many approvals are pending.
    ///
    /// Grants that this request already claimed (the first path of a rename whose second
    /// path interrupts too) are carried into the ticket, so approving it lets both through.
    pub fn submit_retry(&self, request: Request, asker: u64) -> Option<ApprovalId> {
        let mut inner = self.inner.lock();
        let mut inherited = Vec::new();
        let before = inner.retries.len();
        inner.retries.retain(|g| {
            let mine = g.claimed_by == Some(asker);
            if mine {
                inherited.extend(g.pairs.iter().cloned());
            }
            !mine
        });
        self.claimed.fetch_sub(before - inner.retries.len(), Ordering::Relaxed);
        let same = |t: &Ticket| {
            t.retry
                && t.request.uid == request.uid
                && t.request.operation == request.operation
                && t.request.op == request.op
                && t.request.path == request.path
                && t.request.names == request.names
                && t.inherited == inherited
        };
        if let Some((id, _)) = inner.pending.iter().find(|(_, t)| same(t)) {
            let id = *id;
            drop(inner);
            self.record(&request, &format!("interrupt-retry (#{id} pending)"), "");
            return Some(id);
        }
        self.open(inner, request, inherited, true, Box::new(|_, _| {}))
    }

    /// Leaves the grant an approved retry ticket promises.
    pub(super) fn grant_retry(&self, inner: &mut Inner, ticket: &Ticket) {
        let mut pairs = ticket.inherited.clone();
        pairs.push((ticket.request.op, ticket.request.path.clone()));
        inner.retries.push(RetryGrant {
            uid: ticket.request.uid,
            pairs,
            deadline: Instant::now() + self.timeout(),
            claimed_by: None,
            request: ticket.request.clone(),
        });
        self.bell.ring();
    }

    /// Whether an approved retry lets the interrupt verdict on (`op`, `path`) pass for this
    /// request, which attempts `operation` (the syscall's name, as in the ticket); if so the
    /// request claims the grant, and no other request can use it.
    pub fn covers_retry(&self, retry: Retry, operation: &str, op: Op, path: &VPath) -> bool {
        if retry.request == 0 {
            return false;
        }
        let mut inner = self.inner.lock();
        let lets = |g: &RetryGrant| g.lets(operation, op, path, retry.names);
        if inner.retries.iter().any(|g| g.claimed_by == Some(retry.request) && lets(g)) {
            return true;
        }
        let now = Instant::now();
        let free = inner
            .retries
            .iter_mut()
            .find(|g| g.claimed_by.is_none() && g.uid == retry.uid && g.deadline > now && lets(g));
        match free {
            Some(grant) => {
                grant.claimed_by = Some(retry.request);
                self.claimed.fetch_add(1, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// The FUSE request `request` is over: the retry grants it claimed are used up.
    pub fn spend(&self, request: u64) {
        if self.claimed.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut inner = self.inner.lock();
        let mut spent = Vec::new();
        inner.retries.retain(|g| {
            let mine = g.claimed_by == Some(request);
            if mine {
                spent.push(g.request.clone());
            }
            !mine
        });
        self.claimed.fetch_sub(spent.len(), Ordering::Relaxed);
        drop(inner);
        for request in spent {
            self.record(&request, "retried", "");
        }
    }

    /// How many approved retries wait for their caller.
    pub fn retry_count(&self) -> usize {
        self.inner.lock().retries.len()
    }
}
