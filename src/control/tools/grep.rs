//! The `grep` tool: a literal (not regex) search across files, as Deep Agents' `grep` answers it
//! — three output modes, a total match cap whose hit is reported, a hint when the pattern looks
//! like a regex, and the 80 000-character body cap.
//!
//! Files are found by the shared parallel walk and searched in parallel, but matches are taken in
//! path order: a file's matches count only once every file before it is done, so the cap keeps
//! the first `max_count` matches in sorted order and the answer does not depend on scheduling.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use memchr::memmem;
use parking_lot::Mutex;
use serde_json::{json, Value};

use super::common::{self, char_len, MAX_CHARS, TRUNCATION_GUIDANCE};
use super::pattern;
use super::search::{self, Found, Root};
use super::{args, Asks, Depth, ErrorCode, Listed, ToolEnv, ToolOutput, ToolSpec};
use crate::control::vfs::ToolFs;
use crate::policy::{Mode, Op};
use crate::vpath::VPath;

pub const SPEC: ToolSpec = ToolSpec {
    name: "grep",
    description,
    input_schema,
    read_only: true,
    destructive: false,
    asks: Asks::bulk(Op::Read, "path", Depth::Subtree),
    call,
};

/// Matches returned when the call sets no `max_count` (Deep Agents' `grep_max_count`).
pub const DEFAULT_MAX_COUNT: usize = 1000;
/// A search still running after this returns what it has, flagged as truncated (Deep Agents'
/// `DEFAULT_GREP_TIMEOUT` for its filesystem backend).
pub const TIME_LIMIT: Duration = Duration::from_secs(15);
/// Larger files are not searched (Deep Agents' `max_file_size_bytes`).
pub const MAX_FILE_BYTES: u64 = 10 * 1024 * 1024;
/// A NUL byte in this much of a file's head marks it as binary.
const BINARY_PROBE: usize = 8192;

pub const NO_MATCHES: &str = "No matches found";
pub const TRUNCATION_NOTE: &str = "Note: the search stopped early (it hit its time limit or the maximum match count). The matches above are valid but incomplete. Narrow the search (a more specific pattern or a narrower path), or raise max_count, to see the rest.";
pub const REGEX_HINT: &str = "Note: grep matches literal text, not regex, so characters like `|`, `.*`, and `\\.` are searched verbatim. Search for the literal text you need instead; for `|` alternation, run a separate search per alternative.";

fn description(listed: &Listed) -> String {
    // The regex fallback names `execute`, so it is only offered when that tool is listed.
    let fallback = if listed.execute {
        "\n- If you genuinely need regex, use the execute tool with `rg '<regex>'` instead."
    } else {
        ""
    };
    format!(
        "Search for a LITERAL text pattern across files (NOT regex).

The pattern is matched verbatim: regex metacharacters are ordinary characters, not operators. To match any of several strings, run a separate grep for each; `grep(pattern=\"foo|bar\")` searches for the literal text \"foo|bar\", and `.*` or `\\.` match those characters literally.{fallback}

Returns matching files or content per `output_mode`. Offloaded large tool results live under the artifacts root (`/large_tool_results/` by default); grep that directory to search them when you do not know the exact path."
    )
}

fn input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Text pattern to search for (literal string, not regex)."},
            "path": {
                "type": ["string", "null"],
                "default": null,
                "description": "Directory to search in. Defaults to current working directory."
            },
            "glob": {
                "type": ["string", "null"],
                "default": null,
                "description": "Glob pattern (NOT regex) limiting which files are searched (e.g. '*.py', '*.ts'). A pattern without '/' matches the file name at any depth; a pattern containing '/' matches the search-root-relative path (e.g. 'src/**/*.py'). This is an in-tool file filter, not a call to the separate glob tool. Brace expansion (e.g. '*.{ts,tsx}') is supported."
            },
            "output_mode": {
                "type": "string",
                "enum": ["files_with_matches", "content", "count"],
                "default": "files_with_matches",
                "description": "Shape of the returned text. 'files_with_matches' (default): newline-separated matching file paths. 'content': matching lines grouped by file under a '<path>:' header, each line indented and formatted '<line_number>: <line text>' (only the matched line, no surrounding context). 'count': one '<path>: <match_count>' line per file."
            },
            "max_count": {
                "type": ["integer", "null"],
                "exclusiveMinimum": 0,
                "default": null,
                "description": "Optional cap on the total number of matches returned across all files. Leave unset to use the configured default. When the cap is hit, results are truncated and a note says so; narrow the pattern or path to see the rest."
            }
        },
        "required": ["pattern"],
        "additionalProperties": false
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OutputMode {
    FilesWithMatches,
    Content,
    Count,
}

