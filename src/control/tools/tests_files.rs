//! Tests of the file tools (ls, read_file, write_file, edit_file, delete) over memory
//! backends: the exact texts and error codes of TOOLS.md §1.1–1.5, §2.4, §2.7 and the
//! deliberate differences, plus a comparison with Deep Agents' own tools
//! (`tests/reference/`).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::audit::Audit;
use crate::backend::memory::MemoryBackend;
use crate::backend::{Backend, Caller, SetAttr, TimeSet};
use crate::control::session::{Observation, Session, Version};
use crate::control::tools::common::{char_len, py_repr, MAX_CHARS, TRUNCATION_GUIDANCE};
use crate::control::tools::{
    delete, edit_file, ls, read_file, write_file, Block, ToolEnv, ToolOutput, ToolSpec,
};
use crate::control::vfs::ToolFs;
use crate::engine::Engine;
use crate::policy::{Gate, Mode, Op, Rule, RuleSet};
use crate::route::{Route, Router};
use crate::vpath::VPath;

use Mode::{Allow, Deny};
use Op::{Read, Write};

fn rule(ops: &[Op], paths: &[&str], mode: Mode) -> Rule {
    Rule { operations: ops.to_vec(), paths: paths.iter().map(|s| s.to_string()).collect(), mode, hide: true }
}

fn p(s: &str) -> VPath {
    VPath::parse(s).unwrap()
}

/// An engine over memory backends and one control session.
struct Fx {
    engine: Engine,
    session: Session,
}

impl Fx {
    fn with(routes: &[&str], rules: Vec<Rule>, observation: Observation) -> Fx {
        let routes = routes
            .iter()
            .map(|prefix| Route {
                prefix: p(prefix),
                backend: Arc::new(MemoryBackend::new(None)) as Arc<dyn Backend>,
                ttl: Duration::from_secs(1),
                kind: "memory",
                read_only: false,
            })
            .collect();
        let engine = Engine::new(
            Gate::new(RuleSet::new(rules).unwrap()),
            Router::new(routes),
            Arc::new(Audit::open(None, crate::config::DEFAULT_AUDIT_MAX_RECORDS).unwrap()),
        );
        Fx { engine, session: Session::new(observation) }
    }

    /// `/` plus a `/memories` route, strict observation.
    fn new(rules: Vec<Rule>) -> Fx {
        Fx::with(&["/", "/memories"], rules, Observation::Strict)
    }

    fn call(&self, spec: &ToolSpec, args: Value) -> ToolOutput {
        let env = ToolEnv {
            fs: ToolFs::new(&self.engine),
            session: &self.session,
            exec: None,
            call_id: None,
            structured: false,
        };
        (spec.call)(&env, &args)
    }

    /// The text of a successful call.
    fn ok(&self, spec: &ToolSpec, args: Value) -> String {
        let out = self.call(spec, args.clone());
        assert!(!out.is_error, "{} {args} failed: {}", spec.name, out.joined_text());
        out.joined_text()
    }

    /// The text and error code of a failed call.
    fn err(&self, spec: &ToolSpec, args: Value) -> (String, String) {
        let out = self.call(spec, args.clone());
        assert!(out.is_error, "{} {args} succeeded: {}", spec.name, out.joined_text());
        (out.joined_text(), out.structured["error_code"].as_str().unwrap().to_string())
    }

    fn caller() -> Caller {
        Caller { uid: 0, gid: 0, pid: 1 }
    }

    /// Creates the missing directories above `path`, behind the gate (as on a host dir).
    fn parents(&self, path: &str) {
        let path = p(path);
        let mut ancestors = Vec::new();
        let mut dir = path.parent();
        while !dir.is_root() {
            ancestors.push(dir.clone());
            dir = dir.parent();
        }
        for dir in ancestors.into_iter().rev() {
            let _ = self.engine.router_for_tests().mkdir(&self.engine.gate.probe(&dir), 0o755, &Fx::caller());
        }
    }

    /// Asserts that a call fails with exactly `text` and error `code`.
    fn fails(&self, spec: &ToolSpec, args: Value, text: impl AsRef<str>, code: &str) {
        assert_eq!(self.err(spec, args), (text.as_ref().to_string(), code.to_string()));
    }

    /// Writes a file behind the gate and the session, in place when it exists.
    fn put(&self, path: &str, data: &[u8]) {
        self.parents(path);
        let probe = self.engine.gate.probe(&p(path));
        let file = match self.engine.router_for_tests().open(&probe, libc::O_WRONLY) {
            Ok(file) => {
                file.setattr(&SetAttr { size: Some(0), ..SetAttr::default() }).unwrap();
                file
            }
            Err(_) => {
                self.engine.router_for_tests().create(&probe, 0o644, libc::O_WRONLY, &Fx::caller()).unwrap().1
            }
        };
        file.write(0, data).unwrap();
    }

