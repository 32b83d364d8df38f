//! Escape attempts on the host route: nothing outside the root, or hidden by a rule, is
//! reached through `..`, symlinks (absolute, relative, swapped in mid-call) or hard links.

use std::fs;
use std::os::unix::fs::symlink;

use crate::harness::{sh, Fixture};

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
