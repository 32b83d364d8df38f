//! Engine tests without a kernel: the gate, the router and the backends wired together.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::backend::memory::MemoryBackend;
use crate::backend::{Backend, Caller};
use crate::policy::{Rule, RuleSet};
use crate::route::Route;

fn rule(ops: &[Op], paths: &[&str], mode: Mode, hide: bool) -> Rule {
    Rule { operations: ops.to_vec(), paths: paths.iter().map(|s| s.to_string()).collect(), mode, hide }
}

fn engine(rules: Vec<Rule>) -> Engine {
    let route = |prefix: &str| Route {
        prefix: VPath::parse(prefix).unwrap(),
        backend: Arc::new(MemoryBackend::new(None)) as Arc<dyn Backend>,
        ttl: Duration::from_secs(1),
        kind: "memory",
        read_only: false,
    };
    Engine::new(
        Gate::new(RuleSet::new(rules).unwrap()),
        Router::new(vec![route("/"), route("/w"), route("/a/b/c")]),
        Arc::new(Audit::open(None, crate::config::DEFAULT_AUDIT_MAX_RECORDS).unwrap()),
    )
}

fn ctx() -> Ctx {
    Ctx::new(Door::Tool, Caller { uid: 0, gid: 0, pid: 1 })
}

fn p(s: &str) -> VPath {
    VPath::parse(s).unwrap()
}

fn write(e: &Engine, path: &str, data: &[u8]) {
    let (_, h) = e.create(&ctx(), &p(path), 0o644, libc::O_WRONLY).unwrap();
    e.write(&h, 0, data).unwrap();
}

fn names(e: &Engine, dir: &str) -> Vec<String> {
    let mut v: Vec<String> = e.readdir(&ctx(), &p(dir)).unwrap().into_iter().map(|d| d.name).collect();
    v.sort();
    v
}

#[test]
fn route_mount_points_are_listed_busy_and_cross_route_ops_fail() {
    let e = engine(vec![]);
    assert_eq!(names(&e, "/"), ["a", "w"]);
    assert_eq!(names(&e, "/a"), ["b"]);
    assert_eq!(e.lookup(&ctx(), &p("/a/b")).unwrap().kind, FileKind::Dir, "synthetic directory");
    assert_eq!(e.rmdir(&ctx(), &p("/w")).unwrap_err().errno, Errno::EBUSY);
    assert_eq!(e.rename(&ctx(), &p("/w"), &p("/x"), 0).unwrap_err().errno, Errno::EBUSY);
    assert_eq!(e.mkdir(&ctx(), &p("/a"), 0o755).unwrap_err().errno, Errno::EEXIST);
    write(&e, "/w/f", b"x");
    assert_eq!(e.rename(&ctx(), &p("/w/f"), &p("/f"), 0).unwrap_err().errno, Errno::EXDEV);
    assert_eq!(e.link(&ctx(), &p("/w/f"), &p("/f")).unwrap_err().errno, Errno::EXDEV);
    assert_eq!(e.lookup(&ctx(), &p("/w/f")).unwrap().size, 1);
}

#[test]
fn hidden_entries_are_absent_and_cannot_be_recreated() {
    let e = engine(vec![rule(&[Op::Read, Op::Write], &["/**/.env"], Mode::Deny, true)]);
    e.mkdir(&ctx(), &p("/w/d"), 0o755).unwrap();
    assert_eq!(
        e.create(&ctx(), &p("/w/d/.env"), 0o644, libc::O_WRONLY).err().map(|e| e.errno),
        Some(Errno::EACCES)
    );
    write(&e, "/w/d/ok", b"1");
    // Planted behind the gate's back (as on a host directory).
    e.router_for_tests()
        .create(&e.gate.probe(&p("/w/d/.env")), 0o644, libc::O_WRONLY, &ctx().caller)
        .unwrap();
    assert_eq!(names(&e, "/w/d"), ["ok"]);
    assert_eq!(e.lookup(&ctx(), &p("/w/d/.env")).unwrap_err().errno, Errno::ENOENT);
    assert_eq!(e.audit.recorded(), 2, "the create and the lookup were refused and audited");
}

#[test]
fn hide_false_lists_but_refuses() {
    let e = engine(vec![rule(&[Op::Read], &["/w/s"], Mode::Deny, false)]);
    write(&e, "/w/s", b"1");
    assert_eq!(names(&e, "/w"), ["s"]);
    let err = e.lookup(&ctx(), &p("/w/s")).unwrap_err();
    assert_eq!((err.errno, err.denied_by), (Errno::EACCES, Some(0)));
}

