//! What `glob` and `grep` share: the search-root pre-check, a parallel walk of the virtual tree
//! through the engine, and glob's busy refusal.
//!
//! The walk reads directories with the engine's `readdir` (which already leaves out entries the
//! rules hide) and decides each candidate with the gate before anything is opened, so entries a
//! rule denies are skipped silently instead of producing a refusal in the audit log per file.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use super::common;
use super::pattern::{IncludeGlob, State};
use super::{ErrorCode, ToolEnv, ToolOutput};
use crate::backend::FileKind;
use crate::control::vfs::{ToolFs, ToolPath};
use crate::error::Errno;
use crate::policy::{Mode, Op};
use crate::vpath::VPath;

/// How many threads a search uses: enough to overlap storage latency, few enough not to
/// crowd out the FUSE door.
pub fn worker_count() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 8)
}

/// What a search starts from, after the pre-check.
pub enum Root {
    /// Nothing there (or nothing visible): the search finds nothing.
    Missing,
    Dir(VPath),
    File(VPath),
}

/// The pre-check of `glob`/`grep` on their search root (doc/tools.md steps 1-3 with `path` judged
/// as a directory, deviation 11), then where it leads through symlinks (deviation 7). `hint` is
/// appended to a plain denial (glob's note for a pathless call). A root written as a directory
/// (`f.txt/`) that is not one is an error, as it is for `ls`.
pub fn precheck(env: &ToolEnv, named: &ToolPath, hint: &str) -> Result<Root, ToolOutput> {
    let path = &named.path;
    if let Err(denied) = common::precheck(env, Op::Read, path, true) {
        if hint.is_empty() {
            return Err(denied);
        }
        return Err(ToolOutput::error(
            ErrorCode::PermissionDenied,
            format!("{}{hint}", denied.joined_text()),
        ));
    }
    let located = common::locate(env, Op::Read, path, true, false)?;
    common::check_target(env, Op::Read, &located, true)?;
    common::require_dir(named, &located, |written, _| format!("Error: Path '{written}': not_a_directory"))?;
    Ok(match located.kind() {
        Some(FileKind::Dir) => Root::Dir(located.real),
        Some(FileKind::File) => Root::File(located.real),
        _ => Root::Missing,
    })
}

/// A file the walk found.
#[derive(Clone, Debug)]
pub struct Found {
    /// Where it was found (what results show).
    pub path: VPath,
    /// What to open: the same path, or a symlink's target.
    pub target: VPath,
    /// The gate's read verdict on it (deny already filtered out).
    pub mode: Mode,
}

/// What a walk produced.
#[derive(Default)]
pub struct Walked {
    /// Sorted by path.
    pub files: Vec<Found>,
    /// Some directory could not be read (an I/O error, not a rule).
    pub unreadable: bool,
    /// The walk stopped at its time budget.
    pub out_of_time: bool,
}

struct Queue {
    dirs: Vec<(VPath, State)>,
    /// Workers holding a directory they have not finished.
    busy: usize,
}

/// Every regular file beneath `root` (symlinks to regular files included, judged on both
/// paths) that `glob` accepts, in parallel, stopping at `stop_at`. Directories no pattern can
/// reach are not read. Files the rules deny are left out (result filtering, doc/tools.md).
pub fn walk(fs: &ToolFs, root: &VPath, glob: Option<&IncludeGlob>, stop_at: Instant) -> Walked {
    let accept_all = super::pattern::compile("**").expect("`**` compiles");
    let glob = glob.unwrap_or(&accept_all);
    // A name pattern matches at any depth, so name patterns match `**`'s files and more; with
    // no pattern every file is wanted, including those under dot-directories.
    let everything = std::ptr::eq(glob, &accept_all);
    let queue = Mutex::new(Queue { dirs: vec![(root.clone(), glob.start())], busy: 0 });
    let wake = Condvar::new();
    let unreadable = AtomicBool::new(false);
    let out_of_time = AtomicBool::new(false);
    let results: Mutex<Vec<Found>> = Mutex::new(Vec::new());
    // Entries hidden by a rule never reach the walk, so unless some read rule denies without
    // hiding or asks for approval, every entry it sees is allowed and need not be judged again.
    let judge = fs.engine.gate.rules().may_refuse_in_sight(Op::Read);
    std::thread::scope(|scope| {
        for _ in 0..worker_count() {
            scope.spawn(|| {
                let mut found = Vec::new();
                let mut subdirs = Vec::new();
                while let Some((dir, state)) = next_dir(&queue, &wake) {
                    if Instant::now() >= stop_at {
                        out_of_time.store(true, Ordering::Relaxed);
                    }
                    if !out_of_time.load(Ordering::Relaxed) {
                        let ok =
                            read_dir(fs, glob, (everything, judge), &dir, &state, &mut found, &mut subdirs);
                        if !ok {
                            unreadable.store(true, Ordering::Relaxed);
                        }
                    }
                    let mut q = queue.lock();
                    q.dirs.append(&mut subdirs);
                    q.busy -= 1;
                    if !q.dirs.is_empty() || q.busy == 0 {
                        wake.notify_all();
                    }
                }
                results.lock().append(&mut found);
            });
        }
    });
    let mut files = results.into_inner();
    files.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    Walked { files, unreadable: unreadable.into_inner(), out_of_time: out_of_time.into_inner() }
}

