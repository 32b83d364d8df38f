//! The `execute` tool: a shell command run in the sandbox of [`crate::exec`], where the
//! virtual tree is the file system and every file access passes the gate. The validation
//! texts and the output format are Deep Agents' (its middleware around LocalShellBackend).

use std::time::Duration;

use serde_json::{json, Value};

use super::common::py_isspace;
use super::{args, ErrorCode, Listed, ToolEnv, ToolOutput, ToolSpec};
use crate::backend::FileKind;
use crate::config::ExecConfig;
use crate::exec::{Finished, Plan, TopEntry, RESERVED};
use crate::vpath::VPath;

pub const SPEC: ToolSpec = ToolSpec {
    name: "execute",
    description,
    input_schema,
    read_only: false,
    destructive: true,
    asks: None,
    call,
};

/// What the execute tool needs from the daemon: its config and where the tree is mounted.
pub struct ExecEnv {
    pub config: ExecConfig,
    pub mountpoint: std::path::PathBuf,
}

/// The exit code reported for a command that ran out of time (`timeout(1)`'s).
pub const TIMEOUT_EXIT_CODE: i32 = 124;

fn description(_listed: &Listed) -> String {
    // Deep Agents' text for a tool set with both grep and glob (always listed here).
    "Executes a shell command in an isolated sandbox and returns combined stdout/stderr with the exit code (truncated if very large).

Usage:
- Quote paths containing spaces (e.g. cd \"/path/with spaces\").
- Chain commands with ';' or '&&' (use '&&' when a command depends on the previous); do not use newlines except inside quoted strings.
- Use absolute paths and avoid `cd` so the working directory stays stable; use the optional timeout to override the default.
- You MUST avoid using search commands like find and grep. Instead use the grep, glob tools to search. Use read_file rather than cat/head/tail.
    - execute(command=\"find . -name '*.py'\")  # Use glob tool instead
    - execute(command=\"grep -r 'pattern' .\")  # Use grep tool instead

Paths in commands are the same virtual paths the file tools use (`/workspace/...`), and the same access rules apply: files the tools cannot see or write, the command cannot either."
        .to_string()
}

fn input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "Shell command to execute in the sandbox environment."},
            "timeout": {
                "type": ["integer", "null"],
                "description": "Maximum time in seconds to wait for the command to complete. Defaults to the configured timeout (120 seconds unless set otherwise).",
            },
        },
        "required": ["command"],
        "additionalProperties": false,
    })
}

/// Python's `str.rstrip()`.
fn rstrip(s: &str) -> &str {
    s.trim_end_matches(py_isspace)
}

/// LocalShellBackend's output: stdout, then each stderr line prefixed `[stderr] `, joined by
/// `\n` (`<no output>` when both are empty); cut at `max_bytes` UTF-8 bytes with a note; and
/// `Exit code: N` after a failure. Returns the text and whether it was cut.
pub fn shell_output(stdout: &str, stderr: &str, exit_code: i32, max_bytes: usize) -> (String, bool) {
    let mut parts: Vec<String> = Vec::new();
    if !stdout.is_empty() {
        parts.push(stdout.to_string());
    }
    if !stderr.is_empty() {
        let stripped = stderr.trim_matches(py_isspace);
        parts.extend(stripped.split('\n').map(|line| format!("[stderr] {line}")));
    }
    let mut output = if parts.is_empty() { "<no output>".to_string() } else { parts.join("\n") };
    let mut truncated = false;
    if output.len() > max_bytes {
        // `bytes[:max].decode(errors="ignore")`: a character cut in half is dropped.
        output.truncate(crate::display::prefix_within(&output, max_bytes).len());
        output.push_str(&format!("\n\n... Output truncated at {max_bytes} bytes."));
        truncated = true;
    }
    if exit_code != 0 {
        output = format!("{}\n\nExit code: {exit_code}", rstrip(&output));
    }
    (output, truncated)
}

