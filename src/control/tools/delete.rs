//! `delete`: removes a file, a symlink (never its target) or a whole directory tree
//! (doc/tools.md), judged first by Deep Agents' delete rules: a plain file by the
//! first matching write rule, anything that may have descendants by every deny-write
//! pattern that could reach into its subtree. Each removal then passes the gate again.

use serde_json::{json, Value};

use super::common::{self, Located};
use super::{args, Asks, Depth, ErrorCode, Listed, ToolEnv, ToolOutput, ToolSpec};
use crate::error::Errno;
use crate::policy::{Mode, Op};
use crate::vpath::VPath;

pub const SPEC: ToolSpec = ToolSpec {
    name: "delete",
    description,
    input_schema,
    read_only: false,
    destructive: true,
    asks: Asks::bulk(Op::Write, "file_path", Depth::Subtree),
    call,
};

fn description(_listed: &Listed) -> String {
    "Deletes a file or directory from the filesystem.\n\
     \n\
     Usage:\n\
     - Permanently removes the file or directory at the given absolute path.\n\
     - Deleting a directory removes it and everything inside it, recursively. Prefer\n  \
     deleting a directory in one call over deleting each file individually.\n\
     - Deleting a symlink removes the link, not what it points to.\n\
     - The root `/` and route mount points cannot be deleted.\n\
     - This cannot be undone, so only delete paths you are sure are no longer needed.\n"
        .to_string()
}

fn input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "file_path": {
                "type": "string",
                "description": "Absolute path to the file to delete. Must be absolute, not relative."
            }
        },
        "required": ["file_path"]
    })
}

fn call(env: &ToolEnv, arguments: &Value) -> ToolOutput {
    let raw = match args::string(arguments, "file_path") {
        Ok(p) => p,
        Err(e) => return e,
    };
    let named = match common::validate(&raw) {
        Ok(p) => p,
        Err(e) => return e,
    };
    let path = named.path.clone();
    if let Err(e) = common::refuse_route_root(env, &path, "deleted") {
        return e;
    }
    // The last component is not followed: deleting a link removes the link. Symlinked
    // ancestors are followed, and the path they lead to is judged too.
    let loc = match common::locate(env, Op::Write, &path, false, false) {
        Ok(loc) => loc,
        Err(e) => return e,
    };
    if let Err(e) = check(env, &loc) {
        return e;
    }
    if loc.attr.is_none() {
        return not_found(&path);
    }
    // `file.txt/` names a directory: unlink and rmdir answer ENOTDIR, and so does the tool.
    if let Err(e) = common::require_dir(&named, &loc, |written, os_error| {
        format!("Error deleting '{written}': {os_error}")
    }) {
        return e;
    }
    if loc.real != loc.path {
        if let Err(e) = common::refuse_route_root(env, &loc.real, "deleted") {
            return e;
        }
    }
    // Stopped when the client goes: nobody would learn what was removed.
    match env.fs.remove_tree(&loc.real, &|| !env.session.replies.is_closed()) {
        Ok(()) => {
            env.session.forget(&loc.real);
            ToolOutput::text(format!("Deleted {path}")).with("path", json!(path.as_str()))
        }
        // Deleted meanwhile by another caller: the same answer as a moment later.
        Err(e) if e.is(Errno::ENOENT) && e.denied_by.is_none() => not_found(&path),
        Err(e) => common::fs_failure(Op::Write, &path, &e, || {
            format!("Error deleting '{path}': {}", common::py_os_error(&e, &path))
        }),
    }
}

fn not_found(path: &VPath) -> ToolOutput {
    ToolOutput::error(ErrorCode::NotFound, format!("Error: '{path}' not found"))
}

/// The delete permission check (doc/tools.md). Only a confirmed non-directory is a leaf; a
/// directory (even an empty one) or a missing path may have descendants.
fn check(env: &ToolEnv, loc: &Located) -> Result<(), ToolOutput> {
    let has_descendants = loc.attr.is_none() || loc.is_dir();
    let denying = deny_patterns(env, &loc.path, has_descendants);
    if !denying.is_empty() {
        audit(env, &loc.path);
        return Err(ToolOutput::error(
            ErrorCode::PermissionDenied,
            format!(
                "Error: permission denied for write on {} (matches deny rule(s): {})",
                loc.path,
                listed(&denying)
            ),
        ));
    }
    if loc.real != loc.path && !deny_patterns(env, &loc.real, has_descendants).is_empty() {
        audit(env, &loc.real);
        return Err(common::permission_denied_resolved(Op::Write, &loc.path, &loc.real));
    }
    Ok(())
}

/// At most this many patterns are named in a refusal: thousands of rules may reach a
/// directory, and the agent reads the whole text.
const PATTERNS_NAMED: usize = 20;

/// The patterns, comma-separated, the first [`PATTERNS_NAMED`] of them and how many more.
fn listed(patterns: &[String]) -> String {
    match patterns.len().checked_sub(PATTERNS_NAMED) {
        Some(more) if more > 0 => format!("{}, and {more} more", patterns[..PATTERNS_NAMED].join(", ")),
        _ => patterns.join(", "),
    }
}

/// Records the refused delete (as a write on `path`, with the rule that decides it there).
fn audit(env: &ToolEnv, path: &VPath) {
    let mut verdict = env.fs.decide(Op::Write, path, true);
    verdict.mode = Mode::Deny;
    env.fs.audit_refusal(Op::Write, path, verdict);
}

/// The deny-write patterns that block deleting `target`.
///
/// A leaf is judged like a write: the first rule (in order) that matches decides, and only a
/// deny yields its matching patterns. A subtree is judged against every deny-write pattern
/// that could match the target or anything beneath it, whatever the rule order: an earlier
/// allow cannot vouch for every descendant.
pub fn deny_patterns(env: &ToolEnv, target: &VPath, has_descendants: bool) -> Vec<String> {
    let rules = env.fs.engine.gate.rules();
    if has_descendants {
        return rules
            .overlapping_patterns(target, &[Op::Write], &[Mode::Deny])
            .into_iter()
            .map(str::to_string)
            .collect();
    }
    let verdict = rules.decide(Op::Write, target, false);
    let Some(index) = verdict.rule.filter(|_| verdict.mode == Mode::Deny) else {
        return Vec::new();
    };
    let rule = &rules.rules()[index];
    let matching: Vec<String> =
        rules.matching_patterns(index, target).into_iter().map(str::to_string).collect();
    if matching.is_empty() {
        rule.paths.clone()
    } else {
        matching
    }
}
