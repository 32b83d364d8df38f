//! The scratch backend: a whole directory tree held in memory, lost when the daemon stops.
//! File contents are pages allocated where data was written ([`pages`]); the size cap counts
//! those pages, as the kernel counts a tmpfs's.
//!
//! One `RwLock` guards the inode table. Lookups, reads and `open` take the read lock; anything
//! that changes the tree or file contents takes the write lock. No code path takes the lock
//! twice, and open-file handles are only built or dropped after the lock is released, so no
//! operation can deadlock against another.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::{Mutex, RwLock};

use super::{
    check_xattr_namespace, split_parent, Attr, Backend, Caller, DirEntry, FileKind, OpenFile, SetAttr,
    StatFs, TimeSet, RENAME_EXCHANGE, RENAME_NOREPLACE,
};
use crate::error::{Errno, FsError, FsResult};

#[path = "memory_file.rs"]
mod file;
#[path = "memory_pages.rs"]
mod pages;
use file::MemFile;
use pages::{Pages, INLINE_SYMLINK_MAX, PAGE};

const ROOT: u64 = 1;
const BLOCK_SIZE: u64 = PAGE;
const NAME_MAX: usize = 255;
const PATH_MAX: usize = 4096;
const XATTR_NAME_MAX: usize = 255;
const XATTR_SIZE_MAX: usize = 65536;
const XATTR_CREATE: i32 = 1;
const XATTR_REPLACE: i32 = 2;
const FALLOC_FL_KEEP_SIZE: i32 = 1;
const FALLOC_FL_PUNCH_HOLE: i32 = 2;
/// Largest file offset Linux accepts (`loff_t` is signed).
const MAX_FILE_SIZE: u64 = i64::MAX as u64;
/// What statfs reports without a cap: 2^32 blocks of 4 KiB (16 TiB).
const UNCAPPED_BLOCKS: u64 = 1 << 32;
const MAX_FILES: u64 = 1 << 32;
/// Directories report a conventional size, as ext4 does; they allocate nothing (as on tmpfs).
const DIR_SIZE: u64 = 4096;
/// relatime: an access time older than this is refreshed even if newer than mtime/ctime.
const ATIME_REFRESH: Duration = Duration::from_secs(24 * 60 * 60);
const S_ISGID: u16 = libc::S_ISGID as u16;

/// An in-memory backend. Cheap to share: handles keep the tree alive through an `Arc`.
pub struct MemoryBackend {
    tree: Arc<RwLock<Tree>>,
}

struct Tree {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
    /// Pages allocated to file contents and long symlink targets, including those of unlinked
    /// files still open.
    used: u64,
    /// The cap in pages: `max_bytes` rounded up to whole pages, as tmpfs rounds its size.
    cap: Option<u64>,
    /// `max_bytes` as configured.
    max_bytes: Option<u64>,
    /// Under a cap, what inodes and extended attributes may take ([`inode_space`]), and
    /// what they take: tmpfs's `nr_inodes` budget, kept the same way.
    inode_space: Option<u64>,
    inode_space_used: u64,
}

/// What one inode takes of a capped route's inode budget (tmpfs's `BOGO_INODE_SIZE`).
pub const INODE_SPACE: u64 = 1024;

/// The inodes a route capped at `max_bytes` may hold (the private tmpfs's `nr_inodes`): one
/// per 2 KiB of the cap, at least 4,096. Without it, names cost no bytes: a 1 MiB route took
/// 20,000 empty files and 20 MB of extended attributes, all in the host's memory.
pub fn inode_limit(max_bytes: u64) -> u64 {
    (max_bytes / 2048).max(4096)
}

/// What an extended attribute takes of the inode budget (the kernel's `simple_xattr_space`).
fn xattr_space(name: &str, size: usize) -> u64 {
    (40 + name.len() + 1 + size) as u64
}

