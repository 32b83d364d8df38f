//! A rule's path pattern, parsed once into components: the matcher (one `GlobSet` built from
//! it) and the subtree-overlap test both read this one structure, so they cannot disagree
//! about what a pattern names, whatever escapes, classes or alternatives it is spelled with.
//!
//! The syntax is globset's with `literal_separator`: `*` and `?` stay within one component,
//! `**` as a whole component spans any number of them, `[...]` is a class, `\` escapes the
//! next character (inside a class it is a plain character, as in globset). Alternatives
//! `{a,b}` are expanded first, as a shell does (an empty alternative is the empty string, so
//! `.env{,.local}` names `.env` and `.env.local`), and each expansion is one branch: a plain
//! sequence of components. Spellings that could never match a normalised path (`//`, a `.`
//! component, `/` inside a class or escaped, a `/` after `**`) are refused, not left dead.

use globset::{Glob, GlobBuilder, GlobMatcher, GlobSet, GlobSetBuilder};
use regex::Regex;

use crate::vpath::VPath;

/// More expansions than this is surely a mistake (and would slow every decision).
const MAX_BRANCHES: usize = 256;

/// One component of a branch.
#[derive(Clone, Debug)]
enum Segment {
    /// A name matched exactly (escapes removed).
    Literal(String),
    /// One component with wildcards (`*`, `?`, `[...]`), matched against one name: its text,
    /// a set of that one glob, which answers `*.ext`, `name*` and `*name` by lookup where
    /// a compiled matcher would be a regex of about 15 KiB per rule, and, when it has a `?`
    /// or a class, its [`ByChar`] matcher for names that are not all ASCII.
    Wildcard(String, GlobSet, Option<ByChar>),
    /// `**`: any number of components.
    AnyDepth,
}

/// One expansion of a pattern's alternatives.
#[derive(Clone, Debug)]
pub struct Branch {
    segments: Vec<Segment>,
    /// A trailing `/`: the branch names a directory (it matches only the `dir/` spelling).
    dir_only: bool,
    /// The whole branch as one glob, rendered from `segments`, for the rule set's `GlobSet`.
    /// Not compiled here: a compiled matcher costs about 15 KiB, which thousands of rules
    /// would pay for a matcher asked only by `explain`.
    glob: Glob,
    /// The whole branch by characters, when a component has a `?` or a class ([`ByChar`]).
    by_char: Option<ByChar>,
}

/// A matcher that reads a name or path by characters, for what globset reads by bytes: its
/// `?` and classes each take one byte, so `sec?et` would miss `sec€et` and `[é]` never match
/// `é`. The glob is translated to a Unicode regex with the same meaning, asked only for text
/// that is not all ASCII (where bytes are characters, globset's answer stands).
#[derive(Clone, Debug)]
pub struct ByChar(Regex);

impl ByChar {
    pub fn is_match(&self, text: &str) -> bool {
        self.0.is_match(text)
    }
}

/// A validated, parsed rule pattern.
#[derive(Clone, Debug)]
pub struct Pattern {
    source: String,
    branches: Vec<Branch>,
}

fn builder(text: &str) -> Result<Glob, String> {
    GlobBuilder::new(text)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map_err(|e| e.kind().to_string())
}

impl Pattern {
    /// Parses `source`; the error says what is wrong with it (the config loader adds where).
    pub fn parse(source: &str) -> Result<Pattern, String> {
        let fail = |why: String| format!("rule path {source:?}: {why}");
        if source.starts_with('~') || source.split('/').any(|c| c.starts_with('~')) {
            return Err(fail("'~' is not supported; write the full path".into()));
        }
        if !source.starts_with('/') {
            return Err(fail("must start with '/'".into()));
        }
        let mut expansions = Vec::new();
        expand(source, &mut expansions).map_err(fail)?;
        let branches = expansions.iter().map(|e| Branch::parse(e)).collect::<Result<Vec<_>, _>>();
        Ok(Pattern { source: source.to_string(), branches: branches.map_err(fail)? })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    pub fn branches(&self) -> &[Branch] {
        &self.branches
    }

    /// Whether the pattern matches `path` itself (as a file, or as `path/` when `is_dir`).
    /// Compiles the pattern for this one question; [`Pattern::matcher`] keeps it compiled.
    pub fn is_match(&self, path: &VPath, is_dir: bool) -> bool {
        self.matcher().is_match(path, is_dir)
    }

    /// The pattern compiled for matching paths one at a time (decisions use the rule set's
    /// `GlobSet` instead; this serves `explain` and the tests).
    pub fn matcher(&self) -> PatternMatcher<'_> {
        PatternMatcher { branches: self.branches.iter().map(|b| (b, b.glob.compile_matcher())).collect() }
    }