    fn dir(&self, path: &str) {
        self.parents(path);
        let _ = self.engine.router_for_tests().mkdir(&self.engine.gate.probe(&p(path)), 0o755, &Fx::caller());
    }

    fn link(&self, path: &str, target: &str) {
        self.parents(path);
        self.engine
            .router_for_tests()
            .symlink(&self.engine.gate.probe(&p(path)), target.as_bytes(), &Fx::caller())
            .unwrap();
    }

    fn content(&self, path: &str) -> Vec<u8> {
        let file =
            self.engine.router_for_tests().open(&self.engine.gate.probe(&p(path)), libc::O_RDONLY).unwrap();
        file.read(0, u32::MAX).unwrap()
    }

    fn exists(&self, path: &str) -> bool {
        self.engine.router_for_tests().getattr(&self.engine.gate.probe(&p(path))).is_ok()
    }
}

fn read(path: &str) -> Value {
    json!({"file_path": path})
}

fn window(path: &str, offset: i64, limit: i64) -> Value {
    json!({"file_path": path, "offset": offset, "limit": limit})
}

const FIVE: &[u8] = b"one\ntwo\nthree\nfour\nfive\n";
const DENIED: &str = "FS_PERMISSION_DENIED";

// ---------------------------------------------------------------------------------------------
// §1.0 validation, deviation 8

#[test]
fn paths_are_validated_like_deep_agents() {
    let fx = Fx::new(vec![]);
    fx.put("/a.txt", FIVE);
    let cases = [
        ("/a/../b", "Error: Path traversal not allowed: /a/../b"),
        ("~/x", "Error: Path traversal not allowed: ~/x"),
        (
            "C:\\x",
            "Error: Windows absolute paths are not supported: C:\\x. Please use virtual paths starting with / (e.g., /workspace/file.txt)",
        ),
    ];
    for (raw, text) in cases {
        fx.fails(&read_file::SPEC, read(raw), text, "FS_INVALID_PATH");
    }
    assert!(fx.ok(&read_file::SPEC, read("a.txt")).starts_with("@@ lines 1-5 of 5 @@"));
    // Deviation 8: "", "." and "./" are the root.
    for raw in ["", ".", "./"] {
        assert_eq!(fx.ok(&ls::SPEC, json!({"path": raw})), "['/a.txt', '/memories/']");
    }
    let (text, code) = fx.err(&ls::SPEC, json!({}));
    assert_eq!(
        (text.as_str(), code.as_str()),
        ("Error: argument `path` must be a string, got nothing", "FS_INVALID_ARGUMENT")
    );
}

// ---------------------------------------------------------------------------------------------
// §1.1 ls

#[test]
fn ls_renders_a_python_list_of_children() {
    let fx = Fx::new(vec![]);
    fx.put("/a.txt", b"12345");
    fx.put("/dir/x", b"x");
    fx.put("/it's", b"");
    fx.dir("/empty");
    let out = fx.call(&ls::SPEC, json!({"path": "/"}));
    assert_eq!(out.joined_text(), "['/a.txt', '/dir/', '/empty/', \"/it's\", '/memories/']");
    let entries = out.structured["entries"].as_array().unwrap();
    assert_eq!(entries[0]["path"], "/a.txt");
    assert_eq!((entries[0]["is_dir"].as_bool(), entries[0]["size"].as_u64()), (Some(false), Some(5)));
    assert_eq!((entries[1]["is_dir"].as_bool(), entries[1]["size"].as_u64()), (Some(true), Some(0)));
    assert!(entries[0]["modified_at"].as_str().unwrap().ends_with("+00:00"));
    assert_eq!(fx.ok(&ls::SPEC, json!({"path": "/dir/"})), "['/dir/x']");
    assert_eq!(fx.ok(&ls::SPEC, json!({"path": "/empty"})), "No files found");
    assert_eq!(fx.ok(&ls::SPEC, json!({"path": "/memories"})), "No files found");
    fx.fails(&ls::SPEC, json!({"path": "/nope"}), "Error: Path '/nope': path_not_found", "FS_NOT_FOUND");
    fx.fails(
        &ls::SPEC,
        json!({"path": "/a.txt"}),
        "Error: Path '/a.txt': not_a_directory",
        "FS_NOT_DIRECTORY",
    );
    let under_file = fx.err(&ls::SPEC, json!({"path": "/a.txt/x"}));
    assert_eq!(under_file.0, "Error: Path '/a.txt/x': path_not_found");
}

