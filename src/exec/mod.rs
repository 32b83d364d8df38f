//! The `execute` sandbox: runs `sh -c COMMAND` with bubblewrap in fresh mount, PID, IPC, UTS
//! (and, unless allowed, network) namespaces whose only writable world is the agentvfs mount,
//! as an unprivileged uid with no capabilities. See `doc/execute.md` for the threat model.
//!
//! The daemon runs as root, so bubblewrap needs no user namespace (and none is made: inside
//! one, the command's writes would reach the mount as root). bubblewrap builds the tree and
//! keeps only the capabilities `setpriv` needs to switch to the configured uid/gid, clear the
//! groups and empty the bounding set; `no_new_privs` is set by both, so nothing the command
//! runs can gain privileges back. The command is PID 2 under bubblewrap's own init: killing
//! the outer bubblewrap process kills that init (`--die-with-parent`), and the kernel then
//! kills every process left in the PID namespace, so a timeout leaves nothing behind.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::config::ExecConfig;

pub mod confine;
pub mod identity;

/// Top-level names that belong to the sandbox's system layout; an entry of the virtual tree
/// with one of these names is not shown (it would hide the host's programs or the kernel's
/// views, and `/tmp` is handled on its own).
pub const RESERVED: [&str; 12] =
    ["bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "sys", "usr", "tmp"];

/// Host system directories that may be symlinks (merged `/usr`) or real directories.
const SYSTEM_DIRS: [&str; 6] = ["bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// The part of the host's `/etc` that ordinary tools need: user and group names, name
/// resolution, the dynamic loader's cache, Debian's alternatives, time zone, certificates.
/// Everything else of `/etc` (and so any config file or secret kept there) stays out.
const ETC_FILES: [&str; 17] = [
    "passwd",
    "group",
    "hosts",
    "host.conf",
    "resolv.conf",
    "nsswitch.conf",
    "gai.conf",
    "services",
    "protocols",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "localtime",
    "os-release",
    "ssl",
    "ca-certificates",
];

/// The size cap of the private `/tmp` (a tmpfs lives in memory).
const TMP_BYTES: &str = "1073741824";

/// `PATH` inside the sandbox unless the caller gives its own.
pub const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// One entry at the top of the virtual tree, as the sandbox shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TopEntry {
    /// A directory or file, bound from the mount (so every access passes the gate). The
    /// source is an `O_PATH` descriptor opened without following symlinks, never a path:
    /// bubblewrap resolves paths in the host's namespace, so an entry swapped for a symlink
    /// between the listing and the bind would otherwise bind whatever host file it names.
    Bind(String),
    /// A symlink, recreated with its target (which the kernel resolves inside the sandbox,
    /// where virtual paths are real paths).
    Symlink { name: String, target: Vec<u8> },
}

impl TopEntry {
    pub fn name(&self) -> &str {
        match self {
            TopEntry::Bind(name) | TopEntry::Symlink { name, .. } => name,
        }
    }
}

/// What one command runs in: the mount, the config, and the tree's top-level entries.
pub struct Plan<'a> {
    pub mountpoint: &'a Path,
    pub config: &'a ExecConfig,
    pub entries: Vec<TopEntry>,
    /// Who the command runs as (uid, gid): `[exec]`'s identity, or the calling agent's own
    /// ([`Plan::user_for`]).
    pub user: (u32, u32),
}

/// How a command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finished {
    /// Its exit status: the code, or 128 + the signal that killed it (as the shell reports).
    Exited(i32),
    /// It ran past its timeout and its whole process tree was killed.
    TimedOut,
}

/// What a command printed (each stream cut at the capture limit) and how it ended.
#[derive(Debug)]
pub struct Outcome {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Whether either stream was longer than the capture limit.
    pub cut: bool,
    pub finished: Finished,
}

/// Why a command could not be started.
#[derive(Debug)]
pub struct Unavailable(pub String);

