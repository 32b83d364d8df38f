//! The storage interface every route's backend implements (host directory, memory, sqlite).
//!
//! Backends see **route-relative paths**: `""` is the route's root, `"a/b"` an entry beneath it,
//! always normalised (no `.`/`..`/empty components) and already approved by the policy gate.
//! A backend never judges rules and never follows a symlink on its own; it stores and serves.
//!
//! Permission bits are enforced by the kernel (`default_permissions`), so backends only record
//! ownership and modes. What they must get right is POSIX bookkeeping: ownership of new nodes
//! (the caller's uid; the caller's gid, or the parent's when the parent is set-group-ID, in which
//! case a new directory inherits the bit), link counts, and times (`mtime`/`ctime` of a parent on
//! every entry change, `ctime` on every attribute change, `mtime`/`ctime` on data writes).

pub mod chunks;
pub mod host;
pub mod memory;
pub mod postgres;
pub mod sqlite;
#[cfg(test)]
pub mod suite;
#[cfg(test)]
pub mod test_file;
pub mod tree;

use std::os::fd::BorrowedFd;
use std::time::SystemTime;

use crate::error::{Errno, FsError, FsResult};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl FileKind {
    /// The kind encoded in the `S_IFMT` bits of a mode.
    pub fn from_mode(mode: u32) -> Option<FileKind> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => FileKind::File,
            libc::S_IFDIR => FileKind::Dir,
            libc::S_IFLNK => FileKind::Symlink,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDevice,
            libc::S_IFBLK => FileKind::BlockDevice,
            _ => return None,
        })
    }

    pub fn mode_bits(self) -> u32 {
        match self {
            FileKind::File => libc::S_IFREG,
            FileKind::Dir => libc::S_IFDIR,
            FileKind::Symlink => libc::S_IFLNK,
            FileKind::Fifo => libc::S_IFIFO,
            FileKind::Socket => libc::S_IFSOCK,
            FileKind::CharDevice => libc::S_IFCHR,
            FileKind::BlockDevice => libc::S_IFBLK,
        }
    }
}

/// Attributes of one node, as `stat` reports them. `ino` is the backend's own identity for the
/// node (hard links share it); the FUSE door assigns its own inode numbers.
#[derive(Clone, Debug, PartialEq)]
pub struct Attr {
    pub ino: u64,
    pub kind: FileKind,
    /// Permission bits including set-user-ID, set-group-ID and sticky (`mode & 0o7777`).
    pub perm: u16,
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub crtime: SystemTime,
}

