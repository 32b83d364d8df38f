//! Directories the kernel opens by itself: unless a rule judges listings when a directory is
//! opened, `opendir` never reaches the daemon, each READDIR names the listing it continues,
//! and rules loaded later judge a listing at its first read.

use std::collections::BTreeSet;
use std::fs;
use std::io::ErrorKind;

use agentvfs::control::client::Client;
use serde_json::{json, Value};

use crate::harness::{status, Fixture};

fn opendirs(fx: &Fixture) -> u64 {
    status(fx)["counters"]["fuse_opendirs"].as_u64().unwrap()
}

fn client(fx: &Fixture) -> Client {
    Client::connect(&fx.scratch.path().join("agentvfs.sock")).unwrap()
}

/// Appends `rules` to the daemon's config file and reloads it.
fn add_rules(fx: &Fixture, rules: &str) {
    let config = fx.scratch.path().join("agentvfs.toml");
    let text = fs::read_to_string(&config).unwrap();
    fs::write(&config, format!("{text}\n{rules}")).unwrap();
    client(fx).call("vfs/reload", Some(json!({}))).unwrap();
}

fn names(dir: &std::path::Path) -> BTreeSet<String> {
    fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect()
}

#[test]
fn directories_are_opened_by_the_kernel_unless_a_rule_judges_listings_at_open() {
    let fx = Fixture::new("");
    for dir in ["a", "b/c"] {
        fs::create_dir_all(fx.host_root.join(dir)).unwrap();
        fs::write(fx.host_root.join(dir).join("f"), "x").unwrap();
    }
    for _ in 0..3 {
        assert_eq!(names(&fx.p("/host/a")), BTreeSet::from(["f".to_string()]));
        assert_eq!(names(&fx.p("/host/b")), BTreeSet::from(["c".to_string()]));
        assert_eq!(names(&fx.p("/host/b/c")), BTreeSet::from(["f".to_string()]));
    }
    assert_eq!(opendirs(&fx), 0, "no directory was opened through the daemon");

    let asks = Fixture::new(
        "[[rules]]\noperations = [\"read\"]\npaths = [\"/host/guarded/**\"]\nmode = \"interrupt\"\n",
    );
    fs::create_dir(asks.host_root.join("a")).unwrap();
    for _ in 0..3 {
        assert!(names(&asks.p("/host/a")).is_empty());
    }
    assert_eq!(opendirs(&asks), 3, "with a rule that asks at listing, every opendir comes");
}

/// Several processes list one large directory at once, and one reads a little, waits for
/// another to list it all, and goes on: each sees every name exactly once.
#[test]
fn a_large_directory_read_by_many_at_once_shows_every_name_once() {
    let fx = Fixture::new("");
    let host = fx.host_root.join("big");
    fs::create_dir(&host).unwrap();
    let all: BTreeSet<String> = (0..3000).map(|i| format!("entry-with-a-longish-name-{i:05}")).collect();
    for name in &all {
        fs::write(host.join(name), "").unwrap();
    }
    let dir = fx.p("/host/big");
    let mut partial = fs::read_dir(&dir).unwrap();
    let mut seen: Vec<String> =
        partial.by_ref().take(10).map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let dir = dir.clone();
            std::thread::spawn(move || {
                fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect()
            })
        })
        .collect();
    for reader in readers {
        let listed: Vec<String> = reader.join().unwrap();
        assert_eq!(listed.len(), all.len(), "a name twice or missing");
        assert_eq!(listed.into_iter().collect::<BTreeSet<_>>(), all);
    }
    seen.extend(partial.map(|e| e.unwrap().file_name().into_string().unwrap()));
    assert_eq!(seen.len(), all.len(), "the reader that paused");
    assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), all);
}

/// Rules loaded after the kernel stopped opening directories judge a listing at its first
/// read: a read denial that keeps the directory visible fails the read of a directory opened
/// before (it can no longer be looked up), and an interrupt (which lookups do not ask) refuses
/// the listing until a human approves it, then lets the retry through.
#[test]
fn rules_loaded_later_judge_a_listing_at_its_first_read() {
    let fx = Fixture::new("");
    for dir in ["shown", "guarded"] {
        fs::create_dir(fx.host_root.join(dir)).unwrap();
        fs::write(fx.host_root.join(dir).join("f"), "x").unwrap();
        assert_eq!(names(&fx.p(&format!("/host/{dir}"))).len(), 1);
    }
    assert_eq!(opendirs(&fx), 0);
    // Opened before the reload (a shell's working directory, say): the rule below also
    // refuses to look the directory up, so nothing opens it afterwards.
    let mut listing = fs::read_dir(fx.p("/host/shown")).unwrap();
    add_rules(
        &fx,
        "[[rules]]\noperations = [\"read\"]\npaths = [\"/host/shown/**\"]\nmode = \"deny\"\nhide = false\n\n\
         [[rules]]\noperations = [\"read\"]\npaths = [\"/host/guarded/**\"]\nmode = \"interrupt\"\n",
    );

    let first = listing.next().expect("an entry or an error");
    assert_eq!(first.unwrap_err().kind(), ErrorKind::PermissionDenied);
    assert_eq!(fs::read_dir(fx.p("/host/shown")).unwrap_err().kind(), ErrorKind::PermissionDenied);

    let refused = fs::read_dir(fx.p("/host/guarded")).unwrap().next().unwrap();
    assert_eq!(refused.unwrap_err().kind(), ErrorKind::PermissionDenied, "refused until approved");
    let mut c = client(&fx);
    let list: Value = c.call("interrupts/list", Some(json!({}))).unwrap();
    let tickets = list["interrupts"].as_array().unwrap();
    assert_eq!(tickets.len(), 1, "{list}");
    assert_eq!(
        (tickets[0]["operation"].as_str(), tickets[0]["path"].as_str(), &tickets[0]["retry"]),
        (Some("readdir"), Some("/host/guarded"), &json!(true))
    );
    c.call("interrupts/resolve", Some(json!({"id": tickets[0]["id"], "decision": "approve"}))).unwrap();
    assert_eq!(names(&fx.p("/host/guarded")), BTreeSet::from(["f".to_string()]), "the approved retry");
    // Once: the kernel kept no copy of that listing, so the next one asks again.
    crate::harness::soon("the next listing asks again", || {
        fs::read_dir(fx.p("/host/guarded")).unwrap().next().is_some_and(|e| e.is_err())
    });
    assert_eq!(opendirs(&fx), 0);
}
