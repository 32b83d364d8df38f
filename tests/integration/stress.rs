//! Concurrency: several shells writing, renaming and deleting at once, through the mount,
//! must leave the same tree as the same script run on a plain directory; both doors at once
//! must agree with a model; opens racing replacements must never fail.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use agentvfs::control::client::Client;
use serde_json::json;

use crate::harness::{call_tool, sh, sh_ok, Fixture, ROUTES};

/// Each worker churns its own files and a shared directory; the final tree is deterministic.
const WORKER: &str = r#"
w=$1
mkdir -p shared "own$w"
i=0
while [ $i -lt 60 ]; do
  echo "w$w i$i" > "own$w/f$i"
  echo "more" >> "own$w/f$i"
  mv "own$w/f$i" "own$w/g$i"
  if [ $((i % 3)) -eq 0 ]; then rm "own$w/g$i"; fi
  mkdir -p "own$w/d$i" && echo x > "own$w/d$i/x"
  if [ $((i % 2)) -eq 0 ]; then rm -r "own$w/d$i"; fi
  echo "$w" > "shared/tmp.$w.$i" && mv "shared/tmp.$w.$i" "shared/from$w"
  i=$((i+1))
done
"#;

fn run_workers(dir: &Path) -> String {
    std::fs::write(dir.join("worker.sh"), WORKER).unwrap();
    let handles: Vec<_> = (0..6)
        .map(|w| {
            let dir = dir.to_path_buf();
            std::thread::spawn(move || sh(&dir, &format!("sh worker.sh {w}")))
        })
        .collect();
    for h in handles {
        let (code, _, err) = h.join().unwrap();
        assert_eq!(code, 0, "{err}");
    }
    sh_ok(dir, "rm worker.sh; find . | sort; cat shared/* own*/g* | sort | md5sum")
}

#[test]
fn parallel_shells_agree_with_a_plain_directory() {
    let reference_dir = tempfile::tempdir().unwrap();
    let expected = run_workers(reference_dir.path());
    let fx = Fixture::new("");
    for route in ROUTES {
        let dir = fx.p(route).join("stress");
        std::fs::create_dir(&dir).unwrap();
        assert_eq!(run_workers(&dir), expected, "{route}");
    }
}

/// What writer `id` writes as its version `n`: one line that says whose and which it is, with
/// a length that changes from version to version, so a torn or mixed read cannot pass.
fn version(id: &str, n: u32) -> String {
    let head = format!("{id} v{n} ");
    let len = 40 + (n as usize * 37) % 900;
    format!("{head}{}", "x".repeat(len - head.len()))
}

/// The version number of a whole version of `id`; panics on anything else.
fn version_of(id: &str, text: &str) -> u32 {
    let n = text.strip_prefix(&format!("{id} v")).and_then(|rest| rest.split(' ').next()?.parse().ok());
    match n {
        Some(n) if version(id, n) == text => n,
        _ => panic!("{id}: not a whole version: {text:?}"),
    }
}

/// Sets its flag when dropped: threads that loop until the flag is set then stop even when the
/// thread that would have set it panicked.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

const ROUNDS: u32 = 41;
const FILES: usize = 3;

