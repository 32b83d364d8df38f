//! The ring threads' scheduling class, and the guard that keeps it from starving them.
//!
//! A ring thread answers while it runs on its caller's CPU, so when the kernel wakes the
//! caller that CPU is busy, and the scheduler moves the caller to an idle CPU (on a VM, waking
//! a halted virtual CPU costs more than the request: a lookup takes about 35 µs instead of 19).
//! A thread in the `SCHED_IDLE` class does not count as work, so the caller is woken where it
//! was, and the ring thread, which only has to wait for its next request, goes to sleep after.
//!
//! But a `SCHED_IDLE` thread gets next to no CPU while any normal thread wants its CPU, so a busy
//! program on a ring's CPU would stall every request of that CPU's callers (2,000 creates took
//! 221 s under two CPU hogs). The guard watches each ring thread: when it is runnable at
//! [`STALL_LOOKS`] looks in a row without having served a request in between, it waits for a
//! CPU, and the guard moves it to the normal class for a while. A ring thread can also be
//! runnable with nothing to do (preempted by the caller it just woke, while something else
//! holds the CPU), so the first hold is short ([`FIRST_HOLD`]); it doubles each time the thread
//! stalls again soon after going back ([`AGAIN_WITHIN`]), up to [`LONGEST_HOLD`], so that a
//! program that keeps its CPU busy costs the ring a stall every two seconds at most.
//!
//! The guard looks every [`ACTIVE_LOOK`] while requests flow. After a quiet second it rests:
//! the ring threads go to the normal class, where nothing can starve them, and the guard sleeps
//! until a ring thread reports a request ([`Activity::request`]), then puts them back in the
//! idle class. So an idle daemon's guard never wakes.

use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// Looks in a row at which a runnable ring thread had served nothing, before it is promoted.
pub const STALL_LOOKS: u32 = 3;
/// How long a promoted ring thread stays in the normal class at first, and at most.
pub const FIRST_HOLD: Duration = Duration::from_millis(100);
pub const LONGEST_HOLD: Duration = Duration::from_secs(2);
/// A stall this soon after going back to the idle class doubles the next hold.
pub const AGAIN_WITHIN: Duration = Duration::from_secs(1);
/// Time between looks while requests flow.
pub const ACTIVE_LOOK: Duration = Duration::from_millis(5);
/// How long without a request before the guard rests.
const QUIET: Duration = Duration::from_secs(1);

/// What the guard knows of one ring thread between looks.
#[derive(Debug)]
pub struct Watch {
    served: u64,
    stalled_looks: u32,
    promoted_at: Option<Instant>,
    hold: Duration,
    demoted_at: Option<Instant>,
}

impl Default for Watch {
    fn default() -> Watch {
        Watch { served: 0, stalled_looks: 0, promoted_at: None, hold: FIRST_HOLD, demoted_at: None }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Leave,
    Promote,
    Demote,
}

impl Watch {
    /// Judges one look at a ring thread: `served` is its request count, `runnable` whether it
    /// is running or waiting for a CPU.
    pub fn look(&mut self, served: u64, runnable: bool, now: Instant) -> Verdict {
        let progressed = served != self.served;
        self.served = served;
        if let Some(at) = self.promoted_at {
            if now.duration_since(at) < self.hold {
                return Verdict::Leave;
            }
            self.promoted_at = None;
            self.demoted_at = Some(now);
            self.stalled_looks = 0;
            return Verdict::Demote;
        }
        self.stalled_looks = if runnable && !progressed { self.stalled_looks + 1 } else { 0 };
        if self.stalled_looks < STALL_LOOKS {
            return Verdict::Leave;
        }
        self.stalled_looks = 0;
        let again = self.demoted_at.is_some_and(|at| now.duration_since(at) <= AGAIN_WITHIN);
        self.hold = if again { (self.hold * 2).min(LONGEST_HOLD) } else { FIRST_HOLD };
        self.promoted_at = Some(now);
        Verdict::Promote
    }

