//! The `glob` tool: files whose name or root-relative path matches a pattern, as Deep Agents'
//! `glob` returns them (a Python list repr of absolute paths, sorted), with its pre-check,
//! busy refusal, time bound and truncation notes.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::search::{self, Root, Slots};
use super::{args, Asks, Depth, ErrorCode, Listed, ToolEnv, ToolOutput, ToolSpec};
use super::{common, pattern};
use crate::policy::{Mode, Op};

pub const SPEC: ToolSpec = ToolSpec {
    name: "glob",
    description,
    input_schema,
    read_only: true,
    destructive: false,
    asks: Asks::bulk(Op::Read, "path", Depth::Subtree),
    call,
};

/// At most this many glob calls run at once (Deep Agents' `BoundedSemaphore(4)`); more are
/// refused rather than queued, so a burst of broad globs cannot pile up behind each other.
pub const MAX_IN_FLIGHT: usize = 4;
static IN_FLIGHT: Slots = Slots::new(MAX_IN_FLIGHT);

/// How long a glob may take.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The walk stops here and returns what it found, with the time-limit note (the budget of
    /// Deep Agents' FilesystemBackend).
    pub budget: Duration,
    /// A call still running here (a backend stuck in one request) is answered with the
    /// timeout error instead (Deep Agents' `GLOB_TIMEOUT`).
    pub deadline: Duration,
}

pub const LIMITS: Limits = Limits { budget: Duration::from_secs(5), deadline: Duration::from_secs(10) };

pub const BUSY: &str =
    "Error: too many glob calls are already running. Try again later with a more specific pattern or a narrower path.";
pub const PATHLESS_DENIED_HINT: &str = ". A glob without 'path' is authorized against the backend's default root, not the directories named in 'pattern'. Retry with an explicit 'path' inside an allowed directory and a 'pattern' relative to it.";
pub const TRUNCATION_NOTE: &str = "Note: the search stopped early because it hit its time or size limit. The paths above are valid but incomplete. Narrow the search (a more specific pattern or a narrower path) to see the rest.";
pub const UNREADABLE_NOTE: &str = "Note: some directories could not be read, so the paths above are valid but incomplete. Narrowing the search will NOT reveal the missing files -- they are inaccessible. Continue with what is listed, or report the access problem rather than retrying.";

/// Deep Agents' timeout text, which prints the deadline as a Python float (`10.0`).
pub fn timeout_message(deadline: Duration) -> String {
    format!(
        "Error: glob timed out after {:?}s. Try a more specific pattern or a narrower path.",
        deadline.as_secs_f64()
    )
}

fn description(_listed: &Listed) -> String {
    "Find files matching a glob pattern, returning absolute paths.

Supports `*` (any characters within a path segment), `**` (any directories), `?` (single character), `[abc]` (one character from a set), and `{a,b}` (alternatives), e.g. `*.py`, `src/**/*.py`, `*.{yml,yaml}`.

A pattern without `/` matches the file name at any depth under the search root (`*.py` matches `src/app/main.py`). A pattern containing `/` matches the search-root-relative path (`src/**/*.py`). A leading `/` anchors to the search root (`/*.py` matches only top-level Python files).

Leading-dot names are only matched when the pattern segment itself starts with `.` (use `.env`, or `.github/**/*.yml`). Because `**` will not descend into dot-directories, the bare form `*.yml` is *broader* than `**/*.yml` and is usually what you want."
        .to_string()
}

fn input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "pattern": {
                "type": "string",
                "description": "Glob pattern to match files (e.g., '*.py', '**/*.py', '/subdir/**/*.md'). A pattern without '/' matches the file name at any depth; a pattern containing '/' matches the search-root-relative path; a leading '/' anchors to the search root ('/*.py' matches only top-level files). Leading-dot names are excluded unless the pattern segment starts with '.', so prefer the bare form '*.py' over '**/*.py' -- '**' will not descend into dot-directories like '.github'."
            },
            "path": {
                "type": ["string", "null"],
                "default": null,
                "description": "Base directory to search from. Defaults to the backend's default root."
            }
        },
        "required": ["pattern"],
        "additionalProperties": false
    })
}

fn call(env: &ToolEnv, args: &Value) -> ToolOutput {
    run(env, args, &IN_FLIGHT, LIMITS)
}

/// The tool with its slot pool and time limits given (tests use their own).
pub fn run(env: &ToolEnv, args: &Value, slots: &Slots, limits: Limits) -> ToolOutput {
    let started = Instant::now();
    let pattern = match args::string(args, "pattern") {
        Ok(p) => p,
        Err(e) => return e,
    };
    let path_arg = match args::opt_string(args, "path") {
        Ok(p) => p,
        Err(e) => return e,
    };
    let named = match common::validate(path_arg.as_deref().unwrap_or("/")) {
        Ok(p) => p,
        Err(e) => return e,
    };
    let hint = if path_arg.is_none() { PATHLESS_DENIED_HINT } else { "" };
    let root = match search::precheck(env, &named, hint) {
        Ok(root) => root,
        Err(refusal) => return refusal,
    };
    let Some(_slot) = slots.try_acquire() else {
        return ToolOutput::error(ErrorCode::Busy, BUSY);
    };
    let glob = match pattern::compile(&pattern) {
        Ok(g) => g,
        Err(e) => return ToolOutput::error(ErrorCode::InvalidArgument, format!("Error: {e}")),
    };
    // A file or a missing path has no files beneath it (FilesystemBackend answers empty).
    let walked = match root {
        Root::Dir(dir) => search::walk(&env.fs, &dir, Some(&glob), started + limits.budget),
        Root::File(_) | Root::Missing => search::Walked::default(),
    };
    if started.elapsed() > limits.deadline {
        return ToolOutput::error(ErrorCode::Timeout, timeout_message(limits.deadline));
    }
    // Interrupt-mode matches are kept, as Deep Agents keeps them (the approval, if any, was
    // about the call); only denied ones were dropped by the walk.
    let paths: Vec<String> =
        walked.files.iter().filter(|f| f.mode != Mode::Deny).map(|f| f.path.to_string()).collect();
    // At most this many paths fit the cap (each costs at least `'/x', `), so only they are kept
    // for the structured result rather than copying a huge list.
    let mut head: Vec<String> = paths.iter().take(common::MAX_CHARS / 6).cloned().collect();
    let total = paths.len();
    // A structured caller gets every match: it renders (and truncates) the list itself.
    let all: Option<Vec<Value>> =
        env.structured.then(|| paths.iter().map(|p| json!({"path": p, "is_dir": false})).collect());
    let (mut text, kept) = common::format_file_paths(paths);
    head.truncate(kept.unwrap_or(total));
    let cut = kept.is_some();
    let reason = if walked.unreadable {
        Some("unreadable")
    } else if walked.out_of_time {
        Some("budget")
    } else {
        None
    };
    if let Some(reason) = reason {
        text.push_str("\n\n");
        text.push_str(if reason == "unreadable" { UNREADABLE_NOTE } else { TRUNCATION_NOTE });
    }
    let output = match all {
        Some(all) => ToolOutput::text(text).with("matches", Value::Array(all)),
        None => ToolOutput::text(text),
    };
    output
        .with("paths", json!(head))
        .with("truncated", json!(reason.is_some() || cut))
        .with("truncation_reason", json!(reason.or(cut.then_some("size"))))
}

#[cfg(test)]
#[path = "tests_search.rs"]
mod tests;
