//! Where a tool's glob pattern is anchored, and whether two subtrees overlap. (A rule
//! pattern's own overlap test lives with its parsed form, [`super::pattern::Pattern`].)

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::pattern::Pattern;

    fn overlaps(pattern: &str, target: &str) -> bool {
        Pattern::parse(pattern).unwrap().reaches_subtree(&VPath::parse(target).unwrap())
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
            // Deep Agents blocks this one (its anchor stops at the brace); the parsed
            // pattern knows that nothing under /work/c can match.
            ("/work/{a,b}/**", "/work/c", false),
            ("/work/{a,b}/**", "/work/b", true),
            ("/work/secrets/**", "/work", true),
            ("/work/**", "/work/logs", true),
            ("/work", "/work/sub/deep", true),
            ("/work/secrets", "/work", true),
            ("/anything/**", "/", true),
            ("/**/secrets", "/work", true),
            ("/work/", "/work/sub", true),
            // Escapes are read as the matcher reads them.
            ("/ws/my\\ dir/secrets/**", "/ws/my dir", true),
            ("/ws/my\\ dir/secrets/**", "/ws/other", false),
            ("/ws/\\*/k", "/ws/*", true),
            ("/ws/\\*/k", "/ws/a", false),
            ("/ws/[ab]c/**", "/ws/bc", true),
            ("/ws/[ab]c/**", "/ws/cc", false),
            ("/ws/{x,y/z}/k", "/ws/y", true),
            ("/ws/{x,y/z}/k", "/ws/q", false),
            ("/ws/*/secret/**", "/ws", true),
            ("/ws/*/secret/**", "/ws/a/public", false),
            ("/ws/**/a/b", "/ws/q/a", true),
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
