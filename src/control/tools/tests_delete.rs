//! Tests of the delete tool (TOOLS.md §1.5, §2.7, deviation 6): files, trees and links, and
//! trees a rule reaches only in part.

use super::*;

fn work(rules: Vec<Rule>) -> Fx {
    let fx = Fx::new(rules);
    fx.put("/work/a.txt", b"a");
    fx.put("/work/notes.txt", b"n");
    fx.put("/work/app.log", b"l");
    fx.dir("/work/empty");
    fx.put("/work/secrets/key", b"k");
    fx.put("/work/sub/deep/f", b"f");
    fx
}

fn del(path: &str) -> Value {
    json!({"file_path": path})
}

#[test]
fn delete_removes_files_trees_and_links() {
    let fx = work(vec![]);
    assert_eq!(fx.ok(&delete::SPEC, del("/work/a.txt")), "Deleted /work/a.txt");
    assert_eq!(fx.ok(&delete::SPEC, del("/work/sub")), "Deleted /work/sub");
    assert!(!fx.exists("/work/sub") && !fx.exists("/work/a.txt") && fx.exists("/work/notes.txt"));
    fx.fails(&delete::SPEC, del("/work/nope"), "Error: '/work/nope' not found", "FS_NOT_FOUND");
    fx.link("/work/link", "/work/notes.txt");
    assert_eq!(fx.ok(&delete::SPEC, del("/work/link")), "Deleted /work/link");
    assert!(!fx.exists("/work/link") && fx.exists("/work/notes.txt"), "the link goes, its target stays");
    let refused = |path: &str| {
        format!("Error: permission denied for write on {path} (the root and route mount points cannot be deleted)")
    };
    for path in ["/", "/memories"] {
        fx.fails(&delete::SPEC, del(path), refused(path), DENIED);
    }
    assert!(fx.exists("/work/notes.txt"));
    // The session forgets what it deleted.
    fx.ok(&read_file::SPEC, read("/work/notes.txt"));
    fx.ok(&delete::SPEC, del("/work/notes.txt"));
    assert_eq!(fx.session.observed(&p("/work/notes.txt")), None);
}