impl Attr {
    /// Attributes that reveal nothing: for an entry that is listed but may not be read
    /// (a deny rule with `hide = false`).
    pub fn placeholder(kind: FileKind) -> Attr {
        let epoch = SystemTime::UNIX_EPOCH;
        Attr {
            ino: 0,
            kind,
            perm: 0,
            size: 0,
            blocks: 0,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            atime: epoch,
            mtime: epoch,
            ctime: epoch,
            crtime: epoch,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    pub kind: FileKind,
}

/// The process on whose behalf an operation runs (from the FUSE request header, or the
/// daemon's own identity for tool calls).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl Caller {
    pub fn daemon() -> Caller {
        Caller {
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
            pid: std::process::id(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSet {
    Now,
    At(SystemTime),
}

impl TimeSet {
    pub fn resolve(self) -> SystemTime {
        match self {
            TimeSet::Now => SystemTime::now(),
            TimeSet::At(t) => t,
        }
    }
}

/// The attribute changes of one `setattr` (chmod, chown, truncate, utimens). Fields that are
/// `None` stay as they are. `mode` holds permission bits only (`& 0o7777`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
}

impl SetAttr {
    pub fn is_empty(&self) -> bool {
        *self == SetAttr::default()
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// A change another daemon made to a shared backend's tree (route-relative path), for the
/// kernel's caches of this daemon's mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemoteChange {
    /// The name came, went or leads to another node now.
    Name(String),
    /// The content or attributes of the node at the path changed.
    Content(String),
    /// The content or attributes of the file with backend inode `ino` changed. `path` is
    /// the name its writer opened it by, which may lead elsewhere by now (or nowhere).
    FileContent { ino: u64, path: String },
    /// Anything may have changed (changes were missed).
    Everything,
}

/// `rename` flags, as in renameat2(2).
pub const RENAME_NOREPLACE: u32 = 1;
pub const RENAME_EXCHANGE: u32 = 2;

/// An open file. Reads and writes go through it without path lookups, so a file stays usable
/// after it is renamed or unlinked, as POSIX requires.
pub trait OpenFile: Send + Sync {
    fn read(&self, offset: u64, size: u32) -> FsResult<Vec<u8>>;
    /// Writes all of `data` at `offset` (extending the file as needed) and returns its length.
    fn write(&self, offset: u64, data: &[u8]) -> FsResult<u32>;
    /// Writes back pages of the kernel's cache (`FUSE_WRITE_CACHE`: a store through `mmap`):
    /// `data` belongs at `offset` whatever the handle's open flags, since the kernel sends it
    /// on any handle of the file that writes, an `O_APPEND` one included.
    fn write_back(&self, offset: u64, data: &[u8]) -> FsResult<u32> {
        self.write(offset, data)
    }
    /// Called on every `close()` of a descriptor. After it returns, what was written is durable
    /// for backends that promise durability (sqlite).
    fn flush(&self) -> FsResult<()>;
    /// Whether `flush` has anything to do. When it has not (writes already reached the store),
    /// the kernel is told to skip the flush request on every `close()`.
    fn needs_flush(&self) -> bool {
        true
    }
    fn fsync(&self, datasync: bool) -> FsResult<()>;
    /// Called once the last descriptor of this open file is gone (FUSE release): commits what
    /// is still buffered. A backend that cannot store it drops it (so that what is shown stays
    /// what is stored) and says so in the error, for the caller to log which file lost what.
    fn release(&self) -> FsResult<()> {
        self.flush()
    }
    fn fallocate(&self, offset: u64, length: u64, mode: i32) -> FsResult<()>;
    fn getattr(&self) -> FsResult<Attr>;
    /// What the file's identity is made of: its kind and its backend inode number (as in
    /// [`Attr`]). A backend that knows them without asking its store overrides it.
    fn kind_and_ino(&self) -> FsResult<(FileKind, u64)> {
        self.getattr().map(|a| (a.kind, a.ino))
    }
    /// `ftruncate`, `fchmod` and friends on the open file.
    fn setattr(&self, changes: &SetAttr) -> FsResult<Attr>;
    /// The same file opened anew with the kernel's open `flags`, as through `/proc/PID/fd/N`:
    /// how a file is opened once every name of it is gone.
    fn reopen(&self, flags: i32) -> FsResult<Box<dyn OpenFile>>;
    /// A host file the kernel may serve reads and writes from directly (FUSE passthrough).
    /// Only backends whose data lives in a real file return one.
    fn backing(&self) -> Option<BackingFile<'_>> {
        None
    }
    /// For a file without a backing file whose content changes only through this daemon
    /// (every other change reaches the kernel as an invalidation): its attributes as the
    /// store held them when it was opened, which tell its versions apart by size, mtime and
    /// ctime. The door then keeps the file's pages in the kernel across opens, and stores a
    /// small one there at its first open instead of answering a read per page (see
    /// `fuse::page_cache`). `None`: the kernel keeps the pages as its own checks allow.
    fn opened_version(&self) -> Option<&Attr> {
        None
    }
}

/// The host file behind an [`OpenFile`], as it was opened: what the door needs to pass it to
/// the kernel without asking the host again.
pub struct BackingFile<'a> {
    pub fd: BorrowedFd<'a>,
    /// The flags the descriptor was opened with. Its access mode and `O_DIRECT`/`O_SYNC`/
    /// `O_DSYNC` (what decides whether other handles may share it) never change; other
    /// status flags may have since.
    pub flags: i32,
    /// The descriptor's `fstat`, taken once, in the request that opened it (the door passes a
    /// file on in that request): its type and identity hold for good, its size and times as
    /// of that open.
    pub opened: &'a libc::stat,
}

/// One route's storage. All paths are route-relative (see the module docs).
pub trait Backend: Send + Sync {
    /// A short description for status output: `host /home/me/project`, `memory`, ...
    fn describe(&self) -> String;
    fn getattr(&self, path: &str) -> FsResult<Attr>;
    /// The attributes as the store holds them at this moment, for checks that must see every
    /// daemon's changes (the tools' stale-version check). Backends that answer `getattr` from
    /// a cache that other daemons' changes reach a moment later override it.
    fn getattr_stored(&self, path: &str) -> FsResult<Attr> {
        self.getattr(path)
    }
    /// The kind and inode number of the node at `path`: what tells whether a name still leads
    /// to the node the kernel knows it by. Backends that know it without a full `getattr`
    /// (from a cache kept as fresh as the kernel's) override it.
    fn kind_and_ino(&self, path: &str) -> FsResult<(FileKind, u64)> {
        self.getattr(path).map(|a| (a.kind, a.ino))
    }
    /// The attributes of several entries of one directory (for readdirplus). Backends that
    /// can do better than one `getattr` per name (resolving the directory once) override it.
    fn getattr_entries(&self, dir: &str, names: &[&str]) -> Vec<FsResult<Attr>> {
        names
            .iter()
            .map(|name| {
                self.getattr(&if dir.is_empty() { name.to_string() } else { format!("{dir}/{name}") })
            })
            .collect()
    }
    /// The entries of a directory, without `.` and `..`, in any order.
    fn readdir(&self, path: &str) -> FsResult<Vec<DirEntry>>;
    /// Opens an existing node. `flags` are open(2) flags; `O_CREAT`/`O_EXCL`/`O_TRUNC` are not
    /// set here (the kernel sends creation and truncation separately).
    fn open(&self, path: &str, flags: i32) -> FsResult<Box<dyn OpenFile>>;
    /// Creates a regular file (EEXIST if the name exists) and opens it. `mode` has permission
    /// bits with the umask already applied.
    fn create(
        &self,
        path: &str,
        mode: u32,
        flags: i32,
        caller: &Caller,
    ) -> FsResult<(Attr, Box<dyn OpenFile>)>;
    /// Creates a node of any kind but directories and symlinks; `mode` includes `S_IFMT`.
    fn mknod(&self, path: &str, mode: u32, rdev: u32, caller: &Caller) -> FsResult<Attr>;
    fn mkdir(&self, path: &str, mode: u32, caller: &Caller) -> FsResult<Attr>;
    fn symlink(&self, path: &str, target: &[u8], caller: &Caller) -> FsResult<Attr>;
    /// Makes `new_path` another name of the node at `existing` (never a directory: EPERM).
    fn link(&self, existing: &str, new_path: &str) -> FsResult<Attr>;
    fn readlink(&self, path: &str) -> FsResult<Vec<u8>>;
    fn unlink(&self, path: &str) -> FsResult<()>;
    fn rmdir(&self, path: &str) -> FsResult<()>;
    /// renameat2(2) semantics within this backend, including `RENAME_NOREPLACE` and
    /// `RENAME_EXCHANGE`, replacing files and empty directories, and ENOTEMPTY / EISDIR /
    /// ENOTDIR / EINVAL (moving a directory beneath itself) as the kernel would report them.
    fn rename(&self, from: &str, to: &str, flags: u32) -> FsResult<()>;
    fn setattr(&self, path: &str, changes: &SetAttr) -> FsResult<Attr>;
    fn statfs(&self, path: &str) -> FsResult<StatFs>;
    /// Sends the store what this backend answered without it: the postgres route's name
    /// changes made while alone (its journal) and files it holds back. The tools call it
    /// before they report success, so that what they report is what a crash keeps.
    fn commit_pending(&self) -> FsResult<()> {
        Ok(())
    }

    /// `fsync` of a directory: makes the names in it (its creations, removals and renames)
    /// durable. Backends whose name changes are durable when they return have nothing to do.
    fn fsyncdir(&self, _path: &str) -> FsResult<()> {
        Ok(())
    }

    /// [`Backend::fsyncdir`] of each of `dirs` (what a tool call changed), skipping one that
    /// is gone (its removal is in its parent, which is among them). A store whose sync covers
    /// every directory at once does it once.
    fn fsyncdirs(&self, dirs: &[&str]) -> FsResult<()> {
        dirs.iter().try_for_each(|dir| match self.fsyncdir(dir) {
            Err(e) if e.is(Errno::ENOENT) || e.is(Errno::ENOTDIR) => Ok(()),
            other => other,
        })
    }

    fn getxattr(&self, _path: &str, _name: &str) -> FsResult<Vec<u8>> {
        Err(FsError::errno(Errno::ENODATA))
    }
    /// Attribute names, each followed by a NUL byte.
    fn listxattr(&self, _path: &str) -> FsResult<Vec<u8>> {
        Ok(Vec::new())
    }
    fn setxattr(&self, _path: &str, _name: &str, _value: &[u8], _flags: i32) -> FsResult<()> {
        Err(FsError::errno(Errno::ENOTSUP))
    }
    fn removexattr(&self, _path: &str, _name: &str) -> FsResult<()> {
        Err(FsError::errno(Errno::ENODATA))
    }

    /// Starts reporting to `report` the changes that others make to this backend's tree (a
    /// store shared by several daemons); a backend only this daemon changes ignores it.
    fn watch(&self, _report: Box<dyn Fn(RemoteChange) + Send + Sync>) {}
}

/// Whether a store of its own (memory, sqlite, postgres) keeps an extended attribute of this
/// name: as on tmpfs and ext4, those of the `user.`, `trusted.` and `security.` namespaces
/// (the kernel itself lets only a privileged caller reach `trusted.`). Another namespace, or
/// none, answers EOPNOTSUPP; a namespace's prefix alone, EINVAL.
pub fn check_xattr_namespace(name: &str) -> FsResult<()> {
    let rest = ["user.", "trusted.", "security."].iter().find_map(|prefix| name.strip_prefix(prefix));
    match rest {
        None => Err(FsError::errno(Errno::EOPNOTSUPP)),
        Some("") => Err(FsError::errno(Errno::EINVAL)),
        Some(_) => Ok(()),
    }
}

/// `name` in the directory `dir` (both route-relative, `dir` empty for the root): the
/// inverse of [`split_parent`].
pub fn join_child(dir: &str, name: &str) -> String {
    match dir {
        "" => name.to_string(),
        _ => format!("{dir}/{name}"),
    }
}

/// The last component of a route-relative path and its parent (`""` for the route root).
pub fn split_parent(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => ("", path),
    }
}
