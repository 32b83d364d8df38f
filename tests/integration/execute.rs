//! The `execute` tool over a real daemon and socket: the sandbox sees only the gated tree
//! (hidden files absent to every program, denied writes refused, host paths and the network
//! gone), timeouts kill the whole process tree, large output is cut and offloaded, the tool
//! is listed only when enabled, and with the embedded default config commands run as the
//! workspace's owner (or the sudo user) and can write the workspace and `/memories`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::{scratch, sh_ok, status_at, unmounted, Fixture, Mount, BIN};

const RULES: &str = r#"
[[rules]]
operations = ["read", "write"]
paths = ["/**/.env"]
mode = "deny"

[[rules]]
operations = ["write"]
paths = ["/host/locked/**"]
mode = "deny"
"#;

const EXEC: &str = "\n[exec]\nenabled = true\ncwd = \"/host\"\ntimeout_seconds = 30\n";

/// A daemon with `execute` enabled (working directory `/host`, which the sandbox's user may
/// write), a secret `.env` at two depths, and a write-locked directory.
fn fixture() -> Fixture {
    prepare(Fixture::new(&format!("{RULES}{EXEC}")))
}

fn prepare(f: Fixture) -> Fixture {
    let root = &f.host_root;
    std::fs::write(root.join(".env"), "SECRET=hunter2\n").unwrap();
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join("sub/.env"), "SECRET=deep\n").unwrap();
    std::fs::write(root.join("sub/a.txt"), "public SECRET-free text\n").unwrap();
    std::fs::create_dir_all(root.join("locked")).unwrap();
    // The host root belongs to root, so the sandbox runs as nobody; the kernel checks modes
    // on the mount (default_permissions).
    for dir in [root.to_path_buf(), root.join("locked"), root.join("sub")] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    f
}

fn socket(f: &Fixture) -> PathBuf {
    f.scratch.path().join("agentvfs.sock")
}

/// Sends one request on a fresh connection and returns the reply.
fn request(socket: &Path, id: Value, method: &str, params: Value) -> Value {
    let stream = UnixStream::connect(socket).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    writer.write_all(format!("{line}\n").as_bytes()).unwrap();
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply).unwrap();
    serde_json::from_str(&reply).unwrap_or_else(|e| panic!("not JSON ({e}): {reply}"))
}

/// `tools/call execute` → (text, structuredContent, isError).
fn execute(socket: &Path, args: Value) -> (String, Value, bool) {
    let reply = request(socket, json!(7), "tools/call", json!({"name": "execute", "arguments": args}));
    let r = &reply["result"];
    assert!(r.is_object(), "{reply}");
    (
        r["content"][0]["text"].as_str().unwrap().to_string(),
        r["structuredContent"].clone(),
        r["isError"] == json!(true),
    )
}

fn run(f: &Fixture, command: &str) -> String {
    execute(&socket(f), json!({ "command": command })).0
}

#[test]
fn no_program_can_see_a_hidden_file() {
    let f = fixture();
    let cases = [
        ("cat /host/.env", "[stderr] cat: /host/.env: No such file or directory\n\nExit code: 1\n[Command failed with exit code 1]"),
        ("cat sub/.env", "[stderr] cat: sub/.env: No such file or directory\n\nExit code: 1\n[Command failed with exit code 1]"),
        ("grep -r SECRET= /host; echo rc=$?", "rc=1\n\n[Command succeeded with exit code 0]"),
        ("find /host | sort", "/host\n/host/locked\n/host/sub\n/host/sub/a.txt\n\n[Command succeeded with exit code 0]"),
        (
            "python3 -c \"import os; print(os.path.exists('/host/.env'), sorted(os.listdir('/host/sub')))\"",
            "False ['a.txt']\n\n[Command succeeded with exit code 0]",
        ),
        ("ls -a /host/sub", ".\n..\na.txt\n\n[Command succeeded with exit code 0]"),
    ];
    for (command, want) in cases {
        assert_eq!(run(&f, command), want, "{command}");
    }
    // The file is there on the host, and the daemon's log shows no crash.
    assert!(f.host_root.join(".env").exists());
}

