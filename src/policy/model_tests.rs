//! A model test of the gate: random rules and paths, decided by the compiled rule set and by a
//! plain reference matcher written from the documented semantics, must agree.

use proptest::prelude::*;

use super::rules::{Mode, Op, Rule, RuleSet};
use crate::vpath::VPath;

/// Does one pattern component match one path component? `*` any run (dot-files included),
/// `?` one character, `{a,b}` alternatives.
fn component_matches(pattern: &str, name: &str) -> bool {
    if let Some(open) = pattern.find('{') {
        let close = pattern[open..].find('}').map(|c| c + open).expect("balanced");
        let (head, tail) = (&pattern[..open], &pattern[close + 1..]);
        return pattern[open + 1..close]
            .split(',')
            .any(|alt| component_matches(&format!("{head}{alt}{tail}"), name));
    }
    fn go(p: &[char], n: &[char]) -> bool {
        match p.first() {
            None => n.is_empty(),
            Some('*') => (0..=n.len()).any(|i| go(&p[1..], &n[i..])),
            Some('?') => !n.is_empty() && go(&p[1..], &n[1..]),
            Some(c) => n.first() == Some(c) && go(&p[1..], &n[1..]),
        }
    }
    go(&pattern.chars().collect::<Vec<_>>(), &name.chars().collect::<Vec<_>>())
}

/// `**` spans zero or more components, except at the end, where it needs at least one (the
/// empty one after a trailing slash counts): `/a/**` matches `/a/` and `/a/x`, not `/a`.
fn path_matches(pattern: &[&str], path: &[&str]) -> bool {
    match pattern.first() {
        None => path.is_empty(),
        Some(&"**") if pattern.len() == 1 => !path.is_empty(),
        Some(&"**") => (0..=path.len()).any(|i| path_matches(&pattern[1..], &path[i..])),
        Some(p) => {
            !path.is_empty() && component_matches(p, path[0]) && path_matches(&pattern[1..], &path[1..])
        }
    }
}

fn reference(rules: &[Rule], op: Op, path: &str, is_dir: bool) -> Option<usize> {
    let slashed = format!("{path}/");
    let plain: Vec<&str> = path.split('/').collect();
    let slashed: Vec<&str> = slashed.split('/').collect();
    rules.iter().position(|rule| {
        rule.applies_to(op)
            && rule.paths.iter().any(|pattern| {
                let pc: Vec<&str> = pattern.split('/').collect();
                path_matches(&pc, &plain)
                    || (is_dir && path != "/" && pattern.ends_with("/**") && path_matches(&pc, &slashed))
            })
    })
}

fn component() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("a".to_string()),
        Just("b".to_string()),
        Just(".env".to_string()),
        Just("ab".to_string()),
    ]
}

fn pattern_component() -> impl Strategy<Value = String> {
    prop_oneof![
        component(),
        Just("*".to_string()),
        Just("**".to_string()),
        Just("?".to_string()),
        Just("a*".to_string()),
        Just(".*".to_string()),
        Just("{a,b}".to_string()),
    ]
}

fn pattern() -> impl Strategy<Value = String> {
    prop::collection::vec(pattern_component(), 1..4).prop_map(|c| format!("/{}", c.join("/")))
}

fn rule() -> impl Strategy<Value = Rule> {
    (
        prop::sample::subsequence(vec![Op::Read, Op::Write], 1..=2),
        prop::collection::vec(pattern(), 1..3),
        prop_oneof![Just(Mode::Allow), Just(Mode::Deny), Just(Mode::Interrupt)],
    )
        .prop_map(|(operations, paths, mode)| Rule { operations, paths, mode, hide: true })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn compiled_rules_agree_with_the_reference(
        rules in prop::collection::vec(rule(), 0..6),
        path in prop::collection::vec(component(), 0..4),
        is_dir in any::<bool>(),
        write in any::<bool>(),
    ) {
        let set = RuleSet::new(rules.clone()).unwrap();
        let path = format!("/{}", path.join("/"));
        let op = if write { Op::Write } else { Op::Read };
        let vpath = VPath::parse(&path).unwrap();
        let verdict = set.decide(op, &vpath, is_dir);
        prop_assert_eq!(verdict.rule, reference(&rules, op, &path, is_dir), "{} {:?}", path, rules);
        // Both kinds at once, as a node of unknown kind is judged.
        let both = (set.decide(op, &vpath, false), set.decide(op, &vpath, true));
        prop_assert_eq!(set.decide_both_kinds(op, &vpath), both);
    }
}