/// Both doors at once, on every route. A tool writer and a writer making system calls each
/// replace their own files atomically (a tool write; a write, then a rename, through the
/// mount), and delete and recreate others, while a reader on each door reads every file. Each
/// read must find a whole version its writer wrote (a file being recreated may be missing),
/// never older than the one that reader saw last; at the end both doors read the model's last
/// version of every file, and no temporary file is left.
#[test]
fn both_doors_at_once_agree_with_a_model() {
    let fx = Fixture::new("");
    let socket = fx.scratch.path().join("agentvfs.sock");
    for route in ROUTES {
        std::fs::create_dir(fx.p(route).join("cross")).unwrap();
        let file = |name: &str| format!("{route}/cross/{name}");
        let names: Vec<String> =
            ["t", "d", "s", "e"].iter().flat_map(|w| (0..FILES).map(move |k| format!("{w}{k}"))).collect();
        // Files whose writer deletes and recreates them.
        let recreated = |name: &str| name.starts_with('d') || name.starts_with('e');
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            let writers = [
                s.spawn(|| {
                    let mut tools = Client::connect(&socket).unwrap();
                    for n in 1..=ROUNDS {
                        for k in 0..FILES {
                            for id in [format!("t{k}"), format!("d{k}")] {
                                let (ok, text) = if id.starts_with('d') && n % 4 == 0 {
                                    call_tool(&mut tools, "delete", json!({"file_path": file(&id)}))
                                } else {
                                    let args = json!({"file_path": file(&id), "content": version(&id, n)});
                                    call_tool(&mut tools, "write_file", args)
                                };
                                assert!(ok, "{route} {id} v{n}: {text}");
                            }
                        }
                    }
                }),
                s.spawn(|| {
                    for n in 1..=ROUNDS {
                        for k in 0..FILES {
                            for id in [format!("s{k}"), format!("e{k}")] {
                                let path = fx.p(&file(&id));
                                if id.starts_with('e') && n % 4 == 0 {
                                    std::fs::remove_file(&path).unwrap();
                                } else {
                                    let new = fx.p(&file(&format!(".{id}.new")));
                                    std::fs::write(&new, version(&id, n)).unwrap();
                                    std::fs::rename(&new, &path).unwrap();
                                }
                            }
                        }
                    }
                }),
            ];
            let readers = [
                s.spawn(|| {
                    let mut seen: HashMap<&str, u32> = HashMap::new();
                    let mut reads = 0;
                    while !done.load(Ordering::Relaxed) {
                        for name in &names {
                            match std::fs::read_to_string(fx.p(&file(name))) {
                                Ok(text) => {
                                    let n = version_of(name, &text);
                                    let last = seen.insert(name, n).unwrap_or(0);
                                    assert!(
                                        n >= last,
                                        "{route} {name} through the mount: v{n} after v{last}"
                                    );
                                    reads += 1;
                                }
                                Err(e) if e.kind() == std::io::ErrorKind::NotFound && recreated(name) => {}
                                // Not written yet.
                                Err(e)
                                    if e.kind() == std::io::ErrorKind::NotFound
                                        && !seen.contains_key(name.as_str()) => {}
                                Err(e) => panic!("{route} {name} through the mount: {e}"),
                            }
                        }
                    }
                    reads
                }),
                s.spawn(|| {
                    let mut tools = Client::connect(&socket).unwrap();
                    let mut seen: HashMap<&str, u32> = HashMap::new();
                    let mut reads = 0;
                    while !done.load(Ordering::Relaxed) {
                        for name in &names {
                            let (ok, text) =
                                call_tool(&mut tools, "read_file", json!({"file_path": file(name)}));
                            if !ok {
                                // Deleted before the tool looked, or between its look and its read.
                                let missing = text == format!("Error: File '{}' not found", file(name))
                                    || text == format!("Error: Error reading file '{0}': [Errno 2] No such file or directory: '{0}'", file(name));
                                assert!(
                                    missing && (recreated(name) || !seen.contains_key(name.as_str())),
                                    "{route} {name} by the tools: {text}"
                                );
                                continue;
                            }
                            let content = text
                                .strip_prefix("@@ lines 1-1 of 1 @@\n")
                                .unwrap_or_else(|| panic!("{text}"));
                            let n = version_of(name, content);
                            let last = seen.insert(name, n).unwrap_or(0);
                            assert!(n >= last, "{route} {name} by the tools: v{n} after v{last}");
                            reads += 1;
                        }
                    }
                    reads
                }),
            ];
            let stop = SetOnDrop(&done);
            for writer in writers {
                writer.join().unwrap();
            }
            drop(stop);
            for reader in readers {
                assert!(reader.join().unwrap() > 0, "{route}: a reader read nothing");
            }
        });
        // The model: every file at its writer's last version (41 is no deleting round).
        let mut tools = Client::connect(&socket).unwrap();
        for name in &names {
            let through_mount = std::fs::read_to_string(fx.p(&file(name))).unwrap();
            assert_eq!(version_of(name, &through_mount), ROUNDS, "{route} {name}");
            let (ok, text) = call_tool(&mut tools, "read_file", json!({"file_path": file(name)}));
            assert!(ok && text.ends_with(&through_mount), "{route} {name}: {text}");
        }
        let mut listed: Vec<String> = std::fs::read_dir(fx.p(&file("")))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        listed.sort();
        let mut expected = names.clone();
        expected.sort();
        assert_eq!(listed, expected, "{route}: no temporary file is left");
    }
}

