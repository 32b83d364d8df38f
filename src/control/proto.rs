//! The control door's wire protocol: JSON-RPC 2.0, one JSON object per line, the same on
//! both of its sockets.
//!
//! This module doc is the protocol's specification; `doc/protocol.md` has an example of
//! every method.
//!
//! # Sockets
//!
//! The **agent socket** serves the agent's methods: `initialize`, `ping`, `tools/list`,
//! `tools/call`, `vfs/paths`, `vfs/explain`, `vfs/upload`, `vfs/download`. The **control
//! socket** serves every method. Each
//! admits the peers its role list names (`control::roles`); a peer without that role gets one
//! `-32001` error line with a `null` id and is disconnected. On the agent socket, a method of
//! the approver (`interrupts/*`) or the operator (`vfs/status`, `vfs/reload`) is answered
//! with `-32001` naming the role it needs, and the connection goes on.
//!
//! # Framing
//!
//! A Unix stream socket. Each message is one JSON object on one line, ended by `\n` (a `\r`
//! before it is ignored, blank lines are skipped, and a last line without `\n` at EOF still
//! counts). A line longer than [`MAX_LINE`] bytes (1 MiB, without the `\n`) is answered with
//! an `-32600` error whose `id` is `null` as soon as the limit is crossed; the rest of that
//! line is discarded and the connection stays open. Batches (JSON arrays) are not supported
//! (`-32600`), as in MCP since 2025-06-18.
//!
//! # Messages
//!
//! - A **request** has `"jsonrpc": "2.0"`, an `id` (number, string or null), a `method`
//!   (string) and optional `params` (object: params are by name, and an array is `-32602`
//!   for every method the server has). Every request gets exactly one response with the same
//!   `id`, the same JSON text ([`Id`]): `{"jsonrpc":"2.0","id":…,"result":…}` or
//!   `{"jsonrpc":"2.0","id":…,"error":{"code":…,"message":…,"data"?:…}}`.
//! - A **notification** has no `id` and is never answered. The server acts on
//!   `notifications/initialized` (nothing to do) and ignores all others, including
//!   `notifications/cancelled` (a running call cannot be stopped; its answer is still sent).
//! - A message with `result` or `error` and no `method` is a response to the client; the
//!   server never asks anything, so these are ignored.
//!
//! Requests on one connection run concurrently: replies may come out of order, and the ids
//! tell them apart. A request that waits (a tool call paused on an approval) does not hold up
//! the others. Each connection is one *session* (read-before-write memory for the tools).
//!
//! # Methods
//!
//! MCP (protocol revision [`MCP_PROTOCOL_VERSION`]; `initialize` is optional here), on both
//! sockets:
//!
//! | method | params | result |
//! |---|---|---|
//! | `initialize` | `{protocolVersion, capabilities?, clientInfo?}` | `{protocolVersion, capabilities: {tools: {listChanged: false}}, serverInfo: {name, version}, instructions}` — the client's revision is echoed when known ([`MCP_KNOWN_VERSIONS`]), else ours |
//! | `ping` | — | `{}` |
//! | `tools/list` | `{cursor?}` | `{tools: [{name, description, inputSchema, annotations: {readOnlyHint, destructiveHint, idempotentHint, openWorldHint}}]}` in a fixed order |
//! | `tools/call` | `{name, arguments?, staged_arguments?, structured?, wait?, ticket?}` (`arguments` absent or `null`: `{}`; `staged_arguments` names `vfs/upload`s of arguments too long for one line) | MCP `CallToolResult`: `{content, isError, structuredContent}`; an unknown tool is error `-32602` |
//!
//! `tools/call`'s extra parameters, for a harness's own backend: `structured: true` adds the
//! data behind the text to `structuredContent`, whole, and never offloads (`read_file`:
//! `content` and `encoding` of the window, window numbers; `ls`: every entry; `glob`:
//! `matches`; `grep` content mode: each file's `matches` `[{line, text}]`; `execute`:
//! `output`). `wait: false`: a call needing approval is answered at once with
//! `structuredContent` `{interrupted: true, interrupt_id, interrupt}` and its ticket stays
//! pending, owned by no connection; the same call (tool, arguments, uid) deferred again gets
//! the same ticket. `ticket: N`: finishes the call that deferred `N` (same name and arguments,
//! else `-32602`) once an approver has answered; an answer is used once (`-32000` after).
//!
//! The daemon's methods (the role each needs; the agent's are on both sockets):
//!
//! | method | role | params | result |
//! |---|---|---|---|
//! | `vfs/paths` | agent | — | `{mountpoint, routes: [{virtual, shell, backend, location}], execute, prompt, socket}` (`socket`: `agent` or `control`, the socket that answered) |
//! | `vfs/explain` | agent | `{operation: "read"\|"write", path}` (a trailing `/` judges a directory) | `{operation, path, directory, decision, hidden, effect, rule, rule_text, as_directory?}` |
//! | `vfs/upload` | agent | `{path, content (base64), more?, upload?}`; a first piece with `more: true` starts upload N, later pieces name it (`upload: N`), the last writes the file atomically; with `argument: true` the pieces stage a `tools/call` argument instead (`staged_arguments`) | `{path, size}` (`{path, staged, upload}` for a staged piece), or `{path, error_code, message}` |
//! | `vfs/download` | agent | `{path}` | `{path, content (base64), size}`, or `{path, error_code, message}` |
//! | `vfs/status` | operator | — | `{version, pid, mountpoint, socket, agent_socket, roles: {agents, approvers}, config, uptime_seconds, routes: [{path, backend, location, …}], rules, pending_interrupts, observation, counters: {…}}` |
//! | `vfs/reload` | operator | — | `{rules, config, warnings}`; a failure is error `-32000` and the old rules stay |
//! | `interrupts/list` | approver | — | `{interrupts: [{id, door, socket, operation, class, path, rule, pid, uid, command, created, expires, expires_in_seconds, retry, cut, tool?: {name, arguments (a bounded preview), arguments_bytes, guarded?}}]}` |
//! | `interrupts/resolve` | approver | `{id, decision: "approve"\|"reject"\|"edit"\|"respond", scope?: "once"\|"session", arguments?, message?}` | the ticket with `decision` and `resolved_by`; not pending, or edit/respond on a syscall, is `-32000`; a ticket a tool call of this connection waits on is `-32001` |
//! | `interrupts/subscribe` | approver | — | `{subscribed: true, interrupts}`; then `notifications/interrupt` lines `{event: "created"\|"resolved", interrupt}` on this connection |
//!
//! # Errors
//!
//! | code | meaning |
//! |---|---|
//! | `-32700` | parse error: the line is not JSON (or not UTF-8) |
//! | `-32600` | invalid request: not a JSON-RPC 2.0 request object (an `id` neither number, string nor null; `params` neither object nor array), a batch, or a line over the limit |
//! | `-32601` | method not found |
//! | `-32602` | invalid params: `params` an array, missing or mistyped parameters, unknown tool, unknown operation |
//! | `-32603` | internal error (a bug; the connection and daemon stay up) |
//! | `-32000` | the operation failed (e.g. `vfs/reload` could not read the rules) |
//! | `-32001` | permission denied: the peer lacks the socket's role (sent once with a `null` id, then the connection is closed), or the method needs a role this socket does not serve, or the connection would answer its own tool call's ticket (the connection stays) |
//! | `-32002` | overloaded: too many requests in flight on this connection, or too many connections |
//!
//! A tool that fails is not a protocol error: its result has `isError: true` and
//! `structuredContent.error_code`.

