//! Unit tests of the approvals: tickets, decisions, bounds, expiry, grants, subscribers.

use std::sync::mpsc;

use super::*;

fn request(door: &'static str, operation: &str, op: Op, path: &str, pid: u32) -> Request {
    Request {
        door,
        operation: operation.into(),
        op,
        path: VPath::parse(path).unwrap(),
        rule: Some(0),
        pid,
        uid: 0,
        command: "sh -c echo".into(),
        tool: (door == "tool").then(|| ToolCall {
            name: "write_file".to_string(),
            arguments: Preview::of(&json!({"file_path": path})),
            resolved: None,
            reach: Reach::named(vec![VPath::parse(path).unwrap()]),
            socket: "agent",
        }),
        names: None,
        other: None,
    }
}

fn me() -> u32 {
    std::process::id()
}

fn p(s: &str) -> VPath {
    VPath::parse(s).unwrap()
}

/// Submits and returns the receiver of the outcome.
fn ask(a: &Approvals, r: Request, inherit: Option<ApprovalId>) -> mpsc::Receiver<(ApprovalId, Outcome)> {
    let (tx, rx) = mpsc::channel();
    a.submit(r, inherit, Box::new(move |id, o| tx.send((id, o)).unwrap()));
    rx
}

fn only_id(a: &Approvals) -> ApprovalId {
    let list = a.list();
    assert_eq!(list.len(), 1, "{list:?}");
    list[0]["id"].as_u64().unwrap()
}

#[test]
fn approve_once_covers_exactly_the_pair_until_finished() {
    let a = Approvals::default();
    let rx = ask(&a, request("fuse", "create", Op::Write, "/s/k", me()), None);
    let id = only_id(&a);
    assert_eq!(a.pending_count(), 1);
    let view = a.resolve(id, Decision::Approve(Scope::Once), "uid 0").unwrap();
    assert_eq!(view["decision"], "approve");
    assert_eq!(rx.try_recv().unwrap(), (id, Outcome::Decided(Decision::Approve(Scope::Once))));
    assert_eq!(a.pending_count(), 0);
    assert!(a.covers(Some(id), Op::Write, &p("/s/k"), 0));
    assert!(!a.covers(Some(id), Op::Write, &p("/s/other"), 0));
    assert!(!a.covers(Some(id), Op::Read, &p("/s/k"), 0));
    assert!(!a.covers(None, Op::Write, &p("/s/k"), 0), "once leaves no grant");
    a.finish(id);
    assert!(!a.covers(Some(id), Op::Write, &p("/s/k"), 0));
    assert!(a.resolve(id, Decision::Reject(None), "x").is_err(), "resolved twice");
}

#[test]
fn a_second_ticket_of_one_operation_keeps_the_first_pair() {
    let a = Approvals::default();
    let _rx = ask(&a, request("fuse", "rename", Op::Write, "/s/a", me()), None);
    let first = only_id(&a);
    a.resolve(first, Decision::Approve(Scope::Once), "u").unwrap();
    let _rx2 = ask(&a, request("fuse", "rename", Op::Write, "/s/b", me()), Some(first));
    a.finish(first);
    let second = only_id(&a);
    a.resolve(second, Decision::Approve(Scope::Once), "u").unwrap();
    assert!(a.covers(Some(second), Op::Write, &p("/s/a"), 0));
    assert!(a.covers(Some(second), Op::Write, &p("/s/b"), 0));
}

#[test]
fn tool_approvals_cover_the_call_where_it_was_shown_to_act() {
    let a = Approvals::default();
    let _rx = ask(&a, request("tool", "write_file", Op::Write, "/s/k", me()), None);
    let id = only_id(&a);
    a.resolve(id, Decision::Approve(Scope::Once), "u").unwrap();
    assert!(a.covers(Some(id), Op::Write, &p("/s/k"), 0));
    assert!(a.covers(Some(id), Op::Read, &p("/s/k"), 0));
    assert!(a.covers(Some(id), Op::Write, &p("/s"), 0), "a missing parent is made");
    assert!(!a.covers(Some(id), Op::Write, &p("/s/other"), 0), "another file of the directory");
    assert!(!a.covers(Some(id), Op::Read, &p("/anything"), 0));
    // Edited arguments move the cover to where they lead.
    a.cover_call(id, Reach::named(vec![p("/t/edited")]));
    assert!(a.covers(Some(id), Op::Write, &p("/t/edited"), 0));
    assert!(!a.covers(Some(id), Op::Write, &p("/s/k"), 0));
    a.finish(id);
    assert!(!a.covers(Some(id), Op::Write, &p("/t/edited"), 0));
}

