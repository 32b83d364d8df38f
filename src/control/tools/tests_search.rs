//! Tests of `glob` and `grep` over an engine with memory backends: Deep Agents' exact texts,
//! its glob-semantics matrix, pre-checks, result filtering, limits and truncation.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::*;
use crate::audit::Audit;
use crate::backend::memory::MemoryBackend;
use crate::backend::{Attr, Backend, Caller, DirEntry, OpenFile, SetAttr, StatFs};
use crate::control::session::{Observation, Session};
use crate::control::tools::common::{format_file_paths, TRUNCATION_GUIDANCE};
use crate::control::tools::{grep, pattern};
use crate::control::vfs::ToolFs;
use crate::engine::Engine;
use crate::error::{Errno, FsError, FsResult};
use crate::policy::{Gate, Mode, Op, Rule, RuleSet};
use crate::route::{Route, Router};
use crate::vpath::VPath;

/// A memory backend that can be slow to list directories, or fail to list one.
struct Faulty {
    inner: MemoryBackend,
    delay: Duration,
    broken: Option<&'static str>,
}

impl Backend for Faulty {
    fn describe(&self) -> String {
        "faulty".into()
    }
    fn getattr(&self, path: &str) -> FsResult<Attr> {
        self.inner.getattr(path)
    }
    fn readdir(&self, path: &str) -> FsResult<Vec<DirEntry>> {
        std::thread::sleep(self.delay);
        if self.broken == Some(path) {
            return Err(FsError::new(Errno::EIO, "broken"));
        }
        self.inner.readdir(path)
    }
    fn open(&self, path: &str, flags: i32) -> FsResult<Box<dyn OpenFile>> {
        self.inner.open(path, flags)
    }
    fn create(&self, path: &str, mode: u32, flags: i32, c: &Caller) -> FsResult<(Attr, Box<dyn OpenFile>)> {
        self.inner.create(path, mode, flags, c)
    }
    fn mknod(&self, path: &str, mode: u32, rdev: u32, c: &Caller) -> FsResult<Attr> {
        self.inner.mknod(path, mode, rdev, c)
    }
    fn mkdir(&self, path: &str, mode: u32, c: &Caller) -> FsResult<Attr> {
        self.inner.mkdir(path, mode, c)
    }
    fn symlink(&self, path: &str, target: &[u8], c: &Caller) -> FsResult<Attr> {
        self.inner.symlink(path, target, c)
    }
    fn link(&self, existing: &str, new_path: &str) -> FsResult<Attr> {
        self.inner.link(existing, new_path)
    }
    fn readlink(&self, path: &str) -> FsResult<Vec<u8>> {
        self.inner.readlink(path)
    }
    fn unlink(&self, path: &str) -> FsResult<()> {
        self.inner.unlink(path)
    }
    fn rmdir(&self, path: &str) -> FsResult<()> {
        self.inner.rmdir(path)
    }
    fn rename(&self, from: &str, to: &str, flags: u32) -> FsResult<()> {
        self.inner.rename(from, to, flags)
    }
    fn setattr(&self, path: &str, changes: &SetAttr) -> FsResult<Attr> {
        self.inner.setattr(path, changes)
    }
    fn statfs(&self, path: &str) -> FsResult<StatFs> {
        self.inner.statfs(path)
    }
}

fn rule(ops: &[Op], paths: &[&str], mode: Mode, hide: bool) -> Rule {
    Rule { operations: ops.to_vec(), paths: paths.iter().map(|s| s.to_string()).collect(), mode, hide }
}

fn deny(paths: &[&str]) -> Rule {
    rule(&[Op::Read], paths, Mode::Deny, true)
}

fn engine_with(rules: Vec<Rule>, root: Arc<dyn Backend>) -> Engine {
    let route = |prefix: &str, backend: Arc<dyn Backend>| Route {
        prefix: VPath::parse(prefix).unwrap(),
        backend,
        ttl: Duration::from_secs(1),
        kind: "memory",
        read_only: false,
    };
    Engine::new(
        Gate::new(RuleSet::new(rules).unwrap()),
        Router::new(vec![route("/", root), route("/mem", Arc::new(MemoryBackend::new(None)))]),
        Arc::new(Audit::open(None, crate::config::DEFAULT_AUDIT_MAX_RECORDS).unwrap()),
    )
}

fn engine(rules: Vec<Rule>) -> Engine {
    engine_with(rules, Arc::new(MemoryBackend::new(None)))
}

