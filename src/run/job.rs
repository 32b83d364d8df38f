//! The sandbox as a job of `agentvfs run`'s: bubblewrap leads a session of its own (see
//! [`super::pty::new_session`]), so the sandbox is out of the caller's session and its
//! terminal, and a program's `kill(0, …)` reaches nothing of the caller's. Its stops are
//! passed on to the caller's shell, which sees `agentvfs run` stop and continue with it.
//!
//! The program runs under a monitor of its own ([`super::inside`]), in a process group of its
//! own inside the sandbox: a group that is not orphaned (its parent, the monitor, is in the
//! same session), so the terminal's Ctrl-Z and a SIGTSTP stop it; the monitor passes such a
//! stop out as a SIGSTOP of bubblewrap's group (a stop signal the kernel does not discard for
//! an orphaned group), which this process sees.

/// The sandbox's session and process group (bubblewrap's pid).
pub struct Job {
    group: libc::pid_t,
    /// bubblewrap's init (the sandbox's pid 1), once known: the monitor is its child, and the
    /// program the monitor's.
    init: Option<libc::pid_t>,
}

impl Job {
    /// bubblewrap (`group`, the leader of its own session) has been spawned.
    pub fn started(group: libc::pid_t) -> Job {
        Job { group, init: None }
    }

    /// bubblewrap reported its init's pid.
    pub fn init_is(&mut self, init: Option<libc::pid_t>) {
        self.init = init;
    }

    /// The program's monitor ([`super::inside`]), or the init while there is none yet.
    fn monitor(&self) -> Option<libc::pid_t> {
        self.init.and_then(first_child).or(self.init)
    }

    /// The program's own process group.
    fn program_group(&self) -> Option<libc::pid_t> {
        let program = self.init.and_then(first_child).and_then(first_child)?;
        // SAFETY: getpgid only reads the process table.
        let group = unsafe { libc::getpgid(program) };
        (group > 0).then_some(group)
    }

    /// This process was sent SIGTSTP (a `kill -TSTP`, or the terminal's Ctrl-Z when the
    /// terminal is not raw, as in `agentvfs run … | less`): passes it to the program's group,
    /// whose monitor passes its stop out ([`Job::stop_here`]); before the program has started,
    /// stops the sandbox as it is.
    pub fn stop(&self) {
        let (group, signal) = match self.program_group() {
            Some(group) => (group, libc::SIGTSTP),
            None => (self.group, libc::SIGSTOP),
        };
        // SAFETY: kill touches no memory.
        unsafe { libc::kill(-group, signal) };
    }

    /// Passes on a SIGINT, SIGTERM, SIGHUP or SIGQUIT: the terminal's (`from_terminal`, when
    /// it is not raw) to the sandbox's group, where bubblewrap ignores SIGINT and SIGQUIT and
    /// the monitor passes them to the program's group (a hangup ends bubblewrap, and the
    /// sandbox with it); one sent by `kill` to the monitor, which passes it to the program.
    pub fn pass(&self, signal: libc::c_int, from_terminal: bool) {
        let target = match from_terminal {
            true => Some(-self.group),
            false => self.monitor(),
        };
        if let Some(pid) = target {
            // SAFETY: kill touches no memory.
            unsafe { libc::kill(pid, signal) };
        }
    }

    /// The sandbox stopped: stops this process with SIGTSTP, so that the caller's shell says
    /// `Stopped` and has its terminal again. Returns once continued (the continue then waits,
    /// blocked, for the signal loop), with true; false at once where the kernel discarded the
    /// stop (an orphaned process group: no job-control shell above, as under `tmux new
    /// 'agentvfs run …'`), where nobody would continue the sandbox, so the caller resumes it
    /// (Ctrl-Z does nothing there, as for any program).
    pub fn stop_here(&self) -> bool {
        raise_unblocked(libc::SIGTSTP);
        continue_pending()
    }

    /// Continues the sandbox (its monitor then continues the program's group).
    pub fn resume(&self) {
        // SAFETY: kill touches no memory.
        unsafe { libc::kill(-self.group, libc::SIGCONT) };
    }
}

/// Sends this process `signal` with it unblocked for the moment (the stop signals are
/// blocked here, read from the signal loop): its default action, a stop, happens before the
/// `kill` returns, unless the kernel discards it (an orphaned group).
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

/// The first child of process `pid` (bubblewrap's init has one: the monitor, whose one child
/// is the program).
pub(super) fn first_child(pid: i32) -> Option<i32> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    children.split_whitespace().next()?.parse().ok()
}
