//! FUSE over io_uring (Linux 6.14+): the kernel hands requests to rings the daemon registered,
//! one queue per CPU, instead of the daemon reading `/dev/fuse`. A request then costs no
//! system call of its own, and it is served by a thread pinned to the CPU its caller runs on,
//! so waking the server stays on that CPU. (Waking the caller with the reply stays there too
//! only while the thread waits in the idle scheduling class: see [`ring_guard`].)
//!
//! Each queue has a thread, an io_uring and a set of entries. An entry is a pair of buffers
//! the kernel fills with a request (headers, then the arguments) and the daemon fills with the
//! reply, then gives back with `COMMIT_AND_FETCH`, which also asks for the next request. The
//! requests go through fuser's own dispatch ([`fuser::RawDispatcher`]), so the door does not
//! know which transport a request came by. `FORGET` and `INTERRUPT` still come by `/dev/fuse`,
//! and so does every request until all queues are registered; fuser's threads keep serving it.
//!
//! A reply may come later from another thread (a request waiting for a human's approval). Only
//! the queue's thread may submit to its ring: the kernel delivers the next request into an
//! entry in the context of the thread that submitted its `COMMIT_AND_FETCH`, and cancels the
//! command when that thread exits (a control connection's thread would strand or cancel
//! requests). So a late reply is written into its entry where it is made, and its commit is
//! handed to the queue's thread, woken through an eventfd its ring polls. Entries held by
//! waiting requests may be at most all but a reserve of the queue's entries (past that, a
//! request that would wait is refused until approved: [`may_wait`]), so that they never stall
//! their CPU's queue.
//!
//! Each queue's thread serves its CPU's requests one at a time. So a request handler must never
//! wait for something that waits for the kernel on this mount (a tool-door change holding a
//! lock while it invalidates a directory the kernel has locked for a request queued behind):
//! the engine notifies the kernel only after it has released its locks.
//!
//! The kernel's ABI (`include/uapi/linux/fuse.h`): `fuse_uring_req_header` is the header
//! buffer (128 bytes for the in/out header, 128 for the operation's own header, then
//! `fuse_uring_ent_in_out`), `fuse_uring_cmd_req` rides in the SQE's command area.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use fuser::{Filesystem, RawDispatcher, RawReplySink};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use parking_lot::{Mutex, RwLock};

use super::ring_guard;
use crate::log_limit::RateLimited;

/// `enum fuse_uring_cmd`.
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// `struct fuse_uring_req_header`: in/out header, operation header, `fuse_uring_ent_in_out`.
const HEADER_BUFFER: usize = 128 + 128 + 32;
const OP_HEADER_AT: usize = 128;
const OP_HEADER_MAX: usize = 128;
/// `fuse_uring_ent_in_out`: `flags: u64, commit_id: u64, payload_sz: u32`.
const COMMIT_ID_AT: usize = 256 + 8;
const PAYLOAD_SIZE_AT: usize = 256 + 16;
const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;

/// Entries registered per queue, all at the start: the kernel gives an entry registered later
/// only new requests, never one it queued while every entry was taken, so such a request
/// would wait for another entry's reply (none comes while they all wait for approval).
/// Each is mapped, not touched, until a request needs it; the kernel hands out the entry
/// freed last first, so a queue touches about as many as its requests run at once.
const MAX_ENTRIES: usize = 512;
/// Entries of a queue that waiting requests never hold: the kernel cannot take an entry back
/// before its reply, and a CPU whose entries were all held would stall every request from it.
const RESERVED_ENTRIES: usize = 32;
/// The most entries a queue's requests may hold while they wait ([`may_wait`]).
pub const MAX_WAITING: usize = MAX_ENTRIES - RESERVED_ENTRIES;
/// The completion of the eventfd poll (entries are numbered from 0).
const WAKE: u64 = u64::MAX;

/// The module parameter that lets daemons ask for io_uring (off by default on most kernels).
const ENABLE_PARAMETER: &str = "/sys/module/fuse/parameters/enable_uring";

