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

/// Pins the calling thread to `cpu`, so that its FUSE requests go to that CPU's ring.
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; pid 0 is the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set), 0);
    }
}

/// The first CPU this process may run on.
fn first_cpu() -> usize {
    // SAFETY: as in `pin_to`.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set), 0);
        (0..libc::CPU_SETSIZE as usize).find(|&cpu| libc::CPU_ISSET(cpu, &set)).unwrap()
    }
}

#[test]
fn paused_opens_from_one_cpu_never_take_the_entries_its_other_requests_need() {
    // More than a ring's 512 entries: before the bound, the 513th paused open took the CPU's
    // last entry and every request from that CPU (a root `stat`) hung until tickets ended.
    const OPENERS: usize = 600;
    let f = Fixture::new(RULES);
    let secrets = f.host_root.join("secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    for i in 0..OPENERS {
        std::fs::write(secrets.join(format!("f{i}")), "old").unwrap();
        std::fs::set_permissions(secrets.join(format!("f{i}")), std::fs::Permissions::from_mode(0o666))
            .unwrap();
    }
    std::fs::write(f.host_root.join("readme"), "hello").unwrap();
    let on_rings = crate::harness::status(&f)["fuse_transport"] == "io_uring";
    // By /dev/fuse a waiting request holds nothing that others need, so every open waits.
    let paused = if on_rings { agentvfs::fuse::ring::MAX_WAITING } else { OPENERS };
    let cpu = first_cpu();
    let (done, outcomes) = std::sync::mpsc::channel();
    for i in 0..OPENERS {
        let (path, done) = (f.p(&format!("/host/secrets/f{i}")), done.clone());
        // Three users, 200 each: under one user's share of the tickets (256), over a ring's
        // bound together.
        let uid = (i % 3) as libc::uid_t;
        std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || {
                pin_to(cpu);
                // SAFETY: raw setresuid changes this thread's credentials only.
                unsafe { assert_eq!(libc::syscall(libc::SYS_setresuid, uid, uid, uid), 0) };
                let opened = std::fs::OpenOptions::new().append(true).open(path);
                let _ = done.send(opened.map(drop).map_err(|e| e.raw_os_error()));
            })
            .unwrap();
    }
    // Those past the bound are refused at once, each with a ticket; the rest wait.
    let mut refused = Vec::new();
    let mut tickets = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while refused.len() + tickets.iter().filter(|t: &&Value| t["retry"] == json!(false)).count() < OPENERS
        && Instant::now() < deadline
    {
        refused.extend(outcomes.try_iter());
        tickets = listed(&f);
        std::thread::sleep(Duration::from_millis(50));
    }
    refused.extend(outcomes.try_iter());
    // Meanwhile a stat and a read from the same CPU answer (on a thread, to clean up if not).
    let (probed, probe) = std::sync::mpsc::channel();
    let (other, readme) = (f.p("/host/never-looked-up"), f.p("/host/readme"));
    std::thread::spawn(move || {
        pin_to(cpu);
        let started = Instant::now();
        let stat = std::fs::metadata(&other).map_err(|e| e.raw_os_error());
        let read = std::fs::read_to_string(&readme).map_err(|e| e.raw_os_error());
        let _ = probed.send((stat.map(drop), read, started.elapsed()));
    });
    let probe = probe.recv_timeout(Duration::from_secs(5));
    // Clean up whatever happened: reject every ticket until each opener has its answer.
    let mut approver =
        agentvfs::control::client::Client::connect(&f.scratch.path().join("agentvfs.sock")).unwrap();
    let mut rest = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while refused.len() + rest.len() < OPENERS && Instant::now() < deadline {
        for t in listed(&f) {
            let _ = approver.call("interrupts/resolve", Some(json!({"id": t["id"], "decision": "reject"})));
        }
        rest.extend(outcomes.try_iter());
        std::thread::sleep(Duration::from_millis(20));
    }
    let (stat, read, took) = probe.expect("a stat and a read from the CPU of the paused opens hung");
    assert_eq!((stat, read), (Err(Some(libc::ENOENT)), Ok("hello".to_string())));
    assert!(took < Duration::from_secs(1), "the stat and read took {took:?}");
    assert_eq!(refused.len(), OPENERS - paused, "refused at once");
    assert!(refused.iter().all(|r| *r == Err(Some(libc::EACCES))), "{refused:?}");
    let retries = tickets.iter().filter(|t| t["retry"] == json!(true)).count();
    assert_eq!((tickets.len(), retries), (OPENERS, OPENERS - paused), "tickets: paused, and retries");
    assert_eq!(rest.len(), paused);
    assert!(rest.iter().all(|r| *r == Err(Some(libc::EACCES))), "rejected: {rest:?}");
    for i in 0..OPENERS {
        assert_eq!(std::fs::read_to_string(secrets.join(format!("f{i}"))).unwrap(), "old");
    }
}
