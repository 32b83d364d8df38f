//! Rules and their compiled form: every pattern of every rule in one `GlobSet`.
//!
//! A decision costs one set match (two for directories, which are judged as `dir` and `dir/`),
//! however many rules there are. First match wins; no match means allow.

use globset::{GlobSet, GlobSetBuilder};

use super::branch_index::BranchIndex;
use super::pattern::{Branch, ByChar, Pattern};

use crate::vpath::VPath;

/// Calls `f` with `path/`, the spelling that judges a directory as one, built in a buffer
/// of the thread's own (decisions are made on every request).
fn slashed<T>(path: &VPath, f: impl FnOnce(&str) -> T) -> T {
    thread_local! {
        static SLASHED: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    }
    SLASHED.with(|text| {
        let mut text = text.borrow_mut();
        text.clear();
        text.push_str(path.as_str());
        text.push('/');
        f(&text)
    })
}

/// The two operation classes every syscall and tool call falls into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Read,
    Write,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
        }
    }

    pub fn parse(s: &str) -> Option<Op> {
        match s {
            "read" => Some(Op::Read),
            "write" => Some(Op::Write),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    Allow,
    Deny,
    Interrupt,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Allow => "allow",
            Mode::Deny => "deny",
            Mode::Interrupt => "interrupt",
        }
    }

    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "allow" => Some(Mode::Allow),
            "deny" => Some(Mode::Deny),
            "interrupt" => Some(Mode::Interrupt),
            _ => None,
        }
    }
}

/// One `[[rules]]` entry, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub operations: Vec<Op>,
    pub paths: Vec<String>,
    pub mode: Mode,
    /// For read denials: answer ENOENT and leave the entry out of listings (the default), or
    /// keep it visible and answer EACCES.
    pub hide: bool,
}

impl Rule {
    pub fn applies_to(&self, op: Op) -> bool {
        self.operations.contains(&op)
    }

    /// The rule as one line, for `explain`, `check` and the audit log.
    pub fn describe(&self) -> String {
        let ops: Vec<&str> = self.operations.iter().map(|o| o.as_str()).collect();
        let hide = if self.mode == Mode::Deny && !self.hide { " (hide = false)" } else { "" };
        format!("{} {} {}{}", self.mode.as_str(), ops.join(","), self.paths.join(" "), hide)
    }
}

/// Why a pattern is not acceptable; the config loader adds file and line.
pub fn check_pattern(pattern: &str) -> Result<(), String> {
    Pattern::parse(pattern).map(|_| ())
}

/// The rules compiled for matching.
pub struct RuleSet {
    rules: Vec<Rule>,
    /// Every branch of every pattern (see [`Pattern`]), in rule order.
    set: GlobSet,
    /// The branches of `set` that read some names by characters ([`ByChar`]), by set index
    /// (ascending): for a path that is not all ASCII their answer replaces the set's.
    by_char: Vec<(usize, ByChar)>,
    /// Each rule's patterns, parsed once, with the rule they belong to.
    patterns: Vec<(usize, Pattern)>,
    /// What is known of each branch in `set`, by its index there.
    branches: Vec<SetBranch>,
    has_rules_for: [bool; 2],
    /// For each operation: whether a rule interrupts it, and whether a rule may refuse it on
    /// something that stays in sight (asked per listing, so not by reading every rule).
    asks_for: [bool; 2],
    refuses_in_sight: [bool; 2],
    /// Every branch but the position-free denials, filed by where it is anchored: the ones
    /// whose own walk answers whether a rename or a hiding rule reaches a subtree.
    walked: BranchIndex,
    /// The position-free denials (set indexes, so in rule order), which reach every subtree
    /// (see [`RuleSet::rename_may_change_verdicts`]).
    free_denials: Vec<usize>,
    /// Whether a hiding rule (deny read, `hide = true`) starts with `**` and so may hide
    /// something anywhere.
    hides_anywhere: bool,
}

/// What the rule set knows about one branch of its `GlobSet`.
struct SetBranch {
    /// The branch's pattern (an index in `patterns`) and its place among that pattern's branches.
    pattern: usize,
    branch: usize,
    /// Whether it names a directory itself when it matches `dir/` ([`Branch::covers_dir`]).
    covers_dir: bool,
    /// A deny or interrupt branch of the form `/**/NAME` or `/**/NAME/**`
    /// ([`Branch::is_position_free`]).
    free_denial: bool,
    /// A branch of a hiding rule.
    hiding: bool,
}

