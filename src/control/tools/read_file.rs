//! `read_file`: a window of a text file under an `@@ lines A-B of T | next offset N @@`
//! header (Deep Agents 0.7.32 format, doc/tools.md), or an image/media file as base64.
//! A successful read records the file's version in the session (read-before-write).

use serde_json::{json, Value};

use super::common::{self, char_len, is_blank, splitlines_keepends, to_lf, MAX_CHARS};
use super::{args, Asks, Block, ErrorCode, Listed, ToolEnv, ToolOutput, ToolSpec};
use crate::control::session::Version;
use crate::policy::Op;

pub const SPEC: ToolSpec = ToolSpec {
    name: "read_file",
    description,
    input_schema,
    read_only: true,
    destructive: false,
    asks: Asks::exact(Op::Read),
    call,
};

const DEFAULT_LIMIT: i64 = 100;

/// Binary files are returned whole, base64-encoded; past this size they are refused rather
/// than ballooning one reply (Deep Agents has no cap; a JSON-RPC line must stay bounded).
const MAX_BINARY_BYTES: u64 = 20 * 1024 * 1024;

pub const EMPTY_CONTENT_WARNING: &str = "System reminder: File exists but has empty contents";

fn description(listed: &Listed) -> String {
    let mut text = String::from(
        "Reads a file from the filesystem. Assume any path the user provides is valid; reading a missing file returns an error.\n\
         \n\
         Usage:\n\
         - By default, it reads up to 100 lines starting from the beginning of the file. Use `offset`/`limit` to page through large files instead of reading them whole.\n\
         - A status header, `@@ field | field | ... @@`, sits above the file content, and every line after it is verbatim file content. When content is truncated, there may be an explanation before the header. Never include the header when editing.\n\
         - Speculatively batch multiple `read_file` calls in one response when several files may be useful.\n\
         - An empty file returns a system-reminder warning in place of contents.\n",
    );
    if listed.execute {
        text.push_str(
            "- Large tool results may be offloaded to a file; the tool message gives the path. Read that path here, paging with `offset`/`limit`.\n",
        );
    }
    text.push_str(
        "- Images (`.png`, `.jpg`, etc.), audio, video, and PDFs return base64 content blocks.\n\
         - For images and PDFs, pagination via `offset`/`limit` is text-only - supply `file_path` only\n\
         - Always read a file before editing it: edits of a file you have not read, or that changed since you read it, are refused.",
    );
    text
}

fn input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "file_path": {
                "type": "string",
                "description": "Absolute path to the file to read. Must be absolute, not relative."
            },
            "offset": {
                "type": "integer",
                "default": 0,
                "description": "Line number to start reading from (0-indexed). Use for pagination of large files."
            },
            "limit": {
                "type": "integer",
                "default": DEFAULT_LIMIT,
                "description": "Maximum number of lines to read. Use for pagination of large files."
            }
        },
        "required": ["file_path"]
    })
}

/// The MIME type of a file Deep Agents returns as a media block rather than text (its
/// extension table, UTL:198-228, plus `.mkv`, which its backends also read as binary), with
/// the types Python's `mimetypes` gives them.
pub fn media_type(path: &str) -> Option<&'static str> {
    let name = path.rsplit('/').next().unwrap_or(path);
    // `PurePosixPath.suffix`: the last dot, not leading, not trailing.
    let suffix = match name.rfind('.') {
        Some(i) if i > 0 && i + 1 < name.len() => name[i..].to_ascii_lowercase(),
        _ => return None,
    };
    Some(match suffix.as_str() {
        ".png" => "image/png",
        ".jpeg" | ".jpg" => "image/jpeg",
        ".webp" => "image/webp",
        ".gif" => "image/gif",
        ".heic" => "image/heic",
        ".heif" => "image/heif",
        ".mp4" => "video/mp4",
        ".mpeg" | ".mpg" => "video/mpeg",
        ".mov" => "video/quicktime",
        ".avi" => "video/x-msvideo",
        ".flv" => "video/x-flv",
        ".webm" => "video/webm",
        ".wmv" => "video/x-ms-wmv",
        ".mkv" => "video/x-matroska",
        ".3gpp" => "audio/3gpp",
        ".wav" => "audio/x-wav",
        ".mp3" => "audio/mpeg",
        ".aiff" => "audio/x-aiff",
        ".aac" => "audio/aac",
        ".ogg" => "audio/ogg",
        ".flac" => "audio/flac",
        ".pdf" => "application/pdf",
        ".ppt" => "application/vnd.ms-powerpoint",
        ".pptx" => "application/vnd.openxmlformats-officedocument.presentationml.presentation",
        _ => return None,
    })
}

