//! Interrupts at the tool door: Deep Agents' predicates deciding which tool calls wait for a
//! human (doc/tools.md), the wait itself, what each decision makes of the call, and the
//! `interrupts/list` and `interrupts/resolve` methods.
//!
//! A waiting call holds only its own request thread (the server runs one per request), so
//! the connection keeps answering meanwhile. A call may also ask not to wait (`wait: false`)
//! and finish later under its ticket (`control::deferred`).

use std::sync::{mpsc, Arc};
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::control::deferred::{AttachError, CallKey, Deferred};
use crate::control::methods::Peer;
use crate::control::proto::{self, RpcError};
use crate::control::session::Session;
use crate::control::tools::{self, Asks, Block, ErrorCode, ToolEnv, ToolOutput};
use crate::control::vfs::{validate_path, ToolFs};
use crate::policy::approvals::preview::Preview;
use crate::policy::approvals::{ApprovalId, Approvals, Decision, Outcome, Reach, Request, Scope, ToolCall};
use crate::policy::overlap::{glob_anchor, paths_overlap};
use crate::policy::{Mode, Op};
use crate::vpath::VPath;

/// What a tool call waits for a human about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ask {
    pub op: Op,
    /// The path as the call names it.
    pub path: VPath,
    /// Where `path` leads through symlinks, when that is elsewhere (the path a rule matched).
    pub resolved: Option<VPath>,
    /// The interrupt rule that matched the path or where it leads, if one did (a bulk call
    /// may only overlap a pattern deeper down).
    pub rule: Option<usize>,
    /// Where an approval lets the call act (`ToolCall::reach`): the path, where it leads,
    /// where a `glob` pattern reaches, and what lies beneath those under interrupt rules.
    pub reach: Reach,
}

impl Ask {
    fn new(fs: &ToolFs, op: Op, path: VPath, real: Option<(VPath, bool)>) -> Ask {
        let mut verdicts = vec![fs.decide(op, &path, false)];
        if let Some((real, is_dir)) = &real {
            verdicts.push(fs.decide(op, real, *is_dir));
        }
        let rule = verdicts.iter().find(|v| v.mode == Mode::Interrupt).unwrap_or(&verdicts[0]).rule;
        let resolved = real.map(|(r, _)| r).filter(|r| *r != path);
        let reach = Reach::named(std::iter::once(path.clone()).chain(resolved.clone()).collect());
        Ask { op, resolved, path, rule, reach }
    }

    /// Also lets the approved call act at and beneath `anchor`.
    fn reaching(mut self, anchor: VPath) -> Ask {
        self.reach.named.push(anchor);
        self
    }
}

/// Whether the call `name(args)` waits for a human, and on what. A bulk call's ticket lists
/// what lies beneath its paths under interrupt rules ([`Engine::survey`]); a call reaching
/// too much to list is refused (the error is the call's answer).
///
/// [`Engine::survey`]: crate::engine::Engine::survey
pub fn asks(fs: &ToolFs, name: &str, args: &Value) -> Result<Option<Ask>, ToolOutput> {
    let Some(spec) = tools::spec(name).and_then(|spec| spec.asks) else { return Ok(None) };
    let Some(mut ask) = predicate(fs, name, spec, args) else { return Ok(None) };
    if let Some(depth) = spec.beneath {
        match fs.engine.survey(&ask.reach.named, depth) {
            Ok(guarded) => ask.reach.guarded = guarded,
            Err(too_much) => {
                tracing::info!(
                    "refusing to ask about {name} on {}: {}",
                    crate::display::Escaped(ask.path.as_str()),
                    too_much.describe()
                );
                return Err(ToolOutput::error(
                    ErrorCode::TooLarge,
                    format!(
                        "Error: the tool call for `{name}` on {} needs a human's approval, but it reaches too much to show an approver. Name a narrower path. The tool was not executed.",
                        ask.path
                    ),
                ));
            }
        }
    }
    Ok(Some(ask))
}