    /// Whether the pattern could match `target`, anything beneath it, or an ancestor of it.
    /// Exact up to the wildcards of the components past the target, which are assumed to
    /// match some name.
    pub fn reaches_subtree(&self, target: &VPath) -> bool {
        self.branches.iter().any(|b| b.reaches_subtree(target))
    }

    /// The literal leading directories of each branch (`/a/b` for `/a/b/*.x`).
    pub fn anchors(&self) -> impl Iterator<Item = VPath> + '_ {
        self.branches.iter().map(Branch::anchor)
    }
}

/// A [`Pattern`] with each branch's glob compiled.
pub struct PatternMatcher<'a> {
    branches: Vec<(&'a Branch, GlobMatcher)>,
}

impl PatternMatcher<'_> {
    /// Whether the pattern matches `path` itself (as a file, or as `path/` when `is_dir`).
    pub fn is_match(&self, path: &VPath, is_dir: bool) -> bool {
        self.branches.iter().any(|(branch, matcher)| {
            let matches = |text: &str| match branch.by_char() {
                Some(chars) if !text.is_ascii() => chars.is_match(text),
                _ => matcher.is_match(text),
            };
            matches(path.as_str())
                || (is_dir && !path.is_root() && branch.covers_dir() && matches(&format!("{path}/")))
        })
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.source)
    }
}