struct Node {
    kind: FileKind,
    perm: u16,
    uid: u32,
    gid: u32,
    nlink: u32,
    /// Reads refresh it under the tree's read lock, hence its own small lock.
    atime: Mutex<SystemTime>,
    mtime: SystemTime,
    ctime: SystemTime,
    crtime: SystemTime,
    /// Open handles. The node outlives its last name until this reaches zero. Atomic so that
    /// `open` needs only the read lock; it is decremented (and the node freed) under the write
    /// lock, which excludes concurrent opens.
    open: AtomicU32,
    xattrs: BTreeMap<String, Vec<u8>>,
    body: Body,
}

enum Body {
    File(Pages),
    Dir(BTreeMap<String, u64>),
    Symlink(Vec<u8>),
    /// Fifos, sockets and devices: nothing but attributes and a device number.
    Special(u32),
}

fn err(errno: Errno, path: &str) -> FsError {
    FsError::new(errno, path.to_string())
}

fn check_name(name: &str, path: &str) -> FsResult<()> {
    if name.len() > NAME_MAX {
        return Err(err(Errno::ENAMETOOLONG, path));
    }
    Ok(())
}

impl Node {
    /// A node created now; `Tree::add` sets its owner.
    fn new(kind: FileKind, perm: u16, body: Body) -> Node {
        let now = SystemTime::now();
        Node {
            kind,
            perm,
            uid: 0,
            gid: 0,
            nlink: if kind == FileKind::Dir { 2 } else { 1 },
            atime: Mutex::new(now),
            mtime: now,
            ctime: now,
            crtime: now,
            open: AtomicU32::new(0),
            xattrs: BTreeMap::new(),
            body,
        }
    }

    /// A regular file's contents; other kinds fail as read(2) and truncate(2) do.
    fn file(&self) -> FsResult<&Pages> {
        match &self.body {
            Body::File(c) => Ok(c),
            Body::Dir(_) => Err(Errno::EISDIR.into()),
            _ => Err(Errno::EINVAL.into()),
        }
    }

    /// Pages this node charges against the size cap: those its contents allocated, or one for
    /// a symlink target too long to live in the inode.
    fn charged(&self) -> u64 {
        match &self.body {
            Body::File(c) => c.allocated(),
            Body::Symlink(t) => u64::from(t.len() > INLINE_SYMLINK_MAX),
            Body::Dir(_) | Body::Special(_) => 0,
        }
    }

    fn size(&self) -> u64 {
        match &self.body {
            Body::File(c) => c.len(),
            Body::Symlink(t) => t.len() as u64,
            Body::Dir(_) => DIR_SIZE,
            Body::Special(_) => 0,
        }
    }

    fn pages_mut(&mut self) -> &mut Pages {
        match &mut self.body {
            Body::File(c) => c,
            _ => unreachable!("pages_mut on a non-file"),
        }
    }

    fn entries(&self) -> Option<&BTreeMap<String, u64>> {
        match &self.body {
            Body::Dir(e) => Some(e),
            _ => None,
        }
    }

    fn entries_mut(&mut self) -> &mut BTreeMap<String, u64> {
        match &mut self.body {
            Body::Dir(e) => e,
            _ => unreachable!("entries_mut on a non-directory"),
        }
    }

    /// relatime, Linux's default: cheap, yet `atime > mtime` still tells "read since written".
    fn touch_atime(&self, now: SystemTime) {
        let mut atime = self.atime.lock();
        let stale = now.duration_since(*atime).is_ok_and(|d| d >= ATIME_REFRESH);
        if *atime <= self.mtime || *atime <= self.ctime || stale {
            *atime = now;
        }
    }

    /// mtime and ctime: a directory's entries or a file's data changed.
    fn touch_modified(&mut self, now: SystemTime) {
        self.mtime = now;
        self.ctime = now;
    }
}

impl Tree {
    fn node(&self, ino: u64) -> &Node {
        &self.nodes[&ino]
    }

    fn node_mut(&mut self, ino: u64) -> &mut Node {
        self.nodes.get_mut(&ino).expect("inode in table")
    }

