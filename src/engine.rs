//! The engine: the one place both doors call. It takes normalised paths, asks the gate,
//! records refusals, and hands permits to the router.
//!
//! Operation names match the FUSE door, the router and the backends, so
//! `grep -n "fn rename"` shows the whole chain.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use crate::audit::{command_line, Audit, AuditEvent};
use crate::backend::{Attr, DirEntry, FileKind, OpenFile, RemoteChange, SetAttr, StatFs};
use crate::error::{Errno, FsError, FsResult};
use crate::policy::approvals::Interrupted;
use crate::policy::{Gate, Mode, Op, Permit, Refusal};
use crate::route::Router;
use crate::vpath::VPath;
pub use access::Groups;
pub use who::{Ctx, Door, Principal, Socket};

/// An open file together with the path it was opened by.
pub struct OpenHandle {
    pub path: VPath,
    pub file: Box<dyn OpenFile>,
    /// Opened for writing: the gate (and any human) already said yes to writing this file,
    /// so changes through the handle do not ask again.
    pub writable: bool,
}

/// Told about every change made through a door other than the FUSE one, so the kernel's
/// caches of the mount can be invalidated (the kernel already knows about its own requests).
pub trait ChangeObserver: Send + Sync {
    /// `path` was created, removed or renamed, or its content or attributes changed.
    fn changed(&self, path: &VPath);

    /// Only the content or attributes of the node at `path` changed: its name still leads to
    /// the same node, and its directory is unchanged.
    fn content_changed(&self, path: &VPath) {
        self.changed(path);
    }

    /// Only the content or attributes of the file with backend identity `identity` changed;
    /// `path` is a name it had, which may lead elsewhere by now.
    fn file_changed(&self, _identity: (u32, u64), path: &VPath) {
        self.content_changed(path);
    }

    /// A rename is replacing, or an unlink removing, the file with backend identity
    /// `identity`, which `file` holds: a door that may still be asked for that file by its old
    /// name (an open racing the change) can keep it. Said just before the change and again
    /// just after (the file may have come to a door's notice in between).
    fn replacing(&self, _identity: (u32, u64), _file: &Arc<OpenHandle>) {}
}

pub struct Engine {
    pub gate: Gate,
    /// Private: a door reaches a backend only through the engine's operations, each of which
    /// asks the gate first (see [`Engine::routes`] for what a door may know of the routes).
    router: Router,
    pub audit: Arc<Audit>,
    /// Makes a rename atomic with everything that could change what it carries: every
    /// operation that adds a name (create, mknod, mkdir, symlink, link) holds it shared, and
    /// every rename holds it exclusively from the look at its source to the backend's rename.
    /// The kernel locks only the parents of a rename, so without this a move inside a
    /// directory being renamed (from either door) could slip an entry past the walk that
    /// judges what the rename carries, or turn a source judged as a file into a directory.
    /// Removals need not hold it: they cannot bring anything into a subtree.
    names: parking_lot::RwLock<()>,
    observer: std::sync::OnceLock<Arc<dyn ChangeObserver>>,
    /// Names the kernel asked the FUSE door for because it had not cached them (present or
    /// absent): how well its caches work, shown by `status`.
    pub fuse_lookups: std::sync::atomic::AtomicU64,
    /// Directory listings the FUSE door took because the kernel had none cached: shown by
    /// `status`.
    pub fuse_listings: std::sync::atomic::AtomicU64,
    /// File reads the FUSE door served because neither the kernel's page cache nor a backing
    /// file held the data: shown by `status`.
    pub fuse_reads: std::sync::atomic::AtomicU64,
    /// Directories the kernel asked the FUSE door to open (none once it opens them by itself):
    /// shown by `status`.
    pub fuse_opendirs: std::sync::atomic::AtomicU64,
    /// Files open through the FUSE door now: opened, and not yet released by the kernel (which
    /// releases a file shortly after its last descriptor is closed). Shown by `status`.
    pub fuse_open_files: std::sync::atomic::AtomicU64,
    /// The requests each io_uring queue of the FUSE door served; unset when requests come by
    /// `/dev/fuse` alone. Set once at mount, shown by `status`.
    pub fuse_rings: std::sync::OnceLock<crate::fuse::ring::RingCounters>,
    /// Events read by the host-changes watcher, when the daemon watches host routes.
    pub host_change_events: std::sync::OnceLock<Arc<std::sync::atomic::AtomicU64>>,
    /// Where beneath a host root a mounted filesystem is not watched: names there keep the
    /// route's short cache lifetime (`host_changes::Unwatched`).
    pub unwatched_mounts: std::sync::OnceLock<crate::host_changes::Unwatched>,
    /// The temporary files of whole writes under way (by serial), which a stop removes
    /// ([`Engine::remove_unfinished_writes`]).
    unfinished: parking_lot::Mutex<HashMap<u64, (Permit, u64)>>,
}

