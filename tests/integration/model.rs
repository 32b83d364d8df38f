//! Random sequences of file operations, through the mount and on a plain directory, must agree
//! call by call (same result, same errno) and leave the same tree. Descriptors stay open across
//! renames and unlinks, and the tool API's writes, edits and deletes are mixed in, so a stale
//! kernel cache or a door that misses the other's change shows as a difference. On the host
//! route some calls are made directly in the host directory, as by another program; the test
//! then waits until the mount shows their effect (the host watch is asynchronous) and goes on.
//!
//! `MODEL_CASES` (default 2,000) sets the sequences per route and `MODEL_SEED` picks other ones;
//! a failure prints the shrunk sequence.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use agentvfs::control::client::Client;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use serde_json::{json, Value};

use crate::harness::{call_tool, Fixture, ROUTES};

/// Every path an operation may name, relative to the work directory.
const NAMES: [&str; 9] = ["a", "b", "d", "d/a", "d/b", "d/e", "d/e/a", "e", "e/a"];
/// Descriptors an operation may open, use and close.
const SLOTS: usize = 2;

#[derive(Clone, Debug)]
enum Op {
    Write {
        path: usize,
        offset: u64,
        len: usize,
        byte: u8,
    },
    Append {
        path: usize,
        len: usize,
        byte: u8,
    },
    Truncate {
        path: usize,
        size: u64,
    },
    Read {
        path: usize,
    },
    Stat {
        path: usize,
    },
    List {
        path: usize,
    },
    Mkdir {
        path: usize,
    },
    Rmdir {
        path: usize,
    },
    Unlink {
        path: usize,
    },
    Rename {
        from: usize,
        to: usize,
    },
    Link {
        from: usize,
        to: usize,
    },
    Symlink {
        target: usize,
        at: usize,
    },
    Chmod {
        path: usize,
        mode: u32,
    },
    Open {
        slot: usize,
        path: usize,
        create: bool,
    },
    PWrite {
        slot: usize,
        offset: u64,
        len: usize,
        byte: u8,
    },
    PRead {
        slot: usize,
        offset: u64,
        len: usize,
    },
    FTruncate {
        slot: usize,
        size: u64,
    },
    FStat {
        slot: usize,
    },
    Close {
        slot: usize,
    },
    ToolWrite {
        path: usize,
        len: usize,
        byte: u8,
    },
    ToolEdit {
        path: usize,
        old: u8,
        new: u8,
    },
    ToolDelete {
        path: usize,
    },
    /// A new file written beside the name and renamed over it, as editors save.
    Replace {
        path: usize,
        len: usize,
        byte: u8,
    },
    /// A change made by another program directly in the host directory behind the host
    /// route (skipped on the other routes).
    OnHost(Box<Op>),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => mount_op(),
        1 => host_op().prop_map(|op| Op::OnHost(Box::new(op))),
    ]
}

/// What another program may do in the host directory: calls by name only.
fn host_op() -> impl Strategy<Value = Op> {
    let path = 0..NAMES.len();
    let byte = b'a'..=b'f';
    prop_oneof![
        2 => (path.clone(), 0..12_000u64, 0..6_000usize, byte.clone())
            .prop_map(|(path, offset, len, byte)| Op::Write { path, offset, len, byte }),
        1 => (path.clone(), 0..15_000u64).prop_map(|(path, size)| Op::Truncate { path, size }),
        1 => path.clone().prop_map(|path| Op::Mkdir { path }),
        1 => path.clone().prop_map(|path| Op::Rmdir { path }),
        1 => path.clone().prop_map(|path| Op::Unlink { path }),
        2 => (path.clone(), path.clone()).prop_map(|(from, to)| Op::Rename { from, to }),
        1 => (path.clone(), path.clone()).prop_map(|(from, to)| Op::Link { from, to }),
        1 => (path.clone(), 0..3_000usize, byte.clone()).prop_map(|(path, len, byte)| Op::Append { path, len, byte }),
        1 => (path.clone(), 0..0o1000u32).prop_map(|(path, mode)| Op::Chmod { path, mode }),
        1 => (path.clone(), path.clone()).prop_map(|(target, at)| Op::Symlink { target, at }),
        2 => (path, 0..4_000usize, byte).prop_map(|(path, len, byte)| Op::Replace { path, len, byte }),
    ]
}

