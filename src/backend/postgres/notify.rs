//! Other daemons' changes: each committed change of a namespace sends a notification on the
//! namespace's channel (`instance \t kind \t path`, kind `n` for a name, `c` for content or
//! attributes, `*` for "anything"; `instance \t i \t inode \t path` for a file changed
//! through a handle, whose name may lead elsewhere by then), and one connection per backend
//! listens on it and reports what others changed. The same connection holds this instance's advisory lock, by which other
//! daemons know it is alive.
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

use super::schema;
use super::PgSettings;
use crate::backend::RemoteChange;
use crate::error::FsResult;

/// How often the listening thread looks at its stop flag and its connection.
const POLL: Duration = Duration::from_millis(200);
/// Pause between two attempts to reconnect.
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);

/// The notification channel of namespace `ns` of `schema`.
pub(super) fn channel(schema: &str, ns: i64) -> String {
    format!("agentvfs_{schema}_{ns}")
}

pub(super) struct Listener {
    settings: Arc<PgSettings>,
    instance: i64,
    channel: String,
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
        Self::on_channel(settings, instance, channel)
    }

    /// Like [`Listener::new`], on a channel named by the caller (the langgraph layout's).
    pub fn on_channel(settings: Arc<PgSettings>, instance: i64, channel: String) -> FsResult<Listener> {
        let client = listen(&settings, instance, &channel).map_err(|e| settings.error(e))?;
        Ok(Listener {
            settings,
            instance,
            channel,
            client: Mutex::new(Some(client)),
            stop: Arc::new(AtomicBool::new(false)),
            thread: Mutex::new(None),
        })
    }

    /// Reports other daemons' changes to `report` from a thread of its own (once).
    pub fn start(&self, report: Box<dyn Fn(RemoteChange) + Send + Sync>) {
        let Some(client) = self.client.lock().take() else {
            return;
        };
        let run = Run {
            settings: self.settings.clone(),
            instance: self.instance,
            channel: self.channel.clone(),
            stop: self.stop.clone(),
            report,
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
            let _ = thread.join();
        }
    }
}

/// A connection that holds `instance`'s lock and listens on `channel`.
fn listen(settings: &PgSettings, instance: i64, channel: &str) -> Result<Client, postgres::Error> {
    let mut client = settings.connect()?;
    client.batch_execute(&format!(
        "SELECT {}; LISTEN \"{channel}\"",
        schema::instance_lock(&settings.schema, instance)
    ))?;
    Ok(client)
}

struct Run {
    settings: Arc<PgSettings>,
    instance: i64,
    channel: String,
    stop: Arc<AtomicBool>,
    report: Box<dyn Fn(RemoteChange) + Send + Sync>,
}

impl Run {
    fn run(&self, mut client: Client) {
        while !self.stop.load(Ordering::Relaxed) {
            if !self.drain(&mut client) {
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

    /// Reports the notifications that arrive within one poll; false when the connection is lost.
    fn drain(&self, client: &mut Client) -> bool {
        {
            let mut notifications = client.notifications();
            let mut arrived = notifications.timeout_iter(POLL);
            loop {
                match arrived.next() {
                    Ok(Some(n)) => self.handle(n.payload()),
                    Ok(None) => break,
                    Err(_) => return false,
                }
            }
        }
        !client.is_closed()
    }

    fn handle(&self, payload: &str) {
        let mut parts = payload.splitn(3, '\t');
        let (Some(from), Some(kind), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            return;
        };
        if from.parse::<i64>().ok() == Some(self.instance) {
            return; // this daemon's own change: its kernel knows
        }
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
    }

    /// Connects again until that works (or the backend stops: `None`).
    fn reconnect(&self) -> Option<Client> {
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return None;
            }
            match listen(&self.settings, self.instance, &self.channel) {
                Ok(client) => return Some(client),
                Err(e) => super::unreachable_line(&self.settings.server(), &e),
            }
            std::thread::sleep(RECONNECT_PAUSE);
        }
    }
}
