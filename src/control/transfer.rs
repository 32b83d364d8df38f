//! `vfs/upload` and `vfs/download`: whole files as bytes (base64 on the wire), for harnesses
//! that seed or collect files (Deep Agents' `upload_files`/`download_files`). They are not
//! tools the model sees; they run through the same path pipeline and gate as the tools
//! (deny rules refuse, hidden paths do not exist), and they never ask a human: an interrupt
//! rule refuses them, as it refuses any operation nobody approved.
//!
//! A request line is capped (1 MiB), so an upload comes in pieces: each `vfs/upload` with
//! `more: true` adds its piece to the session's staging for that path, and the one without
//! it writes the whole file at once (atomically, like `write_file`). Replies are not capped:
//! a download is one reply.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use serde_json::{json, Map, Value};

use crate::backend::FileKind;
use crate::control::proto::RpcError;
use crate::control::tools::{common, ErrorCode, ToolEnv, ToolOutput};
use crate::error::{Errno, FsError};
use crate::policy::Op;

/// The largest file either method moves, in bytes.
pub const MAX_FILE_BYTES: usize = 256 << 20;

/// What every session together may hold staged, in bytes. A session holds at most
/// [`MAX_FILE_BYTES`] across all its paths; this bounds the many sessions together, so that
/// clients staging pieces they never finish cannot run the daemon out of memory.
pub const MAX_STAGED_BYTES: usize = 1 << 30;

/// Bytes staged in all sessions now.
static STAGED: AtomicUsize = AtomicUsize::new(0);

/// Upload pieces received so far, per path, for one session.
#[derive(Default)]
pub struct Staging {
    files: Mutex<HashMap<String, Vec<u8>>>,
}

impl Staging {
    /// Takes `n` more bytes out of the daemon's budget, if it has them.
    fn reserve(n: usize) -> bool {
        STAGED
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                (now + n <= MAX_STAGED_BYTES).then_some(now + n)
            })
            .is_ok()
    }

    fn release(n: usize) {
        STAGED.fetch_sub(n, Ordering::AcqRel);
    }

    /// Adds `piece` to what is staged for `raw`: with `more`, keeps it (and says how much
    /// the path holds now); without, hands the whole file over. Past either budget the
    /// path's pieces are dropped (a file missing some cannot be finished) and the answer
    /// says why.
    fn add(&self, raw: &str, piece: &[u8], more: bool) -> Result<Staged, ToolOutput> {
        let mut files = self.files.lock();
        let session: usize = files.values().map(Vec::len).sum();
        let refusal = if session + piece.len() > MAX_FILE_BYTES {
            Some(too_large(raw))
        } else if !Self::reserve(piece.len()) {
            Some(ToolOutput::error(
                ErrorCode::TooLarge,
                format!("Error: the daemon holds {MAX_STAGED_BYTES} bytes of unfinished uploads; '{raw}' was dropped, send it again later"),
            ))
        } else {
            None
        };
        if let Some(refusal) = refusal {
            Self::release(files.remove(raw).map_or(0, |v| v.len()));
            return Err(refusal);
        }
        let staged = files.entry(raw.to_string()).or_default();
        staged.extend_from_slice(piece);
        if more {
            return Ok(Staged::More(staged.len()));
        }
        let data = files.remove(raw).unwrap_or_default();
        Self::release(data.len());
        Ok(Staged::Whole(data))
    }
}

/// What [`Staging::add`] did with a piece.
enum Staged {
    /// Kept: the path holds this many bytes now.
    More(usize),
    /// The last piece: the whole file.
    Whole(Vec<u8>),
}

impl Drop for Staging {
    fn drop(&mut self) {
        Self::release(self.files.get_mut().values().map(Vec::len).sum());
    }
}

/// `vfs/upload {path, content (base64), more?}` → `{path, size}`, or `{path, error_code,
/// message}` when it failed (a failure is a result, not a protocol error, as for tools).
pub fn upload(env: &ToolEnv, staging: &Staging, params: &Map<String, Value>) -> Result<Value, RpcError> {
    let raw = string(params, "path")?;
    let piece = decode_base64(string(params, "content")?)
        .ok_or_else(|| RpcError::invalid_params("`content` must be base64 (RFC 4648, with padding)"))?;
    let more = match params.get("more") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(RpcError::invalid_params(format!("`more` must be a boolean, got {other}")))
        }
    };
    let data = match staging.add(raw, &piece, more) {
        Ok(Staged::More(staged)) => return Ok(json!({"path": raw, "staged": staged})),
        Ok(Staged::Whole(data)) => data,
        Err(refusal) => return Ok(failure(raw, &refusal)),
    };
    Ok(match write(env, raw, &data) {
        Ok(path) => json!({"path": path, "size": data.len()}),
        Err(e) => failure(raw, &e),
    })
}

/// `vfs/download {path}` → `{path, content (base64), size}`, or `{path, error_code, message}`.
pub fn download(env: &ToolEnv, params: &Map<String, Value>) -> Result<Value, RpcError> {
    let raw = string(params, "path")?;
    Ok(match read(env, raw) {
        Ok(data) => json!({"path": raw, "content": common::base64(&data), "size": data.len()}),
        Err(e) => failure(raw, &e),
    })
}