#[test]
fn a_bulk_approval_covers_beneath_its_path_only_what_the_approver_was_shown() {
    let a = Approvals::default();
    let mut r = request("tool", "delete", Op::Write, "/s", me());
    let call = r.tool.as_mut().unwrap();
    call.reach.guarded = [p("/s/sub"), p("/s/sub/old.conf")].into_iter().collect();
    let _rx = ask(&a, r, None);
    let id = only_id(&a);
    let shown = a.describe(id).unwrap();
    assert_eq!(shown["tool"]["guarded"], json!(["/s/sub", "/s/sub/old.conf"]));
    assert_eq!(
        a.describe_for_caller(id).unwrap()["tool"].get("guarded"),
        None,
        "the caller is not shown them"
    );
    a.resolve(id, Decision::Approve(Scope::Once), "u").unwrap();
    for (path, covered) in [
        ("/s", true),
        ("/", true),
        ("/s/sub", true),
        ("/s/sub/old.conf", true),
        ("/s/sub/moved-in.conf", false),
        ("/s/other", false),
        ("/t", false),
    ] {
        assert_eq!(a.covers(Some(id), Op::Write, &p(path), 0), covered, "{path}");
    }
}

#[test]
fn a_long_guarded_list_is_shown_cut() {
    let a = Approvals::default();
    let mut r = request("tool", "grep", Op::Read, "/s", me());
    r.tool.as_mut().unwrap().reach.guarded =
        (0..preview::GUARDED_SHOWN + 3).map(|n| p(&format!("/s/{n:03}"))).collect();
    let _rx = ask(&a, r, None);
    let view = a.describe(only_id(&a)).unwrap();
    assert_eq!(view["tool"]["guarded"].as_array().unwrap().len(), preview::GUARDED_SHOWN);
    assert_eq!(
        view["cut"],
        json!([{"at": "/tool/guarded", "entries": preview::GUARDED_SHOWN + 3, "shown": preview::GUARDED_SHOWN}])
    );
    assert_eq!(a.describe_for_caller(only_id(&a)).unwrap()["cut"], json!([]));
}

#[test]
fn a_session_approval_through_a_symlink_grants_where_it_leads() {
    let a = Approvals::default();
    let mut r = request("tool", "write_file", Op::Write, "/ws/link", me());
    if let Some(call) = r.tool.as_mut() {
        call.resolved = Some(p("/ws/guard/f"));
        call.reach = Reach::named(vec![p("/ws/link"), p("/ws/guard/f")]);
    }
    let _rx = ask(&a, r, None);
    let id = only_id(&a);
    a.resolve(id, Decision::Approve(Scope::Session), "u").unwrap();
    assert_eq!(a.grants(), vec![Grant { op: Op::Write, root: p("/ws/guard"), uid: 0 }]);
    assert!(a.covers(None, Op::Write, &p("/ws/guard/y"), 0));
    assert!(!a.covers(None, Op::Write, &p("/ws/guard/y"), 1000), "another user's");
    assert!(!a.covers(None, Op::Write, &p("/ws/secrets/x"), 0));
}

#[test]
fn edit_and_respond_are_for_tool_calls_only() {
    let a = Approvals::default();
    let rx = ask(&a, request("fuse", "open", Op::Write, "/s/k", me()), None);
    let id = only_id(&a);
    assert!(a.resolve(id, Decision::Edit(json!({})), "u").unwrap_err().contains("syscall"));
    assert!(a.resolve(id, Decision::Respond("no".into()), "u").is_err());
    assert!(rx.try_recv().is_err(), "still pending");
    a.resolve(id, Decision::Reject(Some("no".into())), "u").unwrap();
    assert_eq!(rx.try_recv().unwrap().1, Outcome::Decided(Decision::Reject(Some("no".into()))));
    assert!(!a.covers(Some(id), Op::Write, &p("/s/k"), 0), "a rejection covers nothing");
}

