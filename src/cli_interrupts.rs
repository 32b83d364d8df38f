//! The CLI's interrupt commands: listing and following pending approvals readably, and
//! printing what a resolution did.

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Result;
use serde_json::Value;

use crate::control::client::Client;

/// Longest command line shown; the rest is elided so one request stays on one line.
const COMMAND_WIDTH: usize = 48;

fn elide(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    let kept: String = s.chars().take(width).collect();
    format!("{kept} ...")
}

/// `4m58s`, `12s`, `1h02m`.
pub fn duration_text(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// One pending approval on one line, e.g.
/// `#12 write /workspace/secrets/k by pid 4242 (bash -c echo key > ...) expires in 4m58s`.
pub fn line(v: &Value) -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    let left = v["expires"].as_f64().map(|e| e - now).unwrap_or(0.0);
    let who = match v.get("tool") {
        Some(tool) => format!(
            "by tool {} {} (pid {})",
            tool["name"].as_str().unwrap_or("?"),
            elide(&tool["arguments"].to_string(), COMMAND_WIDTH),
            v["pid"]
        ),
        None => {
            format!("by pid {} ({})", v["pid"], elide(v["command"].as_str().unwrap_or(""), COMMAND_WIDTH))
        }
    };
    format!(
        "#{} {} {}{} {who} expires in {}",
        v["id"],
        v["class"].as_str().unwrap_or("?"),
        v["path"].as_str().unwrap_or("?"),
        v["resolved"].as_str().map(|r| format!(" (-> {r})")).unwrap_or_default(),
        duration_text(left)
    )
}

/// A resolution on one line: `#12 write /workspace/secrets/k: approve by uid 0 (pid 99)`.
pub fn resolution(v: &Value) -> String {
    let by = v["resolved_by"].as_str().map(|b| format!(" by {b}")).unwrap_or_default();
    format!(
        "#{} {} {}: {}{by}",
        v["id"],
        v["class"].as_str().unwrap_or("?"),
        v["path"].as_str().unwrap_or("?"),
        v["decision"].as_str().unwrap_or("?")
    )
}

/// `agentvfs interrupts [--watch]`.
pub fn show(client: &mut Client, watch: bool, json: bool) -> Result<ExitCode> {
    if !watch {
        let result = client.call("interrupts/list", None)?;
        if json {
            println!("{}", serde_json::to_string_pretty(&result)?);
            return Ok(ExitCode::SUCCESS);
        }
        let pending = result["interrupts"].as_array().cloned().unwrap_or_default();
        if pending.is_empty() {
            println!("no pending approvals");
        }
        for v in &pending {
            println!("{}", line(v));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let first = client.call("interrupts/subscribe", None)?;
    for v in first["interrupts"].as_array().into_iter().flatten() {
        println!("{}", if json { v.to_string() } else { line(v) });
    }
    while let Some(message) = client.next_message()? {
        if message["method"] != "notifications/interrupt" {
            continue;
        }
        let params = &message["params"];
        if json {
            println!("{params}");
        } else if params["event"] == "created" {
            println!("{}", line(&params["interrupt"]));
        } else {
            println!("{}", resolution(&params["interrupt"]));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What `approve` and `reject` print.
pub fn resolved(result: &Value, json: bool) -> Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string_pretty(result)?);
    } else {
        println!("{}", resolution(result));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_pending_syscall_reads_as_one_line() {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
        let v = json!({"id": 12, "class": "write", "path": "/workspace/secrets/k", "pid": 4242,
            "command": "bash -c echo key > /workspace/secrets/k; echo done and more and more", "expires": now + 298.4});
        assert_eq!(
            line(&v),
            "#12 write /workspace/secrets/k by pid 4242 (bash -c echo key > /workspace/secrets/k; echo do ...) expires in 4m58s"
        );
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration_text(5.2), "5s");
        assert_eq!(duration_text(298.0), "4m58s");
        assert_eq!(duration_text(3720.0), "1h02m");
        assert_eq!(duration_text(-3.0), "0s");
    }
}
