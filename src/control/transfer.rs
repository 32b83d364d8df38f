//! `vfs/upload` and `vfs/download`: whole files as bytes (base64 on the wire), for harnesses
//! that seed or collect files (Deep Agents' `upload_files`/`download_files`). They are not
//! tools the model sees; they run through the same path pipeline and gate as the tools
//! (deny rules refuse, hidden paths do not exist), and they never ask a human: an interrupt
//! rule refuses them, as it refuses any operation nobody approved.
//!
//! A request line is capped (1 MiB), so an upload comes in pieces. The first piece starts
//! an upload (its path judged at once, so a refused file costs no more pieces); with `more:
//! true` it is staged under a number the answer gives, and every later piece names that
//! number. The piece without `more` writes the whole file at once (atomically, like
//! `write_file`). A refused piece ends its upload, so a later piece of it is refused too and
//! the file is never written from what came after the refusal; and two uploads at once, of
//! one path or two, never mix their pieces. Replies are not capped: a download is one reply.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use serde_json::{json, Map, Value};

use crate::backend::FileKind;
use crate::control::proto::RpcError;
use crate::control::session::Version;
use crate::control::tools::{common, ErrorCode, ToolEnv, ToolOutput};
use crate::control::vfs::ToolPath;
use crate::error::{Errno, FsError};
use crate::policy::{Mode, Op};

/// The largest file either method moves, in bytes.
pub const MAX_FILE_BYTES: usize = 256 << 20;

/// What every session together may hold staged, in bytes. A session holds at most
/// [`MAX_FILE_BYTES`] across all its uploads; this bounds the many sessions together, so that
/// clients staging pieces they never finish cannot run the daemon out of memory.
pub const MAX_STAGED_BYTES: usize = 1 << 30;

/// Unfinished uploads one session may hold at once (each costs its path besides its bytes).
pub const MAX_UNFINISHED: usize = 64;

/// Bytes staged in all sessions now.
static STAGED: AtomicUsize = AtomicUsize::new(0);

/// One session's unfinished uploads, by number.
#[derive(Default)]
pub struct Staging {
    uploads: Mutex<Uploads>,
}

#[derive(Default)]
struct Uploads {
    /// The number the next upload gets (from 1).
    last: u64,
    unfinished: HashMap<u64, Unfinished>,
}

/// An upload some of whose pieces have come.
struct Unfinished {
    path: String,
    bytes: Vec<u8>,
    /// Staged for a tool call's argument (`argument: true`), not for a file: the `tools/call`
    /// that names it takes it, and no piece of it writes anything.
    argument: bool,
}

impl Uploads {
    fn staged(&self) -> usize {
        self.unfinished.values().map(|u| u.bytes.len()).sum()
    }
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