/// What a program does through the mount, and the tool calls.
fn mount_op() -> impl Strategy<Value = Op> {
    let path = 0..NAMES.len();
    let slot = 0..SLOTS;
    // Letters only, so the tool API sees text; holes read as NUL, which is text too.
    let byte = b'a'..=b'f';
    prop_oneof![
        4 => (path.clone(), 0..12_000u64, 0..6_000usize, byte.clone())
            .prop_map(|(path, offset, len, byte)| Op::Write { path, offset, len, byte }),
        1 => (path.clone(), 0..3_000usize, byte.clone()).prop_map(|(path, len, byte)| Op::Append { path, len, byte }),
        2 => (path.clone(), 0..15_000u64).prop_map(|(path, size)| Op::Truncate { path, size }),
        3 => path.clone().prop_map(|path| Op::Read { path }),
        2 => path.clone().prop_map(|path| Op::Stat { path }),
        2 => path.clone().prop_map(|path| Op::List { path }),
        3 => path.clone().prop_map(|path| Op::Mkdir { path }),
        1 => path.clone().prop_map(|path| Op::Rmdir { path }),
        2 => path.clone().prop_map(|path| Op::Unlink { path }),
        3 => (path.clone(), path.clone()).prop_map(|(from, to)| Op::Rename { from, to }),
        1 => (path.clone(), path.clone()).prop_map(|(from, to)| Op::Link { from, to }),
        1 => (path.clone(), path.clone()).prop_map(|(target, at)| Op::Symlink { target, at }),
        1 => (path.clone(), 0..0o1000u32).prop_map(|(path, mode)| Op::Chmod { path, mode }),
        3 => (slot.clone(), path.clone(), any::<bool>()).prop_map(|(slot, path, create)| Op::Open { slot, path, create }),
        3 => (slot.clone(), 0..12_000u64, 0..6_000usize, byte.clone())
            .prop_map(|(slot, offset, len, byte)| Op::PWrite { slot, offset, len, byte }),
        2 => (slot.clone(), 0..12_000u64, 0..8_000usize).prop_map(|(slot, offset, len)| Op::PRead { slot, offset, len }),
        1 => (slot.clone(), 0..15_000u64).prop_map(|(slot, size)| Op::FTruncate { slot, size }),
        1 => slot.clone().prop_map(|slot| Op::FStat { slot }),
        2 => slot.prop_map(|slot| Op::Close { slot }),
        2 => (path.clone(), 0..4_000usize, byte.clone()).prop_map(|(path, len, byte)| Op::ToolWrite { path, len, byte }),
        1 => (path.clone(), byte.clone(), byte.clone()).prop_map(|(path, old, new)| Op::ToolEdit { path, old, new }),
        1 => path.clone().prop_map(|path| Op::ToolDelete { path }),
        2 => (path, 0..4_000usize, byte).prop_map(|(path, len, byte)| Op::Replace { path, len, byte }),
    ]
}

type Outcome = Result<String, i32>;

fn errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

fn bad_descriptor() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::EBADF)
}

/// What a test can compare of a node: its kind, permission bits, link count, and the size of
/// anything but a directory (whose size is the filesystem's own business).
fn summary(m: &fs::Metadata) -> String {
    let kind = m.mode() & libc::S_IFMT;
    let size = if kind == libc::S_IFDIR { 0 } else { m.size() };
    format!("kind {kind:o} perm {:o} nlink {} size {size}", m.mode() & 0o7777, m.nlink())
}

/// One side of the comparison: a directory and the descriptors opened in it.
struct Side {
    dir: PathBuf,
    slots: Vec<Option<File>>,
}

impl Side {
    fn new(dir: PathBuf) -> Side {
        Side { dir, slots: (0..SLOTS).map(|_| None).collect() }
    }

