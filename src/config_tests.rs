//! The config's `[exec]`, `[tools]` and `[fuse]` keys: defaults, values, who `execute` runs as,
//! and errors that name their line.

use super::*;
use crate::exec::identity::Identity;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse_str(text, "t.toml", Path::new("/"))
}

#[test]
fn exec_defaults_and_keys() {
    let c = parse("").unwrap().exec;
    assert!(!c.enabled && !c.network);
    assert_eq!((c.timeout.as_secs(), c.max_timeout.as_secs(), c.max_output_bytes), (120, 3600, 100_000));
    assert_eq!(c.cwd.as_str(), "/");
    // No host route: the sudo user's, if the tests run under sudo, else nobody's.
    assert_eq!(c.identity, Identity::resolve(None, None, crate::exec::identity::sudo_from_env(), None));
    let with_workspace = "[[routes]]\npath = \"/workspace\"\nbackend = \"memory\"\n";
    assert_eq!(parse(with_workspace).unwrap().exec.cwd.as_str(), "/workspace");
    let c = parse("[exec]\nenabled = true\ntimeout_seconds = 5\nmax_timeout_seconds = 10\nmax_output_bytes = 7\nnetwork = true\ncwd = \"/w/x\"\nuid = 1000\ngid = 100\n")
        .unwrap()
        .exec;
    assert!(c.enabled && c.network);
    assert_eq!((c.timeout.as_secs(), c.max_timeout.as_secs(), c.max_output_bytes), (5, 10, 7));
    assert_eq!((c.identity.uid, c.identity.gid, c.cwd.as_str()), (1000, 100, "/w/x"));
    assert_eq!(c.identity.to_string(), "uid 1000, gid 100 ([exec] uid/gid)");
}

#[test]
fn exec_identity_defaults_to_the_workspace_owner_and_is_never_root() {
    use std::os::unix::fs::MetadataExt;
    let dir = std::env::temp_dir();
    let text = format!("[[routes]]\npath = \"/workspace\"\nbackend = \"host\"\nroot = {dir:?}\n");
    let owner = std::fs::metadata(&dir).unwrap();
    let want = Identity::resolve(
        None,
        None,
        crate::exec::identity::sudo_from_env(),
        Some((&VPath::parse("/workspace").unwrap(), owner.uid(), owner.gid())),
    );
    assert_eq!(parse(&text).unwrap().exec.identity, want);
    assert_ne!(want.uid, 0);
    let e = parse("[exec]\nenabled = true\n\nuid = 0\n").unwrap_err();
    assert_eq!(e.line, Some(4));
    assert!(e.message.starts_with("[exec] uid = 0 would run commands as root"), "{e}");
    let e = parse("[exec]\ngid = 0\n").unwrap_err();
    assert!(e.message.starts_with("[exec] gid = 0 would run commands as root"), "{e}");
}

#[test]
fn exec_errors_name_the_line() {
    let e = parse("\n[exec]\ntimeout_seconds = 0\n").unwrap_err();
    assert_eq!((e.line, e.message.as_str()), (Some(2), "[exec] timeout_seconds must be positive"));
    let e = parse("[exec]\ntimeout_seconds = 10\nmax_timeout_seconds = 5\n").unwrap_err();
    assert!(e.message.contains("exceeds max_timeout_seconds (5)"), "{e}");
    let e = parse("[exec]\ncwd = \"/..\"\n").unwrap_err();
    assert_eq!(e.line, Some(2));
    let e = parse("[exec]\nshell = \"bash\"\n").unwrap_err();
    assert!(e.message.contains("unknown field `shell`"), "{e}");
}

#[test]
fn tools_keys_are_checked() {
    assert_eq!(parse("").unwrap().observation, Observation::Strict);
    assert_eq!(parse("[tools]\nobservation = \"off\"\n").unwrap().observation, Observation::Off);
    let e = parse("[tools]\n\nobservation = \"loose\"\n").unwrap_err();
    assert_eq!(
        (e.line, e.message.as_str()),
        (Some(3), "[tools] observation = \"loose\": expected \"strict\" or \"off\"")
    );
    let e = parse("[tools]\nobservaton = \"off\"\n").unwrap_err();
    assert!(e.message.contains("unknown field `observaton`"), "{e}");
    assert_eq!(e.line, Some(2));
}

#[test]
fn cached_reads_max_kb_defaults_to_one_request_and_has_a_ceiling() {
    assert_eq!(parse("").unwrap().cached_reads_max, 1 << 20);
    assert_eq!(parse("[fuse]\ncached_reads_max_kb = 0\n").unwrap().cached_reads_max, 0);
    assert_eq!(parse("[fuse]\ncached_reads_max_kb = 64\n").unwrap().cached_reads_max, 64 << 10);
    let e = parse("[fuse]\n\ncached_reads_max_kb = 16385\n").unwrap_err();
    assert_eq!(e.line, Some(3));
    assert!(e.message.contains("cached_reads_max_kb = 16385 is too large: at most 16384"), "{e}");
}

#[test]
fn io_uring_spin_us_defaults_to_fifty_and_has_a_ceiling() {
    use std::time::Duration;
    assert_eq!(parse("").unwrap().io_uring_spin, Duration::from_micros(50));
    assert_eq!(parse("[fuse]\nio_uring_spin_us = 0\n").unwrap().io_uring_spin, Duration::ZERO);
    let e = parse("[fuse]\nio_uring_spin_us = 1001\n").unwrap_err();
    assert_eq!(e.line, Some(2));
    assert!(e.message.contains("io_uring_spin_us = 1001 is too large: at most 1000"), "{e}");
    let e = parse("[fuse]\nio_uring_spin_us = -1\n").unwrap_err();
    assert_eq!(e.line, Some(2), "{e}");
}