    fn child(&self, dir: u64, name: &str) -> Option<u64> {
        self.node(dir).entries().and_then(|e| e.get(name).copied())
    }

    fn lookup(&self, path: &str) -> FsResult<u64> {
        let mut ino = ROOT;
        if path.is_empty() {
            return Ok(ino);
        }
        for name in path.split('/') {
            check_name(name, path)?;
            let entries = self.node(ino).entries().ok_or_else(|| err(Errno::ENOTDIR, path))?;
            ino = *entries.get(name).ok_or_else(|| err(Errno::ENOENT, path))?;
        }
        Ok(ino)
    }

    /// The directory that holds `path`'s last component, and that component. `on_root` is
    /// the error for operations aimed at the route root itself, which has no parent here.
    fn lookup_parent<'p>(&self, path: &'p str, on_root: Errno) -> FsResult<(u64, &'p str)> {
        if path.is_empty() {
            return Err(err(on_root, path));
        }
        let (parent, name) = split_parent(path);
        let dir = self.lookup(parent)?;
        if self.node(dir).kind != FileKind::Dir {
            return Err(err(Errno::ENOTDIR, path));
        }
        check_name(name, path)?;
        Ok((dir, name))
    }

    /// The parent and name for a new entry at `path`, which must not exist yet.
    fn lookup_new<'p>(&self, path: &'p str) -> FsResult<(u64, &'p str)> {
        let (dir, name) = self.lookup_parent(path, Errno::EEXIST)?;
        if self.child(dir, name).is_some() {
            return Err(err(Errno::EEXIST, path));
        }
        Ok((dir, name))
    }

    fn attr(&self, ino: u64) -> Attr {
        let n = self.node(ino);
        Attr {
            ino,
            kind: n.kind,
            perm: n.perm,
            size: n.size(),
            blocks: n.charged() * (PAGE / 512),
            nlink: n.nlink,
            uid: n.uid,
            gid: n.gid,
            rdev: match n.body {
                Body::Special(rdev) => rdev,
                _ => 0,
            },
            blksize: BLOCK_SIZE as u32,
            atime: *n.atime.lock(),
            mtime: n.mtime,
            ctime: n.ctime,
            crtime: n.crtime,
        }
    }

    /// Sets a regular file's length. Growth is a hole and allocates nothing; shrinking frees
    /// the pages past the new end at once.
    fn set_len(&mut self, ino: u64, len: u64) -> FsResult<()> {
        self.node(ino).file()?;
        if len > MAX_FILE_SIZE {
            return Err(Errno::EFBIG.into());
        }
        let freed = self.node_mut(ino).pages_mut().set_len(len);
        self.used -= freed;
        Ok(())
    }

    /// Pages that may still be allocated (`u64::MAX` without a cap).
    fn free_pages(&self) -> u64 {
        self.cap.map_or(u64::MAX, |cap| cap.saturating_sub(self.used))
    }

    /// Fails with ENOSPC unless `pages` more pages fit under the cap.
    /// Takes `bytes` of the inode budget, or ENOSPC (as tmpfs answers) when it is spent.
    fn take_inode_space(&mut self, bytes: u64) -> FsResult<()> {
        if self.inode_space.is_some_and(|budget| self.inode_space_used + bytes > budget) {
            return Err(FsError::new(Errno::ENOSPC, "memory backend inode limit reached"));
        }
        self.inode_space_used += bytes;
        Ok(())
    }

    fn check_cap(&self, pages: u64) -> FsResult<()> {
        match pages > self.free_pages() {
            true => Err(FsError::new(Errno::ENOSPC, "memory backend size cap reached")),
            false => Ok(()),
        }
    }

    /// Writes `data` at `offset` of a regular file, as much of it as the cap lets it allocate
    /// pages for (in order, as tmpfs does): the bytes written, or ENOSPC when none fit.
    fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> FsResult<usize> {
        let end =
            offset.checked_add(data.len() as u64).filter(|&end| end <= MAX_FILE_SIZE).ok_or(Errno::EFBIG)?;
        let free = self.free_pages();
        let fits = self.node(ino).file()?.fitting_end(offset, end, free);
        if fits == offset && !data.is_empty() {
            return Err(FsError::new(Errno::ENOSPC, "memory backend size cap reached"));
        }
        let written = (fits - offset) as usize;
        let n = self.node_mut(ino);
        let allocated = n.pages_mut().write(offset, &data[..written]);
        n.touch_modified(SystemTime::now());
        self.used += allocated;
        Ok(written)
    }

    /// Links a new node into `parent`. It belongs to `caller`, with the group (and, for
    /// directories, the set-group-ID bit) taken from a set-group-ID parent as POSIX prescribes.
    fn add(&mut self, parent: u64, name: &str, mut node: Node, caller: &Caller) -> u64 {
        let (now, ino) = (SystemTime::now(), self.next_ino);
        self.next_ino += 1;
        (*node.atime.get_mut(), node.mtime, node.ctime, node.crtime) = (now, now, now, now);
        self.used += node.charged();
        let p = self.node_mut(parent);
        node.uid = caller.uid;
        node.gid = caller.gid;
        if p.perm & S_ISGID != 0 {
            node.gid = p.gid;
            if node.kind == FileKind::Dir {
                node.perm |= S_ISGID;
            }
        }
        if node.kind == FileKind::Dir {
            p.nlink += 1;
        }
        p.entries_mut().insert(name.to_string(), ino);
        p.touch_modified(now);
        self.nodes.insert(ino, node);
        ino
    }

    /// Takes one name from a non-directory: a name past the last gives its inode share back
    /// (the last one's goes when the node is freed), as tmpfs's `shmem_unlink` does.
    fn drop_name(&mut self, ino: u64) {
        let n = self.node_mut(ino);
        n.nlink -= 1;
        if n.nlink > 0 {
            self.inode_space_used -= INODE_SPACE;
        }
    }

    /// Frees a node that has neither names nor open handles, releasing its bytes.
    fn maybe_free(&mut self, ino: u64) {
        let n = self.node(ino);
        if n.nlink == 0 && n.open.load(Ordering::Acquire) == 0 {
            let n = self.nodes.remove(&ino).expect("inode in table");
            self.used -= n.charged();
            let xattrs: u64 = n.xattrs.iter().map(|(name, value)| xattr_space(name, value.len())).sum();
            self.inode_space_used -= INODE_SPACE + xattrs;
        }
    }

    fn setattr(&mut self, ino: u64, changes: &SetAttr, now: SystemTime) -> FsResult<Attr> {
        if changes.is_empty() {
            return Ok(self.attr(ino));
        }
        // The only change that can fail goes first, so a failure changes nothing.
        if let Some(size) = changes.size {
            self.set_len(ino, size)?;
        }
        let n = self.node_mut(ino);
        if let Some(mode) = changes.mode {
            n.perm = (mode & 0o7777) as u16;
        }
        if let Some(uid) = changes.uid {
            n.uid = uid;
        }
        if let Some(gid) = changes.gid {
            n.gid = gid;
        }
        if changes.size.is_some() {
            n.mtime = now;
        }
        let resolve = |t: TimeSet| match t {
            TimeSet::Now => now,
            TimeSet::At(t) => t,
        };
        if let Some(t) = changes.atime {
            *n.atime.get_mut() = resolve(t);
        }
        if let Some(t) = changes.mtime {
            n.mtime = resolve(t);
        }
        n.ctime = now;
        Ok(self.attr(ino))
    }

    fn rename(&mut self, from: &str, to: &str, flags: u32, now: SystemTime) -> FsResult<()> {
        let noreplace = flags & RENAME_NOREPLACE != 0;
        let exchange = flags & RENAME_EXCHANGE != 0;
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0 || (noreplace && exchange) {
            return Err(Errno::EINVAL.into());
        }
        // The checks below follow the order of Linux's do_renameat2 and vfs_rename, so that
        // when several errors apply the kernel's choice is the one reported.
        if to.is_empty() && noreplace && !from.is_empty() {
            return Err(err(Errno::EEXIST, to));
        }
        let (fdir, fname) = self.lookup_parent(from, Errno::EBUSY)?;
        let (tdir, tname) = self.lookup_parent(to, Errno::EBUSY)?;
        let src = self.child(fdir, fname).ok_or_else(|| err(Errno::ENOENT, from))?;
        let dst = self.child(tdir, tname);
        if noreplace && dst.is_some() {
            return Err(err(Errno::EEXIST, to));
        }
        if exchange && dst.is_none() {
            return Err(err(Errno::ENOENT, to));
        }
        let beneath =
            |a: &str, b: &str| a.len() > b.len() && a.starts_with(b) && a.as_bytes()[b.len()] == b'/';
        if beneath(to, from) {
            return Err(err(Errno::EINVAL, to));
        }
        if beneath(from, to) {
            let errno = if exchange { Errno::EINVAL } else { Errno::ENOTEMPTY };
            return Err(err(errno, to));
        }
        if dst == Some(src) {
            // Two names of one node: POSIX says do nothing and succeed.
            return Ok(());
        }
        let src_dir = self.node(src).kind == FileKind::Dir;
        let dst_dir = dst.is_some_and(|d| self.node(d).kind == FileKind::Dir);
        if let (Some(d), false) = (dst, exchange) {
            if src_dir && !dst_dir {
                return Err(err(Errno::ENOTDIR, to));
            }
            if !src_dir && dst_dir {
                return Err(err(Errno::EISDIR, to));
            }
            if dst_dir && !self.node(d).entries().is_some_and(|e| e.is_empty()) {
                return Err(err(Errno::ENOTEMPTY, to));
            }
        }

        // Everything is checked; from here on nothing fails.
        if exchange {
            let dst = dst.expect("checked above");
            self.node_mut(fdir).entries_mut().insert(fname.to_string(), dst);
            self.node_mut(tdir).entries_mut().insert(tname.to_string(), src);
            if fdir != tdir && src_dir != dst_dir {
                // A directory changed parents: move its `..` link along.
                let (lose, gain) = if src_dir { (fdir, tdir) } else { (tdir, fdir) };
                self.node_mut(lose).nlink -= 1;
                self.node_mut(gain).nlink += 1;
            }
            self.node_mut(dst).ctime = now;
        } else {
            if let Some(d) = dst {
                let victim = self.node_mut(d);
                victim.ctime = now;
                if dst_dir {
                    victim.nlink = 0;
                    self.node_mut(tdir).nlink -= 1;
                } else {
                    self.drop_name(d);
                }
            }
            self.node_mut(fdir).entries_mut().remove(fname);
            self.node_mut(tdir).entries_mut().insert(tname.to_string(), src);
            if src_dir && fdir != tdir {
                self.node_mut(fdir).nlink -= 1;
                self.node_mut(tdir).nlink += 1;
            }
            if let Some(d) = dst {
                self.maybe_free(d);
            }
        }
        self.node_mut(src).ctime = now;
        self.node_mut(fdir).touch_modified(now);
        self.node_mut(tdir).touch_modified(now);
        Ok(())
    }
}

