//! A seccomp filter that refuses the two ioctls with which a program can type into the
//! terminal it shares with its caller (`TIOCSTI`, pushing input; `TIOCLINUX`, the console's
//! paste): a program inside `agentvfs run` could otherwise leave commands in the caller's
//! shell, to run outside the sandbox once it exits. Installed by the program's first process
//! inside the sandbox (after `no_new_privs`), inherited by everything it starts, never lifted.

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
const X32_BIT: u32 = 0x4000_0000;
const IOCTL_X86_64: u32 = 16;
const IOCTL_I386: u32 = 54;
const TIOCSTI: u32 = 0x5412;
const TIOCLINUX: u32 = 0x541C;
const ALLOW: u32 = 0x7fff_0000;
const EPERM: u32 = 0x0005_0000 | libc::EPERM as u32;

const fn op(code: u16, k: u32, jt: u8, jf: u8) -> Instruction {
    Instruction { code, jt, jf, k }
}

/// The filter. Jumps count instructions from the next one: 14 is the allow, 15 the refusal.
/// Calls through the i386 ABI are judged alike; x32 calls are refused (nothing here uses them).
const PROGRAM: [Instruction; 16] = [
    op(LD_ABS, ARCH, 0, 0),      // 0
    op(JEQ, ARCH_X86_64, 0, 6),  // 1: x86_64, else 8
    op(LD_ABS, NR, 0, 0),        // 2
    op(JGE, X32_BIT, 11, 0),     // 3: x32 → refuse
    op(JEQ, IOCTL_X86_64, 0, 9), // 4: not ioctl → allow
    op(LD_ABS, ARG1, 0, 0),      // 5
    op(JEQ, TIOCSTI, 8, 0),      // 6
    op(JEQ, TIOCLINUX, 7, 6),    // 7
    op(JEQ, ARCH_I386, 0, 5),    // 8: i386, else allow
    op(LD_ABS, NR, 0, 0),        // 9
    op(JEQ, IOCTL_I386, 0, 3),   // 10
    op(LD_ABS, ARG1, 0, 0),      // 11
    op(JEQ, TIOCSTI, 2, 0),      // 12
    op(JEQ, TIOCLINUX, 1, 0),    // 13
    op(RET, ALLOW, 0, 0),        // 14
    op(RET, EPERM, 0, 0),        // 15
];

/// Installs the filter on this process (and so on everything it starts). Needs
/// `no_new_privs`, which bubblewrap has set.
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every jump lands inside the program, and the last two are the answers.
    #[test]
    fn jumps_land_on_instructions() {
        for (i, ins) in PROGRAM.iter().enumerate() {
            if ins.code == JEQ || ins.code == JGE {
                assert!(
                    i + 1 + (ins.jt as usize) < PROGRAM.len() && i + 1 + (ins.jf as usize) < PROGRAM.len(),
                    "{i}"
                );
            }
        }
        assert_eq!((PROGRAM[14].code, PROGRAM[14].k), (RET, ALLOW));
        assert_eq!((PROGRAM[15].code, PROGRAM[15].k), (RET, EPERM));
        // The refusals lead to 15, the allowances to 14.
        assert_eq!(3 + 1 + PROGRAM[3].jt as usize, 15);
        assert_eq!(4 + 1 + PROGRAM[4].jf as usize, 14);
        assert_eq!(6 + 1 + PROGRAM[6].jt as usize, 15);
        assert_eq!((7 + 1 + PROGRAM[7].jt as usize, 7 + 1 + PROGRAM[7].jf as usize), (15, 14));
        assert_eq!(1 + 1 + PROGRAM[1].jf as usize, 8);
        assert_eq!(8 + 1 + PROGRAM[8].jf as usize, 14);
        assert_eq!(10 + 1 + PROGRAM[10].jf as usize, 14);
        assert_eq!((12 + 1 + PROGRAM[12].jt as usize, 13 + 1 + PROGRAM[13].jt as usize), (15, 15));
    }

    /// In a child process (the filter cannot be lifted): TIOCSTI is refused, other ioctls and
    /// calls work.
    #[test]
    fn a_filtered_process_cannot_type_into_its_terminal() {
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
                        match (sti, errno, other, other_errno, libc::getpid() > 0) {
                            (-1, libc::EPERM, _, e, true) if e != libc::EPERM || other == 0 => 0,
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
                    "the child saw TIOCSTI allowed or other ioctls refused"
                );
            }
        }
    }
}
