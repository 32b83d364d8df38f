//! The on-disk layout: table definitions, connection settings, schema versioning and
//! migrations, namespace roots, the claim on a namespace, and crash-orphan cleanup.
//!
//! Inode numbers are global and never reused: `meta.next_ino` is the first number not yet handed
//! out, and a backend reserves them in blocks (so a create writes no sequence row). Each
//! namespace owns a root inode, and since dentries, chunks and xattrs hang off inode numbers,
//! trees of different namespaces cannot reach each other. `inodes.ns` only scopes orphan cleanup.
//!
//! Content rows are keyed by one integer, `ino << CHUNK_BITS | idx`: a rowid table keyed so
//! needs no second index, which saves a page write on every commit of file data.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Transaction, TransactionBehavior};

use super::store::{self, NewNode};
use crate::error::{Errno, FsError, FsResult};

/// The version this build writes; stored in `PRAGMA user_version`.
pub(super) const SCHEMA_VERSION: i64 = 1;

/// Page size of new databases.
pub(super) const PAGE_SIZE: i64 = 4096;

/// Marks the file as ours ("avfs"), so a foreign SQLite database is refused rather than altered.
const APPLICATION_ID: i64 = 0x6176_6673;

/// Upgrades in order: entry `i` turns a version `i + 1` database into version `i + 2`.
/// To add version 2: append its migration here and bump `SCHEMA_VERSION`.
type Migration = fn(&Transaction<'_>) -> rusqlite::Result<()>;
const MIGRATIONS: &[Migration] = &[];
const _: () = assert!(SCHEMA_VERSION == 1 + MIGRATIONS.len() as i64);
const _: () = assert!(CHUNK_BITS == 28, "the chunks table's generated columns assume 28");

/// Bits of a chunk key that hold the chunk index. With 64 KiB chunks this bounds files at
/// 16 TiB and inode numbers at 2^35.
pub(super) const CHUNK_BITS: u32 = 28;
pub(super) const MAX_INO: u64 = 1 << (63 - CHUNK_BITS);

const SCHEMA_V1: &str = "
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO meta (key, value) VALUES ('next_ino', 1);
CREATE TABLE namespaces (
    id   INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    root INTEGER NOT NULL
);
CREATE TABLE inodes (
    ino    INTEGER PRIMARY KEY,
    ns     INTEGER NOT NULL,
    kind   INTEGER NOT NULL,
    perm   INTEGER NOT NULL,
    uid    INTEGER NOT NULL,
    gid    INTEGER NOT NULL,
    rdev   INTEGER NOT NULL,
    size   INTEGER NOT NULL,
    nlink  INTEGER NOT NULL,
    atime  INTEGER NOT NULL,
    mtime  INTEGER NOT NULL,
    ctime  INTEGER NOT NULL,
    crtime INTEGER NOT NULL,
    target BLOB
);
-- Only unlinked-but-open inodes (and crash leftovers) are in this index, so it costs nothing
-- for ordinary rows and makes the cleanup at open a lookup instead of a scan.
CREATE INDEX inodes_orphans ON inodes(ns) WHERE nlink = 0;
CREATE TABLE dentries (
    parent INTEGER NOT NULL,
    name   TEXT NOT NULL,
    child  INTEGER NOT NULL,
    PRIMARY KEY (parent, name)
) WITHOUT ROWID;
-- id = ino << 28 | idx (see CHUNK_BITS); ino and idx are computed, for people reading the file.
CREATE TABLE chunks (
    id   INTEGER PRIMARY KEY,
    data BLOB NOT NULL,
    ino  INTEGER AS (id >> 28) VIRTUAL,
    idx  INTEGER AS (id & 268435455) VIRTUAL
);
CREATE TABLE xattrs (
    ino   INTEGER NOT NULL,
    name  TEXT NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (ino, name)
) WITHOUT ROWID;
";

fn open_error(path: &Path, err: impl std::fmt::Display, errno: Errno) -> FsError {
    FsError::new(errno, format!("sqlite database {}: {err}", path.display()))
}

fn sql_error(path: &Path, err: rusqlite::Error) -> FsError {
    let err = FsError::from(err);
    open_error(path, err.context, err.errno)
}

/// Opens a connection with the settings every connection shares.
fn connect(path: &Path) -> rusqlite::Result<Connection> {
    let flags =
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)?;
    // Other backends may share the file (other namespaces); wait for their write lock.
    conn.busy_timeout(Duration::from_secs(30))?;
    conn.set_prepared_statement_cache_capacity(64);
    // Reads of the database file through a mapping instead of a pread per page: about a third
    // faster for large files. (Writes still go through the WAL.)
    conn.pragma_update(None, "mmap_size", 1i64 << 30)?;
    Ok(conn)
}