fn put(e: &Engine, path: &str, data: &[u8]) {
    ToolFs::new(e).write_atomic(&VPath::parse(path).unwrap(), data, 0o644).unwrap();
}

/// Adds files behind the gate's back (for trees the rules would not let a tool write).
fn plant(e: &Engine, path: &str, data: &[u8]) {
    let rules = e.gate.rules();
    e.gate.reload(RuleSet::empty());
    put(e, path, data);
    e.gate.reload(RuleSet::new(rules.rules().to_vec()).unwrap());
}

fn call(e: &Engine, spec: &ToolSpec, args: serde_json::Value) -> ToolOutput {
    let session = Session::new(Observation::Off);
    let env = ToolEnv { fs: ToolFs::new(e), session: &session, exec: None, call_id: None, structured: false };
    (spec.call)(&env, &args)
}

fn text(out: &ToolOutput) -> String {
    out.joined_text()
}

fn glob(e: &Engine, args: serde_json::Value) -> String {
    text(&call(e, &SPEC, args))
}

fn grep(e: &Engine, args: serde_json::Value) -> String {
    text(&call(e, &grep::SPEC, args))
}

fn code(out: &ToolOutput) -> Option<&str> {
    out.structured.get("error_code").and_then(|v| v.as_str())
}

/// T/backends/test_glob_semantics.py's tree.
fn matrix_tree() -> Engine {
    let e = engine(vec![]);
    for (path, data) in [
        ("/a.py", "a"),
        ("/sub/b.py", "b"),
        ("/sub/nested/c.py", "c"),
        ("/readme.md", "docs"),
        ("/.hidden.py", "h"),
        ("/.hidden/x.py", "x"),
        ("/.github/workflows/ci.yml", "name: ci"),
    ] {
        put(&e, path, data.as_bytes());
    }
    e
}

#[test]
fn glob_matrix_matches_deep_agents() {
    let e = matrix_tree();
    let bare_py = "'/.hidden/x.py', '/a.py', '/sub/b.py', '/sub/nested/c.py'";
    let walked_py = "'/a.py', '/sub/b.py', '/sub/nested/c.py'";
    let ci = "'/.github/workflows/ci.yml'";
    let cases: Vec<(&str, &str, String)> = vec![
        ("*.py", "/", format!("[{bare_py}]")),
        ("**/*.py", "/", format!("[{walked_py}]")),
        ("*.md", "/", "['/readme.md']".into()),
        ("sub/*.py", "/", "['/sub/b.py']".into()),
        ("sub/**/*.py", "/", "['/sub/b.py', '/sub/nested/c.py']".into()),
        ("/*.py", "/", "['/a.py']".into()),
        ("a.py/**", "/", "No files found".into()),
        ("*.py", "/sub", "['/sub/b.py', '/sub/nested/c.py']".into()),
        ("*.yml", "/", format!("[{ci}]")),
        ("**/*.yml", "/", "No files found".into()),
        (".github/**/*.yml", "/", format!("[{ci}]")),
        (".hidden.py", "/", "['/.hidden.py']".into()),
        (".*.py", "/", "['/.hidden.py']".into()),
        (
            "*",
            "/",
            format!("[{ci}, '/.hidden/x.py', '/a.py', '/readme.md', '/sub/b.py', '/sub/nested/c.py']"),
        ),
        (
            "*.{py,md}",
            "/",
            "['/.hidden/x.py', '/a.py', '/readme.md', '/sub/b.py', '/sub/nested/c.py']".into(),
        ),
        ("*.{yml,yaml}", "/", format!("[{ci}]")),
        ("?.py", "/", format!("[{bare_py}]")),
        ("[ab].py", "/", "['/a.py', '/sub/b.py']".into()),
        ("[!a].py", "/", "['/.hidden/x.py', '/sub/b.py', '/sub/nested/c.py']".into()),
        ("[^a].py", "/", "['/.hidden/x.py', '/sub/b.py', '/sub/nested/c.py']".into()),
        // Directories are never returned, and a trailing `/` names directories only.
        ("sub", "/", "No files found".into()),
        ("sub/", "/", "No files found".into()),
    ];
    for (pattern, path, want) in cases {
        assert_eq!(glob(&e, json!({"pattern": pattern, "path": path})), want, "{pattern} in {path}");
    }
}

