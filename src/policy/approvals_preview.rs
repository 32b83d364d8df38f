//! What a ticket shows approvers, and keeps of a tool call's arguments and a process's
//! command line: a bounded preview, with what was cut said out of band (`cut`: where, how
//! long in all, how much is shown), so a thousand tickets of 300 KB writes hold a few MB, not
//! a thousand copies.
//!
//! The ticket is for the approver's eyes; the call keeps its own arguments (a waiting call on
//! its request thread, a deferred one re-sends them with `ticket: N`, checked against a
//! digest), so nothing needs the whole text here.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

use super::{ApprovalId, Ticket};

/// Bytes of argument text (strings, keys, scalars) a ticket shows.
pub const ARGUMENTS_SHOWN: usize = 2048;
/// Bytes of a process's command line a ticket shows.
pub const COMMAND_SHOWN: usize = 2048;
/// A key longer than this ends its object's preview: a pointer naming it stays short.
const KEY_SHOWN: usize = 64;
/// Containers nested deeper than this are not shown (each level lengthens the pointers).
const DEPTH_SHOWN: usize = 8;
/// At most this many `cut` entries; the sizes (`arguments_bytes`) still tell the truth.
const CUTS_KEPT: usize = 8;

/// A tool call's arguments as a ticket keeps them.
#[derive(Clone, Debug, PartialEq)]
pub struct Preview {
    /// The arguments with long strings shortened and members past the budget left out.
    pub shown: Value,
    /// The size of the whole arguments, as compact JSON.
    pub bytes: usize,
    /// What was shortened or left out: `{at, bytes, shown}` for a string, `{at, items,
    /// shown}` for an array or object, `at` a JSON pointer into `shown`.
    pub cut: Vec<Value>,
}

impl Preview {
    pub fn of(arguments: &Value) -> Preview {
        let mut walk = Walk { budget: ARGUMENTS_SHOWN, cut: Vec::new() };
        let shown = walk.value(arguments, String::new(), 0);
        Preview { shown, bytes: json_len(arguments), cut: walk.cut }
    }

    pub fn is_cut(&self) -> bool {
        !self.cut.is_empty()
    }
}

/// The serialized length, counted without building the text.
fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// About `value`'s serialized size, cheaply for a string (no escaping counted): to order.
fn size(value: &Value) -> usize {
    match value {
        Value::String(s) => s.len() + 2,
        other => json_len(other),
    }
}

/// `text` cut to at most `max` bytes at a character boundary: (shown, full length) when cut.
pub fn shorten(text: &str, max: usize) -> (String, Option<usize>) {
    if text.len() <= max {
        return (text.to_string(), None);
    }
    (crate::display::prefix_within(text, max).to_string(), Some(text.len()))
}

struct Walk {
    budget: usize,
    cut: Vec<Value>,
}

impl Walk {
    fn note(&mut self, entry: Value) {
        if self.cut.len() < CUTS_KEPT {
            self.cut.push(entry);
        }
    }

    fn value(&mut self, value: &Value, at: String, depth: usize) -> Value {
        match value {
            Value::String(s) => {
                let (shown, full) = shorten(s, self.budget);
                self.budget -= shown.len();
                if let Some(bytes) = full {
                    self.note(json!({"at": at, "bytes": bytes, "shown": shown.len()}));
                }
                Value::String(shown)
            }
            Value::Array(items) => {
                if depth >= DEPTH_SHOWN && !items.is_empty() {
                    self.note(json!({"at": at, "items": items.len(), "shown": 0}));
                    return json!([]);
                }
                let mut shown = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    if self.budget == 0 {
                        break;
                    }
                    shown.push(self.value(item, format!("{at}/{i}"), depth + 1));
                }
                if shown.len() < items.len() {
                    self.note(json!({"at": at, "items": items.len(), "shown": shown.len()}));
                }
                Value::Array(shown)
            }
            Value::Object(members) => {
                if depth >= DEPTH_SHOWN && !members.is_empty() {
                    self.note(json!({"at": at, "items": members.len(), "shown": 0}));
                    return json!({});
                }
                // Smallest first, so a path or a flag is never crowded out by a long content.
                let mut order: Vec<(&String, &Value)> = members.iter().collect();
                order.sort_by_cached_key(|(key, member)| key.len() + size(member));
                let mut shown = Map::new();
                for (key, member) in order {
                    if self.budget == 0 || key.len() > KEY_SHOWN.min(self.budget) {
                        break;
                    }
                    self.budget -= key.len();
                    let pointer = format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"));
                    shown.insert(key.clone(), self.value(member, pointer, depth + 1));
                }
                if shown.len() < members.len() {
                    self.note(json!({"at": at, "items": members.len(), "shown": shown.len()}));
                }
                Value::Object(shown)
            }
            scalar => {
                self.budget = self.budget.saturating_sub(json_len(scalar));
                scalar.clone()
            }
        }
    }
}