/// Opens that race a rename over their name, or an unlink, get what they would get on a local
/// filesystem: the old file or the new one, and for a deleted name ENOENT, never ESTALE. A
/// name only ever replaced is never missing. One writer replaces, deletes and recreates files
/// through the mount, a tool client replaces one, and two more delete and recreate another, all
/// as fast as they can, while this thread opens and reads them.
#[test]
fn opens_racing_replacements_never_fail() {
    let fx = Fixture::new("");
    let socket = fx.scratch.path().join("agentvfs.sock");
    for route in ROUTES {
        let dir = fx.p(route).join("race");
        std::fs::create_dir(&dir).unwrap();
        for name in ["replaced", "recreated", "by-tools"] {
            std::fs::write(dir.join(name), "0").unwrap();
        }
        let names = ["replaced", "recreated", "deleted", "by-tools", "tool-recreated"];
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut n = 0;
                while !done.load(Ordering::Relaxed) {
                    n += 1;
                    for name in ["replaced", "recreated", "deleted"] {
                        if name == "recreated" && n % 4 == 0 {
                            std::fs::remove_file(dir.join(name)).unwrap();
                            continue;
                        }
                        std::fs::write(dir.join(".new"), n.to_string()).unwrap();
                        std::fs::rename(dir.join(".new"), dir.join(name)).unwrap();
                        if name == "deleted" {
                            std::fs::remove_file(dir.join(name)).unwrap();
                        }
                    }
                }
            });
            s.spawn(|| {
                let mut tools = Client::connect(&socket).unwrap();
                let mut n = 0;
                while !done.load(Ordering::Relaxed) {
                    n += 1;
                    let args =
                        json!({"file_path": format!("{route}/race/by-tools"), "content": n.to_string()});
                    assert!(call_tool(&mut tools, "write_file", args).0);
                }
            });
            // Deleted and recreated behind the kernel's back by two clients at once, so that a
            // reader's open and the kernel's one retry of it can both meet a file the tools
            // just deleted.
            for phase in 0..2 {
                let socket = &socket;
                let done = &done;
                s.spawn(move || {
                    let mut tools = Client::connect(socket).unwrap();
                    let path = format!("{route}/race/tool-recreated");
                    let mut n = phase;
                    while !done.load(Ordering::Relaxed) {
                        n += 1;
                        let (ok, text) = match n % 2 {
                            0 => call_tool(&mut tools, "delete", json!({"file_path": path})),
                            _ => call_tool(
                                &mut tools,
                                "write_file",
                                json!({"file_path": path, "content": n.to_string()}),
                            ),
                        };
                        // What the other client did meanwhile: deleted it, or wrote it since
                        // this one last did.
                        let raced = [
                            format!("Error: '{path}' not found"),
                            format!(
                                "Error: '{path}' changed since it was read; re-read the file, then retry"
                            ),
                        ];
                        assert!(ok || raced.contains(&text), "{text}");
                    }
                });
            }
            let _stop = SetOnDrop(&done);
            let mut missing = 0;
            // Bounded in time too: a slow route (pg) still races for long enough, and the suite
            // stays quick.
            let started = std::time::Instant::now();
            for i in 0..12_000 {
                if i % 100 == 0 && started.elapsed() > std::time::Duration::from_secs(10) {
                    break;
                }
                let name = names[i % names.len()];
                match std::fs::read_to_string(dir.join(name)) {
                    Ok(text) => assert!(text.parse::<u32>().is_ok(), "{route} {name}: {text:?}"),
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) && name == "recreated" => missing += 1,
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) && name == "deleted" => {}
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) && name == "tool-recreated" => {}
                    Err(e) => panic!("{route} {name}, read {i}: {e}"),
                }
            }
            assert!(missing < 2_000, "{route}: the writer deletes one round in four");
        });
    }
}