#[test]
fn glob_without_path_searches_the_whole_tree_and_every_route() {
    let e = matrix_tree();
    put(&e, "/mem/notes.md", b"n");
    put(&e, "/mem/deep/more.md", b"n");
    assert_eq!(glob(&e, json!({"pattern": "*.md"})), "['/mem/deep/more.md', '/mem/notes.md', '/readme.md']");
    // An anchored pattern at the root reaches only top-level files, as in Deep Agents' Composite.
    assert_eq!(glob(&e, json!({"pattern": "/*.md"})), "['/readme.md']");
    assert_eq!(glob(&e, json!({"pattern": "/mem/**/*.md"})), "['/mem/deep/more.md', '/mem/notes.md']");
    assert_eq!(glob(&e, json!({"pattern": "*.md", "path": "/mem/deep"})), "['/mem/deep/more.md']");
    // Paths that name nothing, or a file, have no files beneath them.
    assert_eq!(glob(&e, json!({"pattern": "*", "path": "/nowhere"})), "No files found");
    assert_eq!(glob(&e, json!({"pattern": "*", "path": "/a.py"})), "No files found");
    // "", "." and "./" mean the root (deviation 8).
    assert_eq!(glob(&e, json!({"pattern": "*.md", "path": "."})), glob(&e, json!({"pattern": "*.md"})));
}

#[test]
fn glob_pattern_and_path_errors() {
    let e = matrix_tree();
    let out = call(&e, &SPEC, json!({"pattern": "../*.py", "path": "/sub"}));
    assert_eq!(text(&out), "Error: Path traversal not allowed in glob pattern '../*.py'");
    assert!(out.is_error);
    assert_eq!(
        glob(&e, json!({"pattern": "a\\..\\b"})),
        "Error: Path traversal not allowed in glob pattern 'a\\\\..\\\\b'"
    );
    let broad = "{a,}".repeat(10) + "x";
    assert_eq!(
        glob(&e, json!({"pattern": broad})),
        format!("Error: Invalid glob pattern '{broad}': Pattern limit exceeded the limit of 1000")
    );
    let out = call(&e, &SPEC, json!({"pattern": "*", "path": "/a/../b"}));
    assert_eq!(text(&out), "Error: Path traversal not allowed: /a/../b");
    assert_eq!(code(&out), Some("FS_INVALID_PATH"));
    let out = call(&e, &SPEC, json!({"path": "/"}));
    assert_eq!(text(&out), "Error: argument `pattern` must be a string, got nothing");
    assert_eq!(glob(&e, json!({"pattern": ""})), "No files found");
}

#[test]
fn glob_precheck_judges_the_search_root_as_a_directory() {
    let e = engine(vec![rule(&[Op::Read], &["/pub/**"], Mode::Allow, true), deny(&["/**"])]);
    plant(&e, "/pub/a.txt", b"a");
    plant(&e, "/other/b.txt", b"b");
    // Deep Agents refuses `/pub` itself here; agentvfs judges it as `/pub/` too (deviation 11).
    assert_eq!(glob(&e, json!({"pattern": "*.txt", "path": "/pub"})), "['/pub/a.txt']");
    let out = call(&e, &SPEC, json!({"pattern": "*.txt", "path": "/other"}));
    assert_eq!(text(&out), "Error: permission denied for read on /other");
    assert_eq!(code(&out), Some("FS_PERMISSION_DENIED"));
    assert_eq!(
        glob(&e, json!({"pattern": "pub/*.txt"})),
        format!("Error: permission denied for read on /{PATHLESS_DENIED_HINT}")
    );
}

#[test]
fn glob_results_are_filtered_by_the_rules() {
    let e = matrix_tree();
    e.gate.reload(
        RuleSet::new(vec![
            // Hidden: never listed. Not hidden: listed by `ls`, yet still not a search result.
            deny(&["/sub/nested/**"]),
            rule(&[Op::Read], &["/sub/b.py"], Mode::Deny, false),
            // Rules reach dot-files (deviation 1).
            deny(&["/.hidden/**"]),
            // Interrupt-mode results are kept, as in Deep Agents.
            rule(&[Op::Read], &["/a.py"], Mode::Interrupt, true),
        ])
        .unwrap(),
    );
    assert_eq!(glob(&e, json!({"pattern": "*.py"})), "['/a.py']");
    assert_eq!(e.audit.recorded(), 0, "a search is not a refused read of each denied entry");
}

