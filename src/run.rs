//! `agentvfs run -- COMMAND`: starts a program on the caller's terminal in the `execute`
//! sandbox (the gated tree as its whole file system, the host's system paths read-only), as
//! the invoking user with no capabilities, and returns its exit status. See `doc/run.md`.
//!
//! This process asks the daemon (agent socket, `vfs/paths`) where the tree is mounted, makes
//! the agent's home through the mount, drops to the invoking user when started through sudo,
//! and then starts bubblewrap and stays its parent ([`supervise`]: the sandbox a session of
//! its own with a pty of its own, relayed to the caller's terminal, see [`pty`], and a job of
//! `run`'s, see [`job`]; a parent-death signal and a PID namespace make sure nothing the
//! program started outlives it).

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use crate::config::Config;
use crate::control::client::Client;
use crate::exec::{self, Options, RunAs, TopEntry, RESERVED};
use crate::vpath::VPath;

mod home;
mod inside;
mod job;
mod pty;
mod reach;

pub use inside::exec_program;

/// Where the agent socket is inside the sandbox (`AGENTVFS_SOCKET` names it there).
pub const SANDBOX_SOCKET: &str = "/run/agentvfs/agent.sock";

/// Where the running agentvfs binary is bound inside the sandbox (first in `PATH`).
const SANDBOX_BIN: &str = "/run/agentvfs/bin/agentvfs";

/// The hidden subcommand that starts the program inside ([`exec_program`]).
pub const SHIM: &str = "run-program";

/// A tree entry at the top named so is not shown: the sandbox's `/run` holds the socket and
/// the binary.
const RUN_DIR: &str = "run";

/// Whether this process runs inside `agentvfs run`'s sandbox, as far as its environment says
/// (only for messages: the sandbox has no control socket whatever the environment says).
pub fn inside() -> bool {
    std::env::var_os("AGENTVFS_SOCKET").is_some_and(|s| s == SANDBOX_SOCKET)
        && Path::new(SANDBOX_SOCKET).exists()
}

/// The user the program runs as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    /// The login name, when the user database has one.
    pub name: Option<String>,
}

/// Who invoked `agentvfs run`: the real user; as root, the sudo user (`SUDO_UID`/`SUDO_GID`);
/// root itself never (an agent must not be root).
pub fn invoking_user(euid: u32, uid: u32, gid: u32, sudo: Option<(u32, u32)>) -> Result<(u32, u32), String> {
    if euid != 0 {
        return Ok((uid, gid));
    }
    match sudo {
        Some((u, g)) if u != 0 => Ok((u, g)),
        _ => Err("agentvfs run refuses to run a program as root: an agent must not be root. Run it as the \
                  agent's user (an unprivileged user in [control] agents), or through sudo from that user's \
                  shell (it then runs as SUDO_UID/SUDO_GID)"
            .to_string()),
    }
}

/// The working directory inside: the caller's `cwd` when it is under the mountpoint (the same
/// virtual path) or under a host route's root (the route's path and the rest); else `None`.
/// `hosts` are (virtual path, root on the host); the longest root that holds `cwd` wins.
pub fn virtual_cwd(cwd: &Path, mountpoint: &Path, hosts: &[(VPath, PathBuf)]) -> Option<VPath> {
    let under = |rest: &Path, base: &VPath| -> Option<VPath> {
        let rest = rest.to_str()?;
        let joined =
            if rest.is_empty() { base.clone() } else { VPath::parse(&format!("{base}/{rest}")).ok()? };
        Some(joined)
    };
    if let Ok(rest) = cwd.strip_prefix(mountpoint) {
        return under(rest, &VPath::root());
    }
    hosts
        .iter()
        .filter_map(|(route, root)| Some((root.components().count(), route, cwd.strip_prefix(root).ok()?)))
        .max_by_key(|(depth, _, _)| *depth)
        .and_then(|(_, route, rest)| under(rest, route))
}

