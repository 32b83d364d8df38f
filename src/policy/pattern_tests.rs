//! Tests of the parsed pattern: its overlap answer against brute force over generated trees,
//! and its matching against globset's own reading of the same text.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;

fn p(s: &str) -> VPath {
    VPath::parse(s).unwrap()
}

#[test]
fn escapes_are_read_once() {
    let pattern = Pattern::parse(r"/ws/my\ dir/secrets/**").unwrap();
    assert!(pattern.is_match(&p("/ws/my dir/secrets/key"), false));
    assert!(pattern.reaches_subtree(&p("/ws/my dir")));
    assert!(pattern.reaches_subtree(&p("/ws")));
    assert_eq!(pattern.anchors().collect::<Vec<_>>(), [p("/ws/my dir/secrets")]);
    let star = Pattern::parse(r"/ws/\*/k").unwrap();
    assert!(star.is_match(&p("/ws/*/k"), false));
    assert!(!star.is_match(&p("/ws/a/k"), false));
}

/// A leading `**` before a name or an extension is given to the set in the shape globset
/// answers without a regex; before a component that may be empty it keeps the root's `/`.
#[test]
fn a_leading_any_depth_is_rendered_for_the_sets_lookups() {
    let rendered = |text: &str| Pattern::parse(text).unwrap().branches()[0].glob().glob().to_string();
    assert_eq!(rendered("/**/.env"), "**/.env");
    assert_eq!(rendered("/**/*.pem"), "**/*.pem");
    assert_eq!(rendered("/**/.ssh/**"), "**/.ssh/**");
    assert_eq!(rendered("/**/*/x"), "/**/*/x");
    assert_eq!(rendered("/**"), "/**");
    assert_eq!(rendered("/w/**/.env"), "/w/**/.env");
    let env = Pattern::parse("/**/.env").unwrap();
    assert!(env.is_match(&p("/.env"), false) && env.is_match(&p("/a/b/.env"), false));
    assert!(!env.is_match(&p("/a/x.env"), false));
}

#[test]
fn alternatives_expand_like_a_shell() {
    let pattern = Pattern::parse("/**/.env{,.local}").unwrap();
    assert!(pattern.is_match(&p("/a/.env"), false));
    assert!(pattern.is_match(&p("/a/.env.local"), false));
    let nested = Pattern::parse("/w/{a,b{c,d}}/x").unwrap();
    let anchors: Vec<String> = nested.anchors().map(|a| a.as_str().to_string()).collect();
    assert_eq!(anchors, ["/w/a/x", "/w/bc/x", "/w/bd/x"]);
    let across = Pattern::parse("/w/{a,b/c}/k").unwrap();
    assert!(across.is_match(&p("/w/b/c/k"), false));
    assert!(across.reaches_subtree(&p("/w/b")));
    assert!(!across.reaches_subtree(&p("/w/c")));
    // Braces inside a class or escaped are plain characters.
    assert!(Pattern::parse("/w/[{]x").unwrap().is_match(&p("/w/{x"), false));
    assert!(Pattern::parse(r"/w/\{a,b\}").unwrap().is_match(&p("/w/{a,b}"), false));
}

#[test]
fn dead_spellings_are_refused_with_a_reason() {
    for (pattern, why) in [
        ("/ws/./x/**", "'.' component"),
        ("/ws//x/**", "empty component"),
        ("/ws/x/**/", "after a final '**'"),
        ("/ws/[a/b]", "class never matches '/'"),
        (r"/ws/a\/b", "cannot be escaped"),
        ("/ws/{a,/b}", "empty component"),
        ("/ws/{a,b", "without its '}'"),
        ("/ws/a}", "without its '{'"),
        ("/ws/[ab", "unclosed"),
        (r"/ws/a\", "escapes nothing"),
        ("/ws/../x", "'..'"),
        (r"/ws/\.\./x", "never matches"),
        ("ws/x", "must start with '/'"),
        ("~/x", "not supported"),
    ] {
        let err = Pattern::parse(pattern).unwrap_err();
        assert!(err.contains(why), "{pattern}: {err}");
    }
    assert!(Pattern::parse("/").unwrap().is_match(&VPath::root(), true));
    assert!(Pattern::parse("/ws/dir/").unwrap().is_match(&p("/ws/dir"), true));
    assert!(!Pattern::parse("/ws/dir/").unwrap().is_match(&p("/ws/dir"), false));
}

/// `?` and classes take one character, not one byte of it, whatever the name's script.
#[test]
fn wildcards_match_characters_not_bytes() {
    let is = |pattern: &str, path: &str| Pattern::parse(pattern).unwrap().is_match(&p(path), false);
    assert!(is("/w/sec?et/**", "/w/sec€et/doc"));
    assert!(is("/w/sec?et/**", "/w/sec😀et/doc"));
    assert!(is("/w/?", "/w/é") && !is("/w/??", "/w/é") && !is("/w/?", "/w/éé"));
    assert!(is("/w/[eé]tude/**", "/w/étude/doc") && is("/w/[eé]tude/**", "/w/etude/doc"));
    assert!(is("/w/[!a]", "/w/é") && !is("/w/[!a]", "/w/a"));
    assert!(is("/w/[à-ÿ]x", "/w/éx") && !is("/w/[à-ÿ]x", "/w/ax"));
    assert!(is("/**/[[:alpha:]]é", "/d/aé") && !is("/**/[[:alpha:]]é", "/d/1é"));
    assert!(is("/w/*é?", "/w/xxéü") && !is("/w/*é?", "/w/xxé"));
    // A class that spans `/` (a range, a named class) still never matches it.
    assert!(!is("/w/build[[:punct:]]*", "/w/build/é") && is("/w/build[[:punct:]]*", "/w/build.é"));
    assert!(!is("/w/a[+-9]*", "/w/a/é") && is("/w/a[+-9]*", "/w/a5é"));
    // A `-` right after a range ends it: `[a-c-e]` is `a` to `e`, as globset reads it.
    assert!(is("/w/[a-c-e]é", "/w/dé"));
    // The subtree walk reads by characters too.
    let pattern = Pattern::parse("/w/sec?et/**").unwrap();
    assert!(pattern.reaches_subtree(&p("/w/sec€et")));
    assert!(!pattern.reaches_subtree(&p("/w/sec€€et")));
}

/// Path components of the generated trees: plain names and names that need escaping.
const NAMES: [&str; 8] = ["a", "b", "ab", ".env", "my dir", "*", "{x", "k.pem"];

/// Pattern components, each with the names it is meant to reach (for readability only).
fn pattern_component(with_alternatives: bool) -> BoxedStrategy<String> {
    let mut choices: Vec<&'static str> = vec![
        "a",
        "b",
        ".env",
        r"my\ dir",
        r"\*",
        r"\{x",
        "*",
        "?",
        "a*",
        "[ab]",
        "[!a]",
        "*.pem",
        "**",
        "a**",
        "?b",
        "[[:alpha:]]b",
        "[a-c]*",
        "[]a]",
        "[!-.]b",
        // Ranges and named classes that span `/`, which globset leaves out of a class.
        "[+-9]*",
        "[[:punct:]]*",
        "[a-c-e]",
        "[-a]b",
    ];
    if with_alternatives {
        choices.extend(["{a,b}", r"{a,my\ dir}", "{a,b/k.pem}", "{*.pem,.env}", "{a,{b,ab}}"]);
    }
    prop::sample::select(choices).prop_map(str::to_string).boxed()
}