/// Opens the write connection, creating or upgrading the schema as needed. A file that is not
/// ours, or is newer than this build, is refused before anything in it is changed.
pub(super) fn open_writer(path: &Path) -> FsResult<Connection> {
    // SQLite says only "unable to open database file" where the file cannot be made or is
    // not a file: say what is wrong with it, and what to do.
    if let Err(e) = crate::private_file::create_private(path) {
        let errno = e.raw_os_error().map(Errno::from_raw).unwrap_or(Errno::EIO);
        let message =
            format!("cannot be created ({e}); make its directory writable, or set database to another path");
        return Err(open_error(path, message, errno));
    }
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        return Err(open_error(path, "is not a regular file; set database to a file's path", Errno::EISDIR));
    }
    let mut conn = connect(path).map_err(|e| sql_error(path, e))?;
    refuse_unwritable(&conn, path)?;
    check_version(&conn, path)?;
    configure_writer(&conn).map_err(|e| sql_error(path, e))?;
    let tx =
        conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| sql_error(path, e))?;
    create_or_migrate(&tx, path)?;
    tx.commit().map_err(|e| sql_error(path, e))?;
    Ok(conn)
}

/// Refuses a database this process cannot write. SQLite opens such a file read-only without a
/// word, and every change would then fail late (at a close nobody checks), so the daemon says
/// so at start instead, naming the file and the reason.
fn refuse_unwritable(conn: &Connection, path: &Path) -> FsResult<()> {
    if !conn.is_readonly(rusqlite::DatabaseName::Main).map_err(|e| sql_error(path, e))? {
        return Ok(());
    }
    let why = match std::fs::OpenOptions::new().write(true).open(path) {
        Err(e) => e.to_string(),
        Ok(_) => "SQLite can only open it read-only".to_string(),
    };
    let message = format!(
        "cannot be written ({why}); make it writable, or set read_only = true on its route to serve it read-only"
    );
    Err(open_error(path, message, Errno::EROFS))
}

/// Opens an existing, current store without writing anything to it (for a route served
/// read-only).
pub(super) fn open_read_only(path: &Path) -> FsResult<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(|e| sql_error(path, e))?;
    conn.busy_timeout(Duration::from_secs(30)).map_err(|e| sql_error(path, e))?;
    match check_version(&conn, path)? {
        SCHEMA_VERSION => Ok(conn),
        0 => Err(open_error(path, "holds no store yet: open it writable once", Errno::ENOENT)),
        v => Err(open_error(
            path,
            format!("schema version {v} must be upgraded to {SCHEMA_VERSION}, which a read-only store cannot; open it writable once"),
            Errno::EROFS,
        )),
    }
}

/// The id and root inode of an existing namespace (for a store served read-only).
pub(super) fn find_namespace(conn: &Connection, name: &str, path: &Path) -> FsResult<(i64, u64)> {
    conn.query_row("SELECT id, root FROM namespaces WHERE name = ?1", [name], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
        .map_err(|e| sql_error(path, e))?
        .map(|(ns, root): (i64, i64)| (ns, root as u64))
        .ok_or_else(|| {
            open_error(path, format!("has no namespace {name:?} to serve read-only"), Errno::ENOENT)
        })
}

/// Opens a read-only helper connection (the schema is already in place).
pub(super) fn open_reader(path: &Path) -> FsResult<Connection> {
    let conn = connect(path).map_err(|e| sql_error(path, e))?;
    conn.pragma_update(None, "query_only", true).map_err(|e| sql_error(path, e))?;
    Ok(conn)
}

/// Opens the connection of the checkpoint thread.
pub(super) fn open_checkpointer(path: &Path) -> FsResult<Connection> {
    let conn = connect(path).map_err(|e| sql_error(path, e))?;
    // NORMAL: a checkpoint syncs the WAL before and the database after copying.
    conn.pragma_update(None, "synchronous", "NORMAL").map_err(|e| sql_error(path, e))?;
    conn.pragma_update(None, "wal_autocheckpoint", 0i64).map_err(|e| sql_error(path, e))?;
    Ok(conn)
}

fn configure_writer(conn: &Connection) -> rusqlite::Result<()> {
    // Only takes effect on a new file, so it must come before anything writes the header.
    conn.pragma_update(None, "page_size", PAGE_SIZE)?;
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "wal", |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(rusqlite::Error::InvalidParameterName(format!(
            "journal_mode stays {mode}, WAL is required"
        )));
    }
    // NORMAL: a commit reaches the WAL file (so it survives kill -9) without an fsync;
    // `fsync` on a file syncs the WAL explicitly (see `Inner::sync_durable`).
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "cache_size", -32768i64)?; // 32 MiB
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    // Keep the WAL from staying huge after a large write has been checkpointed.
    conn.pragma_update(None, "journal_size_limit", 64i64 << 20)?;
    // Checkpoints run on their own thread (see `checkpoint`).
    conn.pragma_update(None, "wal_autocheckpoint", 0i64)?;
    Ok(())
}