/// Turns the kernel's `enable_uring` on if it is off. It only allows daemons to ask for
/// io_uring at mount time; mounts that do not ask are unaffected.
pub fn enable_in_kernel() -> io::Result<()> {
    match std::fs::read_to_string(ENABLE_PARAMETER)?.trim() {
        "Y" | "1" => Ok(()),
        _ => {
            std::fs::write(ENABLE_PARAMETER, "1")?;
            tracing::info!("enabled FUSE over io_uring in the kernel ({ENABLE_PARAMETER})");
            Ok(())
        }
    }
}

/// Whether this process may set up rings like the queues' (`kernel.io_uring_disabled`,
/// seccomp or memory limits can forbid it). Asked before the handshake: once the connection
/// negotiated io_uring, the kernel holds every request until all queues are registered, so a
/// failure after that would leave the mount hanging rather than fall back to `/dev/fuse`.
pub fn available() -> io::Result<()> {
    IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(2).map(drop).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "this process may not create io_uring instances ({e}; see sysctl kernel.io_uring_disabled)"
            ),
        )
    })
}

/// Requests each queue has served, by queue (CPU) number.
pub type Served = Arc<[AtomicU64]>;

/// What the queues report, for `status`.
#[derive(Clone)]
pub struct RingCounters {
    pub served: Served,
    /// Whether the queues' threads run in `SCHED_IDLE` under the guard (see [`ring_guard`]).
    pub idle_class: bool,
    /// How often the guard moved a stalled queue thread to the normal class.
    pub promotions: Arc<AtomicU64>,
}

/// The running queues. Dropping it stops their threads (after the session ended).
pub struct Rings {
    counters: RingCounters,
    /// Dropped first, so that the queue threads are no longer watched when they stop.
    guard: Option<ring_guard::Guard>,
    stop: Arc<AtomicBool>,
    /// Each queue's eventfd, to wake its thread for the stop.
    wakes: Vec<OwnedFd>,
    threads: Vec<JoinHandle<()>>,
}

impl Rings {
    /// Registers one queue per possible CPU on the connection of `dev_fuse`, whose session
    /// negotiated `FUSE_OVER_IO_URING`, and serves them with `dispatcher`. `payload_size` is
    /// the largest request or reply body (the session's `max_write`). With `idle_class`, the
    /// queues' threads run in `SCHED_IDLE` under a guard (see [`ring_guard`]) if this process
    /// may do that. Returns once every queue is registered (the kernel then sends all requests
    /// to the rings) or failed.
    pub fn start<FS: Filesystem>(
        dev_fuse: BorrowedFd<'_>,
        dispatcher: RawDispatcher<FS>,
        payload_size: usize,
        idle_class: bool,
        spin: Duration,
    ) -> io::Result<Rings> {
        let queues = possible_cpus();
        let dispatcher = Arc::new(dispatcher);
        let stop = Arc::new(AtomicBool::new(false));
        let served: Served = (0..queues).map(|_| AtomicU64::new(0)).collect();
        let activity = Arc::new(ring_guard::Activity::new(queues));
        let counters = RingCounters { served: served.clone(), idle_class: false, promotions: Arc::default() };
        let mut rings =
            Rings { counters, guard: None, stop: stop.clone(), wakes: Vec::new(), threads: Vec::new() };
        let (started, outcomes) = std::sync::mpsc::channel();
        for qid in 0..queues {
            let fd = dev_fuse.try_clone_to_owned()?;
            let (dispatcher, stop, started, served, activity) =
                (dispatcher.clone(), stop.clone(), started.clone(), served.clone(), activity.clone());
            let thread = std::thread::Builder::new().name(format!("fuse-ring-{qid}")).spawn(move || {
                let started_queue = Queue::new(qid as u16, fd, payload_size, spin, served, activity)
                    .and_then(|queue| {
                        // Registering runs inside the submit, so a refusal is already in the
                        // completion queue; requests may be too (the last queue makes the rings
                        // live), and are served first.
                        let early = queue.take_completions();
                        match early.iter().find(|(_, result)| *result < 0) {
                            Some(&(_, result)) => Err(io::Error::from_raw_os_error(-result)),
                            None => Ok((queue, early)),
                        }
                    });
                match started_queue.and_then(|(queue, early)| Ok((queue.wake.try_clone()?, queue, early))) {
                    Ok((wake, queue, early)) => {
                        let _ = started.send(Ok((qid, wake, unsafe { libc::gettid() })));
                        queue.serve(early, &*dispatcher, &stop);
                    }
                    Err(e) => {
                        let _ = started.send(Err(e));
                    }
                }
            })?;
            rings.threads.push(thread);
        }
        // By queue number, as `served` is: the threads report in whatever order they start.
        let mut tids = vec![0; queues];
        for _ in 0..queues {
            let (qid, wake, tid) =
                outcomes.recv().map_err(|_| io::Error::other("a ring thread died while starting"))??;
            rings.wakes.push(wake);
            tids[qid] = tid;
        }
        if idle_class {
            let watched = tids.into_iter().map(ring_guard::Watched::new).collect::<io::Result<Vec<_>>>();
            match watched.and_then(|w| {
                ring_guard::Guard::start(w, served, rings.counters.promotions.clone(), activity)
            }) {
                Ok(guard) => {
                    rings.guard = Some(guard);
                    rings.counters.idle_class = true;
                }
                Err(e) => tracing::info!("FUSE ring threads stay in the normal scheduling class: {e}"),
            }
        }
        Ok(rings)
    }

