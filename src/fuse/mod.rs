//! The FUSE door: translates kernel requests (inodes, handles) into engine calls on virtual
//! paths and sends the replies. No logic lives here beyond that translation.

pub mod absent;
mod convert;
pub mod inodes;
pub mod invalidate;
mod listing;
mod names;
mod open_files;
mod page_cache;
mod park;
mod passthrough;
pub mod replaced;
pub mod ring;
pub mod ring_guard;
mod unsupported;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno as FuseErrno, FileHandle, Filesystem, Generation, INodeNo,
    InitFlags, IoctlFlags, KernelConfig, LockOwner, Notifier, OpenFlags, PollEvents, PollFlags, PollNotifier,
    RenameFlags, ReplyAttr, ReplyBmap, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLock, ReplyLseek, ReplyOpen, ReplyPoll, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::RwLock;

use crate::backend::{Attr, SetAttr};
use crate::engine::{Ctx, Engine};
use crate::error::{Errno, FsError, FsResult};
use crate::policy::Op;
use crate::vpath::VPath;
use convert::{absent_attr, ctx, errno, fuse_attr, reply_empty, reply_entry, reply_xattr, time_set};
use inodes::Inodes;
use listing::DirHandle;
use names::went_stale;
use open_files::OpenFiles;
use passthrough::Passthrough;

/// Cheap to clone (shared state only): a paused operation keeps a clone to finish with.
#[derive(Clone)]
pub struct FuseDoor {
    engine: Arc<Engine>,
    inodes: Arc<Inodes>,
    files: Arc<OpenFiles>,
    dirs: Arc<RwLock<HashMap<u64, Arc<DirHandle>>>>,
    next_handle: Arc<AtomicU64>,
    passthrough: Arc<Passthrough>,
    /// Which directories to list afresh for the attributes passthrough reads made stale.
    reads_since_listed: Arc<listing::ReadsSinceListed>,
    relister: Arc<listing::Relister>,
    /// Listings of directories the kernel did not open.
    snapshots: Arc<listing::Snapshots>,
    options: DoorOptions,
    /// Whether `init` got the kernel to offer FUSE over io_uring (see [`ring`]).
    ring_negotiated: Arc<AtomicBool>,
    /// Whether the kernel can expire a cached name without dropping it (`FUSE_EXPIRE_ONLY`).
    expire_only: Arc<AtomicBool>,
    /// The session's notifier, set once the session exists (see [`FuseDoor::notifier_slot`]).
    notifier: Arc<OnceLock<Notifier>>,
    /// Files renames through the mount replaced, by the inode the kernel knew them by.
    replaced: Arc<replaced::ReplacedFiles>,
    /// Requests waiting for a human, by request id: their caller's signal ends them.
    parked: Arc<park::Parked>,
}

/// The `[fuse]` choices the door acts on.
#[derive(Clone, Copy)]
pub struct DoorOptions {
    /// Ask the kernel for FUSE passthrough of file data in real files (host routes, the
    /// memory route's tmpfs).
    pub passthrough: bool,
    /// Files of routes with passthrough up to this size, opened only for reading, are served
    /// from the kernel's page cache (see [`page_cache`]).
    pub cached_reads_max: u64,
    /// Serve extended attributes. Off, the door answers ENOSYS once and the kernel stops
    /// sending xattr requests for the whole mount (`ls -l` sends two per file otherwise).
    pub xattrs: bool,
    /// Ask the kernel for FUSE over io_uring (the daemon then registers rings, see [`ring`]).
    pub io_uring: bool,
}

const GEN: Generation = Generation(0);

/// The largest write (and read) request: also the size of each io_uring entry's payload.
pub const MAX_WRITE: usize = 1 << 20;

/// Routes whose names are cached at least this long also have their listings cached.
const LONG_TTL: Duration = Duration::from_secs(60);