#[test]
fn glob_follows_symlinks_to_files_inside_the_tree() {
    let e = matrix_tree();
    e.gate.reload(RuleSet::new(vec![deny(&["/secret/**"])]).unwrap());
    plant(&e, "/secret/key.py", b"k");
    let fs = ToolFs::new(&e);
    fs.engine.symlink(&fs.ctx, &VPath::parse("/sub/link.py").unwrap(), b"/a.py").unwrap();
    fs.engine.symlink(&fs.ctx, &VPath::parse("/sub/leak.py").unwrap(), b"/secret/key.py").unwrap();
    fs.engine.symlink(&fs.ctx, &VPath::parse("/sub/dir.py").unwrap(), b"/sub/nested").unwrap();
    assert_eq!(
        glob(&e, json!({"pattern": "*.py", "path": "/sub"})),
        "['/sub/b.py', '/sub/link.py', '/sub/nested/c.py']"
    );
    // A search root through a symlink is judged, and searched, where it leads.
    fs.engine.symlink(&fs.ctx, &VPath::parse("/s").unwrap(), b"secret").unwrap();
    fs.engine.symlink(&fs.ctx, &VPath::parse("/n").unwrap(), b"sub/nested").unwrap();
    assert_eq!(
        glob(&e, json!({"pattern": "*", "path": "/s"})),
        "Error: permission denied for read on /s (resolves to /secret)"
    );
    assert_eq!(
        grep(&e, json!({"pattern": "k", "path": "/s/key.py"})),
        "Error: permission denied for read on /s/key.py (resolves to /secret/key.py)"
    );
    assert_eq!(glob(&e, json!({"pattern": "*", "path": "/n"})), "['/sub/nested/c.py']");
    fs.engine.symlink(&fs.ctx, &VPath::parse("/loop").unwrap(), b"/loop").unwrap();
    assert_eq!(glob(&e, json!({"pattern": "*", "path": "/loop"})), "Error: cannot resolve /loop");
    assert_eq!(grep(&e, json!({"pattern": "a", "path": "/sub"})), "/sub/link.py");
}

#[test]
fn glob_list_is_capped_like_deep_agents() {
    // 1000 paths of 103 characters: Deep Agents keeps 746, then the guidance (checked by hand
    // against `truncate_if_too_long`).
    let paths: Vec<String> = (0..1000).map(|i| format!("/{}{i:04}", "x".repeat(98))).collect();
    let (listed, shown) = format_file_paths(paths.clone());
    assert_eq!(shown, Some(746));
    assert_eq!(listed.matches(", '/x").count() + 1, 746);
    assert!(listed.ends_with(&format!(", '{TRUNCATION_GUIDANCE}']")));
    assert_eq!(listed.chars().count(), 79_895);
    assert_eq!(format_file_paths(paths[..10].to_vec()).1, None);
}

#[test]
fn busy_refusal_when_four_globs_are_running() {
    let e = matrix_tree();
    let session = Session::new(Observation::Off);
    let env =
        ToolEnv { fs: ToolFs::new(&e), session: &session, exec: None, call_id: None, structured: false };
    let slots = Slots::new(MAX_IN_FLIGHT);
    let held: Vec<_> = (0..4).map(|_| slots.try_acquire().unwrap()).collect();
    let out = run(&env, &json!({"pattern": "*.py"}), &slots, LIMITS);
    assert_eq!(text(&out), BUSY);
    assert_eq!(code(&out), Some("FS_BUSY"));
    drop(held);
    assert!(text(&run(&env, &json!({"pattern": "*.py"}), &slots, LIMITS)).starts_with("['/.hidden/x.py'"));
    assert_eq!(slots.in_use(), 0);
}

#[test]
fn busy_refusal_with_real_calls_in_flight() {
    let slow = Faulty { inner: MemoryBackend::new(None), delay: Duration::from_millis(300), broken: None };
    let e = engine_with(vec![], Arc::new(slow));
    put(&e, "/f.py", b"x");
    let slots = Slots::new(MAX_IN_FLIGHT);
    std::thread::scope(|scope| {
        let running: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    let session = Session::new(Observation::Off);
                    let env = ToolEnv {
                        fs: ToolFs::new(&e),
                        session: &session,
                        exec: None,
                        call_id: None,
                        structured: false,
                    };
                    text(&run(&env, &json!({"pattern": "*.py"}), &slots, LIMITS))
                })
            })
            .collect();
        while slots.in_use() < 4 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let session = Session::new(Observation::Off);
        let env =
            ToolEnv { fs: ToolFs::new(&e), session: &session, exec: None, call_id: None, structured: false };
        assert_eq!(text(&run(&env, &json!({"pattern": "*.py"}), &slots, LIMITS)), BUSY);
        for call in running {
            assert_eq!(call.join().unwrap(), "['/f.py']");
        }
    });
}

