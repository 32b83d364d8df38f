//! The control door's wire, over a real daemon: what a client that stops reading costs the same
//! user's other connections. (Framing, errors and the CLI: `control.rs`.)

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::control::FixturePaths;
use crate::harness::{Conn, Fixture};

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