impl FuseDoor {
    pub fn new(engine: Arc<Engine>, inodes: Arc<Inodes>, options: DoorOptions) -> FuseDoor {
        let notifier: Arc<OnceLock<Notifier>> = Arc::default();
        FuseDoor {
            engine,
            inodes,
            files: Arc::default(),
            dirs: Arc::new(RwLock::new(HashMap::new())),
            next_handle: Arc::new(AtomicU64::new(1)),
            passthrough: Arc::default(),
            reads_since_listed: Arc::default(),
            relister: Arc::new(listing::Relister::start(notifier.clone())),
            snapshots: Arc::default(),
            options,
            ring_negotiated: Arc::default(),
            expire_only: Arc::default(),
            notifier,
            replaced: Arc::default(),
            parked: Arc::default(),
        }
    }

    /// Where the daemon puts the session's notifier: the door tells the kernel itself when it
    /// finds an inode's attributes stale (see [`FuseDoor::drop_stale_name`]).
    pub fn notifier_slot(&self) -> Arc<OnceLock<Notifier>> {
        self.notifier.clone()
    }

    /// Set by `init` when the kernel can expire cached names without dropping them (see
    /// [`invalidate::KernelInvalidator::forget_everything`]).
    pub fn expire_only(&self) -> Arc<AtomicBool> {
        self.expire_only.clone()
    }

