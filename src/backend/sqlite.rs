//! A persistent backend: the trees of several namespaces in one SQLite file.
//!
//! Layout and versioning are in `schema`, row helpers in `store`, the path operations of
//! [`Backend`](crate::backend::Backend) in `ops`, open files with their write buffers in `file`,
//! and the background checkpoint thread in `checkpoint`.
//!
//! Durability: metadata operations are one write transaction each. While the backend is alone
//! on its file they may be held in the open transaction for up to 0.2 s and committed together
//! (`held`); otherwise, and whenever something needs them durable, they are committed before
//! the call returns. File data is buffered per inode and committed at flush, fsync, close, or
//! when the buffer grows large, with every change held before it. The database runs in WAL
//! mode with `synchronous=NORMAL`, so a commit is in the WAL file (the OS page cache) when it
//! returns and survives `kill -9`; `fsync` additionally fdatasyncs the WAL, which makes
//! everything committed so far survive power loss (what was checkpointed out of the WAL has
//! been synced to the database file by the checkpoint).
//!
//! Reads use the write connection when it is free (its page cache and dentry cache are
//! current), otherwise a pooled read connection (WAL readers and the writer never block each
//! other), unless changes are held: the pooled readers would not see them. Checkpoints run on
//! a thread of their own.
//!
//! Several backends may open one file (one namespace each); each has its own connections. A
//! namespace in use by another process is refused (EBUSY): each would take the other's open
//! unlinked files for crash orphans. Within one daemon, the configuration refuses two routes on
//! one namespace.
//!
//! Locks, always taken in this order: an inode's state → the write connection → the inode
//! registry or the inode-number reservation. The registry, the reservation and the reader pool
//! are leaves: nothing is awaited while holding them.

mod checkpoint;
mod file;
mod held;
mod ops;
mod schema;
mod space;
mod store;
#[cfg(test)]
mod tests;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use rusqlite::Connection;

use crate::error::FsResult;
use checkpoint::Checkpointer;
use file::InodeState;
use held::{Commit, Committer};
use store::{Ctx, Dentries, Nodes};

/// How many idle reader connections are kept for reuse.
const MAX_IDLE_READERS: usize = 8;

/// A route's storage in a SQLite file, one namespace of it.
pub struct SqliteBackend {
    inner: Arc<Inner>,
}

type StateRef = Arc<Mutex<InodeState>>;

/// How many inode numbers a backend reserves at a time.
const INO_BLOCK: u64 = 1024;

#[derive(Default)]
struct Registry {
    /// Per-inode state (open handles, write buffer) of inodes that are open or in use by an
    /// operation; entries go away when idle.
    states: HashMap<u64, StateRef>,
    /// Inodes whose last name went while they were in use: their last close deletes them.
    nameless: HashSet<u64>,
}

/// The write connection and what may only be used with it.
struct Db {
    conn: Connection,
    dentries: RefCell<Dentries>,
    nodes: RefCell<Nodes>,
    /// A write transaction is open with changes in it not yet committed (see `held`).
    held: bool,
}

struct Inner {
    /// Commits held changes when they are due (see `held`); `None` for a store opened
    /// read-only. First field, so that its thread stops before anything else goes.
    committer: Option<Committer>,
    /// Before the connections close.
    /// `None` for a store opened read-only, which never commits.
    checkpointer: Option<Checkpointer>,
    path: PathBuf,
    namespace: String,
    ns: i64,
    root: u64,
    /// The only connection that writes (each write is one IMMEDIATE transaction, or a
    /// savepoint in the open one while changes are held); it also serves reads while no write
    /// needs it.
    conn: Mutex<Db>,
    /// Changes are held (`Db::held`), so reads must use the write connection. Changed only
    /// with it held.
    holding: AtomicBool,
    /// This backend's claim on its namespace (`None` when serving read-only).
    claim: Option<schema::Claim>,
    /// Idle read connections, for reads while the writer is busy.
    readers: Mutex<Vec<Connection>>,
    /// Inode numbers reserved in the database and not yet used: `(next, end)`. Only touched
    /// with `conn` held.
    inos: Mutex<(u64, u64)>,
    registry: Mutex<Registry>,
    /// Bytes buffered across all inodes, to bound memory when many files are written at once.
    dirty_total: AtomicUsize,
    /// Whether the database's directory entry and file have been fsynced since opening.
    dir_synced: AtomicBool,
    /// Free space on the database's filesystem, checked before a write is buffered.
    space: space::Space,
    /// Changes made through the write connection (committed or held), each counted after it
    /// with the connection still held, once every reader would see it (see
    /// `Inner::change_in`): when the count has not moved since before a node was read, the
    /// node is still what the store holds (see [`Inner::open_handle`]).
    changes: AtomicU64,
}

