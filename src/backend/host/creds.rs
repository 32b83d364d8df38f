//! Creating nodes as the calling process: a per-thread switch of the filesystem uid/gid.
//!
//! The host filesystem then assigns ownership itself (including set-group-ID directory
//! inheritance), exactly as it would for the caller. The kernel already checked permissions
//! for the caller at the FUSE layer (`default_permissions`), and the caller's supplementary
//! groups are not known here, so the permission-override capabilities are raised again for the
//! duration: the switch decides ownership, not access.

use crate::backend::Caller;

pub struct AsCaller {
    switched: bool,
}

/// CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_MKNOD (capability(7) numbers).
const RAISED: [u32; 3] = [1, 2, 27];

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_V3: u32 = 0x2008_0522;

fn raise_override_caps() {
    let mut header = CapHeader { version: CAP_V3, pid: 0 };
    let mut data = [CapData::default(); 2];
    // SAFETY: the structs match the kernel's v3 layout; pid 0 means this thread.
    unsafe {
        if libc::syscall(libc::SYS_capget, &mut header as *mut CapHeader, data.as_mut_ptr()) != 0 {
            return;
        }
        for cap in RAISED {
            let (word, bit) = ((cap / 32) as usize, 1u32 << (cap % 32));
            if data[word].permitted & bit != 0 {
                data[word].effective |= bit;
            }
        }
        libc::syscall(libc::SYS_capset, &mut header as *mut CapHeader, data.as_ptr());
    }
}

thread_local! {
    static OWN_UMASK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The kernel already applied the caller's umask to the mode it sends; the daemon's own umask
/// must not strip bits again. The umask lives in the process's shared `fs_struct`, so each
/// thread that creates nodes first takes a private copy (`unshare(CLONE_FS)`) and clears it
/// there, leaving the rest of the daemon (its databases, its sockets) with the normal umask.
fn clear_thread_umask() {
    OWN_UMASK.with(|done| {
        if !done.get() {
            // SAFETY: unshare(CLONE_FS) affects only the calling thread's fs context.
            unsafe {
                if libc::unshare(libc::CLONE_FS) == 0 {
                    libc::umask(0);
                }
            }
            done.set(true);
        }
    });
}

impl AsCaller {
    /// Switches this thread's filesystem ids to the caller's until the guard drops.
    /// A daemon that is not root (or a caller that is) needs no switch.
    pub fn enter(caller: &Caller) -> AsCaller {
        clear_thread_umask();
        let me = unsafe { libc::geteuid() };
        if me != 0 || (caller.uid == 0 && caller.gid == 0) {
            return AsCaller { switched: false };
        }
        // SAFETY: setfsuid/setfsgid only affect the calling thread.
        unsafe {
            libc::setfsgid(caller.gid);
            libc::setfsuid(caller.uid);
        }
        if caller.uid != 0 {
            raise_override_caps();
        }
        AsCaller { switched: true }
    }
}

impl Drop for AsCaller {
    fn drop(&mut self) {
        if self.switched {
            // Going back to fsuid 0 restores the capabilities the switch dropped.
            unsafe {
                libc::setfsuid(0);
                libc::setfsgid(0);
            }
        }
    }
}
