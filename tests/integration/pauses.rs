//! Paused operations from their caller's side: a signal (Ctrl-C, SIGTERM) ends the wait at
//! once, withdraws the ticket, and changes nothing.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::Fixture;

const RULES: &str = r#"
[[rules]]
operations = ["write"]
paths = ["/host/secrets/**"]
mode = "interrupt"

[interrupts]
timeout_seconds = 300
"#;

/// The pending approvals.
fn listed(f: &Fixture) -> Vec<Value> {
    let mut client =
        agentvfs::control::client::Client::connect(&f.scratch.path().join("agentvfs.sock")).unwrap();
    client.call("interrupts/list", Some(json!({}))).unwrap()["interrupts"].as_array().unwrap().clone()
}

fn shell(cwd: &Path, script: &str) -> Child {
    with_default_sigint(Command::new("sh").arg("-c").arg(script).current_dir(cwd).stdin(Stdio::null()))
        .spawn()
        .unwrap()
}

/// `command` with SIGINT at its default action, whatever this process has: a test run in the
/// background of a shell without job control (`cargo test &` in a script) inherits SIGINT
/// ignored, and a shell that starts with it ignored may not take it back, so Ctrl-C would
/// never reach the paused program.
fn with_default_sigint(command: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: `signal` is async-signal-safe, as `pre_exec` requires.
    unsafe {
        command.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        })
    }
}

fn wait_until(what: &str, within: Duration, mut check: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < within, "not within {within:?}: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
    start.elapsed()
}

#[test]
fn a_signal_ends_a_paused_operation_and_its_ticket() {
    let f = Fixture::new(RULES);
    std::fs::create_dir_all(f.host_root.join("secrets")).unwrap();
    for name in ["a", "b", "c", "p"] {
        std::fs::write(f.host_root.join("secrets").join(name), "old").unwrap();
    }
    // Changes to existing files pause (changes of names are refused at once instead).
    for (signal, script) in [
        (libc::SIGINT, "echo key > secrets/a"),
        (libc::SIGTERM, "exec truncate -s 0 secrets/b"),
        (libc::SIGINT, "exec chmod 600 secrets/c"),
    ] {
        let mut child = shell(&f.p("/host"), script);
        wait_until("the ticket", Duration::from_secs(10), || listed(&f).len() == 1);
        // The shell itself (or the program it execs) is the process that waits.
        unsafe { libc::kill(child.id() as i32, signal) };
        let took = wait_until("the caller stops waiting", Duration::from_secs(3), || {
            child.try_wait().unwrap().is_some()
        });
        assert!(took < Duration::from_secs(2), "{script}: took {took:?}");
        wait_until(&format!("the ticket is gone: {:?}", listed(&f)), Duration::from_secs(2), || {
            listed(&f).is_empty()
        });
        for name in ["a", "b", "c"] {
            let path = f.host_root.join("secrets").join(name);
            assert_eq!(std::fs::read_to_string(&path).unwrap(), "old", "{script}");
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o644, "{script}");
        }
    }
    // A program that handles the signal gets EINTR from its call and carries on (here: exits
    // with a code of its own), where the kernel alone would keep it waiting for the human.
    let script =
        "import signal, sys\nsignal.signal(signal.SIGINT, lambda *a: sys.exit(7))\nopen('secrets/p', 'w')";
    let mut child =
        with_default_sigint(Command::new("/usr/bin/python3").args(["-c", script]).current_dir(f.p("/host")))
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
    wait_until("the ticket", Duration::from_secs(10), || listed(&f).len() == 1);
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    wait_until("the program handles the signal", Duration::from_secs(3), || {
        child.try_wait().unwrap().is_some()
    });
    assert_eq!(child.wait().unwrap().code(), Some(7));
    wait_until("the ticket is gone", Duration::from_secs(2), || listed(&f).is_empty());
    assert_eq!(std::fs::read_to_string(f.host_root.join("secrets/p")).unwrap(), "old");
    // The audit log says how each ended.
    let db = rusqlite::Connection::open(f.scratch.path().join("audit.db")).unwrap();
    crate::harness::soon("four interrupted tickets in the audit log", || {
        db.query_row("SELECT count(*) FROM audit WHERE decision LIKE 'interrupted%'", [], |r| {
            r.get::<_, i64>(0)
        })
        .is_ok_and(|n| n == 4)
    });
}

