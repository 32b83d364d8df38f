//! The audit log: every denial (and later every interrupt and resolution), to `tracing` and to
//! a SQLite table, written by a background thread so the hot path never waits for the disk.
//!
//! The table holds the true strings (paths, command lines, decisions), byte for byte, for
//! machines; whatever shows them to a human escapes them with [`crate::display::escape`], as
//! the `tracing` event here does.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection};

use crate::display::Escaped;
use crate::error::{Errno, FsError, FsResult};
use crate::log_limit::{Held, RateLimited};

#[derive(Clone, Debug)]
pub struct AuditEvent {
    pub time: SystemTime,
    /// "fuse" or "tool".
    pub door: &'static str,
    /// Which control socket a tool call came through (`agent` or `control`); `None` at the
    /// mount. With `pid` and `uid` (the socket's peer, or the syscall's caller): the principal.
    pub socket: Option<&'static str>,
    pub pid: u32,
    pub uid: u32,
    /// The process's command line (syscalls) or the tool name and arguments (tool calls), cut
    /// to [`MAX_COMMAND`] bytes when recorded.
    pub command: String,
    /// The syscall or tool name, e.g. "open", "rename", "read_file".
    pub operation: String,
    /// The rule operation class: "read" or "write".
    pub class: &'static str,
    pub path: String,
    pub rule: Option<usize>,
    /// "deny", "hide", "interrupt", ...
    pub decision: String,
}

pub struct Audit {
    sender: Option<SyncSender<AuditEvent>>,
    /// Records that did not reach the table: the queue was full, or their batch failed to be
    /// written (shared with the writer thread).
    dropped: Arc<AtomicU64>,
    recorded: AtomicU64,
}

/// The most of a command line (or a tool call's arguments) a record keeps: the caller chooses
/// them, and a process with megabytes of arguments denied in a loop would otherwise fill the
/// audit database's disk (and the log, and the queue's memory) in seconds.
pub const MAX_COMMAND: usize = 4096;

/// `value` as compact JSON for a record, cut like a command line but without building the
/// whole text first: a tool call's arguments may be a staged 256 MiB string, whose JSON (six
/// bytes for every control character) would be several times that.
pub fn arguments_text(value: &serde_json::Value) -> String {
    struct Kept {
        text: Vec<u8>,
        total: usize,
    }
    impl std::io::Write for Kept {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            // Room for the tool's name and the cut's note within MAX_COMMAND.
            let room = (MAX_COMMAND - 256).saturating_sub(self.text.len());
            self.text.extend_from_slice(&buf[..buf.len().min(room)]);
            self.total += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut kept = Kept { text: Vec::new(), total: 0 };
    let _ = serde_json::to_writer(&mut kept, value);
    // JSON is UTF-8; only the cut may have split a character.
    let whole = match std::str::from_utf8(&kept.text) {
        Ok(text) => text.len(),
        Err(e) => e.valid_up_to(),
    };
    let text = String::from_utf8_lossy(&kept.text[..whole]).into_owned();
    match kept.total - text.len() {
        0 => text,
        cut => text + &cut_note(cut),
    }
}

/// `command` cut to [`MAX_COMMAND`] bytes (at a character boundary), saying how much was cut.
fn cut_command(command: &mut String) {
    if command.len() <= MAX_COMMAND {
        return;
    }
    let end = crate::display::prefix_within(command, MAX_COMMAND).len();
    let cut = command.len() - end;
    command.truncate(end);
    command.push_str(&cut_note(cut));
}

/// What ends a text cut short: how much more there was.
fn cut_note(cut: usize) -> String {
    format!("… [{cut} more bytes]")
}

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY,
    time_ms INTEGER NOT NULL,
    door TEXT NOT NULL,
    socket TEXT,
    pid INTEGER NOT NULL,
    uid INTEGER NOT NULL,
    command TEXT NOT NULL,
    operation TEXT NOT NULL,
    class TEXT NOT NULL,
    path TEXT NOT NULL,
    rule INTEGER,
    decision TEXT NOT NULL
)";

