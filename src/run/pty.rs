//! The sandbox's own pseudo-terminal. When the caller's stdin, stdout or stderr is a terminal,
//! the sandbox gets a pty in its place, and `agentvfs run` relays bytes between the two, as
//! `ssh -t` does: the program inside can never reach the caller's terminal, neither by a
//! descriptor nor as its controlling terminal, so it cannot take it from the caller's shell
//! (`tcsetpgrp`) and read what the human types there after it stops or ends.
//!
//! Keystrokes are relayed, with the caller's terminal in raw mode so that Ctrl-C, Ctrl-Z and
//! the rest reach the pty's line discipline (and so the program) as bytes, only while the run
//! is interactive (stdin and stdout both the terminal) and its job holds the terminal. The raw
//! mode is undone whenever `agentvfs run` stops or ends, panics or crashes.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};

use anyhow::{Context, Result};

/// The caller's terminal, as this process's stdin, stdout and stderr show it.
pub struct Caller {
    /// Which of stdin, stdout and stderr are terminals (the sandbox gets the pty's slave
    /// for those).
    stdio: [bool; 3],
    /// The first of them that is a terminal: its modes, size and foreground group.
    control: RawFd,
    /// Where the program's terminal output goes: stdout, else stderr, else stdin.
    out: RawFd,
}

impl Caller {
    /// The caller's terminal, if any of stdin, stdout and stderr is one.
    pub fn find() -> Option<Caller> {
        // SAFETY: isatty only asks about the descriptors.
        let stdio = [0, 1, 2].map(|fd| unsafe { libc::isatty(fd) } == 1);
        let control = (0..3).find(|&fd| stdio[fd as usize])?;
        let out = [1, 2, 0].into_iter().find(|&fd| stdio[fd as usize])?;
        Some(Caller { stdio, control, out })
    }

    /// The terminal's modes now.
    fn modes(&self) -> Option<libc::termios> {
        // SAFETY: a zeroed termios is filled by tcgetattr before it is used.
        let mut modes: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor and a termios to fill.
        (unsafe { libc::tcgetattr(self.control, &mut modes) } == 0).then_some(modes)
    }

    /// Whether the human types into the program: its input and output are both the
    /// terminal. With either redirected (`agentvfs run … | less`, `… > log`) the program is
    /// not interactive, and the terminal stays the caller's job's: a pager in the same
    /// pipeline keeps reading it, and Ctrl-C or Ctrl-Z go to the job as before.
    pub fn interactive(&self) -> bool {
        self.stdio[0] && self.stdio[1]
    }

    /// Which of stdin, stdout and stderr are the terminal.
    pub fn stdio(&self) -> [bool; 3] {
        self.stdio
    }

    /// Whether this process's job holds the terminal (its shell ran it in the foreground, or
    /// `fg` brought it back); also true when the terminal is not this process's controlling
    /// terminal, where no job control stands between it and the terminal.
    pub fn in_front(&self) -> bool {
        // SAFETY: tcgetpgrp and getpgrp only read.
        let front = unsafe { libc::tcgetpgrp(self.control) };
        front < 0 || front == unsafe { libc::getpgrp() }
    }

    /// The terminal's window size.
    fn size(&self) -> libc::winsize {
        // SAFETY: a zeroed winsize is valid; TIOCGWINSZ fills it.
        let mut size: libc::winsize = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor and a winsize to fill.
        unsafe { libc::ioctl(self.control, libc::TIOCGWINSZ, &mut size) };
        size
    }

    /// Puts the terminal in raw mode until the guard is dropped (or this process crashes),
    /// from the modes it has now (the shell's for its jobs; it may have had others at the
    /// start, its own line editor's, when the job started in the background). Called only
    /// with the job in front: from the background, the kernel would stop it (SIGTTOU) or,
    /// with SIGTTOU blocked, change the modes under the caller's shell.
    pub fn raw(&self) -> Option<Raw> {
        let saved = self.modes()?;
        let mut raw = saved;
        // SAFETY: cfmakeraw edits the copy; tcsetattr reads it.
        unsafe {
            libc::cfmakeraw(&mut raw);
            remember(self.control, &saved);
            libc::tcsetattr(self.control, libc::TCSADRAIN, &raw);
        }
        Some(Raw { fd: self.control, saved })
    }
}

