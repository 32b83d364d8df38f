//! Test harness: a real daemon on a real mount, unmounted even when a test panics.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub const BIN: &str = env!("CARGO_BIN_EXE_agentvfs");

/// Is `path` a mount point now?
pub fn is_mounted(path: &Path) -> bool {
    let want = path.to_string_lossy().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

/// A scratch directory for one test, removed afterwards.
pub fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("agentvfs-test-").tempdir_in("/tmp").expect("tempdir")
}

/// A test's files before its daemon starts: the scratch directory, the host route's root in it,
/// and a config written by [`config`] with `rules`. Keep `scratch` bound for the whole test:
/// dropping it removes the directory.
pub struct Unmounted {
    pub scratch: tempfile::TempDir,
    pub host_root: PathBuf,
    pub config: PathBuf,
}

pub fn unmounted(rules: &str) -> Unmounted {
    let scratch = scratch();
    let host_root = scratch.path().join("host-root");
    std::fs::create_dir_all(&host_root).unwrap();
    let config = config(scratch.path(), &host_root, rules);
    Unmounted { scratch, host_root, config }
}

/// A running daemon and its mount. Dropping it stops the daemon (SIGTERM) and makes sure
/// nothing stays mounted (lazy unmount as the last resort).
pub struct Mount {
    pub dir: PathBuf,
    pub child: Option<Child>,
    pub log: PathBuf,
}