#[test]
fn denied_writes_fail_and_allowed_writes_land() {
    let f = fixture();
    let text = run(&f, "echo no > /host/locked/x.txt");
    assert_eq!(
        text,
        "[stderr] /bin/sh: 1: cannot create /host/locked/x.txt: Permission denied\n\nExit code: 2\n[Command failed with exit code 2]"
    );
    assert_eq!(run(&f, "echo no > .env"), "[stderr] /bin/sh: 1: cannot create .env: Permission denied\n\nExit code: 2\n[Command failed with exit code 2]");
    assert!(!f.host_root.join("locked/x.txt").exists());
    assert_eq!(
        run(&f, "echo yes > new.txt && mkdir -p made/deeper && echo deep > made/deeper/f && id -u && stat -c %u:%g new.txt"),
        "65534\n65534:65534\n\n[Command succeeded with exit code 0]"
    );
    assert_eq!(std::fs::read_to_string(f.host_root.join("new.txt")).unwrap(), "yes\n");
    assert_eq!(std::fs::read_to_string(f.p("/host/made/deeper/f")).unwrap(), "deep\n");
    // Nothing outside the tree is writable: the root and the system directories are read-only.
    let text = run(&f, "touch /newtop 2>&1; touch /usr/x 2>&1; touch /etc/x 2>&1; true");
    assert_eq!(text.matches("Read-only file system").count(), 3, "{text}");
}

#[test]
fn the_host_is_out_of_sight() {
    let f = fixture();
    let config = f.scratch.path().join("agentvfs.toml");
    let db = f.scratch.path().join("store.db");
    let audit = f.scratch.path().join("audit.db");
    let mut paths: Vec<String> =
        ["/root", "/home", "/opt", "/var", "/work", "/sys", "/boot"].map(String::from).to_vec();
    for p in [&config, &db, &audit, &f.mount.dir, &f.host_root] {
        paths.push(p.display().to_string());
    }
    let probes: Vec<String> = paths.iter().map(|p| format!("test -e '{p}' && echo 'present {p}'")).collect();
    let text = run(&f, &format!("{}; ls /", probes.join("; ")));
    assert_eq!(text, format!("{}\n\n[Command succeeded with exit code 0]", sorted_root()));
    // No capabilities, no way to gain any, and its own PID namespace.
    let status = run(
        &f,
        "grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs)' /proc/self/status; ls /proc | grep -cE '^[0-9]+$'",
    );
    assert!(
        status.contains("CapEff:\t0000000000000000") && status.contains("CapBnd:\t0000000000000000"),
        "{status}"
    );
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    // No descriptor of the daemon's (a host directory's `..` would lead out) reaches it: only
    // the three streams and `ls`'s own handle of the directory it lists.
    assert_eq!(run(&f, "ls /proc/self/fd"), "0\n1\n2\n3\n\n[Command succeeded with exit code 0]");
    // /etc is the minimal set.
    assert_eq!(
        run(&f, "test -e /etc/shadow || test -e /etc/sudoers || echo minimal"),
        "minimal\n\n[Command succeeded with exit code 0]"
    );
    let dev = run(&f, "ls /dev");
    for name in ["null", "zero", "full", "random", "urandom", "tty"] {
        assert!(dev.lines().any(|l| l == name), "{dev}");
    }
    assert!(!dev.lines().any(|l| l == "fuse" || l.starts_with("sd") || l == "mem"), "{dev}");
}

/// `ls /` inside: the tree's entries and the system layout, in `ls` order.
fn sorted_root() -> String {
    let mut names = vec!["db", "host", "mem", "pg", "bin", "dev", "etc", "proc", "sbin", "tmp", "usr"];
    for lib in ["lib", "lib32", "lib64", "libx32"] {
        if Path::new("/").join(lib).exists() {
            names.push(lib);
        }
    }
    names.sort();
    names.join("\n")
}