fn of(uid: u32, path: &str) -> Request {
    Request { uid, ..request("fuse", "open", Op::Write, path, me()) }
}

/// The guarded entries bulk tickets list are bounded in bytes, per user and in all, so that
/// an agent opening many cannot hold the daemon's memory; an answer gives the room back.
#[test]
fn the_guarded_entries_pending_tickets_list_are_bounded() {
    let a = Approvals::new(Duration::from_secs(60), 1024);
    let long = vec!["n".repeat(200); 5].join("/");
    let listing = |uid: u32, n: usize, tag: &str| {
        let mut r = of(uid, &format!("/s/{tag}"));
        r.tool = Some(ToolCall {
            name: "delete".into(),
            arguments: Preview::of(&json!({"file_path": "/s"})),
            resolved: None,
            reach: Reach {
                named: vec![p("/s")],
                guarded: (0..n).map(|i| p(&format!("/s/{tag}/{i}/{long}"))).collect(),
            },
            socket: "agent",
        });
        r
    };
    // About 1 KiB per entry: 10,000 entries list about 10 MB.
    let first = ask(&a, listing(1000, 10_000, "a"), None);
    assert!(first.try_recv().is_err(), "pending");
    let refused = ask(&a, listing(1000, 10_000, "b"), None);
    let share = Overload::Listed { uid: Some(1000), limit: LISTED_SHARE };
    assert_eq!(refused.try_recv().unwrap().1, Outcome::Overloaded(share));
    assert!(share.reason().contains("uid 1000 has pending would pass 16 MiB"), "{}", share.reason());
    // Another user still may, and a ticket listing nothing is not counted.
    let other = ask(&a, listing(1001, 10_000, "c"), None);
    assert!(other.try_recv().is_err(), "pending");
    let plain = ask(&a, of(1000, "/s/plain"), None);
    assert!(plain.try_recv().is_err(), "pending");
    let id = a.list()[0]["id"].as_u64().unwrap();
    a.resolve(id, Decision::Reject(None), "u").unwrap();
    let again = ask(&a, listing(1000, 10_000, "d"), None);
    assert!(again.try_recv().is_err(), "pending again");
    // Everyone's bound.
    drop(first);
    let mut held = vec![other, plain, again];
    for uid in 2000..2005 {
        held.push(ask(&a, listing(uid, 10_000, &format!("u{uid}")), None));
    }
    let all = held.iter().filter(|rx| rx.try_recv().is_ok()).count();
    assert_eq!(all, 1, "the seventh list of 10 MB passes 64 MiB in all");
}

/// Each user holds at most a quarter of the bound, and users other than root together hold
/// at most all but root's quarter: one agent, or several, cannot shut the others out.
#[test]
fn past_its_share_a_users_new_tickets_are_refused_at_once() {
    let a = Approvals::new(Duration::from_secs(60), 8);
    let mut held = Vec::new();
    for i in 0..2 {
        held.push(ask(&a, of(1000, &format!("/s/a{i}")), None));
    }
    let refused = ask(&a, of(1000, "/s/a2"), None);
    assert_eq!(refused.try_recv().unwrap().1, Outcome::Overloaded(Overload::Share { uid: 1000, limit: 2 }));
    assert!(Overload::Share { uid: 1000, limit: 2 }
        .reason()
        .contains("uid 1000 already has 2 approvals pending"));
    for (uid, i) in [(1001, 0), (1001, 1), (1002, 0), (1002, 1)] {
        held.push(ask(&a, of(uid, &format!("/s/{uid}-{i}")), None));
    }
    assert_eq!(a.pending_count(), 6);
    let refused = ask(&a, of(1003, "/s/b"), None);
    assert_eq!(refused.try_recv().unwrap().1, Outcome::Overloaded(Overload::Others { limit: 6 }));
    // Root's quarter is there for root, and then root is bounded like anyone.
    for i in 0..2 {
        let rx = ask(&a, of(0, &format!("/s/r{i}")), None);
        assert!(rx.try_recv().is_err(), "pending");
        held.push(rx);
    }
    let refused = ask(&a, of(0, "/s/r2"), None);
    assert_eq!(refused.try_recv().unwrap().1, Outcome::Overloaded(Overload::Share { uid: 0, limit: 2 }));
    // An answer gives the place back.
    let first = a.list()[0]["id"].as_u64().unwrap();
    a.resolve(first, Decision::Reject(None), "u").unwrap();
    let rx = ask(&a, of(1000, "/s/a3"), None);
    assert!(rx.try_recv().is_err(), "pending again");
    assert_eq!(a.pending_count(), 8);
}

