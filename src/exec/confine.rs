//! What every process of a sandbox (`execute`'s and `agentvfs run`'s) is refused, beyond its
//! namespaces, for good and for everything it starts:
//!
//! - a seccomp filter refusing (EPERM) the two ioctls with which a program can type into the
//!   terminal it shares with its caller (`TIOCSTI`, pushing input; `TIOCLINUX`, the console's
//!   paste: a program inside `agentvfs run` could otherwise leave commands in the caller's
//!   shell, to run outside the sandbox once it exits), and the kernel's key management calls
//!   (`add_key`, `request_key`, `keyctl`: keyrings are not namespaced by a mount or PID
//!   namespace, so a session keyring inherited from the daemon or the caller, a user's
//!   keyring or its persistent one, with Kerberos tickets say, would be readable and
//!   writable from inside);
//! - a Landlock scope on abstract unix sockets: with the network shared (`agentvfs run`'s
//!   default), the host's abstract sockets (a D-Bus session bus, X11's) are reachable by name,
//!   as the user, unless the sandbox's domain keeps its connections inside.
//!
//! Installed on bubblewrap before it starts (after `no_new_privs`, or as root), so that its
//! init, which a program may `ptrace`, is under them too.

/// `struct sock_filter`: one classic BPF instruction.
#[repr(C)]
struct Instruction {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

const LD_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const JEQ: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const JGE: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const RET: u16 = 0x06; // BPF_RET | BPF_K

// `struct seccomp_data`: the system call's number, the ABI, and the low half of argument 1.
const NR: u32 = 0;
const ARCH: u32 = 4;
const ARG1: u32 = 24;

const ARCH_X86_64: u32 = 0xC000_003E;
const ARCH_I386: u32 = 0x4000_0003;
const ARCH_AARCH64: u32 = 0xC000_00B7;
const X32_BIT: u32 = 0x4000_0000;
const IOCTL_X86_64: u32 = 16;
const IOCTL_I386: u32 = 54;
const IOCTL_AARCH64: u32 = 29;
const KEYS_X86_64: [u32; 3] = [248, 249, 250]; // add_key, request_key, keyctl
const KEYS_I386: [u32; 3] = [286, 287, 288];
const KEYS_AARCH64: [u32; 3] = [217, 218, 219];
const TIOCSTI: u32 = 0x5412;
const TIOCLINUX: u32 = 0x541C;
const ALLOW: u32 = 0x7fff_0000;
const EPERM: u32 = 0x0005_0000 | libc::EPERM as u32;

const fn op(code: u16, k: u32, jt: u8, jf: u8) -> Instruction {
    Instruction { code, jt, jf, k }
}

/// The filter. Jumps count instructions from the next one: 29 is the allow, 30 the refusal.
/// Calls through the i386 ABI, and on aarch64, are judged alike; x32 calls are refused
/// (nothing here uses them); other architectures pass (none of these numbers are theirs).
const PROGRAM: [Instruction; 31] = [
    op(LD_ABS, ARCH, 0, 0),         // 0
    op(JEQ, ARCH_X86_64, 0, 9),     // 1: x86_64, else 11
    op(LD_ABS, NR, 0, 0),           // 2
    op(JGE, X32_BIT, 26, 0),        // 3: x32 → refuse
    op(JEQ, KEYS_X86_64[0], 25, 0), // 4
    op(JEQ, KEYS_X86_64[1], 24, 0), // 5
    op(JEQ, KEYS_X86_64[2], 23, 0), // 6
    op(JEQ, IOCTL_X86_64, 0, 21),   // 7: not ioctl → allow
    op(LD_ABS, ARG1, 0, 0),         // 8
    op(JEQ, TIOCSTI, 20, 0),        // 9
    op(JEQ, TIOCLINUX, 19, 18),     // 10
    op(JEQ, ARCH_I386, 0, 8),       // 11: i386, else 20
    op(LD_ABS, NR, 0, 0),           // 12
    op(JEQ, KEYS_I386[0], 16, 0),   // 13
    op(JEQ, KEYS_I386[1], 15, 0),   // 14
    op(JEQ, KEYS_I386[2], 14, 0),   // 15
    op(JEQ, IOCTL_I386, 0, 12),     // 16
    op(LD_ABS, ARG1, 0, 0),         // 17
    op(JEQ, TIOCSTI, 11, 0),        // 18
    op(JEQ, TIOCLINUX, 10, 9),      // 19
    op(JEQ, ARCH_AARCH64, 0, 8),    // 20: aarch64, else allow
    op(LD_ABS, NR, 0, 0),           // 21
    op(JEQ, KEYS_AARCH64[0], 7, 0), // 22
    op(JEQ, KEYS_AARCH64[1], 6, 0), // 23
    op(JEQ, KEYS_AARCH64[2], 5, 0), // 24
    op(JEQ, IOCTL_AARCH64, 0, 3),   // 25
    op(LD_ABS, ARG1, 0, 0),         // 26
    op(JEQ, TIOCSTI, 2, 0),         // 27
    op(JEQ, TIOCLINUX, 1, 0),       // 28
    op(RET, ALLOW, 0, 0),           // 29
    op(RET, EPERM, 0, 0),           // 30
];

/// Installs the filter on this process (and so on everything it starts). Needs
/// `no_new_privs`, or root.
pub fn install() -> std::io::Result<()> {
    #[repr(C)]
    struct Program {
        len: u16,
        filter: *const Instruction,
    }
    let program = Program { len: PROGRAM.len() as u16, filter: PROGRAM.as_ptr() };
    // SAFETY: `program` points at a valid, 'static filter for the duration of the call.
    let done = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &program as *const Program as libc::c_ulong,
        )
    };
    match done {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// `struct landlock_ruleset_attr` (ABI 6): no file system or network access handled, only the
/// scopes.
#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
const LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1;

/// A Landlock ruleset that keeps abstract unix sockets inside the domain, made in the parent
/// and applied in the child between fork and exec ([`AbstractSockets::apply`]).
pub struct AbstractSockets(std::os::fd::OwnedFd);

impl AbstractSockets {
    /// The ruleset, or why this kernel cannot scope abstract sockets (Landlock off, or its ABI
    /// before 6, Linux 6.12).
    pub fn new() -> Result<AbstractSockets, String> {
        // SAFETY: the version query reads nothing.
        let abi = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<RulesetAttr>(),
                0usize,
                LANDLOCK_CREATE_RULESET_VERSION,
            )
        };
        if abi < 6 {
            let why =
                if abi < 0 { std::io::Error::last_os_error().to_string() } else { format!("ABI {abi}") };
            return Err(format!(
                "Landlock cannot scope abstract unix sockets here ({why}; needs ABI 6, Linux 6.12)"
            ));
        }
        let attr = RulesetAttr {
            handled_access_fs: 0,
            handled_access_net: 0,
            scoped: LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET,
        };
        // SAFETY: `attr` is valid for reads of its size for the duration of the call.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                &attr as *const RulesetAttr,
                std::mem::size_of::<RulesetAttr>(),
                0u32,
            )
        };
        if fd < 0 {
            return Err(format!("Landlock: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: a new descriptor (close-on-exec) that nothing else owns.
        Ok(AbstractSockets(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd as i32) }))
    }

    /// The descriptor, for [`apply`] in the child.
    pub fn raw(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.0)
    }
}