#[test]
fn directory_rename_is_judged_on_what_it_carries() {
    let e = engine(vec![
        rule(&[Op::Read], &["/w/tree/inner/**"], Mode::Deny, true),
        rule(&[Op::Read, Op::Write], &["/**/.env"], Mode::Deny, true),
    ]);
    e.mkdir(&ctx(), &p("/w/tree"), 0o755).unwrap();
    // Creating inside the hidden tree is refused, so it is planted behind the gate's back.
    assert_eq!(e.mkdir(&ctx(), &p("/w/tree/inner"), 0o755).unwrap_err().errno, Errno::EACCES);
    e.router_for_tests().mkdir(&e.gate.probe(&p("/w/tree/inner")), 0o755, &ctx().caller).unwrap();
    assert_eq!(e.rename(&ctx(), &p("/w/tree"), &p("/w/t2"), 0).unwrap_err().errno, Errno::EACCES);
    // `.env` is denied at both ends: the move is allowed.
    e.mkdir(&ctx(), &p("/w/env"), 0o755).unwrap();
    e.router_for_tests()
        .create(&e.gate.probe(&p("/w/env/.env")), 0o644, libc::O_WRONLY, &ctx().caller)
        .unwrap();
    e.rename(&ctx(), &p("/w/env"), &p("/w/env2"), 0).unwrap();
    assert!(e.router_for_tests().getattr(&e.gate.probe(&p("/w/env2/.env"))).is_ok());
}

#[test]
fn a_tree_moved_out_of_an_allow_rule_into_the_default_allow_is_not_refused() {
    let e = engine(vec![
        rule(&[Op::Read], &["/w/pub/**"], Mode::Allow, true),
        rule(&[Op::Read, Op::Write], &["/**/.env"], Mode::Deny, true),
    ]);
    e.mkdir(&ctx(), &p("/w/pub"), 0o755).unwrap();
    e.mkdir(&ctx(), &p("/w/pub/d"), 0o755).unwrap();
    write(&e, "/w/pub/d/f", b"x");
    // Allowed by a rule before, allowed by default after: no decision changes.
    e.rename(&ctx(), &p("/w/pub/d"), &p("/w/d"), 0).unwrap();
    e.rename(&ctx(), &p("/w/d"), &p("/w/pub/d"), 0).unwrap();
    assert_eq!(names(&e, "/w/pub/d"), ["f"]);
    // The allow rule does decide `.env` beneath it: carrying one out is refused.
    e.router_for_tests()
        .create(&e.gate.probe(&p("/w/pub/d/.env")), 0o644, libc::O_WRONLY, &ctx().caller)
        .unwrap();
    assert_eq!(e.rename(&ctx(), &p("/w/pub/d"), &p("/w/d"), 0).unwrap_err().errno, Errno::EACCES);
}

#[test]
fn a_rename_learns_its_source_kind_exactly_when_a_rule_needs_it() {
    // `/w/locked/` names the directory only: a file may take that name, a directory may not.
    let e = engine(vec![rule(&[Op::Write], &["/w/locked/"], Mode::Deny, false)]);
    write(&e, "/w/f", b"1");
    e.mkdir(&ctx(), &p("/w/d"), 0o755).unwrap();
    assert_eq!(e.rename(&ctx(), &p("/w/d"), &p("/w/locked"), 0).unwrap_err().errno, Errno::EACCES);
    e.rename(&ctx(), &p("/w/f"), &p("/w/locked"), 0).unwrap();
    assert_eq!(e.lookup(&ctx(), &p("/w/locked")).unwrap().kind, FileKind::File);
    // Where no rule depends on the kind, a missing source still fails as missing (in the
    // backend, since nothing is looked up first) and a directory still moves.
    assert_eq!(e.rename(&ctx(), &p("/w/gone"), &p("/w/g2"), 0).unwrap_err().errno, Errno::ENOENT);
    e.rename(&ctx(), &p("/w/d"), &p("/w/d2"), 0).unwrap();
    assert_eq!(e.lookup(&ctx(), &p("/w/d2")).unwrap().kind, FileKind::Dir);
}

#[test]
fn links_need_write_on_the_existing_file() {
    let e = engine(vec![rule(&[Op::Write], &["/w/ro/**"], Mode::Deny, true)]);
    e.mkdir(&ctx(), &p("/w/ro"), 0o755).unwrap_err();
    e.mkdir(&ctx(), &p("/w/rw"), 0o755).unwrap();
    write(&e, "/w/rw/f", b"1");
    e.link(&ctx(), &p("/w/rw/f"), &p("/w/rw/g")).unwrap();
    assert_eq!(e.lookup(&ctx(), &p("/w/rw/f")).unwrap().nlink, 2);
}