#[test]
fn ls_hides_denied_entries_and_judges_directories_as_dirs() {
    let fx = Fx::new(vec![rule(&[Read], &["/secrets/**", "/d/*.log"], Deny)]);
    fx.put("/a.txt", b"");
    fx.put("/secrets/k", b"k");
    fx.put("/secrets/.env", b"k");
    fx.put("/d/a.log", b"");
    fx.put("/d/b.txt", b"");
    assert_eq!(fx.ok(&ls::SPEC, json!({"path": "/"})), "['/a.txt', '/d/', '/memories/']");
    assert_eq!(fx.ok(&ls::SPEC, json!({"path": "/d"})), "['/d/b.txt']");
    // Deviation 11: the `ls` path is a directory, judged as `/secrets/` too.
    fx.fails(&ls::SPEC, json!({"path": "/secrets"}), "Error: permission denied for read on /secrets", DENIED);
    // Deviation 1: dot-files are covered.
    fx.fails(
        &read_file::SPEC,
        read("/secrets/.env"),
        "Error: permission denied for read on /secrets/.env",
        DENIED,
    );

    let fx = Fx::new(vec![rule(&[Read], &["/pub/**"], Allow), rule(&[Read], &["/**"], Deny)]);
    fx.put("/pub/a", b"a\n");
    fx.put("/priv", b"");
    assert_eq!(fx.ok(&ls::SPEC, json!({"path": "/pub"})), "['/pub/a']");
    assert_eq!(fx.ok(&read_file::SPEC, read("/pub/a")), "@@ lines 1-1 of 1 @@\na");
    assert_eq!(fx.err(&ls::SPEC, json!({"path": "/"})).0, "Error: permission denied for read on /");
}

#[test]
fn ls_truncates_long_listings() {
    let fx = Fx::new(vec![]);
    let prefix = "a_rather_long_file_name_to_fill_the_listing_quickly_";
    for i in 0..1500 {
        fx.put(&format!("/m/{prefix}{i:05}"), b"");
    }
    let out = fx.call(&ls::SPEC, json!({"path": "/m"}));
    let text = out.joined_text();
    // Each item costs its repr plus ", "; the budget leaves room for the guidance element.
    let item = char_len(&py_repr(&format!("/m/{prefix}00000"))) + 2;
    let kept = (MAX_CHARS - char_len(&py_repr(TRUNCATION_GUIDANCE)) - 2) / item;
    assert_eq!(out.structured["entries"].as_array().unwrap().len(), kept);
    assert_eq!(out.structured["truncated"], json!(true));
    assert!(text.ends_with(&format!("{prefix}{:05}', '{TRUNCATION_GUIDANCE}']", kept - 1)));
    assert!(char_len(&text) <= MAX_CHARS);
}

#[test]
fn ls_follows_symlinked_entries() {
    let fx = Fx::new(vec![rule(&[Read], &["/secret/**"], Deny)]);
    fx.put("/t/inner", b"");
    fx.put("/secret/k", b"");
    fx.link("/d/to_dir", "/t");
    fx.link("/d/to_file", "../t/inner");
    fx.link("/d/dangling", "/nowhere");
    fx.link("/d/to_secret", "/secret/k");
    assert_eq!(fx.ok(&ls::SPEC, json!({"path": "/d"})), "['/d/to_dir/', '/d/to_file']");
    // A symlinked directory is listed under the name the caller used.
    fx.link("/view", "/t");
    assert_eq!(fx.ok(&ls::SPEC, json!({"path": "/view"})), "['/view/inner']");
}

// ---------------------------------------------------------------------------------------------
// §1.2 read_file

#[test]
fn read_file_windows() {
    let fx = Fx::new(vec![]);
    fx.put("/a.txt", FIVE);
    let r = |args: Value| fx.ok(&read_file::SPEC, args);
    assert_eq!(r(read("/a.txt")), "@@ lines 1-5 of 5 @@\none\ntwo\nthree\nfour\nfive");
    assert_eq!(r(window("/a.txt", 2, 2)), "@@ lines 3-4 of 5 | next offset 4 @@\nthree\nfour");
    assert_eq!(r(window("/a.txt", 4, 2)), "@@ lines 5-5 of 5 @@\nfive");
    assert_eq!(
        r(window("/a.txt", -1, 2)),
        "[Requested offset -1 is before the start of the file; read from line 1 instead.]\n@@ lines 1-2 of 5 | next offset 2 @@\none\ntwo"
    );
    for limit in [0, -3] {
        assert_eq!(
            r(json!({"file_path": "/a.txt", "limit": limit})),
            format!("System reminder: no lines were read because `limit` was {limit}. The file was not inspected and may have contents; retry with `limit` >= 1 to read it.")
        );
    }
    fx.fails(
        &read_file::SPEC,
        json!({"file_path": "/a.txt", "offset": 5}),
        "Error: Line offset 5 exceeds file length (5 lines)",
        "FS_INVALID_ARGUMENT",
    );
    let out = fx.call(&read_file::SPEC, window("/a.txt", 1, 2));
    let s = &out.structured;
    let fields: Vec<Value> = ["start_line", "end_line", "total_lines", "next_offset", "truncated"]
        .iter()
        .map(|k| s[*k].clone())
        .collect();
    assert_eq!(fields, [json!(2), json!(3), json!(5), json!(3), json!(false)]);
}

