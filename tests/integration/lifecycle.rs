//! Mount lifecycle: clean unmount on signals, stale-mount recovery, busy mountpoints, bad
//! configs and a missing /dev/fuse, each with a clear message.

use std::fs;
use std::process::Command;

use crate::harness::{is_mounted, scratch, unmounted, Mount, Unmounted, BIN};

#[test]
fn sigint_and_sigterm_unmount_cleanly() {
    let Unmounted { scratch: s, config: cfg, .. } = unmounted("");
    let mnt = s.path().join("mnt");
    for signal in [libc::SIGINT, libc::SIGTERM] {
        let mut m = Mount::start(&cfg, &mnt);
        assert!(m.log_text().contains("mounted at"), "{}", m.log_text());
        let status = m.stop_with(signal);
        assert!(status.success(), "signal {signal}: {status:?}\n{}", m.log_text());
        assert!(!is_mounted(&m.dir), "signal {signal} left the mount");
        assert!(fs::read_dir(&mnt).unwrap().next().is_none(), "no transport-endpoint error");
    }
}

/// Started with a soft limit of 256 open files under a higher hard limit (systemd gives 1,024
/// soft), the daemon raises its soft limit to the hard one: each socket connection holds four
/// descriptors, each open file one or two.
#[test]
fn the_daemon_raises_its_open_file_limit_to_the_hard_one() {
    let Unmounted { scratch: s, config: cfg, .. } = unmounted("");
    let m =
        Mount::try_start_wrapped(&cfg, &s.path().join("mnt"), "warn", &[], &["prlimit", "--nofile=256:4096"])
            .unwrap();
    let pid = m.child.as_ref().unwrap().id();
    let limits = fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    assert_eq!(line.split_whitespace().collect::<Vec<_>>()[3..5], ["4096", "4096"], "{line}");
}

#[test]
fn a_stale_mount_is_recovered_and_a_busy_one_refused() {
    let Unmounted { scratch: s, host_root: root, config: cfg } = unmounted("");
    let mnt = s.path().join("mnt");
    let mut first = Mount::start(&cfg, &mnt);
    // A second daemon on a live mount is refused with a clear message.
    let out = Command::new(BIN).args(["mount", "--config"]).arg(&cfg).arg(&mnt).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is busy") && err.contains("fuse filesystem (agentvfs)"), "{err}");
    // kill -9 leaves a dead mount (ENOTCONN); the next start clears it.
    first.stop_with(libc::SIGKILL);
    assert_eq!(fs::read_dir(&mnt).unwrap_err().raw_os_error(), Some(libc::ENOTCONN));
    let second = Mount::start(&cfg, &mnt);
    fs::write(second.path("/host/after-recovery"), "ok").unwrap();
    assert_eq!(fs::read_to_string(root.join("after-recovery")).unwrap(), "ok");
    second.stop();
    drop(first);
}

/// The FUSE connection number of the mount at `dir`.
fn connection_of(dir: &std::path::Path) -> u32 {
    agentvfs::daemon::stale_mount::mount_at(dir).and_then(|m| m.connection()).expect("mounted")
}

/// Whether a thread of process `pid` waits in the kernel to tell it to forget a name.
fn waits_in_inval_entry(pid: u32) -> bool {
    fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten().any(|task| {
        fs::read_to_string(task.path().join("stack")).is_ok_and(|s| s.contains("fuse_reverse_inval_entry"))
    })
}

/// Aborts the old connection when the test ends another way than the daemon meant, so a
/// failing run leaves no process waiting in the kernel.
struct AbortOnDrop(u32);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        let _ = agentvfs::daemon::stale_mount::abort_connection(self.0);
    }
}

