//! A shared persistent backend: one namespace of a tree kept in PostgreSQL, which daemons on
//! several hosts may mount at once.
//!
//! Layout and migrations are in `schema`, the rows (and the shared tree logic on them) in
//! `store`, the path operations of [`Backend`](crate::backend::Backend) in `ops`, open files
//! in `file` (new ones made while alone in `drafts`), other daemons' changes in `notify`, what
//! this daemon knows of directories without asking in `dircache`, connection settings (URL,
//! password files) in `connect`. `langgraph` is the other layout: the files of LangGraph's
//! `store` table.
//!
//! Every operation is one transaction committed before it returns, file writes included, so
//! what a call acknowledged survives a `kill -9` of the daemon and is seen by every other
//! daemon at once. The exceptions are made while this daemon is alone on its namespace, when
//! nobody else can look: a file created then (`drafts`) stays in the daemon until its close
//! or until anyone could tell, and then goes to the server in one call; known name changes
//! (`journal`) and small writes to stored files (`held_writes`) wait, in order, until the
//! next operation that asks the server (a close of a descriptor that wrote, among them).
//! Commits do not wait for the server's disk; `fsync` and `fsyncdir` do
//! (`Inner::sync_durable`), and so does the `close` of a descriptor that wrote, with the
//! route's `sync_on_close`. Name changes (create, link,
//! unlink, rmdir, rename) of one namespace take a transaction-scoped advisory lock, so that
//! concurrent renames on two hosts cannot cut a subtree loose; writes and attribute changes
//! lock the inode's row. Each committed change sends a notification carrying the changed
//! path, by which the other daemons invalidate their kernel caches.
//!
//! A file unlinked while this daemon holds it open keeps its rows, marked with this daemon's
//! instance, until its last close; a daemon that died leaves them behind, and the next daemon
//! on the namespace deletes them once the instance's advisory lock (held for the life of the
//! daemon by its listening connection) is free.

mod connect;
mod dircache;
mod drafts;
#[cfg(test)]
mod drafts_tests;
mod file;
mod functions;
mod handles;
mod held_writes;
mod journal;
mod langgraph;
mod notify;
mod ops;
mod quiet;
#[cfg(test)]
mod quiet_tests;
mod schema;
mod splice;
mod store;
pub mod testing;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use postgres::{Client, Statement};

use crate::error::{Errno, FsError, FsResult};
pub use connect::PgSettings;
pub use langgraph::LangGraphBackend;
use store::Sql;

/// How long an operation waits for a connection before answering EIO.
const CONNECT_WAIT: Duration = Duration::from_secs(3);
/// Connections kept at most (per route).
const POOL_SIZE: u32 = 8;
/// How many inode numbers one `nextval` of the sequence reserves.
const INO_BLOCK: u64 = 1024;
/// Times a transaction is tried when the server reports a deadlock or serialization failure.
const TX_TRIES: usize = 5;

/// A route's storage in PostgreSQL, one namespace of it.
pub struct PostgresBackend {
    inner: Arc<Inner>,
}

/// A pooled connection and its prepared statements.
pub(super) struct Conn {
    client: Client,
    stmts: HashMap<&'static str, Statement>,
    /// [`PgSettings::generation`] when it was made: older than the settings' is stale.
    generation: u64,
}

struct Manager {
    settings: Arc<PgSettings>,
}

impl r2d2::ManageConnection for Manager {
    type Connection = Conn;
    type Error = postgres::Error;

    fn connect(&self) -> Result<Conn, postgres::Error> {
        let generation = self.settings.generation();
        Ok(Conn { client: self.settings.connect()?, stmts: HashMap::new(), generation })
    }

    fn is_valid(&self, conn: &mut Conn) -> Result<(), postgres::Error> {
        conn.client.simple_query("").map(|_| ())
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.client.is_closed() || conn.generation != self.settings.generation()
    }
}

