//! A private tmpfs: created with the mount API (`fsopen`, `fsconfig`, `fsmount`) and never
//! attached to any path, so only the daemon, through the returned descriptor, can reach it.
//! The memory route keeps its tree there and is then served exactly like a host directory
//! (with kernel passthrough for file data). It disappears when the daemon exits.

use std::ffi::CString;
use std::os::fd::{FromRawFd, OwnedFd};

use crate::error::{Errno, FsError, FsResult};

const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
const MOUNT_ATTR_NOSUID: libc::c_uint = 0x2;
const MOUNT_ATTR_NODEV: libc::c_uint = 0x4;

fn fd_or_error(ret: libc::c_long, what: &str) -> FsResult<OwnedFd> {
    if ret < 0 {
        return Err(FsError::new(Errno::last(), what.to_string()));
    }
    Ok(unsafe { OwnedFd::from_raw_fd(ret as i32) })
}

fn set_string(fs: &OwnedFd, key: &str, value: &str) -> FsResult<()> {
    use std::os::fd::AsRawFd;
    let (key, value) = (CString::new(key).expect("no NUL"), CString::new(value).expect("no NUL"));
    let ret = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_SET_STRING,
            key.as_ptr(),
            value.as_ptr(),
            0,
        )
    };
    if ret < 0 {
        return Err(FsError::new(Errno::last(), format!("tmpfs option {key:?}")));
    }
    Ok(())
}

/// The root directory (mode 0755, owned by the daemon) of a new private tmpfs allocating at
/// most `max_bytes` (rounded up to whole pages), or half the machine's memory.
pub fn private_tmpfs(max_bytes: Option<u64>) -> FsResult<OwnedFd> {
    use std::os::fd::AsRawFd;
    let fs =
        fd_or_error(unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), FSOPEN_CLOEXEC) }, "fsopen")?;
    set_string(&fs, "mode", "0755")?;
    match max_bytes {
        // Under a cap, 4 KiB pages only, so that the cap counts what was written: with huge
        // pages a write of 4 KiB into a hole of a large sparse file allocated (and was charged)
        // the 2 MiB page around it, and scattered small writes ran out of space long before
        // the data reached the cap. Said explicitly: a system may make huge pages the default
        // for tmpfs (`transparent_hugepage_tmpfs=`).
        Some(bytes) => {
            set_string(&fs, "size", &bytes.max(1).to_string())?;
            // Names (and extended attributes, charged to the same budget) bounded too.
            set_string(&fs, "nr_inodes", &crate::backend::memory::inode_limit(bytes).to_string())?;
            let _ = set_string(&fs, "huge", "never");
        }
        // Large folios for files big enough (as ext4 has): warm reads of a 1 GiB file went
        // from 2.8x native time to 1.0x. Optional: a kernel without transparent huge pages
        // says no.
        None => {
            let _ = set_string(&fs, "huge", "within_size");
        }
    }
    let ret = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if ret < 0 {
        return Err(FsError::new(Errno::last(), "creating the tmpfs"));
    }
    let attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    fd_or_error(
        unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), FSMOUNT_CLOEXEC, attrs) },
        "fsmount",
    )
}