impl MemoryBackend {
    /// An empty tree whose root belongs to the daemon. `size_cap` bounds the bytes allocated
    /// (whole pages of file data written or reserved, and long symlink targets), rounded up to
    /// whole pages; `None` means only host memory bounds them.
    pub fn new(size_cap: Option<u64>) -> MemoryBackend {
        let me = Caller::daemon();
        let mut root = Node::new(FileKind::Dir, 0o755, Body::Dir(BTreeMap::new()));
        (root.uid, root.gid) = (me.uid, me.gid);
        // As the private tmpfs is given `max(1)` bytes (its size 0 would mean unlimited).
        let cap = size_cap.map(|bytes| bytes.max(1).div_ceil(PAGE));
        let nodes = HashMap::from([(ROOT, root)]);
        let inode_space = size_cap.map(|bytes| inode_limit(bytes) * INODE_SPACE);
        let tree = Tree {
            nodes,
            next_ino: ROOT + 1,
            used: 0,
            cap,
            max_bytes: size_cap,
            inode_space,
            inode_space_used: INODE_SPACE,
        };
        MemoryBackend { tree: Arc::new(RwLock::new(tree)) }
    }

    fn handle(&self, ino: u64, flags: i32) -> Box<dyn OpenFile> {
        MemFile::boxed(&self.tree, ino, flags)
    }

