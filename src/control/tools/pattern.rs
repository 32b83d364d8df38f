//! The include-glob matcher shared by `glob` and `grep`'s `glob` filter, reproducing Deep Agents'
//! `compile_grep_include_glob` (wcmatch with `BRACE | GLOBSTAR`, no `DOTMATCH`) on Linux:
//!
//! * a pattern without `/` matches the file name at any depth; one with `/` matches the path
//!   relative to the search root, and leading slashes are dropped (they only anchor);
//! * `*`, `?`, `[...]` (`!`/`^` negate, ranges, `[:alpha:]`-style classes), `\` escapes, `{a,b}`
//!   and `{1..3}`/`{a..c}` brace expansion (at most 1000 expansions), and `**` as a whole
//!   segment for any number of directories;
//! * a name starting with `.` is matched only by a segment whose first token is a literal `.`,
//!   and `**` never crosses such a name — so `*.yml` finds `.github/workflows/ci.yml` while
//!   `**/*.yml` does not.
//!
//! Matching is a small NFA over path components, so a walk can carry the state of a directory
//! down to its entries and skip subtrees that no pattern can reach (an anchored `/*.py` reads
//! one directory; `**/*.py` never enters dot-directories).

use super::common::py_repr;

/// wcmatch's `PATTERN_LIMIT`: more brace expansions than this and the pattern is refused.
const EXPANSION_LIMIT: usize = 1000;

/// A compiled include glob.
#[derive(Debug)]
pub struct IncludeGlob {
    /// The pattern named a path (it contained `/`), rather than a file name.
    anchored: bool,
    /// One entry per brace expansion.
    alts: Vec<Vec<Seg>>,
}

#[derive(Debug)]
enum Seg {
    /// `**`: any number of components that do not start with `.`.
    Globstar,
    Name(Vec<Tok>),
    /// A pattern ending in `/` names directories only, so it matches no file.
    Never,
}

#[derive(Debug)]
enum Tok {
    Lit(char),
    Any,
    Star,
    Class { negated: bool, items: Vec<ClassItem> },
}

#[derive(Debug)]
enum ClassItem {
    Char(char),
    Range(char, char),
    Posix(CharTest),
}

/// A named character class such as `[:alpha:]`.
type CharTest = fn(char) -> bool;

/// Where matching stands after some directories: (expansion, segment) pairs, sorted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct State(Vec<(u32, u32)>);

/// Why a pattern was refused; the text is Deep Agents' (without `Error: `).
pub fn compile(pattern: &str) -> Result<IncludeGlob, String> {
    if pattern.replace('\\', "/").split('/').any(|c| c == "..") {
        return Err(format!("Path traversal not allowed in glob pattern {}", py_repr(pattern)));
    }
    let anchored = pattern.contains('/');
    let expanded = expand_braces(pattern.trim_start_matches('/')).map_err(|limit| {
        format!("Invalid glob pattern {}: Pattern limit exceeded the limit of {limit}", py_repr(pattern))
    })?;
    let alts = expanded.iter().map(|p| parse_segments(p)).collect();
    Ok(IncludeGlob { anchored, alts })
}

impl IncludeGlob {
    /// Whether the pattern is matched against root-relative paths (else against file names).
    pub fn anchored(&self) -> bool {
        self.anchored
    }

    /// The state at the search root.
    pub fn start(&self) -> State {
        let mut states = Vec::new();
        for (a, segs) in self.alts.iter().enumerate() {
            push_closed(&mut states, segs, a as u32, 0);
        }
        states.sort_unstable();
        states.dedup();
        State(states)
    }

    /// The state inside directory `name` entered from `state`, or `None` when no file beneath it
    /// can match (the walk may skip it). Name patterns match at any depth, so they always go on.
    pub fn enter(&self, state: &State, name: &str) -> Option<State> {
        if !self.anchored {
            return Some(state.clone());
        }
        let mut next = Vec::new();
        for &(a, i) in &state.0 {
            let segs = &self.alts[a as usize];
            let Some(seg) = segs.get(i as usize) else { continue };
            match seg {
                Seg::Globstar => {
                    if !name.starts_with('.') {
                        push_closed(&mut next, segs, a, i);
                    }
                }
                Seg::Name(toks) => {
                    if match_name(toks, name) {
                        push_closed(&mut next, segs, a, i + 1);
                    }
                }
                Seg::Never => {}
            }
        }
        // A state that has used up every segment can match nothing further down.
        next.retain(|&(a, i)| (i as usize) < self.alts[a as usize].len());
        if next.is_empty() {
            return None;
        }
        next.sort_unstable();
        next.dedup();
        Some(State(next))
    }

