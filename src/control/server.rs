//! The control door's transport: two Unix stream sockets (the agent socket and the control
//! socket, each admitting the peers its role list names, checked with SO_PEERCRED), a thread
//! per connection reading lines, and a thread per request so that a slow request never holds
//! up the others; replies are written whole under a lock. The agent socket answers the
//! methods it does not serve with a permission error (`control::roles`).

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use parking_lot::{Condvar, Mutex};

use crate::control::methods::{Peer, State};
use crate::control::proto::{self, Line, LineReader, Message, RpcError};
use crate::control::reply_budget::ReplyBudget;
use crate::control::roles::{self, Credentials, Socket};
use crate::control::session::Session;
use crate::display::Escaped;

/// Requests one connection may have running at once; past it a request is refused
/// (`-32002`) rather than queued, so the connection keeps answering.
const MAX_IN_FLIGHT: usize = 256;
/// Connections open at once on each socket; a thread each. Counted per socket, so that
/// agents holding every connection they may open leave the approvers' socket answering.
const MAX_CONNECTIONS: usize = 1024;
/// A reply line not written whole within this long disconnects its client, so a client that
/// stops reading (or reads a few bytes now and then) cannot pin the threads that answer it.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a half-closed connection whose requests still run is checked for a full close.
const HANGUP_POLL: Duration = Duration::from_millis(50);

/// The socket file we created, known by its inode so that shutting down never removes a
/// file someone else has put in its place.
struct SocketFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl SocketFile {
    fn remove(&self) {
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) if m.dev() == self.dev && m.ino() == self.ino => {
                if let Err(e) = std::fs::remove_file(&self.path) {
                    tracing::warn!("cannot remove the socket {}: {e}", self.path.display());
                }
            }
            _ => {}
        }
    }
}

/// The words and the config key of each socket, for messages.
fn named(socket: Socket) -> (&'static str, &'static str) {
    match socket {
        Socket::Agent => ("the agent socket", "agent_socket"),
        Socket::Control => ("the control socket", "socket"),
    }
}

/// A bound socket that does not accept yet (the daemon binds before mounting, so a socket
/// problem is reported before anything is mounted, and accepts once the mount is live).
pub struct Listener {
    listener: UnixListener,
    file: Option<SocketFile>,
    socket: Socket,
}

impl Listener {
    /// Binds `path` as `socket`: creates its directory (mode `dir_mode`) if missing, replaces
    /// a stale socket left by a daemon that died, refuses one a live daemon answers on (and
    /// anything that is not a socket), and gives the socket `mode` before it becomes visible
    /// under its name.
    pub fn bind(path: &Path, socket: Socket, mode: u32, dir_mode: u32) -> Result<Listener> {
        let (what, key) = named(socket);
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(dir_mode)
                .create(&dir)
                .with_context(|| format!("cannot create the socket directory {}", dir.display()))?;
        } else if mode & 0o007 != 0 && std::fs::metadata(&dir).is_ok_and(|m| m.mode() & 0o001 == 0) {
            tracing::warn!(
                "{what} {} is for other users too, but its directory {} is not searchable by them (mode {:o})",
                path.display(),
                dir.display(),
                std::fs::metadata(&dir).map(|m| m.mode() & 0o7777).unwrap_or(0)
            );
        }
        // sun_path holds 108 bytes including the terminating NUL.
        if path.as_os_str().len() > 107 {
            bail!(
                "{what} path {} is too long ({} bytes; Unix sockets allow at most 107)",
                path.display(),
                path.as_os_str().len()
            );
        }
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() => match UnixStream::connect(path) {
                Ok(_) => bail!(
                    "another daemon is already listening on {what} {} (stop it, or set a different `{key}` in the config)",
                    path.display()
                ),
                // Refused: nobody listens, the daemon that made it died.
                Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                    tracing::info!("replacing the stale {} {}", &what[4..], path.display())
                }
                Err(e) => bail!(
                    "cannot tell whether a daemon listens on {what} {} ({e}); refusing to replace it",
                    path.display()
                ),
            },
            Ok(_) => bail!("{what} path {} exists and is not a socket; refusing to replace it", path.display()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => bail!("cannot use {what} path {}: {e}", path.display()),
        }
        // Bind under a temporary name, set its mode, then rename it into place: the socket is
        // never reachable under its real name with other permissions, and a stale file is
        // replaced atomically. (Anyone connecting through the temporary name meanwhile still
        // meets the peer check.) The name is short so that it fits wherever the real one does.
        let temp = dir.join(format!(".avfs{}{}", std::process::id(), &socket.as_str()[..1]));
        let _ = std::fs::remove_file(&temp);
        let listener =
            UnixListener::bind(&temp).with_context(|| format!("cannot create {what} {}", path.display()))?;
        let placed = std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(mode))
            .and_then(|_| std::fs::rename(&temp, path))
            .and_then(|_| std::fs::symlink_metadata(path));
        let meta = match placed {
            Ok(m) => m,
            Err(e) => {
                let _ = std::fs::remove_file(&temp);
                bail!("cannot create {what} {}: {e}", path.display());
            }
        };
        let file = SocketFile { path: path.to_path_buf(), dev: meta.dev(), ino: meta.ino() };
        Ok(Listener { listener, file: Some(file), socket })
    }

    pub fn path(&self) -> &Path {
        &self.file.as_ref().expect("bound").path
    }
}

