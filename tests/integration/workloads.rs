//! What developers do in a checkout, through the mount: git, tar, cargo, editors, rm -rf.

use std::fs;

use crate::harness::{sh_ok, Fixture, ROUTES};

#[test]
fn git_init_add_commit_status() {
    let fx = Fixture::new("");
    for route in ROUTES {
        let dir = fx.p(route).join("repo");
        fs::create_dir(&dir).unwrap();
        let out = sh_ok(
            &dir,
            "git init -q . && mkdir -p src && for i in $(seq 1 50); do echo \"line $i\" > src/f$i.txt; done \
             && git add -A && git -c user.name=t -c user.email=t@t commit -qm init && echo change >> src/f1.txt \
             && git status --porcelain && git log --oneline | wc -l && git fsck --no-progress >/dev/null 2>&1 && echo fsck-ok",
        );
        assert_eq!(out, " M src/f1.txt\n1\nfsck-ok\n", "{route}");
    }
}

#[test]
fn untar_a_source_tree_and_remove_it() {
    let fx = Fixture::new("");
    // A source tree built on the host: 400 files in nested directories, with symlinks.
    let src = fx.scratch.path().join("src-tree");
    for d in 0..20 {
        fs::create_dir_all(src.join(format!("pkg{d}/sub"))).unwrap();
        for f in 0..20 {
            fs::write(src.join(format!("pkg{d}/sub/file{f}.rs")), format!("// {d} {f}\n").repeat(50))
                .unwrap();
        }
        std::os::unix::fs::symlink("sub/file0.rs", src.join(format!("pkg{d}/link.rs"))).unwrap();
    }
    let tarball = fx.scratch.path().join("tree.tar");
    sh_ok(fx.scratch.path(), &format!("tar -C {} -cf {} .", src.display(), tarball.display()));
    let expected = sh_ok(&src, "find . | sort | wc -l; cat $(find . -type f | sort) | md5sum");
    for route in ROUTES {
        let dir = fx.p(route).join("untar");
        fs::create_dir(&dir).unwrap();
        sh_ok(&dir, &format!("tar -xf {}", tarball.display()));
        assert_eq!(
            sh_ok(&dir, "find . | sort | wc -l; cat $(find . -type f | sort) | md5sum"),
            expected,
            "{route}"
        );
        sh_ok(fx.p(route).as_path(), "rm -rf untar");
        assert!(!dir.exists(), "{route}");
    }
}

#[test]
fn editor_save_via_temp_and_rename() {
    let fx = Fixture::new("");
    for route in ROUTES {
        let f = fx.p(route).join("notes.txt");
        fs::write(&f, "v1\n").unwrap();
        // What vim and most editors do: write a temp file, fsync, rename over the original.
        let out = sh_ok(
            &fx.p(route),
            "printf 'v2\\n' > .notes.txt.swp && sync .notes.txt.swp && mv .notes.txt.swp notes.txt && cat notes.txt && ls -a",
        );
        assert_eq!(out, "v2\n.\n..\nnotes.txt\n", "{route}");
    }
}

#[test]
fn cargo_new_and_build() {
    let fx = Fixture::new("");
    let dir = fx.p("/host");
    let out = sh_ok(
        &dir,
        "export CARGO_TARGET_DIR=$PWD/target; cargo new -q --vcs none hello && cd hello && cargo build -q --offline 2>&1 && ./../target/debug/hello",
    );
    assert_eq!(out, "Hello, world!\n");
}
