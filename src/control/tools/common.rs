//! What the file tools share: the path pipeline (validation, gate pre-check, symlink
//! resolution), Deep Agents' message texts, and the bits of Python behaviour those texts
//! depend on (`repr` of path lists, `str.splitlines`, codec error wording).

use crate::backend::{Attr, FileKind};
use crate::control::session::{Observation, Version};
use crate::control::vfs::{validate_path, ToolPath};
use crate::error::{Errno, FsError};
use crate::policy::{Mode, Op};
use crate::vpath::VPath;

use super::{ErrorCode, ToolEnv, ToolOutput};

/// Deep Agents' size cap at the tool boundary: 20,000 tokens × 4 characters (code points).
pub const MAX_CHARS: usize = 80_000;

/// The element appended to a list that was cut to fit [`MAX_CHARS`].
pub const TRUNCATION_GUIDANCE: &str = "... [results truncated, try being more specific with your parameters]";

// ---------------------------------------------------------------------------------------------
// Python behaviour the texts depend on.

/// Python's `len()` of a string: code points, not bytes.
pub fn char_len(s: &str) -> usize {
    s.chars().count()
}

/// `str.isspace()`: Unicode White_Space plus the four ASCII separators Python also counts.
pub fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\x1c'..='\x1f').contains(&c)
}

/// `not s or s.strip() == ""`: Deep Agents' test for an empty file.
pub fn is_blank(s: &str) -> bool {
    s.chars().all(py_isspace)
}

/// `str.splitlines(keepends=True)`: besides `\n`, `\r` and `\r\n`, Python ends lines at
/// `\v`, `\f`, `\x1c`–`\x1e`, `\x85`, U+2028 and U+2029 (deviation 10 keeps this quirk so
/// line numbers agree with Deep Agents).
pub fn splitlines_keepends(s: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut start = 0;
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let end = match c {
            '\r' => match chars.peek() {
                Some(&(j, '\n')) => {
                    chars.next();
                    j + 1
                }
                _ => i + 1,
            },
            '\n' | '\x0b' | '\x0c' | '\x1c' | '\x1d' | '\x1e' | '\u{85}' | '\u{2028}' | '\u{2029}' => {
                i + c.len_utf8()
            }
            _ => continue,
        };
        lines.push(&s[start..end]);
        start = end;
    }
    if start < s.len() {
        lines.push(&s[start..]);
    }
    lines
}

/// Python's universal-newline translation (`\r\n` and lone `\r` become `\n`), which Deep
/// Agents applies to read windows and to everything `edit_file` matches.
pub fn to_lf(s: &str) -> String {
    if s.contains('\r') {
        s.replace("\r\n", "\n").replace('\r', "\n")
    } else {
        s.to_string()
    }
}

/// Whether `str.isprintable()` would hold. Python escapes the rest in `repr`. Exact for the
/// control, separator and format characters that occur in practice; unassigned code points
/// (which Python also escapes) would need the Unicode tables and are printed as they are.
fn py_printable(c: char) -> bool {
    let u = c as u32;
    !matches!(u,
        0x00..=0x1f | 0x7f..=0xa0 | 0xad
        | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x890..=0x891 | 0x8e2 | 0x1680 | 0x180e
        | 0x2000..=0x200f | 0x2028..=0x202f | 0x205f..=0x2064 | 0x2066..=0x206f | 0x3000
        | 0xd800..=0xf8ff | 0xfdd0..=0xfdef | 0xfeff | 0xfff9..=0xfffb | 0xfffe..=0xffff
        | 0x110bd | 0x110cd | 0x13430..=0x1343f | 0x1bca0..=0x1bca3 | 0x1d173..=0x1d17a
        | 0xe0001 | 0xe0020..=0xe007f | 0xf0000..)
        && (u & 0xfffe) != 0xfffe
}

