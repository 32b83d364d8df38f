//! A private PostgreSQL server for the tests: its own data directory under `/tmp`, its own port
//! and socket directory, run as the unprivileged `postgres` user (or `nobody`), from Debian's
//! packages (`scripts/setup.sh` installs them). It is stopped and removed when dropped; a
//! watchdog process does it if the test process dies first (even by SIGKILL), and the shared
//! server of a test process is stopped when the process exits.
//!
//! Local (socket) connections are trusted; TCP connections need the password [`PASSWORD`].

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

/// The password of user `postgres` over TCP.
pub const PASSWORD: &str = "agentvfs-test";

pub struct TestServer {
    dir: PathBuf,
    bin: PathBuf,
    user: String,
    pub port: u16,
    watchdog: Option<Child>,
}

/// The directory of Debian's server binaries (the newest version), or of `pg_ctl` on `PATH`.
fn bin_dir() -> Result<PathBuf, String> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|b| b.join("pg_ctl").exists())
        .collect();
    found.sort_by_key(|p| p.parent().and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok()));
    if let Some(dir) = found.pop() {
        return Ok(dir);
    }
    let out = Command::new("sh").args(["-c", "command -v pg_ctl"]).output().map_err(|e| e.to_string())?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    match Path::new(&path).parent() {
        Some(dir) if out.status.success() => Ok(dir.to_path_buf()),
        _ => Err("PostgreSQL is not installed: run scripts/setup.sh".into()),
    }
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("bound").port()
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

impl TestServer {
    /// initdb and start a new server; it is ready when this returns.
    pub fn start() -> Result<TestServer, String> {
        let dir = nix::unistd::mkdtemp("/tmp/agentvfs-pg-XXXXXX").map_err(|e| format!("mkdtemp: {e}"))?;
        TestServer::start_in(dir)
    }

    /// [`TestServer::start`] with its files in `dir`, an empty directory (a small filesystem
    /// mounted there, to fill the server's disk). Its contents are removed with the server.
    pub fn start_in(dir: PathBuf) -> Result<TestServer, String> {
        let bin = bin_dir()?;
        let user = ["postgres", "nobody"]
            .into_iter()
            .find(|u| nix::unistd::User::from_name(u).ok().flatten().is_some())
            .ok_or("no unprivileged user (postgres, nobody) to run the server as")?;
        let pw = nix::unistd::User::from_name(user).ok().flatten().expect("found above");
        nix::unistd::chown(&dir, Some(pw.uid), Some(pw.gid)).map_err(|e| e.to_string())?;
        let pwfile = dir.join("pw");
        std::fs::write(&pwfile, PASSWORD).map_err(|e| e.to_string())?;
        nix::unistd::chown(&pwfile, Some(pw.uid), Some(pw.gid)).map_err(|e| e.to_string())?;
        let mut server = TestServer { dir, bin, user: user.to_string(), port: free_port(), watchdog: None };
        server.watchdog = Some(server.spawn_watchdog()?);
        let data = server.data();
        server.run(&[
            "initdb",
            "-D",
            &data,
            "-U",
            "postgres",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "--pwfile",
            &pwfile.display().to_string(),
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        ])?;
        server.start_again()?;
        Ok(server)
    }

    /// The server every test of this process shares (started on first use, stopped at exit).
    pub fn shared() -> &'static TestServer {
        static SHARED: OnceLock<TestServer> = OnceLock::new();
        extern "C" fn stop_shared() {
            if let Some(server) = SHARED.get() {
                server.remove();
            }
        }
        SHARED.get_or_init(|| {
            let server = TestServer::start().unwrap_or_else(|e| panic!("private PostgreSQL server: {e}"));
            // SAFETY: registering a plain function to run at exit.
            unsafe { libc::atexit(stop_shared) };
            server
        })
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    /// Runs one of the server's programs as its user.
    fn run(&self, args: &[&str]) -> Result<(), String> {
        let program = self.bin.join(args[0]);
        let out = Command::new("setpriv")
            .args(["--reuid", &self.user, "--regid", &self.user, "--init-groups", "--"])
            .arg(&program)
            .args(&args[1..])
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{}: {e}", program.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} failed: {}{}",
                args[0],
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(())
    }

    /// Starts the server (again, after [`TestServer::stop`]) on the same port and data.
    pub fn start_again(&self) -> Result<(), String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=400 -c fsync=off",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("server.log").display().to_string();
        self.run(&["pg_ctl", "-D", &self.data(), "-l", &log, "-w", "-t", "60", "-o", &options, "start"])
    }

    /// Stops the server (fast shutdown: sessions are ended, committed data is kept).
    pub fn stop(&self) -> Result<(), String> {
        self.run(&["pg_ctl", "-D", &self.data(), "-w", "-m", "fast", "stop"])
    }

    /// Stops the server as a crash would (immediate shutdown: what its WAL buffers held and no
    /// commit waited for is lost).
    pub fn crash(&self) -> Result<(), String> {
        self.run(&["pg_ctl", "-D", &self.data(), "-w", "-m", "immediate", "stop"])
    }

    /// A URL reaching the server by its Unix socket (no password), database `postgres`.
    pub fn url(&self) -> String {
        let dir = self.dir.display().to_string().replace('/', "%2F");
        format!("postgresql://postgres@{dir}:{}/postgres", self.port)
    }

    /// A URL reaching the server over TCP, without the password (it needs [`PASSWORD`]).
    pub fn tcp_url(&self) -> String {
        format!("postgresql://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// A process that stops the server and removes its files once this process is gone.
    fn spawn_watchdog(&self) -> Result<Child, String> {
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; \
             setpriv --reuid {user} --regid {user} --init-groups -- {pg_ctl} -D {data} -m immediate stop >/dev/null 2>&1; \
             rm -rf {dir}",
            pid = std::process::id(),
            user = self.user,
            pg_ctl = sh_quote(&self.bin.join("pg_ctl").display().to_string()),
            data = sh_quote(&self.data()),
            dir = sh_quote(&self.dir.display().to_string()),
        );
        Command::new("setsid")
            .args(["sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("setsid: {e}"))
    }

    /// Stops the server at once and removes its files.
    fn remove(&self) {
        let _ = self.run(&["pg_ctl", "-D", &self.data(), "-m", "immediate", "stop"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.remove();
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }
}
