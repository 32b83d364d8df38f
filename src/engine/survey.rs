//! What lies beneath a bulk tool call's paths under an interrupt rule, taken when its ticket
//! opens: an approved call may act on what the approver was asked about, and nothing moved
//! in afterwards passes under that approval.

use std::collections::BTreeSet;

use super::Engine;
use crate::backend::FileKind;
use crate::policy::overlap::paths_overlap;
use crate::policy::{Mode, Op};
use crate::vpath::VPath;

/// At most this many guarded entries are listed for one ticket: a human cannot weigh more,
/// and every pending ticket keeps its list.
pub const GUARDED_LISTED: usize = 10_000;
/// At most this many entries are looked at for one ticket, so that asking stays bounded.
pub const SURVEY_WALKED: usize = 1_000_000;

/// How far beneath its paths a call acts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Depth {
    /// A directory's own entries (`ls`).
    Entries,
    /// Everything beneath (`glob`, `grep`, `delete`).
    Subtree,
}

/// Why a survey gave up: the call reaches too much to be shown to an approver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TooMuch {
    Guarded,
    Walked,
}

impl TooMuch {
    /// Why, for the log: the caller is told only that the call reaches too much (how much
    /// lies under interrupt rules there is for approvers to know).
    pub fn describe(&self) -> String {
        match self {
            TooMuch::Guarded => {
                format!("more than {GUARDED_LISTED} entries beneath it are under interrupt rules")
            }
            TooMuch::Walked => format!("it holds more than {SURVEY_WALKED} entries to look through"),
        }
    }
}

impl Engine {
    /// The entries beneath the directories among `roots` (as deep as `depth`) that an
    /// interrupt rule guards, for reading or writing. This is the daemon's own look, for the
    /// approver (`Gate::preview`): an interrupt rule on a listing does not stop it, a deny
    /// rule does (the call is refused there anyway), hidden entries are not seen, and only
    /// directories an interrupt pattern could reach into are listed.
    pub fn survey(&self, roots: &[VPath], depth: Depth) -> Result<BTreeSet<VPath>, TooMuch> {
        let rules = self.gate.rules();
        let anchors: Vec<VPath> =
            [Op::Read, Op::Write].iter().flat_map(|op| rules.anchors(*op, Mode::Interrupt)).collect();
        let guarded = |path: &VPath, is_dir: bool| {
            [Op::Read, Op::Write].iter().any(|op| rules.decide(*op, path, is_dir).mode == Mode::Interrupt)
        };
        let mut found = BTreeSet::new();
        let mut walked = 0usize;
        let mut stack: Vec<VPath> = roots
            .iter()
            .filter(|root| self.router.getattr(&self.gate.probe(root)).is_ok_and(|a| a.kind == FileKind::Dir))
            .cloned()
            .collect();
        while let Some(dir) = stack.pop() {
            if !anchors.iter().any(|a| paths_overlap(&dir, a)) {
                continue;
            }
            let Some(permit) = self.gate.preview(Op::Read, &dir, true) else { continue };
            // Gone or unreadable meanwhile: the call will find it so too.
            let Ok(entries) = self.router.readdir(&permit) else { continue };
            // Every entry counts, hidden ones too: they were read all the same.
            walked += entries.len();
            if walked > SURVEY_WALKED {
                return Err(TooMuch::Walked);
            }
            for entry in entries {
                let path = dir.join(&entry.name);
                let is_dir = entry.kind == FileKind::Dir;
                if !self.gate.is_visible(&path, is_dir) {
                    continue;
                }
                if guarded(&path, is_dir) {
                    found.insert(path.clone());
                    if found.len() > GUARDED_LISTED {
                        return Err(TooMuch::Guarded);
                    }
                }
                if is_dir && depth == Depth::Subtree {
                    stack.push(path);
                }
            }
        }
        Ok(found)
    }
}
