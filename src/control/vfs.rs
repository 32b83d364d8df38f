//! The tool door's view of the tree: Deep Agents' path validation, symlinks resolved inside
//! the virtual tree, and whole-file operations (read, atomic write, recursive delete, walk),
//! all through the engine and so through the gate.

use crate::backend::{Attr, FileKind, SetAttr};
use crate::engine::{Ctx, Door, Engine};
use crate::error::{Errno, FsError, FsResult};
use crate::policy::{Mode, Op, Verdict};
use crate::vpath::VPath;

/// How many symlinks one resolution may follow before it is a loop.
const MAX_SYMLINKS: usize = 40;

/// A tool's path argument once validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolPath {
    pub path: VPath,
    /// The argument ends in `/` (or `/.`): as in a syscall, it names a directory, and a file
    /// there is an error (ENOTDIR) rather than the file the path names without the slash.
    pub must_be_dir: bool,
}

/// Validates a tool's path argument the way Deep Agents' `validate_path` does, except that
/// `""`, `"."` and `"./"` mean `/`, and that a trailing `/` is kept as [`ToolPath::must_be_dir`]
/// (normalising drops it from the path). The error is the text after `Error: `.
pub fn validate_path(input: &str) -> Result<ToolPath, String> {
    let slashed = input.replace('\\', "/");
    if slashed.split('/').any(|c| c == "..") || input.starts_with('~') {
        return Err(format!("Path traversal not allowed: {input}"));
    }
    let bytes = input.as_bytes();
    if bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':' {
        return Err(format!(
            "Windows absolute paths are not supported: {input}. Please use virtual paths starting with / (e.g., /workspace/file.txt)"
        ));
    }
    let path = VPath::parse(&slashed).map_err(|e| match e.is(crate::error::Errno::ENAMETOOLONG) {
        true => format!("File name too long (a name is longer than 255 bytes): {input}"),
        false => format!("Invalid path: {input}"),
    })?;
    let must_be_dir = matches!(slashed.rsplit('/').next(), Some("" | "."));
    Ok(ToolPath { path, must_be_dir })
}

/// The tool door's file system: one caller (a control session) on one engine.
pub struct ToolFs<'e> {
    pub engine: &'e Engine,
    pub ctx: Ctx,
    /// The tool call being served (name and arguments), for the audit log.
    pub tool: String,
    pub arguments: String,
    /// The directories whose entries this call changed, made durable before it reports
    /// success ([`ToolFs::make_durable`]).
    changed: parking_lot::Mutex<Vec<VPath>>,
}

/// A path after symlinks were followed: where it leads, and whether it went through a link.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    pub path: VPath,
    /// The node there, or `None` when the last component does not exist.
    pub attr: Option<Attr>,
    pub through_symlink: bool,
}