fn pattern(with_alternatives: bool) -> impl Strategy<Value = String> {
    (prop::collection::vec(pattern_component(with_alternatives), 1..5), any::<bool>()).prop_map(
        |(components, trailing)| {
            let text = format!("/{}", components.join("/"));
            match trailing && !text.ends_with("**") {
                true => format!("{text}/"),
                false => text,
            }
        },
    )
}

/// A tree: every generated path and all its ancestors (directories).
fn tree() -> impl Strategy<Value = (BTreeSet<String>, BTreeSet<String>)> {
    let path = prop::collection::vec(prop::sample::select(NAMES.to_vec()), 1..5);
    prop::collection::vec(path, 1..12).prop_map(|paths| {
        let (mut files, mut dirs) = (BTreeSet::new(), BTreeSet::new());
        for components in paths {
            let mut at = String::new();
            for (i, name) in components.iter().enumerate() {
                at = format!("{at}/{name}");
                if i + 1 == components.len() {
                    files.insert(at.clone());
                } else {
                    dirs.insert(at.clone());
                }
            }
        }
        files.retain(|f| !dirs.contains(f));
        dirs.insert("/".to_string());
        (files, dirs)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whenever some entry at or below a directory matches, the overlap test says so.
    #[test]
    fn overlap_never_misses_a_match(text in pattern(true), (files, dirs) in tree()) {
        let Ok(pattern) = Pattern::parse(&text) else { return Ok(()) };
        let entries = files.iter().map(|f| (f, false)).chain(dirs.iter().map(|d| (d, true)));
        let matcher = pattern.matcher();
        let matched: Vec<VPath> = entries
            .map(|(e, is_dir)| (p(e), is_dir))
            .filter(|(e, is_dir)| matcher.is_match(e, *is_dir))
            .map(|(e, _)| e)
            .collect();
        for target in &dirs {
            let target = p(target);
            if let Some(entry) = matched.iter().find(|e| e.starts_with(&target)) {
                prop_assert!(
                    pattern.reaches_subtree(&target),
                    "{text} matches {entry} but is said not to reach {target}"
                );
            }
        }
    }

    /// On ASCII text, where a byte is a character, the by-character reading of every branch
    /// matches exactly what globset's does.
    #[test]
    fn by_char_agrees_with_globset_on_ascii(text in pattern(true), (files, dirs) in tree()) {
        let pattern = Pattern::parse(&text).unwrap();
        for branch in pattern.branches() {
            let ours = anchored(&branch_regex(&branch.segments, branch.dir_only).unwrap()).unwrap();
            let globs = branch.glob.compile_matcher();
            for entry in files.iter().chain(&dirs) {
                for candidate in [entry.clone(), format!("{entry}/")] {
                    prop_assert_eq!(ours.is_match(&candidate), globs.is_match(&candidate), "{} on {}", text, candidate);
                }
            }
        }
    }

    /// The parsed pattern matches exactly what globset reads into the same text.
    #[test]
    fn parse_agrees_with_globset(text in pattern(true), (files, dirs) in tree()) {
        let pattern = Pattern::parse(&text);
        prop_assert!(pattern.is_ok(), "{} refused: {:?}", text, pattern.err());
        let pattern = pattern.unwrap();
        let original = GlobBuilder::new(&text)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .unwrap()
            .compile_matcher();
        let branches: Vec<_> = pattern.branches().iter().map(|b| b.glob.compile_matcher()).collect();
        for entry in files.iter().chain(&dirs) {
            for candidate in [entry.clone(), format!("{entry}/")] {
                let ours = branches.iter().any(|b| b.is_match(&candidate));
                prop_assert_eq!(ours, original.is_match(&candidate), "{} on {}", text, candidate);
            }
        }
    }
}