#[test]
fn glob_time_limits() {
    assert_eq!(
        timeout_message(LIMITS.deadline),
        "Error: glob timed out after 10.0s. Try a more specific pattern or a narrower path."
    );
    let slow = Faulty { inner: MemoryBackend::new(None), delay: Duration::from_millis(40), broken: None };
    let e = engine_with(vec![], Arc::new(slow));
    // Nested, so the walk takes six slow listings one after another however many threads run.
    for d in 1..=6 {
        put(&e, &format!("/{}/f.py", vec!["d"; d].join("/")), b"x");
    }
    let session = Session::new(Observation::Off);
    let env =
        ToolEnv { fs: ToolFs::new(&e), session: &session, exec: None, call_id: None, structured: false };
    let slots = Slots::new(MAX_IN_FLIGHT);
    // Past the budget the walk returns what it found, with the time-limit note.
    let limits = Limits { budget: Duration::from_millis(60), deadline: Duration::from_secs(10) };
    let out = text(&run(&env, &json!({"pattern": "*.py"}), &slots, limits));
    assert!(out.ends_with(&format!("\n\n{TRUNCATION_NOTE}")), "{out}");
    // A backend call that outlasts the deadline gets the timeout error.
    let limits = Limits { budget: Duration::from_secs(10), deadline: Duration::from_millis(20) };
    let out = run(&env, &json!({"pattern": "*.py"}), &slots, limits);
    assert_eq!(text(&out), timeout_message(Duration::from_millis(20)));
    assert_eq!(code(&out), Some("FS_TIMEOUT"));
}

#[test]
fn grep_time_limit_returns_what_it_found_as_truncated() {
    let slow = Faulty { inner: MemoryBackend::new(None), delay: Duration::from_millis(40), broken: None };
    let e = engine_with(vec![], Arc::new(slow));
    for d in 1..=6 {
        put(&e, &format!("/{}/f.txt", vec!["d"; d].join("/")), b"needle");
    }
    let session = Session::new(Observation::Off);
    let env =
        ToolEnv { fs: ToolFs::new(&e), session: &session, exec: None, call_id: None, structured: false };
    let out = grep::run(&env, &json!({"pattern": "needle"}), Duration::from_millis(60));
    assert!(text(&out).ends_with(&format!("\n\n{}", grep::TRUNCATION_NOTE)), "{}", text(&out));
    assert_eq!(out.structured["truncated"], json!(true));
    let out = grep::run(&env, &json!({"pattern": "needle"}), Duration::from_secs(30));
    assert_eq!(out.structured["match_count"], json!(6));
    assert_eq!(out.structured["truncated"], json!(false));
}

#[test]
fn unreadable_directories_get_their_own_note() {
    let faulty = Faulty { inner: MemoryBackend::new(None), delay: Duration::ZERO, broken: Some("locked") };
    let e = engine_with(vec![], Arc::new(faulty));
    put(&e, "/ok.py", b"x");
    put(&e, "/locked/hidden.py", b"x");
    let out = call(&e, &SPEC, json!({"pattern": "*.py"}));
    assert_eq!(text(&out), format!("['/ok.py']\n\n{UNREADABLE_NOTE}"));
    assert_eq!(out.structured["paths"], json!(["/ok.py"]));
    assert_eq!(out.structured["truncation_reason"], json!("unreadable"));
}

fn grep_tree() -> Engine {
    let e = engine(vec![]);
    put(&e, "/dir/a.py", b"import os\nx = 1\n");
    put(&e, "/dir/b.py", b"x = 1\nprint(x)\n");
    put(&e, "/readme.md", b"nothing here\n");
    e
}

