//! Large tool result offload (Deep Agents' eviction): a result text longer than 80,000
//! characters is written to `/large_tool_results/<id>` through the engine and replaced by a
//! notice with a line-numbered head-and-tail preview, so the model can page through the whole
//! result with `read_file` instead of receiving it at once.

use std::hash::{BuildHasher, Hasher};

use serde_json::json;

use super::common::{char_len, splitlines_keepends, MAX_CHARS};
use super::{Block, ToolEnv, ToolOutput};
use crate::display::Escaped;
use crate::vpath::VPath;

/// Tools with their own size caps, whose results are never offloaded (Deep Agents' list).
pub const EXCLUDED: [&str; 7] = ["ls", "glob", "grep", "read_file", "edit_file", "write_file", "delete"];

/// Where offloaded results go.
pub const DIRECTORY: &str = "/large_tool_results";

/// Longer ids become `call-<sha256>` so the file name stays short.
const MAX_ID_BYTES: usize = 128;
/// Preview lines are clipped to this many characters.
const PREVIEW_LINE_CHARS: usize = 1000;
/// The notice shows at most this much of a tool call id.
const VISIBLE_ID_CHARS: usize = 32;
/// Lines beyond this are cut into `N.1`, `N.2` … rows (never reached by clipped previews).
const MAX_LINE_LENGTH: usize = 5000;
const HEAD_LINES: usize = 5;
const TAIL_LINES: usize = 5;

const OMITTED_CAVEAT: &str =
    "lines of the form `... [N lines truncated] ...` indicate omitted lines in the middle of the content";
const CLIPPED_CAVEAT: &str = "the output contains lines longer than 1000 characters; this preview shows only their first 1000 characters";

/// Deep Agents' `sanitize_tool_call_id`: `.`, `/` and `\` become `_`; too long an id becomes
/// `call-<sha256 of the original>`.
pub fn sanitize_id(id: &str) -> String {
    let sanitized = id.replace(['.', '/', '\\'], "_");
    if sanitized.len() > MAX_ID_BYTES {
        return format!("call-{}", hex(&sha256(id.as_bytes())));
    }
    sanitized
}

/// `unknown-<8 hex digits>` for a call without an id.
pub fn generated_id() -> String {
    // A randomly seeded hasher is the standard library's source of randomness.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos(),
    );
    format!("unknown-{:08x}", h.finish() as u32)
}

/// Deep Agents' `format_content_with_line_numbers` for a list of lines: markers right-aligned
/// to the widest marker of the block, two spaces, the line (long lines in `N.k` chunks).
pub fn number_lines(lines: &[String], start: usize) -> String {
    let mut rows: Vec<(String, String)> = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let chars: Vec<char> = line.chars().collect();
        let chunks: Vec<String> = if chars.is_empty() {
            vec![String::new()]
        } else {
            chars.chunks(MAX_LINE_LENGTH).map(|c| c.iter().collect()).collect()
        };
        for (k, chunk) in chunks.into_iter().enumerate() {
            let marker = if k == 0 { format!("{}", start + i) } else { format!("{}.{k}", start + i) };
            rows.push((marker, chunk));
        }
    }
    let width = rows.iter().map(|(m, _)| m.len()).max().unwrap_or(0);
    rows.iter().map(|(m, l)| format!("{m:>width$}  {l}")).collect::<Vec<_>>().join("\n")
}

/// The preview and whether lines were omitted or clipped (Deep Agents' `_create_content_preview`).
pub fn preview(text: &str) -> (String, bool, bool) {
    let lines: Vec<&str> = splitlines_keepends(text)
        .into_iter()
        .map(|l| {
            l.trim_end_matches([
                '\n', '\r', '\x0b', '\x0c', '\x1c', '\x1d', '\x1e', '\u{85}', '\u{2028}', '\u{2029}',
            ])
        })
        .collect();
    let clip = |shown: &[&str]| -> (Vec<String>, bool) {
        let clipped = shown.iter().any(|l| char_len(l) > PREVIEW_LINE_CHARS);
        (shown.iter().map(|l| l.chars().take(PREVIEW_LINE_CHARS).collect()).collect(), clipped)
    };
    if lines.len() <= HEAD_LINES + TAIL_LINES {
        let (shown, clipped) = clip(&lines);
        return (number_lines(&shown, 1), false, clipped);
    }
    let (head, head_clipped) = clip(&lines[..HEAD_LINES]);
    let (tail, tail_clipped) = clip(&lines[lines.len() - TAIL_LINES..]);
    let omitted = lines.len() - HEAD_LINES - TAIL_LINES;
    let text = format!(
        "{}\n... [{omitted} lines truncated] ...\n{}",
        number_lines(&head, 1),
        number_lines(&tail, lines.len() - TAIL_LINES + 1)
    );
    (text, true, head_clipped || tail_clipped)
}

