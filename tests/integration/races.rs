//! Races against the gate's subtree check, as an unprivileged attacker would run them: one
//! thread shuttles a protected entry between directories inside a tree while others keep
//! renaming the whole tree out from under its rule.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use crate::harness::{call_tool, sh, Fixture};

/// Python threads as uid 65534: `movers` shuttle an entry between two paths under the tree,
/// `renamers` try `mv tree tree.out` (and back after a success) `attempts`
/// times each. Prints `attempts escapes shuttles`: an escape is a rename of the tree that went
/// through, since the protected entry is inside it at every instant.
const RACE: &str = r#"
import os, sys, threading
tree, a, b, attempts = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
out = tree + ".out"
done = threading.Event()
shuttles = [0]
escapes = []
def shuttle():
    here, there = os.path.join(tree, a), os.path.join(tree, b)
    while not done.is_set():
        try:
            os.rename(here, there)
            here, there = there, here
            shuttles[0] += 1
        except OSError:
            pass
def rename_tree():
    for _ in range(attempts):
        try:
            os.rename(tree, out)
        except OSError:
            continue
        escapes.append(1)
        os.rename(out, tree)
movers = [threading.Thread(target=shuttle) for _ in range(2)]
renamers = [threading.Thread(target=rename_tree) for _ in range(3)]
for t in movers + renamers:
    t.start()
for t in renamers:
    t.join()
done.set()
for t in movers:
    t.join()
print(3 * attempts, len(escapes), shuttles[0])
"#;

/// Each rule shape with the protected file (under `app`), and the two places of the
/// directory that shuttles with it inside.
const SHAPES: [(&str, &str, &str, &str); 3] = [
    ("/host/app/**/*.pem", "z/certs/server.pem", "z/certs", "a/certs"),
    ("/host/app/*/secret/**", "z/secret/key", "z", "w"),
    ("/host/app/{x,y}/**/*.pem", "x/d/key.pem", "x/d", "y/d"),
];

#[test]
fn a_tree_rename_never_carries_a_protected_entry_out_while_moves_race_inside_it() {
    for (pattern, secret, a, b) in SHAPES {
        let rules = format!(
            "[[rules]]\noperations = [\"read\", \"write\"]\npaths = [\"{pattern}\"]\nmode = \"deny\"\n"
        );
        let fx = Fixture::new(&rules);
        let app = fx.host_root.join("app");
        fs::create_dir_all(app.join(b).parent().unwrap()).unwrap();
        let key = app.join(secret);
        fs::create_dir_all(key.parent().unwrap()).unwrap();
        fs::write(&key, "KEY").unwrap();
        let (code, _, err) = sh(&fx.host_root, "chown -R 65534:65534 . && chmod 777 .");
        assert_eq!(code, 0, "{err}");
        fs::set_permissions(fx.scratch.path(), fs::Permissions::from_mode(0o711)).unwrap();
        let script = fx.scratch.path().join("race.py");
        fs::write(&script, RACE).unwrap();
        fs::set_permissions(&script, fs::Permissions::from_mode(0o644)).unwrap();
        let tree = fx.p("/host/app");
        let (code, out, err) = sh(
            &fx.mount.dir,
            &format!(
                "setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 {} {} {a} {b} 1000",
                script.display(),
                tree.display()
            ),
        );
        assert_eq!(code, 0, "{pattern}: {err}");
        let counts: Vec<u64> = out.split_whitespace().map(|n| n.parse().unwrap()).collect();
        assert_eq!(counts[..2], [3000, 0], "{pattern}: the tree was renamed with its secret inside ({out})");
        assert!(counts[2] >= 100, "{pattern}: too few moves raced the renames ({out})");
        // The secret is still where its rule covers it, hidden through both doors.
        assert!(!fx.p("/host/app.out").exists(), "{pattern}");
        let rest = key.strip_prefix(app.join(a)).unwrap();
        let now = [app.join(a).join(rest), app.join(b).join(rest)].into_iter().find(|p| p.exists());
        let now = now.expect("the secret is in one of its two places");
        let virt = format!("/host/app/{}", now.strip_prefix(&app).unwrap().display());
        assert_eq!(fs::read(fx.p(&virt)).unwrap_err().raw_os_error(), Some(libc::ENOENT), "{pattern}");
        let mut client =
            agentvfs::control::client::Client::connect(&fx.scratch.path().join("agentvfs.sock")).unwrap();
        let (ok, text) = call_tool(&mut client, "read_file", serde_json::json!({"file_path": virt}));
        assert!(!ok && !text.contains("KEY"), "{pattern}: {text}");
    }
}

/// A tool call that adds names (a `write_file` whose directory is missing makes it) while
/// renames through the mount churn the same directory: the tool tells the kernel of its change
/// only after letting go of the namespace lock, since the kernel's invalidation waits for the
/// directory's lock, which such a rename holds while it waits for the namespace lock. Before,
/// the two waited for each other for good, and the daemon with them.
#[test]
fn tool_writes_and_renames_at_the_mount_in_one_directory_never_wait_for_each_other() {
    let f = Fixture::new("");
    let pub_dir = f.host_root.join("pub");
    fs::create_dir_all(pub_dir.join("d")).unwrap();
    // The churn runs in a process of its own: were it stuck in the kernel, only it would be.
    let churn = format!(
        r#"end=$(( $(date +%s) + 4 )); cd {dir}
        while [ $(date +%s) -lt $end ]; do
          mv d d.x 2>/dev/null; ln -s ../elsewhere d 2>/dev/null; rm -f d 2>/dev/null
          mv d.x d 2>/dev/null || mkdir d 2>/dev/null
        done"#,
        dir = f.p("/host/pub").display()
    );
    let mut racer = std::process::Command::new("sh").args(["-c", &churn]).spawn().unwrap();
    let mut c = crate::harness::Conn::open(&f.scratch.path().join("agentvfs-agent.sock"));
    let started = std::time::Instant::now();
    let mut calls = 0;
    while started.elapsed() < std::time::Duration::from_secs(4) {
        let args = serde_json::json!({"file_path": "/host/pub/d/s.txt", "content": "tool\n"});
        // Answered, one way or another (the directory may be a symlink or gone meanwhile):
        // a call the daemon never answers fails here after 20 s.
        let reply =
            c.request(calls, "tools/call", serde_json::json!({"name": "write_file", "arguments": args}));
        assert!(reply["result"]["content"][0]["text"].is_string(), "{reply}");
        calls += 1;
    }
    assert!(racer.wait().unwrap().success());
    assert!(calls > 10, "only {calls} calls");
    // The daemon still serves both doors.
    fs::write(f.p("/host/pub/after.txt"), "after").unwrap();
    let (ok, text) = call_tool(
        &mut agentvfs::control::client::Client::connect(&f.scratch.path().join("agentvfs-agent.sock"))
            .unwrap(),
        "read_file",
        serde_json::json!({"file_path": "/host/pub/after.txt"}),
    );
    assert!(ok && text.contains("after"), "{text}");
}
