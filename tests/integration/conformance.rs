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
const KNOWN_HOST: &[&str] = &["rename::write_access_required_subdir"];
const KNOWN_MEMORY: &[&str] = &[];
const KNOWN_SQLITE: &[&str] = &[];

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
    let failed = text
        .lines()
        .filter(|l| l.trim_end().ends_with("FAILED"))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    Outcome { passed, failed, summary: summary.to_string() }
}

fn check_route(route: &str, known: &[&str]) {
    let work = scratch();
    let baseline_dir = work.path().join("plain");
    std::fs::create_dir(&baseline_dir).unwrap();
    let baseline = run(&baseline_dir, work.path());
    let fx = Fixture::new("");
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
    assert!(
        outcome.passed + known.len() >= baseline.passed,
        "{route}: {} vs plain {}",
        outcome.summary,
        baseline.summary
    );
}

#[test]
fn pjdfstest_host_route() {
    check_route("/host", KNOWN_HOST);
}

#[test]
fn pjdfstest_memory_route() {
    check_route("/mem", KNOWN_MEMORY);
}

#[test]
fn pjdfstest_sqlite_route() {
    check_route("/db", KNOWN_SQLITE);
}
