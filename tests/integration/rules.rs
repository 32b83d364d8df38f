//! The gate through real syscalls: each operation against allow, deny, hide, `hide = false`
//! and subtree rules.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use crate::harness::{config, scratch, sh, Mount, BIN};

const RULES: &str = r#"
[[rules]]
operations = ["read"]
paths = ["/host/pub/**"]
mode = "allow"

[[rules]]
operations = ["read", "write"]
paths = ["/host/secret/**", "/**/.env"]
mode = "deny"

[[rules]]
operations = ["read"]
paths = ["/host/visible-secret"]
mode = "deny"
hide = false

[[rules]]
operations = ["write"]
paths = ["/host/ro/**"]
mode = "deny"

[[rules]]
operations = ["read"]
paths = ["/host/tree/inner/**"]
mode = "deny"

[[rules]]
operations = ["read", "write"]
paths = ["/**"]
mode = "deny"
hide = false
"#;

/// Fields drop in order: the mount goes before its scratch directory.
struct Setup {
    mount: Mount,
    _scratch: tempfile::TempDir,
    cfg: std::path::PathBuf,
}

fn setup() -> Setup {
    let scratch = scratch();
    let root = scratch.path().join("host-root");
    for dir in ["secret", "pub", "ro", "tree/inner", "plain/sub", "withenv", "sub"] {
        fs::create_dir_all(root.join(dir)).unwrap();
    }
    for (file, body) in [
        ("secret/key", "KEY"),
        (".env", "TOKEN=1"),
        ("sub/.env", "TOKEN=2"),
        ("withenv/.env", "TOKEN=3"),
        ("pub/a", "public"),
        ("ro/file", "read only"),
        ("visible-secret", "shh"),
        ("tree/inner/x", "carried"),
        ("plain/sub/y", "plain"),
        ("open.txt", "open"),
    ] {
        fs::write(root.join(file), body).unwrap();
    }
    // The catch-all deny is scoped by replacing `/**` with a path that only this test uses,
    // so the host route stays usable for everything else.
    let rules = RULES.replace(
        "\"/**\"]\nmode = \"deny\"\nhide = false",
        "\"/host/closed/**\"]\nmode = \"deny\"\nhide = false",
    );
    fs::create_dir_all(root.join("closed")).unwrap();
    fs::write(root.join("closed/c"), "c").unwrap();
    let cfg = config(scratch.path(), &root, &rules);
    let mount = Mount::start(&cfg, &scratch.path().join("mnt"));
    Setup { mount, _scratch: scratch, cfg }
}

/// Runs a shell snippet and returns what it printed on stderr (errors name their cause).
fn fails_with(m: &Mount, script: &str, want: &str) {
    let (code, out, err) = sh(&m.dir, script);
    assert_ne!(code, 0, "{script} should fail; stdout {out}");
    assert!(err.contains(want), "{script}: expected {want:?} in {err:?}");
}

