//! Roles at the control door over a real daemon: the agent socket and the control socket,
//! whom each admits (users and groups, told apart with SO_PEERCRED), the methods the agent
//! socket refuses, the principal every ticket and audit record names, the CLI's sockets, and
//! a real MCP client running as an agent.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::{is_mounted, unmounted, Fixture, Mount, BIN};

/// Writes under `/host/secrets` ask a human; `/host/private` is hidden.
const RULES: &str = r#"
[[rules]]
operations = ["write"]
paths = ["/host/secrets/**"]
mode = "interrupt"

[[rules]]
operations = ["read", "write"]
paths = ["/host/private/**"]
mode = "deny"
"#;

fn control(f: &Fixture) -> PathBuf {
    f.scratch.path().join("agentvfs.sock")
}

/// Beside the control socket, named after it (the harness's config names no agent socket).
fn agent(f: &Fixture) -> PathBuf {
    f.scratch.path().join("agentvfs-agent.sock")
}

fn shown(path: &Path) -> String {
    path.display().to_string()
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o777
}

/// One connection: requests out, lines in.
struct Conn {
    stream: UnixStream,
    lines: BufReader<UnixStream>,
}

impl Conn {
    fn open(socket: &Path) -> Conn {
        let stream =
            UnixStream::connect(socket).unwrap_or_else(|e| panic!("connect {}: {e}", socket.display()));
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Conn { lines: BufReader::new(stream.try_clone().unwrap()), stream }
    }

    fn send(&mut self, id: u64, method: &str, params: Value) {
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.stream.write_all(format!("{request}\n").as_bytes()).unwrap();
    }

    /// The reply to `id` (skipping notifications and other replies).
    fn reply(&mut self, id: u64) -> Value {
        loop {
            let mut line = String::new();
            self.lines.read_line(&mut line).expect("a line from the daemon");
            let m: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
            if m["id"] == json!(id) {
                return m;
            }
        }
    }

    fn result(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send(id, method, params);
        let reply = self.reply(id);
        assert!(reply.get("error").is_none(), "{method}: {reply}");
        reply["result"].clone()
    }

    /// The error code and message a request is answered with.
    fn error(&mut self, id: u64, method: &str, params: Value) -> (i64, String) {
        self.send(id, method, params);
        let reply = self.reply(id);
        let e = &reply["error"];
        (
            e["code"].as_i64().unwrap_or_else(|| panic!("{method}: not an error: {reply}")),
            e["message"].as_str().unwrap().into(),
        )
    }
}

/// Waits until `n` approvals are pending (asked on the control socket) and returns them.
fn pending(f: &Fixture, n: usize) -> Vec<Value> {
    let mut c = Conn::open(&control(f));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list = c.result(1, "interrupts/list", json!({}))["interrupts"].as_array().unwrap().clone();
        if list.len() == n {
            return list;
        }
        assert!(Instant::now() < deadline, "wanted {n} pending approvals, have {list:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Rows of the audit table (waiting up to 3 s for `n` of them), for `sql`'s three columns.
fn audit_rows(f: &Fixture, sql: &str, n: usize) -> Vec<(String, Option<String>, u32, String)> {
    let db = rusqlite::Connection::open(f.scratch.path().join("audit.db")).unwrap();
    let rows = || -> Vec<(String, Option<String>, u32, String)> {
        let Ok(mut stmt) = db.prepare(sql) else { return Vec::new() };
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)));
        rows.map(|r| r.map(Result::unwrap).collect()).unwrap_or_default()
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    while rows().len() < n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    rows()
}

