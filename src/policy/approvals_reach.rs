//! Where an approved tool call may act under an interrupt rule (the paths the approver was
//! shown, and the guarded entries listed beneath them), and what those lists may cost while
//! their tickets are pending.

use std::collections::BTreeSet;

use super::Request;
use crate::vpath::VPath;

/// Where an approved tool call may act under an interrupt rule: the places the approver was
/// shown, nothing else.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reach {
    /// The path as named, where it leads, and where a `glob` pattern reaches; the call may
    /// act on these and on the directories above them (a `write_file` makes missing
    /// parents). A symlink swapped after the approval leads elsewhere, and the call's
    /// interrupt verdicts there are not covered.
    pub named: Vec<VPath>,
    /// What lay beneath `named` under an interrupt rule when the ticket opened (a bulk
    /// call's survey, `Engine::survey`): beneath `named`, only these. An entry moved in
    /// after the approver looked is refused, not acted on.
    pub guarded: BTreeSet<VPath>,
}

impl Reach {
    pub fn named(named: Vec<VPath>) -> Reach {
        Reach { named, guarded: BTreeSet::new() }
    }

    pub(super) fn covers(&self, path: &VPath) -> bool {
        self.named.iter().any(|r| r.starts_with(path)) || self.guarded.contains(path)
    }
}

/// Bytes of guarded entries ([`Reach::guarded`]) one user's pending tickets may list.
pub const LISTED_SHARE: usize = 16 << 20;
/// Bytes of guarded entries all pending tickets may list.
pub const LISTED_ALL: usize = 64 << 20;

/// What a ticket's list of guarded entries costs, roughly: each path and its place in a set.
pub(super) fn listed_bytes(request: &Request) -> usize {
    request.tool.as_ref().map_or(0, |call| call.reach.guarded.iter().map(|p| p.as_str().len() + 48).sum())
}
