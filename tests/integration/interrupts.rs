//! Interrupts on a real mount and socket: shells paused until a human answers (changes to
//! existing files), changes of names refused until approved and then retried, tool calls
//! waiting while their connection keeps working, every decision, scopes, and subscribers.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::{Fixture, BIN};

/// Writes under `/host/secrets` ask a human; `/host/private` is denied outright.
pub(crate) const RULES: &str = r#"
[[rules]]
operations = ["write"]
paths = ["/host/secrets/**"]
mode = "interrupt"

[[rules]]
operations = ["read", "write"]
paths = ["/host/private/**"]
mode = "deny"
"#;

pub(crate) fn fixture(timeout_seconds: u64) -> Fixture {
    let f = Fixture::new(&format!("{RULES}\n[interrupts]\ntimeout_seconds = {timeout_seconds}\n"));
    std::fs::create_dir_all(f.host_root.join("secrets")).unwrap();
    std::fs::create_dir_all(f.host_root.join("private")).unwrap();
    f
}

/// An existing file under `/host`, whose change (not a new name) pauses for approval.
pub(crate) fn existing(f: &Fixture, rel: &str, content: &str) {
    std::fs::write(f.host_root.join(rel), content).unwrap();
}

pub(crate) fn host_text(f: &Fixture, rel: &str) -> String {
    std::fs::read_to_string(f.host_root.join(rel)).unwrap()
}

pub(crate) fn socket(f: &Fixture) -> PathBuf {
    f.scratch.path().join("agentvfs.sock")
}

/// One connection: requests out, lines in (replies and notifications, in arrival order).
pub(crate) struct Conn {
    stream: UnixStream,
    lines: BufReader<UnixStream>,
}

impl Conn {
    pub(crate) fn open(socket: &Path) -> Conn {
        let stream = UnixStream::connect(socket).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Conn { lines: BufReader::new(stream.try_clone().unwrap()), stream }
    }

    pub(crate) fn send(&mut self, id: u64, method: &str, params: Value) {
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.stream.write_all(format!("{request}\n").as_bytes()).unwrap();
    }

    fn recv(&mut self) -> Value {
        let mut line = String::new();
        self.lines.read_line(&mut line).expect("a line from the daemon");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"))
    }

    /// The reply to `id`, skipping notifications.
    pub(crate) fn reply(&mut self, id: u64) -> Value {
        loop {
            let m = self.recv();
            if m["id"] == json!(id) {
                return m;
            }
            assert!(m.get("method").is_some(), "a reply to another request: {m}");
        }
    }

    pub(crate) fn result(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send(id, method, params);
        let reply = self.reply(id);
        assert!(reply.get("error").is_none(), "{method}: {reply}");
        reply["result"].clone()
    }
}