/// `kill -9` while the daemon holds a caller's request and a tool call's invalidation waits in
/// the kernel for the directory that caller holds: the killed daemon cannot finish dying (its
/// thread stays in the kernel, so its `/dev/fuse` descriptors stay open and the kernel keeps
/// the connection), and the caller would wait for good. The next daemon on that mountpoint
/// aborts the connection, mounts afresh and serves; the caller is released, the old daemon
/// exits. By io_uring the dead mount answers ECANCELED; by `/dev/fuse` it does not answer.
#[test]
fn a_killed_daemon_the_kernel_still_holds_is_cleared_by_the_next_start() {
    for io_uring in [true, false] {
        clear_a_wedged_mount(io_uring);
    }
}

/// A mount whose daemon was killed while the kernel waited on it: `old` cannot finish dying,
/// `caller` (a chmod) waits for an answer, and `tool`'s write waits for the daemon.
/// Fields drop in this order: the old connection aborted, then what is left at `mnt`
/// unmounted, and only then the scratch directory removed.
struct Wedged {
    abort: AbortOnDrop,
    /// Unmounts what is left at `mnt` when dropped.
    first: Mount,
    tool: std::thread::JoinHandle<()>,
    caller: std::process::Child,
    old: std::process::Child,
    /// The mountpoint, resolved.
    mnt: std::path::PathBuf,
    unmounted: Unmounted,
}

fn wedge(io_uring: bool) -> Wedged {
    use std::time::Duration;
    let rules = format!(
        r#"
[[rules]]
operations = ["write"]
paths = ["/host/d"]
mode = "interrupt"

[interrupts]
timeout_seconds = 300

[fuse]
io_uring = {io_uring}
"#
    );
    let unmounted = unmounted(&rules);
    let (s, root) = (unmounted.scratch.path(), &unmounted.host_root);
    fs::create_dir(root.join("d")).unwrap();
    let mut first = Mount::start(&unmounted.config, &s.join("mnt"));
    let mnt = first.dir.clone();
    let abort = AbortOnDrop(connection_of(&first.dir));
    let old = first.child.take().unwrap();
    let socket = s.join("agentvfs.sock");
    let pending = || {
        let mut c = agentvfs::control::client::Client::connect(&socket).unwrap();
        c.call("interrupts/list", Some(serde_json::json!({}))).unwrap()["interrupts"]
            .as_array()
            .unwrap()
            .len()
    };
    // chmod holds the directory's lock while its request waits for approval.
    let caller = Command::new("chmod").arg("700").arg(first.path("/host/d")).spawn().unwrap();
    crate::harness::within("the chmod waits for approval", Duration::from_secs(10), || pending() == 1);
    // A tool's write in that directory: the daemon has the kernel forget the name, and the
    // kernel waits for the directory's lock.
    let tool_socket = socket.clone();
    let tool = std::thread::spawn(move || {
        let mut c = agentvfs::control::client::Client::connect(&tool_socket).unwrap();
        let args = serde_json::json!({"name": "write_file", "arguments": {"file_path": "/host/d/new", "content": "x"}});
        let _ = c.call("tools/call", Some(args));
    });
    crate::harness::within("the invalidation waits in the kernel", Duration::from_secs(10), || {
        waits_in_inval_entry(old.id())
    });
    unsafe { libc::kill(old.id() as i32, libc::SIGKILL) };
    let mut wedged = Wedged { abort, first, tool, caller, old, mnt, unmounted };
    // The kernel keeps the connection: the daemon does not exit, the caller still waits.
    std::thread::sleep(Duration::from_secs(1));
    assert!(wedged.old.try_wait().unwrap().is_none(), "the killed daemon exited: nothing held it");
    assert!(wedged.caller.try_wait().unwrap().is_none(), "the caller was released");
    assert!(waits_in_inval_entry(wedged.old.id()));
    wedged
}

/// Waits (up to 10 s) for `child` to exit.
fn released(child: &mut std::process::Child) -> std::process::ExitStatus {
    use std::time::{Duration, Instant};
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "process {} still waits", child.id());
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait().unwrap()
}