/// The outcome of matching one (operation, path).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub mode: Mode,
    /// The deciding rule; `None` when nothing matched (default allow).
    pub rule: Option<usize>,
    pub hide: bool,
}

impl Verdict {
    pub const DEFAULT_ALLOW: Verdict = Verdict { mode: Mode::Allow, rule: None, hide: false };
    /// A tool's temporary file, the daemon's own, hidden whatever the rules say (see
    /// [`super::temporaries`]).
    pub const TEMPORARY: Verdict = Verdict { mode: Mode::Deny, rule: None, hide: true };

    /// What the verdict does to `op`: its mode, and whether it hides (only a read denial
    /// can). Two verdicts with the same effect are the same decision, whichever rule gave them.
    pub fn effect(&self, op: Op) -> (Mode, bool) {
        (self.mode, self.mode == Mode::Deny && op == Op::Read && self.hide)
    }
}

impl RuleSet {
    /// Compiles validated rules. Patterns were checked by [`check_pattern`]; a failure here
    /// is reported the same way.
    pub fn new(rules: Vec<Rule>) -> Result<RuleSet, String> {
        let mut builder = GlobSetBuilder::new();
        let mut patterns = Vec::new();
        let mut branches = Vec::new();
        let (mut has_rules_for, mut asks_for, mut refuses_in_sight) = ([false; 2], [false; 2], [false; 2]);
        let mut hides_anywhere = false;
        let mut by_char = Vec::new();
        for (index, rule) in rules.iter().enumerate() {
            for op in &rule.operations {
                has_rules_for[*op as usize] = true;
                asks_for[*op as usize] |= rule.mode == Mode::Interrupt;
                refuses_in_sight[*op as usize] |=
                    rule.mode == Mode::Interrupt || (rule.mode == Mode::Deny && !rule.hide);
            }
            let hiding = rule.mode == Mode::Deny && rule.hide && rule.applies_to(Op::Read);
            for source in &rule.paths {
                let pattern = Pattern::parse(source)?;
                for (place, branch) in pattern.branches().iter().enumerate() {
                    if let Some(chars) = branch.by_char() {
                        by_char.push((branches.len(), chars.clone()));
                    }
                    builder.add(branch.glob().clone());
                    let free_denial = rule.mode != Mode::Allow && branch.is_position_free();
                    hides_anywhere |= hiding && branch.starts_anywhere();
                    let covers_dir = branch.covers_dir();
                    branches.push(SetBranch {
                        pattern: patterns.len(),
                        branch: place,
                        covers_dir,
                        free_denial,
                        hiding,
                    });
                }
                patterns.push((index, pattern));
            }
        }
        let set = builder.build().map_err(|e| e.to_string())?;
        let free_denials = (0..branches.len()).filter(|&b| branches[b].free_denial).collect();
        let walked =
            BranchIndex::new(branches.iter().enumerate().filter(|(_, b)| !b.free_denial).map(
                |(set_index, b)| (set_index, patterns[b.pattern].1.branches()[b.branch].literal_prefix()),
            ));
        Ok(RuleSet {
            rules,
            set,
            by_char,
            patterns,
            branches,
            has_rules_for,
            asks_for,
            refuses_in_sight,
            walked,
            free_denials,
            hides_anywhere,
        })
    }

    /// The branch at `set_index` in `set`, and the index of its rule.
    fn branch(&self, set_index: usize) -> (&Branch, usize) {
        let SetBranch { pattern, branch, .. } = self.branches[set_index];
        let (rule, pattern) = &self.patterns[pattern];
        (&pattern.branches()[branch], *rule)
    }