#[test]
fn read_file_empty_blank_and_python_line_ends() {
    let fx = Fx::new(vec![]);
    let empty = "System reminder: File exists but has empty contents";
    fx.put("/e.txt", b"");
    fx.put("/w.txt", b" \n\t\n");
    fx.put("/e.png", b"");
    assert_eq!(fx.ok(&read_file::SPEC, read("/e.txt")), empty);
    assert_eq!(fx.ok(&read_file::SPEC, read("/w.txt")), empty);
    assert_eq!(fx.ok(&read_file::SPEC, read("/e.png")), empty);
    assert_eq!(fx.ok(&read_file::SPEC, json!({"file_path": "/e.txt", "limit": 0})), empty);
    fx.put("/b.txt", b"a\n\n\n");
    assert_eq!(
        fx.ok(&read_file::SPEC, json!({"file_path": "/b.txt", "offset": 1})),
        "@@ lines 2-3 of 3 @@\n\n"
    );
    // Deviation 10: Python's splitlines ends lines at \f, U+2028, ...; the body is re-split on
    // \n and padded to the window.
    fx.put("/s.txt", "a\x0cb\nc\u{2028}d\ne\n".as_bytes());
    assert_eq!(fx.ok(&read_file::SPEC, read("/s.txt")), "@@ lines 1-5 of 5 @@\na\x0cb\nc\u{2028}d\ne\n\n");
    assert_eq!(
        fx.ok(&read_file::SPEC, window("/s.txt", 1, 2)),
        "@@ lines 2-3 of 5 | next offset 3 @@\nb\nc\u{2028}"
    );
    fx.put("/c.txt", b"a\r\nb\rc\r\n");
    assert_eq!(fx.ok(&read_file::SPEC, read("/c.txt")), "@@ lines 1-3 of 3 @@\na\nb\nc");
    fx.put("/n.txt", b"x\ny");
    assert_eq!(fx.ok(&read_file::SPEC, read("/n.txt")), "@@ lines 1-2 of 2 @@\nx\ny");
}

#[test]
fn read_file_errors_and_media() {
    let fx = Fx::new(vec![]);
    fx.dir("/d");
    fx.put("/bin.dat", b"hi\xff\x00");
    fx.put("/i.png", b"\x89PNG\r\n\x1a\n\0\0");
    fx.put("/d.PDF", b"%PDF-");
    fx.fails(&read_file::SPEC, read("/nope.txt"), "Error: File '/nope.txt' not found", "FS_NOT_FOUND");
    fx.fails(&read_file::SPEC, read("/d"), "Error: File '/d' not found", "FS_IS_DIRECTORY");
    fx.fails(&read_file::SPEC, read("/bin.dat"), "Error: Error reading file '/bin.dat': 'utf-8' codec can't decode byte 0xff in position 2: invalid start byte", "FS_NOT_TEXT");
    let out = fx.call(&read_file::SPEC, read("/i.png"));
    assert_eq!(
        out.content,
        vec![Block::Media {
            data: "iVBORw0KGgoAAA==".into(),
            mime_type: "image/png".into(),
            path: "/i.png".into()
        }]
    );
    assert!(!out.is_error);
    assert_eq!(
        out.to_mcp()["content"][0],
        json!({"type": "image", "data": "iVBORw0KGgoAAA==", "mimeType": "image/png"})
    );
    let out = fx.call(&read_file::SPEC, read("/d.PDF"));
    assert_eq!(
        out.content,
        vec![Block::Media {
            data: "JVBERi0=".into(),
            mime_type: "application/pdf".into(),
            path: "/d.PDF".into()
        }]
    );
    // MCP's image block is for images: a PDF is an embedded resource, audio an audio block.
    assert_eq!(
        out.to_mcp()["content"][0],
        json!({"type": "resource", "resource": {"uri": "file:///d.PDF", "mimeType": "application/pdf", "blob": "JVBERi0="}})
    );
    fx.put("/a b#é.pdf", b"%PDF-");
    let out = fx.call(&read_file::SPEC, read("/a b#é.pdf"));
    assert_eq!(out.to_mcp()["content"][0]["resource"]["uri"], json!("file:///a%20b%23%C3%A9.pdf"));
    fx.put("/s.wav", b"RIFF");
    let out = fx.call(&read_file::SPEC, read("/s.wav"));
    assert_eq!(out.to_mcp()["content"][0]["type"], json!("audio"), "{:?}", out.content);
    assert_eq!(read_file::media_type("/x/.png"), None, "a dot-file has no suffix");
    assert_eq!(read_file::media_type("/x/a.tar.webp"), Some("image/webp"));
}