fn call(env: &ToolEnv, args: &Value) -> ToolOutput {
    run(env, args, TIME_LIMIT)
}

/// The tool with its time limit given (tests shorten it).
pub fn run(env: &ToolEnv, args: &Value, time_limit: Duration) -> ToolOutput {
    let started = Instant::now();
    let (pattern, path_arg, glob_arg, mode, max_count) = match parse_args(args) {
        Ok(parsed) => parsed,
        Err(e) => return e,
    };
    // Only an explicit path is pre-checked; a pathless search is filtered result by result.
    let root = match path_arg {
        None => Root::Dir(VPath::root()),
        Some(p) => {
            let named = match common::validate(&p) {
                Ok(named) => named,
                Err(e) => return e,
            };
            match search::precheck(env, &named, "") {
                Ok(root) => root,
                Err(refusal) => return refusal,
            }
        }
    };
    // A refused filter is the backend's error, which Deep Agents returns without `Error: `.
    let glob = match glob_arg.as_deref().map(pattern::compile).transpose() {
        Ok(g) => g,
        Err(e) => return ToolOutput::error(ErrorCode::InvalidArgument, e),
    };
    let stop_at = started + time_limit;
    let (files, walk_cut, unreadable) = match root {
        Root::Missing => (Vec::new(), false, false),
        Root::File(file) => {
            let wanted = glob.as_ref().is_none_or(|g| g.is_match(file.name()));
            let mode = env.fs.mode(Op::Read, &file, false);
            let found =
                (wanted && mode != Mode::Deny).then(|| Found { target: file.clone(), path: file, mode });
            (found.into_iter().collect(), false, false)
        }
        Root::Dir(dir) => {
            let walked = search::walk(&env.fs, &dir, glob.as_ref(), stop_at);
            (walked.files, walked.out_of_time, walked.unreadable)
        }
    };
    let searcher = Searcher::new(&pattern, mode == OutputMode::Content, max_count);
    let outcome = search_files(&env.fs, &files, &searcher, mode, max_count, stop_at, env.structured);
    let truncated = outcome.truncated || walk_cut;
    let mut text = if outcome.taken == 0 { NO_MATCHES.to_string() } else { outcome.body.finish() };
    if truncated {
        text.push_str("\n\n");
        text.push_str(TRUNCATION_NOTE);
    } else if outcome.taken == 0 && looks_like_regex(&pattern) {
        text.push_str("\n\n");
        text.push_str(REGEX_HINT);
    }
    ToolOutput::text(text)
        .with("match_count", json!(outcome.taken))
        .with("files", json!(outcome.files))
        .with("truncated", json!(truncated))
        .with("unreadable", json!(unreadable))
}

type Parsed = (String, Option<String>, Option<String>, OutputMode, usize);

fn parse_args(args: &Value) -> Result<Parsed, ToolOutput> {
    let pattern = args::string(args, "pattern")?;
    let path = args::opt_string(args, "path")?;
    let glob = args::opt_string(args, "glob")?;
    let mode = match args::opt_string(args, "output_mode")?.as_deref() {
        None | Some("files_with_matches") => OutputMode::FilesWithMatches,
        Some("content") => OutputMode::Content,
        Some("count") => OutputMode::Count,
        Some(other) => {
            return Err(ToolOutput::error(
                ErrorCode::InvalidArgument,
                format!("Error: argument `output_mode` must be one of 'files_with_matches', 'content', 'count', got {other:?}"),
            ))
        }
    };
    let max_count = match args::opt_int(args, "max_count")? {
        None => DEFAULT_MAX_COUNT,
        Some(n) if n > 0 => usize::try_from(n).unwrap_or(usize::MAX),
        Some(n) => {
            return Err(ToolOutput::error(
                ErrorCode::InvalidArgument,
                format!("Error: argument `max_count` must be greater than 0, got {n}"),
            ))
        }
    };
    Ok((pattern, path, glob, mode, max_count))
}

/// Deep Agents' test for a pattern written as a regex: alternation, `.*`, `.+`, or a
/// backslash before a regex metacharacter or class letter.
pub fn looks_like_regex(pattern: &str) -> bool {
    let escaped =
        pattern.as_bytes().windows(2).any(|w| w[0] == b'\\' && b".wWdDsSbB(){}[]|+*?^$".contains(&w[1]));
    pattern.contains('|') || pattern.contains(".*") || pattern.contains(".+") || escaped
}

