//! The protocol a harness's own backend uses, over a real daemon and socket: structured tool
//! results (`structured: true`), approvals a call does not wait for (`wait: false`, then
//! `ticket: N`), and `vfs/upload` / `vfs/download` of bytes, all under the rules.

use std::path::PathBuf;

use agentvfs::control::client::{Client, ClientError};
use serde_json::{json, Value};

use crate::harness::Fixture;

const RULES: &str = r#"
[[rules]]
operations = ["read", "write"]
paths = ["/**/.env"]
mode = "deny"

[[rules]]
operations = ["write"]
paths = ["/host/guarded/**"]
mode = "interrupt"

[interrupts]
timeout_seconds = 60
"#;

fn fixture() -> Fixture {
    let f = Fixture::new(RULES);
    std::fs::create_dir_all(f.host_root.join("guarded")).unwrap();
    f
}

fn agent_socket(f: &Fixture) -> PathBuf {
    f.scratch.path().join("agentvfs-agent.sock")
}

fn control(f: &Fixture) -> Client {
    Client::connect(&f.scratch.path().join("agentvfs.sock")).unwrap()
}

fn tools_call(client: &mut Client, params: Value) -> Value {
    client.call("tools/call", Some(params)).unwrap()
}

fn structured(client: &mut Client, name: &str, arguments: Value) -> Value {
    tools_call(client, json!({"name": name, "arguments": arguments, "structured": true}))
}

#[test]
fn structured_results_carry_the_data_behind_the_text() {
    let f = fixture();
    std::fs::write(f.host_root.join("a.txt"), "one\r\ntwo\nthree\n").unwrap();
    std::fs::write(f.host_root.join(".env"), "K=secret\n").unwrap();
    let mut c = Client::connect(&agent_socket(&f)).unwrap();

    // A window's raw text (line ends as Deep Agents slices them), and the whole window's numbers.
    let read = structured(&mut c, "read_file", json!({"file_path": "/host/a.txt", "offset": 1, "limit": 1}));
    assert_eq!(read["content"][0]["text"], "@@ lines 2-2 of 3 | next offset 2 @@\ntwo");
    let s = &read["structuredContent"];
    assert_eq!(
        (
            &s["content"],
            &s["encoding"],
            &s["start_line"],
            &s["end_line"],
            &s["total_lines"],
            &s["next_offset"]
        ),
        (&json!("two\n"), &json!("utf-8"), &json!(2), &json!(2), &json!(3), &json!(2))
    );
    let none = structured(&mut c, "read_file", json!({"file_path": "/host/a.txt", "limit": 0}));
    assert_eq!(none["structuredContent"]["no_lines_requested"], true);
    assert_eq!(none["structuredContent"]["content"], "");
    // Without `structured` the result is as before: no raw content.
    let plain = tools_call(&mut c, json!({"name": "read_file", "arguments": {"file_path": "/host/a.txt"}}));
    assert_eq!(plain["structuredContent"].get("content"), None);

    // Media as base64.
    std::fs::write(f.host_root.join("p.png"), [0x89u8, b'P', b'N', b'G', 0, 255]).unwrap();
    let png = structured(&mut c, "read_file", json!({"file_path": "/host/p.png"}));
    assert_eq!(
        (&png["structuredContent"]["content"], &png["structuredContent"]["encoding"]),
        (&json!("iVBORwD/"), &json!("base64"))
    );

    // Every entry and match; the hidden file in none of them.
    let ls = structured(&mut c, "ls", json!({"path": "/host"}));
    let paths: Vec<&str> = ls["structuredContent"]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["/host/a.txt", "/host/guarded/", "/host/p.png"]);
    let glob = structured(&mut c, "glob", json!({"pattern": "*", "path": "/host"}));
    assert_eq!(
        glob["structuredContent"]["matches"],
        json!([{"path": "/host/a.txt", "is_dir": false}, {"path": "/host/p.png", "is_dir": false}])
    );
    let grep = structured(&mut c, "grep", json!({"pattern": "t", "path": "/host", "output_mode": "content"}));
    assert_eq!(
        grep["structuredContent"]["files"][0]["matches"],
        json!([{"line": 2, "text": "two"}, {"line": 3, "text": "three"}])
    );
    let secret =
        structured(&mut c, "grep", json!({"pattern": "secret", "path": "/host", "output_mode": "content"}));
    assert_eq!(secret["structuredContent"]["files"], json!([]));
}

