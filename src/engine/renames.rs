//! Renames and exchanges: judged on both paths, and a directory on everything it carries.

use super::{naming, Ctx, Engine};
use crate::backend::FileKind;
use crate::error::{Errno, FsError, FsResult};
use crate::policy::{Mode, Op, Permit, Refusal};
use crate::vpath::VPath;

/// Past this many entries a directory rename that rules might care about is refused rather
/// than judged entry by entry.
const RENAME_WALK_LIMIT: usize = 100_000;

impl Engine {
    /// Renames (and exchanges) are judged on both paths, and a directory is judged on
    /// everything it carries: if any entry beneath it would be decided differently at its new
    /// path than at its old one, the rename is refused, so no protected file can be carried
    /// out from under its rule (or a rule dodged by moving a tree in and out).
    pub fn rename(&self, ctx: &Ctx, from: &VPath, to: &VPath, flags: u32) -> FsResult<()> {
        use crate::backend::{RENAME_EXCHANGE, RENAME_NOREPLACE};
        // Only the flags every backend implements fully: RENAME_WHITEOUT (for overlay
        // filesystems) would leave a device node behind on a host route.
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0 || flags == RENAME_NOREPLACE | RENAME_EXCHANGE {
            return Err(FsError::new(Errno::EINVAL, format!("unsupported rename flags {flags:#x}")));
        }
        let ctx = &Ctx { names: Some(crate::policy::approvals::retry::names_key(from, to)), ..*ctx };
        let moving = self.names.write();
        let from_carries = self.gate.rename_may_change_verdicts(from, to);
        let from_is_dir = self.is_dir_for_rename(from, to, from_carries)?;
        let exchange = flags & crate::backend::RENAME_EXCHANGE != 0;
        let judged = || -> FsResult<_> {
            let from_permit = self.check(ctx, "rename", Op::Write, from, from_is_dir)?;
            let to_permit = self.check_new(ctx, "rename", to, from_is_dir)?;
            self.check_read_kept(ctx, "rename", from, to, from_is_dir)?;
            // An exchange also moves the node at `to` to `from`, judged the same way.
            let (to_is_dir, to_carries) = if exchange {
                let to_carries = self.gate.rename_may_change_verdicts(to, from);
                let to_is_dir = self.is_dir_for_rename(to, from, to_carries)?;
                self.check(ctx, "rename", Op::Write, to, to_is_dir)?;
                self.check(ctx, "rename", Op::Write, from, to_is_dir)?;
                self.check_read_kept(ctx, "rename", to, from, to_is_dir)?;
                (to_is_dir, to_carries)
            } else {
                (false, false)
            };
            Ok((from_permit, to_permit, to_is_dir, to_carries))
        };
        let (from_permit, to_permit, to_is_dir, to_carries) = judged().map_err(|e| naming(e, from, to))?;
        self.router.check_rename(&from_permit, &to_permit)?;
        if from_is_dir && from_carries {
            self.check_carried(ctx, &from_permit, from, to)?;
        }
        if to_is_dir && to_carries {
            self.check_carried(ctx, &to_permit, to, from)?;
        }
        self.router.rename(&from_permit, &to_permit, flags)?;
        // The kernel is told after the lock is let go (see `Engine::adding`).
        drop(moving);
        self.note_change(ctx, from);
        self.note_change(ctx, to);
        Ok(())
    }

    /// Whether the node at `path`, about to be renamed to `other`, is to be judged as a
    /// directory. Only where that changes a decision (a rule for `dir/`, or `carries`: entries
    /// beneath it the move could carry past a rule) is the backend asked, and then a "not a
    /// directory" from its cache is confirmed with the store, which may lag behind another
    /// daemon's change. Otherwise the answer is "no" without a lookup: a rename of a missing
    /// name then fails in the backend.
    fn is_dir_for_rename(&self, path: &VPath, other: &VPath, carries: bool) -> FsResult<bool> {
        let kind_matters =
            carries || [path, other].into_iter().any(|p| self.gate.kind_changes_verdict(Op::Write, p));
        if !kind_matters {
            // Every decision below comes out the same for a file and a directory, and nothing
            // beneath a directory would be judged differently: no need to ask the store.
            return Ok(false);
        }
        let probe = self.gate.probe(path);
        if self.router.kind_and_ino(&probe)?.0 == FileKind::Dir {
            return Ok(true);
        }
        Ok(self.router.getattr_stored(&probe)?.kind == FileKind::Dir)
    }

    /// The node moved from `from` to `to` must not lose what guards reading it: a file under
    /// an interrupt (or a `hide = false` deny) for reads, renamed to where reads are allowed,
    /// would be read there freely. Both ends may be written (checked before), so only reads
    /// are compared: a move out of read protection is judged as a read of the node (asked
    /// under an interrupt rule, refused under a deny); a move into it, or between two rules
    /// as strict, is not. A hard link gives the node a second name as a rename gives it a new
    /// one (`ln guarded/f out; rm guarded/f` is `mv`), so `link` asks this too.
    pub(super) fn check_read_kept(
        &self,
        ctx: &Ctx,
        operation: &'static str,
        from: &VPath,
        to: &VPath,
        is_dir: bool,
    ) -> FsResult<()> {
        fn strictness(mode: Mode) -> u8 {
            match mode {
                Mode::Allow => 0,
                Mode::Interrupt => 1,
                Mode::Deny => 2,
            }
        }
        let before = self.gate.decide(Op::Read, from, is_dir);
        if before.mode == Mode::Allow {
            return Ok(());
        }
        let after = self.gate.decide(Op::Read, to, is_dir);
        if strictness(after.mode) >= strictness(before.mode) {
            return Ok(());
        }
        let refusal = Refusal { op: Op::Read, path: from.clone(), verdict: before };
        self.settle(ctx, operation, Op::Read, from, Err(refusal)).map(drop).map_err(|mut err| {
            err.errno = Errno::EACCES;
            err
        })
    }

    /// Refuses moving the directory at `from` to `to` when any entry beneath it would be
    /// judged differently there. Called only where a deny or interrupt rule reaches either
    /// subtree (`Gate::rename_may_change_verdicts`, asked once per rename).
    fn check_carried(&self, ctx: &Ctx, source: &Permit, from: &VPath, to: &VPath) -> FsResult<()> {
        let entries = self.router.walk(source, RENAME_WALK_LIMIT)?;
        for (rel, kind) in entries {
            let is_dir = kind == FileKind::Dir;
            let (old, new) = (from.join_rel(&rel), to.join_rel(&rel));
            for op in [Op::Read, Op::Write] {
                let before = self.gate.decide(op, &old, is_dir);
                let after = self.gate.decide(op, &new, is_dir);
                if before.effect(op) != after.effect(op) {
                    let verdict = if before.mode != Mode::Allow { before } else { after };
                    let refusal = Refusal { op: Op::Write, path: old.clone(), verdict };
                    let mut err = self.refuse(ctx, "rename", refusal);
                    err.errno = Errno::EACCES;
                    err.context = format!("{err} (the rename would change how rules apply to {old})");
                    return Err(err);
                }
            }
        }
        Ok(())
    }
}