/// The first `n` code points of `s` (Python's `s[:n]`).
fn prefix_chars(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// A literal search in one file's bytes, line by line (lines end at `\n` only).
struct Searcher {
    finder: memmem::Finder<'static>,
    /// The empty pattern matches every line.
    empty: bool,
    /// A pattern with a newline can never lie within one line.
    impossible: bool,
    want_lines: bool,
    /// Stop a file after this many matching lines: one past the total cap proves there are more.
    cap: usize,
}

/// What searching one file found.
enum Scan {
    /// Not searched: unreadable, binary, too large, or not to be opened.
    Skipped,
    /// Matching lines (at most the cap), and for content mode their numbers and text.
    Hits { count: usize, lines: Vec<(usize, String)> },
}

impl Searcher {
    fn new(pattern: &str, want_lines: bool, max_count: usize) -> Searcher {
        Searcher {
            finder: memmem::Finder::new(pattern.as_bytes()).into_owned(),
            empty: pattern.is_empty(),
            impossible: pattern.contains('\n'),
            want_lines,
            cap: max_count.saturating_add(1),
        }
    }

    fn scan(&self, data: &[u8]) -> Scan {
        if memchr::memchr(0, &data[..data.len().min(BINARY_PROBE)]).is_some() {
            return Scan::Skipped;
        }
        if self.impossible {
            return Scan::Hits { count: 0, lines: Vec::new() };
        }
        let mut spans = Vec::new();
        let (mut count, mut pos, mut line_no, mut counted) = (0, 0, 1, 0);
        while pos < data.len() && count < self.cap {
            let at = if self.empty {
                pos
            } else {
                match self.finder.find(&data[pos..]) {
                    Some(offset) => pos + offset,
                    None => break,
                }
            };
            // `pos` is always the start of a line, so the match's line starts after the last
            // newline between them.
            let start = memchr::memrchr(b'\n', &data[pos..at]).map_or(pos, |i| pos + i + 1);
            let end = memchr::memchr(b'\n', &data[at..]).map_or(data.len(), |i| at + i);
            count += 1;
            if self.want_lines {
                line_no += data[counted..start].iter().filter(|&&b| b == b'\n').count();
                counted = start;
                spans.push((line_no, start, end));
            }
            pos = end + 1;
        }
        // Text that is not UTF-8 is binary to Deep Agents; only files with matches need the check.
        let Ok(text) = (if count > 0 { std::str::from_utf8(data) } else { Ok("") }) else {
            return Scan::Skipped;
        };
        // No line can show more than the whole body cap, so longer ones are clipped here.
        let lines = spans
            .into_iter()
            .map(|(n, s, e)| (n, prefix_chars(&text[s..e], MAX_CHARS + 1).to_string()))
            .collect();
        Scan::Hits { count, lines }
    }
}

/// Reads a file through the engine and scans it.
fn search_file(fs: &ToolFs, found: &Found, searcher: &Searcher) -> Scan {
    // An interrupt-mode file its approval does not cover cannot be opened; asking would only
    // be refused.
    if found.mode != Mode::Allow {
        return Scan::Skipped;
    }
    let Ok(handle) = fs.engine.open(&fs.ctx, &found.target, libc::O_RDONLY) else { return Scan::Skipped };
    let Ok(attr) = handle.file.getattr() else { return Scan::Skipped };
    if attr.size > MAX_FILE_BYTES {
        return Scan::Skipped;
    }
    // One byte more than the size tells a file that grew meanwhile, which is then read on.
    let Ok(mut data) = fs.engine.read(&handle, 0, attr.size as u32 + 1) else { return Scan::Skipped };
    if data.len() as u64 > attr.size {
        loop {
            match fs.engine.read(&handle, data.len() as u64, 1 << 20) {
                Ok(chunk) if chunk.is_empty() => break,
                Ok(chunk) => data.extend_from_slice(&chunk),
                Err(_) => return Scan::Skipped,
            }
            if data.len() as u64 > MAX_FILE_BYTES {
                return Scan::Skipped;
            }
        }
    }
    searcher.scan(&data)
}

/// The text body, kept only up to the cap (what lies past it is never shown).
struct Body {
    text: String,
    chars: usize,
    over: bool,
}

impl Body {
    fn new() -> Body {
        Body { text: String::new(), chars: 0, over: false }
    }

    fn line(&mut self, line: &str) {
        if !self.text.is_empty() {
            self.push("\n");
        }
        self.push(line);
    }

    fn push(&mut self, s: &str) {
        if self.over {
            return;
        }
        let n = char_len(s);
        if self.chars + n > MAX_CHARS {
            self.text.push_str(prefix_chars(s, MAX_CHARS - self.chars));
            self.over = true;
        } else {
            self.text.push_str(s);
        }
        self.chars += n;
    }

    /// Deep Agents' `truncate_if_too_long` on the formatted matches.
    fn finish(self) -> String {
        if !self.over {
            return self.text;
        }
        let keep = MAX_CHARS - TRUNCATION_GUIDANCE.len() - 1;
        format!("{}\n{TRUNCATION_GUIDANCE}", prefix_chars(&self.text, keep))
    }
}

/// The results in path order: files are taken as soon as all before them are done.
struct Ordered<'a> {
    files: &'a [Found],
    done: Vec<Option<Scan>>,
    next: usize,
    taken: usize,
    max_count: usize,
    mode: OutputMode,
    truncated: bool,
    /// Nothing after this can change the answer.
    settled: bool,
    body: Body,
    summary: Vec<Value>,
    /// Each file's summary carries its matching lines' text too (a structured call).
    with_text: bool,
}