#[test]
fn commands_start_with_no_signal_ignored_whatever_the_daemon_inherited() {
    // The daemon's parent ignores SIGALRM, SIGUSR2 and a real-time signal (as `nohup` ignores
    // SIGHUP); an ignored signal survives exec, so without the reset every command would
    // inherit them.
    let crate::harness::Unmounted { scratch, host_root, config } = unmounted(&format!("{RULES}{EXEC}"));
    let rt = libc::SIGRTMIN() + 4;
    let trap = format!("trap '' ALRM USR2 {rt}; exec \"$@\"");
    let ignoring = ["sh", "-c", trap.as_str(), "sh"];
    let mount =
        Mount::try_start_wrapped(&config, &scratch.path().join("mnt"), "warn", &[], &ignoring).unwrap();
    let f = prepare(Fixture { mount, scratch, host_root });
    let bit = |signal: i32| 1u64 << (signal - 1);
    let ignored = |status: &str| {
        let line = status.lines().find(|l| l.starts_with("SigIgn:")).unwrap().to_string();
        u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
    };
    let daemon = ignored(
        &std::fs::read_to_string(format!("/proc/{}/status", f.mount.child.as_ref().unwrap().id())).unwrap(),
    );
    let three = bit(libc::SIGALRM) | bit(libc::SIGUSR2) | bit(rt);
    assert_eq!(daemon & three, three, "the daemon ignores all three: {daemon:x}");
    // Read by the command's own process (exec'd by the shell, so no shell between). Signals
    // 32 and 33 are the C library's own (no program can set or see them), left as they came.
    let text = run(&f, "exec grep SigIgn: /proc/self/status");
    let command = ignored(text.lines().next().unwrap());
    assert_eq!(command & !(bit(32) | bit(33)), 0, "{text}");
}

#[test]
fn there_is_no_network_by_default() {
    let f = fixture();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let text = run(
        &f,
        &format!("python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2)\" 2>/dev/null && echo connected; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"),
    );
    assert_eq!(text, "lo\n\n[Command succeeded with exit code 0]");
}

#[test]
fn a_timeout_kills_the_whole_process_tree() {
    let f = fixture();
    let started = Instant::now();
    let (text, structured, is_error) = execute(
        &socket(&f),
        json!({"command": "sleep 1000.4242 & (sleep 1000.4243 &); sleep 1000.4244", "timeout": 2}),
    );
    assert_eq!(
        text,
        "Error: Command timed out after 2 seconds (custom timeout). The command may be stuck or require more time.\n[Command failed with exit code 124]"
    );
    assert!(!is_error);
    assert_eq!(structured["exit_code"], json!(124));
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    std::thread::sleep(Duration::from_millis(200));
    let survivors: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("1000.424"))
        .collect();
    assert!(survivors.is_empty(), "{survivors:?}");
}

#[test]
fn validation_and_output_follow_deep_agents() {
    let f = fixture();
    let s = socket(&f);
    let cases = [
        (json!({"command": "echo hi", "timeout": -1}), "Error: timeout must be non-negative, got -1.", true),
        (
            json!({"command": "echo hi", "timeout": 3601}),
            "Error: timeout 3601s exceeds maximum allowed (3600s).",
            true,
        ),
        (
            json!({"command": ""}),
            "Error: Command must be a non-empty string.\n[Command failed with exit code 1]",
            false,
        ),
        (
            json!({"command": "echo hi", "timeout": 0}),
            "Error: Invalid parameter. timeout must be positive, got 0",
            true,
        ),
        (
            json!({"command": "echo out; echo err 1>&2; exit 3"}),
            "out\n\n[stderr] err\n\nExit code: 3\n[Command failed with exit code 3]",
            false,
        ),
        (json!({"command": "true"}), "<no output>\n[Command succeeded with exit code 0]", false),
        (
            json!({"command": "pwd; printf 'a\\r\\nb'"}),
            "/host\na\nb\n[Command succeeded with exit code 0]",
            false,
        ),
    ];
    for (args, want, error) in cases {
        let (text, _, is_error) = execute(&s, args.clone());
        assert_eq!((text.as_str(), is_error), (want, error), "{args}");
    }
}