fn write(env: &ToolEnv, raw: &str, data: &[u8]) -> Result<String, ToolOutput> {
    let named = common::validate(raw)?;
    let path = &named.path;
    common::refuse_route_root(env, path, "overwritten")?;
    common::precheck(env, Op::Write, path, false)?;
    let loc = common::locate(env, Op::Write, path, true, true)?;
    common::check_target(env, Op::Write, &loc, false)?;
    let io = |e: &FsError| {
        common::fs_failure(Op::Write, path, e, || {
            format!("Error writing file '{path}': {}", common::py_os_error(e, path))
        })
    };
    let mut mode = 0o644;
    if let Some(attr) = &loc.attr {
        if attr.kind == FileKind::Dir {
            return Err(io(&FsError::errno(Errno::EISDIR)));
        }
        mode = u32::from(attr.perm);
    }
    if named.must_be_dir {
        return Err(io(&FsError::errno(Errno::EISDIR)));
    }
    env.fs.write_atomic(&loc.real, data, mode).map_err(|e| io(&e))?;
    Ok(path.to_string())
}

fn read(env: &ToolEnv, raw: &str) -> Result<Vec<u8>, ToolOutput> {
    let named = common::validate(raw)?;
    let loc = common::prepare(env, &named, Op::Read, false, false)?;
    let path = &loc.path;
    match &loc.attr {
        None => {
            return Err(ToolOutput::error(ErrorCode::NotFound, format!("Error: File '{path}' not found")))
        }
        Some(a) if a.kind == FileKind::Dir => {
            return Err(ToolOutput::error(ErrorCode::IsDirectory, format!("Error: '{path}' is a directory")))
        }
        Some(a) if a.size as usize > MAX_FILE_BYTES => return Err(too_large(raw)),
        Some(a) if a.kind != FileKind::File => {
            // A FIFO or a device would hold the call until someone writes to it.
            return Err(ToolOutput::error(
                ErrorCode::InvalidArgument,
                format!("Error: '{path}' is not a regular file"),
            ));
        }
        Some(_) => {}
    }
    // `file.txt/` names a directory: a file there is ENOTDIR, as for `read_file`.
    common::require_dir(&named, &loc, |written, os_error| {
        format!("Error: Error reading file '{written}': {os_error}")
    })?;
    env.fs.read(&loc.real, MAX_FILE_BYTES as u64).map_err(|e| {
        if e.is(Errno::EFBIG) {
            // Grown past the limit since it was looked at.
            return too_large(raw);
        }
        common::fs_failure(Op::Read, path, &e, || {
            format!("Error: Error reading file '{path}': {}", common::py_os_error(&e, path))
        })
    })
}

fn too_large(raw: &str) -> ToolOutput {
    ToolOutput::error(
        ErrorCode::TooLarge,
        format!("Error: '{raw}' is larger than {MAX_FILE_BYTES} bytes (with the other unfinished uploads of this connection), the most one transfer moves"),
    )
}

fn failure(raw: &str, output: &ToolOutput) -> Value {
    json!({"path": raw, "error_code": output.structured.get("error_code"), "message": output.joined_text()})
}

fn string<'p>(params: &'p Map<String, Value>, name: &str) -> Result<&'p str, RpcError> {
    params
        .get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::invalid_params(format!("missing parameter `{name}` (a string)")))
}

/// Standard base64 with padding; `None` for anything else.
pub fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    if bytes.len() % 4 != 0 {
        return None;
    }
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    let chunks = bytes.chunks(4).count();
    for (i, chunk) in bytes.chunks(4).enumerate() {
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && i + 1 != chunks) {
            return None;
        }
        let mut n = 0u32;
        for &c in &chunk[..4 - pad] {
            n = n << 6 | value(c)?;
        }
        n <<= 6 * pad as u32;
        let decoded = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&decoded[..3 - pad]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_every_byte() {
        let data: Vec<u8> = (0..=255u8).chain([0, 1]).collect();
        for len in 0..data.len() {
            let text = common::base64(&data[..len]);
            assert_eq!(decode_base64(&text).as_deref(), Some(&data[..len]), "{len}");
        }
        assert_eq!(decode_base64("abc"), None);
        assert_eq!(decode_base64("a=bc"), None);
        assert_eq!(decode_base64("ab==cdef"), None);
        assert_eq!(decode_base64("ab!="), None);
    }

    /// One session holds at most one file's worth, all sessions together the daemon's
    /// budget; what a session leaves unfinished goes back when it ends.
    #[test]
    fn staging_is_bounded_per_session_and_in_all() {
        let mib = |n: usize| vec![0u8; n << 20];
        let one = Staging::default();
        assert!(matches!(one.add("/a", &mib(100), true), Ok(Staged::More(n)) if n == 100 << 20));
        assert!(matches!(one.add("/b", &mib(100), true), Ok(Staged::More(_))));
        let refused = one.add("/c", &mib(100), true).err().unwrap();
        assert!(
            refused.joined_text().contains("with the other unfinished uploads"),
            "{}",
            refused.joined_text()
        );
        assert!(matches!(one.add("/a", &mib(1), false), Ok(Staged::Whole(data)) if data.len() == 101 << 20));
        drop(one);
        let many: Vec<Staging> = (0..4).map(|_| Staging::default()).collect();
        for s in &many {
            assert!(matches!(s.add("/x", &mib(250), true), Ok(Staged::More(_))));
        }
        let fifth = Staging::default();
        let refused = fifth.add("/x", &mib(100), true).err().unwrap();
        assert!(refused.joined_text().contains("bytes of unfinished uploads"), "{}", refused.joined_text());
        drop(many);
        assert!(
            matches!(fifth.add("/x", &mib(100), true), Ok(Staged::More(_))),
            "given back when sessions end"
        );
    }
}
