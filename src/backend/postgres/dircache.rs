//! What this daemon knows of its namespace's tree without asking the server: directories'
//! attributes, the names each holds when its whole listing is known, the node (inode and kind)
//! a name leads to where a read or an own change told it, and the attributes of such nodes
//! that are not directories. It answers the requests the kernel sends after every change of a
//! directory (a `GETATTR` of it, from `default_permissions`), before every new name (a `LOOKUP`
//! that finds nothing), the walk of every `OPEN` of a known name, and the `GETATTR` of a file
//! between its attribute changes.
//!
//! It is exactly as honest as the kernel's own caches, which live an hour on this route: it
//! learns of this daemon's changes as they commit, and forgets what other daemons change when
//! their notifications arrive, before the kernel is told (so a kernel that asks again is never
//! answered from the old entry). Nothing is kept until the change listener runs.
//!
//! Races: a server answer is kept only if nothing changed (no own change began or ended, no
//! notification arrived) between the moment it was asked and the moment it is kept, and no own
//! change is under way. An own change is applied to what is known only when it was the only
//! one under way from its start to its end; otherwise what it touched is forgotten.
//! Directories have one name each, so a path names one of them.

use std::collections::{BTreeMap, HashMap};

use parking_lot::Mutex;

use crate::backend::tree::ns_to_time;
use crate::backend::{join_child, split_parent, Attr, DirEntry, FileKind, RemoteChange};

/// Names kept at most over all listings; past it everything is forgotten and learned again.
const MAX_NAMES: usize = 1 << 20;
/// Directories kept at most.
const MAX_DIRS: usize = 1 << 17;

#[derive(Default)]
pub(super) struct DirCache {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Whether other daemons' changes are being heard (the listener runs).
    on: bool,
    /// Moves on with every own change that begins or ends and every notification.
    generation: u64,
    /// Own changes under way.
    changing: u32,
    /// By route-relative path ("" is the route's root).
    dirs: BTreeMap<String, Dir>,
    /// Names held by all listings together.
    names: usize,
    /// The attributes of nodes other than directories, by inode (a file with several names
    /// has one entry). Whatever may change a node's attributes forgets them, and a change of
    /// a node this cache cannot name forgets them all.
    files: HashMap<u64, Attr>,
}

#[derive(Default)]
struct Dir {
    attr: Option<Attr>,
    /// Names in the directory, each with the node it leads to where that is known.
    names: HashMap<String, Option<Node>>,
    /// Whether `names` holds every name in the directory.
    complete: bool,
}

/// The node a name leads to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Node {
    pub ino: u64,
    pub kind: FileKind,
}

impl Node {
    fn of(attr: &Attr) -> Node {
        Node { ino: attr.ino, kind: attr.kind }
    }
}

/// What the cache knows of a path.
#[derive(Debug, PartialEq)]
pub(super) enum Known {
    /// Nothing is there.
    Absent,
    /// A directory with these attributes.
    Dir(Attr),
    /// Ask the server.
    Unknown,
}

/// The moment a server read or an own change began, to tell whether anything changed since.
#[derive(Clone, Copy)]
pub(super) struct Ticket(u64);