fn call(env: &ToolEnv, arguments: &Value) -> ToolOutput {
    let parsed = args::string(arguments, "file_path").and_then(|p| {
        let offset = args::opt_int(arguments, "offset")?.unwrap_or(0);
        let limit = args::opt_int(arguments, "limit")?.unwrap_or(DEFAULT_LIMIT);
        Ok((p, offset, limit))
    });
    let (raw, offset, limit) = match parsed {
        Ok(v) => v,
        Err(e) => return e,
    };
    let loc = match common::validate(&raw).and_then(|named| {
        let loc = common::prepare(env, &named, Op::Read, false, false)?;
        common::require_dir(&named, &loc, |written, os_error| {
            format!("Error: Error reading file '{written}': {os_error}")
        })?;
        Ok(loc)
    }) {
        Ok(loc) => loc,
        Err(e) => return e,
    };
    let path = &loc.path;
    let attr = match common::regular_file(&loc) {
        Ok(attr) => attr,
        Err(e) => return e,
    };
    let media = media_type(path.as_str());
    if media.is_some() && attr.size > MAX_BINARY_BYTES {
        return ToolOutput::error(
            ErrorCode::TooLarge,
            format!(
                "Error: File '{path}' is too large to return ({} bytes; the limit is {MAX_BINARY_BYTES})",
                attr.size
            ),
        );
    }
    if media.is_none() && attr.size > common::MAX_TEXT_BYTES {
        return common::too_large_to_take_whole("read", path, Some(attr.size));
    }
    let max = if media.is_some() { MAX_BINARY_BYTES } else { common::MAX_TEXT_BYTES };
    let data = match env.fs.read(&loc.real, max) {
        Ok(d) => d,
        // Grown past the limit since it was looked at.
        Err(e) if e.is(crate::error::Errno::EFBIG) && media.is_none() => {
            return common::too_large_to_take_whole("read", path, None)
        }
        Err(e) => {
            return common::fs_failure(Op::Read, path, &e, || {
                format!("Error: Error reading file '{path}': {}", common::py_os_error(&e, path))
            })
        }
    };
    let (mut output, inspected) = if data.is_empty() {
        let output = ToolOutput::text(EMPTY_CONTENT_WARNING)
            .with("total_lines", json!(0))
            .with("truncated", json!(false));
        (output, true)
    } else if let Some(mime_type) = media {
        let output = ToolOutput {
            content: vec![Block::Media {
                data: common::base64(&data),
                mime_type: mime_type.to_string(),
                path: path.to_string(),
            }],
            is_error: false,
            structured: Default::default(),
        }
        .with("mime_type", json!(mime_type))
        .with("size", json!(data.len()));
        let output = if env.structured {
            output.with("content", json!(common::base64(&data))).with("encoding", json!("base64"))
        } else {
            output
        };
        (output, true)
    } else {
        match std::str::from_utf8(&data) {
            // A window of no lines did not inspect a file that has some.
            Ok(text) => {
                let output = render_text(text, path.as_str(), offset, limit, env.structured);
                let inspected = !output.is_error && (limit > 0 || is_blank(text));
                (output, inspected)
            }
            // Read whole, and found not to be text: an edit then says so, as in Deep Agents.
            Err(e) => {
                let text = format!("Error: Error reading file '{path}': {}", common::py_utf8_error(&data, e));
                (ToolOutput::error(ErrorCode::NotText, text), true)
            }
        }
    };
    // The session has read the file only when it saw it: not for a window of no lines, nor an
    // offset past the end. The version was taken before the content: if the file changes in
    // between, a later write is refused as stale rather than allowed over unseen content.
    if inspected {
        env.session.observe(&loc.real, Version::of(&attr));
    }
    if env.structured && data.is_empty() {
        output = output.with("content", json!("")).with("encoding", json!("utf-8"));
    }
    output
}