/// Who the sandboxed program runs as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunAs {
    /// bubblewrap runs as root (the daemon) and keeps only what `setpriv` needs to switch to
    /// this uid and gid, clear the groups and empty every capability set (`execute`).
    Switch { uid: u32, gid: u32 },
    /// bubblewrap runs as the caller, an unprivileged user, and drops every capability
    /// (`--cap-drop ALL`); it makes a user namespace when it is not setuid (`agentvfs run`).
    Caller,
}

/// What differs between the sandboxes of `execute` and `agentvfs run`; the rest (the tree,
/// the read-only system paths, the minimal `/etc`, `/proc`, `/dev`, `/tmp`) is the same.
pub struct Options<'a> {
    /// Share the host's network; otherwise an empty network namespace.
    pub network: bool,
    /// `--new-session`: no terminal (`execute`: no TIOCSTI into the daemon's). Without it
    /// the program keeps the session its parent gave it (`agentvfs run`: a session of its
    /// own, with a pty of its own as its terminal).
    pub new_session: bool,
    /// The working directory, a virtual path.
    pub cwd: &'a str,
    /// The environment besides `PATH` (which is always [`PATH`] unless given here).
    pub env: &'a [(&'a str, OsString)],
    pub run_as: RunAs,
    /// More files bound read-only from descriptors (in bubblewrap's process): (fd, where).
    /// Their parents are made on the sandbox's own root, which must not be a tree entry.
    pub ro_binds: &'a [(RawFd, &'a str)],
    /// The program and its arguments.
    pub argv: &'a [OsString],
}

