//! The control door over a real daemon: JSON-RPC framing and errors, concurrency, peer
//! checks, the socket files' life, the CLI's client commands, and a real MCP client. (Roles,
//! and what each of the two sockets serves: `roles.rs`.)

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::{config, is_mounted, resident, scratch, Conn, Fixture, Mount, BIN};

const TOOLS: [&str; 7] = ["ls", "read_file", "write_file", "edit_file", "delete", "glob", "grep"];

/// What `tests/mcp_client.py` prints for a fixture's daemon (without `execute`).
pub const MCP_TRANSCRIPT: &str = "server agentvfs protocol 2025-06-18\n\
     tools capability listChanged=False\n\
     ping ok\n\
     tools ls read_file write_file edit_file delete glob grep\n  \
     ls readOnly=True schema=object\n  \
     read_file readOnly=True schema=object\n  \
     write_file readOnly=False schema=object\n  \
     edit_file readOnly=False schema=object\n  \
     delete readOnly=False schema=object\n  \
     glob readOnly=True schema=object\n  \
     grep readOnly=True schema=object\n\
     call write_file: CallToolResult isError=False\n\
     call read_file: CallToolResult isError=False\n\
     call edit_file: CallToolResult isError=False\n\
     call ls: CallToolResult isError=False\n\
     call glob: CallToolResult isError=False\n\
     call grep: CallToolResult isError=False\n\
     call delete: CallToolResult isError=False\n\
     unknown tool: error -32602\n";

/// Where the harness puts a fixture's sockets and config file.
pub(crate) trait FixturePaths {
    fn socket(&self) -> PathBuf;
    fn agent_socket(&self) -> PathBuf;
    fn config_path(&self) -> PathBuf;
}

impl FixturePaths for Fixture {
    fn socket(&self) -> PathBuf {
        self.scratch.path().join("agentvfs.sock")
    }

    fn agent_socket(&self) -> PathBuf {
        self.scratch.path().join("agentvfs-agent.sock")
    }

    fn config_path(&self) -> PathBuf {
        self.scratch.path().join("agentvfs.toml")
    }
}

/// Runs the CLI: (exit code, stdout, stderr).
fn cli(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("AGENTVFS_SOCKET")
        .env_remove("AGENTVFS_CONTROL_SOCKET")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn cli_ok(args: &[&str]) -> String {
    let (code, out, err) = cli(args, &[]);
    assert_eq!(code, 0, "agentvfs {args:?}\nstdout:\n{out}\nstderr:\n{err}");
    out
}

fn fixture() -> (Fixture, String) {
    let f = Fixture::new(
        "[[rules]]\noperations = [\"read\", \"write\"]\npaths = [\"/host/secret/**\"]\nmode = \"deny\"\n",
    );
    let socket = f.socket().display().to_string();
    (f, socket)
}

#[test]
fn initialize_negotiates_and_ping_answers() {
    let (f, _) = fixture();
    let mut c = Conn::open(&f.socket());
    for (asked, got) in [
        ("2025-06-18", "2025-06-18"),
        ("2024-11-05", "2024-11-05"),
        ("2025-11-25", "2025-06-18"),
        ("1999-01-01", "2025-06-18"),
    ] {
        let r = c.result(1, "initialize", json!({"protocolVersion": asked, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}));
        assert_eq!(r["protocolVersion"], got, "asked {asked}");
        assert_eq!(r["serverInfo"], json!({"name": "agentvfs", "version": env!("CARGO_PKG_VERSION")}));
        assert_eq!(r["capabilities"], json!({"tools": {"listChanged": false}}));
        let mount = f.mount.dir.display().to_string();
        assert!(
            r["instructions"].as_str().unwrap().contains(&format!("- `/host/` -> `{mount}/host/`")),
            "{r}"
        );
    }
    // A notification gets no reply: the next line is the ping's.
    c.send("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n");
    c.send("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":1}}\n");
    c.send("{\"jsonrpc\":\"2.0\",\"id\":\"p\",\"method\":\"ping\"}\n");
    assert_eq!(c.recv(), json!({"jsonrpc": "2.0", "id": "p", "result": {}}));
    let (code, message) = Conn::error_of(&c.request(2, "initialize", json!({})));
    assert_eq!((code, message.as_str()), (-32602, "missing parameter `protocolVersion` (a string)"));
}

#[test]
fn tools_are_listed_in_order_with_annotations() {
    let (f, _) = fixture();
    let mut c = Conn::open(&f.socket());
    let tools = c.result(1, "tools/list", json!({}))["tools"].as_array().unwrap().clone();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, TOOLS);
    for tool in &tools {
        let name = tool["name"].as_str().unwrap();
        let read_only = ["ls", "read_file", "glob", "grep"].contains(&name);
        let a = &tool["annotations"];
        assert_eq!(a["readOnlyHint"], json!(read_only), "{tool}");
        assert_eq!(a["idempotentHint"], json!(read_only), "{tool}");
        assert_eq!(a["openWorldHint"], json!(false), "{tool}");
        assert!(a["destructiveHint"].is_boolean(), "{tool}");
        assert!(!tool["description"].as_str().unwrap().is_empty(), "{tool}");
        assert_eq!(tool["inputSchema"]["type"], "object", "{tool}");
    }
    assert_eq!(tools[4]["annotations"]["destructiveHint"], json!(true), "delete is destructive");
}

