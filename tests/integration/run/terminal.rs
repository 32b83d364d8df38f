//! `agentvfs run` driven through a pseudo-terminal of the test's own, the caller's terminal as
//! a job-control shell sees it: the program inside has a terminal of its own, never the
//! caller's, so it cannot take the caller's terminal from the shell and read what the human
//! types there once the run stops or ends.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::Setup;

/// A shell on a pty of the test's: the shell's session, with the pty its controlling
/// terminal; the test types into the master and reads what the shell shows.
struct Terminal {
    master: std::fs::File,
    child: Child,
    seen: String,
    /// The slave's device number (what `st_rdev` says of the caller's terminal).
    device: u64,
}

impl Terminal {
    /// Starts `bash script` on a new 120x40 pty.
    fn start(script: &std::path::Path) -> Terminal {
        let size = nix::pty::Winsize { ws_row: 40, ws_col: 120, ws_xpixel: 0, ws_ypixel: 0 };
        let pair = nix::pty::openpty(Some(&size), None).unwrap();
        let device = nix::sys::stat::fstat(pair.slave.as_raw_fd()).unwrap().st_rdev;
        let slave = |pair: &OwnedFd| Stdio::from(pair.try_clone().unwrap());
        let mut command = Command::new("bash");
        command.args(["--norc", "--noprofile"]).arg(script);
        command.stdin(slave(&pair.slave)).stdout(slave(&pair.slave)).stderr(slave(&pair.slave));
        // SAFETY: setsid and ioctl between fork and exec, on the child's own descriptors.
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().unwrap();
        drop(pair.slave);
        Terminal { master: std::fs::File::from(pair.master), child, seen: String::new(), device }
    }

    /// Waits (up to 20 s) until the terminal has shown `text`; returns all it has shown.
    fn wait_for(&mut self, text: &str) -> String {
        self.wait_until(text, || false)
    }

    /// Waits (up to 20 s) until the terminal has shown `text`, or `besides` holds.
    fn wait_until(&mut self, text: &str, besides: impl Fn() -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.seen.contains(text) && !besides() {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "{text:?} not shown; the terminal showed:\n{}", self.seen);
            let mut poll = libc::pollfd { fd: self.master.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut poll, 1, left.as_millis().min(100) as i32) } != 1 {
                continue;
            }
            let mut buffer = [0u8; 4096];
            match std::io::Read::read(&mut self.master, &mut buffer) {
                Ok(0) | Err(_) => panic!("the terminal closed before {text:?}:\n{}", self.seen),
                Ok(n) => self.seen.push_str(&String::from_utf8_lossy(&buffer[..n])),
            }
        }
        self.seen.clone()
    }

    fn type_(&mut self, text: &str) {
        self.master.write_all(text.as_bytes()).unwrap();
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        // SAFETY: the shell's session (its pid leads it) is the test's to end.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// The attack: a child in a group of its own, ignoring SIGTTOU and SIGTTIN, takes the terminal
/// (`/dev/tty`) with `tcsetpgrp` in a loop and reads it, noting in /host/stolen what it took
/// and read; once it has the terminal, its parent stops the program's group, as Ctrl-Z would.
const ATTACK: &str = r#"
import fcntl, os, signal, struct
tty = os.open("/dev/tty", os.O_RDWR)
# TIOCGDEV: the terminal's device number, the same for /dev/tty as for the terminal it is.
device = lambda fd: struct.unpack("I", fcntl.ioctl(fd, 0x80045432, b"\0" * 4))[0]
print("devices %d %d %d" % (device(0), device(1), device(tty)), flush=True)
r, w = os.pipe()
if os.fork() == 0:
    os.setpgid(0, 0)
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    signal.signal(signal.SIGTTIN, signal.SIG_IGN)
    out = os.open("/host/stolen", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    told = False
    while True:
        try:
            os.tcsetpgrp(tty, os.getpgrp())
        except OSError:
            continue
        if not told:
            os.write(out, b"took\n")
            os.write(w, b"x")
            told = True
        try:
            data = os.read(tty, 100)
        except OSError:
            continue
        os.write(out, b"read:" + data + b"\n")
os.read(r, 1)
os.kill(0, signal.SIGTSTP)
print("continued", flush=True)
"#;

/// A program that takes `/dev/tty` from a background group and reads it gets its own pty
/// only: once it has stopped the run (the shell says it stopped and has its terminal again),
/// what the human types goes to the shell, and nothing of it reaches the program. Inside,
/// stdin, stdout and `/dev/tty` are one terminal, not the caller's.
#[test]
fn a_program_cannot_take_the_callers_terminal_and_read_what_is_typed_after_it_stops() {
    let s = Setup::new();
    s.make_home();
    let attack = s.f.host_root.join("attack.py");
    std::fs::write(&attack, ATTACK).unwrap();
    let script = s.f.scratch.path().join("caller.sh");
    let text = format!(
        "set -m\n{}\necho \"stopped-$?\"\nread -r line\necho \"shell-got:$line\"\nfg\necho \"rc=$?\"\nread -r end\n",
        s.run_as_nobody("python3 /host/attack.py")
    );
    std::fs::write(&script, text).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut t = Terminal::start(&script);
    // The run stopped as a job does on Ctrl-Z (128 + SIGTSTP), with the program's child
    // holding its terminal; the human types a line into the caller's terminal.
    t.wait_for("stopped-148");
    t.type_("echo secret\n");
    let stolen = || std::fs::read_to_string(s.f.host_root.join("stolen")).unwrap_or_default();
    let seen = t.wait_until("shell-got:", || stolen().contains("read:"));
    assert_eq!(stolen(), "took\n", "the program's child read what was typed to the shell");
    assert!(seen.contains("shell-got:echo secret\r\n"), "{seen}");
    // `fg`: the program goes on and ends; its child, which took its own terminal, read
    // nothing.
    t.wait_for("rc=0");
    assert!(t.seen.contains("continued\r\n"), "{}", t.seen);
    assert_eq!(stolen(), "took\n", "the program's child read what was typed after `fg`");
    t.type_("\n");
    assert_eq!(t.child.wait().unwrap().code(), Some(0), "{}", t.seen);
    // The program's terminal: one device for stdin, stdout and /dev/tty, not the caller's.
    let line =
        t.seen.lines().find_map(|l| l.strip_prefix("devices ")).unwrap_or_else(|| panic!("{}", t.seen));
    let devices: Vec<u64> = line.trim().split(' ').map(|d| d.parse().unwrap()).collect();
    assert_eq!(devices.len(), 3, "{}", t.seen);
    assert!(devices.iter().all(|&d| d == devices[0] && d != t.device), "{devices:?} vs {}", t.device);
}
