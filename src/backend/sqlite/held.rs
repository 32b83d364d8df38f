//! Changes held back for a moment: while a daemon is alone on its store file, the changes that
//! need not be durable when they return (creations, removals, renames, links, attribute
//! changes) stay in the write connection's open transaction and are committed together.
//!
//! A commit is most of what a change costs (each writes its pages to the WAL, two `pwrite`s a
//! page, and takes SQLite's locks), and a run of changes (an `rm -rf`, an untar, a `git add`)
//! rewrites the same few pages again and again. Held changes are committed:
//! - [`MAX_HOLD`] after the first of them, or once [`QUIET`] passed with no new one;
//! - with the next change that must be durable when it returns (the data of a file at its
//!   close or `fsync`, which also makes the file's name durable), or just before it when it
//!   stores more than [`CONTENT_WITH_HELD`] (a full disk that such a commit meets makes SQLite
//!   end the whole transaction);
//! - at `fsync`, `fsyncdir`, before a tool reports success (`commit_pending`), before the
//!   WAL is emptied or inode numbers are reserved, and when the backend closes.
//!
//! Every read of the namespace sees them at once: while changes are held, reads wait for the
//! write connection instead of using a pooled reader (whose snapshot is the committed state).
//! A `kill -9` of the daemon loses at most the name changes of its last [`MAX_HOLD`] that no
//! close, `fsync` or tool call followed, as a power cut loses them on a local filesystem
//! without an `fsync` of the directory. A daemon that shares the file with another namespace
//! (in this process or another) commits each change at once, so that no writer waits for it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::store::Ctx;
use super::{Db, Inner};
use crate::error::FsResult;

/// The longest a change is held.
pub(super) const MAX_HOLD: Duration = Duration::from_millis(200);
/// Held changes are committed once no change came for this long.
pub(super) const QUIET: Duration = Duration::from_millis(10);
/// Free space the store's disk must show for changes to be held, and for a change to join
/// them: a change that meets a full disk makes SQLite end the whole transaction, so the held
/// changes would be lost with it.
const ROOM_TO_HOLD: u64 = 64 << 20;
/// File content that may be committed in one transaction with held changes at most. The
/// commit of more first commits what is held on its own: it is the kind of commit that meets
/// a disk filled since its writes were admitted, and the held changes must not go with it.
const CONTENT_WITH_HELD: u64 = 256 << 10;

/// When a change must be committed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Commit {
    /// Before the call returns, with everything held before it; the change stores `content`
    /// bytes of file data.
    Now { content: u64 },
    /// Within [`MAX_HOLD`], if the backend may hold changes; otherwise now.
    Soon,
}

/// The times of the changes held; guarded by its own lock, changed only with the write
/// connection held.
#[derive(Default)]
struct Times {
    first: Option<Instant>,
    last: Option<Instant>,
    stop: bool,
    /// The thread waits with no deadline, for a first held change to wake it. (Otherwise it
    /// wakes by itself and looks again: no wake-up per change, which would cost a context
    /// switch per file in a run of creates.)
    idle: bool,
}

struct Shared {
    times: Mutex<Times>,
    wake: Condvar,
}

/// The thread that commits held changes when they are due; dropping this stops it.
pub(super) struct Committer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Committer {
    /// Starts the thread for the backend `inner` will be (it commits through a weak reference,
    /// so that it does not keep the backend alive).
    pub fn start(inner: Weak<Inner>) -> std::io::Result<Committer> {
        let shared = Arc::new(Shared { times: Mutex::default(), wake: Condvar::new() });
        let theirs = shared.clone();
        let thread =
            std::thread::Builder::new().name("sqlite-held".into()).spawn(move || run(&theirs, &inner))?;
        Ok(Committer { shared, thread: Some(thread) })
    }

    /// A change was held (`first` when none was before it).
    fn held(&self, first: bool) {
        let now = Instant::now();
        let mut times = self.shared.times.lock();
        times.last = Some(now);
        if first {
            times.first = Some(now);
            if std::mem::take(&mut times.idle) {
                self.shared.wake.notify_one();
            }
        }
    }

