//! Virtual paths: absolute, `/`-separated, normalised once at each door.
//!
//! A [`VPath`] never contains `.`, `..`, empty components or NUL, never ends in `/` (except the
//! root itself), and is valid UTF-8 (rules are matched on text). Building one is the only place
//! that checks these properties; everything below the doors relies on them.

use std::fmt;
use std::sync::Arc;

use crate::error::{Errno, FsError, FsResult};

/// A normalised absolute virtual path. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VPath(Arc<str>);

impl VPath {
    pub fn root() -> VPath {
        VPath(Arc::from("/"))
    }

    /// Normalises a path given by a client. Relative paths are taken from `/`; `.` and empty
    /// components are dropped; `..` pops a component, and climbing above `/` is an error rather
    /// than a silent clamp. A name longer than 255 bytes is ENAMETOOLONG, as the kernel says.
    pub fn parse(input: &str) -> FsResult<VPath> {
        if input.contains('\0') {
            return Err(FsError::new(Errno::EINVAL, format!("path contains NUL: {input:?}")));
        }
        let mut parts: Vec<&str> = Vec::new();
        for component in input.split('/') {
            match component {
                "" | "." => {}
                ".." => {
                    if parts.pop().is_none() {
                        return Err(FsError::new(Errno::EINVAL, format!("path climbs above /: {input}")));
                    }
                }
                name if name.len() > 255 => {
                    return Err(FsError::new(Errno::ENAMETOOLONG, "a name is longer than 255 bytes"))
                }
                name => parts.push(name),
            }
        }
        if parts.is_empty() {
            return Ok(VPath::root());
        }
        Ok(VPath(Arc::from(format!("/{}", parts.join("/")))))
    }

    /// Checks one directory-entry name as the kernel hands it to the FUSE door.
    pub fn check_name(name: &[u8]) -> FsResult<&str> {
        let name = std::str::from_utf8(name)
            .map_err(|_| FsError::new(Errno::EINVAL, "file names must be valid UTF-8"))?;
        if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
            return Err(FsError::new(Errno::EINVAL, format!("invalid file name {name:?}")));
        }
        if name.len() > 255 {
            return Err(FsError::errno(Errno::ENAMETOOLONG));
        }
        Ok(name)
    }

    /// The path of the entry `name` inside this directory.
    pub fn join(&self, name: &str) -> VPath {
        debug_assert!(Self::check_name(name.as_bytes()).is_ok());
        self.appended(name)
    }

    /// `self` + `/` + `rest` (no second slash after the root), built without `format!`:
    /// every request that names a child joins once, so it stays a plain copy.
    fn appended(&self, rest: &str) -> VPath {
        let base = if self.is_root() { "" } else { &*self.0 };
        let mut path = String::with_capacity(base.len() + 1 + rest.len());
        path.push_str(base);
        path.push('/');
        path.push_str(rest);
        VPath(Arc::from(path))
    }

    /// Appends a relative path that is already normalised (no `.`/`..`/empty components).
    pub fn join_rel(&self, rel: &str) -> VPath {
        if rel.is_empty() {
            self.clone()
        } else {
            self.appended(rel)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_root(&self) -> bool {
        &*self.0 == "/"
    }

    /// The parent directory; the root is its own parent.
    pub fn parent(&self) -> VPath {
        match self.0.rfind('/') {
            Some(0) | None => VPath::root(),
            Some(i) => VPath(Arc::from(&self.0[..i])),
        }
    }

    /// The last component; empty for the root.
    pub fn name(&self) -> &str {
        match self.0.rfind('/') {
            Some(i) => &self.0[i + 1..],
            None => &self.0,
        }
    }

    /// Whether `self` is `prefix` or lies beneath it, comparing whole components
    /// (`/work` is not a prefix of `/workspace`).
    pub fn starts_with(&self, prefix: &VPath) -> bool {
        self.strip_prefix(prefix).is_some()
    }

    /// The part of `self` below `prefix`, without a leading `/` (empty when equal).
    pub fn strip_prefix(&self, prefix: &VPath) -> Option<&str> {
        if prefix.is_root() {
            return Some(&self.0[1..]);
        }
        let rest = self.0.strip_prefix(&*prefix.0)?;
        if rest.is_empty() {
            Some("")
        } else {
            rest.strip_prefix('/')
        }
    }

    /// The directories above this path, from `/` down to its parent (none above `/`).
    pub fn ancestors(&self) -> impl Iterator<Item = VPath> + '_ {
        let path: &str = if self.is_root() { "" } else { &self.0 };
        path.match_indices('/')
            .map(move |(at, _)| if at == 0 { VPath::root() } else { VPath(path[..at].into()) })
    }

    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/').filter(|c| !c.is_empty())
    }

    pub fn depth(&self) -> usize {
        self.components().count()
    }
}

impl fmt::Display for VPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for VPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ancestors_run_from_the_root_to_the_parent() {
        let of = |p: &str| {
            VPath::parse(p).unwrap().ancestors().map(|a| a.as_str().to_string()).collect::<Vec<_>>()
        };
        assert_eq!(of("/"), Vec::<String>::new());
        assert_eq!(of("/a"), ["/"]);
        assert_eq!(of("/a/bc/d"), ["/", "/a", "/a/bc"]);
    }

    #[test]
    fn parse_normalises() {
        for (input, want) in [
            ("/", "/"),
            ("", "/"),
            (".", "/"),
            ("./", "/"),
            ("a/b", "/a/b"),
            ("/a/./b/", "/a/b"),
            ("//a//b/", "/a/b"),
            ("/a/b/../c", "/a/c"),
            ("/foo..bar", "/foo..bar"),
        ] {
            assert_eq!(VPath::parse(input).unwrap().as_str(), want, "{input}");
        }
    }

    #[test]
    fn parse_refuses_climbing_above_root() {
        for input in ["..", "/..", "/a/../..", "a/../../etc"] {
            assert_eq!(VPath::parse(input).unwrap_err().errno, Errno::EINVAL, "{input}");
        }
    }

    #[test]
    fn prefixes_are_whole_components() {
        let ws = VPath::parse("/workspace").unwrap();
        let work = VPath::parse("/work").unwrap();
        assert!(!ws.starts_with(&work));
        assert_eq!(VPath::parse("/work/a/b").unwrap().strip_prefix(&work), Some("a/b"));
        assert_eq!(work.strip_prefix(&work), Some(""));
        assert_eq!(ws.strip_prefix(&VPath::root()), Some("workspace"));
    }

    #[test]
    fn parent_and_name() {
        let p = VPath::parse("/a/b/c").unwrap();
        assert_eq!(p.parent().as_str(), "/a/b");
        assert_eq!(p.name(), "c");
        assert_eq!(VPath::parse("/a").unwrap().parent().as_str(), "/");
        assert_eq!(VPath::root().name(), "");
        assert_eq!(VPath::root().join("x").join("y").as_str(), "/x/y");
    }

    #[test]
    fn names_are_checked() {
        assert!(VPath::check_name(b"ok.txt").is_ok());
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0b", b"\xff"] {
            assert!(VPath::check_name(bad).is_err());
        }
    }
}