/// Deep Agents' `when` predicates: whether the call waits for a human, and on what.
fn predicate(fs: &ToolFs, name: &str, spec: Asks, args: &Value) -> Option<Ask> {
    let (op, key, exact) = (spec.op, spec.path_argument, spec.beneath.is_none());
    let rules = fs.engine.gate.rules();
    let anchors: Vec<VPath> = rules.anchors(op, Mode::Interrupt);
    if anchors.is_empty() {
        return None;
    }
    let raw = match args.get(key) {
        // A pathless search starts at the root (loophole 1). (A `delete` needs its path: the
        // tool answers the missing argument before anyone is asked.)
        None | Some(Value::Null) if !exact && name != "delete" => {
            return Some(Ask::new(fs, op, VPath::root(), None))
        }
        Some(Value::String(s)) => s,
        _ => return None,
    };
    // `""`, `"."` and `"./"` become `/`, which overlaps every anchor (loophole 2).
    let path = validate_path(raw).ok()?.path;
    let real = fs
        .resolve(&path, true)
        .ok()
        .map(|r| (r.path, r.attr.is_some_and(|a| a.kind == crate::backend::FileKind::Dir)));
    if exact {
        // First match wins for the path as given and where it leads: any interrupt and no
        // deny fires (a denied path is refused by the tool itself).
        let mut verdicts = vec![fs.decide(op, &path, false)];
        if let Some((real, is_dir)) = &real {
            verdicts.push(fs.decide(op, real, *is_dir));
        }
        let fires = verdicts.iter().any(|v| v.mode == Mode::Interrupt)
            && verdicts.iter().all(|v| v.mode != Mode::Deny);
        return fires.then(|| Ask::new(fs, op, path, real));
    }
    let overlaps = |p: &VPath| anchors.iter().any(|a| paths_overlap(p, a));
    if overlaps(&path) || real.as_ref().is_some_and(|(r, _)| overlaps(r)) {
        return Some(Ask::new(fs, op, path, real));
    }
    // glob's pattern can reach outside its path (loophole 3).
    if name == "glob" {
        if let Some(Value::String(pattern)) = args.get("pattern") {
            // Where it reaches: below its literal start, or anywhere once it climbs.
            let anchor = if pattern.starts_with('/') { glob_anchor(pattern) } else { VPath::root() };
            let reaches = if pattern.starts_with('/') {
                overlaps(&anchor)
            } else {
                pattern.split('/').any(|c| c == "..")
            };
            if reaches {
                return Some(Ask::new(fs, op, path, real).reaching(anchor));
            }
        }
    }
    None
}

/// Python's `json.dumps` layout (`{"a": 1, "b": [2, 3]}`), as the reviewer note shows it.
fn py_json(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let items: Vec<String> =
                map.iter().map(|(k, v)| format!("{}: {}", Value::String(k.clone()), py_json(v))).collect();
            format!("{{{}}}", items.join(", "))
        }
        Value::Array(items) => format!("[{}]", items.iter().map(py_json).collect::<Vec<_>>().join(", ")),
        other => other.to_string(),
    }
}

/// What a tool call that needs a human does (`tools/call`'s `wait` and `ticket`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Wait for the answer on this connection (the default).
    Block,
    /// Answer "interrupted, approval #N" at once; the ticket stays pending (`wait: false`).
    Defer,
    /// Finish the call that deferred approval #N, once it is answered (`ticket: N`).
    Ticket(ApprovalId),
}