/// Python's `repr()` of a string.
pub fn py_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !py_printable(c) => {
                let u = c as u32;
                let escaped = match u {
                    0..=0xff => format!("\\x{u:02x}"),
                    0x100..=0xffff => format!("\\u{u:04x}"),
                    _ => format!("\\U{u:08x}"),
                };
                out.push_str(&escaped);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// `str(list_of_str)`.
pub fn py_list_repr(items: &[String]) -> String {
    let parts: Vec<String> = items.iter().map(|s| py_repr(s)).collect();
    format!("[{}]", parts.join(", "))
}

/// Deep Agents' `truncate_if_too_long` for a list: keeps the longest prefix whose repr
/// (each item plus `", "`) fits the budget, then appends [`TRUNCATION_GUIDANCE`]. Returns the
/// number of items kept when something was cut.
pub fn truncate_list(items: &mut Vec<String>) -> Option<usize> {
    let budget = MAX_CHARS - char_len(&py_repr(TRUNCATION_GUIDANCE)) - 2;
    let mut used = 0;
    for (kept, item) in items.iter().enumerate() {
        used += char_len(&py_repr(item)) + 2;
        if used > budget {
            items.truncate(kept);
            items.push(TRUNCATION_GUIDANCE.to_string());
            return Some(kept);
        }
    }
    None
}

/// How `ls` (and `glob`) render a list of paths: `No files found`, or the (capped) repr.
/// Also returns how many paths were shown when the list was cut.
pub fn format_file_paths(mut paths: Vec<String>) -> (String, Option<usize>) {
    if paths.is_empty() {
        return ("No files found".to_string(), None);
    }
    let kept = truncate_list(&mut paths);
    (py_list_repr(&paths), kept)
}

/// The message of Python's `UnicodeDecodeError` for bytes that are not UTF-8, as a text-mode
/// `open(..., encoding="utf-8").read()` reports it.
pub fn py_utf8_error(bytes: &[u8], err: std::str::Utf8Error) -> String {
    let pos = err.valid_up_to();
    let (first, last, reason) = match err.error_len() {
        Some(len) => {
            let invalid_start = matches!(bytes[pos], 0x80..=0xc1 | 0xf5..=0xff);
            let reason = if invalid_start { "invalid start byte" } else { "invalid continuation byte" };
            (pos, pos + len - 1, reason)
        }
        None => (pos, bytes.len() - 1, "unexpected end of data"),
    };
    if first == last {
        format!("'utf-8' codec can't decode byte 0x{:02x} in position {first}: {reason}", bytes[first])
    } else {
        format!("'utf-8' codec can't decode bytes in position {first}-{last}: {reason}")
    }
}

/// Python's `str(OSError)` for an error on `path`: `[Errno 21] Is a directory: '/a/b'`. The
/// virtual path stands where Deep Agents would show the host path (which it leaks).
pub fn py_os_error(err: &FsError, path: &VPath) -> String {
    format!("[Errno {}] {}: {}", err.errno as i32, err.errno.desc(), py_repr(path.as_str()))
}

/// ISO-8601 UTC time as Python's `datetime.isoformat()` writes it (microseconds only when
/// non-zero).
pub fn iso8601(t: std::time::SystemTime) -> String {
    let since = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    let micros = since.subsec_micros();
    let frac = if micros == 0 { String::new() } else { format!(".{micros:06}") };
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}{frac}+00:00")
}

/// Standard base64 with padding (for image blocks); no crate in the tree provides one.
pub fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Error texts (doc/tools.md) and their codes.

pub fn permission_denied(op: Op, path: &VPath) -> ToolOutput {
    ToolOutput::error(
        ErrorCode::PermissionDenied,
        format!("Error: permission denied for {} on {path}", op.as_str()),
    )
}

pub fn permission_denied_resolved(op: Op, path: &VPath, target: &VPath) -> ToolOutput {
    ToolOutput::error(
        ErrorCode::PermissionDenied,
        format!("Error: permission denied for {} on {path} (resolves to {target})", op.as_str()),
    )
}

/// `/` and route mount points (and the directories leading to them) hold whole backends:
/// the tools never delete or overwrite them (deviation 6).
pub fn refuse_route_root(env: &ToolEnv, path: &VPath, what: &str) -> Result<(), ToolOutput> {
    if path.is_root() || env.fs.engine.is_mount_point(path) {
        return Err(ToolOutput::error(
            ErrorCode::PermissionDenied,
            format!("Error: permission denied for write on {path} (the root and route mount points cannot be {what})"),
        ));
    }
    Ok(())
}