use std::io::{self, BufRead, BufReader, Read};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

/// The longest request line accepted, in bytes (without the newline).
pub const MAX_LINE: usize = 1 << 20;

/// The MCP protocol revision this server implements.
pub const MCP_PROTOCOL_VERSION: &str = "2025-06-18";

/// Revisions a client may ask for and get echoed back: everything the tools API needs is the
/// same in them (structured content is simply extra for the older ones).
pub const MCP_KNOWN_VERSIONS: [&str; 3] = ["2025-06-18", "2025-03-26", "2024-11-05"];

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
pub const OPERATION_FAILED: i64 = -32000;
pub const PEER_REFUSED: i64 = -32001;
pub const OVERLOADED: i64 = -32002;

/// A JSON-RPC error object.
#[derive(Clone, Debug, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError { code, message: message.into(), data: None }
    }

    pub fn invalid_request(message: impl Into<String>) -> RpcError {
        RpcError::new(INVALID_REQUEST, message)
    }

    pub fn invalid_params(message: impl Into<String>) -> RpcError {
        RpcError::new(INVALID_PARAMS, message)
    }

    pub fn internal(message: impl Into<String>) -> RpcError {
        RpcError::new(INTERNAL_ERROR, message)
    }

    pub fn with_data(mut self, data: Value) -> RpcError {
        self.data = Some(data);
        self
    }

    pub fn to_json(&self) -> Value {
        let mut error = json!({"code": self.code, "message": self.message});
        if let Some(data) = &self.data {
            error["data"] = data.clone();
        }
        error
    }

    /// Reads the `error` member of a response.
    pub fn from_json(error: &Value) -> RpcError {
        RpcError {
            code: error.get("code").and_then(Value::as_i64).unwrap_or(INTERNAL_ERROR),
            message: error.get("message").and_then(Value::as_str).unwrap_or("(no message)").to_string(),
            data: error.get("data").cloned(),
        }
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RpcError {}

/// A request's id as the client wrote it (a number, a string or null), so that its response
/// carries the same JSON text: read as a `Value`, `1e2` would go back as `100.0` and a number
/// past 2^53 would lose digits, and JSON-RPC asks for the same value.
#[derive(Clone, Debug)]
pub struct Id(Box<RawValue>);

impl Id {
    /// The `null` id (of a reply to a line whose id could not be read).
    pub fn null() -> Id {
        Id(RawValue::from_string("null".into()).expect("null is JSON"))
    }

    /// An id given as a value (for ids that are not read from a request).
    pub fn from_value(id: &Value) -> Id {
        Id(serde_json::value::to_raw_value(id).expect("a JSON value always serialises"))
    }

    /// The id's text, as the client sent it.
    pub fn text(&self) -> &str {
        self.0.get()
    }

    /// The id when it is a string, unescaped.
    pub fn as_string(&self) -> Option<String> {
        serde_json::from_str(self.text()).ok()
    }
}

impl PartialEq for Id {
    fn eq(&self, other: &Id) -> bool {
        self.text() == other.text()
    }
}

impl Serialize for Id {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

/// One parsed incoming line.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    Request {
        id: Id,
        method: String,
        params: Option<Value>,
    },
    Notification {
        method: String,
        params: Option<Value>,
    },
    /// A response or error addressed to the server, which never asks anything: ignored.
    Response,
}