#[test]
fn read_file_caps_at_80000_chars() {
    let fx = Fx::new(vec![]);
    let notice = |path: &str| {
        format!("[Output was truncated due to size limits. The file content is very large. Consider reformatting the file to make it easier to navigate. For example, if this is JSON, use execute(command='jq . {path}') to pretty-print it with line breaks. For other formats, you can use appropriate formatting tools to split long lines.]")
    };
    // One 90,000-char line: cut inside it, with no resume offset.
    fx.put("/big.txt", &[b'x'; 90_000]);
    let out = fx.call(&read_file::SPEC, read("/big.txt"));
    let text = out.joined_text();
    let head =
        format!("{}\n@@ lines 1-1 of 1 | truncated mid-line | 79613 of 90000 chars @@\n", notice("/big.txt"));
    assert!(text.starts_with(&head), "{}", &text[..400]);
    assert_eq!(char_len(&text), 80_000);
    assert_eq!(
        (out.structured["truncated"].as_bool(), out.structured["next_offset"].is_null()),
        (Some(true), true)
    );
    // Whole lines: as many as fit, and the offset to resume from.
    let line = format!("{}\n", "z".repeat(999));
    fx.put("/long.txt", line.repeat(100).as_bytes());
    let text = fx.ok(&read_file::SPEC, read("/long.txt"));
    let header = "@@ lines 1-79 of 100 | next offset 79 | truncated due to size @@";
    assert!(text.starts_with(&format!("{}\n{header}\n", notice("/long.txt"))));
    assert_eq!(text.lines().count(), 2 + 79);
    // The limit is "under 80,000": a result of exactly 80,000 chars is truncated.
    let header = "@@ lines 1-1 of 1 @@\n";
    fx.put("/cap.txt", "c".repeat(79_999 - header.len()).as_bytes());
    assert_eq!(char_len(&fx.ok(&read_file::SPEC, read("/cap.txt"))), 79_999);
    fx.put("/cap.txt", "c".repeat(80_000 - header.len()).as_bytes());
    assert!(fx.ok(&read_file::SPEC, read("/cap.txt")).contains("| truncated mid-line |"));
}

#[test]
fn read_file_records_the_version_read() {
    let fx = Fx::new(vec![]);
    fx.put("/a.txt", FIVE);
    fx.ok(&read_file::SPEC, json!({"file_path": "/a.txt", "limit": 1}));
    let attr = fx.engine.router_for_tests().getattr(&fx.engine.gate.probe(&p("/a.txt"))).unwrap();
    assert_eq!(fx.session.observed(&p("/a.txt")), Some(Version::of(&attr)));
}

// ---------------------------------------------------------------------------------------------
// §2.4 permission texts, deviation 7 (symlinks)

#[test]
fn permission_texts_and_symlinks() {
    let fx = Fx::new(vec![rule(&[Read, Write], &["/secrets/**"], Deny), rule(&[Write], &["/ro/**"], Deny)]);
    fx.put("/secrets/key.txt", b"k");
    fx.put("/data/f.txt", b"hello\n");
    fx.link("/pub/link.txt", "/secrets/key.txt");
    fx.link("/pub/ok.txt", "../data/f.txt");
    fx.link("/l", "../../../x");
    let cases = [
        (&read_file::SPEC, read("/secrets/key.txt"), "Error: permission denied for read on /secrets/key.txt"),
        (
            &read_file::SPEC,
            read("/pub/link.txt"),
            "Error: permission denied for read on /pub/link.txt (resolves to /secrets/key.txt)",
        ),
        (
            &write_file::SPEC,
            json!({"file_path": "/ro/x", "content": "x"}),
            "Error: permission denied for write on /ro/x",
        ),
        (
            &write_file::SPEC,
            json!({"file_path": "/pub/link.txt", "content": "x"}),
            "Error: permission denied for write on /pub/link.txt (resolves to /secrets/key.txt)",
        ),
        (
            &edit_file::SPEC,
            json!({"file_path": "/secrets/key.txt", "old_string": "k", "new_string": "K"}),
            "Error: permission denied for write on /secrets/key.txt",
        ),
    ];
    for (spec, args, text) in cases {
        assert_eq!(fx.err(spec, args), (text.to_string(), DENIED.to_string()));
    }
    assert_eq!(fx.ok(&read_file::SPEC, read("/pub/ok.txt")), "@@ lines 1-1 of 1 @@\nhello");
    // A link that leaves the tree is an error, never an escape.
    fx.fails(&read_file::SPEC, read("/l"), "Error: cannot resolve /l", "FS_INVALID_PATH");
    // Writing through a link writes its target; the session observes the target.
    fx.ok(&read_file::SPEC, read("/pub/ok.txt"));
    assert_eq!(
        fx.ok(&write_file::SPEC, json!({"file_path": "/pub/ok.txt", "content": "new"})),
        "Updated file /pub/ok.txt"
    );
    assert_eq!(fx.content("/data/f.txt"), b"new");
    fx.link("/pub/dir", "/data");
    assert_eq!(
        fx.ok(&write_file::SPEC, json!({"file_path": "/pub/dir/n/g.txt", "content": "g"})),
        "Updated file /pub/dir/n/g.txt"
    );
    assert_eq!(fx.content("/data/n/g.txt"), b"g");
}

// ---------------------------------------------------------------------------------------------
// §1.3 write_file, deviations 4 and 6