#[test]
fn grep_output_modes() {
    let e = grep_tree();
    assert_eq!(grep(&e, json!({"pattern": "x"})), "/dir/a.py\n/dir/b.py");
    assert_eq!(
        grep(&e, json!({"pattern": "x", "output_mode": "files_with_matches"})),
        "/dir/a.py\n/dir/b.py"
    );
    assert_eq!(
        grep(&e, json!({"pattern": "x", "output_mode": "content"})),
        "/dir/a.py:\n  2: x = 1\n/dir/b.py:\n  1: x = 1\n  2: print(x)"
    );
    assert_eq!(grep(&e, json!({"pattern": "x", "output_mode": "count"})), "/dir/a.py: 1\n/dir/b.py: 2");
    assert_eq!(grep(&e, json!({"pattern": "absent"})), grep::NO_MATCHES);
    // One line counts once however often it matches.
    put(&e, "/dir/c.txt", b"xx xx\n");
    assert_eq!(grep(&e, json!({"pattern": "xx", "output_mode": "count"})), "/dir/c.txt: 1");
    let out = call(&e, &grep::SPEC, json!({"pattern": "x", "output_mode": "lines"}));
    assert!(out.is_error && text(&out).contains("output_mode"));
}

#[test]
fn grep_is_literal_and_hints_at_regex_only_on_a_real_miss() {
    let e = grep_tree();
    let hint = format!("{}\n\n{}", grep::NO_MATCHES, grep::REGEX_HINT);
    for pattern in ["import|print", "x.*1", "x.+", "\\d", "a\\.b", "\\(", "x\\|y"] {
        assert_eq!(grep(&e, json!({"pattern": pattern})), hint, "{pattern}");
    }
    for pattern in ["self.tools", "arr[0]", "def __init__(self):", "a\\q", "^x$"] {
        assert_eq!(grep(&e, json!({"pattern": pattern})), grep::NO_MATCHES, "{pattern}");
    }
    put(&e, "/dir/re.txt", b"a|b and (x) and .* too\n");
    assert_eq!(grep(&e, json!({"pattern": "a|b"})), "/dir/re.txt");
    assert_eq!(grep(&e, json!({"pattern": ".*"})), "/dir/re.txt");
    assert_eq!(grep(&e, json!({"pattern": "(x) and"})), "/dir/re.txt");
    // The text the hint names: `|`, `.*` and `\.` in backticks.
    assert!(grep::REGEX_HINT.contains("like `|`, `.*`, and `\\.` are searched verbatim"));
}

#[test]
fn grep_max_count_edges() {
    let e = engine(vec![]);
    put(&e, "/a.txt", b"hit 1\nhit 2\n");
    put(&e, "/b.txt", b"hit 3\nmiss\nhit 4\n");
    let note = format!("\n\n{}", grep::TRUNCATION_NOTE);
    let content = |max: i64| grep(&e, json!({"pattern": "hit", "output_mode": "content", "max_count": max}));
    // Exactly max matches with none dropped is complete.
    assert_eq!(content(4), "/a.txt:\n  1: hit 1\n  2: hit 2\n/b.txt:\n  1: hit 3\n  3: hit 4");
    assert_eq!(content(3), format!("/a.txt:\n  1: hit 1\n  2: hit 2\n/b.txt:\n  1: hit 3{note}"));
    // The cap falls on a file boundary: the next file's match proves there are more.
    assert_eq!(content(2), format!("/a.txt:\n  1: hit 1\n  2: hit 2{note}"));
    assert_eq!(content(1), format!("/a.txt:\n  1: hit 1{note}"));
    assert_eq!(
        grep(&e, json!({"pattern": "hit", "output_mode": "count", "max_count": 3})),
        format!("/a.txt: 2\n/b.txt: 1{note}")
    );
    assert_eq!(grep(&e, json!({"pattern": "hit", "max_count": 2})), format!("/a.txt{note}"));
    for bad in [0, -1] {
        let out = call(&e, &grep::SPEC, json!({"pattern": "hit", "max_count": bad}));
        assert!(out.is_error);
        assert_eq!(code(&out), Some("FS_INVALID_ARGUMENT"));
    }
    // The default cap is 1000 matches.
    let lines = |n: usize| (0..n).map(|i| format!("hit {i}\n")).collect::<String>();
    put(&e, "/a.txt", lines(998).as_bytes());
    assert!(!grep(&e, json!({"pattern": "hit"})).contains("Note:"), "998 + 2 = 1000 matches");
    put(&e, "/a.txt", lines(999).as_bytes());
    assert_eq!(grep(&e, json!({"pattern": "hit"})), format!("/a.txt\n/b.txt{note}"));
}

