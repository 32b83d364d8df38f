//! The host backend: a real directory, reached only through a root directory fd.
//!
//! Every access resolves its path with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS)` from the root fd and acts on the last component with an `*at`
//! call that does not follow symlinks. So `..`, absolute or relative symlinks, and symlinks
//! swapped in during a call can never lead outside the root, and the path the gate approved
//! is the path that is touched. Symlinks are served as symlinks; the kernel resolves them by
//! looking their targets up again through the mount, and so through the gate.

mod creds;
mod sys;
mod tmpfs;

pub use sys::reopen;

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::OnceLock;

use crate::backend::{
    split_parent, Attr, Backend, BackingFile, Caller, DirEntry, FileKind, OpenFile, SetAttr, StatFs,
};
use crate::error::{Errno, FsError, FsResult};
use creds::AsCaller;

pub struct HostBackend {
    /// What `describe` says: the host directory, or the private tmpfs.
    description: String,
    root: OwnedFd,
    /// The daemon's own files under the root (databases of sqlite routes and the audit log,
    /// relative paths): absent through this backend, so that no caller reads them raw or
    /// writes under SQLite's feet.
    hidden: Vec<String>,
}

impl HostBackend {
    pub fn new(root: &Path) -> FsResult<HostBackend> {
        let c = sys::cstr(&root.to_string_lossy())?;
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(FsError::new(Errno::last(), format!("host root {}", root.display())));
        }
        let root_fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        Ok(HostBackend { description: format!("host {}", root.display()), root: root_fd, hidden: Vec::new() })
    }

    /// This backend with `hidden` (paths relative to the root) left out: looking them up or
    /// opening them is ENOENT, creating them EACCES, they are missing from listings, and a
    /// directory holding one cannot be renamed (EBUSY).
    pub fn hiding(mut self, hidden: Vec<String>) -> HostBackend {
        self.hidden = hidden;
        self
    }

    fn check_visible(&self, path: &str) -> FsResult<()> {
        match self.hidden.iter().any(|h| h == path) {
            true => Err(FsError::new(Errno::ENOENT, "one of the daemon's own files")),
            false => Ok(()),
        }
    }

    /// For a name about to be made: EACCES where one of the daemon's own files lives.
    fn check_new(&self, path: &str) -> FsResult<()> {
        match self.hidden.iter().any(|h| h == path) {
            true => Err(FsError::new(Errno::EACCES, "one of the daemon's own files lives there")),
            false => Ok(()),
        }
    }

    /// A memory route's tree on a private tmpfs (see [`tmpfs`]). Needs CAP_SYS_ADMIN.
    pub fn private_tmpfs(max_bytes: Option<u64>) -> FsResult<HostBackend> {
        let description = match max_bytes {
            Some(cap) => format!("memory (private tmpfs, cap {cap} bytes)"),
            None => "memory (private tmpfs)".to_string(),
        };
        Ok(HostBackend { description, root: tmpfs::private_tmpfs(max_bytes)?, hidden: Vec::new() })
    }

    /// The directory holding `path`'s last component, and that component.
    fn parent<'a>(&self, path: &'a str) -> FsResult<(DirFd<'_>, &'a str)> {
        self.check_visible(path)?;
        let (parent, name) = split_parent(path);
        if parent.is_empty() {
            return Ok((DirFd::Root(self.root.as_fd()), name));
        }
        let fd = sys::open_beneath(self.root.as_fd(), parent, libc::O_PATH | libc::O_DIRECTORY, 0)?;
        Ok((DirFd::Owned(fd), name))
    }

    /// An O_PATH descriptor of the node itself (a symlink stays a symlink).
    fn node(&self, path: &str) -> FsResult<OwnedFd> {
        self.check_visible(path)?;
        sys::open_beneath(self.root.as_fd(), path, libc::O_PATH, 0)
    }

    fn stat_at(&self, dir: &DirFd<'_>, name: &str) -> FsResult<Attr> {
        Ok(sys::attr_from_stat(&sys::fstatat(dir.fd(), name)?))
    }
}

enum DirFd<'a> {
    Root(BorrowedFd<'a>),
    Owned(OwnedFd),
}

impl DirFd<'_> {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            DirFd::Root(fd) => *fd,
            DirFd::Owned(fd) => fd.as_fd(),
        }
    }
}

