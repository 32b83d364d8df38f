//! The control door's wire, over a real daemon: what a client that stops reading costs the same
//! user's other connections, how `agentvfs mcp` bounds the lines it reads, ids echoed as sent,
//! and params by name. (Framing, errors and the CLI: `control.rs`.)

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::control::FixturePaths;
use crate::harness::{resident, Conn, Fixture, BIN};

/// A connection that asks for several large replies and reads none is closed at its first
/// reply's 30 s write deadline, and every reply queued behind that one is dropped with it: the
/// same user's call on another connection, which waits for the reply budget they hold, is
/// answered then, not one deadline per queued reply later.
#[test]
fn a_client_that_stops_reading_stalls_its_users_other_connections_for_one_deadline() {
    let f = Fixture::new("");
    std::fs::write(f.host_root.join("big.bin"), vec![b'x'; 30 << 20]).unwrap();
    let mut stalled = UnixStream::connect(f.agent_socket()).unwrap();
    for id in 1..=4 {
        let download = json!({"jsonrpc": "2.0", "id": id, "method": "vfs/download",
            "params": {"path": "/host/big.bin"}});
        writeln!(stalled, "{download}").unwrap();
    }
    // The four replies (40 MB each) are built and wait, unread: more than uid 0's share of
    // the daemon's unsent bytes, so its next result waits for them to go.
    std::thread::sleep(Duration::from_secs(2));
    let mut other = Conn::open(&f.agent_socket());
    other.stream.set_read_timeout(Some(Duration::from_secs(50))).unwrap();
    let started = Instant::now();
    let listed = other.result(1, "tools/call", json!({"name": "ls", "arguments": {"path": "/"}}));
    let took = started.elapsed();
    assert_eq!(listed["isError"], json!(false), "{listed}");
    assert!(
        took > Duration::from_secs(10),
        "not held by the stalled replies ({took:?}): the test proves nothing"
    );
    assert!(took < Duration::from_secs(45), "answered after {took:?}, past one write deadline");
    // The stalled connection is closed, no reply whole on it.
    stalled.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut received = Vec::new();
    stalled.read_to_end(&mut received).expect("the daemon closed the stalled connection");
    assert!(!received.contains(&b'\n'), "a whole reply reached the stalled client");
}

/// `agentvfs mcp` on the fixture's agent socket, its stdin and stdout piped.
fn bridge(f: &Fixture) -> std::process::Child {
    Command::new(BIN)
        .args(["mcp", "--socket"])
        .arg(f.agent_socket())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `agentvfs mcp` reads stdin as the daemon reads its socket: a line longer than the daemon
/// takes is answered by the bridge as soon as it passes the limit, with the daemon's error,
/// while the rest of it streams by unkept and unforwarded; the next line is served.
#[test]
fn the_stdio_bridge_answers_an_overlong_line_itself_and_keeps_serving() {
    let f = Fixture::new("");
    let mut bridge = bridge(&f);
    let mut stdin = bridge.stdin.take().unwrap();
    let stdout = BufReader::new(bridge.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let next = || -> Value {
        let line = rx.recv_timeout(Duration::from_secs(20)).expect("a line from the bridge");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    };
    // 64 MiB of one line, its newline not sent yet.
    stdin.write_all(br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":""#).unwrap();
    let chunk = vec![b'x'; 1 << 20];
    for _ in 0..64 {
        stdin.write_all(&chunk).unwrap();
    }
    stdin.flush().unwrap();
    let too_long = json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600,
        "message": "request line too long (limit 1048576 bytes); it was discarded"}});
    assert_eq!(next(), too_long);
    let held = resident(bridge.id());
    assert!(held < 24 << 20, "the bridge holds {} MiB", held >> 20);
    // The daemon never saw the line (it would answer it too): the next answer is the ping's.
    stdin.write_all(b"\"}}\n{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}\n").unwrap();
    assert_eq!(next(), json!({"jsonrpc": "2.0", "id": 2, "result": {}}));
    drop(stdin);
    assert!(bridge.wait().unwrap().success());
    assert!(rx.recv_timeout(Duration::from_secs(5)).is_err(), "a line more");
}