    /// Links `node` in at `path`, charging its bytes against the cap. An `opened` node starts
    /// with one open handle, taken under the same lock so no unlink can free it first.
    fn make(&self, path: &str, node: Node, caller: &Caller, opened: bool) -> FsResult<(Attr, u64)> {
        let mut t = self.tree.write();
        let (dir, name) = t.lookup_new(path)?;
        t.check_cap(node.charged())?;
        t.take_inode_space(INODE_SPACE)?;
        node.open.store(u32::from(opened), Ordering::Release);
        let ino = t.add(dir, name, node, caller);
        Ok((t.attr(ino), ino))
    }
}

impl Backend for MemoryBackend {
    fn describe(&self) -> String {
        match self.tree.read().max_bytes {
            Some(cap) => format!("memory (cap {cap} bytes)"),
            None => "memory".to_string(),
        }
    }

    fn getattr(&self, path: &str) -> FsResult<Attr> {
        let t = self.tree.read();
        Ok(t.attr(t.lookup(path)?))
    }

    fn readdir(&self, path: &str) -> FsResult<Vec<DirEntry>> {
        let t = self.tree.read();
        let dir = t.node(t.lookup(path)?);
        let entries = dir.entries().ok_or_else(|| err(Errno::ENOTDIR, path))?;
        let list = entries
            .iter()
            .map(|(name, &ino)| DirEntry { name: name.clone(), kind: t.node(ino).kind })
            .collect();
        dir.touch_atime(SystemTime::now());
        Ok(list)
    }