/// Runs a tool call, first asking a human when an interrupt rule says so. `Ok(None)` when
/// there is no such tool.
pub fn call(
    env: &mut ToolEnv,
    peer: &Peer,
    name: &str,
    args: &Value,
    wait: Wait,
    deferred: &Arc<Deferred>,
) -> Result<Option<ToolOutput>, RpcError> {
    let approvals = env.fs.engine.gate.approvals.clone();
    let (id, outcome) = match wait {
        Wait::Ticket(id) => {
            if !tools::registry(&env.listed()).iter().any(|spec| spec.name == name) {
                return Ok(None);
            }
            // Withdrawn, like a waiting call's, if this client goes away before the answer. A
            // client already gone reads no answer: the ticket is left for another call.
            if !env.session.wait_on(id) {
                return Ok(Some(ToolOutput::error(
                    ErrorCode::InterruptRejected,
                    format!("Error: the client that made the tool call for `{name}` disconnected. The tool was not executed."),
                )));
            }
            let call = CallKey::new(name, args, peer.uid);
            let attached = deferred.attach(id, &call, approvals.timeout() + Duration::from_secs(5));
            env.session.done_waiting(id);
            let outcome = match attached {
                Ok(outcome) => outcome.unwrap_or(Outcome::TimedOut),
                Err(e @ AttachError::OtherCall) => return Err(RpcError::invalid_params(e.message(id))),
                Err(e) => return Err(RpcError::new(proto::OPERATION_FAILED, e.message(id))),
            };
            (id, outcome)
        }
        Wait::Block | Wait::Defer => {
            let ask = match asks(&env.fs, name, args) {
                Ok(Some(ask)) => ask,
                Ok(None) => return Ok(tools::call(env, name, args)),
                Err(refused) => return Ok(Some(refused)),
            };
            let request = Request {
                door: "tool",
                operation: name.to_string(),
                op: ask.op,
                rule: ask.rule,
                path: ask.path,
                pid: peer.pid,
                uid: peer.uid,
                command: String::new(),
                names: None,
                other: None,
                tool: Some(ToolCall {
                    name: name.to_string(),
                    arguments: Preview::of(args),
                    resolved: ask.resolved,
                    reach: ask.reach,
                    socket: peer.socket.as_str(),
                }),
            };
            if wait == Wait::Defer {
                // A re-run of a call whose ticket is still pending gets that ticket again.
                let call = CallKey::new(name, args, peer.uid);
                let d = deferred.clone();
                let (tx, refused) = mpsc::channel();
                let waiter = Box::new(move |id, outcome| match outcome {
                    // Refused at once: this call answers it, with the reason.
                    Outcome::Overloaded(_) => drop(tx.send(outcome)),
                    _ => d.deliver(id, outcome),
                });
                let submit = || approvals.submit(request, None, waiter);
                let opened = deferred.open_once(call, approvals.timeout(), submit);
                // An approved ticket nobody came back for keeps no cover.
                for id in deferred.forgotten() {
                    approvals.finish(id);
                }
                match opened {
                    Some(id) => return Ok(Some(interrupted(&approvals, id, name))),
                    None => (0, refused.try_recv().unwrap_or(Outcome::TimedOut)),
                }
            } else {
                block(env, &approvals, request)
            }
        }
    };
    Ok(Some(conclude(env, &approvals, id, outcome, name, args)))
}

/// The answer to a deferred call: its ticket, pending.
fn interrupted(approvals: &Approvals, id: ApprovalId, name: &str) -> ToolOutput {
    let ticket = approvals.describe_for_caller(id).unwrap_or(Value::Null);
    let path = ticket["path"].as_str().unwrap_or("").to_string();
    ToolOutput::text(format!(
        "Interrupted: the tool call for `{name}` on {path} needs a human's approval (approval #{id}). It has not run; once an approver has answered on the control socket, call it again with `ticket: {id}` to finish it."
    ))
    .with("interrupted", json!(true))
    .with("interrupt_id", json!(id))
    .with("interrupt", ticket)
}

