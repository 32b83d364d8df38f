//! Interrupts at the FUSE door. An operation the gate wants a human to approve either
//! *pauses* or is *refused until approved*, depending on what the kernel holds meanwhile.
//!
//! - A change of names (create, mknod, mkdir, symlink, link, unlink, rmdir, rename) runs with
//!   its parent directory locked by the kernel, so it never waits: it answers EACCES at once
//!   and leaves a ticket; approving the ticket lets the caller's next attempt through
//!   ([`crate::policy::approvals::retry`]).
//! - Everything else (an open, a listing, a truncate, an attribute change) holds no
//!   directory lock and pauses: the request is parked, reply object and all, in a pending
//!   ticket, and the worker thread returns at once. The ticket's waiter runs on the thread that
//!   resolves it (a control request, or the expiry sweeper): on approval it re-runs the
//!   operation under the approval and sends the reply; otherwise it replies EACCES. So a
//!   hundred paused writes hold no FUSE thread.
//!
//! A request that came by a FUSE ring keeps its ring entry while it waits; once a CPU's
//! waiting requests hold [`super::ring::MAX_WAITING`] entries, a further one from that CPU is
//! refused until approved instead, so the entries left keep serving the CPU's other requests.
//!
//! A signal to a paused process (Ctrl-C in its shell) makes the kernel send `FUSE_INTERRUPT`
//! for the request: its ticket is withdrawn and the request answers EINTR, so the caller stops
//! waiting and nothing is changed.

use crate::audit::command_line;
use crate::engine::Ctx;
use crate::error::{Errno, FsError, FsResult};
use crate::policy::approvals::{Decision, Interrupted, Outcome, Request, Waiter};

use super::FuseDoor;

/// The tickets of parked requests, by FUSE request id, and the ids of requests whose
/// interrupt came before they were parked (a signal right after the ticket appeared).
#[derive(Default)]
pub struct Parked(parking_lot::Mutex<ParkedRequests>);

#[derive(Default)]
pub struct ParkedRequests {
    tickets: std::collections::HashMap<u64, crate::policy::approvals::ApprovalId>,
    interrupted_early: std::collections::HashSet<u64>,
}

/// Interrupts of requests not parked (yet) are remembered up to this many; request ids are
/// never reused, so forgetting old ones only forgets requests that finished long ago.
const EARLY_INTERRUPTS: usize = 1024;

impl FuseDoor {
    /// Runs `work` and answers with `send`, unless the gate asks a human first: then the
    /// reply waits in a ticket and `work` runs again once (and if) it is approved.
    pub(super) fn serve<T, R, W, S>(&self, ctx: Ctx, reply: R, work: W, send: S)
    where
        R: Send + 'static,
        W: Fn(&FuseDoor, &Ctx) -> FsResult<T> + Send + 'static,
        S: FnOnce(&FuseDoor, FsResult<T>, R) + Send + 'static,
    {
        match work(self, &ctx) {
            Err(FsError { interrupt: Some(interrupted), .. }) if super::ring::may_wait() => {
                self.engine.gate.approvals.spend(ctx.request);
                self.park(ctx, *interrupted, reply, work, send)
            }
            // (An interrupt here found its CPU's ring full of waiting requests.)
            result => {
                let result = self.refused_until_approved(&ctx, result);
                send(self, result, reply)
            }
        }
    }

    /// Runs a change of names and answers at once: an interrupt is refused with EACCES and
    /// leaves a ticket whose approval lets the next attempt through (see the module doc).
    pub(super) fn serve_naming<T, R, W, S>(&self, ctx: Ctx, reply: R, work: W, send: S)
    where
        W: FnOnce(&FuseDoor, &Ctx) -> FsResult<T>,
        S: FnOnce(&FuseDoor, FsResult<T>, R),
    {
        let result = self.refused_until_approved(&ctx, work(self, &ctx));
        send(self, result, reply)
    }

    /// The outcome of an operation that cannot wait for a human: an interrupt is refused with
    /// EACCES and leaves a ticket whose approval lets the next attempt through.
    pub(super) fn refused_until_approved<T>(&self, ctx: &Ctx, result: FsResult<T>) -> FsResult<T> {
        let result = match result {
            Err(FsError { interrupt: Some(interrupted), .. }) => {
                Err(self.refuse_until_approved(ctx, *interrupted))
            }
            result => result,
        };
        self.engine.gate.approvals.spend(ctx.request);
        result
    }

