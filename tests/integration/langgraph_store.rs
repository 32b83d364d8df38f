//! The postgres route's `langgraph` layout through real mounts: shell operations become rows of
//! LangGraph's `store` table as Deep Agents' StoreBackend writes them (keys with a leading
//! slash, text or base64 values), a row written straight into the table (as LangGraph writes
//! it) is seen in the mount within 100 ms, and two daemons on one prefix see each other.

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};

use serde_json::json;

use crate::harness::{call_tool, config, pg, scratch, sh, sh_ok, within, Mount};

/// A daemon whose `/lg` is the langgraph layout on `prefix` of the test server.
struct Daemon {
    mount: Mount,
    scratch: tempfile::TempDir,
}

impl Daemon {
    fn start(prefix: &str) -> Daemon {
        let scratch = scratch();
        let host_root = scratch.path().join("host-root");
        fs::create_dir_all(&host_root).unwrap();
        let cfg = config(scratch.path(), &host_root, "");
        let route = format!(
            "\n[[routes]]\npath = \"/lg\"\nbackend = \"postgres\"\nurl = \"{}\"\nlayout = \"langgraph\"\nnamespace = \"{prefix}\"\n",
            pg().url()
        );
        let text = fs::read_to_string(&cfg).unwrap();
        // Routes go before the [audit] table.
        let text = text.replacen("[audit]", &format!("{route}\n[audit]"), 1);
        fs::write(&cfg, text).unwrap();
        let mount = Mount::start(&cfg, &scratch.path().join("mnt"));
        Daemon { mount, scratch }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.mount.path(&format!("/lg/{}", rel.trim_start_matches('/')))
    }
}

fn prefix(test: &str) -> String {
    format!("lg-{test}-{}", std::process::id())
}

fn db() -> Client {
    Client::connect(&pg().url(), NoTls).unwrap()
}

