//! The policy gate: every operation from either door is decided here before a backend is
//! touched. A [`Permit`] can only be built by this module, and the router only acts on one.

pub mod approvals;
mod branch_index;
pub mod overlap;
pub mod pattern;
pub mod rules;
pub mod temporaries;

#[cfg(test)]
mod model_tests;

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::error::Errno;
use crate::vpath::VPath;
pub use rules::{Mode, Op, Rule, RuleSet, Verdict};

/// Proof that the gate allowed `op` on `path`. Only [`Gate`] builds these.
#[derive(Debug, Clone)]
pub struct Permit {
    path: VPath,
    op: Op,
}

impl Permit {
    pub fn path(&self) -> &VPath {
        &self.path
    }

    pub fn op(&self) -> Op {
        self.op
    }

    /// A permit to remove the tool temporary `name` (see [`temporaries`]) inside the directory
    /// whose removal this permit allows. `None` for any other name or permit.
    pub fn temporary_within(&self, name: &str) -> Option<Permit> {
        (self.op == Op::Write && temporaries::is_temporary_name(name))
            .then(|| Permit { path: self.path.join(name), op: Op::Write })
    }

    /// A permit for a temporary file named `name` beside this permit's path, which may be
    /// written only to replace the path at once by renaming it there: the write of the path is
    /// what the gate judged, and the temporary name never outlives the operation. `None` for
    /// anything but a write.
    pub fn temporary_sibling(&self, name: &str) -> Option<Permit> {
        (self.op == Op::Write && !self.path.is_root())
            .then(|| Permit { path: self.path.parent().join(name), op: Op::Write })
    }
}

/// A decision other than allow, with what is needed to report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub op: Op,
    pub path: VPath,
    pub verdict: Verdict,
}

impl Refusal {
    /// What a syscall gets: hidden reads look like absent entries; everything else is EACCES.
    pub fn errno(&self) -> Errno {
        match (self.verdict.mode, self.op, self.verdict.hide) {
            (Mode::Deny, Op::Read, true) => Errno::ENOENT,
            (Mode::Deny, _, _) | (Mode::Interrupt, _, _) | (Mode::Allow, _, _) => Errno::EACCES,
        }
    }

    pub fn is_hidden(&self) -> bool {
        self.errno() == Errno::ENOENT
    }
}

/// The rules in force. Reading them is lock-free; a reload swaps them atomically.
pub struct Gate {
    rules: ArcSwap<RuleSet>,
    /// Pending interrupts and the session grants they left; grants end with the rules.
    pub approvals: Arc<approvals::Approvals>,
}

impl Gate {
    pub fn new(rules: RuleSet) -> Gate {
        Gate { rules: ArcSwap::from_pointee(rules), approvals: Arc::new(approvals::Approvals::default()) }
    }

    pub fn reload(&self, rules: RuleSet) {
        self.rules.store(Arc::new(rules));
        self.approvals.clear_grants();
    }

    /// Lets an interrupt verdict pass when a human approved it: under `approval` (the
    /// operation re-running after its ticket was approved), under a session grant, or as the
    /// approved retry of a change refused earlier (`retry`: who asks, at the mount, and
    /// `operation`: what it attempts, which must be what was approved). `uid` is who asks
    /// (a session grant is its user's alone).
    pub fn approve(
        &self,
        refusal: Refusal,
        operation: &str,
        uid: u32,
        approval: Option<approvals::ApprovalId>,
        retry: Option<approvals::retry::Retry>,
    ) -> Result<Permit, Refusal> {
        if refusal.verdict.mode == Mode::Interrupt
            && (self.approvals.covers(approval, refusal.op, &refusal.path, uid)
                || retry
                    .is_some_and(|r| self.approvals.covers_retry(r, operation, refusal.op, &refusal.path)))
        {
            return Ok(Permit { path: refusal.path, op: refusal.op });
        }
        Err(refusal)
    }

    pub fn rules(&self) -> Arc<RuleSet> {
        self.rules.load_full()
    }

    pub fn decide(&self, op: Op, path: &VPath, is_dir: bool) -> Verdict {
        self.rules.load().decide(op, path, is_dir)
    }