    /// The held changes were committed (or lost).
    fn cleared(&self) {
        let mut times = self.shared.times.lock();
        times.first = None;
        times.last = None;
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        self.shared.times.lock().stop = true;
        // (It may be waiting with a deadline: this wakes it either way.)
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            // The thread itself may drop the backend's last reference, and so this.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

#[cfg(test)]
impl Inner {
    /// Stops the thread that commits held changes when due: what is held then stays held
    /// until a change, close or call commits it, so that a test can act while it is.
    pub(super) fn stop_committer(&self) {
        if let Some(committer) = &self.committer {
            committer.shared.times.lock().stop = true;
            committer.shared.wake.notify_one();
        }
    }
}

fn run(shared: &Shared, inner: &Weak<Inner>) {
    loop {
        {
            let mut times = shared.times.lock();
            loop {
                if times.stop {
                    return;
                }
                let (Some(first), Some(last)) = (times.first, times.last) else {
                    times.idle = true;
                    shared.wake.wait(&mut times);
                    continue;
                };
                let due = (first + MAX_HOLD).min(last + QUIET);
                if Instant::now() >= due {
                    break;
                }
                shared.wake.wait_until(&mut times, due);
            }
        }
        let Some(inner) = inner.upgrade() else { return };
        if let Err(e) = inner.commit_held() {
            tracing::error!("{}: committing held changes: {e}", inner.describe_store());
        }
    }
}

impl Inner {
    /// Runs `f` as one change on the write connection `db`, and commits it as `when` says.
    /// An error undoes the change alone: changes held before it stay held (unless SQLite
    /// itself ended the transaction, which is why a change that may meet a full disk is not
    /// made in it, see [`Inner::may_join_held`]).
    pub(super) fn change_in<T>(
        &self,
        db: &mut Db,
        when: Commit,
        f: impl FnOnce(&Ctx<'_>) -> FsResult<T>,
    ) -> FsResult<T> {
        if db.held && !self.may_join_held(when) {
            self.commit_in(db)?;
        }
        let held = db.held;
        let begin = if held { "SAVEPOINT change" } else { "BEGIN IMMEDIATE" };
        db.conn.prepare_cached(begin)?.execute([])?;
        let done = f(&Ctx { conn: &db.conn, dentries: Some(&db.dentries), nodes: None });
        let value = match done {
            Ok(value) => value,
            Err(e) => {
                let undo = if held { "ROLLBACK TO change" } else { "ROLLBACK" };
                let undone = db.conn.prepare_cached(undo).and_then(|mut s| s.execute([]));
                if held && undone.is_ok() {
                    db.conn.prepare_cached("RELEASE change")?.execute([])?;
                }
                if held && db.conn.is_autocommit() {
                    // SQLite ended the whole transaction (a full disk, an I/O error).
                    self.lost_held(db, &e.to_string());
                }
                return Err(e);
            }
        };
        if held {
            db.conn.prepare_cached("RELEASE change")?.execute([])?;
        }
        // The change is counted (see `Inner::changes`) with the connection still held, and only
        // once a pooled reader would see it (committed) or is kept from the connection
        // (`holding`): a reader that finds the count moved must find the change too, or an
        // `open` would take a node it read before the change for current.
        let done = if when == Commit::Soon && (held || self.may_hold()) {
            db.held = true;
            self.holding.store(true, Ordering::Release);
            if let Some(committer) = &self.committer {
                committer.held(!held);
            }
            Ok(())
        } else {
            self.commit_in(db)
        };
        self.changes.fetch_add(1, Ordering::AcqRel);
        done.map(|()| value)
    }

    /// Commits the open transaction of `db` (this change and every one held before it).
    pub(super) fn commit_in(&self, db: &mut Db) -> FsResult<()> {
        let done = db.conn.prepare_cached("COMMIT").and_then(|mut s| s.execute([]));
        if let Err(e) = done {
            if !db.conn.is_autocommit() {
                let _ = db.conn.execute_batch("ROLLBACK");
            }
            if db.held {
                self.lost_held(db, &e.to_string());
            }
            return Err(e.into());
        }
        if std::mem::take(&mut db.held) {
            self.holding.store(false, Ordering::Release);
            if let Some(committer) = &self.committer {
                committer.cleared();
            }
        }
        self.committed();
        Ok(())
    }

    /// Commits the changes held, if any. Every close calls this: with nothing held it does
    /// not wait for the write connection. (A change held on another thread just after the
    /// look was not made before this call; one made before it on this thread is seen.)
    pub(super) fn commit_held(&self) -> FsResult<()> {
        if !self.holding.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut db = self.conn.lock();
        self.commit_held_in(&mut db)
    }

    /// Commits the changes held, if any, with the write connection held.
    pub(super) fn commit_held_in(&self, db: &mut Db) -> FsResult<()> {
        if db.held {
            self.commit_in(db)?;
        }
        Ok(())
    }

    /// Whether a change may be held now: the backend writes its store, no other namespace of
    /// the file is in use, and the disk has room for the commit.
    fn may_hold(&self) -> bool {
        self.committer.is_some()
            && self.claim.as_ref().is_some_and(|c| c.alone())
            && self.space.has_room(ROOM_TO_HOLD)
    }

    /// Whether a change may be made in the transaction of the held changes: not one that
    /// stores much file content, nor any once the disk's room ran short.
    fn may_join_held(&self, when: Commit) -> bool {
        let content = match when {
            Commit::Now { content } => content,
            Commit::Soon => 0,
        };
        content <= CONTENT_WITH_HELD && self.space.has_room(ROOM_TO_HOLD)
    }

    /// The held changes are gone (their transaction ended without a commit): what the daemon
    /// learnt from them is forgotten, and the loss is logged.
    fn lost_held(&self, db: &mut Db, why: &str) {
        db.held = false;
        self.holding.store(false, Ordering::Release);
        if let Some(committer) = &self.committer {
            committer.cleared();
        }
        db.dentries.borrow_mut().clear();
        db.nodes.borrow_mut().clear();
        self.changes.fetch_add(1, Ordering::AcqRel);
        tracing::error!(
            "{}: name and attribute changes of the last {} ms were not stored: {why}",
            self.describe_store(),
            MAX_HOLD.as_millis()
        );
    }
}
