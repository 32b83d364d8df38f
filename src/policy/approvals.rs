//! Pending approvals (interrupts): tickets waiting for a human, their resolution, expiry,
//! subscribers, and the session-scope grants that approvals leave behind.
//!
//! A ticket owns a *waiter*: a callback that receives the outcome. The FUSE door's waiter
//! holds the kernel's reply object and re-runs the operation, so a paused syscall occupies no
//! thread; the tool door's waiter wakes the request thread that asked. Waiters always run
//! outside the lock, on the thread that resolved (or expired) the ticket.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::audit::{Audit, AuditEvent};
use crate::display::Escaped;
use crate::policy::{Op, Refusal};
use crate::vpath::VPath;
use preview::Preview;

pub type ApprovalId = u64;

/// Past this many pending approvals new interrupts are refused at once: a runaway agent must
/// not be able to pile up unbounded tickets (each may hold a kernel request).
pub const MAX_PENDING: usize = 1024;

/// How many of the pending approvals one user (uid) may hold, a quarter of the bound: an agent
/// that fills its share leaves the rest to everyone else.
pub fn share_of(max_pending: usize) -> usize {
    (max_pending / 4).max(1)
}

/// Takes `by` from `uid`'s count, forgetting a uid left with none.
fn decrease(counts: &mut HashMap<u32, usize>, uid: u32, by: usize) {
    if let std::collections::hash_map::Entry::Occupied(mut count) = counts.entry(uid) {
        *count.get_mut() -= by;
        if *count.get() == 0 {
            count.remove();
        }
    }
}

/// How often the sweeper looks for expired tickets and callers that died, while there are any
/// tickets or retry grants (otherwise it sleeps until one comes: see [`Bell`]).
const SWEEP_EVERY: Duration = Duration::from_millis(200);

/// How many ended tickets are remembered, so that resolving one says how it ended.
const ENDED_KEPT: usize = 4 * MAX_PENDING;

/// What the engine hands a door when the gate wants a human: the refusal and the syscall
/// or tool operation that met it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interrupted {
    pub operation: String,
    pub refusal: Refusal,
    /// For a rename or link, its two paths ([`retry::names_key`]).
    pub names: Option<u64>,
    /// For a rename or link, its path other than the one judged, for the ticket.
    pub other: Option<VPath>,
}

/// What a ticket asks about.
#[derive(Clone, Debug)]
pub struct Request {
    /// "fuse" or "tool".
    pub door: &'static str,
    /// The syscall or tool name.
    pub operation: String,
    pub op: Op,
    pub path: VPath,
    pub rule: Option<usize>,
    pub pid: u32,
    pub uid: u32,
    /// The process's command line (syscalls).
    pub command: String,
    /// The tool call (tool calls only).
    pub tool: Option<ToolCall>,
    /// For a rename or link at the mount, its two paths ([`retry::names_key`]): its approved
    /// retry must join the same two.
    pub names: Option<u64>,
    /// For a rename or link, its path other than `path` (shown as `other_path`).
    pub other: Option<VPath>,
}

/// The tool call a ticket asks about.
#[derive(Clone, Debug)]
pub struct ToolCall {
    pub name: String,
    /// What the approver is shown of the arguments: a bounded preview, not the call's copy
    /// (a waiting call keeps its own; a deferred one sends them again with `ticket: N`).
    pub arguments: Preview,
    /// Where the call's path leads through symlinks, when that is elsewhere: the path the
    /// rule matched. (The kernel resolves a syscall's links before the daemon sees it, so
    /// only a tool call names a path other than the one judged.)
    pub resolved: Option<VPath>,
    /// Where the approved call may act under an interrupt rule.
    pub reach: Reach,
    /// The control socket it came through (`agent` or `control`): with the request's `pid`
    /// and `uid`, the principal. (A syscall's ticket has none: it came through the mount.)
    pub socket: &'static str,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Once,
    Session,
}

/// A human's answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    Approve(Scope),
    Reject(Option<String>),
    /// Tool calls only: run these arguments instead.
    Edit(Value),
    /// Tool calls only: do not run; this is the result.
    Respond(String),
}

impl Decision {
    fn name(&self) -> &'static str {
        match self {
            Decision::Approve(Scope::Once) => "approve",
            Decision::Approve(Scope::Session) => "approve-session",
            Decision::Reject(_) => "reject",
            Decision::Edit(_) => "edit",
            Decision::Respond(_) => "respond",
        }
    }
}

