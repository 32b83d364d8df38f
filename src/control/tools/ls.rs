//! `ls`: the direct children of a directory, as Deep Agents renders them (doc/tools.md): the
//! Python repr of the sorted paths, directories ending in `/`.

use serde_json::{json, Value};

use super::common::{self, format_file_paths, iso8601, Located};
use super::{args, Asks, Depth, ErrorCode, Listed, ToolEnv, ToolOutput, ToolSpec};
use crate::backend::{Attr, FileKind};
use crate::policy::Op;

pub const SPEC: ToolSpec = ToolSpec {
    name: "ls",
    description,
    input_schema,
    read_only: true,
    destructive: false,
    asks: Asks::bulk(Op::Read, "path", Depth::Entries),
    call,
};

fn description(_listed: &Listed) -> String {
    "Lists all files in a directory.\n\
     \n\
     This is useful for exploring the filesystem and finding the right file to read or edit.\n\
     You should almost ALWAYS use this tool before using the read_file or edit_file tools.\n\
     \n\
     Usage:\n\
     - Returns the absolute paths of the direct children, sorted; directories end with `/`.\n\
     - Paths hidden by the filesystem's rules are not listed."
        .to_string()
}

fn input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "description": "Absolute path to the directory to list. Must be absolute, not relative."
            }
        },
        "required": ["path"]
    })
}

/// One listed child.
struct Entry {
    /// Display path; directories end with `/`.
    path: String,
    is_dir: bool,
    size: u64,
    attr: Attr,
}

fn call(env: &ToolEnv, arguments: &Value) -> ToolOutput {
    let raw = match args::string(arguments, "path") {
        Ok(p) => p,
        Err(e) => return e,
    };
    // A listed path is a directory, so it is judged as `dir/` as well (deviation 11). Anything
    // else answers `not_a_directory` below, with or without a trailing `/`.
    let loc =
        match common::validate(&raw).and_then(|named| common::prepare(env, &named, Op::Read, true, false)) {
            Ok(loc) => loc,
            Err(e) => return e,
        };
    let path = &loc.path;
    match loc.kind() {
        None => {
            return ToolOutput::error(ErrorCode::NotFound, format!("Error: Path '{path}': path_not_found"));
        }
        Some(FileKind::Dir) => {}
        Some(_) => {
            return ToolOutput::error(
                ErrorCode::NotDirectory,
                format!("Error: Path '{path}': not_a_directory"),
            );
        }
    }
    let entries = match list(env, &loc) {
        Ok(entries) => entries,
        Err(e) => return e,
    };
    let paths: Vec<String> = entries.iter().map(|e| e.path.clone()).collect();
    let (text, kept) = format_file_paths(paths);
    // A structured caller gets every entry: it renders (and truncates) the listing itself.
    let shown = if env.structured { entries.len() } else { kept.unwrap_or(entries.len()) };
    let structured: Vec<Value> = entries[..shown]
        .iter()
        .map(|e| json!({"path": e.path, "is_dir": e.is_dir, "size": e.size, "modified_at": iso8601(e.attr.mtime)}))
        .collect();
    ToolOutput::text(text).with("entries", Value::Array(structured)).with("truncated", json!(kept.is_some()))
}

/// The visible children of the directory at `loc`, shown under the path the caller named,
/// sorted by display path. Hidden entries never come back from the engine. A symlink is
/// shown with its target's kind, and left out when its target cannot be reached or is hidden
/// (Deep Agents drops entries it cannot resolve or whose target is denied).
fn list(env: &ToolEnv, loc: &Located) -> Result<Vec<Entry>, ToolOutput> {
    let children = env.fs.list(&loc.real).map_err(|e| {
        common::fs_failure(Op::Read, &loc.path, &e, || format!("Error: Cannot list '{}': {e}", loc.path))
    })?;
    let mut entries = Vec::with_capacity(children.len());
    for (name, attr) in children {
        let shown = loc.path.join(&name);
        let attr = if attr.kind == FileKind::Symlink {
            match env.fs.resolve(&loc.real.join(&name), true) {
                Ok(r) => match r.attr {
                    Some(target) if env.fs.engine.gate.is_visible(&r.path, target.kind == FileKind::Dir) => {
                        target
                    }
                    _ => continue,
                },
                Err(_) => continue,
            }
        } else {
            attr
        };
        let is_dir = attr.kind == FileKind::Dir;
        let path = if is_dir { format!("{shown}/") } else { shown.to_string() };
        entries.push(Entry { path, is_dir, size: if is_dir { 0 } else { attr.size }, attr });
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(entries)
}
