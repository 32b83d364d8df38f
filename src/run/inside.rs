//! Inside `agentvfs run`'s sandbox, before the program: its signals put back, and the
//! program started in a process group of its own inside the sandbox's PID namespace (holding
//! the sandbox's terminal, its pty, when it has one), with this process (the monitor) passing
//! its stops out to `agentvfs run` and its continues back in.
//!
//! Why a group inside: the sandbox's own group (and session) is led by bubblewrap, outside
//! the PID namespace, so inside it has no number (`getpgrp` and `tcgetpgrp` answer 0). A
//! job-control shell notes the terminal's group when it starts and hands the terminal back to
//! it when it exits; dash's `exit` then fails ("Cannot set tty process group") and exits 2. A
//! group led by the program has its number on both sides. And bubblewrap's group is orphaned
//! (its leader's parent, `agentvfs run`, is in another session), so the kernel discards the
//! terminal's stop signals there; the program's group, whose parent is this monitor, gets them.

use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// Puts back the default actions of SIGINT and SIGQUIT (bubblewrap ignores them, and an
/// ignored signal stays ignored across `exec`; the sandbox's seccomp filter and Landlock scope
/// are bubblewrap's already, see [`crate::exec::confine`]), then starts the program in a group
/// of its own, which gets the sandbox's terminal if it has one, and stays its parent
/// ([`monitor`]). Returns the program's status.
pub fn exec_program(argv: &[OsString]) -> ExitCode {
    let Some((program, args)) = argv.split_first() else { return ExitCode::from(2) };
    // SAFETY: resetting dispositions to their default touches no memory.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::signal(libc::SIGQUIT, libc::SIG_DFL);
    }
    let mut command = std::process::Command::new(program);
    command.args(args);
    let error = match monitor(command) {
        Ok(code) => return code,
        Err(e) => e,
    };
    eprintln!("agentvfs run: {}: {error}", crate::display::escape(&program.to_string_lossy()));
    ExitCode::from(if error.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 })
}

/// Starts `command` as the leader of a new process group that gets the sandbox's controlling
/// terminal (`/dev/tty`, the pty `agentvfs run` made) if there is one, then waits for it: a
/// stop of the program stops this process's group (bubblewrap's, which `agentvfs run` waits
/// for, and so the caller's job); a continue of
/// this process continues the program's group; what `agentvfs run` passes on goes to the
/// program's group. Ends with the program's status, or by the signal that ended it.
fn monitor(mut command: std::process::Command) -> std::io::Result<ExitCode> {
    let mut waited = SigSet::empty();
    // What `agentvfs run` passes on to the program goes on to the program's group.
    for signal in super::FORWARDED {
        waited.add(signal);
    }
    waited.add(Signal::SIGCHLD);
    waited.add(Signal::SIGCONT);
    // Only these wait (for `wait` below); the stops this process raises on itself must not.
    waited.thread_set_mask().map_err(std::io::Error::from)?;
    // SAFETY: the default action (SIG_IGN would reap the program unseen).
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_DFL) };
    // The sandbox's terminal: none when `agentvfs run` had none to give (every descriptor
    // redirected), as bubblewrap's session then has no controlling terminal.
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC)
        .open("/dev/tty")
        .ok();
    let terminal = tty.as_ref().map(|f| f.as_raw_fd());
    // SAFETY: between fork and exec only async-signal-safe calls on this (child) process: the
    // group, the terminal (SIGTTOU blocked meanwhile, so that the hand-over from what is for
    // that moment a group without the terminal is let through), and an empty signal mask.
    unsafe {
        command.pre_exec(move || {
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let Some(terminal) = terminal else { return Ok(()) };
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTTOU);
            libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            libc::tcsetpgrp(terminal, libc::getpid());
            libc::sigemptyset(&mut set);
            libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
            Ok(())
        });
    }
    // Forked here, not by `spawn`: `spawn` waits until the child has exec'd, and a child
    // stopped before that (Ctrl-Z while it starts) would hold this process there, where it
    // cannot pass the stop out. This process has no other thread, so the child may run any
    // code; it says itself why the program did not start.
    // SAFETY: single-threaded, see above.
    let child = match unsafe { nix::unistd::fork() }.map_err(std::io::Error::from)? {
        nix::unistd::ForkResult::Parent { child } => child,
        nix::unistd::ForkResult::Child => {
            let error = command.exec();
            let program = command.get_program().to_string_lossy();
            eprintln!("agentvfs run: {}: {error}", crate::display::escape(&program));
            let code = if error.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
            // SAFETY: ends the child at once, as a failed exec should.
            unsafe { libc::_exit(code) }
        }
    };
    // As shells do, from both sides: neither order of the child's exec and this call leaves
    // the group unmade. EACCES once the child has exec'd is expected.
    let _ = nix::unistd::setpgid(child, child);
    let program_group = Pid::from_raw(-child.as_raw());
    loop {
        let signal = waited.wait().map_err(std::io::Error::from)?;
        match signal {
            Signal::SIGCHLD => loop {
                match waitpid(child, Some(WaitPidFlag::WUNTRACED | WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::Exited(_, code)) => return Ok(ExitCode::from(code.clamp(0, 255) as u8)),
                    Ok(WaitStatus::Signaled(_, signal, _)) => return Ok(end_by(signal)),
                    Ok(WaitStatus::Stopped(..)) => stop_with(program_group),
                    Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::EINTR) => break,
                    Ok(_) => {}
                    Err(e) => return Err(e.into()),
                }
            },
            // Continued (`fg`, `bg`): the program goes on too.
            Signal::SIGCONT => {
                let _ = nix::sys::signal::kill(program_group, Signal::SIGCONT);
            }
            passed => {
                let _ = nix::sys::signal::kill(program_group, passed);
            }
        }
    }
}

/// The program stopped: stops this process's group (bubblewrap's, this process included), so
/// that `agentvfs run` sees the stop and passes it on to the caller's shell. With SIGSTOP
/// whatever stopped the program: that group is orphaned (bubblewrap leads a session of its
/// own), and the kernel discards SIGTSTP, SIGTTIN and SIGTTOU there. Returns once continued,
/// or at once when a continue already waits for this process (the stop was passed out, and
/// `fg` came, before the program's stop was seen here): stopping then would swallow that
/// continue, as a stop signal discards a pending SIGCONT, and leave the job stopped after
/// `fg`.
fn stop_with(program_group: Pid) {
    if super::job::continue_pending() {
        let _ = nix::sys::signal::kill(program_group, Signal::SIGCONT);
        return;
    }
    // SIGSTOP cannot be caught, blocked or ignored: the stop happens before `kill` returns.
    let _ = nix::sys::signal::kill(Pid::from_raw(0), Signal::SIGSTOP);
}

/// Ends this process by `signal`, the way the program ended, so that bubblewrap and
/// `agentvfs run` report the same (128 + its number); with no core dump of this process.
fn end_by(signal: Signal) -> ExitCode {
    let none = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: setrlimit reads the struct; signal and sigprocmask touch no memory of ours.
    unsafe {
        libc::setrlimit(libc::RLIMIT_CORE, &none);
        libc::signal(signal as libc::c_int, libc::SIG_DFL);
    }
    let mut set = SigSet::empty();
    set.add(signal);
    let _ = nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&set), None);
    let _ = nix::sys::signal::raise(signal);
    ExitCode::from((128 + signal as i32).clamp(0, 255) as u8)
}