impl Ordered<'_> {
    fn settle(&mut self) {
        while !self.settled && self.next < self.files.len() {
            let Some(scan) = self.done[self.next].take() else { return };
            if let Scan::Hits { count, lines } = scan {
                if count > 0 {
                    let room = self.max_count - self.taken;
                    if room == 0 {
                        // A match past the cap: there are more than `max_count`.
                        self.truncated = true;
                        self.settled = true;
                        return;
                    }
                    let take = count.min(room);
                    let files = self.files;
                    self.render(&files[self.next].path, take, &lines);
                    self.taken += take;
                    if count > room {
                        self.truncated = true;
                        self.settled = true;
                        return;
                    }
                }
            }
            self.next += 1;
        }
    }

    fn render(&mut self, path: &VPath, take: usize, lines: &[(usize, String)]) {
        match self.mode {
            OutputMode::FilesWithMatches => self.body.line(path.as_str()),
            OutputMode::Count => self.body.line(&format!("{path}: {take}")),
            OutputMode::Content => {
                self.body.line(&format!("{path}:"));
                for (n, text) in &lines[..take.min(lines.len())] {
                    self.body.line(&format!("  {n}: {text}"));
                }
            }
        }
        let mut entry = json!({"path": path.as_str(), "count": take});
        if self.mode == OutputMode::Content {
            entry["lines"] = json!(lines.iter().take(take).map(|(n, _)| n).collect::<Vec<_>>());
            if self.with_text {
                let matches: Vec<Value> =
                    lines.iter().take(take).map(|(n, text)| json!({"line": n, "text": text})).collect();
                entry["matches"] = Value::Array(matches);
            }
        }
        self.summary.push(entry);
    }
}

struct Outcome {
    taken: usize,
    truncated: bool,
    body: Body,
    files: Vec<Value>,
}

/// Searches `files` (sorted) in parallel; stops once the answer is known or at `stop_at`.
fn search_files(
    fs: &ToolFs,
    files: &[Found],
    searcher: &Searcher,
    mode: OutputMode,
    max_count: usize,
    stop_at: Instant,
    with_text: bool,
) -> Outcome {
    let ordered = Mutex::new(Ordered {
        files,
        done: (0..files.len()).map(|_| None).collect(),
        next: 0,
        taken: 0,
        max_count,
        mode,
        truncated: false,
        settled: false,
        body: Body::new(),
        summary: Vec::new(),
        with_text,
    });
    let next_index = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let out_of_time = AtomicBool::new(false);
    let workers = search::worker_count().min(files.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let i = next_index.fetch_add(1, Ordering::Relaxed);
                    if i >= files.len() {
                        break;
                    }
                    if Instant::now() >= stop_at {
                        out_of_time.store(true, Ordering::Relaxed);
                        stop.store(true, Ordering::Relaxed);
                        break;
                    }
                    let scan = search_file(fs, &files[i], searcher);
                    let mut o = ordered.lock();
                    o.done[i] = Some(scan);
                    o.settle();
                    if o.settled {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let mut o = ordered.into_inner();
    o.settle();
    // Out of time with files left unsearched: what was found is valid but incomplete.
    let cut_short = out_of_time.into_inner() && !o.settled && o.next < files.len();
    Outcome { taken: o.taken, truncated: o.truncated || cut_short, body: o.body, files: o.summary }
}