    fn p(&self, path: usize) -> PathBuf {
        self.dir.join(NAMES[path])
    }

    /// Applies one file-system operation (not a tool call) and reports what it returned.
    fn apply(&mut self, op: &Op) -> Outcome {
        let ok = |_| String::new();
        match *op {
            Op::Write { path, offset, len, byte } => OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o644)
                .open(self.p(path))
                .and_then(|f| f.write_all_at(&vec![byte; len], offset))
                .map(ok),
            Op::Append { path, len, byte } => OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o644)
                .open(self.p(path))
                .and_then(|mut f| std::io::Write::write_all(&mut f, &vec![byte; len]))
                .map(ok),
            Op::Truncate { path, size } => {
                nix::unistd::truncate(&self.p(path), size as i64).map(ok).map_err(std::io::Error::from)
            }
            Op::Read { path } => {
                return fs::read(self.p(path)).map(|d| String::from_utf8(d).unwrap()).map_err(errno)
            }
            Op::Stat { path } => fs::symlink_metadata(self.p(path)).map(|m| summary(&m)),
            Op::List { path } => fs::read_dir(self.p(path)).and_then(|entries| {
                let mut names = entries.map(|e| e.map(|e| e.file_name())).collect::<Result<Vec<_>, _>>()?;
                names.sort();
                Ok(format!("{names:?}"))
            }),
            Op::Mkdir { path } => fs::create_dir(self.p(path)).map(ok),
            Op::Rmdir { path } => fs::remove_dir(self.p(path)).map(ok),
            Op::Unlink { path } => fs::remove_file(self.p(path)).map(ok),
            Op::Rename { from, to } => fs::rename(self.p(from), self.p(to)).map(ok),
            Op::Link { from, to } => fs::hard_link(self.p(from), self.p(to)).map(ok),
            // Relative to the link's directory, so it stays inside the work directory.
            Op::Symlink { target, at } => std::os::unix::fs::symlink(NAMES[target], self.p(at)).map(ok),
            Op::Chmod { path, mode } => {
                fs::set_permissions(self.p(path), fs::Permissions::from_mode(mode)).map(ok)
            }
            Op::Open { slot, path, create } => {
                let opened = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(create)
                    .truncate(false)
                    .mode(0o644)
                    .open(self.p(path));
                return opened.map(|f| self.slots[slot] = Some(f)).map(ok).map_err(errno);
            }
            Op::PWrite { slot, offset, len, byte } => {
                self.file(slot).and_then(|f| f.write_all_at(&vec![byte; len], offset)).map(ok)
            }
            Op::PRead { slot, offset, len } => self.file(slot).and_then(|f| {
                let mut buf = vec![0; len];
                let n = f.read_at(&mut buf, offset)?;
                buf.truncate(n);
                Ok(String::from_utf8(buf).unwrap())
            }),
            Op::FTruncate { slot, size } => self.file(slot).and_then(|f| f.set_len(size)).map(ok),
            Op::FStat { slot } => self.file(slot).and_then(|f| f.metadata()).map(|m| summary(&m)),
            Op::Close { slot } => self.slots[slot].take().map(|_| String::new()).ok_or_else(bad_descriptor),
            Op::Replace { path, len, byte } => {
                let target = self.p(path);
                let tmp = target.with_file_name(".replacing");
                fs::write(&tmp, vec![byte; len]).and_then(|_| fs::rename(&tmp, &target)).map(ok).inspect_err(
                    |_| {
                        let _ = fs::remove_file(&tmp);
                    },
                )
            }
            Op::ToolWrite { .. } | Op::ToolEdit { .. } | Op::ToolDelete { .. } | Op::OnHost(_) => {
                unreachable!("applied by the model")
            }
        }
        .map_err(errno)
    }

    fn file(&self, slot: usize) -> std::io::Result<&File> {
        self.slots[slot].as_ref().ok_or_else(bad_descriptor)
    }

    /// Every node under the work directory with its summary, and each file's content or each
    /// link's target.
    fn tree(&self) -> BTreeMap<String, String> {
        self.try_tree().unwrap()
    }

    /// The tree, and what a `stat` of every name answers.
    fn view(&mut self) -> (Result<BTreeMap<String, String>, i32>, Vec<Outcome>) {
        let stats = (0..NAMES.len()).map(|path| self.apply(&Op::Stat { path })).collect();
        (self.try_tree().map_err(errno), stats)
    }

    fn try_tree(&self) -> std::io::Result<BTreeMap<String, String>> {
        let mut out = BTreeMap::new();
        let mut stack = vec![self.dir.clone()];
        while let Some(dir) = stack.pop() {
            for entry in fs::read_dir(&dir)? {
                let path = entry?.path();
                let m = fs::symlink_metadata(&path)?;
                let rel = path.strip_prefix(&self.dir).unwrap().display().to_string();
                let detail = if m.is_dir() {
                    stack.push(path.clone());
                    String::new()
                } else if m.file_type().is_symlink() {
                    fs::read_link(&path)?.display().to_string()
                } else {
                    // A read error is part of the tree: the other side would not have it.
                    fs::read(&path).map_or_else(|e| format!("error {e}"), |d| String::from_utf8(d).unwrap())
                };
                out.insert(rel, format!("{} {detail}", summary(&m)));
            }
        }
        Ok(out)
    }

    fn reset(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = None);
        if self.dir.exists() {
            fs::remove_dir_all(&self.dir).unwrap();
        }
        fs::create_dir(&self.dir).unwrap();
    }
}