#[test]
fn write_file_creates_and_overwrites() {
    let fx = Fx::new(vec![]);
    assert_eq!(
        fx.ok(&write_file::SPEC, json!({"file_path": "/new/dir/f.txt", "content": "hello\n"})),
        "Updated file /new/dir/f.txt"
    );
    assert_eq!(fx.content("/new/dir/f.txt"), b"hello\n");
    // Overwriting a file never read is allowed ("You do not need to read the file first").
    fx.put("/a.txt", FIVE);
    fx.engine
        .router_for_tests()
        .setattr(&fx.engine.gate.probe(&p("/a.txt")), &SetAttr { mode: Some(0o600), ..SetAttr::default() })
        .unwrap();
    assert_eq!(
        fx.ok(&write_file::SPEC, json!({"file_path": "/a.txt", "content": "new"})),
        "Updated file /a.txt"
    );
    assert_eq!(fx.content("/a.txt"), b"new");
    let attr = fx.engine.router_for_tests().getattr(&fx.engine.gate.probe(&p("/a.txt"))).unwrap();
    assert_eq!(attr.perm, 0o600, "a replaced file keeps its mode");
    assert_eq!(fx.session.observed(&p("/a.txt")), Some(Version::of(&attr)), "its own write is observed");
    // No temporary file is left behind.
    assert_eq!(fx.ok(&ls::SPEC, json!({"path": "/"})), "['/a.txt', '/memories/', '/new/']");
    fx.put("/f", b"");
    fx.fails(
        &write_file::SPEC,
        json!({"file_path": "/f/x", "content": "x"}),
        "Error writing file '/f/x': [Errno 20] Not a directory: '/f/x'",
        "FS_NOT_DIRECTORY",
    );
}

#[test]
fn write_file_refusals() {
    let fx = Fx::with(&["/", "/memories", "/a/b/c"], vec![], Observation::Strict);
    fx.dir("/d");
    let root = |path: &str| {
        format!("Error: permission denied for write on {path} (the root and route mount points cannot be overwritten)")
    };
    for path in ["/", "/memories", "/a/b", "/a/b/c"] {
        fx.fails(&write_file::SPEC, json!({"file_path": path, "content": "x"}), root(path), DENIED);
    }
    let text = "Error writing file '/d': [Errno 21] Is a directory: '/d'";
    fx.fails(&write_file::SPEC, json!({"file_path": "/d", "content": "x"}), text, "FS_IS_DIRECTORY");
    assert_eq!(fx.err(&write_file::SPEC, json!({"file_path": "/x"})).1, "FS_INVALID_ARGUMENT");
}

#[test]
fn write_file_refuses_stale_overwrites() {
    for observation in [Observation::Strict, Observation::Off] {
        let fx = Fx::with(&["/"], vec![], observation);
        fx.put("/a.txt", FIVE);
        fx.ok(&read_file::SPEC, read("/a.txt"));
        fx.put("/a.txt", b"theirs, changed\n");
        let out = fx.call(&write_file::SPEC, json!({"file_path": "/a.txt", "content": "mine"}));
        if observation == Observation::Strict {
            assert_eq!(
                out.joined_text(),
                "Error: '/a.txt' changed since it was read; re-read the file, then retry"
            );
            assert_eq!(out.structured["error_code"], "FS_STALE_VERSION");
            assert_eq!(fx.content("/a.txt"), b"theirs, changed\n");
            fx.ok(&read_file::SPEC, read("/a.txt"));
            fx.ok(&write_file::SPEC, json!({"file_path": "/a.txt", "content": "mine"}));
        } else {
            assert!(!out.is_error, "observation = off restores Deep Agents' behaviour");
        }
        assert_eq!(fx.content("/a.txt"), b"mine");
    }
}

// ---------------------------------------------------------------------------------------------
// §1.4 edit_file, deviations 4 and 5