#[test]
fn open_checks_each_access_mode() {
    let e = engine(vec![rule(&[Op::Write], &["/w/f"], Mode::Deny, true)]);
    write(&e, "/w/g", b"1");
    e.rename(&ctx(), &p("/w/g"), &p("/w/h"), 0).unwrap();
    e.router_for_tests().create(&e.gate.probe(&p("/w/f")), 0o644, libc::O_WRONLY, &ctx().caller).unwrap();
    assert!(e.open(&ctx(), &p("/w/f"), libc::O_RDONLY).is_ok());
    assert_eq!(e.open(&ctx(), &p("/w/f"), libc::O_RDWR).err().map(|e| e.errno), Some(Errno::EACCES));
    assert_eq!(
        e.open(&ctx(), &p("/w/f"), libc::O_RDONLY | libc::O_TRUNC).err().map(|e| e.errno),
        Some(Errno::EACCES)
    );
    let changes = SetAttr { mode: Some(0o600), ..SetAttr::default() };
    assert_eq!(e.setattr(&ctx(), &p("/w/f"), &changes, None).unwrap_err().errno, Errno::EACCES);
}

#[test]
fn a_reopen_is_judged_under_the_name_the_file_was_opened_by() {
    let e = engine(vec![rule(&[Op::Write], &["/w/f"], Mode::Deny, true)]);
    write(&e, "/w/g", b"data");
    let opened = e.open(&ctx(), &p("/w/g"), libc::O_RDONLY).unwrap();
    e.unlink(&ctx(), &p("/w/g")).unwrap();
    let again = e.reopen(&ctx(), &opened, libc::O_RDWR).unwrap();
    assert!(again.writable && again.path == p("/w/g"));
    e.write(&again, 4, b"!").unwrap();
    assert_eq!(e.read(&opened, 0, 10).unwrap(), b"data!");
    // The same file, had it been opened as `/w/f`.
    let as_f = OpenHandle { path: p("/w/f"), ..opened };
    assert_eq!(e.read(&e.reopen(&ctx(), &as_f, libc::O_RDONLY).unwrap(), 0, 10).unwrap(), b"data!");
    for flags in [libc::O_WRONLY, libc::O_RDWR, libc::O_RDONLY | libc::O_TRUNC] {
        assert_eq!(e.reopen(&ctx(), &as_f, flags).err().map(|e| e.errno), Some(Errno::EACCES), "{flags:o}");
    }
    assert_eq!(e.reopen(&ctx(), &as_f, libc::O_ACCMODE).err().map(|e| e.errno), Some(Errno::EINVAL));
}

/// A write by a process without `CAP_FSETID` that the kernel left to the daemon clears
/// set-user-ID always, and set-group-ID only from a group-executable file (without group
/// execute it marks mandatory locking); a file with neither bit is left alone.
#[test]
fn a_write_without_fsetid_clears_set_id_bits_as_a_local_filesystem_does() {
    let e = engine(vec![]);
    for (mode, kept, changed) in
        [(0o6755, 0o755, true), (0o6745, 0o2745, true), (0o2745, 0o2745, false), (0o755, 0o755, false)]
    {
        let (_, h) = e.create(&ctx(), &p("/w/prog"), 0o644, libc::O_RDWR).unwrap();
        let chmod = SetAttr { mode: Some(mode), ..SetAttr::default() };
        e.setattr(&ctx(), &p("/w/prog"), &chmod, Some(&h)).unwrap();
        assert_eq!(e.clear_setid_for_write(&h).unwrap(), changed, "{mode:o}");
        assert_eq!(u32::from(e.getattr(&ctx(), &p("/w/prog")).unwrap().perm), kept, "{mode:o}");
        e.unlink(&ctx(), &p("/w/prog")).unwrap();
    }
}

#[test]
fn a_created_handle_writes_as_its_access_mode_says() {
    let e = engine(vec![]);
    for (name, flags, writable) in
        [("r", libc::O_RDONLY, false), ("w", libc::O_WRONLY, true), ("rw", libc::O_RDWR, true)]
    {
        let (_, h) = e.create(&ctx(), &p(&format!("/w/{name}")), 0o644, flags).unwrap();
        assert_eq!(h.writable, writable, "{name}");
    }
}
