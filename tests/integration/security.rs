//! Escape attempts on the host route: nothing outside the root, or hidden by a rule, is
//! reached through `..`, symlinks (absolute, relative, swapped in mid-call) or hard links.

use std::fs;
use std::os::unix::fs::symlink;

use crate::control::FixturePaths;
use crate::harness::{call_tool, sh, Fixture};
use agentvfs::control::client::Client;
use serde_json::json;

const RULES: &str = r#"
[[rules]]
operations = ["read", "write"]
paths = ["/host/secrets/**"]
mode = "deny"
"#;

#[test]
fn symlinks_cannot_leave_the_root_or_dodge_rules() {
    let fx = Fixture::new(RULES);
    let outside = fx.scratch.path().join("outside.txt");
    fs::write(&outside, "OUTSIDE").unwrap();
    fs::create_dir_all(fx.host_root.join("secrets")).unwrap();
    fs::write(fx.host_root.join("secrets/key"), "KEY").unwrap();
    // Links planted on the host side, pointing out of the root and into the hidden tree.
    symlink("../outside.txt", fx.host_root.join("rel")).unwrap();
    symlink("secrets/key", fx.host_root.join("tokey")).unwrap();
    symlink("secrets", fx.host_root.join("todir")).unwrap();
    // The kernel resolves a relative link through the mount: `../` from the route's root
    // lands in the memory route, never in the host directory above the root.
    let rel = fs::read(fx.p("/host/rel"));
    assert_eq!(
        rel.unwrap_err().raw_os_error(),
        Some(libc::ENOENT),
        "../ from the route root climbs into the memory route"
    );
    // A link into the hidden tree is re-resolved through the mount and so through the gate.
    assert_eq!(fs::read(fx.p("/host/tokey")).unwrap_err().raw_os_error(), Some(libc::ENOENT));
    assert_eq!(fs::read(fx.p("/host/todir/key")).unwrap_err().raw_os_error(), Some(libc::ENOENT));
    let (_, out, _) = sh(&fx.mount.dir, "cat host/todir/key host/tokey 2>&1; cd host/todir 2>&1 && cat key");
    assert!(!out.contains("KEY"), "{out}");
}

#[test]
fn symlink_swapped_in_mid_walk_is_never_followed() {
    let fx = Fixture::new(RULES);
    // Beside the host root: `../outside-dir` from the root reaches it on the host, while the
    // kernel resolving the same link through the mount lands in the (empty) memory route.
    // So reading OUTSIDE through the mount could only mean the daemon followed the link.
    let outside = fx.scratch.path().join("outside-dir");
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("f"), "OUTSIDE").unwrap();
    fs::create_dir_all(fx.host_root.join("d")).unwrap();
    fs::write(fx.host_root.join("d/f"), "inside").unwrap();
    // A host process flips `d` between a directory and a symlink to the outside directory
    // while the mount reads `d/f` as fast as it can. The daemon resolves with
    // RESOLVE_NO_SYMLINKS, so it must see "inside" or an error, never "OUTSIDE".
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
    let root = fx.host_root.clone();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let flips = std::sync::Arc::new(AtomicUsize::new(0));
    let (flag, count) = (stop.clone(), flips.clone());
    let target = std::path::PathBuf::from("../outside-dir");
    let flipper = std::thread::spawn(move || {
        // Mostly a directory, briefly a symlink: the reads must get through sometimes (the
        // kernel may cache either state for the route's TTL), and the swaps must be frequent.
        let (as_link, as_dir) = (std::time::Duration::from_micros(300), std::time::Duration::from_millis(3));
        while !flag.load(Relaxed) {
            let _ = fs::rename(root.join("d"), root.join("d.real"));
            let _ = symlink(&target, root.join("d"));
            std::thread::sleep(as_link);
            let _ = fs::remove_file(root.join("d"));
            let _ = fs::rename(root.join("d.real"), root.join("d"));
            std::thread::sleep(as_dir);
            count.fetch_add(1, Relaxed);
        }
    });
    // Reads go on until many swaps happened (a read that meets the link fails fast: the
    // kernel may remember that its target is absent).
    let mut inside = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while (inside < 20 || flips.load(Relaxed) < 300) && std::time::Instant::now() < deadline {
        if let Ok(text) = fs::read_to_string(fx.p("/host/d/f")) {
            assert_ne!(text, "OUTSIDE", "followed a swapped-in symlink");
            inside += 1;
        }
    }
    stop.store(true, Relaxed);
    flipper.join().unwrap();
    let flips = flips.load(Relaxed);
    assert!(flips >= 300 && inside >= 20, "flips {flips}, reads {inside}");
}

