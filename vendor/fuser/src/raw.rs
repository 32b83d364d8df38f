//! Requests that reach the filesystem by another transport than reading `/dev/fuse`, such as
//! FUSE over io_uring: the transport hands over one request in the classic wire layout
//! (`fuse_in_header`, then the operation's arguments) and a sink for its reply, and the
//! request goes through the session's own dispatch.

use std::io;
use std::io::IoSlice;
use std::sync::Arc;

use crate::Filesystem;
use crate::Session;
use crate::request::RequestWithSender;
use crate::session::FilesystemHolder;
use crate::session::SessionEventLoop;

/// Where the reply to a request from another transport goes.
pub trait RawReplySink: Send + Sync + 'static {
    /// Sends the reply: a `fuse_out_header` (whose `len` counts every slice) and its data.
    /// Called exactly once per request that has a reply, possibly from another thread.
    fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()>;
}

impl std::fmt::Debug for dyn RawReplySink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RawReplySink")
    }
}

/// Dispatches requests from another transport to a filesystem, with the access rules of the
/// session it was made from.
pub struct RawDispatcher<FS: Filesystem> {
    event_loop: SessionEventLoop<FS>,
}

impl<FS: Filesystem> std::fmt::Debug for RawDispatcher<FS> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RawDispatcher")
    }
}

impl<FS: Filesystem> RawDispatcher<FS> {
    /// Dispatches one request. Fails only when `request` is not a valid FUSE request.
    pub fn dispatch(&self, request: &[u8], sink: Arc<dyn RawReplySink>) -> io::Result<()> {
        let Some(mut request) = RequestWithSender::new(self.event_loop.ch.sender(), request) else {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "invalid FUSE request"));
        };
        request.raw_sink = Some(sink);
        request.dispatch(&self.event_loop);
        Ok(())
    }
}

impl<FS: Filesystem> Session<FS> {
    /// A dispatcher for requests that arrive by another transport, serving them with
    /// `filesystem` (which shares its state with the session's own). Call it after the
    /// handshake; `init` and `destroy` are never called on `filesystem`.
    pub fn raw_dispatcher(&self, filesystem: FS) -> RawDispatcher<FS> {
        RawDispatcher {
            event_loop: SessionEventLoop {
                thread_name: "raw".to_string(),
                ch: self.ch.clone(),
                filesystem: Arc::new(FilesystemHolder { fs: Some(filesystem) }),
                allowed: self.allowed,
                session_owner: self.session_owner,
                paced: false,
            },
        }
    }
}
