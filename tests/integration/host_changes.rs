//! Changes made on the host, behind the daemon's back, show through the mount at once even
//! though the kernel may cache host-route names, attributes and listings for an hour.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::harness::Fixture;

/// Waits (up to 3 s, far below the hour the kernel may cache) for `check` to hold.
fn soon(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while !check() {
        assert!(Instant::now() < deadline, "not seen through the mount: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

#[test]
fn host_side_changes_reach_cached_names_attributes_and_listings() {
    // The host route caches for an hour here, whatever the default is.
    let fx = Fixture::with_config("", |text| {
        assert!(text.contains("backend = \"host\"\n"));
        text.replacen("backend = \"host\"\n", "backend = \"host\"\ncache_ttl_seconds = 3600\n", 1)
    });

    let host = fx.host_root.join("dir");
    let mnt = fx.p("/host/dir");
    fs::create_dir(&host).unwrap();
    fs::write(host.join("a.txt"), "one").unwrap();
    fs::write(host.join("gone.txt"), "x").unwrap();
    // Cache everything: the listing, the names, the attributes.
    for _ in 0..2 {
        assert_eq!(names(&mnt), ["a.txt", "gone.txt"]);
        assert_eq!(fs::metadata(mnt.join("a.txt")).unwrap().len(), 3);
    }

    fs::write(host.join("a.txt"), "one, two").unwrap();
    soon("a new size", || fs::metadata(mnt.join("a.txt")).unwrap().len() == 8);
    fs::set_permissions(host.join("a.txt"), fs::Permissions::from_mode(0o600)).unwrap();
    soon("a new mode", || fs::metadata(mnt.join("a.txt")).unwrap().permissions().mode() & 0o777 == 0o600);
    // A name the kernel was told is absent.
    assert!(!mnt.join("new.txt").exists() && !mnt.join("new.txt").exists());
    fs::write(host.join("new.txt"), "n").unwrap();
    soon("a new file", || mnt.join("new.txt").exists());
    soon("a new file in the listing", || names(&mnt).contains(&"new.txt".to_string()));
    fs::remove_file(host.join("gone.txt")).unwrap();
    soon("a removed file gone", || {
        !mnt.join("gone.txt").exists() && !names(&mnt).contains(&"gone.txt".into())
    });
    fs::rename(host.join("new.txt"), host.join("renamed.txt")).unwrap();
    soon("a rename", || names(&mnt) == ["a.txt", "renamed.txt"]);
    fs::rename(&host, fx.host_root.join("moved")).unwrap();
    soon("a moved directory", || !mnt.exists() && names(&fx.p("/host/moved")) == ["a.txt", "renamed.txt"]);
}

/// Two host routes on one filesystem: events under the second root reach its own route.
#[test]
fn a_second_host_route_on_the_same_filesystem_is_watched_too() {
    let fx = Fixture::with_config("", |text| {
        let root = text.split("root = \"").nth(1).unwrap().split('"').next().unwrap().to_string();
        let second = format!("{root}-second");
        fs::create_dir_all(&second).unwrap();
        format!("{text}\n[[routes]]\npath = \"/second\"\nbackend = \"host\"\nroot = \"{second}\"\ncache_ttl_seconds = 3600\n")
    });
    let host = fx.host_root.with_file_name("host-root-second");
    let mnt = fx.p("/second");
    fs::write(host.join("a.txt"), "one").unwrap();
    for _ in 0..2 {
        assert_eq!(names(&mnt), ["a.txt"]);
    }
    fs::write(host.join("b.txt"), "two").unwrap();
    soon("a new file under the second root", || names(&mnt) == ["a.txt", "b.txt"]);
}

/// Nested roots: one host file seen through two routes. A change through either view of the
/// mount, or on the host, reaches the other view's cached listing.
#[test]
fn nested_host_roots_see_each_others_changes() {
    let fx = Fixture::with_config("", |text| {
        let root = text.split("root = \"").nth(1).unwrap().split('"').next().unwrap().to_string();
        fs::create_dir_all(format!("{root}/sub")).unwrap();
        let text = text.replacen("backend = \"host\"\n", "backend = \"host\"\ncache_ttl_seconds = 3600\n", 1);
        format!("{text}\n[[routes]]\npath = \"/inner\"\nbackend = \"host\"\nroot = \"{root}/sub\"\ncache_ttl_seconds = 3600\n")
    });
    let (outer, inner) = (fx.p("/host/sub"), fx.p("/inner"));
    fs::write(fx.host_root.join("sub/a.txt"), "a").unwrap();
    for _ in 0..2 {
        assert_eq!(names(&outer), ["a.txt"]);
        assert_eq!(names(&inner), ["a.txt"]);
    }
    assert!(!inner.join("b.txt").exists() && !inner.join("b.txt").exists());
    fs::write(outer.join("b.txt"), "through the outer route").unwrap();
    soon("a file made through the outer route, in the inner one", || inner.join("b.txt").exists());
    soon("... and in its listing", || names(&inner) == ["a.txt", "b.txt"]);
    assert_eq!(fs::read_to_string(inner.join("b.txt")).unwrap(), "through the outer route");
    fs::remove_file(inner.join("a.txt")).unwrap();
    soon("a file removed through the inner route, in the outer one", || names(&outer) == ["b.txt"]);
    fs::write(fx.host_root.join("sub/c.txt"), "host").unwrap();
    soon("a host-made file, in both", || {
        names(&outer) == ["b.txt", "c.txt"] && names(&inner) == ["b.txt", "c.txt"]
    });
}

/// The names the kernel asked the daemon for since it started (`status` counts them).
fn fuse_lookups(fx: &Fixture) -> u64 {
    crate::harness::status(fx)["counters"]["fuse_lookups"].as_u64().unwrap()
}

/// What the caches save, counted: a missing name is asked for once, and a file written through
/// the mount keeps its cached name although the watcher hears of the write.
#[test]
fn cached_names_stay_cached() {
    let fx = Fixture::with_config("", |text| {
        text.replacen("backend = \"host\"\n", "backend = \"host\"\ncache_ttl_seconds = 3600\n", 1)
    });
    fs::create_dir(fx.p("/host/d")).unwrap();
    for dir in ["/host/d", "/mem"] {
        let missing = fx.p(&format!("{dir}/missing"));
        let before = fuse_lookups(&fx);
        for _ in 0..3 {
            assert!(!missing.exists());
        }
        assert_eq!(fuse_lookups(&fx) - before, 1, "{dir}: one lookup for three probes");
    }
    let written = fx.p("/host/d/written");
    fs::write(&written, "through the mount").unwrap();
    // Let the watcher see the write (it reads events every 5 ms).
    std::thread::sleep(Duration::from_millis(200));
    let before = fuse_lookups(&fx);
    assert_eq!(fs::metadata(&written).unwrap().len(), 17);
    assert_eq!(fuse_lookups(&fx) - before, 0, "the written file's name was invalidated");
}