#[test]
fn large_output_is_truncated_and_offloaded() {
    let f = fixture();
    let reply = request(
        &socket(&f),
        json!("call/1.big"),
        "tools/call",
        json!({"name": "execute", "arguments": {"command": "seq 1 30000"}}),
    );
    let r = &reply["result"];
    let text = r["content"][0]["text"].as_str().unwrap();
    assert_eq!(r["structuredContent"]["truncated"], json!(true), "{reply}");
    assert_eq!(r["structuredContent"]["output_file"], json!("/large_tool_results/call_1_big"));
    let saved = std::fs::read_to_string(f.p("/large_tool_results/call_1_big")).unwrap();
    assert!(saved.starts_with("1\n2\n3\n"), "{}", &saved[..20]);
    assert!(
        saved.ends_with("\n\n... Output truncated at 100000 bytes.\n[Command succeeded with exit code 0]\n[Output was truncated due to size limits]"),
        "{}",
        &saved[saved.len() - 200..]
    );
    // The cut is at 100,000 bytes of `seq` output: 1..=30000 is 168,894 bytes.
    assert_eq!(saved.find("\n\n... Output truncated"), Some(100_000));
    let lines = saved.lines().count();
    let want =
        agentvfs::control::tools::offload::notice("call/1.big", "/large_tool_results/call_1_big", &saved);
    assert_eq!(text, want);
    assert!(text.contains("Here is a preview showing the head and tail of the result"), "{text}");
    assert!(text.contains(&format!("... [{} lines truncated] ...", lines - 10)), "{text}");
    // The file tools read it like any other file.
    let (read, _, _) = {
        let reply = request(
            &socket(&f),
            json!(2),
            "tools/call",
            json!({"name": "read_file", "arguments": {"file_path": "/large_tool_results/call_1_big", "limit": 2}}),
        );
        (reply["result"]["content"][0]["text"].as_str().unwrap().to_string(), (), ())
    };
    assert!(read.contains("1\n2"), "{read}");
    // Numeric request ids start at 1 on every connection: such results get names of their own.
    let files: Vec<String> = (0..2)
        .map(|_| {
            let reply = request(
                &socket(&f),
                json!(1),
                "tools/call",
                json!({"name": "execute", "arguments": {"command": "seq 1 30000"}}),
            );
            reply["result"]["structuredContent"]["output_file"].as_str().unwrap().to_string()
        })
        .collect();
    assert!(
        files.iter().all(|p| p.starts_with("/large_tool_results/unknown-") && p.len() == 36),
        "{files:?}"
    );
    assert_ne!(files[0], files[1]);
}