#[test]
fn a_ticket_keeps_a_bounded_preview_of_long_arguments_and_command_lines() {
    let a = Approvals::new(Duration::from_secs(60), 8);
    let content = "A".repeat(300_000);
    let mut r = request("tool", "write_file", Op::Write, "/s/k", me());
    r.tool.as_mut().unwrap().arguments = Preview::of(&json!({"file_path": "/s/k", "content": content}));
    let _rx = ask(&a, r, None);
    let _ry = ask(&a, Request { command: "x".repeat(100_000), ..of(0, "/s/c") }, None);
    let list = a.list();
    let (tool, cmd) = (&list[0], &list[1]);
    assert_eq!(tool["tool"]["arguments"]["file_path"], json!("/s/k"));
    assert_eq!(tool["tool"]["arguments_bytes"], json!(300_033));
    let shown = tool["tool"]["arguments"]["content"].as_str().unwrap().len();
    assert_eq!(tool["cut"], json!([{"at": "/tool/arguments/content", "bytes": 300_000, "shown": shown}]));
    assert_eq!(cmd["cut"], json!([{"at": "/command", "bytes": 100_000, "shown": preview::COMMAND_SHOWN}]));
    assert_eq!(cmd["command"].as_str().unwrap().len(), preview::COMMAND_SHOWN);
    for t in &list {
        assert!(t.to_string().len() < 3000, "{}", t.to_string().len());
    }
}

#[test]
fn unanswered_tickets_expire_and_dead_callers_are_cleaned_up() {
    let a = Approvals::new(Duration::from_millis(0), 10);
    let rx = ask(&a, request("tool", "write_file", Op::Write, "/s/k", me()), None);
    a.sweep();
    assert_eq!(rx.try_recv().unwrap().1, Outcome::TimedOut);

    let a = Approvals::new(Duration::from_secs(60), 10);
    let alive = ask(&a, request("fuse", "create", Op::Write, "/s/a", me()), None);
    // No process has this pid (pid_max is at most 2^22).
    let dead = ask(&a, request("fuse", "create", Op::Write, "/s/b", 4_000_000_000), None);
    a.sweep();
    assert_eq!(dead.try_recv().unwrap().1, Outcome::CallerGone);
    assert!(alive.try_recv().is_err());
    assert_eq!(a.pending_count(), 1);
}

#[test]
fn a_withdrawn_ticket_is_gone_and_resolving_it_says_why() {
    let a = Approvals::default();
    let (tx, rx) = mpsc::channel();
    let id = a.submit(
        request("tool", "write_file", Op::Write, "/s/k", me()),
        None,
        Box::new(move |id, o| tx.send((id, o)).unwrap()),
    );
    let id = id.unwrap();
    let other = ask(&a, request("tool", "write_file", Op::Write, "/s/other", me()), None);
    assert!(a.withdraw(id));
    assert_eq!(rx.try_recv().unwrap(), (id, Outcome::CallerGone));
    assert!(!a.withdraw(id), "withdrawn once");
    assert!(other.try_recv().is_err(), "other tickets stay");
    assert_eq!(a.pending_count(), 1);
    let err = a.resolve(id, Decision::Approve(Scope::Once), "u").unwrap_err();
    assert_eq!(
        err,
        format!("approval #{id} is no longer pending: it was withdrawn because the client that asked disconnected")
    );
    assert!(!a.covers(Some(id), Op::Write, &p("/s/k"), 0));
    let answered = only_id(&a);
    a.resolve(answered, Decision::Reject(None), "uid 7").unwrap();
    let err = a.resolve(answered, Decision::Reject(None), "uid 7").unwrap_err();
    assert!(err.ends_with("it was already answered (reject by uid 7)"), "{err}");
    assert!(a
        .resolve(9999, Decision::Reject(None), "u")
        .unwrap_err()
        .starts_with("no pending approval #9999"));
}

