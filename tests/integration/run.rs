//! `agentvfs run` on a real terminal (tmux) as an agent user (nobody, in `[control] agents`):
//! the gated tree is its whole file system, its writes are the user's, Ctrl-C and the exit
//! status come back, and an interrupt pauses it until an approver answers from outside.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::{Fixture, BIN};

mod terminal;

/// `.env` is denied; writes under `/host/guarded` wait for an approver.
const RULES: &str = r#"
[[rules]]
operations = ["read", "write"]
paths = ["/**/.env"]
mode = "deny"

[[rules]]
operations = ["write"]
paths = ["/host/guarded/**"]
mode = "interrupt"

[control]
agents = ["nobody"]

[exec]
cwd = "/host"
"#;

/// `setpriv` in front of a command: nobody (65534:65534), no other groups.
pub(crate) const AS_NOBODY: &str = "setpriv --reuid=65534 --regid=65534 --clear-groups";

/// The environment of `sudo` run by nobody: `agentvfs run` as root then acts for nobody.
pub(crate) const SUDO_NOBODY: [(&str, &str); 2] = [("SUDO_UID", "65534"), ("SUDO_GID", "65534")];

/// A tmux server of one test (its own socket), killed with every session when dropped.
struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    fn new(dir: &Path) -> Tmux {
        Tmux { socket: dir.join("tmux.sock") }
    }

    fn tmux(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux").arg("-S").arg(&self.socket).args(args).stdin(Stdio::null()).output().unwrap()
    }

    /// Starts session `name` running `sh -c script` on a 120x40 terminal.
    fn start(&self, name: &str, script: &str) {
        let out = self.tmux(&["new-session", "-d", "-s", name, "-x", "120", "-y", "40", script]);
        assert!(out.status.success(), "tmux: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn keys(&self, name: &str, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", name];
        args.extend_from_slice(keys);
        assert!(self.tmux(&args).status.success());
    }

    /// Starts session `name` running an interactive bash (prompt `$ `, job control on), and
    /// waits for its prompt.
    fn bash(&self, name: &str) {
        self.start(name, "PS1='$ ' exec bash --norc --noprofile -i");
        self.wait_for(name, "$ ");
    }

    /// Types `line` and Enter.
    fn line(&self, name: &str, line: &str) {
        self.keys(name, &["-l", line]);
        self.keys(name, &["Enter"]);
    }

    fn screen(&self, name: &str) -> String {
        String::from_utf8_lossy(&self.tmux(&["capture-pane", "-p", "-J", "-S", "-200", "-t", name]).stdout)
            .into_owned()
    }

    /// Waits (up to 20 s) until the screen of `name` shows `text`; returns the screen.
    fn wait_for(&self, name: &str, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let screen = self.screen(name);
            if screen.contains(text) {
                return screen;
            }
            assert!(Instant::now() < deadline, "{text:?} not on the screen of {name}:\n{screen}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.tmux(&["kill-server"]);
    }
}

/// The test's daemon, a copy of the binary nobody may run, and the script prefix that runs
/// `agentvfs run` as nobody with the daemon's config.
pub(crate) struct Setup {
    pub(crate) f: Fixture,
    pub(crate) config: PathBuf,
    pub(crate) bin: PathBuf,
}

impl Setup {
    pub(crate) fn new() -> Setup {
        Setup::edited(str::to_string)
    }

    /// Like [`Setup::new`], with the daemon's config text passed through `edit` first.
    pub(crate) fn edited(edit: impl Fn(&str) -> String) -> Setup {
        let f = Fixture::with_config(RULES, edit);
        let scratch = f.scratch.path().to_path_buf();
        let bin = scratch.join("agentvfs");
        assert!(Command::new("cp").arg(BIN).arg(&bin).status().unwrap().success());
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&scratch, std::fs::Permissions::from_mode(0o711)).unwrap();
        std::fs::create_dir(f.host_root.join("guarded")).unwrap();
        std::fs::write(f.host_root.join(".env"), "SECRET=1\n").unwrap();
        for path in [f.host_root.clone(), f.host_root.join("guarded"), f.host_root.join(".env")] {
            std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
        }
        let config = scratch.join("agentvfs.toml");
        Setup { f, config, bin }
    }

    /// `agentvfs run --config … -- ARGS` as nobody, for a shell script.
    fn run_as_nobody(&self, args: &str) -> String {
        format!("{AS_NOBODY} {} run --config {} -- {args}", self.bin.display(), self.config.display())
    }

    /// A tmux script that runs `command` with SIGINT reaching it (the outer shell only
    /// catches it) and writes its exit status to `status`.
    fn script(&self, command: &str, status: &Path) -> String {
        format!("trap : INT; {command}; echo $? > {}; sleep 600", status.display())
    }

    /// Makes nobody's home in the tree once, through sudo (nobody finds it afterwards).
    pub(crate) fn make_home(&self) {
        let (code, _, err) =
            cli(&["run", "--config", self.config.to_str().unwrap(), "--", "true"], &SUDO_NOBODY);
        assert_eq!(code, 0, "{err}");
    }

    fn control_socket(&self) -> PathBuf {
        self.f.scratch.path().join("agentvfs.sock")
    }
}

