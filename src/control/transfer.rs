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

use parking_lot::Mutex;
use serde_json::{json, Map, Value};

use crate::backend::FileKind;
use crate::control::proto::RpcError;
use crate::control::tools::{common, ErrorCode, ToolEnv, ToolOutput};
use crate::error::{Errno, FsError};
use crate::policy::Op;

/// The largest file either method moves, in bytes.
pub const MAX_FILE_BYTES: usize = 256 << 20;

/// Upload pieces received so far, per path, for one session.
#[derive(Default)]
pub struct Staging {
    files: Mutex<HashMap<String, Vec<u8>>>,
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
    let data = {
        let mut files = staging.files.lock();
        let staged = files.entry(raw.to_string()).or_default();
        if staged.len() + piece.len() > MAX_FILE_BYTES {
            files.remove(raw);
            return Ok(failure(raw, &too_large(raw)));
        }
        staged.extend_from_slice(&piece);
        if more {
            return Ok(json!({"path": raw, "staged": staged.len()}));
        }
        files.remove(raw).unwrap_or_default()
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
        Some(_) => {}
    }
    env.fs.read(&loc.real).map_err(|e| {
        common::fs_failure(Op::Read, path, &e, || {
            format!("Error: Error reading file '{path}': {}", common::py_os_error(&e, path))
        })
    })
}

fn too_large(raw: &str) -> ToolOutput {
    ToolOutput::error(
        ErrorCode::TooLarge,
        format!("Error: '{raw}' is larger than {MAX_FILE_BYTES} bytes, the most one transfer moves"),
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
}