#[test]
fn edit_file_texts() {
    let fx = Fx::new(vec![]);
    let edit = |content: &[u8], old: &str, new: &str, all: bool| {
        fx.put("/e.txt", content);
        fx.ok(&read_file::SPEC, read("/e.txt"));
        fx.call(
            &edit_file::SPEC,
            json!({"file_path": "/e.txt", "old_string": old, "new_string": new, "replace_all": all}),
        )
    };
    let code =
        |out: &ToolOutput| out.structured.get("error_code").and_then(Value::as_str).unwrap_or("").to_string();
    // (file content, old_string, new_string, replace_all, text, error code)
    type Row<'a> = (&'a [u8], &'a str, &'a str, bool, &'a str, &'a str);
    let table: &[Row] = &[
        (b"alpha\n", "", "z", false, "Error: old_string cannot be empty. Provide the exact text to replace.", "FS_INVALID_ARGUMENT"),
        (b"a\nlast", "last\n", "LAST\n", false, "Error: old_string ends with a newline, but the file does not end with a newline. Retry with the trailing newline removed from old_string (and from new_string if it also ends with a newline).", "FS_EDIT_NOT_FOUND"),
        (b"ab ab ab", "ab\n", "AB\n", false, "Error: old_string ends with a newline, but the file does not end with a newline. With the trailing newline removed, old_string would appear 3 times in the file. Retry with the trailing newline removed and add surrounding context so the match is unique.", "FS_EDIT_NOT_FOUND"),
        (b"alpha\n", "omega", "z", false, "Error: String not found in file: 'omega'", "FS_EDIT_NOT_FOUND"),
        (b"x y x y x\n", "x", "z", false, "Error: String 'x' appears 3 times in file. Use replace_all=True to replace all instances, or provide a more specific string with surrounding context.", "FS_AMBIGUOUS_EDIT"),
        (b"alpha\n", "alpha", "alpha", false, "Error: new_string must differ from old_string", "FS_INVALID_ARGUMENT"),
        (b"x y x y x\n", "x", "z", true, "Successfully replaced 3 instance(s) of the string in '/e.txt'", ""),
        (b"alpha beta\n", "beta", "BETA", false, "Successfully replaced 1 instance(s) of the string in '/e.txt'", ""),
    ];
    for &(content, old, new, all, text, want_code) in table {
        let out = edit(content, old, new, all);
        assert_eq!(
            (out.joined_text().as_str(), code(&out).as_str()),
            (text, want_code),
            "{old:?} in {content:?}"
        );
    }
    assert_eq!(fx.content("/e.txt"), b"alpha BETA\n");
    let missing = json!({"file_path": "/nope", "old_string": "a", "new_string": "b"});
    fx.fails(&edit_file::SPEC, missing, "Error: File '/nope' not found", "FS_NOT_FOUND");
    // CRLF in the file and in the strings is matched as LF, and the file is written with LF
    // endings, as FilesystemBackend does.
    let out = edit(b"one\r\ntwo\r\nthree", "one\r\ntwo", "1\r\n2", false);
    assert_eq!(out.joined_text(), "Successfully replaced 1 instance(s) of the string in '/e.txt'");
    assert_eq!(fx.content("/e.txt"), b"1\n2\nthree");
    fx.put("/e.txt", b"\xffa");
    // The failed read still counts as one: the session has seen the file's bytes.
    assert_eq!(fx.err(&read_file::SPEC, read("/e.txt")).1, "FS_NOT_TEXT");
    let args = json!({"file_path": "/e.txt", "old_string": "a", "new_string": "b"});
    let text =
        "Error editing file '/e.txt': 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte";
    fx.fails(&edit_file::SPEC, args, text, "FS_NOT_TEXT");
}

#[test]
fn edit_file_requires_reading_the_current_version() {
    let args = json!({"file_path": "/e.txt", "old_string": "alpha", "new_string": "beta"});
    let fx = Fx::new(vec![]);
    fx.put("/e.txt", b"alpha\n");
    fx.fails(
        &edit_file::SPEC,
        args.clone(),
        "Error: edit requires reading '/e.txt' first",
        "FS_NOT_OBSERVED",
    );
    fx.ok(&read_file::SPEC, read("/e.txt"));
    fx.put("/e.txt", b"alpha, changed\n");
    fx.fails(
        &edit_file::SPEC,
        args.clone(),
        "Error: '/e.txt' changed since it was read; re-read the file, then retry",
        "FS_STALE_VERSION",
    );
    fx.ok(&read_file::SPEC, read("/e.txt"));
    fx.ok(&edit_file::SPEC, args.clone());
    // Its own edit and write count as seen: a second edit needs no new read.
    fx.ok(&edit_file::SPEC, json!({"file_path": "/e.txt", "old_string": "changed", "new_string": "again"}));
    fx.ok(&write_file::SPEC, json!({"file_path": "/w.txt", "content": "w1"}));
    fx.ok(&edit_file::SPEC, json!({"file_path": "/w.txt", "old_string": "w1", "new_string": "w2"}));
    assert_eq!(fx.content("/e.txt"), b"beta, again\n");

    let off = Fx::with(&["/"], vec![], Observation::Off);
    off.put("/e.txt", b"alpha\n");
    assert!(!off.call(&edit_file::SPEC, args.clone()).is_error, "observation = off: no read needed");
    // Deviation 5 holds either way.
    let same = json!({"file_path": "/e.txt", "old_string": "beta", "new_string": "beta"});
    off.fails(&edit_file::SPEC, same, "Error: new_string must differ from old_string", "FS_INVALID_ARGUMENT");
}

/// A change of content that kept the size and set the mtime back (`touch -r`, `rsync -t`) is
/// still a change: the ctime moved.
#[test]
fn a_change_with_its_mtime_set_back_is_still_stale() {
    let fx = Fx::new(vec![]);
    fx.put("/e.txt", b"alpha\n");
    fx.ok(&read_file::SPEC, read("/e.txt"));
    let probe = fx.engine.gate.probe(&p("/e.txt"));
    let before = fx.engine.router_for_tests().getattr(&probe).unwrap();
    fx.put("/e.txt", b"omega\n");
    let back = SetAttr { mtime: Some(TimeSet::At(before.mtime)), ..SetAttr::default() };
    let after = fx.engine.router_for_tests().setattr(&probe, &back).unwrap();
    assert_eq!((after.size, after.mtime), (before.size, before.mtime));
    fx.fails(
        &edit_file::SPEC,
        json!({"file_path": "/e.txt", "old_string": "omega", "new_string": "beta"}),
        "Error: '/e.txt' changed since it was read; re-read the file, then retry",
        "FS_STALE_VERSION",
    );
}