/// Waits (up to 20 s) for the file `status` and returns the number in it.
fn exit_status(status: &Path) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(text) = std::fs::read_to_string(status) {
            if text.ends_with('\n') {
                return text.trim().parse().unwrap();
            }
        }
        assert!(Instant::now() < deadline, "no exit status in {}", status.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The CLI as root (outside every sandbox): (exit code, stdout, stderr).
pub(crate) fn cli(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .env_remove("SUDO_UID")
        .env_remove("SUDO_GID")
        .env_remove("AGENTVFS_SOCKET")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

/// Processes of nobody whose command line starts with `argv`.
fn pids(argv: &[&str]) -> Vec<i32> {
    let want: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain([0])).collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.metadata().is_ok_and(|m| m.uid() == 65534))
        .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c.starts_with(&want)))
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// How many processes of nobody run exactly `argv`.
fn processes(argv: &[&str]) -> usize {
    let exact: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain([0])).collect();
    pids(argv)
        .into_iter()
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == exact))
        .count()
}

#[test]
fn a_program_runs_on_a_terminal_as_the_agent_user_inside_the_gated_tree() {
    let s = Setup::new();
    let config = s.config.to_str().unwrap();
    // As root without sudo: refused. Through sudo: the sudo user, whose home is made.
    let (code, _, err) = cli(&["run", "--config", config, "--", "true"], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("refuses to run a program as root: an agent must not be root"), "{err}");
    let sudo = SUDO_NOBODY;
    let (code, out, err) =
        cli(&["run", "--config", config, "--", "sh", "-c", "id -u; id -g; echo $HOME; pwd"], &sudo);
    assert_eq!((code, out.as_str()), (0, "65534\n65534\n/home/nobody\n/host\n"), "{err}");
    let home = std::fs::metadata(s.f.p("/home/nobody")).unwrap();
    assert_eq!((home.uid(), home.gid(), home.mode() & 0o7777), (65534, 65534, 0o700));

    let tmux = Tmux::new(s.f.scratch.path());
    let status = s.f.scratch.path().join("shell.status");
    tmux.start("shell", &s.script(&s.run_as_nobody("bash --norc --noprofile"), &status));
    tmux.wait_for("shell", "$ ");
    tmux.line("shell", "id -u; pwd; echo \"home=$HOME socket=$AGENTVFS_SOCKET\"");
    tmux.wait_for("shell", "home=/home/nobody socket=/run/agentvfs/agent.sock");
    tmux.line("shell", "cat .env; echo \"[cat $?]\"");
    let screen = tmux.wait_for("shell", "[cat 1]");
    assert!(screen.contains("cat: .env: No such file or directory"), "{screen}");
    assert!(screen.contains("65534\n/host\n"), "{screen}");
    // Neither root's home nor the host's /home: only what the tree has.
    tmux.line("shell", "ls -d /root; ls /home; echo \"[ls $?]\"");
    let screen = tmux.wait_for("shell", "[ls 0]");
    assert!(
        screen.contains("ls: cannot access '/root': No such file or directory\nnobody\n[ls 0]"),
        "{screen}"
    );
    tmux.line("shell", "grep -E 'NoNewPrivs|CapEff' /proc/self/status | tr -s '\\t' ' '; echo \"[caps $?]\"");
    let screen = tmux.wait_for("shell", "[caps 0]");
    assert!(screen.contains("CapEff: 0000000000000000\nNoNewPrivs: 1\n[caps 0]"), "{screen}");
    // The program cannot type into the terminal it shares with the caller (TIOCSTI would leave
    // a command in the caller's shell, to run outside the sandbox).
    let sti = "import fcntl, sys, termios\ntry:\n    fcntl.ioctl(0, termios.TIOCSTI, b'x')\n    print('typed')\nexcept OSError as e:\n    print('refused', e.errno)";
    tmux.line("shell", &format!("python3 -c \"{sti}\"; echo \"[sti $?]\""));
    let screen = tmux.wait_for("shell", "[sti 0]");
    assert!(screen.contains(&format!("refused {}\n[sti 0]", libc::EPERM)), "{screen}");
    // Nor through any other process of the sandbox (say by ptrace of its pid 1, bubblewrap's
    // init, which shares the terminal): every one of them is under the filter.
    tmux.line(
        "shell",
        "grep -h '^Seccomp:' /proc/[0-9]*/status | sort | uniq -c | tr -s ' \\t' ' '; echo \"[filtered $?]\"",
    );
    let screen = tmux.wait_for("shell", "[filtered 0]");
    assert!(screen.contains(" Seccomp: 2\n[filtered 0]"), "{screen}");
    assert!(!screen.contains("Seccomp: 0"), "{screen}");
    tmux.line("shell", "echo made > /host/made.txt; echo \"[w $?]\"");
    tmux.wait_for("shell", "[w 0]");
    let made = std::fs::metadata(s.f.host_root.join("made.txt")).unwrap();
    assert_eq!((made.uid(), made.gid()), (65534, 65534));
    assert_eq!(std::fs::read_to_string(s.f.host_root.join("made.txt")).unwrap(), "made\n");

    // The agent's CLI works with no flags; the approver's has no socket here and says so.
    tmux.line("shell", "agentvfs tools; echo \"[tools $?]\"");
    let screen = tmux.wait_for("shell", "[tools 0]");
    assert!(screen.contains("read_file    read-only") && screen.contains("write_file"), "{screen}");
    tmux.line("shell", "agentvfs call ls '{\"path\": \"/host\"}'; echo \"[call $?]\"");
    let screen = tmux.wait_for("shell", "[call 0]");
    assert!(screen.contains("/host/made.txt") && !screen.contains("/host/.env"), "{screen}");
    let ping = r#"{"jsonrpc":"2.0","id":41,"method":"ping"}"#;
    tmux.line("shell", &format!("echo '{ping}' | agentvfs mcp; echo \"[mcp $?]\""));
    let screen = tmux.wait_for("shell", "[mcp 0]");
    assert!(screen.contains(r#"{"id":41,"jsonrpc":"2.0","result":{}}"#), "{screen}");
    tmux.line("shell", "agentvfs approve 1; echo \"[approve $?]\"");
    let screen = tmux.wait_for("shell", "[approve 1]");
    assert!(
        screen.contains("agentvfs: permission denied: interrupts/resolve needs the approver role (the control socket); inside `agentvfs run` there is no control socket"),
        "{screen}"
    );

    // A new name under an interrupt rule is refused at once (the kernel would hold the
    // directory while a human decides); the approver outside approves, and the retry lands.
    tmux.line("shell", "echo key > /host/guarded/k; echo \"[guarded $?]\"");
    tmux.wait_for("shell", "[guarded 1]");
    let socket = s.control_socket();
    let socket = socket.to_str().unwrap();
    let (_, out, _) = cli(&["interrupts", "--json", "--socket", socket], &[]);
    let list: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
    let t =
        list["interrupts"].as_array().and_then(|a| a.first()).unwrap_or_else(|| panic!("no ticket: {out}"));
    assert_eq!(
        (&t["uid"], &t["operation"], &t["retry"]),
        (&json!(65534), &json!("create"), &json!(true)),
        "{t}"
    );
    assert!(!s.f.host_root.join("guarded/k").exists());
    let (code, _, err) = cli(&["approve", &t["id"].to_string(), "--socket", socket], &[]);
    assert_eq!(code, 0, "{err}");
    tmux.line("shell", "echo key > /host/guarded/k; echo \"[again $?]\"");
    tmux.wait_for("shell", "[again 0]");
    assert_eq!(std::fs::read_to_string(s.f.host_root.join("guarded/k")).unwrap(), "key\n");
    assert_eq!(std::fs::metadata(s.f.host_root.join("guarded/k")).unwrap().uid(), 65534);

    // A change to the existing file waits for the approver outside, then lands.
    tmux.line("shell", "echo more > /host/guarded/k; echo \"[paused $?]\"");
    let deadline = Instant::now() + Duration::from_secs(20);
    let id = loop {
        let (_, out, _) = cli(&["interrupts", "--json", "--socket", socket], &[]);
        let list: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
        if let Some(t) = list["interrupts"].as_array().and_then(|a| a.first()) {
            assert_eq!((&t["uid"], &t["operation"]), (&json!(65534), &json!("open")), "{t}");
            break t["id"].as_u64().unwrap();
        }
        assert!(Instant::now() < deadline, "no pending interrupt: {out}");
        std::thread::sleep(Duration::from_millis(20));
    };
    std::thread::sleep(Duration::from_millis(300));
    let screen = tmux.screen("shell");
    assert!(
        !screen.contains("[paused 0]") && !screen.contains("[paused 1]"),
        "the write did not wait:\n{screen}"
    );
    assert_eq!(std::fs::read_to_string(s.f.host_root.join("guarded/k")).unwrap(), "key\n");
    let (code, _, err) = cli(&["approve", &id.to_string(), "--socket", socket], &[]);
    assert_eq!(code, 0, "{err}");
    tmux.wait_for("shell", "[paused 0]");
    assert_eq!(std::fs::read_to_string(s.f.host_root.join("guarded/k")).unwrap(), "more\n");

    tmux.line("shell", "exit 7");
    assert_eq!(exit_status(&status), 7, "{}", tmux.screen("shell"));
}

#[test]
fn ctrl_c_and_signals_reach_the_program_everything_it_started_ends_with_it_and_its_status_comes_back() {
    let s = Setup::new();
    s.make_home();
    let tmux = Tmux::new(s.f.scratch.path());
    let three = s.f.scratch.path().join("three.status");
    tmux.start("three", &s.script(&s.run_as_nobody("sh -c 'exit 3'"), &three));
    assert_eq!(exit_status(&three), 3);

    let sleep = s.f.scratch.path().join("sleep.status");
    tmux.start("sleep", &s.script(&s.run_as_nobody("sh -c 'sleep 200 & exec sleep 100'"), &sleep));
    let deadline = Instant::now() + Duration::from_secs(20);
    while processes(&["sleep", "100"]) == 0 || processes(&["sleep", "200"]) == 0 {
        assert!(Instant::now() < deadline, "the sleeps did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let started = Instant::now();
    tmux.keys("sleep", &["C-c"]);
    assert_eq!(exit_status(&sleep), 130);
    assert!(started.elapsed() < Duration::from_secs(10));
    // The background job went with it: the PID namespace is gone.
    crate::harness::soon("no sleep left", || {
        processes(&["sleep", "200"]) + processes(&["sleep", "100"]) == 0
    });

    // A program that handles Ctrl-C itself gets it and goes on (the sandbox is not torn down).
    let caught = s.f.scratch.path().join("caught.status");
    let program = "sh -c 'trap \"echo caught\" INT; sleep 101; echo \"[after $?]\"; exit 4'";
    tmux.start("caught", &s.script(&s.run_as_nobody(program), &caught));
    crate::harness::within("sleep 101", Duration::from_secs(20), || processes(&["sleep", "101"]) == 1);
    tmux.keys("caught", &["C-c"]);
    assert_eq!(exit_status(&caught), 4, "{}", tmux.screen("caught"));
    assert!(tmux.screen("caught").contains("caught\n[after 130]"), "{}", tmux.screen("caught"));

    // SIGTERM sent to `agentvfs run` reaches the program.
    let term = s.f.scratch.path().join("term.status");
    let program = "sh -c 'trap \"exit 5\" TERM; sleep 102 & wait'";
    tmux.start("term", &s.script(&s.run_as_nobody(program), &term));
    crate::harness::within("sleep 102", Duration::from_secs(20), || processes(&["sleep", "102"]) == 1);
    let bin = s.bin.to_str().unwrap();
    let run = pids(&[bin, "run"]);
    assert_eq!(run.len(), 1, "{run:?}");
    unsafe { libc::kill(run[0], libc::SIGTERM) };
    assert_eq!(exit_status(&term), 5, "{}", tmux.screen("term"));
    crate::harness::soon("no sleep left", || processes(&["sleep", "102"]) == 0);
}

#[test]
fn without_a_home_it_may_create_the_user_is_told_how_to_get_one() {
    let s = Setup::new();
    let out = Command::new("sh")
        .arg("-c")
        .arg(s.run_as_nobody("true"))
        .env_remove("SUDO_UID")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot create HOME /home/nobody in the tree: mkdir /home: Permission denied"),
        "{err}"
    );
    assert!(err.contains("sudo agentvfs run"), "{err}");
}

/// Made as root (through sudo), the home is walked without following a symlink: a link in
/// its path (put there by another session's program, say) is refused, never followed out of
/// the tree for a mkdir and a chown as root.
#[test]
fn a_home_through_a_symlink_is_refused_not_followed() {
    let s = Setup::new();
    let outside = s.f.scratch.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, s.f.host_root.join("link")).unwrap();
    let config = s.config.to_str().unwrap();
    let text = std::fs::read_to_string(&s.config).unwrap() + "\n[run]\nhome = \"/host/link/me\"\n";
    std::fs::write(&s.config, text).unwrap();
    let sudo = SUDO_NOBODY;
    let (code, _, err) = cli(&["run", "--config", config, "--", "true"], &sudo);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("HOME /host/link/me: /host/link exists in the tree and is not a directory"),
        "{err}"
    );
    assert!(!outside.join("me").exists(), "made outside the tree");
}

/// A `--config` file says which socket, home, variables and network the next run gives its
/// program, so one the program could rewrite through the tree is refused; behind an interrupt
/// rule (a human answers each write) it is used.
#[test]
fn a_config_file_the_program_could_change_is_refused() {
    let s = Setup::new();
    let sudo = SUDO_NOBODY;
    let text = std::fs::read_to_string(&s.config).unwrap();
    let writable = s.f.host_root.join("agent.toml");
    std::fs::write(&writable, &text).unwrap();
    std::os::unix::fs::chown(&writable, Some(65534), Some(65534)).unwrap();
    let (code, _, err) = cli(&["run", "--config", writable.to_str().unwrap(), "--", "true"], &sudo);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("is /host/agent.toml in the tree, and the program could change it"), "{err}");

    // Root's file in root's directory, but that directory's parent is the user's: the directory
    // could be renamed away and made again with another file in it.
    std::fs::create_dir(s.f.host_root.join("ro")).unwrap();
    let in_roots = s.f.host_root.join("ro/agent.toml");
    std::fs::write(&in_roots, &text).unwrap();
    let (code, _, err) = cli(&["run", "--config", in_roots.to_str().unwrap(), "--", "true"], &sudo);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("is /host/ro/agent.toml in the tree"), "{err}");

    // A link in the tree to a config outside it: the program could point the link elsewhere.
    let linked = s.f.host_root.join("linked.toml");
    std::os::unix::fs::symlink(&s.config, &linked).unwrap();
    let (code, _, err) = cli(&["run", "--config", linked.to_str().unwrap(), "--", "true"], &sudo);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("is /host/linked.toml in the tree"), "{err}");

    // A directory of the user's outside the tree, bind-mounted under the host route's root
    // (which the route follows): the same file, in the tree under another path.
    let outside = s.f.scratch.path().join("configs");
    std::fs::create_dir(&outside).unwrap();
    std::os::unix::fs::chown(&outside, Some(65534), Some(65534)).unwrap();
    let bound = outside.join("agent.toml");
    std::fs::write(&bound, &text).unwrap();
    std::os::unix::fs::chown(&bound, Some(65534), Some(65534)).unwrap();
    let (code, _, err) = cli(&["run", "--config", bound.to_str().unwrap(), "--", "true"], &sudo);
    assert_eq!(code, 0, "not in the tree yet: {err}");
    std::fs::create_dir(s.f.host_root.join("bound")).unwrap();
    let _bind = crate::harness::HostMount::bind(&outside, &s.f.host_root.join("bound"));
    let (code, _, err) = cli(&["run", "--config", bound.to_str().unwrap(), "--", "true"], &sudo);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("is /host/bound/agent.toml in the tree"), "{err}");

    let guarded = s.f.host_root.join("guarded/agent.toml");
    std::fs::write(&guarded, &text).unwrap();
    let (code, _, err) = cli(&["run", "--config", guarded.to_str().unwrap(), "--", "true"], &sudo);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = cli(&["run", "--config", s.config.to_str().unwrap(), "--", "true"], &sudo);
    assert_eq!(code, 0, "{err}");
}

