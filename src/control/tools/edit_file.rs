//! `edit_file`: exact-substring replacement with uniqueness (doc/tools.md), as Deep Agents'
//! FilesystemBackend does it (universal newlines on both the file and the strings), written
//! back atomically. Requires that this session read the current version (deviation 4) and
//! refuses a no-op edit (deviation 5).

use serde_json::{json, Value};

use super::common::{self, to_lf, Located};
use super::{args, Asks, ErrorCode, Listed, ToolEnv, ToolOutput, ToolSpec};
use crate::control::session::Version;
use crate::error::FsError;
use crate::policy::Op;

pub const SPEC: ToolSpec = ToolSpec {
    name: "edit_file",
    description,
    input_schema,
    read_only: false,
    destructive: false,
    asks: Asks::exact(Op::Write),
    call,
};

fn description(_listed: &Listed) -> String {
    "Performs exact string replacements in files.\n\
     \n\
     Usage:\n\
     - You must read the file before editing; this tool errors otherwise. If the file changed since you read it, the edit is refused; re-read it, then retry.\n\
     - Preserve the exact source indentation from the read output, and never include the read status header in old_string or new_string.\n\
     - old_string must match exactly once unless replace_all is true; add surrounding context to make it unique.\n\
     - Prefer editing an existing file over creating a new one.\n\
     - Only use emojis if the user explicitly requests it."
        .to_string()
}

fn input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "file_path": {
                "type": "string",
                "description": "Absolute path to the file to edit. Must be absolute, not relative."
            },
            "old_string": {
                "type": "string",
                "description": "The exact text to find and replace. Must be unique in the file unless replace_all is True."
            },
            "new_string": {
                "type": "string",
                "description": "The text to replace old_string with. Must be different from old_string."
            },
            "replace_all": {
                "type": "boolean",
                "default": false,
                "description": "If True, replace all occurrences of old_string. If False (default), old_string must be unique."
            }
        },
        "required": ["file_path", "old_string", "new_string"]
    })
}

struct Args {
    file_path: String,
    old_string: String,
    new_string: String,
    replace_all: bool,
}

fn parse(arguments: &Value) -> Result<Args, ToolOutput> {
    Ok(Args {
        file_path: args::string(arguments, "file_path")?,
        old_string: args::string(arguments, "old_string")?,
        new_string: args::string(arguments, "new_string")?,
        replace_all: args::opt_bool(arguments, "replace_all")?.unwrap_or(false),
    })
}

fn call(env: &ToolEnv, arguments: &Value) -> ToolOutput {
    let a = match parse(arguments) {
        Ok(a) => a,
        Err(e) => return e,
    };
    // FilesystemBackend reads the file with universal newlines, so `\r\n`/`\r` in the strings
    // are normalised the same way before matching.
    let (old, new) = (to_lf(&a.old_string), to_lf(&a.new_string));
    // Deviation 5: the schema's "must be different" is enforced like any argument check,
    // before the file is touched.
    if !old.is_empty() && old == new {
        return ToolOutput::error(
            ErrorCode::InvalidArgument,
            "Error: new_string must differ from old_string",
        );
    }
    let loc = match common::validate(&a.file_path).and_then(|named| {
        let loc = common::prepare(env, &named, Op::Write, false, false)?;
        common::require_dir(&named, &loc, |written, os_error| {
            format!("Error editing file '{written}': {os_error}")
        })?;
        Ok(loc)
    }) {
        Ok(loc) => loc,
        Err(e) => return e,
    };
    let attr = match common::regular_file(&loc) {
        Ok(attr) => attr,
        Err(e) => return e,
    };
    // Before the read-before-edit check: such a file cannot have been read whole either.
    if attr.size > common::MAX_TEXT_BYTES {
        return common::too_large_to_take_whole("edit", &loc.path, Some(attr.size));
    }
    if let Err(e) = common::check_observed(env, &loc, &attr, true) {
        return e;
    }
    let data = match env.fs.read(&loc.real, common::MAX_TEXT_BYTES) {
        Ok(d) => d,
        Err(e) if e.is(crate::error::Errno::EFBIG) => {
            return common::too_large_to_take_whole("edit", &loc.path, None)
        }
        Err(e) => return edit_error(&loc, &e),
    };
    let content = match std::str::from_utf8(&data) {
        Ok(text) => to_lf(text),
        Err(e) => {
            return ToolOutput::error(
                ErrorCode::NotText,
                format!("Error editing file '{}': {}", loc.path, common::py_utf8_error(&data, e)),
            )
        }
    };
    let (updated, occurrences) = match replace(&content, &old, &new, a.replace_all) {
        Ok(done) => done,
        Err((code, text)) => return ToolOutput::error(code, text),
    };
    match env.fs.write_atomic(&loc.real, updated.as_bytes(), u32::from(attr.perm)) {
        Ok(attr) => {
            env.session.observe(&loc.real, Version::of(&attr));
            ToolOutput::text(format!(
                "Successfully replaced {occurrences} instance(s) of the string in '{}'",
                loc.path
            ))
            .with("path", json!(loc.path.as_str()))
            .with("occurrences", json!(occurrences))
        }
        Err(e) => edit_error(&loc, &e),
    }
}

fn edit_error(loc: &Located, err: &FsError) -> ToolOutput {
    common::fs_failure(Op::Write, &loc.path, err, || {
        format!("Error editing file '{}': {}", loc.path, common::py_os_error(err, &loc.path))
    })
}

/// Deep Agents' `perform_string_replacement`: the new content and the number of
/// (non-overlapping) occurrences replaced, or the error text with its code.
pub fn replace(
    content: &str,
    old: &str,
    new: &str,
    replace_all: bool,
) -> Result<(String, usize), (ErrorCode, String)> {
    if old.is_empty() {
        return Err((
            ErrorCode::InvalidArgument,
            "Error: old_string cannot be empty. Provide the exact text to replace.".to_string(),
        ));
    }
    let occurrences = content.matches(old).count();
    if occurrences == 0 {
        // A common mismatch at the end of the file: the model added a line terminator the
        // file lacks. Say so precisely instead of relaxing the match.
        if let Some(stripped) = old.strip_suffix('\n') {
            if !stripped.is_empty() && content.ends_with(stripped) {
                let count = content.matches(stripped).count();
                let text = if count == 1 {
                    "Error: old_string ends with a newline, but the file does not end with a newline. Retry with the trailing newline removed from old_string (and from new_string if it also ends with a newline).".to_string()
                } else {
                    format!("Error: old_string ends with a newline, but the file does not end with a newline. With the trailing newline removed, old_string would appear {count} times in the file. Retry with the trailing newline removed and add surrounding context so the match is unique.")
                };
                return Err((ErrorCode::EditNotFound, text));
            }
        }
        return Err((ErrorCode::EditNotFound, format!("Error: String not found in file: '{old}'")));
    }
    if occurrences > 1 && !replace_all {
        return Err((
            ErrorCode::AmbiguousEdit,
            format!("Error: String '{old}' appears {occurrences} times in file. Use replace_all=True to replace all instances, or provide a more specific string with surrounding context."),
        ));
    }
    Ok((content.replace(old, new), occurrences))
}