/// The middleware's text around a backend result: the exit-code trailer and the
/// truncation line.
pub fn tool_text(output: &str, exit_code: i32, truncated: bool) -> String {
    let status = if exit_code == 0 { "succeeded" } else { "failed" };
    let mut text = format!("{output}\n[Command {status} with exit code {exit_code}]");
    if truncated {
        text.push_str("\n[Output was truncated due to size limits]");
    }
    text
}

/// A finished backend result as the tool returns it.
fn result(output: &str, exit_code: i32, truncated: bool) -> ToolOutput {
    // `output` is the command's output before the trailer (kept for structured calls only).
    ToolOutput::text(tool_text(output, exit_code, truncated))
        .with("output", json!(output))
        .with("exit_code", json!(exit_code))
        .with("truncated", json!(truncated))
}

/// Python's universal newlines (`text=True`): `\r\n` and lone `\r` become `\n`.
fn universal_newlines(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    super::common::to_lf(&text)
}

/// The top-level entries of the tree the sandbox shows: what `/` lists through the gate
/// (hidden entries are absent), minus the names the system layout takes.
fn top_entries(env: &ToolEnv) -> Result<Vec<TopEntry>, String> {
    let root = VPath::root();
    let entries = env.fs.list(&root).map_err(|e| format!("cannot list /: {e}"))?;
    let mut out = Vec::new();
    for (name, attr) in entries {
        if RESERVED.contains(&name.as_str()) && name != "tmp" {
            continue;
        }
        match attr.kind {
            // Only a directory can stand in for /tmp: a link or a file named `tmp` is left
            // out (bubblewrap cannot put the private /tmp on either), so no entry an agent
            // makes can stop the sandbox from starting.
            _ if name == "tmp" && attr.kind != FileKind::Dir => {}
            FileKind::Symlink => {
                let target = env.fs.engine.readlink(&env.fs.ctx, &root.join(&name));
                if let Ok(target) = target {
                    out.push(TopEntry::Symlink { name, target });
                }
            }
            _ => out.push(TopEntry::Bind(name)),
        }
    }
    Ok(out)
}

fn call(env: &ToolEnv, a: &Value) -> ToolOutput {
    let mut output = run(env, a);
    // The raw output is for structured callers, which render the trailer themselves.
    if !env.structured {
        output.structured.remove("output");
    }
    output
}