impl Branch {
    fn parse(text: &str) -> Result<Branch, String> {
        let parts = split_components(text)?;
        // `parts[0]` is the empty text before the leading '/'.
        if !parts[0].is_empty() {
            return Err("must start with '/'".into());
        }
        let mut parts = &parts[1..];
        let mut dir_only = false;
        if parts.len() > 1 && parts.last().is_some_and(|p| p.is_empty()) {
            dir_only = true;
            parts = &parts[..parts.len() - 1];
        }
        let mut segments = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            let segment = match part.as_str() {
                "" if parts.len() == 1 => break, // the pattern "/" names the root
                "" => return Err("an empty component ('//') never matches".into()),
                "." => return Err("a '.' component never matches; leave it out".into()),
                ".." => return Err("must not contain a '..' component".into()),
                "**" => Segment::AnyDepth,
                _ => match unescaped_literal(part) {
                    Some(name) if name == "." || name == ".." => {
                        return Err(format!("component {part:?} never matches"))
                    }
                    Some(name) => Segment::Literal(name),
                    None => {
                        // globset first: its error says what is wrong with the glob.
                        let set = component_set(part)?;
                        let (regex, by_char) = component_regex(part)?;
                        let by_char = by_char.then(|| anchored(&regex)).transpose()?;
                        Segment::Wildcard(part.clone(), set, by_char)
                    }
                },
            };
            if dir_only && i + 1 == parts.len() && matches!(segment, Segment::AnyDepth) {
                return Err(
                    "a '/' after a final '**' makes it match directories only; write '**' alone".into()
                );
            }
            segments.push(segment);
        }
        let glob = builder(&render(&segments, dir_only))?;
        let by_char = match segments.iter().any(|s| matches!(s, Segment::Wildcard(_, _, Some(_)))) {
            true => Some(anchored(&branch_regex(&segments, dir_only)?)?),
            false => None,
        };
        Ok(Branch { segments, dir_only, glob, by_char })
    }

    /// The branch's matcher by characters, if it has one ([`ByChar`]).
    pub fn by_char(&self) -> Option<&ByChar> {
        self.by_char.as_ref()
    }

    /// The whole branch as one glob, for the rule set's `GlobSet`.
    pub fn glob(&self) -> &Glob {
        &self.glob
    }

    /// Whether matching `dir/` names the directory itself: only branches ending in `/**` or
    /// `/` do (`/a/*` matching `/a/` through an empty `*` does not).
    pub fn covers_dir(&self) -> bool {
        self.dir_only || matches!(self.segments.last(), Some(Segment::AnyDepth))
    }

    /// Whether the branch begins with `**`, so that it may match beneath any directory.
    pub fn starts_anywhere(&self) -> bool {
        matches!(self.segments.first(), Some(Segment::AnyDepth))
    }

    /// The branch's leading literal components: a target must begin with them (as far as it
    /// goes) for the branch to reach its subtree (see [`Branch::reaches_subtree`]).
    pub fn literal_prefix(&self) -> impl Iterator<Item = &str> {
        self.segments.iter().map_while(|segment| match segment {
            Segment::Literal(name) => Some(name.as_str()),
            Segment::Wildcard(..) | Segment::AnyDepth => None,
        })
    }

    /// Whether the branch matches `dir` itself, spelled `dir` or `dir/`: the reference that
    /// `RuleSet`'s answer for every branch at once is tested against.
    #[cfg(test)]
    pub fn touches(&self, dir: &VPath) -> bool {
        let matcher = self.glob.compile_matcher();
        let matches = |text: &str| match &self.by_char {
            Some(chars) if !text.is_ascii() => chars.is_match(text),
            _ => matcher.is_match(text),
        };
        matches(dir.as_str()) || matches(&format!("{dir}/"))
    }

    /// Runs the branch's components over the target's as an automaton: if any state is
    /// alive after the last component, some path at or below the target can match. An
    /// ancestor that matches counts too (the subtree lies inside what the pattern names,
    /// as in Deep Agents' delete overlap table).
    pub fn reaches_subtree(&self, target: &VPath) -> bool {
        // A leading `**` stays alive over any components (below, state 0 never dies), so such
        // a branch reaches every subtree; the common `/**/NAME` rules need no walk.
        if self.starts_anywhere() {
            return true;
        }
        // The walk's first step, without its buffers: a leading literal that the target's
        // first component is not leaves no state alive (rules anchored elsewhere, by the
        // thousand, are rejected here).
        if let (Some(literal), Some(first)) = (self.literal_prefix().next(), target.components().next()) {
            if literal != first {
                return false;
            }
        }
        let n = self.segments.len();
        let closure = |states: &mut Vec<bool>| {
            for i in 0..n {
                if states[i] && matches!(self.segments[i], Segment::AnyDepth) {
                    states[i + 1] = true;
                }
            }
        };
        let mut states = vec![false; n + 1];
        let mut next = vec![false; n + 1];
        states[0] = true;
        closure(&mut states);
        for name in target.components() {
            next.fill(false);
            for i in (0..n).filter(|&i| states[i]) {
                match &self.segments[i] {
                    Segment::AnyDepth => next[i] = true,
                    Segment::Literal(literal) if literal == name => next[i + 1] = true,
                    Segment::Wildcard(_, _, Some(chars)) if !name.is_ascii() => {
                        if chars.is_match(name) {
                            next[i + 1] = true;
                        }
                    }
                    Segment::Wildcard(_, set, _) if set.is_match(name) => next[i + 1] = true,
                    Segment::Literal(_) | Segment::Wildcard(..) => {}
                }
            }
            closure(&mut next);
            if next[n] {
                return true;
            }
            if !next.contains(&true) {
                return false;
            }
            std::mem::swap(&mut states, &mut next);
        }
        true
    }

    fn anchor(&self) -> VPath {
        let mut anchor = VPath::root();
        for segment in &self.segments {
            match segment {
                Segment::Literal(name) => anchor = anchor.join(name),
                Segment::Wildcard(..) | Segment::AnyDepth => break,
            }
        }
        anchor
    }

    /// `Some(NAME)` when the branch is `/**/NAME` or `/**/NAME/**` with NAME one component
    /// that is not `**`: whether it matches an entry depends only on the entry's own trailing
    /// components, never on where the tree lies.
    pub fn is_position_free(&self) -> bool {
        let single = |s: &Segment| !matches!(s, Segment::AnyDepth);
        match self.segments.as_slice() {
            [Segment::AnyDepth, name] => single(name) && !self.dir_only,
            [Segment::AnyDepth, name, Segment::AnyDepth] => single(name),
            _ => false,
        }
    }
}