fn clear_a_wedged_mount(io_uring: bool) {
    use std::time::{Duration, Instant};
    let Wedged { unmounted, mnt, mut old, mut caller, tool, first, abort } = wedge(io_uring);
    let root = &unmounted.host_root;

    let started = Instant::now();
    let second = Mount::start(&unmounted.config, &mnt);
    let log = second.log_text();
    assert!(log.contains("whose daemon died"), "io_uring {io_uring}: {log}");
    fs::write(second.path("/host/after-recovery"), "ok").unwrap();
    assert_eq!(fs::read_to_string(root.join("after-recovery")).unwrap(), "ok");
    assert_eq!(fs::read_to_string(second.path("/host/d/new")).unwrap(), "x");
    assert!(!released(&mut caller).success(), "the chmod fails: its daemon died");
    released(&mut old);
    tool.join().unwrap();
    assert!(started.elapsed() < Duration::from_secs(20), "io_uring {io_uring}: took {:?}", started.elapsed());
    eprintln!("io_uring {io_uring}: {}", log.lines().find(|l| l.contains("whose daemon died")).unwrap());
    second.stop();
    drop(abort);
    drop(first);
}

/// A daemon started by a test outside [`Mount`] (whose guard would unmount the other's mount
/// at the same mountpoint): stopped when dropped, if it still runs.
struct Daemon {
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl Daemon {
    fn start(config: &std::path::Path, mnt: &std::path::Path, log: std::path::PathBuf) -> Daemon {
        let out = fs::File::create(&log).unwrap();
        let child = Command::new(BIN)
            .args(["mount", "--config"])
            .arg(config)
            .arg(mnt)
            .env("RUST_LOG", "info")
            .env_remove("SUDO_UID")
            .env_remove("SUDO_GID")
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        Daemon { child, log }
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().unwrap().is_none() {
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while self.child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Two daemons started at once on one wedged mountpoint take turns: the first to get there
/// clears the dead mount and mounts; the other waits until then, finds that mount served, and
/// refuses as busy. It never aborts the new mount's connection (which may have the dead one's
/// number: the kernel hands out the lowest free one) nor unmounts it, and the winner's mount
/// keeps working. By `/dev/fuse` the dead mount does not answer, so the examination the two
/// would overlap in lasts the whole 5 s probe.
#[test]
fn two_daemons_started_at_once_on_a_wedged_mountpoint_take_turns() {
    use std::time::{Duration, Instant};
    let Wedged { unmounted, mnt, mut old, mut caller, tool, first, abort } = wedge(false);
    let (s, root) = (unmounted.scratch.path(), &unmounted.host_root);
    let dead_connection = abort.0;
    // The other daemon: its own sockets, stores and postgres namespace; the same host root.
    let name = s.file_name().unwrap().to_string_lossy().into_owned();
    let other_state = s.join(format!("{name}-b"));
    fs::create_dir(&other_state).unwrap();
    let other_config = crate::harness::config(&other_state, root, "");
    let mut daemons = [
        Daemon::start(&unmounted.config, &mnt, s.join("a.log")),
        Daemon::start(&other_config, &mnt, s.join("b.log")),
    ];

    // One exits, refusing; the other mounts.
    let deadline = Instant::now() + Duration::from_secs(40);
    let loser = loop {
        let exited = daemons.iter_mut().position(|d| d.child.try_wait().unwrap().is_some());
        if let Some(i) = exited {
            break i;
        }
        assert!(
            Instant::now() < deadline,
            "neither refused:\n{}\n{}",
            daemons[0].log_text(),
            daemons[1].log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let winner = 1 - loser;
    let winner_pid = daemons[winner].child.id();
    let (lost, won) = (daemons[loser].log_text(), daemons[winner].log_text());
    let status = daemons[loser].child.wait().unwrap();
    assert_eq!(status.code(), Some(1), "{lost}\n-- the other --\n{won}");
    assert!(
        lost.contains("another agentvfs daemon is preparing mountpoint")
            && !lost.contains("whose daemon died"),
        "it waited its turn and cleared nothing:\n{lost}"
    );
    assert!(
        lost.contains(&format!(
            "is busy: a fuse filesystem (agentvfs) is already mounted there, served by process {winner_pid}"
        )),
        "{lost}"
    );
    eprintln!("refused: {}", lost.lines().last().unwrap_or_default());
    crate::harness::within("the winner mounts", Duration::from_secs(20), || {
        is_mounted(&mnt) && daemons[winner].log_text().contains("\n  audit log")
    });
    let won = daemons[winner].log_text();
    assert!(won.contains("whose daemon died"), "{won}");
    assert!(daemons[winner].child.try_wait().unwrap().is_none(), "the winner exited:\n{won}");
    // The winner's connection most often takes the dead one's number (the lowest free).
    eprintln!("the dead connection was {dead_connection}, the winner's is {}", connection_of(&mnt));
    fs::write(mnt.join("host/after-race"), "ok").unwrap();
    assert_eq!(fs::read_to_string(root.join("after-race")).unwrap(), "ok");

    assert!(!released(&mut caller).success(), "the chmod fails: its daemon died");
    released(&mut old);
    tool.join().unwrap();
    unsafe { libc::kill(winner_pid as i32, libc::SIGTERM) };
    assert!(released(&mut daemons[winner].child).success(), "{}", daemons[winner].log_text());
    assert!(!is_mounted(&mnt));
    drop(daemons);
    drop(abort);
    drop(first);
}

/// A mount whose daemon this one cannot see (here the new daemon runs in a PID namespace of
/// its own, whose /proc does not show the first one) and that does not answer (the first
/// daemon is stopped): with no holder at all the kernel would have ended the connection, so
/// whether a daemon serves it cannot be told. It is refused, naming the commands that end it,
/// and its connection is not aborted: once the first daemon goes on, it serves as before.
#[test]
fn a_silent_mount_whose_holder_is_out_of_sight_is_refused_not_aborted() {
    use std::time::{Duration, Instant};
    // By /dev/fuse: a statfs the stopped daemon has not read can be given up when the new
    // daemon exits (one handed to an io_uring entry could not, until the daemon answers).
    let Unmounted { scratch: s, host_root: root, config: cfg } = unmounted("[fuse]\nio_uring = false\n");
    let first = Mount::start(&cfg, &s.path().join("mnt"));
    let mnt = first.dir.clone();
    let name = s.path().file_name().unwrap().to_string_lossy().into_owned();
    let other_state = s.path().join(format!("{name}-b"));
    fs::create_dir(&other_state).unwrap();
    let other_config = crate::harness::config(&other_state, &root, "");

    /// Lets the stopped daemon go on when dropped (before its [`Mount`] stops it).
    struct Continue(i32);
    impl Drop for Continue {
        fn drop(&mut self) {
            unsafe { libc::kill(self.0, libc::SIGCONT) };
        }
    }
    let pid = first.child.as_ref().unwrap().id() as i32;
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let stopped = Continue(pid);
    let log = s.path().join("other.log");
    let mut other = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "--mount-proc", BIN, "mount", "--config"])
        .arg(&other_config)
        .arg(&mnt)
        .env_remove("SUDO_UID")
        .env_remove("SUDO_GID")
        .stdout(std::process::Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while other.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    // Should it still run, the first daemon goes on and it is killed (with its namespaces,
    // and whatever it mounted in them).
    drop(stopped);
    if other.try_wait().unwrap().is_none() {
        unsafe { libc::kill(other.id() as i32, libc::SIGKILL) };
    }
    let status = other.wait().unwrap();
    let err = fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(!err.contains("whose daemon died"), "{err}");
    assert!(
        err.contains(&format!("mountpoint {} holds a mount of agentvfs that is not cleared", mnt.display()))
            && err.contains("yet no process seen here holds its connection")
            && err.contains("/abort` and `umount -l"),
        "{err}"
    );
    eprintln!("refused: {}", err.lines().last().unwrap_or_default());
    // The first daemon's mount was left alone and serves.
    fs::write(first.path("/host/still-served"), "ok").unwrap();
    assert_eq!(fs::read_to_string(root.join("still-served")).unwrap(), "ok");
    first.stop();
}

fn mount_error(config_text: &str) -> String {
    let s = scratch();
    let cfg = s.path().join("bad.toml");
    fs::write(&cfg, config_text).unwrap();
    let out = Command::new(BIN).args(["check", "--config"]).arg(&cfg).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "check should fail for:\n{config_text}");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    // Every message names the file.
    assert!(err.contains(&cfg.display().to_string()), "{err}");
    err.replace(&cfg.display().to_string(), "FILE")
}

#[test]
fn config_errors_name_file_line_and_value() {
    let cases = [
        ("[[rules]]\noperations = [\"read\"]\npaths = [\"/a/[b\"]\nmode = \"deny\"\n", "FILE:3:", "\"/a/[b\""),
        ("[[rules]]\noperations = [\"read\"]\npaths = [\"relative/x\"]\nmode = \"deny\"\n", "FILE:3:", "must start with '/'"),
        ("[[rules]]\noperations = [\"read\"]\npaths = [\"/a/../b\"]\nmode = \"deny\"\n", "FILE:3:", "'..'"),
        ("[[rules]]\noperations = [\"read\"]\npaths = [\"~/x\"]\nmode = \"deny\"\n", "FILE:3:", "not supported"),
        ("[[routes]]\npath = \"/a\"\nbackend = \"memory\"\n\n[[routes]]\npath = \"/a\"\nbackend = \"memory\"\n", "FILE:6:", "duplicate route path \"/a\""),
        ("[[routes]]\npath = \"/w\"\nbackend = \"host\"\nroot = \"/nonexistent/agentvfs\"\n", "FILE:4:", "/nonexistent/agentvfs"),
        ("[[routes]]\npath = \"/w\"\nbackend = \"nfs\"\n", "FILE:3:", "unknown backend \"nfs\""),
        ("[[routes]]\npath = \"/m\"\nbackend = \"memory\"\nstore = \"disk\"\n", "FILE:4:", "unknown memory store \"disk\""),
        ("[[routes]]\npath = \"/d\"\nbackend = \"sqlite\"\ndatabase = \"x.db\"\nstore = \"tmpfs\"\n", "FILE:1:", "key `store` does not apply to backend \"sqlite\""),
        ("[[routes]]\npath = \"/a\"\nbackend = \"sqlite\"\ndatabase = \"x.db\"\n\n[[routes]]\npath = \"/b\"\nbackend = \"sqlite\"\ndatabase = \"x.db\"\n", "FILE:6:", "route \"/b\" uses namespace \"default\" of "),
        ("[audit]\nmax_records = 0\n", "FILE:2:", "max_records must be at least 1"),
        ("mountpont = \"/x\"\n", "FILE:1:", "unknown field `mountpont`"),
        ("[[rules]]\noperations = [\"delete\"]\npaths = [\"/x\"]\nmode = \"deny\"\n", "FILE:2:", "unknown operation \"delete\""),
        ("[[rules]]\noperations = [\"read\"]\npaths = [\"/x\"]\nmode = \"block\"\n", "FILE:4:", "unknown mode \"block\""),
        ("[default\n", "FILE:1:", ""),
    ];
    for (text, location, detail) in cases {
        let err = mount_error(text);
        assert!(err.contains(location) && err.contains(detail), "for:\n{text}\ngot: {err}");
    }
}

/// A second daemon on a sqlite namespace in use would delete the first one's open unlinked
/// files as crash orphans: it is refused, and the first daemon's data is untouched.
#[test]
fn a_sqlite_namespace_serves_one_daemon_at_a_time() {
    let Unmounted { scratch: s, config: cfg, .. } = unmounted("");
    let first = Mount::start(&cfg, &s.path().join("mnt"));
    fs::write(first.path("/db/kept"), "first").unwrap();

    let second_state = s.path().join("second");
    fs::create_dir_all(&second_state).unwrap();
    let text = fs::read_to_string(&cfg).unwrap().replace(
        &s.path().join("agentvfs.sock").display().to_string(),
        &second_state.join("agentvfs.sock").display().to_string(),
    );
    let second_cfg = second_state.join("agentvfs.toml");
    fs::write(&second_cfg, &text).unwrap();
    let second_mnt = s.path().join("mnt2");
    fs::create_dir_all(&second_mnt).unwrap();
    // Should it start after all, it is stopped (and its mount removed) rather than waited for.
    let mut refused = Command::new(BIN)
        .args(["mount", "--config"])
        .arg(&second_cfg)
        .arg(&second_mnt)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while refused.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if refused.try_wait().unwrap().is_none() {
        unsafe { libc::kill(refused.id() as i32, libc::SIGTERM) };
    }
    let out = refused.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let db = s.path().join("store.db").display().to_string();
    assert!(
        err.contains(&format!(
            "sqlite database {db}: namespace \"default\" is in use by another agentvfs daemon"
        )),
        "{err}"
    );
    assert!(!is_mounted(&second_mnt));
    // Another namespace of the same file is fine.
    fs::write(
        &second_cfg,
        text.replace("backend = \"sqlite\"\n", "backend = \"sqlite\"\nnamespace = \"other\"\n"),
    )
    .unwrap();
    let second = Mount::start(&second_cfg, &second_mnt);
    fs::write(second.path("/db/theirs"), "second").unwrap();
    second.stop();
    assert_eq!(fs::read_to_string(first.path("/db/kept")).unwrap(), "first");
    assert!(!first.path("/db/theirs").exists());
    first.stop();
}

#[test]
fn check_prints_routes_and_rules() {
    let Unmounted { scratch: _scratch, host_root: root, config: cfg } =
        unmounted("[[rules]]\noperations = [\"write\"]\npaths = [\"/host/**\"]\nmode = \"deny\"\n");
    let out = Command::new(BIN).args(["check", "--config"]).arg(&cfg).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("/host                host {}", root.display())), "{text}");
    assert!(text.contains("  #0 deny write /host/**"), "{text}");
}

#[test]
fn missing_dev_fuse_is_reported_clearly() {
    let Unmounted { scratch: s, config: cfg, .. } = unmounted("");
    // Starts the daemon in a private mount namespace after `prepare` changed its /dev; exits 1
    // with this error.
    let start_after = |prepare: &str| {
        let script = format!(
            "{prepare} && exec {BIN} mount --config {} {}",
            cfg.display(),
            s.path().join("mnt").display()
        );
        let out = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", &script])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // A /dev that lacks the fuse device.
    let err = start_after("mount -t tmpfs none /dev");
    assert!(err.contains("/dev/fuse is missing"), "{err}");
    // Something else in its place (a container's bind of /dev/null) is named as such, not
    // left to fail at mount() with EINVAL.
    let err = start_after("mount --bind /dev/null /dev/fuse");
    assert!(
        err.contains("/dev/fuse is not the FUSE device (it is device 1:3, the FUSE device is 10:229)"),
        "{err}"
    );
}

/// A mountpoint that holds files is used (as `mount` does), with a warning that they are
/// hidden until the unmount.
#[test]
fn a_mountpoint_that_holds_files_is_used_with_a_warning() {
    let Unmounted { scratch: s, config: cfg, .. } = unmounted("");
    let at = s.path().join("mnt");
    fs::create_dir(&at).unwrap();
    fs::write(at.join("underneath"), "x").unwrap();
    let m = Mount::start(&cfg, &at);
    crate::harness::soon("the warning", || {
        m.log_text().contains(&format!("mountpoint {} is not empty: what it holds is hidden", at.display()))
    });
    assert!(!m.path("/underneath").exists());
    m.stop();
    assert_eq!(fs::read_to_string(at.join("underneath")).unwrap(), "x");
}

#[test]
fn sighup_reloads_rules_and_the_kernel_forgets_cached_entries() {
    let Unmounted { scratch: s, config: cfg, .. } = unmounted("");
    let m = Mount::start(&cfg, &s.path().join("mnt"));
    fs::create_dir(m.path("/mem")).unwrap();
    fs::write(m.path("/mem/secret.txt"), "s").unwrap();
    fs::write(m.path("/db/secret.txt"), "s").unwrap();
    // Cached now: the memory and sqlite routes let the kernel keep entries, and listings,
    // for an hour.
    assert_eq!(fs::read_to_string(m.path("/mem/secret.txt")).unwrap(), "s");
    for _ in 0..2 {
        let names: Vec<_> = fs::read_dir(m.path("/mem")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["secret.txt"]);
    }
    let rules =
        "[[rules]]\noperations = [\"read\", \"write\"]\npaths = [\"/**/secret.txt\"]\nmode = \"deny\"\n";
    let text = fs::read_to_string(&cfg).unwrap() + rules;
    fs::write(&cfg, text).unwrap();
    unsafe { libc::kill(m.child.as_ref().unwrap().id() as i32, libc::SIGHUP) };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while m.path("/mem/secret.txt").exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!m.path("/mem/secret.txt").exists(), "the cached entry still answers");
    assert!(!m.path("/db/secret.txt").exists());
    let names: Vec<_> = fs::read_dir(m.path("/mem")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(names.is_empty(), "{names:?}");
    // A config that fails validation keeps the rules in force.
    fs::write(&cfg, "[[rules]]\nmode = 1\n").unwrap();
    unsafe { libc::kill(m.child.as_ref().unwrap().id() as i32, libc::SIGHUP) };
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(!m.path("/mem/secret.txt").exists());
    assert!(m.log_text().contains("reload failed, keeping the current rules"), "{}", m.log_text());
    m.stop();
}

/// A stop (SIGTERM) in the middle of a tool's whole write leaves no temporary file beside the
/// file, which keeps its old content or has the new one whole.
#[test]
fn a_stop_during_a_tool_write_leaves_no_temporary_file() {
    let Unmounted { scratch: s, host_root: root, config: cfg } = unmounted("");
    let mut m = Mount::start(&cfg, &s.path().join("mnt"));
    fs::write(root.join("big.bin"), "old").unwrap();
    let socket = s.path().join("agentvfs-agent.sock");
    let mut c = agentvfs::control::client::Client::connect(&socket).unwrap();
    let piece = agentvfs::control::tools::common::base64(&vec![7u8; 700_000]);
    const PIECES: usize = 120;
    let mut number = serde_json::Value::Null;
    for i in 0..PIECES - 1 {
        let params = serde_json::json!({"path": "/host/big.bin", "content": piece, "more": true, "upload": number, "offset": i * 700_000});
        let staged = c.call("vfs/upload", Some(params)).unwrap();
        assert_eq!(staged["staged"], (i + 1) * 700_000, "{staged}");
        number = staged["upload"].clone();
    }
    let last = std::thread::spawn(move || {
        let offset = (PIECES - 1) * 700_000;
        let params = serde_json::json!({"path": "/host/big.bin", "content": piece, "upload": number, "offset": offset});
        let _ = c.call("vfs/upload", Some(params));
    });
    let temporary = || {
        fs::read_dir(&root)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(".big.bin.agentvfs-"))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !temporary() {
        assert!(std::time::Instant::now() < deadline, "the write never started");
    }
    let status = m.stop_with(libc::SIGTERM);
    assert!(status.success(), "{status:?}");
    let _ = last.join();
    let names: Vec<String> = fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["big.bin"], "a temporary was left");
    let size = fs::metadata(root.join("big.bin")).unwrap().len();
    assert!(size == 3 || size == (PIECES * 700_000) as u64, "{size}");
}