/// In a child between `fork` and `exec` (async-signal-safe): every descriptor above stderr
/// is closed at the `exec` except `fds` (bubblewrap's bind sources, which it closes once
/// bound), so nothing else its parent holds reaches the sandbox.
pub fn pass_only(fds: &[RawFd]) -> std::io::Result<()> {
    // SAFETY: system calls on descriptors only.
    unsafe {
        if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        for &fd in fds {
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// Finds `program` in this process's `PATH`.
pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/bin:/bin"));
    std::env::split_paths(&path).map(|dir| dir.join(program)).find(|p| p.is_file())
}

/// Opens the mount's entry for each [`TopEntry::Bind`] (`O_PATH | O_NOFOLLOW`); entries
/// that vanished or turned into symlinks since the listing are left out.
pub fn open_sources(mountpoint: &Path, entries: &[TopEntry]) -> HashMap<String, OwnedFd> {
    let mut fds = HashMap::new();
    for entry in entries {
        let TopEntry::Bind(name) = entry else { continue };
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
            .open(mountpoint.join(name));
        let Ok(file) = opened else { continue };
        match file.metadata() {
            Ok(m) if !m.file_type().is_symlink() => {
                fds.insert(name.clone(), OwnedFd::from(file));
            }
            _ => {}
        }
    }
    fds
}

/// The bubblewrap arguments, up to and including the program, for a sandbox whose file
/// system is the tree's `entries` (bound from `sources`, descriptors in bubblewrap's
/// process) and the host's read-only system paths.
pub fn bwrap_args(
    entries: &[TopEntry],
    sources: &HashMap<String, RawFd>,
    options: &Options,
) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::new();
    let mut push = |items: &[&[u8]]| {
        for item in items {
            a.push(OsString::from(std::ffi::OsStr::from_bytes(item)));
        }
    };
    push(&[b"--die-with-parent"]);
    if options.new_session {
        push(&[b"--new-session"]);
    }
    push(&[b"--unshare-pid", b"--unshare-ipc"]);
    push(&[b"--unshare-uts", b"--hostname", b"agentvfs", b"--unshare-cgroup-try"]);
    if !options.network {
        push(&[b"--unshare-net"]);
    }
    // An empty root; it is made read-only once everything is in place, so the only
    // writable places are the mount's entries and /tmp.
    push(&[b"--tmpfs", b"/", b"--ro-bind", b"/usr", b"/usr"]);
    for dir in SYSTEM_DIRS {
        let host = Path::new("/").join(dir);
        let dest = format!("/{dir}");
        match std::fs::symlink_metadata(&host) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(&host) {
                    push(&[b"--symlink", target.as_os_str().as_bytes(), dest.as_bytes()]);
                }
            }
            Ok(m) if m.is_dir() => push(&[b"--ro-bind", dest.as_bytes(), dest.as_bytes()]),
            _ => {}
        }
    }
    push(&[b"--dir", b"/etc"]);
    for name in ETC_FILES {
        let path = format!("/etc/{name}");
        push(&[b"--ro-bind-try", path.as_bytes(), path.as_bytes()]);
    }
    push(&[b"--proc", b"/proc", b"--dev", b"/dev"]);
    // bubblewrap's /dev/shm is its own directory (root's, 0755 while it runs as root): POSIX
    // shared memory needs a sticky world-writable one, capped as /tmp is.
    push(&[b"--perms", b"1777", b"--size", TMP_BYTES.as_bytes(), b"--tmpfs", b"/dev/shm"]);
    // The rest of /dev is bubblewrap's own tmpfs, uncapped: read-only (its device nodes still
    // work; /dev/shm and /dev/pts are mounts of their own).
    push(&[b"--remount-ro", b"/dev"]);
    let mut has_tmp = false;
    for entry in entries {
        let dest = format!("/{}", entry.name());
        match entry {
            TopEntry::Bind(name) => {
                let Some(fd) = sources.get(name) else { continue };
                // bubblewrap closes the descriptor once bound: the command must not get it,
                // since `..` from a descriptor of the host's mount leads out of the sandbox.
                push(&[b"--bind-fd", fd.to_string().as_bytes(), dest.as_bytes()]);
                has_tmp |= name == "tmp";
            }
            TopEntry::Symlink { target, .. } => push(&[b"--symlink", target, dest.as_bytes()]),
        }
    }
    if !has_tmp {
        // No /tmp in the tree: a private, world-writable tmpfs that lives as long as the
        // command (the host's /tmp is never shown), capped so it cannot eat the memory.
        push(&[b"--perms", b"1777", b"--size", TMP_BYTES.as_bytes(), b"--tmpfs", b"/tmp"]);
    }
    for (fd, dest) in options.ro_binds {
        push(&[b"--ro-bind-fd", fd.to_string().as_bytes(), dest.as_bytes()]);
    }
    push(&[b"--remount-ro", b"/", b"--chdir", options.cwd.as_bytes()]);
    push(&[b"--clearenv"]);
    if !options.env.iter().any(|(name, _)| *name == "PATH") {
        push(&[b"--setenv", b"PATH", PATH.as_bytes()]);
    }
    for (name, value) in options.env {
        push(&[b"--setenv", name.as_bytes(), value.as_bytes()]);
    }
    match options.run_as {
        RunAs::Switch { uid, gid } => {
            // Only what setpriv needs to become the configured user; it drops them again.
            push(&[b"--cap-add", b"CAP_SETUID", b"--cap-add", b"CAP_SETGID", b"--cap-add", b"CAP_SETPCAP"]);
            push(&[b"--", b"setpriv"]);
            let (uid, gid) = (format!("--reuid={uid}"), format!("--regid={gid}"));
            push(&[uid.as_bytes(), gid.as_bytes(), b"--clear-groups", b"--inh-caps=-all"]);
            push(&[b"--bounding-set=-all", b"--no-new-privs", b"--"]);
        }
        RunAs::Caller => push(&[b"--cap-drop", b"ALL", b"--"]),
    }
    for arg in options.argv {
        push(&[arg.as_bytes()]);
    }
    a
}