#[test]
fn twenty_concurrent_calls_work() {
    let f = fixture();
    let s = socket(&f);
    let started = Instant::now();
    let threads: Vec<_> = (0..20)
        .map(|i| {
            let s = s.clone();
            std::thread::spawn(move || {
                execute(
                    &s,
                    json!({"command": format!("sleep 0.5; echo call {i} > /host/c{i}; cat /host/c{i}")}),
                )
            })
        })
        .collect();
    for (i, t) in threads.into_iter().enumerate() {
        let (text, structured, _) = t.join().unwrap();
        assert_eq!(text, format!("call {i}\n\n[Command succeeded with exit code 0]"));
        assert_eq!(structured, json!({"exit_code": 0, "truncated": false}));
    }
    let took = started.elapsed();
    eprintln!("20 concurrent execute calls (each sleeping 0.5 s): {took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn execute_is_listed_only_when_enabled() {
    let names = |f: &Fixture| -> (Vec<String>, String) {
        let reply = request(&socket(f), json!(1), "tools/list", json!({}));
        let tools = reply["result"]["tools"].as_array().unwrap().clone();
        let grep =
            tools.iter().find(|t| t["name"] == "grep").unwrap()["description"].as_str().unwrap().to_string();
        (tools.iter().map(|t| t["name"].as_str().unwrap().to_string()).collect(), grep)
    };
    let on = fixture();
    let (listed, grep) = names(&on);
    assert_eq!(listed, ["ls", "read_file", "write_file", "edit_file", "delete", "glob", "grep", "execute"]);
    assert!(grep.contains("execute"), "{grep}");
    let off = Fixture::new(RULES);
    let (listed, grep) = names(&off);
    assert_eq!(listed, ["ls", "read_file", "write_file", "edit_file", "delete", "glob", "grep"]);
    assert!(!grep.contains("execute"), "{grep}");
    let reply = request(
        &socket(&off),
        json!(3),
        "tools/call",
        json!({"name": "execute", "arguments": {"command": "id"}}),
    );
    assert!(reply["error"]["message"].as_str().unwrap().starts_with("unknown tool \"execute\""), "{reply}");
}

#[test]
fn the_default_timeout_has_its_own_text_and_the_tree_can_provide_tmp() {
    let f = Fixture::new("\n[exec]\nenabled = true\ntimeout_seconds = 1\n");
    // A /tmp in the tree is the sandbox's /tmp (so tools and shell agree on its files).
    std::fs::create_dir(f.p("/tmp")).unwrap();
    std::fs::set_permissions(f.p("/tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let (text, structured, _) =
        execute(&socket(&f), json!({"command": "pwd; echo t > /tmp/from-shell; sleep 5"}));
    assert_eq!(
        text,
        "Error: Command timed out after 1 seconds. For long-running commands, re-run using the timeout parameter.\n[Command failed with exit code 124]"
    );
    assert_eq!(structured["timed_out"], json!(true));
    assert_eq!(std::fs::read_to_string(f.p("/tmp/from-shell")).unwrap(), "t\n");
    // Without a /workspace route the working directory is `/`.
    assert_eq!(
        execute(&socket(&f), json!({"command": "pwd"})).0,
        "/\n\n[Command succeeded with exit code 0]"
    );
}

/// A reload makes the kernel forget every cached name. Were the names dropped, a descriptor the
/// daemon just opened on a top-level entry would read as "... (deleted)", and bubblewrap, which
/// resolves each bind source's path anew, would stop before the command ran. Commands started
/// while rules are reloaded over and over still run, exactly once each.
#[test]
fn commands_run_while_rules_are_reloaded() {
    let f = fixture();
    let s = socket(&f);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reloader = {
        let (s, stop) = (s.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut reloads = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let reply = request(&s, json!(1), "vfs/reload", json!({}));
                assert!(reply["result"].is_object(), "{reply}");
                reloads += 1;
            }
            reloads
        })
    };
    for i in 0..20 {
        let (text, structured, _) =
            execute(&s, json!({"command": format!("echo run {i} >> /host/runs; echo ok {i}")}));
        assert_eq!(text, format!("ok {i}\n\n[Command succeeded with exit code 0]"), "call {i}");
        assert_eq!(structured["exit_code"], 0);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(reloader.join().unwrap() > 20);
    let runs = std::fs::read_to_string(f.host_root.join("runs")).unwrap();
    assert_eq!(runs, (0..20).map(|i| format!("run {i}\n")).collect::<String>());
}

/// Entries an agent can make at the top of the tree, named like the sandbox's own places,
/// never stop the sandbox from starting for anyone.
#[test]
fn entries_named_like_system_paths_never_break_the_sandbox() {
    let f = fixture();
    for (make, what) in [
        ("ln -s /host tmp", "a link named tmp"),
        ("ln -s /nowhere tmp", "a dangling link named tmp"),
        ("echo x > tmp", "a file named tmp"),
        (
            "mkdir -p bin etc usr/x && ln -s /host proc && echo x > dev && ln -s / lib64 && ln -s / sys",
            "links and files named like system directories",
        ),
    ] {
        sh_ok(&f.mount.dir, &format!("rm -rf tmp bin etc usr proc dev lib64 sys; {make}"));
        assert_eq!(
            run(&f, "echo ok > /tmp/t && cat /tmp/t && ls /usr/bin/env"),
            "ok\n/usr/bin/env\n\n[Command succeeded with exit code 0]",
            "{what}"
        );
    }
    sh_ok(&f.mount.dir, "rm -rf tmp bin etc usr proc dev lib64 sys");
}

/// An existing unprivileged account other than nobody (Debian's `daemon`, 1:1), to own the
/// workspace in the tests below.
const OWNER: (u32, u32) = (1, 1);

/// The embedded default config (memory `/`, host `/workspace`, sqlite `/memories`, the secrets
/// rule) with its files in a scratch directory, `/workspace` rooted at a directory owned by
/// `owner`, and `[exec] enabled = true` with no uid or gid.
struct DefaultLike {
    scratch: tempfile::TempDir,
    workspace: PathBuf,
    config: PathBuf,
}

impl DefaultLike {
    fn new(owner: (u32, u32)) -> DefaultLike {
        let scratch = scratch();
        let workspace = scratch.path().join("project");
        std::fs::create_dir(&workspace).unwrap();
        std::os::unix::fs::chown(&workspace, Some(owner.0), Some(owner.1)).unwrap();
        let embedded = agentvfs::config::EMBEDDED_DEFAULT
            .replace("@CWD@", &workspace.display().to_string())
            .replace("@DATA@", &scratch.path().join("data").display().to_string());
        let text = format!(
            "socket = \"{}\"\n{embedded}\n[audit]\ndatabase = \"{}\"\n\n[exec]\nenabled = true\ntimeout_seconds = 30\n",
            scratch.path().join("agentvfs.sock").display(),
            scratch.path().join("audit.db").display(),
        );
        let config = scratch.path().join("agentvfs.toml");
        std::fs::write(&config, text).unwrap();
        DefaultLike { scratch, workspace, config }
    }

    fn start(&self, env: &[(&str, &str)]) -> Mount {
        let mnt = self.scratch.path().join("mnt");
        Mount::try_start_with_env(&self.config, &mnt, "warn", env).unwrap_or_else(|e| panic!("{e}"))
    }

    fn socket(&self) -> PathBuf {
        self.scratch.path().join("agentvfs.sock")
    }

    fn run(&self, command: &str) -> String {
        execute(&self.socket(), json!({ "command": command })).0
    }
}

fn owner_of(path: &Path) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).unwrap();
    (m.uid(), m.gid())
}

