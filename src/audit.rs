//! The audit log: every denial (and later every interrupt and resolution), to `tracing` and to
//! a SQLite table, written by a background thread so the hot path never waits for the disk.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection};

use crate::error::FsResult;

#[derive(Clone, Debug)]
pub struct AuditEvent {
    pub time: SystemTime,
    /// "fuse" or "tool".
    pub door: &'static str,
    pub pid: u32,
    pub uid: u32,
    /// The process's command line (syscalls) or the tool name and arguments (tool calls).
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
    dropped: AtomicU64,
    recorded: AtomicU64,
}

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY,
    time_ms INTEGER NOT NULL,
    door TEXT NOT NULL,
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
    /// Opens (creating) the audit database; `None` logs to `tracing` only.
    pub fn open(database: Option<&Path>) -> FsResult<Audit> {
        let sender = match database {
            None => None,
            Some(path) => {
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                let conn = Connection::open(path)?;
                conn.pragma_update(None, "journal_mode", "WAL")?;
                conn.execute(SCHEMA, [])?;
                let (tx, rx) = sync_channel::<AuditEvent>(4096);
                std::thread::Builder::new().name("audit".into()).spawn(move || {
                    while let Ok(event) = rx.recv() {
                        if let Err(e) = insert(&conn, &event) {
                            tracing::warn!("audit log write failed: {e}");
                        }
                    }
                })?;
                Some(tx)
            }
        };
        Ok(Audit { sender, dropped: AtomicU64::new(0), recorded: AtomicU64::new(0) })
    }

    pub fn record(&self, event: AuditEvent) {
        tracing::info!(
            target: "agentvfs::audit",
            door = event.door,
            pid = event.pid,
            uid = event.uid,
            command = %event.command,
            operation = %event.operation,
            path = %event.path,
            rule = ?event.rule,
            decision = %event.decision,
            "{} {} {} refused",
            event.operation,
            event.class,
            event.path
        );
        self.recorded.fetch_add(1, Ordering::Relaxed);
        if let Some(tx) = &self.sender {
            if let Err(TrySendError::Full(_)) = tx.try_send(event) {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub fn recorded(&self) -> u64 {
        self.recorded.load(Ordering::Relaxed)
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

fn insert(conn: &Connection, e: &AuditEvent) -> rusqlite::Result<()> {
    let ms = e.time.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
    conn.execute(
        "INSERT INTO audit (time_ms, door, pid, uid, command, operation, class, path, rule, decision)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params![
            ms,
            e.door,
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