    fn open(&self, path: &str, flags: i32) -> FsResult<Box<dyn OpenFile>> {
        let ino = {
            let t = self.tree.read();
            let ino = t.lookup(path)?;
            let n = t.node(ino);
            match n.kind {
                FileKind::Dir if flags & libc::O_ACCMODE != libc::O_RDONLY => {
                    return Err(err(Errno::EISDIR, path))
                }
                // Backends never follow symlinks; opening one is what O_NOFOLLOW reports.
                FileKind::Symlink => return Err(err(Errno::ELOOP, path)),
                _ => {}
            }
            n.open.fetch_add(1, Ordering::AcqRel);
            ino
        };
        // Built after the lock is released: dropping a handle takes the write lock.
        Ok(self.handle(ino, flags))
    }

    fn create(
        &self,
        path: &str,
        mode: u32,
        flags: i32,
        caller: &Caller,
    ) -> FsResult<(Attr, Box<dyn OpenFile>)> {
        let node = Node::new(FileKind::File, (mode & 0o7777) as u16, Body::File(Pages::default()));
        let (attr, ino) = self.make(path, node, caller, true)?;
        Ok((attr, self.handle(ino, flags)))
    }

    fn mknod(&self, path: &str, mode: u32, rdev: u32, caller: &Caller) -> FsResult<Attr> {
        // Like mknod(2): a zero type means a regular file; directories need mkdir.
        let kind = match mode & libc::S_IFMT {
            0 => FileKind::File,
            fmt => FileKind::from_mode(fmt).ok_or_else(|| err(Errno::EINVAL, path))?,
        };
        let body = match kind {
            FileKind::Dir => return Err(err(Errno::EPERM, path)),
            FileKind::Symlink => return Err(err(Errno::EINVAL, path)),
            FileKind::File => Body::File(Pages::default()),
            FileKind::CharDevice | FileKind::BlockDevice => Body::Special(rdev),
            FileKind::Fifo | FileKind::Socket => Body::Special(0),
        };
        let node = Node::new(kind, (mode & 0o7777) as u16, body);
        Ok(self.make(path, node, caller, false)?.0)
    }