#[test]
fn grep_lines_end_at_newlines_only() {
    let e = engine(vec![]);
    put(&e, "/f.txt", b"one\x0cfoo\rtwo\r\nfoo\x0b\nlast foo");
    assert_eq!(
        grep(&e, json!({"pattern": "foo", "output_mode": "content"})),
        "/f.txt:\n  1: one\x0cfoo\rtwo\r\n  2: foo\x0b\n  3: last foo"
    );
    // The empty pattern matches every line; a pattern with a newline matches none.
    assert_eq!(grep(&e, json!({"pattern": "", "output_mode": "count"})), "/f.txt: 3");
    assert_eq!(grep(&e, json!({"pattern": "two\r\nfoo"})), grep::NO_MATCHES);
}

#[test]
fn grep_skips_binary_and_large_files() {
    let e = engine(vec![]);
    put(&e, "/text.txt", b"needle\n");
    put(&e, "/nul.bin", b"needle\0\n");
    put(&e, "/latin1.txt", b"needle \xe9\n");
    let mut late_nul = vec![b'a'; 9000];
    late_nul.extend_from_slice(b"\0 needle\n");
    put(&e, "/late-nul.txt", &late_nul);
    let mut big = vec![b'.'; grep::MAX_FILE_BYTES as usize];
    big.extend_from_slice(b"needle");
    put(&e, "/big.txt", &big);
    put(&e, "/limit.txt", &big[6..]);
    // A NUL past the first 8 KiB does not make a UTF-8 file binary.
    assert_eq!(grep(&e, json!({"pattern": "needle"})), "/late-nul.txt\n/limit.txt\n/text.txt");
}

#[test]
fn grep_include_glob_and_search_root() {
    let e = engine(vec![]);
    put(&e, "/src/app/main.py", b"import os");
    put(&e, "/readme.md", b"import nothing");
    put(&e, "/.github/ci.yml", b"import ci");
    let files = |args: serde_json::Value| grep(&e, args);
    assert_eq!(files(json!({"pattern": "import", "glob": "src/**/*.py"})), "/src/app/main.py");
    assert_eq!(files(json!({"pattern": "import", "glob": "**/*.py"})), "/src/app/main.py");
    assert_eq!(files(json!({"pattern": "import", "glob": "*.py"})), "/src/app/main.py");
    assert_eq!(files(json!({"pattern": "import", "glob": "*.md"})), "/readme.md");
    assert_eq!(files(json!({"pattern": "import", "glob": "app/*.py"})), grep::NO_MATCHES);
    assert_eq!(files(json!({"pattern": "import", "path": "/src", "glob": "app/*.py"})), "/src/app/main.py");
    assert_eq!(files(json!({"pattern": "import", "glob": "*.{md,yml}"})), "/.github/ci.yml\n/readme.md");
    // Without a filter, dot-directories are searched too.
    assert_eq!(files(json!({"pattern": "import"})), "/.github/ci.yml\n/readme.md\n/src/app/main.py");
    // A file as the search root is searched itself; the filter applies to its name.
    assert_eq!(files(json!({"pattern": "import", "path": "/readme.md"})), "/readme.md");
    assert_eq!(files(json!({"pattern": "import", "path": "/readme.md", "glob": "*.py"})), grep::NO_MATCHES);
    assert_eq!(files(json!({"pattern": "import", "path": "/missing"})), grep::NO_MATCHES);
    // A refused filter is returned verbatim, without `Error: `, as an error.
    let out = call(&e, &grep::SPEC, json!({"pattern": "import", "glob": "../*.py"}));
    assert_eq!(text(&out), "Path traversal not allowed in glob pattern '../*.py'");
    assert!(out.is_error);
    let out = call(&e, &grep::SPEC, json!({"pattern": "import", "path": "../x"}));
    assert_eq!(text(&out), "Error: Path traversal not allowed: ../x");
}