    /// Whether the session's `init` negotiated FUSE over io_uring.
    pub fn ring_negotiated(&self) -> bool {
        self.ring_negotiated.load(Ordering::Relaxed)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> FsResult<VPath> {
        let dir = self.inodes.path(parent.0)?;
        Ok(dir.join(VPath::check_name(name.as_bytes())?))
    }

    /// Replies with a new entry the kernel will hold a lookup on.
    fn entry(&self, path: &VPath, attr: &Attr, reply: ReplyEntry) {
        let ino = self.remember(path, attr);
        reply.entry(&self.attr_ttl(ino, path), &fuse_attr(ino, attr), GEN);
    }
}

impl Filesystem for FuseDoor {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // fuser asks only for async reads and big writes; everything else is requested here.
        // Each flag is optional: an older kernel without it still mounts.
        for flag in [
            // Always readdirplus (not "auto"): listing a directory then hands the kernel every
            // entry's attributes, so the stat that usually follows costs no lookup request.
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_AUTO_INVAL_DATA,
            // Not FUSE_CACHE_SYMLINKS: a target the kernel kept would answer the next
            // `readlink` (another user's, or one after a reload) without the gate, and an
            // interrupt rule must ask at every one.
            InitFlags::FUSE_MAX_PAGES,
            InitFlags::FUSE_ASYNC_DIO,
            // A writer with no backing file is served FOPEN_DIRECT_IO (see `admit_file`);
            // without this, a shared `mmap` of it would fail with ENODEV.
            InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP,
        ] {
            let _ = config.add_capabilities(flag);
        }
        let _ = config.set_max_write(MAX_WRITE as u32);
        let expire_only = config.capabilities().contains(InitFlags::FUSE_HAS_EXPIRE_ONLY);
        self.expire_only.store(expire_only, Ordering::Relaxed);
        if self.options.io_uring && config.add_capabilities(InitFlags::FUSE_OVER_IO_URING).is_ok() {
            self.ring_negotiated.store(true, Ordering::Relaxed);
        }
        let _ = config.set_max_background(64);
        // Depth 2 lets backing files live on a stacked host fs (overlayfs in a container).
        if self.options.passthrough
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(2).is_ok()
        {
            self.passthrough.enable(self.options.cached_reads_max);
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.engine.fuse_lookups.fetch_add(1, Ordering::Relaxed);
        let path = match self.child(parent, name) {
            Ok(path) => path,
            Err(e) => return reply.error(errno(&e)),
        };
        match self.engine.lookup(&ctx(req), &path) {
            Ok(attr) => self.entry(&path, &attr, reply),
            // The kernel may keep an absence as long as it keeps names of this route. A name a
            // rule hides is answered afresh each time, so that every attempt is audited.
            Err(e) if e.is(Errno::ENOENT) && e.denied_by.is_none() => {
                let ttl = self.engine.ttl(&path);
                if self.inodes.absent.remember(parent.0, path.name(), Instant::now() + ttl) {
                    reply.entry(&ttl, &absent_attr(), GEN)
                } else {
                    reply.error(errno(&e))
                }
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        if self.inodes.forget(ino.0, nlookup) {
            self.passthrough.forget(ino.0);
            self.replaced.forget(ino.0);
        }
    }

    fn batch_forget(&self, _req: &Request, nodes: &[fuser::ForgetOne]) {
        for ino in self.inodes.forget_many(nodes.iter().map(|n| (n.nodeid().0, n.nlookup()))) {
            self.passthrough.forget(ino);
            self.replaced.forget(ino);
        }
    }

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let open = fh.and_then(|fh| self.file(fh).ok());
        let result = match open {
            Some(f) => f.handle.file.getattr().map(|a| (a, f.handle.path.clone())),
            None => self.attr_by_name(&ctx(req), ino),
        };
        match result {
            Ok((attr, path)) => reply.attr(&self.attr_ttl(ino.0, &path), &fuse_attr(ino.0, &attr)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let changes = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
        };
        let open = match fh {
            Some(fh) => self.file(fh).ok(),
            // Changes a process makes to a file it holds open for writing (a truncate for its
            // `O_TRUNC` open; fchmod, fchown, futimens, which name no handle) are served
            // through its handle: one system call on the host file, and on the sqlite route
            // they wait for the file's next commit.
            None => self.writable_file_of(ino.0, req.pid()),
        };
        let work = move |d: &FuseDoor, c: &Ctx| {
            let (p, open) = match &open {
                Some(f) if fh.is_some() || size.is_some() => (f.handle.path.clone(), open.clone()),
                // The handle's path is the node's only name: it is what the check below would
                // judge whether or not the name still leads here (a stale one falls back to
                // the handle's path), so the host lookup that checks it is skipped.
                Some(f) if d.inodes.paths(ino.0).is_ok_and(|p| p == [f.handle.path.clone()]) => {
                    (f.handle.path.clone(), open.clone())
                }
                // Judged by the node's names, as if no handle served it.
                _ => match d.live_path(c, ino, "setattr", Op::Write) {
                    Ok(p) => (p, open.clone()),
                    // Every name is gone (fchmod of a file deleted or replaced behind the
                    // kernel's back): the caller's writable handle still reaches the file, as
                    // its writes do. Another handle (any process's, read-only ones too) serves
                    // only a file with no name left anywhere: one a host program moved lives
                    // under a name this door does not know, where other rules may hold.
                    Err(e) if e.is(Errno::ENOENT) || e.is(Errno::ESTALE) => match &open {
                        Some(f) => (f.handle.path.clone(), open.clone()),
                        None => {
                            let f = d.any_file_of(ino.0).ok_or(e)?;
                            if f.handle.file.getattr()?.nlink > 0 {
                                return Err(FsError::new(
                                    Errno::ESTALE,
                                    "the file was moved elsewhere behind the mount's back",
                                ));
                            }
                            (f.handle.path.clone(), Some(f))
                        }
                    },
                    Err(e) => return Err(e),
                },
            };
            Ok((d.engine.setattr(c, &p, &changes, open.as_ref().map(|f| &f.handle))?, p))
        };
        self.serve(ctx(req), reply, work, move |d, result, reply: ReplyAttr| match result {
            Ok((attr, path)) => reply.attr(&d.attr_ttl(ino.0, &path), &fuse_attr(ino.0, &attr)),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let work =
            move |d: &FuseDoor, c: &Ctx| d.engine.readlink(c, &d.node_path(c, ino, "readlink", Op::Read)?);
        self.serve(ctx(req), reply, work, |_, result, reply: ReplyData| match result {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let name = name.to_owned();
        let work = move |d: &FuseDoor, c: &Ctx| {
            let p = d.child(parent, &name)?;
            Ok((d.engine.mknod(c, &p, mode, rdev)?, p))
        };
        self.serve_naming(ctx(req), reply, work, reply_entry)
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        let name = name.to_owned();
        let work = move |d: &FuseDoor, c: &Ctx| {
            let p = d.child(parent, &name)?;
            Ok((d.engine.mkdir(c, &p, mode)?, p))
        };
        self.serve_naming(ctx(req), reply, work, reply_entry)
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.to_owned();
        let work = move |d: &FuseDoor, c: &Ctx| {
            let p = d.child(parent, &name)?;
            d.engine.unlink(c, &p).map(|_| p)
        };
        self.serve_naming(ctx(req), reply, work, |d, result, reply: ReplyEmpty| match result {
            Ok(path) => {
                let ino = d.inodes.ino_of(&path);
                d.inodes.removed(&path);
                // Before the reply: the space of a memory route's file is free when unlink returns.
                if let Some(ino) = ino.filter(|&ino| !d.inodes.has_names(ino)) {
                    d.passthrough.unlinked(ino);
                }
                reply.ok()
            }
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.to_owned();
        let work = move |d: &FuseDoor, c: &Ctx| {
            let p = d.child(parent, &name)?;
            d.engine.rmdir(c, &p).map(|_| p)
        };
        self.serve_naming(ctx(req), reply, work, |d, result, reply: ReplyEmpty| match result {
            Ok(path) => {
                d.inodes.removed(&path);
                reply.ok()
            }
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let (name, target) = (link_name.to_owned(), target.as_os_str().as_bytes().to_vec());
        let work = move |d: &FuseDoor, c: &Ctx| {
            let p = d.child(parent, &name)?;
            Ok((d.engine.symlink(c, &p, &target)?, p))
        };
        self.serve_naming(ctx(req), reply, work, reply_entry)
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (name, newname, flags) = (name.to_owned(), newname.to_owned(), flags.bits());
        let work = move |d: &FuseDoor, c: &Ctx| {
            let (from, to) = (d.child(parent, &name)?, d.child(newparent, &newname)?);
            // Held from before the rename: an open may meet the new file under the name while
            // the rename is under way. An exchange replaces both names' files.
            let held = match flags {
                f if f & crate::backend::RENAME_NOREPLACE != 0 => [None, None],
                f if f & crate::backend::RENAME_EXCHANGE != 0 => {
                    [d.hold_replaced(&to), d.hold_replaced(&from)]
                }
                _ => [d.hold_replaced(&to), None],
            };
            d.engine
                .rename(c, &from, &to, flags)
                .inspect_err(|_| held.into_iter().for_each(|h| d.release_replaced(h)))?;
            Ok((from, to))
        };
        self.serve_naming(ctx(req), reply, work, move |d, result, reply: ReplyEmpty| match result {
            Ok((from, to)) => {
                if flags & crate::backend::RENAME_EXCHANGE != 0 {
                    d.inodes.exchanged(&from, &to);
                } else {
                    d.inodes.renamed(&from, &to);
                }
                reply.ok()
            }
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let newname = newname.to_owned();
        let work = move |d: &FuseDoor, c: &Ctx| {
            let existing = d.node_path(c, ino, "link", Op::Write)?;
            let new_path = d.child(newparent, &newname)?;
            Ok((d.engine.link(c, &existing, &new_path)?, new_path))
        };
        self.serve_naming(ctx(req), reply, work, reply_entry)
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let op = if flags.0 & libc::O_ACCMODE == libc::O_RDONLY { Op::Read } else { Op::Write };
        let pid = req.pid();
        let work = move |d: &FuseDoor, c: &Ctx| {
            let by_name = d.node_path(c, ino, "open", op).and_then(|path| {
                let handle = d.engine.open(c, &path, flags.0).map_err(went_stale)?;
                // The name may lead to another file by now (replaced behind the kernel's
                // back): the kernel must not take it for this inode.
                d.check_identity(ino.0, &path, || handle.file.kind_and_ino())?;
                Ok(handle)
            });
            match by_name {
                // The name no longer leads to the file. If a rename through the mount replaced
                // it (the open raced the rename), or every name was removed through the mount
                // (the kernel came by a descriptor's `/proc/PID/fd/N`), the file itself is
                // opened anew, through what the door holds of it, as a local filesystem would.
                Err(e) if e.is(Errno::ESTALE) => {
                    // An open handle is the file only when the kernel holds no stale name
                    // for it, which would lead elsewhere now.
                    let open_handles = d.inodes.lost_names_through_mount(ino.0);
                    d.with_held_file(ino.0, open_handles, |held| d.engine.reopen(c, held, flags.0))
                        .unwrap_or_else(|| d.gone(ino.0, e))
                }
                other => other,
            }
        };
        self.serve(ctx(req), reply, work, move |d, result, reply: ReplyOpen| {
            let handle = match result {
                Ok(handle) => handle,
                Err(e) => return reply.error(errno(&e)),
            };
            // Nothing to flush: read-only, or a backend whose writes are already stored.
            let noflush = op == Op::Read || !handle.file.needs_flush();
            let (fh, fopen, backing) =
                d.admit_file(ino.0, pid, handle, flags.0, noflush, |fd| reply.open_backing(fd));
            match backing {
                Some(backing) => reply.opened_passthrough(fh, fopen, &backing),
                None => reply.opened(fh, fopen),
            }
        })
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.engine.fuse_reads.fetch_add(1, Ordering::Relaxed);
        let read = self.file(fh).and_then(|f| {
            f.atime_stale.store(true, Ordering::Relaxed);
            self.engine.read(&f.handle, offset, size)
        });
        match read {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let kill_setid = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        let written = self.file(fh).and_then(|f| {
            if kill_setid && self.engine.clear_setid_for_write(&f.handle)? {
                // The kernel keeps the mode cached, and would go on showing and executing the
                // file with those bits until its attributes expire.
                self.invalidate_attributes(ino.0);
            }
            if write_flags.contains(WriteFlags::FUSE_WRITE_CACHE) {
                self.engine.write_back(&f.handle, offset, data)
            } else {
                self.engine.write(&f.handle, offset, data)
            }
        });
        match written {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        match self.file(fh).and_then(|f| self.engine.flush(&f.handle)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let handle = self.release_handle(fh);
        // Dropping the last reference closes the backend file; flush first so a backend that
        // buffers reports its error here rather than losing the data silently.
        let result = match handle {
            Some(f) => self.engine.release(&f.handle),
            None => Ok(()),
        };
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        match self.file(fh).and_then(|f| self.engine.fsync(&f.handle, datasync)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.open_dir(req, ino, reply)
    }

    fn readdir(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, reply: ReplyDirectory) {
        self.list(req, ino, fh, offset, reply)
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        self.list_plus(req, ino, fh, offset, reply)
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.dirs.write().remove(&fh.0);
        reply.ok()
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.sync_dir(ino, fh, reply)
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        match self.inodes.path(ino.0).or_else(|_| Ok(VPath::root())).and_then(|p| self.engine.statfs(&p)) {
            Ok(s) => {
                reply.statfs(s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        if !self.options.xattrs {
            return reply.error(FuseErrno::ENOSYS);
        }
        let (name, value) = (name.to_owned(), value.to_vec());
        let work = move |d: &FuseDoor, c: &Ctx| {
            let p = d.node_path(c, ino, "setxattr", Op::Write)?;
            let name = name.to_str().ok_or_else(|| FsError::errno(Errno::EINVAL))?;
            d.engine.setxattr(c, &p, name, &value, flags)
        };
        self.serve(ctx(req), reply, work, reply_empty)
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if !self.options.xattrs {
            return reply.error(FuseErrno::ENOSYS);
        }
        let name = name.to_owned();
        let work = move |d: &FuseDoor, c: &Ctx| {
            let p = d.node_path(c, ino, "getxattr", Op::Read)?;
            let name = name.to_str().ok_or_else(|| FsError::errno(Errno::ENODATA))?;
            d.engine.getxattr(c, &p, name)
        };
        self.serve(ctx(req), reply, work, move |_, result, reply| reply_xattr(result, size, reply))
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        if !self.options.xattrs {
            return reply.error(FuseErrno::ENOSYS);
        }
        let work =
            move |d: &FuseDoor, c: &Ctx| d.engine.listxattr(c, &d.node_path(c, ino, "listxattr", Op::Read)?);
        self.serve(ctx(req), reply, work, move |_, result, reply| reply_xattr(result, size, reply))
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if !self.options.xattrs {
            return reply.error(FuseErrno::ENOSYS);
        }
        let name = name.to_owned();
        let work = move |d: &FuseDoor, c: &Ctx| {
            let p = d.node_path(c, ino, "removexattr", Op::Write)?;
            let name = name.to_str().ok_or_else(|| FsError::errno(Errno::ENODATA))?;
            d.engine.removexattr(c, &p, name)
        };
        self.serve(ctx(req), reply, work, reply_empty)
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // Permission bits are checked by the kernel (default_permissions).
        reply.ok()
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let (name, pid) = (name.to_owned(), req.pid());
        let work = move |d: &FuseDoor, c: &Ctx| {
            let p = d.child(parent, &name)?;
            Ok((d.engine.create(c, &p, mode, flags)?, p))
        };
        self.serve_naming(ctx(req), reply, work, move |d, result, reply: ReplyCreate| match result {
            Ok(((attr, handle), path)) => {
                let ino = d.remember(&path, &attr);
                let (ttl, attr) = (d.attr_ttl(ino, &path), fuse_attr(ino, &attr));
                let noflush = !handle.file.needs_flush();
                let (fh, fopen, backing) =
                    d.admit_file(ino, pid, handle, flags, noflush, |fd| reply.open_backing(fd));
                match backing {
                    Some(backing) => reply.created_passthrough(&ttl, &attr, GEN, fh, fopen, &backing),
                    None => reply.created(&ttl, &attr, GEN, fh, fopen),
                }
            }
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        match self.file(fh).and_then(|f| self.engine.fallocate(&f.handle, offset, length, mode)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    // The requests below are answered without being served; see `unsupported` for each
    // answer and why. (`batch_forget` is fuser's: it calls `forget` for each inode.)

    fn interrupt(&self, _req: &Request, unique: fuser::RequestId) {
        self.interrupted(unique.0)
    }

    fn destroy(&mut self) {
        // Nothing to do at unmount: files commit at their flush and release, and the
        // backends close when the daemon drops the engine.
    }

    fn getlk(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        reply.error(unsupported::LOCKS)
    }

    fn setlk(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
        _sleep: bool,
        reply: ReplyEmpty,
    ) {
        reply.error(unsupported::LOCKS)
    }

    fn bmap(&self, _req: &Request, _ino: INodeNo, _blocksize: u32, _idx: u64, reply: ReplyBmap) {
        reply.error(unsupported::BMAP)
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(unsupported::IOCTL)
    }

    fn poll(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _ph: PollNotifier,
        _events: PollEvents,
        _flags: PollFlags,
        reply: ReplyPoll,
    ) {
        reply.error(unsupported::POLL)
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: ReplyLseek,
    ) {
        reply.error(unsupported::LSEEK)
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        reply.error(unsupported::COPY_FILE_RANGE)
    }
}