/// The tree's top-level entries as the sandbox shows them: what the mount lists (the gate has
/// left hidden entries out), minus the names of the system layout and `run`.
fn top_entries(mountpoint: &Path) -> Result<Vec<TopEntry>> {
    let mut out = Vec::new();
    let listing =
        std::fs::read_dir(mountpoint).with_context(|| format!("listing {}", mountpoint.display()))?;
    for entry in listing {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else { continue };
        let kind = entry.file_type()?;
        if name == RUN_DIR || (RESERVED.contains(&name.as_str()) && name != "tmp") {
            continue;
        }
        // As for execute: only a directory can stand in for /tmp.
        if name == "tmp" && !kind.is_dir() {
            continue;
        }
        if kind.is_symlink() {
            if let Ok(target) = std::fs::read_link(entry.path()) {
                out.push(TopEntry::Symlink { name, target: target.into_os_string().into_vec() });
            }
        } else {
            out.push(TopEntry::Bind(name));
        }
    }
    Ok(out)
}

/// Opens `path` as an `O_PATH` descriptor (following links when `follow`).
fn open_path(path: &Path, follow: bool) -> std::io::Result<OwnedFd> {
    let flags = if follow { libc::O_PATH } else { libc::O_PATH | libc::O_NOFOLLOW };
    Ok(OwnedFd::from(std::fs::OpenOptions::new().read(true).custom_flags(flags).open(path)?))
}

/// The mount's path for a virtual path.
fn in_mount(mountpoint: &Path, path: &VPath) -> PathBuf {
    mountpoint.join(path.as_str().trim_start_matches('/'))
}

/// Becomes `user` (its groups from the user database, then gid, then uid) for good.
fn drop_to(user: &User) -> Result<()> {
    use nix::unistd::{Gid, Uid};
    let gid = Gid::from_raw(user.gid);
    set_groups(user)?;
    nix::unistd::setresgid(gid, gid, gid).context("setresgid")?;
    let uid = Uid::from_raw(user.uid);
    nix::unistd::setresuid(uid, uid, uid).context("setresuid")?;
    if nix::unistd::geteuid().is_root() || nix::unistd::getuid().is_root() {
        bail!("could not drop root privileges");
    }
    Ok(())
}

/// What `agentvfs run` was asked.
pub struct Request<'a> {
    /// The agent socket, unless `config_file` names it.
    pub socket: Option<&'a Path>,
    /// The config `--config` named (its agent socket, `[run]`, `[exec] cwd`), if any.
    pub config_file: Option<&'a Path>,
    pub argv: &'a [OsString],
}

/// What the daemon told `run` before anything is done for the program, asked as the user.
struct Asked {
    config: Option<Config>,
    /// Whether the config file is root's (see [`load_config`]).
    roots_config: bool,
    socket: PathBuf,
    paths: Value,
}

/// How long `run` waits for each answer of the daemon (which answers its requests at once): a
/// socket whose listener accepts but never answers must not hold `run` for ever.
const ANSWER_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// A client of the daemon on `socket` for `run`'s requests, bounded by [`ANSWER_WITHIN`].
fn connect(socket: &Path) -> Result<Client> {
    let mut client = Client::connect(socket)?;
    client.answer_within(ANSWER_WITHIN)?;
    Ok(client)
}

/// Reads the `--config` file, and says whether it is root's: owned by root and writable by no
/// one else, so that its `[run] home` is root's choice, which root may make. Read through the
/// descriptor whose owner is judged, so that a file swapped in between is not taken for it.
fn load_config(path: &Path) -> Result<(Config, bool)> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let unreadable = |e: std::io::Error| anyhow!("{}: cannot read: {e}", path.display());
    let mut file = std::fs::File::open(path).map_err(unreadable)?;
    let meta = file.metadata().map_err(unreadable)?;
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(unreadable)?;
    let config = Config::load_text(path, &text)?;
    Ok((config, meta.uid() == 0 && meta.mode() & 0o022 == 0))
}