/// The rename question answered the plain way, branch by branch in rule order, without the
/// index or the set: the reference the rule set's answer must equal.
fn rename_may_change_by_every_branch(rules: &[Rule], from: &VPath, to: &VPath) -> bool {
    use super::pattern::Pattern;
    let mut earliest_reaching_allow = usize::MAX;
    for (rule_index, rule) in rules.iter().enumerate() {
        for source in &rule.paths {
            for branch in Pattern::parse(source).unwrap().branches() {
                if !(branch.reaches_subtree(from) || branch.reaches_subtree(to)) {
                    continue;
                }
                if rule.mode == Mode::Allow {
                    earliest_reaching_allow = earliest_reaching_allow.min(rule_index);
                    continue;
                }
                let touches = branch.touches(from) || branch.touches(to);
                if branch.is_position_free() && earliest_reaching_allow > rule_index && !touches {
                    continue;
                }
                return true;
            }
        }
    }
    false
}

fn path_of(components: &[String]) -> VPath {
    VPath::parse(&format!("/{}", components.join("/"))).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]
    #[test]
    fn a_rename_said_not_to_change_verdicts_changes_none(
        rules in prop::collection::vec(rule(), 0..6),
        from in prop::collection::vec(component(), 1..3),
        to in prop::collection::vec(component(), 1..3),
    ) {
        let set = RuleSet::new(rules.clone()).unwrap();
        let (from, to) = (path_of(&from), path_of(&to));
        let may_change = set.rename_may_change_verdicts(&from, &to);
        prop_assert_eq!(may_change, rename_may_change_by_every_branch(&rules, &from, &to));
        if may_change {
            return Ok(());
        }
        // Nothing beneath the moved directory is judged differently at its new place.
        let names = ["a", "b", ".env", "ab", "c"];
        let mut beneath: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        beneath.extend(names.iter().flat_map(|a| names.iter().map(move |b| format!("{a}/{b}"))));
        for rel in &beneath {
            for op in [Op::Read, Op::Write] {
                for is_dir in [false, true] {
                    let old = set.decide(op, &from.join_rel(rel), is_dir);
                    let new = set.decide(op, &to.join_rel(rel), is_dir);
                    prop_assert_eq!(old.effect(op), new.effect(op), "{} -> {}: {}", from, to, rel);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn a_hiding_rule_is_found_beneath_every_directory_it_reaches(
        rules in prop::collection::vec(rule(), 0..6),
        dir in prop::collection::vec(component(), 0..3),
    ) {
        use super::pattern::Pattern;
        let set = RuleSet::new(rules.clone()).unwrap();
        let dir = path_of(&dir);
        let hiding = |rule: &Rule| rule.mode == Mode::Deny && rule.hide && rule.applies_to(Op::Read);
        let reference = rules.iter().filter(|rule| hiding(rule)).any(|rule| {
            rule.paths.iter().any(|source| Pattern::parse(source).unwrap().reaches_subtree(&dir))
        });
        prop_assert_eq!(set.may_hide_beneath(&dir), reference, "{} {:?}", dir, rules);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn the_patterns_overlapping_a_subtree_are_each_pattern_that_reaches_it(
        rules in prop::collection::vec(rule(), 0..6),
        dir in prop::collection::vec(component(), 0..3),
        write in any::<bool>(),
        deny_only in any::<bool>(),
    ) {
        use super::pattern::Pattern;
        let set = RuleSet::new(rules.clone()).unwrap();
        let dir = path_of(&dir);
        let op = if write { Op::Write } else { Op::Read };
        let modes: &[Mode] = if deny_only { &[Mode::Deny] } else { &[Mode::Deny, Mode::Interrupt, Mode::Allow] };
        let mut reference: Vec<&str> = Vec::new();
        for rule in rules.iter().filter(|r| modes.contains(&r.mode) && r.applies_to(op)) {
            for source in &rule.paths {
                let reaches = Pattern::parse(source).unwrap().reaches_subtree(&dir);
                if reaches && !reference.contains(&source.as_str()) {
                    reference.push(source);
                }
            }
        }
        prop_assert_eq!(set.overlapping_patterns(&dir, &[op], modes), reference, "{} {:?}", dir, rules);
    }
}