/// The window of a (non-empty) text file Deep Agents would return for `offset`/`limit`,
/// rendered, with the window numbers as structured fields. With `raw` (a structured call)
/// the window's text is added as `content` (`\n` line ends, as Deep Agents' backends slice
/// it), and the numbers describe the whole window, not what the size cap let the text show:
/// such a client truncates the rendering itself. A blank file's `content` is the file.
pub fn render_text(content: &str, path: &str, offset: i64, limit: i64, raw: bool) -> ToolOutput {
    let raw_fields = |out: ToolOutput, text: &str| {
        if raw {
            out.with("content", json!(text)).with("encoding", json!("utf-8"))
        } else {
            out
        }
    };
    if is_blank(content) {
        let total = splitlines_keepends(content).len();
        let out = ToolOutput::text(EMPTY_CONTENT_WARNING)
            .with("total_lines", json!(total))
            .with("truncated", json!(false));
        return raw_fields(out, content);
    }
    // Degenerate bounds are clamped (`normalize_read_bounds`); a zero-line window never
    // inspected the file, which its own reminder says.
    let (start, count) = (offset.max(0) as usize, limit.max(0) as usize);
    if count == 0 {
        let out = ToolOutput::text(format!(
            "System reminder: no lines were read because `limit` was {limit}. The file was not inspected and may have contents; retry with `limit` >= 1 to read it."
        ))
        .with("truncated", json!(false));
        return raw_fields(out, "").with("no_lines_requested", json!(true));
    }
    let lines = splitlines_keepends(content);
    let total = lines.len();
    if start >= total {
        return ToolOutput::error(
            ErrorCode::InvalidArgument,
            format!("Error: Line offset {start} exceeds file length ({total} lines)"),
        );
    }
    let end = start.saturating_add(count).min(total);
    let text_window = to_lf(&lines[start..end].concat());
    let (start_line, end_line) = (start + 1, end);
    let next_offset = (end < total).then_some(end);
    if is_blank(&text_window) && start_line == 1 && end_line == total {
        let out = ToolOutput::text(EMPTY_CONTENT_WARNING)
            .with("total_lines", json!(total))
            .with("truncated", json!(false));
        return raw_fields(out, content);
    }
    // The body is the window split on `\n` with the final terminator dropped, padded with
    // blank rows when Python line ends other than `\n` made it short (`_pad_blank_rows`).
    let mut rows: Vec<&str> = text_window.split('\n').collect();
    if rows.last() == Some(&"") {
        rows.pop();
    }
    let want = end_line - start_line + 1;
    if rows.len() < want {
        rows.resize(want, "");
    }
    let notices: Vec<String> = if offset < 0 {
        vec![format!(
            "[Requested offset {offset} is before the start of the file; read from line 1 instead.]"
        )]
    } else {
        Vec::new()
    };
    let window = Window { start_line, end_line, total, next_offset };
    let (text, mut shown) = truncate(&rows, path, &window, &notices);
    if raw {
        shown = Shown { start_line, end_line, next_offset, truncated: false };
    }
    raw_fields(ToolOutput::text(text), &text_window)
        .with("start_line", json!(shown.start_line))
        .with("end_line", json!(shown.end_line))
        .with("total_lines", json!(total))
        .with("next_offset", json!(shown.next_offset))
        .with("truncated", json!(shown.truncated))
}

#[derive(Clone, Copy, Debug)]
struct Window {
    start_line: usize,
    end_line: usize,
    total: usize,
    next_offset: Option<usize>,
}

/// What the result finally shows.
struct Shown {
    start_line: usize,
    end_line: usize,
    next_offset: Option<usize>,
    truncated: bool,
}