impl Audit {
    /// Opens (creating) the audit database, which keeps the newest `max_records` records;
    /// `None` logs to `tracing` only.
    pub fn open(database: Option<&Path>, max_records: u64) -> FsResult<Audit> {
        let dropped = Arc::new(AtomicU64::new(0));
        let sender = match database {
            None => None,
            Some(path) => {
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                crate::private_file::create_private(path)?;
                let mut conn = Connection::open(path)?;
                // SQLite opens a file it cannot write read-only, without a word; every record
                // would then be lost.
                if conn.is_readonly(rusqlite::DatabaseName::Main)? {
                    let why = match std::fs::OpenOptions::new().write(true).open(path) {
                        Err(e) => e.to_string(),
                        Ok(_) => "SQLite can only open it read-only".to_string(),
                    };
                    return Err(FsError::new(
                        Errno::EROFS,
                        format!("{} cannot be written ({why}); make it writable", path.display()),
                    ));
                }
                conn.pragma_update(None, "journal_mode", "WAL")?;
                // A commit survives the daemon's death; records are best effort anyway (they
                // are dropped when the queue is full), so they need not wait for the disk.
                conn.pragma_update(None, "synchronous", "NORMAL")?;
                conn.execute(SCHEMA, [])?;
                add_socket_column(&conn)?;
                let (tx, rx) = sync_channel::<AuditEvent>(4096);
                let lost = dropped.clone();
                std::thread::Builder::new()
                    .name("audit".into())
                    .spawn(move || write_records(&mut conn, &rx, max_records, &lost))?;
                Some(tx)
            }
        };
        Ok(Audit { sender, dropped, recorded: AtomicU64::new(0) })
    }