#[test]
fn grep_precheck_only_with_a_path_and_filtering_always() {
    let e = engine(vec![
        deny(&["/secrets/**"]),
        rule(&[Op::Read], &["/pub/**"], Mode::Allow, true),
        rule(&[Op::Read], &["/shown/**"], Mode::Deny, false),
    ]);
    plant(&e, "/secrets/key.txt", b"token");
    plant(&e, "/secrets/.env", b"token");
    plant(&e, "/pub/a.txt", b"token");
    plant(&e, "/shown/b.txt", b"token");
    plant(&e, "/ok.txt", b"token");
    let out = call(&e, &grep::SPEC, json!({"pattern": "token", "path": "/secrets"}));
    assert_eq!(text(&out), "Error: permission denied for read on /secrets");
    assert_eq!(code(&out), Some("FS_PERMISSION_DENIED"));
    assert_eq!(
        grep(&e, json!({"pattern": "token", "path": "/shown"})),
        "Error: permission denied for read on /shown"
    );
    // A pathless search is not refused; denied files are simply not in the results.
    assert_eq!(grep(&e, json!({"pattern": "token"})), "/ok.txt\n/pub/a.txt");
    assert_eq!(grep(&e, json!({"pattern": "token", "path": "/pub"})), "/pub/a.txt");
    // Matches only in denied files are a miss, not a hint-worthy regex miss.
    assert_eq!(grep(&e, json!({"pattern": "token", "path": "/", "glob": "key.txt"})), grep::NO_MATCHES);
    // The two refused search roots are audited; files left out of results are not refusals.
    assert_eq!(e.audit.recorded(), 2);
}

#[test]
fn grep_body_is_capped_at_80000_characters() {
    let e = engine(vec![]);
    let line = format!("match {}\n", "é".repeat(994));
    put(&e, "/long.txt", line.repeat(100).as_bytes());
    let out = grep(&e, json!({"pattern": "match", "output_mode": "content"}));
    assert_eq!(out.chars().count(), 80_000);
    assert!(out.starts_with("/long.txt:\n  1: match éé"));
    assert!(out.ends_with(&format!("é\n{TRUNCATION_GUIDANCE}")));
    // The match-count note survives the cap.
    let out = grep(&e, json!({"pattern": "match", "output_mode": "content", "max_count": 99}));
    assert!(out.ends_with(&format!("{TRUNCATION_GUIDANCE}\n\n{}", grep::TRUNCATION_NOTE)));
}

#[test]
fn descriptions_and_schemas() {
    let with = (grep::SPEC.description)(&Listed { execute: true });
    let without = (grep::SPEC.description)(&Listed { execute: false });
    assert!(with.contains("use the execute tool with `rg '<regex>'`"));
    assert!(!without.contains("execute"));
    assert!(without.starts_with("Search for a LITERAL text pattern across files (NOT regex).\n\n"));
    assert!(without.contains("`.*` or `\\.` match those characters literally.\n\nReturns"));
    assert!((SPEC.description)(&Listed::default()).starts_with("Find files matching a glob pattern"));
    for spec in [&SPEC, &grep::SPEC] {
        assert!(spec.read_only && !spec.destructive);
        assert_eq!((spec.input_schema)()["required"], json!(["pattern"]));
    }
    assert_eq!((grep::SPEC.input_schema)()["properties"]["output_mode"]["default"], "files_with_matches");
}

#[test]
fn matcher_details_agree_with_wcmatch() {
    // Checked by hand against deepagents' compile_grep_include_glob (wcmatch 12.0.1).
    let cases = [
        ("a/**", "a", false),
        ("a/**", "a/.x", false),
        ("**/**/*.py", "a.py", true),
        ("a//b.py", "a/b.py", true),
        ("[.]x", ".x", false),
        ("\\.a", ".a", true),
        ("{.a,b}", ".a", true),
        ("a\\", "a", true),
        ("[z-ab]", "b", true),
        ("[a-c-e]", "-", true),
        ("[]-a]", "-", false),
        ("[[:alpha:]x]", "x", true),
        ("*[", "a[", true),
        ("x[a/b]y", "x[a/b]y", true),
        ("{a}{b,c}", "{a}b", true),
        ("{{a,b}", "{a", true),
        ("{,a}/x", "x", false),
        ("{01..3}.py", "02.py", true),
        ("{a..C}", "_", true),
        ("{z..a..5}", "u", true),
        ("a**b", "ax/yb", false),
        ("/**.py", "d/x.py", false),
        ("**/b/**", "x/b/c/d", true),
        ("*.PY", "a.py", false),
        ("?", "é", true),
    ];
    for (p, path, want) in cases {
        assert_eq!(pattern::compile(p).unwrap().is_match(path), want, "{p} vs {path}");
    }
    assert_eq!(
        pattern::compile("{1..5000}").unwrap_err(),
        "Invalid glob pattern '{1..5000}': Pattern limit exceeded the limit of 1000"
    );
}