#[test]
fn bad_input_gets_errors_and_the_connection_stays_usable() {
    let (f, _) = fixture();
    let mut c = Conn::open(&f.socket());
    let cases: [(&str, Value, i64, &str); 9] = [
        ("{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\"\n", Value::Null, -32700, "parse error"),
        ("\u{1}garbage\n", Value::Null, -32700, "parse error"),
        ("[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}]\n", Value::Null, -32600, "batch requests are not supported"),
        ("{\"jsonrpc\":\"1.0\",\"id\":3,\"method\":\"ping\"}\n", json!(3), -32600, "`jsonrpc` must be \"2.0\""),
        ("{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"ping\",\"params\":7}\n", json!(4), -32600, "`params` must be an object"),
        ("{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"frobnicate\"}\n", json!(5), -32601, "method not found: frobnicate"),
        ("{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"tools/call\",\"params\":{\"name\":5}}\n", json!(6), -32602, "parameter `name` must be a string, got 5"),
        ("{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/call\",\"params\":{\"name\":\"ls\",\"arguments\":[1]}}\n", json!(7), -32602, "`arguments` must be an object, got [1]"),
        ("{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"vfs/explain\",\"params\":{\"operation\":\"delete\",\"path\":\"/x\"}}\n", json!(8), -32602, "unknown operation \"delete\" (expected \"read\" or \"write\")"),
    ];
    for (line, id, code, message) in cases {
        c.send(line);
        // Blank lines and stray responses are skipped without a reply.
        c.send("\n   \n{\"jsonrpc\":\"2.0\",\"id\":99,\"result\":{}}\n");
        let reply = c.recv();
        assert_eq!(reply["id"], id, "{line}: {reply}");
        let (got_code, got_message) = Conn::error_of(&reply);
        assert_eq!(got_code, code, "{line}: {reply}");
        assert!(got_message.starts_with(message), "{line}: {reply}");
    }
    let reply = c.request(9, "tools/call", json!({"name": "no_such_tool", "arguments": {}}));
    assert_eq!(
        Conn::error_of(&reply),
        (-32602, format!("unknown tool \"no_such_tool\" (the tools are: {})", TOOLS.join(", ")))
    );
    assert_eq!(c.result(10, "ping", json!({})), json!({}));
}

#[test]
fn an_oversized_line_is_refused_and_skipped() {
    let (f, _) = fixture();
    let mut c = Conn::open(&f.socket());
    // Just under the limit is fine.
    let pad = "x".repeat(1_000_000);
    assert_eq!(c.result(1, "ping", json!({ "pad": pad })), json!({}));
    let mut writer = c.stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let big = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\",\"params\":{{\"pad\":\"{}\"}}}}\n",
            "y".repeat(3 << 20)
        );
        writer.write_all(big.as_bytes()).unwrap();
    });
    let reply = c.recv();
    assert_eq!(reply["id"], Value::Null);
    assert_eq!(
        Conn::error_of(&reply),
        (-32600, "request line too long (limit 1048576 bytes); it was discarded".to_string())
    );
    sender.join().unwrap();
    assert_eq!(c.result(3, "ping", json!({})), json!({}));
}

#[test]
fn a_client_stalled_mid_line_blocks_nobody() {
    let (f, _) = fixture();
    let mut stalled = Conn::open(&f.socket());
    stalled.send("{\"jsonrpc\":\"2.0\",\"id\":1,\"me");
    let mut other = Conn::open(&f.socket());
    assert_eq!(other.result(1, "ping", json!({})), json!({}));
    assert_eq!(other.result(2, "vfs/status", json!({}))["pending_interrupts"], json!(0));
    stalled.send("thod\":\"ping\"}\n");
    assert_eq!(stalled.recv(), json!({"jsonrpc": "2.0", "id": 1, "result": {}}));
}

#[test]
fn a_hundred_connections_at_once() {
    let (f, _) = fixture();
    let socket = f.socket();
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(100));
    let workers: Vec<_> = (0..100u64)
        .map(|i| {
            let (socket, barrier) = (socket.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut c = Conn::open(&socket);
                barrier.wait();
                let tools = c.result(i, "tools/list", json!({}));
                assert_eq!(tools["tools"].as_array().unwrap().len(), TOOLS.len());
                c
            })
        })
        .collect();
    let conns: Vec<Conn> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let status = Conn::open(&socket).result(1, "vfs/status", json!({}));
    assert!(status["counters"]["connections_open"].as_u64().unwrap() >= 101, "{status}");
    drop(conns);
}

#[test]
fn replies_may_come_out_of_order() {
    let (f, _) = fixture();
    // A reload reads the config file; made a FIFO, the read waits until the test writes it,
    // which holds request 1 while request 2 on the same connection is answered.
    let cfg = f.config_path();
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::remove_file(&cfg).unwrap();
    assert!(Command::new("mkfifo").arg(&cfg).status().unwrap().success());
    let mut c = Conn::open(&f.socket());
    c.send("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"vfs/reload\"}\n{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}\n");
    assert_eq!(c.recv(), json!({"jsonrpc": "2.0", "id": 2, "result": {}}));
    std::fs::OpenOptions::new().write(true).open(&cfg).unwrap().write_all(text.as_bytes()).unwrap();
    let reply = c.recv();
    assert_eq!(reply["id"], json!(1), "{reply}");
    assert_eq!(reply["result"], json!({"rules": 1, "config": cfg, "warnings": []}));
    std::fs::remove_file(&cfg).unwrap();
    std::fs::write(&cfg, text).unwrap();
}