/// The caller's terminal in raw mode; dropping it puts the modes back.
pub struct Raw {
    fd: RawFd,
    saved: libc::termios,
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: the descriptor and modes are the ones `Caller::raw` used. SIGTTOU is
        // blocked in this process, so this works from the background too.
        unsafe { libc::tcsetattr(self.fd, libc::TCSADRAIN, &self.saved) };
        forget();
    }
}

/// The modes a crash puts back (see [`restore_on_crash`]): the descriptor, -1 when the
/// terminal is not raw, and the modes, written before the descriptor is published.
static RAW_FD: AtomicI32 = AtomicI32::new(-1);
static mut SAVED: std::mem::MaybeUninit<libc::termios> = std::mem::MaybeUninit::uninit();

/// # Safety
/// Called by the one thread that relays, never concurrently.
unsafe fn remember(fd: RawFd, saved: &libc::termios) {
    RAW_FD.store(-1, Ordering::SeqCst);
    // SAFETY: no handler reads SAVED while RAW_FD is -1; only this thread writes it.
    unsafe { (*std::ptr::addr_of_mut!(SAVED)).write(*saved) };
    RAW_FD.store(fd, Ordering::SeqCst);
}

fn forget() {
    RAW_FD.store(-1, Ordering::SeqCst);
}