/// A route's connections, made as they are needed.
fn pool(settings: &Arc<PgSettings>) -> r2d2::Pool<Manager> {
    r2d2::Pool::builder()
        .max_size(POOL_SIZE)
        .min_idle(Some(1))
        .connection_timeout(CONNECT_WAIT)
        // A check before every use would cost a round trip per operation; a broken
        // connection fails its statement instead, and is dropped when it comes back. One made
        // before the server was last found gone is stale and not handed out (`pooled`).
        .test_on_check_out(false)
        .error_handler(Box::new(PoolErrors { server: settings.server() }))
        .build_unchecked(Manager { settings: settings.clone() })
}

/// A connection from `pool` made since the server was last found gone: an older one is
/// stale (the server that made it may have closed it), and goes back to the pool, which drops
/// it (`has_broken`).
fn fresh_connection(
    pool: &r2d2::Pool<Manager>,
    settings: &PgSettings,
) -> FsResult<r2d2::PooledConnection<Manager>> {
    loop {
        let conn = pool.get().map_err(|e| {
            unreachable_line(&settings.server(), &e);
            FsError::new(Errno::EIO, format!("postgres {}: no connection: {e}", settings.server()))
        })?;
        if conn.generation == settings.generation() {
            return Ok(conn);
        }
    }
}

/// Where r2d2 reports connection failures: one rate-limited line each, naming the server.
#[derive(Debug)]
struct PoolErrors {
    server: String,
}

impl r2d2::HandleError<postgres::Error> for PoolErrors {
    fn handle_error(&self, error: postgres::Error) {
        unreachable_line(&self.server, &error);
    }
}

/// The log line of a database that cannot be reached, a few a second at most.
fn unreachable_line(server: &str, error: &dyn std::fmt::Display) {
    static DOWN: crate::log_limit::RateLimited = crate::log_limit::RateLimited::new();
    if let Some(held) = DOWN.admit() {
        tracing::error!(
            "postgres route: cannot reach {server}: {error}; operations answer EIO until it is back{held}"
        );
    }
}

struct Inner {
    settings: Arc<PgSettings>,
    pool: r2d2::Pool<Manager>,
    namespace: String,
    ns: i64,
    root: u64,
    /// This daemon's instance of the namespace: marks its orphans, and its own notifications.
    instance: i64,
    /// The statement taking the advisory lock that serialises name changes in this namespace.
    tree_lock: String,
    /// That lock's first key.
    tree_key: i32,
    /// The notification channel of this namespace.
    channel: String,
    /// Inode numbers reserved and not yet used: `(next, end)`.
    inos: Mutex<(u64, u64)>,
    /// This daemon's open handles.
    handles: handles::Handles,
    /// Files created while alone and not yet stored.
    drafts: drafts::Drafts,
    /// The directories' attributes and listings this daemon knows without asking.
    dirs: Arc<dircache::DirCache>,
    /// Keeps the instance's lock and listens for other daemons' changes (its thread, once
    /// started by [`PostgresBackend::watch`]).
    listener: notify::Listener,
}

/// How a transaction starts.
#[derive(Clone, Copy, PartialEq)]
enum Lock {
    /// Row locks only (data and attribute changes).
    Rows,
    /// The namespace's name lock too.
    Tree,
}

impl PostgresBackend {
    /// Connects, creates or upgrades the schema, finds or creates `namespace`, and removes the
    /// orphans of daemons that died.
    pub fn open(settings: PgSettings, namespace: &str) -> FsResult<PostgresBackend> {
        let settings = Arc::new(settings);
        let mut client = settings.connect().map_err(|e| settings.unreachable_at_start(e))?;
        schema::create_or_migrate(&mut client, &settings)?;
        let (ns, root) = schema::namespace(&mut client, &settings, namespace)?;
        let instance = schema::new_instance(&mut client, &settings)?;
        let listener = notify::Listener::new(settings.clone(), instance, ns)?;
        schema::remove_dead_orphans(&mut client, &settings, ns)?;
        let pool = pool(&settings);
        let channel = notify::channel(&settings.schema, ns);
        Ok(PostgresBackend {
            inner: Arc::new(Inner {
                tree_lock: schema::tree_lock(&settings.schema, ns),
                tree_key: schema::tree_lock_key(&settings.schema),
                settings,
                pool,
                namespace: namespace.to_string(),
                ns,
                root,
                instance,
                channel,
                inos: Mutex::new((0, 0)),
                handles: handles::Handles::default(),
                drafts: drafts::Drafts::default(),
                dirs: Arc::default(),
                listener,
            }),
        })
    }
}