/// An own change, for the cache to apply or forget.
pub(super) enum Change<'a> {
    /// A name was made at `path` for the node `attr` (create, mkdir, mknod, symlink, link),
    /// its directory touched at `now` (ns).
    Made { path: &'a str, attr: &'a Attr, now: i64 },
    /// The name `path` was taken (unlink, rmdir: `dir`), its directory touched at `now`.
    Taken { path: &'a str, dir: bool, now: i64 },
    /// The node at `path` got these attributes (`None`: changed in a way not known here).
    Attrs { path: &'a str, attr: Option<&'a Attr> },
    /// A rename (`exchange`: RENAME_EXCHANGE) that moved a node, the directories touched at
    /// `now`.
    Moved { from: &'a str, to: &'a str, now: i64, exchange: bool },
    /// The attributes of the node changed, at whatever path.
    Node(Node),
    /// The attributes of inode `attr.ino` are `attr` now (a change through a handle).
    NodeAttrs { attr: &'a Attr },
}

impl DirCache {
    /// Other daemons' changes are heard from now on: the cache may keep what it learns.
    pub fn start(&self) {
        self.state.lock().on = true;
    }

    pub fn known(&self, path: &str) -> Known {
        let state = self.state.lock();
        if !state.on {
            return Known::Unknown;
        }
        if let Some(attr) = state.dirs.get(path).and_then(|d| d.attr.as_ref()) {
            return Known::Dir(attr.clone());
        }
        if path.is_empty() {
            return Known::Unknown;
        }
        let (parent, leaf) = split_parent(path);
        match state.dirs.get(parent) {
            Some(d) if d.complete && !d.names.contains_key(leaf) => Known::Absent,
            _ => Known::Unknown,
        }
    }

    /// Whether `path` is known to be a directory without a name in it.
    pub fn empty_dir(&self, path: &str) -> bool {
        let state = self.state.lock();
        state.on && state.dirs.get(path).is_some_and(|d| d.attr.is_some() && d.complete && d.names.is_empty())
    }

    /// The node `path` leads to, if known.
    pub fn node(&self, path: &str) -> Option<Node> {
        let state = self.state.lock();
        state.on.then(|| state.node(path)).flatten()
    }

    /// The attributes of what `path` leads to, if that is not a directory and they are known.
    pub fn file_attr(&self, path: &str) -> Option<Attr> {
        let state = self.state.lock();
        let node = state.on.then(|| state.node(path)).flatten()?;
        state.files.get(&node.ino).cloned()
    }

    /// The attributes of inode `ino`, if it is not a directory and they are known.
    pub fn attr_of(&self, ino: u64) -> Option<Attr> {
        let state = self.state.lock();
        state.on.then(|| state.files.get(&ino).cloned()).flatten()
    }

    /// Keeps the attributes of a node read by its inode from the server, if not a directory's.
    pub fn read_node_attr(&self, ticket: Ticket, attr: &Attr) {
        let mut state = self.state.lock();
        if attr.kind != FileKind::Dir && state.keeps(ticket) {
            state.keep_file_attr(attr);
        }
    }

    /// Taken before a server read whose answer may be kept.
    pub fn reading(&self) -> Ticket {
        Ticket(self.state.lock().generation)
    }

    /// Keeps what the server said of the node at `path`: the node the name leads to, and a
    /// directory's attributes.
    pub fn read_attr(&self, ticket: Ticket, path: &str, attr: &Attr) {
        let mut state = self.state.lock();
        if state.keeps(ticket) {
            state.learn(path, attr);
        }
    }

    /// Keeps what the server said of the entry `name` of the directory `dir`.
    pub fn read_entry_attr(&self, ticket: Ticket, (dir, name): (&str, &str), attr: &Attr) {
        self.read_attr(ticket, &join_child(dir, name), attr);
    }

    /// Keeps a directory's whole listing read from the server.
    pub fn read_listing(&self, ticket: Ticket, path: &str, entries: &[DirEntry]) {
        let mut state = self.state.lock();
        if state.keeps(ticket) {
            state.make_room(entries.len());
            state.set_listing(path, entries);
        }
    }

    /// Taken before an own change of names or attributes is sent to the server.
    pub fn changing(&self) -> Ticket {
        let mut state = self.state.lock();
        state.changing += 1;
        state.generation += 1;
        Ticket(state.generation)
    }

    /// After the change begun at `ticket`: applies it if it `committed` and ran alone, else
    /// forgets what it touched.
    pub fn changed(&self, ticket: Ticket, change: Change<'_>, committed: bool) {
        let mut state = self.state.lock();
        state.changing -= 1;
        let alone = state.generation == ticket.0 && state.changing == 0;
        state.generation += 1;
        if committed && alone {
            state.apply(change);
        } else {
            state.forget(change);
        }
    }

    /// After an own change of the name `path` that failed (its outcome may be unknown):
    /// forgets the directory and what was at the name.
    pub fn failed(&self, ticket: Ticket, path: &str) {
        let mut state = self.state.lock();
        state.changing -= 1;
        state.generation += 1;
        let _ = ticket; // pairs the call with its `changing`
        state.forget_name(path);
    }

    /// Another daemon's change: forgets what it may have changed.
    pub fn remote(&self, change: &RemoteChange) {
        let mut state = self.state.lock();
        state.generation += 1;
        match change {
            RemoteChange::Name(path) => state.forget_name(path),
            RemoteChange::Content(path) => {
                // A writer names the file by the name it opened it with, which may lead
                // elsewhere now (or nowhere): a name this cache cannot place says nothing of
                // which node changed.
                if state.node(path).is_none() {
                    state.files.clear();
                }
                state.forget_attrs_at(path);
            }
            RemoteChange::FileContent { ino, .. } => {
                state.files.remove(ino);
            }
            RemoteChange::Everything => state.clear(),
        }
    }
}

impl State {
    fn node(&self, path: &str) -> Option<Node> {
        if let Some(attr) = self.dirs.get(path).and_then(|d| d.attr.as_ref()) {
            return Some(Node::of(attr));
        }
        if path.is_empty() {
            return None;
        }
        let (parent, leaf) = split_parent(path);
        self.dirs.get(parent)?.names.get(leaf).copied().flatten()
    }

    /// The attributes of what `path` leads to (or led to) may have changed: forgets them, and
    /// all files' when the node is not known, unless nothing was at the name.
    fn forget_attrs_at(&mut self, path: &str) {
        match self.node(path) {
            Some(node) => {
                self.files.remove(&node.ino);
            }
            None => {
                let (parent, leaf) = split_parent(path);
                let absent = !path.is_empty()
                    && self.dirs.get(parent).is_some_and(|d| d.complete && !d.names.contains_key(leaf));
                if !absent {
                    self.files.clear();
                }
            }
        }
        if let Some(dir) = self.dirs.get_mut(path) {
            dir.attr = None;
        }
    }

    /// The attributes of `node` may have changed. (Only a directory's are kept by path and
    /// must be looked for: a file's write, on the hot path, forgets one entry.)
    fn forget_node(&mut self, node: Node) {
        if node.kind != FileKind::Dir {
            self.files.remove(&node.ino);
            return;
        }
        for dir in self.dirs.values_mut() {
            if dir.attr.as_ref().is_some_and(|a| a.ino == node.ino) {
                dir.attr = None;
            }
        }
    }

    fn keeps(&self, ticket: Ticket) -> bool {
        self.on && self.generation == ticket.0 && self.changing == 0
    }

    fn apply(&mut self, change: Change<'_>) {
        match change {
            Change::Made { path, attr, now } => {
                let is_dir = attr.kind == FileKind::Dir;
                self.touch(split_parent(path).0, now, if is_dir { 1 } else { 0 });
                if is_dir {
                    // Made here a moment ago: empty, and every name it will get is learned.
                    self.drop_tree(path);
                    self.dirs.insert(
                        path.to_string(),
                        Dir { attr: Some(attr.clone()), names: HashMap::new(), complete: true },
                    );
                }
                self.learn(path, attr);
            }
            Change::Taken { path, dir, now } => {
                // A file's link count and change time moved (it may have other names).
                self.forget_attrs_at(path);
                let (parent, leaf) = split_parent(path);
                self.touch(parent, now, if dir { -1 } else { 0 });
                self.remove_entry(parent, leaf);
                if dir {
                    self.drop_tree(path);
                }
            }
            Change::Moved { from, to, now, exchange: false } => match self.node(from) {
                // A file (the common rename: an editor's save, git's lock files) moves along
                // with what is known of it, as the server moved it. Directories (whose trees
                // are known by path) and exchanges are forgotten.
                Some(file) if file.kind != FileKind::Dir => self.move_file(file, (from, to), now),
                _ => self.forget(change),
            },
            Change::Attrs { path, attr: Some(attr) } => self.learn(path, attr),
            Change::NodeAttrs { attr } if attr.kind != FileKind::Dir => self.keep_file_attr(attr),
            change => self.forget(change),
        }
    }

    fn forget(&mut self, change: Change<'_>) {
        match change {
            Change::Made { path, .. } | Change::Taken { path, .. } => self.forget_name(path),
            Change::Attrs { path, .. } => self.forget_attrs_at(path),
            Change::Moved { from, to, .. } => {
                // Both nodes first: forgetting a name forgets its directory's listing.
                self.forget_attrs_at(from);
                self.forget_attrs_at(to);
                self.drop_name(from);
                self.drop_name(to);
            }
            Change::Node(node) => self.forget_node(node),
            Change::NodeAttrs { attr } => self.forget_node(Node::of(attr)),
        }
    }

    /// The file `file` at `from` was renamed to `to` at `now` (replacing whatever was there):
    /// as `rename_at` does, both directories' times and the file's change time become `now`.
    fn move_file(&mut self, file: Node, (from, to): (&str, &str), now: i64) {
        // A replaced node lost a link (and maybe its rows).
        self.forget_attrs_at(to);
        let ((from_dir, from_leaf), (to_dir, to_leaf)) = (split_parent(from), split_parent(to));
        self.remove_entry(from_dir, from_leaf);
        if let Some(d) = self.dirs.get_mut(to_dir) {
            if d.names.insert(to_leaf.to_string(), Some(file)).is_none() {
                self.names += 1;
            }
        }
        self.touch(from_dir, now, 0);
        if to_dir != from_dir {
            self.touch(to_dir, now, 0);
        }
        if let Some(attr) = self.files.get_mut(&file.ino) {
            attr.ctime = ns_to_time(now);
        }
    }

    /// The name `leaf` is gone from the directory at `dir`, if that is known.
    fn remove_entry(&mut self, dir: &str, leaf: &str) {
        if let Some(d) = self.dirs.get_mut(dir) {
            if d.names.remove(leaf).is_some() {
                self.names -= 1;
            }
        }
    }

    /// The directory at `path` changed a name at `now`: as the server functions do, its
    /// modification and change times become `now` and its link count moves by `links`.
    fn touch(&mut self, path: &str, now: i64, links: i32) {
        if let Some(attr) = self.dirs.get_mut(path).and_then(|d| d.attr.as_mut()) {
            attr.mtime = ns_to_time(now);
            attr.ctime = ns_to_time(now);
            attr.nlink = attr.nlink.saturating_add_signed(links);
        }
    }

    /// The node at `path` is `attr`'s: its parent's entry leads to it, and a directory's
    /// attributes are kept.
    fn learn(&mut self, path: &str, attr: &Attr) {
        match attr.kind {
            FileKind::Dir => {
                self.make_room(1);
                self.dirs.entry(path.to_string()).or_default().attr = Some(attr.clone());
            }
            _ => self.keep_file_attr(attr),
        }
        if path.is_empty() {
            return;
        }
        let (parent, leaf) = split_parent(path);
        let dir = self.dirs.entry(parent.to_string()).or_default();
        if dir.names.insert(leaf.to_string(), Some(Node::of(attr))).is_none() {
            self.names += 1;
        }
    }

    /// Keeps the attributes of a node other than a directory.
    fn keep_file_attr(&mut self, attr: &Attr) {
        self.make_room(1);
        self.files.insert(attr.ino, attr.clone());
    }

    /// The directory at `path` holds exactly `entries`; the nodes known of names it still
    /// holds (with the same kind) stay known.
    fn set_listing(&mut self, path: &str, entries: &[DirEntry]) {
        let dir = self.dirs.entry(path.to_string()).or_default();
        let before = dir.names.len();
        let mut names = HashMap::with_capacity(entries.len());
        for e in entries {
            let node = dir.names.get(&e.name).copied().flatten().filter(|n| n.kind == e.kind);
            names.insert(e.name.clone(), node);
        }
        let after = names.len();
        (dir.names, dir.complete) = (names, true);
        self.names = self.names - before + after;
    }

    /// A name came, went or changed at `path`: forgets its directory and what was there.
    fn forget_name(&mut self, path: &str) {
        self.forget_attrs_at(path);
        self.drop_name(path);
    }

    /// Forgets the directory of the name `path` and the tree at it.
    fn drop_name(&mut self, path: &str) {
        self.drop_dir(split_parent(path).0);
        self.drop_tree(path);
    }

    /// Forgets the directory at `path`, attributes and listing.
    fn drop_dir(&mut self, path: &str) {
        if let Some(dir) = self.dirs.remove(path) {
            self.names -= dir.names.len();
        }
    }

    /// Forgets `path` and every directory below it.
    fn drop_tree(&mut self, path: &str) {
        self.drop_dir(path);
        if path.is_empty() {
            return self.clear();
        }
        // Paths below `path` sort from "path/" up to, not including, "path0" ('0' follows '/').
        let below: Vec<String> =
            self.dirs.range(format!("{path}/")..format!("{path}0")).map(|(k, _)| k.clone()).collect();
        for key in below {
            self.drop_dir(&key);
        }
    }

    /// Makes room for `more` names and one more directory: past either bound, forgets all.
    fn make_room(&mut self, more: usize) {
        if self.names + self.files.len() + more > MAX_NAMES || self.dirs.len() >= MAX_DIRS {
            self.clear();
        }
    }

    fn clear(&mut self) {
        self.dirs.clear();
        self.files.clear();
        self.names = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn dir_attr(ino: u64, nlink: u32) -> Attr {
        Attr {
            ino,
            kind: FileKind::Dir,
            perm: 0o755,
            size: 0,
            blocks: 0,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            atime: SystemTime::UNIX_EPOCH,
            mtime: SystemTime::UNIX_EPOCH,
            ctime: SystemTime::UNIX_EPOCH,
            crtime: SystemTime::UNIX_EPOCH,
        }
    }

    fn file_attr(ino: u64) -> Attr {
        Attr { kind: FileKind::File, nlink: 1, ..dir_attr(ino, 1) }
    }

    fn started() -> DirCache {
        let cache = DirCache::default();
        cache.start();
        cache
    }

    fn mkdir(cache: &DirCache, path: &str, ino: u64) {
        let t = cache.changing();
        cache.changed(t, Change::Made { path, attr: &dir_attr(ino, 2), now: 5 }, true);
    }

    #[test]
    fn nothing_is_kept_before_the_listener_runs() {
        let cache = DirCache::default();
        let t = cache.reading();
        cache.read_attr(t, "d", &dir_attr(2, 2));
        assert_eq!(cache.known("d"), Known::Unknown);
        mkdir(&cache, "e", 3);
        assert_eq!(cache.known("e/x"), Known::Unknown);
    }

    #[test]
    fn a_made_directory_is_known_empty_and_learns_its_names() {
        let cache = started();
        mkdir(&cache, "d", 2);
        assert_eq!(cache.known("d/x"), Known::Absent);
        let t = cache.changing();
        cache.changed(t, Change::Made { path: "d/x", attr: &file_attr(3), now: 9 }, true);
        assert_eq!(cache.known("d/x"), Known::Unknown, "a file's attributes are the server's");
        assert_eq!(cache.node("d/x").map(|n| n.ino), Some(3), "its inode is known");
        let Known::Dir(d) = cache.known("d") else { panic!("d is known") };
        assert_eq!((d.mtime, d.ctime, d.nlink), (ns_to_time(9), ns_to_time(9), 2));
        mkdir(&cache, "d/sub", 4);
        let Known::Dir(d) = cache.known("d") else { panic!("d is known") };
        assert_eq!(d.nlink, 3, "a subdirectory's `..` links the parent");
        let t = cache.changing();
        cache.changed(t, Change::Taken { path: "d/sub", dir: true, now: 11 }, true);
        let Known::Dir(d) = cache.known("d") else { panic!("d is known") };
        assert_eq!((d.nlink, d.mtime), (2, ns_to_time(11)));
        assert_eq!(cache.known("d/sub"), Known::Absent);
        assert_eq!(cache.known("d/sub/y"), Known::Unknown);
    }

    #[test]
    fn a_renamed_file_moves_with_what_is_known_of_it() {
        let cache = started();
        mkdir(&cache, "d", 2);
        mkdir(&cache, "e", 3);
        for (path, ino) in [("d/a", 4), ("d/b", 5), ("e/c", 6)] {
            let t = cache.changing();
            cache.changed(t, Change::Made { path, attr: &file_attr(ino), now: 1 }, true);
        }
        // Within a directory, over an existing file.
        let t = cache.changing();
        cache.changed(t, Change::Moved { from: "d/a", to: "d/b", now: 7, exchange: false }, true);
        assert_eq!((cache.known("d/a"), cache.node("d/b").map(|n| n.ino)), (Known::Absent, Some(4)));
        assert_eq!(cache.attr_of(4).map(|a| a.ctime), Some(ns_to_time(7)), "the change time moves");
        assert_eq!(cache.attr_of(5), None, "the replaced file lost a link");
        let Known::Dir(d) = cache.known("d") else { panic!("d is known") };
        assert_eq!((d.mtime, d.ctime, d.nlink), (ns_to_time(7), ns_to_time(7), 2));
        // To another directory, to a new name.
        let t = cache.changing();
        cache.changed(t, Change::Moved { from: "d/b", to: "e/n", now: 8, exchange: false }, true);
        assert_eq!((cache.known("d/b"), cache.node("e/n").map(|n| n.ino)), (Known::Absent, Some(4)));
        for dir in ["d", "e"] {
            let Known::Dir(a) = cache.known(dir) else { panic!("{dir} is known") };
            assert_eq!(a.mtime, ns_to_time(8));
        }
        assert_eq!(cache.node("e/c").map(|n| n.ino), Some(6), "other names stay");
        // A failed rename, and a directory's, are forgotten.
        let t = cache.changing();
        cache.changed(t, Change::Moved { from: "e/n", to: "d/x", now: 9, exchange: false }, false);
        assert_eq!((cache.node("e/n"), cache.known("d/x")), (None, Known::Unknown));
        mkdir(&cache, "e/sub", 10);
        let t = cache.changing();
        cache.changed(t, Change::Moved { from: "e/sub", to: "d/sub", now: 9, exchange: false }, true);
        assert_eq!((cache.known("e"), cache.known("d/sub")), (Known::Unknown, Known::Unknown));
    }

    #[test]
    fn a_read_overtaken_by_a_change_or_a_notification_is_not_kept() {
        let cache = started();
        let t = cache.reading();
        let c = cache.changing();
        cache.read_attr(t, "d", &dir_attr(2, 2));
        cache.changed(c, Change::Attrs { path: "e", attr: None }, true);
        cache.read_attr(t, "d", &dir_attr(2, 2));
        assert_eq!(cache.known("d"), Known::Unknown);
        let t = cache.reading();
        cache.remote(&RemoteChange::Content("zzz".into()));
        cache.read_listing(t, "d", &[]);
        assert_eq!(cache.known("d/x"), Known::Unknown);
        let t = cache.reading();
        cache.read_listing(t, "d", &[DirEntry { name: "a".into(), kind: FileKind::File }]);
        assert_eq!(cache.known("d/x"), Known::Absent);
        assert_eq!(cache.known("d/a"), Known::Unknown);
    }

    #[test]
    fn overlapping_changes_forget_what_they_touched() {
        let cache = started();
        mkdir(&cache, "d", 2);
        let a = cache.changing();
        let b = cache.changing();
        cache.changed(b, Change::Made { path: "d/b", attr: &dir_attr(4, 2), now: 7 }, true);
        cache.changed(a, Change::Made { path: "d/a", attr: &dir_attr(3, 2), now: 6 }, true);
        assert_eq!(cache.known("d"), Known::Unknown);
        assert_eq!(cache.known("d/zz"), Known::Unknown);
        assert_eq!(cache.known("d/b"), Known::Unknown);
    }

    #[test]
    fn notifications_forget_the_directory_and_everything_below() {
        let cache = started();
        mkdir(&cache, "d", 2);
        mkdir(&cache, "d/e", 3);
        mkdir(&cache, "d/e/f", 4);
        mkdir(&cache, "d0", 5);
        cache.remote(&RemoteChange::Name("d/e".into()));
        assert_eq!(cache.known("d"), Known::Unknown);
        assert_eq!(cache.known("d/e/f"), Known::Unknown);
        assert_eq!(cache.known("d/e/f/g"), Known::Unknown);
        assert!(matches!(cache.known("d0"), Known::Dir(_)), "a sibling sorting after stays");
        cache.remote(&RemoteChange::Content("d0".into()));
        assert_eq!(cache.known("d0"), Known::Unknown);
        assert_eq!(cache.known("d0/x"), Known::Absent, "content leaves the names");
        cache.remote(&RemoteChange::Everything);
        assert_eq!(cache.known("d0/x"), Known::Unknown);
    }

    #[test]
    fn the_node_a_name_leads_to_is_learned_and_forgotten_with_the_name() {
        let cache = started();
        let t = cache.reading();
        cache.read_listing(t, "d", &[DirEntry { name: "a".into(), kind: FileKind::File }]);
        assert_eq!(cache.node("d/a"), None, "a listing names no inode");
        let t = cache.reading();
        cache.read_entry_attr(t, ("d", "a"), &file_attr(3));
        assert_eq!(cache.node("d/a"), Some(Node { ino: 3, kind: FileKind::File }));
        // Listed again: still there, still known; a name of another kind now is not.
        let t = cache.reading();
        cache.read_listing(
            t,
            "d",
            &[
                DirEntry { name: "a".into(), kind: FileKind::File },
                DirEntry { name: "b".into(), kind: FileKind::Dir },
            ],
        );
        assert_eq!(cache.node("d/a"), Some(Node { ino: 3, kind: FileKind::File }));
        // A file found by a path walk, in a directory whose listing is not known.
        let t = cache.reading();
        cache.read_attr(t, "e/f", &file_attr(9));
        assert_eq!(cache.node("e/f"), Some(Node { ino: 9, kind: FileKind::File }));
        assert_eq!(cache.known("e/g"), Known::Unknown, "one name known is not the listing");
        // Own changes: a created file is known, an unlinked one is not.
        let t = cache.changing();
        cache.changed(t, Change::Made { path: "d/c", attr: &file_attr(4), now: 1 }, true);
        assert_eq!(cache.node("d/c").map(|n| n.ino), Some(4));
        let t = cache.changing();
        cache.changed(t, Change::Taken { path: "d/a", dir: false, now: 2 }, true);
        assert_eq!((cache.node("d/a"), cache.known("d/a")), (None, Known::Absent));
        let t = cache.changing();
        cache.changed(t, Change::Moved { from: "d/c", to: "e/f", now: 3, exchange: true }, true);
        assert_eq!((cache.node("d/c"), cache.node("e/f")), (None, None), "an exchange is forgotten");
        // Another daemon's change of a name forgets the node it led to.
        let t = cache.reading();
        cache.read_attr(t, "e/h", &file_attr(10));
        cache.remote(&RemoteChange::Content("e/h".into()));
        assert_eq!(cache.node("e/h").map(|n| n.ino), Some(10), "content leaves the inode");
        cache.remote(&RemoteChange::Name("e/h".into()));
        assert_eq!(cache.node("e/h"), None);
        // A read overtaken by a change is not kept.
        let t = cache.reading();
        cache.remote(&RemoteChange::Content("zzz".into()));
        cache.read_attr(t, "e/i", &file_attr(11));
        assert_eq!(cache.node("e/i"), None);
    }

    #[test]
    fn a_files_attributes_are_kept_until_anything_may_change_them() {
        let cache = started();
        mkdir(&cache, "d", 2);
        let made = |path, ino| {
            let t = cache.changing();
            cache.changed(t, Change::Made { path, attr: &file_attr(ino), now: 1 }, true);
        };
        made("d/a", 3);
        assert_eq!(cache.file_attr("d/a").map(|a| a.ino), Some(3));
        assert_eq!(cache.attr_of(3).map(|a| a.ino), Some(3));
        // A write through a handle forgets; the attributes a handle's change answered are kept.
        let t = cache.changing();
        cache.changed(t, Change::Node(Node { ino: 3, kind: FileKind::File }), true);
        assert_eq!(cache.file_attr("d/a"), None);
        let t = cache.changing();
        cache.changed(t, Change::NodeAttrs { attr: &Attr { perm: 0o600, ..file_attr(3) } }, true);
        assert_eq!(cache.file_attr("d/a").map(|a| a.perm), Some(0o600));
        // A second name of the same node: one entry, which the unlink of either name forgets.
        let t = cache.changing();
        cache.changed(
            t,
            Change::Made { path: "d/b", attr: &Attr { nlink: 2, ..file_attr(3) }, now: 2 },
            true,
        );
        assert_eq!(cache.file_attr("d/a").map(|a| a.nlink), Some(2));
        let t = cache.changing();
        cache.changed(t, Change::Taken { path: "d/b", dir: false, now: 3 }, true);
        assert_eq!(cache.attr_of(3), None, "the link count moved");
        // A read by path or by inode is kept; an xattr change by path forgets.
        let t = cache.reading();
        cache.read_attr(t, "d/a", &file_attr(3));
        assert!(cache.file_attr("d/a").is_some());
        let t = cache.changing();
        cache.changed(t, Change::Attrs { path: "d/a", attr: None }, true);
        assert_eq!(cache.file_attr("d/a"), None);
        let t = cache.reading();
        cache.read_node_attr(t, &file_attr(3));
        assert!(cache.file_attr("d/a").is_some());
        // Another daemon's content change of a known name forgets that node alone; of a name
        // this cache cannot place, every file's attributes.
        made("d/c", 4);
        cache.remote(&RemoteChange::Content("d/a".into()));
        assert_eq!((cache.attr_of(3).is_some(), cache.attr_of(4).is_some()), (false, true));
        cache.remote(&RemoteChange::Content("elsewhere/x".into()));
        assert_eq!(cache.attr_of(4), None);
        // A handle's write names its inode: that file's attributes alone go, wherever its
        // old name leads.
        made("d/c", 4);
        made("d/e", 5);
        cache.remote(&RemoteChange::FileContent { ino: 4, path: "d/e".into() });
        assert_eq!((cache.attr_of(4).is_some(), cache.attr_of(5).is_some()), (false, true));
        // A new name in a directory whose listing is known moves no node's link count; a
        // content change at a name known to be absent (a handle's old name) may be any node's.
        made("d/c", 4);
        cache.remote(&RemoteChange::Name("d/new".into()));
        assert!(cache.attr_of(4).is_some());
        mkdir(&cache, "f", 9);
        cache.remote(&RemoteChange::Content("f/gone".into()));
        assert_eq!(cache.attr_of(4), None);
        made("d/c", 4);
        // A rename forgets the replaced file's attributes and no other file's; the moved
        // file's go with it.
        mkdir(&cache, "e", 5);
        for (path, ino) in [("e/c", 6), ("e/y", 7), ("e/z", 8)] {
            made(path, ino);
        }
        let t = cache.changing();
        cache.changed(t, Change::Moved { from: "e/c", to: "e/z", now: 3, exchange: false }, true);
        let kept = |ino| cache.attr_of(ino).is_some();
        assert_eq!((kept(6), kept(7), kept(8)), (true, true, false));
        assert_eq!(cache.file_attr("e/z").map(|a| a.ino), Some(6));
    }

    #[test]
    fn a_failed_change_forgets_and_a_node_change_finds_its_directory() {
        let cache = started();
        mkdir(&cache, "d", 2);
        let t = cache.changing();
        cache.changed(t, Change::Made { path: "d/x", attr: &file_attr(3), now: 1 }, false);
        assert_eq!(cache.known("d/x"), Known::Unknown);
        mkdir(&cache, "e", 7);
        let t = cache.changing();
        cache.changed(t, Change::Node(Node { ino: 7, kind: FileKind::Dir }), true);
        assert_eq!(cache.known("e"), Known::Unknown);
        assert_eq!(cache.known("e/x"), Known::Absent);
    }
}