/// Starts accepting connections on every listener.
pub fn serve(listeners: Vec<Listener>, state: Arc<State>) -> Result<Server> {
    let (wake_rx, wake_tx) = UnixStream::pair().context("cannot create the control wake-up pipe")?;
    let shared = Arc::new(Shared {
        state,
        stopping: AtomicBool::new(false),
        connections: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(0),
        running: Arc::default(),
    });
    let mut accepting = Vec::new();
    let mut files = Vec::new();
    for mut listener in listeners {
        listener.listener.set_nonblocking(true)?;
        accepting.push((listener.listener.try_clone()?, listener.socket));
        files.extend(listener.file.take());
    }
    let accept_shared = shared.clone();
    let accept = std::thread::Builder::new()
        .name("control-accept".into())
        .spawn(move || accept_loop(&accepting, &wake_rx, &accept_shared))?;
    Ok(Server { shared, accept: Some(accept), wake: Some(wake_tx), files })
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(file) = &self.file {
            file.remove();
        }
    }
}

struct Shared {
    state: Arc<State>,
    stopping: AtomicBool,
    /// Open connections, so that stopping can close them.
    connections: Mutex<HashMap<u64, (UnixStream, Socket)>>,
    next_id: AtomicU64,
    /// Requests running on every connection, by uid (each has a thread).
    running: Arc<super::running::Running>,
}

/// The running control door. Dropping it stops accepting, closes every connection and
/// removes the socket files.
pub struct Server {
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
    wake: Option<UnixStream>,
    files: Vec<SocketFile>,
}