#[test]
fn other_users_are_refused() {
    let (f, socket) = fixture();
    // A copy of the binary that uid 65534 can run wherever the build directory is. Copied by
    // another process: a parallel test's child forked while this one held the copy open for
    // writing would keep it open until its own exec (ETXTBSY for ours).
    let bin = f.scratch.path().join("agentvfs");
    assert!(Command::new("cp").arg(BIN).arg(&bin).status().unwrap().success());
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(f.scratch.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let as_nobody = |args: &[&str]| {
        let out = Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .arg(&bin)
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // The socket's mode keeps others out first (only root may use it)...
    let (code, _, err) = as_nobody(&["status", "--socket", &socket]);
    assert_eq!(code, Some(1));
    assert_eq!(err, format!("agentvfs: permission denied opening the socket {socket} (its file mode or its directory's keeps this user out: the daemon makes a socket 0600 when only root and its own user may use it)\n"));
    // ...and if it were opened up, the peer check still refuses them with one error line.
    std::fs::set_permissions(f.socket(), std::fs::Permissions::from_mode(0o666)).unwrap();
    let (_, out, _) = as_nobody(&["mcp", "--socket", &socket]);
    assert_eq!(
        out,
        "{\"error\":{\"code\":-32001,\"message\":\"permission denied: uid 65534 may not use this socket (the control socket admits only root, as [control] approvers is unset)\"},\"id\":null,\"jsonrpc\":\"2.0\"}\n"
    );
    let (code, _, err) = as_nobody(&["status", "--socket", &socket]);
    assert_eq!(
        (code, err.as_str()),
        (Some(1), "agentvfs: permission denied: uid 65534 may not use this socket (the control socket admits only root, as [control] approvers is unset)\n")
    );
    let status = Conn::open(&f.socket()).result(1, "vfs/status", json!({}));
    assert_eq!(status["counters"]["peers_refused"], json!(2));
}

fn start(state: &Path) -> Result<Mount, String> {
    let root = state.join("host-root");
    std::fs::create_dir_all(&root).unwrap();
    Mount::try_start(&config(state, &root, ""), &state.join("mnt"))
}

#[test]
fn the_socket_files_are_private_replaced_when_stale_and_removed_at_exit() {
    let s = scratch();
    let socket = s.path().join("agentvfs.sock");
    let agent = s.path().join("agentvfs-agent.sock");
    // Stale sockets from a daemon that died are replaced.
    drop(UnixListener::bind(&socket).unwrap());
    drop(UnixListener::bind(&agent).unwrap());
    let m = start(s.path()).unwrap();
    for path in [&socket, &agent] {
        let meta = std::fs::symlink_metadata(path).unwrap();
        assert!(meta.file_type().is_socket());
        // Only root may use either (no [control]; the workspace is root's).
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{}", path.display());
    }
    let log = m.log_text();
    assert!(log.contains(&format!("  control socket {} (approvers: root)\n", socket.display())), "{log}");
    assert!(log.contains(&format!("  agent socket {} (agents: root)\n", agent.display())), "{log}");
    let audit = format!("  audit log {}\n", s.path().join("audit.db").display());
    assert!(m.log_text().contains(&audit), "{}", m.log_text());
    assert_eq!(Conn::open(&socket).result(1, "ping", json!({})), json!({}));
    assert_eq!(Conn::open(&agent).result(1, "ping", json!({})), json!({}));
    m.stop();
    assert!(!socket.exists() && !agent.exists(), "a socket outlived the daemon");

    // A live listener on the agent socket is not taken over either.
    let live = UnixListener::bind(&agent).unwrap();
    let err = start(s.path()).err().expect("refused");
    assert!(
        err.contains(&format!(
            "another daemon is already listening on the agent socket {} (stop it, or set a different `agent_socket` in the config)",
            agent.display()
        )),
        "{err}"
    );
    assert!(!socket.exists(), "the control socket bound first is removed again");
    drop(live);
    std::fs::remove_file(&agent).unwrap();

    // A live listener is not taken over, and nothing gets mounted.
    let live = UnixListener::bind(&socket).unwrap();
    let err = start(s.path()).err().expect("refused");
    assert!(
        err.contains(&format!(
            "another daemon is already listening on the control socket {}",
            socket.display()
        )),
        "{err}"
    );
    assert!(!is_mounted(&s.path().join("mnt")));
    assert!(socket.exists());
    drop(live);
    std::fs::remove_file(&socket).unwrap();

    // Neither is a file that is not a socket.
    std::fs::write(&socket, "data").unwrap();
    let err = start(s.path()).err().expect("refused");
    assert!(err.contains("exists and is not a socket; refusing to replace it"), "{err}");
    assert_eq!(std::fs::read_to_string(&socket).unwrap(), "data");
    std::fs::remove_file(&socket).unwrap();

    // A missing directory is created, private (only root may use the sockets in it).
    let nested = s.path().join("run/agentvfs");
    let cfg = s.path().join("agentvfs.toml");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace(&socket.display().to_string(), &nested.join("a.sock").display().to_string());
    std::fs::write(&cfg, text).unwrap();
    let m = Mount::start(&cfg, &s.path().join("mnt"));
    assert_eq!(std::fs::metadata(&nested).unwrap().permissions().mode() & 0o777, 0o700);
    assert_eq!(Conn::open(&nested.join("a.sock")).result(1, "ping", json!({})), json!({}));
    assert_eq!(Conn::open(&nested.join("a-agent.sock")).result(1, "ping", json!({})), json!({}));
    m.stop();
    assert!(!nested.join("a.sock").exists() && !nested.join("a-agent.sock").exists());
    // One for other users too is searchable (the peer check decides who gets in).
    std::fs::remove_dir(&nested).unwrap();
    let text = std::fs::read_to_string(&cfg).unwrap() + "\n[control]\nagents = [\"nobody\"]\n";
    std::fs::write(&cfg, &text).unwrap();
    let m = Mount::start(&cfg, &s.path().join("mnt"));
    assert_eq!(std::fs::metadata(&nested).unwrap().permissions().mode() & 0o777, 0o755);
    let modes: Vec<u32> = ["a.sock", "a-agent.sock"]
        .iter()
        .map(|n| std::fs::symlink_metadata(nested.join(n)).unwrap().permissions().mode() & 0o777)
        .collect();
    assert_eq!(modes, [0o600, 0o666]);
    m.stop();

    // A path the kernel cannot bind is named as such.
    let long = s.path().join("x".repeat(120));
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace(&nested.join("a.sock").display().to_string(), &long.display().to_string());
    std::fs::write(&cfg, text).unwrap();
    let err = Mount::try_start(&cfg, &s.path().join("mnt")).err().expect("refused");
    assert!(err.contains("is too long (") && err.contains("Unix sockets allow at most 107)"), "{err}");
}

#[test]
fn status_paths_and_tools_from_the_cli() {
    let (f, socket) = fixture();
    let mount = f.mount.dir.display().to_string();
    let out = cli_ok(&["status", "--socket", &socket]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with(&format!("agentvfs {} (pid ", env!("CARGO_PKG_VERSION"))), "{out}");
    assert_eq!(lines[1], format!("mountpoint    {mount}"));
    assert_eq!(lines[2], format!("socket        {socket} (approvers: root)"));
    assert_eq!(lines[3], format!("agent socket  {} (agents: root)", f.agent_socket().display()));
    assert_eq!(lines[4], format!("config        {}", f.config_path().display()));
    assert_eq!(
        lines[5..9],
        [
            "routes:".to_string(),
            "  /                    memory  (in memory)".to_string(),
            format!("  /host                host    {}", f.host_root.display()),
            format!(
                "  /db                  sqlite  {} (namespace default)",
                f.scratch.path().join("store.db").display()
            ),
        ]
    );
    // The postgres route's server, never its URL (which may hold a password).
    let namespace = f.scratch.path().file_name().unwrap().to_string_lossy().to_string();
    assert!(lines[9].starts_with("  /pg                  postgres postgres@/tmp/agentvfs-pg-"), "{out}");
    assert!(lines[9].ends_with(&format!("/postgres (namespace {namespace})")), "{out}");
    // Which transport is the transport tests' business; here, how it is shown.
    let status = crate::harness::status(&f);
    let transport = match status["fuse_transport"].as_str() {
        Some("io_uring") if status["fuse_ring_idle_class"] == true => {
            format!("FUSE transport: io_uring ({} queues, idle-class threads)", status["fuse_ring_queues"])
        }
        Some("io_uring") => format!("FUSE transport: io_uring ({} queues)", status["fuse_ring_queues"]),
        _ => "FUSE transport: /dev/fuse".to_string(),
    };
    assert_eq!(
        lines[10..15],
        [
            "rules: 1 (observation: strict)",
            &transport,
            "pending interrupts: 0",
            "files open through the mount: 0",
            "audit records: 0 (0 dropped)"
        ]
    );
    assert!(lines[15].starts_with("connections: 1 open, "), "{out}");

    let status: Value = serde_json::from_str(&cli_ok(&["status", "--socket", &socket, "--json"])).unwrap();
    assert_eq!(status["mountpoint"], json!(mount));
    assert_eq!((&status["socket"], &status["agent_socket"]), (&json!(socket), &json!(f.agent_socket())));
    // The daemon's config file names the socket too.
    let config = f.config_path().display().to_string();
    let by_config: Value = serde_json::from_str(&cli_ok(&["status", "--config", &config, "--json"])).unwrap();
    assert_eq!(by_config["pid"], status["pid"]);
    assert_eq!(status["rules"], json!(1));
    assert_eq!(
        status["routes"][1],
        json!({"path": "/host", "backend": "host", "location": f.host_root, "read_only": false})
    );
    for key in
        ["audit_records", "audit_dropped", "connections_open", "connections_total", "requests", "tool_calls"]
    {
        assert!(status["counters"][key].is_u64(), "{key}: {status}");
    }

    let paths: Value = serde_json::from_str(&cli_ok(&["paths", "--socket", &socket, "--json"])).unwrap();
    assert_eq!(
        paths["routes"][2],
        json!({"virtual": "/db/", "shell": format!("{mount}/db/"), "backend": "sqlite", "location": f.scratch.path().join("store.db")})
    );
    let prompt = paths["prompt"].as_str().unwrap();
    assert!(prompt.starts_with("## Shell paths vs. virtual paths\n"), "{prompt}");
    assert!(prompt.ends_with(&format!(
        "Host path mappings:\n- `/host/` -> `{mount}/host/` (e.g. `/host/dir/x.py` -> `{mount}/host/dir/x.py`)\n- `/db/` -> `{mount}/db/` (e.g. `/db/dir/x.py` -> `{mount}/db/dir/x.py`)\n- `/pg/` -> `{mount}/pg/` (e.g. `/pg/dir/x.py` -> `{mount}/pg/dir/x.py`)\n- `/` -> `{mount}/` (e.g. `/dir/x.py` -> `{mount}/dir/x.py`)"
    )), "{prompt}");
    // Every mapping really is the shell path of its route.
    std::fs::write(f.p("/db/via-shell"), "x").unwrap();
    assert_eq!(std::fs::read_to_string(format!("{mount}/db/via-shell")).unwrap(), "x");
    assert_eq!(cli_ok(&["paths", "--socket", &socket, "--prompt"]), format!("{prompt}\n"));
    let human = cli_ok(&["paths", "--socket", &socket]);
    assert!(
        human.starts_with(&format!("{:<20} {:<36} {:<7} -\n", "/", format!("{mount}/"), "memory")),
        "{human}"
    );
    assert!(human.ends_with(&format!("\n\n{prompt}\n")), "{human}");

    let tools: Value = serde_json::from_str(&cli_ok(&["tools", "--socket", &socket, "--json"])).unwrap();
    assert_eq!(tools["tools"].as_array().unwrap().len(), TOOLS.len());
    let human = cli_ok(&["tools", "--socket", &socket]);
    let lines: Vec<&str> = human.lines().collect();
    assert_eq!(lines.len(), TOOLS.len(), "{human}");
    for (line, name) in lines.iter().zip(TOOLS) {
        let kind = match name {
            "ls" | "read_file" | "glob" | "grep" => "read-only",
            "delete" => "destructive",
            _ => "",
        };
        assert!(line.starts_with(&format!("{name:<12} {kind}")), "{human}");
    }
}

/// `status` counts the files open through the mount on every route (directories not), until
/// the kernel releases them.
#[test]
fn status_counts_the_files_open_through_the_mount() {
    let f = Fixture::new("");
    let open_files = || crate::harness::open_files(&f);
    assert_eq!(open_files(), 0);
    let held: Vec<std::fs::File> =
        ["/host/a", "/mem/b", "/db/c"].iter().map(|p| std::fs::File::create(f.p(p)).unwrap()).collect();
    let again = std::fs::File::open(f.p("/host/a")).unwrap();
    let dir = std::fs::read_dir(f.p("/host")).unwrap();
    assert_eq!(open_files(), 4);
    drop(held);
    crate::harness::soon("three files released", || open_files() == 1);
    drop((again, dir));
    crate::harness::soon("every file released", || open_files() == 0);
}

#[test]
fn call_prints_the_text_or_the_whole_result() {
    let (f, socket) = fixture();
    let result: Value =
        serde_json::from_str(&cli_ok(&["call", "--socket", &socket, "--json", "ls", "{\"path\": \"/\"}"]))
            .unwrap();
    assert!(result["isError"].is_boolean() && result["structuredContent"].is_object(), "{result}");
    let text: Vec<&str> =
        result["content"].as_array().unwrap().iter().map(|b| b["text"].as_str().unwrap()).collect();
    let (code, out, _) = cli(&["call", "--socket", &socket, "ls", "{\"path\": \"/\"}"], &[]);
    assert_eq!(code, if result["isError"] == json!(true) { 2 } else { 0 });
    assert_eq!(out, text.iter().map(|t| format!("{t}\n")).collect::<String>());
    let (code, _, err) = cli(&["call", "--socket", &socket, "ls", "{nope"], &[]);
    assert_eq!(code, 1);
    assert!(err.starts_with("agentvfs: the arguments are not JSON: "), "{err}");
    let (code, _, err) = cli(&["call", "--socket", &socket, "ls", "[1]"], &[]);
    assert_eq!(
        (code, err.as_str()),
        (1, "agentvfs: the arguments must be a JSON object, e.g. '{\"path\": \"/\"}'\n")
    );
    let (code, _, err) = cli(&["call", "--socket", &socket, "nope"], &[]);
    assert_eq!(
        (code, err),
        (1, format!("agentvfs: unknown tool \"nope\" (the tools are: {})\n", TOOLS.join(", ")))
    );
    drop(f);
}

#[test]
fn explain_asks_the_daemon_for_the_rules_in_force() {
    let (f, socket) = fixture();
    let from_daemon = format!("(from the daemon at {socket})\n");
    let denied = "read /host/secret/key: denied: hidden (ENOENT, absent from listings)\nby rule #0: deny read,write /host/secret/**\n";
    assert_eq!(
        cli_ok(&["explain", "--socket", &socket, "read", "/host/secret/key"]),
        from_daemon.clone() + denied
    );
    // --config still explains a file, daemon or not.
    let cfg = f.config_path().display().to_string();
    assert_eq!(
        cli_ok(&["explain", "--config", &cfg, "write", "/host/secret/"]),
        format!("(from the config file {cfg})\nwrite /host/secret/: denied (EACCES)\nby rule #0: deny read,write /host/secret/**\n")
    );
    // --json prints the daemon's answer alone on stdout, and where it came from on stderr.
    let (code, out, err) = cli(&["explain", "--socket", &socket, "--json", "write", "/host/x"], &[]);
    assert_eq!((code, err.as_str()), (0, from_daemon.as_str()));
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap(),
        json!({"operation": "write", "path": "/host/x", "directory": false, "decision": "allow", "hidden": false, "effect": "allowed", "rule": null, "rule_text": null})
    );
    let (code, _, err) = cli(&["explain", "--socket", &socket, "delete", "/x"], &[]);
    assert_eq!(
        (code, err.as_str()),
        (1, "agentvfs: unknown operation \"delete\" (expected \"read\" or \"write\")\n")
    );
    // A path cannot rewrite the lines it is shown on.
    let out = cli_ok(&["explain", "--socket", &socket, "read", "/host/secret/\r\x1b[2K\nok"]);
    assert_eq!(
        out,
        from_daemon + "read /host/secret/\\r\\x1b[2K\\nok: denied: hidden (ENOENT, absent from listings)\nby rule #0: deny read,write /host/secret/**\n"
    );
}

#[test]
fn explain_without_a_socket_or_config_asks_the_daemon_status_finds_and_says_so() {
    let (f, socket) = fixture();
    let agent = f.agent_socket().display().to_string();
    // The sockets the client commands find without flags ($AGENTVFS_SOCKET for the agent's,
    // $AGENTVFS_CONTROL_SOCKET for the control socket, the default config's otherwise).
    // Explain asks on the agent socket: the daemon's rule, which the embedded default lacks.
    let env = [("AGENTVFS_SOCKET", agent.as_str()), ("AGENTVFS_CONTROL_SOCKET", socket.as_str())];
    let (code, status, _) = cli(&["status"], &env);
    assert!(code == 0 && status.contains(&format!("socket        {socket} (approvers: root)\n")), "{status}");
    let (code, out, err) = cli(&["explain", "read", "/host/secret/key"], &env);
    assert_eq!(
        (code, out.as_str()),
        (0, format!("(from the daemon at {agent})\nread /host/secret/key: denied: hidden (ENOENT, absent from listings)\nby rule #0: deny read,write /host/secret/**\n").as_str()),
        "{err}"
    );
    // `--config` names both sockets: agent commands take the agent socket from it.
    let cfg = f.config_path().display().to_string();
    let aside = f.scratch.path().join("aside.sock");
    std::fs::rename(f.socket(), &aside).unwrap();
    let (tools, _, err) = cli(&["tools", "--config", &cfg], &[]);
    let (status, _, missing) = cli(&["status", "--config", &cfg], &[]);
    std::fs::rename(&aside, f.socket()).unwrap();
    assert_eq!(tools, 0, "{err}");
    assert_eq!(
        (status, missing),
        (1, format!("agentvfs: no daemon is listening on {socket} (is `agentvfs mount` running?)\n"))
    );
    // No daemon there: the embedded default, and the first line says so.
    let gone = f.scratch.path().join("nothing.sock").display().to_string();
    let (code, out, _) = cli(&["explain", "read", "/workspace/.env"], &[("AGENTVFS_SOCKET", &gone)]);
    assert_eq!(code, 0);
    let expected = format!("(from the embedded default config: no daemon answers at {gone})\nread /workspace/.env: denied: hidden (ENOENT, absent from listings)\nby rule #0: deny read,write /**/.env ");
    assert!(out.starts_with(&expected), "{out}");
    let (code, out, _) = cli(&["explain", "read", "/host/secret/key"], &[("AGENTVFS_SOCKET", &gone)]);
    assert!(
        code == 0 && out.ends_with("read /host/secret/key: allowed\nno rule matches (default allow)\n"),
        "{out}"
    );
    drop(f);
}

#[test]
fn reload_applies_new_rules_and_the_kernel_forgets_cached_entries() {
    let (f, socket) = fixture();
    std::fs::write(f.p("/mem/secret.txt"), "s").unwrap();
    std::fs::write(f.p("/secret.txt"), "top").unwrap();
    assert_eq!(std::fs::read_to_string(f.p("/mem/secret.txt")).unwrap(), "s");
    let open_dir = std::fs::File::open(f.p("/mem")).unwrap();
    let cfg = f.config_path();
    let original = std::fs::read_to_string(&cfg).unwrap();
    let rules =
        "[[rules]]\noperations = [\"read\", \"write\"]\npaths = [\"/**/secret.txt\"]\nmode = \"deny\"\n";
    std::fs::write(&cfg, original.clone() + rules).unwrap();
    assert_eq!(
        cli_ok(&["reload", "--socket", &socket]),
        format!("reloaded 2 rule(s) from {}\n", cfg.display())
    );
    // Names the new rules do not touch stay: an open directory keeps its path (it would read
    // "... (deleted)" had the kernel dropped the name rather than asked again, until the next
    // lookup of that name).
    let link = std::fs::read_link(format!("/proc/self/fd/{}", open_dir.as_raw_fd())).unwrap();
    assert_eq!(link, f.p("/mem"));
    // Answered only after the kernel was told, so the cached entry is gone at once.
    assert!(!f.p("/mem/secret.txt").exists(), "the cached entry still answers");
    let json: Value = serde_json::from_str(&cli_ok(&["reload", "--socket", &socket, "--json"])).unwrap();
    assert_eq!(json, json!({"rules": 2, "config": cfg, "warnings": []}));
    // A broken file keeps the rules in force; so does a route change, with a warning.
    let good = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, "[[rules]]\nmode = 1\n").unwrap();
    let (code, _, err) = cli(&["reload", "--socket", &socket], &[]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with(&format!("agentvfs: reload failed, keeping the current rules: {}:", cfg.display())),
        "{err}"
    );
    assert!(!f.p("/mem/secret.txt").exists());
    let changed = format!("{good}[[routes]]\npath = \"/extra\"\nbackend = \"memory\"\n[tools]\nobservation = \"off\"\n[interrupts]\ntimeout_seconds = 42\n");
    std::fs::write(&cfg, changed).unwrap();
    let out = cli_ok(&["reload", "--socket", &socket]);
    assert_eq!(out, format!("reloaded 2 rule(s) from {0}\nwarning: the routes, [tools] in {0} changed; only the rules and [interrupts] are reloaded (restart the daemon to apply the rest)\n", cfg.display()));
    assert_eq!(Conn::open(&f.socket()).result(1, "vfs/status", json!({}))["rules"], json!(2));
    // Lifting the rule shows the files at once, in a directory and in the root: a hidden name
    // is never cached as absent.
    assert!(!f.p("/mem/secret.txt").exists() && !f.p("/secret.txt").exists());
    std::fs::write(&cfg, &original).unwrap();
    assert_eq!(
        cli_ok(&["reload", "--socket", &socket]),
        format!("reloaded 1 rule(s) from {}\n", cfg.display())
    );
    assert_eq!(std::fs::read_to_string(f.p("/mem/secret.txt")).unwrap(), "s");
    assert_eq!(std::fs::read_to_string(f.p("/secret.txt")).unwrap(), "top");
}