/// A read that showed nothing of the file (no lines, or an offset past its end) is no read.
#[test]
fn a_read_that_showed_nothing_does_not_count() {
    let args = json!({"file_path": "/e.txt", "old_string": "alpha", "new_string": "beta"});
    let fx = Fx::new(vec![]);
    fx.put("/e.txt", b"alpha\n");
    for nothing in [window("/e.txt", 0, 0), window("/e.txt", 5, 10)] {
        fx.call(&read_file::SPEC, nothing);
        fx.fails(
            &edit_file::SPEC,
            args.clone(),
            "Error: edit requires reading '/e.txt' first",
            "FS_NOT_OBSERVED",
        );
    }
    fx.ok(&read_file::SPEC, window("/e.txt", 0, 1));
    fx.ok(&edit_file::SPEC, args);
    // An empty or blank file is read whole by any window.
    fx.put("/blank.txt", b"\n\n");
    fx.ok(&read_file::SPEC, window("/blank.txt", 0, 0));
    fx.ok(&write_file::SPEC, json!({"file_path": "/blank.txt", "content": "x"}));
}

/// A tool write is judged as a write of its path, like a shell's `>`: the temporary file it
/// writes first is the engine's own, and no rule is asked about it.
#[test]
fn a_tool_write_is_judged_on_its_path_alone() {
    let fx = Fx::new(vec![
        rule(&[Write], &["/w/notes.md"], Allow),
        rule(&[Write], &["/**/.*", "/**/*.tmp"], Deny),
        rule(&[Write], &["/**"], Deny),
    ]);
    fx.parents("/w/notes.md");
    fx.ok(&write_file::SPEC, json!({"file_path": "/w/notes.md", "content": "one\n"}));
    fx.ok(&edit_file::SPEC, json!({"file_path": "/w/notes.md", "old_string": "one", "new_string": "two"}));
    assert_eq!(fx.content("/w/notes.md"), b"two\n");
    fx.fails(
        &write_file::SPEC,
        json!({"file_path": "/w/other.md", "content": "x"}),
        "Error: permission denied for write on /w/other.md",
        "FS_PERMISSION_DENIED",
    );
    let names: Vec<String> = fx
        .engine
        .router_for_tests()
        .readdir(&fx.engine.gate.probe(&p("/w")))
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["notes.md"], "no temporary file is left");
}

/// Writes of one path at once each replace it whole; none fails on another's temporary file.
/// (Without observation: one session's writes at once may find each other's version.)
#[test]
fn tool_writes_of_one_path_at_once_all_succeed() {
    let fx = Fx::with(&["/"], vec![], Observation::Off);
    std::thread::scope(|s| {
        for t in 0..4 {
            let fx = &fx;
            s.spawn(move || {
                for i in 0..50 {
                    // Big enough that the writes overlap.
                    let content = format!("{}writer {t}, round {i}\n", "-".repeat(1 << 18));
                    fx.ok(&write_file::SPEC, json!({"file_path": "/same.txt", "content": content}));
                }
            });
        }
    });
    let last = String::from_utf8(fx.content("/same.txt")).unwrap();
    assert!(last.trim_start_matches('-').starts_with("writer ") && last.ends_with(", round 49\n"));
}

// §1.5 delete, §2.7, deviation 6: their own file.
#[path = "tests_delete.rs"]
mod delete_tests;

// The comparison with Deep Agents' own tools lives with its cases and runner.
#[path = "../../../tests/reference/compare.rs"]
mod reference;

/// The tool door reads a regular file, whole, up to the limit it is given: a FIFO (one put
/// where a file was looked at) is refused at once, and a file past the limit with EFBIG.
#[test]
fn the_tool_doors_read_takes_a_regular_file_within_its_limit() {
    let fx = Fx::new(vec![]);
    let fs = ToolFs::new(&fx.engine);
    fs.write_atomic(&p("/f.txt"), b"hello", 0o644).unwrap();
    assert_eq!(fs.read(&p("/f.txt"), 5).unwrap(), b"hello");
    assert_eq!(fs.read(&p("/f.txt"), 4).unwrap_err().errno, crate::error::Errno::EFBIG);
    fx.engine.mknod(&fs.ctx, &p("/fifo"), libc::S_IFIFO | 0o644, 0).unwrap();
    assert_eq!(fs.read(&p("/fifo"), 100).unwrap_err().errno, crate::error::Errno::EINVAL);
}