fn kind_of_dirent(d_type: u8) -> Option<FileKind> {
    Some(match d_type {
        libc::DT_REG => FileKind::File,
        libc::DT_DIR => FileKind::Dir,
        libc::DT_LNK => FileKind::Symlink,
        libc::DT_FIFO => FileKind::Fifo,
        libc::DT_SOCK => FileKind::Socket,
        libc::DT_CHR => FileKind::CharDevice,
        libc::DT_BLK => FileKind::BlockDevice,
        _ => return None,
    })
}

impl Backend for HostBackend {
    fn describe(&self) -> String {
        self.description.clone()
    }

    fn getattr(&self, path: &str) -> FsResult<Attr> {
        if path.is_empty() {
            return Ok(sys::attr_from_stat(&sys::fstat(self.root.as_fd())?));
        }
        // The node itself, in one resolution: a missing name (every LOOKUP before a create)
        // costs one `openat2` where the parent's descriptor took three calls.
        let node = self.node(path)?;
        Ok(sys::attr_from_stat(&sys::fstat(node.as_fd())?))
    }

    fn getattr_entries(&self, dir: &str, names: &[&str]) -> Vec<FsResult<Attr>> {
        // One resolution of the directory, then one fstatat per name relative to it.
        match sys::open_beneath(self.root.as_fd(), dir, libc::O_PATH | libc::O_DIRECTORY, 0) {
            Ok(fd) => names
                .iter()
                .map(|name| {
                    if !self.hidden.is_empty() {
                        self.check_visible(&crate::backend::join_child(dir, name))?;
                    }
                    Ok(sys::attr_from_stat(&sys::fstatat(fd.as_fd(), name)?))
                })
                .collect(),
            Err(e) => names.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    fn readdir(&self, path: &str) -> FsResult<Vec<DirEntry>> {
        let fd = sys::open_beneath(self.root.as_fd(), path, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        let raw = std::os::fd::IntoRawFd::into_raw_fd(fd);
        // SAFETY: `raw` was just released from an OwnedFd; Dir takes ownership of it.
        let mut dir = nix::dir::Dir::from_fd(raw).map_err(FsError::from)?;
        let mut entries = Vec::new();
        for entry in dir.iter() {
            let entry = entry.map_err(FsError::from)?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            // Names that are not UTF-8 cannot be judged by rules written as text: leave them out.
            let Ok(name) = std::str::from_utf8(name) else { continue };
            let kind = match kind_of_dirent(dirent_type(&entry)) {
                Some(k) => k,
                None => {
                    let st = sys::fstatat(unsafe { BorrowedFd::borrow_raw(raw) }, name)?;
                    FileKind::from_mode(st.st_mode).unwrap_or(FileKind::File)
                }
            };
            entries.push(DirEntry { name: name.to_string(), kind });
        }
        if !self.hidden.is_empty() {
            entries.retain(|e| self.check_visible(&crate::backend::join_child(path, &e.name)).is_ok());
        }
        Ok(entries)
    }

    fn open(&self, path: &str, flags: i32) -> FsResult<Box<dyn OpenFile>> {
        self.check_visible(path)?;
        let flags = opening_flags(flags);
        let fd = sys::open_beneath(self.root.as_fd(), path, flags, 0)?;
        Ok(Box::new(HostFile::new(fd, flags)))
    }

    fn create(
        &self,
        path: &str,
        mode: u32,
        flags: i32,
        caller: &Caller,
    ) -> FsResult<(Attr, Box<dyn OpenFile>)> {
        self.check_new(path)?;
        let mut flags =
            (flags & !(libc::O_APPEND | libc::O_TRUNC | libc::O_NOCTTY)) | libc::O_CREAT | libc::O_EXCL;
        // A file this call creates opens read-write whatever its mode says, so a write-only
        // caller gets a read-write descriptor, which passthrough can use as the backing
        // instead of opening the file again (the kernel still lets the caller's handle only
        // write).
        if flags & libc::O_ACCMODE == libc::O_WRONLY {
            flags = (flags & !libc::O_ACCMODE) | libc::O_RDWR;
        }
        // One resolution of the whole path, with no descriptor of the parent to open and
        // close: the walk's search checks pass under the raised override capabilities, as
        // the root daemon's own walk did, so only the new file's owner is the caller's.
        let fd = {
            let _as = AsCaller::enter(caller);
            sys::open_beneath(self.root.as_fd(), path, flags, mode & 0o7777)?
        };
        let file = HostFile::new(fd, flags);
        Ok((sys::attr_from_stat(file.opened()?), Box::new(file)))
    }

    fn mknod(&self, path: &str, mode: u32, rdev: u32, caller: &Caller) -> FsResult<Attr> {
        self.check_new(path)?;
        let (dir, name) = self.parent(path)?;
        {
            let _as = AsCaller::enter(caller);
            sys::mknodat(dir.fd(), name, mode, rdev as u64)?;
        }
        self.stat_at(&dir, name)
    }

    fn mkdir(&self, path: &str, mode: u32, caller: &Caller) -> FsResult<Attr> {
        self.check_new(path)?;
        let (dir, name) = self.parent(path)?;
        {
            let _as = AsCaller::enter(caller);
            sys::mkdirat(dir.fd(), name, mode & 0o7777)?;
        }
        self.stat_at(&dir, name)
    }

    fn symlink(&self, path: &str, target: &[u8], caller: &Caller) -> FsResult<Attr> {
        self.check_new(path)?;
        let (dir, name) = self.parent(path)?;
        {
            let _as = AsCaller::enter(caller);
            sys::symlinkat(target, dir.fd(), name)?;
        }
        self.stat_at(&dir, name)
    }

    fn link(&self, existing: &str, new_path: &str) -> FsResult<Attr> {
        self.check_new(new_path)?;
        let (old_dir, old_name) = self.parent(existing)?;
        let (new_dir, new_name) = self.parent(new_path)?;
        sys::linkat(old_dir.fd(), old_name, new_dir.fd(), new_name)?;
        self.stat_at(&new_dir, new_name)
    }

    fn readlink(&self, path: &str) -> FsResult<Vec<u8>> {
        let (dir, name) = self.parent(path)?;
        sys::readlinkat(dir.fd(), name)
    }

    fn unlink(&self, path: &str) -> FsResult<()> {
        let (dir, name) = self.parent(path)?;
        sys::unlinkat(dir.fd(), name, 0)
    }

    fn rmdir(&self, path: &str) -> FsResult<()> {
        let (dir, name) = self.parent(path)?;
        sys::unlinkat(dir.fd(), name, libc::AT_REMOVEDIR)
    }

    fn rename(&self, from: &str, to: &str, flags: u32) -> FsResult<()> {
        self.check_new(to)?;
        // Moving a directory would move the daemon's own files beneath it.
        if self.hidden.iter().any(|h| h.strip_prefix(from).is_some_and(|rest| rest.starts_with('/')))
            || self.hidden.iter().any(|h| h.strip_prefix(to).is_some_and(|rest| rest.starts_with('/')))
        {
            return Err(FsError::new(Errno::EBUSY, "it holds the daemon's own files"));
        }
        let (from_dir, from_name) = self.parent(from)?;
        if split_parent(from).0 == split_parent(to).0 {
            // Within one directory (most renames): one resolution of it serves both names.
            self.check_visible(to)?;
            let to_name = split_parent(to).1;
            return sys::renameat2(from_dir.fd(), from_name, from_dir.fd(), to_name, flags);
        }
        let (to_dir, to_name) = self.parent(to)?;
        sys::renameat2(from_dir.fd(), from_name, to_dir.fd(), to_name, flags)
    }

    fn setattr(&self, path: &str, changes: &SetAttr) -> FsResult<Attr> {
        let node = self.node(path)?;
        apply_setattr(node.as_fd(), changes, || {
            sys::open_beneath(self.root.as_fd(), path, libc::O_WRONLY, 0)
        })?;
        Ok(sys::attr_from_stat(&sys::fstat(node.as_fd())?))
    }

    fn fsyncdir(&self, path: &str) -> FsResult<()> {
        let fd = sys::open_beneath(self.root.as_fd(), path, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        if unsafe { libc::fsync(fd.as_raw_fd()) } < 0 {
            return Err(FsError::errno(Errno::last()));
        }
        Ok(())
    }

    fn statfs(&self, _path: &str) -> FsResult<StatFs> {
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstatvfs(self.root.as_raw_fd(), &mut s) } < 0 {
            return Err(FsError::errno(Errno::last()));
        }
        Ok(StatFs {
            blocks: s.f_blocks,
            bfree: s.f_bfree,
            bavail: s.f_bavail,
            files: s.f_files,
            ffree: s.f_ffree,
            bsize: s.f_bsize as u32,
            namelen: s.f_namemax as u32,
            frsize: s.f_frsize as u32,
        })
    }

    fn getxattr(&self, path: &str, name: &str) -> FsResult<Vec<u8>> {
        let node = self.node(path)?;
        let p = sys::proc_fd_path(node.as_fd());
        let n = sys::cstr(name)?;
        xattr_buffer(|buf, len| unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf, len) })
    }

    fn listxattr(&self, path: &str) -> FsResult<Vec<u8>> {
        let node = self.node(path)?;
        let p = sys::proc_fd_path(node.as_fd());
        xattr_buffer(|buf, len| unsafe { libc::listxattr(p.as_ptr(), buf.cast(), len) })
    }

    fn setxattr(&self, path: &str, name: &str, value: &[u8], flags: i32) -> FsResult<()> {
        let node = self.node(path)?;
        let p = sys::proc_fd_path(node.as_fd());
        let n = sys::cstr(name)?;
        let ret =
            unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), flags) };
        if ret < 0 {
            return Err(FsError::errno(Errno::last()));
        }
        Ok(())
    }

    fn removexattr(&self, path: &str, name: &str) -> FsResult<()> {
        let node = self.node(path)?;
        let p = sys::proc_fd_path(node.as_fd());
        let n = sys::cstr(name)?;
        if unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) } < 0 {
            return Err(FsError::errno(Errno::last()));
        }
        Ok(())
    }
}