#[test]
fn session_grants_cover_the_subtree_and_end_with_the_rules() {
    let a = Approvals::default();
    let _rx = ask(&a, request("fuse", "mkdir", Op::Write, "/s/dst", me()), None);
    a.resolve(only_id(&a), Decision::Approve(Scope::Session), "u").unwrap();
    assert!(a.covers(None, Op::Write, &p("/s/dst"), 0));
    assert!(a.covers(None, Op::Write, &p("/s/dst/sub/f"), 0));
    assert!(!a.covers(None, Op::Write, &p("/s/other"), 0));
    assert!(!a.covers(None, Op::Read, &p("/s/dst/f"), 0));

    let _rx = ask(&a, request("fuse", "create", Op::Write, "/t/f1", me()), None);
    a.resolve(only_id(&a), Decision::Approve(Scope::Session), "u").unwrap();
    assert!(a.covers(None, Op::Write, &p("/t/f2"), 0), "a file's grant is its directory");
    assert!(!a.covers(None, Op::Write, &p("/u/f"), 0));
    assert_eq!(a.grants().len(), 2);
    a.clear_grants();
    assert!(!a.covers(None, Op::Write, &p("/t/f2"), 0));
}

#[test]
fn grant_roots() {
    assert_eq!(grant_root(&p("/a/b/c"), false), Some(p("/a/b")));
    assert_eq!(grant_root(&p("/a/b/c"), true), Some(p("/a/b/c")));
    assert_eq!(grant_root(&p("/top"), false), Some(p("/top")), "never everything");
    assert_eq!(grant_root(&p("/top"), true), Some(p("/top")));
    assert_eq!(grant_root(&p("/"), true), None, "never everything");
}

#[test]
fn a_session_approval_of_the_root_itself_holds_once() {
    let a = Approvals::default();
    let _rx = ask(&a, request("tool", "grep", Op::Read, "/", me()), None);
    a.resolve(only_id(&a), Decision::Approve(Scope::Session), "u").unwrap();
    assert!(a.grants().is_empty());
    assert!(!a.covers(None, Op::Read, &p("/secrets/key"), 0));
}

#[test]
fn subscribers_hear_creation_and_resolution_until_they_go_away() {
    let a = Approvals::default();
    let (tx, rx) = mpsc::channel::<Value>();
    a.subscribe(move |m| tx.send(m.clone()).is_ok());
    let _r = ask(&a, request("fuse", "create", Op::Write, "/s/k", me()), None);
    let created = rx.try_recv().unwrap();
    assert_eq!(created["method"], "notifications/interrupt");
    assert_eq!(created["params"]["event"], "created");
    assert_eq!(created["params"]["interrupt"]["path"], "/s/k");
    assert_eq!(created["params"]["interrupt"]["command"], "sh -c echo");
    let id = created["params"]["interrupt"]["id"].as_u64().unwrap();
    a.resolve(id, Decision::Reject(None), "uid 7").unwrap();
    let resolved = rx.try_recv().unwrap();
    assert_eq!(resolved["params"]["event"], "resolved");
    assert_eq!(resolved["params"]["interrupt"]["decision"], "reject");
    assert_eq!(resolved["params"]["interrupt"]["resolved_by"], "uid 7");
    drop(rx);
    let _r = ask(&a, request("fuse", "create", Op::Write, "/s/k2", me()), None);
    assert!(a.inner.lock().subscribers.is_empty(), "a dead subscriber is dropped");
}

#[test]
fn the_timeout_stays_below_the_kernel_limit() {
    assert_eq!(effective_timeout(Duration::from_secs(300), 0), Duration::from_secs(300));
    assert_eq!(effective_timeout(Duration::from_secs(300), 120), Duration::from_secs(119));
    assert_eq!(effective_timeout(Duration::from_secs(30), 120), Duration::from_secs(30));
    assert_eq!(effective_timeout(Duration::from_secs(30), 1), Duration::from_secs(1));
}

fn retry(request: u64) -> retry::Retry {
    retry::Retry { request, uid: 0, names: None }
}