/// Changes of names under `guarded*` in `/host/ws` ask a human, and so do changes to the
/// files there.
const WORKSPACE_RULES: &str = r#"
[[rules]]
operations = ["write"]
paths = ["/host/ws/guarded*", "/host/ws/guarded*/**"]
mode = "interrupt"

[interrupts]
timeout_seconds = 300
"#;

/// Runs `script` in `cwd` to its end: (how long it took, exit code). A script still running
/// after 5 s is killed and fails the test: it was waiting behind something.
fn timed(cwd: &Path, script: &str) -> (Duration, i32) {
    let started = Instant::now();
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (started.elapsed(), status.code().unwrap_or(-1));
        }
        if started.elapsed() > Duration::from_secs(5) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`{script}` was still waiting after 5 s");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// What other processes do in a directory while approvals are pending there; each must
/// succeed.
const NEIGHBOURS: [&str; 9] = [
    "ls -la >/dev/null",
    "stat cached.txt",
    "! stat not-there-{n}",
    "touch other-{n}.txt",
    "rm other-{n}.txt",
    "mkdir d-{n} && rmdir d-{n}",
    "mv a.txt b.txt && mv b.txt a.txt",
    "cat cached.txt >/dev/null",
    "ln -s a.txt l-{n} && rm l-{n}",
];

#[test]
fn pending_approvals_freeze_nothing_in_their_directory() {
    let f = Fixture::new(WORKSPACE_RULES);
    let ws = f.host_root.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    for name in ["guarded-a", "guarded-b", "guarded-old", "plain", "cached.txt", "a.txt"] {
        std::fs::write(ws.join(name), "old").unwrap();
    }
    let dir = f.p("/host/ws");
    std::fs::metadata(dir.join("cached.txt")).unwrap();
    let baseline: Vec<Duration> = NEIGHBOURS.iter().map(|s| timed(&dir, &s.replace("{n}", "0")).0).collect();

    // Paused: changes to two existing files, and a tool call writing a new name.
    let writer = shell(&dir, "echo new > guarded-a");
    let truncater = shell(&dir, "exec truncate -s 0 guarded-b");
    let mut tool =
        agentvfs::control::client::Client::connect(&f.scratch.path().join("agentvfs.sock")).unwrap();
    let (tx, tool_result) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = tool.call(
            "tools/call",
            Some(json!({"name": "write_file", "arguments": {"file_path": "/host/ws/guarded-tool", "content": "t"}})),
        );
        let _ = tx.send(r.map_err(|e| e.to_string()));
    });
    wait_until("three paused operations", Duration::from_secs(10), || listed(&f).len() == 3);

    // Changes of names answer at once: refused, each leaving a ticket.
    let changes = [
        ("echo x > guarded-new", "create", "guarded-new"),
        ("mkdir guarded-dir", "mkdir", "guarded-dir"),
        ("rm guarded-old", "unlink", "guarded-old"),
        ("mv plain guarded-moved", "rename", "guarded-moved"),
        ("ln plain guarded-link", "link", "guarded-link"),
        ("ln -s plain guarded-sym", "symlink", "guarded-sym"),
        ("mkfifo guarded-fifo", "mknod", "guarded-fifo"),
    ];
    for (script, _, _) in changes {
        let (took, code) = timed(&dir, script);
        assert!(code != 0 && took < Duration::from_secs(1), "`{script}`: exit {code} after {took:?}");
    }
    wait_until("ten tickets", Duration::from_secs(5), || listed(&f).len() == 10);

    // Meanwhile every other operation in the directory answers as quickly as before.
    for (script, before) in NEIGHBOURS.iter().zip(&baseline) {
        let script = script.replace("{n}", "1");
        let (took, code) = timed(&dir, &script);
        assert_eq!(code, 0, "`{script}`");
        eprintln!("{script:40} {before:>12.1?} with none pending, {took:>12.1?} with ten");
        assert!(took < Duration::from_secs(1), "`{script}` took {took:?} (before: {before:?})");
    }
    // Nothing changed yet.
    assert_eq!(std::fs::read_to_string(ws.join("guarded-a")).unwrap(), "old");
    assert_eq!(std::fs::read_to_string(ws.join("guarded-b")).unwrap(), "old");
    for (_, _, name) in changes.iter().filter(|(_, operation, _)| *operation != "unlink") {
        assert!(std::fs::symlink_metadata(ws.join(name)).is_err(), "{name}");
    }
    assert!(ws.join("guarded-old").exists() && ws.join("plain").exists());

    // The approver's decisions do exactly what was asked.
    let tickets = listed(&f);
    for (script, operation, name) in changes {
        let t = tickets.iter().find(|t| t["path"] == format!("/host/ws/{name}")).expect(script);
        assert_eq!((t["operation"].as_str(), &t["retry"]), (Some(operation), &json!(true)), "{t}");
    }
    let ticket = |operation: &str, path: &str| {
        tickets
            .iter()
            .find(|t| t["operation"] == operation && t["path"] == path)
            .unwrap_or_else(|| panic!("no ticket for {operation} {path}: {tickets:?}"))["id"]
            .clone()
    };
    let mut approver =
        agentvfs::control::client::Client::connect(&f.scratch.path().join("agentvfs.sock")).unwrap();
    let mut answer = |id: Value, decision: &str| {
        approver.call("interrupts/resolve", Some(json!({"id": id, "decision": decision}))).unwrap();
    };
    answer(ticket("open", "/host/ws/guarded-a"), "approve");
    answer(ticket("open", "/host/ws/guarded-b"), "reject");
    answer(ticket("write_file", "/host/ws/guarded-tool"), "approve");
    answer(ticket("mkdir", "/host/ws/guarded-dir"), "approve");
    answer(ticket("rename", "/host/ws/guarded-moved"), "approve");
    answer(ticket("unlink", "/host/ws/guarded-old"), "reject");
    let status = |mut child: Child| child.wait().unwrap().code();
    assert_eq!(status(writer), Some(0));
    assert_ne!(status(truncater), Some(0));
    let result = tool_result.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!(result["isError"], json!(false), "{result}");
    assert_eq!(std::fs::read_to_string(ws.join("guarded-a")).unwrap(), "new\n");
    assert_eq!(std::fs::read_to_string(ws.join("guarded-b")).unwrap(), "old");
    assert_eq!(std::fs::read_to_string(ws.join("guarded-tool")).unwrap(), "t");
    // An approved change of names passes when it is tried again, once; a rejected one is
    // refused again, with a new ticket.
    assert_eq!(timed(&dir, "mkdir guarded-dir").1, 0);
    assert!(ws.join("guarded-dir").is_dir());
    assert_eq!(timed(&dir, "mv plain guarded-moved").1, 0);
    assert_eq!(std::fs::read_to_string(ws.join("guarded-moved")).unwrap(), "old");
    assert_ne!(timed(&dir, "rmdir guarded-dir").1, 0, "the approval held once");
    assert_ne!(timed(&dir, "rm guarded-old").1, 0);
    assert!(ws.join("guarded-old").exists() && ws.join("guarded-dir").is_dir());
    let now = listed(&f);
    assert!(now.iter().any(|t| t["operation"] == "rmdir"), "{now:?}");
    assert_eq!(now.iter().filter(|t| t["operation"] == "unlink").count(), 1, "{now:?}");
}

