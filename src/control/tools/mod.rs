//! The agent tools (one file each) and what they share: the result type, the registry that
//! lists them in a fixed order, and the dispatcher.

pub mod common;
pub mod delete;
pub mod edit_file;
pub mod execute;
pub mod glob;
pub mod grep;
pub mod ls;
pub mod offload;
pub mod pattern;
pub mod read_file;
pub mod search;
pub mod write_file;

use serde_json::{json, Value};

use crate::control::session::Session;
use crate::control::vfs::ToolFs;
pub use crate::engine::survey::Depth;
use crate::policy::Op;

/// The closed set of machine-readable error codes (`structuredContent.error_code`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    NotFound,
    PermissionDenied,
    InterruptRejected,
    InterruptTimeout,
    NotObserved,
    StaleVersion,
    AmbiguousEdit,
    EditNotFound,
    NotText,
    IsDirectory,
    NotDirectory,
    InvalidPath,
    InvalidArgument,
    Exists,
    Busy,
    Timeout,
    TooLarge,
    Unsupported,
    Io,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::NotFound => "FS_NOT_FOUND",
            ErrorCode::PermissionDenied => "FS_PERMISSION_DENIED",
            ErrorCode::InterruptRejected => "FS_INTERRUPT_REJECTED",
            ErrorCode::InterruptTimeout => "FS_INTERRUPT_TIMEOUT",
            ErrorCode::NotObserved => "FS_NOT_OBSERVED",
            ErrorCode::StaleVersion => "FS_STALE_VERSION",
            ErrorCode::AmbiguousEdit => "FS_AMBIGUOUS_EDIT",
            ErrorCode::EditNotFound => "FS_EDIT_NOT_FOUND",
            ErrorCode::NotText => "FS_NOT_TEXT",
            ErrorCode::IsDirectory => "FS_IS_DIRECTORY",
            ErrorCode::NotDirectory => "FS_NOT_DIRECTORY",
            ErrorCode::InvalidPath => "FS_INVALID_PATH",
            ErrorCode::InvalidArgument => "FS_INVALID_ARGUMENT",
            ErrorCode::Exists => "FS_EXISTS",
            ErrorCode::Busy => "FS_BUSY",
            ErrorCode::Timeout => "FS_TIMEOUT",
            ErrorCode::TooLarge => "FS_TOO_LARGE",
            ErrorCode::Unsupported => "FS_UNSUPPORTED",
            ErrorCode::Io => "FS_IO",
        }
    }

    /// The code for an errno from the engine.
    pub fn from_errno(errno: crate::error::Errno) -> ErrorCode {
        use crate::error::Errno::*;
        match errno {
            ENOENT => ErrorCode::NotFound,
            EACCES | EPERM => ErrorCode::PermissionDenied,
            EISDIR => ErrorCode::IsDirectory,
            ENOTDIR => ErrorCode::NotDirectory,
            EEXIST => ErrorCode::Exists,
            EBUSY | ENOTEMPTY => ErrorCode::Busy,
            EINVAL | ENAMETOOLONG | ELOOP | EXDEV => ErrorCode::InvalidPath,
            // A full disk (ENOSPC, EDQUOT) is FS_IO: FS_TOO_LARGE says a smaller file would do.
            EFBIG => ErrorCode::TooLarge,
            EOPNOTSUPP | ENOSYS => ErrorCode::Unsupported,
            ETIMEDOUT => ErrorCode::Timeout,
            _ => ErrorCode::Io,
        }
    }
}

/// One content block of a result.
#[derive(Clone, Debug, PartialEq)]
pub enum Block {
    Text(String),
    /// A media file: base64 data, its MIME type and its path. In MCP an image block, an
    /// audio block, or else (video, PDF) an embedded resource named by the path's
    /// `file://` URI: MCP's image block is for images only.
    Media {
        data: String,
        mime_type: String,
        path: String,
    },
}

/// What a tool returns: MCP `CallToolResult` parts.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolOutput {
    pub content: Vec<Block>,
    pub is_error: bool,
    /// Machine-readable fields; `error_code` is added for errors.
    pub structured: serde_json::Map<String, Value>,
}