/// Refuses a file that is not an agentvfs database or has a newer schema; returns its schema
/// version, 0 for an empty file.
fn check_version(conn: &Connection, path: &Path) -> FsResult<i64> {
    let sql = |e| sql_error(path, e);
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(sql)?;
    let app_id: i64 = conn.pragma_query_value(None, "application_id", |r| r.get(0)).map_err(sql)?;
    let tables: i64 = conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0)).map_err(sql)?;
    if tables == 0 && version == 0 {
        return Ok(0);
    }
    if app_id != APPLICATION_ID || version == 0 {
        return Err(open_error(path, "not an agentvfs database", Errno::EINVAL));
    }
    if version > SCHEMA_VERSION {
        let why = format!(
            "schema version {version} is newer than this agentvfs supports ({SCHEMA_VERSION}); \
             upgrade agentvfs"
        );
        return Err(open_error(path, why, Errno::EINVAL));
    }
    Ok(version)
}

/// Creates the schema in an empty file or brings an older one up to `SCHEMA_VERSION`. Checks
/// the version again inside the transaction: another process may have got there first.
fn create_or_migrate(tx: &Transaction<'_>, path: &Path) -> FsResult<()> {
    let sql = |e| sql_error(path, e);
    let mut version = check_version(tx, path)?;
    if version == 0 {
        tx.execute_batch(SCHEMA_V1).map_err(sql)?;
        tx.pragma_update(None, "application_id", APPLICATION_ID).map_err(sql)?;
        tx.pragma_update(None, "user_version", 1i64).map_err(sql)?;
        version = 1;
    }
    for v in version..SCHEMA_VERSION {
        MIGRATIONS[(v - 1) as usize](tx).map_err(sql)?;
        tx.pragma_update(None, "user_version", v + 1).map_err(sql)?;
    }
    Ok(())
}

/// Finds or creates a namespace; returns its id and root inode. The root of a new namespace
/// belongs to the daemon's user.
pub(super) fn namespace(conn: &mut Connection, name: &str, path: &Path) -> FsResult<(i64, u64)> {
    let sql = |e| sql_error(path, e);
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(sql)?;
    let found: Option<(i64, i64)> = tx
        .query_row("SELECT id, root FROM namespaces WHERE name = ?1", [name], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
        .map_err(sql)?;
    let (ns, root) = match found {
        Some((ns, root)) => (ns, root as u64),
        None => {
            tx.execute("INSERT INTO namespaces (name, root) VALUES (?1, 0)", [name]).map_err(sql)?;
            let ns = tx.last_insert_rowid();
            let root = reserve_inos(&tx, 1)? - 1;
            store::insert_node(&tx, root, &NewNode::root(ns))?;
            tx.execute("UPDATE namespaces SET root = ?2 WHERE id = ?1", params![ns, root as i64])
                .map_err(sql)?;
            (ns, root)
        }
    };
    tx.commit().map_err(sql)?;
    Ok((ns, root))
}

/// A descriptor of the database file at `path` for syncing it, opened once per process and
/// never closed. Closing any descriptor of a file drops every POSIX lock the process holds on
/// it, SQLite's own included (the shared lock that tells other processes the WAL is in use:
/// without it, another process closing its connection checkpoints and deletes the WAL this
/// one is still writing), so the file is never opened and closed beside SQLite.
pub(super) fn database_file(path: &Path) -> std::io::Result<&'static std::fs::File> {
    use std::os::unix::fs::MetadataExt;
    static KEPT: parking_lot::Mutex<Vec<((u64, u64), &'static std::fs::File)>> =
        parking_lot::Mutex::new(Vec::new());
    // Looked up by identity, without opening, and under the lock: a second descriptor opened
    // in a race would have to be closed.
    let mut kept = KEPT.lock();
    let meta = std::fs::metadata(path)?;
    let identity = (meta.dev(), meta.ino());
    if let Some((_, file)) = kept.iter().find(|(id, _)| *id == identity) {
        return Ok(file);
    }
    let file: &'static std::fs::File = Box::leak(Box::new(std::fs::File::open(path)?));
    kept.push((identity, file));
    Ok(file)
}

/// Claims namespace `ns` of the database at `path` for this process, then removes the
/// namespace's crash orphans. Two daemons on one namespace would each take the other's open
/// unlinked files for orphans and delete them, and keep caches the other makes stale, so a
/// claim held by another process fails with EBUSY. (Two routes of one daemon on one namespace
/// are refused earlier, by the configuration.)
///
/// The claim is an open-file-description lock on byte `ns` of a file beside the database
/// (`<database>-lock`), on one descriptor per file that the process keeps open until it exits:
/// the kernel drops the claim when the daemon dies, however it dies. The database file itself
/// is not used, because closing a second descriptor of it would drop SQLite's own POSIX locks.
pub(super) fn claim_namespace(conn: &mut Connection, path: &Path, name: &str, ns: i64) -> FsResult<Claim> {
    let mut lock_path = path.as_os_str().to_owned();
    lock_path.push("-lock");
    let lock_error =
        |e: std::io::Error| open_error(path, format!("{}: {e}", Path::new(&lock_path).display()), Errno::EIO);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(lock_error)?;
    let key = std::fs::canonicalize(&lock_path).map_err(lock_error)?;
    let mut claims = CLAIMS.lock().unwrap_or_else(|e| e.into_inner());
    if !claims.iter().any(|c| c.key == key) {
        claims.push(FileClaims { key: key.clone(), file, namespaces: Vec::new() });
    }
    let claims_of_file = claims.iter_mut().find(|c| c.key == key).expect("just added");
    let lock = ns_lock(libc::F_WRLCK, ns, 1);
    // SAFETY: a valid descriptor and a fully initialised `struct flock`.
    if unsafe { libc::fcntl(claims_of_file.file.as_raw_fd(), libc::F_OFD_SETLK, &lock) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EAGAIN | libc::EACCES) => open_error(
                path,
                format!("namespace \"{name}\" is in use by another agentvfs daemon"),
                Errno::EBUSY,
            ),
            _ => open_error(path, format!("locking namespace \"{name}\": {e}"), Errno::EIO),
        });
    }
    if !claims_of_file.namespaces.contains(&ns) {
        claims_of_file.namespaces.push(ns);
    }
    drop(claims);
    let sql = |e| sql_error(path, e);
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(sql)?;
    remove_orphans(&tx, ns)?;
    tx.commit().map_err(sql)?;
    Ok(Claim { key })
}