    /// Whether the file `name` in a directory reached with `state` matches.
    pub fn matches_file(&self, state: &State, name: &str) -> bool {
        state.0.iter().any(|&(a, i)| {
            let segs = &self.alts[a as usize];
            if i as usize + 1 != segs.len() {
                return false;
            }
            match &segs[i as usize] {
                Seg::Globstar => !name.starts_with('.'),
                Seg::Name(toks) => match_name(toks, name),
                Seg::Never => false,
            }
        })
    }

    /// Whether a root-relative path (`a/b.py`, no leading `/`) matches: the file name alone for
    /// name patterns, the whole path for anchored ones.
    pub fn is_match(&self, rel: &str) -> bool {
        let (dirs, name) = match rel.rfind('/') {
            Some(i) => (&rel[..i], &rel[i + 1..]),
            None => ("", rel),
        };
        let mut state = self.start();
        if self.anchored {
            for dir in dirs.split('/').filter(|d| !d.is_empty()) {
                match self.enter(&state, dir) {
                    Some(next) => state = next,
                    None => return false,
                }
            }
        }
        self.matches_file(&state, name)
    }
}

/// Adds `(a, i)` and, past every `**` that is not the last segment, the positions after it
/// (a non-final `**` may stand for no directory at all).
fn push_closed(out: &mut Vec<(u32, u32)>, segs: &[Seg], a: u32, mut i: u32) {
    loop {
        out.push((a, i));
        match segs.get(i as usize) {
            Some(Seg::Globstar) if (i as usize) + 1 < segs.len() => i += 1,
            _ => return,
        }
    }
}

/// Splits one expanded pattern into segments: empty ones (from `//`) are dropped, a trailing `/`
/// makes it match nothing (it names directories), and `**` alone is the globstar. An expansion
/// that starts with `/` (`{,a}/x` gives `/x`) is absolute and never matches a relative path.
fn parse_segments(pattern: &str) -> Vec<Seg> {
    if pattern.starts_with('/') {
        return vec![Seg::Never];
    }
    let mut segs: Vec<Seg> = pattern
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| if s == "**" { Seg::Globstar } else { Seg::Name(parse_tokens(s)) })
        .collect();
    if pattern.ends_with('/') || pattern.is_empty() {
        segs.push(Seg::Never);
    }
    segs
}

fn parse_tokens(segment: &str) -> Vec<Tok> {
    let chars: Vec<char> = segment.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            // A trailing backslash escapes nothing and is dropped, as wcmatch does.
            '\\' => {
                if let Some(&c) = chars.get(i + 1) {
                    toks.push(Tok::Lit(c));
                }
                i += 2;
            }
            '*' => {
                if !matches!(toks.last(), Some(Tok::Star)) {
                    toks.push(Tok::Star);
                }
                i += 1;
            }
            '?' => {
                toks.push(Tok::Any);
                i += 1;
            }
            '[' => match parse_class(&chars, i) {
                Some((tok, next)) => {
                    toks.push(tok);
                    i = next;
                }
                None => {
                    toks.push(Tok::Lit('['));
                    i += 1;
                }
            },
            c => {
                toks.push(Tok::Lit(c));
                i += 1;
            }
        }
    }
    toks
}

/// Parses the bracket expression opening at `chars[start]`; `None` when it is not closed (the
/// `[` is then an ordinary character).
fn parse_class(chars: &[char], start: usize) -> Option<(Tok, usize)> {
    let mut i = start + 1;
    let negated = matches!(chars.get(i), Some('!' | '^'));
    if negated {
        i += 1;
    }
    let mut items = Vec::new();
    let mut first = true;
    loop {
        let c = *chars.get(i)?;
        if c == ']' && !first {
            return Some((Tok::Class { negated, items }, i + 1));
        }
        first = false;
        if c == '[' && chars.get(i + 1) == Some(&':') {
            if let Some((class, next)) = posix_class(chars, i) {
                items.push(ClassItem::Posix(class));
                i = next;
                continue;
            }
        }
        // One character, possibly escaped, possibly the start of a range.
        let (lo, after) = class_char(chars, i)?;
        if chars.get(after) == Some(&'-') && chars.get(after + 1).is_some_and(|&c| c != ']') {
            let (hi, next) = class_char(chars, after + 1)?;
            // A reversed range matches nothing; the rest of the class still counts.
            if lo <= hi {
                items.push(ClassItem::Range(lo, hi));
            }
            i = next;
        } else {
            items.push(ClassItem::Char(lo));
            i = after;
        }
    }
}