/// The CLI as root: (exit code, stdout, stderr).
fn cli(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("AGENTVFS_SOCKET")
        .env_remove("AGENTVFS_CONTROL_SOCKET")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null());
    cmd.envs(env.iter().copied());
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A copy of the binary that other users can run, in `scratch` (which is opened for them to
/// pass through). Copied by another process: a parallel test's child forked while this one
/// held the copy open for writing would keep it open until its own exec (ETXTBSY for ours).
fn runnable(scratch: &Path) -> PathBuf {
    let bin = scratch.join("agentvfs");
    assert!(Command::new("cp").arg(BIN).arg(&bin).status().unwrap().success());
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(scratch, std::fs::Permissions::from_mode(0o711)).unwrap();
    bin
}

/// `setpriv` arguments for nobody (65534:65534, no other groups).
const NOBODY: [&str; 5] = ["--reuid", "65534", "--regid", "65534", "--clear-groups"];
/// For Debian's `daemon` (1:1), in no role.
const DAEMON_USER: [&str; 5] = ["--reuid", "1", "--regid", "1", "--clear-groups"];

/// Runs `bin` with `args` as the user `ids` names (setpriv): (exit code, stdout, stderr).
fn cli_as(bin: &Path, ids: &[&str], args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new("setpriv")
        .args(ids)
        .arg(bin)
        .args(args)
        .env_remove("AGENTVFS_SOCKET")
        .env_remove("AGENTVFS_CONTROL_SOCKET")
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn write_file(path: &str) -> Value {
    json!({"name": "write_file", "arguments": {"file_path": path, "content": "x"}})
}

#[test]
fn an_agent_connection_can_neither_list_nor_resolve_its_ticket_and_the_control_socket_can() {
    let f = Fixture::new(&format!("{RULES}\n[interrupts]\ntimeout_seconds = 300\n"));
    std::fs::create_dir_all(f.host_root.join("secrets")).unwrap();
    let me = std::process::id();
    let mut a = Conn::open(&agent(&f));
    a.send(1, "tools/call", write_file("/host/secrets/a"));
    let t = pending(&f, 1).remove(0);
    assert_eq!(
        (t["door"].as_str(), t["socket"].as_str(), &t["uid"], &t["pid"]),
        (Some("tool"), Some("agent"), &json!(0), &json!(me)),
        "the ticket names its principal: {t}"
    );
    let methods = [
        ("interrupts/list", json!({}), "approver"),
        ("interrupts/resolve", json!({"id": t["id"], "decision": "approve"}), "approver"),
        ("interrupts/subscribe", json!({}), "approver"),
        ("vfs/status", json!({}), "operator"),
        ("vfs/reload", json!({}), "operator"),
    ];
    for (i, (method, params, role)) in methods.into_iter().enumerate() {
        let (code, message) = a.error(10 + i as u64, method, params);
        assert_eq!(
            (code, message),
            (
                -32001,
                format!("permission denied: {method} needs the {role} role (the control socket); this is the agent socket")
            )
        );
    }
    // The connection stays up and serves what an agent needs; the ticket still waits.
    assert_eq!(a.result(20, "ping", json!({})), json!({}));
    assert_eq!(a.result(21, "vfs/paths", json!({}))["mountpoint"], json!(f.mount.dir));
    let explained = a.result(22, "vfs/explain", json!({"operation": "write", "path": "/host/secrets/a"}));
    assert_eq!(explained["decision"], "interrupt");
    let listed = a.result(23, "tools/list", json!({}));
    assert_eq!(listed, Conn::open(&control(&f)).result(1, "tools/list", json!({})), "the same tools");
    assert_eq!(a.error(24, "frobnicate", json!({})).0, -32601, "unknown methods are not found");
    assert_eq!(pending(&f, 1)[0]["id"], t["id"]);
    assert!(!f.host_root.join("secrets/a").exists());

    // A control connection whose own tool call waits cannot answer it either.
    let mut c = Conn::open(&control(&f));
    c.send(1, "tools/call", write_file("/host/secrets/b"));
    let list = pending(&f, 2);
    let b = list.iter().find(|t| t["path"] == "/host/secrets/b").unwrap().clone();
    assert_eq!(b["socket"], "control", "{b}");
    assert_eq!(
        c.error(2, "interrupts/resolve", json!({"id": b["id"], "decision": "approve"})),
        (-32001, format!("permission denied: approval #{} waits on a tool call of this connection, which may not answer it; an approver answers it on a connection of their own", b["id"]))
    );
    // The approver sees where each came from.
    let (_, shown_list, _) = cli(&["interrupts", "--socket", &shown(&control(&f))], &[]);
    for (ticket, via) in [(&t, "the agent socket"), (&b, "the control socket")] {
        let head =
            format!("#{} write {} by tool write_file ", ticket["id"], ticket["path"].as_str().unwrap());
        let line =
            shown_list.lines().find(|l| l.starts_with(&head)).unwrap_or_else(|| panic!("{shown_list}"));
        assert!(line.contains(&format!("(pid {me} uid 0 via {via}) expires in ")), "{line}");
    }

    // The approver, on a connection of their own, answers both.
    let mut approver = Conn::open(&control(&f));
    let resolved = approver.result(1, "interrupts/resolve", json!({"id": t["id"], "decision": "approve"}));
    assert_eq!(resolved["resolved_by"], format!("uid 0 (pid {me})"));
    assert_eq!(a.reply(1)["result"]["isError"], json!(false));
    assert_eq!(std::fs::read_to_string(f.host_root.join("secrets/a")).unwrap(), "x");
    approver.result(2, "interrupts/resolve", json!({"id": b["id"], "decision": "reject"}));
    assert_eq!(c.reply(1)["result"]["structuredContent"]["error_code"], "FS_INTERRUPT_REJECTED");

    // The audit log names the principal of both records, and who resolved.
    let rows = audit_rows(
        &f,
        "SELECT door, socket, pid, decision FROM audit WHERE path = '/host/secrets/a' ORDER BY id",
        2,
    );
    let by = format!("approve by uid 0 (pid {me})");
    assert_eq!(
        rows,
        [
            ("tool".to_string(), Some("agent".to_string()), me, "interrupt".to_string()),
            ("tool".to_string(), Some("agent".to_string()), me, by)
        ]
    );
}

/// Each socket has its own connection limit: agents holding every connection the agent
/// socket admits leave the control socket answering its approvers.
#[test]
fn agents_holding_every_connection_leave_the_control_socket_answering() {
    let f = Fixture::new(RULES);
    let mut held = Vec::new();
    for _ in 0..1024 {
        let mut c = UnixStream::connect(agent(&f)).unwrap();
        writeln!(c, r#"{{"jsonrpc":"2.0","id":1,"method":"ping"}}"#).unwrap();
        held.push(c);
    }
    // Every one of them is served (its thread is up), then the next is refused.
    for c in &held {
        let mut line = String::new();
        BufReader::new(c).read_line(&mut line).unwrap();
        assert!(line.contains(r#""result""#), "{line}");
    }
    let over = UnixStream::connect(agent(&f)).unwrap();
    let mut line = String::new();
    BufReader::new(&over).read_line(&mut line).unwrap();
    let refused: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(refused["error"]["code"], json!(-32002), "{line}");
    assert_eq!(refused["error"]["message"], json!("too many connections to the agent socket (limit 1024)"));
    let (code, out, err) = cli(&["status", "--socket", control(&f).to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("rules: 2"), "{out}");
    drop(held);
}

#[test]
fn a_user_listed_only_as_an_agent_calls_tools_and_the_control_socket_refuses_it() {
    let f = Fixture::new(&format!("{RULES}\n[control]\nagents = [\"nobody\"]\n"));
    std::fs::create_dir_all(f.host_root.join("private")).unwrap();
    std::fs::write(f.host_root.join("readme"), "hello\n").unwrap();
    std::fs::write(f.host_root.join("private/key"), "KEY").unwrap();
    let bin = runnable(f.scratch.path());
    let cfg = shown(&f.scratch.path().join("agentvfs.toml"));
    let (agent, control) = (shown(&agent(&f)), shown(&control(&f)));
    // The agent socket is open to the listed user, the control socket to root alone.
    assert_eq!((mode(Path::new(&agent)), mode(Path::new(&control))), (0o666, 0o600));

    // Tools on the agent socket, which `call` and `tools` find through --config or
    // $AGENTVFS_SOCKET.
    let read = r#"{"file_path": "/host/readme"}"#;
    let (code, out, err) = cli_as(&bin, &NOBODY, &["call", "--config", &cfg, "read_file", read], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("hello"), "{out}");
    let (code, out, err) = cli_as(&bin, &NOBODY, &["tools"], &[("AGENTVFS_SOCKET", &agent)]);
    assert_eq!((code, out.lines().count()), (0, 7), "{out}{err}");
    let hidden = r#"{"file_path": "/host/private/key"}"#;
    let (code, _, _) = cli_as(&bin, &NOBODY, &["call", "--socket", &agent, "read_file", hidden], &[]);
    assert_eq!(code, 2, "the rules hold on the agent socket");

    // The control socket: its mode keeps the agent out first...
    let (code, _, err) = cli_as(&bin, &NOBODY, &["status", "--config", &cfg], &[]);
    assert_eq!((code, err), (1, format!("agentvfs: permission denied opening the socket {control} (its file mode or its directory's keeps this user out: the daemon makes a socket 0600 when only root and its own user may use it)\n")));
    // ...and opened up, the peer check refuses it, saying where it belongs.
    std::fs::set_permissions(&control, std::fs::Permissions::from_mode(0o666)).unwrap();
    let refused = format!("agentvfs: permission denied: uid 65534 may not use this socket (the control socket admits only root, as [control] approvers is unset; uid 65534 is an agent, whose socket is {agent})\n");
    for args in [
        &["status", "--config", &cfg][..],
        &["interrupts", "--config", &cfg],
        &["approve", "1", "--socket", &control],
        &["reload", "--socket", &control],
    ] {
        let (code, out, err) = cli_as(&bin, &NOBODY, args, &[]);
        assert_eq!((code, out.as_str(), err.as_str()), (1, "", refused.as_str()), "{args:?}");
    }
    let (code, _, err) = cli_as(&bin, &NOBODY, &["call", "--socket", &control, "ls", "{}"], &[]);
    assert_eq!((code, err.as_str()), (1, refused.as_str()), "not even tools there");
    let status = Conn::open(Path::new(&control)).result(1, "vfs/status", json!({}));
    assert_eq!(status["counters"]["peers_refused"], json!(5));

    // Audit records of the agent's calls name it; those of the mount have no socket.
    let _ = std::fs::read(f.p("/host/private/key"));
    let rows = audit_rows(&f, "SELECT door, socket, uid, decision FROM audit WHERE door = 'tool'", 1);
    assert_eq!(rows, [("tool".to_string(), Some("agent".to_string()), 65534, "hide".to_string())]);
    let rows = audit_rows(&f, "SELECT door, socket, uid, decision FROM audit WHERE door = 'fuse'", 1);
    assert!(!rows.is_empty(), "the mount's refusal is recorded");
    assert!(rows.iter().all(|r| r == &("fuse".to_string(), None, 0, "hide".to_string())), "{rows:?}");
}

#[test]
fn an_unlisted_user_is_refused_by_both_sockets_and_a_group_admits_its_members() {
    let f = Fixture::new("[control]\nagents = [\"nobody\"]\napprovers = [\"group:nogroup\"]\n");
    let bin = runnable(f.scratch.path());
    let (agent, control) = (shown(&agent(&f)), shown(&control(&f)));
    assert_eq!((mode(Path::new(&agent)), mode(Path::new(&control))), (0o666, 0o666));
    let at_agent = "agentvfs: permission denied: uid 1 may not use this socket (the agent socket admits root and the users and groups in [control] agents)\n";
    let at_control = "agentvfs: permission denied: uid 1 may not use this socket (the control socket admits root and the users and groups in [control] approvers)\n";
    for (args, refused) in [
        (&["tools", "--socket", &agent][..], at_agent),
        (&["paths", "--socket", &agent], at_agent),
        (&["status", "--socket", &control], at_control),
        (&["interrupts", "--socket", &control], at_control),
    ] {
        let (code, out, err) = cli_as(&bin, &DAEMON_USER, args, &[]);
        assert_eq!((code, out.as_str(), err.as_str()), (1, "", refused), "{args:?}");
    }
    // On the wire: one error line with a null id, then the daemon closes.
    let (_, out, _) = cli_as(&bin, &DAEMON_USER, &["mcp", "--socket", &agent], &[]);
    let message = at_agent.trim_start_matches("agentvfs: ").trim_end();
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap(),
        json!({"error": {"code": -32001, "message": message}, "id": null, "jsonrpc": "2.0"})
    );
    // A member of the group approves, by its primary group or a supplementary one.
    let with_group = ["--reuid", "1", "--regid", "1", "--groups", "65534"];
    for ids in [&with_group[..], &NOBODY] {
        let (code, out, err) = cli_as(&bin, ids, &["interrupts", "--socket", &control], &[]);
        assert_eq!((code, out.as_str()), (0, "no pending approvals\n"), "{ids:?}: {err}");
    }
    // The group gives no agent role: that one is nobody's alone.
    let (code, _, err) = cli_as(&bin, &with_group, &["tools", "--socket", &agent], &[]);
    assert_eq!((code, err.as_str()), (1, at_agent));
    let status = Conn::open(Path::new(&control)).result(1, "vfs/status", json!({}));
    assert_eq!(
        status["roles"],
        json!({"agents": ["root", "nobody"], "approvers": ["root", "group:nogroup"]})
    );
}

#[test]
fn without_control_the_default_user_holds_both_roles() {
    // The daemon runs as root here, and the workspace is root's: root alone, both sockets 0600.
    let f = Fixture::new("");
    assert_eq!((mode(&agent(&f)), mode(&control(&f))), (0o600, 0o600));
    assert_eq!(Conn::open(&agent(&f)).result(1, "ping", json!({})), json!({}));
    let status = Conn::open(&control(&f)).result(1, "vfs/status", json!({}));
    assert_eq!((&status["socket"], &status["agent_socket"]), (&json!(control(&f)), &json!(agent(&f))));
    assert_eq!(status["roles"], json!({"agents": ["root"], "approvers": ["root"]}));
    let (code, out, _) = cli(&["status", "--socket", &shown(&control(&f))], &[]);
    assert_eq!(code, 0);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[2], format!("socket        {} (approvers: root)", shown(&control(&f))));
    assert_eq!(lines[3], format!("agent socket  {} (agents: root)", shown(&agent(&f))));
    drop(f);

    // A workspace that belongs to nobody makes nobody the default user: agent and approver.
    let u = unmounted("");
    std::os::unix::fs::chown(&u.host_root, Some(65534), Some(65534)).unwrap();
    let bin = runnable(u.scratch.path());
    let m = Mount::start(&u.config, &u.scratch.path().join("mnt"));
    let (agent, control) =
        (u.scratch.path().join("agentvfs-agent.sock"), u.scratch.path().join("agentvfs.sock"));
    assert_eq!((mode(&agent), mode(&control)), (0o666, 0o666));
    let (code, out, err) = cli_as(&bin, &NOBODY, &["tools", "--socket", &shown(&agent)], &[]);
    assert_eq!((code, out.lines().count()), (0, 7), "{err}");
    let (code, out, err) = cli_as(&bin, &NOBODY, &["interrupts", "--socket", &shown(&control)], &[]);
    assert_eq!((code, out.as_str()), (0, "no pending approvals\n"), "{err}");
    let (code, _, err) = cli_as(&bin, &DAEMON_USER, &["tools", "--socket", &shown(&agent)], &[]);
    assert_eq!(
        (code, err.as_str()),
        (1, "agentvfs: permission denied: uid 1 may not use this socket (the agent socket admits only root and uid 65534, as [control] agents is unset)\n")
    );
    let status = Conn::open(&control).result(1, "vfs/status", json!({}));
    assert_eq!(
        status["roles"],
        json!({"agents": ["root", "nobody (default)"], "approvers": ["root", "nobody (default)"]})
    );
    m.stop();
    assert!(!agent.exists() && !control.exists(), "both sockets go with the daemon");
}

#[test]
fn agentvfs_mcp_as_an_agent_lists_and_calls_the_tools_over_the_agent_socket() {
    let f = Fixture::new("[control]\nagents = [\"nobody\"]\n");
    let bin = runnable(f.scratch.path());
    // The tools act with nobody's permissions: it works in a directory of its own.
    std::os::unix::fs::chown(f.p("/mem"), Some(65534), Some(65534)).unwrap();
    // What an MCP client launches, run as nobody.
    let wrapper = f.scratch.path().join("agentvfs-as-nobody");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nexec setpriv {} {} \"$@\"\n", NOBODY.join(" "), bin.display()),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_client.py");
    let out = Command::new("python3").arg(&script).arg(&wrapper).arg(agent(&f)).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(stdout, crate::control::MCP_TRANSCRIPT);
    let status = Conn::open(&control(&f)).result(1, "vfs/status", json!({}));
    assert_eq!(status["counters"]["tool_calls"], json!(7));

    // Pointed at the control socket, the bridge still carries only the agent's methods.
    let mut bridge = Command::new(BIN)
        .args(["mcp", "--socket", &shown(&control(&f))])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"interrupts/list\"}\n{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}\n";
    bridge.stdin.take().unwrap().write_all(lines.as_bytes()).unwrap();
    let out = bridge.wait_with_output().unwrap();
    assert!(out.status.success());
    let mut replies: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    replies.sort_by_key(|r| r["id"].as_u64());
    assert_eq!(
        replies,
        [
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32001, "message": "permission denied: interrupts/list needs the approver role (the control socket); agentvfs mcp forwards only the agent's methods"}}),
            json!({"jsonrpc": "2.0", "id": 2, "result": {}}),
        ]
    );
}

