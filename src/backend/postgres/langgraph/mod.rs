//! The postgres route's `langgraph` layout: the route's files are the rows of LangGraph's
//! `PostgresStore` table (`public.store`) under one prefix, as Deep Agents' `StoreBackend`
//! writes them, so that an agent's `/memories/` on that store and a shell in the mount see the
//! same files.
//!
//! The mapping (doc/configuration.md, "The langgraph layout"):
//! - the route's `namespace` is the row's `prefix`: LangGraph joins a namespace tuple with
//!   `.`, so `StoreBackend(namespace=lambda rt: ("alice", "filesystem"))` is
//!   `namespace = "alice.filesystem"`;
//! - the file `a/b.md` below the route is the key `/a/b.md` (StoreBackend's keys are absolute
//!   paths below its route, with the leading slash); keys without one are not shown;
//! - the value is StoreBackend's `{"content", "encoding", "created_at", "modified_at"}`:
//!   content as text with encoding `utf-8`, or base64 with `base64` for bytes that are not
//!   UTF-8 (or hold NUL, which jsonb cannot); times in Python's `isoformat()`;
//! - directories are implied by the keys below them; what the store has no column for (modes,
//!   owners, atime/ctime, empty directories) is in agentvfs's side table `lg_nodes`.
//!
//! Changes are announced by a trigger on the store table (`schema`), whoever makes them, on
//! the prefix's channel, which the shared listener (`notify`) hears. Writes of an open file
//! are kept in memory, shared by this daemon's handles on the file, and committed as one
//! whole value by `flush` (every `close`) and `fsync`; changes of names are transactions
//! under an advisory lock of the prefix.

mod file;
mod ops;
mod rows;
mod schema;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::store::Sql;
use super::{notify, Conn, Manager, PgSettings};
use crate::error::FsResult;
use file::Shared;
pub(super) use schema::SIDE_TABLES;

/// A route's files in LangGraph's store table, one prefix of it.
pub struct LangGraphBackend {
    inner: Arc<Inner>,
}

struct Inner {
    settings: Arc<PgSettings>,
    pool: r2d2::Pool<Manager>,
    prefix: String,
    /// This daemon's instance: the trigger names it in its notifications, so the listener
    /// skips this daemon's own changes.
    instance: i64,
    /// The prefix's notification channel.
    channel: String,
    /// The statement that takes the prefix's lock for the current transaction.
    name_lock: String,
    /// The open files of this daemon by path: the handles of one file share its buffer.
    open: Mutex<HashMap<String, Arc<Shared>>>,
    /// Held exclusively by renames and unlinks from their transaction until the open files
    /// carry their new names, and shared by commits of buffers: so no buffer is committed
    /// under a name that just went. Taken before any open file's state.
    names: RwLock<()>,
    listener: notify::Listener,
}

impl LangGraphBackend {
    /// Connects, brings agentvfs's schema up to date, makes sure the store table (and its
    /// trigger) exists, and the route's root directory has its metadata.
    pub fn open(settings: PgSettings, prefix: &str) -> FsResult<LangGraphBackend> {
        let settings = Arc::new(settings);
        let mut client = settings.connect().map_err(|e| settings.unreachable_at_start(e))?;
        super::schema::create_or_migrate(&mut client, &settings)?;
        schema::prepare_store(&mut client, &settings, &super::schema::migrate_lock(&settings.schema))?;
        let instance = super::schema::new_instance(&mut client, &settings)?;
        let channel = schema::channel(&mut client, &settings, prefix)?;
        let listener = notify::Listener::on_channel(settings.clone(), instance, channel.clone())?;
        let pool = super::pool(&settings);
        let name_lock = format!(
            "SELECT pg_advisory_xact_lock(hashtext('agentvfs-langgraph'), hashtext({}))",
            quote(prefix)
        );
        let inner = Inner {
            settings,
            pool,
            prefix: prefix.to_string(),
            instance,
            channel,
            name_lock,
            open: Mutex::new(HashMap::new()),
            names: RwLock::new(()),
            listener,
        };
        inner.write(|sql| rows::ensure_root(sql, &inner.prefix))?;
        Ok(LangGraphBackend { inner: Arc::new(inner) })
    }
}