/// The matcher of one wildcard component. A name holds no `/`, so the glob is read without
/// `literal_separator`, which is what lets globset answer `*.ext` by extension.
fn component_set(part: &str) -> Result<GlobSet, String> {
    let glob = GlobBuilder::new(part).backslash_escape(true).build().map_err(|e| e.kind().to_string())?;
    GlobSetBuilder::new().add(glob).build().map_err(|e| e.to_string())
}

/// The name a component spells when it has no wildcard, with escapes removed.
fn unescaped_literal(part: &str) -> Option<String> {
    let mut name = String::new();
    let mut chars = part.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => name.push(chars.next()?),
            '*' | '?' | '[' => return None,
            c => name.push(c),
        }
    }
    Some(name)
}

/// The glob text of a branch: literals escaped, wildcard components as written.
///
/// A leading `**` followed by a component that cannot be empty is written without the root's
/// `/` (`**/NAME`, `**/*.pem`): globset answers that shape with a lookup by name or by
/// extension instead of a regex, which costs about 15 KiB per pattern in the set. It matches
/// the same paths, since every path asked about is absolute: `**/` may also match nothing
/// before the path's own leading `/`, which only a component matching the empty name could use.
fn render(segments: &[Segment], dir_only: bool) -> String {
    let never_empty = |segment: &Segment| match segment {
        Segment::Literal(_) => true,
        Segment::Wildcard(text, ..) => !text.chars().all(|c| c == '*'),
        Segment::AnyDepth => false,
    };
    let unrooted = matches!(segments, [Segment::AnyDepth, next, ..] if never_empty(next));
    let mut text = String::new();
    for (i, segment) in segments.iter().enumerate() {
        if i > 0 || !unrooted {
            text.push('/');
        }
        match segment {
            Segment::Literal(name) => {
                for c in name.chars() {
                    if matches!(c, '\\' | '*' | '?' | '[' | ']' | '{' | '}' | ',') {
                        text.push('\\');
                    }
                    text.push(c);
                }
            }
            Segment::Wildcard(glob, ..) => text.push_str(glob),
            Segment::AnyDepth => text.push_str("**"),
        }
    }
    if text.is_empty() || dir_only {
        text.push('/');
    }
    text
}

/// A wildcard component as a regex (unanchored, no `/` matched anywhere), and whether it has a
/// `?` or a class, the tokens globset reads by bytes ([`ByChar`]). Read as [`scan`] reads it:
/// `\` escapes the next character, and inside a class it is a plain member.
fn component_regex(part: &str) -> Result<(String, bool), String> {
    let mut out = String::new();
    let mut by_char = false;
    let mut i = 0;
    while let Some(c) = part[i..].chars().next() {
        match c {
            '\\' => {
                let escaped = part[i + 1..].chars().next().ok_or("a '\\' at the end escapes nothing")?;
                out.push_str(&regex::escape(escaped.encode_utf8(&mut [0; 4])));
                i += 1 + escaped.len_utf8();
            }
            '*' => {
                out.push_str("[^/]*");
                i += 1;
            }
            '?' => {
                out.push_str("[^/]");
                by_char = true;
                i += 1;
            }
            '[' => {
                let class = Class::parse(&part[i..]).ok_or("unclosed character class")?;
                out.push_str(&class.regex());
                by_char = true;
                i += class.len;
            }
            c => {
                out.push_str(&regex::escape(c.encode_utf8(&mut [0; 4])));
                i += c.len_utf8();
            }
        }
    }
    Ok((out, by_char))
}