/// The `id` member of a request line, as written.
#[derive(Deserialize)]
struct RawId<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
}

/// Parses one line. On failure returns the error to send and the id to send it with (`null`
/// when the id could not be read).
pub fn parse(line: &[u8]) -> Result<Message, (Id, RpcError)> {
    let value: Value = serde_json::from_slice(line)
        .map_err(|e| (Id::null(), RpcError::new(PARSE_ERROR, format!("parse error: {e}"))))?;
    let object = match value {
        Value::Object(o) => o,
        Value::Array(_) => {
            return Err((Id::null(), RpcError::invalid_request("batch requests are not supported")))
        }
        _ => return Err((Id::null(), RpcError::invalid_request("a request must be a JSON object"))),
    };
    let id = match object.get("id") {
        None => None,
        // The text as sent; an `id` given twice (which the value keeps the last of) as read.
        Some(id @ (Value::Null | Value::Number(_) | Value::String(_))) => Some(
            serde_json::from_slice::<RawId>(line)
                .ok()
                .and_then(|raw| raw.id)
                .map_or_else(|| Id::from_value(id), |raw| Id(raw.to_owned())),
        ),
        Some(_) => {
            return Err((Id::null(), RpcError::invalid_request("`id` must be a number, a string or null")))
        }
    };
    let reply_id = id.clone().unwrap_or_else(Id::null);
    if object.get("jsonrpc") != Some(&json!("2.0")) {
        return Err((reply_id, RpcError::invalid_request("`jsonrpc` must be \"2.0\"")));
    }
    let method = match object.get("method") {
        Some(Value::String(m)) => m.clone(),
        None if object.contains_key("result") || object.contains_key("error") => {
            return Ok(Message::Response)
        }
        _ => return Err((reply_id, RpcError::invalid_request("`method` must be a string"))),
    };
    let params = match object.get("params") {
        None => None,
        Some(p @ (Value::Object(_) | Value::Array(_))) => Some(p.clone()),
        Some(_) => return Err((reply_id, RpcError::invalid_request("`params` must be an object"))),
    };
    Ok(match id {
        Some(id) => Message::Request { id, method, params },
        None => Message::Notification { method, params },
    })
}