/// An engine error met while a tool acted on `path`: refusals by the gate read like the
/// pre-check's; everything else gets the tool's own wording from `text`.
pub fn fs_failure(op: Op, path: &VPath, err: &FsError, text: impl FnOnce() -> String) -> ToolOutput {
    if err.denied_by.is_some() && !err.is(Errno::ENOENT) {
        return permission_denied(op, path);
    }
    ToolOutput::error(ErrorCode::from_errno(err.errno), text())
}

// ---------------------------------------------------------------------------------------------
// The path pipeline (doc/tools.md).

/// Step 1: Deep Agents' path validation (which also says whether the path was written as a
/// directory, with a trailing `/`).
pub fn validate(raw: &str) -> Result<ToolPath, ToolOutput> {
    validate_path(raw).map_err(|msg| ToolOutput::error(ErrorCode::InvalidPath, format!("Error: {msg}")))
}

/// Step 2: the gate's verdict on the path as given. Interrupt verdicts pass: tools never
/// pause themselves (doc/tools.md); approval happens around the call, and the engine still
/// refuses an unapproved operation.
pub fn precheck(env: &ToolEnv, op: Op, path: &VPath, as_dir: bool) -> Result<(), ToolOutput> {
    let verdict = env.fs.decide(op, path, as_dir);
    match verdict.mode {
        Mode::Deny => {
            env.fs.audit_refusal(op, path, verdict);
            Err(permission_denied(op, path))
        }
        Mode::Allow | Mode::Interrupt => Ok(()),
    }
}

/// Where a tool's path leads once symlinks are followed.
#[derive(Clone, Debug)]
pub struct Located {
    /// The validated path the caller named (used in every message).
    pub path: VPath,
    /// The path after symlinks; equal to `path` when none was involved.
    pub real: VPath,
    /// The node at `real`, or `None` when it (or an ancestor) does not exist.
    pub attr: Option<Attr>,
}

impl Located {
    pub fn kind(&self) -> Option<FileKind> {
        self.attr.as_ref().map(|a| a.kind)
    }

    pub fn is_dir(&self) -> bool {
        self.kind() == Some(FileKind::Dir)
    }
}

/// Step 3: follows symlinks inside the virtual tree. A missing node (or a missing or
/// non-directory ancestor) is not an error here: each tool words "not found" its own way.
/// With `for_create`, a missing node's parent is resolved instead, so a new file lands
/// where an existing symlinked ancestor points.
pub fn locate(
    env: &ToolEnv,
    op: Op,
    path: &VPath,
    follow_last: bool,
    for_create: bool,
) -> Result<Located, ToolOutput> {
    match env.fs.resolve(path, follow_last) {
        Ok(r) => Ok(Located { path: path.clone(), real: r.path, attr: r.attr }),
        // The gate refused a step of the walk. Through a symlink, that is the target being
        // refused (say where the link leads, as Deep Agents does); otherwise an ancestor is
        // hidden, and the path does not exist as far as this caller can tell.
        Err(e) if e.denied_by.is_some() => match link_target(env, path) {
            Some(target) if target != *path => Err(permission_denied_resolved(op, path, &target)),
            _ if e.is(Errno::ENOENT) => Ok(Located { path: path.clone(), real: path.clone(), attr: None }),
            _ => Err(permission_denied(op, path)),
        },
        Err(e) if e.is(Errno::ENOENT) || e.is(Errno::ENOTDIR) => {
            if for_create && !path.parent().is_root() {
                let parent = locate(env, op, &path.parent(), true, true)?;
                let real = parent.real.join(path.name());
                return Ok(Located { path: path.clone(), real, attr: None });
            }
            Ok(Located { path: path.clone(), real: path.clone(), attr: None })
        }
        // The peer may not search a directory on the way (its mode bits).
        Err(e) if e.is(Errno::EACCES) => Err(permission_denied(op, path)),
        // A path that leads nowhere (a loop, out of the tree) cannot be resolved; any other
        // failure on the way (a store that cannot be reached) says what the system said.
        Err(e) => Err(match e.errno {
            Errno::EXDEV | Errno::ELOOP | Errno::EINVAL => {
                ToolOutput::error(ErrorCode::InvalidPath, format!("Error: cannot resolve {path}"))
            }
            other => {
                ToolOutput::error(ErrorCode::from_errno(other), format!("Error: {}", py_os_error(&e, path)))
            }
        }),
    }
}