impl SqliteBackend {
    /// Opens (creating if missing) the database at `path` and the tree of `namespace` in it.
    /// Parent directories are not created. Orphans of this namespace left by a crash (nodes
    /// unlinked while open) are removed.
    pub fn open(path: &Path, namespace: &str) -> FsResult<SqliteBackend> {
        let mut conn = schema::open_writer(path)?;
        let (ns, root) = schema::namespace(&mut conn, namespace, path)?;
        let claim = schema::claim_namespace(&mut conn, path, namespace, ns)?;
        Self::serving(conn, path, namespace, (ns, root), Some((Checkpointer::start(path)?, claim)))
    }

    /// Opens an existing store to serve it read-only (`read_only = true` on its route): nothing
    /// in the file is changed, not even the schema, and no namespace is created or claimed.
    /// The engine refuses every change with EROFS before it reaches this backend.
    pub fn open_read_only(path: &Path, namespace: &str) -> FsResult<SqliteBackend> {
        let conn = schema::open_read_only(path)?;
        let found = schema::find_namespace(&conn, namespace, path)?;
        Self::serving(conn, path, namespace, found, None)
    }

    /// The backend of namespace `(ns, root)` of the store at `path`, `conn` its writer; a
    /// store it writes comes with its checkpointer and its claim.
    fn serving(
        conn: Connection,
        path: &Path,
        namespace: &str,
        (ns, root): (i64, u64),
        writes: Option<(Checkpointer, schema::Claim)>,
    ) -> FsResult<SqliteBackend> {
        let writing = writes.is_some();
        let (checkpointer, claim) = writes.unzip();
        let mut started = Ok(());
        let inner = Arc::new_cyclic(|me: &Weak<Inner>| Inner {
            committer: match writing.then(|| Committer::start(me.clone())) {
                Some(Err(e)) => {
                    started = Err(e);
                    None
                }
                started => started.and_then(Result::ok),
            },
            checkpointer,
            path: path.to_path_buf(),
            namespace: namespace.to_string(),
            ns,
            root,
            conn: Mutex::new(Db {
                conn,
                dentries: RefCell::default(),
                nodes: RefCell::default(),
                held: false,
            }),
            holding: AtomicBool::new(false),
            claim,
            readers: Mutex::new(Vec::new()),
            inos: Mutex::new((0, 0)),
            registry: Mutex::new(Registry::default()),
            dirty_total: AtomicUsize::new(0),
            dir_synced: AtomicBool::new(false),
            space: space::Space::new(path),
            changes: AtomicU64::new(0),
        });
        started?;
        Ok(SqliteBackend { inner })
    }
}

impl Drop for Inner {
    /// Commits the changes still held.
    fn drop(&mut self) {
        let mut db = self.conn.lock();
        if let Err(e) = self.commit_held_in(&mut db) {
            tracing::error!("{}: committing held changes at close: {e}", self.describe_store());
        }
    }
}

impl Inner {
    /// Whether this backend writes its store (a read-only one has no checkpointer), and so has
    /// claimed its namespace: no other process changes it.
    fn writes(&self) -> bool {
        self.checkpointer.is_some()
    }

    /// The store and namespace, for messages.
    fn describe_store(&self) -> String {
        format!("sqlite {} (namespace {})", self.path.display(), self.namespace)
    }

    /// Counts a commit, for the checkpoint thread. Called after every commit, with the write
    /// connection still held.
    fn committed(&self) {
        if let Some(checkpointer) = &self.checkpointer {
            checkpointer.committed();
        }
    }

    /// Counts `bytes` of file content in the commit just counted, for the checkpoint thread.
    fn committed_content(&self, bytes: u64) {
        if let Some(checkpointer) = &self.checkpointer {
            checkpointer.committed_content(bytes);
        }
    }

