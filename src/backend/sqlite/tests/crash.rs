//! A `kill -9` in the middle of random work: the store then holds the tree exactly as it was
//! after some operation (changes are committed whole, in order), and no earlier than the last
//! point that made things durable (a file's close, `fsyncdir`, a tool's `commit_pending`).

use std::io::BufRead;
use std::time::Duration;

use super::durability::{check_consistency, XorShift};
use super::*;

const SEED: &str = "AGENTVFS_SQLITE_CRASH_SEED";
const DB: &str = "AGENTVFS_SQLITE_CRASH_STORE";
/// Operations a child makes at most (it is killed long before).
const OPS: usize = 100_000;

const NAMES: [&str; 8] = ["a", "b", "c", "d", "d/a", "d/b", "e", "e/a"];

/// Operation `rng` picks next on backend `b`; true when it made everything before it durable.
/// The same seed makes the same operations, whatever their timing.
fn step(b: &SqliteBackend, rng: &mut XorShift) -> bool {
    let mut pick = || NAMES[rng.below(NAMES.len() as u64) as usize];
    let (p, q) = (pick(), pick());
    let n = rng.below(100);
    match n {
        0..=14 => drop(b.mkdir(p, 0o755, &ME)),
        15..=22 => drop(b.rmdir(p)),
        23..=37 => {
            // A file written and closed: its close commits.
            let opened = b.open(p, libc::O_RDWR).or_else(|_| b.create(p, 0o644, 0, &ME).map(|(_, f)| f));
            let Ok(f) = opened else { return false };
            let ok = f.setattr(&SetAttr { size: Some(0), ..Default::default() }).is_ok()
                && f.write(0, &pattern(1 + n as usize * 37, n as u8)).is_ok();
            return f.flush().is_ok() && ok;
        }
        38..=52 => drop(b.unlink(p)),
        53..=70 => drop(b.rename(p, q, 0)),
        71..=78 => drop(b.setattr(p, &SetAttr { mode: Some(0o600 + n as u32), ..Default::default() })),
        79..=84 => drop(b.link(p, q)),
        85..=88 => drop(b.symlink(p, q.as_bytes(), &ME)),
        89..=91 => return b.commit_pending().is_ok(),
        92..=93 => return b.fsyncdir("").is_ok(),
        _ => thread::sleep(Duration::from_millis(n - 90)),
    }
    false
}

/// The tree of `b`: every path with its kind, mode, link count and content.
fn snapshot(b: &SqliteBackend) -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs = vec![String::new()];
    while let Some(dir) = dirs.pop() {
        for e in b.readdir(&dir).unwrap() {
            let path = if dir.is_empty() { e.name.clone() } else { format!("{dir}/{}", e.name) };
            let a = b.getattr(&path).unwrap();
            let body = match a.kind {
                crate::backend::FileKind::Dir => {
                    dirs.push(path.clone());
                    String::new()
                }
                crate::backend::FileKind::Symlink => {
                    String::from_utf8_lossy(&b.readlink(&path).unwrap()).into()
                }
                _ => format!("{:x}", md5_like(&get(b, &path))),
            };
            out.push(format!("{path} {:?} {:o} {} {body}", a.kind, a.perm, a.nlink));
        }
    }
    out.sort();
    out
}

/// A cheap checksum of file content (FNV-1a).
fn md5_like(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// The child: makes operations until it is killed, printing each one's number once it returned
/// ("op N", or "durable N" when it made everything before it durable).
#[test]
#[ignore = "run by a_kill_9_keeps_a_whole_prefix_of_the_operations in a child process"]
fn crash_worker() {
    let (Some(db), Some(seed)) = (std::env::var_os(DB), std::env::var(SEED).ok()) else { return };
    let b = SqliteBackend::open(Path::new(&db), "ns").unwrap();
    let mut rng = XorShift(seed.parse().unwrap());
    for i in 1..=OPS {
        let durable = step(&b, &mut rng);
        println!("{} {i}", if durable { "durable" } else { "op" });
    }
}

#[test]
fn a_kill_9_keeps_a_whole_prefix_of_the_operations() {
    for round in 0..6u64 {
        let seed = 0x2545_F491_4F6C_DD1D ^ (round * 0x9E37_79B9);
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("crash.db");
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "backend::sqlite::tests::crash::crash_worker", "--ignored", "--nocapture"])
            .env(DB, &db)
            .env(SEED, seed.to_string())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines().map_while(Result::ok);
        let kill_after = 40 + (seed % 160) as usize;
        let (mut done, mut durable) = (0, 0);
        for line in lines.by_ref() {
            let Some((kind, n)) = line.split_once(' ') else { continue };
            let Ok(n) = n.parse::<usize>() else { continue };
            done = n;
            if kind == "durable" {
                durable = n;
            }
            if n >= kill_after {
                break;
            }
        }
        child.kill().unwrap(); // SIGKILL, while it goes on
        for line in lines {
            if let Some(n) = line.strip_prefix("durable ").and_then(|n| n.parse().ok()) {
                durable = n;
            }
            if let Some(n) = line.split_once(' ').and_then(|(_, n)| n.parse().ok()) {
                done = n;
            }
        }
        child.wait().unwrap();
        assert!(done >= kill_after, "round {round}: the child stopped after {done} operations");

        // The same operations, replayed on a store nobody kills: the tree after each.
        let (_d2, _db2, model) = setup();
        let mut rng = XorShift(seed);
        let mut trees = vec![snapshot(&model)];
        for _ in 0..done + 1 {
            step(&model, &mut rng);
            trees.push(snapshot(&model));
        }
        let b = SqliteBackend::open(&db, "ns").unwrap();
        let found = snapshot(&b);
        let kept = (durable..trees.len()).find(|&k| trees[k] == found);
        assert!(
            kept.is_some(),
            "round {round} (seed {seed}): the store holds no tree between operation {durable} (the \
             last durable point) and {}, the last begun (earlier: {:?}):\n{found:#?}",
            done + 1,
            trees.iter().rposition(|t| *t == found)
        );
        drop(b);
        check_consistency(&db);
    }
}