/// In a child between fork and exec (async-signal-safe): puts this process in the domain of
/// `ruleset` (a [`AbstractSockets::raw`]). Needs `no_new_privs`, or root.
pub fn apply(ruleset: std::os::fd::RawFd) -> std::io::Result<()> {
    // SAFETY: a system call on a descriptor; touches no memory.
    match unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the program answers for a call: a small interpreter of the four instructions it
    /// uses, over `seccomp_data`'s number, architecture and argument 1.
    fn verdict(arch: u32, nr: u32, arg1: u32) -> u32 {
        let mut pc = 0;
        let mut acc = 0;
        loop {
            let ins = &PROGRAM[pc];
            pc += 1;
            match ins.code {
                LD_ABS => {
                    acc = match ins.k {
                        NR => nr,
                        ARCH => arch,
                        ARG1 => arg1,
                        other => panic!("loads {other}"),
                    }
                }
                JEQ | JGE => {
                    let taken = if ins.code == JEQ { acc == ins.k } else { acc >= ins.k };
                    pc += if taken { ins.jt } else { ins.jf } as usize;
                }
                RET => return ins.k,
                other => panic!("instruction {other:#x}"),
            }
        }
    }

    #[test]
    fn the_filter_refuses_typing_and_keys_and_allows_the_rest() {
        for (arch, ioctl, keys) in [
            (ARCH_X86_64, IOCTL_X86_64, KEYS_X86_64),
            (ARCH_I386, IOCTL_I386, KEYS_I386),
            (ARCH_AARCH64, IOCTL_AARCH64, KEYS_AARCH64),
        ] {
            assert_eq!(verdict(arch, ioctl, TIOCSTI), EPERM);
            assert_eq!(verdict(arch, ioctl, TIOCLINUX), EPERM);
            assert_eq!(verdict(arch, ioctl, libc::TIOCGWINSZ as u32), ALLOW);
            for key in keys {
                assert_eq!(verdict(arch, key, 0), EPERM, "{key}");
            }
            // Neighbours of the refused numbers, and an ioctl's request number as a call's.
            for nr in [0, 1, 59, keys[0] - 1, keys[2] + 1, TIOCSTI] {
                assert_eq!(verdict(arch, nr, TIOCSTI), ALLOW, "{nr}");
            }
        }
        assert_eq!(verdict(ARCH_X86_64, X32_BIT | 1, 0), EPERM);
        assert_eq!(verdict(ARCH_AARCH64, X32_BIT | 1, 0), ALLOW, "no x32 on aarch64");
        assert_eq!(verdict(0x4000_0028, IOCTL_AARCH64, TIOCSTI), ALLOW, "another architecture passes");
    }

    /// In a child process (the filter cannot be lifted): TIOCSTI and keyctl are refused, other
    /// ioctls and calls work.
    #[test]
    fn a_filtered_process_cannot_type_into_its_terminal_or_read_keys() {
        // SAFETY: the child only makes system calls and exits.
        match unsafe { libc::fork() } {
            0 => {
                let code = unsafe {
                    if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || install().is_err() {
                        10
                    } else {
                        let c = b'x';
                        let sti = libc::ioctl(0, libc::TIOCSTI as _, &c);
                        let errno = *libc::__errno_location();
                        let mut size: libc::winsize = std::mem::zeroed();
                        let other = libc::ioctl(0, libc::TIOCGWINSZ as _, &mut size);
                        let other_errno = *libc::__errno_location();
                        // KEYCTL_GET_KEYRING_ID of the session keyring (-3).
                        let keys = libc::syscall(libc::SYS_keyctl, 0, -3i64, 0);
                        let keys_errno = *libc::__errno_location();
                        match (sti, errno, other, other_errno, keys, keys_errno) {
                            (-1, libc::EPERM, _, e, -1, libc::EPERM) if e != libc::EPERM || other == 0 => 0,
                            _ => 11,
                        }
                    }
                };
                unsafe { libc::_exit(code) }
            }
            pid => {
                let mut status = 0;
                unsafe { libc::waitpid(pid, &mut status, 0) };
                assert_eq!(
                    libc::WEXITSTATUS(status),
                    0,
                    "the child saw TIOCSTI or keyctl allowed, or other ioctls refused"
                );
            }
        }
    }
}
