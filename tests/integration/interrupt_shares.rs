//! Pending approvals under load, over a real daemon and sockets: each user's share of the
//! bound (one agent filling its share, or several agents theirs, cannot stop another user or
//! root from being asked), a list of a thousand tickets of large writes staying small, and
//! an approved deferred write landing whole although its ticket kept only a preview.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::{Conn, Fixture};

/// Writes under `/host/guard` ask a human; four users are agents.
const CONFIG: &str = r#"
[[rules]]
operations = ["write"]
paths = ["/host/guard/**"]
mode = "interrupt"

[interrupts]
timeout_seconds = 300

[control]
agents = ["nobody", "daemon", "bin", "sys"]
"#;

/// Each user's share of the 1024 pending approvals (a quarter), and what users other than
/// root may hold together (all but root's share).
const SHARE: usize = 256;
const OTHERS: usize = 768;

const NOBODY: u32 = 65534;
const DAEMON: u32 = 1;
const BIN: u32 = 2;
const SYS: u32 = 3;

fn fixture() -> Fixture {
    let f = Fixture::new(CONFIG);
    let guard = f.host_root.join("guard");
    std::fs::create_dir(&guard).unwrap();
    // The agents' tool calls act as their users: they may write here.
    std::fs::set_permissions(&guard, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::set_permissions(f.scratch.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    f
}

fn control(f: &Fixture) -> PathBuf {
    f.scratch.path().join("agentvfs.sock")
}

fn agent(f: &Fixture) -> PathBuf {
    f.scratch.path().join("agentvfs-agent.sock")
}

/// What these tests ask of a connection.
trait Asking {
    fn reply(&mut self, method: &str, params: Value) -> (Value, usize);
    fn call(&mut self, method: &str, params: Value) -> (Value, usize);
    fn defer(&mut self, path: &str, content: &str) -> Value;
    fn fill(&mut self, tag: &str, n: usize, content: &str);
}

impl Asking for Conn {
    /// The whole reply to one request, and its length on the wire.
    fn reply(&mut self, method: &str, params: Value) -> (Value, usize) {
        let request = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        self.send(&format!("{request}\n"));
        let line = self.recv_line();
        (serde_json::from_str(&line).unwrap(), line.len())
    }

    /// The result of one request, and the reply's length on the wire.
    fn call(&mut self, method: &str, params: Value) -> (Value, usize) {
        let (reply, bytes) = self.reply(method, params);
        assert!(reply.get("error").is_none(), "{method}: {reply}");
        (reply["result"].clone(), bytes)
    }

    /// `write_file(path, content)` with `wait: false`: its result.
    fn defer(&mut self, path: &str, content: &str) -> Value {
        let args = json!({"file_path": path, "content": content});
        self.call("tools/call", json!({"name": "write_file", "arguments": args, "wait": false})).0
    }

    /// Defers `n` writes named `guard/{tag}-{i}`, each asking a human.
    fn fill(&mut self, tag: &str, n: usize, content: &str) {
        for i in 0..n {
            let r = self.defer(&format!("/host/guard/{tag}-{i}"), content);
            assert_eq!(r["structuredContent"]["interrupted"], json!(true), "{tag} #{i}: {r}");
        }
    }
}

fn list(f: &Fixture) -> (Vec<Value>, usize) {
    let (result, bytes) = Conn::open(&control(f)).call("interrupts/list", json!({}));
    (result["interrupts"].as_array().unwrap().clone(), bytes)
}

/// The refusal a tool call meets past a bound (the overloaded path's shape, with its reason).
fn refused(r: &Value, why: &str) {
    assert_eq!(r["isError"], json!(true), "{r}");
    assert_eq!(r["structuredContent"]["error_code"], json!("FS_INTERRUPT_REJECTED"), "{r}");
    assert_eq!(
        r["content"][0]["text"],
        json!(format!("Error: the tool call for `write_file` needs approval, but too many approvals are pending: {why}. The tool was not executed.")),
    );
}

/// Root appends to an existing guarded file through the mount: the write pauses with a
/// ticket of uid 0 (not refused at once), and lands once approved.
fn root_is_asked(f: &Fixture, name: &str) {
    std::fs::write(f.host_root.join("guard").join(name), "").unwrap();
    let mut shell = Command::new("sh")
        .arg("-c")
        .arg(format!("echo x >> guard/{name}"))
        .current_dir(f.p("/host"))
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let path = format!("/host/guard/{name}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let ticket = loop {
        if let Some(t) = list(f).0.into_iter().find(|t| t["path"] == json!(path)) {
            break t;
        }
        if let Some(status) = shell.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut shell.stderr.take().unwrap(), &mut err).unwrap();
            panic!("root's write ended unasked ({status}): {err}");
        }
        assert!(Instant::now() < deadline, "root's write opened no ticket");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!((ticket["door"].as_str(), &ticket["uid"]), (Some("fuse"), &json!(0)), "{ticket}");
    let decision = json!({"id": ticket["id"], "decision": "approve"});
    Conn::open(&control(f)).call("interrupts/resolve", decision);
    assert!(shell.wait().unwrap().success());
    assert_eq!(std::fs::read_to_string(f.host_root.join("guard").join(name)).unwrap(), "x\n");
}

#[test]
fn one_user_filling_its_share_cannot_stop_another_user_or_root_being_asked() {
    let f = fixture();
    let mut nobody = Conn::open_as(NOBODY, &agent(&f));
    nobody.fill("nobody", SHARE, "x");
    refused(
        &nobody.defer("/host/guard/one-more", "x"),
        "uid 65534 already has 256 approvals pending (one user's share)",
    );
    // Another agent, and root at the mount, are still asked.
    let mut daemon = Conn::open_as(DAEMON, &agent(&f));
    daemon.fill("daemon", 1, "x");
    root_is_asked(&f, "first");
    // Agents of three users fill all but root's share: a fourth user is refused, root is not.
    daemon.fill("daemon-more", SHARE - 1, "x");
    Conn::open_as(BIN, &agent(&f)).fill("bin", SHARE, "x");
    assert_eq!(list(&f).0.len(), OTHERS);
    refused(
        &Conn::open_as(SYS, &agent(&f)).defer("/host/guard/sys", "x"),
        "users other than root already have 768 approvals pending (the rest is kept for root)",
    );
    root_is_asked(&f, "second");
}

#[test]
fn a_thousand_large_tickets_list_small_and_an_approved_deferred_write_lands_whole() {
    let f = fixture();
    // 300 KB, as the review's agent wrote; then 32 KiB for each of the others.
    let whole: String = (0..300_000).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
    let mut nobody = Conn::open_as(NOBODY, &agent(&f));
    let first = nobody.defer("/host/guard/whole", &whole);
    let id = first["structuredContent"]["interrupt_id"].clone();
    let large = "B".repeat(32 * 1024);
    nobody.fill("nobody", SHARE - 1, &large);
    Conn::open_as(DAEMON, &agent(&f)).fill("daemon", SHARE, &large);
    Conn::open_as(BIN, &agent(&f)).fill("bin", SHARE, &large);
    Conn::open(&control(&f)).fill("root", SHARE, &large);

    let started = Instant::now();
    let (tickets, bytes) = list(&f);
    let took = started.elapsed();
    assert_eq!(tickets.len(), 1024);
    // At most 3 KiB a ticket: each shows 2 KiB of its arguments, and says what it cut.
    assert!(bytes < 1024 * 3 * 1024, "the list is {bytes} bytes");
    assert!(took < Duration::from_secs(5), "the list took {took:?}");
    let t = tickets.iter().find(|t| t["id"] == id).unwrap();
    let shown = t["tool"]["arguments"]["content"].as_str().unwrap();
    assert!(whole.starts_with(shown) && shown.len() > 1024, "{}", shown.len());
    assert_eq!(t["tool"]["arguments"]["file_path"], json!("/host/guard/whole"));
    assert_eq!(
        t["tool"]["arguments_bytes"],
        json!(300_000 + r#"{"content":"","file_path":"/host/guard/whole"}"#.len())
    );
    assert_eq!(t["cut"], json!([{"at": "/tool/arguments/content", "bytes": 300_000, "shown": shown.len()}]));

    // Approved, the call finishes with its arguments sent again: the whole content lands.
    // The ticket kept a digest of them, so other content (past the preview) cannot finish it.
    Conn::open(&control(&f)).call("interrupts/resolve", json!({"id": id, "decision": "approve"}));
    let mut other = whole.clone();
    other.replace_range(299_999.., "!");
    let args = json!({"file_path": "/host/guard/whole", "content": other});
    let (reply, _) =
        nobody.reply("tools/call", json!({"name": "write_file", "arguments": args, "ticket": id}));
    assert_eq!(reply["error"]["code"], json!(-32602), "{reply}");
    let args = json!({"file_path": "/host/guard/whole", "content": whole});
    let (done, _) = nobody.call("tools/call", json!({"name": "write_file", "arguments": args, "ticket": id}));
    assert_eq!(done["isError"], json!(false), "{done}");
    assert_eq!(std::fs::read_to_string(f.host_root.join("guard/whole")).unwrap(), whole);
}