/// Opens the ticket for `request` and waits on this connection for its answer.
fn block(env: &mut ToolEnv, approvals: &Arc<Approvals>, request: Request) -> (ApprovalId, Outcome) {
    let (tx, rx) = mpsc::channel();
    let recording = env.session.submitting();
    let submitted =
        approvals.submit(request, None, Box::new(move |id, outcome| drop(tx.send((id, outcome)))));
    // The connection withdraws the ticket if its client goes away; if it already went, the
    // ticket is withdrawn here.
    if let Some(id) = submitted {
        if !env.session.wait_on(id) {
            approvals.withdraw(id);
        }
    }
    drop(recording);
    // The sweeper answers at the deadline; the margin only guards against its absence.
    let (id, outcome) =
        rx.recv_timeout(approvals.timeout() + Duration::from_secs(5)).unwrap_or((0, Outcome::TimedOut));
    if let Some(id) = submitted {
        env.session.done_waiting(id);
    }
    (id, outcome)
}

/// What a decision (or its absence) makes of the call.
fn conclude(
    env: &mut ToolEnv,
    approvals: &Approvals,
    id: ApprovalId,
    outcome: Outcome,
    name: &str,
    args: &Value,
) -> ToolOutput {
    let output = match outcome {
        Outcome::Decided(Decision::Approve(_)) => run_approved(env, approvals, id, name, args),
        Outcome::Decided(Decision::Edit(edited)) => {
            // The approver chose these arguments: the call may act where they lead now.
            // Beneath the edited path nothing guarded passes: nobody was shown what lies there.
            let named = tools::spec(name)
                .and_then(|spec| spec.asks)
                .and_then(|spec| predicate(&env.fs, name, spec, &edited))
                .map(|ask| ask.reach.named)
                .unwrap_or_default();
            approvals.cover_call(id, Reach::named(named));
            let output = run_approved(env, approvals, id, name, &edited);
            reviewer_note(name, &edited, output).with("edited_arguments", edited)
        }
        Outcome::Decided(Decision::Respond(message)) => ToolOutput::text(message).with("responded", json!(true)),
        Outcome::Decided(Decision::Reject(Some(message))) => ToolOutput::error(
            ErrorCode::InterruptRejected,
            format!("User rejected the tool call for `{name}` with reason: {message}"),
        ),
        Outcome::Decided(Decision::Reject(None)) => ToolOutput::error(
            ErrorCode::InterruptRejected,
            format!("User rejected the tool call for `{name}` with id {id}. The tool was not executed. Do not retry this tool call unless the user explicitly requests it."),
        ),
        Outcome::TimedOut => ToolOutput::error(
            ErrorCode::InterruptTimeout,
            format!(
                "Error: nobody approved the tool call for `{name}` within {}s. The tool was not executed.",
                approvals.timeout().as_secs()
            ),
        ),
        Outcome::Cancelled => ToolOutput::error(
            ErrorCode::InterruptRejected,
            format!("Error: the daemon is stopping; the tool call for `{name}` was not executed."),
        ),
        // A tool call's ticket is never interrupted by a signal; withdrawn either way.
        Outcome::CallerGone | Outcome::Interrupted => ToolOutput::error(
            ErrorCode::InterruptRejected,
            format!("Error: the client that made the tool call for `{name}` disconnected before it was approved. The tool was not executed."),
        ),
        Outcome::Overloaded(overload) => ToolOutput::error(
            ErrorCode::InterruptRejected,
            format!(
                "Error: the tool call for `{name}` needs approval, but too many approvals are pending: {}. The tool was not executed.",
                overload.reason()
            ),
        ),
    };
    output.with("interrupt_id", json!(id))
}

/// Runs the call under approval `id`: its interrupt verdicts pass, deny rules still refuse
/// (so edited arguments cannot reach a denied path).
fn run_approved(env: &mut ToolEnv, approvals: &Approvals, id: u64, name: &str, args: &Value) -> ToolOutput {
    env.fs.ctx.approval = Some(id);
    let output = tools::call(env, name, args).unwrap_or_else(|| {
        ToolOutput::error(ErrorCode::InvalidArgument, format!("Error: unknown tool {name:?}"))
    });
    env.fs.ctx.approval = None;
    approvals.finish(id);
    output
}