fn dirent_type(entry: &nix::dir::Entry) -> u8 {
    use nix::dir::Type;
    match entry.file_type() {
        Some(Type::Fifo) => libc::DT_FIFO,
        Some(Type::CharacterDevice) => libc::DT_CHR,
        Some(Type::Directory) => libc::DT_DIR,
        Some(Type::BlockDevice) => libc::DT_BLK,
        Some(Type::File) => libc::DT_REG,
        Some(Type::Symlink) => libc::DT_LNK,
        Some(Type::Socket) => libc::DT_SOCK,
        None => libc::DT_UNKNOWN,
    }
}

/// Calls an xattr syscall twice: once for the size, once for the data.
fn xattr_buffer(call: impl Fn(*mut libc::c_void, usize) -> isize) -> FsResult<Vec<u8>> {
    loop {
        let size = call(std::ptr::null_mut(), 0);
        if size < 0 {
            return Err(FsError::errno(Errno::last()));
        }
        let mut buf = vec![0u8; size as usize];
        let got = call(buf.as_mut_ptr().cast(), buf.len());
        if got < 0 {
            if Errno::last() == Errno::ERANGE {
                continue; // grew in between
            }
            return Err(FsError::errno(Errno::last()));
        }
        buf.truncate(got as usize);
        return Ok(buf);
    }
}

