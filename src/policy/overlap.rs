//! Could a rule's pattern match anything inside a subtree? (Deep Agents' delete overlap test.)
//!
//! Used before removing or renaming a directory: a rule that protects something beneath it
//! must see that operation. The test is conservative (it may say "overlaps" when nothing
//! actually matches), never the other way round.

use globset::GlobMatcher;

use crate::vpath::VPath;

const WILDCARDS: [char; 4] = ['*', '?', '[', '{'];

/// The longest leading run of components without a wildcard character, or `/`.
pub fn glob_anchor(pattern: &str) -> VPath {
    let mut literal = Vec::new();
    for component in pattern.split('/').filter(|c| !c.is_empty()) {
        if component.contains(WILDCARDS) {
            break;
        }
        literal.push(component);
    }
    VPath::parse(&format!("/{}", literal.join("/"))).unwrap_or_else(|_| VPath::root())
}

/// Equal, or one lies beneath the other (whole components).
pub fn paths_overlap(a: &VPath, b: &VPath) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// Whether `pattern` could match `target` or anything beneath it.
pub fn subtree_overlaps(pattern: &str, matcher: &GlobMatcher, target: &VPath) -> bool {
    let anchor = glob_anchor(pattern);
    if !pattern.contains(WILDCARDS) {
        return paths_overlap(target, &anchor);
    }
    if anchor.is_root() {
        return true;
    }
    if matcher.is_match(target.as_str()) || matcher.is_match(format!("{target}/")) {
        return true;
    }
    if anchor.starts_with(target) {
        return true;
    }
    if !target.starts_with(&anchor) {
        return false;
    }
    let suffix = pattern
        .trim_start_matches('/')
        .split('/')
        .filter(|c| !c.is_empty())
        .skip(anchor.depth())
        .collect::<Vec<_>>();
    if suffix.len() != 1 || suffix[0].contains("**") {
        return true; // fail closed: the pattern can reach any depth
    }
    // A one-component pattern below the anchor matches at one depth only: an ancestor of the
    // target at that depth decides.
    let mut ancestor = target.parent();
    while ancestor.depth() > anchor.depth() {
        if matcher.is_match(ancestor.as_str()) {
            return true;
        }
        ancestor = ancestor.parent();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::rules::compile_glob;

    fn overlaps(pattern: &str, target: &str) -> bool {
        let matcher = compile_glob(pattern).unwrap().compile_matcher();
        subtree_overlaps(pattern, &matcher, &VPath::parse(target).unwrap())
    }

    /// The worked examples of the delete overlap table, one row each.
    #[test]
    fn worked_examples() {
        let table = [
            ("/other/**", "/work", false),
            ("/workshop/**", "/work", false),
            ("/work2", "/work", false),
            ("/work/*.log", "/work/notes.txt", false),
            ("/work/*.log", "/work/app.log", true),
            ("/work/*.log", "/work/app.log/child", true),
            ("/work/*.log", "/work", true),
            ("/work/*", "/work/app/child", true),
            ("/work/*/secrets", "/work/app", true),
            ("/work/**/secrets", "/work/app", true),
            ("/work/**/*.log", "/work/sub", true),
            ("/work/f?le.txt", "/work/other.txt", false),
            ("/work/*.txt", "/work/sub/deep", false),
            ("/work/{a,b}/**", "/work/c", true),
            ("/work/secrets/**", "/work", true),
            ("/work/**", "/work/logs", true),
            ("/work", "/work/sub/deep", true),
            ("/work/secrets", "/work", true),
            ("/anything/**", "/", true),
            ("/**/secrets", "/work", true),
            ("/work/", "/work/sub", true),
        ];
        for (pattern, target, want) in table {
            assert_eq!(overlaps(pattern, target), want, "{pattern} vs {target}");
        }
    }

    #[test]
    fn anchors() {
        assert_eq!(glob_anchor("/a/b/*.x").as_str(), "/a/b");
        assert_eq!(glob_anchor("/**/x").as_str(), "/");
        assert_eq!(glob_anchor("/a/{b,c}/d").as_str(), "/a");
        assert_eq!(glob_anchor("/a/b/").as_str(), "/a/b");
    }
}