#[test]
fn delete_leaf_and_subtree_rules() {
    let denied = |path: &str, patterns: &str| {
        (
            format!("Error: permission denied for write on {path} (matches deny rule(s): {patterns})"),
            DENIED.to_string(),
        )
    };
    // A plain file is judged like a write (first match); an empty directory is a subtree.
    let fx = work(vec![rule(&[Write], &["/work/**"], Allow), rule(&[Write], &["/**"], Deny)]);
    assert_eq!(fx.ok(&delete::SPEC, del("/work/a.txt")), "Deleted /work/a.txt");
    assert_eq!(fx.err(&delete::SPEC, del("/work/empty")), denied("/work/empty", "/**"));
    let fx = work(vec![rule(&[Write], &["/work/secrets/**"], Deny)]);
    assert_eq!(fx.err(&delete::SPEC, del("/work")), denied("/work", "/work/secrets/**"));
    assert_eq!(fx.ok(&delete::SPEC, del("/work/sub")), "Deleted /work/sub");
    let fx = work(vec![rule(&[Write], &["/work/*.log"], Deny)]);
    assert_eq!(fx.ok(&delete::SPEC, del("/work/notes.txt")), "Deleted /work/notes.txt");
    assert_eq!(fx.err(&delete::SPEC, del("/work/app.log")), denied("/work/app.log", "/work/*.log"));
    assert_eq!(fx.err(&delete::SPEC, del("/work")), denied("/work", "/work/*.log"));
    // Every overlapping deny-write pattern, deduplicated, in rule order; read-only denies and
    // allows do not count.
    let fx = work(vec![
        rule(&[Read], &["/work/sub/**"], Deny),
        rule(&[Write], &["/work/secrets/**", "/other/**"], Deny),
        rule(&[Read, Write], &["/**/secrets", "/work/*.log"], Deny),
        rule(&[Write], &["/work/secrets/**"], Deny),
    ]);
    assert_eq!(
        fx.err(&delete::SPEC, del("/work")),
        denied("/work", "/work/secrets/**, /**/secrets, /work/*.log")
    );
    // Thousands of patterns reaching a directory are named up to 20, then counted.
    let many: Vec<String> = (0..1000).map(|i| format!("/**/x{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let fx = work(vec![rule(&[Write], &many, Deny), rule(&[Write], &["/**/x0"], Deny)]);
    let named: Vec<String> = (0..20).map(|i| format!("/**/x{i}")).collect();
    assert_eq!(
        fx.err(&delete::SPEC, del("/work")),
        denied("/work", &format!("{}, and 980 more", named.join(", ")))
    );
    // A missing path may have had descendants: the subtree rule applies before "not found".
    let fx = work(vec![rule(&[Write], &["/work/nope/x"], Deny)]);
    assert_eq!(fx.err(&delete::SPEC, del("/work/nope")), denied("/work/nope", "/work/nope/x"));
    // Through a symlinked ancestor, the target is judged too.
    let fx = Fx::new(vec![rule(&[Write], &["/secrets/**"], Deny)]);
    fx.put("/secrets/key.txt", b"k");
    fx.link("/pub/ld", "/secrets");
    let text = "Error: permission denied for write on /pub/ld/key.txt (resolves to /secrets/key.txt)";
    fx.fails(&delete::SPEC, del("/pub/ld/key.txt"), text, DENIED);
}

#[test]
fn delete_subtree_worked_examples() {
    // The delete table of doc/tools.md, each pattern a deny-write rule and each target a directory.
    let table = [
        ("/other/**", "/work", false),
        ("/workshop/**", "/work", false),
        ("/work2", "/work", false),
        ("/work/*.log", "/work/app.log", true),
        ("/work/*.log", "/work/app.log/child", true),
        ("/work/*.log", "/work", true),
        ("/work/*", "/work/app/child", true),
        ("/work/*/secrets", "/work/app", true),
        ("/work/**/secrets", "/work/app", true),
        ("/work/**/*.log", "/work/sub", true),
        ("/work/f?le.txt", "/work/other.txt", false),
        ("/work/*.txt", "/work/sub/deep", false),
        // Deep Agents fails closed here; the parsed pattern knows /work/c holds no match.
        ("/work/{a,b}/**", "/work/c", false),
        ("/work/{a,b}/**", "/work/b", true),
        ("/work/secrets/**", "/work", true),
        ("/work/**", "/work/logs", true),
        ("/work", "/work/sub/deep", true),
        ("/work/secrets", "/work", true),
        ("/**/secrets", "/work", true),
        ("/work/", "/work/sub", true),
    ];
    for (pattern, target, blocked) in table {
        let fx = Fx::new(vec![rule(&[Write], &[pattern], Deny)]);
        fx.dir(target);
        let out = fx.call(&delete::SPEC, del(target));
        let want = if blocked {
            format!("Error: permission denied for write on {target} (matches deny rule(s): {pattern})")
        } else {
            format!("Deleted {target}")
        };
        assert_eq!(out.joined_text(), want, "{pattern} vs {target}");
    }
}

#[test]
fn delete_of_partly_hidden_or_guarded_trees() {
    // Entries hidden from reads are not seen, so they are not removed: the tree stays, as
    // `rm -rf` through the mount would leave it.
    let fx = work(vec![rule(&[Read], &["/work/sub/deep/f"], Deny)]);
    fx.fails(
        &delete::SPEC,
        del("/work/sub"),
        "Error deleting '/work/sub': [Errno 39] Directory not empty: '/work/sub'",
        "FS_BUSY",
    );
    assert!(fx.exists("/work/sub/deep/f"));
    // Interrupt rules pass the tool's own check; the engine still needs an approval.
    let fx = work(vec![rule(&[Write], &["/work/sub/**"], Mode::Interrupt)]);
    fx.fails(&delete::SPEC, del("/work/sub"), "Error: permission denied for write on /work/sub", DENIED);
}