#[test]
fn out_of_the_box_commands_write_as_the_workspace_owner() {
    let d = DefaultLike::new(OWNER);
    let m = d.start(&[]);
    let text = d.run(
        "echo x > /workspace/f && echo m > /memories/note && mkdir /memories/dir && id -u && id -g \
         && stat -c %u:%g /workspace/f /memories/note && echo t > /tmp/t && echo h > \"$HOME/h\" && cat /tmp/t ~/h",
    );
    assert_eq!(text, "1\n1\n1:1\n1:1\nt\nh\n\n[Command succeeded with exit code 0]");
    let why = "uid 1, gid 1 (owner of /workspace's root)";
    assert!(m.log_text().contains(&format!("execute runs as {why}, in /workspace")), "{}", m.log_text());
    assert_eq!(
        status_at(&d.socket())["execute"],
        json!({"uid": 1, "gid": 1, "identity": why, "cwd": "/workspace"})
    );
    // On the host, the new file belongs to the workspace's owner.
    assert_eq!(std::fs::read_to_string(d.workspace.join("f")).unwrap(), "x\n");
    assert_eq!(owner_of(&d.workspace.join("f")), OWNER);
    // The roots of the memory and sqlite routes were handed to that user; the host root kept
    // its owner and mode.
    assert_eq!(owner_of(&m.dir), OWNER);
    assert_eq!(owner_of(&m.path("/memories")), OWNER);
    assert_eq!(owner_of(&d.workspace), OWNER);
    {
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(&d.workspace).unwrap().mode() & 0o7777, 0o755);
    }
    // The scratch area: the owner's own shell can create top-level entries in it, and the
    // command writes those (it cannot create entries at the top itself: its `/` is read-only).
    let mnt = m.dir.display().to_string();
    sh_ok(
        Path::new("/"),
        &format!("setpriv --reuid=1 --regid=1 --clear-groups sh -c 'echo s > {mnt}/scratch.txt && mkdir {mnt}/shared'"),
    );
    assert_eq!(
        d.run("echo s2 >> /scratch.txt && echo in > /shared/in && cat /scratch.txt /shared/in"),
        "s\ns2\nin\n\n[Command succeeded with exit code 0]"
    );
    assert_eq!(std::fs::read_to_string(m.path("/shared/in")).unwrap(), "in\n");
    m.stop();
    // The note is in the sqlite store: there after a restart, with its owner.
    let m = d.start(&[]);
    assert_eq!(std::fs::read_to_string(m.path("/memories/note")).unwrap(), "m\n");
    assert_eq!(owner_of(&m.path("/memories/note")), OWNER);
    assert_eq!(
        d.run("echo more >> /memories/note && cat /memories/note"),
        "m\nmore\n\n[Command succeeded with exit code 0]"
    );
    m.stop();
}