/// Whether any component of `rel` under `dir` is a symlink: the tools resolve links to their
/// real path, which the reference below does not model.
fn through_symlink(dir: &Path, rel: &str) -> bool {
    let mut at = dir.to_path_buf();
    rel.split('/').any(|part| {
        at.push(part);
        fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink())
    })
}

/// The tool call's effect on the reference directory, or the error it must report.
fn tool_reference(dir: &Path, op: &Op) -> Result<(), ()> {
    match *op {
        Op::ToolWrite { path, len, byte } => {
            let target = dir.join(NAMES[path]);
            let old = fs::symlink_metadata(&target).ok();
            if old.as_ref().is_some_and(|m| m.is_dir()) {
                return Err(());
            }
            // Missing parents are created; a parent that is not a directory fails.
            fs::create_dir_all(target.parent().unwrap()).map_err(|_| ())?;
            let tmp = target.with_file_name(".model-tmp");
            fs::write(&tmp, vec![byte; len]).unwrap();
            let perm = old.map_or(0o644, |m| m.mode() & 0o7777);
            fs::set_permissions(&tmp, fs::Permissions::from_mode(perm)).unwrap();
            fs::rename(&tmp, &target).unwrap();
            Ok(())
        }
        Op::ToolEdit { path, old, new } => {
            let target = dir.join(NAMES[path]);
            let m = fs::symlink_metadata(&target).map_err(|_| ())?;
            let content = if m.is_file() { fs::read(&target).unwrap() } else { return Err(()) };
            if old == new || !content.contains(&old) {
                return Err(());
            }
            let updated: Vec<u8> = content.iter().map(|&b| if b == old { new } else { b }).collect();
            let tmp = target.with_file_name(".model-tmp");
            fs::write(&tmp, updated).unwrap();
            fs::set_permissions(&tmp, m.permissions()).unwrap();
            fs::rename(&tmp, &target).unwrap();
            Ok(())
        }
        Op::ToolDelete { path } => {
            let target = dir.join(NAMES[path]);
            match fs::symlink_metadata(&target) {
                Ok(m) if m.is_dir() => fs::remove_dir_all(&target).map_err(|_| ()),
                Ok(_) => fs::remove_file(&target).map_err(|_| ()),
                Err(_) => Err(()),
            }
        }
        _ => unreachable!(),
    }
}

/// Calls a tool on a fresh connection (a session that has read nothing) and says whether it
/// succeeded, with its text.
fn tool(socket: &Path, name: &str, arguments: Value) -> (bool, String) {
    call_tool(&mut Client::connect(socket).unwrap(), name, arguments)
}