/// chown, then chmod (chown may clear set-ID bits the new mode sets again), then truncate,
/// then times (which the other changes would otherwise bump).
fn apply_setattr(
    node: BorrowedFd<'_>,
    changes: &SetAttr,
    open_for_write: impl FnOnce() -> FsResult<OwnedFd>,
) -> FsResult<()> {
    if changes.uid.is_some() || changes.gid.is_some() {
        sys::fchownat_empty(node, changes.uid, changes.gid)?;
    }
    if let Some(mode) = changes.mode {
        let st = sys::fstat(node)?;
        if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
            return Err(FsError::errno(Errno::EOPNOTSUPP));
        }
        sys::chmod_fd(node, mode & 0o7777)?;
    }
    if let Some(size) = changes.size {
        let fd = open_for_write()?;
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size as i64) } < 0 {
            return Err(FsError::errno(Errno::last()));
        }
    }
    if changes.atime.is_some() || changes.mtime.is_some() {
        sys::utimens_fd(node, changes.atime, changes.mtime)?;
    }
    Ok(())
}

/// The kernel's open flags as the host file is opened with. The kernel hands the daemon the
/// caller's append/truncate intent separately; pwrite at the offsets it sends must not be
/// redirected by O_APPEND.
fn opening_flags(flags: i32) -> i32 {
    flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_APPEND | libc::O_NOCTTY)
}

