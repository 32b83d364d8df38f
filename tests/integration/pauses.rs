//! Paused operations from their caller's side: a signal (Ctrl-C, SIGTERM) ends the wait at
//! once, withdraws the ticket, and changes nothing.

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
    Command::new("sh").arg("-c").arg(script).current_dir(cwd).stdin(Stdio::null()).spawn().unwrap()
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
    for (signal, script) in [
        (libc::SIGINT, "echo key > secrets/a"),
        (libc::SIGTERM, "exec mkdir secrets/d"),
        (libc::SIGINT, "exec mv plain secrets/moved"),
    ] {
        std::fs::write(f.host_root.join("plain"), "p").unwrap();
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
        assert!(
            !f.host_root.join("secrets/a").exists() && !f.host_root.join("secrets/d").exists(),
            "{script}"
        );
        assert!(
            !f.host_root.join("secrets/moved").exists() && f.host_root.join("plain").exists(),
            "{script}"
        );
    }
    // A program that handles the signal gets EINTR from its call and carries on (here: exits
    // with a code of its own), where the kernel alone would keep it waiting for the human.
    let script =
        "import signal, sys\nsignal.signal(signal.SIGINT, lambda *a: sys.exit(7))\nopen('secrets/p', 'w')";
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .current_dir(f.p("/host"))
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
    assert!(!f.host_root.join("secrets/p").exists());
    // The audit log says how each ended.
    let db = rusqlite::Connection::open(f.scratch.path().join("audit.db")).unwrap();
    crate::harness::soon("four interrupted tickets in the audit log", || {
        db.query_row("SELECT count(*) FROM audit WHERE decision LIKE 'interrupted%'", [], |r| {
            r.get::<_, i64>(0)
        })
        .is_ok_and(|n| n == 4)
    });
}