/// How many of a tool call's guarded entries a ticket lists.
pub(super) const GUARDED_SHOWN: usize = 50;

/// A pending (or just ended) ticket as approvers see it.
pub(super) fn describe(id: ApprovalId, t: &Ticket) -> Value {
    let r = &t.request;
    let mut v = json!({
        "id": id,
        "door": r.door,
        "socket": r.tool.as_ref().map(|call| call.socket),
        "operation": r.operation,
        "class": r.op.as_str(),
        "path": r.path.as_str(),
        "rule": r.rule,
        "pid": r.pid,
        "uid": r.uid,
        "command": r.command,
        "created": unix_seconds(t.created),
        "expires": unix_seconds(t.expires),
        "expires_in_seconds": t.deadline.saturating_duration_since(Instant::now()).as_secs_f64(),
        "retry": t.retry,
    });
    // What the ticket does not show whole: JSON pointers into this object.
    let mut cut = Vec::new();
    if let Some(bytes) = t.command_bytes {
        cut.push(json!({"at": "/command", "bytes": bytes, "shown": r.command.len()}));
    }
    if let Some(other) = &r.other {
        v["other_path"] = json!(other.as_str());
    }
    if let Some(call) = &r.tool {
        let arguments = &call.arguments;
        v["tool"] =
            json!({"name": call.name, "arguments": arguments.shown, "arguments_bytes": arguments.bytes});
        for entry in &arguments.cut {
            let mut entry = entry.clone();
            entry["at"] = json!(format!("/tool/arguments{}", entry["at"].as_str().unwrap_or("")));
            cut.push(entry);
        }
        if let Some(resolved) = &call.resolved {
            v["resolved"] = json!(resolved.as_str());
        }
        // What an approval lets the call act on beneath its path (approvers only: the
        // caller is not shown what an interrupt rule guards).
        let guarded = &call.reach.guarded;
        if !guarded.is_empty() {
            v["tool"]["guarded"] =
                guarded.iter().take(GUARDED_SHOWN).map(|p| json!(p.as_str())).collect::<Value>();
            if guarded.len() > GUARDED_SHOWN {
                cut.push(json!({"at": "/tool/guarded", "entries": guarded.len(), "shown": GUARDED_SHOWN}));
            }
        }
    }
    v["cut"] = Value::Array(cut);
    v
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_arguments_are_kept_whole() {
        let args = json!({"file_path": "/w/a", "content": "x", "n": 3});
        let p = Preview::of(&args);
        assert_eq!((p.shown.clone(), p.bytes, p.is_cut()), (args.clone(), args.to_string().len(), false));
    }

    #[test]
    fn a_long_string_is_cut_and_says_so() {
        let args = json!({"content": "é".repeat(200_000), "file_path": "/w/a"});
        let p = Preview::of(&args);
        let shown = p.shown["content"].as_str().unwrap();
        // The path is shown first (the smaller member), then as much content as fits, cut at
        // a character boundary.
        assert_eq!(p.shown["file_path"], json!("/w/a"));
        let budget = ARGUMENTS_SHOWN - "file_path".len() - "/w/a".len() - "content".len();
        assert_eq!(shown.len(), budget / 2 * 2);
        assert_eq!(p.bytes, args.to_string().len());
        assert_eq!(p.cut, vec![json!({"at": "/content", "bytes": 400_000, "shown": shown.len()})]);
        assert!(p.shown.to_string().len() < ARGUMENTS_SHOWN + 100);
    }

    #[test]
    fn many_members_deep_nesting_and_long_keys_stay_bounded() {
        let many: Map<String, Value> = (0..100_000).map(|i| (format!("k{i}"), json!(i))).collect();
        let mut deep = json!("x");
        for _ in 0..100 {
            deep = json!({"a/b~": [deep]});
        }
        let long_key = json!({"k".repeat(100_000): 1});
        for args in [Value::Object(many), deep, long_key] {
            let p = Preview::of(&args);
            assert!(p.is_cut(), "{}", p.shown);
            let size = json!({"a": p.shown, "c": p.cut}).to_string().len();
            assert!(size < 2 * ARGUMENTS_SHOWN, "{size}");
        }
    }
}
