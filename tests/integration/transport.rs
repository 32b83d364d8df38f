//! How the kernel's requests reach the daemon: FUSE-over-io_uring rings, one per CPU, when the
//! kernel offers them (the default), or `/dev/fuse` (when it does not, or with
//! `[fuse] io_uring = false`). The same work gets the same results either way, from every CPU.

use std::path::Path;

use crate::harness::{sh_ok, status, Fixture, ROUTES};

const ENABLE_PARAMETER: &str = "/sys/module/fuse/parameters/enable_uring";
const DISABLE_SYSCTL: &str = "/proc/sys/kernel/io_uring_disabled";

/// The tests that expect rings and the one that forbids them take turns.
static RINGS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Forbids io_uring to unprivileged and privileged processes alike while it lives.
struct RingsForbidden(String);

impl RingsForbidden {
    fn new() -> RingsForbidden {
        let before = std::fs::read_to_string(DISABLE_SYSCTL).unwrap();
        std::fs::write(DISABLE_SYSCTL, "2").unwrap();
        RingsForbidden(before)
    }
}

impl Drop for RingsForbidden {
    fn drop(&mut self) {
        let _ = std::fs::write(DISABLE_SYSCTL, self.0.trim());
    }
}

/// Creates, writes, appends, reads, renames, lists, links and deletes on every route, from a
/// shell pinned to `cpu` (the kernel picks the ring of the caller's CPU), and checks each
/// result.
fn file_work(fx: &Fixture, cpu: Option<usize>) {
    let pin = cpu.map(|c| format!("taskset -c {c} ")).unwrap_or_default();
    for route in ROUTES {
        let dir = fx.p(route).join(format!("work-{}", cpu.map_or("any".to_string(), |c| c.to_string())));
        let script = r#"
            mkdir d && cd d
            printf 'one\n' > a && printf 'two\n' >> a
            head -c 3000000 /dev/zero | tr '\0' x > big
            mv a b && ln -s b link && mkdir sub && touch sub/f
            cat link; wc -c < big; ls; ls sub
            rm b link big sub/f && rmdir sub && cd .. && rmdir d && ls -A
        "#;
        std::fs::create_dir(&dir).unwrap();
        let out = sh_ok(&dir, &format!("{pin}sh -e <<'SCRIPT'\n{script}\nSCRIPT\n"));
        assert_eq!(out, "one\ntwo\n3000000\nb\nbig\nlink\nsub\nf\n", "route {route}, cpu {cpu:?}");
        std::fs::remove_dir(&dir).unwrap();
    }
}

fn online_cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

#[test]
fn requests_come_by_io_uring_rings_and_every_cpu_is_served() {
    let _turn = RINGS.lock().unwrap_or_else(|e| e.into_inner());
    let fx = Fixture::new("");
    let status = status(&fx);
    if Path::new(ENABLE_PARAMETER).exists() {
        // The daemon turned the kernel's parameter on and registered a ring per CPU.
        assert_eq!(std::fs::read_to_string(ENABLE_PARAMETER).unwrap().trim(), "Y");
        assert_eq!(status["fuse_transport"], "io_uring", "{status}");
        assert!(status["fuse_ring_queues"].as_u64().unwrap() >= online_cpus() as u64, "{status}");
    } else {
        assert_eq!(status["fuse_transport"], "dev_fuse", "{status}");
    }
    let ring_requests = |fx: &Fixture| -> Vec<u64> {
        crate::harness::status(fx)["counters"]["fuse_ring_requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .collect()
    };
    for cpu in 0..online_cpus() {
        let before = ring_requests(&fx);
        file_work(&fx, Some(cpu));
        let after = ring_requests(&fx);
        if status["fuse_transport"] == "io_uring" {
            // The work of a shell on this CPU was served by this CPU's ring (hundreds of
            // requests; the kernel's own background requests may land elsewhere).
            let here = after[cpu] - before[cpu];
            let elsewhere: u64 = after.iter().zip(&before).map(|(a, b)| a - b).sum::<u64>() - here;
            assert!(here >= 60 && here > elsewhere, "cpu {cpu}: before {before:?}, after {after:?}");
        }
    }
}

#[test]
fn with_io_uring_off_requests_come_by_dev_fuse() {
    let fx = Fixture::new("[fuse]\nio_uring = false\n");
    let status = status(&fx);
    assert_eq!(status["fuse_transport"], "dev_fuse", "{status}");
    assert_eq!(status["fuse_ring_queues"], 0, "{status}");
    file_work(&fx, None);
    assert_eq!(crate::harness::status(&fx)["counters"]["fuse_ring_requests"], serde_json::json!([]));
}

#[test]
fn when_rings_are_forbidden_requests_come_by_dev_fuse() {
    if !Path::new(DISABLE_SYSCTL).exists() {
        return; // a kernel before 6.6 cannot forbid them
    }
    let _turn = RINGS.lock().unwrap_or_else(|e| e.into_inner());
    // Checked before the handshake: once io_uring is negotiated, a daemon that cannot
    // register its rings would leave every caller of the mount waiting.
    let fx = {
        let _forbidden = RingsForbidden::new();
        Fixture::new("")
    };
    let status = status(&fx);
    assert_eq!(status["fuse_transport"], "dev_fuse", "{status}");
    file_work(&fx, None);
}

/// The daemon's threads named `prefix` followed by a number: (name, thread id, /proc entry).
fn daemon_threads(pid: u64, prefix: &str) -> Vec<(String, i32, std::path::PathBuf)> {
    let mut threads = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        let name = std::fs::read_to_string(task.join("comm")).unwrap_or_default().trim().to_string();
        let digits = name.strip_prefix(prefix).unwrap_or("");
        if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let tid: i32 = task.file_name().unwrap().to_str().unwrap().parse().unwrap();
        threads.push((name, tid, task));
    }
    threads.sort();
    threads
}

