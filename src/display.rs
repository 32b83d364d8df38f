//! Strings shown to a human (the CLI's lines, the daemon's log): printable text as it is, and
//! every character that could change what the reader sees shown as a visible escape.
//!
//! Paths, command lines, tool arguments and reasons come from callers, who may put a carriage
//! return, an ANSI sequence, a newline or a right-to-left override in them to make a line read
//! as something else (a different path or pid, a forged extra line). [`escape`] renders:
//!
//! - `\` as `\\`, so literal text cannot pass for an escape;
//! - tab, newline and carriage return as `\t`, `\n`, `\r`; the other C0 controls and DEL as
//!   `\x1b`-style escapes;
//! - C1 controls, bidi controls (U+202A-U+202E, U+2066-U+2069, U+061C), zero-width and
//!   direction marks (U+200B-U+200F, U+2060-U+2064), U+FEFF, line and paragraph separators,
//!   and whatever else the standard library does not consider printable (other format
//!   characters, unassigned code points, private use, spaces other than U+0020) as
//!   `\u{202e}`-style escapes.
//!
//! Everything else, e.g. `café` or `日本`, is kept as it is. This module depends on nothing
//! else in the crate.

use std::borrow::Cow;
use std::fmt::{self, Write};

/// The longest prefix of `text` of at most `max` bytes that ends at a character boundary, for
/// text cut to a size (`str::floor_char_boundary` does this from Rust 1.91, past this crate's
/// minimum).
pub fn prefix_within(text: &str, max: usize) -> &str {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `s` as a human should see it: printable characters kept, the rest escaped (see the module
/// documentation). Borrows when nothing needs escaping.
pub fn escape(s: &str) -> Cow<'_, str> {
    if s.chars().all(|c| !needs_escape(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        push_escaped(&mut out, c);
    }
    Cow::Owned(out)
}

/// Formats its string escaped, e.g. as a `tracing` field: `path = %Escaped(&path)`.
pub struct Escaped<'a>(pub &'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        // Runs of characters that need nothing go out in one write.
        while let Some((at, c)) = rest.char_indices().find(|&(_, c)| needs_escape(c)) {
            f.write_str(&rest[..at])?;
            write_escaped(f, c)?;
            rest = &rest[at + c.len_utf8()..];
        }
        f.write_str(rest)
    }
}

/// Appends `c` to `out`, escaped if it needs to be.
pub fn push_escaped(out: &mut String, c: char) {
    // Writing to a String cannot fail.
    let _ = write_escaped(out, c);
}

/// Whether `c` is shown as an escape rather than as itself.
pub fn needs_escape(c: char) -> bool {
    match c {
        '\\' => true,
        ' '..='~' => false,
        '\0'..='\x1f' | '\x7f' => true,
        // Named so that the guarantee does not rest on the standard library's table alone.
        '\u{80}'..='\u{9f}'
        | '\u{ad}'
        | '\u{61c}'
        | '\u{180e}'
        | '\u{200b}'..='\u{200f}'
        | '\u{2028}'..='\u{202e}'
        | '\u{2060}'..='\u{2064}'
        | '\u{2066}'..='\u{206f}'
        | '\u{feff}'
        | '\u{fff9}'..='\u{fffb}' => true,
        _ => !printable(c),
    }
}

/// The standard library's notion of printable (what `{:?}` leaves unescaped), without its
/// rule for combining marks: `str::escape_debug` escapes a grapheme extender only at the
/// start of a string, so `c` is asked about behind a letter, where only an unprintable
/// character is escaped. Combining marks stay, so a decomposed `é` reads as `é`.
fn printable(c: char) -> bool {
    let mut buf = [0u8; 5];
    buf[0] = b'a';
    let len = 1 + c.encode_utf8(&mut buf[1..]).len();
    let probe = std::str::from_utf8(&buf[..len]).expect("UTF-8 from a letter and a char");
    probe.escape_debug().nth(1) == Some(c)
}

fn write_escaped(out: &mut impl Write, c: char) -> fmt::Result {
    if !needs_escape(c) {
        return out.write_char(c);
    }
    match c {
        '\\' => out.write_str("\\\\"),
        '\t' => out.write_str("\\t"),
        '\n' => out.write_str("\\n"),
        '\r' => out.write_str("\\r"),
        '\0'..='\x7f' => write!(out, "\\x{:02x}", c as u32),
        _ => write!(out, "\\u{{{:x}}}", c as u32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_shown_as_escapes() {
        assert_eq!(escape("a\rb\nc\td"), "a\\rb\\nc\\td");
        assert_eq!(escape("\x1b[2Kgone"), "\\x1b[2Kgone");
        assert_eq!(escape("\0\x07\x08\x0c\x1f"), "\\x00\\x07\\x08\\x0c\\x1f");
        assert_eq!(escape("del\x7f"), "del\\x7f");
        // C1: U+009B is a one-character CSI on some terminals.
        assert_eq!(escape("\u{85}\u{9b}2K"), "\\u{85}\\u{9b}2K");
    }

    #[test]
    fn bidi_and_invisible_characters_are_shown_as_escapes() {
        assert_eq!(escape("/x/\u{202e}txt.exe"), "/x/\\u{202e}txt.exe");
        for c in
            ['\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}', '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}']
        {
            assert_eq!(escape(&c.to_string()), format!("\\u{{{:x}}}", c as u32));
        }
        for c in ['\u{200b}', '\u{200c}', '\u{200d}', '\u{200e}', '\u{200f}', '\u{feff}', '\u{2060}'] {
            assert_eq!(escape(&c.to_string()), format!("\\u{{{:x}}}", c as u32));
        }
        assert_eq!(escape("a\u{2028}b\u{2029}c\u{ad}d"), "a\\u{2028}b\\u{2029}c\\u{ad}d");
        // Unassigned, private use, and a space that is not U+0020.
        assert_eq!(escape("\u{378}\u{e000}\u{a0}"), "\\u{378}\\u{e000}\\u{a0}");
    }

    #[test]
    fn a_backslash_cannot_pass_for_an_escape() {
        assert_eq!(escape("\\r"), "\\\\r");
        assert_eq!(escape("a\\b"), "a\\\\b");
        // The rendering of a real CR and of the literal text `\r` differ.
        assert_ne!(escape("\r"), escape("\\r"));
    }

    #[test]
    fn printable_text_is_kept_as_it_is() {
        for s in ["café", "日本", "/workspace/src/main.rs", "naïve résumé ✓ 🦀", "e\u{301}", "", " ~!\"'"]
        {
            assert!(matches!(escape(s), Cow::Borrowed(_)), "{s:?}");
            assert_eq!(escape(s), s);
        }
    }

    #[test]
    fn the_display_wrapper_matches_escape() {
        for s in ["plain", "a\rb", "\x1b[2K\n#99 write /host/forged by pid 1", "日本\u{202e}x\\", "\u{9b}"]
        {
            assert_eq!(Escaped(s).to_string(), escape(s), "{s:?}");
        }
    }
}