#[test]
fn a_call_that_does_not_wait_is_finished_under_its_ticket() {
    let f = fixture();
    let args = json!({"file_path": "/host/guarded/plan.md", "content": "plan\n"});
    let mut agent = Client::connect(&agent_socket(&f)).unwrap();
    let paused = tools_call(&mut agent, json!({"name": "write_file", "arguments": args, "wait": false}));
    let s = &paused["structuredContent"];
    assert_eq!((s["interrupted"].clone(), paused["isError"].clone()), (json!(true), json!(false)));
    let id = s["interrupt_id"].as_u64().unwrap();
    assert_eq!(
        paused["content"][0]["text"],
        format!("Interrupted: the tool call for `write_file` on /host/guarded/plan.md needs a human's approval (approval #{id}). It has not run; once an approver has answered on the control socket, call it again with `ticket: {id}` to finish it.")
    );
    assert_eq!(
        (s["interrupt"]["id"].as_u64(), &s["interrupt"]["path"]),
        (Some(id), &json!("/host/guarded/plan.md"))
    );
    assert!(!f.host_root.join("guarded/plan.md").exists());

    // The same call again (a harness re-running its tool) gets the same ticket; the ticket
    // outlives the connection that opened it.
    drop(agent);
    let mut agent = Client::connect(&agent_socket(&f)).unwrap();
    let again = tools_call(&mut agent, json!({"name": "write_file", "arguments": args, "wait": false}));
    assert_eq!(again["structuredContent"]["interrupt_id"].as_u64(), Some(id));
    let pending = control(&f).call("interrupts/list", None).unwrap();
    assert_eq!(pending["interrupts"].as_array().unwrap().len(), 1);

    // The agent socket cannot answer; a ticket is finished only by the call it was opened for.
    match agent.call("interrupts/resolve", Some(json!({"id": id, "decision": "approve"}))) {
        Err(ClientError::Rpc(e)) => assert_eq!(e.code, -32001),
        other => panic!("{other:?}"),
    }
    let other = json!({"file_path": "/host/guarded/other.md", "content": "x"});
    match agent.call("tools/call", Some(json!({"name": "write_file", "arguments": other, "ticket": id}))) {
        Err(ClientError::Rpc(e)) => {
            assert_eq!((e.code, e.message.as_str()), (-32602, format!("approval #{id} is for another tool call: `ticket` needs the same tool name and arguments as the call that opened it").as_str()))
        }
        other => panic!("{other:?}"),
    }

    // Answered on the control socket, then finished: the outcome waits for the call.
    control(&f).call("interrupts/resolve", Some(json!({"id": id, "decision": "approve"}))).unwrap();
    let done = tools_call(
        &mut agent,
        json!({"name": "write_file", "arguments": args, "ticket": id, "structured": true}),
    );
    assert_eq!(done["content"][0]["text"], "Updated file /host/guarded/plan.md");
    assert_eq!(
        (done["structuredContent"]["interrupt_id"].as_u64(), &done["structuredContent"]["path"]),
        (Some(id), &json!("/host/guarded/plan.md"))
    );
    assert_eq!(std::fs::read_to_string(f.host_root.join("guarded/plan.md")).unwrap(), "plan\n");
    // Its outcome is used up.
    match agent.call("tools/call", Some(json!({"name": "write_file", "arguments": args, "ticket": id}))) {
        Err(ClientError::Rpc(e)) => assert_eq!(e.code, -32000),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_same_call_sent_at_once_on_many_connections_opens_one_ticket() {
    let f = fixture();
    for round in 0..5 {
        let path = format!("/host/guarded/race{round}.md");
        let args = json!({"file_path": path, "content": "r\n"});
        let start = std::sync::Arc::new(std::sync::Barrier::new(16));
        let callers: Vec<_> = (0..16)
            .map(|_| {
                let (socket, args, start) = (agent_socket(&f), args.clone(), start.clone());
                std::thread::spawn(move || {
                    let mut agent = Client::connect(&socket).unwrap();
                    start.wait();
                    let paused = tools_call(
                        &mut agent,
                        json!({"name": "write_file", "arguments": args, "wait": false}),
                    );
                    paused["structuredContent"]["interrupt_id"].as_u64().unwrap()
                })
            })
            .collect();
        let mut ids: Vec<u64> = callers.into_iter().map(|c| c.join().unwrap()).collect();
        ids.dedup();
        assert_eq!(ids.len(), 1, "round {round}: tickets {ids:?}");
        let pending = control(&f).call("interrupts/list", None).unwrap();
        let paths: Vec<&str> =
            pending["interrupts"].as_array().unwrap().iter().filter_map(|t| t["path"].as_str()).collect();
        assert_eq!(paths.iter().filter(|p| **p == path).count(), 1, "round {round}: {paths:?}");
    }
}

#[test]
fn a_ticket_call_waits_for_the_answer_and_gets_each_decision() {
    let f = fixture();
    for (decision, text, lands) in [
        (
            json!({"decision": "reject", "message": "no"}),
            "User rejected the tool call for `write_file` with reason: no",
            false,
        ),
        (json!({"decision": "respond", "message": "use the wiki"}), "use the wiki", false),
        (json!({"decision": "approve"}), "Updated file /host/guarded/d.md", true),
    ] {
        let args = json!({"file_path": "/host/guarded/d.md", "content": "d\n"});
        let mut agent = Client::connect(&agent_socket(&f)).unwrap();
        let paused = tools_call(&mut agent, json!({"name": "write_file", "arguments": args, "wait": false}));
        let id = paused["structuredContent"]["interrupt_id"].as_u64().unwrap();
        // The finishing call waits (on its own thread) until the approver answers.
        let waiter = std::thread::spawn(move || {
            tools_call(&mut agent, json!({"name": "write_file", "arguments": args, "ticket": id}))
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!waiter.is_finished());
        let mut resolve = decision.clone();
        resolve["id"] = json!(id);
        control(&f).call("interrupts/resolve", Some(resolve)).unwrap();
        let done = waiter.join().unwrap();
        assert_eq!(done["content"][0]["text"], text, "{decision}");
        assert_eq!(f.host_root.join("guarded/d.md").exists(), lands, "{decision}");
    }
}

#[test]
fn bytes_go_up_in_pieces_and_come_down_whole_under_the_rules() {
    let f = fixture();
    let mut c = Client::connect(&agent_socket(&f)).unwrap();
    let data: Vec<u8> = (0..=255u8).cycle().take(700_000).collect();
    for route in ["/host", "/mem", "/db"] {
        let path = format!("{route}/up/blob.bin");
        let (first, rest) = data.split_at(400_000);
        let staged =
            c.call("vfs/upload", Some(json!({"path": path, "content": b64(first), "more": true}))).unwrap();
        let number = staged["upload"].as_u64().unwrap();
        assert_eq!(staged, json!({"path": path, "staged": 400_000, "upload": number}));
        assert!(!f.p(&path).exists(), "nothing is written before the last piece");
        let last = json!({"path": path, "content": b64(rest), "upload": number, "offset": 400_000});
        let done = c.call("vfs/upload", Some(last)).unwrap();
        assert_eq!(done, json!({"path": path, "size": 700_000}));
        assert_eq!(std::fs::read(f.p(&path)).unwrap(), data);
        let down = c.call("vfs/download", Some(json!({"path": path}))).unwrap();
        assert_eq!(down, json!({"path": path, "content": b64(&data), "size": 700_000}));

        let secret = format!("{route}/.env");
        let refused = c.call("vfs/upload", Some(json!({"path": secret, "content": "eA=="}))).unwrap();
        assert_eq!(
            refused,
            json!({"path": secret, "error_code": "FS_PERMISSION_DENIED", "message": format!("Error: permission denied for write on {secret}")})
        );
        let dir = format!("{route}/up");
        let down = c.call("vfs/download", Some(json!({"path": dir}))).unwrap();
        assert_eq!(down["error_code"], "FS_IS_DIRECTORY");
        let missing = c.call("vfs/download", Some(json!({"path": format!("{route}/nope")}))).unwrap();
        assert_eq!(missing["error_code"], "FS_NOT_FOUND");
        // A trailing `/` names a directory: the file is not sent.
        let slashed = c.call("vfs/download", Some(json!({"path": format!("{path}/")}))).unwrap();
        assert_eq!(slashed["error_code"], "FS_NOT_DIRECTORY", "{slashed}");
        assert!(slashed.get("content").is_none(), "{slashed}");
    }
    // An interrupt rule refuses a transfer: nobody is asked.
    let guarded = c.call("vfs/upload", Some(json!({"path": "/host/guarded/x", "content": "eA=="}))).unwrap();
    assert_eq!(guarded["error_code"], "FS_PERMISSION_DENIED");
    match c.call("vfs/upload", Some(json!({"path": "/host/x", "content": "not base64!"}))) {
        Err(ClientError::Rpc(e)) => assert_eq!(e.code, -32602),
        other => panic!("{other:?}"),
    }
}

fn b64(data: &[u8]) -> String {
    agentvfs::control::tools::common::base64(data)
}

/// `vfs/upload` of one piece (`more`), as part of upload `number` after `offset` bytes when
/// given.
fn piece(c: &mut Client, path: &str, data: &[u8], more: bool, number: Option<(u64, usize)>) -> Value {
    let mut params = json!({"path": path, "content": b64(data), "more": more});
    if let Some((n, offset)) = number {
        params["upload"] = json!(n);
        params["offset"] = json!(offset);
    }
    c.call("vfs/upload", Some(params)).unwrap()
}

#[test]
fn a_refused_piece_ends_its_upload_and_uploads_at_once_never_mix() {
    let f = fixture();
    let mut c = Client::connect(&agent_socket(&f)).unwrap();
    // A refused piece (here one naming another path; a piece past the 256 MiB a connection
    // may stage is refused the same way, unit-tested in transfer.rs) ends its upload: every
    // later piece of it is refused, so the file is never written from what came after.
    let path = "/host/cut.bin";
    let number = piece(&mut c, path, b"head", true, None)["upload"].as_u64().unwrap();
    let wrong = piece(&mut c, "/host/d.bin", b"d", true, Some((number, 4)));
    assert_eq!(
        wrong["message"],
        format!("Error: upload #{number} is of another path, not '/host/d.bin'; it was dropped")
    );
    let after = piece(&mut c, path, b"tail", true, Some((number, 4)));
    let gone = format!("Error: upload #{number} of '{path}' is not under way on this connection (a piece of it was refused, or it was finished); send the file again from its first piece");
    assert_eq!(after, json!({"path": path, "error_code": "FS_INVALID_ARGUMENT", "message": gone}));
    let last = piece(&mut c, path, b"end", false, Some((number, 8)));
    assert_eq!(last["error_code"], "FS_INVALID_ARGUMENT", "{last}");
    assert!(!f.host_root.join("cut.bin").exists() && !f.host_root.join("d.bin").exists());

    // A piece that cannot be read (bad base64, a line too long) ends its upload too, and a
    // piece after a lost one shows the gap: the file is never written with a hole.
    let path = "/host/gap.bin";
    let number = piece(&mut c, path, b"AAA", true, None)["upload"].as_u64().unwrap();
    let bad = c.call(
        "vfs/upload",
        Some(json!({"path": path, "content": "not base64!", "more": true, "upload": number, "offset": 3})),
    );
    assert!(matches!(bad, Err(ClientError::Rpc(ref e)) if e.code == -32602), "{bad:?}");
    assert_eq!(piece(&mut c, path, b"CCC", false, Some((number, 3)))["error_code"], "FS_INVALID_ARGUMENT");
    let number = piece(&mut c, path, b"AAA", true, None)["upload"].as_u64().unwrap();
    let gap = piece(&mut c, path, b"CCC", false, Some((number, 6)));
    assert_eq!(gap["message"], format!("Error: this piece of upload #{number} begins at byte 6, but 3 bytes came before it (a piece was lost); it was dropped"));
    assert!(!f.host_root.join("gap.bin").exists());

    // Two uploads of one path, their pieces interleaved on one connection: each lands whole.
    let (a, b) = (vec![b'a'; 300_000], vec![b'b'; 300_000]);
    let path = "/host/same.bin";
    let na = piece(&mut c, path, &a, true, None)["upload"].as_u64().unwrap();
    let nb = piece(&mut c, path, &b, true, None)["upload"].as_u64().unwrap();
    assert_ne!(na, nb);
    assert_eq!(piece(&mut c, path, &a, false, Some((na, 300_000)))["size"], 600_000);
    assert_eq!(std::fs::read(f.host_root.join("same.bin")).unwrap(), [a.clone(), a.clone()].concat());
    assert_eq!(piece(&mut c, path, &b, false, Some((nb, 300_000)))["size"], 600_000);
    assert_eq!(std::fs::read(f.host_root.join("same.bin")).unwrap(), [b.clone(), b.clone()].concat());
    // Another connection's numbers are not this one's.
    let mut other = Client::connect(&agent_socket(&f)).unwrap();
    let elsewhere = piece(&mut c, "/host/e.bin", b"e", true, None)["upload"].as_u64().unwrap();
    assert_eq!(
        piece(&mut other, "/host/e.bin", b"e", false, Some((elsewhere, 1)))["error_code"],
        "FS_INVALID_ARGUMENT"
    );
}

#[test]
fn an_upload_the_rules_refuse_is_refused_at_its_first_piece() {
    let f = fixture();
    let mut c = Client::connect(&agent_socket(&f)).unwrap();
    for (path, why) in [
        ("/host/.env", "Error: permission denied for write on /host/.env"),
        ("/host/guarded/x.bin", "Error: permission denied for write on /host/guarded/x.bin"),
    ] {
        let first = piece(&mut c, path, b"piece", true, None);
        assert_eq!(first, json!({"path": path, "error_code": "FS_PERMISSION_DENIED", "message": why}));
    }
    let invalid = piece(&mut c, "/host/../x", b"piece", true, None);
    assert_eq!(invalid["error_code"], "FS_INVALID_PATH", "{invalid}");
    // Nobody was asked.
    let pending = control(&f).call("interrupts/list", None).unwrap();
    assert_eq!(pending["interrupts"], json!([]));
}

#[test]
fn a_download_lets_the_connection_edit_what_it_downloaded() {
    let f = fixture();
    std::fs::write(f.host_root.join("notes.md"), "one\n").unwrap();
    let mut c = Client::connect(&agent_socket(&f)).unwrap();
    let edit = json!({"file_path": "/host/notes.md", "old_string": "one", "new_string": "two"});
    let unread = structured(&mut c, "edit_file", edit.clone());
    assert_eq!(unread["structuredContent"]["error_code"], "FS_NOT_OBSERVED", "{unread}");
    c.call("vfs/download", Some(json!({"path": "/host/notes.md"}))).unwrap();
    let edited = structured(&mut c, "edit_file", edit);
    assert_eq!(edited["isError"], json!(false), "{edited}");
    assert_eq!(std::fs::read_to_string(f.host_root.join("notes.md")).unwrap(), "two\n");
}

/// Stages `text` as a tool call's argument, in pieces; its upload's number.
fn stage_argument(c: &mut Client, label: &str, text: &[u8]) -> u64 {
    let mut number = None;
    for (i, chunk) in text.chunks(600_000).enumerate() {
        let mut params = json!({"path": label, "content": b64(chunk), "more": true, "argument": true});
        if let Some(n) = number {
            params["upload"] = json!(n);
            params["offset"] = json!(i * 600_000);
        }
        let answer = c.call("vfs/upload", Some(params)).unwrap();
        number = Some(answer["upload"].as_u64().unwrap_or_else(|| panic!("{answer}")));
    }
    number.unwrap()
}

#[test]
fn arguments_too_long_for_one_request_are_staged_and_judged_with_their_call() {
    let f = fixture();
    let mut c = Client::connect(&agent_socket(&f)).unwrap();
    // 3 MB of text: three times what one request line may hold.
    let text: String =
        (0..60_000).map(|i| format!("line {i:06} of a long tool result\n")).collect::<String>();
    assert!(text.len() > 2_000_000);
    let n = stage_argument(&mut c, "/host/big.md", text.as_bytes());
    let staged = json!({"name": "write_file", "arguments": {"file_path": "/host/big.md"}, "staged_arguments": {"content": n}});
    let done = tools_call(&mut c, staged.clone());
    assert_eq!(done["content"][0]["text"], "Updated file /host/big.md", "{done}");
    assert_eq!(std::fs::read_to_string(f.host_root.join("big.md")).unwrap(), text);
    // Used once.
    match c.call("tools/call", Some(staged)) {
        Err(ClientError::Rpc(e)) => assert_eq!(
            (e.code, e.message.as_str()),
            (-32602, format!("upload #{n} is not under way on this connection (a piece of it was refused, or it was used)").as_str())
        ),
        other => panic!("{other:?}"),
    }
    // An edit whose strings are staged: judged and observed like any edit.
    let appended = format!("{text}one more line\n");
    let old = stage_argument(&mut c, "/host/big.md", text.as_bytes());
    let new = stage_argument(&mut c, "/host/big.md", appended.as_bytes());
    let edit = json!({"name": "edit_file", "arguments": {"file_path": "/host/big.md"}, "staged_arguments": {"old_string": old, "new_string": new}});
    let done = tools_call(&mut c, edit);
    assert_eq!(done["isError"], json!(false), "{done}");
    assert_eq!(std::fs::read_to_string(f.host_root.join("big.md")).unwrap(), appended);
    // The rules hold: a denied path is refused, an interrupt rule asks with the staged text.
    let n = stage_argument(&mut c, "/host/.env", b"K=1\n");
    let refused = tools_call(
        &mut c,
        json!({"name": "write_file", "arguments": {"file_path": "/host/.env"}, "staged_arguments": {"content": n}}),
    );
    assert_eq!(refused["content"][0]["text"], "Error: permission denied for write on /host/.env");
    let n = stage_argument(&mut c, "/host/guarded/g.md", text.as_bytes());
    let paused = tools_call(
        &mut c,
        json!({"name": "write_file", "arguments": {"file_path": "/host/guarded/g.md"}, "staged_arguments": {"content": n}, "wait": false}),
    );
    let id = paused["structuredContent"]["interrupt_id"].as_u64().unwrap_or_else(|| panic!("{paused}"));
    control(&f).call("interrupts/resolve", Some(json!({"id": id, "decision": "approve"}))).unwrap();
    let n = stage_argument(&mut c, "/host/guarded/g.md", text.as_bytes());
    let done = tools_call(
        &mut c,
        json!({"name": "write_file", "arguments": {"file_path": "/host/guarded/g.md"}, "staged_arguments": {"content": n}, "ticket": id}),
    );
    assert_eq!(done["content"][0]["text"], "Updated file /host/guarded/g.md", "{done}");
    assert_eq!(std::fs::read_to_string(f.host_root.join("guarded/g.md")).unwrap(), text);
    // Not text, or ended by a last piece: refused.
    let n = stage_argument(&mut c, "/host/x", &[0xff, 0xfe]);
    match c.call("tools/call", Some(json!({"name": "write_file", "arguments": {"file_path": "/host/x"}, "staged_arguments": {"content": n}}))) {
        Err(ClientError::Rpc(e)) => assert_eq!(e.message, format!("upload #{n} is not UTF-8 text (at byte 0)")),
        other => panic!("{other:?}"),
    }
    let n = stage_argument(&mut c, "/host/x", b"x");
    let ended = piece(&mut c, "/host/x", b"y", false, Some((n, 1)));
    assert_eq!(ended["error_code"], "FS_INVALID_ARGUMENT", "{ended}");
    assert!(!f.host_root.join("x").exists());
}