/// `text` as an SQL string literal (the escape form: quotes and backslashes doubled).
fn quote(text: &str) -> String {
    format!("E'{}'", text.replace('\\', "\\\\").replace('\'', "''"))
}

impl Inner {
    fn conn(&self) -> FsResult<r2d2::PooledConnection<Manager>> {
        super::fresh_connection(&self.pool, &self.settings)
    }

    /// Runs `f` on a connection outside a transaction.
    fn read<T>(&self, f: impl FnOnce(&Sql<'_>) -> FsResult<T>) -> FsResult<T> {
        let mut conn = self.conn()?;
        let Conn { client, stmts, .. } = &mut *conn;
        f(&Sql::new(client, stmts, &self.settings))
    }

    /// Runs `f` in one transaction under the prefix's lock, which serialises the changes of
    /// the daemons on the prefix (LangGraph's own writes are single statements), and commits
    /// it with the notifications `f` queued; an error rolls it back. Deadlocks are tried again.
    fn write<T>(&self, f: impl Fn(&Sql<'_>) -> FsResult<T>) -> FsResult<T> {
        self.transact("", f)
    }

    /// Like [`Inner::write`], for a file's content at `close` or `fsync`: the commit waits for
    /// the server's disk (with its configured `synchronous_commit`; the session's is `off`).
    fn write_durable<T>(&self, f: impl Fn(&Sql<'_>) -> FsResult<T>) -> FsResult<T> {
        self.transact("SET LOCAL synchronous_commit TO DEFAULT;", f)
    }

    fn transact<T>(&self, settings: &str, f: impl Fn(&Sql<'_>) -> FsResult<T>) -> FsResult<T> {
        let mut conn = self.conn()?;
        let Conn { client, stmts, .. } = &mut *conn;
        let begin = format!(
            "BEGIN; {settings} SELECT set_config('agentvfs.instance', '{}', true); {}",
            self.instance, self.name_lock
        );
        super::transaction(client, stmts, &self.settings, &begin, f)
    }

    /// Queues, for the commit, a notification that `path` changed (`'n'`: a name, `'c'`:
    /// content or attributes) for changes the trigger does not see (the side table's).
    fn announce(&self, sql: &Sql<'_>, kind: char, path: &str) -> FsResult<()> {
        sql.notify(&self.channel, &format!("{}\t{kind}\t{path}", self.instance))
    }

    /// The shared state of the open file at `path`, made if this daemon has none.
    fn opened(&self, path: &str) -> Arc<Shared> {
        let mut open = self.open.lock();
        let shared = open.entry(path.to_string()).or_insert_with(|| Arc::new(Shared::new(path)));
        shared.state.lock().handles += 1;
        shared.clone()
    }

    /// A handle on `shared` closed; the last one forgets the file.
    fn closed(&self, shared: &Arc<Shared>) {
        let mut open = self.open.lock();
        let mut state = shared.state.lock();
        state.handles -= 1;
        if state.handles == 0 && open.get(&state.path).is_some_and(|s| Arc::ptr_eq(s, shared)) {
            open.remove(&state.path);
        }
    }

    /// The open file at `path`, if this daemon has one.
    fn open_at(&self, path: &str) -> Option<Arc<Shared>> {
        self.open.lock().get(path).cloned()
    }

    /// Renames (in this daemon's table of open files) `from` and everything below it to `to`,
    /// after the rename committed, so that their buffers are committed under their new names.
    fn moved(&self, from: &str, to: &str) {
        let mut open = self.open.lock();
        let below = format!("{from}/");
        let moving: Vec<String> =
            open.keys().filter(|p| *p == from || p.starts_with(&below)).cloned().collect();
        for old in moving {
            let shared = open.remove(&old).expect("listed above");
            let new = format!("{to}{}", &old[from.len()..]);
            shared.state.lock().path = new.clone();
            if let Some(replaced) = open.insert(new, shared) {
                replaced.state.lock().unlinked = true;
            }
        }
    }
}