    fn mkdir(&self, path: &str, mode: u32, caller: &Caller) -> FsResult<Attr> {
        // mkdir(2) ignores set-user-ID and set-group-ID in `mode`; only the parent grants S_ISGID.
        let node = Node::new(FileKind::Dir, (mode & 0o1777) as u16, Body::Dir(BTreeMap::new()));
        Ok(self.make(path, node, caller, false)?.0)
    }

    fn symlink(&self, path: &str, target: &[u8], caller: &Caller) -> FsResult<Attr> {
        if target.is_empty() {
            return Err(err(Errno::ENOENT, path));
        }
        if target.len() >= PATH_MAX {
            return Err(err(Errno::ENAMETOOLONG, path));
        }
        let node = Node::new(FileKind::Symlink, 0o777, Body::Symlink(target.to_vec()));
        Ok(self.make(path, node, caller, false)?.0)
    }

    fn link(&self, existing: &str, new_path: &str) -> FsResult<Attr> {
        // Times are taken under the lock so that a directory's mtime never runs backwards.
        let mut t = self.tree.write();
        let now = SystemTime::now();
        let ino = t.lookup(existing)?;
        let (dir, name) = t.lookup_new(new_path)?;
        if t.node(ino).kind == FileKind::Dir {
            return Err(err(Errno::EPERM, existing));
        }
        // Each name past the first takes an inode's share, as tmpfs's `shmem_link` reserves.
        if t.node(ino).nlink > 0 {
            t.take_inode_space(INODE_SPACE)?;
        }
        let p = t.node_mut(dir);
        p.entries_mut().insert(name.to_string(), ino);
        p.touch_modified(now);
        let n = t.node_mut(ino);
        n.nlink += 1;
        n.ctime = now;
        Ok(t.attr(ino))
    }

    fn readlink(&self, path: &str) -> FsResult<Vec<u8>> {
        let t = self.tree.read();
        let n = t.node(t.lookup(path)?);
        match &n.body {
            Body::Symlink(target) => {
                n.touch_atime(SystemTime::now());
                Ok(target.clone())
            }
            _ => Err(err(Errno::EINVAL, path)),
        }
    }

    fn unlink(&self, path: &str) -> FsResult<()> {
        let mut t = self.tree.write();
        let now = SystemTime::now();
        let (dir, name) = t.lookup_parent(path, Errno::EISDIR)?;
        let ino = t.child(dir, name).ok_or_else(|| err(Errno::ENOENT, path))?;
        if t.node(ino).kind == FileKind::Dir {
            return Err(err(Errno::EISDIR, path));
        }
        let p = t.node_mut(dir);
        p.entries_mut().remove(name);
        p.touch_modified(now);
        t.drop_name(ino);
        t.node_mut(ino).ctime = now;
        t.maybe_free(ino);
        Ok(())
    }

    fn rmdir(&self, path: &str) -> FsResult<()> {
        let mut t = self.tree.write();
        let now = SystemTime::now();
        let (dir, name) = t.lookup_parent(path, Errno::EBUSY)?;
        let ino = t.child(dir, name).ok_or_else(|| err(Errno::ENOENT, path))?;
        match t.node(ino).entries() {
            None => return Err(err(Errno::ENOTDIR, path)),
            Some(e) if !e.is_empty() => return Err(err(Errno::ENOTEMPTY, path)),
            Some(_) => {}
        }
        let p = t.node_mut(dir);
        p.entries_mut().remove(name);
        p.nlink -= 1;
        p.touch_modified(now);
        let n = t.node_mut(ino);
        n.nlink = 0;
        n.ctime = now;
        t.maybe_free(ino);
        Ok(())
    }