/// A class as globset's parser reads it, parsed once for both questions asked of it: where it
/// ends ([`scan`]) and what it matches ([`Class::regex`]). `!` or `^` negates, a leading `]` or
/// `-` is a member, `x-y` is a range and a `-` right after a range ends it (`[a-c-e]` is `a` to
/// `e`), `[:name:]` is one of globset's ASCII classes, and `\` is a plain member.
struct Class {
    /// Its length in bytes, from the `[` to the closing `]` included.
    len: usize,
    negated: bool,
    ranges: Vec<(char, char)>,
}

impl Class {
    /// The class at the start of `text` (`text[0] == '['`), or `None` when it is not closed.
    fn parse(text: &str) -> Option<Class> {
        let body: Vec<(usize, char)> = text.char_indices().skip(1).collect();
        let negated = matches!(body.first(), Some((_, '!' | '^')));
        let mut i = usize::from(negated);
        let mut ranges: Vec<(char, char)> = Vec::new();
        let (mut first, mut in_range) = (true, false);
        loop {
            let &(at, c) = body.get(i)?;
            i += 1;
            match c {
                ']' if !first => {
                    if in_range {
                        // A `-` just before the closing `]` is a member.
                        ranges.push(('-', '-'));
                    }
                    return Some(Class { len: at + 1, negated, ranges });
                }
                ']' => ranges.push((']', ']')),
                '-' if first => ranges.push(('-', '-')),
                '-' if in_range => {
                    if let Some(last) = ranges.last_mut() {
                        last.1 = '-';
                    }
                    in_range = false;
                }
                '-' => in_range = true,
                '[' if !in_range && body.get(i).is_some_and(|&(_, c)| c == ':') => {
                    let rest: Vec<char> = body[i..].iter().take(12).map(|&(_, c)| c).collect();
                    match posix_class(&rest) {
                        Some((named, used)) => {
                            ranges.extend_from_slice(named);
                            i += used;
                        }
                        None => ranges.push(('[', '[')),
                    }
                    in_range = false;
                }
                c => {
                    match ranges.last_mut() {
                        Some(last) if in_range => last.1 = c,
                        _ => ranges.push((c, c)),
                    }
                    in_range = false;
                }
            }
            first = false;
        }
    }

    /// The class as a Unicode regex class: its ranges with `/` left out, as globset's
    /// `literal_separator` leaves it out of a class that is not negated and a negated one
    /// excludes it too. Each character is written as `\x{…}`.
    fn regex(&self) -> String {
        let members: String = self
            .ranges
            .iter()
            .map(|&(a, b)| match a == b {
                true => format!("\\x{{{:X}}}", a as u32),
                false => format!("\\x{{{:X}}}-\\x{{{:X}}}", a as u32, b as u32),
            })
            .collect();
        match self.negated {
            true => format!("[^/{members}]"),
            false => format!("[{members}&&[^/]]"),
        }
    }
}

/// A POSIX class name after a class's `[`: `text` starts at its `:`. Its ranges (globset's
/// ASCII definitions) and the characters it used, or `None` when it is none (the `[` is then
/// a plain member).
fn posix_class(text: &[char]) -> Option<(&'static [(char, char)], usize)> {
    let name: String = text.iter().skip(1).take_while(|c| c.is_ascii_lowercase()).collect();
    if name.len() > 8 || text.get(1 + name.len()..3 + name.len()) != Some(&[':', ']']) {
        return None;
    }
    let ranges: &'static [(char, char)] = match name.as_str() {
        "alnum" => &[('0', '9'), ('A', 'Z'), ('a', 'z')],
        "alpha" => &[('A', 'Z'), ('a', 'z')],
        "blank" => &[('\t', '\t'), (' ', ' ')],
        "cntrl" => &[('\x00', '\x1f'), ('\x7f', '\x7f')],
        "digit" => &[('0', '9')],
        "graph" => &[('!', '~')],
        "lower" => &[('a', 'z')],
        "print" => &[(' ', '~')],
        "punct" => &[('!', '/'), (':', '@'), ('[', '`'), ('{', '~')],
        "space" => &[('\t', '\r'), (' ', ' ')],
        "upper" => &[('A', 'Z')],
        "xdigit" => &[('0', '9'), ('A', 'F'), ('a', 'f')],
        _ => return None,
    };
    Some((ranges, 3 + name.len()))
}