fn class_char(chars: &[char], i: usize) -> Option<(char, usize)> {
    match *chars.get(i)? {
        '\\' => Some((*chars.get(i + 1)?, i + 2)),
        c => Some((c, i + 1)),
    }
}

fn posix_class(chars: &[char], i: usize) -> Option<(CharTest, usize)> {
    let rest: String = chars[i + 2..].iter().take(8).collect();
    let end = rest.find(":]")?;
    let class: CharTest = match &rest[..end] {
        "alnum" => |c| c.is_ascii_alphanumeric(),
        "alpha" => |c| c.is_ascii_alphabetic(),
        "ascii" => |c| c.is_ascii(),
        "blank" => |c| c == ' ' || c == '\t',
        "cntrl" => |c| c.is_ascii_control(),
        "digit" => |c| c.is_ascii_digit(),
        "graph" => |c| c.is_ascii_graphic(),
        "lower" => |c| c.is_ascii_lowercase(),
        "print" => |c| c.is_ascii_graphic() || c == ' ',
        "punct" => |c| c.is_ascii_punctuation(),
        "space" => |c| c.is_ascii_whitespace() || c == '\x0b',
        "upper" => |c| c.is_ascii_uppercase(),
        "word" => |c| c.is_ascii_alphanumeric() || c == '_',
        "xdigit" => |c| c.is_ascii_hexdigit(),
        _ => return None,
    };
    Some((class, i + 2 + end + 2))
}

fn class_matches(negated: bool, items: &[ClassItem], c: char) -> bool {
    let hit = items.iter().any(|item| match *item {
        ClassItem::Char(x) => x == c,
        ClassItem::Range(lo, hi) => lo <= c && c <= hi,
        ClassItem::Posix(f) => f(c),
    });
    hit != negated
}

/// Matches one path component. A leading `.` must be matched by a literal `.`; every other
/// token consumes exactly one character, so one backtrack point for the last `*` suffices.
fn match_name(toks: &[Tok], name: &str) -> bool {
    if name.starts_with('.') && !matches!(toks.first(), Some(Tok::Lit('.'))) {
        return false;
    }
    let mut t = 0;
    let mut pos = 0;
    let mut backtrack: Option<(usize, usize)> = None;
    loop {
        let c = name[pos..].chars().next();
        let step = match (toks.get(t), c) {
            (Some(Tok::Star), _) => {
                backtrack = Some((t, pos));
                t += 1;
                continue;
            }
            (None, None) => return true,
            (Some(Tok::Lit(l)), Some(c)) => *l == c,
            (Some(Tok::Any), Some(_)) => true,
            (Some(Tok::Class { negated, items }), Some(c)) => class_matches(*negated, items, c),
            _ => false,
        };
        if step {
            t += 1;
            pos += c.map_or(0, char::len_utf8);
            continue;
        }
        match backtrack {
            // Let the last `*` swallow one more character and retry what follows it.
            Some((star, from)) if from < name.len() => {
                let next = from + name[from..].chars().next().map_or(1, char::len_utf8);
                backtrack = Some((star, next));
                t = star + 1;
                pos = next;
            }
            _ => return false,
        }
    }
}

/// Bash-style brace expansion as wcmatch does it (through `bracex`): `{a,b}` alternatives (nested,
/// empty ones allowed), `{1..9..2}`/`{a..e}` sequences, a group without a top-level comma kept
/// literally (its inner groups still expand), unbalanced braces literal, escapes kept for the
/// glob parser. Err carries the limit when there would be more than [`EXPANSION_LIMIT`].
fn expand_braces(pattern: &str) -> Result<Vec<String>, usize> {
    let out = expand(pattern)?;
    // Alternatives that came out empty only match an empty name; wcmatch keeps one "" when
    // nothing else is left.
    let mut kept: Vec<String> = out.into_iter().filter(|s| !s.is_empty()).collect();
    if kept.is_empty() {
        kept.push(String::new());
    }
    Ok(kept)
}

