//! The CLI's interrupt commands: listing and following pending approvals readably, and
//! printing what a resolution did.

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Result;
use serde_json::Value;

use crate::control::client::Client;
use crate::display::{escape, push_escaped};

/// Longest command line shown (in characters as shown); the rest is elided so one request
/// stays on one line.
const COMMAND_WIDTH: usize = 48;

/// `s` escaped for the terminal ([`escape`]) and cut to `width` shown characters, never
/// inside an escape.
fn elide(s: &str, width: usize) -> String {
    let mut out = String::new();
    let mut shown = 0;
    for c in s.chars() {
        let mut one = String::new();
        push_escaped(&mut one, c);
        let n = one.chars().count();
        if shown + n > width {
            out.push_str(" ...");
            break;
        }
        shown += n;
        out.push_str(&one);
    }
    out
}

/// A field of a ticket as the approver sees it: a string escaped, anything else as JSON
/// (escaped too), `?` when it is missing.
fn field(v: &Value) -> String {
    match v {
        Value::String(s) => escape(s).into_owned(),
        Value::Null => "?".to_string(),
        other => escape(&other.to_string()).into_owned(),
    }
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

/// Which door a ticket came through, in words (`the mount`, `the agent socket`, `the control
/// socket`).
fn door(v: &Value) -> String {
    match (v["door"].as_str(), v["socket"].as_str()) {
        (Some("fuse"), _) => "the mount".to_string(),
        (_, Some(socket)) => format!("the {} socket", escape(socket)),
        _ => "?".to_string(),
    }
}

/// One pending approval on one line, with its principal (pid, uid, door), e.g.
/// `#12 write /workspace/secrets/k by pid 4242 uid 1000 via the mount (bash -c echo key > ...) expires in 4m58s`.
/// Every field is escaped, so a path or command line cannot move the cursor, end the line or
/// pass for another ticket.
pub fn line(v: &Value) -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    let left = v["expires"].as_f64().map(|e| e - now).unwrap_or(0.0);
    let principal = format!("pid {} uid {} via {}", field(&v["pid"]), field(&v["uid"]), door(v));
    // The daemon keeps only the start of long arguments or command lines: say how long the
    // whole was, so an elided line is not taken for all there is.
    let cut = v["cut"].as_array().filter(|c| !c.is_empty());
    let whole = |bytes: &Value| {
        if cut.is_some() {
            format!(" [cut: {} bytes in all]", field(bytes))
        } else {
            String::new()
        }
    };
    let who = match v.get("tool") {
        Some(tool) => format!(
            "by tool {} {}{} ({principal})",
            field(&tool["name"]),
            elide(&tool["arguments"].to_string(), COMMAND_WIDTH),
            whole(&tool["arguments_bytes"]),
        ),
        None => format!(
            "by {principal} ({}){}",
            elide(v["command"].as_str().unwrap_or(""), COMMAND_WIDTH),
            whole(
                &cut.and_then(|c| c.iter().find(|e| e["at"] == "/command"))
                    .map_or(Value::Null, |e| e["bytes"].clone())
            ),
        ),
    };
    // A bulk call approved acts beneath its path on these guarded entries alone.
    let guarded = match v["tool"]["guarded"].as_array().filter(|g| !g.is_empty()) {
        Some(listed) => {
            let all = cut
                .and_then(|c| c.iter().find(|e| e["at"] == "/tool/guarded"))
                .map_or(listed.len() as u64, |e| e["entries"].as_u64().unwrap_or(0));
            let first: Vec<String> = listed.iter().take(3).map(field).collect();
            let more = if all > first.len() as u64 { ", ..." } else { "" };
            format!(" [guarded beneath, {all} in all: {}{more}]", first.join(", "))
        }
        None => String::new(),
    };
    // A change of names was refused at once (nobody waits); approving lets it be retried.
    let retry = if v["retry"] == Value::Bool(true) {
        format!(" [refused for now; approving lets the next {} through]", field(&v["operation"]))
    } else {
        String::new()
    };
    format!(
        "#{} {} {}{}{} {who}{guarded}{retry} expires in {}",
        field(&v["id"]),
        field(&v["class"]),
        field(&v["path"]),
        v.get("resolved").map(|r| format!(" (-> {})", field(r))).unwrap_or_default(),
        v.get("other_path").map(|o| format!(" (with {})", field(o))).unwrap_or_default(),
        duration_text(left)
    )
}