/// A reply's id is the request's id as written, whatever its form: JSON-RPC asks for the same
/// value, which a number read as a float and written again is not. Ids JSON-RPC forbids are
/// refused, with a `null` id.
#[test]
fn ids_are_echoed_exactly_as_sent() {
    let f = Fixture::new("");
    let mut c = Conn::open(&f.agent_socket());
    for id in ["1e2", "123456789012345678901234567890", "-0", "1.50", r#""\u0041b""#, r#""x""#, "7", "null"] {
        c.send(&format!("{{\"jsonrpc\":\"2.0\",\"id\": {id} ,\"method\":\"ping\"}}\n"));
        assert_eq!(c.recv_line(), format!("{{\"id\":{id},\"jsonrpc\":\"2.0\",\"result\":{{}}}}\n"));
    }
    // Errors carry it too, those found in parsing as well as a method's.
    c.send("{\"jsonrpc\":\"1.0\",\"id\":1E+2,\"method\":\"ping\"}\n");
    assert!(c.recv_line().contains(r#","id":1E+2,"#));
    c.send("{\"jsonrpc\":\"2.0\",\"id\":2.0e0,\"method\":\"vfs/explain\",\"params\":{}}\n");
    assert!(c.recv_line().contains(r#","id":2.0e0,"#));
    for id in ["true", "[1]", "{}"] {
        c.send(&format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"ping\"}}\n"));
        let reply = c.recv();
        assert_eq!(reply["id"], Value::Null, "{id}: {reply}");
        assert_eq!(Conn::error_of(&reply), (-32600, "`id` must be a number, a string or null".into()));
    }
    // Through `agentvfs mcp`, whose own refusals echo it as well.
    let lines = "{\"jsonrpc\":\"2.0\",\"id\":1e2,\"method\":\"interrupts/list\"}\n\
                 {\"jsonrpc\":\"2.0\",\"id\":3e2,\"method\":\"ping\"}\n";
    let mut bridge = bridge(&f);
    bridge.stdin.take().unwrap().write_all(lines.as_bytes()).unwrap();
    let out = bridge.wait_with_output().unwrap();
    let out = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.contains(r#""id":1e2,"#) && out.contains(r#"{"id":3e2,"jsonrpc":"2.0","result":{}}"#),
        "{out}"
    );
}

/// Every method takes its params by name: an array (by position, which JSON-RPC allows) is
/// refused alike by all of them, on both sockets, whether they read params or not.
#[test]
fn params_by_position_are_refused_by_every_method() {
    let f = Fixture::new("");
    let agent = ["initialize", "ping", "tools/list", "tools/call", "vfs/paths", "vfs/explain", "vfs/upload"];
    let control = ["vfs/download", "vfs/status", "vfs/reload", "interrupts/list", "interrupts/resolve"];
    for (socket, methods) in [(f.agent_socket(), &agent[..]), (f.socket(), &control[..])] {
        let mut c = Conn::open(&socket);
        for (id, method) in methods.iter().enumerate() {
            let reply = c.request(id as u64, method, json!([]));
            assert_eq!(Conn::error_of(&reply), (-32602, "params must be an object".into()), "{method}");
        }
    }
    // A subscription is not made either: the connection hears nothing more.
    let mut c = Conn::open(&f.socket());
    let reply = c.request(1, "interrupts/subscribe", json!([{}]));
    assert_eq!(Conn::error_of(&reply), (-32602, "params must be an object".into()));
    // An unknown method is still not found; by name, the same methods answer.
    assert_eq!(Conn::error_of(&c.request(2, "no/such", json!([]))).0, -32601);
    assert_eq!(c.result(3, "ping", json!({})), json!({}));
    assert_eq!(c.result(4, "vfs/paths", json!({}))["socket"], json!("control"));
}

/// `tools/call`'s `arguments` given as `null` are no arguments, as when left out; anything
/// else but an object is refused.
#[test]
fn null_arguments_are_no_arguments_and_other_non_objects_are_refused() {
    let f = Fixture::new("");
    std::fs::write(f.host_root.join("a.txt"), "x").unwrap();
    let mut c = Conn::open(&f.agent_socket());
    let absent = c.request(1, "tools/call", json!({"name": "ls"}));
    let null = c.request(1, "tools/call", json!({"name": "ls", "arguments": null}));
    let empty = c.request(1, "tools/call", json!({"name": "ls", "arguments": {}}));
    assert_eq!(null, absent);
    assert_eq!(null, empty);
    for arguments in [json!("/host"), json!(["/host"]), json!(3), json!(false)] {
        let reply = c.request(2, "tools/call", json!({"name": "ls", "arguments": arguments}));
        let (code, message) = Conn::error_of(&reply);
        assert_eq!(code, -32602, "{reply}");
        assert!(message.starts_with("`arguments` must be an object, got "), "{reply}");
    }
}