/// A response as it is sent: `id` keeps its text, and the members are in sorted order, as in
/// every other message the server sends.
#[derive(Serialize)]
pub struct Response<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<Value>,
    id: &'a Id,
    jsonrpc: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<Value>,
}

/// The response for `id`.
pub fn response(id: &Id, result: Result<Value, RpcError>) -> Response<'_> {
    let (result, error) = match result {
        Ok(result) => (Some(result), None),
        Err(error) => (None, Some(error.to_json())),
    };
    Response { error, id, jsonrpc: "2.0", result }
}

/// A request object (for clients).
pub fn request(id: u64, method: &str, params: Option<Value>) -> Value {
    let mut request = json!({"jsonrpc": "2.0", "id": id, "method": method});
    if let Some(params) = params {
        request["params"] = params;
    }
    request
}

/// One message as it goes on the wire: compact JSON and a newline (serde_json escapes
/// control characters, so the text never contains a raw newline).
pub fn encode(message: &impl Serialize) -> Vec<u8> {
    let mut line = serde_json::to_vec(message).expect("a JSON value always serialises");
    line.push(b'\n');
    line
}

/// The answer to a request line longer than [`MAX_LINE`] (sent with a `null` id): the daemon's,
/// and `agentvfs mcp`'s, which stops such a line before it reaches the daemon.
pub fn line_too_long() -> RpcError {
    RpcError::invalid_request(format!("request line too long (limit {MAX_LINE} bytes); it was discarded"))
}

/// Refuses params by position (an array, which JSON-RPC allows): every method takes its params
/// by name, so an array is refused alike whether the method reads its params or not.
pub fn params_by_name(params: Option<&Value>) -> Result<(), RpcError> {
    match params {
        None | Some(Value::Null | Value::Object(_)) => Ok(()),
        Some(_) => Err(RpcError::invalid_params("params must be an object")),
    }
}

/// The params of a request as an object (absent params are an empty object).
pub fn params_object(params: Option<&Value>) -> Result<Map<String, Value>, RpcError> {
    params_by_name(params)?;
    Ok(params.and_then(Value::as_object).cloned().unwrap_or_default())
}

/// What [`LineReader::read_line`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// One line, without its `\n` (and without a `\r` before it).
    Complete(Vec<u8>),
    /// The current line passed the cap; the reader skips the rest of it on the next call.
    TooLong,
    /// The peer closed its side.
    Eof,
}

/// Splits a byte stream into lines of at most `cap` bytes without ever buffering more than
/// `cap` (plus one read) of a line, so an endless line cannot exhaust memory.
pub struct LineReader<R> {
    inner: BufReader<R>,
    cap: usize,
    skipping: bool,
}

impl<R: Read> LineReader<R> {
    pub fn new(inner: R, cap: usize) -> LineReader<R> {
        LineReader { inner: BufReader::with_capacity(64 * 1024, inner), cap, skipping: false }
    }