    fn refuse_until_approved(&self, ctx: &Ctx, interrupted: Interrupted) -> FsError {
        let Interrupted { operation, refusal, names, other } = interrupted;
        let request = Request {
            door: "fuse",
            operation,
            op: refusal.op,
            path: refusal.path.clone(),
            rule: refusal.verdict.rule,
            pid: ctx.caller.pid,
            uid: ctx.caller.uid,
            command: command_line(ctx.caller.pid),
            tool: None,
            names,
            other,
        };
        let what = format!("{} {} {}", request.operation, request.op.as_str(), request.path);
        let message = match self.engine.gate.approvals.submit_retry(request, ctx.request) {
            Some(id) => {
                static REFUSED: crate::log_limit::RateLimited = crate::log_limit::RateLimited::new();
                if let Some(held) = REFUSED.admit() {
                    tracing::info!(
                        "{} by uid {} waits for approval #{id}: refused for now (EACCES); approving it lets the next attempt through{held}",
                        crate::display::Escaped(&what),
                        ctx.caller.uid
                    );
                }
                format!("{what}: refused until approval #{id} is given; then retry")
            }
            None => format!("{what}: refused, too many approvals are pending"),
        };
        let rule = refusal.verdict.rule.unwrap_or(usize::MAX);
        FsError::denied(Errno::EACCES, rule, message)
    }

    fn park<T, R, W, S>(&self, ctx: Ctx, interrupted: Interrupted, reply: R, work: W, send: S)
    where
        R: Send + 'static,
        W: Fn(&FuseDoor, &Ctx) -> FsResult<T> + Send + 'static,
        S: FnOnce(&FuseDoor, FsResult<T>, R) + Send + 'static,
    {
        let Interrupted { operation, refusal, names, other } = interrupted;
        let request = Request {
            door: "fuse",
            operation,
            op: refusal.op,
            path: refusal.path,
            rule: refusal.verdict.rule,
            pid: ctx.caller.pid,
            uid: ctx.caller.uid,
            command: command_line(ctx.caller.pid),
            tool: None,
            names,
            other,
        };
        let door = self.clone();
        let unique = ctx.request;
        let waiter: Waiter = Box::new(move |id, outcome| {
            door.parked.0.lock().tickets.remove(&unique);
            match outcome {
                Outcome::Decided(Decision::Approve(_)) => {
                    // Re-run under the approval; a second interrupt in the same operation (the
                    // other path of a rename) opens a new ticket that keeps this one's pairs.
                    door.serve(Ctx { approval: Some(id), ..ctx }, reply, work, send);
                    door.engine.gate.approvals.finish(id);
                }
                Outcome::Interrupted => {
                    send(&door, Err(FsError::new(Errno::EINTR, "interrupted by a signal")), reply)
                }
                other => {
                    let why = match other {
                        Outcome::TimedOut => "the approval timed out".to_string(),
                        Outcome::Overloaded(overload) => {
                            format!("too many approvals are pending: {}", overload.reason())
                        }
                        Outcome::CallerGone => "the caller exited".to_string(),
                        Outcome::Cancelled => "the daemon is stopping".to_string(),
                        _ => "rejected".to_string(),
                    };
                    send(&door, Err(FsError::new(Errno::EACCES, why)), reply)
                }
            }
        });
        let approvals = &self.engine.gate.approvals;
        if let Some(id) = approvals.submit(request, ctx.approval, waiter) {
            let mut parked = self.parked.0.lock();
            if parked.interrupted_early.remove(&unique) {
                drop(parked);
                approvals.interrupt(id);
            } else if approvals.is_pending(id) {
                parked.tickets.insert(unique, id); // (else answered meanwhile)
            }
        }
    }

    /// The process waiting for request `unique` got a signal: if a human was to approve it,
    /// the ticket is withdrawn and the request answers EINTR. (Other requests finish as usual.)
    pub(super) fn interrupted(&self, unique: u64) {
        let mut parked = self.parked.0.lock();
        match parked.tickets.remove(&unique) {
            Some(id) => {
                drop(parked);
                self.engine.gate.approvals.interrupt(id);
            }
            None => {
                if parked.interrupted_early.len() >= EARLY_INTERRUPTS {
                    parked.interrupted_early.clear();
                }
                parked.interrupted_early.insert(unique);
            }
        }
    }
}