/// An open host file: plain positional I/O on a real descriptor.
struct HostFile {
    fd: OwnedFd,
    /// The flags `fd` was opened with, and its `fstat` when first asked (see [`BackingFile`]).
    flags: i32,
    opened: OnceLock<libc::stat>,
}

impl HostFile {
    /// `fd`, just opened with `flags`.
    fn new(fd: OwnedFd, flags: i32) -> HostFile {
        HostFile { fd, flags, opened: OnceLock::new() }
    }

    /// Taken at the first ask, not at the open, so that an open nobody asks this of (the grep
    /// tool's, which asks [`OpenFile::getattr`]) costs no extra system call.
    fn opened(&self) -> FsResult<&libc::stat> {
        if let Some(st) = self.opened.get() {
            return Ok(st);
        }
        let st = sys::fstat(self.fd.as_fd())?;
        Ok(self.opened.get_or_init(|| st))
    }
}

impl OpenFile for HostFile {
    fn read(&self, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let mut buf = vec![0u8; size as usize];
        let mut done = 0usize;
        while done < buf.len() {
            let n = unsafe {
                libc::pread(
                    self.fd.as_raw_fd(),
                    buf[done..].as_mut_ptr().cast(),
                    buf.len() - done,
                    (offset + done as u64) as i64,
                )
            };
            if n < 0 {
                if Errno::last() == Errno::EINTR {
                    continue;
                }
                return Err(FsError::errno(Errno::last()));
            }
            if n == 0 {
                break;
            }
            done += n as usize;
        }
        buf.truncate(done);
        Ok(buf)
    }

    fn write(&self, offset: u64, data: &[u8]) -> FsResult<u32> {
        let mut done = 0usize;
        while done < data.len() {
            let n = unsafe {
                libc::pwrite(
                    self.fd.as_raw_fd(),
                    data[done..].as_ptr().cast(),
                    data.len() - done,
                    (offset + done as u64) as i64,
                )
            };
            if n < 0 {
                if Errno::last() == Errno::EINTR {
                    continue;
                }
                return Err(FsError::errno(Errno::last()));
            }
            done += n as usize;
        }
        Ok(done as u32)
    }

    fn flush(&self) -> FsResult<()> {
        Ok(())
    }

    fn needs_flush(&self) -> bool {
        false
    }

    fn fsync(&self, datasync: bool) -> FsResult<()> {
        let ret = unsafe {
            if datasync {
                libc::fdatasync(self.fd.as_raw_fd())
            } else {
                libc::fsync(self.fd.as_raw_fd())
            }
        };
        if ret < 0 {
            return Err(FsError::errno(Errno::last()));
        }
        Ok(())
    }

    fn fallocate(&self, offset: u64, length: u64, mode: i32) -> FsResult<()> {
        if unsafe { libc::fallocate(self.fd.as_raw_fd(), mode, offset as i64, length as i64) } < 0 {
            return Err(FsError::errno(Errno::last()));
        }
        Ok(())
    }

    fn getattr(&self) -> FsResult<Attr> {
        Ok(sys::attr_from_stat(&sys::fstat(self.fd.as_fd())?))
    }

    fn setattr(&self, changes: &SetAttr) -> FsResult<Attr> {
        let fd = self.fd.as_fd();
        if changes.uid.is_some() || changes.gid.is_some() {
            sys::fchownat_empty(fd, changes.uid, changes.gid)?;
        }
        if let Some(mode) = changes.mode {
            if unsafe { libc::fchmod(fd.as_raw_fd(), mode & 0o7777) } < 0 {
                return Err(FsError::errno(Errno::last()));
            }
        }
        if let Some(size) = changes.size {
            // A size change may come through a descriptor that only reads (the truncation of
            // an `O_RDONLY|O_TRUNC` open), which ftruncate refuses: it takes one that writes.
            let writer = match self.flags & libc::O_ACCMODE {
                libc::O_RDONLY => Some(sys::reopen(fd, libc::O_WRONLY)?),
                _ => None,
            };
            let fd = writer.as_ref().map_or(fd, |w| w.as_fd());
            if unsafe { libc::ftruncate(fd.as_raw_fd(), size as i64) } < 0 {
                return Err(FsError::errno(Errno::last()));
            }
        }
        if changes.atime.is_some() || changes.mtime.is_some() {
            sys::utimens_fd(fd, changes.atime, changes.mtime)?;
        }
        self.getattr()
    }

