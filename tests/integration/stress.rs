//! Concurrency: several shells writing, renaming and deleting at once, through the mount,
//! must leave the same tree as the same script run on a plain directory.

use std::path::Path;

use crate::harness::{sh, sh_ok, Fixture, ROUTES};

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