#[test]
fn client_commands_say_clearly_that_no_daemon_runs() {
    let s = scratch();
    let socket = s.path().join("agentvfs.sock");
    let shown = socket.display().to_string();
    let expected = format!("agentvfs: no daemon is listening on {shown} (is `agentvfs mount` running?)\n");
    let commands: [&[&str]; 7] = [
        &["status"],
        &["paths"],
        &["tools"],
        &["call", "ls", "{}"],
        &["reload"],
        &["explain", "read", "/x"],
        &["mcp"],
    ];
    // No file at all, then a stale socket nobody listens on.
    for stale in [false, true] {
        if stale {
            drop(UnixListener::bind(&socket).unwrap());
        }
        for args in commands {
            let mut with_flag: Vec<&str> = args.to_vec();
            with_flag.splice(1..1, ["--socket", shown.as_str()]);
            let (code, out, err) = cli(&with_flag, &[]);
            assert_eq!((code, out.as_str(), err.as_str()), (1, "", expected.as_str()), "{with_flag:?}");
        }
        // The environment variables name the sockets too: the agent's, and the control one.
        let (code, _, err) = cli(&["tools"], &[("AGENTVFS_SOCKET", &shown)]);
        assert_eq!((code, err.as_str()), (1, expected.as_str()));
        let (code, _, err) = cli(&["status"], &[("AGENTVFS_CONTROL_SOCKET", &shown)]);
        assert_eq!((code, err.as_str()), (1, expected.as_str()));
    }
}