#[test]
fn read_denials_hide_entries() {
    let s = setup();
    let m = &s.mount;
    let listing = fs::read_dir(m.path("/host"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect::<Vec<_>>();
    assert!(!listing.contains(&"secret".to_string()), "{listing:?}");
    assert!(!listing.contains(&".env".to_string()), "{listing:?}");
    assert!(listing.contains(&"visible-secret".to_string()), "hide = false keeps it listed");
    assert!(listing.contains(&"pub".to_string()));
    assert_eq!(fs::metadata(m.path("/host/secret")).unwrap_err().raw_os_error(), Some(libc::ENOENT));
    assert_eq!(fs::read(m.path("/host/secret/key")).unwrap_err().raw_os_error(), Some(libc::ENOENT));
    assert_eq!(fs::read(m.path("/host/.env")).unwrap_err().raw_os_error(), Some(libc::ENOENT));
    assert_eq!(fs::read(m.path("/host/sub/.env")).unwrap_err().raw_os_error(), Some(libc::ENOENT));
    fails_with(m, "cat host/sub/.env", "No such file or directory");
    let (_, out, _) =
        sh(&m.dir, "ls -a host/sub; find host -name '.env' | wc -l; grep -r TOKEN host | wc -l");
    assert_eq!(out, ".\n..\n0\n0\n");
    // hide = false: listed, but EACCES.
    assert_eq!(fs::read(m.path("/host/visible-secret")).unwrap_err().raw_os_error(), Some(libc::EACCES));
    assert_eq!(fs::metadata(m.path("/host/visible-secret")).unwrap_err().raw_os_error(), Some(libc::EACCES));
    // An allow rule earlier in the list wins over the later denies.
    assert_eq!(fs::read_to_string(m.path("/host/pub/a")).unwrap(), "public");
    // Creating a name where a hidden entry lives is refused without revealing it.
    assert_eq!(fs::write(m.path("/host/.env"), "x").unwrap_err().raw_os_error(), Some(libc::EACCES));
    assert_eq!(fs::read_to_string(s._scratch.path().join("host-root/.env")).unwrap(), "TOKEN=1");
    // The memory and sqlite routes obey the same rules.
    fs::write(m.path("/db/.env"), "x").unwrap_err();
    assert!(!m.path("/db/.env").exists());
}

#[test]
fn write_denials_answer_eacces_and_change_nothing() {
    let s = setup();
    let m = &s.mount;
    assert_eq!(fs::read_to_string(m.path("/host/ro/file")).unwrap(), "read only");
    for script in [
        "echo x > host/ro/file",
        "echo x >> host/ro/file",
        "touch host/ro/new",
        "mkdir host/ro/d",
        "rm host/ro/file",
        "mv host/ro/file host/elsewhere",
        "chmod 600 host/ro/file",
        "ln -s x host/ro/link",
        "ln host/ro/file host/hardlink",
        "truncate -s 0 host/ro/file",
        "mv host/open.txt host/ro/file2",
        "touch -d 2001-01-01 host/ro/file",
    ] {
        fails_with(m, script, "Permission denied");
    }
    assert_eq!(fs::read_to_string(m.path("/host/ro/file")).unwrap(), "read only");
    let mode = fs::metadata(m.path("/host/ro/file")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644);
    assert!(!m.path("/host/ro/new").exists() && !m.path("/host/hardlink").exists());
    // The catch-all deny with hide = false: listed, unreadable, unwritable.
    fails_with(m, "cat host/closed/c", "Permission denied");
    fails_with(m, "echo > host/closed/new", "Permission denied");
}

#[test]
fn directory_renames_cannot_carry_protected_entries() {
    let s = setup();
    let m = &s.mount;
    // `tree/inner/**` is read-denied: moving `tree` would expose `inner/x` at a new path.
    fails_with(m, "mv host/tree host/tree2", "Permission denied");
    // The hidden directory itself cannot even be named.
    fails_with(m, "mv host/tree/inner host/inner2", "No such file or directory");
    assert!(s._scratch.path().join("host-root/tree/inner/x").exists());
    // A directory whose contents are judged the same at both paths moves freely, even with
    // a `.env` inside (denied at the old and the new path alike).
    let (code, _, err) = sh(&m.dir, "mv host/withenv host/withenv2 && mv host/plain host/plain2");
    assert_eq!(code, 0, "{err}");
    assert_eq!(fs::read_to_string(s._scratch.path().join("host-root/withenv2/.env")).unwrap(), "TOKEN=3");
    // Moving a tree into a write-protected area, or a protected tree out of it, is refused.
    fails_with(m, "mv host/plain2 host/ro/plain", "Permission denied");
    fails_with(m, "mv host/ro host/rw", "Permission denied");
    // rmdir of a directory a deny rule covers.
    fails_with(m, "rmdir host/ro", "Permission denied");
}

#[test]
fn denials_are_audited_and_explained() {
    let s = setup();
    let m = &s.mount;
    // Twice: a hidden name is never cached as absent, so each attempt reaches the gate.
    let _ = fs::read(m.path("/host/.env"));
    let _ = fs::read(m.path("/host/.env"));
    let _ = fs::write(m.path("/host/ro/file"), "x");
    // The audit writer is asynchronous; wait for the rows.
    let db = s._scratch.path().join("audit.db");
    let mut rows = Vec::new();
    for _ in 0..100 {
        if let Ok(conn) = rusqlite::Connection::open(&db) {
            let mut stmt = conn
                .prepare("SELECT door, operation, class, path, rule, decision FROM audit ORDER BY id")
                .unwrap();
            rows = stmt
                .query_map([], |r| {
                    Ok(format!(
                        "{} {} {} {} {} {}",
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, i64>(4)?,
                        r.get::<_, String>(5)?
                    ))
                })
                .unwrap()
                .map(Result::unwrap)
                .collect();
        }
        if rows.len() >= 3 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let hidden = rows.iter().filter(|r| *r == "fuse lookup read /host/.env 1 hide").count();
    assert_eq!(hidden, 2, "{rows:?}");
    assert!(rows.contains(&"fuse open write /host/ro/file 3 deny".to_string()), "{rows:?}");

    let out = Command::new(BIN)
        .args(["explain", "--config"])
        .arg(&s.cfg)
        .args(["read", "/host/sub/.env"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    let from = format!("(from the config file {})\n", s.cfg.display());
    assert_eq!(
        text,
        from.clone() + "read /host/sub/.env: denied: hidden (ENOENT, absent from listings)\nby rule #1: deny read,write /host/secret/** /**/.env\n"
    );
    let out = Command::new(BIN)
        .args(["explain", "--config"])
        .arg(&s.cfg)
        .args(["read", "/host/pub/x"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        from.clone() + "read /host/pub/x: allowed\nby rule #0: allow read /host/pub/**\n"
    );
    let out = Command::new(BIN)
        .args(["explain", "--config"])
        .arg(&s.cfg)
        .args(["write", "/mem/x"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        from + "write /mem/x: allowed\nno rule matches (default allow)\n"
    );
}

/// A pattern spelled with escapes is read the same way by the matcher and by the check of
/// what a directory rename carries: `my\ dir` names `my dir` for both.
#[test]
fn escaped_patterns_guard_the_subtrees_they_name() {
    let rules = r#"
[[rules]]
operations = ["read", "write"]
paths = ['/host/my\ dir/secrets/**', '/host/\*/k', '/host/b{r,l}ace/**/*.pem']
mode = "deny"
"#;
    let fx = crate::harness::Fixture::new(rules);
    for (dir, file) in [("my dir/secrets", "key"), ("*", "k"), ("brace/x", "s.pem")] {
        fs::create_dir_all(fx.host_root.join(dir)).unwrap();
        fs::write(fx.host_root.join(dir).join(file), "KEY").unwrap();
    }
    let (code, out, err) = sh(
        &fx.p("/host"),
        r#"cat "my dir/secrets/key" '*/k' brace/x/s.pem 2>/dev/null; echo "cat:$?"
           mv "my dir" moved 2>&1; mv '*' star 2>&1; mv brace plain 2>&1
           cat moved/secrets/key star/k plain/x/s.pem 2>/dev/null; echo "after:$?"; ls -A"#,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "cat:1\nmv: cannot move 'my dir' to 'moved': Permission denied\n\
         mv: cannot move '*' to 'star': Permission denied\n\
         mv: cannot move 'brace' to 'plain': Permission denied\nafter:1\n*\nbrace\nmy dir\n"
    );
}

/// Denials a caller provokes at will do not flood the daemon's log: their lines go out a few
/// times a second, the next one saying how many were held back, while the audit table keeps
/// every record.
#[test]
fn a_burst_of_denials_keeps_the_log_small_and_the_audit_table_whole() {
    let u = crate::harness::unmounted(
        "[[rules]]\noperations = [\"read\", \"write\"]\npaths = [\"/host/.env\"]\nmode = \"deny\"\n",
    );
    fs::write(u.host_root.join(".env"), "TOKEN=1").unwrap();
    let mount = Mount::try_start_logging(&u.config, &u.scratch.path().join("mnt"), "info").unwrap();
    let before = mount.log_text().len();
    for _ in 0..2000 {
        assert_eq!(fs::write(mount.path("/host/.env"), "x").unwrap_err().raw_os_error(), Some(libc::EACCES));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(fs::write(mount.path("/host/.env"), "x").is_err());
    let grown = mount.log_text().len() - before;
    assert!(grown < 8 << 10, "the log grew by {grown} bytes");
    crate::harness::soon("the held-back count is said", || {
        mount.log_text().contains("more like it held back)")
    });
    let db = rusqlite::Connection::open(u.scratch.path().join("audit.db")).unwrap();
    crate::harness::soon("every denial is in the audit table", || {
        db.query_row(
            "SELECT count(*) FROM audit WHERE path = '/host/.env' AND operation = 'create'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .is_ok_and(|n| n == 2001)
    });
    drop(mount);
}

/// Thousands of rules inside one route, as a big project's would be: each subtree question
/// (may a rename carry something past a rule; may a rule hide something beneath a directory)
/// still finds the one rule that matters among them, through the mount.
#[test]
fn thousands_of_rules_in_one_route_each_guard_their_own_subtree() {
    use std::fmt::Write as _;
    use std::os::unix::fs::MetadataExt;
    let mut rules = String::new();
    for i in 0..3000 {
        // Mostly literal anchors; a wildcard pattern is a regex, which a debug build is slow
        // to compile, so only a few.
        let path = match (i % 3, i % 100) {
            (2, _) => format!("/**/x{i}.secret"),
            (_, 1) => format!("/host/p{i}/*.key"),
            _ => format!("/host/p{i}/secret/**"),
        };
        let ops = if i % 3 == 2 { r#"["write"]"# } else { r#"["read", "write"]"# };
        writeln!(rules, "[[rules]]\noperations = {ops}\npaths = [\"{path}\"]\nmode = \"deny\"\n").unwrap();
    }
    let fx = crate::harness::Fixture::new(&rules);
    for dir in ["p2997/secret", "p2901", "p1500/public", "free/sub"] {
        fs::create_dir_all(fx.host_root.join(dir)).unwrap();
    }
    for (file, body) in [("p2997/secret/k", "K1"), ("p2901/a.key", "K2"), ("free/sub/f", "f")] {
        fs::write(fx.host_root.join(file), body).unwrap();
    }
    let (code, out, err) = sh(
        &fx.p("/host"),
        "mv p2997 q 2>&1; mv p2901 q 2>&1; mv free p2999 && mv p2999 free && mv p1500 p1502 && echo moved",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "mv: cannot move 'p2997' to 'q': Permission denied\n\
         mv: cannot move 'p2901' to 'q': Permission denied\nmoved\n"
    );
    assert_eq!(fs::read_to_string(fx.host_root.join("p2997/secret/k")).unwrap(), "K1");
    assert_eq!(fs::read_to_string(fx.host_root.join("p2901/a.key")).unwrap(), "K2");
    assert_eq!(fs::read_to_string(fx.host_root.join("free/sub/f")).unwrap(), "f");
    // A directory a hiding rule reaches does not count its subdirectories; one none reaches does.
    assert_eq!(fs::metadata(fx.p("/host/p2997")).unwrap().nlink(), 1);
    assert_eq!(fs::metadata(fx.p("/host/free")).unwrap().nlink(), 3);
    assert_eq!(fs::metadata(fx.p("/host/p1502")).unwrap().nlink(), 3);
    fs::create_dir(fx.host_root.join("p1501")).unwrap();
    assert_eq!(
        fs::metadata(fx.p("/host/p1501")).unwrap().nlink(),
        1,
        "/host/p1501/*.key may hide a name in it"
    );
    // The delete tool, through the socket: the 1,000 write denials that reach everywhere
    // block a directory's delete; the refusal names 20 of them in rule order.
    let mut client =
        agentvfs::control::client::Client::connect(&fx.scratch.path().join("agentvfs.sock")).unwrap();
    let (ok, text) =
        crate::harness::call_tool(&mut client, "delete", serde_json::json!({"file_path": "/host/free"}));
    let named: Vec<String> = (0..20).map(|k| format!("/**/x{}.secret", 3 * k + 2)).collect();
    assert!(!ok);
    assert_eq!(
        text,
        format!(
            "Error: permission denied for write on /host/free (matches deny rule(s): {}, and 980 more)",
            named.join(", ")
        )
    );
    assert_eq!(fs::read_to_string(fx.host_root.join("free/sub/f")).unwrap(), "f");
}
