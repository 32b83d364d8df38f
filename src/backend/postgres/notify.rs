//! Other daemons' changes: each committed change of a namespace sends a notification on the
//! namespace's channel (`instance \t kind \t path`, kind `n` for a name, `c` for content or
//! attributes, `*` for "anything"; `instance \t i \t inode \t path` for a file changed
//! through a handle, whose name may lead elsewhere by then; `instance \t j` for a daemon that
//! joins the namespace, see `quiet`), and one connection per backend
//! listens on it and reports what others changed. The same connection holds this instance's
//! advisory lock, by which other daemons know it is alive, and, on the default layout, the
//! locks by which a daemon alone on its namespace stops notifying (`quiet`).
//!
//! When the connection is lost, notifications are lost with it: after reconnecting, the
//! listener reports [`RemoteChange::Everything`], so the kernel forgets what it cached.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use postgres::fallible_iterator::FallibleIterator;
use postgres::Client;

use super::PgSettings;
use super::{quiet, schema};
use crate::backend::RemoteChange;
use crate::error::FsResult;

/// How often the listening thread looks at its stop flag and its connection.
const POLL: Duration = Duration::from_millis(200);
/// Pause between two attempts to reconnect.
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);
/// Every how many quiet polls a daemon that is not alone looks whether it is now.
const LOOK_EVERY: u32 = 25;

/// The notification channel of namespace `ns` of `schema`.
pub(super) fn channel(schema: &str, ns: i64) -> String {
    format!("agentvfs_{schema}_{ns}")
}