/// Where `path` leads when the gate will not let the walk reach it: the path up to its last
/// reachable symlink, with that link's text in place. `None` when no symlink is involved.
fn link_target(env: &ToolEnv, path: &VPath) -> Option<VPath> {
    match env.fs.resolve(path, false) {
        Ok(r) if r.attr.as_ref().is_some_and(|a| a.kind == FileKind::Symlink) => {
            let text = env.fs.engine.readlink(&env.fs.ctx, &r.path).ok()?;
            let text = String::from_utf8(text).ok()?;
            let joined = if text.starts_with('/') { text } else { format!("{}/{text}", r.path.parent()) };
            VPath::parse(&joined).ok()
        }
        Ok(r) => Some(r.path),
        Err(_) if path.is_root() => None,
        Err(_) => Some(link_target(env, &path.parent())?.join(path.name())),
    }
}

/// The attributes of the regular file at `loc`. Deep Agents reports anything else as not
/// found (a directory keeps that text but gets `FS_IS_DIRECTORY`).
/// The largest text file `read_file` reads, and `edit_file` edits, whole (both need every
/// line: `read_file` counts them). A larger one is refused with [`too_large_to_take_whole`]:
/// reading it would hold the daemon's memory (a sparse file of 100 GB takes no disk).
pub const MAX_TEXT_BYTES: u64 = 32 << 20;

/// The refusal of a text file over [`MAX_TEXT_BYTES`] (`what`: "read" or "edit"; `size`, when
/// known: a file that grew past the limit while it was read is not read to its end).
pub fn too_large_to_take_whole(what: &str, path: &VPath, size: Option<u64>) -> ToolOutput {
    let size = size.map_or_else(|| "over the limit".to_string(), |s| format!("{s} bytes"));
    ToolOutput::error(
        ErrorCode::TooLarge,
        format!(
            "Error: File '{path}' is too large to {what} whole ({size}; the limit is {MAX_TEXT_BYTES} bytes). \
             Take part of it from a shell (head, tail, sed -n '100,200p', grep -n PATTERN FILE): the grep tool skips files over {} MiB",
            super::grep::MAX_FILE_BYTES >> 20
        ),
    )
}

pub fn regular_file(loc: &Located) -> Result<Attr, ToolOutput> {
    match &loc.attr {
        Some(a) if a.kind == FileKind::File => Ok(a.clone()),
        other => {
            let code = if other.as_ref().is_some_and(|a| a.kind == FileKind::Dir) {
                ErrorCode::IsDirectory
            } else {
                ErrorCode::NotFound
            };
            Err(ToolOutput::error(code, format!("Error: File '{}' not found", loc.path)))
        }
    }
}

/// Step 3b: a path that leads elsewhere is judged on its target too (deviation 7).
pub fn check_target(env: &ToolEnv, op: Op, loc: &Located, as_dir: bool) -> Result<(), ToolOutput> {
    if loc.real != loc.path {
        let verdict = env.fs.decide(op, &loc.real, as_dir || loc.is_dir());
        if verdict.mode == Mode::Deny {
            env.fs.audit_refusal(op, &loc.real, verdict);
            return Err(permission_denied_resolved(op, &loc.path, &loc.real));
        }
    }
    Ok(())
}

/// Step 3c: a path written as a directory (`f.txt/`) must lead to one, as in a syscall: an
/// existing non-directory there (a symlink too, where the last component is not followed) is
/// ENOTDIR, not the file the path names without the slash. A missing node is left to the
/// tool. `text` words the error as the tool words its OS errors ([`written_as_dir`]).
pub fn require_dir(
    named: &ToolPath,
    loc: &Located,
    text: impl FnOnce(&str, &str) -> String,
) -> Result<(), ToolOutput> {
    match loc.kind() {
        Some(kind) if named.must_be_dir && kind != FileKind::Dir => {
            Err(written_as_dir(Errno::ENOTDIR, &loc.path, text))
        }
        _ => Ok(()),
    }
}