    /// The queues' counters (shared: they go on counting).
    pub fn counters(&self) -> RingCounters {
        self.counters.clone()
    }
}

impl Drop for Rings {
    fn drop(&mut self) {
        self.guard = None;
        self.stop.store(true, Ordering::Relaxed);
        for wake in &self.wakes {
            let _ = nix::unistd::write(wake, &1u64.to_ne_bytes());
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

thread_local! {
    /// On a queue's thread, that queue: the one whose request is being handled.
    static SERVING: std::cell::RefCell<Option<Arc<Queue>>> = const { std::cell::RefCell::new(None) };
}

/// Whether the request being handled may keep its entry while it waits (for a human): yes
/// while its queue's held entries, this one included, are at most [`MAX_WAITING`]. Off the
/// queues' threads, always: a request that came by `/dev/fuse` holds nothing other requests
/// need, and one re-run after an approval already holds its entry.
pub(super) fn may_wait() -> bool {
    SERVING.with(|serving| {
        let Some(queue) = &*serving.borrow() else { return true };
        // Only this thread adds to `held`, so it cannot grow between the check and the wait.
        let allowed = queue.held.load(Ordering::Relaxed) <= MAX_WAITING;
        if !allowed {
            static FULL: RateLimited = RateLimited::new();
            if let Some(held) = FULL.admit() {
                tracing::warn!(
                    qid = queue.qid,
                    "{MAX_WAITING} requests from this CPU wait for approval (the most its FUSE ring keeps for them): more are refused until approved (EACCES){held}"
                );
            }
        }
        allowed
    })
}

/// The kernel makes one queue per possible CPU (`nr_cpu_ids`) and takes requests from the
/// rings only once every queue has entries.
fn possible_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|list| cpus_in_list(&list))
        .unwrap_or_else(|| (unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }).max(1) as usize)
}

/// The number of CPU ids up to the last one in a kernel CPU list ("0-3,8-11" → 12).
fn cpus_in_list(list: &str) -> Option<usize> {
    list.trim().rsplit(['-', ',']).next()?.parse::<usize>().ok().map(|last| last + 1)
}

/// One entry's buffers, at fixed addresses the kernel was given at registration.
struct Buffers {
    header: Box<[u8; HEADER_BUFFER]>,
    payload: Payload,
    iov: [libc::iovec; 2],
    /// The kernel's name for the request the entry holds, given back with the reply.
    commit_id: u64,
}