impl Plan<'_> {
    /// Who a command of `caller` (the agent socket's peer: uid, gid) runs as: a caller that is
    /// not root runs its commands as itself, so that a command never reaches more of the tree
    /// than the caller's own file tools, which are judged by its permissions; root's (a harness
    /// run as root) run as `[exec]`'s identity, never root.
    pub fn user_for(config: &ExecConfig, caller: Option<(u32, u32)>) -> (u32, u32) {
        match caller {
            Some((uid, gid)) if uid != 0 => (uid, if gid == 0 { 65534 } else { gid }),
            _ => (config.identity.uid, config.identity.gid),
        }
    }

    fn open_sources(&self) -> HashMap<String, OwnedFd> {
        open_sources(self.mountpoint, &self.entries)
    }

    /// The bubblewrap arguments, up to and including the command; `sources` are the
    /// descriptors (in bubblewrap's process) of the entries to bind.
    pub fn bwrap_args(&self, command: &str, sources: &HashMap<String, RawFd>) -> Vec<OsString> {
        let env = [("HOME", OsString::from("/tmp")), ("LANG", OsString::from("C.UTF-8"))];
        let argv = [OsString::from("/bin/sh"), OsString::from("-c"), OsString::from(command)];
        let (uid, gid) = self.user;
        let options = Options {
            network: self.config.network,
            new_session: true,
            cwd: self.config.cwd.as_str(),
            env: &env,
            run_as: RunAs::Switch { uid, gid },
            ro_binds: &[],
            argv: &argv,
        };
        bwrap_args(&self.entries, sources, &options)
    }

    /// Runs `command`, keeping at most `capture` bytes of each stream, and kills the whole
    /// process tree after `timeout`.
    pub fn run(&self, command: &str, timeout: Duration, capture: usize) -> Result<Outcome, Unavailable> {
        let bwrap = which("bwrap").ok_or_else(|| {
            Unavailable(
                "bubblewrap (bwrap) is not installed on the host; install the `bubblewrap` package.".into(),
            )
        })?;
        if which("setpriv").is_none() {
            return Err(Unavailable("setpriv (util-linux) is not installed on the host.".into()));
        }
        let sources = self.open_sources();
        let raw: HashMap<String, RawFd> = sources.iter().map(|(n, fd)| (n.clone(), fd.as_raw_fd())).collect();
        let inherit: Vec<RawFd> = raw.values().copied().collect();
        let mut cmd = Command::new(bwrap);
        cmd.args(self.bwrap_args(command, &raw))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_clear();
        // Without the scope, abstract sockets are still kept in: the network namespace is the
        // sandbox's own unless `[exec] network` is on.
        let scope = confine::AbstractSockets::new().ok();
        let scope_fd = scope.as_ref().map(confine::AbstractSockets::raw);
        // SAFETY: prctl, fcntl, signal, seccomp and Landlock calls are async-signal-safe and
        // touch only this (forked) process. If the daemon thread waiting for this command dies
        // (the daemon crashed), the sandbox dies with it instead of running on. The bind
        // sources are opened close-on-exec, so no other child inherits them; only bubblewrap
        // gets them, here.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The command starts with every signal at its default, whatever the daemon's
                // parent left ignored (only SIGPIPE is put back otherwise). The C library
                // refuses its own two (32 and 33), which no program can use.
                for signal in 1..=libc::SIGRTMAX() {
                    if signal != libc::SIGKILL && signal != libc::SIGSTOP {
                        libc::signal(signal, libc::SIG_DFL);
                    }
                }
                // As root, bubblewrap may take both without no_new_privs (which would keep
                // setpriv's switch of user from the sandbox's setup).
                confine::install()?;
                if let Some(fd) = scope_fd {
                    confine::apply(fd)?;
                }
                // Nothing the daemon holds reaches the sandbox (a descriptor of a host
                // directory would be a way out of it), except the bind sources.
                pass_only(&inherit)
            });
        }
        let spawned = cmd.spawn();
        // bubblewrap has its copies now (it closes them once bound, before the command runs).
        drop(sources);
        let mut child = spawned.map_err(|e| Unavailable(format!("cannot start bubblewrap: {e}")))?;
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let out = std::thread::spawn(move || drain(stdout, capture));
        let err = std::thread::spawn(move || drain(stderr, capture));
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(1);
        let finished = loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
                    break Finished::Exited(code);
                }
                Ok(None) if Instant::now() >= deadline => {
                    // SIGKILL to bubblewrap; its init dies with it and the kernel empties the
                    // PID namespace, so the pipes close once the last process is gone.
                    let _ = child.kill();
                    let _ = child.wait();
                    break Finished::TimedOut;
                }
                Ok(None) => {
                    std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(Unavailable(format!("cannot wait for the command: {e}")));
                }
            }
        };
        let (stdout, cut_out) = out.join().unwrap_or_default();
        let (stderr, cut_err) = err.join().unwrap_or_default();
        Ok(Outcome { stdout, stderr, cut: cut_out || cut_err, finished })
    }
}