/// A crash (abort, a double panic, a bad access) would leave the caller's terminal raw, with
/// no echo and no line editing: these handlers put the modes back first, then the signal
/// goes on to its default action (they run once, `SA_RESETHAND`). A panic unwinds and drops
/// [`Raw`]; SIGINT, SIGTERM, SIGHUP and SIGQUIT are handled by the signal loop; only SIGKILL
/// leaves the terminal raw (`reset` repairs it).
pub fn restore_on_crash() {
    extern "C" fn put_back(_: libc::c_int) {
        let fd = RAW_FD.swap(-1, Ordering::SeqCst);
        if fd >= 0 {
            // SAFETY: SAVED was written before RAW_FD named `fd`; tcsetattr is
            // async-signal-safe.
            unsafe { libc::tcsetattr(fd, libc::TCSANOW, (*std::ptr::addr_of!(SAVED)).as_ptr()) };
        }
    }
    for signal in [libc::SIGABRT, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGSEGV] {
        // SAFETY: a zeroed sigaction with a handler that only makes async-signal-safe calls.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = put_back as extern "C" fn(libc::c_int) as usize;
            action.sa_flags = libc::SA_RESETHAND | libc::SA_ONSTACK | libc::SA_NODEFER;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// The pty: the master stays here, the slave goes to the sandbox.
pub struct Pty {
    master: OwnedFd,
    slave: Option<OwnedFd>,
}

impl Pty {
    /// A new pty with the caller's terminal's window size, and its modes when the job is in
    /// front (in the background they may be the shell's line editor's, no echo and no
    /// line at a time: the pty then starts with the kernel's defaults). Opened as the user
    /// who runs the program (the slave is theirs).
    pub fn open(caller: &Caller) -> Result<Pty> {
        let size = caller.size();
        let modes = caller.modes().filter(|_| caller.in_front()).map(nix::sys::termios::Termios::from);
        let pair = nix::pty::openpty(Some(&size), modes.as_ref()).context("opening a pseudo-terminal")?;
        for fd in [pair.master.as_raw_fd(), pair.slave.as_raw_fd()] {
            // SAFETY: fcntl on descriptors this process owns.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        }
        // The relay must never block on the master: a program that neither reads its input
        // nor lets its output drain must not hold the signal loop.
        // SAFETY: as above.
        unsafe {
            let flags = libc::fcntl(pair.master.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(pair.master.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
        Ok(Pty { master: pair.master, slave: Some(pair.slave) })
    }

    /// The slave, for the sandbox's stdio; [`Pty::close_slave`] once the sandbox has it.
    pub fn slave(&self) -> RawFd {
        self.slave.as_ref().map_or(-1, |s| s.as_raw_fd())
    }

    /// Closes this process's copy of the slave: once every process of the sandbox has gone,
    /// the master then reads EIO, after what they wrote.
    pub fn close_slave(&mut self) {
        self.slave = None;
    }

    /// Passes the caller's window size on (the kernel sends the pty's foreground group
    /// SIGWINCH when it changed).
    pub fn resize(&self, caller: &Caller) {
        let size = caller.size();
        if size.ws_row != 0 || size.ws_col != 0 {
            // SAFETY: a valid descriptor and winsize.
            unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &size) };
        }
    }

    pub fn master(&self) -> RawFd {
        self.master.as_raw_fd()
    }
}

/// In bubblewrap's child, between fork and exec (async-signal-safe calls only): a session of
/// its own, so that the sandbox is not in the caller's and never has the caller's terminal
/// as its controlling terminal (not even `/dev/tty`); with a pty (`slave`), that is its
/// controlling terminal, and the sandbox's group its foreground.
pub fn new_session(slave: Option<RawFd>) -> std::io::Result<()> {
    // SAFETY: setsid and ioctl touch no memory of ours.
    unsafe {
        if libc::setsid() < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if let Some(fd) = slave {
            if libc::ioctl(fd, libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// Bytes on their way from one descriptor to another.
pub struct Pipe {
    pending: Vec<u8>,
    done: usize,
}

/// What a [`Pipe`] step came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Flow {
    /// Moved what could be moved; more may come.
    Open,
    /// The source has ended (end of file, EIO: a hung-up terminal, a pty whose slave is
    /// closed everywhere, or a read from the background).
    Ended,
}

impl Pipe {
    pub fn new() -> Pipe {
        Pipe { pending: Vec::new(), done: 0 }
    }

    /// Whether bytes wait to be written.
    pub fn pending(&self) -> bool {
        self.done < self.pending.len()
    }

    /// Reads once from `from` (when nothing is pending) and writes what it can to `to`.
    pub fn step(&mut self, from: RawFd, to: RawFd) -> Flow {
        if !self.pending() {
            self.pending.resize(64 * 1024, 0);
            // SAFETY: reads into the buffer, within its length.
            let n = unsafe { libc::read(from, self.pending.as_mut_ptr().cast(), self.pending.len()) };
            if n == 0 {
                self.pending.clear();
                return Flow::Ended;
            }
            if n < 0 {
                self.pending.clear();
                self.done = 0;
                let error = std::io::Error::last_os_error();
                return match error.raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::EINTR) => Flow::Open,
                    _ => Flow::Ended,
                };
            }
            self.pending.truncate(n as usize);
            self.done = 0;
        }
        self.flush(to);
        Flow::Open
    }

    /// Writes what it can of the pending bytes to `to` (all of them unless `to` is
    /// non-blocking); a descriptor that fails drops them, as a closed terminal would.
    pub fn flush(&mut self, to: RawFd) {
        while self.pending() {
            let rest = &self.pending[self.done..];
            // SAFETY: writes from the buffer, within its length.
            let n = unsafe { libc::write(to, rest.as_ptr().cast(), rest.len()) };
            if n > 0 {
                self.done += n as usize;
                continue;
            }
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => return,
                _ => self.done = self.pending.len(),
            }
        }
    }
}

/// Copies everything the master still holds to `out` once the sandbox has ended (every
/// process of it gone, so every byte it wrote is there to read).
pub fn drain(master: RawFd, out: RawFd) {
    let mut pipe = Pipe::new();
    while pipe.step(master, out) == Flow::Open && (pipe.pending() || readable(master)) {
        pipe.flush(out);
    }
}

fn readable(fd: RawFd) -> bool {
    let mut poll = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut poll, 1, 0) == 1 && poll.revents & libc::POLLIN != 0 }
}

/// A duplicate of `fd` for the child's stdio (the original stays this process's).
pub fn duplicate(fd: RawFd) -> Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor nothing else owns.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if new < 0 {
        return Err(std::io::Error::last_os_error()).context("duplicating the pty's slave");
    }
    // SAFETY: just made.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// The pty and the caller's terminal, and the bytes between them.
pub struct Console {
    caller: Caller,
    pty: Pty,
    /// The caller's terminal in raw mode, while keystrokes are relayed.
    raw: Option<Raw>,
    /// Whether keystrokes are relayed now (interactive, and the job in front).
    typing: bool,
    keys: Pipe,
    screen: Pipe,
    /// Whether the master may still have output (it reads EIO once no slave is open).
    open: bool,
}

impl Console {
    /// A pty for the sandbox, when any of stdin, stdout and stderr is a terminal.
    pub fn open() -> Result<Option<Console>> {
        let Some(caller) = Caller::find() else { return Ok(None) };
        let pty = Pty::open(&caller)?;
        restore_on_crash();
        Ok(Some(Console {
            caller,
            pty,
            raw: None,
            typing: false,
            keys: Pipe::new(),
            screen: Pipe::new(),
            open: true,
        }))
    }

    pub fn stdio(&self) -> [bool; 3] {
        self.caller.stdio()
    }

    pub fn slave(&self) -> RawFd {
        self.pty.slave()
    }

    pub fn close_slave(&mut self) {
        self.pty.close_slave();
    }

    /// The job runs (it started, or the shell continued it): keystrokes are relayed, the
    /// caller's terminal raw, when the run is interactive and the job holds the terminal
    /// (`fg`); in the background (`bg`, `&`) the terminal is left as it is and only the
    /// program's output is shown, so a program that reads its terminal waits until `fg`. The
    /// window size is passed on, as it may have changed meanwhile.
    pub fn resume(&mut self) {
        self.pty.resize(&self.caller);
        self.typing = self.caller.interactive() && self.caller.in_front();
        if !self.typing {
            self.raw = None;
        } else if self.raw.is_none() {
            self.raw = self.caller.raw();
        }
    }

    /// The job stops: what the program wrote before it stopped is shown, and the caller's
    /// terminal gets its modes back for the shell.
    pub fn pause(&mut self) {
        self.show();
        self.raw = None;
        self.typing = false;
    }

    /// The sandbox has ended: the rest of its output is shown, and the terminal's modes put
    /// back.
    pub fn finish(&mut self) {
        if self.open {
            drain(self.pty.master(), self.caller.out);
        }
        self.raw = None;
    }

    /// How long to wait for anything else before looking whether the job was brought to
    /// the front: in the background, an interactive run learns of `fg` only by looking, as a
    /// shell continues a job that is not stopped (`bg`, `&`) without a SIGCONT.
    pub fn patience(&self) -> libc::c_int {
        if self.caller.interactive() && !self.typing {
            200
        } else {
            -1
        }
    }

    /// Starts relaying keystrokes once an interactive job in the background is in front.
    pub fn look(&mut self) {
        if self.caller.interactive() && !self.typing && self.caller.in_front() {
            self.resume();
        }
    }

    /// The caller's window changed (SIGWINCH).
    pub fn resize(&self) {
        self.pty.resize(&self.caller);
    }

    /// Shows what the master holds now, without waiting.
    fn show(&mut self) {
        while self.open && readable(self.pty.master()) {
            if self.screen.step(self.pty.master(), self.caller.out) == Flow::Ended {
                self.open = false;
            }
        }
    }

    /// What to wait for: keystrokes (while typing and none wait for the pty), the pty's
    /// output, and room in the pty for keystrokes that wait.
    pub fn wanted(&self) -> Vec<libc::pollfd> {
        let mut fds = Vec::new();
        if self.typing && !self.keys.pending() {
            fds.push(libc::pollfd { fd: 0, events: libc::POLLIN, revents: 0 });
        }
        let mut master = 0;
        if self.open {
            master |= libc::POLLIN;
        }
        if self.keys.pending() {
            master |= libc::POLLOUT;
        }
        if master != 0 {
            fds.push(libc::pollfd { fd: self.pty.master(), events: master, revents: 0 });
        }
        fds
    }

    /// Moves what [`Console::wanted`]'s poll found ready.
    pub fn serve(&mut self, polled: &[libc::pollfd]) {
        for p in polled.iter().filter(|p| p.revents != 0) {
            if p.fd == 0 {
                // EIO: the job was put in the background meanwhile (SIGTTIN is blocked here)
                // or the terminal hung up; keystrokes wait for the next continue.
                if self.keys.step(0, self.pty.master()) == Flow::Ended {
                    self.raw = None;
                    self.typing = false;
                }
            } else if p.revents & libc::POLLOUT != 0 {
                self.keys.flush(self.pty.master());
            }
            if p.fd == self.pty.master() && p.revents & !libc::POLLOUT != 0 {
                self.show_one();
            }
        }
    }

    fn show_one(&mut self) {
        if self.screen.step(self.pty.master(), self.caller.out) == Flow::Ended {
            self.open = false;
        }
    }
}