#[test]
fn hard_links_and_renames_of_ancestors_do_not_expose_protected_files() {
    let fx = Fixture::new(RULES);
    fs::create_dir_all(fx.host_root.join("secrets")).unwrap();
    fs::write(fx.host_root.join("secrets/key"), "KEY").unwrap();
    // A hard link cannot be made to a hidden file: it cannot even be named.
    let (code, _, _) = sh(&fx.mount.dir, "ln host/secrets/key host/stolen");
    assert_ne!(code, 0);
    // Renaming the protected directory (or an ancestor of it) away is refused.
    let (code, _, _) = sh(&fx.mount.dir, "mv host/secrets host/public");
    assert_ne!(code, 0);
    fs::create_dir_all(fx.p("/host/a/b")).unwrap();
    fs::create_dir_all(fx.host_root.join("a/b/secrets")).unwrap();
    // `/host/secrets/**` does not cover `/host/a/b/secrets`, so that tree moves; the real
    // `/host/secrets` stays put.
    let (code, _, err) = sh(&fx.mount.dir, "mv host/a host/a2");
    assert_eq!(code, 0, "{err}");
    assert_eq!(fs::read_to_string(fx.host_root.join("secrets/key")).unwrap(), "KEY");
    // Case variants are different names on Linux and get no special treatment either way.
    fs::write(fx.host_root.join("SECRETS"), "not covered").unwrap();
    assert_eq!(fs::read_to_string(fx.p("/host/SECRETS")).unwrap(), "not covered");
}