impl ToolOutput {
    pub fn text(text: impl Into<String>) -> ToolOutput {
        ToolOutput {
            content: vec![Block::Text(text.into())],
            is_error: false,
            structured: Default::default(),
        }
    }

    pub fn error(code: ErrorCode, text: impl Into<String>) -> ToolOutput {
        let mut structured = serde_json::Map::new();
        structured.insert("error_code".into(), json!(code.as_str()));
        ToolOutput { content: vec![Block::Text(text.into())], is_error: true, structured }
    }

    pub fn with(mut self, key: &str, value: Value) -> ToolOutput {
        self.structured.insert(key.to_string(), value);
        self
    }

    /// The text of the result (all text blocks joined by newlines).
    pub fn joined_text(&self) -> String {
        self.content
            .iter()
            .filter_map(|b| match b {
                Block::Text(t) => Some(t.as_str()),
                Block::Media { .. } => None,
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The MCP `CallToolResult` object.
    pub fn to_mcp(&self) -> Value {
        let content: Vec<Value> = self
            .content
            .iter()
            .map(|b| match b {
                Block::Text(t) => json!({"type": "text", "text": t}),
                Block::Media { data, mime_type, path } => match mime_type.split('/').next() {
                    Some("image") => json!({"type": "image", "data": data, "mimeType": mime_type}),
                    Some("audio") => json!({"type": "audio", "data": data, "mimeType": mime_type}),
                    _ => json!({"type": "resource", "resource": {
                        "uri": file_uri(path), "mimeType": mime_type, "blob": data
                    }}),
                },
            })
            .collect();
        json!({"content": content, "isError": self.is_error, "structuredContent": Value::Object(self.structured.clone())})
    }
}

/// `file://` and `path` with every byte but the unreserved ones and `/` percent-encoded
/// (RFC 3986), so that a name with a space, `#`, `?` or `%` still makes a valid URI.
fn file_uri(path: &str) -> String {
    let mut uri = String::from("file://");
    for byte in path.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                uri.push(byte as char)
            }
            _ => uri.push_str(&format!("%{byte:02X}")),
        }
    }
    uri
}

/// Everything a tool call may use.
pub struct ToolEnv<'e> {
    pub fs: ToolFs<'e>,
    pub session: &'e Session,
    /// The sandbox settings when `execute` is enabled.
    pub exec: Option<&'e execute::ExecEnv>,
    /// The caller's id for this call (the JSON-RPC request id), naming offloaded results.
    pub call_id: Option<String>,
    /// The caller asked for structured results (`tools/call` with `structured: true`): the
    /// tool also puts the data its text is rendered from into `structuredContent`, whole
    /// (file windows, every entry and match, raw command output), for clients that render
    /// it themselves (the Deep Agents backend), and nothing is offloaded.
    pub structured: bool,
}

impl ToolEnv<'_> {
    /// Which optional tools this environment offers.
    pub fn listed(&self) -> Listed {
        Listed { execute: self.exec.is_some() }
    }
}

/// Which optional tools are listed, so descriptions never mention a tool that is not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Listed {
    pub execute: bool,
}

/// One tool: what `tools/list` shows and the function `tools/call` runs.
pub struct ToolSpec {
    pub name: &'static str,
    pub description: fn(&Listed) -> String,
    /// JSON Schema of the arguments.
    pub input_schema: fn() -> Value,
    /// MCP annotations.
    pub read_only: bool,
    pub destructive: bool,
    /// When a call waits for a human under an interrupt rule (`None`: never; `execute`'s
    /// commands meet the rules at the mount).
    pub asks: Option<Asks>,
    pub call: fn(&ToolEnv, &Value) -> ToolOutput,
}

/// Which calls of a tool wait for a human (Deep Agents' `when` predicates, doc/policy.md),
/// and what an approved call may then act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Asks {
    /// The class of operation whose interrupt rules the call meets.
    pub op: Op,
    /// The argument that names the call's path.
    pub path_argument: &'static str,
    /// `None` for the exact predicate (the path, and where its symlinks lead, decide in rule
    /// order); otherwise the bulk predicate (any interrupt pattern the path overlaps), and
    /// how far beneath the path the call acts.
    pub beneath: Option<Depth>,
}

