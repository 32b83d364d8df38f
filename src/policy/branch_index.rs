//! The branches of a rule set that could reach a subtree, found without asking every branch:
//! branches are filed in a tree by their leading literal components, so a question about
//! `/w/a/b` reads only the branches filed along `/w/a/b` and beneath it.
//!
//! A branch's walk ([`super::pattern::Branch::reaches_subtree`]) dies at the first literal
//! that differs from the target's component there, so a branch filed off the target's path
//! cannot reach it. The walk is asked on every rename and every directory `stat`; with
//! thousands of rules, this keeps its cost to the branches that may answer yes.

use std::collections::HashMap;

use crate::vpath::VPath;

/// Set indexes (the order branches were added to the rule set's `GlobSet`) by their leading
/// literal components. Branches left out at build time are in no list.
#[derive(Default)]
pub(super) struct BranchIndex {
    root: Node,
}

#[derive(Default)]
struct Node {
    /// Branches whose literal components end here: the next one is a wildcard or `**`, or
    /// there is none.
    here: Vec<usize>,
    children: HashMap<String, Node>,
}

impl BranchIndex {
    /// Files each `(set index, leading literal components)` given.
    pub fn new<'a, L>(branches: impl IntoIterator<Item = (usize, L)>) -> BranchIndex
    where
        L: IntoIterator<Item = &'a str>,
    {
        let mut index = BranchIndex::default();
        for (set_index, literals) in branches {
            let mut node = &mut index.root;
            for name in literals {
                node = node.children.entry(name.to_string()).or_default();
            }
            node.here.push(set_index);
        }
        index
    }

    /// Calls `visit` with each filed branch that could reach the subtree at `dir` (anchored
    /// above it on its path, or at or beneath it), until `visit` returns true; returns
    /// whether it did.
    pub fn any_reaching(&self, dir: &VPath, mut visit: impl FnMut(usize) -> bool) -> bool {
        let mut node = &self.root;
        for name in dir.components() {
            if node.here.iter().any(|&branch| visit(branch)) {
                return true;
            }
            match node.children.get(name) {
                Some(child) => node = child,
                None => return false,
            }
        }
        node.any_beneath(&mut visit)
    }
}

impl Node {
    fn any_beneath(&self, visit: &mut impl FnMut(usize) -> bool) -> bool {
        self.here.iter().any(|&branch| visit(branch))
            || self.children.values().any(|child| child.any_beneath(visit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> VPath {
        VPath::parse(s).unwrap()
    }

    #[test]
    fn a_subtree_reads_the_branches_on_its_path_and_beneath_it_only() {
        let index = BranchIndex::new([
            (0, vec!["w"]),
            (1, vec![]),
            (2, vec!["x"]),
            (3, vec!["w", "a", "b"]),
            (4, vec![]),
            (5, vec!["w", "c"]),
        ]);
        let found = |dir: &str| {
            let mut found = Vec::new();
            assert!(!index.any_reaching(&p(dir), |branch| {
                found.push(branch);
                false
            }));
            found.sort_unstable();
            found
        };
        assert_eq!(found("/w/a"), [0, 1, 3, 4]);
        assert_eq!(found("/w/a/b/c"), [0, 1, 3, 4]);
        assert_eq!(found("/w"), [0, 1, 3, 4, 5]);
        assert_eq!(found("/x"), [1, 2, 4]);
        assert_eq!(found("/q/w"), [1, 4], "a branch is filed from the first component");
        assert_eq!(found("/"), [0, 1, 2, 3, 4, 5], "the root's subtree holds everything");
        // The visit stops at the first yes.
        let mut seen = 0;
        assert!(index.any_reaching(&p("/w"), |_| {
            seen += 1;
            true
        }));
        assert_eq!(seen, 1);
    }
}