/// Deep Agents' note in front of the result of an edited call.
fn reviewer_note(name: &str, edited: &Value, mut output: ToolOutput) -> ToolOutput {
    let note = format!(
        "Note: a human reviewer replaced this tool call before it ran. The call recorded in your message is the one you produced, not the one that executed. This was intentional and authorized. Do not re-issue your original call. Executed instead: {name} with arguments {}.",
        py_json(edited)
    );
    match output.content.first_mut() {
        Some(Block::Text(text)) if !text.is_empty() => *text = format!("{note}\n\nTool response:\n{text}"),
        Some(_) => output.content.insert(0, Block::Text(format!("{note}\n\nTool response:"))),
        None => output.content.push(Block::Text(note)),
    }
    output
}

/// `interrupts/list`.
pub fn list(approvals: &Approvals) -> Value {
    json!({"interrupts": approvals.list()})
}

/// `interrupts/resolve {id, decision, scope?, arguments?, message?}`. A connection cannot
/// answer a ticket its own tool call waits on.
pub fn resolve(
    approvals: &Approvals,
    peer: &Peer,
    session: &Session,
    params: &Map<String, Value>,
) -> Result<Value, RpcError> {
    let id = params
        .get("id")
        .and_then(Value::as_u64)
        .ok_or_else(|| RpcError::invalid_params("parameter `id` must be the approval's number"))?;
    if session.waits_on(id) {
        return Err(RpcError::new(
            proto::PEER_REFUSED,
            format!("permission denied: approval #{id} waits on a tool call of this connection, which may not answer it; an approver answers it on a connection of their own"),
        ));
    }
    let message = match params.get("message") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            return Err(RpcError::invalid_params(format!("`message` must be a string, got {other}")))
        }
    };
    let decision = match params.get("decision").and_then(Value::as_str) {
        Some("approve") => Decision::Approve(match params.get("scope").and_then(Value::as_str) {
            None | Some("once") => Scope::Once,
            Some("session") => Scope::Session,
            Some(other) => {
                return Err(RpcError::invalid_params(format!(
                    "unknown scope {other:?} (expected \"once\" or \"session\")"
                )))
            }
        }),
        Some("reject") => Decision::Reject(message),
        Some("edit") => match params.get("arguments") {
            Some(a @ Value::Object(_)) => Decision::Edit(a.clone()),
            _ => return Err(RpcError::invalid_params("`edit` needs `arguments` (an object)")),
        },
        Some("respond") => Decision::Respond(
            message.ok_or_else(|| RpcError::invalid_params("`respond` needs `message` (a string)"))?,
        ),
        _ => {
            return Err(RpcError::invalid_params(
                "parameter `decision` must be \"approve\", \"reject\", \"edit\" or \"respond\"",
            ))
        }
    };
    let by = format!("uid {} (pid {})", peer.uid, peer.pid);
    approvals.resolve(id, decision, &by).map_err(|e| RpcError::new(proto::OPERATION_FAILED, e))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::audit::Audit;
    use crate::backend::memory::MemoryBackend;
    use crate::backend::{Backend, Caller};
    use crate::engine::{Ctx, Door, Engine};
    use crate::policy::{Gate, Rule, RuleSet};
    use crate::route::{Route, Router};

    fn rule_set(rules: Vec<(Op, &str, Mode)>) -> RuleSet {
        let rules = rules
            .into_iter()
            .map(|(op, path, mode)| Rule { operations: vec![op], paths: vec![path.into()], mode, hide: true })
            .collect();
        RuleSet::new(rules).unwrap()
    }

    fn engine(rules: Vec<(Op, &str, Mode)>) -> Engine {
        let route = Route {
            prefix: VPath::root(),
            backend: Arc::new(MemoryBackend::new(None)) as Arc<dyn Backend>,
            ttl: Duration::from_secs(1),
            kind: "memory",
            read_only: false,
        };
        let engine = Engine::new(
            Gate::new(RuleSet::new(vec![]).unwrap()),
            Router::new(vec![route]),
            Arc::new(Audit::open(None, crate::config::DEFAULT_AUDIT_MAX_RECORDS).unwrap()),
        );
        let ctx = Ctx::new(Door::Tool, Caller::daemon());
        engine.mkdir(&ctx, &VPath::parse("/secrets").unwrap(), 0o755).unwrap();
        engine.mkdir(&ctx, &VPath::parse("/workspace").unwrap(), 0o755).unwrap();
        engine.gate.reload(rule_set(rules));
        engine
    }

    fn fires(engine: &Engine, name: &str, args: Value) -> bool {
        asks(&ToolFs::new(engine), name, &args).expect("not too much").is_some()
    }

    #[test]
    fn bulk_predicate_matches_deep_agents_examples() {
        let e = engine(vec![(Op::Read, "/secrets/**", Mode::Interrupt)]);
        assert!(fires(&e, "ls", json!({})), "pathless (loophole 1)");
        assert!(fires(&e, "grep", json!({"pattern": "x", "path": "."})), "`.` is `/` (loophole 2)");
        assert!(fires(&e, "ls", json!({"path": "/"})));
        assert!(fires(&e, "ls", json!({"path": "/secrets/sub"})));
        assert!(!fires(&e, "ls", json!({"path": "/secret"})));
        assert!(!fires(&e, "ls", json!({"path": 7})), "non-string");
        assert!(fires(&e, "glob", json!({"pattern": "/secrets/**", "path": "/workspace"})), "loophole 3");
        assert!(fires(&e, "glob", json!({"pattern": "../secrets/*", "path": "/workspace"})));
        assert!(!fires(&e, "glob", json!({"pattern": "*.txt", "path": "/workspace"})));
        assert!(fires(&e, "glob", json!({"pattern": "/**/key.pem", "path": "/workspace"})));
        assert!(
            !fires(&e, "write_file", json!({"file_path": "/secrets/a", "content": ""})),
            "read-only rule"
        );
        // A delete without its path is an argument error, not a question about `/`.
        let w = engine(vec![(Op::Write, "/secrets/**", Mode::Interrupt)]);
        assert!(!fires(&w, "delete", json!({"path": "/secrets/a"})));
        assert!(fires(&w, "delete", json!({"file_path": "/secrets/a"})));
    }

    #[test]
    fn bulk_predicate_ignores_order_and_deny_rules() {
        let e =
            engine(vec![(Op::Write, "/secrets/**", Mode::Deny), (Op::Write, "/secrets/**", Mode::Interrupt)]);
        assert!(fires(&e, "delete", json!({"file_path": "/secrets/a"})));
        assert!(!fires(&e, "write_file", json!({"file_path": "/secrets/a", "content": ""})));
    }

    #[test]
    fn exact_predicate_respects_first_match() {
        let e = engine(vec![
            (Op::Write, "/secrets/public/**", Mode::Allow),
            (Op::Write, "/secrets/**", Mode::Interrupt),
        ]);
        assert!(fires(&e, "write_file", json!({"file_path": "/secrets/a", "content": ""})));
        assert!(fires(&e, "edit_file", json!({"file_path": "/secrets/a"})));
        assert!(!fires(&e, "write_file", json!({"file_path": "/secrets/public/a", "content": ""})));
        assert!(!fires(&e, "write_file", json!({"file_path": "/workspace/a", "content": ""})));
        assert!(!fires(&e, "write_file", json!({"file_path": "/secrets/../x", "content": ""})), "invalid");
        assert!(!fires(&e, "read_file", json!({"file_path": "/secrets/a"})));
        assert!(!fires(&e, "no_such_tool", json!({})));
    }

    #[test]
    fn a_call_through_a_symlink_names_the_link_and_where_it_leads() {
        let e = engine(vec![
            (Op::Write, "/workspace/**", Mode::Allow),
            (Op::Write, "/secrets/**", Mode::Interrupt),
        ]);
        let ctx = Ctx::new(Door::Tool, Caller::daemon());
        e.symlink(&ctx, &VPath::parse("/workspace/link").unwrap(), b"/secrets/f").unwrap();
        e.symlink(&ctx, &VPath::parse("/workspace/dir").unwrap(), b"../secrets").unwrap();
        let fs = ToolFs::new(&e);
        let ask = |args: Value| asks(&fs, "write_file", &args).expect("not too much").expect("asks");
        let via = ask(json!({"file_path": "/workspace/link", "content": ""}));
        assert_eq!(via.path.as_str(), "/workspace/link");
        assert_eq!(via.resolved.as_ref().map(VPath::as_str), Some("/secrets/f"));
        assert_eq!(via.rule, Some(1), "the interrupt rule, not the allow the link itself meets");
        let via = ask(json!({"file_path": "/workspace/dir/new", "content": ""}));
        assert_eq!(via.resolved.as_ref().map(VPath::as_str), Some("/secrets/new"));
        let direct = ask(json!({"file_path": "/secrets/f", "content": ""}));
        assert_eq!((direct.resolved, direct.rule), (None, Some(1)));
    }

    #[test]
    fn a_bulk_ticket_lists_what_interrupt_rules_guard_beneath_its_path() {
        let e = engine(vec![]);
        let ctx = Ctx::new(Door::Tool, Caller::daemon());
        for dir in ["/workspace/a", "/workspace/a/b", "/workspace/hidden", "/secrets/inner"] {
            e.mkdir(&ctx, &VPath::parse(dir).unwrap(), 0o755).unwrap();
        }
        for file in [
            "/workspace/x.conf",
            "/workspace/a/b/y.conf",
            "/workspace/a/b/z.txt",
            "/workspace/hidden/h.conf",
            "/secrets/inner/k",
        ] {
            e.create(&ctx, &VPath::parse(file).unwrap(), 0o644, libc::O_WRONLY).unwrap();
        }
        e.gate.reload(rule_set(vec![
            (Op::Read, "/secrets/**", Mode::Interrupt),
            (Op::Write, "/workspace/**/*.conf", Mode::Interrupt),
            (Op::Read, "/workspace/hidden/**", Mode::Deny),
        ]));
        let fs = ToolFs::new(&e);
        let guarded = |name: &str, args: Value| -> Vec<String> {
            let ask = asks(&fs, name, &args).expect("not too much").expect("asks");
            ask.reach.guarded.iter().map(|p| p.to_string()).collect()
        };
        // Deeper down, under a later rule; the hidden directory is not looked into.
        assert_eq!(
            guarded("delete", json!({"file_path": "/workspace"})),
            ["/workspace/a/b/y.conf", "/workspace/x.conf"]
        );
        // A listing interrupt does not stop the daemon's own look; `ls` acts on one level.
        assert_eq!(
            guarded("grep", json!({"pattern": "k", "path": "/"})),
            ["/secrets", "/secrets/inner", "/secrets/inner/k", "/workspace/a/b/y.conf", "/workspace/x.conf"]
        );
        assert_eq!(guarded("ls", json!({"path": "/secrets"})), ["/secrets/inner"]);
        // The exact predicate acts on its path alone.
        let ask = asks(&fs, "write_file", &json!({"file_path": "/workspace/x.conf", "content": ""}));
        assert!(ask.unwrap().unwrap().reach.guarded.is_empty());
    }

    #[test]
    fn the_reviewer_note_prefixes_the_result() {
        let out = reviewer_note(
            "write_file",
            &json!({"file_path": "/a", "content": "x"}),
            ToolOutput::text("done"),
        );
        assert_eq!(
            out.joined_text(),
            "Note: a human reviewer replaced this tool call before it ran. The call recorded in your message is the one you produced, not the one that executed. This was intentional and authorized. Do not re-issue your original call. Executed instead: write_file with arguments {\"content\": \"x\", \"file_path\": \"/a\"}.\n\nTool response:\ndone"
        );
    }
}