impl Mount {
    /// Starts `agentvfs mount --config <config> <dir>` and waits for the mount to be live.
    pub fn start(config: &Path, dir: &Path) -> Mount {
        Self::try_start(config, dir).unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn try_start(config: &Path, dir: &Path) -> Result<Mount, String> {
        Self::try_start_logging(config, dir, "warn")
    }

    /// Like [`Mount::try_start`], with the daemon's log filtered by `filter` (`RUST_LOG`).
    pub fn try_start_logging(config: &Path, dir: &Path, filter: &str) -> Result<Mount, String> {
        Self::try_start_with_env(config, dir, filter, &[])
    }

    /// Like [`Mount::try_start_logging`], with `env` added to the daemon's environment. The
    /// daemon never inherits the test's `SUDO_UID`/`SUDO_GID` (they choose `execute`'s user).
    pub fn try_start_with_env(
        config: &Path,
        dir: &Path,
        filter: &str,
        env: &[(&str, &str)],
    ) -> Result<Mount, String> {
        Self::try_start_wrapped(config, dir, filter, env, &[])
    }

    /// Like [`Mount::try_start_with_env`], the daemon started through `wrapper` (a program
    /// and its arguments that then runs the daemon in its place, as `prlimit` does).
    pub fn try_start_wrapped(
        config: &Path,
        dir: &Path,
        filter: &str,
        env: &[(&str, &str)],
        wrapper: &[&str],
    ) -> Result<Mount, String> {
        let parent = dir.parent().expect("a mountpoint has a parent");
        let _ = std::fs::create_dir_all(parent);
        let dir = parent.canonicalize().unwrap().join(dir.file_name().expect("a mountpoint has a name"));
        // A mount a killed daemon left there may answer ENOTCONN, or nothing at all (the kernel
        // still holds its connection): only the daemon looks at it, and clears it.
        if !is_mounted(&dir) {
            let _ = std::fs::create_dir_all(&dir);
        }
        let log = dir.with_extension("log");
        let out = std::fs::File::create(&log).unwrap();
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        let child = command
            .args(["mount", "--config"])
            .arg(config)
            .arg(&dir)
            .env("RUST_LOG", filter)
            .env_remove("SUDO_UID")
            .env_remove("SUDO_GID")
            .envs(env.iter().copied())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("spawn agentvfs");
        let mut mount = Mount { dir, child: Some(child), log };
        let deadline = Instant::now() + Duration::from_secs(20);
        // The daemon says so once the mount is live (a stale mount is listed in mountinfo too),
        // in a banner whose last line names the audit log: tests read the whole banner.
        while !(is_mounted(&mount.dir) && mount.log_text().contains("\n  audit log")) {
            if let Some(status) = mount.child.as_mut().unwrap().try_wait().unwrap() {
                mount.child = None;
                return Err(format!("agentvfs exited ({status}) before mounting:\n{}", mount.log_text()));
            }
            if Instant::now() > deadline {
                return Err(format!("mount did not appear:\n{}", mount.log_text()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(mount)
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel.trim_start_matches('/'))
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `signal` and waits for the daemon to exit.
    pub fn stop_with(&mut self, signal: i32) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        unsafe { libc::kill(child.id() as i32, signal) };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return child.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM; asserts a clean exit and that the mount is gone.
    pub fn stop(mut self) {
        let status = self.stop_with(libc::SIGTERM);
        assert!(
            status.success(),
            "daemon exit {status:?} (signal {:?}):\n{}",
            status.signal(),
            self.log_text()
        );
        assert!(!is_mounted(&self.dir), "still mounted after SIGTERM");
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.stop_with(libc::SIGTERM);
        }
        if is_mounted(&self.dir) {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

/// Runs `sh -c script` with `cwd`, returning (status code, stdout, stderr).
pub fn sh(cwd: &Path, script: &str) -> (i32, String, String) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .expect("run sh");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Like [`sh`], but panics with the output unless the script succeeds.
pub fn sh_ok(cwd: &Path, script: &str) -> String {
    let (code, out, err) = sh(cwd, script);
    assert_eq!(code, 0, "script failed: {script}\nstdout:\n{out}\nstderr:\n{err}");
    out
}

/// The private PostgreSQL server of this test process (started on first use, stopped at exit).
pub fn pg() -> &'static agentvfs::backend::postgres::testing::TestServer {
    agentvfs::backend::postgres::testing::TestServer::shared()
}

/// A config with `/` memory, `/host` → `host_root`, `/db` → sqlite in `state`, `/pg` →
/// postgres (the test server, a namespace named after `state`), plus `rules`.
/// The control socket is `state/agentvfs.sock`, so daemons of parallel tests never collide.
pub fn config(state: &Path, host_root: &Path, rules: &str) -> PathBuf {
    let text = format!(
        r#"
socket = "{socket}"

[default]
backend = "memory"

[[routes]]
path = "/host"
backend = "host"
root = "{host}"

[[routes]]
path = "/db"
backend = "sqlite"
database = "{db}"

[[routes]]
path = "/pg"
backend = "postgres"
url = "{pg}"
namespace = "{namespace}"

[audit]
database = "{audit}"

{rules}
"#,
        socket = state.join("agentvfs.sock").display(),
        host = host_root.display(),
        db = state.join("store.db").display(),
        pg = pg().url(),
        namespace = state.file_name().unwrap().to_string_lossy(),
        audit = state.join("audit.db").display(),
    );
    let path = state.join("agentvfs.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// One daemon with the standard three routes and the given rules, in a fresh scratch dir.
pub struct Fixture {
    // Fields drop in order: the mount must go before its scratch directory is removed, or
    // the removal walks into the live mount and stops at the busy mountpoint.
    pub mount: Mount,
    pub scratch: tempfile::TempDir,
    pub host_root: PathBuf,
}

impl Fixture {
    pub fn new(rules: &str) -> Fixture {
        Fixture::with_config(rules, |text| text.to_string())
    }

    /// Like [`Fixture::new`], with the config text passed through `edit` first.
    pub fn with_config(rules: &str, edit: impl Fn(&str) -> String) -> Fixture {
        let Unmounted { scratch, host_root, config: cfg } = unmounted(rules);
        std::fs::write(&cfg, edit(&std::fs::read_to_string(&cfg).unwrap())).unwrap();
        let mount = Mount::start(&cfg, &scratch.path().join("mnt"));
        // The memory route serves `/`; its tests work in a directory of their own.
        std::fs::create_dir(mount.path("/mem")).unwrap();
        Fixture { scratch, host_root, mount }
    }

    pub fn p(&self, rel: &str) -> PathBuf {
        self.mount.path(rel)
    }
}

/// The resident memory of process `pid`, in bytes.
pub fn resident(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// The daemon's `status` (JSON), asked through the CLI.
pub fn status(fx: &Fixture) -> serde_json::Value {
    status_at(&fx.scratch.path().join("agentvfs.sock"))
}

/// The `status` (JSON) of the daemon at `socket`.
pub fn status_at(socket: &Path) -> serde_json::Value {
    let out =
        std::process::Command::new(BIN).args(["status", "--json", "--socket"]).arg(socket).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Files open through the mount now, as `status` counts them. The kernel releases a file
/// shortly after its last descriptor is closed, not at the `close` itself.
pub fn open_files(fx: &Fixture) -> u64 {
    status(fx)["counters"]["fuse_open_files"].as_u64().unwrap()
}

/// Waits (up to 3 s) for `check` to hold: for what the daemon or the kernel does shortly
/// after a call returns.
pub fn soon(what: &str, check: impl Fn() -> bool) {
    within(what, Duration::from_secs(3), check)
}

/// Waits up to `limit` for `check` to hold.
pub fn within(what: &str, limit: Duration, check: impl Fn() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "not seen in time: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The routes every file-semantics test runs against.
pub const ROUTES: [&str; 4] = ["/host", "/mem", "/db", "/pg"];

/// Calls a tool through `client` and says whether it succeeded, with the text it returned.
pub fn call_tool(
    client: &mut agentvfs::control::client::Client,
    name: &str,
    arguments: serde_json::Value,
) -> (bool, String) {
    let params = serde_json::json!({"name": name, "arguments": arguments});
    let result = client.call("tools/call", Some(params)).unwrap();
    let text = result["content"][0]["text"].as_str().unwrap_or_default().to_string();
    (result["isError"] != serde_json::json!(true), text)
}

/// Tests that load every CPU on purpose ([`BusyCpus`]) and tests that need a CPU to
/// themselves take turns through this.
static CPU_TURNS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// This test's turn with the CPUs (see [`CPU_TURNS`]), until the guard is dropped.
pub fn cpu_turn() -> std::sync::MutexGuard<'static, ()> {
    CPU_TURNS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Threads that keep every CPU busy until dropped (each test doing so waits for its turn,
/// see [`cpu_turn`]).
pub struct BusyCpus {
    _turn: std::sync::MutexGuard<'static, ()>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl BusyCpus {
    pub fn start() -> BusyCpus {
        let turn = cpu_turn();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let threads = (0..cpus)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        BusyCpus { _turn: turn, stop, threads }
    }
}

impl Drop for BusyCpus {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// A mount on the host a test makes (a small tmpfs, a bind mount), unmounted even when the
/// test panics.
pub struct HostMount(pub PathBuf);

impl HostMount {
    /// A tmpfs of `megabytes` at `dir` (made if missing).
    pub fn small_disk(dir: &Path, megabytes: u32) -> HostMount {
        std::fs::create_dir_all(dir).unwrap();
        let size = format!("size={megabytes}m");
        HostMount::mount(&["-t", "tmpfs", "-o", &size, "tmpfs"], dir)
    }

    /// `source` bound at `at` (an existing directory).
    pub fn bind(source: &Path, at: &Path) -> HostMount {
        HostMount::mount(&["--bind", source.to_str().unwrap()], at)
    }

    fn mount(args: &[&str], at: &Path) -> HostMount {
        assert!(Command::new("mount").args(args).arg(at).status().unwrap().success());
        HostMount(at.to_path_buf())
    }
}

impl Drop for HostMount {
    fn drop(&mut self) {
        if Command::new("umount").arg(&self.0).status().map(|s| !s.success()).unwrap_or(true) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

/// A connection to `socket` whose peer (SO_PEERCRED, taken at connect) is `uid`: made from a
/// thread that switched to `uid` alone (the raw system calls change that thread only).
pub fn connect_as(uid: u32, socket: &Path) -> std::os::unix::net::UnixStream {
    let socket = socket.to_path_buf();
    std::thread::spawn(move || {
        // SAFETY: raw setresgid/setresuid change this thread's credentials only; it ends right
        // after connecting.
        unsafe {
            assert_eq!(libc::syscall(libc::SYS_setresgid, uid, uid, uid), 0);
            assert_eq!(libc::syscall(libc::SYS_setresuid, uid, uid, uid), 0);
        }
        std::os::unix::net::UnixStream::connect(&socket).unwrap_or_else(|e| panic!("uid {uid} connects: {e}"))
    })
    .join()
    .unwrap()
}

/// One raw connection: lines out, lines in (with a timeout, so a missing reply fails).
pub struct Conn {
    pub stream: UnixStream,
    lines: BufReader<UnixStream>,
}

impl Conn {
    fn new(stream: UnixStream) -> Conn {
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Conn { lines: BufReader::new(stream.try_clone().unwrap()), stream }
    }

    pub fn open(socket: &Path) -> Conn {
        Conn::new(UnixStream::connect(socket).unwrap_or_else(|e| panic!("connect {}: {e}", socket.display())))
    }

    /// Like [`Conn::open`], with `uid` as its peer ([`connect_as`]).
    pub fn open_as(uid: u32, socket: &Path) -> Conn {
        Conn::new(connect_as(uid, socket))
    }

    pub fn send(&mut self, text: &str) {
        self.stream.write_all(text.as_bytes()).unwrap();
    }

    /// The next line, whole (its length is what went over the wire).
    pub fn recv_line(&mut self) -> String {
        let mut line = String::new();
        self.lines.read_line(&mut line).expect("a reply line");
        assert!(line.ends_with('\n'), "incomplete reply: {line:?}");
        line
    }

    pub fn recv(&mut self) -> Value {
        let line = self.recv_line();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("reply is not JSON ({e}): {line}"))
    }

    /// Sends a request and returns its whole response.
    pub fn request(&mut self, id: u64, method: &str, params: Value) -> Value {
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send(&format!("{request}\n"));
        let reply = self.recv();
        assert_eq!(reply["id"], json!(id), "{reply}");
        reply
    }

    pub fn result(&mut self, id: u64, method: &str, params: Value) -> Value {
        let reply = self.request(id, method, params);
        assert!(reply.get("error").is_none(), "{method}: {reply}");
        reply["result"].clone()
    }

    /// The error code and message of a reply.
    pub fn error_of(reply: &Value) -> (i64, String) {
        let e = &reply["error"];
        (
            e["code"].as_i64().unwrap_or_else(|| panic!("not an error: {reply}")),
            e["message"].as_str().unwrap().to_string(),
        )
    }
}