impl Server {
    pub fn stop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Closing our end of the pair wakes the accept loop's poll.
        self.wake.take();
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        for (_, (stream, _)) in self.shared.connections.lock().drain() {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        for file in self.files.drain(..) {
            file.remove();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn poll_readable(fds: &[RawFd]) -> io::Result<()> {
    let mut pollfds: Vec<libc::pollfd> =
        fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    // SAFETY: `pollfds` is a valid, initialised array of the length passed.
    let n = unsafe { libc::poll(pollfds.as_mut_ptr(), pollfds.len() as libc::nfds_t, -1) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

fn accept_loop(listeners: &[(UnixListener, Socket)], wake: &UnixStream, shared: &Arc<Shared>) {
    let mut fds: Vec<RawFd> = listeners.iter().map(|(l, _)| l.as_raw_fd()).collect();
    fds.push(wake.as_raw_fd());
    loop {
        if let Err(e) = poll_readable(&fds) {
            tracing::error!("control socket poll failed: {e}");
            std::thread::sleep(Duration::from_millis(100));
        }
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        for (listener, socket) in listeners {
            accept_one(listener, *socket, shared);
        }
    }
}

/// Accepts a connection waiting on `listener`, if one is.
fn accept_one(listener: &UnixListener, socket: Socket, shared: &Arc<Shared>) {
    match listener.accept() {
        Ok((stream, _)) => {
            let shared = shared.clone();
            let spawned = std::thread::Builder::new()
                .name("control-conn".into())
                .spawn(move || connection(shared, stream, socket));
            if let Err(e) = spawned {
                tracing::error!("cannot start a control connection thread: {e}");
            }
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {}
        Err(e) => {
            // Out of descriptors and the like: wait rather than spin.
            tracing::warn!("{} accept failed: {e}", named(socket).0);
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// `SO_PEERGROUPS` (asm-generic; the libc crate does not name it yet).
const SO_PEERGROUPS: libc::c_int = 59;

/// The peer's supplementary groups; empty when the kernel cannot say (before Linux 4.13).
fn peer_groups(stream: &UnixStream) -> Vec<u32> {
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: `groups` is valid for writes of `len` bytes.
        let rc = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_PEERGROUPS,
                groups.as_mut_ptr() as *mut libc::c_void,
                &mut len,
            )
        };
        let count = len as usize / std::mem::size_of::<libc::gid_t>();
        if rc == 0 {
            groups.truncate(count);
            return groups;
        }
        // ERANGE says how many there are.
        if io::Error::last_os_error().raw_os_error() == Some(libc::ERANGE) && count > groups.len() {
            groups.resize(count, 0);
            continue;
        }
        return Vec::new();
    }
}

/// Who is on the other end of `stream` (`SO_PEERCRED`, and `SO_PEERGROUPS`): for a client's
/// stream, the process that listens.
pub(super) fn peer_credentials(stream: &UnixStream) -> io::Result<Credentials> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Credentials { pid: cred.pid as u32, uid: cred.uid, gid: cred.gid, groups: peer_groups(stream) })
}

/// Sends one error line and closes (refused peers, too many connections).
fn refuse(mut stream: UnixStream, error: RpcError) {
    let _ = write_within(
        &mut stream,
        &proto::encode(&proto::response(&proto::Id::null(), Err(error))),
        Duration::from_secs(1),
    );
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// Writes whole reply lines; once a write fails the connection is shut down.
struct Writer {
    stream: Mutex<Outlet>,
    /// What waits to be written counts against the connection's budget for results.
    budget: Arc<ReplyBudget>,
}

/// The connection's sending side.
struct Outlet {
    stream: UnixStream,
    /// A write failed or timed out. Set, with the shutdown, under the lock that write held: the
    /// replies queued behind it are dropped at once instead of each spending its own
    /// [`WRITE_TIMEOUT`] on a reader that is not there, holding the user's share of the budget.
    dead: bool,
}

impl Writer {
    fn new(stream: UnixStream, budget: Arc<ReplyBudget>) -> Writer {
        Writer { stream: Mutex::new(Outlet { stream, dead: false }), budget }
    }

    /// Whether the line went out.
    fn send(&self, message: &impl serde::Serialize) -> bool {
        let line = proto::encode(message);
        self.budget.queued(line.len());
        let written = {
            let mut outlet = self.stream.lock();
            if outlet.dead {
                false
            } else if let Err(e) = write_within(&mut outlet.stream, &line, WRITE_TIMEOUT) {
                tracing::debug!("control reply lost ({e}); closing the connection");
                outlet.dead = true;
                let _ = outlet.stream.shutdown(std::net::Shutdown::Both);
                // Before the bytes are given back, so that no call of this connection builds
                // again in their room.
                self.budget.close();
                false
            } else {
                true
            }
        };
        self.budget.sent(line.len());
        written
    }
}

/// Writes all of `bytes` within `limit` in all. Each send is non-blocking and the wait for
/// room is a `poll` on what is left of the limit: a send timeout (`SO_SNDTIMEO`) starts again
/// for every buffer the kernel allocates, so a reader draining a little at a time could stretch
/// one reply without end.
fn write_within(stream: &mut UnixStream, bytes: &[u8], limit: Duration) -> io::Result<()> {
    let deadline = std::time::Instant::now() + limit;
    let fd = stream.as_raw_fd();
    let mut rest = bytes;
    while !rest.is_empty() {
        // SAFETY: `rest` is a live buffer of the given length; MSG_DONTWAIT makes this one
        // call non-blocking without changing the descriptor the reader shares.
        let n = unsafe {
            libc::send(fd, rest.as_ptr().cast(), rest.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
        };
        if n >= 0 {
            rest = &rest[n as usize..];
            continue;
        }
        let error = io::Error::last_os_error();
        match error.kind() {
            io::ErrorKind::Interrupted => {}
            io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                let mut pollfd = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
                let millis = left.as_millis().min(i32::MAX as u128) as i32;
                // SAFETY: one valid, initialised pollfd.
                if left.is_zero() || unsafe { libc::poll(&mut pollfd, 1, millis) } == 0 {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "the reply was not read in time"));
                }
            }
            _ => return Err(error),
        }
    }
    Ok(())
}

/// Requests running on one connection.
struct InFlight {
    count: Mutex<usize>,
    done: Condvar,
}

impl InFlight {
    fn try_enter(&self) -> bool {
        let mut count = self.count.lock();
        if *count >= MAX_IN_FLIGHT {
            return false;
        }
        *count += 1;
        true
    }

    fn leave(&self) {
        let mut count = self.count.lock();
        *count -= 1;
        if *count == 0 {
            self.done.notify_all();
        }
    }

    fn wait_idle(&self) {
        let mut count = self.count.lock();
        while *count > 0 {
            self.done.wait(&mut count);
        }
    }

    /// Waits up to `limit` for no request to be running; whether none is.
    fn wait_idle_for(&self, limit: Duration) -> bool {
        let mut count = self.count.lock();
        if *count > 0 {
            self.done.wait_for(&mut count, limit);
        }
        *count == 0
    }
}

/// Whether the peer closed the connection for good, not just its sending side: a Unix stream
/// socket reports POLLHUP once neither end can send to the other (the peer closed it, or a
/// failed reply shut it down), and an error when the peer closed with replies unread.
fn hung_up(fd: RawFd) -> bool {
    let mut pollfd = libc::pollfd { fd, events: 0, revents: 0 };
    // SAFETY: one valid, initialised pollfd; a zero timeout does not block.
    let n = unsafe { libc::poll(&mut pollfd, 1, 0) };
    n > 0 && pollfd.revents & (libc::POLLHUP | libc::POLLERR) != 0
}

fn connection(shared: Arc<Shared>, stream: UnixStream, socket: Socket) {
    let counters = &shared.state.counters;
    let _ = stream.set_nonblocking(false);
    let credentials = match peer_credentials(&stream) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("control connection without credentials ({e}); closing it");
            return;
        }
    };
    let state = &shared.state;
    if let Some(why) = state.roles.refusal(socket, &credentials, &state.agent_socket) {
        counters.peers_refused.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            pid = credentials.pid,
            uid = credentials.uid,
            "refused a connection to {}: the user has no role there",
            named(socket).0
        );
        return refuse(stream, RpcError::new(proto::PEER_REFUSED, why));
    }
    let peer = Peer {
        pid: credentials.pid,
        uid: credentials.uid,
        gid: credentials.gid,
        groups: crate::engine::Groups::new(&credentials.groups),
        socket,
    };
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    {
        let mut connections = shared.connections.lock();
        let on_this_socket = connections.values().filter(|(_, s)| *s == socket).count();
        if on_this_socket >= MAX_CONNECTIONS || shared.stopping.load(Ordering::SeqCst) {
            drop(connections);
            let message = format!("too many connections to {} (limit {MAX_CONNECTIONS})", named(socket).0);
            return refuse(stream, RpcError::new(proto::OVERLOADED, message));
        }
        match stream.try_clone() {
            Ok(clone) => connections.insert(id, (clone, socket)),
            Err(e) => {
                return refuse(stream, RpcError::internal(format!("cannot register the connection: {e}")))
            }
        };
    }
    counters.connections_open.fetch_add(1, Ordering::Relaxed);
    counters.connections_total.fetch_add(1, Ordering::Relaxed);
    match (stream.try_clone(), stream.try_clone()) {
        (Ok(reader), Ok(writer)) => serve_connection(&shared, peer, reader, writer),
        _ => tracing::warn!("cannot duplicate a control connection"),
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
    shared.connections.lock().remove(&id);
    counters.connections_open.fetch_sub(1, Ordering::Relaxed);
}

/// Reads requests until the peer closes its side, then waits for the requests still running
/// so their replies go out (a client may half-close after its last request). A peer that
/// closed the whole connection reads no replies: the approvals its tool calls wait on are
/// withdrawn, so that no later approval runs a call nobody waits for.
fn serve_connection(shared: &Arc<Shared>, peer: Peer, reader: UnixStream, writer: UnixStream) {
    let session = Arc::new(Session::for_uid(shared.state.config.observation, peer.uid));
    let writer = Arc::new(Writer::new(writer, session.replies.clone()));
    let in_flight = Arc::new(InFlight { count: Mutex::new(0), done: Condvar::new() });
    let fd = reader.as_raw_fd();
    let mut lines = LineReader::new(reader, proto::MAX_LINE);
    let approvals = shared.state.engine.gate.approvals.clone();
    let mut subscriptions = Vec::new();
    let mut gone = false;
    loop {
        let line = match lines.read_line() {
            Ok(Line::Complete(line)) => line,
            Ok(Line::TooLong) => {
                writer.send(&proto::response(&proto::Id::null(), Err(proto::line_too_long())));
                continue;
            }
            Ok(Line::Eof) => break,
            Err(e) => {
                tracing::debug!("control connection read failed: {e}");
                gone = true;
                break;
            }
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let (id, method, params) = match proto::parse(&line) {
            Ok(Message::Request { id, method, params }) => (id, method, params),
            Ok(Message::Notification { method, .. }) => {
                tracing::debug!("control notification {}", Escaped(&method));
                continue;
            }
            Ok(Message::Response) => continue,
            Err((id, error)) => {
                writer.send(&proto::response(&id, Err(error)));
                continue;
            }
        };
        // The agent socket serves the agent's methods only.
        if let Err(error) = roles::check_method(peer.socket, &method) {
            writer.send(&proto::response(&id, Err(error)));
            continue;
        }
        // Params by name only, for every method, even those that read none (an unknown method
        // is left to answer "method not found").
        if roles::role_of(&method).is_some() {
            if let Err(error) = proto::params_by_name(params.as_ref()) {
                writer.send(&proto::response(&id, Err(error)));
                continue;
            }
        }
        // A subscription lives as long as the connection and writes on it, so it is the
        // transport's business rather than a method's.
        if method == "interrupts/subscribe" {
            let notify = writer.clone();
            subscriptions.push(approvals.subscribe(move |message| notify.send(message)));
            let result = serde_json::json!({"subscribed": true, "interrupts": approvals.list()});
            writer.send(&proto::response(&id, Ok(result)));
            continue;
        }
        if !in_flight.try_enter() {
            let message = format!("too many requests in flight on this connection (limit {MAX_IN_FLIGHT})");
            writer.send(&proto::response(&id, Err(RpcError::new(proto::OVERLOADED, message))));
            continue;
        }
        let place = match shared.running.enter(peer.uid) {
            Ok(place) => place,
            Err(message) => {
                in_flight.leave();
                writer.send(&proto::response(&id, Err(RpcError::new(proto::OVERLOADED, message))));
                continue;
            }
        };
        let job = {
            let (shared, writer, session, in_flight, id) =
                (shared.clone(), writer.clone(), session.clone(), in_flight.clone(), id.clone());
            move || {
                let _place = place;
                let state = &shared.state;
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    state.handle(&session, &peer, &id, &method, params.as_ref())
                }));
                let result = outcome.unwrap_or_else(|panic| {
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    tracing::error!("control method {} panicked: {}", Escaped(&method), Escaped(&what));
                    Err(RpcError::internal(format!("internal error in {method}: {what}")))
                });
                writer.send(&proto::response(&id, result));
                crate::control::reply_budget::end_of_request();
                in_flight.leave();
            }
        };
        if let Err(e) = std::thread::Builder::new().name("control-request".into()).spawn(job) {
            in_flight.leave();
            writer.send(&proto::response(
                &id,
                Err(RpcError::internal(format!("cannot start the request: {e}"))),
            ));
        }
    }
    for subscription in subscriptions {
        approvals.unsubscribe(subscription);
    }
    // After a half-close the replies are still wanted, but the peer may close meanwhile.
    gone = gone || hung_up(fd);
    while !gone && !in_flight.wait_idle_for(HANGUP_POLL) {
        gone = hung_up(fd);
    }
    if gone {
        session.replies.close();
        for id in session.close() {
            approvals.withdraw(id);
        }
        in_flight.wait_idle();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A reader that drains a little often enough for every single `write` to progress still
    /// cannot stretch a reply past its limit.
    #[test]
    fn a_slowly_drained_reply_fails_at_its_deadline() {
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut theirs = theirs;
                let mut buf = vec![0u8; 64 * 1024];
                let mut read = 0usize;
                while !stop.load(Ordering::SeqCst) {
                    match std::io::Read::read(&mut theirs, &mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => read += n,
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                read
            })
        };
        let started = std::time::Instant::now();
        let outcome = write_within(&mut ours, &vec![b'x'; 8 << 20], Duration::from_millis(500));
        let took = started.elapsed();
        stop.store(true, Ordering::SeqCst);
        drop(ours);
        let read = reader.join().unwrap();
        assert_eq!(outcome.unwrap_err().kind(), io::ErrorKind::TimedOut);
        assert!(took >= Duration::from_millis(500) && took < Duration::from_secs(3), "{took:?}");
        assert!(read > 0 && read < 8 << 20, "{read}");
    }

    /// Connections that ask for large results and read nothing hold no more than the
    /// daemon's budget between them, stop being served once gone, and a connection that
    /// reads its replies is served then.
    #[test]
    fn connections_reading_nothing_hold_no_more_than_the_daemon_budget() {
        use crate::control::reply_budget::{Pool, ReplyBudget};
        const REPLY: usize = 256 << 10;
        // The daemon's bounds, smaller: 2 results built, 1 MiB unsent.
        let pool = Pool::new(2, 1 << 20);
        // Each of another user, so that only the daemon's bounds, not a user's share, hold.
        let connection = |pool: &Arc<Pool>, uid: u32| {
            let (ours, theirs) = UnixStream::pair().unwrap();
            let budget = Arc::new(ReplyBudget::in_pool(pool.clone(), uid));
            (Arc::new(Writer::new(ours, budget)), theirs)
        };
        let (built, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        // As the server runs a request: build in a turn, then send.
        let request = |writer: &Arc<Writer>| {
            let (writer, pool, built, peak) = (writer.clone(), pool.clone(), built.clone(), peak.clone());
            std::thread::spawn(move || {
                let Some(turn) = writer.budget.turn() else { return false };
                built.fetch_add(1, Ordering::SeqCst);
                let reply = serde_json::json!({"data": "x".repeat(REPLY)});
                drop(turn);
                let sent = writer.send(&reply);
                peak.fetch_max(pool.held().1, Ordering::SeqCst);
                sent
            })
        };
        let sampler = {
            let (pool, peak) = (pool.clone(), peak.clone());
            std::thread::spawn(move || {
                for _ in 0..300 {
                    peak.fetch_max(pool.held().1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        };
        // Four connections, sixteen requests each, nothing read.
        let (mut readers, mut writers, mut requests) = (Vec::new(), Vec::new(), Vec::new());
        for uid in 1..=4 {
            let (writer, theirs) = connection(&pool, uid);
            requests.extend((0..16).map(|_| request(&writer)));
            readers.push(theirs);
            writers.push(writer);
        }
        sampler.join().unwrap();
        let line = proto::encode(&serde_json::json!({"data": "x".repeat(REPLY)})).len();
        // A turn is given while at most 1 MiB waits; each of the 2 at once adds one reply.
        let bound = (1 << 20) + 2 * line;
        let before = built.load(Ordering::SeqCst);
        assert!(peak.load(Ordering::SeqCst) <= bound, "held {} > {bound}", peak.load(Ordering::SeqCst));
        assert!(before <= bound / line + 2, "{before} results built for clients reading nothing");
        // A client that reads waits meanwhile; once the others are gone it is served, and
        // their waiting calls build nothing more.
        let (writer, theirs) = connection(&pool, 5);
        let polite = request(&writer);
        let read = std::thread::spawn(move || {
            let mut line = String::new();
            std::io::BufRead::read_line(&mut std::io::BufReader::new(theirs), &mut line).unwrap();
            line.len()
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(!polite.is_finished(), "served beyond the budget");
        // Gone, as the server sees it: their end closed, and their sessions told.
        let started = std::time::Instant::now();
        writers.iter().for_each(|writer| writer.budget.close());
        drop(readers);
        assert!(polite.join().unwrap(), "the reading client was not served");
        assert!(started.elapsed() < Duration::from_secs(2), "served after {:?}", started.elapsed());
        assert_eq!(read.join().unwrap(), line);
        let sent = requests.into_iter().map(|r| r.join().unwrap()).filter(|&sent| sent).count();
        assert_eq!(sent, 0, "no reply reached a client that had gone");
        assert_eq!(built.load(Ordering::SeqCst), before + 1, "calls of gone clients were built");
        assert_eq!(pool.held(), (0, 0));
    }

    #[test]
    fn a_reply_read_in_time_goes_out_whole() {
        let (mut ours, mut theirs) = UnixStream::pair().unwrap();
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            std::io::Read::read_to_end(&mut theirs, &mut all).unwrap();
            all.len()
        });
        write_within(&mut ours, &vec![b'x'; 4 << 20], Duration::from_secs(10)).unwrap();
        drop(ours);
        assert_eq!(reader.join().unwrap(), 4 << 20);
    }
}