    /// Adds `piece` of the file at `raw` (or, with `argument`, of a tool call's argument) to
    /// upload `number` (a new upload when `None`): with `more`, keeps it and says how much the
    /// upload holds; without, hands the whole file over. Past either budget the upload is
    /// dropped (a file missing a piece cannot be finished) and the answer says why; so is one
    /// whose piece names another path, or ends an argument's upload.
    fn add(
        &self,
        raw: &str,
        (number, offset): (Option<u64>, Option<u64>),
        piece: &[u8],
        more: bool,
        argument: bool,
    ) -> Result<Staged, ToolOutput> {
        let mut uploads = self.uploads.lock();
        let number = match number {
            Some(n) => match uploads.unfinished.get(&n) {
                None => return Err(not_under_way(raw, n)),
                Some(u) if offset.is_some_and(|o| o != u.bytes.len() as u64) => {
                    let had = u.bytes.len();
                    Self::release(uploads.unfinished.remove(&n).map_or(0, |u| u.bytes.len()));
                    return Err(ToolOutput::error(
                        ErrorCode::InvalidArgument,
                        format!(
                            "Error: this piece of upload #{n} begins at byte {}, but {had} bytes came before it (a piece was lost); it was dropped",
                            offset.unwrap_or_default()
                        ),
                    ));
                }
                Some(u) if u.path != raw || (u.argument && !more) => {
                    let why = match u.path != raw {
                        true => format!("upload #{n} is of another path, not '{raw}'"),
                        false => format!("upload #{n} is a tool call's argument: the tools/call naming it in `staged_arguments` takes it, no piece ends it"),
                    };
                    let other = uploads.unfinished.remove(&n).map_or(0, |u| u.bytes.len());
                    Self::release(other);
                    return Err(ToolOutput::error(ErrorCode::InvalidArgument, format!("Error: {why}; it was dropped")));
                }
                Some(_) => n,
            },
            // A file in one piece is never staged.
            None if !more => return Ok(Staged::Whole(piece.to_vec())),
            None if uploads.unfinished.len() >= MAX_UNFINISHED => {
                return Err(ToolOutput::error(
                    ErrorCode::TooLarge,
                    format!("Error: this connection has {MAX_UNFINISHED} unfinished uploads, the most it may hold; '{raw}' was not started"),
                ))
            }
            None => {
                uploads.last += 1;
                let n = uploads.last;
                uploads.unfinished.insert(n, Unfinished { path: raw.to_string(), bytes: Vec::new(), argument });
                n
            }
        };
        let refusal = if uploads.staged() + piece.len() > MAX_FILE_BYTES {
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
            Self::release(uploads.unfinished.remove(&number).map_or(0, |u| u.bytes.len()));
            return Err(refusal);
        }
        let upload = uploads.unfinished.get_mut(&number).expect("looked up above");
        upload.bytes.extend_from_slice(piece);
        if more {
            return Ok(Staged::More { number, staged: upload.bytes.len() });
        }
        let data = uploads.unfinished.remove(&number).map(|u| u.bytes).unwrap_or_default();
        Self::release(data.len());
        Ok(Staged::Whole(data))
    }
}

/// The longest argument a call may take from the staging: the tools' limit on a text they
/// take whole (a longer file could not be read back or edited either).
pub const MAX_ARGUMENT_BYTES: usize = common::MAX_TEXT_BYTES as usize;

/// Bytes of a staged argument a call holds: they stay counted in the daemon's staging budget
/// until the call is over (dropped), so that staging again while calls hold their arguments
/// cannot take the daemon past the budget.
pub struct HeldArgument(usize);

impl Drop for HeldArgument {
    fn drop(&mut self) {
        Staging::release(self.0);
    }
}

impl Staging {
    /// The text staged as upload `number` for a tool call's argument, taken out of the
    /// session (its bytes still counted while the call holds them); why not, for the
    /// caller's `-32602`.
    pub fn take_argument(&self, number: u64) -> Result<(String, HeldArgument), String> {
        let mut uploads = self.uploads.lock();
        match uploads.unfinished.get(&number) {
            Some(u) if u.argument && u.bytes.len() <= MAX_ARGUMENT_BYTES => {}
            Some(u) if u.argument => {
                let size = u.bytes.len();
                Self::release(uploads.unfinished.remove(&number).map_or(0, |u| u.bytes.len()));
                return Err(format!(
                    "upload #{number} holds {size} bytes, over the {MAX_ARGUMENT_BYTES} an argument may have"
                ));
            }
            Some(_) => return Err(format!("upload #{number} is a file's, not an argument's (`argument: true`)")),
            None => {
                return Err(format!(
                    "upload #{number} is not under way on this connection (a piece of it was refused, or it was used)"
                ))
            }
        }
        let bytes = uploads.unfinished.remove(&number).map(|u| u.bytes).unwrap_or_default();
        let held = HeldArgument(bytes.len());
        let text = String::from_utf8(bytes).map_err(|e| {
            format!("upload #{number} is not UTF-8 text (at byte {})", e.utf8_error().valid_up_to())
        })?;
        Ok((text, held))
    }
}

