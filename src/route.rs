//! The router: maps a virtual path to the route (and backend) that serves it.
//!
//! The longest route prefix wins, on whole components. Route mount points, and the
//! directories leading to them, always exist as directories even when the parent route's
//! backend has no such entry, and they cannot be removed or renamed (EBUSY). Operations that
//! would span two routes (rename, link) fail with EXDEV. Every method takes a [`Permit`], so
//! nothing reaches a backend without a decision of the gate.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::backend::{Attr, Backend, Caller, DirEntry, FileKind, OpenFile, SetAttr, StatFs};
use crate::error::{Errno, FsError, FsResult};
use crate::policy::Permit;
use crate::vpath::VPath;

pub struct Route {
    pub prefix: VPath,
    pub backend: Arc<dyn Backend>,
    /// How long the kernel may cache entries and attributes of this route.
    pub ttl: Duration,
    /// Config kind name: "host", "memory", "sqlite".
    pub kind: &'static str,
    /// Served read-only on purpose (`read_only = true`): every write answers EROFS at once.
    pub read_only: bool,
}

pub struct Router {
    /// Longest prefix first, so the first match is the deepest.
    routes: Vec<Route>,
}

impl Router {
    /// `routes` must contain one route for `/` (the default backend).
    pub fn new(mut routes: Vec<Route>) -> Router {
        routes.sort_by_key(|r| std::cmp::Reverse(r.prefix.depth()));
        assert!(routes.last().is_some_and(|r| r.prefix.is_root()), "a route must serve /");
        Router { routes }
    }

    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// The route serving `path` and the path relative to it.
    fn resolve<'p>(&self, path: &'p VPath) -> (&Route, &'p str) {
        for route in &self.routes {
            if let Some(rel) = path.strip_prefix(&route.prefix) {
                return (route, rel);
            }
        }
        unreachable!("the root route matches every path")
    }

    /// A stable index of the route serving `path` (for telling backend nodes apart).
    pub fn route_index(&self, path: &VPath) -> usize {
        let route = self.route_of(path);
        self.routes.iter().position(|r| std::ptr::eq(r, route)).expect("a route of the router")
    }

    pub fn route_of(&self, path: &VPath) -> &Route {
        self.resolve(path).0
    }

    /// A route prefix other than `/`, or a directory on the way to one.
    pub fn is_mount_point(&self, path: &VPath) -> bool {
        !path.is_root() && self.routes.iter().any(|r| !r.prefix.is_root() && r.prefix.starts_with(path))
    }

    /// Names of route mount points, or directories leading to them, directly inside `dir`.
    fn mount_children(&self, dir: &VPath) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for route in &self.routes {
            if route.prefix == *dir {
                continue;
            }
            if let Some(rel) = route.prefix.strip_prefix(dir) {
                let name = rel.split('/').next().unwrap_or(rel).to_string();
                if !name.is_empty() && !names.contains(&name) {
                    names.push(name);
                }
            }
        }
        names
    }

    /// Attributes of a directory that exists only because a route lies beneath it.
    fn synthetic_dir(&self) -> Attr {
        let now = SystemTime::UNIX_EPOCH;
        Attr {
            ino: 0,
            kind: FileKind::Dir,
            perm: 0o755,
            size: 0,
            blocks: 0,
            nlink: 2,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
        }
    }

    pub fn getattr(&self, permit: &Permit) -> FsResult<Attr> {
        let (route, rel) = self.resolve(permit.path());
        self.or_mount_point(permit, route.backend.getattr(rel), |attr| attr)
    }

    pub fn getattr_stored(&self, permit: &Permit) -> FsResult<Attr> {
        let (route, rel) = self.resolve(permit.path());
        self.or_mount_point(permit, route.backend.getattr_stored(rel), |attr| attr)
    }

    pub fn kind_and_ino(&self, permit: &Permit) -> FsResult<(FileKind, u64)> {
        let (route, rel) = self.resolve(permit.path());
        self.or_mount_point(permit, route.backend.kind_and_ino(rel), |attr| (attr.kind, attr.ino))
    }

    /// A route's mount point that its backend does not hold is shown as an empty directory.
    fn or_mount_point<T>(
        &self,
        permit: &Permit,
        found: FsResult<T>,
        from: impl FnOnce(Attr) -> T,
    ) -> FsResult<T> {
        match found {
            Err(e) if e.is(Errno::ENOENT) && self.is_mount_point(permit.path()) => {
                Ok(from(self.synthetic_dir()))
            }
            other => other,
        }
    }

    /// Attributes of several entries of the directory `permit` names, in one backend call
    /// where they share its route (route mount points among them are asked one by one).
    pub fn getattr_entries(&self, permit: &Permit, names: &[&str]) -> Vec<FsResult<Attr>> {
        let dir = permit.path();
        let (route, rel) = self.resolve(dir);
        let mut results: Vec<Option<FsResult<Attr>>> = vec![None; names.len()];
        let mut batch = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let child = dir.join(name);
            if std::ptr::eq(self.route_of(&child), route) && !self.is_mount_point(&child) {
                batch.push(i);
            } else {
                let (child_route, child_rel) = self.resolve(&child);
                results[i] = Some(match child_route.backend.getattr(child_rel) {
                    Err(e) if e.is(Errno::ENOENT) && self.is_mount_point(&child) => Ok(self.synthetic_dir()),
                    other => other,
                });
            }
        }
        let batch_names: Vec<&str> = batch.iter().map(|&i| names[i]).collect();
        for (i, attr) in batch.into_iter().zip(route.backend.getattr_entries(rel, &batch_names)) {
            results[i] = Some(attr);
        }
        results.into_iter().map(|r| r.expect("every name answered")).collect()
    }

    pub fn readdir(&self, permit: &Permit) -> FsResult<Vec<DirEntry>> {
        let path = permit.path();
        let (route, rel) = self.resolve(path);
        let mut entries = match route.backend.readdir(rel) {
            Err(e) if e.is(Errno::ENOENT) && self.is_mount_point(path) => Vec::new(),
            other => other?,
        };
        for name in self.mount_children(path) {
            entries.retain(|e| e.name != name);
            entries.push(DirEntry { name, kind: FileKind::Dir });
        }
        Ok(entries)
    }

    pub fn open(&self, permit: &Permit, flags: i32) -> FsResult<Box<dyn OpenFile>> {
        let (route, rel) = self.resolve(permit.path());
        route.backend.open(rel, flags)
    }

    pub fn create(
        &self,
        permit: &Permit,
        mode: u32,
        flags: i32,
        caller: &Caller,
    ) -> FsResult<(Attr, Box<dyn OpenFile>)> {
        self.refuse_mount_point(permit.path(), Errno::EEXIST)?;
        let (route, rel) = self.resolve(permit.path());
        route.backend.create(rel, mode, flags, caller)
    }

    pub fn mknod(&self, permit: &Permit, mode: u32, rdev: u32, caller: &Caller) -> FsResult<Attr> {
        self.refuse_mount_point(permit.path(), Errno::EEXIST)?;
        let (route, rel) = self.resolve(permit.path());
        route.backend.mknod(rel, mode, rdev, caller)
    }

    pub fn mkdir(&self, permit: &Permit, mode: u32, caller: &Caller) -> FsResult<Attr> {
        self.refuse_mount_point(permit.path(), Errno::EEXIST)?;
        let (route, rel) = self.resolve(permit.path());
        route.backend.mkdir(rel, mode, caller)
    }

    pub fn symlink(&self, permit: &Permit, target: &[u8], caller: &Caller) -> FsResult<Attr> {
        self.refuse_mount_point(permit.path(), Errno::EEXIST)?;
        let (route, rel) = self.resolve(permit.path());
        route.backend.symlink(rel, target, caller)
    }

    pub fn link(&self, existing: &Permit, new_path: &Permit) -> FsResult<Attr> {
        self.refuse_mount_point(new_path.path(), Errno::EEXIST)?;
        let (from_route, from_rel) = self.resolve(existing.path());
        let (to_route, to_rel) = self.resolve(new_path.path());
        if !std::ptr::eq(from_route, to_route) {
            return Err(FsError::new(Errno::EXDEV, "hard links cannot cross routes"));
        }
        from_route.backend.link(from_rel, to_rel)
    }

    pub fn readlink(&self, permit: &Permit) -> FsResult<Vec<u8>> {
        let (route, rel) = self.resolve(permit.path());
        route.backend.readlink(rel)
    }

    pub fn unlink(&self, permit: &Permit) -> FsResult<()> {
        self.refuse_mount_point(permit.path(), Errno::EBUSY)?;
        let (route, rel) = self.resolve(permit.path());
        route.backend.unlink(rel)
    }

    pub fn rmdir(&self, permit: &Permit) -> FsResult<()> {
        self.refuse_mount_point(permit.path(), Errno::EBUSY)?;
        let (route, rel) = self.resolve(permit.path());
        route.backend.rmdir(rel)
    }

    /// Whether the routes allow renaming `from` to `to` at all: not a route mount point
    /// (EBUSY), not across routes (EXDEV). The engine asks before it judges what a directory
    /// rename would carry, so that these answers neither wait for nor depend on that walk.
    pub fn check_rename(&self, from: &Permit, to: &Permit) -> FsResult<()> {
        self.refuse_mount_point(from.path(), Errno::EBUSY)?;
        self.refuse_mount_point(to.path(), Errno::EBUSY)?;
        if !std::ptr::eq(self.resolve(from.path()).0, self.resolve(to.path()).0) {
            return Err(FsError::new(Errno::EXDEV, "rename cannot cross routes"));
        }
        Ok(())
    }

    pub fn rename(&self, from: &Permit, to: &Permit, flags: u32) -> FsResult<()> {
        self.check_rename(from, to)?;
        let (route, from_rel) = self.resolve(from.path());
        let (_, to_rel) = self.resolve(to.path());
        route.backend.rename(from_rel, to_rel, flags)
    }

    pub fn setattr(&self, permit: &Permit, changes: &SetAttr) -> FsResult<Attr> {
        let (route, rel) = self.resolve(permit.path());
        if rel.is_empty() && !route.prefix.is_root() && changes.size.is_some() {
            return Err(FsError::errno(Errno::EISDIR));
        }
        route.backend.setattr(rel, changes)
    }

    /// [`Backend::commit_pending`] of every route.
    pub fn commit_pending(&self) -> FsResult<()> {
        self.routes.iter().try_for_each(|route| route.backend.commit_pending())
    }

    /// [`Backend::fsyncdirs`] of each route that serves some of `dirs`.
    pub fn fsyncdirs(&self, dirs: &[VPath]) -> FsResult<()> {
        self.routes.iter().try_for_each(|route| {
            let rels: Vec<&str> = dirs
                .iter()
                .map(|dir| self.resolve(dir))
                .filter(|(served, _)| std::ptr::eq(*served, route))
                .map(|(_, rel)| rel)
                .collect();
            match rels.is_empty() {
                true => Ok(()),
                false => route.backend.fsyncdirs(&rels),
            }
        })
    }

    pub fn fsyncdir(&self, path: &VPath) -> FsResult<()> {
        let (route, rel) = self.resolve(path);
        route.backend.fsyncdir(rel)
    }

    pub fn statfs(&self, path: &VPath) -> FsResult<StatFs> {
        let (route, rel) = self.resolve(path);
        route.backend.statfs(rel)
    }

    pub fn getxattr(&self, permit: &Permit, name: &str) -> FsResult<Vec<u8>> {
        let (route, rel) = self.resolve(permit.path());
        route.backend.getxattr(rel, name)
    }

    pub fn listxattr(&self, permit: &Permit) -> FsResult<Vec<u8>> {
        let (route, rel) = self.resolve(permit.path());
        route.backend.listxattr(rel)
    }

    pub fn setxattr(&self, permit: &Permit, name: &str, value: &[u8], flags: i32) -> FsResult<()> {
        let (route, rel) = self.resolve(permit.path());
        route.backend.setxattr(rel, name, value, flags)
    }

    pub fn removexattr(&self, permit: &Permit, name: &str) -> FsResult<()> {
        let (route, rel) = self.resolve(permit.path());
        route.backend.removexattr(rel, name)
    }

    /// Every entry beneath a directory (relative to it, with its kind), straight from the
    /// backend: the engine uses it to judge what a directory rename would carry along.
    /// Stops with EBUSY past `limit` entries rather than walking forever.
    pub fn walk(&self, permit: &Permit, limit: usize) -> FsResult<Vec<(String, FileKind)>> {
        let (route, rel) = self.resolve(permit.path());
        let mut out = Vec::new();
        let mut stack = vec![rel.to_string()];
        while let Some(dir) = stack.pop() {
            for entry in route.backend.readdir(&dir)? {
                let child = if dir.is_empty() { entry.name.clone() } else { format!("{dir}/{}", entry.name) };
                let below = child[rel.len()..].trim_start_matches('/').to_string();
                if entry.kind == FileKind::Dir {
                    stack.push(child);
                }
                out.push((below, entry.kind));
                if out.len() > limit {
                    return Err(FsError::new(Errno::EBUSY, "directory too large to judge a rename"));
                }
            }
        }
        Ok(out)
    }

    fn refuse_mount_point(&self, path: &VPath, errno: Errno) -> FsResult<()> {
        if self.is_mount_point(path) {
            return Err(FsError::new(errno, format!("{path} is a route mount point")));
        }
        Ok(())
    }
}