/// What the waiter is told.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Decided(Decision),
    TimedOut,
    /// Nobody waits for the answer any more: the calling process exited, or the client of
    /// the tool call disconnected ([`Approvals::withdraw`]).
    CallerGone,
    /// Refused at once: too many approvals pending.
    Overloaded(Overload),
    /// The daemon is stopping.
    Cancelled,
    /// The waiting process got a signal (Ctrl-C): it stops waiting, and nothing runs.
    Interrupted,
}

pub type Waiter = Box<dyn FnOnce(ApprovalId, Outcome) + Send>;

/// Which bound refused a ticket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overload {
    /// The caller's user already holds its share ([`share_of`]).
    Share { uid: u32, limit: usize },
    /// Users other than root hold all but root's share, which is kept for root.
    Others { limit: usize },
    /// Every place is taken.
    All { limit: usize },
    /// The guarded entries listed in pending tickets would pass their bound (of this user's,
    /// or of everyone's when `uid` is `None`), in bytes.
    Listed { uid: Option<u32>, limit: usize },
}

impl Overload {
    /// Why, for the caller's error and the log.
    pub fn reason(&self) -> String {
        match self {
            Overload::Share { uid, limit } => {
                format!("uid {uid} already has {limit} approvals pending (one user's share)")
            }
            Overload::Others { limit } => format!(
                "users other than root already have {limit} approvals pending (the rest is kept for root)"
            ),
            Overload::All { limit } => format!("{limit} approvals are already pending (the limit)"),
            Overload::Listed { uid: Some(uid), limit } => format!(
                "the guarded entries listed in the approvals uid {uid} has pending would pass {} MiB (one user's share)",
                limit >> 20
            ),
            Overload::Listed { uid: None, limit } => {
                format!("the guarded entries listed in pending approvals would pass {} MiB", limit >> 20)
            }
        }
    }
}

struct Ticket {
    /// Its command line is at most [`preview::COMMAND_SHOWN`] bytes ([`Ticket::command_bytes`]).
    request: Request,
    /// The length of the whole command line, when it was cut.
    command_bytes: Option<usize>,
    created: SystemTime,
    expires: SystemTime,
    deadline: Instant,
    /// Pairs an earlier approval of the same operation already covered (a rename whose two
    /// paths both interrupt asks twice, and the second run needs both).
    inherited: Vec<(Op, VPath)>,
    /// Refused at once rather than paused (a change of names: the kernel holds the
    /// directory's lock for as long as its request waits); approving it lets the caller's
    /// next attempt through ([`retry`]). Nobody waits, so the caller's exit does not end it.
    retry: bool,
    waiter: Waiter,
}

/// What an approval lets pass while its operation re-runs.
enum Cover {
    /// A syscall: exactly these (operation class, path) pairs.
    Pairs(Vec<(Op, VPath)>),
    /// A tool call: the interrupt verdicts of that one call within its [`ToolCall::reach`]
    /// (deny rules still apply).
    Call(Reach),
}

/// A session-scope approval: `op` on `root` and everything beneath it, by the user whose
/// request was approved (through either door), not by anyone else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub op: Op,
    pub root: VPath,
    pub uid: u32,
}

type Subscriber = Box<dyn Fn(&Value) -> bool + Send + Sync>;

#[derive(Default)]
struct Inner {
    pending: BTreeMap<ApprovalId, Ticket>,
    /// How many of `pending` each uid holds (uids holding none are absent).
    held: HashMap<u32, usize>,
    /// The bytes of the guarded entries `pending` lists ([`Reach::guarded`]), per uid and in all.
    listed: HashMap<u32, usize>,
    listed_total: usize,
    covers: HashMap<ApprovalId, Cover>,
    grants: Vec<Grant>,
    /// Approved refusals waiting for their caller's next attempt.
    retries: Vec<retry::RetryGrant>,
    subscribers: Vec<(u64, Arc<Subscriber>)>,
    /// How recently ended tickets ended (the newest [`ENDED_KEPT`]), for `resolve`'s error.
    ended: BTreeMap<ApprovalId, String>,
}

impl Inner {
    fn put(&mut self, id: ApprovalId, ticket: Ticket) {
        let uid = ticket.request.uid;
        *self.held.entry(uid).or_default() += 1;
        let listed = listed_bytes(&ticket.request);
        if listed > 0 {
            *self.listed.entry(uid).or_default() += listed;
            self.listed_total += listed;
        }
        self.pending.insert(id, ticket);
    }

