//! Runs the cases of `cases.json` through agentvfs' tools and compares the texts with what
//! Deep Agents 0.7.32's own tools return for them (`deepagents_texts.py`). Compiled as part of
//! the file-tool unit tests (`src/control/tools/tests_files.rs`), whose fixture it uses.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{json, Value};

use super::Fx;
use crate::control::session::Observation;
use crate::control::tools::common::char_len;
use crate::control::tools::{delete, edit_file, ls, read_file, write_file, Block};
use crate::policy::{Mode, Op, Rule};

/// Builds one reference case (see `tests/reference/gen_cases.py`) over a single memory route
/// and returns the text of its last call; media blocks print as `media <mime> <base64>`.
fn run_reference_case(case: &Value) -> String {
    let rules = case["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| Rule {
            operations: r["operations"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| Op::parse(o.as_str().unwrap()).unwrap())
                .collect(),
            paths: r["paths"].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect(),
            mode: Mode::parse(r["mode"].as_str().unwrap()).unwrap(),
            hide: true,
        })
        .collect();
    let fx = Fx::with(&["/"], rules, Observation::Strict);
    let put = |entry: &Value| {
        let path = entry["path"].as_str().unwrap();
        if entry.get("dir").is_some() {
            fx.dir(path);
        } else if let Some(target) = entry.get("symlink") {
            fx.link(path, target.as_str().unwrap());
        } else {
            fx.put(path, &entry_content(entry));
        }
    };
    for entry in case["setup"].as_array().unwrap() {
        if let Some(many) = entry.get("many") {
            for i in 0..many["count"].as_u64().unwrap() {
                let path =
                    format!("{}/{}{i:05}", many["dir"].as_str().unwrap(), many["prefix"].as_str().unwrap());
                fx.put(&path, many.get("text").and_then(Value::as_str).unwrap_or("").as_bytes());
            }
        } else {
            put(entry);
        }
    }
    let mut text = String::new();
    let last = json!({"tool": case["tool"], "args": case["args"]});
    for step in case["steps"].as_array().unwrap().iter().chain([&last]) {
        if let Some(entry) = step.get("put") {
            put(entry);
            continue;
        }
        let spec = match step["tool"].as_str().unwrap() {
            "ls" => &ls::SPEC,
            "read_file" => &read_file::SPEC,
            "write_file" => &write_file::SPEC,
            "edit_file" => &edit_file::SPEC,
            "delete" => &delete::SPEC,
            other => panic!("no tool {other}"),
        };
        let out = fx.call(spec, step["args"].clone());
        let parts: Vec<String> = out
            .content
            .iter()
            .map(|b| match b {
                Block::Text(t) => t.clone(),
                Block::Media { data, mime_type, .. } => format!("media {mime_type} {data}"),
            })
            .collect();
        text = parts.join("\n");
    }
    text
}

fn entry_content(entry: &Value) -> Vec<u8> {
    if let Some(text) = entry.get("text") {
        return text.as_str().unwrap().as_bytes().to_vec();
    }
    if let Some(hex) = entry.get("hex").and_then(Value::as_str) {
        return (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
    }
    if let Some(repeat) = entry.get("repeat") {
        return repeat.as_str().unwrap().repeat(entry["times"].as_u64().unwrap() as usize).into_bytes();
    }
    let pieces = entry["pieces"].as_array().unwrap();
    pieces
        .iter()
        .map(|p| p[0].as_str().unwrap().repeat(p[1].as_u64().unwrap() as usize))
        .collect::<String>()
        .into_bytes()
}

fn shorten(s: &str) -> String {
    if s.len() <= 400 {
        return format!("{s:?}");
    }
    let (head, tail) =
        (s.chars().take(200).collect::<String>(), s.chars().rev().take(100).collect::<String>());
    format!("{head:?} ...[{} chars]... {:?}", char_len(s), tail.chars().rev().collect::<String>())
}

/// Every case of `tests/reference/cases.json` against Deep Agents 0.7.32's own tools (run
/// by `deepagents_texts.py`), except the deliberate differences, which are checked against
/// the text agentvfs promises instead. Without deepagents installed the comparison is
/// skipped (set `AGENTVFS_REQUIRE_REFERENCE=1` to make that a failure).
#[test]
fn texts_match_deep_agents() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference");
    let cases: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cases.json")).unwrap()).unwrap();
    let ours: HashMap<String, String> =
        cases.iter().map(|c| (c["name"].as_str().unwrap().to_string(), run_reference_case(c))).collect();
    let mut failures = Vec::new();
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        if let Some(want) = case.get("agentvfs").and_then(Value::as_str) {
            if ours[name] != want {
                failures.push(format!(
                    "{name}: agentvfs {} but promises {}",
                    shorten(&ours[name]),
                    shorten(want)
                ));
            }
        }
    }
    let output = std::process::Command::new("python3").arg(dir.join("deepagents_texts.py")).output();
    let required = std::env::var_os("AGENTVFS_REQUIRE_REFERENCE").is_some();
    match &output {
        Ok(o) if o.status.success() => {
            let reference: HashMap<String, String> = serde_json::from_slice(&o.stdout).unwrap();
            for case in cases.iter().filter(|c| c.get("differs").is_none()) {
                let name = case["name"].as_str().unwrap();
                if ours[name] != reference[name] {
                    failures.push(format!(
                        "{name}: agentvfs {}\n  deepagents {}",
                        shorten(&ours[name]),
                        shorten(&reference[name])
                    ));
                }
            }
        }
        _ if required => panic!("the Deep Agents reference could not run: {output:?}"),
        Ok(o) => {
            eprintln!("skipping the Deep Agents comparison: {}", String::from_utf8_lossy(&o.stderr).trim())
        }
        Err(e) => eprintln!("skipping the Deep Agents comparison: python3: {e}"),
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}