/// An interrupt refusal of one of the two paths of a rename or link, told the other one (for
/// the ticket).
fn naming(mut err: FsError, a: &VPath, b: &VPath) -> FsError {
    if let Some(interrupted) = err.interrupt.as_mut() {
        let other = if interrupted.refusal.path == *a { b } else { a };
        interrupted.other = Some(other.clone());
    }
    err
}

fn wants_read(flags: i32) -> bool {
    matches!(flags & libc::O_ACCMODE, libc::O_RDONLY | libc::O_RDWR)
}

fn wants_write(flags: i32) -> bool {
    matches!(flags & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR) || flags & libc::O_TRUNC != 0
}

impl Engine {
    pub fn new(gate: Gate, router: Router, audit: Arc<Audit>) -> Engine {
        gate.approvals.set_audit(audit.clone());
        Engine {
            gate,
            router,
            audit,
            names: parking_lot::RwLock::new(()),
            unfinished: parking_lot::Mutex::default(),
            observer: std::sync::OnceLock::new(),
            fuse_lookups: Default::default(),
            fuse_listings: Default::default(),
            fuse_reads: Default::default(),
            fuse_opendirs: Default::default(),
            fuse_open_files: Default::default(),
            fuse_rings: std::sync::OnceLock::new(),
            host_change_events: std::sync::OnceLock::new(),
            unwatched_mounts: std::sync::OnceLock::new(),
        }
    }

    /// Each route's prefix, what its backend is, and whether it is served read-only: what a
    /// door or the CLI may know of the routes (never the backends themselves).
    pub fn routes(&self) -> Vec<(VPath, String, bool)> {
        self.router.routes().iter().map(|r| (r.prefix.clone(), r.backend.describe(), r.read_only)).collect()
    }

    /// A route prefix other than `/`, or a directory on the way to one.
    pub fn is_mount_point(&self, path: &VPath) -> bool {
        self.router.is_mount_point(path)
    }

    /// The router itself, for tests that set up a tree behind the gate's back.
    #[cfg(test)]
    pub fn router_for_tests(&self) -> &Router {
        &self.router
    }

    /// Has every backend that others change too (a store shared by several daemons) report
    /// their changes to `observer`, under its route's prefix; `forget` is called when changes
    /// may have been missed (the kernel should then forget everything it cached).
    pub fn watch_shared_routes(
        &self,
        observer: Arc<dyn ChangeObserver>,
        forget: Arc<dyn Fn() + Send + Sync>,
    ) {
        for (index, route) in self.router.routes().iter().enumerate() {
            let (prefix, observer, forget) = (route.prefix.clone(), observer.clone(), forget.clone());
            route.backend.watch(Box::new(move |change| match change {
                RemoteChange::Name(rel) => observer.changed(&prefix.join_rel(&rel)),
                RemoteChange::Content(rel) => observer.content_changed(&prefix.join_rel(&rel)),
                RemoteChange::FileContent { ino, path } => {
                    observer.file_changed((index as u32, ino), &prefix.join_rel(&path))
                }
                RemoteChange::Everything => forget(),
            }));
        }
    }

    /// Installs the observer of changes made behind the kernel's back (once).
    pub fn set_observer(&self, observer: Arc<dyn ChangeObserver>) {
        let _ = self.observer.set(observer);
    }

    fn note_change(&self, ctx: &Ctx, path: &VPath) {
        if ctx.door != Door::Fuse {
            if let Some(observer) = self.observer.get() {
                observer.changed(path);
            }
        }
    }