    /// Allows or refuses `op` on `path` (judged as a directory too when `is_dir`).
    pub fn check(&self, op: Op, path: &VPath, is_dir: bool) -> Result<Permit, Refusal> {
        let verdict = self.decide(op, path, is_dir);
        match verdict.mode {
            Mode::Allow => Ok(Permit { path: path.clone(), op }),
            Mode::Deny | Mode::Interrupt => Err(Refusal { op, path: path.clone(), verdict }),
        }
    }

    /// A permit for the daemon's own look at what a human is about to be asked (a bulk tool
    /// call's survey of what lies beneath it, `Engine::survey`): an interrupt verdict passes,
    /// a denial does not. What it finds is shown to approvers only, never to the caller.
    pub fn preview(&self, op: Op, path: &VPath, is_dir: bool) -> Option<Permit> {
        match self.decide(op, path, is_dir).mode {
            Mode::Allow | Mode::Interrupt => Some(Permit { path: path.clone(), op }),
            Mode::Deny => None,
        }
    }

    /// Whether a listing shows the entry: everything but hidden read denials.
    pub fn is_visible(&self, path: &VPath, is_dir: bool) -> bool {
        let v = self.decide(Op::Read, path, is_dir);
        !(v.mode == Mode::Deny && v.hide)
    }

    /// The first directory above `path` (not `path` itself) that a rule hides, as the refusal
    /// to read it. The kernel reaches a name through its parents, each looked up and judged;
    /// a tool names a whole path at once, and a rule may hide a directory without matching
    /// what it holds (`/ws/dir/`, `/ws/dir`).
    pub fn hidden_ancestor(&self, path: &VPath) -> Option<Refusal> {
        let rules = self.rules.load();
        // `/` itself is never hidden: the tree's root is always there.
        path.ancestors().skip(1).find_map(|dir| {
            let verdict = rules.decide(Op::Read, &dir, true);
            (verdict.mode == Mode::Deny && verdict.hide).then_some(Refusal {
                op: Op::Read,
                path: dir,
                verdict,
            })
        })
    }

    /// Whether a rule may hide something beneath the directory `dir`.
    pub fn may_hide_beneath(&self, dir: &VPath) -> bool {
        self.rules.load().may_hide_beneath(dir)
    }

    /// Whether moving the directory `from` to `to` could change a decision beneath it.
    pub fn rename_may_change_verdicts(&self, from: &VPath, to: &VPath) -> bool {
        self.rules.load().rename_may_change_verdicts(from, to)
    }
}

impl Gate {
    /// Decides `op` on an existing node whose kind may not be known yet. The kind is looked
    /// up (with `kind_of`) only when it changes the answer, i.e. when a rule matches `dir/`
    /// but not `dir`, which keeps the common case to one set match.
    pub fn check_node(
        &self,
        op: Op,
        path: &VPath,
        kind_of: impl FnOnce(&Permit) -> crate::error::FsResult<bool>,
    ) -> Result<Result<Permit, Refusal>, crate::error::FsError> {
        let (as_file, as_dir) = self.rules.load().decide_both_kinds(op, path);
        let verdict = if as_file == as_dir {
            as_file
        } else {
            // Learning the kind is itself a read of the node's attributes; it is not shown to
            // the caller unless the real decision allows.
            let probe = Permit { path: path.clone(), op: Op::Read };
            if kind_of(&probe)? {
                as_dir
            } else {
                as_file
            }
        };
        Ok(match verdict.mode {
            Mode::Allow => Ok(Permit { path: path.clone(), op }),
            Mode::Deny | Mode::Interrupt => Err(Refusal { op, path: path.clone(), verdict }),
        })
    }

    /// Whether `op` on `path` is judged differently for a directory than for anything else
    /// (a rule for `dir/`): only then does a decision need the node's kind.
    pub fn kind_changes_verdict(&self, op: Op, path: &VPath) -> bool {
        let (as_file, as_dir) = self.rules.load().decide_both_kinds(op, path);
        as_file != as_dir
    }

    /// A permit to learn a node's attributes for the gate's own use (judging it as a
    /// directory, or what a rename would carry along). Its results never reach a door
    /// unless a real decision allows.
    pub fn probe(&self, path: &VPath) -> Permit {
        Permit { path: path.clone(), op: Op::Read }
    }
}