    fn take(&mut self, id: ApprovalId) -> Option<Ticket> {
        let ticket = self.pending.remove(&id)?;
        let uid = ticket.request.uid;
        decrease(&mut self.held, uid, 1);
        let listed = listed_bytes(&ticket.request);
        decrease(&mut self.listed, uid, listed);
        self.listed_total -= listed;
        Some(ticket)
    }

    /// Which bound a new ticket `request` would pass, if any: its user's share, then (for
    /// users other than root) all but root's share, then the whole bound. Root's share is
    /// kept for it, so agents of several users together cannot shut the operator out either.
    /// The guarded entries a bulk tool call lists are bounded in bytes the same way (one
    /// user's share, then everyone's), so pending tickets cannot hold the daemon's memory.
    fn overload(&self, request: &Request, max_pending: usize) -> Option<Overload> {
        let uid = request.uid;
        let share = share_of(max_pending);
        let others = max_pending.saturating_sub(share).max(share);
        let listed = listed_bytes(request);
        if listed > 0 && self.listed.get(&uid).copied().unwrap_or(0) + listed > LISTED_SHARE {
            Some(Overload::Listed { uid: Some(uid), limit: LISTED_SHARE })
        } else if listed > 0 && self.listed_total + listed > LISTED_ALL {
            Some(Overload::Listed { uid: None, limit: LISTED_ALL })
        } else if self.held.get(&uid).copied().unwrap_or(0) >= share {
            Some(Overload::Share { uid, limit: share })
        } else if uid != 0 && self.pending.len() - self.held.get(&0).copied().unwrap_or(0) >= others {
            Some(Overload::Others { limit: others })
        } else if self.pending.len() >= max_pending {
            Some(Overload::All { limit: max_pending })
        } else {
            None
        }
    }

    fn ended(&mut self, id: ApprovalId, how: String) {
        self.ended.insert(id, how);
        while self.ended.len() > ENDED_KEPT {
            self.ended.pop_first();
        }
    }
}

/// Wakes the sweeper: a ticket opened, or the approvals were dropped.
#[derive(Default)]
struct Bell {
    rung: Mutex<bool>,
    ringing: parking_lot::Condvar,
}

impl Bell {
    fn ring(&self) {
        *self.rung.lock() = true;
        self.ringing.notify_all();
    }

    fn wait(&self) {
        let mut rung = self.rung.lock();
        while !*rung {
            self.ringing.wait(&mut rung);
        }
        *rung = false;
    }
}

pub struct Approvals {
    inner: Mutex<Inner>,
    /// Wakes the sweeper (which holds no reference to the approvals while it sleeps).
    bell: Arc<Bell>,
    /// How many retry grants an operation in flight has claimed and not yet spent: the
    /// common case (none) costs one atomic load per change of names.
    claimed: std::sync::atomic::AtomicUsize,
    next_id: AtomicU64,
    next_subscriber: AtomicU64,
    timeout_ms: AtomicU64,
    max_pending: usize,
    audit: OnceLock<Arc<Audit>>,
}

impl Default for Approvals {
    fn default() -> Self {
        Approvals::new(Duration::from_secs(300), MAX_PENDING)
    }
}

/// The kernel aborts a FUSE request after `fs.fuse.max_request_timeout` seconds (0: never);
/// a paused syscall must be answered before that, so the timeout stays a second below it.
pub fn effective_timeout(configured: Duration, kernel_max_seconds: u64) -> Duration {
    if kernel_max_seconds == 0 {
        return configured;
    }
    let cap = Duration::from_secs(kernel_max_seconds.saturating_sub(1).max(1));
    configured.min(cap)
}

/// The kernel's `fs.fuse.max_request_timeout` (0 when unset or unknown).
pub fn kernel_max_request_timeout() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/fuse/max_request_timeout")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Where a session grant for `path` is rooted. An operation on a directory (mkdir, readdir,
/// rmdir) is rooted at the directory itself; anything else at its parent. So the first
/// `mkdir /secrets/dst` of `cp -r src /secrets/dst` grants `/secrets/dst/**` and every file
/// cp then creates there passes, while `cp a b /secrets/` grants `/secrets/**` from the
/// first file. Never rooted at `/`, which would grant everything: a file directly under it is
/// granted alone, and an operation on `/` itself (an `ls /`, a `grep` without a path) gets no
/// grant (`None`: its approval holds once).
pub fn grant_root(path: &VPath, is_dir_operation: bool) -> Option<VPath> {
    if path.is_root() {
        None
    } else if is_dir_operation || path.parent().is_root() {
        Some(path.clone())
    } else {
        Some(path.parent())
    }
}