/// The next directory to read, or `None` once the queue is empty and nobody can add to it.
fn next_dir(queue: &Mutex<Queue>, wake: &Condvar) -> Option<(VPath, State)> {
    let mut q = queue.lock();
    loop {
        if let Some(item) = q.dirs.pop() {
            q.busy += 1;
            return Some(item);
        }
        if q.busy == 0 {
            return None;
        }
        wake.wait(&mut q);
    }
}

/// Reads one directory; false when it could not be read for a reason other than a rule or a
/// concurrent removal. `everything`: no pattern filters the files; `judge`: files need the
/// gate's verdict (see [`walk`]).
fn read_dir(
    fs: &ToolFs,
    glob: &IncludeGlob,
    (everything, judge): (bool, bool),
    dir: &VPath,
    state: &State,
    found: &mut Vec<Found>,
    subdirs: &mut Vec<(VPath, State)>,
) -> bool {
    // Asking the gate first keeps refused directories out of the audit log: a search is not
    // an attempt to read each of them.
    if fs.mode(Op::Read, dir, true) != Mode::Allow {
        return true;
    }
    let entries = match fs.engine.readdir(&fs.ctx, dir) {
        Ok(entries) => entries,
        Err(e) => return e.is(Errno::ENOENT) || e.is(Errno::ENOTDIR) || e.denied_by.is_some(),
    };
    for entry in entries {
        let name = entry.name.as_str();
        match entry.kind {
            FileKind::Dir => {
                let next = if everything { Some(state.clone()) } else { glob.enter(state, name) };
                if let Some(next) = next {
                    subdirs.push((dir.join(name), next));
                }
            }
            FileKind::File if everything || glob.matches_file(state, name) => {
                let path = dir.join(name);
                let mode = if judge { fs.mode(Op::Read, &path, false) } else { Mode::Allow };
                if mode != Mode::Deny {
                    found.push(Found { target: path.clone(), path, mode });
                }
            }
            FileKind::Symlink if everything || glob.matches_file(state, name) => {
                let path = dir.join(name);
                if let Some(found_link) = follow_link(fs, path) {
                    found.push(found_link);
                }
            }
            _ => {}
        }
    }
    true
}

/// A symlink counts as the regular file it leads to inside the tree; it is dropped when either
/// path is denied or it cannot be resolved (as Deep Agents drops unresolvable results).
fn follow_link(fs: &ToolFs, path: VPath) -> Option<Found> {
    let link_mode = fs.mode(Op::Read, &path, false);
    if link_mode == Mode::Deny {
        return None;
    }
    let resolved = fs.resolve(&path, true).ok()?;
    if resolved.attr?.kind != FileKind::File {
        return None;
    }
    let target_mode = fs.mode(Op::Read, &resolved.path, false);
    if target_mode == Mode::Deny {
        return None;
    }
    let mode = if link_mode == Mode::Allow { target_mode } else { link_mode };
    Some(Found { path, target: resolved.path, mode })
}

/// A counting semaphore that refuses instead of waiting (glob's busy refusal).
pub struct Slots {
    used: AtomicUsize,
    max: usize,
}

/// One slot held; released on drop.
pub struct Slot<'s>(&'s Slots);

impl Slots {
    pub const fn new(max: usize) -> Slots {
        Slots { used: AtomicUsize::new(0), max }
    }

    pub fn try_acquire(&self) -> Option<Slot<'_>> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.max).then_some(n + 1))
            .ok()
            .map(|_| Slot(self))
    }

    pub fn in_use(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.used.fetch_sub(1, Ordering::AcqRel);
    }
}