#[test]
fn a_config_naming_an_unknown_user_or_group_is_refused_with_its_line() {
    for (control, error) in [
        (
            "[control]\nagents = [\"nobody\",\n  \"no-such-agent\"]\n",
            "[control] agents: unknown user \"no-such-agent\" (a group is written \"group:NAME\")",
        ),
        (
            "[control]\napprovers = [\"group:no-such-group\"]\n",
            "[control] approvers: unknown group \"no-such-group\"",
        ),
    ] {
        let u = unmounted(control);
        let text = std::fs::read_to_string(&u.config).unwrap();
        let name = if control.contains("no-such-agent") { "no-such-agent" } else { "group:no-such-group" };
        let line = text[..text.find(name).unwrap()].matches('\n').count() + 1;
        let expected = format!("agentvfs: {}:{line}: {error}\n", u.config.display());
        let (code, _, err) = cli(&["check", "--config", &shown(&u.config)], &[]);
        assert_eq!((code, err), (1, expected.clone()));
        let mnt = u.scratch.path().join("mnt");
        let refused = Mount::try_start(&u.config, &mnt).err().expect("the daemon refuses to start");
        assert!(refused.contains(expected.trim_end()), "{refused}");
        assert!(!is_mounted(&mnt));
    }
}

/// A tool call acts with its peer's permissions, as that user's own syscalls through the
/// mount would, although the daemon acts as root: root's private file is not read, root's
/// directory and read-only file are not written, and in a sticky directory another user's
/// file is not deleted. The user's own places work.
#[test]
fn an_agents_tool_calls_have_its_users_permissions_not_the_daemons() {
    use std::os::unix::fs::MetadataExt;
    let f = Fixture::new(&format!("{RULES}\n[control]\nagents = [\"nobody\"]\n"));
    let host = &f.host_root;
    let write = |rel: &str, text: &str, mode: u32| {
        std::fs::write(host.join(rel), text).unwrap();
        std::fs::set_permissions(host.join(rel), std::fs::Permissions::from_mode(mode)).unwrap();
    };
    for (dir, mode) in [("rootdir", 0o700), ("sticky", 0o1777), ("mine", 0o755)] {
        std::fs::create_dir(host.join(dir)).unwrap();
        std::fs::set_permissions(host.join(dir), std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::os::unix::fs::chown(host.join("mine"), Some(65534), Some(65534)).unwrap();
    write("rootonly.txt", "root only\n", 0o600);
    write("shared.txt", "shared\n", 0o644);
    write("rootdir/f", "inside\n", 0o644);
    write("sticky/theirs", "theirs\n", 0o666);
    let bin = runnable(f.scratch.path());
    let agent = shown(&agent(&f));
    let call = |tool: &str, args: Value| {
        cli_as(&bin, &NOBODY, &["call", "--socket", &agent, tool, &args.to_string()], &[])
    };
    for (tool, args) in [
        ("read_file", json!({"file_path": "/host/rootonly.txt"})),
        ("read_file", json!({"file_path": "/host/rootdir/f"})),
        ("ls", json!({"path": "/host/rootdir"})),
        ("write_file", json!({"file_path": "/host/rootdir/new", "content": "x"})),
        ("write_file", json!({"file_path": "/host/shared.txt", "content": "x"})),
        ("delete", json!({"file_path": "/host/sticky/theirs"})),
        ("delete", json!({"file_path": "/host/shared.txt"})),
    ] {
        let (code, out, err) = call(tool, args.clone());
        assert_eq!(code, 2, "{tool} {args}: {out}{err}");
        assert!(out.contains("ermission denied") && !out.contains("root only"), "{tool} {args}: {out}");
    }
    // The same user through the mount meets the same answers from the kernel.
    let mount = f.mount.dir.to_str().unwrap().to_string();
    let (code, _, _) = cli_as(Path::new("cat"), &NOBODY, &[&format!("{mount}/host/rootonly.txt")], &[]);
    assert_ne!(code, 0);
    assert_eq!(std::fs::read_to_string(host.join("shared.txt")).unwrap(), "shared\n");
    assert!(host.join("sticky/theirs").exists() && !host.join("rootdir/new").exists());
    // Its own directory, a file all may read, and a sticky directory's shared space work.
    let (code, out, err) = call("write_file", json!({"file_path": "/host/mine/new", "content": "mine"}));
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(std::fs::metadata(host.join("mine/new")).unwrap().uid(), 65534);
    let (code, out, _) = call("read_file", json!({"file_path": "/host/shared.txt"}));
    assert!(code == 0 && out.contains("shared"), "{out}");
    let (code, out, err) = call("write_file", json!({"file_path": "/host/sticky/own/f", "content": "own"}));
    assert_eq!(code, 0, "{out}{err}");
    // What it makes is its own, as at the mount (not the directory owner's, root here).
    for made in ["sticky/own", "sticky/own/f"] {
        let m = std::fs::metadata(host.join(made)).unwrap();
        assert_eq!((m.uid(), m.gid()), (65534, 65534), "{made}");
    }
    let (code, out, err) = call("delete", json!({"file_path": "/host/sticky/own"}));
    assert_eq!(code, 0, "{out}{err}");
    // Its write of root's set-ID program (which all may write) clears the bits, as its
    // `write` at the mount would: it keeps root as owner, but not root's privileges.
    write("setid", "#!/bin/sh\n", 0o6777);
    let (code, out, err) =
        call("write_file", json!({"file_path": "/host/setid", "content": "#!/bin/sh\nid\n"}));
    assert_eq!(code, 0, "{out}{err}");
    let m = std::fs::metadata(host.join("setid")).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o777));
}