fn expand(s: &str) -> Result<Vec<String>, usize> {
    let bytes = s.as_bytes();
    let Some((open, close)) = first_group(bytes) else { return Ok(vec![s.to_string()]) };
    let (pre, body, post) = (&s[..open], &s[open + 1..close], &s[close + 1..]);
    let tails = expand(post)?;
    let items: Vec<String> = if let Some(seq) = sequence(body)? {
        seq
    } else {
        let parts = split_top_commas(body);
        if parts.len() == 1 {
            expand(body)?.into_iter().map(|b| format!("{{{b}}}")).collect()
        } else {
            let mut items = Vec::new();
            for part in parts {
                items.extend(expand(part)?);
                if items.len() > EXPANSION_LIMIT {
                    return Err(EXPANSION_LIMIT);
                }
            }
            items
        }
    };
    if items.len().saturating_mul(tails.len()) > EXPANSION_LIMIT {
        return Err(EXPANSION_LIMIT);
    }
    let mut out = Vec::with_capacity(items.len() * tails.len());
    for item in &items {
        for tail in &tails {
            out.push(format!("{pre}{item}{tail}"));
        }
    }
    Ok(out)
}

/// The first `{` that has a matching `}` (escapes skipped), and that `}`.
fn first_group(bytes: &[u8]) -> Option<(usize, usize)> {
    let mut start = 0;
    while let Some(open) = find_unescaped(bytes, start, b'{') {
        let mut depth = 0usize;
        let mut i = open;
        while i < bytes.len() {
            match bytes[i] {
                b'\\' => i += 1,
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some((open, i));
                    }
                }
                _ => {}
            }
            i += 1;
        }
        start = open + 1;
    }
    None
}

fn find_unescaped(bytes: &[u8], from: usize, want: u8) -> Option<usize> {
    let mut i = from;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 1,
            b if b == want => return Some(i),
            _ => {}
        }
        i += 1;
    }
    None
}

fn split_top_commas(body: &str) -> Vec<&str> {
    let bytes = body.as_bytes();
    let (mut parts, mut depth, mut last, mut i) = (Vec::new(), 0usize, 0, 0);
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 1,
            b'{' => depth += 1,
            b'}' => depth = depth.saturating_sub(1),
            b',' if depth == 0 => {
                parts.push(&body[last..i]);
                last = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    parts.push(&body[last..]);
    parts
}

/// `{1..5}`, `{05..1..2}`, `{a..e}` and friends, as `bracex` expands them; `None` when the body
/// is not a sequence.
fn sequence(body: &str) -> Result<Option<Vec<String>>, usize> {
    let parts: Vec<&str> = body.split("..").collect();
    if !(2..=3).contains(&parts.len()) {
        return Ok(None);
    }
    let step = match parts.get(2) {
        None => 1,
        Some(s) => match parse_int(s) {
            Some(v) => v.unsigned_abs().max(1),
            None => return Ok(None),
        },
    };
    let (a, b) = (parts[0], parts[1]);
    if let (Some(first), Some(last)) = (parse_int(a), parse_int(b)) {
        let padded = |s: &str| {
            let digits = s.trim_start_matches('-');
            !s.starts_with('+') && digits.len() > 1 && digits.starts_with('0')
        };
        let width = if padded(a) || padded(b) { a.len().max(b.len()) } else { 0 };
        let span = first.abs_diff(last) + 1;
        let count = span.div_ceil(step);
        if count > EXPANSION_LIMIT as u64 {
            return Err(EXPANSION_LIMIT);
        }
        let dir: i128 = if first <= last { 1 } else { -1 };
        let values = (0..count)
            .map(|k| first as i128 + dir * k as i128 * step as i128)
            .map(|v| format!("{v:0width$}"));
        return Ok(Some(values.collect()));
    }
    let (mut ca, mut cb) = (a.chars(), b.chars());
    let (Some(x), None, Some(y), None) = (ca.next(), ca.next(), cb.next(), cb.next()) else {
        return Ok(None);
    };
    if !x.is_ascii_alphabetic() || !y.is_ascii_alphabetic() {
        return Ok(None);
    }
    // bracex walks the ASCII run `A`..=`z`, in which the backslash stands for an empty string.
    let table: Vec<Option<char>> = ('A'..='z').map(|c| (c != '\\').then_some(c)).collect();
    let index = |c: char| (c as usize) - ('A' as usize);
    let (i, j) = (index(x), index(y));
    let span = i.abs_diff(j) + 1;
    let count = span.div_ceil(step as usize);
    if count > EXPANSION_LIMIT {
        return Err(EXPANSION_LIMIT);
    }
    let values = (0..count)
        .map(|k| if i <= j { i + k * step as usize } else { i - k * step as usize })
        .map(|n| table[n].map(String::from).unwrap_or_default());
    Ok(Some(values.collect()))
}

fn parse_int(s: &str) -> Option<i64> {
    let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}