impl<'e> ToolFs<'e> {
    pub fn new(engine: &'e Engine) -> ToolFs<'e> {
        ToolFs {
            engine,
            ctx: Ctx::new(Door::Tool, crate::backend::Caller::daemon()),
            tool: String::new(),
            arguments: String::new(),
            changed: parking_lot::Mutex::new(Vec::new()),
        }
    }

    /// Notes that the entries of `dir` changed.
    fn changed(&self, dir: VPath) {
        let mut changed = self.changed.lock();
        // A tree's removal changes one directory many times in a row.
        if changed.last() != Some(&dir) {
            changed.push(dir);
        }
    }

    /// Makes what this call changed survive a crash, of the daemon, of the machine or of a
    /// database server, before the call reports success: held changes go to their stores,
    /// then every directory whose entries changed is synced (`fsync` of the directory on the
    /// host; the store's own sync on the database routes, once for all of them). A directory
    /// removed since is skipped: its removal is in its parent, which is synced too.
    pub fn make_durable(&self) -> FsResult<()> {
        self.engine.commit_pending()?;
        let mut dirs = std::mem::take(&mut *self.changed.lock());
        dirs.sort();
        dirs.dedup();
        self.engine.fsyncdirs(&dirs)
    }

    /// Records a refusal of the tool's own permission pre-check in the audit log.
    pub fn audit_refusal(&self, op: Op, path: &VPath, verdict: Verdict) {
        let refusal = crate::policy::Refusal { op, path: path.clone(), verdict };
        let command = format!("{} {}", self.tool, self.arguments);
        self.engine.audit_refusal(&self.ctx, &self.tool, command.trim(), refusal);
    }

    /// The gate's verdict for `op` on `path`, without touching storage (the pre-check).
    pub fn decide(&self, op: Op, path: &VPath, is_dir: bool) -> Verdict {
        self.engine.gate.decide(op, path, is_dir)
    }

    /// What the rules let this call do on `path`: an interrupt that its approval (or its
    /// user's session grant) covers counts as allowed, since the engine lets it pass.
    pub fn mode(&self, op: Op, path: &VPath, is_dir: bool) -> Mode {
        let mode = self.decide(op, path, is_dir).mode;
        let approvals = &self.engine.gate.approvals;
        if mode == Mode::Interrupt && approvals.covers(self.ctx.approval, op, path, self.ctx.asker_uid()) {
            return Mode::Allow;
        }
        mode
    }

    /// Follows `path` component by component through the engine: every ancestor must be
    /// visible (a hidden one ends the walk with ENOENT), symlinks are followed inside the
    /// virtual tree (an absolute target is a virtual path; a relative one may not climb above
    /// `/`), and the last component is followed too when `follow_last`.
    pub fn resolve(&self, path: &VPath, follow_last: bool) -> FsResult<Resolved> {
        let mut pending: Vec<String> = path.components().map(str::to_string).collect();
        pending.reverse();
        let mut current = VPath::root();
        let mut attr = None;
        let mut through_symlink = false;
        let mut links = 0;
        while let Some(name) = pending.pop() {
            let next = current.join(&name);
            let found = match self.engine.lookup(&self.ctx, &next) {
                Ok(a) => a,
                Err(e) if e.is(Errno::ENOENT) && pending.is_empty() => {
                    return Ok(Resolved { path: next, attr: None, through_symlink });
                }
                Err(e) => return Err(e),
            };
            if found.kind == FileKind::Symlink && (follow_last || !pending.is_empty()) {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(FsError::new(Errno::ELOOP, format!("too many symlinks resolving {path}")));
                }
                let target = self.engine.readlink(&self.ctx, &next)?;
                let target = String::from_utf8(target)
                    .map_err(|_| FsError::new(Errno::EINVAL, format!("{next}: link target is not UTF-8")))?;
                let joined = if target.starts_with('/') { target } else { format!("{current}/{target}") };
                let base = VPath::parse(&joined)
                    .map_err(|_| FsError::new(Errno::EXDEV, format!("{next} points outside the tree")))?;
                for component in base.components().collect::<Vec<_>>().into_iter().rev() {
                    pending.push(component.to_string());
                }
                current = VPath::root();
                through_symlink = true;
                continue;
            }
            current = next;
            attr = Some(found);
        }
        // `/` is judged only when the walk ends there: with `[allow read /pub/**, deny read /**]`
        // the path `/pub/a` must stay reachable, each component being judged by its own lookup.
        if current.is_root() {
            attr = Some(self.engine.getattr(&self.ctx, &current)?);
        }
        Ok(Resolved { path: current, attr, through_symlink })
    }

    /// The attributes of `path` (resolved already) as the store holds them at this moment.
    pub fn stat_stored(&self, path: &VPath) -> FsResult<Attr> {
        self.engine.getattr_stored(&self.ctx, path)
    }

    /// A directory's visible entries with their attributes, sorted by name, as the mount
    /// lists them: an entry a rule denies without hiding it is listed with placeholder
    /// attributes; entries that vanish meanwhile are left out.
    pub fn list(&self, dir: &VPath) -> FsResult<Vec<(String, Attr)>> {
        let mut entries: Vec<(String, Attr)> = self
            .engine
            .readdir(&self.ctx, dir)?
            .into_iter()
            .filter_map(|e| match self.engine.lookup(&self.ctx, &dir.join(&e.name)) {
                Ok(attr) => Some((e.name, attr)),
                Err(err) if err.is(Errno::EACCES) => {
                    let attr = Attr::placeholder(e.kind);
                    Some((e.name, attr))
                }
                Err(_) => None,
            })
            .collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(entries)
    }