/// A directory that no rule names is judged on what it holds: a move that would carry a
/// protected tree out from under its rule is refused; everything else moves.
#[test]
fn a_directory_carrying_a_protected_tree_stays_put() {
    let fx = Fixture::new(
        r#"
[[rules]]
operations = ["read", "write"]
paths = ["/host/proj/vault/**"]
mode = "deny"
"#,
    );
    fs::create_dir_all(fx.host_root.join("proj/vault")).unwrap();
    fs::write(fx.host_root.join("proj/vault/key"), "KEY").unwrap();
    fs::write(fx.host_root.join("proj/notes"), "n").unwrap();
    let (code, _, err) = sh(&fx.mount.dir, "mv host/proj host/proj2");
    assert_ne!(code, 0);
    assert!(err.contains("Permission denied"), "{err}");
    assert_eq!(fs::read_to_string(fx.host_root.join("proj/vault/key")).unwrap(), "KEY");
    assert!(!fx.host_root.join("proj2").exists());
    let (code, _, err) = sh(
        &fx.mount.dir,
        "mv host/proj/notes host/proj/notes2 && mkdir host/other && mv host/other host/other2",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(fs::read_to_string(fx.host_root.join("proj/notes2")).unwrap(), "n");
    assert!(fx.host_root.join("other2").is_dir());
}

/// A route's mount point is never renamed (EBUSY) and nothing is renamed across routes
/// (EXDEV, so `mv` copies), whatever the directory holds: both are answered before its
/// contents are judged, so neither depends on (or waits for) that walk.
#[test]
fn a_route_mount_point_stays_and_a_move_across_routes_is_a_copy() {
    let fx = Fixture::new(
        "[[rules]]\noperations = [\"read\", \"write\"]\npaths = [\"/host/proj/vault/**\"]\nmode = \"deny\"\n",
    );
    fs::create_dir_all(fx.host_root.join("proj/vault")).unwrap();
    fs::write(fx.host_root.join("proj/vault/key"), "KEY").unwrap();
    let refused = |from: &str, to: &str| fs::rename(fx.p(from), fx.p(to)).unwrap_err().raw_os_error();
    assert_eq!(refused("/host", "/host2"), Some(libc::EBUSY));
    assert_eq!(refused("/host/proj", "/mem/proj"), Some(libc::EXDEV));
    // Within the route, carrying the vault out from under its rule is what is refused.
    assert_eq!(refused("/host/proj", "/host/proj2"), Some(libc::EACCES));
    assert_eq!(fs::read_to_string(fx.host_root.join("proj/vault/key")).unwrap(), "KEY");
}

/// Moving a tree out of an allow rule's reach into the default allow changes no decision:
/// `mv` works, through the mount. Carrying a `.env` out from under that allow does change
/// one (allowed there, denied elsewhere) and is refused.
#[test]
fn a_tree_leaving_an_allow_rule_for_the_default_allow_moves() {
    let fx = Fixture::new(
        r#"
[[rules]]
operations = ["read"]
paths = ["/host/pub/**"]
mode = "allow"

[[rules]]
operations = ["read", "write"]
paths = ["/**/.env"]
mode = "deny"
"#,
    );
    fs::create_dir_all(fx.host_root.join("pub/d")).unwrap();
    fs::write(fx.host_root.join("pub/d/f"), "f").unwrap();
    let (code, _, err) = sh(&fx.mount.dir, "mv host/pub/d host/d && mv host/d host/pub/d");
    assert_eq!(code, 0, "{err}");
    assert_eq!(fs::read_to_string(fx.host_root.join("pub/d/f")).unwrap(), "f");
    fs::write(fx.host_root.join("pub/d/.env"), "SECRET").unwrap();
    let (code, _, err) = sh(&fx.mount.dir, "mv host/pub/d host/d");
    assert_ne!(code, 0);
    assert!(err.contains("Permission denied"), "{err}");
    assert_eq!(fs::read_to_string(fx.host_root.join("pub/d/.env")).unwrap(), "SECRET");
}

/// The daemon's own files (config, control socket, databases and their companions, the
/// audit log) lying inside a host route are absent from it at both doors: nothing can read
/// the rules, edit them away and reload, or write under SQLite's feet.
#[test]
fn the_daemons_own_files_are_absent_from_a_route_that_holds_them() {
    use crate::harness::{call_tool, scratch, sh_ok, Mount};
    let scratch = scratch();
    let root = scratch.path().join("project");
    let state = root.join("conf");
    fs::create_dir_all(&state).unwrap();
    fs::create_dir_all(root.join("secret")).unwrap();
    fs::write(root.join("secret/key"), "KEY").unwrap();
    fs::write(root.join("plain.txt"), "plain").unwrap();
    // The config, the socket, the databases and the audit log all live in the route.
    let cfg = crate::harness::config(
        &state,
        &root,
        "[[rules]]\noperations = [\"read\", \"write\"]\npaths = [\"/host/secret/**\"]\nmode = \"deny\"\n",
    );
    let before = fs::read_to_string(&cfg).unwrap();
    let mount = Mount::start(&cfg, &scratch.path().join("mnt"));
    let conf = mount.path("/host/conf");
    // Listing shows none of them (the directory itself stays, empty to the caller).
    assert_eq!(sh_ok(&conf, "ls -A; echo end"), "end\n");
    let (code, out, _) = sh(
        &conf,
        "export LC_ALL=C; cat agentvfs.toml 2>&1; { echo more >> agentvfs.toml; } 2>&1; rm -f store.db 2>&1; \
         ln -s x agentvfs.sock 2>&1; mkdir audit.db 2>&1; cd .. && mv conf moved 2>&1; echo rc=$?",
    );
    assert_eq!(code, 0);
    assert_eq!(
        out,
        "cat: agentvfs.toml: No such file or directory\n\
         sh: 1: cannot create agentvfs.toml: Permission denied\n\
         ln: failed to create symbolic link 'agentvfs.sock': Permission denied\n\
         mkdir: cannot create directory 'audit.db': Permission denied\n\
         mv: cannot move 'conf' to 'moved': Device or resource busy\nrc=1\n"
    );
    // The tool door: no read, no edit, no overwrite.
    let mut client = agentvfs::control::client::Client::connect(&state.join("agentvfs.sock")).unwrap();
    for (tool, args) in [
        ("read_file", serde_json::json!({"file_path": "/host/conf/agentvfs.toml"})),
        ("write_file", serde_json::json!({"file_path": "/host/conf/agentvfs.toml", "content": "x"})),
        ("ls", serde_json::json!({"path": "/host/conf"})),
        ("grep", serde_json::json!({"pattern": "rules", "path": "/host"})),
        ("glob", serde_json::json!({"pattern": "**/*.db", "path": "/host"})),
    ] {
        let (_, text) = call_tool(&mut client, tool, args);
        assert!(!text.contains("agentvfs.toml") || text.starts_with("Error"), "{tool}: {text}");
        assert!(!text.contains("store.db") && !text.contains("[[rules]]"), "{tool}: {text}");
    }
    assert_eq!(fs::read_to_string(&cfg).unwrap(), before, "the config is untouched");
    assert_eq!(sh(&mount.dir, "cat host/secret/key").0, 1);
    assert!(mount.log_text().contains("the config file"), "{}", mount.log_text());
    mount.stop();
}

/// A host route whose root holds the mountpoint leaves the mountpoint out: through it, each
/// lookup beneath would lead back into the mount, and a daemon thread would wait on itself
/// (with io_uring a `ls` one level down hung the daemon for good).
#[test]
fn a_host_route_holding_the_mountpoint_leaves_it_out() {
    use crate::harness::{sh_ok, Mount};
    let crate::harness::Unmounted { scratch, host_root: _, config: cfg } = crate::harness::unmounted("");
    let text = fs::read_to_string(&cfg).unwrap();
    // Requests by /dev/fuse threads: without the fix a lookup there recursed instead of hanging.
    let route =
        format!("[[routes]]\npath = \"/up\"\nbackend = \"host\"\nroot = \"{}\"\n", scratch.path().display());
    fs::write(&cfg, format!("{text}\n{route}\n[fuse]\nio_uring = false\n")).unwrap();
    fs::write(scratch.path().join("beside.txt"), "b").unwrap();
    let mount = Mount::start(&cfg, &scratch.path().join("mnt"));
    let up = mount.path("/up");
    assert_eq!(sh_ok(&up, "ls -A | grep -c -x -e mnt -e beside.txt"), "1\n");
    let (code, out, _) = sh(&up, "export LC_ALL=C; ls mnt 2>&1; mkdir mnt 2>&1; ls mnt/up 2>&1; echo rc=$?");
    assert_eq!(code, 0);
    assert_eq!(
        out,
        "ls: cannot access 'mnt': No such file or directory\n\
         mkdir: cannot create directory 'mnt': Permission denied\n\
         ls: cannot access 'mnt/up': No such file or directory\nrc=2\n"
    );
    assert!(mount.log_text().contains("the mountpoint"), "{}", mount.log_text());
    mount.stop();
}

/// Hidden means absent, in link counts too: a directory under a hiding rule does not count
/// its subdirectories (1, "not counted"), while one no hiding rule reaches keeps its count.
/// Nor does its size: on the memory route's tmpfs a directory grows by 20 bytes per name.
#[test]
fn a_directorys_size_does_not_tell_its_hidden_entries() {
    use std::os::unix::fs::MetadataExt;
    let fx = Fixture::new("");
    for dir in ["/mem/holds", "/mem/plain", "/mem/empty"] {
        fs::create_dir(fx.p(dir)).unwrap();
    }
    fs::write(fx.p("/mem/holds/.env"), "KEY").unwrap();
    fs::write(fx.p("/mem/plain/f"), "").unwrap();
    let shown = |dir: &str| {
        let m = fs::metadata(fx.p(dir)).unwrap();
        (m.size(), m.blocks(), m.nlink())
    };
    assert_eq!(shown("/mem/empty"), (40, 0, 2), "an empty tmpfs directory");
    assert_eq!(shown("/mem/holds"), (60, 0, 2), "20 bytes per name");
    // Now a rule hides the file: the directory reports nothing it could be counted from.
    let config = fx.config_path();
    let mut text = fs::read_to_string(&config).unwrap();
    text +=
        "[[rules]]\noperations = [\"read\", \"write\"]\npaths = [\"/mem/holds/**/.env\"]\nmode = \"deny\"\n";
    fs::write(&config, text).unwrap();
    let reload = std::process::Command::new(crate::harness::BIN)
        .args(["reload", "--socket"])
        .arg(fx.socket())
        .output()
        .unwrap();
    assert!(reload.status.success(), "{}", String::from_utf8_lossy(&reload.stderr));
    assert_eq!(sh(&fx.p("/mem/holds"), "ls -A").1, "");
    assert_eq!(shown("/mem/holds"), (0, 0, 1));
    // Where no rule can hide anything the store's figures stand.
    assert_eq!(shown("/mem/plain"), (60, 0, 2));
}

#[test]
fn a_directorys_link_count_does_not_tell_its_hidden_subdirectories() {
    use std::os::unix::fs::MetadataExt;
    let fx = Fixture::new(
        "[[rules]]\noperations = [\"read\"]\npaths = [\"/host/d/hidden*/**\"]\nmode = \"deny\"\n",
    );
    for dir in ["d/shown", "d/hidden1", "d/hidden2", "plain/x", "plain/y"] {
        fs::create_dir_all(fx.host_root.join(dir)).unwrap();
    }
    assert_eq!(fs::metadata(fx.host_root.join("d")).unwrap().nlink(), 5, "the host counts all three");
    assert_eq!(fs::metadata(fx.p("/host/d")).unwrap().nlink(), 1);
    let (_, listed, _) = sh(&fx.p("/host/d"), "ls -A");
    assert_eq!(listed, "shown\n");
    assert_eq!(fs::metadata(fx.p("/host/plain")).unwrap().nlink(), 4);
    assert_eq!(fs::metadata(fx.p("/host/d/shown")).unwrap().nlink(), 2, "no hiding rule reaches below it");
    // find, which reads link counts to skip work, still finds everything visible.
    assert_eq!(
        sh(&fx.p("/host"), "find . -type d | sort").1,
        ".\n./d\n./d/shown\n./plain\n./plain/x\n./plain/y\n"
    );
}

/// A rule may hide a directory without matching what it holds (`dir/`, or the exact name):
/// the mount cannot reach inside, since the kernel walks through the hidden name, and the
/// tools may not either. Nor does making a name there tell whether a hidden one exists.
#[test]
fn what_a_hidden_directory_holds_is_out_of_reach_of_both_doors() {
    use crate::harness::call_tool;
    use agentvfs::control::client::Client;
    let fx = Fixture::new(
        "[[rules]]\noperations = [\"read\"]\npaths = [\"/host/hdir/\", \"/host/exact\"]\nmode = \"deny\"\n",
    );
    for dir in ["hdir/sub", "exact/sub"] {
        fs::create_dir_all(fx.host_root.join(dir)).unwrap();
        fs::write(fx.host_root.join(dir).join("f"), "orig").unwrap();
    }
    let mut c = Client::connect(&fx.agent_socket()).unwrap();
    for dir in ["hdir", "exact"] {
        for (tool, args) in [
            ("write_file", json!({"file_path": format!("/host/{dir}/sub/f"), "content": "OVER"})),
            ("write_file", json!({"file_path": format!("/host/{dir}/sub/new"), "content": "NEW"})),
            (
                "edit_file",
                json!({"file_path": format!("/host/{dir}/sub/f"), "old_string": "orig", "new_string": "OVER"}),
            ),
            ("read_file", json!({"file_path": format!("/host/{dir}/sub/f")})),
        ] {
            let (ok, text) = call_tool(&mut c, tool, args.clone());
            assert!(!ok && !text.contains("orig"), "{tool} {args}: {text}");
        }
        let upload =
            c.call("vfs/upload", Some(json!({"path": format!("/host/{dir}/sub/up"), "content": "eA=="})));
        assert!(
            upload.as_ref().is_ok_and(|r| r.get("error_code").is_some()),
            "upload into /host/{dir}: {upload:?}"
        );
        assert_eq!(fs::read_to_string(fx.host_root.join(dir).join("sub/f")).unwrap(), "orig");
        assert!(!fx.host_root.join(dir).join("sub/new").exists());
        assert!(!fx.host_root.join(dir).join("sub/up").exists());
        let (code, _, err) = sh(&fx.mount.dir, &format!("echo OVER > host/{dir}/sub/f"));
        assert!(code != 0 && err.contains("nonexistent"), "{err}");
    }
    // Making a name where a hidden directory lives is refused as where none does.
    fs::remove_dir_all(fx.host_root.join("exact")).unwrap();
    let (_, with) = call_tool(&mut c, "write_file", json!({"file_path": "/host/hdir", "content": "x"}));
    let (_, without) = call_tool(&mut c, "write_file", json!({"file_path": "/host/exact", "content": "x"}));
    assert_eq!(with.replace("hdir", "NAME"), without.replace("exact", "NAME"));
    let (_, _, with) = sh(&fx.mount.dir, "echo x > host/hdir");
    let (_, _, without) = sh(&fx.mount.dir, "echo x > host/exact");
    assert_eq!(with.replace("hdir", "NAME"), without.replace("exact", "NAME"));
    assert!(with.contains("Permission denied"), "{with}");
}

/// The daemon's databases (the audit log, a sqlite route's store, their WAL files) are its
/// owner's alone: they hold what the rules hide from everyone else.
#[test]
fn the_daemons_databases_are_readable_by_their_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let fx = Fixture::new("");
    fs::write(fx.p("/db/f"), "stored").unwrap();
    crate::harness::soon("the stores have their WAL files", || {
        ["store.db-wal", "audit.db-wal"].iter().all(|f| fx.scratch.path().join(f).exists())
    });
    for name in ["audit.db", "audit.db-wal", "store.db", "store.db-wal"] {
        let mode = fs::metadata(fx.scratch.path().join(name)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{name}");
    }
}

/// Rename flags the daemon does not implement fully are refused, and nothing is left behind.
#[test]
fn rename_whiteout_is_refused() {
    let fx = Fixture::new("");
    for route in crate::harness::ROUTES {
        let (a, b) = (fx.p(route).join("a"), fx.p(route).join("b"));
        fs::write(&a, "x").unwrap();
        let c = |p: &std::path::Path| std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        let (ca, cb) = (c(&a), c(&b));
        const RENAME_WHITEOUT: libc::c_uint = 4;
        let rc = unsafe {
            libc::renameat2(libc::AT_FDCWD, ca.as_ptr(), libc::AT_FDCWD, cb.as_ptr(), RENAME_WHITEOUT)
        };
        let err = std::io::Error::last_os_error().raw_os_error();
        assert_eq!((rc, err), (-1, Some(libc::EINVAL)), "{route}");
        assert_eq!(fs::read_to_string(&a).unwrap(), "x", "{route}");
        assert!(!b.exists(), "{route}");
    }
    assert_eq!(sh(&fx.host_root, "ls -A").1, "a\n", "no whiteout device on the host");
}

/// `?` and classes in rules take one character, whatever its script: a deny rule spelled
/// `sec?et` or `[eé]tude` covers `sec€et` and `étude` through both doors (globset alone reads
/// them by bytes and missed both).
#[test]
fn wildcards_in_rules_match_characters_not_bytes() {
    use crate::harness::call_tool;
    use agentvfs::control::client::Client;
    let fx = Fixture::new(
        "[[rules]]\noperations = [\"read\", \"write\"]\npaths = [\"/host/sec?et/**\", \"/host/[eé]tude/**\"]\nmode = \"deny\"\n",
    );
    for dir in ["sec€et", "étude", "secret"] {
        fs::create_dir_all(fx.host_root.join(dir)).unwrap();
        fs::write(fx.host_root.join(dir).join("doc"), "SECRET").unwrap();
    }
    let mut c = Client::connect(&fx.agent_socket()).unwrap();
    for dir in ["sec€et", "étude", "secret"] {
        let err = fs::read_to_string(fx.p(&format!("/host/{dir}/doc"))).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{dir}");
        assert!(fs::write(fx.p(&format!("/host/{dir}/new")), "x").is_err(), "{dir}");
        let (ok, text) = call_tool(&mut c, "read_file", json!({"file_path": format!("/host/{dir}/doc")}));
        assert!(!ok && !text.contains("SECRET"), "{dir}: {text}");
    }
    let names: Vec<String> =
        fs::read_dir(fx.p("/host")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert!(names.is_empty(), "{names:?}");
}

/// A tool's temporary file (its write's new content, renamed over the file once written) is
/// the daemon's own: no door can list, open, write, link or make one, so what lands is what
/// was judged (and approved), and no one keeps a descriptor or a second name of it. The same
/// holds for one a crash left behind.
#[test]
fn a_tools_temporary_files_are_out_of_every_doors_reach() {
    let f = Fixture::new("");
    let leftover = ".a.txt.agentvfs-12-7.tmp";
    std::fs::write(f.host_root.join("a.txt"), "a\n").unwrap();
    std::fs::write(f.host_root.join(leftover), "left by a crash\n").unwrap();
    let names: Vec<String> = std::fs::read_dir(f.p("/host"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["a.txt"]);
    let at = f.p(&format!("/host/{leftover}"));
    assert_eq!(std::fs::metadata(&at).unwrap_err().raw_os_error(), Some(libc::ENOENT));
    assert_eq!(std::fs::File::open(&at).unwrap_err().raw_os_error(), Some(libc::ENOENT));
    let made = f.p("/host/.b.txt.agentvfs-99-1.tmp");
    assert_eq!(std::fs::write(&made, "x").unwrap_err().raw_os_error(), Some(libc::EACCES));
    assert_eq!(std::fs::hard_link(f.p("/host/a.txt"), &made).unwrap_err().raw_os_error(), Some(libc::EACCES));
    assert_eq!(std::fs::rename(f.p("/host/a.txt"), &made).unwrap_err().raw_os_error(), Some(libc::EACCES));
    assert!(!f.host_root.join(".b.txt.agentvfs-99-1.tmp").exists());
    // The tools alike.
    let mut c = Client::connect(&f.scratch.path().join("agentvfs-agent.sock")).unwrap();
    let (_, listed) = call_tool(&mut c, "ls", json!({"path": "/host"}));
    assert!(!listed.contains("agentvfs-"), "{listed}");
    let (ok, read) = call_tool(&mut c, "read_file", json!({"file_path": format!("/host/{leftover}")}));
    assert!(!ok && !read.contains("crash"), "{read}");
    let (ok, wrote) =
        call_tool(&mut c, "write_file", json!({"file_path": "/host/.c.agentvfs-1-1.tmp", "content": "x"}));
    assert!(!ok, "{wrote}");
    // A tool's own writes go on working through their temporaries.
    let (ok, text) = call_tool(&mut c, "write_file", json!({"file_path": "/host/a.txt", "content": "b\n"}));
    assert!(ok, "{text}");
    assert_eq!(std::fs::read_to_string(f.p("/host/a.txt")).unwrap(), "b\n");
    // A directory holding only leftovers is removed, as it shows nothing (else it would answer
    // ENOTEMPTY for good, on a database route with no host to clean it on).
    for (dir, by_tool) in [("d1", false), ("d2", true)] {
        std::fs::create_dir(f.host_root.join(dir)).unwrap();
        std::fs::write(f.host_root.join(dir).join(".x.agentvfs-5-5.tmp"), "left").unwrap();
        assert_eq!(std::fs::read_dir(f.p(&format!("/host/{dir}"))).unwrap().count(), 0);
        if by_tool {
            let (ok, text) = call_tool(&mut c, "delete", json!({"file_path": format!("/host/{dir}")}));
            assert!(ok, "{text}");
        } else {
            std::fs::remove_dir(f.p(&format!("/host/{dir}"))).unwrap();
        }
        assert!(!f.host_root.join(dir).exists(), "{dir}");
    }
    // Beside a visible entry, a leftover stays, and the directory is not empty.
    std::fs::create_dir(f.host_root.join("d3")).unwrap();
    std::fs::write(f.host_root.join("d3/.x.agentvfs-5-5.tmp"), "left").unwrap();
    std::fs::write(f.host_root.join("d3/kept"), "kept").unwrap();
    assert_eq!(std::fs::remove_dir(f.p("/host/d3")).unwrap_err().raw_os_error(), Some(libc::ENOTEMPTY));
    assert!(f.host_root.join("d3/.x.agentvfs-5-5.tmp").exists());
    let explained = crate::harness::sh_ok(
        f.scratch.path(),
        &format!(
            "{} explain --socket {} read /host/{leftover}",
            crate::harness::BIN,
            f.scratch.path().join("agentvfs.sock").display()
        ),
    );
    assert!(explained.contains("a tool's temporary file: the daemon's own"), "{explained}");
}