/// The rows of `prefix`: key, content, encoding.
fn rows(db: &mut Client, prefix: &str) -> Vec<(String, String, String)> {
    db.query(
        "SELECT key, value->>'content', value->>'encoding' FROM public.store WHERE prefix = $1 ORDER BY key",
        &[&prefix],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

fn row(key: &str, content: &str, encoding: &str) -> (String, String, String) {
    (key.to_string(), content.to_string(), encoding.to_string())
}

/// How StoreBackend (through LangGraph's PostgresStore) writes a value.
fn langgraph_put(db: &mut Client, prefix: &str, key: &str, content: &str) {
    let value = serde_json::json!({
        "content": content, "encoding": "utf-8",
        "created_at": "2026-01-02T03:04:05.678901+00:00", "modified_at": "2026-01-02T03:04:05.678901+00:00",
    });
    db.execute(
        "INSERT INTO public.store (prefix, key, value, created_at, updated_at, expires_at, ttl_minutes)
         VALUES ($1, $2, $3::text::jsonb, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, NULL, NULL)
         ON CONFLICT (prefix, key) DO UPDATE
         SET value = EXCLUDED.value, updated_at = CURRENT_TIMESTAMP, expires_at = EXCLUDED.expires_at,
             ttl_minutes = EXCLUDED.ttl_minutes",
        &[&prefix, &key, &value.to_string()],
    )
    .unwrap();
}

fn seen_within_100ms(what: &str, check: impl Fn() -> bool) -> Duration {
    let started = Instant::now();
    within(what, Duration::from_millis(100), check);
    started.elapsed()
}

fn read(path: &std::path::Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| format!("<{e}>"))
}

#[test]
fn shell_operations_are_rows_of_the_store_table() {
    let pfx = prefix("shell");
    let d = Daemon::start(&pfx);
    let mut db = db();
    let root = d.p("");
    sh_ok(
        &root,
        "echo hello > f.md && mkdir -p d/e && printf 'x\\ny' > d/e/g.txt && mv f.md d/f.md && \
         printf '\\377\\000bin' > blob && mkdir empty",
    );
    assert_eq!(
        rows(&mut db, &pfx),
        [
            row("/blob", "/wBiaW4=", "base64"),
            row("/d/e/g.txt", "x\ny", "utf-8"),
            row("/d/f.md", "hello\n", "utf-8")
        ]
    );
    // StoreBackend's timestamps: Python's isoformat() in UTC.
    let times: Vec<(String, String)> = db
        .query(
            "SELECT value->>'created_at', value->>'modified_at' FROM public.store WHERE prefix = $1",
            &[&pfx],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    for (created, modified) in times {
        for t in [created, modified] {
            assert!(t.len() == 32 && t.ends_with("+00:00") && t.as_bytes()[10] == b'T', "{t}");
        }
    }
    assert_eq!(sh_ok(&root, "ls -A"), "blob\nd\nempty\n");
    assert_eq!(
        sh_ok(&root, "ls d; cat d/f.md d/e/g.txt; echo; od -An -tx1 blob"),
        "e\nf.md\nhello\nx\ny\n ff 00 62 69 6e\n"
    );
    assert_eq!(fs::metadata(d.p("blob")).unwrap().len(), 5);
    // Modes live in agentvfs's side table.
    sh_ok(&root, "chmod 600 d/f.md && chmod 700 empty");
    assert_eq!(
        sh_ok(&root, "stat -c '%a %s %F' d/f.md empty d"),
        "600 6 regular file\n700 0 directory\n755 0 directory\n"
    );
    // Appending rewrites the whole value once, at close.
    sh_ok(&root, "for i in 1 2 3; do echo line$i; done >> d/f.md");
    assert_eq!(rows(&mut db, &pfx)[2], row("/d/f.md", "hello\nline1\nline2\nline3\n", "utf-8"));
    // A directory's times move with its entries.
    let before = sh_ok(&root, "stat -c %y empty");
    std::thread::sleep(Duration::from_millis(20));
    sh_ok(&root, "touch empty/x && rm empty/x");
    assert_ne!(sh_ok(&root, "stat -c %y empty"), before);
    // What the store cannot hold.
    let (code, _, err) = sh(&root, "ln d/f.md hard");
    assert!(code != 0 && err.contains("Operation not permitted"), "{err}");
    let (code, _, err) = sh(&root, "ln -s d/f.md soft");
    assert!(code != 0 && err.contains("Operation not permitted"), "{err}");
    let (code, _, err) = sh(&root, "mkfifo fifo");
    assert!(code != 0 && err.contains("Operation not permitted"), "{err}");
    let (code, _, err) = sh(&root, "rmdir d");
    assert!(code != 0 && err.contains("Directory not empty"), "{err}");
    // A directory rename moves every key below it.
    sh_ok(&root, "mv d moved && rm moved/f.md && rmdir empty");
    assert_eq!(
        rows(&mut db, &pfx),
        [row("/blob", "/wBiaW4=", "base64"), row("/moved/e/g.txt", "x\ny", "utf-8")]
    );
    assert_eq!(sh_ok(&root, "ls -A; ls -A moved"), "blob\nmoved\ne\n");
    // An open file keeps its writes across a rename, and its content after an unlink.
    assert_eq!(
        sh_ok(
            &root,
            "exec 3> open.txt; echo one >&3; mv open.txt renamed.txt; echo two >&3; exec 3>&-; \
             cat renamed.txt; test ! -e open.txt && exec 4< renamed.txt && rm renamed.txt && cat <&4"
        ),
        "one\ntwo\none\ntwo\n"
    );
    // Writes are kept until fsync or close, which commit them.
    let mut f = fs::File::create(d.p("synced.txt")).unwrap();
    std::io::Write::write_all(&mut f, b"not yet").unwrap();
    assert_eq!(rows(&mut db, &pfx).iter().find(|r| r.0 == "/synced.txt").unwrap().1, "");
    f.sync_all().unwrap();
    assert_eq!(rows(&mut db, &pfx).iter().find(|r| r.0 == "/synced.txt").unwrap().1, "not yet");
    drop(f);
    sh_ok(&root, "rm -r moved blob synced.txt");
    assert!(rows(&mut db, &pfx).is_empty());
    assert_eq!(sh_ok(&root, "ls -A"), "");
}

#[test]
fn a_row_written_into_the_store_table_is_seen_within_100ms() {
    let pfx = prefix("visible");
    let d = Daemon::start(&pfx);
    let mut db = db();
    // The kernel caches these answers for an hour (the route's default lifetime).
    assert!(!d.p("new.md").exists());
    assert!(!d.p("dir").exists());
    assert_eq!(fs::read_dir(d.p("")).unwrap().count(), 0);

    langgraph_put(&mut db, &pfx, "/new.md", "from langgraph");
    let mut worst = seen_within_100ms("a new key", || read(&d.p("new.md")) == "from langgraph");
    langgraph_put(&mut db, &pfx, "/dir/sub/deep.md", "deep");
    worst =
        worst.max(seen_within_100ms("a key in a new directory", || read(&d.p("dir/sub/deep.md")) == "deep"));
    worst = worst.max(seen_within_100ms("the listing", || {
        let mut names: Vec<String> =
            fs::read_dir(d.p("")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names == ["dir", "new.md"]
    }));
    langgraph_put(&mut db, &pfx, "/new.md", "changed by langgraph");
    worst = worst.max(seen_within_100ms("new content", || read(&d.p("new.md")) == "changed by langgraph"));
    db.execute("DELETE FROM public.store WHERE prefix = $1 AND key = $2", &[&pfx, &"/dir/sub/deep.md"])
        .unwrap();
    worst = worst.max(seen_within_100ms("a deleted key and its directories", || !d.p("dir").exists()));
    // Legacy values (a list of lines) and keys that are no paths of StoreBackend's.
    db.execute(
        "INSERT INTO public.store (prefix, key, value) VALUES ($1, '/old.md', '{\"content\": [\"a\", \"b\"]}'),
         ($1, 'no-slash', '{\"content\": \"x\"}')",
        &[&pfx],
    )
    .unwrap();
    worst = worst.max(seen_within_100ms("a legacy value", || read(&d.p("old.md")) == "a\nb"));
    assert!(!d.p("no-slash").exists());
    eprintln!("slowest store change seen in the mount after {worst:?}");
}

#[test]
fn two_daemons_on_one_prefix_see_each_other() {
    let pfx = prefix("two");
    let (a, b) = (Daemon::start(&pfx), Daemon::start(&pfx));
    assert!(!b.p("notes/todo.md").exists());
    fs::create_dir(a.p("notes")).unwrap();
    fs::write(a.p("notes/todo.md"), "one").unwrap();
    let mut worst = seen_within_100ms("a new file", || read(&b.p("notes/todo.md")) == "one");
    fs::write(b.p("notes/todo.md"), "two!").unwrap();
    worst = worst.max(seen_within_100ms("new content", || read(&a.p("notes/todo.md")) == "two!"));
    fs::create_dir(b.p("empty")).unwrap();
    worst = worst.max(seen_within_100ms("an empty directory", || a.p("empty").is_dir()));
    fs::rename(b.p("notes"), b.p("renamed")).unwrap();
    worst = worst.max(seen_within_100ms("a rename", || {
        !a.p("notes").exists() && read(&a.p("renamed/todo.md")) == "two!"
    }));
    fs::remove_file(a.p("renamed/todo.md")).unwrap();
    worst = worst.max(seen_within_100ms("a deletion", || !b.p("renamed/todo.md").exists()));
    // The tool door: a write_file and an edit_file on A, read on B.
    let mut client =
        agentvfs::control::client::Client::connect(&a.scratch.path().join("agentvfs.sock")).unwrap();
    let (ok, text) =
        call_tool(&mut client, "write_file", json!({"file_path": "/lg/tool.md", "content": "by tool\n"}));
    assert!(ok, "{text}");
    worst = worst.max(seen_within_100ms("a tool write", || read(&b.p("tool.md")) == "by tool\n"));
    let (ok, text) = call_tool(&mut client, "read_file", json!({"file_path": "/lg/tool.md"}));
    assert!(ok && text.contains("by tool"), "{text}");
    let args = json!({"file_path": "/lg/tool.md", "old_string": "by", "new_string": "edited by"});
    let (ok, text) = call_tool(&mut client, "edit_file", args);
    assert!(ok, "{text}");
    worst = worst.max(seen_within_100ms("a tool edit", || read(&b.p("tool.md")) == "edited by tool\n"));
    // Concurrent whole-value writers: every value read is one of the values written.
    let writer = |d: &Daemon, tag: char| {
        let path = d.p("race.txt");
        std::thread::spawn(move || {
            for i in 0..40 {
                fs::write(&path, tag.to_string().repeat(1000 + i)).unwrap();
            }
        })
    };
    let (ta, tb) = (writer(&a, 'a'), writer(&b, 'b'));
    ta.join().unwrap();
    tb.join().unwrap();
    for d in [&a, &b] {
        within("one writer's value", Duration::from_secs(1), || {
            let text = read(&d.p("race.txt"));
            text.len() >= 1000 && (text.chars().all(|c| c == 'a') || text.chars().all(|c| c == 'b'))
        });
    }
    eprintln!("slowest change seen on the other daemon after {worst:?}");
}