/// The claims of this process on one database file: the descriptor holding their locks, and
/// the namespaces claimed (kept until the process exits, as the locks are).
struct FileClaims {
    key: std::path::PathBuf,
    file: std::fs::File,
    namespaces: Vec<i64>,
}

static CLAIMS: std::sync::Mutex<Vec<FileClaims>> = std::sync::Mutex::new(Vec::new());

fn ns_lock(kind: libc::c_int, start: i64, len: i64) -> libc::flock {
    libc::flock { l_type: kind as i16, l_whence: libc::SEEK_SET as i16, l_start: start, l_len: len, l_pid: 0 }
}

/// This process's claim on a namespace of a database file.
pub(super) struct Claim {
    key: std::path::PathBuf,
}

impl Claim {
    /// Whether no other namespace of the file is claimed, by this process or another: then no
    /// other writer can be waiting for SQLite's write lock (a store served read-only claims
    /// nothing, and never writes).
    pub fn alone(&self) -> bool {
        let claims = CLAIMS.lock().unwrap_or_else(|e| e.into_inner());
        let Some(mine) = claims.iter().find(|c| c.key == self.key) else { return false };
        if mine.namespaces.len() != 1 {
            return false;
        }
        // Locks of this descriptor never conflict with themselves: any lock reported is
        // another process's.
        let mut probe = ns_lock(libc::F_WRLCK, 0, 0);
        // SAFETY: a valid descriptor and a fully initialised `struct flock`.
        let asked = unsafe { libc::fcntl(mine.file.as_raw_fd(), libc::F_OFD_GETLK, &mut probe) };
        asked == 0 && probe.l_type == libc::F_UNLCK as i16
    }
}

/// Reserves `n` inode numbers; returns the end of the reserved range (exclusive).
pub(super) fn reserve_inos(conn: &Connection, n: u64) -> FsResult<u64> {
    let end: i64 = conn
        .prepare_cached("UPDATE meta SET value = value + ?1 WHERE key = 'next_ino' RETURNING value")?
        .query_row([n as i64], |r| r.get(0))?;
    let end = end as u64;
    if end > MAX_INO {
        return Err(FsError::new(Errno::ENOSPC, "inode numbers exhausted"));
    }
    Ok(end)
}

/// Deletes inodes of this namespace with no name left: files unlinked while open when the
/// daemon died. Other namespaces are left alone (their daemon may still hold them open).
fn remove_orphans(tx: &Transaction<'_>, ns: i64) -> FsResult<()> {
    let orphans: Vec<i64> = tx
        .prepare("SELECT ino FROM inodes WHERE ns = ?1 AND nlink = 0")?
        .query_map([ns], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for ino in orphans {
        store::delete_rows(tx, ino as u64)?;
    }
    Ok(())
}