/// Reads a stream to its end, keeping the first `limit` bytes; the rest is read and dropped
/// so the command never blocks on a full pipe. Returns the bytes and whether any were dropped.
fn drain(mut stream: impl Read, limit: usize) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut cut = false;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let room = limit.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                cut |= n > room;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    (kept, cut)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vpath::VPath;

    #[test]
    fn the_plan_binds_the_tree_and_only_a_minimal_host() {
        let mut config = ExecConfig::defaults(&[]);
        config.cwd = VPath::parse("/workspace").unwrap();
        config.identity = identity::Identity::resolve(Some(1000), Some(100), None, None);
        let plan = Plan {
            mountpoint: Path::new("/mnt/agent"),
            config: &config,
            entries: vec![
                TopEntry::Bind("workspace".into()),
                TopEntry::Symlink { name: "w".into(), target: b"/workspace".to_vec() },
            ],
            user: Plan::user_for(&config, Some((0, 0))),
        };
        let sources = HashMap::from([("workspace".to_string(), 7)]);
        let args: Vec<String> =
            plan.bwrap_args("echo hi", &sources).iter().map(|a| a.to_string_lossy().into_owned()).collect();
        let text = args.join(" ");
        assert!(text.contains("--bind-fd 7 /workspace"), "{text}");
        assert!(text.contains("--symlink /workspace /w"), "{text}");
        assert!(text.contains("--unshare-net"), "{text}");
        assert!(text.contains("--perms 1777 --size 1073741824 --tmpfs /tmp"), "{text}");
        assert!(text.contains("--chdir /workspace"), "{text}");
        assert!(text.contains("--reuid=1000 --regid=100"), "{text}");
        assert!(!text.contains("/root") && !text.contains("/home"), "{text}");
        assert_eq!(&args[args.len() - 3..], ["/bin/sh", "-c", "echo hi"]);
        config.network = true;
        let plan = Plan { mountpoint: Path::new("/m"), config: &config, entries: vec![], user: (1000, 100) };
        let text: Vec<String> =
            plan.bwrap_args("x", &HashMap::new()).iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert!(!text.contains(&"--unshare-net".to_string()));
    }

    #[test]
    fn a_caller_that_is_not_root_runs_as_itself() {
        let mut config = ExecConfig::defaults(&[]);
        config.identity = identity::Identity::resolve(Some(1000), Some(100), None, None);
        assert_eq!(Plan::user_for(&config, None), (1000, 100));
        assert_eq!(Plan::user_for(&config, Some((0, 0))), (1000, 100));
        assert_eq!(Plan::user_for(&config, Some((0, 5))), (1000, 100));
        assert_eq!(Plan::user_for(&config, Some((1001, 1002))), (1001, 1002));
        assert_eq!(Plan::user_for(&config, Some((1001, 0))), (1001, 65534), "never group root");
    }

    #[test]
    fn drain_keeps_the_head_and_reports_the_cut() {
        assert_eq!(drain(&b"hello"[..], 10), (b"hello".to_vec(), false));
        assert_eq!(drain(&b"hello"[..], 3), (b"hel".to_vec(), true));
        assert_eq!(drain(&b"hello"[..], 5), (b"hello".to_vec(), false));
    }
}