#[test]
fn an_approved_retry_lets_one_attempt_through_and_outlives_its_caller() {
    let a = Approvals::default();
    // The caller (a process long gone) does not wait: the sweeper keeps the ticket.
    let id = a.submit_retry(request("fuse", "mkdir", Op::Write, "/s/d", u32::MAX - 1), 10).unwrap();
    a.sweep();
    assert_eq!(a.list()[0]["retry"], json!(true));
    // Asking again before anyone answered opens no second ticket.
    assert_eq!(a.submit_retry(request("fuse", "mkdir", Op::Write, "/s/d", 1), 11), Some(id));
    assert_eq!(a.pending_count(), 1);
    // Another operation on the same path is another question.
    let other = a.submit_retry(request("fuse", "symlink", Op::Write, "/s/d", 1), 15).unwrap();
    assert_ne!(other, id);
    a.resolve(other, Decision::Reject(None), "uid 0").unwrap();
    assert!(!a.covers_retry(retry(12), "mkdir", Op::Write, &p("/s/d")), "nothing before the approval");
    a.resolve(id, Decision::Approve(Scope::Once), "uid 0").unwrap();
    assert_eq!(a.retry_count(), 1);
    assert!(
        !a.covers_retry(retry::Retry { request: 12, uid: 1000, names: None }, "mkdir", Op::Write, &p("/s/d")),
        "another user"
    );
    assert!(!a.covers_retry(retry(12), "mkdir", Op::Write, &p("/s/e")));
    assert!(!a.covers_retry(retry(12), "mkdir", Op::Read, &p("/s/d")));
    // An approved mkdir lets no other change of the same path through in its place.
    for other in ["create", "open", "rename", "setattr", "symlink"] {
        assert!(
            !a.covers_retry(retry(12), other, Op::Write, &p("/s/d")),
            "{other} is not the mkdir approved"
        );
    }
    assert!(a.covers_retry(retry(12), "mkdir", Op::Write, &p("/s/d")));
    assert!(a.covers_retry(retry(12), "mkdir", Op::Write, &p("/s/d")), "the claiming request may ask again");
    assert!(!a.covers_retry(retry(13), "mkdir", Op::Write, &p("/s/d")), "claimed by another request");
    a.spend(12);
    assert_eq!(a.retry_count(), 0);
    assert!(!a.covers_retry(retry(14), "mkdir", Op::Write, &p("/s/d")), "once");
    assert!(!a.covers(None, Op::Write, &p("/s/d"), 0), "once leaves no session grant");
}

#[test]
fn a_rejected_retry_leaves_nothing_and_a_session_one_grants_the_directory() {
    let a = Approvals::default();
    let id = a.submit_retry(request("fuse", "create", Op::Write, "/s/k", 1), 20).unwrap();
    a.resolve(id, Decision::Reject(None), "uid 0").unwrap();
    assert_eq!(a.retry_count(), 0);
    assert!(!a.covers_retry(retry(21), "create", Op::Write, &p("/s/k")));
    let id = a.submit_retry(request("fuse", "create", Op::Write, "/s/k", 1), 22).unwrap();
    a.resolve(id, Decision::Approve(Scope::Session), "uid 0").unwrap();
    assert!(a.covers(None, Op::Write, &p("/s/other"), 0));
    // A reload ends both.
    a.clear_grants();
    assert!(!a.covers(None, Op::Write, &p("/s/other"), 0));
    assert!(!a.covers_retry(retry(23), "create", Op::Write, &p("/s/k")));
}

#[test]
fn a_retry_refused_on_its_second_path_carries_the_first() {
    let a = Approvals::default();
    let first = a.submit_retry(request("fuse", "rename", Op::Write, "/s/a", 1), 30).unwrap();
    a.resolve(first, Decision::Approve(Scope::Once), "uid 0").unwrap();
    // The retry passes its first path, then meets the second.
    assert!(a.covers_retry(retry(31), "rename", Op::Write, &p("/s/a")));
    assert!(!a.covers_retry(retry(31), "rename", Op::Write, &p("/s/b")));
    let second = a.submit_retry(request("fuse", "rename", Op::Write, "/s/b", 1), 31).unwrap();
    a.spend(31);
    assert_eq!(a.retry_count(), 0, "the first grant moved into the new ticket");
    a.resolve(second, Decision::Approve(Scope::Once), "uid 0").unwrap();
    assert!(a.covers_retry(retry(32), "rename", Op::Write, &p("/s/a")));
    assert!(a.covers_retry(retry(32), "rename", Op::Write, &p("/s/b")));
    a.spend(32);
    assert_eq!(a.retry_count(), 0);
}