#[test]
fn a_real_mcp_client_over_the_stdio_bridge() {
    let (f, _) = fixture();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_client.py");
    let have_sdk = Command::new("python3").args(["-c", "import mcp"]).status().map(|s| s.success());
    assert!(matches!(have_sdk, Ok(true)), "the MCP Python SDK is missing: run scripts/setup.sh");
    let out = Command::new("python3")
        .arg(&script)
        .arg(BIN)
        .arg(f.agent_socket())
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(stdout, MCP_TRANSCRIPT);
    // The bridge's connection was one session, and it closed when the client did.
    let status = Conn::open(&f.socket()).result(1, "vfs/status", json!({}));
    assert_eq!(status["counters"]["tool_calls"], json!(7));
    assert_eq!(status["counters"]["connections_open"], json!(1));
}

/// A client that asks for many large results and reads none of them does not make the
/// daemon hold them all: results are built a few at a time, and only while what waits to
/// be written stays small. Read at last, every reply arrives whole.
#[test]
fn a_client_that_reads_nothing_cannot_make_the_daemon_hold_its_results() {
    let (f, _) = fixture();
    let line = "x".repeat(59) + "\n";
    std::fs::write(f.host_root.join("big.txt"), line.repeat(100_000)).unwrap();
    let pid = f.mount.child.as_ref().unwrap().id();
    let mut c = UnixStream::connect(f.agent_socket()).unwrap();
    let before = resident(pid);
    const CALLS: usize = 60;
    for id in 0..CALLS {
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "read_file",
            "arguments": {"file_path": "/host/big.txt", "limit": 100_000}, "structured": true}});
        writeln!(c, "{call}").unwrap();
    }
    // Each reply is over 6 MB: all sixty would be 400 MB and more.
    std::thread::sleep(Duration::from_secs(3));
    let grown = resident(pid).saturating_sub(before);
    assert!(grown < 250 << 20, "the daemon grew by {} MiB", grown >> 20);
    let mut lines = BufReader::new(&c);
    for _ in 0..CALLS {
        let mut text = String::new();
        lines.read_line(&mut text).unwrap();
        assert!(text.len() > 6_000_000, "{} bytes", text.len());
        assert!(text.contains(r#""isError":false"#), "{}", &text[..200]);
    }
}

/// Names up to 255 bytes, the kernel's limit, work through the tools as through the mount
/// (a whole write's temporary name is cut to fit); a longer one is an error result, not an
/// internal error.
#[test]
fn the_longest_names_work_through_the_tools_and_longer_ones_are_refused() {
    use crate::harness::call_tool;
    let f = Fixture::new("");
    let mut c = agentvfs::control::client::Client::connect(&f.agent_socket()).unwrap();
    for route in ["/host", "/mem", "/db"] {
        let long = format!("{route}/{}", "w".repeat(240));
        let (ok, text) = call_tool(&mut c, "write_file", json!({"file_path": long, "content": "x\n"}));
        assert!(ok, "{route}: {text}");
        assert_eq!(std::fs::read_to_string(f.p(&long)).unwrap(), "x\n");
        let upload = c.call(
            "vfs/upload",
            Some(json!({"path": format!("{route}/{}", "u".repeat(255)), "content": "eA=="})),
        );
        assert!(upload.as_ref().is_ok_and(|r| r.get("error_code").is_none()), "{route}: {upload:?}");
        let longer = format!("{route}/{}", "n".repeat(256));
        for (tool, args) in [
            ("read_file", json!({"file_path": longer})),
            ("write_file", json!({"file_path": longer, "content": "x"})),
            ("ls", json!({"path": longer})),
            ("delete", json!({"file_path": longer})),
        ] {
            let (ok, text) = call_tool(&mut c, tool, args);
            assert!(!ok && text.contains("File name too long"), "{route} {tool}: {text}");
        }
    }
}

/// A full store is an I/O error for the tools (`FS_IO`, with the system's text), not
/// `FS_TOO_LARGE`, which says a smaller file would do; the file keeps its old content.
#[test]
fn a_full_store_is_an_io_error_and_the_old_content_stays() {
    let f = Fixture::new("[[routes]]\npath = \"/small\"\nbackend = \"memory\"\nmax_bytes = 1048576\n");
    let mut c = agentvfs::control::client::Client::connect(&f.agent_socket()).unwrap();
    std::fs::write(f.p("/small/f.txt"), "old\n").unwrap();
    let big = "x".repeat(900_000);
    let params = json!({"name": "write_file", "arguments": {"file_path": "/small/g.txt", "content": big}});
    let first = c.call("tools/call", Some(params)).unwrap();
    assert_eq!(first["isError"], json!(false), "{first}");
    let params = json!({"name": "write_file", "arguments": {"file_path": "/small/f.txt", "content": big}});
    let result = c.call("tools/call", Some(params)).unwrap();
    assert_eq!(result["isError"], json!(true), "{result}");
    assert_eq!(result["structuredContent"]["error_code"], json!("FS_IO"), "{result}");
    let text = result["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("No space left on device"), "{text}");
    assert_eq!(std::fs::read_to_string(f.p("/small/f.txt")).unwrap(), "old\n");
}

/// `vfs/explain` says what the doors do: beneath a hidden directory nothing is reached, and a
/// write needs the lookup a read denial refuses.
#[test]
fn explain_agrees_with_the_doors() {
    let f = Fixture::new(
        "[[rules]]\noperations = [\"read\", \"write\"]\npaths = [\"/host/d2\"]\nmode = \"deny\"\n\n\
         [[rules]]\noperations = [\"read\"]\npaths = [\"/host/wo/f\"]\nmode = \"deny\"\nhide = false\n\n\
         [[rules]]\noperations = [\"read\"]\npaths = [\"/host/sd/**\"]\nmode = \"deny\"\n",
    );
    std::fs::create_dir_all(f.host_root.join("d2")).unwrap();
    std::fs::write(f.host_root.join("d2/f"), "x").unwrap();
    std::fs::create_dir_all(f.host_root.join("wo")).unwrap();
    std::fs::write(f.host_root.join("wo/f"), "x").unwrap();
    let mut c = agentvfs::control::client::Client::connect(&f.agent_socket()).unwrap();
    let mut explain =
        |op: &str, path: &str| c.call("vfs/explain", Some(json!({"operation": op, "path": path}))).unwrap();
    let beneath = explain("read", "/host/d2/f");
    assert_eq!(beneath["decision"], json!("deny"), "{beneath}");
    assert_eq!(std::fs::read(f.p("/host/d2/f")).unwrap_err().raw_os_error(), Some(libc::ENOENT));
    let write = explain("write", "/host/wo/f");
    assert_eq!(write["decision"], json!("deny"), "{write}");
    let appended = std::fs::OpenOptions::new().append(true).open(f.p("/host/wo/f"));
    assert_eq!(appended.unwrap_err().raw_os_error(), Some(libc::EACCES));
    let kinds = explain("read", "/host/sd");
    assert_eq!(kinds["decision"], json!("allow"), "{kinds}");
    assert_eq!(kinds["as_directory"]["decision"], json!("deny"), "{kinds}");
}

/// Each request runs on a thread of its own, so one user's clients, on as many connections as
/// they like, run at most a quarter of what the daemon runs: past it that user's requests are
/// refused at once, while another user's are served, and the places come back as they end.
#[test]
fn one_users_requests_run_at_most_its_share_of_the_daemons_threads() {
    use agentvfs::control::running::MAX_RUNNING_PER_UID;
    let f = Fixture::with_config("", |text| text.to_string() + "\n[control]\nagents = [\"nobody\"]\n");
    std::fs::set_permissions(f.scratch.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let line = "x".repeat(59) + "\n";
    std::fs::write(f.host_root.join("big.txt"), line.repeat(100_000)).unwrap();
    // Connections that ask for large results and read none: past the reply budget their calls
    // wait for a turn, each on its thread.
    let call = |id: usize| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "read_file",
            "arguments": {"file_path": "/host/big.txt", "limit": 100_000}, "structured": true}})
        .to_string()
            + "\n"
    };
    let per_connection = 256;
    let flooding: Vec<UnixStream> = (0..MAX_RUNNING_PER_UID / per_connection)
        .map(|_| {
            let mut c = UnixStream::connect(f.agent_socket()).unwrap();
            let lines: String = (0..per_connection).map(call).collect();
            c.write_all(lines.as_bytes()).unwrap();
            c
        })
        .collect();
    let ping = |c: &mut Conn| c.request(9, "ping", json!({}));
    let mut root = Conn::open(&f.agent_socket());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let refused = loop {
        let answer = ping(&mut root);
        if answer.get("error").is_some() {
            break answer;
        }
        assert!(std::time::Instant::now() < deadline, "never refused: {answer}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(refused["error"]["code"], -32002, "{refused}");
    assert_eq!(
        refused["error"]["message"],
        format!("too many requests running for uid 0 (limit {MAX_RUNNING_PER_UID}, across its connections)")
    );
    // Another user is served meanwhile.
    let mut nobody = Conn::open_as(65534, &f.agent_socket());
    assert_eq!(ping(&mut nobody), json!({"jsonrpc": "2.0", "id": 9, "result": {}}));
    // The flooding clients go: their waiting calls end, and root is served again.
    drop(flooding);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let answer = ping(&mut root);
        if answer.get("result").is_some() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still refused: {answer}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
