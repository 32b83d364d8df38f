//! `agentvfs run`'s home and what steers it: a home another agent user could have planted, or
//! could swap for one of their making, is refused; under sudo root makes only a home root
//! chose; a config the program could change steers nothing; nesting and a socket that never
//! answers are told clearly. A second agent user is uid 61001 (no user database entry), in
//! `[control] agents` through its group, nogroup.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::run::{cli, Setup, SUDO_NOBODY};

/// The other agent user (execute's, when `[exec]` is on).
const AGENT: u32 = 61001;

/// A daemon both nobody and [`AGENT`] may run agents on; with `exec`, `[exec]` is on as
/// AGENT, so the roots of the memory and sqlite routes (the tree's `/` among them) are AGENT's.
fn shared(exec: bool) -> Setup {
    Setup::edited(move |text| {
        let text = text.replace("agents = [\"nobody\"]", "agents = [\"nobody\", \"group:nogroup\"]");
        match exec {
            true => text
                .replace("[exec]\ncwd", &format!("[exec]\nenabled = true\nuid = {AGENT}\ngid = 65534\ncwd")),
            false => text,
        }
    })
}

/// `agentvfs run --config CONFIG -- ARGV` as `uid` (gid nogroup, no sudo): (exit code, stdout,
/// stderr).
fn run_as(s: &Setup, uid: u32, config: &Path, argv: &[&str]) -> (i32, String, String) {
    let out = Command::new("setpriv")
        .args([&format!("--reuid={uid}"), "--regid=65534", "--clear-groups"])
        .arg(&s.bin)
        .arg("run")
        .arg("--config")
        .arg(config)
        .arg("--")
        .args(argv)
        .env_remove("SUDO_UID")
        .env_remove("SUDO_GID")
        .env_remove("AGENTVFS_SOCKET")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

/// `agentvfs run --config CONFIG -- ARGV` through sudo from nobody's shell.
fn sudo_run(config: &Path, argv: &[&str]) -> (i32, String, String) {
    let mut args = vec!["run", "--config", config.to_str().unwrap(), "--"];
    args.extend_from_slice(argv);
    cli(&args, &SUDO_NOBODY)
}

/// (owner, mode bits) of `path`.
fn owner_mode(path: &Path) -> (u32, u32) {
    let meta = std::fs::symlink_metadata(path).unwrap();
    (meta.uid(), meta.mode() & 0o7777)
}

/// What `run` says of a directory above the home that another user owns (`at`, at `host`).
fn owned_above(home: &str, at: &str, host: &Path, owner: u32) -> String {
    format!(
        "HOME {home}: {at}, above it, belongs to uid {owner} (mode 0755), so its owner could rename what is in it \
         and put a home of their own making in its place. agentvfs run uses a home only when it and every \
         directory above it in the tree belong to root or to this user (uid 65534 (nobody)) and no one else may \
         write them (a sticky directory of root's above the home aside, as /tmp). Give it to root (`sudo chown \
         root: {}`), or set [run] home elsewhere",
        host.display()
    )
}

/// With `[exec]` on, the tree's `/` is execute's user's (AGENT), who could rename `/home` and
/// plant a `.bashrc` for nobody: nobody's home is refused until root has `/` and `/home`, and
/// a home AGENT made for nobody is refused; once all is root's, AGENT cannot swap it.
#[test]
fn a_home_another_agent_user_could_swap_is_refused() {
    let s = shared(true);
    let mnt = s.f.scratch.path().join("mnt");
    assert_eq!(owner_mode(&mnt), (AGENT, 0o755));
    // AGENT's own first run, without sudo: `/` is its, so it makes /home, which is its too.
    let (code, out, err) = run_as(&s, AGENT, &s.config, &["sh", "-c", "echo $HOME"]);
    assert_eq!((code, out.as_str()), (0, "/home/61001\n"), "{err}");
    assert_eq!(owner_mode(&mnt.join("home")), (AGENT, 0o755));

    // nobody's first run: `/` is AGENT's, who could rename /home and its home with it.
    let (code, _, err) = sudo_run(&s.config, &["true"]);
    assert_eq!(code, 1, "{err}");
    let root = owned_above("/home/nobody", "the tree's root /", &mnt, AGENT);
    assert_eq!(err, format!("agentvfs: {root}\n"));
    assert!(!mnt.join("home/nobody").exists());

    // AGENT plants a home for nobody, from inside its own run.
    let plant = "mkdir /home/nobody && echo 'echo PLANTED' > /home/nobody/.bashrc && echo planted";
    let (code, out, err) = run_as(&s, AGENT, &s.config, &["sh", "-c", plant]);
    assert_eq!((code, out.as_str()), (0, "planted\n"), "{err}");
    // Root takes `/` back: /home, AGENT's, is next; then the home, which AGENT made.
    std::os::unix::fs::chown(&mnt, Some(0), Some(0)).unwrap();
    let (code, out, err) = sudo_run(&s.config, &["bash", "-i", "-c", "id -u"]);
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert!(err.contains(&owned_above("/home/nobody", "/home", &mnt.join("home"), AGENT)), "{err}");
    std::os::unix::fs::chown(mnt.join("home"), Some(0), Some(0)).unwrap();
    let (code, out, err) = sudo_run(&s.config, &["bash", "-i", "-c", "id -u"]);
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    let planted = format!("HOME /home/nobody: the home itself belongs to uid {AGENT} (mode 0");
    assert!(err.contains(&planted), "{err}");
    assert!(err.contains("so its owner may have put files in it (start-up files such as .bashrc"), "{err}");
    let home = mnt.join("home/nobody");
    let advice = format!("Move it away as root (`sudo mv {} {}.untrusted`)", home.display(), home.display());
    assert!(err.contains(&advice), "{err}");

    // Moved away as advised, a fresh home is made, and nothing of AGENT's runs.
    std::fs::rename(&home, mnt.join("home/nobody.untrusted")).unwrap();
    let (code, out, err) = sudo_run(&s.config, &["bash", "-i", "-c", "id -u"]);
    assert_eq!((code, out.as_str()), (0, "65534\n"), "{err}");
    assert_eq!(owner_mode(&home), (65534, 0o700));
    // AGENT cannot swap it now (/ and /home are root's), and its own home still serves it.
    let swap = "mv /home/nobody /home/nobody.old; echo rc=$?";
    let (code, out, err) = run_as(&s, AGENT, &s.config, &["sh", "-c", swap]);
    assert_eq!((code, out.as_str()), (0, "rc=1\n"), "{err}");
    assert!(err.contains("Permission denied"), "{err}");
    assert_eq!(owner_mode(&home), (65534, 0o700));
}

/// A home another user made before the user's first run is refused; above the home, a sticky
/// directory of root's (as /tmp) is fine, one anyone or its group may write is not.
#[test]
fn a_home_planted_before_the_first_run_or_under_a_writable_directory_is_refused() {
    let s = shared(false);
    let mnt = s.f.scratch.path().join("mnt");
    std::fs::create_dir(mnt.join("home")).unwrap();
    std::fs::set_permissions(mnt.join("home"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    assert_eq!(owner_mode(&mnt.join("home")), (0, 0o1777));
    let plant = "mkdir /home/nobody && echo 'echo PLANTED' > /home/nobody/.bashrc && echo $HOME";
    let (code, out, err) = run_as(&s, AGENT, &s.config, &["sh", "-c", plant]);
    assert_eq!((code, out.as_str()), (0, "/home/61001\n"), "{err}");
    assert_eq!(owner_mode(&mnt.join("home/61001")), (AGENT, 0o700));

    let (code, out, err) = sudo_run(&s.config, &["bash", "-i", "-c", "id -u"]);
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    let planted = format!("HOME /home/nobody: the home itself belongs to uid {AGENT} (mode 0");
    assert!(err.contains(&planted), "{err}");
    assert!(!out.contains("PLANTED"), "{out}");

    for (mode, says) in
        [(0o777, "anyone may write it (mode 0777)"), (0o775, "its group may write it (mode 0775)")]
    {
        std::fs::set_permissions(mnt.join("home"), std::fs::Permissions::from_mode(mode)).unwrap();
        let (code, _, err) = run_as(&s, AGENT, &s.config, &["true"]);
        assert_eq!(code, 1, "{err}");
        let refused = format!(
            "agentvfs: HOME /home/61001: /home, above it, belongs to uid 0 (root) and {says}, so others could \
             rename what is in it and put a home of their own making in its place."
        );
        assert!(err.starts_with(&refused), "{err}");
        let fix =
            format!("(`sudo chmod go-w {}`), or set [run] home elsewhere\n", mnt.join("home").display());
        assert!(err.ends_with(&fix), "{err}");
    }
}

/// Writes a `--config` file into the scratch directory (outside the tree): the test's daemon
/// config with `[run] home = home`, owned by `uid`, mode `mode`.
fn config_with_home(s: &Setup, name: &str, home: &str, (uid, mode): (u32, u32)) -> PathBuf {
    let path = s.f.scratch.path().join(name);
    let text = std::fs::read_to_string(&s.config).unwrap() + &format!("\n[run]\nhome = \"{home}\"\n");
    std::fs::write(&path, text).unwrap();
    std::os::unix::fs::chown(&path, Some(uid), Some(uid)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

/// Under sudo, a `[run] home` of the user's own config is made with the user's ids (the
/// tree's modes bound it): not in a directory of root's or another user's; the same home in a
/// config of root's is made as root and given to the user.
#[test]
fn under_sudo_a_home_the_user_chose_is_made_with_the_users_ids() {
    let s = Setup::new();
    let host = &s.f.host_root;
    std::fs::create_dir(host.join("rootdir")).unwrap();
    std::fs::create_dir(host.join("otherdir")).unwrap();
    std::os::unix::fs::chown(host.join("otherdir"), Some(AGENT), Some(65534)).unwrap();

    let mine = config_with_home(&s, "user-root.toml", "/host/rootdir/planted", (65534, 0o644));
    let (code, _, err) = sudo_run(&mine, &["true"]);
    assert_eq!(code, 1, "{err}");
    let refused = "cannot create HOME /host/rootdir/planted in the tree: mkdir /host/rootdir/planted: Permission denied";
    assert!(err.contains(refused), "{err}");
    assert!(!host.join("rootdir/planted").exists());
    // A root-owned config others may write is the user's choice too.
    let open = config_with_home(&s, "open-root.toml", "/host/rootdir/planted", (0, 0o666));
    let (code, _, err) = sudo_run(&open, &["true"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(refused), "{err}");
    assert!(!host.join("rootdir/planted").exists());

    let other = config_with_home(&s, "user-other.toml", "/host/otherdir/planted", (65534, 0o644));
    let (code, _, err) = sudo_run(&other, &["true"]);
    assert_eq!(code, 1, "{err}");
    let at = s.f.scratch.path().join("mnt/host/otherdir");
    assert!(err.contains(&owned_above("/host/otherdir/planted", "/host/otherdir", &at, AGENT)), "{err}");
    assert!(!host.join("otherdir/planted").exists());

    // Where the user may make it, it is made as the user: the parents are the user's too.
    let own = config_with_home(&s, "user-own.toml", "/host/mine/home", (65534, 0o644));
    let (code, out, err) = sudo_run(&own, &["sh", "-c", "echo $HOME"]);
    assert_eq!((code, out.as_str()), (0, "/host/mine/home\n"), "{err}");
    assert_eq!(owner_mode(&host.join("mine")), (65534, 0o755));
    assert_eq!(owner_mode(&host.join("mine/home")), (65534, 0o700));

    // Named by a config of root's, root makes it and gives it to the user.
    let roots = config_with_home(&s, "root.toml", "/host/rootdir/planted", (0, 0o644));
    let (code, out, err) = sudo_run(&roots, &["sh", "-c", "echo $HOME"]);
    assert_eq!((code, out.as_str()), (0, "/host/rootdir/planted\n"), "{err}");
    assert_eq!(owner_mode(&host.join("rootdir/planted")), (65534, 0o700));
    assert_eq!(owner_mode(&host.join("rootdir")), (0, 0o755));
}

/// A `--config` file the program could change is refused before anything it says is done: the
/// home it names is not made, as root or otherwise.
#[test]
fn a_config_the_program_could_change_makes_no_home() {
    let s = Setup::new();
    let text = std::fs::read_to_string(&s.config).unwrap();
    let named = s.f.host_root.join("named.toml");
    std::fs::write(&named, text.clone() + "\n[run]\nhome = \"/host/tampered-home\"\n").unwrap();
    let default = s.f.host_root.join("default.toml");
    std::fs::write(&default, &text).unwrap();
    for file in [&named, &default] {
        std::os::unix::fs::chown(file, Some(65534), Some(65534)).unwrap();
    }
    let (code, _, err) = sudo_run(&named, &["true"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("is /host/named.toml in the tree, and the program could change it"), "{err}");
    assert!(!s.f.host_root.join("tampered-home").exists(), "made for a refused config");
    let (code, _, err) = sudo_run(&default, &["true"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("is /host/default.toml in the tree, and the program could change it"), "{err}");
    assert!(!s.f.p("/home/nobody").exists(), "made for a refused config");
}

/// `agentvfs run` inside `agentvfs run` says it cannot be nested.
#[test]
fn run_inside_run_says_it_cannot_be_nested() {
    let s = Setup::new();
    s.make_home();
    let (code, out, err) = sudo_run(&s.config, &["sh", "-c", "agentvfs run -- true; echo rc=$?"]);
    assert_eq!((code, out.as_str()), (0, "rc=1\n"), "{err}");
    let mnt = s.f.scratch.path().join("mnt");
    let nested = format!(
        "agentvfs: agentvfs run cannot be nested: this is already inside the sandbox of an `agentvfs run`, whose \
         whole file system is the tree, so the mount it would start from ({}) is not here. Run the command \
         directly, or start it with agentvfs run from outside the sandbox\n",
        mnt.display()
    );
    assert_eq!(err, nested);
}

/// A listener that accepts and never answers: `run` gives up after its timeout, saying why.
#[test]
fn a_socket_that_never_answers_times_out() {
    let s = Setup::new();
    let socket = s.f.scratch.path().join("silent.sock");
    let listen = "import os, socket, sys, time\ns = socket.socket(socket.AF_UNIX)\ns.bind(sys.argv[1])\n\
                  os.chmod(sys.argv[1], 0o666)\ns.listen(8)\nopen(sys.argv[2], 'w').close()\nkept = []\n\
                  while True:\n    kept.append(s.accept())\n";
    let ready = s.f.scratch.path().join("silent.ready");
    let mut silent = Command::new("python3").arg("-c").arg(listen).arg(&socket).arg(&ready).spawn().unwrap();
    crate::harness::within("the silent socket", Duration::from_secs(20), || ready.exists());
    let mut run = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&s.bin)
        .args(["run", "--socket"])
        .arg(&socket)
        .args(["--", "true"])
        .env_remove("SUDO_UID")
        .env_remove("SUDO_GID")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = run.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(60) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let waited = started.elapsed();
    let _ = run.kill();
    let out = run.wait_with_output().unwrap();
    let _ = silent.kill();
    let _ = silent.wait();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(status.and_then(|s| s.code()), Some(1), "still waiting after {waited:?}: {err}");
    assert!(waited >= Duration::from_secs(29), "{waited:?}");
    let timed_out = format!(
        "agentvfs: uid 65534 cannot use the agent socket {0}: no answer to ping on {0} within 30 s: what listens \
         there accepted the connection but does not answer as an agentvfs daemon does (a daemon that hangs, or \
         another program's socket)\n",
        socket.display()
    );
    assert_eq!(err, timed_out);
}