// The iovecs point into the buffers the struct owns.
unsafe impl Send for Buffers {}

struct Entry {
    index: u64,
    buffers: Mutex<Buffers>,
}

impl Entry {
    fn new(index: u64, payload_size: usize) -> io::Result<Arc<Entry>> {
        let mut header = Box::new([0u8; HEADER_BUFFER]);
        let mut payload = Payload::new(payload_size)?;
        let iov = [
            libc::iovec { iov_base: header.as_mut_ptr().cast(), iov_len: HEADER_BUFFER },
            libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: payload.len() },
        ];
        Ok(Arc::new(Entry { index, buffers: Mutex::new(Buffers { header, payload, iov, commit_id: 0 }) }))
    }
}

/// An entry's payload buffer: its own anonymous mapping, so that its pages are touched only
/// by requests that need them (a megabyte from the allocator may come zeroed by `memset`).
struct Payload {
    start: std::ptr::NonNull<u8>,
    len: usize,
}

impl Payload {
    fn new(len: usize) -> io::Result<Payload> {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        let start = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0)
        };
        if start == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Payload { start: std::ptr::NonNull::new(start.cast()).expect("mmap gave a null mapping"), len })
    }
}

impl std::ops::Deref for Payload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.start.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for Payload {
    fn deref_mut(&mut self) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.start.as_ptr(), self.len) }
    }
}

impl Drop for Payload {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.start.as_ptr().cast(), self.len) };
    }
}

struct Queue {
    qid: u16,
    dev_fuse: OwnedFd,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    /// Commits of replies made on other threads, for the queue's thread to submit.
    late_commits: Mutex<Vec<(u64, u64)>>,
    /// Wakes the queue's thread for `late_commits` and for the stop (its ring polls it).
    wake: OwnedFd,
    entries: RwLock<Vec<Arc<Entry>>>,
    /// Entries whose request is with the daemon and not answered yet.
    held: AtomicUsize,
    payload_size: usize,
    thread: ThreadId,
    served: Served,
    /// Told of each request, for the guard's rest (see [`ring_guard`]).
    activity: Arc<ring_guard::Activity>,
    /// How long the thread looks for its next request before it sleeps (see [`Queue::wait`]).
    spin: Duration,
}