fn tool_call(socket: &Path, route: &str, op: &Op) -> (bool, String) {
    let vpath = |path: usize| format!("{route}/m/{}", NAMES[path]);
    match *op {
        Op::ToolWrite { path, len, byte } => {
            let content = String::from_utf8(vec![byte; len]).unwrap();
            tool(socket, "write_file", json!({"file_path": vpath(path), "content": content}))
        }
        Op::ToolEdit { path, old, new } => {
            // An edit needs this session to have read the file: one connection for both.
            let mut client = Client::connect(socket).unwrap();
            let mut call = |name: &str, arguments: Value| call_tool(&mut client, name, arguments);
            let (read, text) = call("read_file", json!({"file_path": vpath(path)}));
            if !read {
                return (false, text);
            }
            let (old, new) = (char::from(old).to_string(), char::from(new).to_string());
            call(
                "edit_file",
                json!({"file_path": vpath(path), "old_string": old, "new_string": new, "replace_all": true}),
            )
        }
        Op::ToolDelete { path } => tool(socket, "delete", json!({"file_path": vpath(path)})),
        _ => unreachable!(),
    }
}

/// Runs `ops` on the reference and through the mount, comparing as it goes.
fn run(
    fx: &Fixture,
    route: &str,
    reference: &mut Side,
    mounted: &mut Side,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    reference.reset();
    mounted.reset();
    let socket = fx.scratch.path().join("agentvfs.sock");
    // The host directory behind the mounted side, on the host route.
    let mut on_host = (route == "/host").then(|| Side::new(fx.host_root.join("m")));
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::OnHost(op) => {
                let Some(host) = on_host.as_mut() else { continue };
                let want = reference.apply(op);
                let got = host.apply(op);
                prop_assert_eq!(&got, &want, "step {} on the host {:?}", i, op);
                // The host watch tells the kernel within milliseconds; until then the mount
                // may show the old tree, or the old answer for a name it cached (present or
                // absent) that no listing shows.
                let want = reference.view();
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
                let mut seen = mounted.view();
                while seen != want && std::time::Instant::now() < deadline {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    seen = mounted.view();
                }
                prop_assert_eq!(seen, want, "step {} on the host {:?}: not seen through the mount", i, op);
            }
            Op::ToolWrite { path, .. } | Op::ToolEdit { path, .. } | Op::ToolDelete { path } => {
                if through_symlink(&reference.dir, NAMES[*path]) {
                    continue;
                }
                let expected = tool_reference(&reference.dir, op);
                let (ok, text) = tool_call(&socket, route, op);
                prop_assert_eq!(ok, expected.is_ok(), "step {} {:?}: tool said {:?}", i, op, text);
            }
            _ => {
                let want = reference.apply(op);
                let got = mounted.apply(op);
                prop_assert_eq!(&got, &want, "step {} {:?}", i, op);
            }
        }
    }
    mounted.slots.iter_mut().for_each(|s| *s = None);
    prop_assert_eq!(mounted.tree(), reference.tree(), "final tree");
    Ok(())
}

#[test]
fn random_operations_agree_with_a_plain_directory_on_every_route() {
    let fx = Fixture::new("");
    let cases = std::env::var("MODEL_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let seed: u64 = std::env::var("MODEL_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    for route in ROUTES {
        let sides = RefCell::new((
            Side::new(fx.scratch.path().join(format!("reference{}", route.replace('/', "-")))),
            Side::new(fx.p(&format!("{route}/m"))),
        ));
        let mut seed_bytes = [0u8; 32];
        seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes);
        let config = Config { cases, failure_persistence: None, ..Config::default() };
        let mut runner = TestRunner::new_with_rng(config, rng);
        let result = runner.run(&proptest::collection::vec(op(), 1..60), |ops| {
            let (reference, mounted) = &mut *sides.borrow_mut();
            run(&fx, route, reference, mounted, &ops)
        });
        if let Err(e) = result {
            panic!("{route}: {e}");
        }
    }
}