    pub fn read_line(&mut self) -> io::Result<Line> {
        let mut line = Vec::new();
        loop {
            let buf = match self.inner.fill_buf() {
                Ok(buf) => buf,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if buf.is_empty() {
                // EOF: a last line without a newline still counts.
                if self.skipping || line.is_empty() {
                    self.skipping = false;
                    return Ok(Line::Eof);
                }
                return Ok(Line::Complete(trim_cr(line)));
            }
            let newline = buf.iter().position(|&b| b == b'\n');
            let take = newline.map_or(buf.len(), |i| i);
            if self.skipping {
                self.inner.consume(take + newline.map_or(0, |_| 1));
                if newline.is_some() {
                    self.skipping = false;
                }
                continue;
            }
            if line.len() + take > self.cap + 1 {
                // (cap + 1: a `\r` before the newline does not count against the cap.)
                self.inner.consume(take + newline.map_or(0, |_| 1));
                self.skipping = newline.is_none();
                return Ok(Line::TooLong);
            }
            line.extend_from_slice(&buf[..take]);
            self.inner.consume(take + newline.map_or(0, |_| 1));
            if newline.is_some() {
                let line = trim_cr(line);
                if line.len() > self.cap {
                    return Ok(Line::TooLong);
                }
                return Ok(Line::Complete(line));
            }
        }
    }
}

fn trim_cr(mut line: Vec<u8>) -> Vec<u8> {
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], cap: usize) -> Vec<Line> {
        let mut reader = LineReader::new(input, cap);
        let mut out = Vec::new();
        loop {
            let line = reader.read_line().unwrap();
            let eof = line == Line::Eof;
            out.push(line);
            if eof {
                return out;
            }
        }
    }

    #[test]
    fn lines_are_split_and_capped() {
        use Line::*;
        assert_eq!(
            lines(b"a\r\nbb\n\nccc", 8),
            vec![
                Complete(b"a".to_vec()),
                Complete(b"bb".to_vec()),
                Complete(vec![]),
                Complete(b"ccc".to_vec()),
                Eof
            ]
        );
        assert_eq!(
            lines(b"12345\n123456\nok\n", 5),
            vec![Complete(b"12345".to_vec()), TooLong, Complete(b"ok".to_vec()), Eof]
        );
        assert_eq!(lines(b"12345\r\n", 5), vec![Complete(b"12345".to_vec()), Eof]);
        // A long line spanning several reads is reported once, then skipped.
        let mut long = vec![b'x'; 200_000];
        long.extend_from_slice(b"\n{}\n");
        assert_eq!(lines(&long, 1000), vec![TooLong, Complete(b"{}".to_vec()), Eof]);
        assert_eq!(lines(&vec![b'x'; 200_000], 1000), vec![TooLong, Eof]);
    }

    #[test]
    fn messages_are_classified() {
        let m = parse(br#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#).unwrap();
        assert_eq!(
            m,
            Message::Request { id: Id::from_value(&json!(7)), method: "ping".into(), params: None }
        );
        let m = parse(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).unwrap();
        assert!(matches!(m, Message::Notification { .. }));
        assert_eq!(parse(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#).unwrap(), Message::Response);
        let err = |line: &[u8]| parse(line).unwrap_err();
        assert_eq!(err(b"{nope").1.code, PARSE_ERROR);
        assert_eq!(err(b"[1]").1.code, INVALID_REQUEST);
        assert_eq!(
            err(br#"{"jsonrpc":"1.0","id":"a","method":"x"}"#),
            (Id::from_value(&json!("a")), RpcError::invalid_request("`jsonrpc` must be \"2.0\""))
        );
        assert_eq!(err(br#"{"jsonrpc":"2.0","id":{},"method":"x"}"#).0, Id::null());
        assert_eq!(err(br#"{"jsonrpc":"2.0","id":2,"method":"x","params":3}"#).1.code, INVALID_REQUEST);
        assert_eq!(err(br#"{"jsonrpc":"2.0","id":2}"#).1.code, INVALID_REQUEST);
    }

    /// An id is answered with the text it was sent as, without the blanks around it.
    #[test]
    fn ids_keep_their_text() {
        for (line, text) in [
            (&br#"{"jsonrpc":"2.0","id":1e2,"method":"ping"}"#[..], "1e2"),
            (
                br#"{"jsonrpc":"2.0","id": 123456789012345678901234567890 ,"method":"ping"}"#,
                "123456789012345678901234567890",
            ),
            (br#"{"jsonrpc":"2.0","id":"\u0041","method":"ping"}"#, r#""\u0041""#),
            (b"{\"jsonrpc\":\"2.0\",\"id\":\tnull\t,\"method\":\"ping\"}", "null"),
        ] {
            let Ok(Message::Request { id, .. }) = parse(line) else { panic!("{line:?}") };
            assert_eq!(id.text(), text);
            let reply = encode(&response(&id, Ok(json!({}))));
            assert_eq!(
                reply,
                format!("{{\"id\":{text},\"jsonrpc\":\"2.0\",\"result\":{{}}}}\n").into_bytes()
            );
        }
        assert_eq!(parse(br#"{"jsonrpc":"1.0","id":1.50,"method":"x"}"#).unwrap_err().0.text(), "1.50");
        // Given twice, the id is the one the value keeps: the last.
        let Ok(Message::Request { id, .. }) = parse(br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#)
        else {
            panic!()
        };
        assert_eq!(id.text(), "2");
        assert_eq!(Id::from_value(&json!("a\"b")).as_string().as_deref(), Some("a\"b"));
    }
}