impl Queue {
    /// Sets the queue up and registers its first entries. A refusal (the connection did not
    /// negotiate io_uring) shows at once, as completions of the registration.
    fn new(
        qid: u16,
        dev_fuse: OwnedFd,
        payload_size: usize,
        spin: Duration,
        served: Served,
        activity: Arc<ring_guard::Activity>,
    ) -> io::Result<Arc<Queue>> {
        // On the CPU whose callers this queue serves. A CPU that is offline (or not ours to
        // use) leaves the thread unpinned: it serves callers only if the CPU comes online.
        let mut cpus = nix::sched::CpuSet::new();
        if cpus.set(qid as usize).is_ok() {
            let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &cpus);
        }
        // One command per entry at most, plus the eventfd poll.
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_cqsize(4 * MAX_ENTRIES as u32)
            .build(2 * MAX_ENTRIES as u32)?;
        let queue = Arc::new(Queue {
            qid,
            dev_fuse,
            ring,
            late_commits: Mutex::new(Vec::new()),
            wake: eventfd()?,
            entries: RwLock::new(Vec::new()),
            held: AtomicUsize::new(0),
            payload_size,
            thread: std::thread::current().id(),
            served,
            activity,
            spin,
        });
        queue.register_entries()?;
        Ok(queue)
    }

    /// Registers the queue's [`MAX_ENTRIES`] entries and submits them.
    fn register_entries(&self) -> io::Result<()> {
        let mut entries = self.entries.write();
        for index in 0..MAX_ENTRIES as u64 {
            let entry = Entry::new(index, self.payload_size)?;
            let iov = entry.buffers.lock().iov.as_ptr();
            let sqe = uring_cmd(self.dev_fuse.as_raw_fd(), CMD_REGISTER, self.qid, 0, Some(iov), entry.index);
            // The submission queue holds twice MAX_ENTRIES; an entry has one command at most.
            unsafe { self.ring.submission_shared().push(&sqe) }.map_err(|_| io::Error::other("ring full"))?;
            entries.push(entry);
        }
        self.ring.submit()?;
        Ok(())
    }

    /// Submits what is queued, waits for completions and takes them. The stop comes as one
    /// too (through the eventfd), so an idle queue sleeps until there is work.
    ///
    /// In the idle class the thread first looks for completions for [`Queue::spin`] without
    /// sleeping. Its caller's next request usually comes within microseconds of the reply,
    /// while the CPU has nothing else to run: found by looking, it costs no sleep and no
    /// wake-up (creates, deletes, untar and cold `stat` 8-18 % faster, see performance.md,
    /// 24.). The looking takes only CPU time no other thread wants (an idle-class thread
    /// yields at once to any other), and ends the spin's length after the last request.
    fn wait(&self) -> io::Result<Vec<(u64, i32)>> {
        if !self.spin.is_zero() && self.activity.may_spin(self.qid as usize) {
            interrupted_is_fine(self.ring.submit())?;
            let until = Instant::now() + self.spin;
            loop {
                let completions = self.take_completions();
                if !completions.is_empty() {
                    return Ok(completions);
                }
                if Instant::now() >= until {
                    break;
                }
                std::hint::spin_loop();
            }
        }
        interrupted_is_fine(self.ring.submitter().submit_and_wait(1))?;
        Ok(self.take_completions())
    }

    /// The completions the kernel has posted, taken off the queue (none is an empty vector,
    /// which costs no allocation). Only the queue's thread calls this.
    fn take_completions(&self) -> Vec<(u64, i32)> {
        // SAFETY: only the queue's thread reads completions.
        unsafe { self.ring.completion_shared() }.map(|cqe| (cqe.user_data(), cqe.result())).collect()
    }

    /// Serves requests until the connection ends or `stop` is set, starting with `early`.
    fn serve<FS: Filesystem>(
        self: Arc<Self>,
        early: Vec<(u64, i32)>,
        dispatcher: &RawDispatcher<FS>,
        stop: &AtomicBool,
    ) {
        let mut request = Vec::with_capacity(64 * 1024);
        let mut ended = 0;
        let mut completions = early;
        SERVING.with(|serving| *serving.borrow_mut() = Some(self.clone()));
        self.watch_wake();
        while !stop.load(Ordering::Relaxed) {
            for (index, result) in completions {
                match result {
                    _ if index == WAKE => {
                        let mut count = [0u8; 8];
                        let _ = nix::unistd::read(self.wake.as_raw_fd(), &mut count);
                        let late = std::mem::take(&mut *self.late_commits.lock());
                        for (index, commit_id) in late {
                            self.submit_commit(index, commit_id);
                        }
                        self.watch_wake();
                    }
                    0 => self.handle(index, &mut request, dispatcher),
                    // The connection is gone (unmount or abort): the kernel ends every entry.
                    _ => {
                        static ENDED: RateLimited = RateLimited::new();
                        if result != -libc::ENOTCONN && result != -libc::ECANCELED {
                            if let Some(held) = ENDED.admit() {
                                tracing::warn!(
                                    qid = self.qid,
                                    "FUSE ring entry ended: errno {}{held}",
                                    -result
                                );
                            }
                        }
                        ended += 1;
                    }
                }
            }
            // Replies given on this thread are batched and go with the next wait.
            if ended >= self.entries.read().len() {
                return;
            }
            completions = match self.wait() {
                Ok(completions) => completions,
                Err(e) => {
                    tracing::warn!(qid = self.qid, "FUSE ring failed: {e}");
                    return;
                }
            };
        }
    }

    /// Rebuilds the request in the classic layout (in header, operation header, arguments)
    /// and dispatches it; the reply may come later, from another thread.
    fn handle<FS: Filesystem>(
        self: &Arc<Self>,
        index: u64,
        request: &mut Vec<u8>,
        dispatcher: &RawDispatcher<FS>,
    ) {
        let Some(entry) = self.entries.read().get(index as usize).cloned() else { return };
        let unique = {
            let mut buffers = entry.buffers.lock();
            let (unique, commit_id) = read_request(&buffers.header, &buffers.payload, request);
            buffers.commit_id = commit_id;
            unique
        };
        self.held.fetch_add(1, Ordering::Relaxed);
        self.served[self.qid as usize].fetch_add(1, Ordering::Relaxed);
        self.activity.request();
        let reply = Arc::new(RingReply { queue: self.clone(), entry, sent: AtomicBool::new(false) });
        static BAD: RateLimited = RateLimited::new();
        if let Err(e) = dispatcher.dispatch(request, reply.clone()) {
            if let Some(held) = BAD.admit() {
                tracing::warn!(qid = self.qid, "bad request from the FUSE ring: {e}{held}");
            }
        }
        // Every request that comes by ring has a reply; one that got none would keep its
        // entry for good.
        if Arc::strong_count(&reply) == 1 && !reply.sent.load(Ordering::Relaxed) {
            reply.send_error(unique, libc::EIO);
        }
    }

    /// Gives an entry back with its reply, asking for the next request: at the queue's next
    /// wait when on its thread, else through that thread.
    fn commit(&self, index: u64, commit_id: u64) {
        if std::thread::current().id() == self.thread {
            self.submit_commit(index, commit_id);
        } else {
            self.late_commits.lock().push((index, commit_id));
            let _ = nix::unistd::write(&self.wake, &1u64.to_ne_bytes());
        }
    }

    /// Queues a `COMMIT_AND_FETCH` (queue's thread only: the next wait submits it).
    fn submit_commit(&self, index: u64, commit_id: u64) {
        let sqe =
            uring_cmd(self.dev_fuse.as_raw_fd(), CMD_COMMIT_AND_FETCH, self.qid, commit_id, None, index);
        // Room for one command per entry, and one for the eventfd.
        if unsafe { self.ring.submission_shared().push(&sqe) }.is_err() {
            queue_full(self.qid);
        }
    }

    /// Asks the ring to complete [`WAKE`] when the eventfd is written (queue's thread only).
    fn watch_wake(&self) {
        let poll = opcode::PollAdd::new(types::Fd(self.wake.as_raw_fd()), libc::POLLIN as u32)
            .build()
            .user_data(WAKE);
        if unsafe { self.ring.submission_shared().push(&poll.into()) }.is_err() {
            queue_full(self.qid);
        }
    }
}