    fn reopen(&self, flags: i32) -> FsResult<Box<dyn OpenFile>> {
        // Through the descriptor's magic link, which O_NOFOLLOW would refuse.
        let flags = opening_flags(flags) & !libc::O_NOFOLLOW;
        let fd = sys::reopen(self.fd.as_fd(), flags)?;
        Ok(Box::new(HostFile::new(fd, flags)))
    }

    fn kind_and_ino(&self) -> FsResult<(FileKind, u64)> {
        // Neither changes while the descriptor is open.
        let attr = sys::attr_from_stat(self.opened()?);
        Ok((attr.kind, attr.ino))
    }

    fn backing(&self) -> Option<BackingFile<'_>> {
        Some(BackingFile { fd: self.fd.as_fd(), flags: self.flags, opened: self.opened().ok()? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_inode_number_on_two_filesystems_is_two_identities() {
        let on = |dev: u64, ino: u64| {
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            (st.st_dev, st.st_ino) = (dev, ino);
            sys::identity_ino(&st)
        };
        let (a, b) = (on(0xfe01, 2), on(0xfe02, 2));
        assert_ne!(a, b);
        assert_eq!(on(0xfe01, 2), a, "stable");
        assert_eq!(on(0xfe02, 2), b, "stable");
        assert_ne!(on(0xfe01, 3), a);
        assert_eq!(a & ((1 << 56) - 1), 2, "the number itself is kept below the top byte");
    }

    #[test]
    fn a_write_only_create_gets_a_read_write_descriptor() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostBackend::new(dir.path()).unwrap();
        let me = Caller { uid: unsafe { libc::geteuid() }, gid: unsafe { libc::getegid() }, pid: 1 };
        let (attr, file) = host.create("f", 0o200, libc::O_WRONLY, &me).unwrap();
        assert_eq!(attr.perm, 0o200);
        let backing = file.backing().unwrap();
        let flags = nix::fcntl::fcntl(backing.fd.as_raw_fd(), nix::fcntl::F_GETFL).unwrap();
        assert_eq!(flags & libc::O_ACCMODE, libc::O_RDWR);
        // What the file says of itself without asking the host is what the host says.
        assert_eq!(backing.flags & libc::O_ACCMODE, libc::O_RDWR);
        let now = sys::fstat(backing.fd).unwrap();
        assert_eq!((backing.opened.st_dev, backing.opened.st_ino), (now.st_dev, now.st_ino));
        assert_eq!(file.kind_and_ino().unwrap(), (FileKind::File, sys::identity_ino(&now)));
        let (attr_g, file) = host.create("g", 0o644, libc::O_RDONLY, &me).unwrap();
        let flags = nix::fcntl::fcntl(file.backing().unwrap().fd.as_raw_fd(), nix::fcntl::F_GETFL).unwrap();
        assert_eq!(flags & libc::O_ACCMODE, libc::O_RDONLY, "a reader stays a reader");
        assert_eq!(file.backing().unwrap().flags & libc::O_ACCMODE, libc::O_RDONLY);
        let reopened = host.open("g", libc::O_WRONLY).unwrap().reopen(libc::O_RDWR).unwrap();
        let backing = reopened.backing().unwrap();
        let flags = nix::fcntl::fcntl(backing.fd.as_raw_fd(), nix::fcntl::F_GETFL).unwrap();
        assert_eq!(backing.flags & libc::O_ACCMODE, flags & libc::O_ACCMODE);
        assert_eq!(sys::identity_ino(backing.opened), attr_g.ino);
    }

    #[test]
    fn a_size_change_through_a_reading_descriptor_is_made() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"hello").unwrap();
        let host = HostBackend::new(dir.path()).unwrap();
        let reader = host.open("f", libc::O_RDONLY).unwrap();
        assert_eq!(reader.setattr(&SetAttr { size: Some(2), ..SetAttr::default() }).unwrap().size, 2);
        assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"he");
    }
}