/// The scheduling policy of each of the daemon's ring threads (`fuse-ring-N`), by name.
fn ring_thread_policies(pid: u64) -> Vec<(String, i32)> {
    let threads = daemon_threads(pid, "fuse-ring-");
    threads.into_iter().map(|(name, tid, _)| (name, unsafe { libc::sched_getscheduler(tid) })).collect()
}

/// Shells pinned to CPUs, running while this lives.
struct Pinned(Vec<std::process::Child>);

impl Pinned {
    /// `script` on each of `cpus`, in `dir`.
    fn run(cpus: impl IntoIterator<Item = usize>, dir: &Path, script: &str) -> Pinned {
        let spawn = |cpu: usize| {
            std::process::Command::new("taskset")
                .args(["-c", &cpu.to_string(), "sh", "-c", script])
                .current_dir(dir)
                .spawn()
                .unwrap()
        };
        Pinned(cpus.into_iter().map(spawn).collect())
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A busy loop (normal class, like any busy program).
const HOG: &str = "while :; do :; done";

/// Creates `n` files in `dir` from a shell pinned to CPU 0; returns how long that took.
fn creates_on_cpu0(dir: &Path, n: usize) -> std::time::Duration {
    std::fs::create_dir(dir).unwrap();
    let started = std::time::Instant::now();
    let out =
        sh_ok(dir, &format!("taskset -c 0 sh -c 'for i in $(seq 1 {n}); do echo x > f$i; done; ls | wc -l'"));
    let took = started.elapsed();
    assert_eq!(out.trim(), n.to_string());
    took
}

#[test]
fn ring_threads_yield_their_cpu_yet_a_busy_cpu_does_not_stall_them() {
    let _turn = RINGS.lock().unwrap_or_else(|e| e.into_inner());
    let fx = Fixture::new("");
    let before = status(&fx);
    if before["fuse_transport"] != "io_uring" {
        return; // a kernel without FUSE over io_uring: no ring threads
    }
    assert_eq!(before["fuse_ring_idle_class"], true, "{before}");
    let pid = before["pid"].as_u64().unwrap();
    let policies = ring_thread_policies(pid);
    assert_eq!(policies.len() as u64, before["fuse_ring_queues"].as_u64().unwrap(), "{policies:?}");
    // While requests flow (a lookup of a new name each time) the ring threads are in the idle
    // class; a quiet second puts them back in the normal class while the guard rests (see
    // `an_idle_daemon_sleeps_until_asked`). Other tests may keep the CPUs busy while this
    // daemon starts, and its guard may have promoted a ring thread already: each promotion is
    // held for 2 s at most.
    let probes = std::cell::Cell::new(0);
    crate::harness::within(
        "every ring thread back in the idle class",
        std::time::Duration::from_secs(10),
        || {
            probes.set(probes.get() + 1);
            assert!(!fx.p(&format!("/host/probe-{}", probes.get())).exists());
            ring_thread_policies(pid).iter().all(|(_, policy)| *policy == libc::SCHED_IDLE)
        },
    );

    // With every CPU kept busy, a caller's requests still get their ring thread's CPU: the
    // guard moves a stalled ring thread to the normal class. (Without it, each of these
    // creates waits a third of a second for its ring thread: over a minute in all.)
    let took = {
        let _hogs = Pinned::run(0..online_cpus(), &fx.mount.dir, HOG);
        creates_on_cpu0(&fx.p("/host/busy"), 300)
    };
    assert!(took < std::time::Duration::from_secs(10), "300 creates on busy CPUs took {took:?}");
    let after = status(&fx);
    assert!(after["counters"]["fuse_ring_promotions"].as_u64().unwrap() >= 1, "{after}");

    // CPU 0 busy, and CPU 1's ring serving a steady stream of requests: CPU 0's stall is
    // still seen (each ring is judged by its own requests, not by its neighbour's). On a
    // fresh daemon, whose ring threads were never promoted.
    if online_cpus() > 1 {
        drop(fx);
        let fx = Fixture::new("");
        let neighbour = fx.p("/host/neighbour");
        std::fs::create_dir(&neighbour).unwrap();
        let took = {
            let _hog = Pinned::run([0], &fx.mount.dir, HOG);
            let _neighbour = Pinned::run([1], &neighbour, "while :; do echo x > f; done");
            creates_on_cpu0(&fx.p("/host/busy-beside"), 300)
        };
        assert!(took < std::time::Duration::from_secs(10), "300 creates beside a busy ring took {took:?}");
    }
}

#[test]
fn with_the_idle_class_off_ring_threads_stay_normal() {
    let _turn = RINGS.lock().unwrap_or_else(|e| e.into_inner());
    let fx = Fixture::new("[fuse]\nio_uring_idle_class = false\n");
    let status = status(&fx);
    if status["fuse_transport"] != "io_uring" {
        return;
    }
    assert_eq!(status["fuse_ring_idle_class"], false, "{status}");
    let policies = ring_thread_policies(status["pid"].as_u64().unwrap());
    assert!(
        !policies.is_empty() && policies.iter().all(|(_, policy)| *policy == libc::SCHED_OTHER),
        "{policies:?}"
    );
    file_work(&fx, None);
    assert_eq!(crate::harness::status(&fx)["counters"]["fuse_ring_promotions"], 0);
}

/// Voluntary context switches of each of the daemon's `/dev/fuse` reader threads (`fuser-N`).
fn dev_fuse_reader_switches(pid: u64) -> Vec<u64> {
    daemon_threads(pid, "fuser-").iter().map(|(_, _, task)| voluntary_switches(task)).collect()
}

/// How often the thread at `task` (`/proc/PID/task/TID`) went to sleep; 0 once it has ended.
fn voluntary_switches(task: &Path) -> u64 {
    let status = std::fs::read_to_string(task.join("status")).unwrap_or_default();
    let line = status.lines().find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"));
    line.map_or(0, |n| n.trim().parse().unwrap())
}

#[test]
fn with_rings_deleting_files_does_not_wake_the_dev_fuse_reader_for_each() {
    let _turn = RINGS.lock().unwrap_or_else(|e| e.into_inner());
    let fx = Fixture::new("");
    let status = status(&fx);
    if status["fuse_transport"] != "io_uring" {
        return;
    }
    // `/dev/fuse` carries only forgets and interrupts now: one thread reads it.
    let pid = status["pid"].as_u64().unwrap();
    assert_eq!(dev_fuse_reader_switches(pid).len(), 1, "one reader thread");
    let dir = fx.p("/host/forgotten");
    std::fs::create_dir(&dir).unwrap();
    const FILES: u64 = 3000;
    for i in 0..FILES {
        std::fs::write(dir.join(i.to_string()), "x").unwrap();
    }
    let before: u64 = dev_fuse_reader_switches(pid).iter().sum();
    let started = std::time::Instant::now();
    // Every unlink makes the kernel forget an inode: a reader waiting on the device would be
    // woken for each (about one switch per file), a paced one reads them in batches, waking
    // at most once every 2 ms however many forgets came meanwhile.
    for i in 0..FILES {
        std::fs::remove_file(dir.join(i.to_string())).unwrap();
    }
    let woken = dev_fuse_reader_switches(pid).iter().sum::<u64>() - before;
    // On a loaded machine the deletions take long enough for the paced reader to wake often
    // too: then the bound is its pace.
    let paced = started.elapsed().as_millis() as u64 / 2 + 20;
    assert!(
        woken < (FILES / 5).max(paced),
        "the reader was woken {woken} times for {FILES} deletions in {:?}",
        started.elapsed()
    );
    std::fs::remove_dir(&dir).unwrap();
    file_work(&fx, None);
}

/// Voluntary context switches of each of the daemon's threads, by thread id.
fn switches_by_thread(pid: u32) -> std::collections::BTreeMap<String, u64> {
    let mut switches = std::collections::BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        let name = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        let id = format!("{} {}", task.file_name().unwrap().to_string_lossy(), name.trim());
        switches.insert(id, voluntary_switches(&task));
    }
    switches
}

/// An idle daemon does not wake: once nothing has asked it anything for a while, none of its
/// threads runs (no polling of `/dev/fuse`, of the ring threads, or of pending approvals)
/// until the next request, which is answered as before. The daemon serves a memory route and
/// a sqlite route (whose checkpoints wait for commits), no host route: a host route's change
/// watch wakes for any write on the host filesystem, which other tests make.
#[test]
fn an_idle_daemon_sleeps_until_asked() {
    let _turn = RINGS.lock().unwrap_or_else(|e| e.into_inner());
    let scratch = crate::harness::scratch();
    let config = scratch.path().join("idle.toml");
    let text = format!(
        "socket = \"{}\"\n[default]\nbackend = \"memory\"\n[[routes]]\npath = \"/db\"\nbackend = \"sqlite\"\n\
         database = \"{}\"\n[audit]\ndatabase = \"{}\"\n",
        scratch.path().join("idle.sock").display(),
        scratch.path().join("store.db").display(),
        scratch.path().join("audit.db").display()
    );
    std::fs::write(&config, text).unwrap();
    let mount = crate::harness::Mount::start(&config, &scratch.path().join("mnt"));
    let pid = mount.child.as_ref().unwrap().id();
    // Work through every part that polled: the rings and their guard, the `/dev/fuse` reader
    // (the deletions' forgets), the sqlite route's checkpoints (its commits).
    for dir in ["d", "db/d"] {
        sh_ok(
            &mount.dir,
            &format!("mkdir {dir} && for i in 1 2 3 4 5; do echo $i > {dir}/f$i; done && rm -r {dir}"),
        );
    }
    // The guard rests after a quiet second, the reader waits in poll after 0.1 s, and the
    // checkpoint of those commits comes within half a second.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let before = switches_by_thread(pid);
    std::thread::sleep(std::time::Duration::from_secs(2));
    let after = switches_by_thread(pid);
    let woken: Vec<(&String, u64)> = after
        .iter()
        .filter_map(|(thread, n)| Some((thread, n - before.get(thread)?)))
        .filter(|(_, n)| *n > 0)
        .collect();
    // Polling woke it about 95 times in 2 s. A forget the kernel sends late (another test
    // dropping the caches) may wake the `/dev/fuse` reader once or twice; nothing else.
    let reader: u64 = woken.iter().filter(|(thread, _)| thread.contains(" fuser-")).map(|(_, n)| n).sum();
    assert!(
        reader <= 2 && woken.iter().all(|(thread, _)| thread.contains(" fuser-")),
        "an idle daemon woke: {woken:?}"
    );
    assert_eq!(sh_ok(&mount.dir, "echo awake > f && cat f"), "awake\n");
}

/// Voluntary context switches of the daemon's ring thread for CPU 0 (`fuse-ring-0`): one per
/// sleep while it waits for requests.
fn ring0_sleeps(pid: u64) -> u64 {
    let threads = daemon_threads(pid, "fuse-ring-");
    let (_, _, task) = threads.iter().find(|(name, _, _)| name == "fuse-ring-0").expect("fuse-ring-0");
    voluntary_switches(task)
}

/// A ring thread in the idle class looks for its caller's next request before it sleeps
/// (`[fuse] io_uring_spin_us`): a caller's stream of requests on one CPU is served without the
/// thread sleeping between them. Off, it sleeps once per request.
#[test]
fn ring_threads_look_for_the_next_request_before_they_sleep() {
    let _turn = RINGS.lock().unwrap_or_else(|e| e.into_inner());
    const FILES: u64 = 500; // each: a lookup and a create, at least
    let fx = Fixture::new("[fuse]\nio_uring_spin_us = 0\n");
    let status = status(&fx);
    if status["fuse_transport"] != "io_uring" || status["fuse_ring_idle_class"] != true {
        return; // no ring threads, or none in the idle class: they never spin
    }
    let pid = status["pid"].as_u64().unwrap();
    let before = ring0_sleeps(pid);
    creates_on_cpu0(&fx.p("/host/no-spin"), FILES as usize);
    let sleeps = ring0_sleeps(pid) - before;
    assert!(sleeps >= FILES, "{sleeps} sleeps for {FILES} creates without looking first");
    drop(fx);

    // Looking, the thread sleeps only when another program took the CPU for longer than the
    // look. Other tests run meanwhile (one compiling a thousand regexes once made three tries
    // in a row sleep 300-1,500 times), so it tries up to ten times, a moment apart, for a quiet
    // stretch. Without the look every try sleeps at least once per create.
    let fx = Fixture::new("");
    let _turn = crate::harness::cpu_turn();
    let pid = crate::harness::status(&fx)["pid"].as_u64().unwrap();
    let mut tries = Vec::new();
    for attempt in 0..10 {
        if attempt > 0 {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        let before = ring0_sleeps(pid);
        creates_on_cpu0(&fx.p(&format!("/host/spin-{attempt}")), FILES as usize);
        tries.push(ring0_sleeps(pid) - before);
        if tries[attempt] < FILES / 4 {
            return;
        }
    }
    panic!("the ring thread slept {tries:?} times for {FILES} creates, ten tries");
}