/// The sandbox is a process group of its own: a program signalling its own group
/// (`kill(0, …)`, `kill 0`) reaches the sandbox, not `agentvfs run` or the script that
/// started it without job control.
#[test]
fn a_signal_to_the_programs_process_group_stays_in_the_sandbox() {
    let s = Setup::new();
    s.make_home();
    // The caller's script runs as the same user (a signal needs that), without job control.
    let dir = s.f.scratch.path().join("caller");
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    let status = dir.join("usr1.status");
    let script = dir.join("caller.sh");
    let text = format!(
        "trap 'echo OUTER-GOT-USR1' USR1\n{} run --config {} -- sh -c 'kill -USR1 0; sleep 5'\n\
         echo $? > {}\necho END\nsleep 600\n",
        s.bin.display(),
        s.config.display(),
        status.display()
    );
    std::fs::write(&script, text).unwrap();
    let tmux = Tmux::new(s.f.scratch.path());
    tmux.start("usr1", &format!("{AS_NOBODY} sh {}", script.display()));
    // bubblewrap, in the program's group, ended by the signal: 128 + SIGUSR1.
    assert_eq!(exit_status(&status), 138, "{}", tmux.screen("usr1"));
    let screen = tmux.wait_for("usr1", "END");
    assert!(!screen.contains("OUTER-GOT-USR1"), "{screen}");
}

