//! `write_file`: creates a file or replaces it whole (doc/tools.md), atomically (temp file,
//! fsync, rename), creating missing parent directories.
//!
//! Read-before-write: overwriting a file this session read at another version is refused
//! (`FS_STALE_VERSION`). Overwriting an existing file the session never read is allowed:
//! Deep Agents' contract for this tool is "You do not need to read the file first", and
//! TOOLS.md deviation 4 makes only `edit_file` require a read. A blind overwrite replaces
//! the whole content, so nothing the model did not mean to write survives anyway; what the
//! check guards against is acting on a stale picture of a file the model *did* look at.

use serde_json::{json, Value};

use super::common::{self, Located};
use super::{args, Asks, Listed, ToolEnv, ToolOutput, ToolSpec};
use crate::backend::FileKind;
use crate::control::session::Version;
use crate::error::{Errno, FsError};
use crate::policy::Op;

pub const SPEC: ToolSpec = ToolSpec {
    name: "write_file",
    description,
    input_schema,
    read_only: false,
    destructive: false,
    asks: Asks::exact(Op::Write),
    call,
};

fn description(_listed: &Listed) -> String {
    "Writes content to a file. Creates the file if it does not exist; replaces it entirely if it does.\n\
     \n\
     Usage:\n\
     - Use this tool when you intend to create a new file or replace the whole file. You do not need to read the file first.\n\
     - If you did read the file and it has changed since, the write is refused; re-read it, then retry.\n\
     - Missing parent directories are created.\n\
     - Prefer to edit existing files (with the edit_file tool) over creating new ones when possible.\n"
        .to_string()
}

fn input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "file_path": {
                "type": "string",
                "description": "Absolute path where the file should be written. Must be absolute, not relative."
            },
            "content": {
                "type": "string",
                "description": "The text content to write to the file. This parameter is required."
            }
        },
        "required": ["file_path", "content"]
    })
}

fn call(env: &ToolEnv, arguments: &Value) -> ToolOutput {
    let parsed =
        args::string(arguments, "file_path").and_then(|p| Ok((p, args::string(arguments, "content")?)));
    let (raw, content) = match parsed {
        Ok(v) => v,
        Err(e) => return e,
    };
    let named = match common::validate(&raw) {
        Ok(p) => p,
        Err(e) => return e,
    };
    let path = &named.path;
    if let Err(e) = common::refuse_route_root(env, path, "overwritten") {
        return e;
    }
    let wording = |written: &str, os_error: &str| format!("Error writing file '{written}': {os_error}");
    let loc = match common::precheck(env, Op::Write, path, false)
        .and_then(|_| common::locate(env, Op::Write, path, true, true))
        .and_then(|loc| common::check_target(env, Op::Write, &loc, false).map(|_| loc))
        .and_then(|loc| common::require_dir(&named, &loc, wording).map(|_| loc))
    {
        Ok(loc) => loc,
        Err(e) => return e,
    };
    // A file cannot be created under a name written as a directory (`open("new/", O_CREAT)`).
    if named.must_be_dir && loc.attr.is_none() {
        return common::written_as_dir(Errno::EISDIR, path, wording);
    }
    let mut mode = 0o644;
    if let Some(attr) = &loc.attr {
        if attr.kind == FileKind::Dir {
            return write_error(&loc, &FsError::errno(Errno::EISDIR));
        }
        if let Err(e) = common::check_observed(env, &loc, attr, false) {
            return e;
        }
        // A replaced file keeps its permission bits.
        mode = u32::from(attr.perm);
    }
    match env.fs.write_atomic(&loc.real, content.as_bytes(), mode) {
        Ok(attr) => {
            // The session has seen what it wrote.
            env.session.observe(&loc.real, Version::of(&attr));
            ToolOutput::text(format!("Updated file {}", loc.path))
                .with("path", json!(loc.path.as_str()))
                .with("size", json!(attr.size))
        }
        Err(e) => write_error(&loc, &e),
    }
}

/// FilesystemBackend's wording, passed through verbatim by Deep Agents (no `Error: `).
fn write_error(loc: &Located, err: &FsError) -> ToolOutput {
    common::fs_failure(Op::Write, &loc.path, err, || {
        format!("Error writing file '{}': {}", loc.path, common::py_os_error(err, &loc.path))
    })
}
