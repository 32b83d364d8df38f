//! A small blocking client for the daemon's sockets (used by the CLI and `agentvfs mcp`):
//! connect, send a request, read lines until the response with its id arrives.

use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::control::proto::{self, Line, LineReader, RpcError};

/// Replies can be much larger than requests (a big read); this only guards against a
/// runaway peer.
const MAX_REPLY: usize = 256 << 20;

#[derive(Debug)]
pub enum ClientError {
    /// Nothing listens on the socket (no file, or a stale one).
    NotRunning(PathBuf),
    /// The socket exists but may not be opened by this user.
    PermissionDenied(PathBuf),
    Io(PathBuf, io::Error),
    /// The daemon answered with a JSON-RPC error.
    Rpc(RpcError),
    /// The daemon closed the connection (or sent something unreadable) before answering.
    Protocol(String),
    /// Nothing came back for a request within the client's timeout (see
    /// [`Client::answer_within`]): (socket, method, timeout).
    TimedOut(PathBuf, String, Duration),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::NotRunning(p) => {
                write!(f, "no daemon is listening on {} (is `agentvfs mount` running?)", p.display())
            }
            ClientError::PermissionDenied(p) => write!(
                f,
                "permission denied opening the socket {} (its file mode or its directory's keeps this user out: the daemon makes a socket 0600 when only root and its own user may use it)",
                p.display()
            ),
            ClientError::Io(p, e) => write!(f, "control socket {}: {e}", p.display()),
            ClientError::Rpc(e) => write!(f, "{}", e.message),
            ClientError::Protocol(m) => f.write_str(m),
            ClientError::TimedOut(p, method, after) => write!(
                f,
                "no answer to {method} on {} within {}: what listens there accepted the connection but \
                 does not answer as an agentvfs daemon does (a daemon that hangs, or another program's \
                 socket)",
                p.display(),
                match after.subsec_millis() {
                    0 => format!("{} s", after.as_secs()),
                    _ => format!("{} ms", after.as_millis()),
                }
            ),
        }
    }
}

impl std::error::Error for ClientError {}

pub struct Client {
    path: PathBuf,
    stream: UnixStream,
    lines: LineReader<UnixStream>,
    next_id: u64,
    /// How long a read or write may wait (`None`: for ever; see [`Client::answer_within`]).
    timeout: Option<Duration>,
}

/// Connects to the socket at `path`, telling "no daemon" apart from other failures.
pub fn connect_stream(path: &Path) -> Result<UnixStream, ClientError> {
    UnixStream::connect(path).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ECONNREFUSED) | Some(libc::ENOTDIR) => {
            ClientError::NotRunning(path.to_path_buf())
        }
        Some(libc::EACCES) | Some(libc::EPERM) => ClientError::PermissionDenied(path.to_path_buf()),
        _ => ClientError::Io(path.to_path_buf(), e),
    })
}