impl Asks {
    /// The exact predicate, on `file_path`.
    pub const fn exact(op: Op) -> Option<Asks> {
        Some(Asks { op, path_argument: "file_path", beneath: None })
    }

    /// The bulk predicate, on `path_argument`, for a call acting `depth` beneath it.
    pub const fn bulk(op: Op, path_argument: &'static str, depth: Depth) -> Option<Asks> {
        Some(Asks { op, path_argument, beneath: Some(depth) })
    }
}

impl ToolSpec {
    /// Whether its result may be large, and so is built in the connection's turn
    /// (`control::reply_budget`), so that a client reading nothing cannot make the daemon
    /// hold many of them: the read-only tools, whose results are what they read (a file's
    /// content, a listing, matches). A change answers in a line, and `execute` caps its output.
    pub fn builds_large_result(&self) -> bool {
        self.read_only
    }
}

/// Argument access with clear errors for missing or mistyped arguments.
pub mod args {
    use serde_json::Value;

    use super::{ErrorCode, ToolOutput};

    fn bad(name: &str, want: &str, got: Option<&Value>) -> ToolOutput {
        let got = match got {
            None | Some(Value::Null) => "nothing".to_string(),
            Some(v) => format!("{v}"),
        };
        ToolOutput::error(
            ErrorCode::InvalidArgument,
            format!("Error: argument `{name}` must be {want}, got {got}"),
        )
    }

    pub fn string(args: &Value, name: &str) -> Result<String, ToolOutput> {
        match args.get(name) {
            Some(Value::String(s)) => Ok(s.clone()),
            other => Err(bad(name, "a string", other)),
        }
    }

    pub fn opt_string(args: &Value, name: &str) -> Result<Option<String>, ToolOutput> {
        match args.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            other => Err(bad(name, "a string", other)),
        }
    }

    pub fn opt_int(args: &Value, name: &str) -> Result<Option<i64>, ToolOutput> {
        match args.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) if v.as_i64().is_some() => Ok(v.as_i64()),
            other => Err(bad(name, "an integer", other)),
        }
    }

    pub fn opt_bool(args: &Value, name: &str) -> Result<Option<bool>, ToolOutput> {
        match args.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            other => Err(bad(name, "a boolean", other)),
        }
    }
}

/// The tools in their fixed order (`execute`, last, only when it is enabled).
pub fn registry(listed: &Listed) -> Vec<&'static ToolSpec> {
    let mut tools = vec![
        &ls::SPEC,
        &read_file::SPEC,
        &write_file::SPEC,
        &edit_file::SPEC,
        &delete::SPEC,
        &glob::SPEC,
        &grep::SPEC,
    ];
    if listed.execute {
        tools.push(&execute::SPEC);
    }
    tools
}

/// The tool named `name`, whether or not this environment lists it.
pub fn spec(name: &str) -> Option<&'static ToolSpec> {
    registry(&Listed { execute: true }).into_iter().find(|spec| spec.name == name)
}

/// Runs the tool `name`; `None` when there is no such tool (or it is not enabled). Results
/// too large for the model are offloaded to a file (see [`offload`]).
pub fn call(env: &ToolEnv, name: &str, arguments: &Value) -> Option<ToolOutput> {
    let spec = registry(&env.listed()).into_iter().find(|spec| spec.name == name)?;
    let _turn = match spec.builds_large_result() {
        true => match env.session.replies.turn() {
            Some(turn) => Some(turn),
            // Nobody reads this answer.
            None => {
                return Some(ToolOutput::error(
                    ErrorCode::Io,
                    "Error: the client went away; the call did not run.",
                ))
            }
        },
        false => None,
    };
    let mut output = (spec.call)(env, arguments);
    if !spec.read_only {
        if let Err(e) = env.fs.make_durable() {
            output = ToolOutput::error(ErrorCode::Io, format!("Error: the change could not be stored: {e}"));
        }
    }
    // A structured caller renders (and offloads) the result itself.
    if env.structured {
        return Some(output);
    }
    Some(offload::apply(env, name, output))
}