    /// Records a refusal decided outside the engine's own operations (a tool's permission
    /// pre-check), with the tool call as the "command".
    pub fn audit_refusal(&self, ctx: &Ctx, operation: &str, command: &str, refusal: Refusal) {
        let (pid, uid) = ctx.principal.map_or((ctx.caller.pid, ctx.caller.uid), |p| (p.pid, p.uid));
        self.audit.record(AuditEvent {
            time: SystemTime::now(),
            door: ctx.door.as_str(),
            socket: ctx.principal.map(|p| p.socket.as_str()),
            pid,
            uid,
            command: command.to_string(),
            operation: operation.to_string(),
            class: refusal.op.as_str(),
            path: refusal.path.to_string(),
            rule: refusal.verdict.rule,
            decision: Self::decision_name(&refusal).to_string(),
        });
    }

    fn decision_name(refusal: &Refusal) -> &'static str {
        match (refusal.verdict.mode, refusal.is_hidden()) {
            (Mode::Deny, true) => "hide",
            (Mode::Deny, false) => "deny",
            (Mode::Interrupt, _) => "interrupt",
            (Mode::Allow, _) => "allow",
        }
    }

    /// Turns a refusal into the caller's error, and records it. An interrupt is recorded
    /// when a door opens a ticket for it (a door that cannot ask refuses with EACCES).
    fn refuse(&self, ctx: &Ctx, operation: &str, refusal: Refusal) -> FsError {
        let errno = refusal.errno();
        let decision = Self::decision_name(&refusal);
        if refusal.verdict.mode == Mode::Interrupt {
            let rule = refusal.verdict.rule.unwrap_or(usize::MAX);
            let context =
                format!("{} {} {} (waits for approval)", decision, refusal.op.as_str(), refusal.path);
            let mut err = FsError::denied(errno, rule, context);
            let interrupted =
                Interrupted { operation: operation.to_string(), refusal, names: ctx.names, other: None };
            err.interrupt = Some(Box::new(interrupted));
            return err;
        }
        let command = match ctx.door {
            Door::Fuse => command_line(ctx.caller.pid),
            Door::Tool => String::new(),
        };
        let rule = refusal.verdict.rule.unwrap_or(usize::MAX);
        let context = format!("{} {} {}", decision, refusal.op.as_str(), refusal.path);
        self.audit_refusal(ctx, operation, &command, refusal);
        FsError::denied(errno, rule, context)
    }

    fn check(&self, ctx: &Ctx, operation: &str, op: Op, path: &VPath, is_dir: bool) -> FsResult<Permit> {
        let decided = self.gate.check(op, path, is_dir);
        self.settle(ctx, operation, op, path, decided)
    }

    /// Decides `op` on an existing node, learning its kind only when a rule depends on it.
    fn check_node(&self, ctx: &Ctx, operation: &str, op: Op, path: &VPath) -> FsResult<Permit> {
        let decided =
            self.gate.check_node(op, path, |probe| Ok(self.router.getattr(probe)?.kind == FileKind::Dir))?;
        self.settle(ctx, operation, op, path, decided)
    }

    /// A decision made final: a denial is refused as the rules say; a change on a route served
    /// read-only answers EROFS at once (before anyone is asked to approve it); an interrupt
    /// passes only under its approval.
    fn settle(
        &self,
        ctx: &Ctx,
        operation: &str,
        op: Op,
        path: &VPath,
        decided: Result<Permit, Refusal>,
    ) -> FsResult<Permit> {
        if ctx.door == Door::Tool {
            // What the kernel's walk through the parents does for the mount (`Gate::hidden_ancestor`).
            if let Some(hidden) = self.gate.hidden_ancestor(path) {
                return Err(self.refuse(ctx, operation, hidden));
            }
        }
        let denied = decided.as_ref().is_err_and(|r| r.verdict.mode == Mode::Deny);
        if op == Op::Write && !denied && self.router.route_of(path).read_only {
            return Err(FsError::new(Errno::EROFS, format!("{path} is on a read-only route")));
        }
        let permit = decided
            .or_else(|r| self.gate.approve(r, operation, ctx.asker_uid(), ctx.approval, ctx.retry()))
            .map_err(|r| self.refuse(ctx, operation, r))?;
        if let (Door::Tool, Some(who)) = (ctx.door, &ctx.principal) {
            self.check_access(who, operation, op, path)?;
        }
        Ok(permit)
    }

    /// A new name may not be created where a hidden entry lives: answering EEXIST would
    /// reveal it, so the creation is refused outright. Judged as a directory whatever is
    /// made: a hidden directory may live there (a rule for `dir/` hides only directories).
    fn check_new(&self, ctx: &Ctx, operation: &str, path: &VPath, is_dir: bool) -> FsResult<Permit> {
        if let Err(r) = self.gate.check(Op::Read, path, true) {
            if r.is_hidden() {
                let r = Refusal { op: Op::Write, ..r };
                let mut err = self.refuse(ctx, operation, r);
                err.errno = Errno::EACCES;
                return Err(err);
            }
        }
        self.check(ctx, operation, Op::Write, path, is_dir)
    }

    /// Looking a name up (and `getattr`) does not ask a human under an interrupt rule: the
    /// content is what the rule protects, and it is asked for when the file is opened or the
    /// directory listed. Asking here too would ask twice for one `cat`.
    pub fn lookup(&self, ctx: &Ctx, path: &VPath) -> FsResult<Attr> {
        let attr = self.router.getattr(&self.gate.probe(path))?;
        self.check_metadata(ctx, "lookup", path, attr.kind == FileKind::Dir)?;
        Ok(self.shown(path, attr))
    }

    /// A directory's link count tells how many subdirectories it has, and its size how many
    /// entries (tmpfs adds 20 bytes per name, ext4 grows by blocks), so where a rule may hide
    /// some of them they would tell that they exist: such a directory reports a link count of
    /// 1, which means "not counted" (as on btrfs; `find` and other tools know it), and a size
    /// of 0 in 0 blocks.
    fn shown(&self, path: &VPath, mut attr: Attr) -> Attr {
        if attr.kind == FileKind::Dir && self.gate.may_hide_beneath(path) {
            attr.nlink = 1;
            attr.size = 0;
            attr.blocks = 0;
        }
        attr
    }

    /// `lookup` of several entries of one directory at once (readdirplus), each judged as
    /// its own lookup: each entry's path, and its attributes or why not.
    pub fn lookup_entries(&self, ctx: &Ctx, dir: &VPath, names: &[&str]) -> Vec<(VPath, FsResult<Attr>)> {
        let attrs = self.router.getattr_entries(&self.gate.probe(dir), names);
        names
            .iter()
            .zip(attrs)
            .map(|(name, attr)| {
                let path = dir.join(name);
                let judged = attr.and_then(|attr| {
                    self.check_metadata(ctx, "lookup", &path, attr.kind == FileKind::Dir)?;
                    Ok(self.shown(&path, attr))
                });
                (path, judged)
            })
            .collect()
    }

    fn check_metadata(&self, ctx: &Ctx, operation: &str, path: &VPath, is_dir: bool) -> FsResult<()> {
        match self.gate.check(Op::Read, path, is_dir) {
            // Looking a name up does not ask (policy.md), and leaves approvals alone: a retry
            // grant is for the operation that asked (a `stat` before the retried listing
            // must not use it up).
            Err(r) if r.verdict.mode == Mode::Interrupt => Ok(()),
            decided => self.settle(ctx, operation, Op::Read, path, decided).map(|_| ()),
        }
    }

    /// The root's own attributes are never refused: a mount whose root cannot be stat'ed is
    /// unusable, and its existence is no secret. Listing it is judged as usual.
    pub fn getattr(&self, ctx: &Ctx, path: &VPath) -> FsResult<Attr> {
        self.judged_attr(ctx, path, self.router.getattr(&self.gate.probe(path))?)
    }

    /// [`Engine::getattr`] as the store holds the node at this moment (see
    /// [`Backend::getattr_stored`](crate::backend::Backend::getattr_stored)).
    pub fn getattr_stored(&self, ctx: &Ctx, path: &VPath) -> FsResult<Attr> {
        self.judged_attr(ctx, path, self.router.getattr_stored(&self.gate.probe(path))?)
    }

    fn judged_attr(&self, ctx: &Ctx, path: &VPath, attr: Attr) -> FsResult<Attr> {
        if !path.is_root() {
            self.check_metadata(ctx, "getattr", path, attr.kind == FileKind::Dir)?;
        }
        Ok(self.shown(path, attr))
    }

    /// The visible entries of a directory: hidden ones are left out, as if absent.
    ///
    /// Through the mount, a listing that would show entries under an interrupt-read rule
    /// asks once for the whole directory (not once per entry). The tool door asks per call
    /// instead, before the tool runs (doc/tools.md).
    /// The decision on listing `path`, for an `opendir` whose listing waits for the first
    /// `readdir` (or for none, when the kernel answers from the listing it keeps).
    pub fn opendir(&self, ctx: &Ctx, path: &VPath) -> FsResult<()> {
        self.check(ctx, "readdir", Op::Read, path, true).map(|_| ())
    }

    /// Whether a listing may ask a human (a rule interrupts reads of what it names): such a
    /// listing is taken at `opendir`, so that each one is approved as it is opened.
    pub fn listing_may_ask(&self) -> bool {
        self.gate.rules().may_ask(Op::Read)
    }

    /// Whether a listing must be judged when its directory is opened: a rule may ask a human
    /// about it, or refuse it without hiding the directory (EACCES belongs to `opendir`).
    pub fn listings_judged_at_open(&self) -> bool {
        self.gate.rules().may_refuse_in_sight(Op::Read)
    }

    pub fn readdir(&self, ctx: &Ctx, path: &VPath) -> FsResult<Vec<DirEntry>> {
        let permit = self.check(ctx, "readdir", Op::Read, path, true)?;
        let mut entries = self.router.readdir(&permit)?;
        entries.retain(|e| self.gate.is_visible(&path.join(&e.name), e.kind == FileKind::Dir));
        if ctx.door == Door::Fuse {
            let ask = entries
                .iter()
                .map(|e| self.gate.decide(Op::Read, &path.join(&e.name), e.kind == FileKind::Dir))
                .find(|v| v.mode == Mode::Interrupt);
            if let Some(verdict) = ask {
                let refusal = Refusal { op: Op::Read, path: path.clone(), verdict };
                self.gate
                    .approve(refusal, "readdir", ctx.asker_uid(), ctx.approval, ctx.retry())
                    .map_err(|r| self.refuse(ctx, "readdir", r))?;
            }
        }
        Ok(entries)
    }

    pub fn open(&self, ctx: &Ctx, path: &VPath, flags: i32) -> FsResult<OpenHandle> {
        if flags & libc::O_ACCMODE == libc::O_ACCMODE {
            return Err(FsError::new(Errno::EINVAL, "invalid access mode"));
        }
        let mut permit = None;
        if wants_read(flags) {
            permit = Some(self.check(ctx, "open", Op::Read, path, false)?);
        }
        if wants_write(flags) {
            permit = Some(self.check(ctx, "open", Op::Write, path, false)?);
        }
        let permit = permit.expect("every access mode reads or writes");
        let file = self.router.open(&permit, flags)?;
        Ok(OpenHandle { path: path.clone(), file, writable: wants_write(flags) })
    }

    /// Opens anew the file an open handle holds, as a process does through `/proc/PID/fd/N`
    /// once every name of the file is gone. Judged by the gate under the name the handle was
    /// opened by, as an `open` of that name.
    pub fn reopen(&self, ctx: &Ctx, handle: &OpenHandle, flags: i32) -> FsResult<OpenHandle> {
        if flags & libc::O_ACCMODE == libc::O_ACCMODE {
            return Err(FsError::new(Errno::EINVAL, "invalid access mode"));
        }
        if wants_read(flags) {
            self.check(ctx, "open", Op::Read, &handle.path, false)?;
        }
        if wants_write(flags) {
            self.check(ctx, "open", Op::Write, &handle.path, false)?;
        }
        let file = handle.file.reopen(flags)?;
        Ok(OpenHandle { path: handle.path.clone(), file, writable: wants_write(flags) })
    }

    /// Holds the file at `path` for the daemon's own use, without opening it for reading or
    /// writing (`O_PATH` on host routes), so that it outlives its name; with its identity.
    /// Nothing reaches its content but [`Engine::reopen`], which the gate judges. `None` when
    /// there is no file there.
    pub fn hold(&self, path: &VPath) -> Option<((u32, u64), Arc<OpenHandle>)> {
        let file = self.router.open(&self.gate.probe(path), libc::O_PATH).ok()?;
        let identity = self.identity_of(path, file.kind_and_ino().ok()?)?;
        Some((identity, Arc::new(OpenHandle { path: path.clone(), file, writable: false })))
    }

    pub fn create(&self, ctx: &Ctx, path: &VPath, mode: u32, flags: i32) -> FsResult<(Attr, OpenHandle)> {
        let (attr, file) = self.adding(|| {
            let permit = self.check_new(ctx, "create", path, false)?;
            if wants_read(flags) {
                self.check(ctx, "create", Op::Read, path, false)?;
            }
            self.router.create(&permit, mode, flags, &ctx.caller)
        })?;
        self.note_change(ctx, path);
        // Writable as its access mode says, as an `open`'s: a size change the process makes
        // by name goes through its handle only if that handle writes.
        Ok((attr, OpenHandle { path: path.clone(), file, writable: wants_write(flags) }))
    }

    pub fn mknod(&self, ctx: &Ctx, path: &VPath, mode: u32, rdev: u32) -> FsResult<Attr> {
        let attr = self.adding(|| {
            let permit = self.check_new(ctx, "mknod", path, false)?;
            self.router.mknod(&permit, mode, rdev, &ctx.caller)
        })?;
        self.note_change(ctx, path);
        Ok(attr)
    }

    pub fn mkdir(&self, ctx: &Ctx, path: &VPath, mode: u32) -> FsResult<Attr> {
        let attr = self.adding(|| {
            let permit = self.check_new(ctx, "mkdir", path, true)?;
            self.router.mkdir(&permit, mode, &ctx.caller)
        })?;
        self.note_change(ctx, path);
        Ok(self.shown(path, attr))
    }

    pub fn symlink(&self, ctx: &Ctx, path: &VPath, target: &[u8]) -> FsResult<Attr> {
        let attr = self.adding(|| {
            let permit = self.check_new(ctx, "symlink", path, false)?;
            self.router.symlink(&permit, target, &ctx.caller)
        })?;
        self.note_change(ctx, path);
        Ok(attr)
    }

    /// Runs `add`, which adds a name, holding the namespace lock shared (see `names`). The
    /// kernel is told of the change only after: its invalidation waits for the directory's
    /// lock, which a rename through the mount holds while it waits for this lock.
    fn adding<T>(&self, add: impl FnOnce() -> FsResult<T>) -> FsResult<T> {
        let _adding = self.names.read();
        add()
    }

    /// A new name for an existing file. The file itself must be writable under the rules:
    /// otherwise a link would open a protected file to writes under an unprotected name.
    pub fn link(&self, ctx: &Ctx, existing: &VPath, new_path: &VPath) -> FsResult<Attr> {
        let ctx =
            &Ctx { names: Some(crate::policy::approvals::retry::names_key(existing, new_path)), ..*ctx };
        let attr = self.adding(|| {
            let judged = || -> FsResult<_> {
                let from = self.check(ctx, "link", Op::Write, existing, false)?;
                let to = self.check_new(ctx, "link", new_path, false)?;
                self.check_read_kept(ctx, "link", existing, new_path, false)?;
                Ok((from, to))
            };
            let (from, to) = judged().map_err(|e| naming(e, existing, new_path))?;
            self.router.link(&from, &to)
        })?;
        self.note_change(ctx, existing);
        self.note_change(ctx, new_path);
        Ok(attr)
    }

    pub fn readlink(&self, ctx: &Ctx, path: &VPath) -> FsResult<Vec<u8>> {
        let permit = self.check(ctx, "readlink", Op::Read, path, false)?;
        self.router.readlink(&permit)
    }

    pub fn unlink(&self, ctx: &Ctx, path: &VPath) -> FsResult<()> {
        let permit = self.check(ctx, "unlink", Op::Write, path, false)?;
        // A tool's delete: an open through the mount that found the file just before gets it,
        // as on a local filesystem (the kernel knows its own unlinks). No rename may put
        // another file at the name between the hold and the unlink.
        let no_renames = (ctx.door != Door::Fuse).then(|| self.names.read());
        let removing = no_renames.is_some().then(|| self.hold_for_racing_opens(path)).flatten();
        let result = self.router.unlink(&permit);
        drop(no_renames);
        if result.is_ok() {
            if let Some(held) = removing {
                held.changed();
            }
            self.note_change(ctx, path);
        }
        result
    }

    pub fn rmdir(&self, ctx: &Ctx, path: &VPath) -> FsResult<()> {
        let permit = self.check(ctx, "rmdir", Op::Write, path, true)?;
        let result = match self.router.rmdir(&permit) {
            // Only tool temporaries a crash left (hidden, so nobody else can remove them).
            Err(e) if e.is(Errno::ENOTEMPTY) && self.remove_leftover_temporaries(&permit) => {
                self.router.rmdir(&permit)
            }
            other => other,
        };
        if result.is_ok() {
            self.note_change(ctx, path);
        }
        result
    }

    pub fn setattr(
        &self,
        ctx: &Ctx,
        path: &VPath,
        changes: &SetAttr,
        handle: Option<&OpenHandle>,
    ) -> FsResult<Attr> {
        let attr = match handle {
            // A truncation through a handle opened for writing does not ask again (an approved
            // `O_TRUNC` open is followed by a truncate through its handle). Other changes
            // served through a handle are judged like any other.
            Some(h) if h.writable && changes.size.is_some() => {
                match self.check_node(ctx, "setattr", Op::Write, path) {
                    Ok(_) => h.file.setattr(changes)?,
                    Err(e) if e.interrupt.is_some() => h.file.setattr(changes)?,
                    Err(e) => return Err(e),
                }
            }
            Some(h) => {
                self.check_node(ctx, "setattr", Op::Write, path)?;
                h.file.setattr(changes)?
            }
            None => {
                let permit = self.check_node(ctx, "setattr", Op::Write, path)?;
                self.router.setattr(&permit, changes)?
            }
        };
        self.note_change(ctx, path);
        Ok(self.shown(path, attr))
    }

    /// What every backend answered reaches its store (see
    /// [`Backend::commit_pending`](crate::backend::Backend::commit_pending)): the tools'
    /// successes are what a crash of the daemon keeps.
    pub fn commit_pending(&self) -> FsResult<()> {
        self.router.commit_pending()
    }

    /// Makes the names in each of `dirs` durable (what a tool call changed, in directories it
    /// was judged for).
    pub fn fsyncdirs(&self, dirs: &[VPath]) -> FsResult<()> {
        self.router.fsyncdirs(dirs)
    }

    /// `fsync` of a directory opened (and judged) by `opendir`.
    pub fn fsyncdir(&self, path: &VPath) -> FsResult<()> {
        self.router.fsyncdir(path)
    }

    pub fn statfs(&self, path: &VPath) -> FsResult<StatFs> {
        self.router.statfs(path)
    }

    pub fn getxattr(&self, ctx: &Ctx, path: &VPath, name: &str) -> FsResult<Vec<u8>> {
        let permit = self.check_node(ctx, "getxattr", Op::Read, path)?;
        self.router.getxattr(&permit, name)
    }

    pub fn listxattr(&self, ctx: &Ctx, path: &VPath) -> FsResult<Vec<u8>> {
        let permit = self.check_node(ctx, "listxattr", Op::Read, path)?;
        self.router.listxattr(&permit)
    }

    pub fn setxattr(&self, ctx: &Ctx, path: &VPath, name: &str, value: &[u8], flags: i32) -> FsResult<()> {
        let permit = self.check_node(ctx, "setxattr", Op::Write, path)?;
        self.router.setxattr(&permit, name, value, flags)?;
        self.note_change(ctx, path);
        Ok(())
    }

    pub fn removexattr(&self, ctx: &Ctx, path: &VPath, name: &str) -> FsResult<()> {
        let permit = self.check_node(ctx, "removexattr", Op::Write, path)?;
        self.router.removexattr(&permit, name)?;
        self.note_change(ctx, path);
        Ok(())
    }

    // Data operations act on a handle whose open was already decided.

    pub fn read(&self, handle: &OpenHandle, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        handle.file.read(offset, size)
    }

    pub fn write(&self, handle: &OpenHandle, offset: u64, data: &[u8]) -> FsResult<u32> {
        handle.file.write(offset, data)
    }

    /// The kernel writes back cached pages (see [`OpenFile::write_back`]).
    pub fn write_back(&self, handle: &OpenHandle, offset: u64, data: &[u8]) -> FsResult<u32> {
        handle.file.write_back(offset, data)
    }

    /// Before a write by a process that may not keep a file's set-ID bits (it lacks
    /// `CAP_FSETID`), when the kernel leaves clearing them to the daemon (a write it does not
    /// do through its page cache or a backing file): clears the set-user-ID bit, and the
    /// set-group-ID bit of a group-executable file, as a local filesystem's write does. Says
    /// whether the mode changed.
    pub fn clear_setid_for_write(&self, handle: &OpenHandle) -> FsResult<bool> {
        let perm = u32::from(handle.file.getattr()?.perm);
        let kept = perm & !setid_bits_a_write_clears(perm);
        if kept != perm {
            handle.file.setattr(&SetAttr { mode: Some(kept), ..SetAttr::default() })?;
        }
        Ok(kept != perm)
    }

    pub fn flush(&self, handle: &OpenHandle) -> FsResult<()> {
        handle.file.flush()
    }

    /// The last descriptor of `handle` is gone. Data a backend held and could not store is
    /// lost here: the kernel's cached pages and size of it are dropped, so the mount shows what
    /// is stored, and then that is logged as an error naming the file (in this order, so that
    /// whoever reads the log line sees the mount as stored).
    pub fn release(&self, handle: &OpenHandle) -> FsResult<()> {
        handle.file.release().inspect_err(|e| {
            if let Some(observer) = self.observer.get() {
                observer.content_changed(&handle.path);
            }
            tracing::error!("{}: {e}", crate::display::Escaped(handle.path.as_str()));
        })
    }

    pub fn fsync(&self, handle: &OpenHandle, datasync: bool) -> FsResult<()> {
        handle.file.fsync(datasync)
    }

    pub fn fallocate(&self, handle: &OpenHandle, offset: u64, length: u64, mode: i32) -> FsResult<()> {
        handle.file.fallocate(offset, length, mode)
    }

    /// A file reached by several names (hard links) is one node: an operation on the node
    /// must be allowed under every name it is known by, not just the one that was used.
    pub fn check_aliases(&self, ctx: &Ctx, operation: &str, op: Op, aliases: &[VPath]) -> FsResult<()> {
        for alias in aliases {
            self.check_node(ctx, operation, op, alias)?;
        }
        Ok(())
    }

    /// The backend node behind a non-directory (route, backend inode), which tells hard links
    /// of one file apart from different files.
    pub fn identity(&self, path: &VPath, attr: &Attr) -> Option<(u32, u64)> {
        self.identity_of(path, (attr.kind, attr.ino))
    }

    /// [`Engine::identity`] from the node's kind and backend inode number alone.
    pub fn identity_of(&self, path: &VPath, (kind, ino): (FileKind, u64)) -> Option<(u32, u64)> {
        (kind != FileKind::Dir).then(|| (self.router.route_index(path) as u32, ino))
    }

    /// The identity of what `path` leads to now, if anything. Asks no rule: the FUSE door's
    /// inode table uses it to drop names that no longer lead to a node, and nothing of the
    /// node reaches a caller.
    pub fn identity_now(&self, path: &VPath) -> Option<(u32, u64)> {
        let node = self.router.kind_and_ino(&self.gate.probe(path)).ok()?;
        self.identity_of(path, node)
    }

    /// How long the kernel may cache what it learned about `path`.
    pub fn ttl(&self, path: &VPath) -> std::time::Duration {
        if let Some(unwatched) = self.unwatched_mounts.get() {
            if let Some((_, ttl)) = unwatched.load().iter().find(|(beneath, _)| path.starts_with(beneath)) {
                return *ttl;
            }
        }
        self.router.route_of(path).ttl
    }
}

/// The set-ID bits of permission bits `perm` that a write by a process without `CAP_FSETID`
/// clears: set-user-ID, and set-group-ID when the group may execute (without group execute,
/// set-group-ID means mandatory locking and stays).
fn setid_bits_a_write_clears(perm: u32) -> u32 {
    let group_exec = perm & libc::S_IXGRP != 0;
    libc::S_ISUID | if group_exec { libc::S_ISGID } else { 0 }
}

mod access;
mod renames;
pub mod survey;
mod who;
mod whole_writes;

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