pub(super) struct Listener {
    settings: Arc<PgSettings>,
    instance: i64,
    channel: String,
    /// The namespace on which this daemon may go quiet while alone (the default layout's), or
    /// `None`: it always notifies.
    quiet_ns: Option<i64>,
    /// The connection, until a thread takes it.
    client: Mutex<Option<Client>>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Listener {
    /// Connects, takes the instance's lock and starts listening (notifications queue up in
    /// the connection until [`Listener::start`]).
    pub fn new(settings: Arc<PgSettings>, instance: i64, ns: i64) -> FsResult<Listener> {
        let channel = channel(&settings.schema, ns);
        Self::listening(settings, instance, channel, Some(ns))
    }

    /// Like [`Listener::new`], on a channel named by the caller (the langgraph layout's, whose
    /// triggers notify every change).
    pub fn on_channel(settings: Arc<PgSettings>, instance: i64, channel: String) -> FsResult<Listener> {
        Self::listening(settings, instance, channel, None)
    }

    fn listening(
        settings: Arc<PgSettings>,
        instance: i64,
        channel: String,
        quiet_ns: Option<i64>,
    ) -> FsResult<Listener> {
        let client = listen(&settings, instance, &channel, quiet_ns)?;
        Ok(Listener {
            settings,
            instance,
            channel,
            quiet_ns,
            client: Mutex::new(Some(client)),
            stop: Arc::new(AtomicBool::new(false)),
            thread: Mutex::new(None),
        })
    }

    /// Reports other daemons' changes to `report` from a thread of its own (once), and tells
    /// `quiet` of this daemon's alone lease and of each poll.
    pub fn start(
        &self,
        report: Box<dyn Fn(RemoteChange) + Send + Sync>,
        quiet: Box<dyn Fn(Quiet) + Send + Sync>,
    ) {
        let Some(client) = self.client.lock().take() else {
            return;
        };
        let run = Run {
            settings: self.settings.clone(),
            instance: self.instance,
            channel: self.channel.clone(),
            quiet_ns: self.quiet_ns,
            stop: self.stop.clone(),
            report,
            quiet,
        };
        let spawned =
            std::thread::Builder::new().name("postgres-listen".into()).spawn(move || run.run(client));
        match spawned {
            Ok(thread) => *self.thread.lock() = Some(thread),
            Err(e) => tracing::error!("postgres: cannot start the change listener: {e}"),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.lock().take() {
            // (The last owner of the backend may be the thread itself, in `quiet`.)
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

/// A connection that holds `instance`'s lock and listens on `channel`; with `quiet_ns`, a
/// member of that namespace that has joined it (see `quiet`).
fn listen(settings: &PgSettings, instance: i64, channel: &str, quiet_ns: Option<i64>) -> FsResult<Client> {
    let err = |e| settings.error(e);
    let mut client = settings.connect().map_err(err)?;
    // Namespace 0 (none): a listener that never goes quiet, known as one of this version.
    let member = quiet::member_lock(&settings.schema, quiet_ns.unwrap_or(0));
    client
        .batch_execute(&format!(
            "SELECT {}; {member}; LISTEN \"{channel}\"",
            schema::instance_lock(&settings.schema, instance)
        ))
        .map_err(err)?;
    if quiet_ns.is_some() {
        quiet::join(&mut client, settings, channel, instance)?;
    }
    Ok(client)
}

/// What one [`Run::drain`] saw.
enum Drained {
    /// A poll went by without notifications.
    Idle,
    /// Another daemon joined the namespace.
    Joined,
    /// The connection is lost.
    Lost,
}

struct Run {
    settings: Arc<PgSettings>,
    instance: i64,
    channel: String,
    quiet_ns: Option<i64>,
    stop: Arc<AtomicBool>,
    report: Box<dyn Fn(RemoteChange) + Send + Sync>,
    quiet: Box<dyn Fn(Quiet) + Send + Sync>,
}

/// What the listener tells its backend (see [`Listener::start`]).
pub(super) enum Quiet {
    /// This daemon took its alone lease.
    Alone,
    /// It is about to give the lease up (another daemon joined), or lost it with its
    /// listening connection.
    NotAlone,
    /// A poll went by (every [`POLL`] at most while nothing arrives).
    Tick,
}

impl Run {
    fn run(&self, mut client: Client) {
        // Whether this daemon holds its alone lease, and the polls since it last looked.
        let (mut alone, mut idle_polls) = (false, LOOK_EVERY);
        while !self.stop.load(Ordering::Relaxed) {
            if let Some(ns) = self.quiet_ns.filter(|_| !alone && idle_polls >= LOOK_EVERY) {
                idle_polls = 0;
                alone = quiet::try_alone(&mut client, &self.settings, &self.channel, ns, self.instance)
                    .inspect_err(|e| {
                        tracing::warn!("postgres: looking for other daemons on the namespace: {e}")
                    })
                    .unwrap_or(false);
                if alone {
                    (self.quiet)(Quiet::Alone);
                }
            }
            let drained = self.drain(&mut client);
            (self.quiet)(Quiet::Tick);
            match drained {
                Drained::Idle => idle_polls += 1,
                Drained::Joined => {
                    if alone {
                        alone = false;
                        (self.quiet)(Quiet::NotAlone);
                        let given = quiet::give_up(&mut client, &self.settings, &self.channel, self.instance);
                        // The connection is gone then, and its lease with it.
                        if let Err(e) = given {
                            tracing::warn!("postgres: giving the quiet lease up: {e}");
                        }
                    }
                }
                Drained::Lost => {
                    // The pool's connections went with it, most likely.
                    self.settings.server_lost();
                    // The lease went with the connection; a look's wait before taking it again.
                    if alone {
                        (self.quiet)(Quiet::NotAlone);
                    }
                    (alone, idle_polls) = (false, 0);
                    match self.reconnect() {
                        Some(c) => client = c,
                        None => return,
                    }
                    tracing::warn!(
                        "postgres {}: listening again; changes made meanwhile are not known, so the kernel forgets what it cached",
                        self.settings.server()
                    );
                    (self.report)(RemoteChange::Everything);
                }
            }
        }
    }

    /// Reports the notifications that arrive until a poll goes by without one, or until one
    /// says that another daemon joined.
    fn drain(&self, client: &mut Client) -> Drained {
        {
            let mut notifications = client.notifications();
            let mut arrived = notifications.timeout_iter(POLL);
            loop {
                match arrived.next() {
                    Ok(Some(n)) => {
                        if self.handle(n.payload()) {
                            return Drained::Joined;
                        }
                    }
                    Ok(None) => break,
                    Err(_) => return Drained::Lost,
                }
            }
        }
        if client.is_closed() {
            Drained::Lost
        } else {
            Drained::Idle
        }
    }

    /// Reports one notification; true when it says that another daemon joined.
    fn handle(&self, payload: &str) -> bool {
        let mut parts = payload.splitn(3, '\t');
        let (Some(from), Some(kind)) = (parts.next(), parts.next()) else {
            return false;
        };
        if from.parse::<i64>().ok() == Some(self.instance) {
            return false; // this daemon's own change: its kernel knows
        }
        if kind == "j" {
            return true;
        }
        let Some(path) = parts.next() else {
            return false;
        };
        let change = match kind {
            "n" => RemoteChange::Name(path.to_string()),
            "c" => RemoteChange::Content(path.to_string()),
            "i" => match path.split_once('\t').and_then(|(ino, path)| Some((ino.parse().ok()?, path))) {
                Some((ino, path)) => RemoteChange::FileContent { ino, path: path.to_string() },
                None => RemoteChange::Everything,
            },
            _ => RemoteChange::Everything,
        };
        (self.report)(change);
        false
    }

    /// Connects again until that works (or the backend stops: `None`).
    fn reconnect(&self) -> Option<Client> {
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return None;
            }
            match listen(&self.settings, self.instance, &self.channel, self.quiet_ns) {
                Ok(client) => return Some(client),
                Err(e) => super::unreachable_line(&self.settings.server(), &e),
            }
            std::thread::sleep(RECONNECT_PAUSE);
        }
    }
}