impl Client {
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        let stream = connect_stream(path)?;
        let reader = stream.try_clone().map_err(|e| ClientError::Io(path.to_path_buf(), e))?;
        Ok(Client {
            path: path.to_path_buf(),
            stream,
            lines: LineReader::new(reader, MAX_REPLY),
            next_id: 1,
            timeout: None,
        })
    }

    /// Bounds every later read and write on the connection by `limit`: a request whose peer
    /// sends nothing for that long fails with [`ClientError::TimedOut`] (each read is bounded,
    /// not the whole answer: a peer trickling bytes keeps it waiting; nor is `connect`, which
    /// waits while the listener's backlog is full). Only for requests the daemon answers
    /// at once (`agentvfs run`'s): a tool call may wait for an approver, and `next_message`
    /// for the next interrupt, as long as it takes, so clients are unbounded unless told.
    pub fn answer_within(&mut self, limit: Duration) -> Result<(), ClientError> {
        let set =
            |s: &UnixStream| s.set_read_timeout(Some(limit)).and_then(|()| s.set_write_timeout(Some(limit)));
        // The timeouts are the socket's, so the reader's clone has them too.
        set(&self.stream).map_err(|e| ClientError::Io(self.path.clone(), e))?;
        self.timeout = Some(limit);
        Ok(())
    }

    /// The uid of the process that listens on the socket (`SO_PEERCRED`): whom this client is
    /// talking to.
    pub fn server_uid(&self) -> std::io::Result<u32> {
        Ok(super::server::peer_credentials(&self.stream)?.uid)
    }

    /// Sends one request and waits for its result.
    pub fn call(&mut self, method: &str, params: Option<Value>) -> Result<Value, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        let line = proto::encode(&proto::request(id, method, params));
        if let Err(e) = self.stream.write_all(&line) {
            if let Some(late) = self.timed_out(&e, method) {
                return Err(late);
            }
            // The daemon may have refused us and closed already; its reason is in the reply.
            return self.read_reply(id, method).and(Err(ClientError::Io(self.path.clone(), e)));
        }
        self.read_reply(id, method)
    }

    /// The error for `e` when it is this client's timeout running out.
    fn timed_out(&self, e: &io::Error, method: &str) -> Option<ClientError> {
        let late = matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut);
        let limit = self.timeout.filter(|_| late)?;
        Some(ClientError::TimedOut(self.path.clone(), method.to_string(), limit))
    }

    /// The next message the daemon sends, whatever it is (for notifications after
    /// `interrupts/subscribe`); `None` when the daemon closed the connection.
    pub fn next_message(&mut self) -> Result<Option<Value>, ClientError> {
        match self.lines.read_line() {
            Ok(Line::Complete(line)) => serde_json::from_slice(&line)
                .map(Some)
                .map_err(|e| ClientError::Protocol(format!("unreadable message from the daemon: {e}"))),
            Ok(Line::TooLong) => Err(ClientError::Protocol("the daemon's message is too long".into())),
            Ok(Line::Eof) => Ok(None),
            Err(e) => Err(ClientError::Io(self.path.clone(), e)),
        }
    }

    fn read_reply(&mut self, id: u64, method: &str) -> Result<Value, ClientError> {
        loop {
            let line = match self.lines.read_line() {
                Ok(Line::Complete(line)) => line,
                Ok(Line::TooLong) => {
                    return Err(ClientError::Protocol("the daemon's reply is too long".into()))
                }
                Ok(Line::Eof) => {
                    return Err(ClientError::Protocol(format!(
                        "the daemon closed the connection on {} before answering",
                        self.path.display()
                    )))
                }
                Err(e) => {
                    return Err(self.timed_out(&e, method).unwrap_or(ClientError::Io(self.path.clone(), e)))
                }
            };
            let reply: Value = match serde_json::from_slice(&line) {
                Ok(v) => v,
                Err(e) => {
                    return Err(ClientError::Protocol(format!("unreadable reply from the daemon: {e}")))
                }
            };
            let reply_id = reply.get("id").cloned().unwrap_or(Value::Null);
            // Errors about the connection itself (a refused peer, an unparsable line) carry a
            // null id and are ours too.
            if reply_id != id && !(reply_id.is_null() && reply.get("error").is_some()) {
                continue;
            }
            if let Some(error) = reply.get("error") {
                return Err(ClientError::Rpc(RpcError::from_json(error)));
            }
            return Ok(reply.get("result").cloned().unwrap_or(Value::Null));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bounded_client_gives_up_on_a_listener_that_never_answers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("silent.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let mut client = Client::connect(&path).unwrap();
        let _accepted = listener.accept().unwrap();
        client.answer_within(Duration::from_millis(200)).unwrap();
        let started = std::time::Instant::now();
        let err = client.call("vfs/paths", None).unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert!(
            matches!(&err, ClientError::TimedOut(p, m, d) if p == &path && m == "vfs/paths" && d.as_millis() == 200)
        );
        assert_eq!(
            err.to_string(),
            format!(
                "no answer to vfs/paths on {} within 200 ms: what listens there accepted the connection but does \
                 not answer as an agentvfs daemon does (a daemon that hangs, or another program's socket)",
                path.display()
            )
        );
    }
}