    pub fn empty() -> RuleSet {
        RuleSet::new(Vec::new()).expect("an empty rule set compiles")
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether a rule interrupts `op` (may ask a human about it somewhere).
    pub fn may_ask(&self, op: Op) -> bool {
        self.asks_for[op as usize]
    }

    /// Whether a rule may refuse `op` on something that stays in sight: it asks a human, or
    /// denies without hiding (`hide = false`). Otherwise every entry a listing shows is allowed.
    pub fn may_refuse_in_sight(&self, op: Op) -> bool {
        self.refuses_in_sight[op as usize]
    }

    /// First matching rule for `op` on `path`; a directory is also judged as `path/`.
    pub fn decide(&self, op: Op, path: &VPath, is_dir: bool) -> Verdict {
        if super::temporaries::is_temporary_name(path.name()) {
            return Verdict::TEMPORARY;
        }
        if !self.has_rules_for[op as usize] {
            return Verdict::DEFAULT_ALLOW;
        }
        let as_file = self.first_match(op, path.as_str(), false);
        self.verdict(if is_dir { self.as_dir(op, path, as_file) } else { as_file })
    }

    /// The decisions for `path` judged as a file and as a directory (whose kind is not known
    /// yet), for one set match fewer than two [`RuleSet::decide`]s.
    pub fn decide_both_kinds(&self, op: Op, path: &VPath) -> (Verdict, Verdict) {
        if super::temporaries::is_temporary_name(path.name()) {
            return (Verdict::TEMPORARY, Verdict::TEMPORARY);
        }
        if !self.has_rules_for[op as usize] {
            return (Verdict::DEFAULT_ALLOW, Verdict::DEFAULT_ALLOW);
        }
        let as_file = self.first_match(op, path.as_str(), false);
        (self.verdict(as_file), self.verdict(self.as_dir(op, path, as_file)))
    }

    /// The first rule for the directory `path`, given `as_file`, the first for its plain
    /// spelling: the earlier of that and the first for the `path/` spelling.
    fn as_dir(&self, op: Op, path: &VPath, as_file: Option<usize>) -> Option<usize> {
        if path.is_root() {
            return as_file;
        }
        let with_slash = slashed(path, |text| self.first_match(op, text, true));
        match (as_file, with_slash) {
            (Some(file), Some(dir)) => Some(file.min(dir)),
            (file, dir) => file.or(dir),
        }
    }

    fn verdict(&self, first: Option<usize>) -> Verdict {
        match first {
            None => Verdict::DEFAULT_ALLOW,
            Some(index) => {
                let rule = &self.rules[index];
                Verdict { mode: rule.mode, rule: Some(index), hide: rule.hide }
            }
        }
    }

    /// The set indexes of the branches matching `candidate`: the set's answer, with the
    /// branches that read by characters asked themselves when `candidate` is not all ASCII.
    fn matches_into(&self, candidate: &str, hits: &mut Vec<usize>) {
        self.set.matches_into(candidate, hits);
        if candidate.is_ascii() || self.by_char.is_empty() {
            return;
        }
        hits.retain(|hit| self.by_char.binary_search_by_key(hit, |(index, _)| *index).is_err());
        hits.extend(
            self.by_char.iter().filter(|(_, chars)| chars.is_match(candidate)).map(|(index, _)| *index),
        );
    }

    fn first_match(&self, op: Op, candidate: &str, as_dir: bool) -> Option<usize> {
        thread_local! {
            static HITS: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        HITS.with(|hits| {
            let mut hits = hits.borrow_mut();
            self.matches_into(candidate, &mut hits);
            hits.iter()
                .map(|&b| &self.branches[b])
                .filter(|b| !as_dir || b.covers_dir)
                .map(|b| self.patterns[b.pattern].0)
                .filter(|&r| self.rules[r].applies_to(op))
                .min()
        })
    }

    /// Whether moving the directory `from` to `to` could change how any rule judges an entry
    /// beneath it (so the engine must compare entry by entry). A deny or interrupt pattern
    /// that reaches neither subtree cannot. Nor can a pattern of the form `/**/NAME` or
    /// `/**/NAME/**` (NAME one component, a "position-free denial") that matches neither
    /// directory itself: whether it matches an entry depends only on the part of the path
    /// that moves along, provided no earlier allow rule reaches either subtree (first match
    /// wins). This keeps `mv` of big trees cheap under the usual "deny every .env" rules.
    ///
    /// Asked at every rename, so it reads only the branches filed on the paths of `from` and
    /// `to` or beneath them (see [`BranchIndex`]); the position-free denials, which reach everywhere, are
    /// answered by the set's matches of the two ends and the last rule holding one.
    pub fn rename_may_change_verdicts(&self, from: &VPath, to: &VPath) -> bool {
        let mut earliest_allow = usize::MAX;
        for end in [from, to] {
            // A branch on both ends' paths is read twice, to the same effect.
            let denial_reaches = self.walked.any_reaching(end, |set_index| {
                let (branch, rule) = self.branch(set_index);
                if !branch.reaches_subtree(end) {
                    return false;
                }
                if self.rules[rule].mode != Mode::Allow {
                    return true;
                }
                earliest_allow = earliest_allow.min(rule);
                false
            });
            if denial_reaches {
                return true;
            }
        }
        // A position-free denial reaches both subtrees (it starts with `**`). It may change a
        // verdict if it matches an end itself, or if an allow rule before it reaches one.
        match self.free_denials.last().map(|&last| self.branch(last).1) {
            None => false,
            Some(last_rule) if last_rule > earliest_allow => true,
            Some(_) => {
                self.any_branch_touching(&[from, to], |set_index| self.branches[set_index].free_denial)
            }
        }
    }

    /// Whether a branch in `set` for which `wanted(set index)` holds matches one of `dirs`
    /// itself, spelled `dir` or `dir/` (what `Branch::touches` answers for one branch).
    fn any_branch_touching(&self, dirs: &[&VPath], wanted: impl Fn(usize) -> bool) -> bool {
        let mut hits = Vec::new();
        dirs.iter().any(|dir| {
            self.matches_into(dir.as_str(), &mut hits);
            if hits.iter().any(|&hit| wanted(hit)) {
                return true;
            }
            slashed(dir, |text| self.matches_into(text, &mut hits));
            hits.iter().any(|&hit| wanted(hit))
        })
    }

    /// Patterns of rules with one of `modes` (for any of `ops`) that could match something in
    /// the subtree at `dir` (see [`Pattern::reaches_subtree`]), in rule order, each text once.
    pub fn overlapping_patterns(&self, dir: &VPath, ops: &[Op], modes: &[Mode]) -> Vec<&str> {
        let wanted = |set_index: usize| {
            let rule = &self.rules[self.branch(set_index).1];
            modes.contains(&rule.mode) && ops.iter().any(|op| rule.applies_to(*op))
        };
        let mut found = Vec::new();
        self.walked.any_reaching(dir, |set_index| {
            if wanted(set_index) && self.branch(set_index).0.reaches_subtree(dir) {
                found.push(self.branches[set_index].pattern);
            }
            false
        });
        // Position-free denials reach every subtree.
        found.extend(self.free_denials.iter().filter(|&&b| wanted(b)).map(|&b| self.branches[b].pattern));
        found.sort_unstable();
        found.dedup();
        // Two rules may hold the same text; a set keeps this linear when thousands match.
        let mut seen = std::collections::HashSet::with_capacity(found.len());
        found.into_iter().map(|p| self.patterns[p].1.as_str()).filter(|text| seen.insert(*text)).collect()
    }

    /// Whether a hiding rule (deny read, `hide = true`) could match something beneath `dir`.
    /// Asked at every directory's `stat`, so the usual case (a `/**/NAME` rule, which may
    /// hide something anywhere) costs nothing.
    pub fn may_hide_beneath(&self, dir: &VPath) -> bool {
        self.hides_anywhere
            || self.walked.any_reaching(dir, |set_index| {
                self.branches[set_index].hiding && self.branch(set_index).0.reaches_subtree(dir)
            })
    }

    /// The patterns of rule `index` that match `path` itself (as a file).
    pub fn matching_patterns(&self, index: usize, path: &VPath) -> Vec<&str> {
        self.patterns
            .iter()
            .filter(|(rule, pattern)| *rule == index && pattern.is_match(path, false))
            .map(|(_, pattern)| pattern.as_str())
            .collect()
    }

    /// The literal leading directories of the patterns of `mode` rules for `op`: a bulk
    /// call on a path that overlaps none of them cannot meet such a rule.
    pub fn anchors(&self, op: Op, mode: Mode) -> Vec<VPath> {
        self.patterns
            .iter()
            .filter(|(rule, _)| self.rules[*rule].mode == mode && self.rules[*rule].applies_to(op))
            .flat_map(|(_, pattern)| pattern.anchors())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(ops: &[Op], paths: &[&str], mode: Mode) -> Rule {
        Rule {
            operations: ops.to_vec(),
            paths: paths.iter().map(|s| s.to_string()).collect(),
            mode,
            hide: true,
        }
    }

    fn p(s: &str) -> VPath {
        VPath::parse(s).unwrap()
    }

    #[test]
    fn first_match_wins_and_default_allows() {
        let set = RuleSet::new(vec![
            rule(&[Op::Read], &["/pub/**"], Mode::Allow),
            rule(&[Op::Read, Op::Write], &["/**"], Mode::Deny),
        ])
        .unwrap();
        assert_eq!(set.decide(Op::Read, &p("/pub/a"), false).mode, Mode::Allow);
        assert_eq!(set.decide(Op::Read, &p("/other"), false).rule, Some(1));
        // Directories are judged as `dir/` too, so `/pub` itself can be listed.
        assert_eq!(set.decide(Op::Read, &p("/pub"), true).mode, Mode::Allow);
        assert_eq!(set.decide(Op::Read, &p("/pub"), false).mode, Mode::Deny);
        assert_eq!(set.decide(Op::Write, &p("/pub/a"), false).mode, Mode::Deny);
        let none = RuleSet::empty();
        assert_eq!(none.decide(Op::Write, &p("/x"), false), Verdict::DEFAULT_ALLOW);
    }

    #[test]
    fn globs_match_dot_files_and_stay_in_components() {
        let set = RuleSet::new(vec![
            rule(&[Op::Read], &["/secrets/**"], Mode::Deny),
            rule(&[Op::Read], &["/w/*.log"], Mode::Deny),
            rule(&[Op::Read], &["/**/.env"], Mode::Deny),
            rule(&[Op::Read], &["/x/{a,b}/f?[0-9]"], Mode::Deny),
        ])
        .unwrap();
        let denied = |s: &str, dir: bool| set.decide(Op::Read, &p(s), dir).mode == Mode::Deny;
        assert!(denied("/secrets/.env", false));
        assert!(denied("/secrets/.git/config", false));
        assert!(denied("/secrets/a/b/c", false));
        assert!(denied("/secrets", true), "a directory is judged as dir/");
        assert!(!denied("/secrets", false), "a plain file named /secrets is not");
        assert!(denied("/w/.hidden.log", false));
        assert!(!denied("/w/sub/a.log", false), "* stays within one component");
        assert!(denied("/.env", false));
        assert!(denied("/a/b/.env", false));
        assert!(!denied("/a/b/.envrc", false));
        assert!(denied("/x/b/fz7", false));
        // `*` may match an empty name, but `/w/*` names the children of `/w`, not `/w` itself.
        let children = RuleSet::new(vec![rule(&[Op::Read], &["/w/*"], Mode::Deny)]).unwrap();
        assert_eq!(children.decide(Op::Read, &p("/w"), true).mode, Mode::Allow);
        assert_eq!(children.decide(Op::Read, &p("/w/a"), true).mode, Mode::Deny);
        assert!(!denied("/x/c/fz7", false));
    }

    #[test]
    fn renames_under_position_free_rules_need_no_walk() {
        let env = RuleSet::new(vec![rule(&[Op::Read, Op::Write], &["/**/.env", "/**/.ssh/**"], Mode::Deny)])
            .unwrap();
        assert!(!env.rename_may_change_verdicts(&p("/w/a"), &p("/w/b")));
        assert!(env.rename_may_change_verdicts(&p("/w/.ssh"), &p("/w/b")), "the moved directory is covered");
        let anchored = RuleSet::new(vec![rule(&[Op::Read], &["/w/a/secret/**"], Mode::Deny)]).unwrap();
        assert!(anchored.rename_may_change_verdicts(&p("/w/a"), &p("/w/b")));
        assert!(!anchored.rename_may_change_verdicts(&p("/x/a"), &p("/x/b")));
        // An earlier allow that reaches the subtree makes the outcome depend on the place.
        let allow_first = RuleSet::new(vec![
            rule(&[Op::Read], &["/b/**"], Mode::Allow),
            rule(&[Op::Read], &["/**/.env"], Mode::Deny),
        ])
        .unwrap();
        assert!(allow_first.rename_may_change_verdicts(&p("/a/d"), &p("/b/d")));
    }

    #[test]
    fn hiding_rules_reach_the_directories_they_may_hide_beneath() {
        let anchored = RuleSet::new(vec![
            rule(&[Op::Read], &["/w/secret*/**"], Mode::Deny),
            rule(&[Op::Write], &["/**/.env"], Mode::Deny),
        ])
        .unwrap();
        assert!(anchored.may_hide_beneath(&p("/w")));
        assert!(anchored.may_hide_beneath(&p("/")));
        assert!(!anchored.may_hide_beneath(&p("/w/public")), "no hiding rule reaches below it");
        assert!(!anchored.may_hide_beneath(&p("/x")), "a write denial hides nothing");
        let anywhere = RuleSet::new(vec![rule(&[Op::Read], &["/**/.env"], Mode::Deny)]).unwrap();
        assert!(anywhere.may_hide_beneath(&p("/any/where")));
        let visible = Rule { hide: false, ..rule(&[Op::Read], &["/**/.env"], Mode::Deny) };
        assert!(
            !RuleSet::new(vec![visible]).unwrap().may_hide_beneath(&p("/any")),
            "hide = false hides nothing"
        );
    }

    #[test]
    fn a_set_knows_which_operations_its_rules_ask_about_or_refuse_in_sight() {
        let visible = Rule { hide: false, ..rule(&[Op::Write], &["/w/**"], Mode::Deny) };
        let set = RuleSet::new(vec![
            rule(&[Op::Read], &["/a/**"], Mode::Interrupt),
            rule(&[Op::Read, Op::Write], &["/**/.env"], Mode::Deny),
            visible,
        ])
        .unwrap();
        assert!(set.may_ask(Op::Read) && !set.may_ask(Op::Write));
        assert!(set.may_refuse_in_sight(Op::Read), "the interrupt asks about what it shows");
        assert!(set.may_refuse_in_sight(Op::Write), "the write denial does not hide");
        let hiding = RuleSet::new(vec![rule(&[Op::Read, Op::Write], &["/**/.env"], Mode::Deny)]).unwrap();
        assert!(!hiding.may_refuse_in_sight(Op::Read), "the read denial hides");
        assert!(!RuleSet::empty().may_ask(Op::Read) && !RuleSet::empty().may_refuse_in_sight(Op::Read));
    }

    #[test]
    fn patterns_are_checked() {
        assert!(check_pattern("/ok/**").is_ok());
        assert!(check_pattern("relative").unwrap_err().contains("must start with '/'"));
        assert!(check_pattern("/a/../b").unwrap_err().contains(".."));
        assert!(check_pattern("~/x").unwrap_err().contains("not supported"));
        assert!(check_pattern("/a/[b").is_err());
        for dead in ["/ws/./x/**", "/ws//x/**", "/ws/x/**/", "/a/[x/y]", "/a\\/b", "/a/\\.."] {
            assert!(check_pattern(dead).is_err(), "{dead} can never match and must be refused");
        }
    }

    #[test]
    fn the_set_finds_the_branches_touching_a_directory_as_each_branch_does() {
        let sources = ["/**/.env", "/**/secrets/**", "/w/*", "/w/", "/a/{b,c}/**", "/x/[0-9]?/", "/**", "/"];
        let set = RuleSet::new(vec![rule(&[Op::Read, Op::Write], &sources, Mode::Deny)]).unwrap();
        let branches: Vec<&Branch> = set.patterns.iter().flat_map(|(_, p)| p.branches()).collect();
        assert_eq!(branches.len(), set.branches.len());
        let touching = |dirs: &[&VPath]| -> Vec<bool> {
            (0..branches.len()).map(|i| set.any_branch_touching(dirs, |hit| hit == i)).collect()
        };
        let dirs = ["/", "/w", "/w/a", "/.env", "/q/.env", "/q/secrets", "/a/b", "/a/c/d", "/x/12", "/x/1"];
        for dir in dirs {
            let dir = p(dir);
            let each: Vec<bool> = branches.iter().map(|b| b.touches(&dir)).collect();
            assert_eq!(touching(&[&dir]), each, "{dir}");
        }
        let (one, other) = (p("/q/.env"), p("/w"));
        let both = touching(&[&one, &other]);
        let either: Vec<bool> = branches.iter().map(|b| b.touches(&one) || b.touches(&other)).collect();
        assert_eq!(both, either);
        assert!(both.iter().any(|&t| t) && both.iter().any(|&t| !t), "the cases tell branches apart");
    }
}