    /// The whole content of a regular file of at most `max` bytes. One that is larger, or
    /// grows past `max` while it is read, is refused (EFBIG), and so is anything but a regular
    /// file (EINVAL): the caller looked at the node first, but another process may have put a
    /// FIFO or a growing file there since, and neither may hold the call's thread or the
    /// daemon's memory without end.
    pub fn read(&self, path: &VPath, max: u64) -> FsResult<Vec<u8>> {
        // O_NONBLOCK: a FIFO opens at once (with no writer, a read finds its end).
        let handle = self.engine.open(&self.ctx, path, libc::O_RDONLY | libc::O_NONBLOCK)?;
        if handle.file.kind_and_ino()?.0 != FileKind::File {
            return Err(FsError::new(Errno::EINVAL, format!("{path} is not a regular file")));
        }
        let mut data = Vec::new();
        loop {
            let chunk = self.engine.read(&handle, data.len() as u64, 1 << 20)?;
            if chunk.is_empty() {
                break;
            }
            if (data.len() + chunk.len()) as u64 > max {
                return Err(FsError::new(Errno::EFBIG, format!("{path} is larger than {max} bytes")));
            }
            data.extend_from_slice(&chunk);
        }
        Ok(data)
    }

    /// Replaces (or creates) `path` with `data` atomically ([`Engine::write_atomic`]). Missing
    /// parent directories are created. A replaced file keeps its owner; a new one belongs to
    /// the owner of its directory, as if that user had written it (the daemon usually runs as
    /// root, and a checkout's files should stay its owner's). Returns the new file's
    /// attributes.
    pub fn write_atomic(&self, path: &VPath, data: &[u8], mode: u32) -> FsResult<Attr> {
        self.make_parents(&path.parent())?;
        // A write by anyone but root clears the set-user-ID bit, and the set-group-ID bit of a
        // group-executable file, as the kernel does for that user's `write` at the mount.
        let mode = match self.ctx.principal {
            Some(p) if p.uid != 0 => mode & !(0o4000 | if mode & 0o010 != 0 { 0o2000 } else { 0 }),
            _ => mode,
        };
        let owner = match self.engine.lookup(&self.ctx, path) {
            Ok(existing) => Some((existing.uid, existing.gid)),
            Err(_) => self.engine.lookup(&self.ctx, &path.parent()).ok().map(|dir| self.new_owner(&dir)),
        };
        let written = self.engine.write_atomic(&self.ctx, path, data, mode, owner)?;
        self.changed(path.parent());
        Ok(written)
    }

    /// Who owns a node this call makes in the directory `dir`: the peer, when it is not root
    /// (as its own syscall at the mount would make it; the group is the directory's under a
    /// set-group-ID directory); for root, the directory's owner (a checkout's files stay its
    /// owner's, although the daemon writes them).
    fn new_owner(&self, dir: &Attr) -> (u32, u32) {
        match self.ctx.principal {
            Some(p) if p.uid != 0 => (p.uid, if dir.perm & 0o2000 != 0 { dir.gid } else { p.gid }),
            _ => (dir.uid, dir.gid),
        }
    }

    /// Makes `dir` and its missing ancestors, from the nearest one that exists down (a loop,
    /// not recursion: a path may have two thousand components).
    fn make_parents(&self, dir: &VPath) -> FsResult<()> {
        let mut missing = Vec::new();
        let mut at = dir.clone();
        loop {
            match self.engine.lookup(&self.ctx, &at) {
                Ok(a) if a.kind == FileKind::Dir => break,
                Ok(_) => return Err(FsError::new(Errno::ENOTDIR, format!("{at} is not a directory"))),
                Err(e) if e.is(Errno::ENOENT) && !at.is_root() => {
                    let parent = at.parent();
                    missing.push(at);
                    at = parent;
                }
                Err(e) => return Err(e),
            }
        }
        for dir in missing.iter().rev() {
            self.make_dir(dir)?;
        }
        Ok(())
    }