fn is_dir_operation(operation: &str) -> bool {
    matches!(operation, "mkdir" | "rmdir" | "readdir" | "opendir" | "ls" | "glob" | "grep")
}

impl Approvals {
    pub fn new(timeout: Duration, max_pending: usize) -> Approvals {
        Approvals {
            inner: Mutex::new(Inner::default()),
            bell: Arc::default(),
            claimed: std::sync::atomic::AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            next_subscriber: AtomicU64::new(1),
            timeout_ms: AtomicU64::new(timeout.as_millis() as u64),
            max_pending,
            audit: OnceLock::new(),
        }
    }

    pub fn set_audit(&self, audit: Arc<Audit>) {
        let _ = self.audit.set(audit);
    }

    /// Sets the timeout, capped below the kernel's request timeout.
    pub fn set_timeout(&self, timeout: Duration) {
        let timeout = effective_timeout(timeout, kernel_max_request_timeout());
        self.timeout_ms.store(timeout.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
    }

    pub fn pending_count(&self) -> usize {
        self.inner.lock().pending.len()
    }

    /// Opens a ticket and returns its id; the waiter is told the outcome exactly once.
    /// `inherit` names the approval under which the operation was re-running, whose pairs the
    /// new one keeps. `None` when too many are pending (the waiter was told so already).
    pub fn submit(
        &self,
        request: Request,
        inherit: Option<ApprovalId>,
        waiter: Waiter,
    ) -> Option<ApprovalId> {
        let inner = self.inner.lock();
        let inherited = match inherit.and_then(|i| inner.covers.get(&i)) {
            Some(Cover::Pairs(pairs)) => pairs.clone(),
            _ => Vec::new(),
        };
        self.open(inner, request, inherited, false, waiter)
    }

    /// Opens a ticket under the lock `inner` (released here), records it and tells the
    /// subscribers; past the bound, refuses it and tells the waiter so.
    fn open(
        &self,
        mut inner: parking_lot::MutexGuard<'_, Inner>,
        mut request: Request,
        inherited: Vec<(Op, VPath)>,
        retry: bool,
        waiter: Waiter,
    ) -> Option<ApprovalId> {
        // A command line can be megabytes: the ticket (and its audit records) keep its start.
        let (command, command_bytes) = preview::shorten(&request.command, preview::COMMAND_SHOWN);
        request.command = command;
        if let Some(overload) = inner.overload(&request, self.max_pending) {
            drop(inner);
            static OVERLOADED: crate::log_limit::RateLimited = crate::log_limit::RateLimited::new();
            if let Some(held) = OVERLOADED.admit() {
                tracing::warn!(
                    "refusing {} {} {} of uid {}: {}{held}",
                    Escaped(&request.operation),
                    request.op.as_str(),
                    Escaped(request.path.as_str()),
                    request.uid,
                    overload.reason()
                );
            }
            self.record(&request, "interrupt-overloaded", "");
            waiter(0, Outcome::Overloaded(overload));
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let created = SystemTime::now();
        let timeout = self.timeout();
        let ticket = Ticket {
            request,
            command_bytes,
            created,
            expires: created + timeout,
            deadline: Instant::now() + timeout,
            inherited,
            retry,
            waiter,
        };
        let view = preview::describe(id, &ticket);
        self.record(&ticket.request, if retry { "interrupt-retry" } else { "interrupt" }, "");
        inner.put(id, ticket);
        let subscribers = inner.subscribers.clone();
        drop(inner);
        self.bell.ring();
        self.notify(subscribers, json!({"event": "created", "interrupt": view}));
        Some(id)
    }

    /// The pending approvals, oldest first.
    pub fn list(&self) -> Vec<Value> {
        self.inner.lock().pending.iter().map(|(id, t)| preview::describe(*id, t)).collect()
    }

    /// Pending approval `id` as the list shows it.
    pub fn describe(&self, id: ApprovalId) -> Option<Value> {
        self.inner.lock().pending.get(&id).map(|t| preview::describe(id, t))
    }

    /// Pending approval `id` as the caller that asked is shown it: without the entries
    /// beneath its path that interrupt rules guard (those are for the approver's eyes).
    pub fn describe_for_caller(&self, id: ApprovalId) -> Option<Value> {
        let mut view = self.describe(id)?;
        if let Some(tool) = view["tool"].as_object_mut() {
            tool.remove("guarded");
        }
        if let Some(cut) = view["cut"].as_array_mut() {
            cut.retain(|entry| entry["at"] != "/tool/guarded");
        }
        Some(view)
    }

    /// Resolves ticket `id`; `by` says who, for the audit log.
    pub fn resolve(&self, id: ApprovalId, decision: Decision, by: &str) -> Result<Value, String> {
        let mut inner = self.inner.lock();
        let Some(ticket) = inner.pending.get(&id) else {
            return Err(match inner.ended.get(&id) {
                Some(how) => format!("approval #{id} is no longer pending: {how}"),
                None => format!("no pending approval #{id} (it was resolved, expired, or never existed)"),
            });
        };
        let is_tool = ticket.request.tool.is_some();
        if matches!(decision, Decision::Edit(_) | Decision::Respond(_)) && !is_tool {
            return Err(format!(
                "approval #{id} is a syscall; only `approve` and `reject` apply (edit and respond are for tool calls)"
            ));
        }
        let ticket = inner.take(id).expect("present");
        if matches!(decision, Decision::Approve(_) | Decision::Edit(_)) {
            let cover = if let Some(call) = &ticket.request.tool {
                Cover::Call(call.reach.clone())
            } else {
                let mut pairs = ticket.inherited.clone();
                pairs.push((ticket.request.op, ticket.request.path.clone()));
                Cover::Pairs(pairs)
            };
            if ticket.retry {
                self.grant_retry(&mut inner, &ticket);
            } else {
                inner.covers.insert(id, cover);
            }
        }
        let mut granted = None;
        if decision == Decision::Approve(Scope::Session) {
            // Through a symlink, the grant is where it leads: the directory the rule matched.
            let judged = ticket.request.tool.as_ref().and_then(|call| call.resolved.as_ref());
            let path = judged.unwrap_or(&ticket.request.path);
            if let Some(root) = grant_root(path, is_dir_operation(&ticket.request.operation)) {
                granted = Some(
                    json!({"op": ticket.request.op.as_str(), "root": root.as_str(), "uid": ticket.request.uid}),
                );
                let grant = Grant { op: ticket.request.op, root, uid: ticket.request.uid };
                if !inner.grants.contains(&grant) {
                    inner.grants.push(grant);
                }
            }
        }
        inner.ended(id, format!("it was already answered ({} by {by})", decision.name()));
        let mut view = preview::describe(id, &ticket);
        view["decision"] = json!(decision.name());
        view["resolved_by"] = json!(by);
        if let Some(granted) = granted {
            // What the session now lets pass: every `op` at or beneath `root`.
            view["session_grant"] = granted;
        }
        let subscribers = inner.subscribers.clone();
        drop(inner);
        self.record(&ticket.request, decision.name(), by);
        self.notify(subscribers, json!({"event": "resolved", "interrupt": view.clone()}));
        (ticket.waiter)(id, Outcome::Decided(decision));
        Ok(view)
    }

    /// An approved tool call that runs with edited arguments acts where those lead: its
    /// cover becomes `reach` (from the edited call, as [`ToolCall::reach`]).
    pub fn cover_call(&self, id: ApprovalId, reach: Reach) {
        if let Some(cover @ Cover::Call(_)) = self.inner.lock().covers.get_mut(&id) {
            *cover = Cover::Call(reach);
        }
    }

    /// Ends the run an approval allowed: its cover no longer lets anything pass.
    pub fn finish(&self, id: ApprovalId) {
        self.inner.lock().covers.remove(&id);
    }

    /// Whether an interrupt verdict on (`op`, `path`) asked by `uid` may pass: under the
    /// approval the operation re-runs with, or under a session grant of that user's.
    pub fn covers(&self, approval: Option<ApprovalId>, op: Op, path: &VPath, uid: u32) -> bool {
        let inner = self.inner.lock();
        let by_ticket = approval.and_then(|id| inner.covers.get(&id)).is_some_and(|c| match c {
            Cover::Call(reach) => reach.covers(path),
            Cover::Pairs(pairs) => pairs.iter().any(|(o, p)| *o == op && p == path),
        });
        by_ticket || inner.grants.iter().any(|g| g.op == op && g.uid == uid && path.starts_with(&g.root))
    }

    pub fn grants(&self) -> Vec<Grant> {
        self.inner.lock().grants.clone()
    }

    /// Session grants (and approved retries not yet made) last until the rules change.
    pub fn clear_grants(&self) {
        let mut inner = self.inner.lock();
        inner.grants.clear();
        inner.retries.retain(|r| r.claimed_by.is_some());
    }

    /// Calls `send` with every notification until it returns false (the peer went away) or
    /// [`Approvals::unsubscribe`] is called.
    pub fn subscribe(&self, send: impl Fn(&Value) -> bool + Send + Sync + 'static) -> u64 {
        let id = self.next_subscriber.fetch_add(1, Ordering::Relaxed);
        self.inner.lock().subscribers.push((id, Arc::new(Box::new(send))));
        id
    }

    pub fn unsubscribe(&self, id: u64) {
        self.inner.lock().subscribers.retain(|(s, _)| *s != id);
    }

    fn notify(&self, subscribers: Vec<(u64, Arc<Subscriber>)>, params: Value) {
        let message = json!({"jsonrpc": "2.0", "method": "notifications/interrupt", "params": params});
        let dead: Vec<u64> =
            subscribers.iter().filter(|(_, send)| !send(&message)).map(|(id, _)| *id).collect();
        if !dead.is_empty() {
            self.inner.lock().subscribers.retain(|(id, _)| !dead.contains(id));
        }
    }

    /// Answers every pending ticket (the daemon is stopping: paused callers get EACCES
    /// rather than hold the unmount up).
    pub fn cancel_all(&self) {
        self.sweep_with(true);
    }

    /// Expires tickets past their deadline and those whose calling process has exited.
    pub fn sweep(&self) {
        self.sweep_with(false);
    }

    fn sweep_with(&self, cancel: bool) {
        let now = Instant::now();
        let mut inner = self.inner.lock();
        if !cancel {
            inner.retries.retain(|r| r.claimed_by.is_some() || r.deadline > now);
        }
        let mut done = Vec::new();
        for (id, t) in &inner.pending {
            if cancel {
                done.push((*id, Outcome::Cancelled));
            } else if t.deadline <= now {
                done.push((*id, Outcome::TimedOut));
            } else if t.request.door == "fuse" && !t.retry && !process_alive(t.request.pid) {
                done.push((*id, Outcome::CallerGone));
            }
        }
        self.end(inner, done);
    }

    /// Withdraws ticket `id` because nobody waits for its answer any more (the client of the
    /// tool call that asked disconnected): it is answered `caller-gone`, and its operation
    /// does not run. False when it was not pending.
    pub fn withdraw(&self, id: ApprovalId) -> bool {
        self.end(self.inner.lock(), vec![(id, Outcome::CallerGone)]) > 0
    }

    /// Withdraws ticket `id` because the process waiting for it got a signal: answered
    /// `interrupted`, and its operation does not run. False when it was not pending.
    pub fn interrupt(&self, id: ApprovalId) -> bool {
        self.end(self.inner.lock(), vec![(id, Outcome::Interrupted)]) > 0
    }

    /// Whether ticket `id` still waits for a human.
    pub fn is_pending(&self, id: ApprovalId) -> bool {
        self.inner.lock().pending.contains_key(&id)
    }

    /// Ends those of the tickets `done` still pending without a human: removes them,
    /// remembers how they ended, tells the audit log, the subscribers and the waiters (outside
    /// the lock). Returns how many it ended.
    fn end(&self, mut inner: parking_lot::MutexGuard<'_, Inner>, done: Vec<(ApprovalId, Outcome)>) -> usize {
        let mut tickets = Vec::new();
        for (id, outcome) in done {
            let Some(ticket) = inner.take(id) else { continue };
            let how = match (&outcome, ticket.request.door) {
                (Outcome::TimedOut, _) => "it timed out".to_string(),
                (Outcome::Cancelled, _) => "it was cancelled because the daemon is stopping".to_string(),
                (Outcome::Interrupted, _) => {
                    "it was withdrawn because the process that asked was interrupted".to_string()
                }
                (_, "tool") => "it was withdrawn because the client that asked disconnected".to_string(),
                _ => "it was withdrawn because the process that asked exited".to_string(),
            };
            inner.ended(id, how);
            tickets.push((id, outcome, ticket));
        }
        let subscribers = inner.subscribers.clone();
        drop(inner);
        let ended = tickets.len();
        for (id, outcome, ticket) in tickets {
            let name = match outcome {
                Outcome::TimedOut => "timeout",
                Outcome::Cancelled => "cancelled",
                Outcome::Interrupted => "interrupted",
                _ => "caller-gone",
            };
            let mut view = preview::describe(id, &ticket);
            view["decision"] = json!(name);
            self.record(&ticket.request, name, "agentvfs");
            self.notify(subscribers.clone(), json!({"event": "resolved", "interrupt": view}));
            (ticket.waiter)(id, outcome);
        }
        ended
    }

    /// Starts the sweeper thread; it ends when the approvals are dropped. It sweeps every
    /// [`SWEEP_EVERY`] while tickets or retry grants exist, and otherwise sleeps until a ticket
    /// opens, so an idle daemon's sweeper never wakes.
    pub fn start_sweeper(self: &Arc<Self>) {
        let weak: Weak<Approvals> = Arc::downgrade(self);
        let bell = self.bell.clone();
        let spawned = std::thread::Builder::new().name("interrupt-sweeper".into()).spawn(move || loop {
            let idle = match weak.upgrade() {
                Some(approvals) => {
                    let inner = approvals.inner.lock();
                    inner.pending.is_empty() && inner.retries.is_empty()
                }
                None => return,
            };
            if idle {
                bell.wait();
                continue;
            }
            std::thread::sleep(SWEEP_EVERY);
            match weak.upgrade() {
                Some(approvals) => approvals.sweep(),
                None => return,
            }
        });
        if let Err(e) = spawned {
            tracing::error!("cannot start the interrupt sweeper: {e}");
        }
    }

    fn record(&self, request: &Request, decision: &str, by: &str) {
        let Some(audit) = self.audit.get() else { return };
        // What the ticket shows, and so as bounded; a cut is said (the ticket says where).
        let command = match &request.tool {
            Some(call) if call.arguments.is_cut() => {
                format!("{} {} (cut: {} bytes in all)", call.name, call.arguments.shown, call.arguments.bytes)
            }
            Some(call) => format!("{} {}", call.name, call.arguments.shown),
            None => request.command.clone(),
        };
        // The path the rule matched, as for every refusal; the arguments name the path asked.
        let path = request.tool.as_ref().and_then(|call| call.resolved.as_ref()).unwrap_or(&request.path);
        let decision = if by.is_empty() { decision.to_string() } else { format!("{decision} by {by}") };
        audit.record(AuditEvent {
            time: SystemTime::now(),
            door: request.door,
            socket: request.tool.as_ref().map(|call| call.socket),
            pid: request.pid,
            uid: request.uid,
            command,
            operation: request.operation.clone(),
            class: request.op.as_str(),
            path: path.to_string(),
            rule: request.rule,
            decision,
        });
    }
}

impl Drop for Approvals {
    fn drop(&mut self) {
        // The sweeper may sleep on the bell: it wakes, finds the approvals gone and ends.
        self.bell.ring();
    }
}

/// Whether `pid` still wants its answer. A caller killed while its FUSE request is with us
/// cannot die until the request is answered (the kernel waits for the reply), so a pending
/// SIGKILL (which every fatal signal becomes) counts as gone, as do zombies and exited ones.
fn process_alive(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return false };
    const SIGKILL_BIT: u64 = 1 << (libc::SIGKILL - 1);
    !status.lines().any(|line| match line.split_once(':') {
        Some(("State", state)) => state.trim_start().starts_with(['Z', 'X']),
        Some(("SigPnd" | "ShdPnd", mask)) => {
            u64::from_str_radix(mask.trim(), 16).is_ok_and(|m| m & SIGKILL_BIT != 0)
        }
        _ => false,
    })
}

/// A ticket as `interrupts/list` and the notifications show it.
#[path = "approvals_preview.rs"]
pub mod preview;
#[path = "approvals_reach.rs"]
mod reach;
#[path = "approvals_retry.rs"]
pub mod retry;

use reach::listed_bytes;
pub use reach::{Reach, LISTED_ALL, LISTED_SHARE};

#[cfg(test)]
#[path = "approvals_tests.rs"]
mod tests;