    fn rename(&self, from: &str, to: &str, flags: u32) -> FsResult<()> {
        self.tree.write().rename(from, to, flags, SystemTime::now())
    }

    fn setattr(&self, path: &str, changes: &SetAttr) -> FsResult<Attr> {
        let mut t = self.tree.write();
        let ino = t.lookup(path)?;
        t.setattr(ino, changes, SystemTime::now())
    }

    fn statfs(&self, path: &str) -> FsResult<StatFs> {
        let t = self.tree.read();
        t.lookup(path)?;
        let blocks = t.cap.unwrap_or(UNCAPPED_BLOCKS);
        let bfree = blocks.saturating_sub(t.used);
        // Under a cap, what tmpfs reports: its inode limit, and what is left of the budget.
        let (files, ffree) = match t.inode_space {
            Some(budget) => (budget / INODE_SPACE, budget.saturating_sub(t.inode_space_used) / INODE_SPACE),
            None => (MAX_FILES, MAX_FILES.saturating_sub(t.nodes.len() as u64)),
        };
        Ok(StatFs {
            blocks,
            bfree,
            bavail: bfree,
            files,
            ffree,
            bsize: BLOCK_SIZE as u32,
            namelen: NAME_MAX as u32,
            frsize: BLOCK_SIZE as u32,
        })
    }

    fn getxattr(&self, path: &str, name: &str) -> FsResult<Vec<u8>> {
        check_xattr_name(name)?;
        let t = self.tree.read();
        let n = t.node(t.lookup(path)?);
        n.xattrs.get(name).cloned().ok_or_else(|| Errno::ENODATA.into())
    }

    fn listxattr(&self, path: &str) -> FsResult<Vec<u8>> {
        let t = self.tree.read();
        let n = t.node(t.lookup(path)?);
        let mut out = Vec::new();
        for name in n.xattrs.keys() {
            out.extend_from_slice(name.as_bytes());
            out.push(0);
        }
        Ok(out)
    }

    fn setxattr(&self, path: &str, name: &str, value: &[u8], flags: i32) -> FsResult<()> {
        if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 {
            return Err(Errno::EINVAL.into());
        }
        check_xattr_name(name)?;
        if value.len() > XATTR_SIZE_MAX {
            return Err(Errno::E2BIG.into());
        }
        let mut t = self.tree.write();
        let ino = t.lookup(path)?;
        let old = t.node(ino).xattrs.get(name).map(|v| xattr_space(name, v.len()));
        if old.is_some() && flags & XATTR_CREATE != 0 {
            return Err(Errno::EEXIST.into());
        }
        if old.is_none() && flags & XATTR_REPLACE != 0 {
            return Err(Errno::ENODATA.into());
        }
        // The new value is charged before the old one is given back, as tmpfs does.
        t.take_inode_space(xattr_space(name, value.len()))?;
        t.inode_space_used -= old.unwrap_or(0);
        let n = t.node_mut(ino);
        n.xattrs.insert(name.to_string(), value.to_vec());
        n.ctime = SystemTime::now();
        Ok(())
    }

    fn removexattr(&self, path: &str, name: &str) -> FsResult<()> {
        check_xattr_name(name)?;
        let mut t = self.tree.write();
        let ino = t.lookup(path)?;
        let n = t.node_mut(ino);
        let value = n.xattrs.remove(name).ok_or(Errno::ENODATA)?;
        n.ctime = SystemTime::now();
        t.inode_space_used -= xattr_space(name, value.len());
        Ok(())
    }
}

/// Linux rejects empty and over-long attribute names with ERANGE, and names outside the
/// namespaces the store keeps as [`check_xattr_namespace`] says.
fn check_xattr_name(name: &str) -> FsResult<()> {
    if name.is_empty() || name.len() > XATTR_NAME_MAX {
        return Err(Errno::ERANGE.into());
    }
    check_xattr_namespace(name)
}

#[cfg(test)]
#[path = "memory_tests.rs"]
mod tests;
