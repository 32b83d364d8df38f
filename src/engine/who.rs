//! Who asks, and through which door: the doors, the control sockets, a socket's peer (the
//! principal), and the context every engine operation gets.

use crate::backend::Caller;
use crate::policy::approvals::ApprovalId;

use super::Groups;

/// Which door a request came through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Door {
    Fuse,
    Tool,
}

impl Door {
    pub fn as_str(self) -> &'static str {
        match self {
            Door::Fuse => "fuse",
            Door::Tool => "tool",
        }
    }
}

/// Which of the control door's two sockets a request came through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Socket {
    /// The agents' socket: tools, path mappings, explain.
    Agent,
    /// The approvers' and operators' socket: everything, interrupts and reload included.
    Control,
}

impl Socket {
    /// `agent` or `control`, as tickets and audit records name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Socket::Agent => "agent",
            Socket::Control => "control",
        }
    }
}

/// Who asked through a control socket: the peer (SO_PEERCRED) whom audit records and tickets
/// name, while the tool door itself acts with the daemon's credentials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Principal {
    pub uid: u32,
    pub gid: u32,
    /// Its supplementary groups, for the tool door's permission checks (`access`).
    pub groups: Groups,
    pub pid: u32,
    pub socket: Socket,
}

/// Who is asking, through which door.
#[derive(Clone, Copy, Debug)]
pub struct Ctx {
    pub door: Door,
    pub caller: Caller,
    /// The peer of the control socket a tool call came from (`None` at the mount, whose
    /// caller is the principal).
    pub principal: Option<Principal>,
    /// Set when the operation re-runs after a human approved it: interrupt verdicts the
    /// approval covers pass (deny rules still refuse).
    pub approval: Option<ApprovalId>,
    /// The FUSE request's id (0 at the tool door): a request parked for a human is ended by
    /// the kernel's `FUSE_INTERRUPT` for this id.
    pub request: u64,
    /// While a rename or link is judged: its two paths, as a key (an approval of it is bound
    /// to them, not to the guarded path alone).
    pub names: Option<u64>,
}

impl Ctx {
    pub fn new(door: Door, caller: Caller) -> Ctx {
        Ctx { door, caller, principal: None, approval: None, request: 0, names: None }
    }

    /// The user who asks: the tool call's peer, or the caller at the mount (whose tickets and
    /// session grants are theirs).
    pub fn asker_uid(&self) -> u32 {
        self.principal.map_or(self.caller.uid, |p| p.uid)
    }

    /// Who may use an approved retry: a request at the mount (a tool call waits for its
    /// approval instead, so it never needs one).
    pub(crate) fn retry(&self) -> Option<crate::policy::approvals::retry::Retry> {
        (self.door == Door::Fuse && self.request != 0).then_some(crate::policy::approvals::retry::Retry {
            request: self.request,
            uid: self.caller.uid,
            names: self.names,
        })
    }
}