/// The notice that replaces an offloaded result (Deep Agents' `_TOO_LARGE_TOOL_MSG`).
pub fn notice(id: &str, path: &str, text: &str) -> String {
    let visible = if char_len(id) > VISIBLE_ID_CHARS {
        format!("{}...", id.chars().take(VISIBLE_ID_CHARS).collect::<String>())
    } else {
        id.to_string()
    };
    let (sample, omitted, clipped) = preview(text);
    let mut note = if omitted {
        "Here is a preview showing the head and tail of the result".to_string()
    } else {
        "Here is a preview of the result".to_string()
    };
    let caveats: Vec<&str> = [(omitted, OMITTED_CAVEAT), (clipped, CLIPPED_CAVEAT)]
        .into_iter()
        .filter(|c| c.0)
        .map(|c| c.1)
        .collect();
    if !caveats.is_empty() {
        note.push_str(&format!(" ({})", caveats.join("; ")));
    }
    format!(
        "Tool result too large, the result of this tool call {visible} was saved in the filesystem at this path: {path}

You can read the result from the filesystem by using the read_file tool, but make sure to only read part of the result at a time.

You can do this by specifying an offset and limit in the read_file tool call. For example, to read the first 100 lines, you can use the read_file tool with offset=0 and limit=100.

{note}:

{sample}
"
    )
}

/// Offloads `output` when tool `name` is not excluded and its text is over the limit. On a
/// write error (a rule denies the directory, the backend is full) the result is kept as it is.
pub fn apply(env: &ToolEnv, name: &str, output: ToolOutput) -> ToolOutput {
    if EXCLUDED.contains(&name) {
        return output;
    }
    let text = output.joined_text();
    if char_len(&text) <= MAX_CHARS {
        return output;
    }
    let id = env.call_id.clone().unwrap_or_else(generated_id);
    let path = format!("{DIRECTORY}/{}", sanitize_id(&id));
    let Ok(vpath) = VPath::parse(&path) else { return output };
    // Made durable before the notice points the model at it (the call's own changes, if
    // any, were made durable before it ran).
    let written = env.fs.write_atomic(&vpath, text.as_bytes(), 0o644).and_then(|_| env.fs.make_durable());
    if let Err(e) = written {
        // The path holds the caller's call id.
        tracing::warn!(
            "cannot offload a large {name} result to {}: {}",
            Escaped(&path),
            Escaped(&e.to_string())
        );
        return output;
    }
    // Non-text blocks stay after the notice, as in Deep Agents.
    let mut content = vec![Block::Text(notice(&id, &path, &text))];
    content.extend(output.content.into_iter().filter(|b| !matches!(b, Block::Text(_))));
    let mut structured = output.structured;
    structured.insert("output_file".into(), json!(path));
    ToolOutput { content, is_error: output.is_error, structured }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 (FIPS 180-4), for the long-id file names; small enough not to need a crate.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
    ];
    let mut h: [u32; 8] =
        [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for block in msg.chunks(64) {
        let mut w = [0u32; 64];
        for (i, word) in block.chunks(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16].wrapping_add(s0).wrapping_add(w[i - 7]).wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh.wrapping_add(s1).wrapping_add(ch).wrapping_add(K[i]).wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            (hh, g, f, e, d, c, b, a) = (g, f, e, d.wrapping_add(t1), c, b, a, t1.wrapping_add(t2));
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 32];
    for (i, word) in h.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&word.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_matches_known_digests() {
        assert_eq!(hex(&sha256(b"")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(hex(&sha256(b"abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        let long = vec![b'a'; 1000];
        assert_eq!(hex(&sha256(&long)), "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
    }

    #[test]
    fn ids_are_sanitised_like_deep_agents() {
        assert_eq!(sanitize_id("call_1.2/3\\4"), "call_1_2_3_4");
        let long = "x".repeat(129);
        assert_eq!(sanitize_id(&long), format!("call-{}", hex(&sha256(long.as_bytes()))));
        assert_eq!(sanitize_id(&"x".repeat(128)), "x".repeat(128));
        let g = generated_id();
        assert!(g.starts_with("unknown-") && g.len() == 16, "{g}");
    }

    #[test]
    fn a_short_result_is_previewed_whole() {
        let text = notice("abc", "/large_tool_results/abc", "one\ntwo\n");
        assert_eq!(
            text,
            "Tool result too large, the result of this tool call abc was saved in the filesystem at this path: /large_tool_results/abc\n\nYou can read the result from the filesystem by using the read_file tool, but make sure to only read part of the result at a time.\n\nYou can do this by specifying an offset and limit in the read_file tool call. For example, to read the first 100 lines, you can use the read_file tool with offset=0 and limit=100.\n\nHere is a preview of the result:\n\n1  one\n2  two\n"
        );
    }

    #[test]
    fn a_long_result_shows_head_and_tail() {
        let text: String = (1..=12).map(|i| format!("line {i}\n")).collect();
        let (sample, omitted, clipped) = preview(&text);
        assert!(omitted && !clipped);
        assert_eq!(
            sample,
            "1  line 1\n2  line 2\n3  line 3\n4  line 4\n5  line 5\n... [2 lines truncated] ...\n 8  line 8\n 9  line 9\n10  line 10\n11  line 11\n12  line 12"
        );
        let id = "a".repeat(40);
        let wide = format!("{}\nshort", "y".repeat(1500));
        let n = notice(&id, "/p", &wide);
        assert!(n.contains(&format!("tool call {}... was saved", "a".repeat(32))), "{n}");
        assert!(n.contains(&format!(
            "Here is a preview of the result ({CLIPPED_CAVEAT}):\n\n1  {}\n2  short\n",
            "y".repeat(1000)
        )));
    }
}