fn run(env: &ToolEnv, a: &Value) -> ToolOutput {
    let command = match args::string(a, "command") {
        Ok(c) => c,
        Err(e) => return e,
    };
    let timeout = match args::opt_int(a, "timeout") {
        Ok(t) => t,
        Err(e) => return e,
    };
    let Some(exec) = env.exec else {
        return ToolOutput::error(
            ErrorCode::Unsupported,
            "Error: Execution not available. This agent's backend does not support command execution (SandboxBackendProtocol). To use the execute tool, provide a backend that implements SandboxBackendProtocol.",
        );
    };
    let config = &exec.config;
    if let Some(t) = timeout {
        if t < 0 {
            return ToolOutput::error(
                ErrorCode::InvalidArgument,
                format!("Error: timeout must be non-negative, got {t}."),
            );
        }
        if t as u64 > config.max_timeout.as_secs() {
            return ToolOutput::error(
                ErrorCode::InvalidArgument,
                format!("Error: timeout {t}s exceeds maximum allowed ({}s).", config.max_timeout.as_secs()),
            );
        }
    }
    // LocalShellBackend's own checks: the command first, then the timeout.
    if command.is_empty() {
        return result("Error: Command must be a non-empty string.", 1, false);
    }
    let seconds = timeout.map(|t| t as u64).unwrap_or(config.timeout.as_secs());
    if seconds == 0 {
        return ToolOutput::error(
            ErrorCode::InvalidArgument,
            "Error: Invalid parameter. timeout must be positive, got 0",
        );
    }
    // The working directory must be visible through the gate, or the sandbox cannot start.
    match env.fs.resolve(&config.cwd, true) {
        Ok(r) if r.attr.as_ref().map(|a| a.kind) == Some(FileKind::Dir) => {}
        _ => {
            return ToolOutput::error(
                ErrorCode::Unsupported,
                format!(
                    "Error: Execution not available. The working directory {} does not exist in the tree.",
                    config.cwd
                ),
            )
        }
    }
    let entries = match top_entries(env) {
        Ok(e) => e,
        Err(e) => return ToolOutput::error(ErrorCode::Io, format!("Error: Execution not available. {e}")),
    };
    let caller = env.fs.ctx.principal.map(|p| (p.uid, p.gid));
    let plan = Plan { mountpoint: &exec.mountpoint, config, entries, user: Plan::user_for(config, caller) };
    // Twice the limit per stream: `\r\n` folding may halve what was captured, and the
    // `[stderr] ` prefixes only add, so the cut the format makes is always inside the capture.
    let capture = config.max_output_bytes.saturating_mul(2).saturating_add(16);
    let outcome = match plan.run(&command, Duration::from_secs(seconds), capture) {
        Ok(o) => o,
        Err(e) => {
            return ToolOutput::error(
                ErrorCode::Unsupported,
                format!("Error: Execution not available. {}", e.0),
            )
        }
    };
    match outcome.finished {
        Finished::TimedOut => {
            let text = if timeout.is_some() {
                format!("Error: Command timed out after {seconds} seconds (custom timeout). The command may be stuck or require more time.")
            } else {
                format!("Error: Command timed out after {seconds} seconds. For long-running commands, re-run using the timeout parameter.")
            };
            result(&text, TIMEOUT_EXIT_CODE, false).with("timed_out", json!(true))
        }
        Finished::Exited(code) => {
            let (stdout, stderr) = (universal_newlines(&outcome.stdout), universal_newlines(&outcome.stderr));
            let (output, truncated) = shell_output(&stdout, &stderr, code, config.max_output_bytes);
            // A stream cut at capture time is longer than the limit, so `truncated` is set then too.
            result(&output, code, truncated)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_follows_local_shell_backend() {
        let (out, cut) = shell_output("out\n", "err\n", 3, 100_000);
        assert!(!cut);
        assert_eq!(
            tool_text(&out, 3, cut),
            "out\n\n[stderr] err\n\nExit code: 3\n[Command failed with exit code 3]"
        );
        let (out, _) = shell_output("", "", 0, 100);
        assert_eq!(tool_text(&out, 0, false), "<no output>\n[Command succeeded with exit code 0]");
        let (out, _) = shell_output("hi\n", "", 0, 100);
        assert_eq!(tool_text(&out, 0, false), "hi\n\n[Command succeeded with exit code 0]");
        let (out, _) = shell_output("", "  a\nb  \n\n", 1, 100);
        assert_eq!(out, "[stderr] a\n[stderr] b\n\nExit code: 1");
    }

    #[test]
    fn truncation_cuts_bytes_and_says_so() {
        let (out, cut) = shell_output(&"x".repeat(20), "", 0, 10);
        assert!(cut);
        assert_eq!(
            tool_text(&out, 0, cut),
            "xxxxxxxxxx\n\n... Output truncated at 10 bytes.\n[Command succeeded with exit code 0]\n[Output was truncated due to size limits]"
        );
        // A two-byte character cut in half is dropped.
        let (out, _) = shell_output("aéé", "", 0, 4);
        assert_eq!(out, "aé\n\n... Output truncated at 4 bytes.");
        let (out, _) = shell_output(&"y".repeat(12), "", 2, 10);
        assert_eq!(out, "yyyyyyyyyy\n\n... Output truncated at 10 bytes.\n\nExit code: 2");
    }

    #[test]
    fn newlines_are_universal() {
        assert_eq!(universal_newlines(b"a\r\nb\rc"), "a\nb\nc");
    }
}