/// The regex of a whole branch, as [`render`] writes its glob: `**` spans any number of
/// components, a trailing `/` (a directory only) stays.
fn branch_regex(segments: &[Segment], dir_only: bool) -> Result<String, String> {
    let mut out = String::new();
    for (i, segment) in segments.iter().enumerate() {
        match segment {
            Segment::AnyDepth if i + 1 == segments.len() => out.push_str("/.*"),
            Segment::AnyDepth => out.push_str("(?:/.*)?"),
            Segment::Literal(name) => {
                out.push('/');
                out.push_str(&regex::escape(name));
            }
            Segment::Wildcard(text, ..) => {
                out.push('/');
                out.push_str(&component_regex(text)?.0);
            }
        }
    }
    if segments.is_empty() || dir_only {
        out.push('/');
    }
    Ok(out)
}

/// `regex` matched against the whole text (`.` taking newlines too: names may hold them).
fn anchored(regex: &str) -> Result<ByChar, String> {
    Regex::new(&format!("(?s)^(?:{regex})$")).map(ByChar).map_err(|e| e.to_string())
}

/// Walks `text` the way globset's parser does, calling `visit(index, byte)` for each byte
/// that is outside any class and not escaped; classes and escapes are skipped whole.
fn scan(text: &str, mut visit: impl FnMut(usize, u8) -> Result<(), String>) -> Result<(), String> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => {
                let escaped = text[i + 1..].chars().next().ok_or("a '\\' at the end escapes nothing")?;
                if escaped == '/' {
                    return Err("'/' cannot be escaped: it always separates components".into());
                }
                i += 1 + escaped.len_utf8();
            }
            b'[' => {
                let len = Class::parse(&text[i..]).ok_or("unclosed character class")?.len;
                if text[i..i + len].contains('/') {
                    return Err("a character class never matches '/': split the pattern instead".into());
                }
                i += len;
            }
            b => {
                visit(i, b)?;
                i += 1;
            }
        }
    }
    Ok(())
}

/// Splits on the `/`s that separate components (not escaped, outside classes).
fn split_components(text: &str) -> Result<Vec<String>, String> {
    let mut parts = Vec::new();
    let mut start = 0;
    scan(text, |i, b| {
        if b == b'/' {
            parts.push(text[start..i].to_string());
            start = i + 1;
        }
        Ok(())
    })?;
    parts.push(text[start..].to_string());
    Ok(parts)
}

/// Expands the first top-level `{...}` of `text` (recursively), appending the results.
fn expand(text: &str, out: &mut Vec<String>) -> Result<(), String> {
    // Positions of the first group: its `{`, its top-level commas, its `}`.
    let (mut open, mut commas, mut close, mut depth) = (None, Vec::new(), None, 0usize);
    scan(text, |i, b| {
        match b {
            _ if close.is_some() => {}
            b'{' => {
                if depth == 0 {
                    open = Some(i);
                }
                depth += 1;
            }
            b',' if depth == 1 => commas.push(i),
            b'}' if depth == 0 => return Err("a '}' without its '{'".into()),
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    close = Some(i);
                }
            }
            _ => {}
        }
        Ok(())
    })?;
    let Some(open) = open else {
        out.push(text.to_string());
        return Ok(());
    };
    let close = close.ok_or("a '{' without its '}'")?;
    let bounds: Vec<usize> = std::iter::once(open).chain(commas).chain(std::iter::once(close)).collect();
    for pair in bounds.windows(2) {
        let alternative = format!("{}{}{}", &text[..open], &text[pair[0] + 1..pair[1]], &text[close + 1..]);
        expand(&alternative, out)?;
        if out.len() > MAX_BRANCHES {
            return Err(format!("its alternatives expand to more than {MAX_BRANCHES} patterns"));
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "pattern_tests.rs"]
mod tests;