#[test]
fn the_sudo_user_in_the_daemons_environment_wins() {
    let d = DefaultLike::new(OWNER);
    let m = d.start(&[("SUDO_UID", "65534"), ("SUDO_GID", "65534")]);
    assert_eq!(
        d.run("id -u && id -g && echo m > /memories/note && stat -c %u:%g /memories/note"),
        "65534\n65534\n65534:65534\n\n[Command succeeded with exit code 0]"
    );
    let why = "uid 65534, gid 65534 (from SUDO_UID/SUDO_GID)";
    assert_eq!(status_at(&d.socket())["execute"]["identity"], json!(why));
    let status =
        std::process::Command::new(BIN).args(["status", "--socket"]).arg(d.socket()).output().unwrap();
    let status = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(status.contains(&format!("execute: runs as {why}, in /workspace\n")), "{status}");
    assert_eq!(owner_of(&m.path("/memories")), (65534, 65534));
    // The workspace's permissions are the host's: not loosened for the sudo user.
    assert_eq!(
        d.run("echo x > /workspace/f"),
        "[stderr] /bin/sh: 1: cannot create /workspace/f: Permission denied\n\nExit code: 2\n[Command failed with exit code 2]"
    );
    m.stop();
}

#[test]
fn check_says_who_execute_runs_as_and_refuses_root() {
    let d = DefaultLike::new(OWNER);
    let check = |env: &[(&str, &str)]| {
        let out = std::process::Command::new(BIN)
            .args(["check", "--config"])
            .arg(&d.config)
            .env_remove("SUDO_UID")
            .env_remove("SUDO_GID")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, out) = check(&[]);
    assert!(
        ok && out.contains("execute: runs as uid 1, gid 1 (owner of /workspace's root), in /workspace\n"),
        "{out}"
    );
    let (_, out) = check(&[("SUDO_UID", "1000"), ("SUDO_GID", "1000")]);
    assert!(out.contains("execute: runs as uid 1000, gid 1000 (from SUDO_UID/SUDO_GID)"), "{out}");
    // sudo from a root shell names root, which is never taken: the workspace's owner is.
    let (_, out) = check(&[("SUDO_UID", "0"), ("SUDO_GID", "0")]);
    assert!(out.contains("execute: runs as uid 1, gid 1 (owner of /workspace's root)"), "{out}");
    std::os::unix::fs::chown(&d.workspace, Some(0), Some(0)).unwrap();
    let (_, out) = check(&[]);
    assert!(
        out.contains("execute: runs as uid 65534, gid 65534 (nobody: no sudo user and /workspace's root belongs to root)"),
        "{out}"
    );
    let text = std::fs::read_to_string(&d.config).unwrap();
    std::fs::write(&d.config, format!("{text}uid = 1000\n")).unwrap();
    let (_, out) = check(&[("SUDO_UID", "5"), ("SUDO_GID", "6")]);
    assert!(out.contains("execute: runs as uid 1000 ([exec] uid), gid 6 (from SUDO_GID)"), "{out}");
    std::fs::write(&d.config, format!("{text}uid = 0\n")).unwrap();
    let (ok, out) = check(&[]);
    let line = text.lines().count() + 1;
    assert!(!ok && out.contains(&format!(":{line}: [exec] uid = 0 would run commands as root")), "{out}");
}

