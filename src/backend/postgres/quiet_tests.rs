//! Tests of quiet while alone (`quiet`): a daemon alone on its namespace sends no
//! notifications, and no daemon that joins, or whose peer lost its listening connection, ever
//! misses a change.

use std::time::{Duration, Instant};

use postgres::fallible_iterator::FallibleIterator;
use postgres::{Client, NoTls};

use super::testing::TestServer;
use super::tests::{backend, fresh_namespace};
use super::PostgresBackend;
use crate::backend::{Backend, Caller};

fn client() -> Client {
    Client::connect(&TestServer::shared().url(), NoTls).unwrap()
}

/// The server processes holding an alone lease on the namespace of `b`.
fn lease_holders(b: &PostgresBackend) -> Vec<i32> {
    let rows = client().query(&super::quiet::lease_holders(&b.inner.channel), &[]).unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

/// How long a daemon may take to go quiet (take its lease): its listener looks every few
/// seconds, and on a loaded machine (the whole suite in parallel on two CPUs) a look can miss.
const GOES_QUIET: Duration = Duration::from_secs(20);

/// Waits up to `limit` for `check`.
fn within(limit: Duration, check: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    check()
}

/// A connection listening on the namespace of `b` without being a daemon (so no daemon counts
/// it); the payloads that arrive within `wait`.
struct Eavesdropper(Client);

impl Eavesdropper {
    fn on(b: &PostgresBackend) -> Eavesdropper {
        let mut c = client();
        c.batch_execute(&format!("LISTEN \"{}\"", b.inner.channel)).unwrap();
        Eavesdropper(c)
    }

    fn heard(&mut self, wait: Duration) -> Vec<String> {
        let mut out = Vec::new();
        let mut notifications = self.0.notifications();
        let mut arrived = notifications.timeout_iter(wait);
        while let Ok(Some(n)) = arrived.next() {
            out.push(n.payload().to_string());
        }
        out
    }
}

fn write(b: &PostgresBackend, path: &str, data: &[u8]) {
    let (_, f) = b.create(path, 0o644, libc::O_WRONLY, &Caller::daemon()).unwrap();
    f.write(0, data).unwrap();
}

#[test]
fn a_daemon_alone_sends_no_notifications_until_another_joins() {
    let ns = fresh_namespace();
    let first = backend(&ns);
    assert!(within(GOES_QUIET, || lease_holders(&first).len() == 1), "the first daemon went quiet");
    let mut ear = Eavesdropper::on(&first);
    write(&first, "a", b"1");
    first.rename("a", "b", 0).unwrap();
    assert_eq!(ear.heard(Duration::from_millis(300)), Vec::<String>::new(), "alone, it notifies nothing");

    // The second daemon knows "c" is absent and what "b" is, then the first changes both.
    let second = backend(&ns);
    assert_eq!(lease_holders(&first), Vec::<i32>::new(), "joining took the lease away");
    assert!(second.getattr("c").is_err());
    assert_eq!(second.getattr("b").unwrap().size, 1);
    write(&first, "c", b"22");
    first.open("b", libc::O_WRONLY).unwrap().write(0, b"333").unwrap();
    assert!(
        ear.heard(Duration::from_millis(300)).iter().any(|p| p.ends_with("\tc")),
        "the first daemon notifies"
    );
    assert!(within(Duration::from_millis(100), || second.getattr("c").ok().map(|a| a.size) == Some(2)));
    assert!(within(Duration::from_millis(100), || second.getattr("b").ok().map(|a| a.size) == Some(3)));

    // Alone again once the second daemon is gone (it looks every few seconds).
    drop(second);
    assert!(within(GOES_QUIET, || lease_holders(&first).len() == 1), "quiet again");
}

/// A quiet daemon whose listening connection ends notifies at once: the server sends what the
/// lease no longer holds back, before the daemon even knows.
#[test]
fn a_quiet_daemon_that_loses_its_listening_connection_notifies_again() {
    let ns = fresh_namespace();
    let b = backend(&ns);
    assert!(within(GOES_QUIET, || lease_holders(&b).len() == 1));
    let mut ear = Eavesdropper::on(&b);
    let holders = lease_holders(&b);
    client().query_one("SELECT pg_terminate_backend($1)", &[&holders[0]]).unwrap();
    assert!(within(Duration::from_secs(1), || lease_holders(&b).is_empty()));
    write(&b, "after", b"x");
    let heard = ear.heard(Duration::from_millis(300));
    assert!(heard.iter().any(|p| p.ends_with("\tafter")), "heard {heard:?}");
}

/// Changes a quiet daemon makes while another one joins are all seen by the one that joins:
/// those decided quiet commit before the join ends, the later ones notify.
#[test]
fn a_daemon_joining_during_a_stream_of_changes_misses_none() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    let ns = fresh_namespace();
    let first = Arc::new(backend(&ns));
    assert!(within(GOES_QUIET, || lease_holders(&first).len() == 1));
    write(&first, "f", b"");
    let (stop, size) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let writer = {
        let (first, stop, size) = (first.clone(), stop.clone(), size.clone());
        std::thread::spawn(move || {
            let f = first.open("f", libc::O_WRONLY).unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                f.write(n, b"x").unwrap();
                n += 1;
                size.store(n, Ordering::Relaxed);
            }
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let second = backend(&ns);
    // The joining daemon caches the file's attributes while the writes go on.
    let seen = second.getattr("f").unwrap().size;
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let last = size.load(Ordering::Relaxed);
    assert!(last > seen && seen > 0, "the writes went on across the join: {seen} then {last}");
    assert!(
        within(Duration::from_millis(100), || second.getattr("f").ok().map(|a| a.size) == Some(last)),
        "the joining daemon sees the last size {last}, not {:?}",
        second.getattr("f").ok().map(|a| a.size)
    );
}

/// A join waits for a change that was decided quiet and has not committed yet (here held open
/// in a transaction that speaks for the quiet daemon), so the joining daemon never caches what
/// that change is about to replace.
#[test]
fn a_join_waits_for_the_quiet_changes_under_way() {
    let ns = fresh_namespace();
    let first = backend(&ns);
    assert!(within(GOES_QUIET, || lease_holders(&first).len() == 1));
    write(&first, "f", b"1");
    let ino = first.getattr("f").unwrap().ino;
    let mut under_way = client();
    under_way
        .batch_execute(&format!(
            "BEGIN; UPDATE agentvfs.inodes SET size = 7 WHERE ino = {ino};
             SELECT agentvfs.notice('{}', E'{}\\tc\\tf')",
            first.inner.channel, first.inner.instance
        ))
        .unwrap();
    let joining = std::thread::spawn(move || {
        let second = backend(&ns);
        let size = second.getattr("f").unwrap().size;
        (second, size)
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(!joining.is_finished(), "the join waits for the change under way");
    under_way.batch_execute("COMMIT").unwrap();
    let (_second, size) = joining.join().unwrap();
    assert_eq!(size, 7, "and then reads what it committed");
}