    /// Makes the directory `dir`, whose parent exists, owned as [`ToolFs::new_owner`] says;
    /// one made meanwhile by another caller is as good.
    fn make_dir(&self, dir: &VPath) -> FsResult<()> {
        let made = match self.engine.mkdir(&self.ctx, dir, 0o755) {
            Err(e) if e.is(Errno::EEXIST) => return Ok(()),
            other => other?,
        };
        self.changed(dir.parent());
        // Like a new file, a new directory belongs to whom `new_owner` says.
        match self.engine.lookup(&self.ctx, &dir.parent()).map(|p| self.new_owner(&p)) {
            Ok((uid, gid)) if (uid, gid) != (made.uid, made.gid) => {
                let owner = SetAttr { uid: Some(uid), gid: Some(gid), ..SetAttr::default() };
                // The daemon's own doing, not the peer's: its permissions are not asked.
                let daemon = Ctx { principal: None, ..self.ctx };
                match self.engine.setattr(&daemon, dir, &owner, None) {
                    Err(e) if !e.is(Errno::EPERM) => Err(e),
                    _ => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }

    /// Removes `path` and everything beneath it, each step through the gate, while `wanted()`
    /// says the caller still waits (a tree of a million files whose client went away is not
    /// removed to its end unasked: EINTR then, with what is left still there). Depth first on
    /// a stack of its own, not by recursion: an agent can make a tree thousands of levels deep
    /// (no store but the host's bounds the depth), which would overflow the thread's stack.
    pub fn remove_tree(&self, path: &VPath, wanted: &dyn Fn() -> bool) -> FsResult<()> {
        // Each entry, and whether its directory has been emptied (it is removed then).
        let mut stack = vec![(path.clone(), false)];
        while let Some((at, emptied)) = stack.pop() {
            if !wanted() {
                return Err(FsError::new(Errno::EINTR, "the client went away; the rest was left"));
            }
            // Whether the step removed `at` (a directory's first step only lists it).
            let step = if emptied {
                self.engine.rmdir(&self.ctx, &at).map(|()| true)
            } else {
                self.engine.lookup(&self.ctx, &at).and_then(|attr| match attr.kind {
                    FileKind::Dir => self.engine.readdir(&self.ctx, &at).map(|entries| {
                        stack.push((at.clone(), true));
                        stack.extend(entries.into_iter().rev().map(|e| (at.join(&e.name), false)));
                        false
                    }),
                    _ => self.engine.unlink(&self.ctx, &at).map(|()| true),
                })
            };
            match step {
                Ok(true) => self.changed(at.parent()),
                Ok(false) => {}
                // Removed meanwhile by another caller: as good as removed here.
                Err(e) if e.is(Errno::ENOENT) && at != *path => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_follows_deep_agents() {
        let path = |input: &str| validate_path(input).unwrap().path;
        assert_eq!(path("a/b").as_str(), "/a/b");
        assert_eq!(path("").as_str(), "/");
        assert_eq!(path("./").as_str(), "/");
        assert_eq!(path("\\a\\b").as_str(), "/a/b");
        assert_eq!(path("/foo..bar").as_str(), "/foo..bar");
        assert_eq!(validate_path("/a/../b").unwrap_err(), "Path traversal not allowed: /a/../b");
        assert_eq!(validate_path("~/x").unwrap_err(), "Path traversal not allowed: ~/x");
        let long = format!("/w/{}", "n".repeat(256));
        assert_eq!(
            validate_path(&long).unwrap_err(),
            format!("File name too long (a name is longer than 255 bytes): {long}")
        );
        assert!(validate_path(&format!("/w/{}", "n".repeat(255))).is_ok());
        assert!(validate_path("C:\\x")
            .unwrap_err()
            .starts_with("Windows absolute paths are not supported: C:\\x."));
    }

    #[test]
    fn a_trailing_slash_names_a_directory() {
        for (input, want, dir) in [
            ("/a/f.txt/", "/a/f.txt", true),
            ("/a/f.txt//", "/a/f.txt", true),
            ("/a/f.txt/.", "/a/f.txt", true),
            ("a\\f.txt\\", "/a/f.txt", true),
            ("/a/f.txt", "/a/f.txt", false),
            ("/a/./f.txt", "/a/f.txt", false),
            ("/", "/", true),
        ] {
            let v = validate_path(input).unwrap();
            assert_eq!((v.path.as_str(), v.must_be_dir), (want, dir), "{input}");
        }
    }
}