/// A socket in the host's abstract namespace, named for this test process, listening while it
/// lives.
pub fn abstract_listener(tag: &str) -> (std::os::unix::net::UnixListener, String) {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("agentvfs-test-{tag}-{}", std::process::id());
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    (std::os::unix::net::UnixListener::bind_addr(&address).unwrap(), name)
}

/// A shell command that prints `connected`, or `refused ERRNO`, for a connection to the
/// abstract socket `name`; then the answer of `keyctl` for the session keyring (`keys -1 ERRNO`).
pub fn probe_sockets_and_keys(name: &str) -> String {
    let script = format!(
        "import ctypes, socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect('\\0{name}')\n    print('connected')\nexcept OSError as e:\n    print('refused', e.errno)\nlibc = ctypes.CDLL(None, use_errno=True)\nprint('keys', libc.syscall(250, 0, -3, 0), ctypes.get_errno())"
    );
    format!("python3 -c \"{script}\"")
}

/// With the network on, the host's abstract unix sockets (a D-Bus session bus, X11's) would be
/// reachable by name: a Landlock scope keeps connections inside the sandbox. The kernel's
/// keyrings are not namespaced: the key calls are refused. `/dev/shm` is writable, as POSIX
/// shared memory needs; the rest of `/dev` is not.
#[test]
fn abstract_sockets_keyrings_and_shared_memory() {
    let f = Fixture::new(&format!("{RULES}{EXEC}network = true\n"));
    let (_listener, name) = abstract_listener("execute");
    let text = run(&f, &probe_sockets_and_keys(&name));
    assert_eq!(
        text,
        format!("refused {}\nkeys -1 {}\n\n[Command succeeded with exit code 0]", libc::EPERM, libc::EPERM)
    );
    let shm = run(
        &f,
        "stat -c %a /dev/shm; python3 -c 'import multiprocessing as m; m.Lock(); print(\"locked\")'; \
         touch /dev/x 2>&1 | grep -o 'Read-only file system'; echo hi > /dev/null && echo null",
    );
    assert_eq!(shm, "1777\nlocked\nRead-only file system\nnull\n\n[Command succeeded with exit code 0]");
}

/// A command never reaches more of the tree than its caller's own file tools, which are judged
/// by the caller's permissions: called by an agent that is not root, it runs as that agent
/// (uid and primary gid); called by root (a harness run as root), as `[exec]`'s user.
#[test]
fn a_command_of_an_agent_that_is_not_root_runs_as_that_agent() {
    let config = format!("{RULES}{EXEC}uid = 4242\ngid = 4243\n\n[control]\nagents = [\"nobody\"]\n");
    let f = Fixture::new(&config);
    std::fs::set_permissions(f.scratch.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    assert_eq!(run(&f, "id -u; id -g"), "4242\n4243\n\n[Command succeeded with exit code 0]");
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN, "call", "--socket"])
        .arg(f.scratch.path().join("agentvfs-agent.sock"))
        .args(["execute", r#"{"command": "id -u; id -g"}"#])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text,
        "65534\n65534\n\n[Command succeeded with exit code 0]\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