/// `tools/call`'s `staged_arguments` (`{name: upload number}`): arguments too long for one
/// request line, staged beforehand with `vfs/upload` (`argument: true`), taken out of the
/// session into `arguments`. The call holds what this returns until it is over.
pub fn take_staged_arguments(
    staging: &Staging,
    params: &Map<String, Value>,
    arguments: &mut Map<String, Value>,
) -> Result<Vec<HeldArgument>, RpcError> {
    let staged = match params.get("staged_arguments") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(staged)) => staged,
        Some(other) => {
            return Err(RpcError::invalid_params(format!(
                "`staged_arguments` must be an object of upload numbers, got {other}"
            )))
        }
    };
    let mut holding = Vec::new();
    for (key, number) in staged {
        let Some(number) = number.as_u64() else {
            return Err(RpcError::invalid_params(format!(
                "`staged_arguments.{key}` must be an upload's number, got {number}"
            )));
        };
        if arguments.contains_key(key) {
            return Err(RpcError::invalid_params(format!(
                "`{key}` is given both in `arguments` and in `staged_arguments`"
            )));
        }
        let (text, held) = staging.take_argument(number).map_err(RpcError::invalid_params)?;
        arguments.insert(key.clone(), Value::String(text));
        holding.push(held);
    }
    Ok(holding)
}

/// What [`Staging::add`] did with a piece.
enum Staged {
    /// Kept: upload `number` holds `staged` bytes now.
    More { number: u64, staged: usize },
    /// The last piece: the whole file.
    Whole(Vec<u8>),
}

impl Staging {
    /// Ends upload `number`, if it is under way (one of its pieces was malformed).
    fn drop_upload(&self, number: u64) {
        let dropped = self.uploads.lock().unfinished.remove(&number);
        Self::release(dropped.map_or(0, |u| u.bytes.len()));
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        Self::release(self.uploads.get_mut().staged());
    }
}

/// `vfs/upload {path, content (base64), more?, upload?, offset?, argument?}` → `{path, size}`,
/// `{path, staged, upload}` for a piece kept, or `{path, error_code, message}` when it failed
/// (a failure is a result, not a protocol error, as for tools). A piece of an upload under way
/// that is malformed ends that upload too, as a refused one does: a later piece must never
/// follow a gap.
pub fn upload(env: &ToolEnv, staging: &Staging, params: &Map<String, Value>) -> Result<Value, RpcError> {
    let number = match params.get("upload") {
        None | Some(Value::Null) => None,
        Some(n) => Some(n.as_u64().filter(|&n| n > 0).ok_or_else(|| {
            RpcError::invalid_params(format!("`upload` must be the number a first piece was given, got {n}"))
        })?),
    };
    let answer = upload_piece(env, staging, params, number);
    if let (Err(_), Some(n)) = (&answer, number) {
        staging.drop_upload(n);
    }
    answer
}

