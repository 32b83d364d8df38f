//! Thin, checked wrappers over the *at syscalls the host backend is built from.
//!
//! Each returns `FsResult` with the raw errno, so the kernel sees exactly what the host
//! filesystem said.

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::backend::{Attr, FileKind, TimeSet};
use crate::error::{Errno, FsError, FsResult};

pub fn cstr(s: &str) -> FsResult<CString> {
    CString::new(s).map_err(|_| FsError::new(Errno::EINVAL, "path contains NUL"))
}

pub fn cbytes(b: &[u8]) -> FsResult<CString> {
    CString::new(b).map_err(|_| FsError::new(Errno::EINVAL, "value contains NUL"))
}

fn check(ret: libc::c_int) -> FsResult<libc::c_int> {
    if ret < 0 {
        Err(FsError::errno(Errno::last()))
    } else {
        Ok(ret)
    }
}

/// openat2 with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`: the path
/// must stay beneath `dir` and may not pass through any symlink, so nothing outside the root
/// can be reached however the tree changes underneath us.
pub fn open_beneath(dir: BorrowedFd<'_>, path: &str, flags: i32, mode: u32) -> FsResult<OwnedFd> {
    let path = if path.is_empty() { "." } else { path };
    let c = cstr(path)?;
    // openat2 refuses unknown bits (such as the kernel's internal exec flag that FUSE passes
    // along), so only the flags that mean something for a host open are kept.
    let known = libc::O_ACCMODE
        | libc::O_NONBLOCK
        | libc::O_DSYNC
        | libc::O_SYNC
        | libc::O_DIRECT
        | libc::O_NOATIME
        | libc::O_LARGEFILE
        | libc::O_DIRECTORY
        | libc::O_PATH
        | libc::O_CREAT
        | libc::O_EXCL
        | libc::O_TMPFILE;
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = ((flags & known) | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64;
    how.mode = if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 { mode as u64 } else { 0 };
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    loop {
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd >= 0 {
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        }
        match Errno::last() {
            // openat2 asks for a retry when a rename raced with the lookup.
            Errno::EAGAIN => continue,
            e => return Err(FsError::errno(e)),
        }
    }
}

pub fn fstatat(dir: BorrowedFd<'_>, name: &str) -> FsResult<libc::stat> {
    let c = cstr(name)?;
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let flags = libc::AT_SYMLINK_NOFOLLOW | if name.is_empty() { libc::AT_EMPTY_PATH } else { 0 };
    check(unsafe { libc::fstatat(dir.as_raw_fd(), c.as_ptr(), &mut st, flags) })?;
    Ok(st)
}

pub fn fstat(fd: BorrowedFd<'_>) -> FsResult<libc::stat> {
    fstatat(fd, "")
}

/// The path through which the kernel reaches an fd's own inode (a "magic link"). Used for
/// operations that have no fd-based form for O_PATH descriptors; it never resolves a name.
pub fn proc_fd_path(fd: BorrowedFd<'_>) -> CString {
    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("no NUL in a number")
}

/// The same file as `fd` (not the same name: it may have been renamed or deleted since) opened
/// anew with `flags`. Fails when the kernel refuses (read-only fs, immutable file, a program
/// running from it) or `/proc` is missing.
pub fn reopen(fd: BorrowedFd<'_>, flags: i32) -> FsResult<OwnedFd> {
    let path = proc_fd_path(fd);
    let raw = check(unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) })?;
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) })
}

pub fn mkdirat(dir: BorrowedFd<'_>, name: &str, mode: u32) -> FsResult<()> {
    let c = cstr(name)?;
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), mode) }).map(drop)
}

pub fn mknodat(dir: BorrowedFd<'_>, name: &str, mode: u32, rdev: u64) -> FsResult<()> {
    let c = cstr(name)?;
    check(unsafe { libc::mknodat(dir.as_raw_fd(), c.as_ptr(), mode, rdev) }).map(drop)
}

pub fn symlinkat(target: &[u8], dir: BorrowedFd<'_>, name: &str) -> FsResult<()> {
    let t = cbytes(target)?;
    let c = cstr(name)?;
    check(unsafe { libc::symlinkat(t.as_ptr(), dir.as_raw_fd(), c.as_ptr()) }).map(drop)
}

pub fn linkat(old_dir: BorrowedFd<'_>, old: &str, new_dir: BorrowedFd<'_>, new: &str) -> FsResult<()> {
    let (o, n) = (cstr(old)?, cstr(new)?);
    check(unsafe { libc::linkat(old_dir.as_raw_fd(), o.as_ptr(), new_dir.as_raw_fd(), n.as_ptr(), 0) })
        .map(drop)
}

pub fn readlinkat(dir: BorrowedFd<'_>, name: &str) -> FsResult<Vec<u8>> {
    let c = cstr(name)?;
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    let n = unsafe { libc::readlinkat(dir.as_raw_fd(), c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(FsError::errno(Errno::last()));
    }
    buf.truncate(n as usize);
    Ok(buf)
}

pub fn unlinkat(dir: BorrowedFd<'_>, name: &str, flags: i32) -> FsResult<()> {
    let c = cstr(name)?;
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), flags) }).map(drop)
}