/// The error `errno` on `path` written as a directory: `text` gets the path as written
/// (`/a/f.txt/`) and Python's `str(OSError)` for it (`[Errno 20] Not a directory: '/a/f.txt/'`).
pub fn written_as_dir(errno: Errno, path: &VPath, text: impl FnOnce(&str, &str) -> String) -> ToolOutput {
    let written = format!("{path}/");
    let os_error = format!("[Errno {}] {}: {}", errno as i32, errno.desc(), py_repr(&written));
    ToolOutput::error(ErrorCode::from_errno(errno), text(&written, &os_error))
}

/// Steps 2–3 for the tools that judge one operation on one path (validated by the caller).
pub fn prepare(
    env: &ToolEnv,
    named: &ToolPath,
    op: Op,
    as_dir: bool,
    for_create: bool,
) -> Result<Located, ToolOutput> {
    let path = &named.path;
    precheck(env, op, path, as_dir)?;
    let loc = locate(env, op, path, true, for_create)?;
    check_target(env, op, &loc, as_dir)?;
    Ok(loc)
}

// ---------------------------------------------------------------------------------------------
// Read-before-write (deviation 4).

/// Refuses a mutation of the existing file at `loc` when this session read another version
/// of it, or (with `require_read`) never read it. `observation = "off"` skips both. The
/// version compared is the store's at this moment, not what a cache of this daemon holds (on
/// a store shared by several daemons, another one may have changed the file just now).
pub fn check_observed(
    env: &ToolEnv,
    loc: &Located,
    attr: &Attr,
    require_read: bool,
) -> Result<(), ToolOutput> {
    if env.session.observation == Observation::Off {
        return Ok(());
    }
    match env.session.observed(&loc.real) {
        None if require_read => Err(ToolOutput::error(
            ErrorCode::NotObserved,
            format!("Error: edit requires reading '{}' first", loc.path),
        )),
        Some(seen)
            if seen != Version::of(&env.fs.stat_stored(&loc.real).unwrap_or_else(|_| attr.clone())) =>
        {
            Err(ToolOutput::error(
                ErrorCode::StaleVersion,
                format!("Error: '{}' changed since it was read; re-read the file, then retry", loc.path),
            ))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitlines_matches_python() {
        assert_eq!(
            splitlines_keepends("a\x0cb\nc\u{2028}d\ne\n"),
            ["a\x0c", "b\n", "c\u{2028}", "d\n", "e\n"]
        );
        assert_eq!(splitlines_keepends("a\r\nb\rc"), ["a\r\n", "b\r", "c"]);
        assert!(splitlines_keepends("").is_empty());
    }

    #[test]
    fn repr_matches_python() {
        assert_eq!(py_repr("/a.txt"), "'/a.txt'");
        assert_eq!(py_repr("it's"), "\"it's\"");
        assert_eq!(py_repr("'\""), "'\\'\"'");
        assert_eq!(py_repr("a\nb\\\u{7}\u{e9}\u{2028}\u{1f600}"), "'a\\nb\\\\\\x07\u{e9}\\u2028\u{1f600}'");
        assert_eq!(py_list_repr(&["/a".into(), "/b/".into()]), "['/a', '/b/']");
    }

    #[test]
    fn codec_errors_match_python() {
        let msg = |b: &[u8]| py_utf8_error(b, std::str::from_utf8(b).unwrap_err());
        assert_eq!(msg(b"\xff"), "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte");
        assert_eq!(
            msg(b"ab\xe2\x28"),
            "'utf-8' codec can't decode byte 0xe2 in position 2: invalid continuation byte"
        );
        assert_eq!(
            msg(b"\xe2\x82\x28"),
            "'utf-8' codec can't decode bytes in position 0-1: invalid continuation byte"
        );
        assert_eq!(
            msg(b"abc\xe2\x82"),
            "'utf-8' codec can't decode bytes in position 3-4: unexpected end of data"
        );
    }

    #[test]
    fn base64_and_time() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_micros(951_782_400_000_001);
        assert_eq!(iso8601(t), "2000-02-29T00:00:00.000001+00:00");
    }
}