/// Job control as a shell gives it: Ctrl-Z (which goes through the sandbox's pty) stops the
/// program and `agentvfs run` with it (the shell gets its terminal back), `fg` continues both
/// and relays keystrokes again; in the background the program runs, and a read of its
/// terminal waits for `fg` (it no longer stops the job: the terminal it reads is its own pty).
/// Where no job-control shell is above it (an orphaned process group, e.g. `tmux new
/// 'agentvfs run …'`), Ctrl-Z does nothing, as it does to any program there.
#[test]
fn ctrl_z_and_fg_stop_and_continue_the_sandbox_with_its_job() {
    let s = Setup::new();
    s.make_home();
    let tmux = Tmux::new(s.f.scratch.path());
    tmux.bash("shell");
    tmux.line("shell", &s.run_as_nobody("sh -c 'echo ready; read x; echo got:$x'"));
    tmux.wait_for("shell", "ready");
    std::thread::sleep(Duration::from_millis(300));
    tmux.keys("shell", &["C-z"]);
    tmux.wait_for("shell", "Stopped");
    tmux.line("shell", "echo alive-$((40+2))");
    tmux.wait_for("shell", "alive-42");
    tmux.line("shell", "fg");
    std::thread::sleep(Duration::from_millis(300));
    tmux.line("shell", "hi");
    tmux.wait_for("shell", "got:hi");
    tmux.line("shell", "echo rc=$?");
    tmux.wait_for("shell", "rc=0");

    // Started in the background, the program runs: its read of its terminal (its own pty)
    // waits, the job is not stopped, and `fg` gives it what is typed from then on.
    tmux.line("shell", &format!("{} &", s.run_as_nobody("sh -c 'echo bg-ready; read y; echo bg:$y'")));
    tmux.wait_for("shell", "bg-ready\n");
    tmux.line("shell", "jobs");
    tmux.wait_for("shell", "Running");
    tmux.line("shell", "fg");
    std::thread::sleep(Duration::from_millis(500));
    tmux.line("shell", "yo");
    tmux.wait_for("shell", "bg:yo");

    // Setting its terminal's modes from the background stops nothing either: they are the
    // pty's, not the caller's terminal's.
    tmux.line("shell", &format!("{} &", s.run_as_nobody("sh -c 'stty -echo; stty echo; echo modes-set'")));
    tmux.wait_for("shell", "modes-set\n");
    tmux.line("shell", "wait; echo waited-$?");
    tmux.wait_for("shell", "waited-0");

    // Stopped and sent on with `bg`, a run that ends leaves the terminal to the shell.
    tmux.line("shell", &s.run_as_nobody("sh -c 'echo started; sleep 2; echo bg-done'"));
    tmux.wait_for("shell", "\nstarted");
    tmux.keys("shell", &["C-z"]);
    let stopped = |screen: &str| screen.lines().any(|l| l.contains("Stopped") && l.contains("bg-done"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !stopped(&tmux.screen("shell")) {
        assert!(Instant::now() < deadline, "{}", tmux.screen("shell"));
        std::thread::sleep(Duration::from_millis(50));
    }
    // A read of the terminal in front while the run ends in the background keeps it.
    tmux.line("shell", "bg; read v; echo got-$v");
    tmux.wait_for("shell", "bg-done\n");
    std::thread::sleep(Duration::from_millis(500));
    tmux.line("shell", "zz");
    tmux.wait_for("shell", "got-zz");

    let status = s.f.scratch.path().join("orphan.status");
    tmux.start("orphan", &s.script(&s.run_as_nobody("sh -c 'echo ready; read x; echo got:$x'"), &status));
    tmux.wait_for("orphan", "ready");
    tmux.keys("orphan", &["C-z"]);
    std::thread::sleep(Duration::from_millis(300));
    tmux.line("orphan", "still");
    tmux.wait_for("orphan", "got:still");
    assert_eq!(exit_status(&status), 0, "{}", tmux.screen("orphan"));
}

/// With its output piped (`agentvfs run … | less`), the program is not interactive: the
/// sandbox does not take the terminal, so a pager reading the terminal keeps draining the
/// pipe, and Ctrl-C and Ctrl-Z, which then go to the caller's job, are passed on to the
/// program.
#[test]
fn a_piped_run_leaves_the_terminal_to_the_pager_and_passes_ctrl_c_on() {
    let s = Setup::new();
    s.make_home();
    let tmux = Tmux::new(s.f.scratch.path());
    tmux.bash("shell");
    // Far more than a pipe holds: with the terminal taken, less would stop and the run hang.
    tmux.line("shell", &format!("{} | less", s.run_as_nobody("sh -c 'seq 1 200000'")));
    tmux.wait_for("shell", "1\n2\n3\n");
    tmux.keys("shell", &["q"]);
    tmux.line("shell", "echo after-less");
    tmux.wait_for("shell", "after-less\n");
    tmux.line("shell", &format!("{} | cat", s.run_as_nobody("sh -c 'echo sleeping; exec sleep 100'")));
    tmux.wait_for("shell", "sleeping");
    crate::harness::within("sleep 100", Duration::from_secs(20), || processes(&["sleep", "100"]) == 1);
    // Ctrl-Z, which goes to the caller's job too, stops the program with it; `fg` goes on.
    let sleep = pids(&["sleep", "100"])[0];
    let state = || {
        let stat = std::fs::read_to_string(format!("/proc/{sleep}/stat")).unwrap_or_default();
        stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next()).unwrap_or('?')
    };
    tmux.keys("shell", &["C-z"]);
    tmux.wait_for("shell", "Stopped");
    crate::harness::soon("the program stopped", || state() == 'T');
    tmux.line("shell", "fg");
    crate::harness::soon("the program goes on", || state() == 'S');
    tmux.keys("shell", &["C-c"]);
    std::thread::sleep(Duration::from_millis(300));
    tmux.line("shell", "echo status-${PIPESTATUS[0]}");
    tmux.wait_for("shell", "status-130");
    crate::harness::soon("no sleep left", || processes(&["sleep", "100"]) == 0);
}

/// The program leads a process group of its own inside the sandbox, and that group holds the
/// terminal: a job-control shell inside finds the terminal's group when it starts and hands it
/// back when it exits (with the group bubblewrap's, outside the PID namespace, dash's `exit`
/// failed with "Cannot set tty process group" and status 2), and its own jobs stop, continue
/// and end as on any terminal.
#[test]
fn a_shell_inside_leads_its_own_group_and_hands_the_terminal_back() {
    let s = Setup::new();
    s.make_home();
    let tmux = Tmux::new(s.f.scratch.path());
    tmux.bash("shell");
    tmux.line("shell", &s.run_as_nobody("dash -i"));
    tmux.line("shell", "echo \"in-$((6*7)) $(ps -o pgid= -p $$ | tr -d ' ')=$$\"");
    let screen = tmux.wait_for("shell", "in-42 ");
    // dash's own group, and its pid: the same number, seen inside.
    let line = screen.lines().find_map(|l| l.split_once("in-42 ")).unwrap_or_else(|| panic!("{screen}")).1;
    let (group, pid) = line.split_once('=').unwrap_or_else(|| panic!("{screen}"));
    assert_eq!(group, pid, "{screen}");
    tmux.line("shell", "sleep 103");
    crate::harness::within("sleep 103", Duration::from_secs(20), || processes(&["sleep", "103"]) == 1);
    tmux.keys("shell", &["C-z"]);
    tmux.wait_for("shell", "Stopped");
    tmux.line("shell", "echo still-$((1+1))");
    tmux.wait_for("shell", "still-2");
    tmux.line("shell", "fg");
    std::thread::sleep(Duration::from_millis(300));
    tmux.keys("shell", &["C-c"]);
    crate::harness::soon("no sleep left", || processes(&["sleep", "103"]) == 0);
    tmux.line("shell", "exit 3");
    // Typed before `run` has ended, a line would go to the sandbox's terminal (what the relay
    // read is the program's, as with ssh), so the outer shell is given it once `run` is gone.
    let bin = s.bin.to_str().unwrap();
    crate::harness::soon("run ended", || pids(&[bin, "run"]).is_empty());
    tmux.line("shell", "echo outer-rc=$?");
    let screen = tmux.wait_for("shell", "outer-rc=");
    assert!(screen.contains("outer-rc=3"), "{screen}");
    assert!(!screen.contains("Cannot set tty process group"), "{screen}");

    // Stopped, sent on with `bg`, then `fg`: the program's own group still holds its terminal.
    tmux.line("shell", "clear");
    tmux.line("shell", &s.run_as_nobody("sh -c 'echo started; sleep 1; read v; echo got-$v'"));
    tmux.wait_for("shell", "\nstarted");
    tmux.keys("shell", &["C-z"]);
    tmux.wait_for("shell", "Stopped");
    // In the background its read waits on its own terminal, without stopping the job.
    tmux.line("shell", "bg");
    tmux.line("shell", "sleep 2; jobs");
    tmux.wait_for("shell", "Running");
    assert_eq!(tmux.screen("shell").matches("Stopped").count(), 1, "{}", tmux.screen("shell"));
    tmux.line("shell", "fg");
    std::thread::sleep(Duration::from_millis(300));
    tmux.line("shell", "zz");
    tmux.wait_for("shell", "got-zz");

    // Stopped by `kill -TSTP` sent to `agentvfs run` itself: one `fg` continues it (the stop
    // goes to the program's group, whose monitor passes it out).
    tmux.line("shell", "clear");
    tmux.line("shell", &s.run_as_nobody("sh -c 'echo tstp-ready; read z; echo tstp-got-$z'"));
    tmux.wait_for("shell", "\ntstp-ready");
    let run = pids(&[bin, "run"]);
    assert_eq!(run.len(), 1, "{run:?}");
    unsafe { libc::kill(run[0], libc::SIGTSTP) };
    tmux.wait_for("shell", "Stopped");
    tmux.line("shell", "fg");
    std::thread::sleep(Duration::from_millis(300));
    tmux.line("shell", "q");
    tmux.wait_for("shell", "tstp-got-q");
}

/// A daemon's stand-in, run by nobody: answers `ping` and `vfs/paths` (naming `mountpoint`)
/// on the socket `socket`, for as long as it lives.
const FAKE_DAEMON: &str = r#"
import json, os, socket, sys
path, mountpoint = sys.argv[1], sys.argv[2]
server = socket.socket(socket.AF_UNIX)
server.bind(path)
os.chmod(path, 0o666)
server.listen(8)
while True:
    conn, _ = server.accept()
    for line in conn.makefile("rb"):
        request = json.loads(line)
        result = {"mountpoint": mountpoint, "routes": [], "execute": None, "socket": "agent"}
        if request["method"] != "vfs/paths":
            result = {}
        reply = {"jsonrpc": "2.0", "id": request["id"], "result": result}
        conn.sendall((json.dumps(reply) + "\n").encode())
"#;

/// `run` binds the socket it talks to into the sandbox, and under sudo makes the home as root
/// where that socket's daemon says the tree is: so it talks only to the agent socket (given
/// the control socket of a user who is an approver too, the program could answer its own
/// interrupts), under sudo only to a daemon run by root, and reads its config file as the user.
#[test]
fn run_talks_only_to_an_agent_socket_served_by_root_and_reads_as_the_user() {
    let with_approver = |t: &str| {
        t.replace("agents = [\"nobody\"]", "agents = [\"nobody\"]\napprovers = [\"root\", \"nobody\"]")
    };
    let s = Setup::edited(with_approver);
    s.make_home();
    let scratch = s.f.scratch.path();
    let as_nobody = |args: &str| {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("{AS_NOBODY} {} run {args} -- true", s.bin.display()))
            .env_remove("SUDO_UID")
            .env_remove("SUDO_GID")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let control = s.control_socket();
    let (code, err) = as_nobody(&format!("--socket {}", control.display()));
    assert_eq!(code, Some(1), "{err}");
    let refused = "is the daemon's control socket (the approvers'), not its agent socket: the program would \
                   answer its own interrupts there. Give the agent socket (`agent_socket` in the daemon's config)";
    assert!(err.contains(refused), "{err}");
    let named = scratch.join("control-as-agent.toml");
    let unused = scratch.join("unused.sock");
    std::fs::write(&named, format!("agent_socket = {control:?}\nsocket = {unused:?}\n")).unwrap();
    let (code, err) = as_nobody(&format!("--config {}", named.display()));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("is the daemon's control socket"), "{err}");

    // Under sudo, a socket of the user's own naming a directory of root's as the tree.
    let victim = scratch.join("victim");
    let fake = scratch.join("fake");
    std::fs::create_dir(&victim).unwrap();
    std::fs::create_dir(&fake).unwrap();
    std::os::unix::fs::chown(&fake, Some(65534), Some(65534)).unwrap();
    let script = fake.join("daemon.py");
    std::fs::write(&script, FAKE_DAEMON).unwrap();
    let socket = fake.join("agent.sock");
    let mut daemon = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3"])
        .arg(&script)
        .arg(&socket)
        .arg(&victim)
        .spawn()
        .unwrap();
    crate::harness::within("the stand-in's socket", Duration::from_secs(20), || socket.exists());
    let config = fake.join("run.toml");
    std::fs::write(&config, format!("agent_socket = {socket:?}\n[run]\nhome = \"/made\"\n")).unwrap();
    let (code, _, err) = cli(&["run", "--config", config.to_str().unwrap(), "--", "true"], &SUDO_NOBODY);
    let _ = daemon.kill();
    let _ = daemon.wait();
    assert!(!victim.join("made").exists(), "made as root outside any tree");
    assert_eq!(code, 1, "{err}");
    let refused = "is served by uid 65534, not root: under sudo, agentvfs run makes the home as root where the \
                   daemon says the tree is, so it trusts only a daemon run by root. Run it without sudo, or give \
                   the socket of root's daemon";
    assert!(err.contains(refused), "{err}");

    // A config file the user may not read is not read for them.
    let secret = scratch.join("secret.toml");
    std::fs::write(&secret, "TOP-SECRET-LINE\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (code, _, err) = cli(&["run", "--config", secret.to_str().unwrap(), "--", "true"], &SUDO_NOBODY);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("Permission denied") && !err.contains("TOP-SECRET"), "{err}");
}

/// The program's network is the host's (`[run] network`'s default), but not the host's
/// abstract unix sockets, which a Landlock scope keeps out of reach; and the kernel's
/// keyrings (the caller's session keyring among them) are refused to it.
#[test]
fn the_program_reaches_no_abstract_socket_of_the_hosts_and_no_keyring() {
    let s = Setup::new();
    let (_listener, name) = crate::execute::abstract_listener("run");
    let probe = crate::execute::probe_sockets_and_keys(&name);
    let config = s.config.to_str().unwrap();
    let (code, out, err) = cli(&["run", "--config", config, "--", "sh", "-c", &probe], &SUDO_NOBODY);
    assert_eq!(
        (code, out.as_str()),
        (0, format!("refused {}\nkeys -1 {}\n", libc::EPERM, libc::EPERM).as_str()),
        "{err}"
    );
}