/// Reads the config and asks the daemon, as `user` (with root's effective ids switched to the
/// user's for the while, under sudo): the config file is one the user may read, and the
/// daemon judges the user's role, before the home is made as root. The socket must be the
/// agent socket (the control socket bound into the sandbox would let the program approve its
/// own interrupts) and, under sudo, served by root: the mountpoint it names is where the home
/// is made as root.
fn ask_as_user(request: &Request, user: &User, sudo: bool) -> Result<Asked> {
    let _as_user = if sudo { Some(AsUser::become_(user)?) } else { None };
    let loaded = request.config_file.map(load_config).transpose()?;
    let roots_config = loaded.as_ref().is_some_and(|(_, roots)| *roots);
    let config = loaded.map(|(config, _)| config);
    let socket = match (&config, request.socket) {
        (Some(c), _) => c.agent_socket.clone(),
        (None, Some(s)) => s.to_path_buf(),
        (None, None) => bail!("no agent socket: give --socket or --config"),
    };
    let mut client = connect(&socket)?;
    if sudo {
        let server =
            client.server_uid().with_context(|| format!("asking who serves {}", socket.display()))?;
        if server != 0 {
            bail!(
                "{} is served by uid {server}, not root: under sudo, agentvfs run makes the home as root \
                 where the daemon says the tree is, so it trusts only a daemon run by root. Run it without \
                 sudo, or give the socket of root's daemon",
                socket.display()
            );
        }
    }
    client
        .call("ping", None)
        .with_context(|| format!("uid {} cannot use the agent socket {}", user.uid, socket.display()))?;
    let paths = client.call("vfs/paths", None)?;
    if paths["socket"] != "agent" {
        bail!(
            "{} is the daemon's control socket (the approvers'), not its agent socket: the program would \
             answer its own interrupts there. Give the agent socket (`agent_socket` in the daemon's config)",
            socket.display()
        );
    }
    Ok(Asked { config, roots_config, socket, paths })
}

/// Root's effective ids switched to a user's (groups, gid, uid) until dropped; the real and
/// saved ids stay root's, so that they can be switched back.
struct AsUser {
    gid: nix::unistd::Gid,
    groups: Vec<nix::unistd::Gid>,
}

impl AsUser {
    fn become_(user: &User) -> Result<AsUser> {
        let saved =
            AsUser { gid: nix::unistd::getegid(), groups: nix::unistd::getgroups().context("getgroups")? };
        set_groups(user)?;
        nix::unistd::setegid(user.gid.into()).context("setegid")?;
        nix::unistd::seteuid(user.uid.into()).context("seteuid")?;
        Ok(saved)
    }
}

impl Drop for AsUser {
    fn drop(&mut self) {
        let back = nix::unistd::seteuid(nix::unistd::Uid::from_raw(0))
            .and_then(|()| nix::unistd::setegid(self.gid))
            .and_then(|()| nix::unistd::setgroups(&self.groups));
        if back.is_err() {
            // Nothing below may run with half of root's ids: `run` goes on only as root.
            eprintln!("agentvfs run: cannot switch back to root's ids");
            std::process::exit(1);
        }
    }
}

/// The user's supplementary groups, from the user database (else only its gid).
fn set_groups(user: &User) -> Result<()> {
    let gid = nix::unistd::Gid::from_raw(user.gid);
    match user.name.as_deref().and_then(|n| std::ffi::CString::new(n).ok()) {
        Some(name) => nix::unistd::initgroups(&name, gid).context("initgroups"),
        None => nix::unistd::setgroups(&[gid]).context("setgroups"),
    }
}