/// Waits until `n` approvals are pending and returns them.
pub(crate) fn pending(f: &Fixture, n: usize) -> Vec<Value> {
    let mut c = Conn::open(&socket(f));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list = c.result(1, "interrupts/list", json!({}))["interrupts"].as_array().unwrap().clone();
        if list.len() == n {
            return list;
        }
        assert!(Instant::now() < deadline, "wanted {n} pending approvals, have {}: {list:?}", list.len());
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(crate) fn resolve(f: &Fixture, params: Value) -> Value {
    Conn::open(&socket(f)).result(9, "interrupts/resolve", params)
}

fn shell(cwd: &Path, script: &str) -> Child {
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `child` (at most `within`): (exit code, stderr).
fn finish(mut child: Child, within: Duration) -> (i32, String) {
    let deadline = Instant::now() + within;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the process did not finish within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The audit log's decisions about `path`, oldest first.
fn audit_decisions(f: &Fixture, path: &str) -> Vec<String> {
    let db = rusqlite::Connection::open(f.scratch.path().join("audit.db")).unwrap();
    let mut query = db.prepare("SELECT decision FROM audit WHERE path = ?1 ORDER BY id").unwrap();
    query.query_map([path], |r| r.get(0)).unwrap().map(Result::unwrap).collect()
}

pub(crate) fn cli(f: &Fixture, args: &[&str]) -> String {
    let out =
        Command::new(BIN).args(args).arg("--socket").arg(socket(f)).env("RUST_LOG", "warn").output().unwrap();
    assert!(out.status.success(), "agentvfs {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_shell_write_waits_for_approval_then_completes() {
    let f = fixture(300);
    existing(&f, "secrets/k", "old\n");
    let child = shell(&f.p("/host"), "echo key > secrets/k");
    let list = pending(&f, 1);
    let t = &list[0];
    assert_eq!((t["door"].as_str(), t["operation"].as_str()), (Some("fuse"), Some("open")), "{t}");
    assert_eq!((t["class"].as_str(), t["path"].as_str()), (Some("write"), Some("/host/secrets/k")));
    assert_eq!((&t["pid"], &t["retry"]), (&json!(child.id()), &json!(false)), "{t}");
    assert!(t["command"].as_str().unwrap().contains("echo key > secrets/k"), "{t}");
    assert!(t["expires_in_seconds"].as_f64().unwrap() > 250.0, "{t}");
    assert_eq!(t["uid"], json!(0));
    // The CLI shows it readably.
    let listed = cli(&f, &["interrupts"]);
    assert!(
        listed.starts_with(&format!(
            "#{} write /host/secrets/k by pid {} uid 0 via the mount (",
            t["id"],
            child.id()
        )),
        "{listed}"
    );
    assert!(listed.contains("expires in 4m") || listed.contains("expires in 5m00s"), "{listed}");
    assert_eq!(host_text(&f, "secrets/k"), "old\n", "nothing happens before the approval");
    let status = Conn::open(&socket(&f)).result(2, "vfs/status", json!({}));
    assert_eq!(status["pending_interrupts"], json!(1));

    // The truncating open asks once, and the write through the approved handle does not ask
    // again.
    let out = cli(&f, &["approve", &t["id"].to_string()]);
    assert!(out.contains("approve by uid 0"), "{out}");
    let (code, err) = finish(child, Duration::from_secs(10));
    assert_eq!(code, 0, "{err}");
    assert_eq!(host_text(&f, "secrets/k"), "key\n");
    pending(&f, 0);
}

#[test]
fn a_new_name_is_refused_at_once_and_its_approved_retry_lands_once() {
    let f = fixture(300);
    let started = Instant::now();
    let (code, err) = finish(shell(&f.p("/host"), "echo key > secrets/k"), Duration::from_secs(10));
    assert!(started.elapsed() < Duration::from_secs(2), "it did not wait: {:?}", started.elapsed());
    assert!(code != 0 && err.contains("Permission denied"), "{code} {err}");
    assert!(!f.host_root.join("secrets/k").exists());
    // The ticket outlives the process that met the rule.
    std::thread::sleep(Duration::from_millis(500));
    let t = pending(&f, 1).remove(0);
    assert_eq!(
        (t["operation"].as_str(), t["path"].as_str()),
        (Some("create"), Some("/host/secrets/k")),
        "{t}"
    );
    assert_eq!(t["retry"], json!(true), "{t}");
    let listed = cli(&f, &["interrupts"]);
    assert!(
        listed.contains("[refused for now; approving lets the next create through] expires in"),
        "{listed}"
    );
    // Trying again before anyone answers opens no second ticket.
    let (code, _) = finish(shell(&f.p("/host"), "echo key > secrets/k"), Duration::from_secs(10));
    assert_ne!(code, 0);
    assert_eq!(pending(&f, 1)[0]["id"], t["id"]);

    let out = cli(&f, &["approve", &t["id"].to_string()]);
    assert!(out.trim_end().ends_with("; the next create by uid 0 passes"), "{out}");
    pending(&f, 0);
    let (code, err) = finish(shell(&f.p("/host"), "echo key > secrets/k"), Duration::from_secs(10));
    assert_eq!(code, 0, "the retry passes: {err}");
    assert_eq!(host_text(&f, "secrets/k"), "key\n");
    // Once: another change of names asks again.
    let (code, _) = finish(shell(&f.p("/host"), "mkdir secrets/d"), Duration::from_secs(10));
    assert_ne!(code, 0);
    let t2 = pending(&f, 1).remove(0);
    assert_eq!((t2["operation"].as_str(), t2["path"].as_str()), (Some("mkdir"), Some("/host/secrets/d")));
    // A rejection leaves nothing behind: the next attempt is refused again, with a new ticket.
    resolve(&f, json!({"id": t2["id"], "decision": "reject"}));
    let (code, _) = finish(shell(&f.p("/host"), "mkdir secrets/d"), Duration::from_secs(10));
    assert_ne!(code, 0);
    let t3 = pending(&f, 1).remove(0);
    assert_ne!(t3["id"], t2["id"]);
    assert!(!f.host_root.join("secrets/d").exists());
    // The audit log tells the story of the file.
    std::thread::sleep(Duration::from_millis(300));
    let decisions = audit_decisions(&f, "/host/secrets/k");
    assert_eq!(decisions.len(), 4, "{decisions:?}");
    assert_eq!(decisions[0], "interrupt-retry");
    assert_eq!(decisions[1], format!("interrupt-retry (#{} pending)", t["id"]));
    assert!(decisions[2].starts_with("approve by uid 0 (pid "), "{decisions:?}");
    assert_eq!(decisions[3], "retried");
}

/// An approval is for the change it names: an approved deletion lets neither a write to the
/// file nor a rename onto its name through in its place, and then lets the deletion through.
#[test]
fn an_approved_deletion_lets_only_that_deletion_through() {
    let f = fixture(300);
    existing(&f, "secrets/k", "old\n");
    existing(&f, "evil", "evil\n");
    let (code, err) = finish(shell(&f.p("/host"), "rm -f secrets/k"), Duration::from_secs(10));
    assert!(code != 0 && err.contains("Permission denied"), "{code} {err}");
    let t = pending(&f, 1).remove(0);
    assert_eq!((t["operation"].as_str(), t["retry"].as_bool()), (Some("unlink"), Some(true)), "{t}");
    let out = cli(&f, &["approve", &t["id"].to_string()]);
    assert!(out.trim_end().ends_with("; the next unlink by uid 0 passes"), "{out}");
    pending(&f, 0);

    // Appending is a change to the file: it asks (and waits) on its own.
    let child = shell(&f.p("/host"), "echo appended >> secrets/k");
    let asked = pending(&f, 1).remove(0);
    assert_eq!(
        (asked["operation"].as_str(), asked["retry"].as_bool()),
        (Some("open"), Some(false)),
        "{asked}"
    );
    resolve(&f, json!({"id": asked["id"], "decision": "reject"}));
    let (code, err) = finish(child, Duration::from_secs(10));
    assert!(code != 0 && err.contains("Permission denied"), "{code} {err}");
    // A rename onto the name is refused at once, with a ticket of its own.
    let (code, err) = finish(shell(&f.p("/host"), "mv -T evil secrets/k"), Duration::from_secs(10));
    assert!(code != 0 && err.contains("Permission denied"), "{code} {err}");
    let renamed = pending(&f, 1).remove(0);
    assert_eq!(renamed["operation"].as_str(), Some("rename"), "{renamed}");
    assert_eq!(host_text(&f, "secrets/k"), "old\n");
    assert_eq!(host_text(&f, "evil"), "evil\n");

    // The deletion that was approved still passes, once.
    let (code, err) = finish(shell(&f.p("/host"), "rm -f secrets/k"), Duration::from_secs(10));
    assert_eq!(code, 0, "{err}");
    assert!(!f.host_root.join("secrets/k").exists());
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(audit_decisions(&f, "/host/secrets/k").last().map(String::as_str), Some("retried"));
}

/// An approved rename is bound to both its paths: the retry may move the file where the
/// approver saw it go, not anywhere else.
#[test]
fn an_approved_rename_lets_only_that_rename_through() {
    let f = fixture(300);
    existing(&f, "secrets/k", "key\n");
    let (code, err) = finish(shell(&f.p("/host"), "mv secrets/k approved"), Duration::from_secs(10));
    assert!(code != 0 && err.contains("Permission denied"), "{code} {err}");
    let t = pending(&f, 1).remove(0);
    assert_eq!(t["operation"].as_str(), Some("rename"), "{t}");
    // The ticket names where the file would go.
    assert_eq!(t["other_path"].as_str(), Some("/host/approved"), "{t}");
    let listed = cli(&f, &["interrupts"]);
    assert!(listed.contains("/host/secrets/k (with /host/approved)"), "{listed}");
    resolve(&f, json!({"id": t["id"], "decision": "approve"}));
    pending(&f, 0);
    // Elsewhere: refused, with a ticket of its own.
    let (code, err) = finish(shell(&f.p("/host"), "mv secrets/k elsewhere"), Duration::from_secs(10));
    assert!(code != 0 && err.contains("Permission denied"), "{code} {err}");
    let other = pending(&f, 1).remove(0);
    assert_ne!(other["id"], t["id"]);
    assert!(!f.host_root.join("elsewhere").exists());
    // Where it was approved to go: through, once.
    let (code, err) = finish(shell(&f.p("/host"), "mv secrets/k approved"), Duration::from_secs(10));
    assert_eq!(code, 0, "{err}");
    assert_eq!(host_text(&f, "approved"), "key\n");
}

/// Renaming a file out from under what guards reading it is judged as reading it: asked under
/// an interrupt rule (and once approved, retried), refused under a `hide = false` denial.
/// Moving into protection, or within it, is not.
#[test]
fn a_file_cannot_be_renamed_out_of_its_read_protection_unasked() {
    named_out_of_read_protection("mv", "rename");
}

/// A hard link gives the file a name outside its read protection as a rename does (`ln
/// ronly/f out; rm ronly/f` is `mv`), so it is asked about the same way.
#[test]
fn a_file_cannot_be_linked_out_of_its_read_protection_unasked() {
    named_out_of_read_protection("ln", "link");
}

/// `command` (`mv` or `ln`) giving a read-guarded file a name outside its protection asks (a
/// ticket for `operation`, class read), or is refused under a `hide = false` denial; giving
/// one into or within protection does not; approved, the retry goes through.
fn named_out_of_read_protection(command: &str, operation: &str) {
    let rules = "[[rules]]\noperations = [\"read\"]\npaths = [\"/host/ronly/**\"]\nmode = \"interrupt\"\n\n\
                 [[rules]]\noperations = [\"read\"]\npaths = [\"/host/shut/**\"]\nmode = \"deny\"\nhide = false\n";
    let f = Fixture::new(&format!("{rules}\n[interrupts]\ntimeout_seconds = 300\n"));
    for dir in ["ronly", "shut"] {
        std::fs::create_dir(f.host_root.join(dir)).unwrap();
    }
    existing(&f, "ronly/f", "guarded\n");
    existing(&f, "shut/g", "shut\n");
    existing(&f, "plain", "plain\n");
    let run = |script: String| finish(shell(&f.p("/host"), &script), Duration::from_secs(10));
    let (code, err) = run(format!("{command} ronly/f out"));
    assert!(code != 0 && err.contains("Permission denied"), "{code} {err}");
    assert!(!f.host_root.join("out").exists());
    let t = pending(&f, 1).remove(0);
    assert_eq!(
        (t["operation"].as_str(), t["class"].as_str(), t["path"].as_str(), t["retry"].as_bool()),
        (Some(operation), Some("read"), Some("/host/ronly/f"), Some(true)),
        "{t}"
    );
    let (code, err) = run(format!("{command} shut/g out2"));
    assert!(code != 0 && err.contains("Permission denied"), "{code} {err}");
    assert!(!f.host_root.join("out2").exists());
    assert_eq!(host_text(&f, "ronly/f"), "guarded\n");
    assert_eq!(host_text(&f, "shut/g"), "shut\n");
    // Into protection, and within it: no question.
    let (code, err) = run(format!("{command} plain ronly/p && {command} ronly/p ronly/q"));
    assert_eq!(code, 0, "{err}");
    assert_eq!(host_text(&f, "ronly/q"), "plain\n");
    // Approved, the retry goes through.
    resolve(&f, json!({"id": t["id"], "decision": "approve"}));
    let (code, err) = run(format!("{command} ronly/f out"));
    assert_eq!(code, 0, "{err}");
    assert_eq!(host_text(&f, "out"), "guarded\n");
}

/// `readlink` under a read interrupt asks every time, as `open` does: the kernel keeps no copy
/// of a link's target that could answer the next call (a second user's, or one after a
/// reload) without the daemon.
#[test]
fn every_readlink_of_a_guarded_link_asks() {
    let rules = "[[rules]]\noperations = [\"read\"]\npaths = [\"/host/ronly/**\"]\nmode = \"interrupt\"\n";
    let f = Fixture::new(&format!("{rules}\n[interrupts]\ntimeout_seconds = 300\n"));
    std::fs::create_dir(f.host_root.join("ronly")).unwrap();
    std::os::unix::fs::symlink("target", f.host_root.join("ronly/lnk")).unwrap();
    let child = shell(&f.p("/host"), "readlink -v ronly/lnk");
    let first = pending(&f, 1).remove(0);
    assert_eq!(
        (first["operation"].as_str(), first["path"].as_str()),
        (Some("readlink"), Some("/host/ronly/lnk"))
    );
    resolve(&f, json!({"id": first["id"], "decision": "approve"}));
    let (code, err) = finish(child, Duration::from_secs(10));
    assert_eq!(code, 0, "{err}");
    let child = shell(&f.p("/host"), "readlink -v ronly/lnk");
    let second = pending(&f, 1).remove(0);
    assert_ne!(second["id"], first["id"]);
    resolve(&f, json!({"id": second["id"], "decision": "reject"}));
    let (code, err) = finish(child, Duration::from_secs(10));
    assert!(code != 0 && err.contains("Permission denied"), "{code} {err}");
}

#[test]
fn a_rejected_write_fails_with_eacces_and_writes_nothing() {
    let f = fixture(300);
    existing(&f, "secrets/k", "old\n");
    let child = shell(&f.p("/host"), "echo key > secrets/k");
    let t = pending(&f, 1).remove(0);
    let out = cli(&f, &["reject", &t["id"].to_string(), "--reason", "not today"]);
    assert!(out.contains("reject by uid 0"), "{out}");
    let (code, err) = finish(child, Duration::from_secs(10));
    assert_ne!(code, 0);
    assert!(err.contains("Permission denied"), "{err}");
    assert_eq!(host_text(&f, "secrets/k"), "old\n");
    // The audit log has the interrupt and who resolved it.
    std::thread::sleep(Duration::from_millis(300));
    let decisions = audit_decisions(&f, "/host/secrets/k");
    assert_eq!(decisions.len(), 2, "{decisions:?}");
    assert_eq!(decisions[0], "interrupt");
    assert!(decisions[1].starts_with("reject by uid 0 (pid "), "{decisions:?}");
}

#[test]
fn an_unanswered_interrupt_times_out() {
    let f = fixture(1);
    existing(&f, "secrets/k", "old\n");
    let started = Instant::now();
    let child = shell(&f.p("/host"), "echo key > secrets/k");
    let (code, err) = finish(child, Duration::from_secs(10));
    assert_ne!(code, 0);
    assert!(err.contains("Permission denied"), "{err}");
    assert!(started.elapsed() >= Duration::from_millis(900), "{:?}", started.elapsed());
    assert_eq!(host_text(&f, "secrets/k"), "old\n");
    // A tool call times out with its own code.
    let mut c = Conn::open(&socket(&f));
    let r = c.result(
        1,
        "tools/call",
        json!({"name": "write_file", "arguments": {"file_path": "/host/secrets/t", "content": "x"}}),
    );
    assert_eq!(r["structuredContent"]["error_code"], "FS_INTERRUPT_TIMEOUT", "{r}");
    assert_eq!(r["isError"], json!(true));
    pending(&f, 0);
}

#[test]
fn two_hundred_paused_writes_do_not_slow_other_work() {
    let f = fixture(300);
    std::fs::write(f.host_root.join("readme"), "hello").unwrap();
    // Existing files: the kernel holds a directory's lock across a create, so creates in one
    // directory queue in the kernel behind a paused one; opens do not.
    for i in 0..200 {
        std::fs::write(f.host_root.join(format!("secrets/f{i}")), "").unwrap();
    }
    let writers: Vec<_> = (0..200)
        .map(|i| {
            let path = f.p(&format!("/host/secrets/f{i}"));
            std::thread::spawn(move || std::fs::write(path, format!("{i}")))
        })
        .collect();
    let list = pending(&f, 200);
    // Unrelated reads stay fast while every write waits.
    let started = Instant::now();
    for _ in 0..200 {
        assert_eq!(std::fs::read_to_string(f.p("/host/readme")).unwrap(), "hello");
        std::fs::metadata(f.p("/mem")).unwrap();
    }
    std::fs::write(f.p("/mem/free"), "ok").unwrap();
    assert!(started.elapsed() < Duration::from_secs(3), "reads took {:?}", started.elapsed());
    let mut c = Conn::open(&socket(&f));
    for (i, t) in list.iter().enumerate() {
        c.result(100 + i as u64, "interrupts/resolve", json!({"id": t["id"], "decision": "approve"}));
    }
    for w in writers {
        w.join().unwrap().unwrap();
    }
    for i in 0..200 {
        assert_eq!(
            std::fs::read_to_string(f.host_root.join(format!("secrets/f{i}"))).unwrap(),
            format!("{i}")
        );
    }
}

#[test]
fn a_session_approval_covers_a_recursive_copy() {
    let f = fixture(300);
    let src = f.scratch.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    for i in 0..50 {
        let dir = if i % 2 == 0 { src.clone() } else { src.join("sub") };
        std::fs::write(dir.join(format!("file{i}")), format!("content {i}\n")).unwrap();
    }
    let copy = format!("cp -r {} secrets/dst", src.display());
    let (code, _) = finish(shell(&f.p("/host"), &copy), Duration::from_secs(10));
    assert_ne!(code, 0, "the first mkdir is refused until approved");
    let t = pending(&f, 1).remove(0);
    assert_eq!((t["operation"].as_str(), t["path"].as_str()), (Some("mkdir"), Some("/host/secrets/dst")));
    let said = cli(&f, &["approve", &t["id"].to_string(), "--scope", "session"]);
    // The approver is told what the session grant opens.
    assert!(
        said.trim_end().ends_with(
            "; for this session every write by uid 0 at or beneath /host/secrets/dst passes, guarded there by: /host/secrets/**"
        ),
        "{said}"
    );
    let (code, err) = finish(shell(&f.p("/host"), &copy), Duration::from_secs(20));
    assert_eq!(code, 0, "{err}");
    for i in 0..50 {
        let rel =
            if i % 2 == 0 { format!("secrets/dst/file{i}") } else { format!("secrets/dst/sub/file{i}") };
        assert_eq!(std::fs::read_to_string(f.host_root.join(rel)).unwrap(), format!("content {i}\n"));
    }
    pending(&f, 0);
    // The grant is its user's: another user's write there still asks.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(f.host_root.join("secrets/dst"), std::fs::Permissions::from_mode(0o777))
        .unwrap();
    let other = "setpriv --reuid=65534 --regid=65534 --clear-groups sh -c 'echo x > secrets/dst/by-nobody'";
    assert_ne!(finish(shell(&f.p("/host"), other), Duration::from_secs(10)).0, 0);
    let t = pending(&f, 1).remove(0);
    assert_eq!((t["path"].as_str(), t["uid"].as_u64()), (Some("/host/secrets/dst/by-nobody"), Some(65534)));
    resolve(&f, json!({"id": t["id"], "decision": "reject"}));
    // Outside the granted directory a write still asks; a reload ends the grant.
    assert_ne!(finish(shell(&f.p("/host"), "echo x > secrets/elsewhere"), Duration::from_secs(10)).0, 0);
    let t = pending(&f, 1).remove(0);
    assert_eq!(t["path"], "/host/secrets/elsewhere");
    resolve(&f, json!({"id": t["id"], "decision": "reject"}));
    Conn::open(&socket(&f)).result(3, "vfs/reload", json!({}));
    assert_ne!(finish(shell(&f.p("/host"), "echo x > secrets/dst/again"), Duration::from_secs(10)).0, 0);
    let t = pending(&f, 1).remove(0);
    assert_eq!(t["path"], "/host/secrets/dst/again");
    resolve(&f, json!({"id": t["id"], "decision": "reject"}));
}

/// Starts `write_file` on `conn` (request id 1) and returns the ticket once it is pending;
/// meanwhile the same connection answers another request.
fn paused_write(f: &Fixture, conn: &mut Conn, path: &str) -> Value {
    conn.send(
        1,
        "tools/call",
        json!({"name": "write_file", "arguments": {"file_path": path, "content": "original"}}),
    );
    let t = pending(f, 1).remove(0);
    let status = conn.result(2, "vfs/status", json!({}));
    assert_eq!(status["pending_interrupts"], json!(1), "the connection keeps working");
    assert_eq!(t["door"], "tool");
    assert_eq!(t["tool"]["name"], "write_file");
    assert_eq!(t["tool"]["arguments"]["file_path"], path);
    t
}

pub(crate) fn text(result: &Value) -> String {
    result["content"][0]["text"].as_str().unwrap_or("").to_string()
}

#[test]
fn tool_calls_wait_and_every_decision_does_its_part() {
    let f = fixture(300);
    let mut c = Conn::open(&socket(&f));

    // approve: runs as proposed.
    let t = paused_write(&f, &mut c, "/host/secrets/a");
    resolve(&f, json!({"id": t["id"], "decision": "approve"}));
    let r = c.reply(1)["result"].clone();
    assert_eq!(r["isError"], json!(false), "{r}");
    assert_eq!(std::fs::read_to_string(f.host_root.join("secrets/a")).unwrap(), "original");

    // reject, with and without a reason.
    let t = paused_write(&f, &mut c, "/host/secrets/b");
    resolve(&f, json!({"id": t["id"], "decision": "reject", "message": "not now"}));
    let r = c.reply(1)["result"].clone();
    assert_eq!(text(&r), "User rejected the tool call for `write_file` with reason: not now");
    assert_eq!(r["structuredContent"]["error_code"], "FS_INTERRUPT_REJECTED");
    assert!(!f.host_root.join("secrets/b").exists());
    let t = paused_write(&f, &mut c, "/host/secrets/b");
    resolve(&f, json!({"id": t["id"], "decision": "reject"}));
    let r = c.reply(1)["result"].clone();
    assert_eq!(
        text(&r),
        format!("User rejected the tool call for `write_file` with id {}. The tool was not executed. Do not retry this tool call unless the user explicitly requests it.", t["id"])
    );

    // edit: the replaced arguments run, and the result says so.
    let t = paused_write(&f, &mut c, "/host/secrets/c");
    let edited = json!({"file_path": "/host/secrets/d", "content": "edited"});
    resolve(&f, json!({"id": t["id"], "decision": "edit", "arguments": edited}));
    let r = c.reply(1)["result"].clone();
    assert_eq!(r["isError"], json!(false), "{r}");
    assert!(text(&r).starts_with("Note: a human reviewer replaced this tool call before it ran. The call recorded in your message is the one you produced, not the one that executed. This was intentional and authorized. Do not re-issue your original call. Executed instead: write_file with arguments {\"content\": \"edited\", \"file_path\": \"/host/secrets/d\"}.\n\nTool response:\n"), "{r}");
    assert!(!f.host_root.join("secrets/c").exists());
    assert_eq!(std::fs::read_to_string(f.host_root.join("secrets/d")).unwrap(), "edited");

    // respond: nothing runs; the message is the result.
    let t = paused_write(&f, &mut c, "/host/secrets/e");
    resolve(&f, json!({"id": t["id"], "decision": "respond", "message": "I wrote it myself"}));
    let r = c.reply(1)["result"].clone();
    assert_eq!((text(&r).as_str(), &r["isError"]), ("I wrote it myself", &json!(false)));
    assert!(!f.host_root.join("secrets/e").exists());

    // Edit and respond make no sense for a syscall.
    let child = shell(&f.p("/host"), "echo x > secrets/s");
    let t = pending(&f, 1).remove(0);
    let mut o = Conn::open(&socket(&f));
    o.send(1, "interrupts/resolve", json!({"id": t["id"], "decision": "respond", "message": "m"}));
    assert!(o.reply(1)["error"]["message"].as_str().unwrap().contains("syscall"));
    resolve(&f, json!({"id": t["id"], "decision": "reject"}));
    finish(child, Duration::from_secs(10));
}

#[test]
fn an_edit_cannot_smuggle_a_denied_path() {
    let f = fixture(300);
    let mut c = Conn::open(&socket(&f));
    let t = paused_write(&f, &mut c, "/host/secrets/a");
    let edited = json!({"file_path": "/host/private/x", "content": "sneaky"});
    resolve(&f, json!({"id": t["id"], "decision": "edit", "arguments": edited}));
    let r = c.reply(1)["result"].clone();
    assert_eq!(r["isError"], json!(true), "{r}");
    assert_eq!(r["structuredContent"]["error_code"], "FS_PERMISSION_DENIED", "{r}");
    assert!(text(&r).contains("Error: permission denied for write on /host/private/x"), "{r}");
    assert!(!f.host_root.join("private/x").exists());
    assert!(!f.host_root.join("secrets/a").exists());
}

#[test]
fn a_subscriber_hears_interrupts_appear_and_resolve() {
    let f = fixture(300);
    let mut s = Conn::open(&socket(&f));
    let first = s.result(1, "interrupts/subscribe", json!({}));
    assert_eq!(first["interrupts"], json!([]));
    existing(&f, "secrets/k", "");
    existing(&f, "secrets/w", "");
    let child = shell(&f.p("/host"), "echo key > secrets/k");
    let created = s.recv();
    assert_eq!(created["method"], "notifications/interrupt", "{created}");
    assert_eq!(created["params"]["event"], "created");
    assert_eq!(created["params"]["interrupt"]["path"], "/host/secrets/k");
    assert_eq!(created["params"]["interrupt"]["pid"], json!(child.id()));
    let id = created["params"]["interrupt"]["id"].clone();
    resolve(&f, json!({"id": id, "decision": "approve"}));
    let resolved = s.recv();
    assert_eq!(resolved["params"]["event"], "resolved", "{resolved}");
    assert_eq!(resolved["params"]["interrupt"]["id"], id);
    assert_eq!(resolved["params"]["interrupt"]["decision"], "approve");
    assert!(resolved["params"]["interrupt"]["resolved_by"].as_str().unwrap().starts_with("uid 0"));
    assert_eq!(finish(child, Duration::from_secs(10)).0, 0);
    // The subscription's connection still answers requests.
    assert_eq!(s.result(2, "ping", json!({})), json!({}));

    // `agentvfs interrupts --watch` prints each request as it comes.
    let mut watch = Command::new(BIN)
        .args(["interrupts", "--watch", "--socket"])
        .arg(socket(&f))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    std::thread::sleep(Duration::from_millis(300));
    let child = shell(&f.p("/host"), "echo key > secrets/w");
    let line = lines.next().unwrap().unwrap();
    assert!(
        line.contains(&format!(
            "write /host/secrets/w by pid {} uid 0 via the mount (sh -c echo key > secrets/w) expires in",
            child.id()
        )),
        "{line}"
    );
    let t = pending(&f, 1).remove(0);
    resolve(&f, json!({"id": t["id"], "decision": "reject"}));
    let line = lines.next().unwrap().unwrap();
    assert!(
        line.ends_with(&format!("#{} write /host/secrets/w: reject by uid 0", t["id"]))
            || line.contains(": reject by uid 0"),
        "{line}"
    );
    finish(child, Duration::from_secs(10));
    let _ = watch.kill();
    let _ = watch.wait();
}

#[test]
fn a_tool_call_through_a_symlink_names_the_link_and_the_guarded_target() {
    let f = fixture(300);
    std::fs::write(f.host_root.join("secrets/f"), "old").unwrap();
    std::os::unix::fs::symlink("secrets/f", f.host_root.join("link")).unwrap();
    std::os::unix::fs::symlink("secrets", f.host_root.join("linkdir")).unwrap();
    let mut s = Conn::open(&socket(&f));
    s.result(1, "interrupts/subscribe", json!({}));
    let mut c = Conn::open(&socket(&f));
    let write =
        |path: &str| json!({"name": "write_file", "arguments": {"file_path": path, "content": "new"}});
    c.send(1, "tools/call", write("/host/link"));
    let t = pending(&f, 1).remove(0);
    assert_eq!(
        (t["path"].as_str(), t["resolved"].as_str()),
        (Some("/host/link"), Some("/host/secrets/f")),
        "{t}"
    );
    assert_eq!(t["rule"], json!(0), "the rule that matched the target: {t}");
    let created = s.recv();
    assert_eq!(created["params"]["interrupt"]["resolved"], "/host/secrets/f", "{created}");
    let shown = cli(&f, &["interrupts"]);
    let want = format!("#{} write /host/link (-> /host/secrets/f) by tool write_file ", t["id"]);
    assert!(shown.starts_with(&want), "{shown}");
    resolve(&f, json!({"id": t["id"], "decision": "approve"}));
    assert_eq!(c.reply(1)["result"]["isError"], json!(false));
    assert_eq!(std::fs::read_to_string(f.host_root.join("secrets/f")).unwrap(), "new");
    // Through a linked directory, to a file not there yet.
    c.send(2, "tools/call", write("/host/linkdir/g"));
    let t = pending(&f, 1).remove(0);
    assert_eq!(
        (t["path"].as_str(), t["resolved"].as_str()),
        (Some("/host/linkdir/g"), Some("/host/secrets/g"))
    );
    resolve(&f, json!({"id": t["id"], "decision": "reject"}));
    c.reply(2);
    // A direct path has no `resolved`.
    c.send(3, "tools/call", write("/host/secrets/h"));
    let t = pending(&f, 1).remove(0);
    assert!(t.get("resolved").is_none(), "{t}");
    assert!(!cli(&f, &["interrupts"]).contains("(->"));
    resolve(&f, json!({"id": t["id"], "decision": "reject"}));
    c.reply(3);
    // The audit log has the target as the path; the arguments name the link.
    std::thread::sleep(Duration::from_millis(300));
    let db = rusqlite::Connection::open(f.scratch.path().join("audit.db")).unwrap();
    let (path, command): (String, String) = db
        .query_row(
            "SELECT path, command FROM audit WHERE decision = 'interrupt' ORDER BY id LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(path, "/host/secrets/f");
    assert!(
        command.starts_with("write_file ") && command.contains(r#""file_path":"/host/link""#),
        "{command}"
    );
}

/// An approval is for the file the approver was shown: a symlink swapped after it leads the
/// call elsewhere, where the rule still holds. A session approval through a link grants the
/// directory the link leads into, not the link's own.
#[test]
fn an_approved_tool_call_acts_only_where_its_link_led() {
    let guard2 = "[[rules]]\noperations = [\"write\"]\npaths = [\"/host/guard2/**\"]\nmode = \"interrupt\"\n";
    let f = Fixture::new(&format!("{RULES}\n{guard2}\n[interrupts]\ntimeout_seconds = 300\n"));
    for dir in ["secrets", "guard2"] {
        std::fs::create_dir_all(f.host_root.join(dir)).unwrap();
    }
    std::fs::write(f.host_root.join("secrets/harmless"), "h").unwrap();
    std::fs::write(f.host_root.join("secrets/important"), "i").unwrap();
    let link = f.host_root.join("link");
    std::os::unix::fs::symlink("secrets/harmless", &link).unwrap();
    let mut c = Conn::open(&socket(&f));
    let args = json!({"file_path": "/host/link", "content": "AGENT"});
    let deferred = c.result(1, "tools/call", json!({"name": "write_file", "arguments": args, "wait": false}));
    let id = deferred["structuredContent"]["interrupt_id"].clone();
    let t = pending(&f, 1).remove(0);
    assert_eq!(
        (t["id"].clone(), t["resolved"].as_str()),
        (id.clone(), Some("/host/secrets/harmless")),
        "{t}"
    );
    resolve(&f, json!({"id": id, "decision": "approve"}));
    // Swapped after the approval, before the call finishes.
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink("secrets/important", &link).unwrap();
    let done = c.result(2, "tools/call", json!({"name": "write_file", "arguments": args, "ticket": id}));
    assert_eq!(done["isError"], json!(true), "{done}");
    assert_eq!(host_text(&f, "secrets/important"), "i");
    assert_eq!(host_text(&f, "secrets/harmless"), "h");

    // A session approval through the link grants /host/secrets, not /host.
    c.send(3, "tools/call", json!({"name": "write_file", "arguments": args}));
    let t = pending(&f, 1).remove(0);
    assert_eq!(t["resolved"].as_str(), Some("/host/secrets/important"), "{t}");
    resolve(&f, json!({"id": t["id"], "decision": "approve", "scope": "session"}));
    assert_eq!(c.reply(3)["result"]["isError"], json!(false));
    assert_eq!(host_text(&f, "secrets/important"), "AGENT");
    let (code, err) = finish(shell(&f.p("/host"), "echo x > secrets/new"), Duration::from_secs(10));
    assert_eq!(code, 0, "the directory the link led into is granted: {err}");
    let (code, err) = finish(shell(&f.p("/host"), "echo x > guard2/new"), Duration::from_secs(10));
    assert!(code != 0 && err.contains("Permission denied"), "the link's own directory is not: {code} {err}");
    assert_eq!(pending(&f, 1)[0]["path"].as_str(), Some("/host/guard2/new"));
}

#[test]
fn listing_a_directory_under_an_interrupt_read_rule_asks_once() {
    let f = Fixture::new(
        "[[rules]]\noperations = [\"read\"]\npaths = [\"/host/secrets/**\"]\nmode = \"interrupt\"\n",
    );
    std::fs::create_dir_all(f.host_root.join("secrets")).unwrap();
    for i in 0..5 {
        std::fs::write(f.host_root.join(format!("secrets/f{i}")), format!("{i}")).unwrap();
    }
    let child = shell(&f.p("/host"), "ls secrets");
    let t = pending(&f, 1).remove(0);
    assert_eq!((t["operation"].as_str(), t["path"].as_str()), (Some("readdir"), Some("/host/secrets")));
    resolve(&f, json!({"id": t["id"], "decision": "approve"}));
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "f0\nf1\nf2\nf3\nf4\n");
    // Stat needs no approval; reading the content does.
    assert_eq!(std::fs::metadata(f.p("/host/secrets/f1")).unwrap().len(), 1);
    let child = shell(&f.p("/host"), "cat secrets/f3");
    let t = pending(&f, 1).remove(0);
    assert_eq!((t["operation"].as_str(), t["class"].as_str()), (Some("open"), Some("read")));
    resolve(&f, json!({"id": t["id"], "decision": "approve"}));
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "3");
}

#[test]
fn stopping_the_daemon_answers_paused_callers() {
    let mut f = fixture(300);
    existing(&f, "secrets/k", "");
    let child = shell(&f.p("/host"), "echo key > secrets/k");
    pending(&f, 1);
    let status = f.mount.stop_with(libc::SIGTERM);
    assert!(status.success(), "{}", f.mount.log_text());
    let (code, err) = finish(child, Duration::from_secs(10));
    assert_ne!(code, 0);
    assert!(err.contains("Permission denied"), "{err}");
}

#[test]
fn a_command_run_by_execute_pauses_on_the_same_rules() {
    use std::os::unix::fs::PermissionsExt;
    let f =
        Fixture::new(&format!("{RULES}\n[exec]\nenabled = true\ncwd = \"/host\"\ntimeout_seconds = 30\n"));
    let secrets = f.host_root.join("secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    // The sandbox runs as nobody; the kernel checks modes on the mount.
    std::fs::write(secrets.join("k"), "").unwrap();
    for (path, mode) in [(f.host_root.clone(), 0o777), (secrets.join("k"), 0o666), (secrets, 0o777)] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let mut c = Conn::open(&socket(&f));
    c.send(
        1,
        "tools/call",
        json!({"name": "execute", "arguments": {"command": "echo key > secrets/k && echo done"}}),
    );
    let t = pending(&f, 1).remove(0);
    assert_eq!((t["door"].as_str(), t["path"].as_str()), (Some("fuse"), Some("/host/secrets/k")), "{t}");
    assert!(t["command"].as_str().unwrap().contains("echo key > secrets/k"), "{t}");
    resolve(&f, json!({"id": t["id"], "decision": "approve"}));
    let r = c.reply(1)["result"].clone();
    assert!(text(&r).starts_with("done"), "{r}");
    assert_eq!(std::fs::read_to_string(f.host_root.join("secrets/k")).unwrap(), "key\n");
}

/// True when `text` holds nothing a terminal would act on: no C0 control but the line end, no
/// DEL, no C1 control.
fn inert(text: &str) -> bool {
    text.chars().all(|c| c == '\n' || !(c < ' ' || ('\u{7f}'..='\u{9f}').contains(&c)))
}

#[test]
fn a_forged_command_line_cannot_change_what_the_approver_sees() {
    use std::os::unix::process::CommandExt;
    // A daemon logging at info, so the audit event with the command line reaches its log.
    let u = crate::harness::unmounted(&format!("{RULES}\n[interrupts]\ntimeout_seconds = 300\n"));
    let mount = crate::harness::Mount::try_start_logging(&u.config, &u.scratch.path().join("mnt"), "info")
        .unwrap_or_else(|e| panic!("{e}"));
    let f = Fixture { mount, scratch: u.scratch, host_root: u.host_root };
    std::fs::create_dir_all(f.host_root.join("secrets")).unwrap();
    existing(&f, "secrets/k", "");
    // argv[0] moves the cursor home, erases the line and starts a forged ticket of its own.
    let forged = "evil\r\x1b[2K\n#99 write /host/forged by pid 1";
    let child = Command::new("sh")
        .arg0(forged)
        .args(["-c", "echo x > secrets/k"])
        .current_dir(f.p("/host"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = pending(&f, 1).remove(0);
    let command = format!("{forged} -c echo x > secrets/k");
    // The JSON carries the true command line; JSON's own escaping keeps it unambiguous.
    assert_eq!(t["command"], json!(command), "{t}");

    let listed = cli(&f, &["interrupts"]);
    assert!(inert(&listed), "{listed:?}");
    assert_eq!(listed.matches('\n').count(), 1, "{listed:?}");
    let shown = r"evil\r\x1b[2K\n#99 write /host/forged by pid 1 - ...";
    assert!(
        listed.starts_with(&format!(
            "#{} write /host/secrets/k by pid {} uid 0 via the mount ({shown}) expires in ",
            t["id"],
            child.id()
        )),
        "{listed:?}"
    );

    // `--watch` shows the same line, then the resolution, each on a line of its own.
    let mut watch = Command::new(BIN)
        .args(["interrupts", "--watch", "--socket"])
        .arg(socket(&f))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(
        inert(&first)
            && first.starts_with(&format!("#{} write /host/secrets/k by pid {}", t["id"], child.id())),
        "{first:?}"
    );
    assert!(first.contains(shown), "{first:?}");
    let out = cli(&f, &["reject", &t["id"].to_string(), "--reason", "no\r\x1b[2K"]);
    assert!(
        inert(&out) && out.starts_with(&format!("#{} write /host/secrets/k: reject by uid 0", t["id"])),
        "{out:?}"
    );
    let resolved = lines.next().unwrap().unwrap();
    assert!(
        inert(&resolved)
            && resolved.starts_with(&format!("#{} write /host/secrets/k: reject by uid 0", t["id"])),
        "{resolved:?}"
    );
    let _ = watch.kill();
    let _ = watch.wait();
    let (code, err) = finish(child, Duration::from_secs(10));
    assert_ne!(code, 0);
    assert!(err.contains("Permission denied"), "{err}");

    // The daemon's log has the command line escaped, and no raw control character at all.
    let escaped = r"evil\r\x1b[2K\n#99 write /host/forged by pid 1 -c echo x > secrets/k";
    crate::harness::soon("the audit event in the log", || f.mount.log_text().contains(escaped));
    let log = f.mount.log_text();
    assert!(inert(&log), "{log:?}");
    assert!(!log.contains("\n#99"), "{log}");
    // The audit table keeps the true command line, for machines.
    let db = rusqlite::Connection::open(f.scratch.path().join("audit.db")).unwrap();
    let mut recorded = String::new();
    crate::harness::soon("the audit row", || {
        db.query_row("SELECT command FROM audit WHERE decision = 'interrupt'", [], |r| r.get::<_, String>(0))
            .is_ok()
    });
    db.query_row("SELECT command FROM audit WHERE decision = 'interrupt'", [], |r| r.get(0))
        .map(|c: String| recorded = c)
        .unwrap();
    assert_eq!(recorded, command);
}

#[path = "interrupts_gone.rs"]
mod callers_gone;