    fn promoted(&self) -> bool {
        self.promoted_at.is_some()
    }
}

/// Whether a thread is running or waiting for a CPU, from its `/proc/.../stat` line (the state
/// is the field after the command name, which may itself hold spaces and parentheses).
pub fn runnable_in_stat(stat: &[u8]) -> Option<bool> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let state = *stat.get(close + 2)?;
    Some(state == b'R')
}

/// Puts thread `tid` in `policy` (`SCHED_IDLE` or `SCHED_OTHER`, priority 0).
pub fn set_policy(tid: libc::pid_t, policy: libc::c_int) -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    if unsafe { libc::sched_setscheduler(tid, policy, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether this process may leave `SCHED_IDLE` again once in it (root may; others need a
/// `RLIMIT_NICE` that allows nice 0). Tried on the calling thread, which ends where it began.
pub fn idle_class_reversible() -> io::Result<()> {
    set_policy(0, libc::SCHED_IDLE)?;
    set_policy(0, libc::SCHED_OTHER)
}

/// A ring thread as the guard sees it.
pub struct Watched {
    pub tid: libc::pid_t,
    /// Its `/proc/self/task/<tid>/stat`, open for the guard's looks.
    stat: std::fs::File,
}

impl Watched {
    pub fn new(tid: libc::pid_t) -> io::Result<Watched> {
        Ok(Watched { tid, stat: std::fs::File::open(format!("/proc/self/task/{tid}/stat"))? })
    }

    /// Whether the thread is running or waiting for a CPU; `None` once it has ended (the open
    /// file keeps naming that thread, never another one given the same id later).
    fn runnable(&self) -> Option<bool> {
        let mut line = [0u8; 512];
        let n = self.stat.read_at(&mut line, 0).ok()?;
        runnable_in_stat(&line[..n])
    }
}

/// What the guard shares with the ring threads: its stop, whether it rests, and which ring
/// threads it keeps in the idle class.
pub struct Activity {
    stop: Mutex<bool>,
    woken: Condvar,
    /// The guard rests (the ring threads are in the normal class) until a request comes.
    resting: AtomicBool,
    /// By queue: the thread is in the idle class now (only there may it spin, see
    /// [`Activity::may_spin`]).
    idle_class: Box<[AtomicBool]>,
}

impl Activity {
    pub fn new(queues: usize) -> Activity {
        Activity {
            stop: Mutex::new(false),
            woken: Condvar::new(),
            resting: AtomicBool::new(false),
            idle_class: (0..queues).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// Whether queue `qid`'s thread may look for its next request before it sleeps: only in
    /// the idle class, where looking takes no CPU any other thread wants. (In the normal class
    /// it would delay the caller its reply just woke on the same CPU.)
    #[inline]
    pub fn may_spin(&self, qid: usize) -> bool {
        self.idle_class.get(qid).is_some_and(|c| c.load(Ordering::Relaxed))
    }

    fn set_class(&self, qid: usize, idle: bool) {
        if let Some(class) = self.idle_class.get(qid) {
            class.store(idle, Ordering::Relaxed);
        }
    }

    /// Called by a ring thread for each request it takes: wakes a resting guard. One relaxed
    /// load while the guard watches.
    #[inline]
    pub fn request(&self) {
        if self.resting.load(Ordering::Relaxed) && self.resting.swap(false, Ordering::AcqRel) {
            let _stop = self.stop.lock();
            self.woken.notify_all();
        }
    }
}

/// The guard's thread. Dropping it stops the thread, and leaves the ring threads as they are.
pub struct Guard {
    shared: Arc<Activity>,
    thread: Option<JoinHandle<()>>,
}

impl Guard {
    /// Starts guarding the ring threads and puts them in `SCHED_IDLE`, once the guard's own
    /// thread has shown that a thread may leave that class again. `served` holds each ring's
    /// request count (same order as `rings`); `promotions` counts the guard's rescues; the ring
    /// threads report their requests to `activity`.
    pub fn start(
        rings: Vec<Watched>,
        served: Arc<[AtomicU64]>,
        promotions: Arc<AtomicU64>,
        activity: Arc<Activity>,
    ) -> io::Result<Guard> {
        let (shared, thread_shared) = (activity.clone(), activity);
        let (started, outcome) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new().name("fuse-ring-guard".into()).spawn(move || {
            // Tried here, so that a thread left in the idle class by a refusal is this one,
            // which then ends.
            let ready = idle_class_reversible()
                .and_then(|()| rings.iter().try_for_each(|ring| set_policy(ring.tid, libc::SCHED_IDLE)));
            if let Err(e) = ready {
                for ring in &rings {
                    let _ = set_policy(ring.tid, libc::SCHED_OTHER);
                }
                let _ = started.send(Err(e));
                return;
            }
            for qid in 0..rings.len() {
                thread_shared.set_class(qid, true);
            }
            let _ = started.send(Ok(()));
            guard(&rings, &served, &promotions, &thread_shared);
        })?;
        let guard = Guard { shared, thread: Some(thread) };
        outcome.recv().map_err(|_| io::Error::other("the ring guard died while starting"))??;
        Ok(guard)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        *self.shared.stop.lock() = true;
        self.shared.woken.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn guard(rings: &[Watched], served: &[AtomicU64], promotions: &AtomicU64, shared: &Activity) {
    let mut watches: Vec<Watch> = rings.iter().map(|_| Watch::default()).collect();
    let mut total = 0u64;
    let mut last_activity = Instant::now();
    loop {
        let now = Instant::now();
        if now.duration_since(last_activity) >= QUIET && !watches.iter().any(Watch::promoted) {
            if !rest(rings, shared) {
                return;
            }
            last_activity = Instant::now();
            continue;
        }
        {
            let mut stop = shared.stop.lock();
            if !*stop {
                shared.woken.wait_for(&mut stop, ACTIVE_LOOK);
            }
            if *stop {
                return;
            }
        }
        let now = Instant::now();
        let mut new_total = 0;
        for (qid, ((ring, watch), count)) in rings.iter().zip(&mut watches).zip(served).enumerate() {
            let count = count.load(Ordering::Relaxed);
            new_total += count;
            // A thread that ended is left alone: its id may already name another thread.
            let Some(runnable) = ring.runnable() else { continue };
            let (policy, name) = match watch.look(count, runnable, now) {
                Verdict::Leave => continue,
                Verdict::Promote => (libc::SCHED_OTHER, "normal"),
                Verdict::Demote => (libc::SCHED_IDLE, "idle"),
            };
            if policy == libc::SCHED_OTHER {
                promotions.fetch_add(1, Ordering::Relaxed);
                shared.set_class(qid, false);
            }
            match set_policy(ring.tid, policy) {
                Ok(()) => shared.set_class(qid, policy == libc::SCHED_IDLE),
                Err(e) => {
                    tracing::warn!(tid = ring.tid, "cannot move a FUSE ring thread to the {name} class: {e}")
                }
            }
        }
        if new_total != total {
            total = new_total;
            last_activity = now;
        }
    }
}

/// Rests while the rings are quiet: their threads go to the normal class, and the guard sleeps
/// until one of them reports a request, then puts them back in the idle class. A request that
/// came just before the rest began is served in the normal class, as the next ones are until
/// one reports: slower to wake its caller, never starved. False at the stop.
fn rest(rings: &[Watched], shared: &Activity) -> bool {
    for (qid, ring) in rings.iter().enumerate() {
        shared.set_class(qid, false);
        let _ = set_policy(ring.tid, libc::SCHED_OTHER);
    }
    let mut stop = shared.stop.lock();
    shared.resting.store(true, Ordering::SeqCst);
    while !*stop && shared.resting.load(Ordering::SeqCst) {
        shared.woken.wait(&mut stop);
    }
    if *stop {
        return false;
    }
    drop(stop);
    for (qid, ring) in rings.iter().enumerate() {
        match set_policy(ring.tid, libc::SCHED_IDLE) {
            Ok(()) => shared.set_class(qid, true),
            Err(e) => {
                tracing::warn!(tid = ring.tid, "cannot move a FUSE ring thread back to the idle class: {e}")
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Looks at `watch` every ACTIVE_LOOK from `at` on, `n` times, with the same answers.
    fn looks(watch: &mut Watch, at: &mut Instant, n: u32, served: u64, runnable: bool) -> Vec<Verdict> {
        (0..n)
            .map(|_| {
                *at += ACTIVE_LOOK;
                watch.look(served, runnable, *at)
            })
            .collect()
    }

    #[test]
    fn a_thread_runnable_without_serving_is_promoted_for_a_while_then_goes_back() {
        let mut at = Instant::now();
        let mut watch = Watch::default();
        assert_eq!(watch.look(5, false, at), Verdict::Leave);
        use Verdict::{Demote, Leave, Promote};
        assert_eq!(looks(&mut watch, &mut at, STALL_LOOKS, 5, true), [Leave, Leave, Promote]);
        let promoted = at;
        // Held, whatever it does.
        while at + ACTIVE_LOOK < promoted + FIRST_HOLD {
            assert_eq!(looks(&mut watch, &mut at, 1, 5, true), [Leave]);
        }
        assert_eq!(looks(&mut watch, &mut at, 1, 5, true), [Demote]);
        // Stalling again at once: promoted again, for twice as long.
        assert_eq!(looks(&mut watch, &mut at, STALL_LOOKS, 5, true), [Leave, Leave, Promote]);
        let promoted = at;
        while at + ACTIVE_LOOK < promoted + 2 * FIRST_HOLD {
            assert_eq!(looks(&mut watch, &mut at, 1, 6, false), [Leave]);
        }
        assert_eq!(looks(&mut watch, &mut at, 1, 6, false), [Demote]);
        // A stall long after the last one starts from the first hold again.
        at += AGAIN_WITHIN * 2;
        assert_eq!(looks(&mut watch, &mut at, STALL_LOOKS, 6, true), [Leave, Leave, Promote]);
        let promoted = at;
        while at + ACTIVE_LOOK < promoted + FIRST_HOLD {
            assert_eq!(looks(&mut watch, &mut at, 1, 6, true), [Leave]);
        }
        assert_eq!(looks(&mut watch, &mut at, 1, 6, true), [Demote]);
    }

    #[test]
    fn the_hold_doubles_up_to_the_longest() {
        let mut at = Instant::now();
        let mut watch = Watch::default();
        assert_eq!(watch.look(1, false, at), Verdict::Leave);
        let mut holds = Vec::new();
        for _ in 0..8 {
            assert_eq!(looks(&mut watch, &mut at, STALL_LOOKS, 1, true).last(), Some(&Verdict::Promote));
            let promoted = at;
            while looks(&mut watch, &mut at, 1, 1, true) != [Verdict::Demote] {}
            holds.push(
                (at - promoted).as_millis().div_ceil(ACTIVE_LOOK.as_millis()) * ACTIVE_LOOK.as_millis(),
            );
        }
        assert_eq!(holds, [100, 200, 400, 800, 1600, 2000, 2000, 2000]);
    }

    #[test]
    fn a_thread_that_serves_or_sleeps_between_looks_is_left_alone() {
        let mut at = Instant::now();
        let mut watch = Watch::default();
        for served in 1..50 {
            assert_eq!(looks(&mut watch, &mut at, 1, served, true), [Verdict::Leave], "busy, and serving");
        }
        for _ in 0..10 {
            assert_eq!(looks(&mut watch, &mut at, 2, 49, true), [Verdict::Leave, Verdict::Leave]);
            assert_eq!(looks(&mut watch, &mut at, 1, 49, false), [Verdict::Leave], "asleep in between");
        }
    }

    #[test]
    fn the_state_is_read_after_the_command_name_whatever_it_holds() {
        assert_eq!(runnable_in_stat(b"31 (fuse-ring-0) R 1 31520"), Some(true));
        assert_eq!(runnable_in_stat(b"31 (fuse-ring-0) S 1 31520"), Some(false));
        assert_eq!(runnable_in_stat(b"31 (a) R (b)) S 1 2"), Some(false));
        assert_eq!(runnable_in_stat(b"31 (x"), None);
    }

    #[test]
    fn a_thread_can_be_moved_to_the_idle_class_and_back() {
        let tid = std::thread::spawn(|| {
            idle_class_reversible().unwrap();
            let policy = unsafe { libc::sched_getscheduler(0) };
            assert_eq!(policy, libc::SCHED_OTHER);
        });
        tid.join().unwrap();
    }
}