/// `lines A-B of T` and, when lines remain, `next offset N` (`_window_fields`).
fn window_fields(w: &Window) -> Vec<String> {
    let mut fields = vec![format!("lines {}-{} of {}", w.start_line, w.end_line, w.total)];
    if let Some(next) = w.next_offset {
        if w.end_line < w.total {
            fields.push(format!("next offset {next}"));
        }
    }
    fields
}

fn header(fields: &[String]) -> String {
    format!("@@ {} @@", fields.join(" | "))
}

/// Notices, header and body, one per line (`_assemble_read`).
fn assemble(notices: &[String], fields: &[String], body: &str) -> String {
    let mut parts: Vec<&str> = notices.iter().map(String::as_str).collect();
    let head = header(fields);
    parts.push(&head);
    parts.push(body);
    parts.join("\n")
}

/// Length in characters of `assemble(notices, fields, body)` for a body of `body_chars`.
fn assembled_len(notices: &[String], fields: &[String], body_chars: usize) -> usize {
    notices.iter().map(|n| char_len(n) + 1).sum::<usize>() + char_len(&header(fields)) + 1 + body_chars
}

/// Deep Agents' `_truncate_paginated_read`: a result of [`MAX_CHARS`] or more keeps the
/// whole source lines that fit (saying where to resume), or cuts inside the first line
/// when not even one fits (no resume offset reaches the rest of such a line).
fn truncate(rows: &[&str], path: &str, w: &Window, notices: &[String]) -> (String, Shown) {
    let body = rows.join("\n");
    let body_chars = char_len(&body);
    let fields = window_fields(w);
    let untouched = Shown {
        start_line: w.start_line,
        end_line: w.end_line,
        next_offset: w.next_offset,
        truncated: false,
    };
    if assembled_len(notices, &fields, body_chars) < MAX_CHARS {
        return (assemble(notices, &fields, &body), untouched);
    }
    let mut all_notices = notices.to_vec();
    all_notices.push(format!(
        "[Output was truncated due to size limits. The file content is very large. Consider reformatting the file to make it easier to navigate. For example, if this is JSON, use execute(command='jq . {path}') to pretty-print it with line breaks. For other formats, you can use appropriate formatting tools to split long lines.]"
    ));
    // Where each source line ends in the body, in characters and bytes.
    let mut boundaries: Vec<(usize, usize, usize)> = Vec::new();
    let (mut chars, mut bytes) = (0, 0);
    for (i, row) in rows.iter().enumerate() {
        let source_line = w.start_line + i;
        if source_line > w.end_line {
            break;
        }
        chars += char_len(row);
        bytes += row.len();
        boundaries.push((chars, bytes, source_line));
        chars += 1;
        bytes += 1;
    }
    for &(chars, bytes, end_line) in boundaries.iter().rev() {
        let cut = Window { end_line, next_offset: Some(end_line), ..*w };
        let mut fields = window_fields(&cut);
        fields.push("truncated due to size".to_string());
        if assembled_len(&all_notices, &fields, chars) <= MAX_CHARS {
            let shown =
                Shown { start_line: w.start_line, end_line, next_offset: Some(end_line), truncated: true };
            return (assemble(&all_notices, &fields, &body[..bytes]), shown);
        }
    }
    // Not one whole line fits: show as much of the first as the budget allows.
    let first = rows.first().copied().unwrap_or("");
    let oversized = char_len(first);
    let clipped = Window { end_line: w.start_line, next_offset: None, ..*w };
    let fields_for = |shown: usize| {
        let mut fields = window_fields(&clipped);
        fields.push("truncated mid-line".to_string());
        fields.push(format!("{shown} of {oversized} chars"));
        fields
    };
    let reserved = assembled_len(&all_notices, &fields_for(oversized), 0);
    let shown = oversized.min(MAX_CHARS.saturating_sub(reserved));
    let cut = first.char_indices().nth(shown).map_or(first.len(), |(i, _)| i);
    let text = assemble(&all_notices, &fields_for(shown), &first[..cut]);
    (text, Shown { start_line: w.start_line, end_line: w.start_line, next_offset: None, truncated: true })
}

#[cfg(test)]
#[path = "tests_files.rs"]
mod tests_files;