impl Inner {
    /// A connection, for a statement that may be about a draft: every draft is stored first
    /// (see `drafts`), and none is made while the answer is held.
    fn conn(&self) -> FsResult<(drafts::Settled<'_>, r2d2::PooledConnection<Manager>)> {
        let settled = self.settled()?;
        Ok((settled, self.pooled()?))
    }

    /// A connection as it is, for statements that know of no draft.
    fn pooled(&self) -> FsResult<r2d2::PooledConnection<Manager>> {
        fresh_connection(&self.pool, &self.settings)
    }

    /// Runs `f` on a connection outside a transaction (each statement sees its own snapshot).
    fn read<T>(&self, f: impl FnOnce(&Sql<'_>) -> FsResult<T>) -> FsResult<T> {
        let _settled = self.settled()?;
        self.read_now(f)
    }

    /// [`Inner::read`] of statements that know of no draft (or store one).
    fn read_now<T>(&self, f: impl FnOnce(&Sql<'_>) -> FsResult<T>) -> FsResult<T> {
        let mut conn = self.pooled()?;
        let Conn { client, stmts, .. } = &mut *conn;
        f(&Sql::new(client, stmts, &self.settings))
    }

    /// Runs `f`, one statement that commits on its own (a call of one of the server's
    /// `functions`), again if the server reports a deadlock or serialization failure.
    fn call<T>(&self, f: impl Fn(&Sql<'_>) -> FsResult<T>) -> FsResult<T> {
        let _settled = self.settled()?;
        self.call_now(f)
    }

    /// [`Inner::call`] of a statement that knows of no draft (or stores one).
    fn call_now<T>(&self, f: impl Fn(&Sql<'_>) -> FsResult<T>) -> FsResult<T> {
        let mut tries = 0;
        loop {
            tries += 1;
            match self.read_now(&f) {
                Err(e) if connect::is_retry(&e) && tries < TX_TRIES => continue,
                done => return done,
            }
        }
    }

    /// The name lock, root and notification of a call of the server's `functions`.
    fn call_args<'a>(&'a self, payload: &'a str) -> functions::Call<'a> {
        functions::Call {
            lock_key: self.tree_key,
            root: self.root,
            channel: &self.channel,
            payload,
            now: crate::backend::tree::now_ns(),
        }
    }

    /// Deletes the rows of the nameless `ino`, kept for a handle of this daemon that closed
    /// before it could be marked an orphan; a failure leaves them to the next daemon.
    fn delete_orphan(&self, ino: u64) {
        Self::orphan_left(ino, self.call(|sql| sql.drop_nameless(ino)));
    }

    /// [`Inner::delete_orphan`] without settling first, for the journal's sender: it may hold
    /// the drafts' gate itself (a journal sent while the drafts are stored), which settling
    /// would wait for forever, and it has just sent the journal that settling would send.
    pub(super) fn delete_orphan_now(&self, ino: u64) {
        Self::orphan_left(ino, self.call_now(|sql| sql.drop_nameless(ino)));
    }

    fn orphan_left(ino: u64, deleted: FsResult<()>) {
        if let Err(e) = deleted {
            tracing::warn!(ino, "postgres: deleting unlinked file failed (the next start does): {e}");
        }
    }

    /// Runs `f` in one transaction (with the namespace's name lock for `Lock::Tree`) and
    /// commits it; an error rolls it back. Deadlocks are tried again.
    fn write<T>(&self, lock: Lock, f: impl Fn(&Sql<'_>) -> FsResult<T>) -> FsResult<T> {
        let (_settled, mut conn) = self.conn()?;
        let Conn { client, stmts, .. } = &mut *conn;
        let begin = match lock {
            Lock::Rows => "BEGIN".to_string(),
            Lock::Tree => format!("BEGIN; {}", self.tree_lock),
        };
        transaction(client, stmts, &self.settings, &begin, f)
    }

    /// Makes everything committed so far survive a crash of the server: one commit with the
    /// server's own `synchronous_commit` (the configured value, which the session's `off`
    /// does not change) waits for the WAL to reach the disk up to it, and so for every commit
    /// before it, of any daemon. The server waits only for a transaction that wrote to the
    /// WAL, so this one rewrites a row unchanged: `ino`'s (whose writers it then waits for),
    /// or the namespace's if that inode is gone.
    fn sync_durable(&self, ino: u64) -> FsResult<()> {
        let (_settled, mut conn) = self.conn()?;
        let done = conn.client.batch_execute(&format!(
            "BEGIN; SET LOCAL synchronous_commit TO DEFAULT;
             WITH f AS (UPDATE inodes SET ctime = ctime WHERE ino = {ino} RETURNING 1)
             UPDATE namespaces SET root = root WHERE id = {ns} AND NOT EXISTS (SELECT 1 FROM f);
             COMMIT",
            ns = self.ns
        ));
        done.map_err(|e| {
            let _ = conn.client.batch_execute("ROLLBACK");
            self.settings.error(e)
        })
    }

    /// A new inode number, from a block reserved by one `nextval` (outside any transaction:
    /// a sequence never hands a number out twice).
    fn alloc_ino(&self) -> FsResult<u64> {
        let mut inos = self.inos.lock();
        if inos.0 == inos.1 {
            let start = self.read_now(|sql| sql.reserve_inos())?;
            *inos = (start, start + INO_BLOCK);
        }
        inos.0 += 1;
        Ok(inos.0 - 1)
    }

    /// Registers a handle on `ino`.
    fn opened(&self, ino: u64) {
        self.handles.opened(ino);
    }

    /// A handle on `ino` closed: the last one of a nameless inode deletes its rows.
    fn closed(&self, ino: u64) {
        if let Some(_deletion) = self.handles.closed(ino) {
            self.delete_orphan(ino);
        }
    }
}

/// Runs `f` in one transaction opened by the simple-query batch `begin` (`BEGIN` and the
/// statements that must precede everything, such as a lock) and commits it with the
/// notifications `f` queued; an error rolls it back. Deadlocks and serialization failures are
/// tried again, `f` and all.
fn transaction<T>(
    client: &mut Client,
    stmts: &mut HashMap<&'static str, Statement>,
    settings: &PgSettings,
    begin: &str,
    f: impl Fn(&Sql<'_>) -> FsResult<T>,
) -> FsResult<T> {
    let mut tries = 0;
    loop {
        tries += 1;
        client.batch_execute(begin).map_err(|e| settings.error(e))?;
        let sql = Sql::new(client, stmts, settings);
        let outcome = f(&sql);
        let commit = sql.commit_batch();
        drop(sql);
        match outcome {
            Ok(value) => match client.batch_execute(&commit) {
                Ok(()) => return Ok(value),
                Err(e) => {
                    // A failed statement before the COMMIT leaves the transaction open
                    // and aborted; a failed COMMIT has ended it already (harmless then).
                    let _ = client.batch_execute("ROLLBACK");
                    if connect::retryable(&e) && tries < TX_TRIES {
                        continue;
                    }
                    return Err(settings.error(e));
                }
            },
            Err(e) => {
                let _ = client.batch_execute("ROLLBACK");
                if connect::is_retry(&e) && tries < TX_TRIES {
                    continue;
                }
                return Err(e);
            }
        }
    }
}