    /// Runs `f` as one change of the namespace, which may be held (see `held`); an error
    /// undoes it.
    fn write_tx<T>(&self, f: impl Fn(&Ctx<'_>) -> FsResult<T>) -> FsResult<T> {
        self.change(Commit::Soon, f)
    }

    /// Runs `f` as one change, committed as `when` says.
    ///
    /// A change that meets a full disk is tried once more after the WAL was checkpointed
    /// and emptied: the WAL may hold the room it needs (deletions free space only once a
    /// checkpoint copied them into the database), and a full disk must not stop the deletions
    /// that would make room.
    fn change<T>(&self, when: Commit, f: impl Fn(&Ctx<'_>) -> FsResult<T>) -> FsResult<T> {
        let mut db = self.conn.lock();
        match self.change_in(&mut db, when, &f) {
            Err(e) if e.is(crate::error::Errno::ENOSPC) && !db.held && Self::empty_wal(&db.conn) => {
                self.change_in(&mut db, when, &f)
            }
            other => other,
        }
    }

    /// Copies the WAL into the database and empties it; false if that failed.
    fn empty_wal(conn: &Connection) -> bool {
        matches!(conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get::<_, i64>(0)), Ok(0))
    }

    /// Copies the WAL into the database and empties it, so that the space it held (and the
    /// pages deletions freed in it) can take new commits; false if that failed. Held changes
    /// are committed first (the WAL cannot be emptied under an open transaction).
    fn make_room(&self) -> bool {
        let mut db = self.conn.lock();
        self.commit_held_in(&mut db).is_ok() && Self::empty_wal(&db.conn)
    }

    /// Runs `f` on a reading connection; `in_tx` wraps it in one read transaction, so that a
    /// path walk sees a single snapshot.
    ///
    /// On the write connection of a store this backend writes, the transaction is left out:
    /// every change to the namespace is made through that connection (another process cannot
    /// claim the namespace), so while it is held nothing can change what `f` reads. A
    /// `BEGIN` and a `COMMIT` were a third of a sqlite-route `open`.
    fn read_with<T>(&self, in_tx: bool, f: impl FnOnce(&Ctx<'_>) -> FsResult<T>) -> FsResult<T> {
        let run = |conn: &mut Connection, dentries, nodes, in_tx: bool| {
            if !in_tx {
                return f(&Ctx { conn, dentries, nodes });
            }
            let tx = conn.transaction()?;
            let value = f(&Ctx { conn: &tx, dentries, nodes })?;
            tx.commit()?;
            Ok(value)
        };
        // An idle writer is the fastest reader: its page cache is always current (a separate
        // connection must re-read every page the writer changed since its last use) and it
        // has the dentry cache. `try_lock` never waits, so this cannot upset the lock order.
        // While changes are held only the write connection sees them: wait for it.
        let writer = match self.conn.try_lock() {
            None if self.holding.load(Ordering::Acquire) => Some(self.conn.lock()),
            db => db,
        };
        if let Some(mut db) = writer {
            let Db { conn, dentries, nodes, .. } = &mut *db;
            // No commit can come while the connection is held, so the count is the one the
            // node cache must be at.
            let nodes = self.writes().then(|| {
                nodes.get_mut().at_change(self.changes_seen());
                &*nodes
            });
            return run(conn, Some(dentries), nodes, in_tx && !self.writes());
        }
        let pooled = self.readers.lock().pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => schema::open_reader(&self.path)?,
        };
        let result = run(&mut conn, None, None, in_tx);
        let mut pool = self.readers.lock();
        if pool.len() < MAX_IDLE_READERS {
            pool.push(conn);
        }
        result
    }

    /// Runs `f` on a reading connection without a transaction (one statement, one snapshot).
    fn with_reader<T>(&self, f: impl FnOnce(&Ctx<'_>) -> FsResult<T>) -> FsResult<T> {
        self.read_with(false, f)
    }

    /// The count of changes so far: read it before a node, and compare after (see
    /// [`Inner::changes`]).
    fn changes_seen(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Runs `f` in one read transaction.
    fn read_tx<T>(&self, f: impl FnOnce(&Ctx<'_>) -> FsResult<T>) -> FsResult<T> {
        self.read_with(true, f)
    }

    /// The state of `ino` if some handle or operation holds it.
    fn state_get(&self, ino: u64) -> Option<StateGuard<'_>> {
        let state = self.registry.lock().states.get(&ino).cloned()?;
        Some(StateGuard { inner: self, ino, state: Some(state) })
    }

    fn state_get_or_create(&self, ino: u64) -> StateGuard<'_> {
        let state = self.registry.lock().states.entry(ino).or_default().clone();
        StateGuard { inner: self, ino, state: Some(state) }
    }

    /// Drops one reference to a state and forgets the state when nobody else holds it and it
    /// has nothing buffered. New references are only made under the registry lock, so a strong
    /// count of one (the registry's) cannot grow meanwhile, and `try_lock` cannot block.
    fn state_release(&self, ino: u64, state: StateRef) {
        drop(state);
        let mut registry = self.registry.lock();
        let idle = match registry.states.get(&ino) {
            Some(s) if Arc::strong_count(s) == 1 => s.try_lock().is_some_and(|st| st.is_idle()),
            _ => false,
        };
        if idle {
            registry.states.remove(&ino);
        }
    }

    /// Inside a transaction that took the last name from `ino`: deletes its rows now if nothing
    /// holds the inode, or returns true when that must wait (see [`Inner::reap`]). Called with the
    /// write connection held, so an `open` that registers later finds the rows already gone.
    fn drop_or_defer(&self, tx: &Connection, ino: u64) -> FsResult<bool> {
        {
            let mut registry = self.registry.lock();
            if registry.states.contains_key(&ino) {
                // Should this transaction roll back, the reap finds a name and keeps the rows.
                registry.nameless.insert(ino);
                return Ok(true);
            }
        }
        store::delete_rows(tx, ino)?;
        Ok(false)
    }

    /// Whether an unlink or rename has left `ino` without a name while it was in use.
    fn is_nameless(&self, ino: u64) -> bool {
        self.registry.lock().nameless.contains(&ino)
    }

    /// A new inode number. Called with the write connection held (`db`) and no change under
    /// way: a reservation is its own small transaction (held changes are committed first), so
    /// a rolled-back create cannot hand out a number twice.
    fn alloc_ino(&self, db: &mut Db) -> FsResult<u64> {
        let mut inos = self.inos.lock();
        if inos.0 == inos.1 {
            self.commit_held_in(db)?;
            let end = schema::reserve_inos(&db.conn, INO_BLOCK)?;
            *inos = (end - INO_BLOCK, end);
        }
        inos.0 += 1;
        Ok(inos.0 - 1)
    }

    /// Deletes a nameless inode's rows unless it is still open (its last close does it then).
    fn reap(&self, ino: u64) -> FsResult<()> {
        let guard = self.state_get_or_create(ino);
        let mut st = guard.lock();
        if st.handles > 0 {
            return Ok(());
        }
        self.reap_locked(ino, &mut st)
    }

    fn reap_locked(&self, ino: u64, st: &mut InodeState) -> FsResult<()> {
        self.write_tx(|tx| {
            if store::node(tx, ino)?.is_some_and(|n| n.nlink == 0) {
                store::delete_rows(tx, ino)?;
            }
            Ok(())
        })?;
        self.registry.lock().nameless.remove(&ino);
        st.discard(&self.dirty_total);
        Ok(())
    }

    /// Makes everything committed so far survive power loss: the commits are in the WAL (or,
    /// once checkpointed, in the database file, which SQLite syncs after a checkpoint), so
    /// syncing the WAL suffices; the first time, the file and its directory entry are synced too.
    fn sync_durable(&self) -> FsResult<()> {
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        match File::open(&wal) {
            Ok(f) => f.sync_data()?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        if !self.dir_synced.load(Ordering::Acquire) {
            schema::database_file(&self.path)?.sync_all()?;
            let dir = match self.path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            File::open(dir)?.sync_all()?;
            self.dir_synced.store(true, Ordering::Release);
        }
        Ok(())
    }
}

/// A counted reference to an inode's state; dropping it lets the registry forget idle states.
struct StateGuard<'a> {
    inner: &'a Inner,
    ino: u64,
    state: Option<StateRef>,
}

impl std::ops::Deref for StateGuard<'_> {
    type Target = Mutex<InodeState>;
    fn deref(&self) -> &Self::Target {
        self.state.as_ref().expect("state present until drop")
    }
}

impl StateGuard<'_> {
    fn arc(&self) -> StateRef {
        self.state.clone().expect("state present until drop")
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        if let Some(state) = self.state.take() {
            self.inner.state_release(self.ino, state);
        }
    }
}
