//! POSIX conformance with pjdfstest (installed by scripts/setup.sh) on every route, against a
//! plain directory on the same machine in the same run.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::{scratch, Fixture};

const CONFIG: &str = r#"
[features]
posix_fallocate = {}
utime_now = {}
utimensat = {}
rename_ctime = {}

[settings]
naptime = 0.1
allow_remount = false

[dummy_auth]
entries = [["nobody", "nogroup"], ["daemon", "daemon"]]
"#;

/// Failures accepted per route, each explained in doc/conformance.md.
const KNOWN_HOST: &[&str] = &[];
const KNOWN_MEMORY: &[&str] = &[];
const KNOWN_SQLITE: &[&str] = &[];
const KNOWN_POSTGRES: &[&str] = &[];
/// Tests pjdfstest skips on any FUSE mount (it cannot learn LINK_MAX there).
const KNOWN_SKIPS: &[&str] = &["link::link_count_max"];

fn pjdfstest() -> PathBuf {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let local = Path::new(&home).join(".cargo/bin/pjdfstest");
    if local.exists() {
        return local;
    }
    let found = Command::new("sh").args(["-c", "command -v pjdfstest"]).output().unwrap();
    assert!(found.status.success(), "pjdfstest is not installed: run scripts/setup.sh");
    PathBuf::from(String::from_utf8_lossy(&found.stdout).trim())
}

struct Outcome {
    passed: usize,
    failed: BTreeSet<String>,
    skipped: BTreeSet<String>,
    summary: String,
}

/// Runs the suite in `dir` (from a cwd outside the mount) and parses its report.
fn run(dir: &Path, work: &Path) -> Outcome {
    let conf = work.join("pjdfstest.toml");
    std::fs::write(&conf, CONFIG).unwrap();
    let out =
        Command::new(pjdfstest()).arg("-c").arg(&conf).arg("-p").arg(dir).current_dir(work).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let summary =
        text.lines().find(|l| l.starts_with("Summary:")).unwrap_or_else(|| panic!("no summary:\n{text}"));
    let passed = summary
        .split(',')
        .find_map(|part| part.trim().strip_suffix(" passed").map(|n| n.trim().parse::<usize>().unwrap()))
        .unwrap();
    let named = |status: &str| -> BTreeSet<String> {
        text.lines()
            .filter(|l| l.trim_end().ends_with(status))
            .map(|l| l.split_whitespace().next().unwrap().to_string())
            .collect()
    };
    Outcome { passed, failed: named("FAILED"), skipped: named("skipped"), summary: summary.to_string() }
}

fn check_route(route: &str, known: &[&str], extra_config: &str) {
    let work = scratch();
    let baseline_dir = work.path().join("plain");
    std::fs::create_dir(&baseline_dir).unwrap();
    let baseline = run(&baseline_dir, work.path());
    let fx = Fixture::new(extra_config);
    let outcome = run(&fx.p(route), work.path());
    let unexpected: Vec<&String> = outcome
        .failed
        .iter()
        .filter(|t| !baseline.failed.contains(*t) && !known.contains(&t.as_str()))
        .collect();
    assert!(
        unexpected.is_empty(),
        "{route}: unexpected failures {unexpected:?}\nmount: {}\nplain directory: {}",
        outcome.summary,
        baseline.summary
    );
    let extra_skips: Vec<&String> = outcome
        .skipped
        .iter()
        .filter(|t| !baseline.skipped.contains(*t) && !KNOWN_SKIPS.contains(&t.as_str()))
        .collect();
    assert!(extra_skips.is_empty(), "{route}: unexpected skips {extra_skips:?}");
    assert!(
        outcome.passed + known.len() + KNOWN_SKIPS.len() >= baseline.passed,
        "{route}: {} vs plain {}",
        outcome.summary,
        baseline.summary
    );
}

#[test]
fn pjdfstest_host_route() {
    check_route("/host", KNOWN_HOST, "");
}

#[test]
fn pjdfstest_memory_route() {
    check_route("/mem", KNOWN_MEMORY, "");
}

/// The memory route's other store: the tree in the daemon's own memory.
#[test]
fn pjdfstest_memory_route_in_the_daemon() {
    let route = "[[routes]]\npath = \"/memd\"\nbackend = \"memory\"\nstore = \"daemon\"\n";
    check_route("/memd", KNOWN_MEMORY, route);
}

#[test]
fn pjdfstest_sqlite_route() {
    check_route("/db", KNOWN_SQLITE, "");
}

/// The postgres route, on the tests' private server.
#[test]
fn pjdfstest_postgres_route() {
    check_route("/pg", KNOWN_POSTGRES, "");
}
