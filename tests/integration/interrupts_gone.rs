//! Interrupts whose asker goes away: a caller killed while it waits, a tool call whose client
//! disconnects (or half-closes first), and what the approver is told afterwards.

use super::*;

#[test]
fn a_caller_that_dies_while_waiting_leaves_no_ticket() {
    let f = fixture(300);
    existing(&f, "secrets/k", "old\n");
    let mut child = shell(&f.p("/host"), "echo key > secrets/k");
    pending(&f, 1);
    // The kernel keeps a killed caller until its request is answered; the sweeper sees the
    // pending SIGKILL, answers, and the caller exits.
    child.kill().unwrap();
    pending(&f, 0);
    finish(child, Duration::from_secs(10));
    assert_eq!(host_text(&f, "secrets/k"), "old\n");
}

/// The pending approvals now.
fn listed(f: &Fixture) -> Vec<Value> {
    Conn::open(&socket(f)).result(1, "interrupts/list", json!({}))["interrupts"].as_array().unwrap().clone()
}

/// Waits until a disconnected client's ticket is withdrawn and `left` tickets stay listed:
/// within 2 s, since the daemon withdraws it as soon as it sees the connection close.
fn withdrawn_leaving(f: &Fixture, left: usize) {
    let started = Instant::now();
    while listed(f).len() != left {
        assert!(started.elapsed() < Duration::from_secs(2), "the ticket is still listed: {:?}", listed(f));
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_tool_call_whose_client_disconnects_loses_its_ticket() {
    let f = fixture(300);
    let mut watcher = Conn::open(&socket(&f));
    watcher.result(1, "interrupts/subscribe", json!({}));
    // Another client's paused call, which A's disconnect must leave alone.
    let mut other = Conn::open(&socket(&f));
    let kept = paused_write(&f, &mut other, "/host/secrets/kept");
    let mut a = Conn::open(&socket(&f));
    a.send(
        1,
        "tools/call",
        json!({"name": "write_file", "arguments": {"file_path": "/host/secrets/a", "content": "late"}}),
    );
    let list = pending(&f, 2);
    let t = list.iter().find(|t| t["path"] == "/host/secrets/a").expect("A's ticket").clone();
    assert_eq!(t["tool"]["name"], "write_file", "{t}");
    drop(a);
    withdrawn_leaving(&f, 1);
    assert_eq!(listed(&f)[0]["id"], kept["id"], "the other client's ticket stays");
    // Subscribers hear how it ended.
    let ended = loop {
        let m = watcher.recv();
        if m["params"]["event"] == "resolved" {
            break m["params"]["interrupt"].clone();
        }
    };
    assert_eq!((&ended["id"], ended["decision"].as_str()), (&t["id"], Some("caller-gone")), "{ended}");
    // Approving it now does nothing but say why.
    let mut b = Conn::open(&socket(&f));
    b.send(2, "interrupts/resolve", json!({"id": t["id"], "decision": "approve"}));
    let reply = b.reply(2);
    assert_eq!(reply["error"]["code"], json!(-32000), "{reply}");
    assert_eq!(
        reply["error"]["message"],
        format!(
            "approval #{} is no longer pending: it was withdrawn because the client that asked disconnected",
            t["id"]
        )
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(!f.host_root.join("secrets/a").exists(), "the withdrawn call never ran");
    // The other call still runs when approved, and answers its own connection.
    resolve(&f, json!({"id": kept["id"], "decision": "approve"}));
    let r = other.reply(1)["result"].clone();
    assert_eq!(r["isError"], json!(false), "{r}");
    assert_eq!(std::fs::read_to_string(f.host_root.join("secrets/kept")).unwrap(), "original");
    // The audit log records the withdrawal.
    std::thread::sleep(Duration::from_millis(300));
    let decisions = audit_decisions(&f, "/host/secrets/a");
    assert_eq!(decisions, ["interrupt", "caller-gone by agentvfs"]);
}

#[test]
fn a_client_that_only_half_closes_still_gets_its_answer() {
    let f = fixture(300);
    let mut a = Conn::open(&socket(&f));
    let t = paused_write(&f, &mut a, "/host/secrets/a");
    a.stream.shutdown(std::net::Shutdown::Write).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(listed(&f).len(), 1, "a half-close still waits for the answer");
    resolve(&f, json!({"id": t["id"], "decision": "approve"}));
    let r = a.reply(1)["result"].clone();
    assert_eq!(r["isError"], json!(false), "{r}");
    assert_eq!(std::fs::read_to_string(f.host_root.join("secrets/a")).unwrap(), "original");
    // Then the daemon closes the connection.
    let mut rest = String::new();
    assert_eq!(a.lines.read_line(&mut rest).unwrap(), 0, "{rest:?}");
}

#[test]
fn a_client_that_half_closes_then_disconnects_loses_its_ticket() {
    let f = fixture(300);
    let mut a = Conn::open(&socket(&f));
    let t = paused_write(&f, &mut a, "/host/secrets/a");
    a.stream.shutdown(std::net::Shutdown::Write).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(listed(&f).len(), 1);
    drop(a);
    withdrawn_leaving(&f, 0);
    let mut b = Conn::open(&socket(&f));
    b.send(2, "interrupts/resolve", json!({"id": t["id"], "decision": "approve"}));
    assert!(b.reply(2)["error"]["message"].as_str().unwrap().contains("withdrawn"));
    assert!(!f.host_root.join("secrets/a").exists());
}
