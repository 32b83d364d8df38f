//! Interrupts at the FUSE door: an operation the gate wants a human to approve is parked,
//! reply object and all, in a pending ticket, and the worker thread returns at once.
//!
//! The ticket's waiter runs on the thread that resolves it (a control request, or the
//! expiry sweeper): on approval it re-runs the operation under the approval and sends the
//! reply; otherwise it replies EACCES. So a hundred paused writes hold no FUSE thread.

use crate::audit::command_line;
use crate::engine::Ctx;
use crate::error::{Errno, FsError, FsResult};
use crate::policy::approvals::{Decision, Interrupted, Outcome, Request, Waiter};

use super::FuseDoor;

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
            Err(FsError { interrupt: Some(interrupted), .. }) => {
                self.park(ctx, *interrupted, reply, work, send)
            }
            result => send(self, result, reply),
        }
    }

    fn park<T, R, W, S>(&self, ctx: Ctx, interrupted: Interrupted, reply: R, work: W, send: S)
    where
        R: Send + 'static,
        W: Fn(&FuseDoor, &Ctx) -> FsResult<T> + Send + 'static,
        S: FnOnce(&FuseDoor, FsResult<T>, R) + Send + 'static,
    {
        let Interrupted { operation, refusal } = interrupted;
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
        };
        let door = self.clone();
        let waiter: Waiter = Box::new(move |id, outcome| match outcome {
            Outcome::Decided(Decision::Approve(_)) => {
                // Re-run under the approval; a second interrupt in the same operation (the
                // other path of a rename) opens a new ticket that keeps this one's pairs.
                door.serve(Ctx { approval: Some(id), ..ctx }, reply, work, send);
                door.engine.gate.approvals.finish(id);
            }
            other => {
                let why = match other {
                    Outcome::TimedOut => "the approval timed out",
                    Outcome::Overloaded => "too many approvals are pending",
                    Outcome::CallerGone => "the caller exited",
                    Outcome::Cancelled => "the daemon is stopping",
                    _ => "rejected",
                };
                send(&door, Err(FsError::new(Errno::EACCES, why)), reply)
            }
        });
        self.engine.gate.approvals.submit(request, ctx.approval, waiter);
    }
}