/// The host routes of a `vfs/paths` answer: (virtual path, root on the host, as the caller
/// finds it).
fn host_roots(paths: &Value) -> Vec<(VPath, PathBuf)> {
    paths["routes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["backend"] == "host")
        .filter_map(|r| {
            let route = VPath::parse(r["virtual"].as_str()?).ok()?;
            let root = PathBuf::from(r["location"].as_str()?);
            Some((route, root.canonicalize().unwrap_or(root)))
        })
        .collect()
}

/// Why `run` stops when the mountpoint the daemon names is not there: inside `agentvfs run`'s
/// sandbox (`inside`), whose whole file system is the tree, the mount itself is not.
fn missing_mountpoint(mountpoint: &Path, inside: bool) -> String {
    let at = crate::display::escape(&mountpoint.to_string_lossy()).to_string();
    if inside {
        format!(
            "agentvfs run cannot be nested: this is already inside the sandbox of an `agentvfs run`, whose \
             whole file system is the tree, so the mount it would start from ({at}) is not here. Run the \
             command directly, or start it with agentvfs run from outside the sandbox"
        )
    } else {
        format!(
            "the daemon says its tree is mounted at {at}, which does not exist here (is the daemon in \
             another mount namespace?)"
        )
    }
}

/// Runs the request: the program's exit status, or why it could not be started.
pub fn run(request: &Request) -> Result<ExitCode> {
    let argv = request.argv;
    if argv.is_empty() {
        bail!("no command: agentvfs run [--config FILE] -- COMMAND [ARGS...]");
    }
    let (euid, uid, gid) =
        (nix::unistd::geteuid().as_raw(), nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
    let (uid, gid) =
        invoking_user(euid, uid, gid, exec::identity::sudo_from_env()).map_err(|e| anyhow!(e))?;
    let name = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)).ok().flatten().map(|u| u.name);
    let user = User { uid, gid, name };
    let bwrap = exec::which("bwrap")
        .ok_or_else(|| anyhow!("bubblewrap (bwrap) is not installed; install the `bubblewrap` package"))?;

    let sudo = euid == 0;
    let Asked { config, roots_config, socket, paths } = ask_as_user(request, &user, sudo)?;
    let mountpoint = paths["mountpoint"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| anyhow!("the daemon's vfs/paths answer names no mountpoint"))?;
    if std::fs::symlink_metadata(&mountpoint).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
        bail!("{}", missing_mountpoint(&mountpoint, inside()));
    }
    let run_config = config.as_ref().map(|c| c.run.clone()).unwrap_or_default();
    let component = user.name.clone().filter(|n| !n.is_empty() && !n.contains('/') && n != "." && n != "..");
    let default_home = VPath::root().join("home").join(&component.unwrap_or_else(|| user.uid.to_string()));
    let home = run_config.home.clone().unwrap_or_else(|| default_home.clone());
    let top = home.as_str().trim_start_matches('/').split('/').next().unwrap_or("");
    if top == RUN_DIR || RESERVED.contains(&top) {
        bail!("HOME {home} would be under /{top}, which the sandbox does not take from the tree; set [run] home elsewhere");
    }
    // The config must be out of the program's reach before anything it says is acted on: the
    // home it names is made (as root, when root's) right below.
    if let Some(file) = config.as_ref().and_then(|c| c.file.as_deref()) {
        let _as_user = if sudo { Some(AsUser::become_(&user)?) } else { None };
        let mount_real = mountpoint.canonicalize().unwrap_or_else(|_| mountpoint.clone());
        reach::config_out_of_reach(file, &socket, &mountpoint, &mount_real, &host_roots(&paths))?;
    }
    // Under sudo, root makes only the home root chose (the default, or one a config of root's
    // names); a home of the user's choosing is made with the user's ids, so the tree's file
    // modes bound it, not only its rules.
    if sudo && (home == default_home || roots_config) {
        home::ensure_home(&mountpoint, &home, &user, home::Maker::Root)?;
    } else {
        let _as_user = if sudo { Some(AsUser::become_(&user)?) } else { None };
        home::ensure_home(&mountpoint, &home, &user, home::Maker::User)?;
    }
    if sudo {
        drop_to(&user)?;
    }

    // Everything from here on is done as the user: the tree is what the gate shows them.
    let entries = top_entries(&mountpoint)?;
    let routes: Vec<&Value> = paths["routes"].as_array().into_iter().flatten().collect();
    let hosts = host_roots(&paths);
    let default_cwd = match &config {
        Some(c) => c.exec.cwd.clone(),
        None => {
            paths["execute"]["cwd"].as_str().and_then(|c| VPath::parse(c).ok()).unwrap_or_else(
                || match routes.iter().any(|r| r["virtual"] == "/workspace/") {
                    true => VPath::parse("/workspace").expect("a valid path"),
                    false => VPath::root(),
                },
            )
        }
    };
    let shown = |p: &VPath| {
        let top = p.as_str().trim_start_matches('/').split('/').next().unwrap_or("");
        p.is_root() || entries.iter().any(|e| e.name() == top)
    };
    let usable =
        |p: &VPath| shown(p) && std::fs::metadata(in_mount(&mountpoint, p)).is_ok_and(|m| m.is_dir());
    let mount_real = mountpoint.canonicalize().unwrap_or_else(|_| mountpoint.clone());
    let caller_cwd = std::env::current_dir().ok();
    let mapped = caller_cwd.as_deref().and_then(|c| virtual_cwd(c, &mount_real, &hosts));
    let cwd = match mapped {
        Some(c) if usable(&c) => c,
        found => {
            let fallback = if usable(&default_cwd) { default_cwd } else { VPath::root() };
            if let Some(c) = found {
                eprintln!(
                    "agentvfs run: {} is not a directory this user sees in the tree; starting in {fallback}",
                    crate::display::escape(c.as_str())
                );
            }
            fallback
        }
    };

    let sources = exec::open_sources(&mountpoint, &entries);
    let socket_fd =
        open_path(&socket, true).with_context(|| format!("opening the agent socket {}", socket.display()))?;
    let binary_fd = open_path(Path::new("/proc/self/exe"), true).context("opening this program's binary")?;
    let raw: HashMap<String, RawFd> = sources.iter().map(|(n, fd)| (n.clone(), fd.as_raw_fd())).collect();
    let ro_binds = [(socket_fd.as_raw_fd(), SANDBOX_SOCKET), (binary_fd.as_raw_fd(), SANDBOX_BIN)];

    let mut env: Vec<(&str, OsString)> = Vec::new();
    for name in &run_config.env {
        if ["HOME", "PATH", "AGENTVFS_SOCKET"].contains(&name.as_str()) {
            continue;
        }
        if let Some(value) = std::env::var_os(name) {
            env.push((name, value));
        }
    }
    let bin_dir = Path::new(SANDBOX_BIN).parent().expect("a directory").as_os_str();
    let mut path = bin_dir.to_os_string();
    path.push(":");
    path.push(exec::PATH);
    env.push(("HOME", OsString::from(home.as_str())));
    env.push(("PATH", path));
    env.push(("AGENTVFS_SOCKET", OsString::from(SANDBOX_SOCKET)));
    // The program runs under a monitor that gives it a process group of its own (see
    // `inside`), and, when there is a terminal, a pty of its own (see `pty`).
    let mut program = vec![OsString::from(SANDBOX_BIN), OsString::from(SHIM), OsString::from("--")];
    program.extend(argv.iter().cloned());
    let options = Options {
        network: run_config.network,
        new_session: false,
        cwd: cwd.as_str(),
        env: &env,
        run_as: RunAs::Caller,
        ro_binds: &ro_binds,
        argv: &program,
    };
    let (info_read, info_write) = nix::unistd::pipe().context("pipe")?;
    let mut args = vec![OsString::from("--info-fd"), OsString::from(info_write.as_raw_fd().to_string())];
    args.extend(exec::bwrap_args(&entries, &raw, &options));
    let mut passed: Vec<RawFd> = raw.values().copied().chain(ro_binds.iter().map(|(fd, _)| *fd)).collect();
    passed.push(info_write.as_raw_fd());
    supervise(&bwrap, &args, &passed, (info_read, info_write), run_config.network)
}

