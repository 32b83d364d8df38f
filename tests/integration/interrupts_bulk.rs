//! Approvals of bulk tool calls (`ls`, `glob`, `grep`, `delete`) on a real mount and socket:
//! what the ticket lists beneath the call's path is what the approval covers.

use serde_json::{json, Value};

use crate::harness::Fixture;
use crate::interrupts::{cli, existing, fixture, host_text, pending, resolve, socket, text, Conn, RULES};

/// An approved bulk call acts on what its ticket showed beneath its path: a guarded entry moved
/// in before the call runs (with `wait: false` the agent picks that moment) is left alone. An
/// approved search reads the guarded files it was shown.
#[test]
fn an_approved_bulk_call_acts_only_on_what_the_approver_was_shown() {
    let vault = "[[rules]]\noperations = [\"read\"]\npaths = [\"/host/vault/**\"]\nmode = \"interrupt\"\n";
    let f = Fixture::new(&format!("{RULES}\n{vault}\n[interrupts]\ntimeout_seconds = 300\n"));
    for dir in ["secrets/trash", "vault"] {
        std::fs::create_dir_all(f.host_root.join(dir)).unwrap();
    }
    existing(&f, "secrets/trash/junk.txt", "junk");
    existing(&f, "secrets/prod.conf", "prod");
    existing(&f, "vault/old.txt", "needle old\n");
    let mut c = Conn::open(&socket(&f));
    let ticket = |c: &mut Conn, n: u64, name: &str, args: &Value| -> Value {
        let deferred = c.result(n, "tools/call", json!({"name": name, "arguments": args, "wait": false}));
        let shown = &deferred["structuredContent"]["interrupt"];
        assert_eq!(shown["tool"]["name"], json!(name), "{deferred}");
        assert_eq!(shown["tool"].get("guarded"), None, "the agent is not shown what is guarded: {deferred}");
        deferred["structuredContent"]["interrupt_id"].clone()
    };

    let grep = json!({"pattern": "needle", "path": "/host/vault", "output_mode": "content"});
    let id = ticket(&mut c, 1, "grep", &grep);
    let t = pending(&f, 1).remove(0);
    assert_eq!(t["tool"]["guarded"], json!(["/host/vault/old.txt"]), "{t}");
    let listed = cli(&f, &["interrupts"]);
    assert!(listed.contains(" [guarded beneath, 1 in all: /host/vault/old.txt] expires in "), "{listed}");
    existing(&f, "vault/new.txt", "needle new\n");
    resolve(&f, json!({"id": id, "decision": "approve"}));
    let done = c.result(2, "tools/call", json!({"name": "grep", "arguments": grep, "ticket": id}));
    assert_eq!(text(&done), "/host/vault/old.txt:\n  1: needle old", "{done}");

    let delete = json!({"file_path": "/host/secrets/trash"});
    let id = ticket(&mut c, 3, "delete", &delete);
    let t = pending(&f, 1).remove(0);
    assert_eq!(t["tool"]["guarded"], json!(["/host/secrets/trash/junk.txt"]), "{t}");
    std::fs::rename(f.host_root.join("secrets/prod.conf"), f.host_root.join("secrets/trash/prod.conf"))
        .unwrap();
    resolve(&f, json!({"id": id, "decision": "approve"}));
    let done = c.result(4, "tools/call", json!({"name": "delete", "arguments": delete, "ticket": id}));
    assert_eq!(done["structuredContent"]["error_code"], json!("FS_PERMISSION_DENIED"), "{done}");
    assert_eq!(text(&done), "Error: permission denied for write on /host/secrets/trash");
    assert_eq!(host_text(&f, "secrets/trash/prod.conf"), "prod");
}

/// A bulk call over more guarded entries than an approver can weigh is refused at once,
/// asking for a narrower path, rather than shown as a list nobody reads.
#[test]
fn a_bulk_call_over_too_many_guarded_entries_asks_for_a_narrower_path() {
    let f = fixture(300);
    let big = f.host_root.join("secrets/big");
    std::fs::create_dir_all(&big).unwrap();
    for n in 0..10_001 {
        std::fs::File::create(big.join(format!("f{n}"))).unwrap();
    }
    let mut c = Conn::open(&socket(&f));
    let done =
        c.result(1, "tools/call", json!({"name": "delete", "arguments": {"file_path": "/host/secrets/big"}}));
    assert_eq!(done["structuredContent"]["error_code"], json!("FS_TOO_LARGE"), "{done}");
    assert_eq!(
        text(&done),
        "Error: the tool call for `delete` on /host/secrets/big needs a human's approval, but it reaches too much to show an approver. Name a narrower path. The tool was not executed."
    );
    assert_eq!(pending(&f, 0).len(), 0);
    assert_eq!(std::fs::read_dir(&big).unwrap().count(), 10_001);
}