pub fn renameat2(
    old_dir: BorrowedFd<'_>,
    old: &str,
    new_dir: BorrowedFd<'_>,
    new: &str,
    flags: u32,
) -> FsResult<()> {
    let (o, n) = (cstr(old)?, cstr(new)?);
    check(unsafe { libc::renameat2(old_dir.as_raw_fd(), o.as_ptr(), new_dir.as_raw_fd(), n.as_ptr(), flags) })
        .map(drop)
}

pub fn fchownat_empty(fd: BorrowedFd<'_>, uid: Option<u32>, gid: Option<u32>) -> FsResult<()> {
    let uid = uid.unwrap_or(u32::MAX);
    let gid = gid.unwrap_or(u32::MAX);
    check(unsafe {
        libc::fchownat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            uid,
            gid,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

/// chmod of the inode an fd refers to (O_PATH descriptors included): `fchmodat2` with an empty
/// path (Linux 6.6), which resolves no name; through the fd's magic link where the kernel
/// lacks it. Both reach the same inode with the same permission checks.
pub fn chmod_fd(fd: BorrowedFd<'_>, mode: u32) -> FsResult<()> {
    let ret = unsafe {
        libc::syscall(libc::SYS_fchmodat2, fd.as_raw_fd(), c"".as_ptr(), mode, libc::AT_EMPTY_PATH)
    };
    if ret == 0 || Errno::last() != Errno::ENOSYS {
        return check(ret as i32).map(drop);
    }
    let p = proc_fd_path(fd);
    check(unsafe { libc::chmod(p.as_ptr(), mode) }).map(drop)
}

fn timespec(t: Option<TimeSet>) -> libc::timespec {
    match t {
        None => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
        Some(TimeSet::Now) => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
        Some(TimeSet::At(t)) => {
            let (sec, nsec) = match t.duration_since(UNIX_EPOCH) {
                Ok(d) => (d.as_secs() as i64, d.subsec_nanos() as i64),
                Err(e) => {
                    let d = e.duration();
                    let (s, n) = (d.as_secs() as i64, d.subsec_nanos() as i64);
                    if n == 0 {
                        (-s, 0)
                    } else {
                        (-s - 1, 1_000_000_000 - n)
                    }
                }
            };
            libc::timespec { tv_sec: sec, tv_nsec: nsec }
        }
    }
}

/// Sets times on the inode an fd refers to (O_PATH descriptors included), without following
/// a symlink the fd may refer to: the empty-path form resolves no name.
pub fn utimens_fd(fd: BorrowedFd<'_>, atime: Option<TimeSet>, mtime: Option<TimeSet>) -> FsResult<()> {
    let times = [timespec(atime), timespec(mtime)];
    let flags = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW;
    check(unsafe { libc::utimensat(fd.as_raw_fd(), c"".as_ptr(), times.as_ptr(), flags) }).map(drop)
}

fn time(sec: i64, nsec: i64) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs((-sec) as u64) + Duration::from_nanos(nsec as u64)
    }
}

/// The identity of a host file ([`Attr::ino`]): its inode number, with the index of its
/// filesystem in the top byte. A host root may hold mounts of other filesystems (a tmpfs, a
/// bind mount, a btrfs subvolume), whose inode numbers repeat the root's: by the number alone,
/// two files would be taken for hard links of one, and the mount would show one's content under
/// the other's name. The first filesystem the daemon meets has index 0 (so its files keep their
/// numbers); past 255 filesystems indexes repeat, and numbers from 2^56 up could meet.
pub fn identity_ino(st: &libc::stat) -> u64 {
    st.st_ino ^ (device_index(st.st_dev) << 56)
}

/// The order in which the daemon met filesystem `dev`, modulo 256. Each thread keeps the last
/// one it asked about, so the usual case (one filesystem) takes no lock.
fn device_index(dev: libc::dev_t) -> u64 {
    static MET: std::sync::Mutex<Vec<libc::dev_t>> = std::sync::Mutex::new(Vec::new());
    thread_local! {
        static LAST: std::cell::Cell<Option<(libc::dev_t, u64)>> = const { std::cell::Cell::new(None) };
    }
    if let Some((last, index)) = LAST.get() {
        if last == dev {
            return index;
        }
    }
    let mut met = MET.lock().unwrap_or_else(|e| e.into_inner());
    let index = match met.iter().position(|&d| d == dev) {
        Some(i) => i,
        None => {
            met.push(dev);
            met.len() - 1
        }
    } as u64
        % 256;
    LAST.set(Some((dev, index)));
    index
}

pub fn attr_from_stat(st: &libc::stat) -> Attr {
    Attr {
        ino: identity_ino(st),
        kind: FileKind::from_mode(st.st_mode).unwrap_or(FileKind::File),
        perm: (st.st_mode & 0o7777) as u16,
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        atime: time(st.st_atime, st.st_atime_nsec),
        mtime: time(st.st_mtime, st.st_mtime_nsec),
        ctime: time(st.st_ctime, st.st_ctime_nsec),
        crtime: time(st.st_ctime, st.st_ctime_nsec),
    }
}