/// A command found no room in the submission queue (there is room for one per entry).
fn queue_full(qid: u16) {
    static FULL: RateLimited = RateLimited::new();
    if let Some(held) = FULL.admit() {
        tracing::error!(qid, "FUSE ring submission queue full{held}");
    }
}

/// The reply side of one request that came by ring.
struct RingReply {
    queue: Arc<Queue>,
    entry: Arc<Entry>,
    sent: AtomicBool,
}

impl RingReply {
    fn send_error(&self, unique: u64, errno: i32) {
        let mut header = [0u8; OUT_HEADER];
        header[..4].copy_from_slice(&(OUT_HEADER as u32).to_ne_bytes());
        header[4..8].copy_from_slice(&(-errno).to_ne_bytes());
        header[8..].copy_from_slice(&unique.to_ne_bytes());
        let _ = self.send(&[IoSlice::new(&header)]);
    }
}

impl RawReplySink for RingReply {
    /// The out header goes to the header buffer, everything after it to the payload.
    fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        if self.sent.swap(true, Ordering::Relaxed) {
            return Err(io::Error::other("second reply to one FUSE request"));
        }
        let commit_id = {
            let mut buffers = self.entry.buffers.lock();
            let Buffers { header, payload, .. } = &mut *buffers;
            write_reply(data, header, payload);
            buffers.commit_id
        };
        self.queue.held.fetch_sub(1, Ordering::Relaxed);
        self.queue.commit(self.entry.index, commit_id);
        Ok(())
    }
}