/// A resolution on one line: `#12 write /workspace/secrets/k: approve by uid 0 (pid 99)`.
/// An approved change of names that was refused at once adds what happens next:
/// `...: approve by uid 0 (pid 99); the next mkdir by uid 1000 passes`.
pub fn resolution(v: &Value) -> String {
    let by = v["resolved_by"].as_str().map(|b| format!(" by {}", escape(b))).unwrap_or_default();
    let approved = matches!(v["decision"].as_str(), Some("approve" | "approve-session"));
    let mut next = if approved && v["retry"] == Value::Bool(true) {
        format!("; the next {} by uid {} passes", field(&v["operation"]), field(&v["uid"]))
    } else {
        String::new()
    };
    if let Some(grant) = v.get("session_grant") {
        let opens: Vec<String> =
            grant["opens"].as_array().into_iter().flatten().map(field).collect::<Vec<_>>();
        next.push_str(&format!(
            "; for this session every {} by uid {} at or beneath {} passes{}",
            field(&grant["op"]),
            field(&grant["uid"]),
            field(&grant["root"]),
            match opens.is_empty() {
                true => String::new(),
                false => format!(", guarded there by: {}", opens.join(" ")),
            }
        ));
    }
    format!(
        "#{} {} {}: {}{by}{next}",
        field(&v["id"]),
        field(&v["class"]),
        field(&v["path"]),
        field(&v["decision"])
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
        let v = json!({"id": 12, "door": "fuse", "socket": null, "class": "write", "path": "/workspace/secrets/k", "pid": 4242,
            "uid": 1000, "command": "bash -c echo key > /workspace/secrets/k; echo done and more and more", "expires": now + 298.4});
        assert_eq!(
            line(&v),
            "#12 write /workspace/secrets/k by pid 4242 uid 1000 via the mount (bash -c echo key > /workspace/secrets/k; echo do ...) expires in 4m58s"
        );
    }

    #[test]
    fn a_refused_change_of_names_says_that_approving_lets_it_retry() {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
        let v = json!({"id": 3, "door": "fuse", "socket": null, "operation": "mkdir", "class": "write", "path": "/w/new",
            "pid": 7, "uid": 1000, "command": "mkdir new", "expires": now + 58.4, "retry": true});
        assert_eq!(
            line(&v),
            "#3 write /w/new by pid 7 uid 1000 via the mount (mkdir new) [refused for now; approving lets the next mkdir through] expires in 58s"
        );
    }

    #[test]
    fn a_pending_tool_call_names_its_socket() {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
        let v = json!({"id": 13, "door": "tool", "socket": "agent", "class": "write", "path": "/w/t", "pid": 5151,
            "uid": 65534, "command": "", "expires": now + 299.6,
            "tool": {"name": "write_file", "arguments": {"file_path": "/w/t"}}});
        assert_eq!(
            line(&v),
            "#13 write /w/t by tool write_file {\"file_path\":\"/w/t\"} (pid 5151 uid 65534 via the agent socket) expires in 5m00s"
        );
        let mut v = v;
        v["tool"]["arguments_bytes"] = json!(300_040);
        v["cut"] = json!([{"at": "/tool/arguments/content", "bytes": 300_000, "shown": 2030}]);
        assert!(line(&v).contains("} [cut: 300040 bytes in all] (pid 5151"), "{}", line(&v));
        let v = json!({"id": 3, "class": "write", "path": "/p", "pid": 1, "command": "sh -c x", "expires": now,
            "cut": [{"at": "/command", "bytes": 90_000, "shown": 2048}]});
        assert!(line(&v).contains("(sh -c x) [cut: 90000 bytes in all] expires"), "{}", line(&v));
        let mut v = json!({"id": 4, "class": "write", "path": "/w", "pid": 1, "expires": now,
            "tool": {"name": "delete", "arguments": {"file_path": "/w"}, "guarded": ["/w/a", "/w/b\n#9"]}});
        assert!(line(&v).contains("[guarded beneath, 2 in all: /w/a, /w/b\\n#9] expires"), "{}", line(&v));
        v["tool"]["guarded"] = json!(["/w/1", "/w/2", "/w/3", "/w/4"]);
        v["cut"] = json!([{"at": "/tool/guarded", "entries": 80, "shown": 4}]);
        assert!(
            line(&v).contains("[guarded beneath, 80 in all: /w/1, /w/2, /w/3, ...] expires"),
            "{}",
            line(&v)
        );
    }

    #[test]
    fn a_forged_command_line_stays_inside_its_ticket() {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
        let v = json!({"id": 3, "door": "fuse", "class": "write", "path": "/host/s/\u{202e}k\r", "pid": 77, "uid": 0,
            "command": "evil\r\x1b[2K\n#99 write /host/forged by pid 1", "expires": now + 10.2});
        assert_eq!(
            line(&v),
            "#3 write /host/s/\\u{202e}k\\r by pid 77 uid 0 via the mount (evil\\r\\x1b[2K\\n#99 write /host/forged by pid 1) expires in 10s"
        );
        // Elision never cuts an escape in two.
        let v = json!({"id": 4, "class": "read", "path": "/p", "pid": 1,
            "command": format!("{}\x1b[2K", "x".repeat(46)), "expires": now});
        assert!(line(&v).contains(&format!("({} ...)", "x".repeat(46))), "{}", line(&v));
        let v = json!({"id": 5, "class": "write", "path": "/p\n#6", "decision": "reject", "resolved_by": "uid 0\r"});
        assert_eq!(resolution(&v), "#5 write /p\\n#6: reject by uid 0\\r");
        let v = json!({"id": 7, "class": "write", "path": "/w/d", "decision": "approve", "resolved_by": "uid 0 (pid 9)",
            "retry": true, "operation": "mkdir", "uid": 1000});
        assert_eq!(
            resolution(&v),
            "#7 write /w/d: approve by uid 0 (pid 9); the next mkdir by uid 1000 passes"
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
