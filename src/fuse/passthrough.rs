//! Kernel FUSE passthrough: the kernel reads and writes a host file directly, without a round
//! trip through the daemon, once an `open` (which the gate has judged) names a backing file.
//!
//! The kernel allows one backing file per inode while the inode has passthrough handles, and
//! refuses to mix passthrough and cached handles on one inode (ETXTBSY). So every open of a
//! host-route regular file takes the same shared backing, opened read-write when the host lets
//! the daemon (so later writers can share it), read-only otherwise. The backing is registered
//! on the first open and closed when the inode's last handle is released.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use fuser::BackingId;
use nix::errno::Errno;
use parking_lot::Mutex;

use crate::backend::OpenFile;
use crate::error::{FsError, FsResult};

/// The kernel's flag on opens made by `execve` (`__FMODE_EXEC`): the backing for a running
/// program stays read-only, so the daemon never holds the host file open for writing because
/// someone ran it (which would make the host's own `execve` of it fail with ETXTBSY).
const FMODE_EXEC: i32 = 0x20;

struct Backing {
    id: Arc<BackingId>,
    writable: bool,
    handles: usize,
}

#[derive(Default)]
pub struct Passthrough {
    /// Set in `init` once the kernel agreed to passthrough and the config asks for it.
    enabled: AtomicBool,
    /// Logged once: registering a backing failed, so opens fall back to the daemon.
    warned: AtomicBool,
    backings: Mutex<HashMap<u64, Backing>>,
}

impl Passthrough {
    pub fn enable(&self) {
        self.enabled.store(true, Ordering::Relaxed);
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// The backing to answer an open of `ino` with, registering one through `register` if the
    /// inode has none. `None`: serve this handle through the daemon (not a host regular file,
    /// or passthrough is off). Each `Some` must be paired with one [`Passthrough::release`].
    pub fn acquire(
        &self,
        ino: u64,
        file: &dyn OpenFile,
        flags: i32,
        register: impl FnOnce(BorrowedFd<'_>) -> std::io::Result<BackingId>,
    ) -> FsResult<Option<Arc<BackingId>>> {
        if !self.enabled() {
            return Ok(None);
        }
        let Some(fd) = file.backing_fd() else { return Ok(None) };
        let wants_write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let mut backings = self.backings.lock();
        if let Some(backing) = backings.get_mut(&ino) {
            if wants_write && !backing.writable {
                // The inode's shared backing is read-only (the host refused a writer when it
                // was opened, e.g. the file is being executed); the kernel cannot give this
                // handle another one.
                return Err(FsError::new(Errno::ETXTBSY, "file is busy: its shared backing is read-only"));
            }
            backing.handles += 1;
            return Ok(Some(backing.id.clone()));
        }
        if !is_regular(fd) {
            return Ok(None);
        }
        let shared = if flags & FMODE_EXEC != 0 { None } else { reopen_read_write(fd) };
        let backing_fd = match (&shared, flags & libc::O_ACCMODE) {
            (Some(f), _) => f.as_fd(),
            // A write-only descriptor cannot serve later readers: keep this one cached.
            (None, libc::O_WRONLY) => return Ok(None),
            (None, _) => fd,
        };
        let writable = shared.is_some() || flags & libc::O_ACCMODE == libc::O_RDWR;
        match register(backing_fd) {
            Ok(id) => {
                let id = Arc::new(id);
                backings.insert(ino, Backing { id: id.clone(), writable, handles: 1 });
                Ok(Some(id))
            }
            Err(e) => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!("FUSE passthrough unavailable ({e}); file data goes through the daemon");
                }
                Ok(None)
            }
        }
    }

    /// One passthrough handle of `ino` closed; the last one unregisters the backing.
    pub fn release(&self, ino: u64) {
        let mut backings = self.backings.lock();
        if let Some(backing) = backings.get_mut(&ino) {
            backing.handles -= 1;
            if backing.handles == 0 {
                backings.remove(&ino);
            }
        }
    }
}

fn is_regular(fd: BorrowedFd<'_>) -> bool {
    nix::sys::stat::fstat(fd.as_raw_fd()).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG)
}

/// The same host file (not the same name: it may have been renamed since) opened read-write
/// through `/proc/self/fd`. `None` when the host refuses a writer (read-only fs, immutable,
/// being executed) or `/proc` is missing.
fn reopen_read_write(fd: BorrowedFd<'_>) -> Option<OwnedFd> {
    let path = format!("/proc/self/fd/{}\0", fd.as_raw_fd());
    let raw = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CLOEXEC) };
    (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw) })
}