/// Puts the request an entry holds into `request` in the classic layout (in header, operation
/// header, arguments) and returns its `unique` and the kernel's `commit_id` for it.
fn read_request(header: &[u8; HEADER_BUFFER], payload: &[u8], request: &mut Vec<u8>) -> (u64, u64) {
    let total = u32_at(header, 0) as usize;
    let payload = &payload[..(u32_at(header, PAYLOAD_SIZE_AT) as usize).min(payload.len())];
    // The in header counts the request's full length, so the operation header is what the
    // arguments leave of it.
    let op_header = total.saturating_sub(IN_HEADER + payload.len()).min(OP_HEADER_MAX);
    request.clear();
    request.extend_from_slice(&header[..IN_HEADER]);
    request.extend_from_slice(&header[OP_HEADER_AT..OP_HEADER_AT + op_header]);
    request.extend_from_slice(payload);
    let length = request.len() as u32;
    request[..4].copy_from_slice(&length.to_ne_bytes());
    (u64_at(header, 8), u64_at(header, COMMIT_ID_AT))
}

/// Puts a reply (an out header and its data, in any slicing) into an entry: the out header to
/// the header buffer, the rest to the payload, whose size goes to `fuse_uring_ent_in_out`.
/// A reply larger than the payload (none is: replies are at most `max_write`) becomes EIO
/// rather than arriving cut.
fn write_reply(data: &[IoSlice<'_>], header: &mut [u8; HEADER_BUFFER], payload: &mut [u8]) {
    let total: usize = data.iter().map(|d| d.len()).sum();
    let mut body = total.saturating_sub(OUT_HEADER);
    let fits = body <= payload.len();
    for (at, &byte) in data.iter().flat_map(|slice| slice.iter()).take(OUT_HEADER).enumerate() {
        header[at] = byte;
    }
    if fits {
        let mut skip = OUT_HEADER;
        let mut at = 0;
        for slice in data {
            let part = &slice[skip.min(slice.len())..];
            skip = skip.saturating_sub(slice.len());
            payload[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
    } else {
        header[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
        body = 0;
    }
    header[..4].copy_from_slice(&((OUT_HEADER + body) as u32).to_ne_bytes());
    header[PAYLOAD_SIZE_AT..PAYLOAD_SIZE_AT + 4].copy_from_slice(&(body as u32).to_ne_bytes());
}

/// An `IORING_OP_URING_CMD` for `/dev/fuse` carrying `fuse_uring_cmd_req` (`flags`,
/// `commit_id`, `qid`); registration also names the entry's two buffers.
fn uring_cmd(
    fd: i32,
    command: u32,
    qid: u16,
    commit_id: u64,
    iov: Option<*const libc::iovec>,
    user_data: u64,
) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    let mut op = opcode::UringCmd80::new(types::Fd(fd), command).cmd(cmd);
    if let Some(iov) = iov {
        op = op.addr(Some(iov as u64));
    }
    let sqe = op.build().user_data(user_data);
    match iov {
        // The kernel wants `len` = 2 (header and payload iovecs), which the builder has no
        // setter for: it is the `u32` at byte 24 of `struct io_uring_sqe`.
        Some(_) => {
            const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);
            let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
            raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
            unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
        }
        None => sqe,
    }
}

fn eventfd() -> io::Result<OwnedFd> {
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap())
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap())
}

/// A submit a signal interrupted has submitted what it could; the next wait takes the rest.
fn interrupted_is_fine(submitted: io::Result<usize>) -> io::Result<()> {
    match submitted {
        Err(e) if e.raw_os_error() != Some(libc::EINTR) => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
#[path = "ring_tests.rs"]
mod tests;