    /// Logs `event` (its strings escaped, see [`crate::display`]) and queues it for the table
    /// (as it is).
    ///
    /// A caller can provoke denials as fast as it likes (`cat .env` in a loop), so their log
    /// line is let through a few times a second, saying how many were held back; the table
    /// keeps every record. Interrupts and their resolutions, which a human paces, are all
    /// logged.
    pub fn record(&self, mut event: AuditEvent) {
        static DENIALS: RateLimited = RateLimited::new();
        cut_command(&mut event.command);
        match event.decision.as_str() {
            "deny" | "hide" => {
                if let Some(held) = DENIALS.admit() {
                    self.log(&event, held);
                }
            }
            _ => self.log(&event, Held(0)),
        }
        self.recorded.fetch_add(1, Ordering::Relaxed);
        if let Some(tx) = &self.sender {
            if let Err(TrySendError::Full(_)) = tx.try_send(event) {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn log(&self, event: &AuditEvent, held: Held) {
        tracing::info!(
            target: "agentvfs::audit",
            door = event.door,
            socket = event.socket,
            pid = event.pid,
            uid = event.uid,
            command = %Escaped(&event.command),
            operation = %Escaped(&event.operation),
            path = %Escaped(&event.path),
            rule = ?event.rule,
            decision = %Escaped(&event.decision),
            "{} {} {} refused{held}",
            Escaped(&event.operation),
            event.class,
            Escaped(&event.path)
        );
    }

    pub fn recorded(&self) -> u64 {
        self.recorded.load(Ordering::Relaxed)
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// At most this many queued records go into one transaction.
const BATCH: usize = 512;

/// The writer thread: what is queued goes in one transaction, and every so often the oldest
/// records beyond `max_records` are deleted (cheap: ids grow with time).
fn write_records(conn: &mut Connection, queue: &Receiver<AuditEvent>, max_records: u64, dropped: &AtomicU64) {
    let prune_every = (max_records / 10).clamp(1, 10_000);
    let mut since_prune = 0;
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match queue.try_recv() {
                Ok(event) => batch.push(event),
                Err(_) => break,
            }
        }
        let written = conn.transaction().and_then(|tx| {
            for event in &batch {
                insert(&tx, event)?;
            }
            tx.commit()
        });
        if let Err(e) = written {
            tracing::warn!("audit log write failed ({} records lost): {e}", batch.len());
            dropped.fetch_add(batch.len() as u64, Ordering::Relaxed);
            continue;
        }
        since_prune += batch.len() as u64;
        if since_prune >= prune_every {
            since_prune = 0;
            let pruned = conn.execute(
                "DELETE FROM audit WHERE id <= (SELECT max(id) FROM audit) - ?1",
                [max_records.min(i64::MAX as u64) as i64],
            );
            if let Err(e) = pruned {
                tracing::warn!("audit log pruning failed: {e}");
            }
        }
    }
}

fn insert(conn: &Connection, e: &AuditEvent) -> rusqlite::Result<()> {
    let ms = e.time.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
    conn.execute(
        "INSERT INTO audit (time_ms, door, socket, pid, uid, command, operation, class, path, rule, decision)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        params![
            ms,
            e.door,
            e.socket,
            e.pid,
            e.uid,
            e.command,
            e.operation,
            e.class,
            e.path,
            e.rule.map(|r| r as i64),
            e.decision
        ],
    )?;
    Ok(())
}

/// A table made before records named their socket gets the column (`NULL` in the old rows).
fn add_socket_column(conn: &Connection) -> rusqlite::Result<()> {
    let has: bool =
        conn.prepare("SELECT 1 FROM pragma_table_info('audit') WHERE name = 'socket'")?.exists([])?;
    if !has {
        conn.execute("ALTER TABLE audit ADD COLUMN socket TEXT", [])?;
    }
    Ok(())
}

/// A process's command line from /proc, arguments joined by spaces ("" once it has exited).
pub fn command_line(pid: u32) -> String {
    match std::fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(bytes) => String::from_utf8_lossy(&bytes)
            .split('\0')
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(" "),
        Err(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(n: u32) -> AuditEvent {
        AuditEvent {
            time: SystemTime::now(),
            door: "fuse",
            socket: None,
            pid: n,
            uid: 0,
            command: String::new(),
            operation: "open".into(),
            class: "read",
            path: format!("/secret/{n}"),
            rule: Some(0),
            decision: "deny".into(),
        }
    }

    #[test]
    fn a_table_from_before_sockets_gets_the_column() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("audit.db");
        let old = SCHEMA.replace("    socket TEXT,\n", "");
        Connection::open(&db).unwrap().execute(&old, []).unwrap();
        let audit = Audit::open(Some(&db), 10).unwrap();
        audit.record(AuditEvent { socket: Some("agent"), door: "tool", ..event(7) });
        audit.record(event(8));
        let conn = Connection::open(&db).unwrap();
        let rows = || -> Vec<(String, Option<String>)> {
            let mut stmt = conn.prepare("SELECT door, socket FROM audit ORDER BY id").unwrap();
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect()
        };
        for _ in 0..200 {
            if rows().len() == 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(rows(), [("tool".to_string(), Some("agent".to_string())), ("fuse".to_string(), None)]);
        // Opening it again finds the column there.
        drop(Audit::open(Some(&db), 10).unwrap());
    }

    #[test]
    fn only_the_newest_records_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("audit.db");
        let audit = Audit::open(Some(&db), 10).unwrap();
        for n in 1..=25 {
            audit.record(event(n));
            // Some records arrive in batches of one, some together.
            if n % 7 == 0 {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        // The writer is asynchronous: wait (2 s at most) for the last record and the pruning.
        let conn = Connection::open(&db).unwrap();
        let kept = || -> Vec<u32> {
            let mut stmt = conn.prepare("SELECT pid FROM audit ORDER BY id").unwrap();
            stmt.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect()
        };
        let mut pids = kept();
        for _ in 0..200 {
            if pids.last() == Some(&25) && pids.len() <= 10 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            pids = kept();
        }
        assert_eq!(pids, (16..=25).collect::<Vec<_>>());
        assert_eq!((audit.recorded(), audit.dropped()), (25, 0));
    }

    #[test]
    fn arguments_are_cut_without_being_written_whole() {
        let small = serde_json::json!({"file_path": "/a", "content": "é"});
        assert_eq!(arguments_text(&small), r#"{"content":"é","file_path":"/a"}"#);
        let large = serde_json::json!({"content": "\u{1}".repeat(1 << 20)});
        let text = arguments_text(&large);
        let kept = MAX_COMMAND - 256;
        assert_eq!(
            text,
            format!(
                "{{\"content\":\"{}… [{} more bytes]",
                &"\\u0001".repeat(kept)[..kept - 12],
                6 * (1 << 20) + 14 - kept
            )
        );
        let wide = serde_json::json!({"content": "é".repeat(5000)});
        assert!(arguments_text(&wide).contains("é… ["), "cut at a character boundary");
    }

    #[test]
    fn a_long_command_is_cut_and_says_so() {
        let mut long = format!("{}é", "x".repeat(MAX_COMMAND - 1));
        cut_command(&mut long);
        assert_eq!(long, format!("{}… [2 more bytes]", "x".repeat(MAX_COMMAND - 1)), "cut before the é");
        let mut short = "cat .env".to_string();
        cut_command(&mut short);
        assert_eq!(short, "cat .env");
    }

    /// Records whose batch cannot be written (the database locked by another process past its
    /// busy time, say) are counted as dropped, not lost unseen.
    #[test]
    fn records_that_fail_to_be_written_are_counted_as_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("audit.db");
        let audit = Audit::open(Some(&db), 100).unwrap();
        let locker = Connection::open(&db).unwrap();
        locker.execute_batch("BEGIN EXCLUSIVE").unwrap();
        audit.record(event(1));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while audit.dropped() == 0 {
            assert!(std::time::Instant::now() < deadline, "the failed batch was not counted");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(audit.dropped(), 1);
    }
}