/// The signals this process takes on the program's behalf.
const FORWARDED: [nix::sys::signal::Signal; 4] = {
    use nix::sys::signal::Signal::*;
    [SIGINT, SIGTERM, SIGHUP, SIGQUIT]
};

/// Starts bubblewrap and stays its parent until it ends; returns its exit status (128 + the
/// signal when one killed it, as shells report).
///
/// The sandbox is a session of its own ([`pty::new_session`]): it never has the caller's
/// terminal, only, when stdin, stdout or stderr is a terminal, a pty of its own in their
/// place, whose bytes this process relays ([`pty::Console`]). Interactive (stdin and stdout
/// the terminal), the caller's terminal is raw while the job is in front, so what the human
/// types (Ctrl-C, Ctrl-Z too) goes to the pty and the program's group; the program's stops
/// are passed on to the caller's shell ([`job`]). Otherwise the terminal's Ctrl-C, Ctrl-\\,
/// Ctrl-Z and hangup reach this process, which passes them on. bubblewrap ignores SIGINT and
/// SIGQUIT (the program gets them back at its default, see [`exec_program`]), so a program
/// that handles Ctrl-C itself is not torn down by it. SIGINT, SIGTERM, SIGHUP and SIGQUIT
/// sent to this process by `kill` are passed on to the program.
fn supervise(
    bwrap: &Path,
    args: &[OsString],
    passed: &[RawFd],
    (info, info_write): (OwnedFd, OwnedFd),
    network: bool,
) -> Result<ExitCode> {
    use nix::sys::signal::{SigSet, SigmaskHow, Signal};
    use nix::sys::signalfd::{SfdFlags, SignalFd};
    let mut mask = SigSet::empty();
    for signal in FORWARDED {
        mask.add(signal);
    }
    // SIGCHLD, for bubblewrap's end and stops; SIGCONT, to learn when the caller's shell
    // continues us; SIGTSTP (a `kill -TSTP`, or Ctrl-Z when the terminal is not raw), so that
    // the sandbox stops first and this process with it, not this process alone; SIGTTOU and
    // SIGTTIN, so that putting the terminal's modes back works from the background, and a read
    // of the terminal from there fails (EIO) rather than stop this process; SIGWINCH, to pass
    // the window size on.
    for signal in [Signal::SIGCHLD, Signal::SIGCONT, Signal::SIGTSTP, Signal::SIGTTOU, Signal::SIGTTIN] {
        mask.add(signal);
    }
    mask.add(Signal::SIGWINCH);
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&mask), None).context("sigprocmask")?;
    let mut console = pty::Console::open()?;
    let slave = console.as_ref().map(pty::Console::slave);
    let passed = passed.to_vec();
    let scope = match exec::confine::AbstractSockets::new() {
        Ok(scope) => Some(scope),
        Err(why) => {
            if network {
                eprintln!("agentvfs run: warning: the host's abstract unix sockets stay reachable: {why}");
            }
            None
        }
    };
    let scope_fd = scope.as_ref().map(exec::confine::AbstractSockets::raw);
    let spawned = {
        let mut command = std::process::Command::new(bwrap);
        command.args(args).env_clear();
        // Each of stdin, stdout and stderr that is the caller's terminal is the pty's slave
        // in the sandbox: no descriptor of the caller's terminal crosses.
        if let (Some(console), Some(slave)) = (&console, slave) {
            let [input, output, error] = console.stdio();
            if input {
                command.stdin(pty::duplicate(slave)?);
            }
            if output {
                command.stdout(pty::duplicate(slave)?);
            }
            if error {
                command.stderr(pty::duplicate(slave)?);
            }
        }
        // SAFETY: between fork and exec only async-signal-safe calls on this (child) process.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                pty::new_session(slave)?;
                let mut empty: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut empty);
                libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
                libc::signal(libc::SIGINT, libc::SIG_IGN);
                libc::signal(libc::SIGQUIT, libc::SIG_IGN);
                // The filter and the scope go on bubblewrap itself, so that its init (the
                // sandbox's pid 1) has them too: a program could otherwise make the init call
                // for it, through ptrace (same user, no Yama needed).
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                exec::confine::install()?;
                if let Some(fd) = scope_fd {
                    exec::confine::apply(fd)?;
                }
                // Only the descriptors bubblewrap binds (it closes them once bound) cross the
                // exec.
                exec::pass_only(&passed)
            });
        }
        command.spawn()
        // The command's copies of the slave close here.
    };
    drop(info_write);
    let child = spawned.with_context(|| format!("cannot start bubblewrap ({})", bwrap.display()))?;
    if let Some(console) = console.as_mut() {
        console.close_slave();
    }
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let mut job = job::Job::started(pid.as_raw());
    // bubblewrap writes {"child-pid": N} (its init, in our PID namespace) once the sandbox is
    // up; the program's monitor is that init's child.
    let mut text = String::new();
    let _ = std::io::Read::read_to_string(&mut std::fs::File::from(info), &mut text);
    let init: Option<i32> =
        serde_json::from_str::<Value>(&text).ok().and_then(|v| v["child-pid"].as_i64()).map(|p| p as i32);
    job.init_is(init);
    if let Some(console) = console.as_mut() {
        console.resume();
    }
    let signals =
        SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK).context("signalfd")?;
    loop {
        use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
        let code = match waitpid(pid, Some(WaitPidFlag::WUNTRACED | WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => Some(code),
            Ok(WaitStatus::Signaled(_, signal, _)) => Some(128 + signal as i32),
            Ok(WaitStatus::Stopped(..)) => {
                if let Some(console) = console.as_mut() {
                    console.pause();
                }
                if !job.stop_here() {
                    // Nobody above to continue us: the sandbox goes on at once.
                    job.resume();
                    if let Some(console) = console.as_mut() {
                        console.resume();
                    }
                }
                None
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => None,
            Err(e) => return Err(e).context("waiting for bubblewrap"),
        };
        if let Some(code) = code {
            if let Some(console) = console.as_mut() {
                console.finish();
            }
            return Ok(ExitCode::from(code.clamp(0, 255) as u8));
        }
        let mut polled = vec![libc::pollfd { fd: signals.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        if let Some(console) = &console {
            polled.extend(console.wanted());
        }
        let patience = console.as_ref().map_or(-1, pty::Console::patience);
        // SAFETY: a valid array of pollfds, of its own length.
        let ready = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, patience) };
        if ready < 0 {
            continue;
        }
        if let Some(console) = console.as_mut() {
            console.serve(&polled[1..]);
            console.look();
        }
        while let Some(info) = signals.read_signal().context("reading signals")? {
            let signo = info.ssi_signo as i32;
            match signo {
                libc::SIGCHLD | libc::SIGTTOU | libc::SIGTTIN => {}
                libc::SIGCONT => {
                    if let Some(console) = console.as_mut() {
                        console.resume();
                    }
                    job.resume();
                }
                libc::SIGWINCH => {
                    if let Some(console) = &console {
                        console.resize();
                    }
                }
                libc::SIGTSTP => job.stop(),
                // What the terminal sends when it is not raw goes to this job; it is passed on
                // to the sandbox, as if the sandbox were in front.
                _ => job.pass(signo, info.ssi_code == libc::SI_KERNEL),
            }
        }
    }
}

/// How the approver's and operator's commands (`approve`, `reject`, `interrupts`, `status`,
/// `reload`) fail inside the sandbox, where no control socket exists.
pub fn no_control_socket(method: &str) -> String {
    let role = crate::control::roles::role_of(method).unwrap_or(crate::control::roles::Role::Approver);
    let here = format!(
        "inside `agentvfs run` there is no control socket, only the agent socket {SANDBOX_SOCKET}: \
         approvers answer from outside the sandbox"
    );
    crate::control::roles::needs(method, role, &here).message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_refused_and_sudo_names_the_user() {
        assert_eq!(invoking_user(1000, 1000, 100, None), Ok((1000, 100)));
        assert_eq!(invoking_user(1000, 1000, 100, Some((5, 5))), Ok((1000, 100)));
        assert_eq!(invoking_user(0, 0, 0, Some((1000, 100))), Ok((1000, 100)));
        let refused = invoking_user(0, 0, 0, None).unwrap_err();
        assert!(refused.contains("an agent must not be root"), "{refused}");
        assert!(invoking_user(0, 0, 0, Some((0, 0))).is_err());
    }

    #[test]
    fn the_working_directory_maps_into_the_tree() {
        let v = |s: &str| VPath::parse(s).unwrap();
        let hosts = vec![
            (v("/workspace"), PathBuf::from("/home/me/p")),
            (v("/deep"), PathBuf::from("/home/me/p/sub")),
        ];
        let m = Path::new("/mnt/agent");
        let at = |cwd: &str| virtual_cwd(Path::new(cwd), m, &hosts).map(|p| p.as_str().to_string());
        assert_eq!(at("/mnt/agent").as_deref(), Some("/"));
        assert_eq!(at("/mnt/agent/memories/x").as_deref(), Some("/memories/x"));
        assert_eq!(at("/home/me/p").as_deref(), Some("/workspace"));
        assert_eq!(at("/home/me/p/src/a").as_deref(), Some("/workspace/src/a"));
        assert_eq!(at("/home/me/p/sub/b").as_deref(), Some("/deep/b"));
        assert_eq!(at("/home/me/px"), None);
        assert_eq!(at("/etc"), None);
    }
}