#[test]
fn an_approved_retry_is_only_for_the_user_who_asked() {
    use std::os::unix::fs::PermissionsExt as _;
    let f = Fixture::new(WORKSPACE_RULES);
    let ws = f.host_root.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::set_permissions(&ws, std::fs::Permissions::from_mode(0o777)).unwrap();
    let dir = f.p("/host/ws");
    let as_nobody = "setpriv --reuid=65534 --regid=65534 --clear-groups mkdir guarded-d";
    assert_ne!(timed(&dir, as_nobody).1, 0);
    let t = listed(&f).remove(0);
    assert_eq!(
        (&t["uid"], &t["operation"], &t["retry"]),
        (&json!(65534), &json!("mkdir"), &json!(true)),
        "{t}"
    );
    let mut approver =
        agentvfs::control::client::Client::connect(&f.scratch.path().join("agentvfs.sock")).unwrap();
    approver.call("interrupts/resolve", Some(json!({"id": t["id"], "decision": "approve"}))).unwrap();
    // Root trying the same change does not ride on nobody's approval: it gets a ticket of its own.
    assert_ne!(timed(&dir, "mkdir guarded-d").1, 0);
    let now = listed(&f);
    assert_eq!(now.len(), 1, "{now:?}");
    assert_eq!(now[0]["uid"], json!(0));
    assert!(!ws.join("guarded-d").exists());
    // The user who asked passes, once.
    assert_eq!(timed(&dir, as_nobody).1, 0);
    assert!(ws.join("guarded-d").is_dir());
    assert_ne!(timed(&dir, "setpriv --reuid=65534 --regid=65534 --clear-groups rmdir guarded-d").1, 0);
    assert!(ws.join("guarded-d").is_dir());
}