fn upload_piece(
    env: &ToolEnv,
    staging: &Staging,
    params: &Map<String, Value>,
    number: Option<u64>,
) -> Result<Value, RpcError> {
    let raw = string(params, "path")?;
    let piece = decode_base64(string(params, "content")?)
        .ok_or_else(|| RpcError::invalid_params("`content` must be base64 (RFC 4648, with padding)"))?;
    let flag = |name: &str| match params.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(RpcError::invalid_params(format!("`{name}` must be a boolean, got {other}"))),
    };
    let (more, argument) = (flag("more")?, flag("argument")?);
    if argument && !more {
        return Err(RpcError::invalid_params(
            "an argument is staged with `more: true` on every piece; the tools/call naming it in `staged_arguments` takes it",
        ));
    }
    // Where a later piece begins: a piece lost on the way (a line too long to read names no
    // upload) shows as a gap, and the upload is refused rather than written without it.
    let offset = match (number, params.get("offset")) {
        (None, None | Some(Value::Null)) => None,
        (Some(n), None | Some(Value::Null)) => {
            return Err(RpcError::invalid_params(format!(
                "a piece of upload #{n} gives its `offset`, the bytes sent before it"
            )))
        }
        (_, Some(o)) => Some(o.as_u64().ok_or_else(|| {
            RpcError::invalid_params(format!("`offset` must be a count of bytes, got {o}"))
        })?),
    };
    // The first of many pieces: a path that will be refused is refused now, not at the end.
    // (An argument's is the tool call's to judge.)
    if number.is_none() && more && !argument {
        if let Err(refusal) = admit(env, raw) {
            return Ok(failure(raw, &refusal));
        }
    }
    let data = match staging.add(raw, (number, offset), &piece, more, argument) {
        Ok(Staged::More { number, staged }) => {
            return Ok(json!({"path": raw, "staged": staged, "upload": number}))
        }
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

/// Whether the file at `raw` may be uploaded at all: a valid path, not a route's root, and a
/// write the rules allow without asking anyone (transfers never ask).
fn admit(env: &ToolEnv, raw: &str) -> Result<ToolPath, ToolOutput> {
    let named = common::validate(raw)?;
    common::refuse_route_root(env, &named.path, "overwritten")?;
    common::precheck(env, Op::Write, &named.path, false)?;
    let verdict = env.fs.decide(Op::Write, &named.path, false);
    if verdict.mode == Mode::Interrupt {
        env.fs.audit_refusal(Op::Write, &named.path, verdict);
        return Err(common::permission_denied(Op::Write, &named.path));
    }
    Ok(named)
}

fn write(env: &ToolEnv, raw: &str, data: &[u8]) -> Result<String, ToolOutput> {
    let named = admit(env, raw)?;
    let path = &named.path;
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
    env.fs.make_durable().map_err(|e| {
        ToolOutput::error(ErrorCode::Io, format!("Error: the change could not be stored: {e}"))
    })?;
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
    let version = loc.attr.as_ref().map(Version::of);
    let data = env.fs.read(&loc.real, MAX_FILE_BYTES as u64).map_err(|e| {
        if e.is(Errno::EFBIG) {
            // Grown past the limit since it was looked at.
            return too_large(raw);
        }
        common::fs_failure(Op::Read, path, &e, || {
            format!("Error: Error reading file '{path}': {}", common::py_os_error(&e, path))
        })
    })?;
    // The client has the whole file: it may edit or overwrite it as after a `read_file` (a
    // change since the look makes the version differ, and such a write is refused).
    if let Some(version) = version {
        env.session.observe(&loc.real, version);
    }
    Ok(data)
}

fn not_under_way(raw: &str, number: u64) -> ToolOutput {
    ToolOutput::error(
        ErrorCode::InvalidArgument,
        format!("Error: upload #{number} of '{raw}' is not under way on this connection (a piece of it was refused, or it was finished); send the file again from its first piece"),
    )
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

    /// Held by the tests that fill the daemon-wide budget (one per process), so that one's
    /// staging never refuses the other's.
    static DAEMON_BUDGET: Mutex<()> = Mutex::new(());

    #[test]
    fn a_piece_past_the_limit_ends_its_upload_and_no_later_piece_starts_another() {
        let _alone = DAEMON_BUDGET.lock();
        let staging = Staging::default();
        let piece = vec![7u8; 16 << 20];
        let Ok(Staged::More { number, .. }) = staging.add("/big", (None, None), &piece, true, false) else {
            panic!()
        };
        for _ in 1..MAX_FILE_BYTES / piece.len() {
            assert!(matches!(
                staging.add("/big", (Some(number), None), &piece, true, false),
                Ok(Staged::More { .. })
            ));
        }
        let refused = staging.add("/big", (Some(number), None), &piece, true, false).err().unwrap();
        assert_eq!(refused.structured.get("error_code"), Some(&json!("FS_TOO_LARGE")));
        assert_eq!(staging.uploads.lock().staged(), 0, "its pieces are dropped");
        for more in [true, false] {
            let later = staging.add("/big", (Some(number), None), b"tail", more, false).err().unwrap();
            assert_eq!(later.structured.get("error_code"), Some(&json!("FS_INVALID_ARGUMENT")));
        }
    }

    #[test]
    fn a_taken_argument_counts_until_its_call_is_over_and_has_a_limit() {
        let _alone = DAEMON_BUDGET.lock();
        let staging = Staging::default();
        let before = STAGED.load(Ordering::Acquire);
        let Ok(Staged::More { number, .. }) = staging.add("/a", (None, None), b"text", true, true) else {
            panic!()
        };
        let (text, held) = staging.take_argument(number).unwrap();
        assert_eq!((text.as_str(), STAGED.load(Ordering::Acquire) - before), ("text", 4));
        drop(held);
        assert_eq!(STAGED.load(Ordering::Acquire), before, "given back when the call is over");
        let long = vec![b'x'; MAX_ARGUMENT_BYTES + 1];
        let Ok(Staged::More { number, .. }) = staging.add("/a", (None, None), &long, true, true) else {
            panic!()
        };
        let refused = staging.take_argument(number).err().unwrap();
        assert_eq!(
            refused,
            format!(
                "upload #{number} holds {} bytes, over the {MAX_ARGUMENT_BYTES} an argument may have",
                MAX_ARGUMENT_BYTES + 1
            )
        );
        assert_eq!(STAGED.load(Ordering::Acquire), before);
    }

    #[test]
    fn a_session_holds_a_bounded_number_of_uploads() {
        let staging = Staging::default();
        for i in 0..MAX_UNFINISHED {
            assert!(matches!(
                staging.add(&format!("/f{i}"), (None, None), b"", true, false),
                Ok(Staged::More { .. })
            ));
        }
        let refused = staging.add("/one-more", (None, None), b"", true, false).err().unwrap();
        assert_eq!(refused.structured.get("error_code"), Some(&json!("FS_TOO_LARGE")));
        assert!(
            matches!(staging.add("/whole", (None, None), b"x", false, false), Ok(Staged::Whole(_))),
            "one piece is never staged"
        );
    }

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
        let _alone = DAEMON_BUDGET.lock();
        let mib = |n: usize| vec![0u8; n << 20];
        let one = Staging::default();
        let Ok(Staged::More { number: a, staged }) = one.add("/a", (None, None), &mib(100), true, false)
        else {
            panic!()
        };
        assert_eq!(staged, 100 << 20);
        assert!(matches!(one.add("/b", (None, None), &mib(100), true, false), Ok(Staged::More { .. })));
        let refused = one.add("/c", (None, None), &mib(100), true, false).err().unwrap();
        assert!(
            refused.joined_text().contains("with the other unfinished uploads"),
            "{}",
            refused.joined_text()
        );
        assert!(
            matches!(one.add("/a", (Some(a), None), &mib(1), false, false), Ok(Staged::Whole(data)) if data.len() == 101 << 20)
        );
        drop(one);
        let many: Vec<Staging> = (0..4).map(|_| Staging::default()).collect();
        for s in &many {
            assert!(matches!(s.add("/x", (None, None), &mib(250), true, false), Ok(Staged::More { .. })));
        }
        let fifth = Staging::default();
        let refused = fifth.add("/x", (None, None), &mib(100), true, false).err().unwrap();
        assert!(refused.joined_text().contains("bytes of unfinished uploads"), "{}", refused.joined_text());
        drop(many);
        assert!(
            matches!(fifth.add("/x", (None, None), &mib(100), true, false), Ok(Staged::More { .. })),
            "given back when sessions end"
        );
    }
}
