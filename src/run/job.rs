//! The sandbox as a job of its own on the caller's terminal: its own process group, so that a
//! program's `kill(0, …)` reaches the sandbox and nothing of the caller's; the terminal's
//! foreground while it runs, as a shell gives it to a job; and its stops and continues passed
//! on to the caller's shell, which sees `agentvfs run` stop and continue with it.
//!
//! Everything here is what a job-control shell does for each job (POSIX "General Terminal
//! Interface"), done by the one parent the sandbox has outside its PID namespace.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// The caller's controlling terminal and the process group `agentvfs run` was started in.
pub struct Terminal {
    fd: OwnedFd,
    ours: libc::pid_t,
}

impl Terminal {
    /// The controlling terminal, if this process has one.
    pub fn open() -> Option<Terminal> {
        let flags = libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOCTTY;
        // SAFETY: a constant C string; the descriptor is owned right away.
        let fd = unsafe { libc::open(c"/dev/tty".as_ptr(), flags) };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` was just opened and nothing else owns it.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        // SAFETY: getpgrp cannot fail.
        Some(Terminal { fd, ours: unsafe { libc::getpgrp() } })
    }

    /// Whether the caller's job holds the terminal (its shell ran us in the foreground).
    pub fn ours_in_front(&self) -> bool {
        self.front() == Some(self.ours)
    }

    /// Whether the sandbox should get the terminal: the caller's job holds it, and the
    /// program's input and output are the terminal. With either redirected (`agentvfs run … |
    /// less`, `… < /dev/null &` in a script) the program is not interactive, and taking the
    /// terminal would stop the caller's other commands that use it (a pager stopped that way
    /// would stop draining the pipe, and the program with it).
    pub fn for_the_sandbox(&self) -> bool {
        // SAFETY: isatty only asks about the descriptors.
        self.ours_in_front() && unsafe { libc::isatty(0) == 1 && libc::isatty(1) == 1 }
    }

    /// The terminal's foreground process group.
    fn front(&self) -> Option<libc::pid_t> {
        // SAFETY: a valid descriptor.
        let group = unsafe { libc::tcgetpgrp(self.fd.as_raw_fd()) };
        (group > 0).then_some(group)
    }

    /// Gives the terminal to `group`. Allowed from the background because SIGTTOU is blocked
    /// in this process (the kernel then lets `tcsetpgrp` through instead of stopping us).
    fn give(&self, group: libc::pid_t) {
        // SAFETY: a valid descriptor; failure leaves the terminal as it was.
        unsafe { libc::tcsetpgrp(self.fd.as_raw_fd(), group) };
    }

    /// The descriptor, for the child's setup between fork and exec ([`enter_own_group`]).
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// In the child, between fork and exec (async-signal-safe calls only): makes it the leader of
/// a process group of its own and, given the terminal (`Some`), that group the foreground.
/// SIGTTOU is still blocked here, as in the parent, so `tcsetpgrp` from what is now a
/// background group is let through.
pub fn enter_own_group(terminal: Option<RawFd>) -> std::io::Result<()> {
    // SAFETY: setpgid, getpid and tcsetpgrp are async-signal-safe and touch no memory.
    unsafe {
        if libc::setpgid(0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if let Some(fd) = terminal {
            libc::tcsetpgrp(fd, libc::getpid());
        }
    }
    Ok(())
}

/// The sandbox's process group (bubblewrap's pid) as a job on the terminal.
pub struct Job {
    group: libc::pid_t,
    terminal: Option<Terminal>,
    /// Whether the sandbox was given the terminal (it is ours to take back when it stops or
    /// ends), and the group inside it that held the terminal when it stopped.
    given: bool,
    front_inside: Option<libc::pid_t>,
    /// bubblewrap's init (the sandbox's pid 1), once known, and whether the program runs under
    /// a monitor of its own that gave it a group of its own ([`super::inside`]: when the
    /// sandbox was given the terminal at the start).
    init: Option<libc::pid_t>,
    monitored: bool,
}

impl Job {
    /// Bubblewrap (`group`) has been spawned; `given` says whether [`enter_own_group`] gave
    /// it the terminal. Both are done here too, as shells do, so that neither order of the
    /// child's exec and this call leaves the job half set up.
    pub fn started(group: libc::pid_t, terminal: Option<Terminal>, given: bool) -> Job {
        // SAFETY: setpgid touches no memory; EACCES once the child has exec'd is expected.
        unsafe { libc::setpgid(group, group) };
        let job = Job { group, terminal, given, front_inside: None, init: None, monitored: given };
        if given {
            if let Some(t) = &job.terminal {
                t.give(group);
            }
        }
        job
    }

    /// bubblewrap reported its init's pid.
    pub fn init_is(&mut self, init: Option<libc::pid_t>) {
        self.init = init;
    }

    /// The group that gets the terminal when the sandbox gets it back and no group inside held
    /// it at the stop: the program's own under a monitor (the monitor's child), else the
    /// sandbox's.
    fn front_group(&self) -> libc::pid_t {
        let program = self.init.filter(|_| self.monitored).and_then(first_child).and_then(first_child);
        // SAFETY: getpgid only reads the process table.
        let group = program.map(|p| unsafe { libc::getpgid(p) });
        group.filter(|&g| g > 0).unwrap_or(self.group)
    }

    /// Whether the sandbox holds the terminal (what the terminal sends goes to it then).
    pub fn holds_terminal(&self) -> bool {
        self.given
    }

    /// This process was sent SIGTSTP (the terminal's Ctrl-Z when the sandbox does not hold
    /// it, as in `agentvfs run … | less`, or a `kill -TSTP`): passes it to the sandbox (to the
    /// program's own group under a monitor); its stop then stops this process
    /// ([`Job::stopped`]).
    pub fn stop(&self) {
        // Under a monitor, to the program's group only: the monitor passes its stop out, and
        // stopped itself it would not see the program's stop until the next `fg`.
        let group = self.front_group();
        // SAFETY: kill touches no memory.
        unsafe { libc::kill(-group, libc::SIGTSTP) };
    }

    /// Bubblewrap stopped with `signal` (the terminal's Ctrl-Z, or a read or write on the
    /// terminal from the background): takes the terminal back if the sandbox held it and
    /// stops this process with the same signal, so the caller's shell sees the job stopped.
    /// Where this process cannot be stopped (the kernel discards SIGTSTP, SIGTTIN and SIGTTOU
    /// for an orphaned process group: no job-control shell above it, as under `tmux new
    /// 'agentvfs run …'`), nobody would continue the sandbox: after Ctrl-Z it is continued at
    /// once (Ctrl-Z does nothing there, as for any program), and after a read or write of the
    /// terminal it is sent SIGHUP and SIGCONT, what the kernel sends a stopped group that
    /// becomes orphaned.
    pub fn stopped(&mut self, signal: libc::c_int) {
        if let Some(t) = &self.terminal {
            let front = t.front();
            if self.given && front != Some(t.ours) {
                self.front_inside = front;
                t.give(t.ours);
            }
        }
        let raise = match signal {
            libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU => signal,
            _ => libc::SIGSTOP,
        };
        raise_unblocked(raise);
        // Continued (SIGCONT is blocked here, so it waits as pending): the signal loop
        // resumes the sandbox. Not stopped: the signal was discarded.
        if !continue_pending() && raise != libc::SIGSTOP {
            if raise != libc::SIGTSTP {
                // SAFETY: kill touches no memory.
                unsafe { libc::kill(-self.group, libc::SIGHUP) };
            }
            self.continued();
        }
    }

    /// This process was continued (`fg` or `bg` in the caller's shell): gives the sandbox
    /// the terminal again if the caller's job holds it now (back to the group inside that held
    /// it, if that group still exists), and continues the sandbox.
    pub fn continued(&mut self) {
        if let Some(t) = &self.terminal {
            // In front again (`fg`): the sandbox gets the terminal back, if it had it or
            // should; in the background (`bg`): it has none to take back later.
            let front_again = t.ours_in_front() && (self.given || t.for_the_sandbox());
            let inside = self.front_inside.take();
            if front_again {
                // SAFETY: kill with signal 0 only checks that the group exists.
                let inside = inside.filter(|g| unsafe { libc::kill(-g, 0) } == 0);
                t.give(inside.unwrap_or_else(|| self.front_group()));
            }
            self.given = front_again;
        }
        // SAFETY: kill touches no memory.
        unsafe { libc::kill(-self.group, libc::SIGCONT) };
    }

    /// The sandbox ended: the terminal goes back to the caller's job, and what of that job
    /// stopped while the sandbox held it (another command of the job that used the terminal)
    /// is continued.
    pub fn ended(&mut self) {
        let Some(t) = &self.terminal else { return };
        if self.given && t.front() != Some(t.ours) {
            t.give(t.ours);
            // SAFETY: kill touches no memory; SIGCONT to a running process does nothing.
            unsafe { libc::kill(0, libc::SIGCONT) };
        }
    }
}

/// Sends this process `signal` with it unblocked for the moment (SIGTTOU is blocked here,
/// so that the terminal can be handed over from the background): its default action, a stop,
/// happens before the `kill` returns, unless the kernel discards it (an orphaned group).
fn raise_unblocked(signal: libc::c_int) {
    // SAFETY: the set is initialised by sigemptyset before use; sigprocmask, kill and getpid
    // touch nothing else.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        let mut before: libc::sigset_t = std::mem::zeroed();
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, &mut before);
        libc::kill(libc::getpid(), signal);
        libc::sigprocmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
    }
}

/// Whether a SIGCONT waits (blocked) for this process.
pub(super) fn continue_pending() -> bool {
    // SAFETY: sigpending fills the zeroed set; sigismember only reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigpending(&mut set) == 0 && libc::sigismember(&set, libc::SIGCONT) == 1
    }
}

/// The first child of process `pid` (bubblewrap's init has one: the program, or its monitor).
pub(super) fn first_child(pid: i32) -> Option<i32> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    children.split_whitespace().next()?.parse().ok()
}
