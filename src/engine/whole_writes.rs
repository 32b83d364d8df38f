//! A tool's whole-file write (a temporary file renamed over the name), and the holds that
//! let opens through the mount racing a tool's replace or delete get the file they found.

use std::sync::Arc;

use super::{ChangeObserver, Ctx, Engine, OpenHandle};
use crate::backend::{Attr, FileKind, SetAttr};
use crate::error::{Errno, FsError, FsResult};
use crate::policy::Permit;
use crate::vpath::VPath;

/// Numbers the temporary files of [`Engine::write_atomic`], so that two writes of one path at
/// once never meet on one name.
static TEMPORARY_FILES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A file a tool's change is about to replace or remove, held for the opens racing it.
pub(super) struct HeldForOpens<'a> {
    observer: &'a Arc<dyn ChangeObserver>,
    identity: (u32, u64),
    file: Arc<OpenHandle>,
}

impl HeldForOpens<'_> {
    /// The change is made: tells the observer again.
    pub(super) fn changed(self) {
        self.observer.replacing(self.identity, &self.file);
    }
}

impl Engine {
    /// Replaces (or creates) the file at `path` with `data` atomically: a temporary file beside
    /// it is written, fsynced and renamed over it, so a reader sees the old content or the new,
    /// and a crash leaves one of them. Judged as one write of `path`: the temporary name is
    /// the engine's own, and no rule is asked about it. `owner` (uid, gid) is given to the new
    /// file before it takes the name, where the daemon may change owners.
    pub fn write_atomic(
        &self,
        ctx: &Ctx,
        path: &VPath,
        data: &[u8],
        mode: u32,
        owner: Option<(u32, u32)>,
    ) -> FsResult<Attr> {
        let permit = self.check_new(ctx, "write", path, false)?;
        let serial = TEMPORARY_FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = crate::policy::temporaries::temporary_name(path.name(), std::process::id(), serial);
        let temporary = permit.temporary_sibling(&name).ok_or_else(|| FsError::errno(Errno::EISDIR))?;
        let (attr, file) = {
            let _adding = self.names.read();
            self.router.create(&temporary, mode, libc::O_WRONLY, &ctx.caller)?
        };
        let _listed = Unfinished::list(self, serial, &temporary, attr.ino);
        let written = (|| {
            if let Some((uid, gid)) = owner.filter(|&(uid, gid)| (uid, gid) != (attr.uid, attr.gid)) {
                match file.setattr(&SetAttr { uid: Some(uid), gid: Some(gid), ..SetAttr::default() }) {
                    Err(e) if e.is(Errno::EPERM) => {} // a daemon that is not root keeps its own
                    other => other.map(|_| ())?,
                }
            }
            let mut offset = 0usize;
            while offset < data.len() {
                let end = (offset + (1 << 20)).min(data.len());
                offset += file.write(offset as u64, &data[offset..end])? as usize;
            }
            file.fsync(false)?;
            file.flush()?;
            file.getattr()
        })();
        drop(file);
        let renamed = written.as_ref().map_err(Clone::clone).and_then(|_| {
            let _moving = self.names.write();
            // The temporary name can be guessed: it must still name the file written here, or
            // a directory moved there meanwhile would be carried over `path` unjudged.
            let now = self.router.getattr(&temporary)?;
            if (now.ino, now.kind) != (attr.ino, FileKind::File) {
                return Err(FsError::new(Errno::EIO, "the temporary file was replaced"));
            }
            // Hidden from both doors, so only a host program could have linked it: the file
            // must not keep a second name once it is the one the write was judged for.
            if now.nlink != 1 {
                return Err(FsError::new(Errno::EIO, "the temporary file was given another name"));
            }
            // The file being replaced, for opens that race the rename (see ChangeObserver):
            // held under the lock, so that it is the one the rename replaces.
            let replacing = self.hold_for_racing_opens(path);
            self.router.rename(&temporary, &permit, 0).map(|()| replacing)
        });
        let replacing = match renamed {
            Ok(replacing) => replacing,
            Err(e) => {
                let _ = self.router.unlink(&temporary);
                return Err(e);
            }
        };
        if let Some(held) = replacing {
            held.changed();
        }
        self.note_change(ctx, path);
        match self.router.getattr(&permit) {
            // Deleted again already, by another caller: what was written is what there was.
            Err(e) if e.is(Errno::ENOENT) => written,
            now => now,
        }
    }

    /// Holds the file at `path`, which a change from a door other than the FUSE one is about
    /// to replace or remove, for the opens through the mount that may race the change (see
    /// [`ChangeObserver::replacing`]), and tells the observer. The caller calls
    /// [`HeldForOpens::changed`] once the change is made.
    pub(super) fn hold_for_racing_opens(&self, path: &VPath) -> Option<HeldForOpens<'_>> {
        let observer = self.observer.get()?;
        let (identity, file) = self.hold(path)?;
        observer.replacing(identity, &file);
        Some(HeldForOpens { observer, identity, file })
    }
}

/// A whole write's temporary file, listed on the engine while the write is under way (the
/// listing ends when this is dropped, however the write ended).
struct Unfinished<'e> {
    engine: &'e Engine,
    serial: u64,
}

impl<'e> Unfinished<'e> {
    fn list(engine: &'e Engine, serial: u64, temporary: &Permit, ino: u64) -> Unfinished<'e> {
        engine.unfinished.lock().insert(serial, (temporary.clone(), ino));
        Unfinished { engine, serial }
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        self.engine.unfinished.lock().remove(&self.serial);
    }
}

impl Engine {
    /// Removes what holds the directory of `removing` (whose removal the gate allowed) from
    /// being removed, when that is only temporaries of tool writes no longer under way (a
    /// crash left them; they are hidden from both doors, so no one could remove them, and the
    /// directory would answer ENOTEMPTY while it shows nothing). Whether it removed them all.
    pub(super) fn remove_leftover_temporaries(&self, removing: &Permit) -> bool {
        let Ok(entries) = self.router.readdir(removing) else { return false };
        let leftovers: Vec<Permit> = entries
            .iter()
            .filter(|e| e.name != "." && e.name != "..")
            .map(|e| removing.temporary_within(&e.name))
            .collect::<Option<_>>()
            .unwrap_or_default();
        if leftovers.is_empty() {
            return false;
        }
        let in_use = |p: &Permit| self.unfinished.lock().values().any(|(t, _)| t.path() == p.path());
        leftovers.iter().all(|t| !in_use(t) && self.router.unlink(t).is_ok())
    }

    /// Removes the temporary files of the whole writes still under way, for a stop: the
    /// process ends before their threads do, and a temporary would otherwise stay beside its
    /// file for good (the file itself keeps its old content). One whose name now holds
    /// another node (it was renamed into place meanwhile) is left alone.
    pub fn remove_unfinished_writes(&self) {
        let unfinished: Vec<(Permit, u64)> = self.unfinished.lock().drain().map(|(_, v)| v).collect();
        for (temporary, ino) in unfinished {
            if self.router.getattr(&temporary).is_ok_and(|a| a.ino == ino) {
                let _ = self.router.unlink(&temporary);
            }
        }
    }
}
